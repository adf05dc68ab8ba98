//! Helpers shared by this crate's tests: a log with epochs, and the sink error inside a
//! delivery error.
#![allow(dead_code)] // each test file uses a different subset

use std::sync::Arc;
use std::time::Duration;
use walsink::{ErrorKind, MemoryCommitStore, Options, RetryPolicy, SinkError, WalSink};
use walsink_http::{Config, HttpSink};

/// A log in a temporary directory (kept alive with it).
pub struct Log {
    pub dir: tempfile::TempDir,
    pub wal: Arc<WalSink>,
}

pub fn open(sink_id: &str) -> Log {
    let dir = tempfile::tempdir().unwrap();
    let (wal, _) = WalSink::open_with(
        Arc::new(walsink::storage::FsStorage::new(dir.path()).unwrap()),
        Options::new(sink_id)
            .segment_size(4 << 20)
            .max_record_size(64 << 10)
            .read_chunk_size(4096)
            .retry(RetryPolicy::new(
                Duration::from_millis(5),
                Duration::from_millis(100),
            )),
        Box::new(MemoryCommitStore::new()),
    )
    .unwrap();
    Log {
        dir,
        wal: Arc::new(wal),
    }
}

/// Appends `records` as checkpoint `cp`, complete.
pub fn epoch(log: &Log, cp: u64, records: &[Vec<u8>]) {
    log.wal
        .append_batch(records.iter().map(|r| r.as_slice()))
        .unwrap();
    log.wal.checkpoint(cp, b"").unwrap();
    log.wal.checkpoint_complete(cp).unwrap();
}

/// Records `from..to` as `tag-NNNNN` with some padding.
pub fn records(tag: &str, from: u64, to: u64) -> Vec<Vec<u8>> {
    (from..to)
        .map(|i| format!("{tag}-{i:05}-{}", "p".repeat((i % 13) as usize)).into_bytes())
        .collect()
}

pub fn sink(url: &str) -> HttpSink {
    HttpSink::new(Config::from_url(url).unwrap()).unwrap()
}

/// The sink's error inside a delivery error.
pub fn sink_error(e: &walsink::Error) -> &SinkError {
    match e.kind() {
        ErrorKind::Sink(s) => s,
        other => panic!("not a sink error: {other:?}"),
    }
}

/// A unique sink id for this test.
pub fn id(test: &str) -> String {
    walsink_tokio::conformance::unique_id(test)
}
