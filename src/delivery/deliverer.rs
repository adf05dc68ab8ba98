//! [`Deliverer`]: the delivery protocol of `docs/design.md` ("Delivery") as steps a driver
//! takes, so that every driver (the committer thread, `deliver_ready`, an async runtime)
//! runs the same protocol and only the calls into the sink differ.
//!
//! Per epoch: [`Deliverer::next_step`] marks what is due and skips what the commit store already
//! holds; the driver asks a marker-keeping sink whether it has the epoch
//! ([`Deliverer::skip_committed`] if so), reads it ([`Deliverer::read`]), hands it to the
//! sink and reports the outcome ([`Deliverer::finish`]). An error stops at that epoch; the
//! next `next_step` offers the same epoch again, so nothing is ever skipped.

use crate::delivery::log::{Delivery, DeliveryLog};
use crate::delivery::sink::Skip;
use crate::error::{Error, ErrorKind, Result};
use crate::{Epoch, EpochKey, SinkError, SinkErrorClass};
use std::sync::Arc;
use std::time::Duration;

/// Named failpoints, compiled in with the `failpoints` feature: a test arms one with
/// [`fail::arm`] and the committer returns an injected error when it passes it.
#[cfg(feature = "failpoints")]
pub mod fail {
    use parking_lot::Mutex;
    static ARMED: Mutex<Vec<&'static str>> = Mutex::new(Vec::new());

    /// Arms failpoint `name` for one hit. Names: `committer::deliver::after` (after the sink
    /// accepted an epoch, before it is marked), `committer::mark::after` (after the mark,
    /// before segments are freed).
    pub fn arm(name: &'static str) {
        ARMED.lock().push(name);
    }

    pub(crate) fn hit(name: &str) -> bool {
        let mut armed = ARMED.lock();
        match armed.iter().position(|n| *n == name) {
            Some(i) => {
                armed.remove(i);
                true
            }
            None => false,
        }
    }
}

fn failpoint(_name: &str) -> Result<()> {
    #[cfg(feature = "failpoints")]
    if fail::hit(_name) {
        return Err(Error::io(
            format!("failpoint {_name}"),
            std::io::Error::other("injected"),
        ));
    }
    Ok(())
}

/// What a driver does next; see [`Deliverer::next_step`].
#[derive(Debug)]
pub enum Next {
    /// Nothing is deliverable now.
    Idle,
    /// The commit store already covers this checkpoint (a crash after marking, before
    /// clean-up): nothing was sent, go on.
    Committed(u64),
    /// This epoch is due: ask a marker-keeping sink about it, else read and deliver it.
    Deliver(Pending),
}

/// An epoch that is due for delivery; see [`Next::Deliver`].
#[derive(Debug)]
pub struct Pending {
    info: crate::delivery::catalog::EpochInfo,
    key: EpochKey,
}

impl Pending {
    /// Sink id, subtask and checkpoint id of the epoch.
    pub fn key(&self) -> &EpochKey {
        &self.key
    }

    /// The checkpoint id.
    pub fn checkpoint(&self) -> u64 {
        self.info.id
    }

    /// Number of records.
    pub fn records(&self) -> u64 {
        self.info.records
    }

    /// Payload bytes.
    pub fn bytes(&self) -> u64 {
        self.info.bytes
    }
}

/// Epochs smaller than this are not read ahead: reading one costs less than handing the read
/// to another thread.
pub const READ_AHEAD_MIN_BYTES: u64 = 256 << 10;

/// The read of one epoch ahead of its turn; from [`Deliverer::read_ahead`]. A log has at
/// most one at a time, with the epoch it read, until that epoch is taken by
/// [`Deliverer::read_or_take`] or dropped.
#[derive(Debug)]
pub struct ReadAhead {
    slot: AheadSlot,
    info: crate::delivery::catalog::EpochInfo,
}

impl ReadAhead {
    /// The checkpoint id of the epoch it reads.
    pub fn checkpoint(&self) -> u64 {
        self.info.id
    }

    /// Reads the epoch (I/O, blocking), as [`Deliverer::read`] would: an epoch within one
    /// read chunk is read and verified whole; a larger one is read as the sink iterates it,
    /// so reading it ahead reads nothing yet.
    pub fn read(self) -> ReadAheadEpoch {
        let epoch = self.slot.0.read_epoch(&self.info);
        ReadAheadEpoch {
            slot: self.slot,
            info: self.info,
            epoch,
        }
    }
}

