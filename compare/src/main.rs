//! Side-by-side benchmark: walsink, okaywal 0.3.1, raft-engine 0.4.2 and the disk's own
//! floors, in one process, in interleaved rounds, with identical record sizes, counts and
//! durability. Every result is reported as a ratio to the matching floor measured in the same
//! round, because this machine's disk switches between a fast and a throttled mode.
//!
//! Usage: `cargo run --release --manifest-path compare/Cargo.toml -- [--rounds N] [--quick]
//! [--only CASE-PREFIX] [--durable-ops N]`

use std::fs::{File, OpenOptions};
use std::io::{BufWriter, Read, Write};
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};
use walsink::{Mode, Options, WalSink};

const MIB: u64 = 1 << 20;

#[derive(Clone, Copy)]
struct Cfg {
    rounds: usize,
    bulk_bytes: u64,
    durable_ops: u64,
    recovery_bytes: u64,
    memory_bytes: u64,
}

/// One measurement: elapsed time for `ops` operations moving `bytes` bytes.
#[derive(Clone, Copy)]
struct Run {
    secs: f64,
    ops: u64,
    bytes: u64,
    /// Write requests the block devices completed meanwhile (0 where not counted).
    disk_writes: u64,
    /// CPU time (user and system, all threads) the process used meanwhile (0 where not
    /// counted).
    cpu_secs: f64,
}

/// CPU time, user and system, of every thread of the process so far (exited ones included).
fn cpu_time() -> f64 {
    // SAFETY: getrusage only writes the struct it is given.
    let mut u: libc::rusage = unsafe { std::mem::zeroed() };
    if unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut u) } != 0 {
        return 0.0;
    }
    let tv = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    tv(u.ru_utime) + tv(u.ru_stime)
}

/// Write requests completed by the machine's block devices so far (field 5 of
/// `/sys/block/*/stat`), or 0 where that cannot be read. Counting them for a durable case
/// shows what each sync costs the disk, which timings on a shared disk hide in noise.
fn disk_writes() -> u64 {
    let Ok(dir) = std::fs::read_dir("/sys/block") else {
        return 0;
    };
    dir.flatten()
        .filter(|d| {
            let n = d.file_name();
            let n = n.to_string_lossy();
            !n.starts_with("loop") && !n.starts_with("ram")
        })
        .filter_map(|d| std::fs::read_to_string(d.path().join("stat")).ok())
        .filter_map(|s| s.split_whitespace().nth(4)?.parse::<u64>().ok())
        .sum()
}

/// One implementation of a case: its name and how to run it in a directory.
type Imp<'a> = (&'static str, Box<dyn Fn(&Path) -> Run + 'a>);

fn record(i: u64, size: usize) -> Vec<u8> {
    // Incompressible-looking bytes, so no implementation is flattered by compression.
    let mut x = i.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..size)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

fn records(n: u64, size: usize) -> Vec<Vec<u8>> {
    (0..n).map(|i| record(i, size)).collect()
}

fn timed(ops: u64, bytes: u64, f: impl FnOnce()) -> Run {
    let (w, c) = (disk_writes(), cpu_time());
    let t = Instant::now();
    f();
    Run {
        secs: t.elapsed().as_secs_f64(),
        ops,
        bytes,
        disk_writes: disk_writes().saturating_sub(w),
        cpu_secs: cpu_time() - c,
    }
}

// ---------- floors ----------

/// Buffered sequential write of the same bytes, then one fdatasync.
fn floor_buffered(dir: &Path, recs: &[Vec<u8>]) -> Run {
    let bytes: u64 = recs.iter().map(|r| r.len() as u64).sum();
    timed(recs.len() as u64, bytes, || {
        let f = File::create(dir.join("floor")).unwrap();
        let mut w = BufWriter::with_capacity(256 << 10, f);
        for r in recs {
            w.write_all(r).unwrap();
        }
        let f = w.into_inner().unwrap();
        f.sync_data().unwrap();
    })
}

