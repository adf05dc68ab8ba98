//! Outside probes, second round: written from the public documentation only (README.md,
//! docs/design.md, docs/architecture.md, rustdoc) by an acceptance tester who did not read the
//! implementation: streaming delivery, damage met half-way, DirSink over a simulated disk with
//! faults and power loss, dump/verify on damaged logs, recovery reports across reopens. Three
//! failed when written and led to fixes: dump returned Ok on a corrupted log, a lost oldest
//! segment in a log with nothing committed went unreported, and lenient recovery refused a log
//! whose oldest segment was lost under an uncommitted epoch.

// Kept as the outside tester wrote them; these lints are about style, not about what is checked.
#![allow(
    clippy::useless_vec,
    clippy::type_complexity,
    clippy::manual_is_multiple_of,
    clippy::drop_non_drop
)]

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::io;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::mpsc;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use walsink::storage::{CrashOptions, FaultOp, FsStorage, SimStorage, Storage};
use walsink::{
    Chunk, CorruptionReason, DirSink, DumpState, Epoch, ErrorKind, MemorySink, Options,
    ProblemKind, Record, RecoveryMode, RetryPolicy, Sink, SinkError, WalSink,
};

// ---------------------------------------------------------------------------------------------
// helpers

fn pad8(n: usize) -> usize {
    (n + 7) & !7
}

/// Bytes one data frame of a record of `len` bytes takes in a segment (docs/design.md).
fn frame_len(len: usize) -> usize {
    16 + pad8(len)
}

/// Deterministic record content for (checkpoint, index, len).
fn rec(ck: u64, i: u64, len: usize) -> Vec<u8> {
    let mut v = Vec::with_capacity(len);
    let mut x = ck.wrapping_mul(0x9E37_79B9_7F4A_7C15)
        ^ i.wrapping_mul(0xD1B5_4A32_D192_ED03)
        ^ (len as u64).wrapping_add(1);
    while v.len() < len {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        v.push(x as u8);
    }
    v
}

fn fast_retry() -> RetryPolicy {
    RetryPolicy {
        initial: Duration::from_millis(1),
        max: Duration::from_millis(5),
    }
}

fn small_opts(sink: &str, segment: u64, chunk: usize, max_record: usize) -> Options {
    Options::new(sink)
        .segment_size(segment)
        .read_chunk_size(chunk)
        .max_record_size(max_record)
        .max_metadata_size(256)
        .retry(fast_retry())
}

/// Appends records of the given sizes as checkpoint `ck`'s epoch and seals it.
fn fill(wal: &WalSink, ck: u64, sizes: &[usize]) -> Vec<Vec<u8>> {
    let recs: Vec<Vec<u8>> = sizes
        .iter()
        .enumerate()
        .map(|(i, &n)| rec(ck, i as u64, n))
        .collect();
    for r in &recs {
        wal.append(r).expect("append");
    }
    wal.checkpoint(ck, format!("meta-{ck}").as_bytes())
        .expect("checkpoint");
    recs
}

/// Runs `f` on another thread and fails the test if it does not finish within `secs`.
fn with_timeout<T: Send + 'static>(
    secs: u64,
    what: &str,
    f: impl FnOnce() -> T + Send + 'static,
) -> T {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    match rx.recv_timeout(Duration::from_secs(secs)) {
        Ok(v) => v,
        Err(_) => panic!("{what}: did not finish within {secs} s (hang or deadlock)"),
    }
}

fn is_corruption(e: &walsink::Error) -> bool {
    matches!(e.kind(), ErrorKind::Corruption(_))
}

/// A sink that checks every documented property of the epochs it is handed, reading each
/// epoch through `chunks()` and again through `records()`; problems are collected, not panicked.
struct CheckSink {
    expected: HashMap<u64, Vec<Vec<u8>>>,
    chunk_limit: usize,
    delivered: Vec<u64>,
    problems: Vec<String>,
    chunks_per_epoch: BTreeMap<u64, usize>,
}

impl CheckSink {
    fn new(expected: HashMap<u64, Vec<Vec<u8>>>, chunk_limit: usize) -> Self {
        CheckSink {
            expected,
            chunk_limit,
            delivered: vec![],
            problems: vec![],
            chunks_per_epoch: BTreeMap::new(),
        }
    }
}

impl Sink for CheckSink {
    fn deliver(&mut self, epoch: &Epoch) -> Result<(), SinkError> {
        let id = epoch.checkpoint();
        let Some(exp) = self.expected.get(&id).cloned() else {
            self.problems.push(format!("epoch {id} was not expected"));
            return Err(SinkError::permanent("unexpected epoch"));
        };
        if epoch.is_empty() {
            self.problems.push(format!("empty epoch {id} was sent"));
        }
        if epoch.len() != exp.len() as u64 {
            self.problems
                .push(format!("epoch {id}: len {} != {}", epoch.len(), exp.len()));
        }
        let bytes: u64 = exp.iter().map(|r| r.len() as u64).sum();
        if epoch.bytes() != bytes {
            self.problems
                .push(format!("epoch {id}: bytes {} != {bytes}", epoch.bytes()));
        }
        if epoch.metadata() != format!("meta-{id}").as_bytes() {
            self.problems
                .push(format!("epoch {id}: metadata {:?}", epoch.metadata()));
        }
        // pass 1: chunks
        let mut next = 0u64;
        let mut nchunks = 0usize;
        for c in epoch.chunks() {
            let c = c.map_err(|e| SinkError::retryable(e.to_string()))?;
            nchunks += 1;
            if c.is_empty() {
                self.problems
                    .push(format!("epoch {id}: empty chunk handed out"));
            }
            if c.first_index() != next {
                self.problems.push(format!(
                    "epoch {id}: chunk first_index {} expected {next}",
                    c.first_index()
                ));
            }
            let recs: Vec<Record> = c.records().collect();
            if recs.len() as u64 != c.len() {
                self.problems.push(format!(
                    "epoch {id}: chunk len {} but {} records",
                    c.len(),
                    recs.len()
                ));
            }
            let frames: usize = recs.iter().map(|r| frame_len(r.data.len())).sum();
            if recs.len() > 1 && frames > self.chunk_limit {
                self.problems.push(format!(
                    "epoch {id}: chunk of {} records holds {frames} frame bytes > read_chunk_size {}",
                    recs.len(),
                    self.chunk_limit
                ));
            }
            for r in recs {
                if r.position.checkpoint != id || r.position.index != next {
                    self.problems.push(format!(
                        "epoch {id}: position {:?} expected ({id},{next})",
                        r.position
                    ));
                }
                match exp.get(next as usize) {
                    Some(e) if e[..] == r.data[..] => {}
                    _ => self
                        .problems
                        .push(format!("epoch {id}: record {next} differs (chunks)")),
                }
                next += 1;
            }
        }
        if next != exp.len() as u64 {
            self.problems.push(format!(
                "epoch {id}: chunks gave {next} records, expected {}",
                exp.len()
            ));
        }
        self.chunks_per_epoch.insert(id, nchunks);
        // pass 2: records
        let mut n = 0u64;
        for r in epoch.records() {
            let r = r.map_err(|e| SinkError::retryable(e.to_string()))?;
            if r.position.checkpoint != id || r.position.index != n {
                self.problems.push(format!(
                    "epoch {id}: records() position {:?} expected ({id},{n})",
                    r.position
                ));
            }
            match exp.get(n as usize) {
                Some(e) if e[..] == r.data[..] => {}
                _ => self
                    .problems
                    .push(format!("epoch {id}: record {n} differs (records)")),
            }
            n += 1;
        }
        if n != exp.len() as u64 {
            self.problems.push(format!(
                "epoch {id}: records() gave {n}, expected {}",
                exp.len()
            ));
        }
        self.delivered.push(id);
        Ok(())
    }
}

// ---------------------------------------------------------------------------------------------
// 1. streaming delivery

/// Epochs much larger than the chunk, mixed record sizes (0, 1, around 8, around a chunk,
/// larger than a chunk), many segment rolls, an empty epoch in between: every chunk respects
/// read_chunk_size (or is one frame), positions are continuous across chunks, both passes
/// give the exact records.
#[test]
fn p01_big_epochs_many_chunks_and_rolls_positions_continuous() {
    let dir = tempfile::tempdir().unwrap();
    let chunk = 1024;
    let o = small_opts("p01", 8192, chunk, 3000);
    let (wal, _) = WalSink::open(dir.path().join("wal"), o).unwrap();
    let pattern = [
        0usize, 1, 7, 8, 9, 100, 496, 500, 1000, 1007, 1008, 1009, 2000, 3000, 33,
    ];
    let mut expected = HashMap::new();
    for ck in [1u64, 3, 4] {
        let sizes: Vec<usize> = (0..450)
            .map(|i| pattern[(i * 7 + ck as usize) % pattern.len()])
            .collect();
        expected.insert(ck, fill(&wal, ck, &sizes));
        if ck == 1 {
            wal.checkpoint(2, b"meta-2").unwrap(); // empty epoch
        }
    }
    let segs = wal.health().segments;
    wal.checkpoint_complete(4).unwrap();
    let mut sink = CheckSink::new(expected, chunk);
    let n = wal.deliver_ready(&mut sink).expect("deliver_ready");
    assert!(
        sink.problems.is_empty(),
        "problems: {:#?}",
        &sink.problems[..sink.problems.len().min(20)]
    );
    assert_eq!(
        sink.delivered,
        vec![1, 3, 4],
        "delivered epochs (empty epoch 2 not sent)"
    );
    assert!(n >= 3, "deliver_ready handled {n}");
    assert!(wal.wait_committed(4, Duration::from_secs(1)));
    assert!(segs > 20, "expected many segment rolls, segments = {segs}");
    for (id, c) in &sink.chunks_per_epoch {
        assert!(
            *c > 50,
            "epoch {id} came in only {c} chunks with read_chunk_size {chunk}"
        );
    }
}

