//! What a dropped `AsyncWal` call leaves behind, as each `# Cancel safety` section and
//! `docs/async.md` state it: work a dropped call started off the runtime ends before any later
//! call on the handle (or a clone) takes effect, and a call dropped before its work started
//! leaves nothing. Each race is tried many times on the real disk: a dropped append that
//! waited for backlog budget appends nothing (a restore then voids nothing of it, and a later
//! append lands alone in the next epoch); a dropped checkpoint seals only what was appended
//! before it, and shows in `pending()` as soon as a later call returns; a dropped restore
//! never voids an append acknowledged after it.

use parking_lot::Mutex;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;
use walsink::{Epoch, ErrorKind, FullPolicy, Options, SinkError};
use walsink_tokio::{AsyncChunks, AsyncSink, AsyncWal};

/// Tries per race: a race shows only when the next call meets the dropped call's work half-way,
/// which without the handle's ordering happened in a tenth to nine tenths of the tries.
const TRIES: usize = 200;

/// Records each delivered epoch's records by checkpoint id (an empty epoch never reaches the
/// sink, so it has no entry).
#[derive(Clone, Default)]
struct ByEpoch(Arc<Mutex<BTreeMap<u64, Vec<Vec<u8>>>>>);

impl AsyncSink for ByEpoch {
    async fn deliver(&mut self, epoch: &Epoch) -> Result<(), SinkError> {
        let mut got = Vec::new();
        let mut chunks = AsyncChunks::new(epoch);
        while let Some(c) = chunks.next().await {
            let c = c.map_err(|e| SinkError::retryable(e.to_string()))?;
            got.extend(c.records().map(|r| r.data.to_vec()));
        }
        self.0.lock().insert(epoch.checkpoint(), got);
        Ok(())
    }
}

impl ByEpoch {
    fn epochs(&self) -> BTreeMap<u64, Vec<Vec<u8>>> {
        self.0.lock().clone()
    }
}

fn epochs(list: &[(u64, &[&[u8]])]) -> BTreeMap<u64, Vec<Vec<u8>>> {
    list.iter()
        .map(|(id, rs)| (*id, rs.iter().map(|r| r.to_vec()).collect()))
        .collect()
}

fn text(records: &[Vec<u8>]) -> Vec<String> {
    records
        .iter()
        .map(|r| String::from_utf8_lossy(r).into_owned())
        .collect()
}

/// Runs `one` `TRIES` times and fails naming how many tries went wrong and the first few.
///
/// Tries alternate between two runtimes, to meet the dropped call's work in each of its
/// phases: a current-thread runtime whose blocking pool keeps no idle thread (a dropped
/// call's work then starts only after a new thread is up, so the next call usually comes
/// first), and a two-worker runtime with the default pool, where the next call comes after a
/// pause of 0 to 2 ms (while the work holds the writer, or syncs, or after it).
fn tries<F, Fut>(what: &str, one: F)
where
    F: Fn(Duration) -> Fut,
    Fut: std::future::Future<Output = Result<(), String>>,
{
    let idle_pool = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .thread_keep_alive(Duration::ZERO)
        .build()
        .unwrap();
    let two_workers = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let mut failed = Vec::new();
    for i in 0..TRIES {
        let r = if i % 2 == 0 {
            idle_pool.block_on(one(Duration::ZERO))
        } else {
            let pause = Duration::from_micros(250 * ((i / 2) % 9) as u64);
            two_workers.block_on(one(pause))
        };
        if let Err(e) = r {
            failed.push(format!("try {i}: {e}"));
        }
    }
    assert!(
        failed.is_empty(),
        "{what}: failed in {} of {TRIES} tries; first: {:#?}",
        failed.len(),
        &failed[..failed.len().min(3)]
    );
}

/// Waits `pause` without yielding the task (a sleep would hand the worker to other tasks
/// and round the pause up to the timer's resolution).
fn pause_for(pause: Duration) {
    let until = std::time::Instant::now() + pause;
    while std::time::Instant::now() < until {
        std::hint::spin_loop();
    }
}

