//! Helpers for the tests against the local Redis: a harness for the conformance suite in
//! each mode and a plain connection for checks.
#![allow(dead_code)] // each test file uses a different subset

use walsink_redis::{Config, Mode, RedisSink};
use walsink_tokio::conformance::Harness;

/// An `XRANGE` entry: its id and its fields.
pub type StreamEntry = (String, Vec<(String, Vec<u8>)>);

pub const URL: &str = "redis://127.0.0.1:6379/0";

/// A plain connection to the local Redis; a server that does not answer fails the test.
pub async fn redis() -> redis::aio::MultiplexedConnection {
    redis::Client::open(URL)
        .unwrap()
        .get_multiplexed_async_connection_with_config(
            &redis::AsyncConnectionConfig::new()
                .set_response_timeout(Some(std::time::Duration::from_secs(60))),
        )
        .await
        .expect("the local Redis at 127.0.0.1:6379 must answer (WALSINK_TEST_SERVERS=1)")
}

/// The data key template of a test sink id (one key per subtask).
pub fn key(sink_id: &str) -> String {
    format!("walsink-test:{sink_id}:$subtask")
}

pub fn config(sink_id: &str, mode: Mode) -> Config {
    let mut c = Config::from_url(&format!("{URL}?key={}", key(sink_id))).unwrap();
    c.mode = mode;
    c
}

/// What a key holds, in order, as the mode wrote it (hash: `FIELD<TAB>VALUE` by field).
pub async fn contents(c: &Config, subtask: u32) -> Vec<Vec<u8>> {
    let mut r = redis().await;
    let key = c.key_for(subtask);
    match c.mode {
        Mode::List => redis::cmd("LRANGE")
            .arg(&key)
            .arg(0)
            .arg(-1)
            .query_async(&mut r)
            .await
            .unwrap(),
        Mode::Stream => {
            let entries: Vec<StreamEntry> = redis::cmd("XRANGE")
                .arg(&key)
                .arg("-")
                .arg("+")
                .query_async(&mut r)
                .await
                .unwrap();
            entries
                .into_iter()
                .map(|(_, mut fields)| {
                    assert_eq!(fields.len(), 1);
                    let (name, value) = fields.remove(0);
                    assert_eq!(name, "record");
                    value
                })
                .collect()
        }
        Mode::Hash => {
            let pairs: Vec<(Vec<u8>, Vec<u8>)> = redis::cmd("HGETALL")
                .arg(&key)
                .query_async(&mut r)
                .await
                .unwrap();
            let mut v: Vec<Vec<u8>> = pairs
                .into_iter()
                .map(|(f, val)| [f, b"\t".to_vec(), val].concat())
                .collect();
            v.sort_by_key(|r| hash_order(r));
            v
        }
    }
}

/// Hash records of the harness are `NNNNNNNNNN<TAB>value-N`: their field gives the order.
fn hash_order(r: &[u8]) -> u64 {
    let tab = r.iter().position(|b| *b == b'\t').unwrap();
    std::str::from_utf8(&r[..tab]).unwrap().parse().unwrap()
}

/// The conformance harness in one mode.
pub struct RedisHarness(pub Mode);

impl Harness for RedisHarness {
    type Sink = RedisSink;

    async fn sink(&self, sink_id: &str) -> RedisSink {
        let mut c = config(sink_id, self.0);
        c.chunk_records = 97; // many chunks per epoch, and chunks across read chunks
        let mut s = RedisSink::new(c).unwrap();
        s.connect().await.expect("connect to the local Redis");
        s
    }

    async fn read_back(&self, sink_id: &str, subtask: u32) -> Vec<Vec<u8>> {
        contents(&config(sink_id, self.0), subtask).await
    }

    fn record(&self, i: u64) -> Vec<u8> {
        match self.0 {
            Mode::Hash => format!("{i:010}\tvalue-{i}").into_bytes(),
            _ => i.to_string().into_bytes(),
        }
    }

    fn empty_records(&self) -> bool {
        self.0 != Mode::Hash
    }
}

