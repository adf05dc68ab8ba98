//! Durable-buffer mode ([`Mode::Durable`]) under the simulator: every append that returned
//! `Ok` (through any of the four ways to append) must reach the sink exactly once and in
//! order, whatever kills, failed syncs, power losses and restarts come between; an append
//! cut short may arrive or not, but never twice and never out of order.
//!
//! The model is per record: each record carries a counter, records are written in counter
//! order, and a sync that returned `Ok` makes every record written before it durable.

use super::workload::{crash_options, RunStats, SimFailure};
use crate::storage::{CrashOptions, FaultOp, SimStorage};
use crate::{DurablePoint, MemorySink, Mode, Options, WalSink};
use std::collections::BTreeSet;
use std::sync::Arc;

/// Runs durable-mode seed `seed` for `ops` random operations, then recovers cleanly and
/// checks that every acknowledged record was delivered.
pub fn run_durable(seed: u64, ops: usize) -> Result<RunStats, SimFailure> {
    let mut run = DurableRun::new(seed);
    run.reopen()?;
    for step in 0..ops {
        run.step = step;
        run.op()?;
    }
    run.step = ops;
    run.finish()?;
    Ok(run.stats)
}

struct DurableRun {
    seed: u64,
    rng: fastrand::Rng,
    sim: SimStorage,
    opts: Options,
    sink: MemorySink,
    wal: Option<WalSink>,
    step: usize,
    stats: RunStats,
    counter: u64,
    /// Records whose append (or a later sync) returned `Ok`: durable.
    acked: BTreeSet<u64>,
    /// Records written in this process lifetime and not known durable yet, in write order.
    written: Vec<u64>,
    /// Records written before a crash without being acknowledged: may or may not arrive.
    maybe: BTreeSet<u64>,
    /// Points returned by the two-step appends, with the last record each covers.
    points: Vec<(DurablePoint, u64)>,
    poisoned: bool,
    faults_before: usize,
}

impl DurableRun {
    fn new(seed: u64) -> Self {
        let mut rng = fastrand::Rng::with_seed(seed ^ 0x5851_f42d_4c95_7f2d);
        let opts = Options::new("sim-durable")
            .mode(Mode::Durable)
            .segment_size(rng.u64(4096..32768))
            .max_record_size(600)
            .max_metadata_size(64)
            .recycle_segments(rng.bool())
            .write_buffer_size(rng.usize(64..4096))
            .read_chunk_size(rng.usize(1024..8192))
            .salt_seed(rng.u64(..));
        DurableRun {
            seed,
            rng,
            sim: SimStorage::new(),
            opts,
            sink: MemorySink::with_marker(),
            wal: None,
            step: 0,
            stats: RunStats::default(),
            counter: 0,
            acked: BTreeSet::new(),
            written: Vec::new(),
            maybe: BTreeSet::new(),
            points: Vec::new(),
            poisoned: false,
            faults_before: 0,
        }
    }

    fn fail(&self, message: impl Into<String>) -> SimFailure {
        SimFailure {
            seed: self.seed,
            step: self.step,
            message: format!("durable mode: {}", message.into()),
        }
    }

    fn wal(&self) -> &WalSink {
        self.wal.as_ref().expect("open log")
    }

    fn records(&mut self, count: u8, pad: u16) -> Vec<Vec<u8>> {
        (0..count.clamp(1, 4))
            .map(|_| {
                self.counter += 1;
                let mut r = format!("{}:{}:", self.seed, self.counter).into_bytes();
                r.resize(
                    r.len() + pad as usize % 400,
                    b'a' + (self.counter % 26) as u8,
                );
                r
            })
            .collect()
    }

    /// Every record written so far is durable.
    fn all_durable(&mut self) {
        self.acked.extend(self.written.drain(..));
        self.points.clear();
    }

    /// Records written up to `last` are durable.
    fn durable_through(&mut self, last: u64) {
        let n = self.written.iter().take_while(|&&c| c <= last).count();
        self.acked.extend(self.written.drain(..n));
        self.points.retain(|&(_, l)| l > last);
    }

