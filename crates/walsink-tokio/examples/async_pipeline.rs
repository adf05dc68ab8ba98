//! A tokio pipeline with walsink in the middle: a source of typed events, checkpoints on a
//! timer, an async sink that writes each checkpoint's events to a file exactly once, one
//! restart half-way (the handle is dropped with unsealed events in it and the log reopened),
//! and a check of what the target holds at the end.
//!
//! Run: `cargo run --release -p walsink-tokio --example async_pipeline`

use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};
use std::time::Duration;
use walsink::{Epoch, EpochKey, Options, SinkError};
use walsink_tokio::{AsyncChunks, AsyncSink, AsyncWal, Codec, Postcard, TypedWal};

/// The events, in a versioned envelope (see `walsink_tokio::typed` on evolving a type).
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
enum Event {
    V1 { id: u64, account: u32, cents: i64 },
}

const TOTAL: u64 = 200_000;

/// The event at offset `i` of the source: a deterministic source, so it can be replayed from
/// any offset, as a Kafka partition can.
fn event(i: u64) -> Event {
    Event::V1 {
        id: i,
        account: (i % 97) as u32,
        cents: (i as i64 % 1000) - 500,
    }
}

/// A target that writes each checkpoint's events as JSON lines to `DIR/CHECKPOINT.jsonl`,
/// renamed into place once complete: the file is the commit marker, so delivery is
/// exactly-once.
struct JsonFiles {
    dir: PathBuf,
}

impl JsonFiles {
    fn path(&self, checkpoint: u64) -> PathBuf {
        self.dir.join(format!("{checkpoint:020}.jsonl"))
    }
}

impl AsyncSink for JsonFiles {
    async fn deliver(&mut self, epoch: &Epoch) -> Result<(), SinkError> {
        let mut out = Vec::new();
        let mut chunks = AsyncChunks::new(epoch);
        while let Some(chunk) = chunks.next().await {
            let chunk = chunk.map_err(|e| SinkError::retryable(e.to_string()))?;
            for record in chunk.records() {
                let event: Event = Postcard.decode_record(&record)?;
                serde_json::to_writer(&mut out, &event)
                    .map_err(|e| SinkError::permanent(e.to_string()))?;
                out.push(b'\n');
            }
        }
        let path = self.path(epoch.checkpoint());
        let tmp = path.with_extension("tmp");
        let io = |e: std::io::Error| SinkError::retryable(format!("{}: {e}", path.display()));
        tokio::fs::write(&tmp, &out).await.map_err(io)?;
        tokio::fs::File::open(&tmp)
            .await
            .map_err(io)?
            .sync_all()
            .await
            .map_err(io)?;
        tokio::fs::rename(&tmp, &path).await.map_err(io)?;
        tokio::fs::File::open(&self.dir)
            .await
            .map_err(io)?
            .sync_all()
            .await
            .map_err(io)
    }

    fn stores_marker(&self) -> bool {
        true
    }

    async fn is_committed(&mut self, key: &EpochKey) -> Result<bool, SinkError> {
        Ok(tokio::fs::try_exists(self.path(key.checkpoint))
            .await
            .unwrap_or(false))
    }
}

/// Runs the pipeline from wherever the log says, until `stop_after` events were appended
/// (then returns without sealing them: a crash) or the source ends.
async fn run(log: &Path, out: &Path, stop_after: Option<u64>) -> walsink::Result<u64> {
    // After a crash in this process the old handle's tasks may still hold the log's lock for
    // a moment; a new process would find it free at once.
    let mut tries = 0;
    let (wal, report) = loop {
        match AsyncWal::open(log, Options::new("async-pipeline")).await {
            Err(e) if matches!(e.kind(), walsink::ErrorKind::Locked { .. }) && tries < 100 => {
                tries += 1;
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            r => break r?,
        }
    };
    // Resume after the newest sealed checkpoint: its metadata is the source offset.
    let mut offset = report
        .last_metadata
        .as_deref()
        .map(|m| u64::from_le_bytes(m.try_into().expect("an 8-byte offset")))
        .unwrap_or(0);
    let mut next_id = report.next_checkpoint_id;
    if let Some(last) = report.last_checkpoint {
        // Everything sealed before the crash was part of a completed checkpoint here.
        wal.restore(Some(last)).await?;
        wal.checkpoint_complete(last)?;
        println!("restarted: resuming at source offset {offset} after checkpoint {last}");
    }
    let committer = wal.spawn_committer(JsonFiles {
        dir: out.to_path_buf(),
    })?;
    let typed = TypedWal::new(wal.clone(), Postcard);
    let mut timer = tokio::time::interval(Duration::from_millis(20));
    let mut appended = 0;
    while offset < TOTAL {
        let batch: Vec<Event> = (offset..(offset + 64).min(TOTAL)).map(event).collect();
        typed.append_batch(&batch).await?;
        offset += batch.len() as u64;
        appended += batch.len() as u64;
        if stop_after.is_some_and(|n| appended >= n) {
            println!("crash: dropping the log with events up to offset {offset} unsealed");
            drop(committer);
            return Ok(offset);
        }
        tokio::select! {
            biased;
            _ = timer.tick() => {
                wal.checkpoint(next_id, &offset.to_le_bytes()).await?;
                wal.checkpoint_complete(next_id)?;
                next_id += 1;
            }
            _ = std::future::ready(()) => {}
        }
    }
    wal.checkpoint(next_id, &offset.to_le_bytes()).await?;
    wal.checkpoint_complete(next_id)?;
    if !wal.wait_committed(next_id, Duration::from_secs(60)).await {
        return Err(walsink::Error::invalid_op(format!(
            "checkpoint {next_id} was not delivered within 60 s: {:?}",
            wal.health()
        )));
    }
    let report = committer.shutdown(Duration::from_secs(10)).await;
    assert!(report.pending.is_empty(), "{report:?}");
    wal.shutdown().await;
    Ok(offset)
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let tmp = tempfile::tempdir()?;
    let (log, out) = (tmp.path().join("log"), tmp.path().join("out"));
    std::fs::create_dir_all(&out)?;
    run(&log, &out, Some(TOTAL / 2)).await?;
    run(&log, &out, None).await?;

    // Verify: every event exactly once, each as the source made it.
    let mut seen = vec![0u32; TOTAL as usize];
    let mut files: Vec<_> = std::fs::read_dir(&out)?.collect::<Result<_, _>>()?;
    files.sort_by_key(|e| e.file_name());
    for f in files {
        for line in std::fs::read_to_string(f.path())?.lines() {
            let e: Event = serde_json::from_str(line)?;
            let Event::V1 { id, .. } = e;
            assert_eq!(e, event(id), "event {id} as delivered");
            seen[id as usize] += 1;
        }
    }
    let lost = seen.iter().filter(|&&n| n == 0).count();
    let duplicated = seen.iter().filter(|&&n| n > 1).count();
    if lost > 0 || duplicated > 0 {
        return Err(format!("{lost} events lost, {duplicated} duplicated").into());
    }
    println!("delivered {} records exactly once", seen.len());
    Ok(())
}
