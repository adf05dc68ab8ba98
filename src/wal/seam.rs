//! The delivery seam: the log's side of [`DeliveryLog`], the few operations delivery
//! (`crate::delivery`) needs from a log. Delivery reaches the log's state only through these.

use super::Shared;
use crate::delivery::catalog::EpochInfo;
use crate::delivery::log::{DeliveryLog, DeliveryState};
use crate::error::{Error, ErrorKind, Result, SinkErrorClass};
use crate::{Epoch, EpochKey, RetryPolicy};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

impl DeliveryLog for Shared {
    /// The key of checkpoint `checkpoint` of this log.
    fn epoch_key(&self, checkpoint: u64) -> EpochKey {
        EpochKey {
            sink_id: self.sink_id.clone(),
            subtask: self.opts.subtask,
            checkpoint,
        }
    }

    /// The oldest sealed epoch after `after`, if it is deliverable.
    fn next_deliverable(&self, after: Option<u64>) -> Option<EpochInfo> {
        let cat = self.cat.lock();
        cat.epochs
            .iter()
            .find(|e| after.is_none_or(|x| e.id > x))
            .filter(|e| cat.is_deliverable(e.id))
            .cloned()
    }

    /// The commit store's mark.
    fn stored_mark(&self) -> Result<Option<u64>> {
        self.store
            .lock()
            .last_committed(&self.sink_id, self.opts.subtask)
    }

    /// Durably records every checkpoint `<= id` as committed in the commit store, then drops
    /// those epochs from the catalog; the success clears the error shown by `health`.
    fn record_mark(&self, id: u64) -> Result<()> {
        self.with_room(|| {
            self.store
                .lock()
                .mark_committed(&self.sink_id, self.opts.subtask, id)
        })?;
        let mut cat = self.cat.lock();
        cat.marked_through(id);
        cat.health.clear_error();
        self.catalog_changed();
        Ok(())
    }

    /// The commit store already covers `id` (a crash after marking, before clean-up).
    fn forget_through(&self, id: u64) {
        self.cat.lock().committed_through(id);
    }

    /// Epoch `e`, ready for a sink (read whole now, or chunk by chunk as it is iterated).
    fn read_epoch(&self, e: &EpochInfo) -> Result<Epoch> {
        crate::delivery::sink::load_epoch(
            &self.storage,
            &self.read_pool,
            self.opts.read_chunk_size,
            e,
            self.epoch_key(e.id),
        )
    }

    /// A sink took an epoch of `records` records and `bytes` payload bytes.
    fn note_delivered(&self, records: u64, bytes: u64) {
        let mut cat = self.cat.lock();
        cat.health.delivered_epochs += 1;
        cat.health.delivered_records += records;
        cat.health.delivered_bytes += bytes;
        cat.health.clear_error();
    }

    /// A deliverer found nothing deliverable, every delivered epoch marked and the freeing
    /// done: an error shown before is no longer current.
    fn note_idle(&self) {
        self.cat.lock().health.clear_error();
    }

    /// A delivery or mark failed, at the `attempt`-th try of the same epoch.
    fn note_error(&self, e: &Error, attempt: u32) {
        let mut cat = self.cat.lock();
        if matches!(e.kind(), ErrorKind::DeadLettered { .. }) {
            // Not a failure: the epoch goes again at once without the record.
            cat.health.dead_letters += 1;
            return;
        }
        cat.health.errors += 1;
        let counts = &mut cat.health.error_counts;
        match e.kind() {
            ErrorKind::Sink(s) if s.class() == SinkErrorClass::Retryable => counts.retryable += 1,
            ErrorKind::Sink(s) if s.class() == SinkErrorClass::Rejected => counts.rejected += 1,
            ErrorKind::Sink(_) => counts.permanent += 1,
            _ => counts.log += 1,
        }
        if matches!(e.kind(), ErrorKind::Corruption(_)) {
            cat.health.corruptions += 1;
        }
        cat.health.retries = attempt;
        cat.health.last_error = Some(e.to_string());
    }

    /// Epochs delivered before their run is marked.
    fn mark_every(&self) -> usize {
        self.opts.mark_every
    }

    /// How failed deliveries are retried.
    fn retry_policy(&self) -> &RetryPolicy {
        &self.opts.retry
    }

    /// Waits up to `timeout` (less if woken) for an epoch after `after` to become deliverable,
    /// unless `stop` is set or one already is.
    fn wait_for_epoch(&self, stop: &AtomicBool, after: Option<u64>, timeout: Duration) {
        let mut cat = self.cat.lock();
        let ready = cat
            .epochs
            .iter()
            .any(|e| cat.is_deliverable(e.id) && after.is_none_or(|x| e.id > x));
        if !ready && !stop.load(Ordering::Acquire) {
            self.cat_cv.wait_for(&mut cat, timeout);
        }
    }

    /// Waits `delay` (less if woken) unless `stop` is set: the backoff before a retry.
    fn pause(&self, stop: &AtomicBool, delay: Duration) {
        let mut cat = self.cat.lock();
        if !stop.load(Ordering::Acquire) {
            self.cat_cv.wait_for(&mut cat, delay);
        }
    }

    /// Wakes a committer waiting in `wait_for_epoch` or `pause`.
    fn wake(&self) {
        let _cat = self.cat.lock();
        self.catalog_changed();
    }

    fn collect_garbage(&self) -> Result<()> {
        Shared::collect_garbage(self)
    }

    fn trim_idle(&self) -> Result<()> {
        Shared::trim_idle(self)
    }

    fn committer_name(&self) -> String {
        format!("walsink-committer-{}", self.sink_id)
    }

    fn state(&self) -> &DeliveryState {
        &self.delivery
    }
}

impl Shared {
    /// Wakes every waiter on the catalog: threads on `cat_cv` and the registered listeners.
    /// Called with the catalog lock held.
    pub(crate) fn catalog_changed(&self) {
        self.cat_cv.notify_all();
        for f in self.listeners.lock().iter() {
            f();
        }
    }

    /// Waits until checkpoint `id` is committed, or `timeout` passes (`Duration::MAX`, too
    /// large for the clock, waits without a deadline). Returns whether it is.
    pub(crate) fn wait_committed(&self, id: u64, timeout: Duration) -> bool {
        let deadline = std::time::Instant::now().checked_add(timeout);
        let mut cat = self.cat.lock();
        while cat.committed.is_none_or(|c| c < id) {
            match deadline {
                Some(deadline) => {
                    if self.cat_cv.wait_until(&mut cat, deadline).timed_out() {
                        return cat.committed.is_some_and(|c| c >= id);
                    }
                }
                None => self.cat_cv.wait(&mut cat),
            }
        }
        true
    }
}
