//! The workload runner: drives one log through a list of [`Op`]s on a simulated disk and
//! checks every reopen and delivery against the [`Model`] of what the contract promises.

use super::workload::{crash_options, Op, RunStats, SimFailure};
use crate::storage::{CrashOptions, FaultOp, SimStorage};
use crate::{
    Epoch, EpochKey, ErrorKind, MemoryCommitStore, MemorySink, Options, RecoveryMode,
    RecoveryReport, RetryPolicy, Sink, SinkError, WalSink,
};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

/// Why an operation did not complete.
pub(super) enum Halt {
    /// The simulated process died (a kill armed by the workload): crash and recover.
    Died,
    /// An operation failed as a failure the workload injected makes it fail (a sync that
    /// was made to fail, or any write on the poisoned log after it): the workload goes on.
    Injected,
    /// The log broke its contract.
    Violation(SimFailure),
}

/// What the engine and the target know, independently of the log.
#[derive(Debug, Default)]
struct Model {
    /// Records and metadata of every epoch ever sealed, by id (the engine never reuses ids).
    epochs: BTreeMap<u64, (Vec<Vec<u8>>, Vec<u8>)>,
    /// Ids whose checkpoint returned Ok and that no completed restore voided.
    durable: BTreeSet<u64>,
    /// Ids that may or may not exist (their checkpoint or a voiding restore was cut short).
    maybe: BTreeSet<u64>,
    /// Records appended since the last checkpoint.
    open: Vec<Vec<u8>>,
    /// The engine's next checkpoint id; `None` once it used `u64::MAX`.
    next_id: Option<u64>,
    /// Highest id ever completed: the engine never restores below it.
    completed_ever: Option<u64>,
    /// Damage may have destroyed the barriers of ids up to this one (committed ones too), so
    /// the newest surviving checkpoint is checked only when it is above it.
    damaged_through: Option<u64>,
    counter: u64,
}

/// One epoch as the target holds it: checkpoint id and records.
type Batch = (u64, Vec<Vec<u8>>);

/// A sink that fails one delivery of a call, after the ones before it succeeded.
struct FailingSink {
    inner: Box<dyn Sink>,
    fail_at: Option<u8>,
    calls: u8,
}

impl Sink for FailingSink {
    fn deliver(&mut self, epoch: &Epoch) -> Result<(), SinkError> {
        let call = self.calls;
        self.calls = self.calls.saturating_add(1);
        if self.fail_at == Some(call) {
            return Err(SinkError::retryable("simulated target failure"));
        }
        self.inner.deliver(epoch)
    }
    fn stores_marker(&self) -> bool {
        self.inner.stores_marker()
    }
    fn is_committed(&mut self, key: &EpochKey) -> Result<bool, SinkError> {
        self.inner.is_committed(key)
    }
}

pub(super) struct Run {
    seed: u64,
    rng: fastrand::Rng,
    sim: SimStorage,
    opts: Options,
    sink: MemorySink,
    /// When set, epochs go to a [`DirSink`](crate::DirSink) on this disk of its own instead
    /// of `sink`: it loses what it did not make durable when the machine loses power.
    target: Option<SimStorage>,
    marker: bool,
    /// The commit store forgets everything at each restart (a fresh `MemoryCommitStore`).
    forgetful: bool,
    model: Model,
    wal: Option<WalSink>,
    step: usize,
    stats: RunStats,
    /// A sync failed: the log is poisoned until a reopen after a power loss.
    poisoned: bool,
    /// Index of the sink's first batch of each process lifetime: a sink without a marker may
    /// see an epoch again only in a later one.
    lifetimes: Vec<usize>,
    /// Ordering is checked from this batch on (reset by damage, which may bring back epochs
    /// a lost restore frame had voided).
    order_from: usize,
    /// Files set aside by lenient recovery, with their contents: never changed or removed.
    aside: BTreeMap<String, Vec<u8>>,
    /// Injected faults not yet hit when the current operation began.
    faults_before: usize,
    /// Highest checkpoint id any recovery reported as dropped: no later open may hand it out.
    dropped_ever: Option<u64>,
}

