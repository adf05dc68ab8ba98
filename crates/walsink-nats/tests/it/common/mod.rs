//! Helpers for the tests against the local NATS server with JetStream: a stream per test,
//! reading a stream back with its message ids, the conformance harness, a cutting proxy.
#![allow(dead_code)] // each test file uses a different subset

use async_nats::jetstream::{self, consumer};
use futures_util::StreamExt;
use std::time::Duration;
use walsink_nats::{Config, NatsSink};
use walsink_tokio::conformance::Harness;

pub const ADDR: &str = "127.0.0.1:4222";

pub async fn js() -> jetstream::Context {
    let c = async_nats::connect(ADDR)
        .await
        .expect("the local NATS at 127.0.0.1:4222 must answer (WALSINK_TEST_SERVERS=1)");
    jetstream::new(c)
}

/// A stream of its own for one test, capturing `walsink-test.NAME`; deleted on drop.
pub struct TestStream {
    pub name: String,
    pub subject: String,
}

impl TestStream {
    pub async fn new(tag: &str, window: Option<Duration>) -> TestStream {
        let u = walsink_tokio::conformance::unique_id(tag).replace(['.', '-'], "_");
        let s = TestStream {
            name: format!("WALSINK_TEST_{u}"),
            subject: format!("walsink-test.{u}"),
        };
        let mut cfg = jetstream::stream::Config {
            name: s.name.clone(),
            subjects: vec![s.subject.clone()],
            ..Default::default()
        };
        if let Some(w) = window {
            cfg.duplicate_window = w;
        }
        js().await
            .create_stream(cfg)
            .await
            .expect("create the test stream");
        s
    }

    pub fn config(&self) -> Config {
        Config::new(&self.name, &self.subject)
    }

    /// Every message of the stream, in order: its `Nats-Msg-Id` and payload.
    pub async fn read(&self) -> Vec<(String, Vec<u8>)> {
        let js = js().await;
        let mut stream = js.get_stream(&self.name).await.unwrap();
        let total = stream.info().await.unwrap().state.messages;
        if total == 0 {
            return Vec::new();
        }
        let consumer = stream
            .create_consumer(consumer::pull::OrderedConfig::default())
            .await
            .unwrap();
        let mut msgs = consumer.messages().await.unwrap();
        let mut out = Vec::with_capacity(total as usize);
        while (out.len() as u64) < total {
            let m = tokio::time::timeout(Duration::from_secs(30), msgs.next())
                .await
                .expect("the stream's messages within 30 s")
                .expect("a message")
                .unwrap();
            let id = m
                .headers
                .as_ref()
                .and_then(|h| h.get("Nats-Msg-Id"))
                .map(|v| v.as_str().to_string())
                .unwrap_or_default();
            out.push((id, m.payload.to_vec()));
        }
        out
    }

    /// The records of `(sink_id, subtask)` in stream order; fails on a repeated message id.
    pub async fn records_of(&self, sink_id: &str, subtask: u32) -> Vec<Vec<u8>> {
        let prefix = format!("{sink_id}:{subtask}:");
        let mut seen = std::collections::HashSet::new();
        self.read()
            .await
            .into_iter()
            .filter(|(id, _)| id.starts_with(&prefix))
            .map(|(id, p)| {
                assert!(seen.insert(id.clone()), "message id {id} stored twice");
                p
            })
            .collect()
    }

    pub async fn delete(&self) {
        let _ = js().await.delete_stream(&self.name).await;
    }
}

/// The conformance harness: every check's sink id publishes into one test stream.
pub struct NatsHarness(pub TestStream);

impl Harness for NatsHarness {
    type Sink = NatsSink;

    async fn sink(&self, _sink_id: &str) -> NatsSink {
        let mut s = NatsSink::new(self.0.config()).unwrap();
        s.connect().await.expect("connect to the local NATS");
        s
    }

    async fn read_back(&self, sink_id: &str, subtask: u32) -> Vec<Vec<u8>> {
        self.0.records_of(sink_id, subtask).await
    }
}

/// A log for `sink_id` in a temporary directory with a commit store that forgets.
pub fn log(sink_id: &str) -> (tempfile::TempDir, std::sync::Arc<walsink::WalSink>) {
    let dir = tempfile::tempdir().unwrap();
    let (wal, _) = walsink::WalSink::open_with(
        std::sync::Arc::new(walsink::storage::FsStorage::new(dir.path()).unwrap()),
        walsink::Options::new(sink_id),
        Box::new(walsink::MemoryCommitStore::new()),
    )
    .unwrap();
    (dir, std::sync::Arc::new(wal))
}

/// Appends `records` and seals them as checkpoint `cp`, complete.
pub fn seal(wal: &walsink::WalSink, cp: u64, records: &[Vec<u8>]) {
    wal.append_batch(records.iter().map(|r| r.as_slice()))
        .unwrap();
    wal.checkpoint(cp, b"").unwrap();
    wal.checkpoint_complete(cp).unwrap();
}

pub fn numbered(from: u64, to: u64) -> Vec<Vec<u8>> {
    (from..to)
        .map(|i| format!("rec-{i}").into_bytes())
        .collect()
}

/// The sealed, deliverable epochs of `wal`, read once (without marking them).
pub fn epochs(wal: &walsink::WalSink) -> Vec<walsink::Epoch> {
    let mut d = wal.deliverer().unwrap();
    let mut out = Vec::new();
    // The deliverer hands out one epoch at a time; finishing it (Ok) moves to the next.
    while let walsink::Next::Deliver(p) = d.next_step().unwrap() {
        let e = d.read(&p).unwrap();
        out.push(e.clone());
        d.finish(p, &e, Ok(())).unwrap();
    }
    out
}

/// A TCP proxy on loopback in front of the local NATS that can cut every connection.
pub struct Proxy {
    pub port: u16,
    cut: tokio::sync::watch::Sender<u64>,
}

impl Proxy {
    pub async fn start() -> Proxy {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = l.local_addr().unwrap().port();
        let (cut, rx) = tokio::sync::watch::channel(0u64);
        tokio::spawn(async move {
            loop {
                let Ok((mut inbound, _)) = l.accept().await else {
                    return;
                };
                let mut rx = rx.clone();
                rx.borrow_and_update();
                tokio::spawn(async move {
                    let Ok(mut out) = tokio::net::TcpStream::connect(ADDR).await else {
                        return;
                    };
                    tokio::select! {
                        _ = tokio::io::copy_bidirectional(&mut inbound, &mut out) => {}
                        _ = rx.changed() => {} // dropping both ends cuts the connection
                    }
                });
            }
        });
        Proxy { port, cut }
    }

    /// Cuts every connection open now.
    pub fn cut(&self) {
        self.cut.send_modify(|n| *n += 1);
    }
}

/// Awaits `f`, failing the test if it takes over 90 s (a hang, not a slow server).
pub async fn bounded<T>(f: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(Duration::from_secs(90), f)
        .await
        .expect("hung for 90 s")
}