/// Records whose frames are exactly a chunk (1008 B -> 1024 B frame), half a chunk, and one
/// byte more than a chunk.
#[test]
fn p02_records_exactly_at_chunk_boundaries() {
    for chunk in [1024usize, 2048, 4096] {
        let dir = tempfile::tempdir().unwrap();
        let o = small_opts("p02", 65536, chunk, 3 * chunk);
        let (wal, _) = WalSink::open(dir.path().join("wal"), o).unwrap();
        let exact = chunk - 16; // frame == chunk
        let half = chunk / 2 - 16; // two frames == chunk
        let over = chunk - 15; // frame == chunk + 8
        let mut expected = HashMap::new();
        expected.insert(1, fill(&wal, 1, &vec![exact; 60]));
        expected.insert(2, fill(&wal, 2, &vec![half; 121]));
        expected.insert(3, fill(&wal, 3, &vec![over; 33]));
        let mixed: Vec<usize> = (0..200)
            .map(|i| [exact, half, over, 0, chunk * 2][i % 5])
            .collect();
        expected.insert(4, fill(&wal, 4, &mixed));
        wal.checkpoint_complete(4).unwrap();
        let mut sink = CheckSink::new(expected, chunk);
        wal.deliver_ready(&mut sink).expect("deliver_ready");
        assert!(
            sink.problems.is_empty(),
            "chunk {chunk}: {:#?}",
            &sink.problems[..sink.problems.len().min(20)]
        );
        assert_eq!(sink.delivered, vec![1, 2, 3, 4]);
        assert!(
            sink.chunks_per_epoch[&1] >= 60,
            "chunk {chunk}: {:?}",
            sink.chunks_per_epoch
        );
        assert!(
            sink.chunks_per_epoch[&3] >= 33,
            "chunk {chunk}: {:?}",
            sink.chunks_per_epoch
        );
    }
}

/// Reading the epoch several times inside one deliver, keeping Record.data and whole Chunks
/// alive while later chunks and later passes are read, and keeping Record.data beyond the
/// deliver call while later epochs reuse the pooled buffers: the kept bytes never change.
#[test]
fn p03_kept_record_data_and_chunks_stay_intact() {
    struct KeepSink {
        expected: HashMap<u64, Vec<Vec<u8>>>,
        kept: Vec<(u64, u64, Bytes)>,
        problems: Vec<String>,
    }
    impl Sink for KeepSink {
        fn deliver(&mut self, epoch: &Epoch) -> Result<(), SinkError> {
            let id = epoch.checkpoint();
            let exp = self.expected[&id].clone();
            // pass 1: keep every Record.data
            let mut datas = vec![];
            for r in epoch.records() {
                let r = r.map_err(|e| SinkError::retryable(e.to_string()))?;
                datas.push((r.position.index, r.data));
            }
            // pass 2: keep every Chunk alive at once
            let chunks: Vec<Chunk> = epoch
                .chunks()
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| SinkError::retryable(e.to_string()))?;
            // pass 3 and 4 while the chunks are held, through a clone of the epoch too
            let clone = epoch.clone();
            for pass in [epoch, &clone] {
                let mut n = 0;
                for r in pass.records() {
                    let r = r.map_err(|e| SinkError::retryable(e.to_string()))?;
                    if exp[n][..] != r.data[..] {
                        self.problems
                            .push(format!("epoch {id}: later pass record {n} differs"));
                    }
                    n += 1;
                }
                if n != exp.len() {
                    self.problems
                        .push(format!("epoch {id}: later pass {n} records"));
                }
            }
            let mut n = 0usize;
            for c in &chunks {
                for r in c.records() {
                    if exp.get(n).map(|e| &e[..]) != Some(&r.data[..]) {
                        self.problems
                            .push(format!("epoch {id}: held chunk record {n} differs"));
                    }
                    n += 1;
                }
            }
            drop(chunks);
            if n != exp.len() {
                self.problems
                    .push(format!("epoch {id}: held chunks {n} records"));
            }
            for (i, d) in &datas {
                if exp[*i as usize][..] != d[..] {
                    self.problems.push(format!(
                        "epoch {id}: kept data of record {i} changed within deliver"
                    ));
                }
            }
            self.kept.extend(datas.into_iter().map(|(i, d)| (id, i, d)));
            Ok(())
        }
    }
    let dir = tempfile::tempdir().unwrap();
    let o = small_opts("p03", 16384, 1024, 4000);
    let (wal, _) = WalSink::open(dir.path().join("wal"), o).unwrap();
    let mut expected = HashMap::new();
    for ck in 1..=5u64 {
        let sizes: Vec<usize> = (0..120)
            .map(|i| [10, 300, 1008, 1500, 64][(i + ck as usize) % 5])
            .collect();
        expected.insert(ck, fill(&wal, ck, &sizes));
    }
    wal.checkpoint_complete(5).unwrap();
    let mut sink = KeepSink {
        expected: expected.clone(),
        kept: vec![],
        problems: vec![],
    };
    wal.deliver_ready(&mut sink).expect("deliver_ready");
    // more epochs delivered after, reusing the pool
    for ck in 6..=8u64 {
        let sizes: Vec<usize> = (0..120).map(|i| [1000, 7, 900][i % 3]).collect();
        let recs = fill(&wal, ck, &sizes);
        sink.expected.insert(ck, recs.clone());
        expected.insert(ck, recs);
    }
    wal.checkpoint_complete(8).unwrap();
    wal.deliver_ready(&mut sink).expect("deliver_ready 2");
    assert!(
        sink.problems.is_empty(),
        "{:#?}",
        &sink.problems[..sink.problems.len().min(20)]
    );
    assert_eq!(sink.kept.len(), 8 * 120);
    let mut changed = vec![];
    for (ck, i, d) in &sink.kept {
        if expected[ck][*i as usize][..] != d[..] {
            changed.push((*ck, *i));
        }
    }
    assert!(
        changed.is_empty(),
        "kept Record.data changed after later reads: {} records, first {:?}",
        changed.len(),
        &changed[..changed.len().min(10)]
    );
}

/// Dropping iterators half-way, then starting again, and two iterators of the same epoch
/// interleaved: each starts at index 0 and gives the exact records; nothing hangs.
#[test]
fn p04_drop_iterator_half_way_and_interleave() {
    struct HalfSink {
        expected: HashMap<u64, Vec<Vec<u8>>>,
        problems: Vec<String>,
        delivered: Vec<u64>,
    }
    impl Sink for HalfSink {
        fn deliver(&mut self, epoch: &Epoch) -> Result<(), SinkError> {
            let id = epoch.checkpoint();
            let exp = &self.expected[&id];
            let err = |e: walsink::Error| SinkError::retryable(e.to_string());
            // half of the chunks, dropped
            let mut it = epoch.chunks();
            for _ in 0..3 {
                let _ = it.next().transpose().map_err(err)?;
            }
            drop(it);
            // a few records, dropped; one chunk held meanwhile
            let held = epoch.chunks().next().transpose().map_err(err)?;
            let mut it = epoch.records();
            for _ in 0..(exp.len() / 2) {
                it.next();
            }
            drop(it);
            // interleave two record iterators and one chunk iterator
            let mut a = epoch.records();
            let mut b = epoch.records();
            let mut c = epoch.chunks();
            let mut n = 0usize;
            loop {
                let (ra, rb) = (a.next(), b.next());
                if n % 10 == 0 {
                    let _ = c.next();
                }
                match (ra, rb) {
                    (None, None) => break,
                    (Some(Ok(x)), Some(Ok(y))) => {
                        if x != y || x.position.index != n as u64 || exp[n][..] != x.data[..] {
                            self.problems
                                .push(format!("epoch {id}: interleaved record {n} differs"));
                        }
                    }
                    other => {
                        self.problems.push(format!(
                            "epoch {id}: interleaved mismatch at {n}: {:?}",
                            other.0.is_some()
                        ));
                        break;
                    }
                }
                n += 1;
            }
            if n != exp.len() {
                self.problems
                    .push(format!("epoch {id}: interleaved gave {n}"));
            }
            if let Some(h) = held {
                if h.first_index() != 0 {
                    self.problems.push("first chunk first_index != 0".into());
                }
                for (i, r) in h.records().enumerate() {
                    if exp[i][..] != r.data[..] {
                        self.problems
                            .push(format!("epoch {id}: held first chunk record {i} differs"));
                    }
                }
            }
            self.delivered.push(id);
            Ok(())
        }
    }
    let dir = tempfile::tempdir().unwrap();
    let o = small_opts("p04", 4096, 1024, 2000);
    let (wal, _) = WalSink::open(dir.path().join("wal"), o).unwrap();
    let mut expected = HashMap::new();
    for ck in 1..=3u64 {
        let sizes: Vec<usize> = (0..200).map(|i| [50, 600, 1200, 8][i % 4]).collect();
        expected.insert(ck, fill(&wal, ck, &sizes));
    }
    wal.checkpoint_complete(3).unwrap();
    let (problems, delivered) = with_timeout(20, "deliver with interleaved iterators", move || {
        let mut sink = HalfSink {
            expected,
            problems: vec![],
            delivered: vec![],
        };
        let r = wal.deliver_ready(&mut sink).map_err(|e| e.to_string());
        (sink.problems, (r, sink.delivered))
    });
    assert!(
        problems.is_empty(),
        "{:#?}",
        &problems[..problems.len().min(20)]
    );
    assert_eq!(delivered.0, Ok(3));
    assert_eq!(delivered.1, vec![1, 2, 3]);
}

/// Empty epochs are not sent, but they do not block later ones and count as committed.
#[test]
fn p05_empty_epochs_not_sent_not_blocking() {
    let dir = tempfile::tempdir().unwrap();
    let o = small_opts("p05", 4096, 1024, 2000);
    let (wal, _) = WalSink::open(dir.path().join("wal"), o).unwrap();
    let mut expected = HashMap::new();
    expected.insert(1, fill(&wal, 1, &vec![900; 30]));
    fill(&wal, 2, &[]);
    fill(&wal, 3, &[]);
    expected.insert(4, fill(&wal, 4, &vec![1500; 20]));
    fill(&wal, 5, &[]);
    wal.checkpoint_complete(5).unwrap();
    let mut sink = CheckSink::new(expected, 1024);
    wal.deliver_ready(&mut sink).expect("deliver_ready");
    assert!(sink.problems.is_empty(), "{:#?}", sink.problems);
    assert_eq!(sink.delivered, vec![1, 4]);
    assert!(
        wal.wait_committed(5, Duration::from_secs(1)),
        "empty epoch 5 not committed"
    );
    assert!(
        wal.pending().is_empty(),
        "pending after delivery: {:?}",
        wal.pending().iter().map(|p| p.id).collect::<Vec<_>>()
    );
}

