//! The async handle against the blocking one, same machine, same run, interleaved rounds:
//! ratios, not absolute times (these machines are noisy). `docs/benchmarks.md` has results.
//!
//! `cargo bench -p walsink-tokio --bench async_vs_sync [-- ROUNDS]`
//!
//! Cases:
//! - `batch64/256B`, `batch64/4KiB`: appends in batches of 64 between checkpoints, per-record
//!   cost, async (`AsyncWal::append_batch`) over sync (`WalSink::append_batch`);
//! - `durable/1`: one writer in durable mode, latency per append, async over sync;
//! - `durable/16`: 16 concurrent writers in durable mode, throughput: async tasks through the
//!   I/O thread, and async tasks that call the blocking API on `spawn_blocking`, over 16
//!   threads on the blocking API.

use std::sync::Arc;
use std::time::Instant;
use walsink::{Mode, Options, WalSink};
use walsink_tokio::AsyncWal;

fn opts(mode: Mode) -> Options {
    Options::new("bench").mode(mode).segment_size(256 << 20)
}

fn rt(workers: usize) -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(workers)
        .enable_all()
        .build()
        .unwrap()
}

/// Seconds per record appending `n` records of `size` bytes in batches of 64.
fn batch_sync(size: usize, n: usize) -> f64 {
    let dir = tempfile::tempdir().unwrap();
    let (wal, _) = WalSink::open(dir.path(), opts(Mode::Checkpointed)).unwrap();
    let rec = vec![7u8; size];
    let batch: Vec<&[u8]> = vec![rec.as_slice(); 64];
    let t = Instant::now();
    for _ in 0..n / 64 {
        wal.append_batch(batch.iter().copied()).unwrap();
    }
    t.elapsed().as_secs_f64() / n as f64
}

fn batch_async(size: usize, n: usize) -> f64 {
    let dir = tempfile::tempdir().unwrap();
    let rt = rt(2);
    rt.block_on(async {
        let (wal, _) = AsyncWal::open(dir.path(), opts(Mode::Checkpointed))
            .await
            .unwrap();
        let rec = vec![7u8; size];
        let batch: Vec<&[u8]> = vec![rec.as_slice(); 64];
        let t = Instant::now();
        for _ in 0..n / 64 {
            wal.append_batch(&batch).await.unwrap();
        }
        let s = t.elapsed().as_secs_f64() / n as f64;
        wal.shutdown().await;
        s
    })
}

/// Seconds per durable append with one writer.
fn durable1_sync(n: usize) -> f64 {
    let dir = tempfile::tempdir().unwrap();
    let (wal, _) = WalSink::open(dir.path(), opts(Mode::Durable)).unwrap();
    let rec = [7u8; 256];
    let t = Instant::now();
    for _ in 0..n {
        wal.append(&rec).unwrap();
    }
    t.elapsed().as_secs_f64() / n as f64
}

fn durable1_async(n: usize) -> f64 {
    let dir = tempfile::tempdir().unwrap();
    rt(2).block_on(async {
        let (wal, _) = AsyncWal::open(dir.path(), opts(Mode::Durable))
            .await
            .unwrap();
        let rec = [7u8; 256];
        let t = Instant::now();
        for _ in 0..n {
            wal.append(&rec).await.unwrap();
        }
        let s = t.elapsed().as_secs_f64() / n as f64;
        wal.shutdown().await;
        s
    })
}

/// Durable appends per second with `w` writers, `n` appends each.
fn durable_sync(w: usize, n: usize) -> f64 {
    let dir = tempfile::tempdir().unwrap();
    let (wal, _) = WalSink::open(dir.path(), opts(Mode::Durable)).unwrap();
    let wal = Arc::new(wal);
    let t = Instant::now();
    std::thread::scope(|s| {
        for _ in 0..w {
            let wal = wal.clone();
            s.spawn(move || {
                let rec = [7u8; 256];
                for _ in 0..n {
                    wal.append(&rec).unwrap();
                }
            });
        }
    });
    (w * n) as f64 / t.elapsed().as_secs_f64()
}

