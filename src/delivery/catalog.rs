//! The epoch catalog: which sealed epochs exist, which are deliverable, what is committed, and
//! the health figures derived from them. Pure bookkeeping, no I/O.
//!
//! An epoch moves open -> sealed (its barrier is durable) -> deliverable (its checkpoint, or a
//! later one, completed) -> committed (the commit store says so) and is then forgotten. A
//! restore voids sealed epochs above the restored id. See `docs/design.md` ("Protocol").

use crate::log::format::Position;
use bytes::Bytes;
use std::collections::VecDeque;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// A sealed, uncommitted epoch.
#[derive(Debug, Clone)]
pub(crate) struct EpochInfo {
    pub id: u64,
    pub timestamp_ms: u64,
    pub metadata: Bytes,
    pub records: u64,
    pub bytes: u64,
    pub start: Position,
    pub barrier: Position,
}

impl EpochInfo {
    /// True when `other` is this epoch at the same place in the log, so its frames are the
    /// same bytes: while a log is open it only grows, so no other epoch starts there.
    pub fn same_frames(&self, other: &EpochInfo) -> bool {
        self.id == other.id
            && self.start == other.start
            && self.barrier == other.barrier
            && self.records == other.records
            && self.bytes == other.bytes
    }
}

/// State of a checkpoint as shown to operators.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CheckpointState {
    /// Sealed and durable, waiting for its completion notification.
    Sealed,
    /// Completed: the committer will deliver it.
    Deliverable,
}

/// One pending checkpoint, as reported by [`WalSink::pending`](crate::WalSink::pending).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct PendingCheckpoint {
    /// Checkpoint id.
    pub id: u64,
    /// Sealed or deliverable.
    pub state: CheckpointState,
    /// Records in the epoch.
    pub records: u64,
    /// Payload bytes in the epoch.
    pub bytes: u64,
    /// Checkpoint time, milliseconds since the Unix epoch.
    pub timestamp_ms: u64,
    /// The metadata blob given to `checkpoint`.
    pub metadata: Vec<u8>,
}

/// Health of a log and its delivery, for metrics and alerts.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Health {
    /// Sealed epochs not yet committed.
    pub backlog_epochs: u64,
    /// Records in those epochs.
    pub backlog_records: u64,
    /// Payload bytes in those epochs.
    pub backlog_bytes: u64,
    /// Records appended to the open epoch, not yet sealed.
    pub open_records: u64,
    /// Payload bytes of the open epoch.
    pub open_bytes: u64,
    /// Age of the oldest sealed, uncommitted epoch.
    pub oldest_pending_age: Option<Duration>,
    /// Highest committed checkpoint id.
    pub committed: Option<u64>,
    /// Highest checkpoint id known to be complete.
    pub completed: Option<u64>,
    /// Epochs delivered since open.
    pub delivered_epochs: u64,
    /// Records delivered since open.
    pub delivered_records: u64,
    /// Failed delivery or commit-store attempts since open.
    pub errors: u64,
    /// Retries of the epoch now at the head of the queue.
    pub retries: u32,
    /// The most recent error of the sink or commit store, cleared by the next success.
    pub last_error: Option<String>,
    /// Time from an epoch becoming deliverable to its commit, for the most recent epoch.
    pub last_commit_latency: Option<Duration>,
    /// Segment files in the log.
    pub segments: u64,
    /// Free files kept for reuse (`.free`, each up to a segment's size): up to
    /// [`Options::max_free_segments`](crate::Options::max_free_segments) (none without
    /// recycling) once a deliverer found nothing deliverable, more while a backlog drains.
    pub free_segments: u64,
    /// True after a failed sync: reopen the log.
    pub poisoned: bool,
    /// Payload bytes delivered since open.
    pub delivered_bytes: u64,
    /// Failed delivery or commit-store attempts since open, by class; they add up to
    /// [`Health::errors`].
    pub error_counts: ErrorCounts,
    /// Commit durations since open, one observation per epoch committed by this process:
    /// from the epoch becoming deliverable (its checkpoint completed) to its commit mark.
    /// [`Health::last_commit_latency`] is the newest observation.
    pub commit_durations: DurationHistogram,
    /// Wall time since open during which appends waited for the backlog budget
    /// ([`Options::max_backlog_bytes`](crate::Options::max_backlog_bytes) used up under
    /// [`FullPolicy::Block`](crate::FullPolicy::Block)); overlapping waits count once.
    pub append_blocked: Duration,
    /// Damage of durable data met since open: found by recovery
    /// ([`RecoveryReport::corruption`](crate::RecoveryReport::corruption)) or by a read of a
    /// sealed epoch whose checksum no longer matches.
    pub corruptions: u64,
    /// Records put into the dead-letter log by this process since open
    /// ([`WalSink::set_dead_letters`](crate::WalSink::set_dead_letters)).
    pub dead_letters: u64,
}