/// Invalid read_chunk_size values (below 1 KiB) are a typed InvalidConfig naming the option,
/// from sanitize() and from open, never a panic; 1024 is accepted.
#[test]
fn p06_invalid_read_chunk_size_is_a_clear_error() {
    for v in [0usize, 1, 8, 512, 1000, 1023] {
        let o = Options::new("p06").read_chunk_size(v);
        let s = std::panic::catch_unwind(|| o.sanitize());
        let s = s.unwrap_or_else(|_| panic!("sanitize panicked for read_chunk_size {v}"));
        match s {
            Err(e) => match e.kind() {
                ErrorKind::InvalidConfig { message } => assert!(
                    message.contains("read_chunk_size"),
                    "read_chunk_size {v}: message does not name the option: {message}"
                ),
                k => panic!("read_chunk_size {v}: wrong error kind {k:?}"),
            },
            Ok(()) => panic!("read_chunk_size {v} accepted by sanitize"),
        }
        let dir = tempfile::tempdir().unwrap();
        let o = Options::new("p06").read_chunk_size(v);
        let r =
            std::panic::catch_unwind(move || WalSink::open(dir.path().join("wal"), o).map(|_| ()));
        let r = r.unwrap_or_else(|_| panic!("open panicked for read_chunk_size {v}"));
        match r {
            Err(e) => assert!(
                matches!(e.kind(), ErrorKind::InvalidConfig { .. }),
                "read_chunk_size {v}: open error kind {:?}",
                e.kind()
            ),
            Ok(()) => panic!("open accepted read_chunk_size {v}"),
        }
    }
    Options::new("p06")
        .read_chunk_size(1024)
        .sanitize()
        .expect("1024 is documented as allowed");
}

/// Child body for p07: open with a huge read_chunk_size and deliver a small epoch.
#[test]
#[ignore]
fn p07_child_huge_chunk() {
    let Ok(v) = std::env::var("PROBE_CHUNK") else {
        return;
    };
    let v: usize = v.parse().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let o = Options::new("p07").read_chunk_size(v);
    match WalSink::open(dir.path().join("wal"), o) {
        Err(e) => {
            assert!(
                matches!(e.kind(), ErrorKind::InvalidConfig { .. }),
                "kind {:?}",
                e.kind()
            );
            println!("PROBE-RESULT rejected: {e}");
        }
        Ok((wal, _)) => {
            for i in 0..100u64 {
                wal.append(&rec(1, i, 100)).unwrap();
            }
            wal.checkpoint(1, b"").unwrap();
            wal.checkpoint_complete(1).unwrap();
            let mut sink = MemorySink::new();
            wal.deliver_ready(&mut sink).expect("deliver");
            assert_eq!(sink.records().len(), 100);
            println!("PROBE-RESULT accepted and delivered");
        }
    }
}

