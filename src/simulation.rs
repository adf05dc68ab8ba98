//! Seeded crash simulation against a reference model, used by `tests/crash_consistency.rs`
//! and the fuzz targets. Public so that any harness can replay a seed.
//!
//! A run drives a log on a [`SimStorage`] with a random workload (append, checkpoint with
//! metadata, complete, restore, delivery with sink failures, clean reopen, segment rolls,
//! recycling and garbage collection through small segments), kills the simulated process at
//! a sync point or between operations, builds a power-loss (or process-kill) image, reopens,
//! and checks the log against the model:
//!
//! - every checkpoint whose `checkpoint` call returned `Ok`, and that no completed `restore`
//!   voided, is still there (pending or committed) with its metadata;
//! - nothing else is: no unsealed record and no voided epoch comes back;
//! - a sink that keeps its own marker receives every epoch exactly once, with exactly the
//!   records appended for it, in checkpoint order; a sink without one at least once;
//! - recovery never fails on an image a crash produced.

use crate::storage::{CrashOptions, SimStorage};
use crate::{MemorySink, Options, RecoveryMode, RetryPolicy, WalSink};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

/// One step of a workload.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    /// Append a batch of `count` (1..=4) records, each padded by `pad` bytes (mod 400).
    Append {
        /// Records in the batch.
        count: u8,
        /// Padding of each record.
        pad: u16,
    },
    /// Checkpoint with the next id plus `skip` (mod 3) and `meta` (mod 20) metadata bytes.
    Checkpoint {
        /// Ids skipped.
        skip: u8,
        /// Metadata length.
        meta: u8,
    },
    /// Complete the newest durable checkpoint (or the one before it, if `older`).
    Complete {
        /// Complete an older one.
        older: bool,
    },
    /// Deliver what is ready; the sink fails once first if `fail`.
    Deliver {
        /// Make the first delivery fail.
        fail: bool,
    },
    /// Restore from the oldest checkpoint the engine may restore from.
    Restore,
    /// Close and reopen the log cleanly.
    Reopen,
    /// Arm a kill at the `n`-th (mod 6) next sync.
    KillAtSync(u8),
    /// Arm a kill after `n` (mod 40) more mutating storage operations.
    KillAfter(u8),
    /// Arm a kill at the `n`-th next sync, unbounded (used to crash at every sync point).
    KillAtSyncAbsolute(u64),
}

impl Op {
    /// Draws a random operation with the workload's weights.
    pub fn random(rng: &mut fastrand::Rng) -> Op {
        match rng.u8(0..100) {
            0..=49 => Op::Append {
                count: rng.u8(1..=4),
                pad: rng.u16(0..400),
            },
            50..=64 => Op::Checkpoint {
                skip: rng.u8(0..3),
                meta: rng.u8(0..20),
            },
            65..=76 => Op::Complete {
                older: rng.u8(0..4) == 0,
            },
            77..=90 => Op::Deliver {
                fail: rng.u8(0..5) == 0,
            },
            91..=94 => Op::Restore,
            _ => Op::Reopen,
        }
    }

    /// Decodes an operation from fuzzer bytes (three bytes an operation).
    pub fn from_bytes(b: [u8; 3]) -> Op {
        let arg = u16::from_le_bytes([b[1], b[2]]);
        match b[0] % 16 {
            0..=5 => Op::Append {
                count: 1 + b[1] % 4,
                pad: arg % 400,
            },
            6..=8 => Op::Checkpoint {
                skip: b[1] % 3,
                meta: b[2] % 20,
            },
            9 => Op::Complete {
                older: b[1] & 1 == 1,
            },
            10 | 11 => Op::Deliver {
                fail: b[1] & 1 == 1,
            },
            12 => Op::Restore,
            13 => Op::Reopen,
            14 => Op::KillAtSync(b[1] % 6),
            _ => Op::KillAfter(b[1] % 40),
        }
    }
}

/// One simulation failure: the seed and what went wrong.
#[derive(Debug, Clone)]
pub struct SimFailure {
    /// The seed that reproduces it.
    pub seed: u64,
    /// The step at which the check failed.
    pub step: usize,
    /// What was expected and what was seen.
    pub message: String,
}

impl std::fmt::Display for SimFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "seed {} failed at step {}: {}\nreplay: WALSINK_SIM_SEED={} cargo test --test crash_consistency replay_one_seed -- --nocapture",
            self.seed, self.step, self.message, self.seed
        )
    }
}