fn sim_options(rng: &mut fastrand::Rng) -> Options {
    Options::new("sim")
        .segment_size(rng.u64(4096..16384))
        .max_record_size(600)
        .max_metadata_size(64)
        .mark_every(rng.usize(1..=3))
        .recycle_segments(rng.bool())
        .retry(RetryPolicy::new(
            Duration::from_millis(1),
            Duration::from_millis(1),
        ))
        .write_buffer_size(rng.usize(64..4096))
        // Small chunks, so that epochs are read in several (frames cut at chunk ends).
        .read_chunk_size(rng.usize(1024..8192))
        .salt_seed(rng.u64(..))
}

impl Run {
    pub(super) fn new(seed: u64) -> Run {
        let mut rng = fastrand::Rng::with_seed(seed);
        let opts = sim_options(&mut rng);
        let marker = rng.bool();
        let forgetful = rng.u8(0..4) == 0;
        let target = (rng.u8(0..3) == 0).then(SimStorage::new);
        Run {
            seed,
            rng,
            sim: SimStorage::new(),
            opts,
            sink: if marker {
                MemorySink::with_marker()
            } else {
                MemorySink::new()
            },
            marker: marker || target.is_some(),
            target,
            forgetful,
            model: Model {
                next_id: Some(0),
                ..Default::default()
            },
            wal: None,
            step: 0,
            stats: RunStats::default(),
            poisoned: false,
            lifetimes: vec![0],
            order_from: 0,
            aside: BTreeMap::new(),
            faults_before: 0,
            dropped_ever: None,
        }
    }

    fn fail(&self, message: impl Into<String>) -> Halt {
        Halt::Violation(self.failure(message))
    }

    fn failure(&self, message: impl Into<String>) -> SimFailure {
        SimFailure {
            seed: self.seed,
            step: self.step,
            message: message.into(),
        }
    }

    fn wal(&self) -> &WalSink {
        self.wal.as_ref().expect("open log")
    }

    /// An error of the log: the process died, or a failure the workload injected (a fault
    /// hit during this operation, or a poisoned log), or a contract violation.
    fn error(&mut self, what: &str, e: crate::Error) -> Halt {
        if std::env::var("WALSINK_DEBUG").is_ok() {
            eprintln!("step {} {what}: {e}", self.step);
        }
        if self.sim.is_dead() {
            return Halt::Died;
        }
        if self.poisoned || self.injected() {
            self.poisoned |= self.wal.as_ref().is_some_and(|w| w.health().poisoned);
            return Halt::Injected;
        }
        self.fail(format!("{what} failed: {e}"))
    }

    /// True when an injected fault was hit during the current operation.
    fn injected(&self) -> bool {
        self.sim.pending_faults() < self.faults_before
    }

    fn open_wal(&self, mode: RecoveryMode) -> crate::Result<(WalSink, RecoveryReport)> {
        let storage = Arc::new(self.sim.clone());
        let opts = self.opts.clone().recovery_mode(mode);
        if self.forgetful {
            WalSink::open_with(storage, opts, Box::new(MemoryCommitStore::new()))
        } else {
            WalSink::open_with_storage(storage, opts)
        }
    }

    /// A new process lifetime begins (after a crash, or a restart that forgets marks).
    fn new_lifetime(&mut self) {
        let n = self.delivered().map_or(0, |d| d.len());
        self.lifetimes.push(n);
    }

    /// Reopens after a crash, cleanly, or after damage (`damaged`), and checks the recovered
    /// log against the model.
    fn reopen(&mut self, damaged: bool) -> Result<(), Halt> {
        self.wal = None;
        self.sim.clear_faults();
        self.poisoned = false;
        let (wal, report) = match self.open_wal(RecoveryMode::TolerateTornTail) {
            Ok(x) => x,
            Err(_) if self.sim.is_dead() => return Err(Halt::Died),
            Err(e) if damaged && matches!(e.kind(), ErrorKind::Corruption(_)) => {
                self.stats.lenient_recoveries += 1;
                match self.open_wal(RecoveryMode::TruncateAtCorruption) {
                    Ok(x) => x,
                    Err(_) if self.sim.is_dead() => return Err(Halt::Died),
                    Err(e2) => {
                        return Err(self.fail(format!(
                            "lenient recovery failed after damage: {e2} (default mode said: {e})"
                        )))
                    }
                }
            }
            Err(e) => {
                if std::env::var("WALSINK_DEBUG").is_ok() {
                    for (n, b) in self.sim.snapshot() {
                        eprintln!("  {n}: {} bytes, head {:?}", b.len(), &b[..b.len().min(24)]);
                    }
                }
                return Err(self.fail(format!("recovery failed on a crash image: {e}")));
            }
        };
        if std::env::var("WALSINK_DEBUG").is_ok() {
            eprintln!("step {} reopen: {report:?}", self.step);
        }
        self.check_report(&wal, &report, damaged)?;
        self.check_aside(&report)?;
        self.model.open.clear();
        self.model.next_id = match self.model.next_id {
            Some(n) => Some(n.max(report.next_checkpoint_id)),
            None => None,
        };
        self.stats.max_segments = self.stats.max_segments.max(report.segments as u64);
        self.wal = Some(wal);
        // The engine restores from its newest checkpoint, or one at least as new as the
        // newest completed one; on a first start (or by choice) it does not restore at all,
        // which leaves the new segment's header unsynced until the first checkpoint. After
        // damage it always restores: that voids epochs a lost restore frame had voided.
        if !damaged && self.rng.u8(0..4) == 0 {
            return Ok(());
        }
        let candidates = self.restore_candidates();
        let target = if candidates.is_empty() {
            self.model.durable.last().copied()
        } else {
            Some(candidates[self.rng.usize(..candidates.len())])
        };
        self.restore(target)
    }

