//! Delivery through walsink into a local null HTTP server against raw POSTs of the same
//! bodies with the same client to the same server, interleaved rounds in one run.
//!
//! walsink's side: the epochs are appended and checkpointed before the clock starts. Two
//! times: `HttpSink::deliver` alone (iterating the records, cutting them into chunks, the
//! POSTs; in a loop of its own, without read-ahead), and the whole of
//! `walsink_tokio::deliver_ready` over a second copy of the log (also reading each epoch back
//! from the log, the next one while the sink takes one, and one durable commit mark per
//! epoch).
//! The floor: the same bodies, cut beforehand by the same chunker, POSTed with a `reqwest` client built the same way, with the same headers and
//! the same number in flight. The server (`receiver::Mode::Null`) reads and drops each body.
//!
//! `cargo bench -p walsink-http --features receiver --bench http [-- ROUNDS]`

use bytes::Bytes;
use std::time::{Duration, Instant};
use walsink::{Next, Options, WalSink};
use walsink_http::chunking::{Chunker, Newline};
use walsink_http::receiver::{Mode, Receiver};
use walsink_http::{Config, HttpSink};
use walsink_tokio::AsyncSink;

struct Case {
    name: &'static str,
    epochs: u64,
    per_epoch: u64,
    record: usize,
    max_records: usize,
    concurrency: usize,
}

fn record(i: u64, size: usize) -> Vec<u8> {
    let mut r = format!("{{\"id\":{i},\"v\":\"").into_bytes();
    r.resize(size - 2, b'x');
    r.extend_from_slice(b"\"}");
    r
}

fn bodies(c: &Case) -> Vec<(String, Bytes)> {
    let mut out = Vec::new();
    for cp in 1..=c.epochs {
        let mut ch = Chunker::new(walsink_http::chunking::Chunking {
            max_records: c.max_records,
            max_bytes: walsink_http::DEFAULT_MAX_BYTES,
            newline: Newline::Reject,
        });
        let mut push = |b: walsink_http::chunking::Body| {
            out.push((format!("raw:0:{cp}:{}", b.chunk), b.bytes));
        };
        for i in 0..c.per_epoch {
            if let Some(b) = ch.push(&record(cp * c.per_epoch + i, c.record)).unwrap() {
                push(b);
            }
        }
        if let Some(b) = ch.finish() {
            push(b);
        }
    }
    out
}

/// The client `HttpSink` builds, built the same way.
fn client(c: &Case) -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(walsink_http::DEFAULT_TIMEOUT)
        .connect_timeout(Duration::from_secs(10))
        .redirect(reqwest::redirect::Policy::none())
        .pool_max_idle_per_host(c.concurrency)
        .user_agent("walsink-http-bench")
        .build()
        .unwrap()
}

async fn raw(client: &reqwest::Client, url: &str, bodies: &[(String, Bytes)], inflight: usize) {
    let mut set = tokio::task::JoinSet::new();
    for (key, body) in bodies {
        while set.len() >= inflight {
            set.join_next().await.unwrap().unwrap();
        }
        let req = client
            .post(url)
            .header("content-type", walsink_http::DEFAULT_CONTENT_TYPE)
            .header("idempotency-key", key)
            .body(body.clone());
        set.spawn(async move {
            let r = req.send().await.unwrap();
            assert!(r.status().is_success());
            r.bytes().await.unwrap();
        });
    }
    while let Some(r) = set.join_next().await {
        r.unwrap();
    }
}

/// The sink of one case, built once and kept across its rounds as a pipeline keeps it (its
/// connections and body buffers warm), as the floor keeps its client.
fn sink(c: &Case, url: &str) -> HttpSink {
    let mut cfg = Config::from_url(url).unwrap();
    cfg.max_records = c.max_records;
    cfg.concurrency = c.concurrency;
    HttpSink::new(cfg).unwrap()
}

/// Times of one walsink round.
struct Round {
    /// `HttpSink::deliver` alone, summed over the epochs: iterating the records, cutting
    /// them, the POSTs. The same work as the floor plus the cut. Measured in a delivery loop
    /// of its own that reads each epoch before handing it over (no read-ahead competing for
    /// the two cores), so it is the sink's share alone.
    sink: Duration,
    /// The whole delivery, `walsink_tokio::deliver_ready` over a second copy of the log:
    /// the POSTs, reading each epoch back from the log (the next one while the sink takes
    /// one), and one durable commit mark per epoch (`mark_every` 1, as `walsink pipe` runs).
    total: Duration,
}

/// A log holding the case's epochs, sealed and completed.
fn sealed_log(c: &Case, dir: &std::path::Path, sink_id: String) -> std::sync::Arc<WalSink> {
    let (wal, _) = WalSink::open(dir, Options::new(sink_id)).unwrap();
    for cp in 1..=c.epochs {
        let recs: Vec<Vec<u8>> = (0..c.per_epoch)
            .map(|i| record(cp * c.per_epoch + i, c.record))
            .collect();
        wal.append_batch(recs.iter().map(|r| r.as_slice())).unwrap();
        wal.checkpoint(cp, b"").unwrap();
    }
    wal.checkpoint_complete(c.epochs).unwrap();
    std::sync::Arc::new(wal)
}