/// Counters of one run, to show that the workload did what it claims.
#[derive(Debug, Clone, Copy, Default)]
pub struct SimStats {
    /// Operations executed.
    pub ops: usize,
    /// Simulated crashes, each followed by a reopen.
    pub crashes: usize,
    /// Checkpoints that returned `Ok`.
    pub checkpoints: usize,
    /// Epochs the sink received.
    pub delivered: usize,
    /// Segment files rolled over (segments created beyond the first of each open).
    pub max_segments: u64,
}

#[derive(Debug, Default)]
struct Model {
    /// Records of every epoch ever sealed, by id (ids are never reused).
    epochs: BTreeMap<u64, (Vec<Vec<u8>>, Vec<u8>)>,
    /// Ids whose checkpoint returned Ok and that no completed restore voided.
    durable: BTreeSet<u64>,
    /// Ids that may or may not exist (their checkpoint or a voiding restore was cut short).
    maybe: BTreeSet<u64>,
    open: Vec<Vec<u8>>,
    next_id: u64,
    /// Highest id ever completed: the engine never restores below it.
    completed_ever: Option<u64>,
    counter: u64,
}

struct Run {
    seed: u64,
    rng: fastrand::Rng,
    sim: SimStorage,
    opts: Options,
    sink: MemorySink,
    marker: bool,
    model: Model,
    wal: Option<WalSink>,
    step: usize,
    stats: SimStats,
}

fn sim_options(rng: &mut fastrand::Rng) -> Options {
    Options::new("sim")
        .segment_size(rng.u64(4096..16384))
        .max_record_size(600)
        .max_metadata_size(64)
        .mark_every(rng.usize(1..=3))
        .recycle_segments(rng.bool())
        .retry(RetryPolicy {
            initial: Duration::from_millis(1),
            max: Duration::from_millis(1),
        })
        .write_buffer_size(rng.usize(64..4096))
        .salt_seed(rng.u64(..))
}

impl Run {
    fn fail(&self, message: impl Into<String>) -> SimFailure {
        SimFailure {
            seed: self.seed,
            step: self.step,
            message: message.into(),
        }
    }

    fn wal(&self) -> &WalSink {
        self.wal.as_ref().expect("open log")
    }

    /// Reopens after a crash (or cleanly) and checks the recovered log against the model.
    fn reopen(&mut self) -> Result<(), SimFailure> {
        self.wal = None;
        let (wal, report) =
            match WalSink::open_with_storage(Arc::new(self.sim.clone()), self.opts.clone()) {
                Ok(x) => x,
                Err(_) if self.sim.is_dead() => return Err(self.fail("dead")),
                Err(e) => return Err(self.fail(format!("recovery failed on a crash image: {e}"))),
            };
        if std::env::var("WALSINK_DEBUG").is_ok() {
            eprintln!("step {} reopen: {report:?}", self.step);
        }
        let committed = report.committed;
        let pending: BTreeSet<u64> = report.pending.iter().copied().collect();
        let is_committed = |id: u64| committed.is_some_and(|c| id <= c);
        for &id in &self.model.durable {
            if !is_committed(id) && !pending.contains(&id) {
                return Err(self.fail(format!(
                    "checkpoint {id} returned Ok but is neither pending nor committed after recovery (pending {pending:?}, committed {committed:?})"
                )));
            }
        }
        for &id in &pending {
            if !self.model.durable.contains(&id) && !self.model.maybe.contains(&id) {
                return Err(self.fail(format!(
                    "checkpoint {id} is pending after recovery but was never sealed, or was voided"
                )));
            }
        }
        for p in wal.pending() {
            let want = &self.model.epochs[&p.id];
            if p.metadata != want.1 || p.records != want.0.len() as u64 {
                return Err(self.fail(format!(
                    "checkpoint {} recovered with {} records / metadata {:?}, expected {} / {:?}",
                    p.id,
                    p.records,
                    p.metadata,
                    want.0.len(),
                    want.1
                )));
            }
        }
        // Resolve the uncertain ids by what recovery found.
        let maybe = std::mem::take(&mut self.model.maybe);
        for id in maybe {
            if pending.contains(&id) {
                self.model.durable.insert(id);
            } else if !is_committed(id) {
                self.model.durable.remove(&id);
            }
        }
        self.model.open.clear();
        self.model.next_id = self.model.next_id.max(report.next_checkpoint_id);
        self.stats.max_segments = self.stats.max_segments.max(report.segments as u64);
        self.wal = Some(wal);
        // The engine restores from its newest checkpoint, or one at least as new as the
        // newest completed one.
        let candidates = self.restore_candidates();
        let target = if candidates.is_empty() {
            self.model.durable.last().copied()
        } else {
            Some(candidates[self.rng.usize(..candidates.len())])
        };
        self.restore(target)
    }