    fn check_report(
        &mut self,
        wal: &WalSink,
        report: &RecoveryReport,
        damaged: bool,
    ) -> Result<(), Halt> {
        let committed = report.committed;
        let pending: BTreeSet<u64> = report.pending.iter().copied().collect();
        let is_committed = |id: u64| committed.is_some_and(|c| id <= c);
        if wal.health().committed != committed {
            return Err(self.fail(format!(
                "health shows committed {:?}, the report {committed:?}",
                wal.health().committed
            )));
        }
        let reported_damage = report.torn_tail.is_some() || report.corruption.is_some();
        let lost: Vec<u64> = self
            .model
            .durable
            .iter()
            .copied()
            .filter(|&id| !is_committed(id) && !pending.contains(&id))
            .collect();
        if !lost.is_empty() {
            if !damaged || !reported_damage {
                return Err(self.fail(format!(
                    "checkpoints {lost:?} returned Ok but are neither pending nor committed after recovery (pending {pending:?}, committed {committed:?}, report {report:?})"
                )));
            }
            for id in lost {
                self.model.durable.remove(&id);
            }
        }
        for &id in &pending {
            if !self.model.durable.contains(&id) && !self.model.maybe.contains(&id) {
                // Only damage that took a restore frame with it may bring a voided epoch back.
                if damaged && reported_damage && self.model.epochs.contains_key(&id) {
                    self.model.durable.insert(id);
                    continue;
                }
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
        // Ids are never reused: not those recovery saw, nor those it (or an earlier recovery)
        // dropped. New damage may destroy what recorded the earlier ones; then only this
        // recovery's count.
        let earlier = if damaged { None } else { self.dropped_ever };
        self.dropped_ever = report
            .checkpoints_dropped
            .iter()
            .copied()
            .chain(earlier)
            .max();
        let seen = report
            .checkpoints_dropped
            .iter()
            .chain(&report.pending)
            .chain(committed.iter())
            .chain(self.dropped_ever.iter())
            .copied()
            .max();
        if let Some(max) = seen {
            if max != u64::MAX && report.next_checkpoint_id <= max {
                return Err(self.fail(format!(
                    "next checkpoint id {} would reuse id {max} (report {report:?})",
                    report.next_checkpoint_id
                )));
            }
        }
        for id in &report.checkpoints_dropped {
            if pending.contains(id) {
                return Err(self.fail(format!("checkpoint {id} dropped and pending")));
            }
            self.model.durable.remove(id);
        }
        // Resolve the uncertain ids by what recovery found.
        let maybe = std::mem::take(&mut self.model.maybe);
        for id in maybe {
            if pending.contains(&id) || is_committed(id) {
                self.model.durable.insert(id);
            } else {
                self.model.durable.remove(&id);
            }
        }
        // The newest surviving checkpoint and its metadata (what an embedder resumes from).
        let newest = self.model.durable.last().copied();
        let beyond_damage = newest.is_none_or(|n| self.model.damaged_through.is_none_or(|d| n > d));
        if damaged {
            self.model.damaged_through = self.model.epochs.keys().next_back().copied();
        } else if beyond_damage {
            let got = report.last_checkpoint;
            let newest_known = newest.filter(|&id| pending.contains(&id) || is_committed(id));
            if got != newest_known {
                return Err(self.fail(format!(
                    "recovery reports newest checkpoint {got:?}, expected {newest_known:?} (report {report:?})"
                )));
            }
            if let Some(id) = newest_known {
                if report.last_metadata.as_deref() != Some(&self.model.epochs[&id].1[..]) {
                    return Err(self.fail(format!(
                        "checkpoint {id} reported with metadata {:?}, expected {:?}",
                        report.last_metadata, self.model.epochs[&id].1
                    )));
                }
            }
        }
        Ok(())
    }

    /// Files set aside earlier are unchanged; new ones are remembered.
    fn check_aside(&mut self, report: &RecoveryReport) -> Result<(), Halt> {
        let files = self.sim.snapshot();
        for (name, bytes) in &self.aside {
            if files.get(name) != Some(bytes) {
                return Err(self.fail(format!("set-aside file {name} was changed or removed")));
            }
        }
        for name in &report.moved_aside {
            if self.aside.contains_key(name) {
                return Err(self.fail(format!("set-aside name {name} used twice")));
            }
            match files.get(name) {
                Some(b) => {
                    self.aside.insert(name.clone(), b.clone());
                }
                None => return Err(self.fail(format!("set-aside file {name} is missing"))),
            }
        }
        Ok(())
    }

    /// Checkpoints the engine may restore from: durable, and not older than a completed one.
    fn restore_candidates(&self) -> Vec<u64> {
        let completed = self.model.completed_ever;
        let ok = |id: &u64| completed.is_none_or(|c| *id >= c);
        self.model.durable.iter().copied().filter(ok).collect()
    }

    fn restore(&mut self, target: Option<u64>) -> Result<(), Halt> {
        let voided: Vec<u64> = self
            .model
            .durable
            .iter()
            .copied()
            .filter(|&id| target.is_none_or(|t| id > t))
            .collect();
        let poisoned = self.poisoned;
        match self.wal().restore(target) {
            Ok(()) if poisoned => Err(self.fail("restore succeeded on a poisoned log")),
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
            Err(e) => {
                // Cut short: the restore may or may not be durable.
                if !poisoned {
                    self.model.maybe.extend(voided.iter().copied());
                    for id in voided {
                        self.model.durable.remove(&id);
                    }
                    self.model.open.clear();
                }
                Err(self.error("restore", e))
            }
        }
    }

    /// What the target holds: one batch per delivered epoch, in delivery order (the
    /// directory target: one per epoch file, in checkpoint order).
    fn delivered(&self) -> Result<Vec<Batch>, Halt> {
        let Some(target) = &self.target else {
            return Ok(self
                .sink
                .batches()
                .into_iter()
                .map(|(k, r)| (k.checkpoint, r))
                .collect());
        };
        let files = crate::DirSink::read_epochs_in(target)
            .map_err(|e| self.fail(format!("reading the target failed: {e}")))?;
        let mut out = Vec::new();
        for (name, records) in files {
            let Some(id) = name.get(..20).and_then(|d| d.parse().ok()) else {
                return Err(self.fail(format!("unexpected file {name} in the target")));
            };
            out.push((id, records));
        }
        Ok(out)
    }

    /// A fresh handle on the target for one delivery.
    fn target_sink(&self) -> Result<Box<dyn Sink>, Halt> {
        match &self.target {
            None => Ok(Box::new(self.sink.clone())),
            Some(t) => crate::DirSink::with_storage(Arc::new(t.clone()))
                .map(|s| Box::new(s) as Box<dyn Sink>)
                .map_err(|e| self.fail(format!("opening the target failed: {e}"))),
        }
    }

    fn check_sink(&self) -> Result<(), Halt> {
        let batches = self.delivered()?;
        let mut seen: BTreeMap<u64, usize> = BTreeMap::new();
        let mut last = None;
        for (i, (id, records)) in batches.iter().enumerate() {
            let id = *id;
            let Some(want) = self.model.epochs.get(&id) else {
                return Err(self.fail(format!(
                    "sink received checkpoint {id}, which was never sealed"
                )));
            };
            if records != &want.0 {
                if let (Ok(_), Some(t)) = (std::env::var("WALSINK_DEBUG"), &self.target) {
                    for (n, b) in t.snapshot() {
                        eprintln!("  target {n}: {} bytes", b.len());
                    }
                }
                return Err(self.fail(format!(
                    "sink received checkpoint {id} with {} records, expected {}",
                    records.len(),
                    want.0.len()
                )));
            }
            let lifetime = self.lifetimes.iter().rposition(|&start| start <= i);
            if let Some(&before) = seen.get(&id) {
                if self.marker {
                    return Err(self.fail(format!(
                        "checkpoint {id} delivered twice to a sink with its own marker"
                    )));
                }
                let earlier = self.lifetimes.iter().rposition(|&start| start <= before);
                if earlier == lifetime {
                    return Err(self.fail(format!(
                        "checkpoint {id} delivered twice without a crash or restart in between"
                    )));
                }
            }
            seen.insert(id, i);
            if i >= self.order_from {
                if self.marker && last.is_some_and(|l| l >= id) {
                    return Err(self.fail(format!("checkpoint {id} delivered after {last:?}")));
                }
                last = Some(id);
            }
        }
        Ok(())
    }

    /// Power loss after a failed sync (or a kill): the disk a restart sees.
    fn crash(&mut self, process_only: bool) {
        self.wal = None;
        let how = crash_options(process_only, self.poisoned, &mut self.rng);
        self.sim.crash(how);
        if let Some(t) = &self.target {
            // The same machine: the target's disk loses power (or its process dies) too.
            t.crash(CrashOptions {
                seed: self.rng.u64(..),
                ..how
            });
        }
        self.new_lifetime();
    }

    /// Runs one operation.
    fn op(&mut self, op: Op) -> Result<(), Halt> {
        if std::env::var("WALSINK_DEBUG").is_ok() {
            eprintln!("step {} {op:?}", self.step);
        }
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
                match res {
                    Ok(()) if self.poisoned => {
                        return Err(self.fail("append succeeded on a poisoned log"))
                    }
                    Ok(()) => self.model.open.extend(batch),
                    Err(e) => return Err(self.error("append", e)),
                }
            }
            Op::Checkpoint { skip, meta } => {
                let meta: Vec<u8> = (0..meta % 20).map(|_| self.rng.u8(..)).collect();
                let Some(id) = self
                    .model
                    .next_id
                    .and_then(|n| n.checked_add((skip % 3) as u64))
                else {
                    // The engine's ids are used up. If the log holds checkpoint u64::MAX it
                    // must refuse it again (if that checkpoint was lost, the id is free).
                    if !self.model.durable.contains(&u64::MAX) {
                        return Ok(());
                    }
                    return match self.wal().checkpoint(u64::MAX, &meta) {
                        Ok(()) => Err(self.fail("checkpoint u64::MAX accepted twice")),
                        Err(e) if matches!(e.kind(), ErrorKind::InvalidCheckpoint { .. }) => Ok(()),
                        Err(e) => Err(self.error("checkpoint", e)),
                    };
                };
                let poisoned = self.poisoned;
                let records = std::mem::take(&mut self.model.open);
                self.model.epochs.insert(id, (records, meta.clone()));
                self.model.next_id = id.checked_add(1);
                match self.wal().checkpoint(id, &meta) {
                    Ok(()) if poisoned => {
                        return Err(self.fail("checkpoint succeeded on a poisoned log"))
                    }
                    Ok(()) => {
                        self.model.durable.insert(id);
                        self.stats.checkpoints += 1;
                    }
                    Err(e) => {
                        if !poisoned {
                            self.model.maybe.insert(id);
                        }
                        return Err(self.error("checkpoint", e));
                    }
                }
            }
            Op::Complete { older } => {
                if let Some(&id) = self.model.durable.iter().next_back() {
                    let id = if older { id.saturating_sub(1) } else { id };
                    if self.model.durable.contains(&id) {
                        if let Err(e) = self.wal().checkpoint_complete(id) {
                            return Err(self.error("complete", e));
                        }
                        self.model.completed_ever =
                            Some(self.model.completed_ever.map_or(id, |c| c.max(id)));
                    }
                }
            }
            Op::Deliver { fail_at } => {
                let before = self.target.as_ref().map_or(0, |t| t.pending_faults());
                let inner = match self.target_sink() {
                    Ok(s) => s,
                    // The target's own injected failure (syncing away leftovers): no delivery.
                    Err(_)
                        if self
                            .target
                            .as_ref()
                            .is_some_and(|t| t.pending_faults() < before) =>
                    {
                        return Ok(())
                    }
                    Err(h) => return Err(h),
                };
                let mut sink = FailingSink {
                    inner,
                    fail_at: fail_at.map(|k| k % 4),
                    calls: 0,
                };
                let res = self.wal().deliver_ready(&mut sink);
                match res {
                    Ok(n) => {
                        let h = self.wal().health();
                        if n > 0 && (h.last_error.is_some() || h.retries != 0) {
                            return Err(self.fail(format!(
                                "delivery succeeded but health still shows an error: {h:?}"
                            )));
                        }
                    }
                    Err(e) if matches!(e.kind(), ErrorKind::Sink(_)) && !self.sim.is_dead() => {}
                    Err(e) => match self.error("deliver", e) {
                        Halt::Injected => {}
                        h => return Err(h),
                    },
                }
                self.check_sink()?;
            }
            Op::Restore => {
                if let Some(&t) = self.restore_candidates().first() {
                    self.restore(Some(t))?;
                }
            }
            Op::Reopen => {
                // Clean reopen: the unsealed tail goes, like after a crash. After a failed
                // sync nothing since the last good sync is known durable: power loss first.
                self.model.open.clear();
                if self.poisoned {
                    self.crash(false);
                } else {
                    self.wal = None;
                    self.new_lifetime();
                }
                self.reopen(false)?;
            }
            Op::KillAtSync(n) => self.sim.kill_at_sync((n % 6) as u64),
            Op::KillAfter(n) => self.sim.kill_after((n % 40) as u64),
            Op::KillAtSyncAbsolute(n) => self.sim.kill_at_sync(n),
            Op::FailSync(n) => {
                let op = if n % 2 == 0 {
                    FaultOp::SyncData
                } else {
                    FaultOp::SyncDir
                };
                let nth = ((n / 4) % 3) as u64;
                match &self.target {
                    // A sync of the target fails: the sink reports an error, and whatever it
                    // left (a renamed file whose name is not durable) must not count yet.
                    Some(t) if (n / 2) % 2 == 1 => {
                        t.inject_fault(op, nth, std::io::ErrorKind::Other)
                    }
                    _ => self.sim.inject_fault(op, nth, std::io::ErrorKind::Other),
                }
                self.stats.failed_syncs += 1;
            }
            Op::Damage { kind, at } => {
                self.model.open.clear();
                self.crash(false);
                if self.damage(kind, at) {
                    self.stats.damages += 1;
                    self.order_from = self.delivered()?.len();
                }
                self.reopen(true)?;
            }
            Op::JumpIds(n) => {
                let to = u64::MAX - (n % 3) as u64;
                self.model.next_id = self.model.next_id.map(|id| id.max(to));
            }
        }
        Ok(())
    }

