//! Streaming delivery: epochs larger than one read chunk are read in bounded chunks, every
//! record arrives once with its position (across many chunks and segment rolls, and at chunk
//! boundaries), the epoch can be read twice, records and chunks a sink keeps stay intact, an
//! iterator dropped half-way loses nothing, a record larger than a chunk comes through whole,
//! empty epochs are not sent, odd read chunk sizes are clear errors or work (never a panic or
//! an abort), and damage met half-way through an epoch is the log's error (not the sink's)
//! with nothing committed and no file left in a directory target, through `deliver_ready`, the
//! committer thread and the simulated disk; damage in a small epoch is found before the sink
//! sees it.

// These bodies are kept as they were written; the lints are about style, not about what
// is checked.
#![allow(
    clippy::useless_vec,
    clippy::type_complexity,
    clippy::manual_is_multiple_of
)]

use crate::support::frames::*;
use crate::support::*;
use bytes::Bytes;
use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::sync::mpsc;
use std::sync::Arc;
use std::time::Duration;
use walsink::storage::{CrashOptions, SimStorage};
use walsink::{
    Chunk, DirSink, Epoch, ErrorKind, MemorySink, Options, Record, Sink, SinkError, WalSink,
};

fn big_opts(sink: &str) -> walsink::Options {
    opts(sink).segment_size(16 << 20).max_record_size(12 << 20)
}

fn record(i: u32, size: usize) -> Vec<u8> {
    let mut r = format!("{i:08}:").into_bytes();
    r.resize(size, b'a' + (i % 26) as u8);
    r
}

/// Checks every record's position and content, reading the epoch twice.
struct Checking {
    sizes: Vec<usize>,
    passes: u32,
    chunks: usize,
}

impl Sink for Checking {
    fn deliver(&mut self, epoch: &Epoch) -> Result<(), SinkError> {
        for _ in 0..2 {
            let mut n = 0u32;
            let mut chunks = 0;
            for chunk in epoch.chunks() {
                let chunk = chunk?;
                assert!(!chunk.is_empty());
                assert_eq!(chunk.first_index(), n as u64);
                chunks += 1;
                for r in chunk.records() {
                    assert_eq!(r.position.index, n as u64);
                    assert_eq!(r.position.checkpoint, epoch.checkpoint());
                    assert_eq!(r.data, record(n, self.sizes[n as usize]));
                    n += 1;
                }
            }
            assert_eq!(n as u64, epoch.len());
            // The record iterator sees the same.
            let mut m = 0u32;
            for r in epoch.records() {
                let r = r?;
                assert_eq!(r.position.index, m as u64);
                assert_eq!(r.data.len(), self.sizes[m as usize]);
                m += 1;
            }
            assert_eq!(m, n);
            self.chunks = chunks;
            self.passes += 1;
        }
        Ok(())
    }
}

#[test]
fn an_epoch_larger_than_a_chunk_is_read_in_chunks_twice() {
    let sim = SimStorage::new();
    let wal = open_sim(&sim, big_opts("big"));
    // 40 MiB over several segments, with a 10 MiB record in the middle (larger than a chunk).
    let mut sizes: Vec<usize> = (0..8000).map(|i| 1000 + (i * 37) % 7000).collect();
    sizes[4500] = 10 << 20;
    for (i, &size) in sizes.iter().enumerate() {
        wal.append(&record(i as u32, size)).unwrap();
    }
    wal.checkpoint(1, b"m").unwrap();
    wal.checkpoint_complete(1).unwrap();
    let mut sink = Checking {
        sizes,
        passes: 0,
        chunks: 0,
    };
    assert_eq!(wal.deliver_ready(&mut sink).unwrap(), 1);
    assert_eq!(sink.passes, 2);
    assert!(sink.chunks >= 4, "read in {} chunks", sink.chunks);
    assert_eq!(wal.health().committed, Some(1));
}