/// pwrite + fdatasync of each record on a preallocated, zero-filled file: the per-write
/// durability floor (one writer).
fn floor_fsync_loop(dir: &Path, recs: &[Vec<u8>]) -> Run {
    let path = dir.join("floor-fsync");
    let size: u64 = recs.iter().map(|r| r.len() as u64).sum();
    {
        let mut f = File::create(&path).unwrap();
        f.write_all(&vec![0u8; size as usize]).unwrap();
        f.sync_all().unwrap();
    }
    let f = OpenOptions::new().write(true).open(&path).unwrap();
    let mut off = 0u64;
    timed(recs.len() as u64, size, || {
        for r in recs {
            f.write_all_at(r, off).unwrap();
            f.sync_data().unwrap();
            off += r.len() as u64;
        }
    })
}

/// Sequential read of files with read(2), 1 MiB at a time (page cache warm).
fn floor_read(paths: &[std::path::PathBuf]) -> Run {
    let mut buf = vec![0u8; MIB as usize];
    let mut total = 0u64;
    let t = Instant::now();
    for p in paths {
        let mut f = File::open(p).unwrap();
        loop {
            let n = f.read(&mut buf).unwrap();
            if n == 0 {
                break;
            }
            total += n as u64;
            std::hint::black_box(&buf[..n]);
        }
    }
    Run {
        secs: t.elapsed().as_secs_f64(),
        ops: 1,
        bytes: total,
        disk_writes: 0,
        cpu_secs: 0.0,
    }
}

// ---------- walsink ----------

fn ws_opts() -> Options {
    Options::new("bench")
        .max_record_size(64 << 10)
        .max_metadata_size(1024)
}

fn walsink_bulk(dir: &Path, recs: &[Vec<u8>]) -> Run {
    let (wal, _) = WalSink::open(dir.join("ws"), ws_opts()).unwrap();
    let bytes: u64 = recs.iter().map(|r| r.len() as u64).sum();
    timed(recs.len() as u64, bytes, || {
        for r in recs {
            wal.append(r).unwrap();
        }
        wal.checkpoint(1, b"").unwrap();
    })
}

fn walsink_durable(dir: &Path, recs: Arc<Vec<Vec<u8>>>, threads: usize) -> Run {
    let (wal, _) = WalSink::open(dir.join("ws"), ws_opts().mode(Mode::Durable)).unwrap();
    let wal = Arc::new(wal);
    concurrent(recs, threads, move |r| wal.append(r).unwrap())
}

fn concurrent(
    recs: Arc<Vec<Vec<u8>>>,
    threads: usize,
    f: impl Fn(&[u8]) + Send + Sync + 'static,
) -> Run {
    let f = Arc::new(f);
    let n = recs.len() as u64;
    let bytes: u64 = recs.iter().map(|r| r.len() as u64).sum();
    let barrier = Arc::new(std::sync::Barrier::new(threads + 1));
    let handles: Vec<_> = (0..threads)
        .map(|t| {
            let (recs, f, barrier) = (recs.clone(), f.clone(), barrier.clone());
            std::thread::spawn(move || {
                barrier.wait();
                for r in recs.iter().skip(t).step_by(threads) {
                    f(r);
                }
            })
        })
        .collect();
    let (w, c) = (disk_writes(), cpu_time());
    let start = Instant::now();
    barrier.wait();
    for h in handles {
        h.join().unwrap();
    }
    Run {
        secs: start.elapsed().as_secs_f64(),
        ops: n,
        bytes,
        disk_writes: disk_writes().saturating_sub(w),
        cpu_secs: cpu_time() - c,
    }
}

// ---------- okaywal ----------

fn okaywal_open(dir: &Path) -> okaywal::WriteAheadLog {
    okaywal::Configuration::default_for(dir.join("ok"))
        .open(okaywal::LogVoid)
        .unwrap()
}

fn okaywal_bulk(dir: &Path, recs: &[Vec<u8>]) -> Run {
    let wal = okaywal_open(dir);
    let bytes: u64 = recs.iter().map(|r| r.len() as u64).sum();
    let run = timed(recs.len() as u64, bytes, || {
        let mut e = wal.begin_entry().unwrap();
        for r in recs {
            e.write_chunk(r).unwrap();
        }
        e.commit().unwrap();
    });
    wal.shutdown().unwrap();
    run
}