/// A log for `sink_id` (subtask 0) in a temporary directory, with a commit store that
/// forgets: the tests' crashes are new handles on the same directory.
pub fn log(sink_id: &str) -> (tempfile::TempDir, std::sync::Arc<walsink::WalSink>) {
    let dir = tempfile::tempdir().unwrap();
    let wal = open_log(dir.path(), sink_id);
    (dir, wal)
}

pub fn open_log(dir: &std::path::Path, sink_id: &str) -> std::sync::Arc<walsink::WalSink> {
    let (wal, _) = walsink::WalSink::open_with(
        std::sync::Arc::new(walsink::storage::FsStorage::new(dir).unwrap()),
        walsink::Options::new(sink_id).read_chunk_size(64 << 10),
        Box::new(walsink::MemoryCommitStore::new()),
    )
    .unwrap();
    std::sync::Arc::new(wal)
}

/// Appends `records` and seals them as checkpoint `cp`, complete.
pub fn seal(wal: &walsink::WalSink, cp: u64, records: &[Vec<u8>]) {
    wal.append_batch(records.iter().map(|r| r.as_slice()))
        .unwrap();
    wal.checkpoint(cp, format!("meta-{cp}").as_bytes()).unwrap();
    wal.checkpoint_complete(cp).unwrap();
}

pub fn numbered(from: u64, to: u64) -> Vec<Vec<u8>> {
    (from..to)
        .map(|i| format!("rec-{i}").into_bytes())
        .collect()
}

/// A unique sink id for one test.
pub fn sink_id(test: &str) -> String {
    walsink_tokio::conformance::unique_id(test)
}

/// A sink with `chunk_records` records per chunk and `in_flight` chunks per transaction.
pub fn sink_with(id: &str, mode: Mode, chunk_records: usize, in_flight: usize) -> RedisSink {
    let mut c = config(id, mode);
    c.chunk_records = chunk_records;
    c.in_flight = in_flight;
    RedisSink::new(c).unwrap()
}

/// The key of checkpoint `cp` of subtask 0 of `id`.
pub fn epoch_key(id: &str, cp: u64) -> walsink::EpochKey {
    walsink::EpochKey {
        sink_id: id.into(),
        subtask: 0,
        checkpoint: cp,
    }
}

/// A key name unique to this run: `{tag}{pid}x{nanos}`.
pub fn uniq(tag: &str) -> String {
    let n = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    format!("{tag}{}x{:x}", std::process::id(), n & 0xffffffff)
}

/// A config for the data key `key` in `mode`, with `chunk_records` and `in_flight` set.
pub fn cfg(key: &str, mode: Mode, chunk_records: usize, in_flight: usize) -> Config {
    let mut c = Config::new(key).mode(mode);
    c.chunk_records = chunk_records;
    c.in_flight = in_flight;
    c
}

/// The list at `key` on the local Redis.
pub async fn list(key: &str) -> Vec<Vec<u8>> {
    let mut a = redis().await;
    redis::cmd("LRANGE")
        .arg(key)
        .arg(0)
        .arg(-1)
        .query_async(&mut a)
        .await
        .unwrap()
}

/// The `record` fields of the stream at `key` on the local Redis, in order.
pub async fn stream(key: &str) -> Vec<Vec<u8>> {
    let mut a = redis().await;
    let v: Vec<StreamEntry> = redis::cmd("XRANGE")
        .arg(key)
        .arg("-")
        .arg("+")
        .query_async(&mut a)
        .await
        .unwrap();
    v.into_iter()
        .map(|(_, mut f)| {
            assert_eq!(f.len(), 1);
            let (n, v) = f.remove(0);
            assert_eq!(n, "record");
            v
        })
        .collect()
}

/// The hash at `key` on the local Redis.
pub async fn hash(key: &str) -> std::collections::BTreeMap<Vec<u8>, Vec<u8>> {
    let mut a = redis().await;
    let v: Vec<(Vec<u8>, Vec<u8>)> = redis::cmd("HGETALL")
        .arg(key)
        .query_async(&mut a)
        .await
        .unwrap();
    v.into_iter().collect()
}

/// Deletes `keys` on the local Redis.
pub async fn del(keys: &[String]) {
    let mut a = redis().await;
    for k in keys {
        let _: () = redis::cmd("DEL").arg(k).query_async(&mut a).await.unwrap();
    }
}