    /// An operation failed: the process died (crash and recover), a failure the workload
    /// injected (the log is poisoned from now on), or a contract violation.
    fn error(&mut self, what: &str, e: crate::Error) -> Result<(), SimFailure> {
        if self.sim.is_dead() {
            return self.crash(false);
        }
        let injected = self.sim.pending_faults() < self.faults_before;
        if self.poisoned || injected {
            // A failed sync of the log poisons it; one in delivery (the commit store, freeing
            // segments) does not.
            self.poisoned |= self.wal.as_ref().is_some_and(|w| w.health().poisoned);
            return Ok(());
        }
        Err(self.fail(format!("{what} failed: {e}")))
    }

    /// The result of an append that syncs: `Ok` makes everything written durable.
    fn synced(&mut self, what: &str, res: crate::Result<()>) -> Result<(), SimFailure> {
        match res {
            Ok(()) if self.poisoned => {
                Err(self.fail(format!("{what} succeeded on a poisoned log")))
            }
            Ok(()) => {
                self.all_durable();
                Ok(())
            }
            Err(e) => self.error(what, e),
        }
    }

    fn op(&mut self) -> Result<(), SimFailure> {
        self.faults_before = self.sim.pending_faults();
        match self.rng.u8(0..100) {
            0..=44 => {
                let (count, pad) = (self.rng.u8(1..=4), self.rng.u16(..));
                let batch = self.records(count, pad);
                let refs: Vec<&[u8]> = batch.iter().map(|r| r.as_slice()).collect();
                let last = self.counter;
                let first = last + 1 - refs.len() as u64;
                match self.rng.u8(0..4) {
                    0 => {
                        self.written.extend(first..=last);
                        let res = refs.iter().try_for_each(|r| self.wal().append(r));
                        self.synced("append", res)?;
                    }
                    1 => {
                        self.written.extend(first..=last);
                        let res = self.wal().append_batch(refs.iter().copied());
                        self.synced("append_batch", res)?;
                    }
                    kind => {
                        let res = match kind {
                            2 => match self.wal().try_append_batch(&refs) {
                                Ok(None) => self.wal().append_batch_unsynced(&refs),
                                Ok(Some(p)) => Ok(p),
                                Err(e) => Err(e),
                            },
                            _ => self.wal().append_batch_unsynced(&refs),
                        };
                        self.written.extend(first..=last);
                        match res {
                            Ok(_) if self.poisoned => {
                                return Err(
                                    self.fail("an unsynced append succeeded on a poisoned log")
                                )
                            }
                            Ok(p) => self.points.push((p, last)),
                            Err(e) => self.error("append_batch_unsynced", e)?,
                        }
                    }
                }
            }
            45..=54 => {
                if self.points.is_empty() {
                    return Ok(());
                }
                let i = if self.rng.bool() {
                    0
                } else {
                    self.points.len() - 1
                };
                let (point, last) = self.points[i];
                match self.wal().make_durable(point) {
                    Ok(()) if self.poisoned => {
                        return Err(self.fail("make_durable succeeded on a poisoned log"))
                    }
                    Ok(()) => self.durable_through(last),
                    Err(e) => self.error("make_durable", e)?,
                }
            }
            55..=71 => {
                let failing = self.rng.u8(0..4) == 0;
                if failing {
                    self.sink.fail_next(1);
                }
                let res = self.wal().deliver_ready(&mut self.sink.clone());
                self.sink.fail_next(0);
                self.check_sink()?;
                match res {
                    Ok(_) if !failing => self.check_complete()?,
                    Ok(_) => {}
                    Err(e) if matches!(e.kind(), crate::ErrorKind::Sink(_)) => {}
                    Err(e) => self.error("deliver", e)?,
                }
            }
            72..=77 => return self.crash(true),
            78..=85 => self.sim.kill_at_sync(self.rng.u64(0..4)),
            86..=91 => self.sim.kill_after(self.rng.u64(0..30)),
            92..=95 => {
                let op = if self.rng.bool() {
                    FaultOp::SyncData
                } else {
                    FaultOp::SyncDir
                };
                self.sim
                    .inject_fault(op, self.rng.u64(0..3), std::io::ErrorKind::Other);
                self.stats.failed_syncs += 1;
            }
            _ => return self.crash(false),
        }
        if self.poisoned && self.rng.u8(0..3) == 0 {
            // After a failed sync nothing since the last good one is known durable.
            return self.crash(false);
        }
        Ok(())
    }