#[test]
fn small_epochs_are_one_verified_chunk() {
    let sim = SimStorage::new();
    let wal = open_sim(&sim, opts("small"));
    append_values(&wal, 1, 100);
    wal.checkpoint(1, b"").unwrap();
    wal.checkpoint_complete(1).unwrap();
    let sizes = vec![0; 100];
    struct One(Vec<usize>);
    impl Sink for One {
        fn deliver(&mut self, epoch: &Epoch) -> Result<(), SinkError> {
            let n: Vec<usize> = epoch
                .chunks()
                .map(|c| c.map(|c| c.len() as usize))
                .collect::<Result<_, _>>()?;
            self.0 = n;
            Ok(())
        }
    }
    let mut s = One(sizes);
    wal.deliver_ready(&mut s).unwrap();
    assert_eq!(s.0, vec![100]);
}

/// Builds a committed-to-be epoch of ~40 MiB over 16 MiB segments and damages its middle.
fn damaged_big_epoch(sim: &SimStorage) -> WalSink {
    let wal = open_sim(sim, big_opts("damaged"));
    for i in 0..10_000u32 {
        wal.append(&record(i, 4000)).unwrap();
    }
    wal.checkpoint(1, b"").unwrap();
    wal.checkpoint_complete(1).unwrap();
    // Flip a byte in the second segment, well inside the epoch.
    let files = sim.snapshot();
    let (name, mut bytes) = files
        .into_iter()
        .filter(|(n, _)| n.ends_with(".wseg"))
        .nth(1)
        .unwrap();
    bytes[1_000_000] ^= 0x20;
    sim.put_file(&name, &bytes);
    wal
}

#[test]
fn damage_met_half_way_is_the_logs_error_and_nothing_is_committed() {
    let sim = SimStorage::new();
    let wal = damaged_big_epoch(&sim);
    let mut sink = MemorySink::with_marker();
    let e = wal.deliver_ready(&mut sink).unwrap_err();
    assert!(
        matches!(e.kind(), ErrorKind::Corruption(_)),
        "expected the log's corruption, got {e}"
    );
    assert!(sink.checkpoints().is_empty());
    assert_eq!(wal.health().committed, None);
    assert!(wal.health().last_error.unwrap().contains("corruption"));
}

#[test]
fn damage_met_half_way_leaves_no_file_in_a_directory_target() {
    let sim = SimStorage::new();
    let wal = damaged_big_epoch(&sim);
    let target = SimStorage::new();
    let mut sink = DirSink::with_storage(Arc::new(target.clone())).unwrap();
    let e = wal.deliver_ready(&mut sink).unwrap_err();
    assert!(matches!(e.kind(), ErrorKind::Corruption(_)), "{e}");
    assert!(DirSink::read_epochs_in(&target).unwrap().is_empty());
    target.crash(CrashOptions::process_kill());
    assert!(DirSink::read_epochs_in(&target).unwrap().is_empty());
}