    /// Checkpoints the engine may restore from: durable, and not older than a completed one.
    fn restore_candidates(&self) -> Vec<u64> {
        let completed = self.model.completed_ever;
        let ok = |id: &u64| completed.is_none_or(|c| *id >= c);
        self.model.durable.iter().copied().filter(ok).collect()
    }

    fn restore(&mut self, target: Option<u64>) -> Result<(), SimFailure> {
        let voided: Vec<u64> = self
            .model
            .durable
            .iter()
            .copied()
            .filter(|&id| target.is_none_or(|t| id > t))
            .collect();
        match self.wal().restore(target) {
            Ok(()) => {
                let committed = self.wal().health().committed;
                for id in voided {
                    if committed.is_none_or(|c| id > c) {
                        self.model.durable.remove(&id);
                    }
                }
                self.model.open.clear();
                if let Some(t) = target {
                    self.model.completed_ever =
                        Some(self.model.completed_ever.map_or(t, |c| c.max(t)));
                }
                Ok(())
            }
            Err(e) if self.sim.is_dead() => {
                let _ = e;
                self.model.maybe.extend(voided.iter().copied());
                for id in voided {
                    self.model.durable.remove(&id);
                }
                Err(self.fail("dead"))
            }
            Err(e) => Err(self.fail(format!("restore failed: {e}"))),
        }
    }

    fn check_sink(&self) -> Result<(), SimFailure> {
        let batches = self.sink.batches();
        let mut seen = BTreeSet::new();
        let mut last = None;
        for (key, records) in &batches {
            let id = key.checkpoint;
            let Some(want) = self.model.epochs.get(&id) else {
                return Err(self.fail(format!(
                    "sink received checkpoint {id}, which was never sealed"
                )));
            };
            if records != &want.0 {
                return Err(self.fail(format!(
                    "sink received checkpoint {id} with {} records, expected {}",
                    records.len(),
                    want.0.len()
                )));
            }
            if !seen.insert(id) && self.marker {
                return Err(self.fail(format!(
                    "checkpoint {id} delivered twice to a sink with its own marker"
                )));
            }
            if self.marker && last.is_some_and(|l| l >= id) {
                return Err(self.fail(format!("checkpoint {id} delivered after {last:?}")));
            }
            last = Some(id);
        }
        Ok(())
    }