/// An epoch read ahead of its turn, for [`Deliverer::read_or_take`].
#[derive(Debug)]
pub struct ReadAheadEpoch {
    slot: AheadSlot,
    info: crate::delivery::catalog::EpochInfo,
    epoch: Result<Epoch>,
}

impl ReadAheadEpoch {
    /// The checkpoint id of the epoch it holds.
    pub fn checkpoint(&self) -> u64 {
        self.info.id
    }
}

/// The log's one place for an epoch read ahead, held from [`Deliverer::read_ahead`] until
/// the epoch is taken or dropped.
#[derive(Debug)]
struct AheadSlot(Arc<dyn DeliveryLog>);

impl AheadSlot {
    fn take(log: &Arc<dyn DeliveryLog>) -> Option<AheadSlot> {
        log.state().try_read_ahead().then(|| AheadSlot(log.clone()))
    }
}

impl Drop for AheadSlot {
    fn drop(&mut self) {
        self.0.state().release_read_ahead();
    }
}

/// Whether `a` and `b` are the same log (the data pointers, whatever the vtables).
fn same_log(a: &Arc<dyn DeliveryLog>, b: &Arc<dyn DeliveryLog>) -> bool {
    std::ptr::addr_eq(Arc::as_ptr(a), Arc::as_ptr(b))
}

/// The right to deliver one log's epochs, with the protocol as steps; from
/// [`WalSink::deliverer`](crate::WalSink::deliverer).
///
/// One deliverer exists per log at a time (a committer thread and `deliver_ready` take one
/// too). Dropping it gives the right back; epochs it delivered but did not mark stay known to
/// the log, so the next deliverer marks them instead of sending them again. Methods that do
/// I/O say so; async drivers run them off the runtime.
#[derive(Debug)]
pub struct Deliverer {
    shared: Arc<dyn DeliveryLog>,
    d: Delivery,
}

impl Deliverer {
    pub(crate) fn claim(shared: Arc<dyn DeliveryLog>) -> Result<Deliverer> {
        if !shared.state().try_claim() {
            return Err(Error::invalid_op(
                "another deliverer (a committer, deliver_ready or an async driver) is delivering this log",
            ));
        }
        let d = std::mem::take(&mut *shared.state().progress());
        Ok(Deliverer { shared, d })
    }

    /// The next step (I/O: may mark and free segments, and reads the commit store). Marks
    /// the epochs delivered so far when nothing more is due, or every
    /// [`Options::mark_every`](crate::Options::mark_every) epochs.
    pub fn next_step(&mut self) -> Result<Next> {
        let next = self.shared.next_deliverable(self.d.delivered);
        if let Some(done) = self.due_mark(next.is_none()) {
            self.mark(done)?;
        }
        self.step_to(next)
    }

    /// [`Deliverer::next_step`], except that a mark that is due while a large epoch
    /// (at least [`READ_AHEAD_MIN_BYTES`]) comes next is not made here but handed back, for
    /// the driver to run ([`DueMark::run`], I/O) while the sink takes that epoch, and to
    /// report with [`Deliverer::marked`] before the step ends. Until then the epochs it covers
    /// count as delivered and not marked, as after a failed mark: a later step or
    /// [`Deliverer::flush`] marks them if it is never reported.
    pub fn next_step_deferring_mark(&mut self) -> Result<(Next, Option<DueMark>)> {
        let next = self.shared.next_deliverable(self.d.delivered);
        let Some(done) = self.due_mark(next.is_none()) else {
            return Ok((self.step_to(next)?, None));
        };
        if next.as_ref().is_none_or(|e| e.bytes < READ_AHEAD_MIN_BYTES) {
            self.mark(done)?;
            return Ok((self.step_to(next)?, None));
        }
        let due = DueMark {
            shared: self.shared.clone(),
            id: done,
            covers: self.d.unmarked,
        };
        match self.step_to(next)? {
            Next::Deliver(p) => Ok((Next::Deliver(p), Some(due))),
            other => {
                self.mark_now(due)?;
                Ok((other, None))
            }
        }
    }