fn okaywal_durable(dir: &Path, recs: Arc<Vec<Vec<u8>>>, threads: usize) -> Run {
    let wal = okaywal_open(dir);
    let w = wal.clone();
    let run = concurrent(recs, threads, move |r| {
        let mut e = w.begin_entry().unwrap();
        e.write_chunk(r).unwrap();
        e.commit().unwrap();
    });
    wal.shutdown().unwrap();
    run
}

// ---------- raft-engine ----------

fn raft_open(dir: &Path) -> raft_engine::Engine {
    let cfg = raft_engine::Config {
        dir: dir.join("re").to_string_lossy().into_owned(),
        // Compression off: the records are incompressible anyway, and it must not flatter it.
        batch_compression_threshold: raft_engine::ReadableSize(0),
        ..Default::default()
    };
    raft_engine::Engine::open(cfg).unwrap()
}

fn raft_bulk(dir: &Path, recs: &[Vec<u8>]) -> Run {
    let engine = raft_open(dir);
    let bytes: u64 = recs.iter().map(|r| r.len() as u64).sum();
    timed(recs.len() as u64, bytes, || {
        let mut batch = raft_engine::LogBatch::default();
        let n = recs.len();
        for (i, r) in recs.iter().enumerate() {
            batch
                .put(1, (i as u64).to_be_bytes().to_vec(), r.clone())
                .unwrap();
            if batch.approximate_size() >= (1 << 20) || i + 1 == n {
                engine.write(&mut batch, i + 1 == n).unwrap();
            }
        }
    })
}

fn raft_durable(dir: &Path, recs: Arc<Vec<Vec<u8>>>, threads: usize) -> Run {
    let engine = Arc::new(raft_open(dir));
    let counter = Arc::new(std::sync::atomic::AtomicU64::new(0));
    concurrent(recs, threads, move |r| {
        let k = counter.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let mut batch = raft_engine::LogBatch::default();
        batch.put(1, k.to_be_bytes().to_vec(), r.to_vec()).unwrap();
        engine.write(&mut batch, true).unwrap();
    })
}

// ---------- recovery and delivery ----------

/// A walsink log of `bytes` of 4 KiB records in 64 MiB checkpoints, left pending.
fn build_log(dir: &Path, bytes: u64) -> Vec<std::path::PathBuf> {
    let (wal, _) = WalSink::open(dir, ws_opts()).unwrap();
    let rec = record(7, 4096);
    let per_cp = (64 * MIB / 4096) as usize;
    let n = bytes / 4096;
    let mut cp = 1;
    for i in 0..n as usize {
        wal.append(&rec).unwrap();
        if (i + 1) % per_cp == 0 {
            wal.checkpoint(cp, b"").unwrap();
            cp += 1;
        }
    }
    wal.checkpoint(cp, b"").unwrap();
    drop(wal);
    let mut segs: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "wseg"))
        .collect();
    segs.sort();
    segs
}

fn walsink_recover(dir: &Path, bytes: u64) -> Run {
    let t = Instant::now();
    let (wal, report) = WalSink::open(dir, ws_opts()).unwrap();
    let secs = t.elapsed().as_secs_f64();
    assert!(report.pending_records >= bytes / 4096);
    drop(wal);
    Run {
        secs,
        ops: 1,
        bytes,
        disk_writes: 0,
        cpu_secs: 0.0,
    }
}

/// A sink that touches every record and keeps nothing.
struct Null;

impl walsink::Sink for Null {
    fn deliver(&mut self, e: &walsink::Epoch) -> Result<(), walsink::SinkError> {
        for chunk in e.chunks() {
            for r in chunk?.records() {
                std::hint::black_box(r.data);
            }
        }
        Ok(())
    }
}