/// Huge read_chunk_size values (usize::MAX, 2^40, 2^62) either are refused with InvalidConfig
/// or work; they never panic or abort the process (run in a child process).
#[test]
fn p07_huge_read_chunk_size_no_panic_or_abort() {
    let exe = std::env::current_exe().unwrap();
    let mut failures = vec![];
    for v in [usize::MAX, 1usize << 40, 1usize << 62] {
        let out = std::process::Command::new(&exe)
            .args([
                "--ignored",
                "--exact",
                "p07_child_huge_chunk",
                "--nocapture",
                "--test-threads=1",
            ])
            .env("PROBE_CHUNK", v.to_string())
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        if !out.status.success() || !stdout.contains("PROBE-RESULT") {
            failures.push(format!(
                "read_chunk_size {v}: status {:?}\nstdout tail: {}\nstderr tail: {}",
                out.status,
                tail(&stdout),
                tail(&String::from_utf8_lossy(&out.stderr))
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n-----\n"));
}

fn tail(s: &str) -> String {
    let lines: Vec<&str> = s.lines().collect();
    lines[lines.len().saturating_sub(12)..].join("\n")
}

// ---------------------------------------------------------------------------------------------
// segment parsing (docs/design.md, format version 1)

#[derive(Debug, Clone, Copy)]
struct FrameAt {
    offset: usize,
    len: usize,
    kind: u8,
}

/// The frames of one segment image, from offset 40, up to a zero header or a segment end.
fn parse_frames(seg: &[u8]) -> Vec<FrameAt> {
    let mut v = vec![];
    let mut off = 40;
    while off + 16 <= seg.len() {
        let h = &seg[off..off + 16];
        if h.iter().all(|&b| b == 0) {
            break;
        }
        let len = u32::from_le_bytes(h[4..8].try_into().unwrap()) as usize;
        let kind = h[8];
        v.push(FrameAt {
            offset: off,
            len,
            kind,
        });
        if kind == 4 || off + 16 + len > seg.len() {
            break;
        }
        off += 16 + pad8(len);
    }
    v
}

fn barrier_id(seg: &[u8], f: &FrameAt) -> u64 {
    u64::from_le_bytes(seg[f.offset + 16..f.offset + 24].try_into().unwrap())
}

/// Sorted segment names and images of a real log directory.
fn fs_segments(dir: &Path) -> Vec<(String, Vec<u8>)> {
    let mut v: Vec<(String, Vec<u8>)> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap())
        .filter(|e| e.file_name().to_string_lossy().ends_with(".wseg"))
        .map(|e| {
            (
                e.file_name().to_string_lossy().into_owned(),
                std::fs::read(e.path()).unwrap(),
            )
        })
        .collect();
    v.sort();
    v
}

fn sim_segments(sim: &SimStorage) -> Vec<(String, Vec<u8>)> {
    sim.snapshot()
        .into_iter()
        .filter(|(n, _)| n.ends_with(".wseg"))
        .collect()
}

/// The segments holding only data frames (plus their segment end) that lie strictly inside
/// the epoch sealed by barrier `ck` (after the barrier of the previous epoch).
fn data_only_segments_of(segs: &[(String, Vec<u8>)], ck: u64) -> Vec<(String, usize)> {
    let mut out = vec![];
    let mut current_after: Option<u64> = None; // id of the last barrier seen
    let mut candidates = vec![];
    for (name, img) in segs {
        let frames = parse_frames(img);
        let data: Vec<&FrameAt> = frames.iter().filter(|f| f.kind == 1).collect();
        let controls: Vec<&FrameAt> = frames
            .iter()
            .filter(|f| f.kind == 2 || f.kind == 3)
            .collect();
        if controls.is_empty() && data.len() >= 2 {
            candidates.push((
                name.clone(),
                data[1].offset + 16 + data[1].len / 2,
                current_after,
            ));
        }
        for c in controls {
            if c.kind == 2 {
                let id = barrier_id(img, c);
                if id == ck {
                    for (n, o, _) in candidates.drain(..) {
                        out.push((n, o));
                    }
                }
                candidates.clear();
                current_after = Some(id);
            }
        }
    }
    out
}

fn flip_fs(path: &Path, off: usize) {
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .unwrap();
    let mut b = [0u8; 1];
    f.read_at(&mut b, off as u64).unwrap();
    b[0] ^= 0x5a;
    f.write_at(&b, off as u64).unwrap();
    f.sync_all().unwrap();
}

// ---------------------------------------------------------------------------------------------
// 2. damage met half-way through a large epoch

/// Builds a log on the real filesystem: epoch 1 (small, delivered and committed), epoch 2
/// (~90 KiB over many 4 KiB segments, read in 1 KiB chunks), epoch 3 (small); 2 and 3
/// completed. Then flips a payload byte in a middle, data-only segment of epoch 2, while the
/// handle stays open. Returns the handle, the log dir and the damaged segment name.
fn damaged_fs_log(root: &Path) -> (WalSink, std::path::PathBuf, String) {
    let wdir = root.join("wal");
    let o = small_opts("pdmg", 4096, 1024, 2000);
    let (wal, _) = WalSink::open(&wdir, o).unwrap();
    fill(&wal, 1, &vec![100; 5]);
    wal.checkpoint_complete(1).unwrap();
    let mut m = MemorySink::new();
    wal.deliver_ready(&mut m).unwrap();
    assert!(wal.wait_committed(1, Duration::from_secs(1)));
    fill(&wal, 2, &vec![200; 400]);
    fill(&wal, 3, &vec![30; 5]);
    wal.checkpoint_complete(3).unwrap();
    let segs = fs_segments(&wdir);
    let cands = data_only_segments_of(&segs, 2);
    assert!(
        cands.len() >= 5,
        "test setup: epoch 2 should span many data-only segments: {}",
        cands.len()
    );
    let (name, off) = cands[cands.len() / 2].clone();
    flip_fs(&wdir.join(&name), off);
    (wal, wdir, name)
}

fn assert_not_committed_after_damage(wal: &WalSink, what: &str) {
    assert!(
        !wal.wait_committed(2, Duration::from_millis(1)),
        "{what}: damaged epoch 2 committed"
    );
    assert!(
        !wal.wait_committed(3, Duration::from_millis(1)),
        "{what}: epoch 3 committed past damaged 2"
    );
    assert_eq!(wal.health().committed, Some(1), "{what}: health.committed");
    let pending: Vec<u64> = wal.pending().iter().map(|p| p.id).collect();
    assert_eq!(pending, vec![2, 3], "{what}: pending");
}

/// A sink that returns the iterator's Err: deliver_ready returns the log's Corruption error,
/// not the sink's, nothing is committed, epoch 3 is never handed out; a retry fails the same.
#[test]
fn p10_midway_damage_propagating_sink_gets_log_error() {
    let root = tempfile::tempdir().unwrap();
    let (wal, _wdir, seg) = damaged_fs_log(root.path());
    let mut expected = HashMap::new();
    expected.insert(2, (0..400).map(|i| rec(2, i, 200)).collect());
    expected.insert(3, (0..5).map(|i| rec(3, i, 30)).collect());
    let mut sink = CheckSink::new(expected, 1024);
    for attempt in 0..2 {
        let r = wal.deliver_ready(&mut sink);
        match &r {
            Err(e) if is_corruption(e) => {
                if let ErrorKind::Corruption(d) = e.kind() {
                    assert_eq!(d.segment, seg, "damage names another segment");
                }
            }
            other => panic!(
                "attempt {attempt}: expected the log's Corruption error, got {:?}",
                other.as_ref().map_err(|e| e.kind())
            ),
        }
        assert_not_committed_after_damage(&wal, "propagating sink");
    }
    assert!(
        sink.delivered.is_empty(),
        "sink completed epochs {:?}",
        sink.delivered
    );
}

/// A sink that IGNORES the iterator's Err (records() and chunks()) and returns Ok: the epoch
/// still is not committed and deliver_ready reports the log's Corruption error.
#[test]
fn p11_midway_damage_ignoring_sink_not_committed() {
    struct Ignoring {
        use_chunks: bool,
        calls: Vec<u64>,
        errs_seen: usize,
        runaway: bool,
    }
    impl Sink for Ignoring {
        fn deliver(&mut self, epoch: &Epoch) -> Result<(), SinkError> {
            self.calls.push(epoch.checkpoint());
            let mut steps = 0;
            if self.use_chunks {
                for c in epoch.chunks() {
                    steps += 1;
                    if steps > 100_000 {
                        self.runaway = true;
                        break;
                    }
                    match c {
                        Ok(c) => {
                            let _ = c.records().count();
                        }
                        Err(_) => self.errs_seen += 1,
                    }
                }
            } else {
                for r in epoch.records() {
                    steps += 1;
                    if steps > 100_000 {
                        self.runaway = true;
                        break;
                    }
                    if r.is_err() {
                        self.errs_seen += 1;
                    }
                }
            }
            Ok(())
        }
    }
    for use_chunks in [false, true] {
        let root = tempfile::tempdir().unwrap();
        let (wal, _, _) = damaged_fs_log(root.path());
        let mut sink = Ignoring {
            use_chunks,
            calls: vec![],
            errs_seen: 0,
            runaway: false,
        };
        let r = wal.deliver_ready(&mut sink);
        assert!(
            !sink.runaway,
            "use_chunks={use_chunks}: iterator kept going after the Err"
        );
        assert!(
            sink.errs_seen >= 1,
            "use_chunks={use_chunks}: the sink never saw an Err from the iterator"
        );
        match &r {
            Err(e) if is_corruption(e) => {}
            other => panic!(
                "use_chunks={use_chunks}: expected Corruption, got {:?}",
                other.as_ref().map_err(|e| e.kind())
            ),
        }
        assert_not_committed_after_damage(&wal, &format!("ignoring sink, use_chunks={use_chunks}"));
        assert_eq!(
            sink.calls,
            vec![2],
            "use_chunks={use_chunks}: deliver calls"
        );
    }
}

fn target_names(dir: &Path) -> Vec<String> {
    match std::fs::read_dir(dir) {
        Ok(rd) => rd
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect(),
        Err(_) => vec![],
    }
}

/// DirSink target: after damage met half-way, the target holds no file named for epoch 2 (nor
/// 3); DirSink::committed lists only epoch 1 when epoch 1 went there; a retry fails the same.
#[test]
fn p12_midway_damage_dirsink_leaves_no_epoch_file() {
    let root = tempfile::tempdir().unwrap();
    let (wal, _, _) = damaged_fs_log(root.path());
    let out = root.path().join("out");
    let mut sink = DirSink::new(&out).unwrap();
    for attempt in 0..2 {
        let r = wal.deliver_ready(&mut sink);
        assert!(
            matches!(&r, Err(e) if is_corruption(e)),
            "attempt {attempt}: {:?}",
            r.as_ref().map_err(|e| e.kind())
        );
        assert_not_committed_after_damage(&wal, "DirSink");
        let names = target_names(&out);
        let bad: Vec<&String> = names
            .iter()
            .filter(|n| {
                n.starts_with("00000000000000000002-") || n.starts_with("00000000000000000003-")
            })
            .collect();
        assert!(
            bad.is_empty(),
            "attempt {attempt}: target holds files of undelivered epochs: {bad:?} (all: {names:?})"
        );
        let committed = DirSink::committed(&out, "pdmg", 0).unwrap();
        assert!(
            committed.iter().all(|c| c.checkpoint < 2),
            "DirSink::committed lists {:?}",
            committed.iter().map(|c| c.checkpoint).collect::<Vec<_>>()
        );
    }
}

/// The same half-way damage made with SimStorage::put_file on a simulated disk, into a
/// DirSink over another simulated disk.
#[test]
fn p13_midway_damage_simstorage_put_file() {
    let wsim = SimStorage::new();
    let tsim = Arc::new(SimStorage::new());
    let o = small_opts("psim", 4096, 1024, 2000);
    let (wal, _) = WalSink::open_with_storage(Arc::new(wsim.clone()), o).unwrap();
    fill(&wal, 1, &vec![100; 5]);
    fill(&wal, 2, &vec![200; 400]);
    fill(&wal, 3, &vec![30; 5]);
    let segs = sim_segments(&wsim);
    let cands = data_only_segments_of(&segs, 2);
    assert!(cands.len() >= 5, "setup: {}", cands.len());
    let (name, off) = cands[cands.len() / 2].clone();
    let mut img = wsim.snapshot()[&name].clone();
    img[off] ^= 0x5a;
    wsim.put_file(&name, &img);
    wal.checkpoint_complete(3).unwrap();
    let mut sink = DirSink::with_storage(tsim.clone()).unwrap();
    let r = wal.deliver_ready(&mut sink);
    assert!(
        matches!(&r, Err(e) if is_corruption(e)),
        "expected Corruption, got {:?}",
        r.as_ref().map_err(|e| e.kind())
    );
    assert!(
        wal.wait_committed(1, Duration::from_millis(1)),
        "undamaged epoch 1 should be committed"
    );
    assert!(
        !wal.wait_committed(2, Duration::from_millis(1)),
        "damaged epoch 2 committed"
    );
    let epochs = DirSink::read_epochs_in(&*tsim).unwrap();
    let ids: Vec<&String> = epochs.iter().map(|(n, _)| n).collect();
    assert!(
        ids.iter().all(|n| n.starts_with("00000000000000000001-")),
        "target files: {ids:?}"
    );
    tsim.crash(CrashOptions::power_loss(7));
    let epochs = DirSink::read_epochs_in(&*tsim).unwrap();
    assert!(
        epochs
            .iter()
            .all(|(n, _)| n.starts_with("00000000000000000001-")),
        "after power loss: {:?}",
        epochs.iter().map(|e| &e.0).collect::<Vec<_>>()
    );
}

/// An epoch that fits in one chunk is verified whole before the sink sees it: damage in it
/// gives the log's Corruption error and deliver is not called for it.
#[test]
fn p14_small_epoch_damage_verified_before_sink_sees_it() {
    let root = tempfile::tempdir().unwrap();
    let wdir = root.path().join("wal");
    let o = small_opts("psmall", 65536, 8192, 2000);
    let (wal, _) = WalSink::open(&wdir, o).unwrap();
    fill(&wal, 1, &vec![100; 10]);
    fill(&wal, 2, &vec![100; 20]);
    fill(&wal, 3, &vec![100; 3]);
    let segs = fs_segments(&wdir);
    // find the 5th data frame after barrier 1
    let (name, img) = &segs[0];
    let frames = parse_frames(img);
    let b1 = frames
        .iter()
        .position(|f| f.kind == 2 && barrier_id(img, f) == 1)
        .unwrap();
    let f = frames[b1 + 5];
    assert_eq!(f.kind, 1);
    flip_fs(&wdir.join(name), f.offset + 16 + 3);
    wal.checkpoint_complete(3).unwrap();
    let sink = MemorySink::new();
    let mut s2 = sink.clone();
    let r = wal.deliver_ready(&mut s2);
    assert!(
        matches!(&r, Err(e) if is_corruption(e)),
        "expected Corruption, got {:?}",
        r.as_ref().map_err(|e| e.kind())
    );
    assert_eq!(sink.checkpoints(), vec![1], "deliveries");
    assert_eq!(
        sink.deliveries(),
        1,
        "deliver was called for the damaged one-chunk epoch"
    );
    assert!(!wal.wait_committed(2, Duration::from_millis(1)));
}

/// The committer thread on a log damaged half-way through epoch 2, into a DirSink: epoch 2 is
/// never committed, health shows errors, the target never gets epoch 2's file, shutdown returns.
#[test]
fn p15_midway_damage_with_committer_thread() {
    let root = tempfile::tempdir().unwrap();
    let (wal, _, _) = damaged_fs_log(root.path());
    let out = root.path().join("out");
    let c = wal.spawn_committer(DirSink::new(&out).unwrap()).unwrap();
    assert!(
        !wal.wait_committed(2, Duration::from_millis(400)),
        "damaged epoch committed by the committer"
    );
    let h = wal.health();
    assert!(h.errors >= 1, "health.errors = {}", h.errors);
    assert!(h.last_error.is_some(), "health.last_error empty");
    with_timeout(10, "Committer::shutdown", move || c.shutdown());
    assert_not_committed_after_damage(&wal, "committer thread");
    let names = target_names(&out);
    assert!(
        !names.iter().any(|n| n.starts_with("00000000000000000002-")),
        "target: {names:?}"
    );
}

// ---------------------------------------------------------------------------------------------
// 3. DirSink over a simulated disk: faults and power loss

fn epoch_of_name(name: &str) -> u64 {
    name[..20]
        .parse()
        .unwrap_or_else(|_| panic!("unexpected target file name {name}"))
}

/// For many seeds: a log (simulated disk) with 4 epochs of random sizes (some multi-chunk,
/// some empty); one fault (SyncDir, SyncData, Rename, Write or Create, at a random call) in
/// the target's simulated disk; a few deliver_ready calls; then a power loss of the target.
/// Every epoch file in the target holds the whole epoch exactly, and every epoch walsink
/// counts as committed is in the target. Then the log also loses power, is reopened with a
/// new DirSink over the crashed target, and everything is delivered: the target then holds
/// every non-empty epoch exactly, nothing else.
#[test]
fn p20_dirsink_faults_and_power_loss_whole_or_nothing() {
    let ops = [
        FaultOp::SyncDir,
        FaultOp::SyncData,
        FaultOp::Rename,
        FaultOp::Write,
        FaultOp::Create,
    ];
    let seeds: u64 = std::env::var("PROBE_SEEDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(150);
    let mut failures: Vec<String> = vec![];
    let (mut faults_hit, mut seeds_with_errors) = (0u64, 0u64);
    for seed in 0..seeds {
        let mut rng = fastrand::Rng::with_seed(seed);
        let wsim = Arc::new(SimStorage::new());
        let tsim = Arc::new(SimStorage::new());
        let o = small_opts("p20", 4096, 1024, 2000).salt_seed(seed);
        let (wal, _) = WalSink::open_with_storage(wsim.clone(), o.clone()).unwrap();
        let mut expected: BTreeMap<u64, Vec<Vec<u8>>> = BTreeMap::new();
        for ck in 1..=4u64 {
            let n = if rng.u8(0..5) == 0 {
                0
            } else {
                rng.usize(1..40)
            };
            let sizes: Vec<usize> = (0..n).map(|_| rng.usize(0..1800)).collect();
            expected.insert(ck, fill(&wal, ck, &sizes));
        }
        wal.checkpoint_complete(4).unwrap();
        let op = ops[rng.usize(0..ops.len())];
        let nth = rng.u64(0..10);
        let mut sink = DirSink::with_storage(tsim.clone())
            .unwrap()
            .keep_metadata(rng.bool());
        tsim.inject_fault(op, nth, io::ErrorKind::Other);
        let mut errs = vec![];
        for _ in 0..3 {
            if let Err(e) = wal.deliver_ready(&mut sink) {
                errs.push(
                    format!("{:?}", e.kind())
                        .chars()
                        .take(80)
                        .collect::<String>(),
                );
            }
        }
        let committed = wal.health().committed.unwrap_or(0);
        if tsim.pending_faults() == 0 {
            faults_hit += 1;
        }
        if !errs.is_empty() {
            seeds_with_errors += 1;
        }
        drop(sink);
        tsim.crash(CrashOptions::power_loss(seed));
        let ctx = format!("seed {seed} fault {op:?}#{nth} committed {committed} errs {errs:?}");
        let check = |phase: &str, tsim: &SimStorage, must_hold: u64, exact: bool| -> Vec<String> {
            let mut f = vec![];
            let epochs = match DirSink::read_epochs_in(tsim) {
                Ok(e) => e,
                Err(e) => return vec![format!("{phase}: read_epochs_in failed: {e}")],
            };
            let mut present = BTreeSet::new();
            for (name, recs) in &epochs {
                let ck = epoch_of_name(name);
                present.insert(ck);
                match expected.get(&ck) {
                    Some(exp) if exp == recs => {}
                    Some(exp) => f.push(format!(
                        "{phase}: {name} holds {} records, epoch has {}",
                        recs.len(),
                        exp.len()
                    )),
                    None => f.push(format!("{phase}: unknown file {name}")),
                }
            }
            for (ck, exp) in &expected {
                if !exp.is_empty() && *ck <= must_hold && !present.contains(ck) {
                    f.push(format!(
                        "{phase}: epoch {ck} counted committed but missing from the target"
                    ));
                }
                if exact && exp.is_empty() && present.contains(ck) {
                    f.push(format!("{phase}: empty epoch {ck} has a file"));
                }
            }
            f
        };
        for m in check("after target power loss", &tsim, committed, false) {
            failures.push(format!("{ctx}: {m}"));
        }
        // phase 2: the log loses power too; reopen and finish
        drop(wal);
        wsim.crash(CrashOptions::power_loss(seed ^ 0xabc));
        let (wal, rep) = match WalSink::open_with_storage(wsim.clone(), o) {
            Ok(x) => x,
            Err(e) => {
                failures.push(format!("{ctx}: reopen failed: {e}"));
                continue;
            }
        };
        if rep.last_checkpoint != Some(4) {
            failures.push(format!(
                "{ctx}: after log power loss last_checkpoint {:?}",
                rep.last_checkpoint
            ));
        }
        wal.checkpoint_complete(4).unwrap();
        let mut sink = DirSink::with_storage(tsim.clone()).unwrap();
        if let Err(e) = wal.deliver_ready(&mut sink) {
            failures.push(format!("{ctx}: final deliver_ready failed: {e}"));
            continue;
        }
        drop(sink);
        tsim.crash(CrashOptions::power_loss(seed + 1));
        for m in check("after final delivery and power loss", &tsim, 4, true) {
            failures.push(format!("{ctx}: {m}"));
        }
    }
    eprintln!("p20: {seeds} seeds, faults hit {faults_hit}, seeds with delivery errors {seeds_with_errors}");
    assert!(
        failures.is_empty(),
        "{} failures:\n{}",
        failures.len(),
        failures[..failures.len().min(15)].join("\n")
    );
    assert!(
        faults_hit > seeds / 3,
        "test validity: only {faults_hit} of {seeds} injected faults were hit"
    );
}

/// For many seeds: the process dies (SimStorage::kill_after on the target's disk) at a random
/// operation during delivery into a DirSink; both disks then lose power. Epochs walsink
/// counted committed are in the target; after reopen and delivery every non-empty epoch is in
/// the target exactly (whole), and no epoch file is torn.
#[test]
fn p21_dirsink_kill_mid_delivery_then_power_loss() {
    let seeds: u64 = std::env::var("PROBE_SEEDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(150);
    let mut failures: Vec<String> = vec![];
    let mut killed = 0;
    for seed in 0..seeds {
        let mut rng = fastrand::Rng::with_seed(seed ^ 0x5555);
        let wsim = Arc::new(SimStorage::new());
        let tsim = Arc::new(SimStorage::new());
        let o = small_opts("p21", 4096, 1024, 2000).salt_seed(seed);
        let (wal, _) = WalSink::open_with_storage(wsim.clone(), o.clone()).unwrap();
        let mut expected: BTreeMap<u64, Vec<Vec<u8>>> = BTreeMap::new();
        for ck in 1..=4u64 {
            let n = if rng.u8(0..6) == 0 {
                0
            } else {
                rng.usize(1..30)
            };
            let sizes: Vec<usize> = (0..n).map(|_| rng.usize(0..1800)).collect();
            expected.insert(ck, fill(&wal, ck, &sizes));
        }
        wal.checkpoint_complete(4).unwrap();
        let mut sink = DirSink::with_storage(tsim.clone())
            .unwrap()
            .keep_metadata(rng.bool());
        tsim.kill_after(rng.u64(0..30));
        for _ in 0..2 {
            let _ = wal.deliver_ready(&mut sink);
        }
        if tsim.is_dead() {
            killed += 1;
        }
        let committed = wal.health().committed.unwrap_or(0);
        drop(sink);
        drop(wal);
        tsim.crash(CrashOptions::power_loss(seed));
        wsim.crash(CrashOptions::power_loss(seed + 99));
        let ctx = format!("seed {seed} committed {committed}");
        let epochs = DirSink::read_epochs_in(&*tsim).unwrap();
        for (name, recs) in &epochs {
            let ck = epoch_of_name(name);
            if expected.get(&ck) != Some(recs) {
                failures.push(format!(
                    "{ctx}: after kill+power loss {name} is not the whole epoch ({} records)",
                    recs.len()
                ));
            }
        }
        for (ck, exp) in &expected {
            if *ck <= committed
                && !exp.is_empty()
                && !epochs.iter().any(|(n, _)| epoch_of_name(n) == *ck)
            {
                failures.push(format!(
                    "{ctx}: epoch {ck} counted committed, missing after power loss"
                ));
            }
        }
        let (wal, rep) = match WalSink::open_with_storage(wsim.clone(), o) {
            Ok(x) => x,
            Err(e) => {
                failures.push(format!("{ctx}: reopen: {e}"));
                continue;
            }
        };
        if rep.last_checkpoint != Some(4) {
            failures.push(format!("{ctx}: last_checkpoint {:?}", rep.last_checkpoint));
        }
        wal.checkpoint_complete(4).unwrap();
        let mut sink = DirSink::with_storage(tsim.clone()).unwrap();
        if let Err(e) = wal.deliver_ready(&mut sink) {
            failures.push(format!("{ctx}: final delivery: {e}"));
            continue;
        }
        let epochs = DirSink::read_epochs_in(&*tsim).unwrap();
        let got: BTreeMap<u64, Vec<Vec<u8>>> = epochs
            .into_iter()
            .map(|(n, r)| (epoch_of_name(&n), r))
            .collect();
        let want: BTreeMap<u64, Vec<Vec<u8>>> = expected
            .iter()
            .filter(|(_, r)| !r.is_empty())
            .map(|(k, v)| (*k, v.clone()))
            .collect();
        if got != want {
            failures.push(format!(
                "{ctx}: final target epochs {:?} != {:?}",
                got.keys().collect::<Vec<_>>(),
                want.keys().collect::<Vec<_>>()
            ));
        }
    }
    eprintln!("p21: {seeds} seeds, killed {killed}");
    assert!(
        failures.is_empty(),
        "{} failures:\n{}",
        failures.len(),
        failures[..failures.len().min(15)].join("\n")
    );
    assert!(killed > seeds / 3, "test validity: only {killed} kills");
}

// ---------------------------------------------------------------------------------------------
// 4. dump and verify

/// dump on a log with epochs larger than the default 8 MiB chunk: every pending epoch is
/// handed to f with the right state and exactly its records (read in chunks); a committed one
/// is either skipped (segments freed) or exact; dump returns Ok.
#[test]
fn p30_dump_large_epochs() {
    let root = tempfile::tempdir().unwrap();
    let wdir = root.path().join("wal");
    let o = Options::new("p30")
        .segment_size(1 << 20)
        .max_record_size(100_000)
        .retry(fast_retry());
    let (wal, _) = WalSink::open(&wdir, o).unwrap();
    let mut expected = HashMap::new();
    expected.insert(1u64, fill(&wal, 1, &vec![65_000; 140])); // ~9.1 MB
    wal.checkpoint_complete(1).unwrap();
    wal.deliver_ready(&mut MemorySink::new()).unwrap();
    expected.insert(2, fill(&wal, 2, &vec![3; 10]));
    let sizes: Vec<usize> = (0..200).map(|i| [50_000, 1, 99_000][i % 3]).collect();
    expected.insert(3, fill(&wal, 3, &sizes)); // ~10 MB
    drop(wal);
    let mut seen = BTreeMap::new();
    let mut problems = vec![];
    let r = walsink::dump(
        Arc::new(FsStorage::new(&wdir).unwrap()),
        |id, state, epoch| {
            let Some(id) = id else { return Ok(()) };
            let mut n = 0usize;
            let mut nchunks = 0;
            for c in epoch.chunks() {
                let c = c.map_err(io::Error::other)?;
                nchunks += 1;
                for r in c.records() {
                    if r.position.checkpoint != id || r.position.index != n as u64 {
                        problems.push(format!("epoch {id}: position {:?} at {n}", r.position));
                    }
                    if expected[&id].get(n).map(|e| &e[..]) != Some(&r.data[..]) {
                        problems.push(format!("epoch {id}: record {n} differs"));
                    }
                    n += 1;
                }
            }
            seen.insert(id, (state, n, nchunks));
            Ok(())
        },
    );
    assert!(r.is_ok(), "dump failed: {:?}", r.err());
    assert!(problems.is_empty(), "{problems:?}");
    assert_eq!(
        seen.get(&2).map(|s| (s.0, s.1)),
        Some((DumpState::Pending, 10)),
        "{seen:?}"
    );
    assert_eq!(
        seen.get(&3).map(|s| (s.0, s.1)),
        Some((DumpState::Pending, 200)),
        "{seen:?}"
    );
    if let Some(s) = seen.get(&1) {
        assert_eq!((s.0, s.1), (DumpState::Committed, 140), "{seen:?}");
    }
}

struct BuiltLog {
    snap: BTreeMap<String, Vec<u8>>,
    expected: HashMap<u64, Vec<Vec<u8>>>,
    /// (segment, frame) of every frame, with the epoch id it belongs to (barrier id that
    /// seals it) when known.
    frames: Vec<(String, FrameAt, Option<u64>)>,
    last_ck: u64,
}

/// A log on a simulated disk: 8 epochs over 8 KiB segments, nothing committed, no unsealed tail.
fn build_sim_log(seed: u64) -> BuiltLog {
    let sim = SimStorage::new();
    let o = small_opts("pdump", 8192, 2048, 3000).salt_seed(seed);
    let (wal, _) = WalSink::open_with_storage(Arc::new(sim.clone()), o).unwrap();
    let mut rng = fastrand::Rng::with_seed(seed);
    let mut expected = HashMap::new();
    for ck in 1..=8u64 {
        let sizes: Vec<usize> = (0..rng.usize(1..25)).map(|_| rng.usize(0..2500)).collect();
        expected.insert(ck, fill(&wal, ck, &sizes));
    }
    drop(wal);
    let snap = sim.snapshot();
    let mut frames = vec![];
    let mut pending_frames = vec![];
    for (name, img) in snap.iter().filter(|(n, _)| n.ends_with(".wseg")) {
        for f in parse_frames(img) {
            if f.kind == 2 {
                let id = barrier_id(img, &f);
                for (n, fr) in pending_frames.drain(..) {
                    frames.push((n, fr, Some(id)));
                }
                frames.push((name.clone(), f, Some(id)));
            } else {
                pending_frames.push((name.clone(), f));
            }
        }
    }
    for (n, fr) in pending_frames {
        frames.push((n, fr, None));
    }
    BuiltLog {
        snap,
        expected,
        frames,
        last_ck: 8,
    }
}

fn sim_from(snap: &BTreeMap<String, Vec<u8>>) -> SimStorage {
    let s = SimStorage::new();
    for (n, d) in snap {
        s.put_file(n, d);
    }
    s
}

/// Damage (a flipped byte in a frame header or payload, a segment header byte, a removed
/// middle segment, a truncated segment) in logs of many seeds: dump never panics, never hands
/// f a record that differs from what was appended (with f returning the iterator's Err or
/// ignoring it); verify never fails, never calls the log clean, and reports Corruption for
/// damage that a later barrier vouches for.
#[test]
fn p31_dump_and_verify_on_damaged_logs() {
    let mut failures = vec![];
    let mut dump_ok_on_covered = BTreeSet::new();
    let mut cases = 0;
    for seed in 0..12u64 {
        let log = build_sim_log(seed);
        let mut rng = fastrand::Rng::with_seed(seed + 1000);
        let segs: Vec<String> = log
            .snap
            .keys()
            .filter(|n| n.ends_with(".wseg"))
            .cloned()
            .collect();
        let mut damages: Vec<(String, Box<dyn Fn(&mut BTreeMap<String, Vec<u8>>)>, bool)> = vec![];
        for _ in 0..14 {
            let (seg, f, ck) = log.frames[rng.usize(0..log.frames.len())].clone();
            if f.kind == 4 {
                continue; // the segment end frame of a closed segment
            }
            let covered = matches!(ck, Some(c) if c < log.last_ck);
            let in_header = rng.bool() || f.len == 0;
            let off = if in_header {
                f.offset + [0, 4, 8, 9, 12][rng.usize(0..5)] + rng.usize(0..4).min(3)
            } else {
                f.offset + 16 + rng.usize(0..f.len)
            };
            let off = if in_header {
                off.min(f.offset + 15)
            } else {
                off
            };
            let s2 = seg.clone();
            damages.push((
                format!(
                    "flip {seg}@{off} (frame kind {} at {}, epoch {ck:?})",
                    f.kind, f.offset
                ),
                Box::new(move |m: &mut BTreeMap<String, Vec<u8>>| {
                    m.get_mut(&s2).unwrap()[off] ^= 0x21
                }),
                covered,
            ));
        }
        if segs.len() >= 3 {
            let mid = segs[segs.len() / 2].clone();
            let m2 = mid.clone();
            damages.push((
                format!("remove {mid}"),
                Box::new(move |m| {
                    m.remove(&m2);
                }),
                true,
            ));
            let m3 = mid.clone();
            let hoff = rng.usize(0..32);
            damages.push((
                format!("segment header flip {mid}@{hoff}"),
                Box::new(move |m| m.get_mut(&m3).unwrap()[hoff] ^= 0x01),
                true,
            ));
            let m4 = mid.clone();
            damages.push((
                format!("truncate {mid} to 1000"),
                Box::new(move |m| m.get_mut(&m4).unwrap().truncate(1000)),
                true,
            ));
        }
        for (what, damage, covered) in damages {
            cases += 1;
            let mut snap = log.snap.clone();
            damage(&mut snap);
            let ctx = format!("seed {seed}: {what}");
            for ignore_errors in [false, true] {
                let sim: Arc<dyn Storage> = Arc::new(sim_from(&snap));
                let expected = log.expected.clone();
                let res = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    let mut bad = vec![];
                    let mut last_sealed = 0u64;
                    let r = walsink::dump(sim.clone(), |id, _state, epoch| {
                        // the unsealed tail of a damaged log is the start of the epoch after
                        // the last sealed one
                        let eid = id.unwrap_or(last_sealed + 1);
                        if let Some(id) = id {
                            last_sealed = id;
                        }
                        for r in epoch.records() {
                            match r {
                                Ok(r) => {
                                    let e = expected
                                        .get(&eid)
                                        .and_then(|v| v.get(r.position.index as usize));
                                    if e.map(|e| &e[..]) != Some(&r.data[..]) {
                                        bad.push(format!(
                                            "dump handed out a wrong record at {:?} (id {id:?})",
                                            r.position
                                        ));
                                    }
                                }
                                Err(e) if !ignore_errors => return Err(io::Error::other(e)),
                                Err(_) => {}
                            }
                        }
                        Ok(())
                    });
                    (r.map_err(|e| format!("{:?}", e.kind())), bad)
                }));
                match res {
                    Err(_) => failures.push(format!(
                        "{ctx}: dump panicked (ignore_errors={ignore_errors})"
                    )),
                    Ok((r, bad)) => {
                        failures.extend(bad.into_iter().map(|b| format!("{ctx}: {b}")));
                        if covered && r.is_ok() {
                            dump_ok_on_covered.insert(ctx.clone());
                        }
                    }
                }
            }
            let sim = sim_from(&snap);
            match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| walsink::verify(&sim))) {
                Err(_) => failures.push(format!("{ctx}: verify panicked")),
                Ok(Err(e)) => failures.push(format!("{ctx}: verify failed: {e}")),
                Ok(Ok(rep)) => {
                    if rep.ok || rep.problems.is_empty() {
                        failures.push(format!("{ctx}: verify called the damaged log clean"));
                    }
                    if covered
                        && !rep
                            .problems
                            .iter()
                            .any(|p| matches!(p.kind, ProblemKind::Corruption(_)))
                    {
                        failures.push(format!(
                            "{ctx}: verify found no Corruption, only {:?}",
                            rep.problems
                                .iter()
                                .map(|p| p.kind.name())
                                .collect::<Vec<_>>()
                        ));
                    }
                }
            }
        }
    }
    eprintln!("p31: {cases} damage cases; dump returned Ok on {} cases of damage a later barrier vouches for (checked by p34):", dump_ok_on_covered.len());
    for c in dump_ok_on_covered.iter().take(10) {
        eprintln!("  {c}");
    }
    assert!(
        failures.is_empty(),
        "{} failures:\n{}",
        failures.len(),
        failures[..failures.len().min(20)].join("\n")
    );
}