    /// Reports a mark from [`Deliverer::next_step_deferring_mark`] that ran: on success the
    /// epochs it covers no longer wait for a mark; its error is returned (the epochs are
    /// marked by a later step).
    pub fn marked(&mut self, outcome: MarkOutcome) -> Result<()> {
        outcome.result?;
        self.d.unmarked = self.d.unmarked.saturating_sub(outcome.covers);
        Ok(())
    }

    /// The checkpoint to mark now, if a mark is due: epochs were delivered and not marked,
    /// and nothing more is deliverable (`idle`) or `mark_every` of them wait.
    fn due_mark(&self, idle: bool) -> Option<u64> {
        let done = self.d.delivered?;
        (self.d.unmarked > 0 && (idle || self.d.unmarked >= self.shared.mark_every()))
            .then_some(done)
    }

    /// The rest of a step once marking is settled: what the commit store already covers is
    /// skipped, else `next` is due.
    fn step_to(&mut self, next: Option<crate::delivery::catalog::EpochInfo>) -> Result<Next> {
        let sh = &*self.shared;
        let Some(e) = next else {
            // Free files kept while a backlog drained are removed now, off the delivery path.
            sh.trim_idle()?;
            sh.note_idle();
            return Ok(Next::Idle);
        };
        if let Some(c) = sh.stored_mark()?.filter(|&c| c >= e.id) {
            sh.forget_through(c);
            self.d.delivered = Some(c);
            sh.collect_garbage()?;
            return Ok(Next::Committed(e.id));
        }
        let key = sh.epoch_key(e.id);
        Ok(Next::Deliver(Pending { info: e, key }))
    }

    /// A marker-keeping sink says the target already holds `p`: it counts as delivered
    /// without being sent.
    pub fn skip_committed(&mut self, p: Pending) {
        self.d.delivered = Some(p.info.id);
        self.d.unmarked += 1;
    }

    /// Reads `p` for the sink (I/O: an epoch within one read chunk is read and verified
    /// whole now; a larger one is read as the sink iterates it).
    /// Records the dead-letter log holds for the epoch are left out of it
    /// ([`Epoch::skipped`]).
    pub fn read(&self, p: &Pending) -> Result<Epoch> {
        self.without_dead_letters(p, self.shared.read_epoch(&p.info))
    }

    /// `epoch` (read for `p`) without the records the dead-letter log holds for it.
    fn without_dead_letters(&self, p: &Pending, epoch: Result<Epoch>) -> Result<Epoch> {
        let mut epoch = epoch?;
        if let Some(dl) = self.shared.state().dead_letters() {
            let held = dl.held(&p.key)?;
            if !held.is_empty() {
                epoch.skip = Skip::new(held, epoch.records);
            }
        }
        Ok(epoch)
    }

    /// The read of the deliverable epoch after `p`, for a driver to run on another thread
    /// while the sink takes `p` (no I/O here): the sink then does not wait for the log
    /// between epochs. `None` when no epoch after `p` is deliverable now, when it is too
    /// small for the read to be worth a thread ([`READ_AHEAD_MIN_BYTES`]), or when an epoch
    /// read ahead earlier still exists (one per log at a time, so drivers that give up and
    /// start again cannot pile reads up). Nothing is delivered or counted through it: hand
    /// the result to [`Deliverer::read_or_take`] when that epoch's turn comes, which uses it
    /// only if it is still the same epoch of the same log.
    pub fn read_ahead(&self, p: &Pending) -> Option<ReadAhead> {
        let next = self.shared.next_deliverable(Some(p.info.id))?;
        if next.bytes < READ_AHEAD_MIN_BYTES {
            return None;
        }
        Some(ReadAhead {
            slot: AheadSlot::take(&self.shared)?,
            info: next,
        })
    }

    /// [`Deliverer::read`], using `ahead` instead when it holds `p` read without error from
    /// the same place in the same log (I/O only when it does not). A read ahead that failed, or
    /// that holds another epoch (a restore voided it, or the sink failed and the same epoch
    /// comes again), is dropped and `p` read now, so its error, if any, is this read's.
    pub fn read_or_take(&self, p: &Pending, ahead: Option<ReadAheadEpoch>) -> Result<Epoch> {
        match ahead {
            Some(a) if same_log(&a.slot.0, &self.shared) && a.info.same_frames(&p.info) => {
                match a.epoch {
                    Ok(e) => self.without_dead_letters(p, Ok(e)),
                    Err(_) => self.read(p),
                }
            }
            _ => self.read(p),
        }
    }