    /// Runs one operation. `Err` with message "dead" means the simulated process died.
    fn op(&mut self, op: Op) -> Result<(), SimFailure> {
        if std::env::var("WALSINK_DEBUG").is_ok() {
            eprintln!("step {} {op:?}", self.step);
        }
        let dead = |r: &Run, what: &str, e: crate::Error| {
            if r.sim.is_dead() {
                r.fail("dead")
            } else {
                r.fail(format!("{what} failed: {e}"))
            }
        };
        match op {
            Op::Append { count, pad } => {
                let mut batch = Vec::new();
                for _ in 0..count.clamp(1, 4) {
                    self.model.counter += 1;
                    let mut r = format!("{}:{}:", self.seed, self.model.counter).into_bytes();
                    r.resize(
                        r.len() + (pad % 400) as usize,
                        b'a' + (self.model.counter % 26) as u8,
                    );
                    batch.push(r);
                }
                let res = self.wal().append_batch(batch.iter().map(|r| r.as_slice()));
                res.map_err(|e| dead(self, "append", e))?;
                self.model.open.extend(batch);
            }
            Op::Checkpoint { skip, meta } => {
                let id = self.model.next_id + (skip % 3) as u64;
                let meta: Vec<u8> = (0..meta % 20).map(|_| self.rng.u8(..)).collect();
                let records = std::mem::take(&mut self.model.open);
                self.model.epochs.insert(id, (records, meta.clone()));
                self.model.next_id = id + 1;
                match self.wal().checkpoint(id, &meta) {
                    Ok(()) => {
                        self.model.durable.insert(id);
                        self.stats.checkpoints += 1;
                    }
                    Err(e) => {
                        self.model.maybe.insert(id);
                        return Err(dead(self, "checkpoint", e));
                    }
                }
            }
            Op::Complete { older } => {
                if let Some(&id) = self.model.durable.iter().next_back() {
                    let id = if older { id.saturating_sub(1) } else { id };
                    if self.model.durable.contains(&id) {
                        self.wal()
                            .checkpoint_complete(id)
                            .map_err(|e| dead(self, "complete", e))?;
                        self.model.completed_ever =
                            Some(self.model.completed_ever.map_or(id, |c| c.max(id)));
                    }
                }
            }
            Op::Deliver { fail } => {
                self.sink.fail_next(u32::from(fail));
                let mut sink = self.sink.clone();
                let res = self.wal().deliver_ready(&mut sink);
                self.sink.fail_next(0);
                match res {
                    Ok(_) => {}
                    Err(e) if self.sim.is_dead() => return Err(dead(self, "deliver", e)),
                    Err(e) if matches!(e.kind(), crate::ErrorKind::Sink(_)) => {}
                    Err(e) => return Err(self.fail(format!("delivery failed: {e}"))),
                }
                self.check_sink()?;
            }
            Op::Restore => {
                if let Some(&t) = self.restore_candidates().first() {
                    self.restore(Some(t))?;
                }
            }
            Op::Reopen => {
                // Clean reopen: the unsealed tail goes, like after a crash.
                self.model.open.clear();
                self.reopen()?;
            }
            Op::KillAtSync(n) => self.sim.kill_at_sync((n % 6) as u64),
            Op::KillAfter(n) => self.sim.kill_after((n % 40) as u64),
            Op::KillAtSyncAbsolute(n) => self.sim.kill_at_sync(n),
        }
        Ok(())
    }
}

/// Runs seed `seed`: `ops` random operations, with up to `crashes` kills armed at random.
pub fn run(seed: u64, ops: usize, crashes: usize) -> Result<SimStats, SimFailure> {
    let mut rng = fastrand::Rng::with_seed(seed ^ 0x9e37_79b9_7f4a_7c15);
    let mut list = Vec::with_capacity(ops + crashes);
    let mut left = crashes;
    for _ in 0..ops {
        if left > 0 && rng.u8(0..8) == 0 {
            left -= 1;
            list.push(if rng.bool() {
                Op::KillAtSync(rng.u8(0..6))
            } else {
                Op::KillAfter(rng.u8(0..40))
            });
        }
        list.push(Op::random(&mut rng));
    }
    run_ops(seed, &list)
}

/// Runs an explicit list of operations (from a property test or a fuzzer) on a log whose
/// options and sink kind are drawn from `seed`, then checks the final state.
pub fn run_ops(seed: u64, ops: &[Op]) -> Result<SimStats, SimFailure> {
    run_ops_observed(seed, ops, |_| {})
}