/// ProblemKind::name and CorruptionReason::name give exactly the documented strings.
#[test]
fn p32_problem_kind_names_match_docs() {
    let reasons = [
        (
            CorruptionReason::Checksum {
                expected: 1,
                got: 2,
            },
            "checksum",
        ),
        (CorruptionReason::BadHeader, "bad_header"),
        (CorruptionReason::BadLength { len: 5 }, "bad_length"),
        (CorruptionReason::UnknownKind(9), "unknown_kind"),
        (CorruptionReason::TornFrame, "torn_frame"),
        (CorruptionReason::Unwritten, "unwritten"),
        (CorruptionReason::BadPayload, "bad_payload"),
        (
            CorruptionReason::MissingSegment { seq: 3 },
            "missing_segment",
        ),
        (
            CorruptionReason::IncompleteEpoch {
                checkpoint: 1,
                expected: 2,
                found: 1,
            },
            "incomplete_epoch",
        ),
    ];
    let mut bad = vec![];
    for (r, n) in &reasons {
        if r.name() != *n {
            bad.push(format!("{r:?}.name() = {} expected {n}", r.name()));
        }
        let k = ProblemKind::Corruption(r.clone());
        if k.name() != *n {
            bad.push(format!(
                "ProblemKind::Corruption({r:?}).name() = {} expected {n}",
                k.name()
            ));
        }
        let t = ProblemKind::TornTail(r.clone());
        if t.name() != "torn_tail" {
            bad.push(format!(
                "ProblemKind::TornTail({r:?}).name() = {}",
                t.name()
            ));
        }
    }
    for (k, n) in [
        (ProblemKind::UnknownVersion, "unknown_version"),
        (ProblemKind::UnexpectedFile, "unexpected_file"),
        (ProblemKind::BadIdentity, "bad_identity"),
        (ProblemKind::BadCommitStore, "bad_commit_store"),
    ] {
        if k.name() != n {
            bad.push(format!("{k:?}.name() = {} expected {n}", k.name()));
        }
    }
    assert!(bad.is_empty(), "{bad:#?}");
}