    /// The sink's outcome for `epoch` (read for `p`). A read failure the sink met half-way
    /// is returned instead of the sink's own error: the log's is the one to act on. On
    /// success the epoch counts as delivered; it is marked by a later `next_step` or `flush`.
    pub fn finish(
        &mut self,
        p: Pending,
        epoch: &Epoch,
        outcome: std::result::Result<(), SinkError>,
    ) -> Result<()> {
        if let Some(failure) = epoch.reader.take_failure() {
            return Err(failure);
        }
        if let Err(e) = outcome {
            return Err(self.refused(epoch, e));
        }
        failpoint("committer::deliver::after")?;
        self.d.delivered = Some(p.info.id);
        self.d.unmarked += 1;
        self.shared.note_delivered(epoch.len(), epoch.bytes());
        Ok(())
    }

    /// The sink's error for `epoch`, or, when it is a rejection naming a record and a
    /// dead-letter log is set, the record put there ([`ErrorKind::DeadLettered`]: the driver
    /// delivers the epoch again at once, without it). Reads the epoch (I/O) to find the
    /// record's bytes.
    fn refused(&self, epoch: &Epoch, e: SinkError) -> Error {
        let (Some(index), Some(dl)) = (e.record(), self.shared.state().dead_letters()) else {
            return e.into();
        };
        if e.class() != SinkErrorClass::Rejected {
            return e.into();
        }
        let key = epoch.key();
        let mut data = None;
        for r in epoch.records() {
            match r {
                Ok(r) if r.position.index == index => {
                    data = Some(r.data);
                    break;
                }
                Ok(_) => {}
                Err(read) => return read,
            }
        }
        let Some(data) = data else {
            return SinkError::permanent(format!(
                "the sink refused record {index} of checkpoint {}, which this delivery does not hold (it has {} records{}): {}",
                key.checkpoint,
                epoch.len(),
                if epoch.skipped().is_empty() { "" } else { ", some already dead-lettered" },
                e.message()
            ))
            .into();
        };
        let time_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64);
        let letter = crate::DeadLetter {
            seq: 0,
            sink_id: key.sink_id.to_string(),
            subtask: key.subtask,
            checkpoint: key.checkpoint,
            index,
            class: e.class(),
            code: e.code().map(str::to_owned),
            message: e.message().to_string(),
            time_ms,
            attempt: 1,
            origin: None,
            data,
        };
        match dl.put(letter) {
            Ok(()) => ErrorKind::DeadLettered {
                checkpoint: key.checkpoint,
                index,
                reason: e.to_string(),
            }
            .into(),
            Err(put) => put,
        }
    }

    /// Marks the epochs delivered but not yet marked, if any (I/O): before a driver stops
    /// or reports an error, so that nothing but a crash sends an epoch twice.
    pub fn flush(&mut self) -> Result<()> {
        match self.d.delivered {
            Some(done) if self.d.unmarked > 0 => self.mark(done),
            _ => Ok(()),
        }
    }

    /// Records a failed step, the `attempt`-th try of the same epoch, for
    /// [`WalSink::health`](crate::WalSink::health).
    pub fn note_error(&self, e: &Error, attempt: u32) {
        self.shared.note_error(e, attempt);
    }

    /// How long to wait before retrying after `e` at try `attempt` (from 1): exponential
    /// backoff with full jitter ([`Options::retry`](crate::Options::retry)), the longest delay
    /// after a permanent sink error (an operator has to act; retrying fast does not help).
    /// No wait after [`ErrorKind::DeadLettered`]: the epoch goes again at once, without the
    /// record.
    pub fn retry_delay(&self, e: &Error, attempt: u32) -> Duration {
        let retry = self.shared.retry_policy();
        if matches!(e.kind(), ErrorKind::DeadLettered { .. }) {
            return Duration::ZERO;
        }
        let permanent = matches!(e.kind(), ErrorKind::Sink(s)
            if matches!(s.class(), SinkErrorClass::Permanent | SinkErrorClass::Fenced | SinkErrorClass::Rejected))
            || matches!(e.kind(), ErrorKind::DeadLetterLimit { .. });
        if permanent {
            retry.max
        } else {
            retry.delay(attempt)
        }
    }

    /// True when an epoch after the last one delivered is deliverable now (no I/O).
    pub fn has_work(&self) -> bool {
        self.shared.next_deliverable(self.d.delivered).is_some()
    }

    /// The last checkpoint delivered (or found committed) by any deliverer of this log
    /// since it was opened.
    pub fn delivered(&self) -> Option<u64> {
        self.d.delivered
    }

    pub(crate) fn log(&self) -> &Arc<dyn DeliveryLog> {
        &self.shared
    }

    fn mark(&mut self, id: u64) -> Result<()> {
        let sh = &*self.shared;
        sh.record_mark(id)?;
        self.d.unmarked = 0;
        failpoint("committer::mark::after")?;
        sh.collect_garbage()
    }
}

