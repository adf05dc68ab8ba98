//! criterion benches of walsink's own paths. Absolute times are noise on shared machines:
//! the published comparison (ratios to raw disk floors and to peers, in interleaved rounds)
//! is `compare/` and docs/benchmarks.md.

use criterion::{criterion_group, criterion_main, BatchSize, BenchmarkId, Criterion, Throughput};
use std::sync::Arc;
use std::time::{Duration, Instant};
use walsink::{Epoch, Mode, Options, Sink, SinkError, WalSink};

fn opts() -> Options {
    Options::new("bench")
        .max_record_size(64 << 10)
        .max_metadata_size(1024)
}

fn open(dir: &tempfile::TempDir, o: Options) -> WalSink {
    WalSink::open(dir.path(), o).expect("open").0
}

/// Appends between checkpoints: buffered, no sync.
fn append(c: &mut Criterion) {
    let mut g = c.benchmark_group("append_between_checkpoints");
    for size in [64usize, 256, 4096] {
        let n = (8 << 20) / size;
        let rec = vec![0x5au8; size];
        g.throughput(Throughput::Bytes((n * size) as u64));
        g.bench_with_input(BenchmarkId::from_parameter(size), &size, |b, _| {
            b.iter_batched(
                || {
                    let dir = tempfile::tempdir().unwrap();
                    let wal = open(&dir, opts());
                    (dir, wal)
                },
                |(dir, wal)| {
                    for _ in 0..n {
                        wal.append(&rec).unwrap();
                    }
                    (dir, wal)
                },
                BatchSize::PerIteration,
            )
        });
    }
    g.finish();
}

/// A checkpoint of 1000 records of 256 B: one write and one fdatasync.
fn checkpoint(c: &mut Criterion) {
    let dir = tempfile::tempdir().unwrap();
    let wal = open(&dir, opts());
    let rec = vec![1u8; 256];
    let mut id = 0;
    c.bench_function("checkpoint_1000x256B", |b| {
        b.iter_custom(|iters| {
            let mut total = Duration::ZERO;
            for _ in 0..iters {
                for _ in 0..1000 {
                    wal.append(&rec).unwrap();
                }
                id += 1;
                let t = Instant::now();
                wal.checkpoint(id, b"").unwrap();
                total += t.elapsed();
            }
            total
        })
    });
}

/// Durable appends of 256 B from 1, 4 and 16 threads (group commit).
fn durable(c: &mut Criterion) {
    let mut g = c.benchmark_group("durable_append");
    g.sample_size(10);
    for threads in [1usize, 4, 16] {
        g.throughput(Throughput::Elements(threads as u64 * 50));
        g.bench_with_input(
            BenchmarkId::from_parameter(threads),
            &threads,
            |b, &threads| {
                let dir = tempfile::tempdir().unwrap();
                let wal = Arc::new(open(&dir, opts().mode(Mode::Durable)));
                b.iter_custom(|iters| {
                    let start = Instant::now();
                    for _ in 0..iters {
                        let hs: Vec<_> = (0..threads)
                            .map(|_| {
                                let wal = wal.clone();
                                std::thread::spawn(move || {
                                    for _ in 0..50 {
                                        wal.append(&[7u8; 256]).unwrap();
                                    }
                                })
                            })
                            .collect();
                        for h in hs {
                            h.join().unwrap();
                        }
                    }
                    start.elapsed()
                })
            },
        );
    }
    g.finish();
}

fn build_log(bytes: usize) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let wal = open(&dir, opts());
    let rec = vec![3u8; 4096];
    for i in 0..bytes / 4096 {
        wal.append(&rec).unwrap();
        if (i + 1) % 4096 == 0 {
            wal.checkpoint(i as u64, b"").unwrap();
        }
    }
    wal.checkpoint(u64::MAX - 1, b"").unwrap();
    dir
}

/// Recovery (open) of a 64 MiB log in the page cache.
fn recovery(c: &mut Criterion) {
    let mut g = c.benchmark_group("recovery");
    g.sample_size(10);
    let dir = build_log(64 << 20);
    g.throughput(Throughput::Bytes(64 << 20));
    g.bench_function("open_64MiB", |b| {
        b.iter(|| WalSink::open(dir.path(), opts()).unwrap())
    });
    g.finish();
}

struct Null;
impl Sink for Null {
    fn deliver(&mut self, epoch: &Epoch) -> Result<(), SinkError> {
        for chunk in epoch.chunks() {
            for r in chunk?.records() {
                std::hint::black_box(r.data);
            }
        }
        Ok(())
    }
}

/// Delivery of a 32 MiB backlog to a sink that does nothing (commit marks included).
fn delivery(c: &mut Criterion) {
    let mut g = c.benchmark_group("delivery");
    g.sample_size(10);
    g.throughput(Throughput::Bytes(32 << 20));
    g.bench_function("null_sink_32MiB", |b| {
        b.iter_batched(
            || {
                let dir = build_log(32 << 20);
                let wal = open(&dir, opts());
                wal.restore(wal.pending().last().map(|p| p.id)).unwrap();
                (dir, wal)
            },
            |(dir, wal)| {
                wal.deliver_ready(&mut Null).unwrap();
                (dir, wal)
            },
            BatchSize::PerIteration,
        )
    });
    g.finish();
}

criterion_group!(benches, append, checkpoint, durable, recovery, delivery);
criterion_main!(benches);