    /// Damages the (crashed) disk; returns false when there was nothing to damage.
    fn damage(&mut self, kind: u8, at: u16) -> bool {
        let files = self.sim.snapshot();
        let segs: Vec<&String> = files
            .keys()
            .filter(|n| crate::log::format::parse_numbered(n, "wseg").is_some())
            .collect();
        let Some(&newest) = segs.last() else {
            return false;
        };
        let header = crate::log::format::SEGMENT_HEADER_LEN;
        let at = at as usize;
        if kind % 6 == 4 {
            // The newest segment is gone altogether.
            use crate::storage::Storage;
            let gone = self.sim.remove(newest).and_then(|_| self.sim.sync_dir());
            return gone.is_ok();
        }
        let (name, mut bytes) = match kind % 6 {
            0 => {
                let mut b = files[newest].clone();
                let n = b.len().min(header);
                b[..n].fill(0);
                (newest.clone(), b)
            }
            1 => (newest.clone(), Vec::new()),
            2 => {
                let name = segs[at % segs.len()].clone();
                let mut b = files[&name].clone();
                if b.len() >= header {
                    b[(at / 7) % header] ^= 1 << (at % 8);
                }
                (name, b)
            }
            5 => {
                // The newest segment cut short: at an 8-aligned offset (often a frame's end)
                // or anywhere.
                let mut b = files[newest].clone();
                let end = b.iter().rposition(|&x| x != 0).map_or(0, |i| i + 1);
                let cut = at % (end + 1);
                b.truncate(if at.is_multiple_of(2) { cut & !7 } else { cut });
                (newest.clone(), b)
            }
            _ => {
                let name = segs[at % segs.len()].clone();
                let b = files[&name].clone();
                (name, b)
            }
        };
        if kind % 6 == 3 {
            let end = bytes.iter().rposition(|&x| x != 0).map_or(0, |i| i + 1);
            if end <= header {
                return false;
            }
            let i = header + self.rng.usize(..end - header);
            bytes[i] ^= 1 << self.rng.u8(0..8);
        }
        self.sim.put_file(&name, &bytes);
        true
    }