/// Failures of delivery since open, by class (see [`Health::error_counts`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct ErrorCounts {
    /// Sink errors classed [`SinkErrorClass::Retryable`](crate::SinkErrorClass::Retryable):
    /// a connection, a timeout, a 5xx, a serialization failure.
    pub retryable: u64,
    /// Sink errors classed [`SinkErrorClass::Permanent`](crate::SinkErrorClass::Permanent):
    /// authentication, a missing table; retried at the longest backoff.
    pub permanent: u64,
    /// Sink errors classed [`SinkErrorClass::Rejected`](crate::SinkErrorClass::Rejected) that
    /// did not go to a dead-letter log (none is set, or the error names no record); retried at
    /// the longest backoff.
    pub rejected: u64,
    /// Failures of the log or the commit store: I/O, a corrupt frame met while reading.
    pub log: u64,
}

/// The upper bounds of [`DurationHistogram`]'s buckets: 1 ms to 60 s, in the 1-2.5-5 steps
/// of Prometheus' default buckets.
pub const COMMIT_DURATION_BOUNDS: [Duration; 15] = [
    Duration::from_millis(1),
    Duration::from_micros(2_500),
    Duration::from_millis(5),
    Duration::from_millis(10),
    Duration::from_millis(25),
    Duration::from_millis(50),
    Duration::from_millis(100),
    Duration::from_millis(250),
    Duration::from_millis(500),
    Duration::from_secs(1),
    Duration::from_millis(2_500),
    Duration::from_secs(5),
    Duration::from_secs(10),
    Duration::from_secs(30),
    Duration::from_secs(60),
];

/// A histogram of durations over the fixed bounds [`COMMIT_DURATION_BOUNDS`]: the shape of a
/// Prometheus histogram (cumulative buckets, a sum and a count), kept without allocation.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct DurationHistogram {
    /// `counts[i]` observations fell in `(bounds[i-1], bounds[i]]` (from zero for `i = 0`);
    /// the last element counts those above the last bound.
    pub counts: [u64; COMMIT_DURATION_BOUNDS.len() + 1],
    /// The sum of every observation.
    pub sum: Duration,
    /// The number of observations.
    pub count: u64,
}

impl DurationHistogram {
    /// The bucket bounds, ascending (the last bucket, above them, is unbounded).
    pub fn bounds(&self) -> &'static [Duration] {
        &COMMIT_DURATION_BOUNDS
    }

    /// Observations at or below each bound, then the count of all (Prometheus' `le` buckets,
    /// `+Inf` last).
    pub fn cumulative(&self) -> [u64; COMMIT_DURATION_BOUNDS.len() + 1] {
        let mut out = self.counts;
        for i in 1..out.len() {
            out[i] += out[i - 1];
        }
        out
    }

    /// Adds one observation.
    pub(crate) fn observe(&mut self, d: Duration) {
        let i = COMMIT_DURATION_BOUNDS.partition_point(|b| *b < d);
        self.counts[i] += 1;
        self.sum = self.sum.saturating_add(d);
        self.count += 1;
    }
}

impl Health {
    /// A delivery, mark or idle step succeeded: the error shown before is no longer current.
    pub(crate) fn clear_error(&mut self) {
        self.retries = 0;
        self.last_error = None;
    }
}

/// Milliseconds since the Unix epoch, now.
pub(crate) fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// The catalog. Invariant: `epochs` is in ascending id order, which is also log order, and
/// holds no id at or below `committed`.
#[derive(Debug, Default)]
pub(crate) struct Catalog {
    pub epochs: VecDeque<EpochInfo>,
    pub committed: Option<u64>,
    pub completed: Option<u64>,
    /// When each epoch of the deliverable prefix of `epochs` became deliverable; element `i`
    /// belongs to `epochs[i]`.
    pub deliverable_since: VecDeque<(u64, std::time::Instant)>,
    /// Position of the barrier of the highest committed checkpoint. Clean-up keeps it: every
    /// uncommitted barrier can still be voided by a restore, and then this one is the newest
    /// that survives, with the metadata (a source offset) an embedder resumes from.
    pub committed_barrier: Option<Position>,
    /// Live segment sequence numbers, ascending.
    pub segments: VecDeque<u64>,
    /// Recycled segments waiting for reuse.
    pub free: Vec<u64>,
    pub health: Health,
    /// Since when appends have waited for the backlog budget, while one does.
    pub blocked_since: Option<std::time::Instant>,
    pub shutdown: bool,
    /// Sum of `bytes` over `epochs`.
    backlog: u64,
}