#[test]
fn an_append_dropped_while_waiting_for_budget_appends_nothing() {
    tries("a dropped append waiting for budget", |pause| async move {
        let dir = tempfile::tempdir().unwrap();
        let (wal, _) = AsyncWal::open(
            dir.path(),
            Options::new("cancel-budget").max_backlog_bytes(16 << 10, FullPolicy::Block),
        )
        .await
        .unwrap();
        let filler = vec![7u8; 1024];
        for _ in 0..16 {
            wal.append(&filler).await.unwrap();
        }
        wal.checkpoint(1, b"").await.unwrap();
        // The budget is used up by sealed epoch 1, which is not complete: the append waits.
        let r = tokio::time::timeout(Duration::from_millis(50), wal.append(b"dropped")).await;
        assert!(r.is_err(), "the append must wait for budget: {r:?}");
        pause_for(pause);
        wal.restore(Some(1)).await.unwrap();
        let sink = ByEpoch::default();
        // Delivering epoch 1 frees the budget.
        assert_eq!(wal.deliver_ready(&mut sink.clone()).await.unwrap(), 1);
        wal.append(b"replayed").await.unwrap();
        wal.checkpoint(2, b"").await.unwrap();
        wal.checkpoint_complete(2).unwrap();
        wal.deliver_ready(&mut sink.clone()).await.unwrap();
        let got = sink.epochs();
        let want_2 = vec![b"replayed".to_vec()];
        if got.get(&2) != Some(&want_2) {
            return Err(format!("epoch 2 holds {:?}", got.get(&2).map(|v| text(v))));
        }
        if got[&1].len() != 16 {
            return Err(format!("epoch 1 holds {} records", got[&1].len()));
        }
        Ok(())
    });
}

#[test]
fn a_dropped_checkpoint_seals_only_what_was_appended_before_it() {
    tries("a dropped checkpoint", |pause| async move {
        let dir = tempfile::tempdir().unwrap();
        let (wal, _) = AsyncWal::open(dir.path(), Options::new("cancel-checkpoint"))
            .await
            .unwrap();
        wal.append(b"a").await.unwrap();
        let _ = tokio::time::timeout(Duration::ZERO, wal.checkpoint(7, b"m")).await;
        pause_for(pause);
        wal.append(b"late").await.unwrap();
        let again = wal.checkpoint(7, b"m").await;
        // Read at once: a later call returned, so the dropped one's work has ended.
        let sealed_7 = wal.pending().iter().any(|p| p.id == 7);
        let want = match &again {
            Ok(()) => epochs(&[(7, &[b"a", b"late"])]),
            Err(e) if matches!(e.kind(), ErrorKind::InvalidCheckpoint { .. }) => {
                if !sealed_7 {
                    return Err("checkpoint 7 was refused but pending() does not show it".into());
                }
                epochs(&[(7, &[b"a"]), (8, &[b"late"])])
            }
            Err(e) => return Err(format!("checkpoint 7 again failed with {e}")),
        };
        wal.checkpoint(8, b"").await.unwrap();
        wal.checkpoint_complete(8).unwrap();
        let sink = ByEpoch::default();
        wal.deliver_ready(&mut sink.clone()).await.unwrap();
        let got = sink.epochs();
        if got != want {
            return Err(format!(
                "checkpoint 7 again: {:?}; delivered {got:?}, want {want:?}",
                again.map_err(|e| e.to_string())
            ));
        }
        Ok(())
    });
}

#[test]
fn a_dropped_restore_never_voids_an_append_acknowledged_after_it() {
    tries("a dropped restore", |pause| async move {
        let dir = tempfile::tempdir().unwrap();
        let (wal, _) = AsyncWal::open(dir.path(), Options::new("cancel-restore"))
            .await
            .unwrap();
        wal.append(b"x").await.unwrap();
        wal.checkpoint(1, b"").await.unwrap();
        let _ = tokio::time::timeout(Duration::ZERO, wal.restore(Some(1))).await;
        pause_for(pause);
        wal.append(b"after-restore").await.unwrap();
        wal.checkpoint(2, b"").await.unwrap();
        wal.checkpoint_complete(2).unwrap();
        let sink = ByEpoch::default();
        wal.deliver_ready(&mut sink.clone()).await.unwrap();
        let got = sink.epochs();
        let want = epochs(&[(1, &[b"x"]), (2, &[b"after-restore"])]);
        if got != want {
            return Err(format!("delivered {got:?}"));
        }
        Ok(())
    });
}

#[test]
fn clones_are_ordered_after_a_call_dropped_on_another_clone() {
    // The same race as above through two clones: the later call is made on the other one.
    tries("a restore dropped on one clone", |pause| async move {
        let dir = tempfile::tempdir().unwrap();
        let (wal, _) = AsyncWal::open(dir.path(), Options::new("cancel-clones"))
            .await
            .unwrap();
        let other = wal.clone();
        wal.append(b"x").await.unwrap();
        wal.checkpoint(1, b"").await.unwrap();
        let _ = tokio::time::timeout(Duration::ZERO, wal.restore(None)).await;
        pause_for(pause);
        other.append(b"after-restore").await.unwrap();
        other.checkpoint(2, b"").await.unwrap();
        wal.checkpoint_complete(2).unwrap();
        let sink = ByEpoch::default();
        wal.deliver_ready(&mut sink.clone()).await.unwrap();
        let got = sink.epochs();
        let want = epochs(&[(2, &[b"after-restore"])]);
        if got != want {
            return Err(format!("delivered {got:?}"));
        }
        Ok(())
    });
}