/// verify on real damage reports the documented kinds: a foreign file, a damaged WALSINK and
/// COMMITTED, a flipped payload byte in an early epoch, a removed middle segment, an unknown
/// version (valid header CRC, version 2), a cut newest segment.
#[test]
fn p33_verify_reports_documented_kinds() {
    let log = build_sim_log(77);
    let segs: Vec<String> = log
        .snap
        .keys()
        .filter(|n| n.ends_with(".wseg"))
        .cloned()
        .collect();
    assert!(segs.len() >= 4, "setup: {} segments", segs.len());
    let names_for = |snap: &BTreeMap<String, Vec<u8>>| -> Vec<(String, &'static str)> {
        let sim = sim_from(snap);
        let rep = walsink::verify(&sim).expect("verify");
        rep.problems
            .iter()
            .map(|p| (p.segment.clone(), p.kind.name()))
            .collect()
    };
    let mut failures = vec![];
    // clean
    let clean = names_for(&log.snap);
    if !clean.is_empty() {
        failures.push(format!("clean log: {clean:?}"));
    }
    let mut expect = |what: &str, snap: BTreeMap<String, Vec<u8>>, want: &str| {
        let got = names_for(&snap);
        if !got.iter().any(|(_, n)| *n == want) {
            failures.push(format!("{what}: expected a {want} problem, got {got:?}"));
        }
    };
    let mut s = log.snap.clone();
    s.insert("notes.txt".into(), b"hello".to_vec());
    expect("foreign file", s, "unexpected_file");
    let mut s = log.snap.clone();
    if let Some(d) = s.get_mut("WALSINK") {
        let n = d.len();
        d[n - 1] ^= 0xff;
    }
    expect("WALSINK last byte flipped", s, "bad_identity");
    let mut s = log.snap.clone();
    let mut c = b"WSNKCMT\0".to_vec();
    c.extend_from_slice(&1u32.to_le_bytes());
    c.extend_from_slice(&16u32.to_le_bytes());
    c.extend_from_slice(&1u64.to_le_bytes());
    c.extend_from_slice(&3u64.to_le_bytes());
    let crc = crc32fast::hash(&c);
    c.extend_from_slice(&(crc ^ 1).to_le_bytes());
    s.insert("COMMITTED".into(), c);
    expect("COMMITTED with a bad CRC", s, "bad_commit_store");
    // payload flip in the first data frame of the first segment (epoch 1, vouched for)
    let mut s = log.snap.clone();
    {
        let img = s.get_mut(&segs[0]).unwrap();
        let f = parse_frames(img)
            .into_iter()
            .find(|f| f.kind == 1 && f.len > 0)
            .unwrap();
        img[f.offset + 16] ^= 0x10;
    }
    expect("payload flip in epoch 1", s, "checksum");
    let mut s = log.snap.clone();
    s.remove(&segs[1]);
    expect("middle segment removed", s, "missing_segment");
    let mut s = log.snap.clone();
    {
        let img = s.get_mut(&segs[1]).unwrap();
        img[8..12].copy_from_slice(&2u32.to_le_bytes());
        let crc = crc32fast::hash(&img[0..32]);
        img[32..36].copy_from_slice(&crc.to_le_bytes());
    }
    expect("segment header of version 2", s, "unknown_version");
    let mut s = log.snap.clone();
    {
        let last = segs.last().unwrap();
        let img = s.get_mut(last).unwrap();
        let frames = parse_frames(img);
        let f = frames.last().unwrap();
        img.truncate(f.offset + 16 + f.len / 2);
    }
    expect("newest segment cut inside its last frame", s, "torn_tail");
    assert!(failures.is_empty(), "{failures:#?}");
}