    /// Runs `ops`, then the final checks: no more faults, everything completed and delivered,
    /// every durable epoch arrived, and a strict reopen finds nothing to repair. `observe` sees
    /// the disk after the workload, before the final reopen.
    pub(super) fn execute(
        mut self,
        ops: &[Op],
        observe: impl FnOnce(&SimStorage),
    ) -> Result<RunStats, SimFailure> {
        self.settle(|r| r.reopen(false))?;
        for &op in ops {
            self.step += 1;
            self.settle(|r| r.op(op))?;
            self.stats.ops += 1;
        }
        observe(&self.sim);
        let poisoned = self.poisoned;
        self.crash(!poisoned);
        self.poisoned = false;
        self.settle(|r| r.reopen(false))?;
        if let Some(&last) = self.model.durable.iter().next_back() {
            self.wal()
                .checkpoint_complete(last)
                .map_err(|e| self.failure(format!("complete: {e}")))?;
        }
        let mut sink = self.target_sink().map_err(|h| self.halt_failure(h))?;
        self.wal()
            .deliver_ready(&mut sink)
            .map_err(|e| self.failure(format!("final delivery failed: {e}")))?;
        self.check_sink().map_err(|h| self.halt_failure(h))?;
        let delivered = self.delivered().map_err(|h| self.halt_failure(h))?;
        let got: BTreeSet<u64> = delivered.iter().map(|(id, _)| *id).collect();
        let committed = self.wal().health().committed;
        for &id in &self.model.durable {
            if !got.contains(&id) && !self.model.epochs[&id].0.is_empty() {
                return Err(self.failure(format!(
                    "checkpoint {id} was durable but never delivered (committed {committed:?})"
                )));
            }
        }
        let h = self.wal().health();
        if h.backlog_epochs != 0 {
            return Err(self.failure(format!("backlog left after final delivery: {h:?}")));
        }
        // Strict recovery of a cleanly closed log finds nothing to repair.
        self.wal = None;
        let storage = Arc::new(self.sim.clone());
        let strict = self.opts.clone().recovery_mode(RecoveryMode::Strict);
        let reopened = if self.forgetful {
            WalSink::open_with(storage, strict, Box::new(MemoryCommitStore::new()))
        } else {
            WalSink::open_with_storage(storage, strict)
        };
        reopened.map_err(|e| self.failure(format!("strict reopen: {e}")))?;
        self.stats.delivered = delivered.len();
        Ok(self.stats)
    }

