//! Delivery's two-halves read (docs/design.md, "Delivery", step 3): a chunk of at least 2 MiB
//! is read in two halves at once and verified in two parts, and the outcome is exactly that of
//! reading on one thread, for clean epochs, random damage, damage aimed at the split boundary,
//! any chunk size and read faults at every read.
//!
//! The one-thread reference is this same test binary run under `taskset -c 0` (one core, so no
//! split), with the same cases: the parent compares every outcome line by line. A second,
//! independent reference is a frame walk over the damaged segment bytes with
//! `walsink::format::decode_frame`.

use parking_lot::Mutex;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::io;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::ThreadId;
use std::time::Duration;
use walsink::format::{
    decode_frame, decode_segment_header, FrameError, FrameKind, FRAME_HEADER_LEN,
    SEGMENT_HEADER_LEN,
};
use walsink::storage::{FaultOp, SimStorage, Storage};
use walsink::{Epoch, ErrorKind, Options, RetryPolicy, Sink, SinkError, WalSink};

const KIB: usize = 1 << 10;
const MIB: usize = 1 << 20;

// ---------------------------------------------------------------------------------------------
// A storage wrapper that notes which threads read large ranges
// ---------------------------------------------------------------------------------------------

#[derive(Default, Debug)]
struct ReadLog {
    on: AtomicBool,
    /// (thread, offset, len) of reads of at least 64 KiB while `on`.
    reads: Mutex<Vec<(ThreadId, u64, usize)>>,
    count: Mutex<u64>,
}

impl ReadLog {
    fn threads(&self) -> usize {
        self.reads
            .lock()
            .iter()
            .map(|r| r.0)
            .collect::<HashSet<_>>()
            .len()
    }
}