/// dump on a log with a flipped payload byte in epoch 1 of 3 (damage that the barriers of 2
/// and 3 vouch for; open fails with Corruption, verify reports "checksum"): dump must return
/// an error (README: `dump` on a damaged log exits 1 after printing what is readable; the
/// brief: dump returns an error for damage), whatever f does.
#[test]
fn p34_dump_returns_error_for_vouched_damage() {
    let root = tempfile::tempdir().unwrap();
    let wdir = root.path().join("wal");
    let (wal, _) = WalSink::open(&wdir, small_opts("p34", 65536, 8192, 2000)).unwrap();
    fill(&wal, 1, &vec![100; 10]);
    fill(&wal, 2, &vec![100; 10]);
    fill(&wal, 3, &vec![100; 10]);
    drop(wal);
    let segs = fs_segments(&wdir);
    let (name, img) = &segs[0];
    let f = parse_frames(img)
        .into_iter()
        .filter(|f| f.kind == 1)
        .nth(4)
        .unwrap();
    flip_fs(&wdir.join(name), f.offset + 16 + 10);
    // the log itself calls this corruption
    let open = WalSink::open(&wdir, small_opts("p34", 65536, 8192, 2000));
    assert!(
        matches!(&open, Err(e) if is_corruption(e)),
        "setup: open should fail with Corruption"
    );
    drop(open);
    let v = walsink::verify(&FsStorage::new(&wdir).unwrap()).unwrap();
    let kinds: Vec<&str> = v.problems.iter().map(|p| p.kind.name()).collect();
    assert!(
        kinds.contains(&"checksum"),
        "setup: verify problems {kinds:?}"
    );
    for ignore in [false, true] {
        let mut seen = vec![];
        let r = walsink::dump(
            Arc::new(FsStorage::new(&wdir).unwrap()),
            |id, state, epoch| {
                let mut n = 0;
                let mut err = None;
                for r in epoch.records() {
                    match r {
                        Ok(_) => n += 1,
                        Err(e) => err = Some(e),
                    }
                }
                seen.push((id, state, n, err.is_some()));
                match err {
                    Some(e) if !ignore => Err(io::Error::other(e)),
                    _ => Ok(()),
                }
            },
        );
        assert!(
            r.is_err(),
            "f ignores errors: {ignore}: dump returned Ok on a log whose epoch 1 is corrupt; f was handed (id, state, records, iterator err): {seen:?}"
        );
    }
}

// ---------------------------------------------------------------------------------------------
// 5. recovery report invariants after damage, across reopens

/// Ids of every barrier frame (reservations included) that still verifies anywhere in the
/// segments of `sim`, found by testing every 8-byte-aligned offset with the documented
/// header CRC (seed = file's sequence number and the salt at header bytes 24..32).
fn intact_barrier_ids(sim: &SimStorage) -> BTreeSet<u64> {
    let mut ids = BTreeSet::new();
    for (name, img) in sim_segments(sim) {
        let Ok(seq) = name[..20].parse::<u64>() else {
            continue;
        };
        if img.len() < 40 {
            continue;
        }
        let salt = u64::from_le_bytes(img[24..32].try_into().unwrap());
        let mut off = 40;
        while off + 16 <= img.len() {
            let h = &img[off..off + 16];
            let mut buf = Vec::with_capacity(36);
            buf.extend_from_slice(&seq.to_le_bytes());
            buf.extend_from_slice(&salt.to_le_bytes());
            buf.extend_from_slice(&(off as u64).to_le_bytes());
            buf.extend_from_slice(&h[4..16]);
            let crc = u32::from_le_bytes(h[0..4].try_into().unwrap());
            let len = u32::from_le_bytes(h[4..8].try_into().unwrap()) as usize;
            if crc == crc32fast::hash(&buf) && h[8] == 2 && off + 16 + len <= img.len() && len >= 40
            {
                let payload = &img[off + 16..off + 16 + len];
                if crc32fast::hash(payload) == u32::from_le_bytes(h[12..16].try_into().unwrap()) {
                    ids.insert(u64::from_le_bytes(payload[0..8].try_into().unwrap()));
                }
            }
            off += 8;
        }
    }
    ids
}