impl Catalog {
    /// Adds a sealed epoch (its barrier is durable).
    pub fn seal(&mut self, e: EpochInfo) {
        debug_assert!(self.epochs.back().is_none_or(|b| b.id < e.id));
        debug_assert!(self.committed.is_none_or(|c| c < e.id));
        self.backlog += e.bytes;
        self.epochs.push_back(e);
        self.note_deliverable();
    }

    /// Records that checkpoint `id` completed; returns true if something became deliverable.
    pub fn complete(&mut self, id: u64) -> bool {
        if self.completed.is_some_and(|c| c >= id) {
            return false;
        }
        self.completed = Some(id);
        self.note_deliverable()
    }

    /// Extends the deliverable prefix. Invariant: `deliverable_since[i]` belongs to
    /// `epochs[i]`, so only the epochs after it need a look: O(newly deliverable).
    fn note_deliverable(&mut self) -> bool {
        let now = std::time::Instant::now();
        let mut any = false;
        while let Some(e) = self.epochs.get(self.deliverable_since.len()) {
            if !self.is_deliverable(e.id) {
                break;
            }
            self.deliverable_since.push_back((e.id, now));
            any = true;
        }
        debug_assert!(self
            .deliverable_since
            .front()
            .is_none_or(|(id, _)| self.epochs.front().is_some_and(|e| e.id == *id)));
        any
    }

    /// An append found the backlog budget used up and waits (or will try again).
    pub fn blocked(&mut self) {
        self.blocked_since
            .get_or_insert_with(std::time::Instant::now);
    }

    /// An append found room in the backlog budget: a wait in progress ends and is counted.
    pub fn unblocked(&mut self) {
        if let Some(since) = self.blocked_since.take() {
            self.health.append_blocked += since.elapsed();
        }
    }

    /// True when checkpoint `id` is covered by a completion.
    pub fn is_deliverable(&self, id: u64) -> bool {
        self.completed.is_some_and(|c| id <= c)
    }

    /// The next epoch to deliver, if it is deliverable.
    #[cfg(test)]
    pub fn next_deliverable(&self) -> Option<&EpochInfo> {
        self.epochs.front().filter(|e| self.is_deliverable(e.id))
    }

    /// Every epoch at or below `id` was committed by this process: drops them as
    /// [`Catalog::committed_through`] does and observes each one's commit duration.
    pub fn marked_through(&mut self, id: u64) {
        let now = std::time::Instant::now();
        for (_, since) in self.deliverable_since.iter().take_while(|(e, _)| *e <= id) {
            let d = now.saturating_duration_since(*since);
            self.health.commit_durations.observe(d);
        }
        if let Some(latency) = self.committed_through(id) {
            self.health.last_commit_latency = Some(latency);
        }
    }

    /// Drops every epoch at or below `id`, which the commit store now covers. Returns the
    /// latency of the last one dropped, measured from when it became deliverable.
    pub fn committed_through(&mut self, id: u64) -> Option<Duration> {
        if self.committed.is_none_or(|c| c < id) {
            self.committed = Some(id);
        }
        while self.epochs.front().is_some_and(|e| e.id <= id) {
            if let Some(e) = self.epochs.pop_front() {
                self.backlog -= e.bytes;
                self.committed_barrier = Some(e.barrier);
            }
        }
        let mut latency = None;
        while self
            .deliverable_since
            .front()
            .is_some_and(|(e, _)| *e <= id)
        {
            latency = self.deliverable_since.pop_front().map(|(_, t)| t.elapsed());
        }
        latency
    }

    /// Voids sealed epochs above `to` (all, for `None`), as a restore does.
    pub fn restore(&mut self, to: Option<u64>) {
        self.epochs.retain(|e| to.is_some_and(|t| e.id <= t));
        self.backlog = self.epochs.iter().map(|e| e.bytes).sum();
        self.deliverable_since
            .retain(|(e, _)| to.is_some_and(|t| *e <= t));
        if let Some(t) = to {
            // The engine restored from `t`, so `t` completed.
            self.complete(t);
        }
    }

    /// Drops epoch `id` (lenient recovery gave it up: its front was lost).
    pub fn forget(&mut self, id: u64) {
        self.epochs.retain(|e| e.id != id);
        self.deliverable_since.retain(|(e, _)| *e != id);
        self.backlog = self.epochs.iter().map(|e| e.bytes).sum();
    }

