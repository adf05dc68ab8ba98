//! Helpers for the server tests: unique names, a raw client, the conformance harness.
#![allow(dead_code)] // each test file uses a different subset

use mysql_async::prelude::Queryable;
use std::sync::Arc;
use std::time::Duration;
use walsink::{MemoryCommitStore, Options, RetryPolicy, WalSink};
use walsink_mysql::{Config, MySqlSink};
use walsink_tokio::conformance::Harness;

/// The shared server of DEVELOPERS.md.
pub const SHARED: &str = "mysql://root@127.0.0.1:3306/test";

/// A name unique to this run: `{tag}_{pid}_{nanos}`.
pub fn unique(tag: &str) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    format!("{tag}_{}_{:x}", std::process::id(), nanos & 0xffff_ffff)
}

/// A plain connection to `url` (`mysql://USER@HOST:PORT/DB`).
pub async fn client(url: &str) -> mysql_async::Conn {
    let opts = mysql_async::Opts::from_url(url).unwrap_or_else(|e| panic!("{url}: {e}"));
    mysql_async::Conn::new(mysql_async::OptsBuilder::from_opts(opts).prefer_socket(false))
        .await
        .unwrap_or_else(|e| panic!("connect to {url}: {e}"))
}

/// The payloads of `table` for `(sink_id, subtask)`, by checkpoint and index.
pub async fn rows(url: &str, table: &str, sink_id: &str, subtask: u32) -> Vec<Vec<u8>> {
    let mut c = client(url).await;
    let r = c
        .exec(
            format!(
                "SELECT payload FROM {table} WHERE sink_id = ? AND subtask = ? ORDER BY checkpoint, idx"
            ),
            (sink_id, subtask),
        )
        .await
        .unwrap();
    c.disconnect().await.ok();
    r
}

/// The conformance harness: one table per harness, sinks by URL.
pub struct My {
    pub url: String,
    pub table: String,
    pub extra: String,
}

impl My {
    pub fn new(url: &str, extra: &str) -> My {
        My {
            url: url.to_string(),
            table: unique("conf"),
            extra: extra.to_string(),
        }
    }

    pub fn config(&self) -> Config {
        Config::from_url(&format!("{}?table={}{}", self.url, self.table, self.extra)).unwrap()
    }
}

impl Harness for My {
    type Sink = MySqlSink;

    async fn sink(&self, _sink_id: &str) -> MySqlSink {
        MySqlSink::new(self.config())
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

/// Appends `recs` and seals them as checkpoint `cp`, complete.
pub fn epoch_of(wal: &WalSink, cp: u64, recs: Vec<Vec<u8>>) -> Vec<Vec<u8>> {
    wal.append_batch(recs.iter().map(|r| r.as_slice())).unwrap();
    wal.checkpoint(cp, format!("meta {cp}").as_bytes()).unwrap();
    wal.checkpoint_complete(cp).unwrap();
    recs
}

/// Appends records `range` and seals them as checkpoint `cp`, complete.
pub fn epoch(wal: &WalSink, cp: u64, range: std::ops::Range<u64>) -> Vec<Vec<u8>> {
    epoch_of(wal, cp, range.map(record).collect())
}

/// Waits (bounded) until checkpoint `id` is committed.
pub async fn wait_committed(wal: &Arc<WalSink>, id: u64, secs: u64) -> bool {
    let w = wal.clone();
    tokio::task::spawn_blocking(move || w.wait_committed(id, Duration::from_secs(secs)))
        .await
        .unwrap()
}