    /// The process dies (`process_only`: the machine stays up; never after a failed sync)
    /// or the machine loses power, and the log is opened again.
    fn crash(&mut self, process_only: bool) -> Result<(), SimFailure> {
        self.wal = None;
        let how = crash_options(process_only, self.poisoned, &mut self.rng);
        self.sim.crash(how);
        self.stats.crashes += 1;
        self.maybe.extend(self.written.drain(..));
        self.points.clear();
        self.reopen()
    }

    fn reopen(&mut self) -> Result<(), SimFailure> {
        self.sim.clear_faults();
        self.poisoned = false;
        // A log may be opened again with another segment size: recycled files are then
        // shorter or longer than the segments they become.
        if self.rng.u8(..4) == 0 {
            self.opts = self.opts.clone().segment_size(self.rng.u64(4096..32768));
        }
        loop {
            match WalSink::open_with_storage(Arc::new(self.sim.clone()), self.opts.clone()) {
                Ok((wal, _)) => {
                    self.wal = Some(wal);
                    return Ok(());
                }
                Err(_) if self.sim.is_dead() => {
                    self.sim.crash(CrashOptions::power_loss(self.rng.u64(..)));
                    self.stats.crashes += 1;
                }
                Err(e) => return Err(self.fail(format!("recovery failed on a crash image: {e}"))),
            }
        }
    }

    fn counter_of(&self, r: &[u8]) -> Result<u64, SimFailure> {
        std::str::from_utf8(r)
            .ok()
            .and_then(|s| s.split(':').nth(1))
            .and_then(|c| c.parse().ok())
            .ok_or_else(|| self.fail(format!("the sink holds a record never appended: {r:?}")))
    }

    /// Everything delivered was appended, arrived once, and in order.
    fn check_sink(&mut self) -> Result<(), SimFailure> {
        let mut last = 0;
        let records = self.sink.records();
        for r in &records {
            let c = self.counter_of(r)?;
            if c <= last {
                return Err(self.fail(format!(
                    "record {c} delivered after record {last}: a duplicate or out of order"
                )));
            }
            if !self.acked.contains(&c) && !self.maybe.contains(&c) && !self.written.contains(&c) {
                return Err(self.fail(format!("record {c} delivered but never appended")));
            }
            last = c;
        }
        self.stats.delivered = self.sink.batches().len();
        Ok(())
    }

    /// After a delivery that succeeded, every acknowledged record has arrived.
    fn check_complete(&self) -> Result<(), SimFailure> {
        let got: BTreeSet<u64> = self
            .sink
            .records()
            .iter()
            .map(|r| self.counter_of(r))
            .collect::<Result<_, _>>()?;
        if let Some(missing) = self.acked.iter().find(|c| !got.contains(c)) {
            return Err(self.fail(format!(
                "record {missing} was acknowledged as durable but is not delivered ({} acknowledged, {} delivered)",
                self.acked.len(),
                got.len()
            )));
        }
        Ok(())
    }

    /// A clean restart and a delivery: nothing acknowledged may be missing.
    fn finish(&mut self) -> Result<(), SimFailure> {
        self.wal = None;
        self.sim.crash(CrashOptions::process_kill());
        self.maybe.extend(self.written.drain(..));
        self.reopen()?;
        if let Err(e) = self.wal().deliver_ready(&mut self.sink.clone()) {
            return Err(self.fail(format!("the final delivery failed: {e}")));
        }
        self.check_sink()?;
        self.check_complete()?;
        self.stats.acknowledged = self.acked.len();
        self.stats.durable_writes = self.sim.stats().durable_writes;
        Ok(())
    }
}