    fn halt_failure(&self, h: Halt) -> SimFailure {
        match h {
            Halt::Died => self.failure("the process died with no kill armed"),
            Halt::Injected => self.failure("an injected failure after the workload ended"),
            Halt::Violation(f) => f,
        }
    }

    /// Runs `f`; when the process dies (or an injected failure poisons the log and the
    /// workload decides to restart), crashes and recovers until recovery succeeds.
    fn settle(&mut self, f: impl FnOnce(&mut Run) -> Result<(), Halt>) -> Result<(), SimFailure> {
        self.faults_before = self.sim.pending_faults();
        match f(self) {
            Ok(()) => Ok(()),
            Err(Halt::Injected) => Ok(()),
            Err(Halt::Violation(v)) => Err(v),
            Err(Halt::Died) => {
                self.stats.crashes += 1;
                let process_only = self.rng.u8(0..4) == 0;
                self.crash(process_only);
                // Recovery itself may be killed again; the next attempt must still succeed.
                loop {
                    match self.reopen(false) {
                        Ok(()) => return Ok(()),
                        Err(Halt::Died) => {
                            self.stats.crashes += 1;
                            self.crash(false);
                        }
                        Err(Halt::Injected) => return Ok(()),
                        Err(Halt::Violation(v)) => return Err(v),
                    }
                }
            }
        }
    }
}

impl From<SimFailure> for Halt {
    fn from(f: SimFailure) -> Self {
        Halt::Violation(f)
    }
}
