//! [`DeliveryLog`]: the narrow view of a log that delivery works through, and the delivery
//! state a log keeps for its deliverers.
//!
//! Delivery is a layer over the log: the deliverer and the committers reach a log only
//! through this trait (the log implements it in `wal/seam.rs`), so the log's internals (its
//! writer, its locks, its catalog) stay the log's, and delivery could drive any log that can
//! answer these few questions. The state kept between deliverers ([`DeliveryState`]) is
//! delivery's; the log only holds it, so that it outlives each deliverer.

use crate::delivery::catalog::EpochInfo;
use crate::error::{Error, Result};
use crate::{DeadLetters, Epoch, EpochKey, RetryPolicy};
use parking_lot::{Mutex, MutexGuard};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// What delivery needs from a log. Every method is quick and takes the log's locks for
/// itself; those that do I/O say so.
pub(crate) trait DeliveryLog: Send + Sync + std::fmt::Debug {
    /// The key of checkpoint `checkpoint` of this log.
    fn epoch_key(&self, checkpoint: u64) -> EpochKey;

    /// The oldest sealed epoch after `after`, if it is deliverable.
    fn next_deliverable(&self, after: Option<u64>) -> Option<EpochInfo>;

    /// The commit store's mark (I/O for stores that read it).
    fn stored_mark(&self) -> Result<Option<u64>>;

    /// Durably records every checkpoint `<= id` as committed in the commit store (I/O), then
    /// drops those epochs from the catalog; the success clears the error shown by `health`.
    fn record_mark(&self, id: u64) -> Result<()>;

    /// The commit store already covers `id` (a crash after marking, before clean-up).
    fn forget_through(&self, id: u64);

    /// Epoch `e`, ready for a sink (I/O: read whole now, or chunk by chunk as it is iterated).
    fn read_epoch(&self, e: &EpochInfo) -> Result<Epoch>;

    /// Frees the segments no committed-but-needed frame remains in (I/O).
    fn collect_garbage(&self) -> Result<()>;

    /// Removes free files kept while a backlog drained (I/O), when nothing is deliverable.
    fn trim_idle(&self) -> Result<()>;

    /// A sink took an epoch of `records` records and `bytes` payload bytes.
    fn note_delivered(&self, records: u64, bytes: u64);

    /// A deliverer found nothing deliverable, every delivered epoch marked and the freeing
    /// done: an error shown before is no longer current.
    fn note_idle(&self);

    /// A delivery or mark failed, at the `attempt`-th try of the same epoch.
    fn note_error(&self, e: &Error, attempt: u32);

    /// Epochs delivered before their run is marked.
    fn mark_every(&self) -> usize;

    /// How failed deliveries are retried.
    fn retry_policy(&self) -> &RetryPolicy;

    /// Waits up to `timeout` (less if woken) for an epoch after `after` to become
    /// deliverable, unless `stop` is set or one already is.
    fn wait_for_epoch(&self, stop: &AtomicBool, after: Option<u64>, timeout: Duration);

    /// Waits `delay` (less if woken) unless `stop` is set: the backoff before a retry.
    fn pause(&self, stop: &AtomicBool, delay: Duration);

    /// Wakes a committer waiting in [`DeliveryLog::wait_for_epoch`] or
    /// [`DeliveryLog::pause`].
    fn wake(&self);

    /// A name for the committer thread.
    fn committer_name(&self) -> String;

    /// The delivery state this log keeps between deliverers.
    fn state(&self) -> &DeliveryState;
}

/// Delivery progress that survives between deliverers: epochs delivered but not yet marked.
#[derive(Debug, Default)]
pub(crate) struct Delivery {
    /// The last checkpoint delivered (or found committed) since the log was opened.
    pub(crate) delivered: Option<u64>,
    /// Epochs delivered since the last mark.
    pub(crate) unmarked: usize,
}

/// What a log holds for delivery: the progress kept between deliverers, the one right to
/// deliver, and the one slot for an epoch read ahead.
#[derive(Debug, Default)]
pub(crate) struct DeliveryState {
    /// Epochs delivered but not yet marked, kept between `deliver_ready` calls and committer
    /// runs so that only a crash can make an epoch go out twice.
    progress: Mutex<Delivery>,
    /// Set while someone delivers (a committer thread, `deliver_ready`, an async driver).
    delivering: AtomicBool,
    /// Set while an epoch read ahead of its turn exists (being read, or read and not yet
    /// taken or dropped): one at a time, whatever the drivers do.
    reading_ahead: AtomicBool,
    /// Where records the target refuses for good go, if anywhere.
    dead_letters: Mutex<Option<Arc<dyn DeadLetters>>>,
}

impl DeliveryState {
    /// The progress kept between deliverers.
    pub(crate) fn progress(&self) -> MutexGuard<'_, Delivery> {
        self.progress.lock()
    }

    /// Takes the right to deliver (one deliverer at a time); false when someone has it.
    pub(crate) fn try_claim(&self) -> bool {
        self.delivering
            .compare_exchange(false, true, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
    }

    /// Gives the right to deliver back.
    pub(crate) fn release_claim(&self) {
        self.delivering.store(false, Ordering::Release);
    }

    /// Takes the read-ahead slot; false when an epoch read ahead exists.
    pub(crate) fn try_read_ahead(&self) -> bool {
        self.reading_ahead
            .compare_exchange(false, true, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
    }

    /// The dead-letter log, if one is set.
    pub(crate) fn dead_letters(&self) -> Option<Arc<dyn DeadLetters>> {
        self.dead_letters.lock().clone()
    }

    /// Sets (or, with `None`, removes) the dead-letter log.
    pub(crate) fn set_dead_letters(&self, d: Option<Arc<dyn DeadLetters>>) {
        *self.dead_letters.lock() = d;
    }

    /// Gives the read-ahead slot back.
    pub(crate) fn release_read_ahead(&self) {
        self.reading_ahead.store(false, Ordering::Release);
    }
}