fn durable_async(w: usize, n: usize) -> f64 {
    let dir = tempfile::tempdir().unwrap();
    rt(2).block_on(async {
        let (wal, _) = AsyncWal::open(dir.path(), opts(Mode::Durable))
            .await
            .unwrap();
        let t = Instant::now();
        let tasks: Vec<_> = (0..w)
            .map(|_| {
                let wal = wal.clone();
                tokio::spawn(async move {
                    let rec = [7u8; 256];
                    for _ in 0..n {
                        wal.append(&rec).await.unwrap();
                    }
                })
            })
            .collect();
        for task in tasks {
            task.await.unwrap();
        }
        let r = (w * n) as f64 / t.elapsed().as_secs_f64();
        wal.shutdown().await;
        r
    })
}

fn durable_spawn_blocking(w: usize, n: usize) -> f64 {
    let dir = tempfile::tempdir().unwrap();
    let (wal, _) = WalSink::open(dir.path(), opts(Mode::Durable)).unwrap();
    let wal = Arc::new(wal);
    rt(2).block_on(async {
        let t = Instant::now();
        let tasks: Vec<_> = (0..w)
            .map(|_| {
                let wal = wal.clone();
                tokio::spawn(async move {
                    for _ in 0..n {
                        let wal = wal.clone();
                        tokio::task::spawn_blocking(move || wal.append(&[7u8; 256]))
                            .await
                            .unwrap()
                            .unwrap();
                    }
                })
            })
            .collect();
        for task in tasks {
            task.await.unwrap();
        }
        (w * n) as f64 / t.elapsed().as_secs_f64()
    })
}

/// Seconds per disabled call site (no subscriber): the event of an append batch and the span
/// of a delivery, as the core emits them.
fn tracing_call_sites(n: usize) -> f64 {
    let id: Arc<str> = "bench".into();
    let t = Instant::now();
    for i in 0..n {
        tracing::trace!(sink_id = %id, "append batch");
        let _s = tracing::info_span!(
            "deliver",
            sink_id = %id,
            subtask = 0u32,
            checkpoint = i as u64,
            records = 64u64,
            bytes = 16384u64
        )
        .entered();
        std::hint::black_box(&_s);
    }
    t.elapsed().as_secs_f64() / (2 * n) as f64
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[v.len() / 2]
}

fn show(name: &str, what: &str, ratios: &mut [f64]) {
    let med = median(ratios);
    println!(
        "{name:<24} {what:<44} median {med:.4}  range {:.4}-{:.4}  ({} rounds)",
        ratios[0],
        ratios[ratios.len() - 1],
        ratios.len()
    );
}

fn main() {
    let rounds: usize = std::env::args()
        .skip(1)
        .find_map(|a| a.parse().ok())
        .unwrap_or(5);
    let mut r = std::collections::BTreeMap::<&str, Vec<f64>>::new();
    let mut push = |k: &'static str, v: f64| r.entry(k).or_default().push(v);
    for round in 0..rounds {
        eprintln!("round {}/{rounds}", round + 1);
        let (s, a) = (batch_sync(256, 200_000), batch_async(256, 200_000));
        push("batch64/256B", a / s);
        // One disabled call site per 64-record batch, against the batch's cost.
        push(
            "tracing/batch64/256B",
            tracing_call_sites(1_000_000) / (64.0 * s),
        );
        let (s, a) = (batch_sync(4096, 50_000), batch_async(4096, 50_000));
        push("batch64/4KiB", a / s);
        let (s, a) = (durable1_sync(1000), durable1_async(1000));
        push("durable/1", a / s);
        let s = durable_sync(16, 400);
        let a = durable_async(16, 400);
        let b = durable_spawn_blocking(16, 400);
        push("durable/16", a / s);
        push("durable/16 spawn_blocking", b / s);
    }
    println!();
    for (k, mut v) in r {
        let what = match k {
            "batch64/256B" | "batch64/4KiB" => "per-record cost, async / sync (lower is better)",
            "durable/1" => "latency per append, async / sync (lower is better)",
            "durable/16" => "throughput, async tasks / sync threads (higher)",
            "tracing/batch64/256B" => "a disabled call site / a 64-record batch append",
            _ => "throughput, spawn_blocking / sync threads (higher)",
        };
        show(k, what, &mut v);
    }
}
