//! `walsink pipe` with large epochs (256 KiB to tens of MiB, mixed with small ones), which
//! turn on delivery's read-ahead and the commit mark written beside the sink (docs/design.md,
//! "Read-ahead and marks beside the sink"), delivers every line once through SIGKILL loops
//! into each target, and verify, dump and inspect stay clean while it runs.
//!
//! Every kill loop is seeded: `PROBE6_SEED=N` replays one (the default seeds are fixed). Each
//! test prints its seed and the number of SIGKILLs that landed. Tests that need a local
//! server run only with `WALSINK_TEST_SERVERS=1` and say they are skipped otherwise.

use crate::common::{s, unique, walsink, write_lines};
use std::collections::{BTreeMap, HashMap};
use std::fs;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

// ---------------------------------------------------------------------------------------
// Running the binary
// ---------------------------------------------------------------------------------------

const BIN: &str = env!("CARGO_BIN_EXE_walsink");

/// Runs walsink with stdout thrown away (a full `dump` of a large log), stderr kept.
fn walsink_quiet_stdout(args: &[&str]) -> (Option<i32>, String) {
    let o = Command::new(BIN)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .output()
        .expect("run walsink");
    (
        o.status.code(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn servers() -> bool {
    std::env::var("WALSINK_TEST_SERVERS").as_deref() == Ok("1")
}

fn skip(test: &str, what: &str) -> bool {
    if servers() {
        return false;
    }
    eprintln!("{test}: skipped (needs WALSINK_TEST_SERVERS=1 and {what})");
    true
}

fn seed(default: u64) -> u64 {
    std::env::var("PROBE6_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn pipe_args(input: &Path, wal: &Path, sink: &str, extra: &[&str]) -> Vec<String> {
    let mut v: Vec<String> = ["pipe", "--input", s(input), "--wal", s(wal), "--sink", sink]
        .iter()
        .map(|a| a.to_string())
        .collect();
    v.extend(extra.iter().map(|e| e.to_string()));
    v
}

/// Runs one `pipe` to its end, bounded: killed and failed after `limit`.
fn run_to_end(args: &[String], limit: Duration) -> (Option<i32>, String) {
    let d = tempfile::tempdir().unwrap();
    let errp = d.path().join("stderr");
    let mut child = Command::new(BIN)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::from(fs::File::create(&errp).unwrap()))
        .spawn()
        .expect("spawn walsink");
    let t = Instant::now();
    loop {
        if let Some(st) = child.try_wait().unwrap() {
            return (st.code(), fs::read_to_string(&errp).unwrap_or_default());
        }
        if t.elapsed() > limit {
            child.kill().unwrap();
            child.wait().unwrap();
            panic!(
                "walsink {:?} did not end within {limit:?}; stderr: {}",
                args,
                fs::read_to_string(&errp).unwrap_or_default()
            );
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// What a kill loop did.
#[derive(Debug, Default)]
struct Kills {
    kills: u32,
    ended: u32,
    /// Runs that ended on their own with another exit code than 0: `run N: stderr`.
    failed: Vec<String>,
}

/// What a kill loop's probe says at each tick of a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Tick {
    /// SIGKILL now.
    Kill,
    /// Not yet, whatever the run's random delay says: the probe waits for a moment of its own
    /// (on a loaded machine the delay can run out before that moment comes).
    Hold,
    /// The run's random delay decides.
    Timer,
}

/// Runs `pipe` `runs` times; each run is SIGKILLed after a seeded random delay in `delays`
/// unless it ends first, or when `kill_now` says so (checked every 2 ms; [`Tick`]). A run
/// that ends on its own with another code than 0 is recorded in `Kills::failed` (each test
/// fails on it after its data checks). `after` runs after every run (killed or not).
fn kill_loop(
    args: &[String],
    runs: u32,
    seed: u64,
    delays: std::ops::RangeInclusive<u64>,
    mut kill_now: impl FnMut(u32, Duration) -> Tick,
    mut after: impl FnMut(u32, bool),
) -> Kills {
    let mut rng = fastrand::Rng::with_seed(seed);
    let mut k = Kills::default();
    let d = tempfile::tempdir().unwrap();
    for run in 0..runs {
        let errp = d.path().join(format!("stderr-{run}"));
        let mut child: Child = Command::new(BIN)
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::from(fs::File::create(&errp).unwrap()))
            .spawn()
            .expect("spawn walsink");
        let delay = Duration::from_millis(rng.u64(delays.clone()));
        let t = Instant::now();
        let killed = loop {
            if let Some(st) = child.try_wait().unwrap() {
                if !st.success() {
                    let e = fs::read_to_string(&errp).unwrap_or_default();
                    eprintln!("run {run} ended with {st}: {e}");
                    k.failed.push(format!("run {run}: {st}: {}", e.trim()));
                }
                k.ended += 1;
                break false;
            }
            let tick = kill_now(run, t.elapsed());
            if tick == Tick::Kill || (tick == Tick::Timer && t.elapsed() >= delay) {
                child.kill().unwrap(); // SIGKILL
                child.wait().unwrap();
                k.kills += 1;
                break true;
            }
            assert!(t.elapsed() < Duration::from_secs(120), "run {run} hangs");
            std::thread::sleep(Duration::from_millis(2));
        };
        after(run, killed);
    }
    k
}

/// Runs its closure when dropped (cleanup of server state even when a test fails).
struct Cleanup<F: FnMut()>(F);

impl<F: FnMut()> Drop for Cleanup<F> {
    fn drop(&mut self) {
        (self.0)()
    }
}

/// A thread that calls `f` at seeded random intervals in `every_ms` until dropped.
struct Disruptor {
    stop: Arc<AtomicBool>,
    count: Arc<AtomicU64>,
    handle: Option<std::thread::JoinHandle<()>>,
}

impl Disruptor {
    fn start(
        seed: u64,
        every_ms: std::ops::RangeInclusive<u64>,
        f: impl Fn() + Send + 'static,
    ) -> Disruptor {
        let stop = Arc::new(AtomicBool::new(false));
        let count = Arc::new(AtomicU64::new(0));
        let (st, c) = (stop.clone(), count.clone());
        let handle = std::thread::spawn(move || {
            let mut rng = fastrand::Rng::with_seed(seed);
            while !st.load(Ordering::Relaxed) {
                let wait = rng.u64(every_ms.clone());
                let t = Instant::now();
                while t.elapsed() < Duration::from_millis(wait) {
                    if st.load(Ordering::Relaxed) {
                        return;
                    }
                    std::thread::sleep(Duration::from_millis(5));
                }
                f();
                c.fetch_add(1, Ordering::Relaxed);
            }
        });
        Disruptor {
            stop,
            count,
            handle: Some(handle),
        }
    }
    fn finish(mut self) -> u64 {
        self.stop.store(true, Ordering::Relaxed);
        self.handle.take().unwrap().join().unwrap();
        self.count.load(Ordering::Relaxed)
    }
}

impl Drop for Disruptor {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}

// ---------------------------------------------------------------------------------------
// Input with large and small epochs
// ---------------------------------------------------------------------------------------

/// Lines per checkpoint (`--checkpoint-every`): input blocks are aligned to it, so the size
/// of each record-count epoch is chosen by the block's line lengths.
const EVERY: usize = 2000;

/// Line `i`: `TAGNNNNNNNN ` and `len` padding bytes (a letter that depends on `i`).
fn line(tag: &str, i: usize, len: usize) -> Vec<u8> {
    let mut v = format!("{tag}{i:08} ").into_bytes();
    v.extend(std::iter::repeat_n(b'a' + (i % 26) as u8, len));
    v
}

/// About `total` bytes of lines in blocks of `EVERY` lines, each block small (~70 KB),
/// medium (~400 KB, just above the 256 KiB read-ahead threshold), big (~8 MB) or huge
/// (~24 MB), in a seeded order, starting and ending with small blocks.
fn mixed_input(tag: &str, seed: u64, total: usize, huge: bool) -> (Vec<Vec<u8>>, Vec<usize>) {
    let mut rng = fastrand::Rng::with_seed(seed);
    let (mut out, mut sizes, mut bytes) = (Vec::new(), Vec::new(), 0usize);
    let mut block = 0;
    while bytes < total {
        let (lo, hi) = if block == 0 {
            (10, 60)
        } else {
            match rng.u32(0..10) {
                0..=2 => (10, 60),
                3..=4 => (150, 250),
                5..=8 => (2000, 6000),
                _ if huge => (10_000, 14_000),
                _ => (2000, 6000),
            }
        };
        let mut b = 0;
        for _ in 0..EVERY {
            let l = line(tag, out.len(), rng.usize(lo..=hi));
            b += l.len() + 1;
            out.push(l);
        }
        sizes.push(b);
        bytes += b;
        block += 1;
    }
    // A last small block, then a tail that is not a multiple of EVERY.
    for _ in 0..(EVERY + 777) {
        let l = line(tag, out.len(), rng.usize(10..=60));
        out.push(l);
    }
    (out, sizes)
}

/// Fails unless `got` is a prefix-in-order subsequence of `want` with no duplicates: each
/// record is one of `want`, at most once, in order. Lines carry their index, so this is a
/// lookup.
fn assert_in_order_once(got: &[Vec<u8>], want: &[Vec<u8>], tag: &str, what: &str) {
    let mut next = 0usize;
    for (k, r) in got.iter().enumerate() {
        let i = index_of(r, tag).unwrap_or_else(|| {
            panic!("{what}: record {k} is foreign: {:?}", short(r));
        });
        assert!(
            i < want.len() && want[i] == *r,
            "{what}: record {k} ({:?}) is not input line {i}",
            short(r)
        );
        assert!(
            i >= next,
            "{what}: record {k} is line {i}, but line {} came before it: duplicated or out of order",
            next.saturating_sub(1)
        );
        next = i + 1;
    }
}

/// Fails unless `got == want`, saying how they differ (missing, duplicated, reordered).
fn assert_exactly_once(got: &[Vec<u8>], want: &[Vec<u8>], tag: &str, what: &str) {
    if got == want {
        return;
    }
    let mut count = vec![0u32; want.len()];
    let mut foreign = 0;
    for r in got {
        match index_of(r, tag) {
            Some(i) if i < want.len() && want[i] == *r => count[i] += 1,
            _ => foreign += 1,
        }
    }
    let missing: Vec<usize> = (0..want.len()).filter(|&i| count[i] == 0).collect();
    let dup: Vec<usize> = (0..want.len()).filter(|&i| count[i] > 1).collect();
    let first_diff = got.iter().zip(want).position(|(a, b)| a != b);
    panic!(
        "{what}: not every line exactly once in order: {} records for {} lines; {} missing \
         (first {:?}), {} duplicated (first {:?}), {foreign} foreign; first difference at \
         record {first_diff:?}",
        got.len(),
        want.len(),
        missing.len(),
        missing.iter().take(5).collect::<Vec<_>>(),
        dup.len(),
        dup.iter().take(5).collect::<Vec<_>>(),
    );
}

fn index_of(r: &[u8], tag: &str) -> Option<usize> {
    let rest = r.strip_prefix(tag.as_bytes())?;
    std::str::from_utf8(rest.get(..8)?).ok()?.parse().ok()
}

fn short(r: &[u8]) -> String {
    text(&r[..r.len().min(40)])
}

// ---------------------------------------------------------------------------------------
// The log directory
// ---------------------------------------------------------------------------------------

#[derive(Debug, Clone, Copy, Default)]
struct LogFiles {
    wseg: usize,
    free: usize,
    /// Allocated bytes (st_blocks * 512) of every file in the directory.
    allocated: u64,
}

fn log_files(wal: &Path) -> LogFiles {
    let mut f = LogFiles::default();
    let Ok(rd) = fs::read_dir(wal) else {
        return f;
    };
    for e in rd.flatten() {
        let p = e.path();
        let Ok(m) = fs::metadata(&p) else { continue };
        f.allocated += m.blocks() * 512;
        match p.extension().and_then(|e| e.to_str()) {
            Some("wseg") => f.wseg += 1,
            Some("free") => f.free += 1,
            _ => {}
        }
    }
    f
}

fn json(out: &[u8]) -> serde_json::Value {
    serde_json::from_slice(out).unwrap_or_else(|e| panic!("not JSON ({e}): {}", text(out)))
}

/// `inspect DIR --json [--sink SINK]`, which must succeed.
fn inspect(wal: &Path, sink: Option<&str>) -> serde_json::Value {
    let mut a = vec!["inspect", s(wal), "--json"];
    if let Some(sk) = sink {
        a.extend(["--sink", sk]);
    }
    let o = walsink(&a);
    assert_eq!(o.status.code(), Some(0), "inspect: {}", text(&o.stderr));
    json(&o.stdout)
}

/// The highest checkpoint id `inspect` lists with records in it.
fn last_nonempty_checkpoint(i: &serde_json::Value) -> Option<u64> {
    i["checkpoints"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["records"].as_u64().unwrap_or(0) > 0)
        .filter_map(|c| c["id"].as_u64())
        .max()
}

/// After a complete run: the log has nothing pending and says so.
fn assert_log_drained(wal: &Path, lines: usize) -> serde_json::Value {
    let i = inspect(wal, None);
    assert_eq!(i["ok"], true, "inspect: {i}");
    assert_eq!(
        i["backlog"]["epochs"], 0,
        "backlog after a complete run: {i}"
    );
    assert_eq!(
        i["backlog"]["records"], 0,
        "backlog after a complete run: {i}"
    );
    assert_eq!(
        i["unsealed_records"], 0,
        "unsealed after a complete run: {i}"
    );
    let committed = i["committed"].as_u64().expect("a commit mark");
    for c in i["checkpoints"].as_array().unwrap() {
        assert_eq!(c["state"], "committed", "{c}");
        assert!(c["id"].as_u64().unwrap() <= committed, "{c}");
    }
    // The newest checkpoint's metadata says the whole input was consumed.
    let newest = i["checkpoints"]
        .as_array()
        .unwrap()
        .iter()
        .max_by_key(|c| c["id"].as_u64())
        .expect("a checkpoint");
    let meta: serde_json::Value =
        serde_json::from_str(newest["metadata"].as_str().unwrap()).unwrap();
    assert_eq!(
        meta["lines"].as_u64(),
        Some(lines as u64),
        "the newest checkpoint covers every line: {meta}"
    );
    i
}

/// `verify` and a full `dump` of the log: both exit 0 and report nothing.
fn assert_verify_and_dump_clean(wal: &Path, when: &str) {
    let o = walsink(&["verify", s(wal), "--json"]);
    let v = json(&o.stdout);
    assert_eq!(
        o.status.code(),
        Some(0),
        "verify {when}: {v} / {}",
        text(&o.stderr)
    );
    assert_eq!(v["ok"], true, "verify {when}: {v}");
    assert_eq!(v["problems"].as_array().map(|p| p.len()), Some(0), "{v}");
    let (code, err) = walsink_quiet_stdout(&["dump", s(wal)]);
    assert_eq!(code, Some(0), "dump {when}: {err}");
    assert!(
        !err.to_lowercase().contains("warning") && !err.to_lowercase().contains("damage"),
        "dump {when}: {err}"
    );
}

// ---------------------------------------------------------------------------------------
// The directory sink
// ---------------------------------------------------------------------------------------

/// The records of a `dir:` target in checkpoint order (the `.txt` files sorted by name), and
/// the checkpoint ids of the files.
fn dir_records(out: &Path) -> (Vec<Vec<u8>>, Vec<u64>) {
    let mut names: Vec<PathBuf> = match fs::read_dir(out) {
        Ok(rd) => rd.flatten().map(|e| e.path()).collect(),
        Err(_) => return (Vec::new(), Vec::new()),
    };
    names.sort();
    let (mut recs, mut ids) = (Vec::new(), Vec::new());
    for p in names {
        let name = p.file_name().unwrap().to_str().unwrap().to_string();
        assert!(
            !name.ends_with(".bin"),
            "a .bin epoch for UTF-8 lines: {name}"
        );
        if name.starts_with('.') || !name.ends_with(".txt") {
            continue;
        }
        ids.push(name[..20].parse().unwrap());
        let body = fs::read(&p).unwrap();
        for l in body.split(|&b| b == b'\n') {
            recs.push(l.to_vec());
        }
        // Each record is followed by a newline: the split leaves one empty piece at the end.
        assert_eq!(recs.pop(), Some(Vec::new()), "{name} ends with a newline");
    }
    (recs, ids)
}

#[test]
fn dir_sink_kill_loop_with_large_epochs_verify_and_dump_after_each_kill() {
    let sd = seed(0x6001);
    let d = tempfile::tempdir().unwrap();
    let (inp, wal, out) = (
        d.path().join("in.txt"),
        d.path().join("wal"),
        d.path().join("out"),
    );
    let tag = "D";
    let (want, blocks) = mixed_input(tag, sd, 150 << 20, true);
    write_lines(&inp, &want);
    let sink = format!("dir:{}", out.display());
    let args = pipe_args(
        &inp,
        &wal,
        &sink,
        &[
            "--checkpoint-every",
            "2000",
            "--checkpoint-interval",
            "300ms",
            "--quiet",
        ],
    );
    let mut peak = LogFiles::default();
    let mut checked = 0;
    let k = kill_loop(
        &args,
        16,
        sd,
        60..=1500,
        |_, _| {
            let f = log_files(&wal);
            if f.wseg > peak.wseg {
                peak = f;
            }
            Tick::Timer
        },
        |run, killed| {
            let (got, _) = dir_records(&out);
            assert_in_order_once(&got, &want, tag, &format!("dir after run {run}"));
            if killed && wal.exists() {
                assert_verify_and_dump_clean(&wal, &format!("after SIGKILL {run}"));
                checked += 1;
            }
        },
    );
    let (code, err) = run_to_end(&args, Duration::from_secs(120));
    assert_eq!(code, Some(0), "{err}");
    let (got, ids) = dir_records(&out);
    assert_exactly_once(&got, &want, tag, "dir sink");
    assert_verify_and_dump_clean(&wal, "after the final run");
    let i = assert_log_drained(&wal, want.len());
    // inspect --sink agrees with the files.
    let t = inspect(&wal, Some(&sink));
    let committed = i["committed"].as_u64().unwrap();
    assert_eq!(
        t["target"]["committed"].as_u64(),
        ids.iter().max().copied(),
        "{t}"
    );
    assert!(committed >= *ids.iter().max().unwrap(), "{i}");
    assert_eq!(
        last_nonempty_checkpoint(&i),
        ids.iter().max().copied(),
        "the newest non-empty checkpoint is the newest file"
    );
    let end = log_files(&wal);
    assert!(end.wseg <= 2, "segments left after delivery: {end:?}");
    eprintln!(
        "dir sink: seed {sd}, {} lines in {} blocks ({} MiB), {} SIGKILLs, {} runs ended on \
         their own, verify+dump after {checked} kills, peak {peak:?}, end {end:?}, {} files",
        want.len(),
        blocks.len(),
        blocks.iter().sum::<usize>() >> 20,
        k.kills,
        k.ended,
        ids.len()
    );
    assert!(k.kills >= 8, "too few kills landed: {k:?}");
    assert!(
        k.failed.is_empty(),
        "runs that failed on their own: {:#?}",
        k.failed
    );
}

#[test]
fn dir_sink_live_verify_dump_inspect_while_segments_roll_and_recycle() {
    let sd = seed(0x6009);
    let d = tempfile::tempdir().unwrap();
    let (inp, wal, out) = (
        d.path().join("in.txt"),
        d.path().join("wal"),
        d.path().join("out"),
    );
    let tag = "L";
    let (want, _) = mixed_input(tag, sd, 330 << 20, true);
    write_lines(&inp, &want);
    let sink = format!("dir:{}", out.display());
    let args = pipe_args(
        &inp,
        &wal,
        &sink,
        &["--checkpoint-every", "2000", "--quiet"],
    );
    let mut child = Command::new(BIN)
        .args(&args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Another thread watches the directory for recycled segments.
    let stop = Arc::new(AtomicBool::new(false));
    let (st, w2) = (stop.clone(), wal.clone());
    let watcher = std::thread::spawn(move || {
        let (mut max_seq, mut saw_free, mut peak) = (0u64, false, LogFiles::default());
        while !st.load(Ordering::Relaxed) {
            if let Ok(rd) = fs::read_dir(&w2) {
                for e in rd.flatten() {
                    let n = e.file_name().to_string_lossy().into_owned();
                    if let Some(seq) = n.strip_suffix(".wseg").and_then(|q| q.parse().ok()) {
                        max_seq = max_seq.max(seq);
                    }
                    saw_free |= n.ends_with(".free");
                }
            }
            let f = log_files(&w2);
            if f.wseg > peak.wseg {
                peak = f;
            }
            std::thread::sleep(Duration::from_millis(3));
        }
        (max_seq, saw_free, peak)
    });
    let t = Instant::now();
    let (mut rounds, mut problems) = (0, Vec::new());
    let status = loop {
        if let Some(st) = child.try_wait().unwrap() {
            break st;
        }
        assert!(t.elapsed() < Duration::from_secs(120), "the run hangs");
        if !wal.join("WALSINK").exists() {
            std::thread::sleep(Duration::from_millis(5));
            continue;
        }
        rounds += 1;
        let o = walsink(&["verify", s(&wal), "--json", "--quiet"]);
        if o.status.code() != Some(0) {
            problems.push(format!(
                "verify exit {:?}: {} {}",
                o.status.code(),
                text(&o.stdout),
                text(&o.stderr)
            ));
        }
        let (code, err) = if rounds % 3 == 0 {
            walsink_quiet_stdout(&["dump", s(&wal)])
        } else {
            walsink_quiet_stdout(&["dump", s(&wal), "-n", "3000"])
        };
        if code != Some(0) || !err.is_empty() {
            problems.push(format!("dump (round {rounds}) exit {code:?}: {err}"));
        }
        let o = walsink(&["inspect", s(&wal), "--json"]);
        if o.status.code() != Some(0) {
            problems.push(format!(
                "inspect exit {:?}: {}",
                o.status.code(),
                text(&o.stderr)
            ));
        }
    };
    stop.store(true, Ordering::Relaxed);
    let (max_seq, saw_free, peak) = watcher.join().unwrap();
    let mut err = String::new();
    child.stderr.take().unwrap().read_to_string(&mut err).ok();
    eprintln!(
        "live dir: seed {sd}, {:.1}s, {rounds} rounds of verify+dump+inspect; newest segment \
         {max_seq}, a .free file seen: {saw_free}, peak {peak:?}; problems: {problems:#?}",
        t.elapsed().as_secs_f64()
    );
    assert!(status.success(), "{status}: {err}");
    let (got, _) = dir_records(&out);
    assert_exactly_once(&got, &want, tag, "dir sink (live checks)");
    assert!(
        problems.is_empty(),
        "verify/dump/inspect of a healthy live log reported problems: {problems:#?}"
    );
    assert!(rounds >= 3, "too few live rounds: {rounds}");
    assert!(
        max_seq >= 4,
        "the log should have rolled over several segments: {max_seq}"
    );
    assert!(log_files(&wal).wseg <= 2, "{:?}", log_files(&wal));
    assert_log_drained(&wal, want.len());
}

#[test]
fn dir_sink_follow_a_growing_file_with_bursts_and_kills() {
    let sd = seed(0x600a);
    let d = tempfile::tempdir().unwrap();
    let (inp, wal, out) = (
        d.path().join("in.txt"),
        d.path().join("wal"),
        d.path().join("out"),
    );
    let tag = "F";
    // Bursts of lines: mostly small, some of 2-20 MiB written at once.
    let mut rng = fastrand::Rng::with_seed(sd);
    let (mut want, mut bursts) = (Vec::new(), Vec::new());
    let mut total = 0usize;
    while total < 120 << 20 {
        let (n, lo, hi) = match rng.u32(0..6) {
            0..=2 => (rng.usize(1..300), 10, 80),
            3 => (rng.usize(200..2000), 150, 300),
            _ => (rng.usize(500..4000), 3000, 6000),
        };
        let mut body = Vec::new();
        for _ in 0..n {
            let l = line(tag, want.len(), rng.usize(lo..=hi));
            body.extend_from_slice(&l);
            body.push(b'\n');
            want.push(l);
        }
        total += body.len();
        bursts.push(body);
    }
    fs::write(&inp, b"").unwrap();
    let nb = bursts.len();
    let writer_inp = inp.clone();
    let writer = std::thread::spawn(move || {
        let mut wr = fastrand::Rng::with_seed(sd ^ 3);
        let mut f = fs::OpenOptions::new()
            .append(true)
            .open(&writer_inp)
            .unwrap();
        for b in bursts {
            // Some bursts land in two writes, so a run may see half a line.
            let cut = wr.usize(0..=b.len());
            f.write_all(&b[..cut]).unwrap();
            f.flush().unwrap();
            std::thread::sleep(Duration::from_millis(wr.u64(0..3)));
            f.write_all(&b[cut..]).unwrap();
            std::thread::sleep(Duration::from_millis(wr.u64(5..60)));
        }
    });
    let sink = format!("dir:{}", out.display());
    let args = pipe_args(
        &inp,
        &wal,
        &sink,
        &[
            "--follow",
            "--checkpoint-every",
            "50000",
            "--checkpoint-interval",
            "300ms",
            "--quiet",
        ],
    );
    let k = kill_loop(
        &args,
        14,
        sd,
        100..=1500,
        |_, _| Tick::Timer,
        |run, _| {
            let (got, _) = dir_records(&out);
            assert_in_order_once(&got, &want, tag, &format!("follow after run {run}"));
        },
    );
    writer.join().unwrap();
    // A last run follows until the target holds every line, then is killed.
    let mut child = Command::new(BIN)
        .args(&args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let t = Instant::now();
    let mut n = 0;
    while t.elapsed() < Duration::from_secs(90) {
        n = dir_records(&out).0.len();
        if n >= want.len() {
            break;
        }
        assert!(
            child.try_wait().unwrap().is_none(),
            "--follow ended on its own"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    std::thread::sleep(Duration::from_millis(300));
    child.kill().unwrap();
    child.wait().unwrap();
    let (got, ids) = dir_records(&out);
    assert_exactly_once(&got, &want, tag, "follow into dir");
    assert_verify_and_dump_clean(&wal, "after the follow runs");
    let i = inspect(&wal, Some(&sink));
    assert_eq!(
        i["target"]["committed"].as_u64(),
        ids.iter().max().copied(),
        "{i}"
    );
    eprintln!(
        "follow: seed {sd}, {} lines in {nb} bursts ({} MiB), {} SIGKILLs, {} files, waited \
         {:.1}s for the last {} lines",
        want.len(),
        total >> 20,
        k.kills,
        ids.len(),
        t.elapsed().as_secs_f64(),
        want.len().saturating_sub(n)
    );
    assert!(k.kills >= 10, "too few kills landed: {k:?}");
    assert!(
        k.failed.is_empty(),
        "runs that failed on their own: {:#?}",
        k.failed
    );
}

// ---------------------------------------------------------------------------------------
// An HTTP receiver that deduplicates by Idempotency-Key (std only)
// ---------------------------------------------------------------------------------------

#[derive(Default)]
struct HttpState {
    /// key -> (body, Walsink-Chunk header)
    kept: HashMap<String, (Vec<u8>, String)>,
    /// keys in the order they were first taken
    first_seen: Vec<String>,
    conflicts: Vec<String>,
    requests: u64,
    faults: u64,
    /// fault probability, delay before each answer (ms)
    fault_p: f64,
    delay_ms: u64,
    /// the highest chunk number taken since the run started
    chunk_in_run: u64,
    /// answer every request 503 (nothing taken)
    always_503: bool,
}

struct HttpReceiver {
    port: u16,
    state: Arc<Mutex<HttpState>>,
    stop: Arc<AtomicBool>,
}

impl HttpReceiver {
    fn start(seed: u64) -> HttpReceiver {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        let state = Arc::new(Mutex::new(HttpState::default()));
        let stop = Arc::new(AtomicBool::new(false));
        let (st, sp) = (state.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut n = 0u64;
            for c in l.incoming() {
                if sp.load(Ordering::Relaxed) {
                    return;
                }
                let Ok(c) = c else { continue };
                n += 1;
                let st = st.clone();
                let s2 = seed ^ n.wrapping_mul(0x9e37_79b9_7f4a_7c15);
                std::thread::spawn(move || serve(c, st, s2));
            }
        });
        HttpReceiver { port, state, stop }
    }

    fn url(&self, params: &str) -> String {
        format!("http://127.0.0.1:{}/ingest?{params}", self.port)
    }

    fn set(&self, fault_p: f64, delay_ms: u64) {
        let mut g = self.state.lock().unwrap();
        g.fault_p = fault_p;
        g.delay_ms = delay_ms;
    }

    /// The records of `sink` after deduplication by key, in (checkpoint, chunk) order; with
    /// `complete` every epoch's chunks must run from 0 to one marked `last=true`.
    fn records(&self, sink: &str, complete: bool) -> (Vec<Vec<u8>>, Vec<u64>) {
        let g = self.state.lock().unwrap();
        let mut by: BTreeMap<(u64, u64), (&Vec<u8>, &String)> = BTreeMap::new();
        for (k, (body, hdr)) in &g.kept {
            let (ck, chunk) = parse_key(k);
            assert!(k.starts_with(&format!("{sink}:0:")), "foreign key {k}");
            by.insert((ck, chunk), (body, hdr));
        }
        let mut recs = Vec::new();
        let mut cps: Vec<u64> = Vec::new();
        let mut expect_chunk = 0;
        let mut epoch_start = 0;
        let mut last_cp = None;
        for ((ck, chunk), (body, hdr)) in &by {
            if last_cp != Some(*ck) {
                if complete {
                    assert_eq!(
                        expect_chunk, 0,
                        "checkpoint {last_cp:?} lacks its last chunk"
                    );
                }
                last_cp = Some(*ck);
                cps.push(*ck);
                expect_chunk = 0;
            }
            if complete {
                assert_eq!(*chunk, expect_chunk, "checkpoint {ck}: chunk gap");
            }
            expect_chunk = if hdr.contains("last=true") {
                0
            } else {
                chunk + 1
            };
            if *chunk == 0 {
                epoch_start = recs.len();
            }
            let before = recs.len();
            for l in body.split(|&b| b == b'\n') {
                recs.push(l.to_vec());
            }
            assert_eq!(
                recs.pop(),
                Some(Vec::new()),
                "body of {ck}:{chunk} ends with \\n"
            );
            // Walsink-Chunk: first=F; count=C; ...
            let field = |name: &str| -> Option<usize> {
                hdr.split(';')
                    .map(str::trim)
                    .find_map(|f| f.strip_prefix(name)?.strip_prefix('=')?.parse().ok())
            };
            assert_eq!(
                field("count"),
                Some(recs.len() - before),
                "{ck}:{chunk}: {hdr}"
            );
            if complete {
                assert_eq!(
                    field("first"),
                    Some(before - epoch_start),
                    "{ck}:{chunk}: {hdr}"
                );
            }
        }
        if complete {
            assert_eq!(expect_chunk, 0, "the last checkpoint lacks its last chunk");
        }
        (recs, cps)
    }
}

impl Drop for HttpReceiver {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        let _ = TcpStream::connect(("127.0.0.1", self.port));
    }
}

fn parse_key(k: &str) -> (u64, u64) {
    let mut it = k.rsplitn(3, ':');
    let chunk = it.next().unwrap().parse().unwrap();
    let ck = it.next().unwrap().parse().unwrap();
    (ck, chunk)
}

fn serve(c: TcpStream, st: Arc<Mutex<HttpState>>, seed: u64) {
    let mut rng = fastrand::Rng::with_seed(seed);
    c.set_read_timeout(Some(Duration::from_secs(30))).ok();
    let mut w = c.try_clone().unwrap();
    let mut r = BufReader::new(c);
    loop {
        // Head
        let mut head = Vec::new();
        loop {
            let mut l = String::new();
            match r.read_line(&mut l) {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
            if l == "\r\n" || l == "\n" {
                break;
            }
            head.push(l.trim_end().to_string());
        }
        if head.first().is_some_and(|l| l.starts_with("HEAD ")) {
            // The sink's start-up check: answered, not counted, no fault.
            if w.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n")
                .is_err()
            {
                return;
            }
            continue;
        }
        let mut len = 0usize;
        let (mut key, mut chunk_hdr, mut chunked) = (String::new(), String::new(), false);
        for h in &head[1..] {
            let (n, v) = h.split_once(':').unwrap_or((h, ""));
            let v = v.trim();
            match n.to_ascii_lowercase().as_str() {
                "content-length" => len = v.parse().unwrap_or(0),
                "idempotency-key" => key = v.to_string(),
                "walsink-chunk" => chunk_hdr = v.to_string(),
                "transfer-encoding" => chunked = v.eq_ignore_ascii_case("chunked"),
                _ => {}
            }
        }
        let (p, delay) = {
            let mut g = st.lock().unwrap();
            g.requests += 1;
            (g.fault_p, g.delay_ms)
        };
        let always_503 = st.lock().unwrap().always_503;
        let fault = if always_503 {
            2
        } else if rng.f64() < p {
            rng.u32(0..3) + 1
        } else {
            0
        };
        if fault == 1 {
            // Close before reading the body: nothing taken.
            st.lock().unwrap().faults += 1;
            return;
        }
        let mut body = Vec::new();
        if chunked {
            loop {
                let mut l = String::new();
                if r.read_line(&mut l).unwrap_or(0) == 0 {
                    return;
                }
                let n = usize::from_str_radix(l.trim(), 16).unwrap_or(0);
                let mut b = vec![0; n + 2];
                if r.read_exact(&mut b).is_err() {
                    return;
                }
                if n == 0 {
                    break;
                }
                body.extend_from_slice(&b[..n]);
            }
        } else {
            body.resize(len, 0);
            if r.read_exact(&mut body).is_err() {
                return;
            }
        }
        if fault == 2 {
            st.lock().unwrap().faults += 1;
            let _ = w.write_all(b"HTTP/1.1 503 Service Unavailable\r\ncontent-length: 0\r\n\r\n");
            continue;
        }
        let status = {
            let mut g = st.lock().unwrap();
            let (_, chunk) = parse_key(&key);
            g.chunk_in_run = g.chunk_in_run.max(chunk);
            match g.kept.get(&key) {
                Some((b, _)) if *b == body => "200 OK",
                Some(_) => {
                    g.conflicts.push(key.clone());
                    "422 Unprocessable Entity"
                }
                None => {
                    g.kept.insert(key.clone(), (body, chunk_hdr));
                    g.first_seen.push(key.clone());
                    "200 OK"
                }
            }
        };
        if fault == 3 {
            // Taken, but the connection closes before the answer.
            st.lock().unwrap().faults += 1;
            return;
        }
        if delay > 0 {
            std::thread::sleep(Duration::from_millis(delay));
        }
        if w.write_all(format!("HTTP/1.1 {status}\r\ncontent-length: 0\r\n\r\n").as_bytes())
            .is_err()
        {
            return;
        }
    }
}

/// The keys taken first, in arrival order, must be in (checkpoint, chunk) order: epochs go
/// strictly in order and chunks one at a time (concurrency 1). With chunks in flight
/// (`chunks_in_order` false) only the checkpoints must not go back: epochs never overlap.
fn assert_first_seen_in_order(r: &HttpReceiver, chunks_in_order: bool) {
    let g = r.state.lock().unwrap();
    let mut prev: Option<(u64, u64)> = None;
    for k in &g.first_seen {
        let p = parse_key(k);
        if chunks_in_order {
            assert!(Some(p) > prev, "key {k} first arrived after {prev:?}");
        } else {
            assert!(
                prev.is_none_or(|q| p.0 >= q.0),
                "key {k} first arrived after a key of checkpoint {prev:?}: epochs overlapped"
            );
        }
        prev = Some(p);
    }
}

fn http_kill_loop(sd: u64, params: &str, budget: Option<&str>, in_flight: bool) {
    let r = HttpReceiver::start(sd);
    let d = tempfile::tempdir().unwrap();
    let (inp, wal) = (d.path().join("in.txt"), d.path().join("wal"));
    let tag = "H";
    let (want, blocks) = mixed_input(tag, sd, 90 << 20, true);
    write_lines(&inp, &want);
    let id = unique("h");
    let url = r.url(params);
    let mut extra = vec![
        "--checkpoint-every",
        "2000",
        "--checkpoint-interval",
        "400ms",
        "--sink-id",
        &id,
        "--quiet",
    ];
    if let Some(b) = budget {
        extra.extend(["--max-backlog-bytes", b]);
    }
    let args = pipe_args(&inp, &wal, &url, &extra);
    // A tenth of the requests fail: closed before the body is read, 503, or taken and
    // closed before the answer.
    r.set(0.10, 0);
    let mut rng = fastrand::Rng::with_seed(sd ^ 7);
    // Half the runs are killed as soon as a chunk numbered 3 or above (the middle of an
    // epoch of at least 768 KiB) is taken; the others at a random moment.
    let mut mid_epoch_kills = 0;
    let (mut armed, mut this_run, mut threshold) = (false, u32::MAX, 0);
    let runs: u32 = std::env::var("PROBE6_RUNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(16);
    if let Ok(p) = std::env::var("PROBE6_FAULTS") {
        r.set(p.parse().unwrap(), 0);
    }
    let mut log_view: BTreeMap<u64, (u64, u64)> = BTreeMap::new();
    let k = kill_loop(
        &args,
        runs,
        sd,
        80..=2500,
        |run, elapsed| {
            if run != this_run {
                this_run = run;
                armed = rng.bool();
                threshold = 3 + rng.u64(0..20);
                r.state.lock().unwrap().chunk_in_run = 0;
            }
            if armed && r.state.lock().unwrap().chunk_in_run >= threshold {
                mid_epoch_kills += 1;
                armed = false;
                return Tick::Kill;
            }
            // An armed run waits for its chunk (up to 20 s), whatever its random delay.
            if armed && elapsed < Duration::from_secs(20) {
                Tick::Hold
            } else {
                Tick::Timer
            }
        },
        |run, _| {
            let (got, _) = r.records(&id, false);
            if wal.join("WALSINK").exists() {
                let i = inspect(&wal, None);
                for c in i["checkpoints"].as_array().unwrap() {
                    let m: serde_json::Value =
                        serde_json::from_str(c["metadata"].as_str().unwrap()).unwrap();
                    log_view.insert(
                        c["id"].as_u64().unwrap(),
                        (c["records"].as_u64().unwrap(), m["lines"].as_u64().unwrap()),
                    );
                }
            }
            // Incomplete epochs may be there: check what is there is each line at most
            // once, in order.
            assert_in_order_once(&got, &want, tag, &format!("http after run {run}"));
        },
    );
    r.set(0.0, 0);
    let (code, err) = run_to_end(&args, Duration::from_secs(120));
    assert_eq!(code, Some(0), "{err}");
    let (got, cps) = r.records(&id, true);
    if got != want {
        // Say where the lines went missing: the key holding the line before each gap.
        let g = r.state.lock().unwrap();
        eprintln!(
            "conflicts (key repeated with another body): {:?}",
            g.conflicts
        );
        let mut keys: Vec<_> = g.kept.iter().collect();
        keys.sort_by_key(|(k, _)| parse_key(k));
        let mut prev_last: Option<usize> = None;
        for (k, (body, hdr)) in keys {
            let ls: Vec<&[u8]> = body
                .split(|&b| b == b'\n')
                .filter(|l| !l.is_empty())
                .collect();
            let first = ls.first().and_then(|l| index_of(l, tag));
            let last = ls.last().and_then(|l| index_of(l, tag));
            if let (Some(p), Some(f)) = (prev_last, first) {
                if f != p + 1 {
                    eprintln!("gap before key {k} ({hdr}): lines {}..{f} missing", p + 1);
                }
            }
            let idx: Vec<usize> = ls.iter().filter_map(|l| index_of(l, tag)).collect();
            if idx.windows(2).any(|w| w[1] != w[0] + 1) {
                eprintln!("gap inside key {k} ({hdr})");
            }
            prev_last = last.or(prev_last);
        }
        drop(g);
        let o = walsink(&["dump", s(&wal), "--json"]);
        eprintln!(
            "log dump has {} lines",
            o.stdout.split(|&b| b == b'\n').count()
        );
        eprintln!("the log's checkpoints seen (id: records, lines at its end): {log_view:?}");
    }
    assert_exactly_once(&got, &want, tag, "http receiver after dedupe by key");
    let (conflicts, requests, faults, keys) = {
        let g = r.state.lock().unwrap();
        (g.conflicts.clone(), g.requests, g.faults, g.kept.len())
    };
    assert!(
        conflicts.is_empty(),
        "keys repeated with other bodies: {conflicts:?}"
    );
    assert_first_seen_in_order(&r, !in_flight);
    let i = assert_log_drained(&wal, want.len());
    assert_eq!(last_nonempty_checkpoint(&i), cps.last().copied(), "{i}");
    assert!(i["committed"].as_u64().unwrap() >= *cps.last().unwrap());
    assert_verify_and_dump_clean(&wal, "after the final http run");
    eprintln!(
        "http {params} budget {budget:?}: seed {sd}, {} lines in {} blocks ({} MiB), {} SIGKILLs ({mid_epoch_kills} \
         right after a chunk >= 3 was taken), {} runs ended, {requests} requests, {faults} \
         faults, {keys} keys, {} checkpoints",
        want.len(),
        blocks.len(),
        blocks.iter().sum::<usize>() >> 20,
        k.kills,
        k.ended,
        cps.len()
    );
    assert!(k.kills >= 8, "too few kills landed: {k:?}");
    assert!(
        k.failed.is_empty(),
        "runs that failed on their own: {:#?}",
        k.failed
    );
    assert!(
        mid_epoch_kills >= 2,
        "too few mid-epoch kills: {mid_epoch_kills}"
    );
}

#[test]
fn http_kill_loop_with_faults_and_large_epochs_delivers_once_after_dedupe() {
    http_kill_loop(
        seed(0x6002),
        "max_records=1000&max_bytes=256KiB&timeout=5s",
        None,
        false,
    );
}

#[test]
fn http_kill_loop_with_chunks_in_flight_and_a_disk_budget() {
    http_kill_loop(
        seed(0x6008),
        "max_records=500&max_bytes=128KiB&timeout=5s&concurrency=4",
        Some("6MiB"),
        true,
    );
}

/// Deterministic: a target that answers 503 keeps every epoch in the log, so the disk budget
/// fills and `pipe` cuts an epoch short of `--checkpoint-every` and waits. Killed there and
/// re-run against a healthy receiver, every line must arrive once.
#[test]
fn a_kill_while_the_disk_budget_is_full_loses_no_line() {
    let r = HttpReceiver::start(1);
    r.state.lock().unwrap().always_503 = true;
    let d = tempfile::tempdir().unwrap();
    let (inp, wal) = (d.path().join("in.txt"), d.path().join("wal"));
    let tag = "B";
    // 3000 lines of 4011 bytes (12 MB): one epoch of checkpoint-every 100000 would hold all.
    let want: Vec<Vec<u8>> = (0..3000).map(|i| line(tag, i, 4000)).collect();
    write_lines(&inp, &want);
    let url = r.url("max_bytes=256KiB&timeout=5s");
    let args = pipe_args(
        &inp,
        &wal,
        &url,
        &[
            "--checkpoint-every",
            "100000",
            "--max-backlog-bytes",
            "4MiB",
            "--max-retries",
            "1000",
            "--quiet",
        ],
    );
    let mut child = Command::new(BIN)
        .args(&args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    // Wait (bounded) until the log holds a sealed epoch cut by the budget.
    let t = Instant::now();
    let sealed = loop {
        assert!(t.elapsed() < Duration::from_secs(30), "no epoch was sealed");
        assert!(
            child.try_wait().unwrap().is_none(),
            "pipe ended against a 503 target"
        );
        std::thread::sleep(Duration::from_millis(200));
        if !wal.join("WALSINK").exists() {
            continue;
        }
        let i = inspect(&wal, None);
        if let Some(c) = i["checkpoints"].as_array().unwrap().first() {
            let m: serde_json::Value =
                serde_json::from_str(c["metadata"].as_str().unwrap()).unwrap();
            break (c["records"].as_u64().unwrap(), m["lines"].as_u64().unwrap());
        }
    };
    std::thread::sleep(Duration::from_millis(500));
    child.kill().unwrap(); // SIGKILL while reading waits for the budget
    child.wait().unwrap();
    r.state.lock().unwrap().always_503 = false;
    let (code, err) = run_to_end(&args, Duration::from_secs(60));
    assert_eq!(code, Some(0), "{err}");
    let (got, _) = r.records("pipe", true);
    eprintln!(
        "budget: the first sealed epoch holds {} records, its metadata says {} lines \
         consumed; after the kill and a re-run the receiver holds {} of {} lines",
        sealed.0,
        sealed.1,
        got.len(),
        want.len()
    );
    assert_exactly_once(&got, &want, tag, "budget-cut epoch after a kill");
    assert_eq!(
        sealed.0, sealed.1,
        "the checkpoint's metadata counts a line its epoch does not hold"
    );
}

#[test]
fn http_slow_receiver_live_verify_dump_inspect_and_the_log_shrinks() {
    let sd = seed(0x6003);
    let r = HttpReceiver::start(sd);
    // Every answer waits: the log grows while the pipe reads ahead of delivery. Until the
    // log holds 3 written segments the answers wait a second each, so the backlog builds
    // however slowly a loaded machine appends; then 15 ms each.
    r.set(0.0, 1000);
    let mut released = false;
    let d = tempfile::tempdir().unwrap();
    let (inp, wal) = (d.path().join("in.txt"), d.path().join("wal"));
    let tag = "S";
    let (want, _) = mixed_input(tag, sd, 220 << 20, true);
    write_lines(&inp, &want);
    let id = unique("s");
    let url = r.url("max_records=2000&max_bytes=256KiB&timeout=10s");
    let args = pipe_args(
        &inp,
        &wal,
        &url,
        &["--checkpoint-every", "2000", "--sink-id", &id, "--quiet"],
    );
    let refs: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut child = Command::new(BIN)
        .args(&refs)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let t = Instant::now();
    let (mut peak, mut verifies, mut dumps, mut full_dumps) = (LogFiles::default(), 0, 0, 0);
    let mut problems = Vec::new();
    let status = loop {
        if let Some(st) = child.try_wait().unwrap() {
            break st;
        }
        assert!(t.elapsed() < Duration::from_secs(150), "the slow run hangs");
        let f = log_files(&wal);
        if f.allocated > peak.allocated {
            peak.allocated = f.allocated;
        }
        peak.wseg = peak.wseg.max(f.wseg);
        peak.free = peak.free.max(f.free);
        if !released && (f.wseg >= 3 || t.elapsed() > Duration::from_secs(60)) {
            r.set(0.0, 15);
            released = true;
        }
        if !wal.join("WALSINK").exists() {
            std::thread::sleep(Duration::from_millis(20));
            continue;
        }
        let o = walsink(&["verify", s(&wal), "--json", "--quiet"]);
        verifies += 1;
        if o.status.code() != Some(0) {
            problems.push(format!(
                "verify exit {:?}: {} {}",
                o.status.code(),
                text(&o.stdout),
                text(&o.stderr)
            ));
        }
        let o = walsink(&["dump", s(&wal), "-n", "50", "--json"]);
        dumps += 1;
        if o.status.code() != Some(0) || !o.stderr.is_empty() {
            problems.push(format!(
                "dump -n exit {:?}: {}",
                o.status.code(),
                text(&o.stderr)
            ));
        }
        if verifies % 4 == 0 {
            let (code, err) = walsink_quiet_stdout(&["dump", s(&wal)]);
            full_dumps += 1;
            if code != Some(0) || !err.is_empty() {
                problems.push(format!("full dump exit {code:?}: {err}"));
            }
        }
        let o = walsink(&["inspect", s(&wal), "--json"]);
        if o.status.code() != Some(0) || json(&o.stdout)["ok"] != true {
            problems.push(format!(
                "inspect exit {:?}: {} {}",
                o.status.code(),
                text(&o.stdout),
                text(&o.stderr)
            ));
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let mut err = String::new();
    child.stderr.take().unwrap().read_to_string(&mut err).ok();
    assert!(status.success(), "the slow run: {status}: {err}");
    let end = log_files(&wal);
    eprintln!(
        "live: seed {sd}, {:.1}s, {verifies} verify, {dumps} dump -n, {full_dumps} full dumps \
         while the pipe ran; peak {peak:?}, end {end:?}; problems: {problems:#?}",
        t.elapsed().as_secs_f64()
    );
    assert!(
        problems.is_empty(),
        "verify/dump/inspect on a healthy live log reported problems: {problems:#?}"
    );
    // How many fit depends on the machine's load (a verify of a debug build reads the
    // whole log); two show the checks ran beside a live pipe.
    assert!(verifies >= 2, "too few live checks: {verifies}");
    let (got, cps) = r.records(&id, true);
    assert_exactly_once(&got, &want, tag, "slow http receiver");
    assert_first_seen_in_order(&r, true);
    let i = assert_log_drained(&wal, want.len());
    assert_eq!(last_nonempty_checkpoint(&i), cps.last().copied());
    // The backlog grew over several segments, and delivery freed them.
    assert!(
        peak.wseg >= 3,
        "the log never held a backlog of 3 segments: {peak:?}"
    );
    assert!(end.wseg <= 2, "segments left after delivery: {end:?}");
    assert!(
        end.allocated < peak.allocated,
        "the log directory did not shrink: peak {peak:?}, end {end:?}"
    );
    assert_verify_and_dump_clean(&wal, "after the slow run");
}

// ---------------------------------------------------------------------------------------
// Redis
// ---------------------------------------------------------------------------------------

const REDIS: &str = "redis://127.0.0.1:6379/0";

fn redis_q<T: redis::FromRedisValue>(cmd: &mut redis::Cmd) -> Result<T, String> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let mut c = redis::Client::open(REDIS)
            .unwrap()
            .get_multiplexed_async_connection_with_config(
                &redis::AsyncConnectionConfig::new()
                    .set_response_timeout(Some(Duration::from_secs(60))),
            )
            .await
            .map_err(|e| e.to_string())?;
        cmd.query_async(&mut c).await.map_err(|e| e.to_string())
    })
}

/// Reads with retries: our own reading connection may be killed by `CLIENT KILL`.
fn redis_read<T: redis::FromRedisValue>(mk: impl Fn() -> redis::Cmd) -> T {
    let mut last = String::new();
    for _ in 0..40 {
        match redis_q(&mut mk()) {
            Ok(v) => return v,
            Err(e) => last = e,
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    panic!("the local Redis at 127.0.0.1:6379 does not answer: {last}");
}

fn redis_client_kill() {
    let _ = Command::new("redis-cli")
        .args([
            "-h",
            "127.0.0.1",
            "-p",
            "6379",
            "CLIENT",
            "KILL",
            "TYPE",
            "normal",
            "SKIPME",
            "yes",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
}

/// Deletes the data key and every marker key of it.
fn redis_cleanup(key: &str) {
    let markers: Vec<String> = redis_read(|| {
        redis::cmd("KEYS")
            .arg(format!("walsink:{{{key}}}:committed*"))
            .clone()
    });
    let _: i64 = redis_read(|| redis::cmd("DEL").arg(key).clone());
    for m in markers {
        let _: i64 = redis_read(|| redis::cmd("DEL").arg(&m).clone());
    }
}

/// The `marker` field of the key's marker hash: `CHECKPOINT:NEXT:DONE`.
fn redis_marker(key: &str) -> Option<String> {
    let markers: Vec<String> = redis_read(|| {
        redis::cmd("KEYS")
            .arg(format!("walsink:{{{key}}}:committed*"))
            .clone()
    });
    assert!(markers.len() <= 1, "{markers:?}");
    let m = markers.first()?;
    redis_read(|| redis::cmd("HGET").arg(m).arg("marker").clone())
}

fn redis_kill_loop(mode: &str, sd: u64) {
    let d = tempfile::tempdir().unwrap();
    let (inp, wal) = (d.path().join("in.txt"), d.path().join("wal"));
    let key = format!("walsink-probe6:{}", unique(mode));
    let tag = if mode == "list" { "RL" } else { "RH" };
    // Hash mode: FIELD<TAB>VALUE with 5000 fields reused over and over, so the final hash
    // (and every state in between) says which prefix of the input was applied.
    const FIELDS: usize = 5000;
    let (base, blocks) = mixed_input(
        tag,
        sd,
        if mode == "list" { 110 << 20 } else { 80 << 20 },
        true,
    );
    let want: Vec<Vec<u8>> = if mode == "list" {
        base
    } else {
        base.into_iter()
            .enumerate()
            .map(|(i, l)| {
                let mut v = format!("f{:05}\t", i % FIELDS).into_bytes();
                v.extend(l);
                v
            })
            .collect()
    };
    write_lines(&inp, &want);
    let id = unique("r");
    let _clean = Cleanup(|| redis_cleanup(&key));
    let sink = format!("{REDIS}?key={key}&mode={mode}&chunk_records=500");
    let args = pipe_args(
        &inp,
        &wal,
        &sink,
        &[
            "--checkpoint-every",
            "2000",
            "--checkpoint-interval",
            "300ms",
            "--sink-id",
            &id,
            "--quiet",
        ],
    );
    let check = |what: &str| match mode {
        "list" => {
            let got: Vec<Vec<u8>> =
                redis_read(|| redis::cmd("LRANGE").arg(&key).arg(0).arg(-1).clone());
            assert_in_order_once(&got, &want, tag, what);
            got.len()
        }
        _ => {
            let got: HashMap<String, Vec<u8>> =
                redis_read(|| redis::cmd("HGETALL").arg(&key).clone());
            assert_hash_is_a_prefix_state(&got, &want, FIELDS, tag, what)
        }
    };
    let disrupt = Disruptor::start(sd ^ 0xc1, 150..=900, redis_client_kill);
    let k = kill_loop(
        &args,
        14,
        sd,
        40..=700,
        |_, _| Tick::Timer,
        |run, _| {
            check(&format!("redis {mode} after run {run}"));
        },
    );
    // A complete run under CLIENT KILL too.
    let (code, err) = run_to_end(&args, Duration::from_secs(120));
    let client_kills = disrupt.finish();
    assert_eq!(code, Some(0), "{err}");
    let n = check(&format!("redis {mode} at the end"));
    match mode {
        "list" => assert_eq!(n, want.len(), "every line in the list"),
        _ => assert_eq!(
            n,
            want.len() - 1,
            "the hash holds the state after the last line"
        ),
    }
    if mode == "list" {
        let got: Vec<Vec<u8>> =
            redis_read(|| redis::cmd("LRANGE").arg(&key).arg(0).arg(-1).clone());
        assert_exactly_once(&got, &want, tag, "redis list");
    }
    let i = assert_log_drained(&wal, want.len());
    // The marker, inspect --sink and the log agree.
    let marker = redis_marker(&key).expect("a marker key");
    let parts: Vec<&str> = marker.split(':').collect();
    let marker_cp: u64 = parts[0].parse().unwrap();
    assert_eq!(
        parts.get(2).copied(),
        Some("1"),
        "the marker's epoch is complete: {marker}"
    );
    assert_eq!(
        Some(marker_cp),
        last_nonempty_checkpoint(&i),
        "marker {marker} vs {i}"
    );
    let t = inspect(&wal, Some(&sink));
    assert_eq!(t["target"]["committed"].as_u64(), Some(marker_cp), "{t}");
    assert_verify_and_dump_clean(&wal, &format!("after the final redis {mode} run"));
    eprintln!(
        "redis {mode}: seed {sd}, {} lines in {} blocks ({} MiB), {} SIGKILLs, {} runs \
         ended, {client_kills} CLIENT KILLs, marker {marker}",
        want.len(),
        blocks.len(),
        blocks.iter().sum::<usize>() >> 20,
        k.kills,
        k.ended
    );
    assert!(k.kills >= 6, "too few kills landed: {k:?}");
    assert!(
        k.failed.is_empty(),
        "runs that failed on their own: {:#?}",
        k.failed
    );
    assert!(client_kills >= 5, "too few CLIENT KILLs: {client_kills}");
}

/// A hash after applying lines `0..=m` in order holds, for each field, the value of the
/// last line `<= m` with that field. Returns `m`. Fails when a field holds a value that is
/// not the one of that prefix (an epoch applied twice out of order, skipped, or reordered).
fn assert_hash_is_a_prefix_state(
    got: &HashMap<String, Vec<u8>>,
    want: &[Vec<u8>],
    fields: usize,
    tag: &str,
    what: &str,
) -> usize {
    if got.is_empty() {
        return 0;
    }
    let mut m = 0;
    for (f, v) in got {
        let i = index_of(v, tag).unwrap_or_else(|| panic!("{what}: foreign value in {f}"));
        let mut line = format!("{f}\t").into_bytes();
        line.extend_from_slice(v);
        assert!(
            i < want.len() && want[i] == line,
            "{what}: {f} holds a foreign value"
        );
        m = m.max(i);
    }
    let expect_fields = (m + 1).min(fields);
    assert_eq!(
        got.len(),
        expect_fields,
        "{what}: fields for prefix 0..={m}"
    );
    for (f, v) in got {
        let fi: usize = f[1..].parse().unwrap();
        // The last line <= m with this field.
        let last = m - ((m + fields - fi) % fields);
        let i = index_of(v, tag).unwrap();
        assert_eq!(
            i, last,
            "{what}: field {f} holds line {i}, but after line {m} it must hold line {last}"
        );
    }
    m
}

#[test]
fn redis_list_kill_loop_with_client_kill_and_large_epochs() {
    if skip(
        "redis_list_kill_loop_with_client_kill_and_large_epochs",
        "a local Redis",
    ) {
        return;
    }
    redis_kill_loop("list", seed(0x6004));
}

#[test]
fn redis_hash_kill_loop_with_client_kill_and_large_epochs() {
    if skip(
        "redis_hash_kill_loop_with_client_kill_and_large_epochs",
        "a local Redis",
    ) {
        return;
    }
    redis_kill_loop("hash", seed(0x6005));
}

// ---------------------------------------------------------------------------------------
// NATS JetStream
// ---------------------------------------------------------------------------------------

mod nats {
    use async_nats::jetstream::{self, consumer};
    use futures_util::StreamExt;
    use std::time::Duration;

    fn rt() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
    }

    async fn js() -> jetstream::Context {
        let c = async_nats::connect("127.0.0.1:4222")
            .await
            .expect("the local NATS at 127.0.0.1:4222");
        jetstream::new(c)
    }

    pub fn create_stream(name: &str, subject: &str) {
        rt().block_on(async {
            js().await
                .create_stream(jetstream::stream::Config {
                    name: name.into(),
                    subjects: vec![subject.into()],
                    ..Default::default()
                })
                .await
                .expect("create the stream");
        })
    }

    pub fn delete_stream(name: &str) {
        rt().block_on(async {
            let _ = js().await.delete_stream(name).await;
        })
    }

    pub fn read_stream(name: &str) -> Vec<(String, Vec<u8>)> {
        rt().block_on(async {
            let js = js().await;
            let mut stream = js.get_stream(name).await.unwrap();
            let total = stream.info().await.unwrap().state.messages;
            let mut out = Vec::new();
            if total == 0 {
                return out;
            }
            let c = stream
                .create_consumer(consumer::pull::OrderedConfig::default())
                .await
                .unwrap();
            let mut msgs = c.messages().await.unwrap();
            while (out.len() as u64) < total {
                let m = tokio::time::timeout(Duration::from_secs(30), msgs.next())
                    .await
                    .expect("messages within 30 s")
                    .unwrap()
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
        })
    }
}

#[test]
fn nats_kill_loop_with_large_epochs_once_within_the_window() {
    if skip(
        "nats_kill_loop_with_large_epochs_once_within_the_window",
        "a local NATS",
    ) {
        return;
    }
    let sd = seed(0x6006);
    let d = tempfile::tempdir().unwrap();
    let (inp, wal) = (d.path().join("in.txt"), d.path().join("wal"));
    let tag = "N";
    let (want, blocks) = mixed_input(tag, sd, 80 << 20, false);
    write_lines(&inp, &want);
    let u = unique("p6").replace('-', "_");
    let (stream, subject) = (format!("WALSINK_PROBE6_{u}"), format!("walsink-probe6.{u}"));
    nats::create_stream(&stream, &subject);
    let _clean = Cleanup(|| nats::delete_stream(&stream));
    let sink = format!("nats://127.0.0.1:4222/?stream={stream}&subject={subject}");
    let id = unique("n");
    let args = pipe_args(
        &inp,
        &wal,
        &sink,
        &[
            "--checkpoint-every",
            "2000",
            "--checkpoint-interval",
            "300ms",
            "--sink-id",
            &id,
            "--quiet",
        ],
    );
    let t0 = Instant::now();
    let k = kill_loop(
        &args,
        12,
        sd,
        50..=900,
        |_, _| Tick::Timer,
        |run, _| {
            let got: Vec<Vec<u8>> = nats::read_stream(&stream)
                .into_iter()
                .map(|(_, p)| p)
                .collect();
            assert_in_order_once(&got, &want, tag, &format!("nats after run {run}"));
        },
    );
    let (code, err) = run_to_end(&args, Duration::from_secs(120));
    let elapsed = t0.elapsed();
    let held = nats::read_stream(&stream);
    nats::delete_stream(&stream);
    assert_eq!(code, Some(0), "{err}");
    assert!(
        elapsed < Duration::from_secs(115),
        "the loop outran the 2-minute duplicate window ({elapsed:?}): duplicates would be allowed"
    );
    let mut ids = std::collections::HashSet::new();
    let mut prev: Option<(u64, u64)> = None;
    for (mid, _) in &held {
        assert!(mid.starts_with(&format!("{id}:0:")), "{mid}");
        assert!(ids.insert(mid.clone()), "{mid} twice");
        let p = parse_key(mid);
        assert!(Some(p) > prev, "message id {mid} stored after {prev:?}");
        prev = Some(p);
    }
    let got: Vec<Vec<u8>> = held.into_iter().map(|(_, p)| p).collect();
    assert_exactly_once(&got, &want, tag, "nats stream");
    let i = assert_log_drained(&wal, want.len());
    assert_eq!(last_nonempty_checkpoint(&i), prev.map(|p| p.0), "{i}");
    assert_verify_and_dump_clean(&wal, "after the final nats run");
    eprintln!(
        "nats: seed {sd}, {} lines in {} blocks ({} MiB), {} SIGKILLs, {} runs ended, {:?}",
        want.len(),
        blocks.len(),
        blocks.iter().sum::<usize>() >> 20,
        k.kills,
        k.ended,
        elapsed
    );
    assert!(k.kills >= 6, "too few kills landed: {k:?}");
    assert!(
        k.failed.is_empty(),
        "runs that failed on their own: {:#?}",
        k.failed
    );
}

// ---------------------------------------------------------------------------------------
// PostgreSQL
// ---------------------------------------------------------------------------------------

const PG: &str = "postgres://postgres@127.0.0.1:5432/test";

fn psql(sql: &str) -> String {
    let o = Command::new("psql")
        .args([PG, "-AtXq", "-v", "ON_ERROR_STOP=1", "-c", sql])
        .output()
        .expect("run psql");
    assert!(o.status.success(), "psql {sql}: {}", text(&o.stderr));
    text(&o.stdout)
}

fn pg_lines(table: &str, sink_id: &str) -> Vec<Vec<u8>> {
    let sql = format!(
        "SELECT convert_from(payload, 'UTF8') FROM {table} WHERE sink_id = '{sink_id}' \
         ORDER BY checkpoint, idx"
    );
    psql(&sql).lines().map(|l| l.as_bytes().to_vec()).collect()
}

#[test]
fn postgres_kill_loop_with_terminated_backends_and_large_epochs() {
    if skip(
        "postgres_kill_loop_with_terminated_backends_and_large_epochs",
        "a local PostgreSQL",
    ) {
        return;
    }
    let sd = seed(0x6007);
    let d = tempfile::tempdir().unwrap();
    let (inp, wal) = (d.path().join("in.txt"), d.path().join("wal"));
    let tag = "P";
    let (want, blocks) = mixed_input(tag, sd, 150 << 20, true);
    write_lines(&inp, &want);
    let u = unique("p6").replace('-', "_");
    let table = format!("probe6_{u}");
    let app = format!("probe6_{u}");
    let id = unique("pg");
    let sink = format!("{PG}?table={table}&application_name={app}");
    let _clean = Cleanup(|| {
        let _ = Command::new("psql")
            .args([PG, "-AtXq", "-c", &format!("DROP TABLE IF EXISTS {table}")])
            .output();
        let _ = Command::new("psql")
            .args([
                PG,
                "-AtXq",
                "-c",
                &format!("DELETE FROM walsink_markers WHERE sink_id = '{id}'"),
            ])
            .output();
    });
    let args = pipe_args(
        &inp,
        &wal,
        &sink,
        &[
            "--checkpoint-every",
            "2000",
            "--checkpoint-interval",
            "300ms",
            "--sink-id",
            &id,
            "--quiet",
        ],
    );
    let terminate_sql = format!(
        "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE application_name = '{app}'"
    );
    let terminated = Arc::new(AtomicU64::new(0));
    let tc = terminated.clone();
    let disrupt = Disruptor::start(sd ^ 0x99, 60..=400, move || {
        let o = Command::new("psql")
            .args([PG, "-AtXq", "-c", &terminate_sql])
            .output();
        if let Ok(o) = o {
            let n: u64 = text(&o.stdout).trim().parse().unwrap_or(0);
            tc.fetch_add(n, Ordering::Relaxed);
        }
    });
    let k = kill_loop(
        &args,
        12,
        sd,
        60..=1200,
        |_, _| Tick::Timer,
        |run, _| {
            let got = pg_lines(&table, &id);
            assert_in_order_once(&got, &want, tag, &format!("postgres after run {run}"));
        },
    );
    let (code, err) = run_to_end(&args, Duration::from_secs(150));
    let rounds = disrupt.finish();
    let got = pg_lines(&table, &id);
    let marker_max: String = psql(&format!(
        "SELECT coalesce(max(checkpoint), 0) FROM walsink_markers WHERE sink_id = '{id}'"
    ));
    let marker_rows: String = psql(&format!(
        "SELECT coalesce(sum(records), 0) FROM walsink_markers WHERE sink_id = '{id}'"
    ));
    let cleanup = || {
        psql(&format!("DROP TABLE IF EXISTS {table}"));
        psql(&format!(
            "DELETE FROM walsink_markers WHERE sink_id = '{id}'"
        ));
    };
    if code != Some(0) {
        cleanup();
        panic!("the final run: {code:?}: {err}");
    }
    let i = assert_log_drained(&wal, want.len());
    let t = inspect(&wal, Some(&sink));
    cleanup();
    assert_exactly_once(&got, &want, tag, "postgres table");
    let marker_max: u64 = marker_max.trim().parse().unwrap();
    assert_eq!(
        marker_rows.trim(),
        want.len().to_string(),
        "records counted by the markers"
    );
    assert_eq!(last_nonempty_checkpoint(&i), Some(marker_max), "{i}");
    assert_eq!(t["target"]["committed"].as_u64(), Some(marker_max), "{t}");
    assert_verify_and_dump_clean(&wal, "after the final postgres run");
    eprintln!(
        "postgres: seed {sd}, {} lines in {} blocks ({} MiB), {} SIGKILLs, {} runs ended, \
         {} backends terminated in {rounds} rounds",
        want.len(),
        blocks.len(),
        blocks.iter().sum::<usize>() >> 20,
        k.kills,
        k.ended,
        terminated.load(Ordering::Relaxed)
    );
    assert!(k.kills >= 6, "too few kills landed: {k:?}");
    assert!(
        k.failed.is_empty(),
        "runs that failed on their own: {:#?}",
        k.failed
    );
    assert!(
        terminated.load(Ordering::Relaxed) >= 3,
        "too few backends terminated"
    );
}