/// [`run_ops`], calling `observe` with the disk before the final checks (after the workload,
/// before the final reopen).
fn run_ops_observed(
    seed: u64,
    ops: &[Op],
    observe: impl FnOnce(&SimStorage),
) -> Result<SimStats, SimFailure> {
    let mut rng = fastrand::Rng::with_seed(seed);
    let opts = sim_options(&mut rng);
    let marker = rng.bool();
    let mut r = Run {
        seed,
        rng,
        sim: SimStorage::new(),
        opts,
        sink: if marker {
            MemorySink::with_marker()
        } else {
            MemorySink::new()
        },
        marker,
        model: Model::default(),
        wal: None,
        step: 0,
        stats: SimStats::default(),
    };
    r.reopen()?;
    for &op in ops {
        r.step += 1;
        match r.op(op) {
            Ok(()) => {}
            Err(f) if f.message == "dead" => {
                r.stats.crashes += 1;
                r.wal = None;
                r.sink.fail_next(0);
                if r.rng.u8(0..4) == 0 {
                    r.sim.crash(CrashOptions::process_kill());
                } else {
                    r.sim.crash(CrashOptions::power_loss(r.rng.u64(..)));
                }
                // Recovery itself may be killed again; the next attempt must still succeed.
                loop {
                    match r.reopen() {
                        Ok(()) => break,
                        Err(f) if f.message == "dead" => {
                            r.stats.crashes += 1;
                            r.wal = None;
                            r.sim.crash(CrashOptions::power_loss(r.rng.u64(..)));
                        }
                        Err(f) => return Err(f),
                    }
                }
            }
            Err(f) => return Err(f),
        }
        r.stats.ops += 1;
    }
    // Final: no more faults; complete everything and deliver; every durable epoch arrives.
    observe(&r.sim);
    r.sim.crash(CrashOptions::process_kill());
    r.sink.fail_next(0);
    r.reopen()?;
    if let Some(&last) = r.model.durable.iter().next_back() {
        r.wal()
            .checkpoint_complete(last)
            .map_err(|e| r.fail(format!("complete: {e}")))?;
    }
    let mut sink = r.sink.clone();
    r.wal()
        .deliver_ready(&mut sink)
        .map_err(|e| r.fail(format!("final delivery failed: {e}")))?;
    r.check_sink()?;
    let got: BTreeSet<u64> = r.sink.checkpoints().into_iter().collect();
    let committed = r.wal().health().committed;
    for &id in &r.model.durable {
        if !got.contains(&id) && !r.model.epochs[&id].0.is_empty() {
            return Err(r.fail(format!(
                "checkpoint {id} was durable but never delivered (committed {committed:?})"
            )));
        }
    }
    let h = r.wal().health();
    if h.backlog_epochs != 0 {
        return Err(r.fail(format!("backlog left after final delivery: {h:?}")));
    }
    // Strict recovery of a cleanly closed log finds nothing to repair.
    r.wal = None;
    let strict = r.opts.clone().recovery_mode(RecoveryMode::Strict);
    WalSink::open_with_storage(Arc::new(r.sim.clone()), strict)
        .map_err(|e| r.fail(format!("strict reopen: {e}")))?;
    r.stats.delivered = r.sink.batches().len();
    Ok(r.stats)
}

/// Fuzz target logic: decodes arbitrary bytes as segment headers, frames at every offset,
/// control payloads and small files. Must never panic or allocate from a length field.
pub fn check_decode(data: &[u8]) {
    use crate::format;
    let seq = data.first().copied().unwrap_or(0) as u64;
    let seed = format::Seed { seq, salt: 7 };
    let _ = format::decode_segment_header(data, seq);
    let mut at = 0;
    while at < data.len() {
        if let Ok(f) = format::decode_frame(data, seed, at) {
            let _ = format::Barrier::decode(f.payload);
            let _ = format::Restore::decode(f.payload);
        }
        let _ = format::peek_frame(data, at);
        at += 1;
    }
    let _ = format::Barrier::decode(data);
    let _ = format::Restore::decode(data);
    let _ = format::decode_identity(data);
    let _ = format::decode_commit(data);
}

/// A small valid log: four checkpoints over several 4 KiB segments, the first committed, an
/// unsealed tail. Returns its files (built once per process).
fn base_log() -> BTreeMap<String, Vec<u8>> {
    static BASE: std::sync::OnceLock<BTreeMap<String, Vec<u8>>> = std::sync::OnceLock::new();
    BASE.get_or_init(build_base_log).clone()
}

fn build_base_log() -> BTreeMap<String, Vec<u8>> {
    let sim = SimStorage::new();
    let opts = Options::new("fuzz")
        .segment_size(4096)
        .max_record_size(512)
        .max_metadata_size(32)
        .salt_seed(3);
    let (wal, _) = WalSink::open_with_storage(Arc::new(sim.clone()), opts).expect("open base log");
    for cp in 1..=4u64 {
        for i in 0..12 {
            let r = format!("record {cp}-{i} {}", "q".repeat((i * 17) % 90));
            wal.append(r.as_bytes()).expect("append");
        }
        wal.checkpoint(cp, format!("m{cp}").as_bytes())
            .expect("checkpoint");
    }
    wal.checkpoint_complete(1).expect("complete");
    wal.deliver_ready(&mut MemorySink::new()).expect("deliver");
    wal.append(b"tail").expect("append");
    drop(wal);
    sim.crash(CrashOptions::process_kill());
    sim.snapshot()
}

fn fuzz_options() -> Options {
    Options::new("fuzz")
        .segment_size(4096)
        .max_record_size(512)
        .max_metadata_size(32)
}