/// For many seeds, 5 rounds each: open (default mode; on a Corruption error, lenient mode),
/// check the report, write epochs (some delivered), then one of: a power loss, a flipped byte
/// in a random segment, a removed segment, a truncated newest segment, a clean close.
/// Checks: every checkpoint whose checkpoint() returned Ok is pending or committed, or its loss
/// is reported (torn_tail, corruption, checkpoints_dropped, or the default open failing);
/// after a plain power loss or a clean close nothing is lost; next_checkpoint_id is above every
/// id any earlier report or call showed (pending, committed, last_checkpoint, dropped,
/// checkpoint() Ok), and the id it names is accepted.
#[test]
fn p40_recovery_report_invariants_across_reopens() {
    let seeds: u64 = std::env::var("PROBE_SEEDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(60);
    let mut failures = vec![];
    let mut ids_reused_after_destroying_damage: Vec<String> = vec![];
    let mut stats = BTreeMap::<&str, u64>::new();
    // Seed 596 lost checkpoint 1 without a report before recovery's claims reached back to
    // its cut; it is kept. Seeds 518 (the lost oldest segment is followed by no control frame)
    // and 739 (something was committed, so a missing front looks like clean-up) are the limit
    // documented in docs/design.md ("Failure model"): they are not run here.
    for seed in (0..seeds).chain([596]) {
        let mut rng = fastrand::Rng::with_seed(seed * 31 + 7);
        let sim = Arc::new(SimStorage::new());
        let o = small_opts("p40", 4096, 1024, 1500).salt_seed(seed);
        let mut live: BTreeSet<u64> = BTreeSet::new(); // checkpoint() Ok, loss not reported yet
        let mut seen_max: Option<u64> = None;
        let mut prev_session_max: Option<u64> = None;
        let mut last_damage = "none";
        let mut detail = String::new();
        for round in 0..5 {
            let ctx = format!("seed {seed} round {round} after {last_damage}");
            let mut open_failed = false;
            let visible_before_open = intact_barrier_ids(&sim);
            let (wal, rep) = match WalSink::open_with_storage(sim.clone(), o.clone()) {
                Ok(x) => x,
                Err(e) if is_corruption(&e) => {
                    open_failed = true;
                    *stats
                        .entry("default open failed with corruption")
                        .or_default() += 1;
                    match WalSink::open_with_storage(
                        sim.clone(),
                        o.clone().recovery_mode(RecoveryMode::TruncateAtCorruption),
                    ) {
                        Ok(x) => x,
                        Err(e) if is_corruption(&e) => {
                            // an open error reports the loss; the lenient mode failing is
                            // probed on its own by p41
                            *stats
                                .entry("lenient open failed with corruption (seed ends)")
                                .or_default() += 1;
                            break;
                        }
                        Err(e) => {
                            failures.push(format!("{ctx}: lenient open failed: {e}"));
                            break;
                        }
                    }
                }
                Err(e) => {
                    failures.push(format!("{ctx}: open failed: {e}"));
                    break;
                }
            };
            let committed = rep.committed.unwrap_or(0);
            let reported = open_failed
                || rep.torn_tail.is_some()
                || rep.corruption.is_some()
                || !rep.checkpoints_dropped.is_empty();
            let lost: Vec<u64> = live
                .iter()
                .copied()
                .filter(|id| *id > committed && !rep.pending.contains(id))
                .collect();
            if !lost.is_empty() {
                if !reported {
                    failures.push(format!("{ctx}: checkpoints {lost:?} vanished without a report (pending {:?}, committed {:?}, last {:?}, segments {}, moved_aside {:?}) [{detail}]", rep.pending, rep.committed, rep.last_checkpoint, rep.segments, rep.moved_aside));
                } else if last_damage == "power loss" || last_damage == "clean close" {
                    failures.push(format!("{ctx}: checkpoints {lost:?} lost after a {last_damage} (torn {:?} corr {:?} dropped {:?})", rep.torn_tail, rep.corruption, rep.checkpoints_dropped));
                }
                for id in &lost {
                    live.remove(id);
                }
            }
            let rep_ids: Vec<u64> = rep
                .pending
                .iter()
                .chain(rep.checkpoints_dropped.iter())
                .chain(rep.committed.iter())
                .chain(rep.last_checkpoint.iter())
                .copied()
                .collect();
            if let Some(m) = visible_before_open.iter().next_back() {
                if rep.next_checkpoint_id <= *m {
                    failures.push(format!(
                        "{ctx}: next_checkpoint_id {} not above {m}, a barrier id still intact in the directory before open (intact: {visible_before_open:?}; report: pending {:?} committed {:?} last {:?} dropped {:?} torn {:?} corruption {:?})",
                        rep.next_checkpoint_id, rep.pending, rep.committed, rep.last_checkpoint, rep.checkpoints_dropped,
                        rep.torn_tail.as_ref().map(|d| (&d.segment, d.offset, d.reason.name())),
                        rep.corruption.as_ref().map(|d| (&d.segment, d.offset, d.reason.name()))
                    ));
                }
            }
            if let (Some(m), true) = (
                prev_session_max,
                last_damage == "power loss" || last_damage == "clean close",
            ) {
                if rep.next_checkpoint_id <= m {
                    failures.push(format!("{ctx}: next_checkpoint_id {} not above {m}, an id of the previous session (its report or checkpoint() Ok)", rep.next_checkpoint_id));
                }
            }
            if let Some(m) = seen_max {
                if rep.next_checkpoint_id <= m {
                    ids_reused_after_destroying_damage.push(format!(
                        "{ctx}: next_checkpoint_id {} not above {m}, an id seen before (report: pending {:?} committed {:?} last {:?} dropped {:?} torn {:?} corruption {:?}; open_failed {open_failed})",
                        rep.next_checkpoint_id, rep.pending, rep.committed, rep.last_checkpoint, rep.checkpoints_dropped,
                        rep.torn_tail.as_ref().map(|d| (&d.segment, d.offset, d.reason.name())),
                        rep.corruption.as_ref().map(|d| (&d.segment, d.offset, d.reason.name()))
                    ));
                }
            }
            if let Some(m) = rep_ids.iter().max() {
                if rep.next_checkpoint_id <= *m {
                    failures.push(format!(
                        "{ctx}: next_checkpoint_id {} not above {m}, an id of this very report",
                        rep.next_checkpoint_id
                    ));
                }
            }
            for id in &rep_ids {
                seen_max = Some(seen_max.unwrap_or(0).max(*id));
            }
            prev_session_max = rep_ids.iter().max().copied();
            // work
            let mut id = rep.next_checkpoint_id + rng.u64(0..2);
            for _ in 0..rng.usize(1..4) {
                let n = rng.usize(0..25);
                for i in 0..n {
                    wal.append(&rec(id, i as u64, rng.usize(0..1200))).unwrap();
                }
                match wal.checkpoint(id, b"m") {
                    Ok(()) => {
                        live.insert(id);
                        seen_max = Some(seen_max.unwrap_or(0).max(id));
                        prev_session_max = Some(prev_session_max.unwrap_or(0).max(id));
                    }
                    Err(e) => failures.push(format!(
                        "{ctx}: checkpoint {id} (next allowed {}) failed: {e}",
                        rep.next_checkpoint_id
                    )),
                }
                id += 1 + rng.u64(0..2);
            }
            if rng.bool() {
                if let Some(&top) = live.iter().next_back() {
                    let upto = if rng.bool() {
                        top
                    } else {
                        *live.iter().next().unwrap()
                    };
                    let _ = wal.checkpoint_complete(upto);
                    let _ = wal.deliver_ready(&mut MemorySink::with_marker());
                }
            }
            for i in 0..rng.usize(0..10) {
                wal.append(&rec(0, i as u64, 300)).unwrap();
            }
            // damage
            let segs: Vec<(String, Vec<u8>)> = sim_segments(&sim);
            let choice = rng.usize(0..5);
            match choice {
                0 => {
                    sim.crash(CrashOptions::power_loss(seed * 100 + round));
                    drop(wal);
                    last_damage = "power loss";
                }
                1 if !segs.is_empty() => {
                    drop(wal);
                    let (name, mut img) = segs[rng.usize(0..segs.len())].clone();
                    let frames = parse_frames(&img);
                    let end = frames
                        .last()
                        .map(|f| (f.offset + 16 + f.len).min(img.len()))
                        .unwrap_or(40);
                    let off = rng.usize(0..end.max(1));
                    img[off] ^= 1 << rng.u8(0..8);
                    sim.put_file(&name, &img);
                    last_damage = "flipped byte";
                }
                2 if segs.len() >= 2 => {
                    drop(wal);
                    let (name, _) = &segs[rng.usize(0..segs.len())];
                    let _ = sim.remove(name);
                    last_damage = "removed segment";
                    detail = format!(
                        "removed {name} of {:?}; barriers per segment {:?}",
                        segs.iter().map(|s| &s.0[15..20]).collect::<Vec<_>>(),
                        segs.iter()
                            .map(|(_, img)| parse_frames(img)
                                .iter()
                                .filter(|f| f.kind == 2)
                                .map(|f| barrier_id(img, f))
                                .collect::<Vec<_>>())
                            .collect::<Vec<_>>()
                    );
                }
                3 if !segs.is_empty() => {
                    drop(wal);
                    let (name, mut img) = segs.last().unwrap().clone();
                    let cut = rng.usize(40..img.len().max(41));
                    img.truncate(cut);
                    sim.put_file(&name, &img);
                    last_damage = "truncated newest segment";
                }
                _ => {
                    drop(wal);
                    last_damage = "clean close";
                }
            }
            *stats.entry(last_damage).or_default() += 1;
        }
    }
    eprintln!("p40 stats: {stats:?}");
    eprintln!("p40: {} reopens reused an id whose barrier the damage destroyed (not a failure: walsink cannot see it):", ids_reused_after_destroying_damage.len());
    for m in ids_reused_after_destroying_damage.iter().take(8) {
        eprintln!("  {m}");
    }
    assert!(
        failures.is_empty(),
        "{} failures:\n{}",
        failures.len(),
        failures[..failures.len().min(20)].join("\n")
    );
}

/// The oldest segment of a log with nothing committed is lost (its epoch is now incomplete).
/// The default open fails with Corruption (IncompleteEpoch), as documented. The lenient mode,
/// documented as the way "to get a damaged log running again" (keep the valid prefix, move the
/// rest aside, report every checkpoint dropped), must open it, and must not answer with an
/// error that recommends the very mode it was opened in.
#[test]
fn p41_lenient_open_after_oldest_segment_lost() {
    let sim = Arc::new(SimStorage::new());
    let o = small_opts("p41", 4096, 1024, 1500).salt_seed(1);
    let (wal, _) = WalSink::open_with_storage(sim.clone(), o.clone()).unwrap();
    fill(&wal, 1, &vec![700; 12]);
    fill(&wal, 2, &vec![700; 12]);
    fill(&wal, 3, &vec![700; 3]);
    drop(wal);
    let segs = sim_segments(&sim);
    assert!(segs.len() >= 4, "setup");
    sim.remove(&segs[0].0).unwrap();
    sim.sync_dir().unwrap();
    let d = WalSink::open_with_storage(sim.clone(), o.clone());
    match &d {
        Err(e) => assert!(is_corruption(e), "default open: {e}"),
        Ok((_, r)) => panic!(
            "default open accepted a log missing its oldest segment: pending {:?} torn {:?}",
            r.pending, r.torn_tail
        ),
    }
    drop(d);
    match WalSink::open_with_storage(
        sim.clone(),
        o.recovery_mode(RecoveryMode::TruncateAtCorruption),
    ) {
        Ok((_, r)) => {
            assert!(
                r.corruption.is_some() || r.torn_tail.is_some(),
                "lenient report shows no damage: {r:?}"
            );
        }
        Err(e) => panic!(
            "lenient open (RecoveryMode::TruncateAtCorruption) failed: {e}\n(kind {:?})",
            e.kind()
        ),
    }
}

/// Nothing committed; segment 1 holds all of epoch 1 and its barrier, epoch 2 starts in
/// segment 2. Segment 1 is lost. Since nothing was committed, no segment can have been freed
/// (design.md invariant 7), so checkpoint 1, which returned Ok, is lost: recovery must report
/// it (torn_tail, corruption, checkpoints_dropped) or open must fail; it must not vanish, and
/// verify must not call the log clean.
#[test]
fn p42_lost_oldest_segment_with_whole_uncommitted_epoch_is_reported() {
    let sim = Arc::new(SimStorage::new());
    let o = small_opts("p42", 4096, 1024, 1500).salt_seed(3);
    let (wal, rep0) = WalSink::open_with_storage(sim.clone(), o.clone()).unwrap();
    assert_eq!(rep0.committed, None);
    fill(&wal, 1, &vec![1000; 3]);
    fill(&wal, 2, &vec![1000; 3]);
    drop(wal);
    let segs = sim_segments(&sim);
    let barriers: Vec<Vec<u64>> = segs
        .iter()
        .map(|(_, img)| {
            parse_frames(img)
                .iter()
                .filter(|f| f.kind == 2)
                .map(|f| barrier_id(img, f))
                .collect()
        })
        .collect();
    let data_in_first: usize = parse_frames(&segs[0].1)
        .iter()
        .filter(|f| f.kind == 1)
        .count();
    assert_eq!(
        (barriers[0].clone(), data_in_first),
        (vec![1], 3),
        "setup: segment 1 should hold exactly epoch 1; barriers {barriers:?}"
    );
    sim.remove(&segs[0].0).unwrap();
    sim.sync_dir().unwrap();
    let v = walsink::verify(&*sim).unwrap();
    let vk: Vec<&str> = v.problems.iter().map(|p| p.kind.name()).collect();
    match WalSink::open_with_storage(sim.clone(), o) {
        Err(e) => eprintln!("p42: open failed (loss reported): {e}"),
        Ok((_, rep)) => {
            let reported = rep.torn_tail.is_some()
                || rep.corruption.is_some()
                || rep.checkpoints_dropped.contains(&1);
            assert!(
                reported || rep.pending.contains(&1),
                "checkpoint 1 vanished without a report: removed {} (nothing committed); report: pending {:?} committed {:?} last {:?} next_checkpoint_id {} torn {:?} corruption {:?} dropped {:?}; verify ok={} problems {vk:?}",
                segs[0].0, rep.pending, rep.committed, rep.last_checkpoint, rep.next_checkpoint_id, rep.torn_tail, rep.corruption, rep.checkpoints_dropped, v.ok
            );
        }
    }
    assert!(!v.ok, "verify called a log that lost checkpoint 1 clean");
}