/// Delivers a freshly built log of `bytes` to a null sink through `deliver_ready`: the
/// committer's path, with each epoch read back and verified, marked in the local commit store
/// and its segments freed. Building and opening the log are not timed. Returns the run and the
/// floor (read(2) of the same segment files just before).
fn walsink_deliver_null(dir: &Path, bytes: u64) -> (Run, Run) {
    let segs = build_log(dir, bytes);
    let floor = floor_read(&segs);
    let (wal, report) = WalSink::open(dir, ws_opts()).unwrap();
    wal.restore(report.pending.last().copied()).unwrap();
    let t = Instant::now();
    wal.deliver_ready(&mut Null).unwrap();
    let run = Run {
        secs: t.elapsed().as_secs_f64(),
        ops: report.pending_records,
        bytes: report.pending_records * 4096,
        disk_writes: 0,
        cpu_secs: 0.0,
    };
    assert_eq!(wal.health().backlog_epochs, 0);
    (run, floor)
}

/// Appends a multi-GiB backlog, then delivers it to a null sink through the committer thread,
/// sampling resident memory. Returns (peak anonymous RSS, peak total RSS) in MiB.
fn memory_check(dir: &Path, bytes: u64) -> (u64, u64) {
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let peak = Arc::new(parking_peak::Peak::default());
    let sampler = {
        let (stop, peak) = (stop.clone(), peak.clone());
        std::thread::spawn(move || {
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                peak.sample();
                std::thread::sleep(Duration::from_millis(20));
            }
        })
    };
    let (wal, _) = WalSink::open(dir, ws_opts()).unwrap();
    let rec = record(3, 4096);
    let per_cp = 64 * MIB / 4096;
    let mut cp = 0;
    for i in 0..bytes / 4096 {
        wal.append(&rec).unwrap();
        if (i + 1) % per_cp == 0 {
            cp += 1;
            wal.checkpoint(cp, b"").unwrap();
        }
    }
    wal.checkpoint_complete(cp).unwrap();
    let committer = wal.spawn_committer(Null).unwrap();
    assert!(wal.wait_committed(cp, Duration::from_secs(600)));
    committer.shutdown();
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    sampler.join().unwrap();
    peak.get()
}

mod parking_peak {
    use std::sync::atomic::{AtomicU64, Ordering};

    #[derive(Default)]
    pub struct Peak {
        anon: AtomicU64,
        total: AtomicU64,
    }

    fn field(status: &str, name: &str) -> u64 {
        status
            .lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    }

    impl Peak {
        pub fn sample(&self) {
            let s = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
            self.anon
                .fetch_max(field(&s, "RssAnon:") / 1024, Ordering::Relaxed);
            self.total
                .fetch_max(field(&s, "VmRSS:") / 1024, Ordering::Relaxed);
        }
        pub fn get(&self) -> (u64, u64) {
            (
                self.anon.load(Ordering::Relaxed),
                self.total.load(Ordering::Relaxed),
            )
        }
    }
}

// ---------- report ----------

#[derive(Default)]
struct Table {
    rows: Vec<(String, String, Vec<Run>)>,
}

impl Table {
    fn add(&mut self, case: &str, imp: &str, run: Run) {
        match self.rows.iter_mut().find(|r| r.0 == case && r.1 == imp) {
            Some(r) => r.2.push(run),
            None => self.rows.push((case.into(), imp.into(), vec![run])),
        }
    }