/// Fuzz target logic: damages a valid log directory as the bytes say (flip, set, truncate,
/// extend, delete, add files), then verifies and opens it in every recovery mode and delivers
/// what it can. Any outcome but a panic is acceptable; errors must be typed.
pub fn check_recovery(data: &[u8]) {
    let mut files = base_log();
    let names: Vec<String> = files.keys().cloned().collect();
    for edit in data.chunks(4) {
        let [op, file, a, b] = [
            edit[0],
            *edit.get(1).unwrap_or(&0),
            *edit.get(2).unwrap_or(&0),
            *edit.get(3).unwrap_or(&0),
        ];
        let name = names[file as usize % names.len()].clone();
        let Some(bytes) = files.get_mut(&name) else {
            continue;
        };
        let pos = ((a as usize) << 5 | (b as usize & 31)) % (bytes.len().max(1));
        match op % 8 {
            0 | 1 => {
                if let Some(x) = bytes.get_mut(pos) {
                    *x ^= 1 << (b % 8);
                }
            }
            2 => {
                if let Some(x) = bytes.get_mut(pos) {
                    *x = b;
                }
            }
            3 => bytes.truncate(pos),
            4 => bytes.extend(std::iter::repeat_n(b, a as usize)),
            5 => {
                files.remove(&name);
            }
            6 => {
                files.insert(format!("{:020}.wseg", a % 8), vec![b; (a as usize) * 16]);
            }
            _ => {
                let at = pos.min(bytes.len());
                bytes.splice(at..at, std::iter::repeat_n(b, 8));
            }
        }
    }
    let sim = SimStorage::new();
    for (name, bytes) in &files {
        sim.put_file(name, bytes);
    }
    let _ = crate::verify(&sim);
    let _ = crate::dump(&sim, |_, _, e| {
        for r in e.records() {
            std::hint::black_box(r.data);
        }
        Ok(())
    });
    for mode in [
        RecoveryMode::Strict,
        RecoveryMode::TolerateTornTail,
        RecoveryMode::TruncateAtCorruption,
    ] {
        let storage = sim.clone();
        match WalSink::open_with_storage(Arc::new(storage), fuzz_options().recovery_mode(mode)) {
            Ok((wal, report)) => {
                let _ = wal.restore(report.pending.last().copied());
                let _ = wal.deliver_ready(&mut MemorySink::new());
                let _ = wal.append(b"after");
                let _ = wal.checkpoint(report.next_checkpoint_id, b"");
            }
            Err(e) => {
                let _ = e.to_string();
            }
        }
    }
}

/// Fuzz target logic: the first 8 bytes are a seed, every further 3 bytes an [`Op`]; runs them
/// against the model. Returns the failure, if the log broke its contract.
pub fn check_ops(data: &[u8]) -> Result<(), SimFailure> {
    let mut seed = [0u8; 8];
    let n = data.len().min(8);
    seed[..n].copy_from_slice(&data[..n]);
    let ops: Vec<Op> = data
        .get(8..)
        .unwrap_or(&[])
        .chunks_exact(3)
        .take(400)
        .map(|c| Op::from_bytes([c[0], c[1], c[2]]))
        .collect();
    run_ops(u64::from_le_bytes(seed), &ops).map(|_| ())
}

/// Crashes one workload at every sync point in turn: a dry run counts the syncs the workload
/// issues, then for each `k` the workload runs again with the process killed at sync `k`
/// (that sync does not happen), followed by a power loss, recovery, the rest of the workload
/// and the final checks. Returns how many sync points were crashed at.
pub fn run_every_sync_point(seed: u64, ops: usize) -> Result<usize, SimFailure> {
    let mut rng = fastrand::Rng::with_seed(seed ^ 0x5151_5151);
    let list: Vec<Op> = (0..ops).map(|_| Op::random(&mut rng)).collect();
    let syncs = count_syncs(seed, &list)?;
    for k in 0..syncs {
        let mut with_kill = Vec::with_capacity(list.len() + 1);
        with_kill.push(Op::KillAtSyncAbsolute(k));
        with_kill.extend_from_slice(&list);
        run_ops(seed, &with_kill).map_err(|mut f| {
            f.message = format!("killed at sync point {k} of {syncs}: {}", f.message);
            f
        })?;
    }
    Ok(syncs as usize)
}

fn count_syncs(seed: u64, ops: &[Op]) -> Result<u64, SimFailure> {
    let counter = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let c = counter.clone();
    run_ops_observed(seed, ops, move |sim| {
        let s = sim.stats();
        c.store(
            s.data_syncs + s.dir_syncs,
            std::sync::atomic::Ordering::Relaxed,
        );
    })?;
    Ok(counter.load(std::sync::atomic::Ordering::Relaxed))
}