/// A commit mark that is due, handed to the driver by
/// [`Deliverer::next_step_deferring_mark`] to run while the sink takes the next epoch.
#[derive(Debug)]
pub struct DueMark {
    shared: Arc<dyn DeliveryLog>,
    id: u64,
    covers: usize,
}

impl DueMark {
    /// The checkpoint it marks (every checkpoint up to it is committed once it ran).
    pub fn checkpoint(&self) -> u64 {
        self.id
    }

    /// Marks the commit store and frees the segments no longer needed (I/O, blocking): the
    /// work [`Deliverer::next_step`] does when it marks. Report the outcome with
    /// [`Deliverer::marked`].
    pub fn run(self) -> MarkOutcome {
        let sh = &*self.shared;
        let result = sh
            .record_mark(self.id)
            .and_then(|()| failpoint("committer::mark::after"))
            .and_then(|()| sh.collect_garbage());
        MarkOutcome {
            covers: self.covers,
            result,
        }
    }
}

/// What a [`DueMark`] did; for [`Deliverer::marked`].
#[derive(Debug)]
pub struct MarkOutcome {
    covers: usize,
    result: Result<()>,
}

impl Deliverer {
    /// Runs a due mark now, on this thread, and reports it: for a driver that has nothing to
    /// overlap it with (the epoch was skipped, or could not be read).
    pub fn mark_now(&mut self, due: DueMark) -> Result<()> {
        self.marked(due.run())
    }
}

impl Drop for Deliverer {
    fn drop(&mut self) {
        *self.shared.state().progress() = std::mem::take(&mut self.d);
        self.shared.state().release_claim();
    }
}

/// What [`Deliverer::plan`] found: the first half of one step of the protocol.
#[derive(Debug)]
pub enum Plan {
    /// Nothing is deliverable now.
    Idle,
    /// The commit store already covers this checkpoint: nothing to send, go on.
    Committed(u64),
    /// This epoch's turn: ask a marker-keeping sink about it, then [`Deliverer::load`] it.
    Due(Turn),
}

/// One epoch's turn, from [`Deliverer::plan`] to [`Deliverer::complete`]: the epoch that is
/// due, and the mark due for the epochs before it (made beside the sink call, or at once when
/// there is nothing to overlap it with).
#[derive(Debug)]
pub struct Turn {
    p: Pending,
    due: Option<DueMark>,
}

impl Turn {
    /// The epoch that is due (its key, checkpoint id, records and bytes).
    pub fn pending(&self) -> &Pending {
        &self.p
    }

    /// The read ahead a driver holds in `held` (tagged with its checkpoint id), for this
    /// turn: taken when it is this epoch's, kept when it is a later epoch's (this epoch came
    /// again after a failure, and the later one still comes after it), dropped otherwise (a
    /// restore voided it). The same rule for every driver, whatever it holds (the read itself,
    /// or a handle to a read under way).
    pub fn take_ahead<T>(&self, held: &mut Option<(u64, T)>) -> Option<T> {
        match held.take() {
            Some((id, a)) if id == self.p.checkpoint() => Some(a),
            Some((id, a)) if id > self.p.checkpoint() => {
                *held = Some((id, a));
                None
            }
            _ => None,
        }
    }
}