    fn runs(&self, case: &str, imp: &str) -> Option<&Vec<Run>> {
        self.rows
            .iter()
            .find(|r| r.0 == case && r.1 == imp)
            .map(|r| &r.2)
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

/// Per-round ratio of an implementation's throughput to its floor's: median and range.
fn ratio_stats(imp: &[Run], floor: &[Run]) -> (f64, f64, f64) {
    let ratios: Vec<f64> = imp
        .iter()
        .zip(floor)
        .map(|(a, f)| (a.ops as f64 / a.secs) / (f.ops as f64 / f.secs))
        .collect();
    let lo = ratios.iter().cloned().fold(f64::INFINITY, f64::min);
    let hi = ratios.iter().cloned().fold(0.0, f64::max);
    (median(ratios), lo, hi)
}

fn print_table(t: &Table, floor_of: &dyn Fn(&str) -> &'static str) {
    println!("| case | implementation | median throughput | ratio to floor (median) | ratio range over rounds |");
    println!("|---|---|---|---|---|");
    for (case, imp, runs) in &t.rows {
        let floor = floor_of(case);
        let ops_s = median(runs.iter().map(|r| r.ops as f64 / r.secs).collect());
        let mb_s = median(runs.iter().map(|r| r.bytes as f64 / r.secs / 1e6).collect());
        let tput = if case.starts_with("recovery") || case.starts_with("delivery") {
            format!("{:.2} GB/s", mb_s / 1000.0)
        } else if case.starts_with("durable") {
            let writes = median(
                runs.iter()
                    .map(|r| r.disk_writes as f64 / r.ops as f64)
                    .collect(),
            );
            let cpu = median(
                runs.iter()
                    .map(|r| r.cpu_secs * 1e6 / r.ops as f64)
                    .collect(),
            );
            format!(
                "{ops_s:.0} appends/s ({:.1} µs each; each: {writes:.3} disk writes, {cpu:.1} µs CPU)",
                1e6 / ops_s
            )
        } else {
            format!("{:.2} M records/s, {mb_s:.0} MB/s", ops_s / 1e6)
        };
        let (ratio, range) = match t.runs(case, floor) {
            Some(f) if imp != floor => {
                let (m, lo, hi) = if case.starts_with("recovery") || case.starts_with("delivery") {
                    let a: Vec<Run> = runs.iter().map(|r| Run { ops: r.bytes, ..*r }).collect();
                    let b: Vec<Run> = f.iter().map(|r| Run { ops: r.bytes, ..*r }).collect();
                    ratio_stats(&a, &b)
                } else {
                    ratio_stats(runs, f)
                };
                (format!("{m:.2}"), format!("{lo:.2}–{hi:.2}"))
            }
            _ => ("1 (floor)".into(), "".into()),
        };
        println!("| {case} | {imp} | {tput} | {ratio} | {range} |");
    }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    // The memory check runs in a child process of its own, so the harness's generated records
    // do not count against walsink.
    if let Some(i) = args.iter().position(|a| a == "--memory-check-child") {
        let bytes: u64 = args[i + 1].parse().unwrap();
        let dir = std::path::PathBuf::from(&args[i + 2]);
        let (anon, total) = memory_check(&dir, bytes);
        println!("{anon} {total}");
        return;
    }
    let quick = args.iter().any(|a| a == "--quick");
    let rounds = args
        .iter()
        .position(|a| a == "--rounds")
        .and_then(|i| args.get(i + 1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(if quick { 2 } else { 5 });
    let only = args
        .iter()
        .position(|a| a == "--only")
        .and_then(|i| args.get(i + 1))
        .cloned()
        .unwrap_or_default();
    let run_case = |case: &str| case.starts_with(only.as_str());
    let durable_ops = args
        .iter()
        .position(|a| a == "--durable-ops")
        .and_then(|i| args.get(i + 1))
        .and_then(|v| v.parse().ok());
    let mut cfg = if quick {
        Cfg {
            rounds,
            bulk_bytes: 16 * MIB,
            durable_ops: 400,
            recovery_bytes: 128 * MIB,
            memory_bytes: 256 * MIB,
        }
    } else {
        Cfg {
            rounds,
            bulk_bytes: 128 * MIB,
            durable_ops: 2000,
            recovery_bytes: 1024 * MIB,
            memory_bytes: 4096 * MIB,
        }
    };
    if let Some(n) = durable_ops {
        cfg.durable_ops = n;
    }
    let base = tempfile::Builder::new()
        .prefix("walsink-compare-")
        .tempdir_in(".")
        .unwrap();
    let mut table = Table::default();
    let sizes = [64usize, 256, 4096];
    let bulk: Vec<(usize, Vec<Vec<u8>>)> = sizes
        .iter()
        .map(|&s| (s, records(cfg.bulk_bytes / s as u64, s)))
        .collect();
    let durable = Arc::new(records(cfg.durable_ops, 256));
    let log_dir = base.path().join("recovery-log");
    eprintln!(
        "building a {} MiB log for the recovery and delivery cases",
        cfg.recovery_bytes / MIB
    );
    let segs = build_log(&log_dir, cfg.recovery_bytes);
    for round in 0..cfg.rounds {
        eprintln!("round {}/{}", round + 1, cfg.rounds);
        for (size, recs) in &bulk {
            let case = format!("append {size} B, one checkpoint");
            if !run_case(&case) {
                continue;
            }
            // Rotate the order so no implementation always runs right after another's flush.
            let mut imps: Vec<Imp> = vec![
                (
                    "floor: buffered write + 1 fdatasync",
                    Box::new(|d| floor_buffered(d, recs)),
                ),
                ("walsink", Box::new(|d| walsink_bulk(d, recs))),
                ("okaywal 0.3.1", Box::new(|d| okaywal_bulk(d, recs))),
                ("raft-engine 0.4.2", Box::new(|d| raft_bulk(d, recs))),
            ];
            imps.rotate_left(round % 4);
            for (name, f) in imps {
                let d = tempfile::tempdir_in(base.path()).unwrap();
                table.add(&case, name, f(d.path()));
            }
        }
        for threads in [1usize, 4, 16] {
            let case = format!("durable 256 B appends, {threads} writers");
            if !run_case(&case) {
                continue;
            }
            let mut imps: Vec<Imp> = vec![
                (
                    "floor: pwrite + fdatasync loop",
                    Box::new(|d| floor_fsync_loop(d, &durable)),
                ),
                (
                    "walsink",
                    Box::new(|d| walsink_durable(d, durable.clone(), threads)),
                ),
                (
                    "okaywal 0.3.1",
                    Box::new(|d| okaywal_durable(d, durable.clone(), threads)),
                ),
                (
                    "raft-engine 0.4.2",
                    Box::new(|d| raft_durable(d, durable.clone(), threads)),
                ),
            ];
            imps.rotate_left(round % 4);
            for (name, f) in imps {
                let d = tempfile::tempdir_in(base.path()).unwrap();
                table.add(&case, name, f(d.path()));
            }
        }
        let rec_case = format!(
            "recovery of a {} MiB log (page cache)",
            cfg.recovery_bytes / MIB
        );
        if run_case(&rec_case) {
            table.add(
                &rec_case,
                "floor: read(2) of the segment files",
                floor_read(&segs),
            );
            table.add(
                &rec_case,
                "walsink open",
                walsink_recover(&log_dir, cfg.recovery_bytes),
            );
        }
        let del_case = format!(
            "delivery of {} MiB to a null sink",
            cfg.recovery_bytes / MIB
        );
        if run_case(&del_case) {
            let d = tempfile::tempdir_in(base.path()).unwrap();
            let (run, floor) = walsink_deliver_null(d.path(), cfg.recovery_bytes);
            table.add(&del_case, "floor: read(2) of the segment files", floor);
            table.add(
                &del_case,
                "walsink deliver_ready (verified, marked, segments freed)",
                run,
            );
        }
    }
    let floor_of = |case: &str| -> &'static str {
        if case.starts_with("append") {
            "floor: buffered write + 1 fdatasync"
        } else if case.starts_with("durable") {
            "floor: pwrite + fdatasync loop"
        } else {
            "floor: read(2) of the segment files"
        }
    };
    println!(
        "rounds: {}; every ratio is throughput / the floor's throughput in the same round\n",
        cfg.rounds
    );
    print_table(&table, &floor_of);
    if !only.is_empty() {
        return;
    }
    eprintln!(
        "memory check: appending {} MiB, then delivering it",
        cfg.memory_bytes / MIB
    );
    let mem_dir = base.path().join("memory-log");
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .arg("--memory-check-child")
        .arg(cfg.memory_bytes.to_string())
        .arg(&mem_dir)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "memory check failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    let mut it = text.split_whitespace().map(|v| v.parse::<u64>().unwrap());
    let (anon, total) = (it.next().unwrap(), it.next().unwrap());
    println!(
        "\nmemory: a backlog of {} MiB of 4 KiB records appended in 64 MiB checkpoints, then delivered to a null sink by the committer thread, in a process of its own: peak anonymous RSS {anon} MiB, peak total RSS {total} MiB",
        cfg.memory_bytes / MIB
    );
}
