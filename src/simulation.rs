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
        let candidates: Vec<u64> = self
            .model
            .durable
            .iter()
            .copied()
            .filter(|&id| self.model.completed_ever.is_none_or(|c| id >= c))
            .collect();
        let target = if candidates.is_empty() {
            self.model.durable.last().copied()
        } else {
            Some(candidates[self.rng.usize(..candidates.len())])
        };
        self.restore(target)
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
    fn op(&mut self) -> Result<(), SimFailure> {
        if std::env::var("WALSINK_DEBUG").is_ok() {
            eprintln!(
                "step {} files {:?}",
                self.step,
                self.sim
                    .snapshot()
                    .iter()
                    .map(|(n, d)| (n.clone(), d.len()))
                    .collect::<Vec<_>>()
            );
        }
        let dead = |r: &Run, what: &str, e: crate::Error| {
            if r.sim.is_dead() {
                r.fail("dead")
            } else {
                r.fail(format!("{what} failed: {e}"))
            }
        };
        match self.rng.u8(0..100) {
            0..=49 => {
                let n = self.rng.usize(1..=4);
                let mut batch = Vec::new();
                for _ in 0..n {
                    self.model.counter += 1;
                    let pad = self.rng.usize(0..400);
                    let mut r = format!("{}:{}:", self.seed, self.model.counter).into_bytes();
                    r.resize(r.len() + pad, b'a' + (self.model.counter % 26) as u8);
                    batch.push(r);
                }
                let res = self.wal().append_batch(batch.iter().map(|r| r.as_slice()));
                res.map_err(|e| dead(self, "append", e))?;
                self.model.open.extend(batch);
            }
            50..=64 => {
                let id = self.model.next_id + self.rng.u64(0..3);
                let meta: Vec<u8> = (0..self.rng.usize(0..20))
                    .map(|_| self.rng.u8(..))
                    .collect();
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
            65..=76 => {
                if let Some(&id) = self.model.durable.iter().next_back() {
                    let id = if self.rng.u8(0..4) == 0 {
                        id.saturating_sub(1)
                    } else {
                        id
                    };
                    if self.model.durable.contains(&id) {
                        self.wal()
                            .checkpoint_complete(id)
                            .map_err(|e| dead(self, "complete", e))?;
                        self.model.completed_ever =
                            Some(self.model.completed_ever.map_or(id, |c| c.max(id)));
                    }
                }
            }
            77..=90 => {
                if self.rng.u8(0..5) == 0 {
                    self.sink.fail_next(1);
                }
                let mut sink = self.sink.clone();
                match self.wal().deliver_ready(&mut sink) {
                    Ok(_) => {}
                    Err(e) if self.sim.is_dead() => return Err(dead(self, "deliver", e)),
                    Err(e) if matches!(e.kind(), crate::ErrorKind::Sink(_)) => {}
                    Err(e) => return Err(self.fail(format!("delivery failed: {e}"))),
                }
                self.sink.fail_next(0);
                self.check_sink()?;
            }
            91..=94 => {
                let candidates: Vec<u64> = self
                    .model
                    .durable
                    .iter()
                    .copied()
                    .filter(|&id| self.model.completed_ever.is_none_or(|c| id >= c))
                    .collect();
                if let Some(&t) = candidates.first() {
                    self.restore(Some(t))?;
                }
            }
            _ => {
                // Clean reopen: the unsealed tail goes, like after a crash.
                self.model.open.clear();
                self.reopen()?;
            }
        }
        Ok(())
    }
}

/// Runs seed `seed` with `ops` operations and up to `crashes` simulated crashes.
pub fn run(seed: u64, ops: usize, crashes: usize) -> Result<SimStats, SimFailure> {
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
    let mut crashes_left = crashes;
    let mut armed = false;
    while r.step < ops {
        r.step += 1;
        if !armed && crashes_left > 0 && r.rng.u8(0..8) == 0 {
            if r.rng.bool() {
                r.sim.kill_at_sync(r.rng.u64(0..6));
            } else {
                r.sim.kill_after(r.rng.u64(0..40));
            }
            armed = true;
        }
        match r.op() {
            Ok(()) => {}
            Err(f) if f.message == "dead" => {
                armed = false;
                crashes_left -= 1;
                r.stats.crashes += 1;
                r.wal = None;
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
    r.sim.kill_at_sync(u64::MAX);
    r.sim.crash(CrashOptions::process_kill());
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
