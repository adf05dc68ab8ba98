//! Helpers for the server tests: unique names, a raw client, the conformance harness.
#![allow(dead_code)] // each test file uses a different subset

pub mod proxy;

use std::sync::Arc;
use std::time::Duration;
use walsink::{MemoryCommitStore, Options, RetryPolicy, WalSink};
use walsink_postgres::{Config, PgSink};
use walsink_tokio::conformance::Harness;

/// The shared server of DEVELOPERS.md.
pub const SHARED: &str = "postgres://postgres@127.0.0.1:5432/test";

/// A name unique to this run: `{tag}_{pid}_{nanos}`.
pub fn unique(tag: &str) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    format!("{tag}_{}_{:x}", std::process::id(), nanos & 0xffff_ffff)
}

/// A plain client on `url` (the connection runs on the current runtime).
pub async fn client(url: &str) -> tokio_postgres::Client {
    let (c, conn) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .unwrap_or_else(|e| panic!("connect to {url}: {e}"));
    tokio::spawn(conn);
    c
}

/// The payloads of `table` for `(sink_id, subtask)`, by checkpoint and index.
pub async fn rows(url: &str, table: &str, sink_id: &str, subtask: u32) -> Vec<Vec<u8>> {
    let c = client(url).await;
    c.query(
        &format!(
            "SELECT payload FROM {table} WHERE sink_id = $1 AND subtask = $2 ORDER BY checkpoint, idx"
        ),
        &[&sink_id, &(subtask as i32)],
    )
    .await
    .unwrap()
    .iter()
    .map(|r| r.get(0))
    .collect()
}

/// The conformance harness: one table per harness, sinks by URL.
pub struct Pg {
    pub url: String,
    pub table: String,
    pub extra: String,
}

impl Pg {
    pub fn new(url: &str, extra: &str) -> Pg {
        Pg {
            url: url.to_string(),
            table: unique("conf"),
            extra: extra.to_string(),
        }
    }

    pub fn config(&self) -> Config {
        Config::from_url(&format!("{}?table={}{}", self.url, self.table, self.extra)).unwrap()
    }
}

impl Harness for Pg {
    type Sink = PgSink;

    async fn sink(&self, _sink_id: &str) -> PgSink {
        PgSink::new(self.config())
    }

    async fn read_back(&self, sink_id: &str, subtask: u32) -> Vec<Vec<u8>> {
        rows(&self.url, &self.table, sink_id, subtask).await
    }
}

/// Options for a test log with quick retries.
pub fn opts(sink_id: &str) -> Options {
    Options::new(sink_id)
        .segment_size(8 << 20)
        .max_record_size(1 << 20)
        .read_chunk_size(64 << 10)
        .retry(RetryPolicy::new(
            Duration::from_millis(10),
            Duration::from_millis(300),
        ))
}

/// A log in a temporary directory.
pub struct Log {
    pub dir: tempfile::TempDir,
    pub wal: Arc<WalSink>,
}

pub fn open(sink_id: &str) -> Log {
    let dir = tempfile::tempdir().unwrap();
    let (wal, _) = WalSink::open_with(
        Arc::new(walsink::storage::FsStorage::new(dir.path()).unwrap()),
        opts(sink_id),
        Box::new(MemoryCommitStore::new()),
    )
    .unwrap();
    Log {
        dir,
        wal: Arc::new(wal),
    }
}

/// Record `i` of a test: 64 bytes.
pub fn record(i: u64) -> Vec<u8> {
    format!("rec {i:012} {}", "x".repeat(47)).into_bytes()
}

/// Appends records `range` and seals them as checkpoint `cp`, complete.
pub fn epoch(wal: &WalSink, cp: u64, range: std::ops::Range<u64>) -> Vec<Vec<u8>> {
    let recs: Vec<Vec<u8>> = range.map(record).collect();
    wal.append_batch(recs.iter().map(|r| r.as_slice())).unwrap();
    wal.checkpoint(cp, format!("meta {cp}").as_bytes()).unwrap();
    wal.checkpoint_complete(cp).unwrap();
    recs
}

/// Waits (bounded) until checkpoint `id` is committed.
pub async fn wait_committed(wal: &Arc<WalSink>, id: u64, secs: u64) -> bool {
    let w = wal.clone();
    tokio::task::spawn_blocking(move || w.wait_committed(id, Duration::from_secs(secs)))
        .await
        .unwrap()
}