/// Large chunks are read and verified in two halves on two threads. Damage anywhere in them
/// (before the middle, in the frame across it, in a length field that would send the walk to
/// the middle astray, after it, in a frame the chunk's end cuts) is reported at the frame it is
/// in, as a read on one thread reports it, and nothing is committed.
#[test]
fn damage_around_the_middle_of_a_large_chunk_is_found_at_its_frame() {
    const MIB: usize = 1 << 20;
    let frame = walsink::format::FRAME_HEADER_LEN + 4000;
    let first = walsink::format::SEGMENT_HEADER_LEN;
    // (byte to flip, bit) in the first segment; chunks are 8 MiB, so halves meet near 4 MiB.
    let straddling = first + (4 * MIB - first) / frame * frame;
    let cases = [
        (100_000, 0x01),
        (4 * MIB - 10, 0x08),
        (4 * MIB + 10, 0x08),
        (straddling + 4, 0x40),
        (straddling + 4 + frame, 0x40),
        (6 * MIB, 0x02),
        (8 * MIB - 5, 0x10),
        (11 * MIB + 77, 0x80),
    ];
    for (at, bit) in cases {
        let sim = SimStorage::new();
        let wal = open_sim(&sim, big_opts("halves"));
        for i in 0..5_000u32 {
            wal.append(&record(i, 4000)).unwrap();
        }
        wal.checkpoint(1, b"").unwrap();
        wal.checkpoint_complete(1).unwrap();
        let name = "00000000000000000001.wseg";
        let mut bytes = sim.snapshot()[name].clone();
        bytes[at] ^= bit;
        sim.put_file(name, &bytes);
        let mut sink = MemorySink::with_marker();
        let e = wal.deliver_ready(&mut sink).unwrap_err();
        let ErrorKind::Corruption(d) = e.kind() else {
            panic!("byte {at}: expected corruption, got {e}");
        };
        let expected = (first + (at - first) / frame * frame) as u64;
        assert_eq!(
            (d.segment.as_str(), d.offset),
            (name, expected),
            "byte {at}: {e}"
        );
        assert!(sink.checkpoints().is_empty(), "byte {at}");
        assert_eq!(wal.health().committed, None, "byte {at}");
    }
}

/// Bytes one data frame of a record of `len` bytes takes in a segment (docs/design.md).
fn frame_len(len: usize) -> usize {
    16 + pad8(len)
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

fn target_names(dir: &Path) -> Vec<String> {
    match std::fs::read_dir(dir) {
        Ok(rd) => rd
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect(),
        Err(_) => vec![],
    }
}

/// Epochs much larger than the chunk, mixed record sizes (0, 1, around 8, around a chunk,
/// larger than a chunk), many segment rolls, an empty epoch in between: every chunk respects
/// read_chunk_size (or is one frame), positions are continuous across chunks, both passes
/// give the exact records.
#[test]
fn big_epochs_over_many_chunks_and_segment_rolls_keep_positions_continuous() {
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
fn records_exactly_at_chunk_boundaries_arrive_whole() {
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
fn record_data_and_chunks_kept_by_the_sink_stay_intact() {
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
fn an_iterator_dropped_half_way_or_interleaved_with_another_loses_nothing() {
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
fn empty_epochs_are_not_sent_and_block_nothing() {
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
fn an_invalid_read_chunk_size_is_a_clear_error() {
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

/// Child body of `a_huge_read_chunk_size_neither_panics_nor_aborts`: open with a huge
/// read_chunk_size and deliver a small epoch.
#[test]
#[ignore = "child process of a_huge_read_chunk_size_neither_panics_nor_aborts"]
fn huge_read_chunk_size_child() {
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
fn a_huge_read_chunk_size_neither_panics_nor_aborts() {
    let exe = std::env::current_exe().unwrap();
    let mut failures = vec![];
    for v in [usize::MAX, 1usize << 40, 1usize << 62] {
        let out = std::process::Command::new(&exe)
            .args([
                "--ignored",
                "--exact",
                &crate::support::test_path(module_path!(), "huge_read_chunk_size_child"),
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

/// A sink that returns the iterator's Err: deliver_ready returns the log's Corruption error,
/// not the sink's, nothing is committed, epoch 3 is never handed out; a retry fails the same.
#[test]
fn damage_met_half_way_is_the_logs_error_for_a_sink_that_passes_errors_on() {
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
fn damage_met_half_way_commits_nothing_for_a_sink_that_ignores_errors() {
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

/// DirSink target: after damage met half-way, the target holds no file named for epoch 2 (nor
/// 3); DirSink::committed lists only epoch 1 when epoch 1 went there; a retry fails the same.
#[test]
fn damage_met_half_way_leaves_no_epoch_file_of_a_dir_sink() {
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
fn damage_met_half_way_on_the_simulated_disk_is_the_logs_error() {
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
fn damage_in_a_small_epoch_is_found_before_the_sink_sees_it() {
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
fn damage_met_half_way_by_the_committer_thread_commits_nothing() {
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