async fn through_walsink(c: &Case, sink: &mut HttpSink, round: u64) -> Round {
    let dir = tempfile::tempdir().unwrap();
    // The sink's share: the protocol's steps driven here, one epoch at a time.
    let wal = sealed_log(c, &dir.path().join("a"), format!("bench{round}a"));
    let mut in_sink = Duration::ZERO;
    let mut d = wal.deliverer().unwrap();
    let mut n = 0;
    loop {
        match d.next_step().unwrap() {
            Next::Idle => break,
            Next::Committed(_) => {}
            Next::Deliver(p) => {
                let e = d.read(&p).unwrap();
                let s = Instant::now();
                sink.deliver(&e).await.unwrap();
                in_sink += s.elapsed();
                d.finish(p, &e, Ok(())).unwrap();
                n += 1;
            }
        }
    }
    d.flush().unwrap();
    drop(d);
    assert_eq!(n, c.epochs);
    // The whole delivery, as a pipeline runs it.
    let wal = sealed_log(c, &dir.path().join("b"), format!("bench{round}b"));
    let t = Instant::now();
    let n = walsink_tokio::deliver_ready(&wal, sink).await.unwrap();
    let total = t.elapsed();
    assert_eq!(n as u64, c.epochs);
    Round {
        sink: in_sink,
        total,
    }
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[v.len() / 2]
}

fn main() {
    let rounds: usize = std::env::args()
        .skip(1)
        .find_map(|a| a.parse().ok())
        .unwrap_or(7);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let server = rt.block_on(Receiver::start(Mode::Null)).unwrap();
    let url = server.url("ingest");
    let cases = [
        Case {
            name: "100 B records, 6 MB epochs, 1000 per request, 1 in flight",
            epochs: 6,
            per_epoch: 60_000,
            record: 100,
            max_records: 1000,
            concurrency: 1,
        },
        Case {
            name: "1 KiB records, 6 MB epochs, 500 per request, 4 in flight",
            epochs: 6,
            per_epoch: 6_000,
            record: 1024,
            max_records: 500,
            concurrency: 4,
        },
        Case {
            name: "100 B records, 1 MB epochs, 1000 per request, 1 in flight",
            epochs: 20,
            per_epoch: 10_000,
            record: 100,
            max_records: 1000,
            concurrency: 1,
        },
    ];
    println!("| case | MB/round | requests/round | raw POSTs ms | HttpSink ms | whole delivery ms | HttpSink / raw: median (min–max) | whole delivery / raw: median (min–max) |");
    println!("|---|---|---|---|---|---|---|---|");
    for c in &cases {
        let bodies = bodies(c);
        let mb = bodies.iter().map(|b| b.1.len()).sum::<usize>() as f64 / 1e6;
        let client = client(c);
        let mut sink = sink(c, &url);
        // Warm both paths (connections, buffers, page cache).
        rt.block_on(raw(&client, &url, &bodies, c.concurrency));
        rt.block_on(through_walsink(c, &mut sink, 999));
        let (mut rs, mut ss, mut ts) = (Vec::new(), Vec::new(), Vec::new());
        let (mut sink_ratio, mut total_ratio) = (Vec::new(), Vec::new());
        for round in 0..rounds {
            let timed_raw = || {
                let t = Instant::now();
                rt.block_on(raw(&client, &url, &bodies, c.concurrency));
                t.elapsed()
            };
            let (w, r) = if round % 2 == 0 {
                let w = rt.block_on(through_walsink(c, &mut sink, round as u64));
                (w, timed_raw())
            } else {
                let r = timed_raw();
                (rt.block_on(through_walsink(c, &mut sink, round as u64)), r)
            };
            let ms = |d: Duration| d.as_secs_f64() * 1e3;
            rs.push(ms(r));
            ss.push(ms(w.sink));
            ts.push(ms(w.total));
            // Throughput ratios: above 1 means faster than the floor.
            sink_ratio.push(ms(r) / ms(w.sink));
            total_ratio.push(ms(r) / ms(w.total));
        }
        let spread = |v: &mut Vec<f64>| {
            let (lo, hi) = (
                v.iter().cloned().fold(f64::MAX, f64::min),
                v.iter().cloned().fold(0.0, f64::max),
            );
            format!("{:.2}x ({lo:.2}–{hi:.2})", median(v))
        };
        println!(
            "| {} | {mb:.1} | {} | {:.1} | {:.1} | {:.1} | {} | {} |",
            c.name,
            bodies.len(),
            median(&mut rs),
            median(&mut ss),
            median(&mut ts),
            spread(&mut sink_ratio),
            spread(&mut total_ratio),
        );
    }
    let (requests, bytes) = server.seen(|s| (s.requests, s.bytes));
    println!(
        "\nserver: {requests} requests, {:.0} MB received; {rounds} interleaved rounds per case",
        bytes as f64 / 1e6
    );
}