    /// Bytes held for epochs not yet committed.
    pub fn backlog_bytes(&self) -> u64 {
        self.backlog
    }

    /// Fills the derived health figures.
    pub fn health(&self) -> Health {
        let mut h = self.health.clone();
        h.backlog_epochs = self.epochs.len() as u64;
        h.backlog_records = self.epochs.iter().map(|e| e.records).sum();
        h.backlog_bytes = self.backlog_bytes();
        h.oldest_pending_age = self
            .epochs
            .front()
            .map(|e| Duration::from_millis(now_ms().saturating_sub(e.timestamp_ms)));
        h.committed = self.committed;
        h.completed = self.completed;
        h.segments = self.segments.len() as u64;
        h.free_segments = self.free.len() as u64;
        if let Some(since) = self.blocked_since {
            h.append_blocked += since.elapsed();
        }
        h
    }

    /// The pending checkpoints, oldest first.
    pub fn pending(&self) -> Vec<PendingCheckpoint> {
        self.epochs
            .iter()
            .map(|e| PendingCheckpoint {
                id: e.id,
                state: if self.is_deliverable(e.id) {
                    CheckpointState::Deliverable
                } else {
                    CheckpointState::Sealed
                },
                records: e.records,
                bytes: e.bytes,
                timestamp_ms: e.timestamp_ms,
                metadata: e.metadata.to_vec(),
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn epoch(id: u64) -> EpochInfo {
        EpochInfo {
            id,
            timestamp_ms: now_ms(),
            metadata: Bytes::new(),
            records: 2,
            bytes: 10,
            start: Position::default(),
            barrier: Position::default(),
        }
    }

    #[test]
    fn later_completion_covers_missed_one() {
        let mut c = Catalog::default();
        c.seal(epoch(0));
        c.seal(epoch(1));
        c.seal(epoch(2));
        assert!(c.next_deliverable().is_none());
        assert!(c.complete(0));
        assert_eq!(c.next_deliverable().unwrap().id, 0);
        // 1 missed; 2 covers it.
        assert!(c.complete(2));
        c.committed_through(0);
        assert_eq!(c.next_deliverable().unwrap().id, 1);
        // A late or repeated completion is a no-op.
        assert!(!c.complete(1));
        assert!(!c.complete(2));
    }

    #[test]
    fn restore_voids_above_and_completes() {
        let mut c = Catalog::default();
        for id in 1..=4 {
            c.seal(epoch(id));
        }
        c.restore(Some(2));
        assert_eq!(
            c.epochs.iter().map(|e| e.id).collect::<Vec<_>>(),
            vec![1, 2]
        );
        assert!(c.is_deliverable(2));
        c.restore(None);
        assert!(c.epochs.is_empty());
    }

    #[test]
    fn a_duration_on_a_bound_counts_in_that_bucket() {
        let mut h = DurationHistogram::default();
        h.observe(Duration::ZERO);
        h.observe(Duration::from_millis(1));
        h.observe(Duration::from_micros(1001));
        h.observe(Duration::from_secs(3600));
        assert_eq!(&h.counts[..3], &[2, 1, 0]);
        assert_eq!(
            h.counts[COMMIT_DURATION_BOUNDS.len()],
            1,
            "above the last bound"
        );
        let c = h.cumulative();
        assert_eq!((c[0], c[1], c[COMMIT_DURATION_BOUNDS.len()]), (2, 3, 4));
        assert_eq!(h.count, 4);
        assert_eq!(h.sum, Duration::from_micros(3_600_002_001));
    }

    #[test]
    fn only_marked_epochs_are_timed() {
        let mut c = Catalog::default();
        c.seal(epoch(5));
        c.seal(epoch(6));
        c.seal(epoch(7));
        c.complete(7);
        c.committed_through(5);
        assert_eq!(
            c.health.commit_durations.count, 0,
            "found committed: not timed"
        );
        c.marked_through(7);
        assert_eq!(c.health.commit_durations.count, 2);
        assert!(c.health.last_commit_latency.is_some());
    }

    #[test]
    fn health_counts_backlog() {
        let mut c = Catalog::default();
        c.seal(epoch(5));
        c.seal(epoch(6));
        let h = c.health();
        assert_eq!(
            (h.backlog_epochs, h.backlog_records, h.backlog_bytes),
            (2, 4, 20)
        );
        c.complete(6);
        c.committed_through(5);
        assert_eq!(c.health().backlog_epochs, 1);
        assert_eq!(c.health().committed, Some(5));
    }
}