impl ReadLog {
    /// A read of `len` bytes at `offset`, by this thread.
    fn note(&self, offset: u64, len: usize) {
        if self.on.load(Ordering::SeqCst) {
            *self.count.lock() += 1;
            if len >= 64 * KIB {
                self.reads
                    .lock()
                    .push((std::thread::current().id(), offset, len));
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Records, sizes, the log
// ---------------------------------------------------------------------------------------------

fn byte_at(cp: u64, idx: u64, j: usize) -> u8 {
    (j as u64)
        .wrapping_mul(131)
        .wrapping_add(idx.wrapping_mul(17))
        .wrapping_add(cp.wrapping_mul(7)) as u8
        ^ (j >> 8) as u8
}

fn rec(cp: u64, idx: u64, len: usize) -> Vec<u8> {
    (0..len).map(|j| byte_at(cp, idx, j)).collect()
}

/// Sampled check (ends plus a stride): enough to see a shifted or mixed-up record.
fn rec_ok(cp: u64, idx: u64, len: usize, data: &[u8]) -> bool {
    if data.len() != len {
        return false;
    }
    let check = |j: usize| data[j] == byte_at(cp, idx, j);
    (0..len.min(32)).all(check)
        && (len.saturating_sub(32)..len).all(check)
        && (0..len).step_by(509).all(check)
}

/// Random record sizes summing to about `total`: mostly tiny, some medium, a few above 2 MiB.
fn sizes(rng: &mut fastrand::Rng, total: usize, big: bool) -> Vec<usize> {
    let mut v = Vec::new();
    let mut sum = 0;
    while sum < total {
        let p = rng.u32(0..100);
        let len = if p < 65 {
            rng.usize(1..300)
        } else if p < 88 {
            rng.usize(300..40_000)
        } else if p < 97 || !big {
            rng.usize(40_000..700_000)
        } else {
            rng.usize(3 * MIB / 2..(3 * MIB + 100))
        };
        sum += len + 16;
        v.push(len);
    }
    v
}

fn fast_retry() -> RetryPolicy {
    RetryPolicy::new(Duration::from_millis(1), Duration::from_millis(5))
}

fn opts(chunk: usize, segment: u64, seed: u64) -> Options {
    Options::new("probe13")
        .segment_size(segment)
        .max_record_size(4 * MIB)
        .read_chunk_size(chunk)
        .salt_seed(seed)
        .retry(fast_retry())
}

struct Log {
    sim: SimStorage,
    rlog: Arc<ReadLog>,
    wal: WalSink,
}

fn open_log(o: Options) -> Log {
    let sim = SimStorage::new();
    let rlog = Arc::new(ReadLog::default());
    let probe = crate::support::ReadHooked {
        inner: Arc::new(sim.clone()),
        hook: {
            let rlog = rlog.clone();
            Arc::new(move |offset, len| rlog.note(offset, len))
        },
    };
    let wal = WalSink::open_with_storage(Arc::new(probe), o)
        .expect("open")
        .0;
    Log { sim, rlog, wal }
}

fn seal(wal: &WalSink, cp: u64, sizes: &[usize]) {
    for (i, &len) in sizes.iter().enumerate() {
        wal.append(&rec(cp, i as u64, len)).expect("append");
    }
    wal.checkpoint(cp, format!("meta{cp}").as_bytes())
        .expect("checkpoint");
}

// ---------------------------------------------------------------------------------------------
// The sink: reads every epoch `passes` times, checks every record, stops at an Err
// ---------------------------------------------------------------------------------------------

#[derive(Debug, Clone, PartialEq, Eq)]
struct PassOut {
    records: u64,
    intact: bool,
    chunk_indices_ok: bool,
    err: Option<String>,
}

struct CheckSink {
    want: Arc<HashMap<u64, Vec<usize>>>,
    passes: u32,
    calls: Vec<(u64, Vec<PassOut>)>,
    delivered: Vec<u64>,
}

impl CheckSink {
    fn new(want: &HashMap<u64, Vec<usize>>, passes: u32) -> Self {
        CheckSink {
            want: Arc::new(want.clone()),
            passes,
            calls: Vec::new(),
            delivered: Vec::new(),
        }
    }
}

impl Sink for CheckSink {
    fn deliver(&mut self, epoch: &Epoch) -> Result<(), SinkError> {
        let cp = epoch.checkpoint();
        let sizes = self.want.get(&cp).cloned().unwrap_or_default();
        let mut outs = Vec::new();
        for _ in 0..self.passes {
            let mut out = PassOut {
                records: 0,
                intact: true,
                chunk_indices_ok: true,
                err: None,
            };
            for ch in epoch.chunks() {
                match ch {
                    Ok(c) => {
                        if c.first_index() != out.records || c.is_empty() {
                            out.chunk_indices_ok = false;
                        }
                        for r in c.records() {
                            let i = out.records;
                            if r.position.index != i
                                || r.position.checkpoint != cp
                                || i as usize >= sizes.len()
                                || !rec_ok(cp, i, sizes[i as usize], &r.data)
                            {
                                out.intact = false;
                            }
                            out.records += 1;
                        }
                    }
                    Err(e) => {
                        out.err = Some(format!("{:?}", e.kind()));
                        break;
                    }
                }
            }
            outs.push(out);
        }
        let failed = outs
            .iter()
            .any(|o| o.err.is_some() || o.records != sizes.len() as u64 || !o.intact);
        self.calls.push((cp, outs));
        if failed {
            return Err(SinkError::retryable("probe13: epoch read failed"));
        }
        self.delivered.push(cp);
        Ok(())
    }
}

// ---------------------------------------------------------------------------------------------
// Frame map and the reference walk
// ---------------------------------------------------------------------------------------------

#[derive(Debug, Clone)]
struct FrameAt {
    seg: String,
    offset: usize,
    size: usize,
    len: usize,
    kind: FrameKind,
}

fn segs(sim: &SimStorage) -> Vec<(String, Vec<u8>)> {
    sim.snapshot()
        .into_iter()
        .filter(|(n, _)| n.ends_with(".wseg"))
        .collect()
}

fn seq_of(name: &str) -> u64 {
    name.trim_end_matches(".wseg").parse().unwrap()
}

/// Every frame of the log in order (stops at the first frame that does not verify).
fn frames(sim: &SimStorage) -> Vec<FrameAt> {
    let mut out = Vec::new();
    for (name, data) in segs(sim) {
        let seed = decode_segment_header(&data, seq_of(&name)).expect("header");
        let mut at = SEGMENT_HEADER_LEN;
        while let Ok(f) = decode_frame(&data, seed, at) {
            out.push(FrameAt {
                seg: name.clone(),
                offset: at,
                size: f.size,
                len: f.payload.len(),
                kind: f.kind,
            });
            at += f.size;
            if f.kind == FrameKind::SegmentEnd {
                break;
            }
        }
    }
    out
}

/// The frames of the first epoch: its data frames, segment ends, and its barrier.
fn epoch1_frames(all: &[FrameAt]) -> Vec<FrameAt> {
    let mut v = Vec::new();
    for f in all {
        v.push(f.clone());
        if f.kind == FrameKind::Barrier {
            break;
        }
    }
    v
}

/// Walks the epoch's frames over the current bytes: the first that does not verify.
fn reference_damage(sim: &SimStorage, ep: &[FrameAt]) -> Option<(String, u64)> {
    let files: BTreeMap<String, Vec<u8>> = segs(sim).into_iter().collect();
    let first = &ep[0];
    let mut seg = first.seg.clone();
    let mut at = first.offset;
    loop {
        let data = &files[&seg];
        let seed = decode_segment_header(data, seq_of(&seg)).expect("header");
        match decode_frame(data, seed, at) {
            Ok(f) => match f.kind {
                FrameKind::Barrier => return None,
                FrameKind::SegmentEnd => {
                    seg = walsink::format::segment_name(seq_of(&seg) + 1);
                    at = SEGMENT_HEADER_LEN;
                }
                _ => at += f.size,
            },
            Err(FrameError::Zero) | Err(FrameError::ShortHeader) | Err(FrameError::Bad(_)) => {
                return Some((seg, at as u64))
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Damage
// ---------------------------------------------------------------------------------------------

fn write_into(sim: &SimStorage, seg: &str, off: usize, bytes: &[u8]) {
    let f = Storage::open(sim, seg).expect("open segment");
    f.write_at(off as u64, bytes).expect("damage write");
}

/// Picks and applies one damage to the epoch's frames; returns its description.
fn damage(sim: &SimStorage, rng: &mut fastrand::Rng, ep: &[FrameAt], chunk: usize) -> String {
    // Choose the frame: uniform, or the one around a multiple of half a chunk from the
    // epoch's start (where the split falls), or the one holding a random byte.
    let cand: Vec<&FrameAt> = ep
        .iter()
        .filter(|f| f.kind != FrameKind::SegmentEnd)
        .collect();
    let mut cum = Vec::new();
    let mut total = 0usize;
    for f in &cand {
        cum.push(total);
        total += f.size;
    }
    let pick_at = |pos: usize| -> usize {
        match cum.binary_search(&pos) {
            Ok(i) => i,
            Err(i) => i.saturating_sub(1),
        }
    };
    let i = match rng.u32(0..3) {
        0 => rng.usize(0..cand.len()),
        1 => {
            let k = rng.usize(1..(2 * total / chunk).max(1) + 2);
            let i = pick_at((k * chunk / 2).min(total - 1));
            (i + rng.usize(0..3)).saturating_sub(1).min(cand.len() - 1)
        }
        _ => pick_at(rng.usize(0..total)),
    };
    let f = cand[i];
    let data = sim.snapshot()[&f.seg].clone();
    let base = f.offset;
    let pad = f.size - FRAME_HEADER_LEN - f.len;
    let what = rng.u32(0..10);
    let (desc, off, bytes): (&str, usize, Vec<u8>) = match what {
        0 => ("hcrc", base + rng.usize(0..4), vec![]),
        1 => ("len", base + 4 + rng.usize(0..4), vec![]),
        2 => ("kind", base + 8, vec![]),
        3 => ("reserved", base + 9 + rng.usize(0..3), vec![]),
        4 => ("pcrc", base + 12 + rng.usize(0..4), vec![]),
        5 if f.len > 0 => ("payload", base + 16 + rng.usize(0..f.len), vec![]),
        6 if pad > 0 => ("padding", base + 16 + f.len + rng.usize(0..pad), vec![]),
        7 => {
            let n = rng.usize(1..64).min(data.len() - base);
            let o = base + rng.usize(0..f.size.min(64));
            let n = n.min(data.len() - o);
            let b: Vec<u8> = (0..n).map(|_| rng.u8(..)).collect();
            ("multi", o, b)
        }
        8 => {
            let n = rng.usize(16..8192).min(data.len() - base);
            ("zeros", base, vec![0; n])
        }
        _ => {
            let l = if rng.bool() {
                u32::MAX
            } else {
                (f.len as u32) ^ (8 << rng.u32(0..20))
            };
            ("setlen", base + 4, l.to_le_bytes().to_vec())
        }
    };
    let bytes = if bytes.is_empty() {
        let mut x = rng.u8(1..=255);
        if desc == "kind" && rng.bool() {
            x = data[off] ^ [2u8, 3, 4, 5][rng.usize(0..4)];
            if x == 0 {
                x = 1;
            }
        }
        vec![data[off] ^ x]
    } else {
        bytes
    };
    write_into(sim, &f.seg, off, &bytes);
    format!(
        "{desc}@{}+{} (frame {} of {}, {:?} len {})",
        f.seg,
        off,
        i,
        cand.len(),
        f.kind,
        f.len
    )
}

/// A damage aimed at the frames around the middle of the first chunk (the chunk is taken to
/// hold whole frames from the epoch's start up to `chunk` bytes).
fn aimed_damage(sim: &SimStorage, ep: &[FrameAt], chunk: usize, aim: u32) -> String {
    let start = ep[0].offset;
    let mut end = start;
    for f in ep {
        if f.seg != ep[0].seg || f.offset + f.size - start > chunk {
            break;
        }
        end = f.offset + f.size;
    }
    let middle = start + (end - start) / 2;
    // The first boundary at or after the middle.
    let b = ep
        .iter()
        .position(|f| f.seg == ep[0].seg && f.offset >= middle)
        .unwrap();
    let i = (b + (aim / 6) as usize).saturating_sub(2);
    let f = &ep[i];
    let next = &ep[i + 1];
    let data = sim.snapshot()[&f.seg].clone();
    let (desc, off, bytes): (&str, usize, Vec<u8>) = match aim % 6 {
        0 => ("hcrc", f.offset, vec![data[f.offset] ^ 0x5a]),
        1 => ("zeros-header", f.offset, vec![0; FRAME_HEADER_LEN]),
        2 => (
            "len-skips-a-frame",
            f.offset + 4,
            ((f.len + next.size) as u32).to_le_bytes().to_vec(),
        ),
        3 => (
            "len-short",
            f.offset + 4,
            (f.len.saturating_sub(8) as u32).to_le_bytes().to_vec(),
        ),
        4 => (
            "payload",
            f.offset + FRAME_HEADER_LEN + f.len / 2,
            vec![data[f.offset + FRAME_HEADER_LEN + f.len / 2] ^ 1],
        ),
        _ => ("zeros-4k", f.offset, vec![0; 4096]),
    };
    write_into(sim, &f.seg, off, &bytes);
    format!(
        "aimed {desc}@{}+{off} (frame {i}, boundary frame {b} at {}, middle {middle})",
        f.seg, ep[b].offset
    )
}

// ---------------------------------------------------------------------------------------------
// One case: build, damage, deliver, summarise
// ---------------------------------------------------------------------------------------------

#[derive(Debug, Clone, Copy)]
struct Case {
    seed: u64,
    chunk: usize,
    segment: u64,
    total: usize,
    damaged: bool,
    passes: u32,
    /// 0: random damage. Otherwise tiny records and a damage aimed at the first chunk's
    /// middle: `aim - 1` = frame (0..4, around the middle) * 6 + damage kind (0..6).
    aim: u32,
}

struct CaseOut {
    /// What must be equal between the split and the one-thread reads.
    line: String,
    desc: String,
    reference: Option<(String, u64)>,
    result: Result<usize, ErrorKind>,
    calls: Vec<(u64, Vec<PassOut>)>,
    delivered: Vec<u64>,
    split_seen: bool,
    n_records: usize,
}

fn run_case(c: Case) -> CaseOut {
    let mut rng = fastrand::Rng::with_seed(c.seed);
    let log = open_log(opts(c.chunk, c.segment, c.seed));
    let s1 = if c.aim == 0 {
        sizes(&mut rng, c.total, true)
    } else {
        let mut v = Vec::new();
        let mut sum = 0;
        while sum < c.total {
            let l = rng.usize(1..400);
            sum += l + 16;
            v.push(l);
        }
        v
    };
    let s2 = sizes(&mut rng, 64 * KIB, false);
    seal(&log.wal, 1, &s1);
    seal(&log.wal, 2, &s2);
    let all = frames(&log.sim);
    let ep = epoch1_frames(&all);
    assert_eq!(
        ep.iter().filter(|f| f.kind == FrameKind::Data).count(),
        s1.len(),
        "frame map"
    );
    let desc = if c.aim != 0 {
        aimed_damage(&log.sim, &ep, c.chunk, c.aim - 1)
    } else if c.damaged {
        damage(&log.sim, &mut rng, &ep, c.chunk)
    } else {
        "none".into()
    };
    let reference = reference_damage(&log.sim, &ep);
    let mut want = HashMap::new();
    want.insert(1, s1.clone());
    want.insert(2, s2.clone());
    let mut sink = CheckSink::new(&want, c.passes);
    log.wal.checkpoint_complete(1).unwrap();
    log.rlog.on.store(true, Ordering::SeqCst);
    let result = log.wal.deliver_ready(&mut sink).map_err(|e| e.into_kind());
    log.rlog.on.store(false, Ordering::SeqCst);
    let split_seen = log.rlog.threads() > 1;
    let committed = log.wal.wait_committed(1, Duration::from_millis(0));
    let line = format!(
        "seed={} chunk={} result={:?} committed={} calls={:?} delivered={:?}",
        c.seed, c.chunk, result, committed, sink.calls, sink.delivered
    );
    CaseOut {
        line,
        desc,
        reference,
        result,
        calls: sink.calls,
        delivered: sink.delivered,
        split_seen,
        n_records: s1.len(),
    }
}

/// Checks one outcome against the frame walk; returns the problems seen.
fn check_against_reference(c: &Case, o: &CaseOut) -> Vec<String> {
    let mut bad = Vec::new();
    let tag = format!("seed {} chunk {} damage {}", c.seed, c.chunk, o.desc);
    match (&o.reference, &o.result) {
        (None, Ok(1)) => {
            if o.delivered != [1] {
                bad.push(format!("{tag}: delivered {:?}", o.delivered));
            }
            for (_, passes) in &o.calls {
                for p in passes {
                    if p.records != o.n_records as u64
                        || !p.intact
                        || !p.chunk_indices_ok
                        || p.err.is_some()
                    {
                        bad.push(format!("{tag}: clean pass {p:?}"));
                    }
                }
            }
        }
        (Some((seg, off)), Err(ErrorKind::Corruption(d))) => {
            if &d.segment != seg || d.offset != *off {
                bad.push(format!(
                    "{tag}: reported {}@{} {:?}, frame walk says {seg}@{off}",
                    d.segment, d.offset, d.reason
                ));
            }
            if !o.delivered.is_empty() {
                bad.push(format!("{tag}: delivered {:?} despite damage", o.delivered));
            }
            for (_, passes) in &o.calls {
                for p in passes {
                    if !p.intact || !p.chunk_indices_ok || p.err.is_none() {
                        bad.push(format!("{tag}: damaged pass {p:?}"));
                    }
                }
            }
        }
        (r, res) => bad.push(format!("{tag}: frame walk {r:?}, delivery {res:?}")),
    }
    bad
}

// ---------------------------------------------------------------------------------------------
// The one-thread reference: this binary under `taskset -c 0`
// ---------------------------------------------------------------------------------------------

const CHILD_ENV: &str = "WALSINK_PROBE13_CASES";

fn encode_cases(cases: &[Case]) -> String {
    cases
        .iter()
        .map(|c| {
            format!(
                "{}:{}:{}:{}:{}:{}:{}",
                c.seed, c.chunk, c.segment, c.total, c.damaged as u8, c.passes, c.aim
            )
        })
        .collect::<Vec<_>>()
        .join(",")
}

fn decode_cases(s: &str) -> Vec<Case> {
    s.split(',')
        .map(|p| {
            let v: Vec<u64> = p.split(':').map(|x| x.parse().unwrap()).collect();
            Case {
                seed: v[0],
                chunk: v[1] as usize,
                segment: v[2],
                total: v[3] as usize,
                damaged: v[4] == 1,
                passes: v[5] as u32,
                aim: v[6] as u32,
            }
        })
        .collect()
}

/// Starts the one-core run of `cases`; `finish` returns its outcome lines and whether it ever
/// saw a split.
fn start_one_core(cases: &[Case]) -> std::process::Child {
    let exe = std::env::current_exe().unwrap();
    std::process::Command::new("taskset")
        .arg("-c")
        .arg("0")
        .arg(exe)
        .args([
            &crate::support::test_path(module_path!(), "one_core_reference_child"),
            "--exact",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD_ENV, encode_cases(cases))
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("spawn taskset")
}

fn finish_one_core(child: std::process::Child) -> (Vec<String>, bool) {
    let out = child.wait_with_output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "one-core child failed: {}\n{}",
        stdout,
        String::from_utf8_lossy(&out.stderr)
    );
    let lines: Vec<String> = stdout
        .lines()
        .filter_map(|l| l.find("P13OUT ").map(|i| l[i + 7..].to_string()))
        .collect();
    let split = stdout.contains("P13SPLIT");
    (lines, split)
}

/// Runs the cases split (here, two cores) and one-core (child); compares every outcome and
/// checks each against the frame walk. Returns (mismatches, reference problems, splits seen).
fn compare(cases: &[Case]) -> (Vec<String>, Vec<String>, usize) {
    let child = start_one_core(cases);
    let mut mine = Vec::new();
    let mut refbad = Vec::new();
    let mut splits = 0;
    for c in cases {
        let o = run_case(*c);
        refbad.extend(check_against_reference(c, &o));
        if o.split_seen {
            splits += 1;
        }
        mine.push((o.line, o.desc));
    }
    let (theirs, child_split) = finish_one_core(child);
    eprintln!("compare: {} cases, split seen in {splits}", cases.len());
    assert!(
        !child_split,
        "the one-core child split a chunk: no reference"
    );
    assert_eq!(theirs.len(), cases.len(), "child outcome lines");
    let mut diff = Vec::new();
    for ((m, desc), t) in mine.iter().zip(&theirs) {
        if m != t {
            diff.push(format!("damage {desc}\n   split:    {m}\n   one core: {t}"));
        }
    }
    (diff, refbad, splits)
}

/// Not a probe of its own when run directly: a small clean case must deliver. Under
/// `WALSINK_PROBE13_CASES` it is the one-core reference run of `compare`.
#[test]
fn one_core_reference_child() {
    match std::env::var(CHILD_ENV) {
        Ok(s) => {
            for c in decode_cases(&s) {
                let o = run_case(c);
                println!("P13OUT {}", o.line);
                if o.split_seen {
                    println!("P13SPLIT seed {}", c.seed);
                }
            }
        }
        Err(_) => {
            let o = run_case(Case {
                seed: 7,
                chunk: MIB,
                segment: 8 << 20,
                total: 2 * MIB,
                damaged: false,
                passes: 1,
                aim: 0,
            });
            assert!(matches!(o.result, Ok(1)), "{}", o.line);
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Probes
// ---------------------------------------------------------------------------------------------

const CHUNKS: [usize; 6] = [
    2 * MIB,
    2 * MIB + 8,
    2 * MIB + 4,
    3 * MIB + 1,
    5 * MIB / 2 + 24,
    8 * MIB,
];

/// Undamaged epochs of random sizes (records above the chunk size included): every record
/// delivered intact, in order, in both passes of one deliver, and the split is really taken.
#[test]
fn clean_epochs_deliver_every_record_split_and_one_core_alike() {
    let mut cases = Vec::new();
    for (i, &chunk) in CHUNKS.iter().enumerate() {
        cases.push(Case {
            seed: 1000 + i as u64,
            chunk,
            segment: [6u64 << 20, 8 << 20, 64 << 20][i % 3],
            total: if chunk == 8 * MIB { 12 * MIB } else { 7 * MIB },
            damaged: false,
            passes: 2,
            aim: 0,
        });
    }
    let (diff, refbad, splits) = compare(&cases);
    assert!(refbad.is_empty(), "{refbad:#?}");
    assert!(diff.is_empty(), "{diff:#?}");
    // On one core nothing splits; the comparison above still holds.
    assert!(
        !two_cores() || splits >= cases.len() / 2,
        "split seen in {splits} cases only"
    );
}

fn damage_cases(start: u64, n: usize) -> Vec<Case> {
    (0..n)
        .map(|i| {
            let seed = start + i as u64;
            Case {
                seed,
                chunk: CHUNKS[i % (CHUNKS.len() - 1)],
                segment: [6u64 << 20, 64 << 20][(i / 5) % 2],
                total: 5 * MIB + (seed as usize % 3) * MIB,
                damaged: true,
                passes: 1 + (i % 2) as u32,
                aim: 0,
            }
        })
        .collect()
}

/// Runs `cases` split and on one core: every outcome the same, each agreeing with the frame
/// walk, and (with two cores) some case split.
fn assert_split_and_one_core_agree(cases: &[Case]) {
    let (diff, refbad, splits) = compare(cases);
    assert!(!two_cores() || splits > 0, "no split seen");
    assert!(
        diff.is_empty(),
        "{} of {}: {diff:#?}",
        diff.len(),
        cases.len()
    );
    assert!(
        refbad.is_empty(),
        "{} of {}: {refbad:#?}",
        refbad.len(),
        cases.len()
    );
}

/// Random damage in large epochs: the reported corruption is that of the one-core read, and
/// the offset is the first frame that does not verify.
#[test]
fn random_damage_split_reports_what_one_core_reports() {
    let cases = damage_cases(5000, 24);
    assert_split_and_one_core_agree(&cases);
}

/// Damage aimed at the frames around the split of the first chunk (the frame before the
/// boundary, the one holding or ending at the middle, the first and second of the second part):
/// header checksum, zeroed header, a length that skips a frame, a short length, payload,
/// 4 KiB of zeros. Split and one-core reads must agree, and with the frame walk.
#[test]
fn damage_aimed_at_the_split_boundary() {
    let mut cases = Vec::new();
    for (k, chunk) in [2 * MIB + 4, 3 * MIB + 1].into_iter().enumerate() {
        for aim in 1..=24u32 {
            cases.push(Case {
                seed: 20_000 + k as u64 * 100 + aim as u64,
                chunk,
                segment: 64 << 20,
                total: chunk + 64 * KIB,
                damaged: true,
                passes: 1,
                aim,
            });
        }
    }
    assert_split_and_one_core_agree(&cases);
}

/// Damage read with a chunk below 2 MiB (never split) and with chunks of 2 MiB and more: the
/// same log bytes, the same damage reported.
#[test]
fn damage_report_does_not_depend_on_the_chunk_size() {
    let mut bad = Vec::new();
    for seed in 9000..9006u64 {
        let mut reports = Vec::new();
        for chunk in [MIB + 8, 2 * MIB, 3 * MIB + 1, 8 * MIB] {
            let o = run_case(Case {
                seed,
                chunk,
                segment: 6 << 20,
                total: 6 * MIB,
                damaged: true,
                passes: 1,
                aim: 0,
            });
            let r = match &o.result {
                Err(ErrorKind::Corruption(d)) => {
                    format!("{}@{} {:?}", d.segment, d.offset, d.reason)
                }
                other => format!("{other:?}"),
            };
            reports.push((chunk, r, o.desc));
        }
        // The damage picked depends on the chunk (half-chunk targeting), so compare runs that
        // hit the same bytes.
        let mut by_desc: BTreeMap<String, Vec<(usize, String)>> = BTreeMap::new();
        for (chunk, r, d) in reports {
            by_desc.entry(d).or_default().push((chunk, r));
        }
        for (d, v) in by_desc {
            if v.iter().any(|x| x.1 != v[0].1) {
                bad.push(format!("seed {seed} damage {d}: {v:?}"));
            }
        }
    }
    assert!(bad.is_empty(), "{bad:#?}");
}

/// Read faults at every nth read of a large epoch: the log's error is reported (not the
/// sink's), nothing is committed, and after clearing the fault the epoch is delivered once.
#[test]
fn read_faults_at_every_read_report_the_log_error_then_deliver_once() {
    for chunk in [2 * MIB, 3 * MIB + 1, 8 * MIB] {
        let seed = 77 + chunk as u64;
        let mut rng = fastrand::Rng::with_seed(seed);
        let log = open_log(opts(chunk, 8 << 20, seed));
        // A clean run counts the reads of one delivery.
        let mut want = HashMap::new();
        let s = sizes(&mut rng, 6 * MIB, true);
        want.insert(1u64, s.clone());
        seal(&log.wal, 1, &s);
        log.wal.checkpoint_complete(1).unwrap();
        let mut sink = CheckSink::new(&want, 1);
        *log.rlog.count.lock() = 0;
        log.rlog.on.store(true, Ordering::SeqCst);
        assert_eq!(log.wal.deliver_ready(&mut sink).unwrap(), 1);
        log.rlog.on.store(false, Ordering::SeqCst);
        let reads = *log.rlog.count.lock();
        assert!(reads >= 2, "reads {reads}");
        let mut cp = 1;
        for nth in 0..reads + 2 {
            cp += 1;
            let s = sizes(&mut rng, 6 * MIB, true);
            want.insert(cp, s.clone());
            seal(&log.wal, cp, &s);
            log.wal.checkpoint_complete(cp).unwrap();
            let mut sink = CheckSink::new(&want, 2);
            log.sim
                .inject_fault(FaultOp::Read, nth, io::ErrorKind::Other);
            let r = log.wal.deliver_ready(&mut sink);
            let hit = log.sim.pending_faults() == 0;
            log.sim.clear_faults();
            if hit {
                match &r {
                    Err(e) => assert!(
                        matches!(e.kind(), ErrorKind::Io { .. }),
                        "chunk {chunk} nth {nth}: {:?}",
                        e.kind()
                    ),
                    Ok(n) => panic!("chunk {chunk} nth {nth}: fault hit, delivered {n}"),
                }
                assert!(sink.delivered.is_empty(), "chunk {chunk} nth {nth}");
                assert!(!log.wal.wait_committed(cp, Duration::ZERO));
                for (_, passes) in &sink.calls {
                    for p in passes {
                        assert!(p.intact && p.chunk_indices_ok, "{p:?}");
                    }
                }
                let mut sink = CheckSink::new(&want, 1);
                assert_eq!(log.wal.deliver_ready(&mut sink).unwrap(), 1);
                assert_eq!(sink.delivered, vec![cp], "chunk {chunk} nth {nth}");
            } else {
                assert_eq!(r.unwrap(), 1, "chunk {chunk} nth {nth}");
                assert_eq!(sink.delivered, vec![cp]);
            }
            assert!(log.wal.wait_committed(cp, Duration::ZERO));
        }
    }
}

/// True when this process may run on two cores or more (the split needs a second one).
fn two_cores() -> bool {
    std::thread::available_parallelism().is_ok_and(|n| n.get() > 1)
}