/// A turn whose epoch is read, from [`Deliverer::load`]: the epoch for the sink, and the work
/// to run beside the sink's call (both I/O, both optional).
#[derive(Debug)]
pub struct Loaded {
    /// The epoch to hand to the sink; an empty epoch is not handed to it (its outcome is
    /// `Ok`).
    pub epoch: Epoch,
    /// The mark due for the epochs before this one: run it ([`DueMark::run`]) beside the
    /// sink and report it with [`Deliverer::marked`] after [`Deliverer::complete`].
    pub mark: Option<DueMark>,
    /// The read of the next deliverable epoch: run it ([`ReadAhead::read`]) beside the sink
    /// and hold the result for the next turn ([`Turn::take_ahead`]).
    pub next: Option<ReadAhead>,
    /// What [`Deliverer::complete`] needs to record the sink's outcome.
    pub landing: Landing,
}

/// The epoch of a [`Loaded`] turn, for [`Deliverer::complete`].
#[derive(Debug)]
pub struct Landing(Pending);

impl Landing {
    /// The epoch loaded (its key, checkpoint id, records and bytes).
    pub fn pending(&self) -> &Pending {
        &self.0
    }
}

/// The turn API: every driver (the committer thread, `deliver_ready`, the async committer)
/// takes one step as `plan` → (a marker-keeping sink's `is_committed`: `skip` or `abandon`) →
/// `load` → the sink's `deliver` beside `Loaded::mark` and `Loaded::next` → `complete` →
/// `marked`. Only how a driver runs the I/O (on its thread, on scoped threads, on a blocking
/// pool) and how it calls the sink differ.
impl Deliverer {
    /// The first half of a step (I/O: may mark and free segments, and reads the commit
    /// store): what is due next.
    pub fn plan(&mut self) -> Result<Plan> {
        Ok(match self.next_step_deferring_mark()? {
            (Next::Idle, _) => Plan::Idle,
            (Next::Committed(id), _) => Plan::Committed(id),
            (Next::Deliver(p), due) => Plan::Due(Turn { p, due }),
        })
    }

    /// A marker-keeping sink says the target already holds the turn's epoch: it counts as
    /// delivered without being sent, and the due mark is made now (I/O).
    pub fn skip(&mut self, t: Turn) -> Result<()> {
        self.skip_committed(t.p);
        self.settle(t.due)
    }

    /// The turn ends with `e` before the sink took the epoch (its `is_committed` failed): the
    /// due mark is made now (I/O), and its error, if any, is returned in place of `e`.
    pub fn abandon(&mut self, t: Turn, e: Error) -> Error {
        match self.settle(t.due) {
            Ok(()) => e,
            Err(mark) => mark,
        }
    }

    /// Reads the turn's epoch (I/O), from `ahead` when it holds it (see
    /// [`Deliverer::read_or_take`]). When the epoch is empty, or its read fails, the due mark
    /// is made now (there is no sink call to overlap it with); a read failure ends the turn.
    pub fn load(&mut self, t: Turn, ahead: Option<ReadAheadEpoch>) -> Result<Loaded> {
        let Turn { p, due } = t;
        let epoch = match self.read_or_take(&p, ahead) {
            Ok(e) => e,
            Err(e) => {
                self.settle(due)?;
                return Err(e);
            }
        };
        let (mark, next) = if epoch.is_empty() {
            self.settle(due)?;
            (None, None)
        } else {
            (due, self.read_ahead(&p))
        };
        Ok(Loaded {
            epoch,
            mark,
            next,
            landing: Landing(p),
        })
    }

    /// Records the sink's outcome for the loaded epoch (no I/O, but for a record refused into
    /// the dead-letter log, which is read and put there): call it as soon as the sink
    /// answered, before waiting for the mark beside it, so that a driver stopped in between
    /// never leaves an epoch the sink took uncounted. See [`Deliverer::finish`].
    pub fn complete(
        &mut self,
        landing: Landing,
        epoch: &Epoch,
        outcome: std::result::Result<(), SinkError>,
    ) -> Result<()> {
        self.finish(landing.0, epoch, outcome)
    }

    fn settle(&mut self, due: Option<DueMark>) -> Result<()> {
        match due {
            Some(due) => self.mark_now(due),
            None => Ok(()),
        }
    }
}
