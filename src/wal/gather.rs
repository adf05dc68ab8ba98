//! Group commit's gathering: before the thread that runs the next sync starts it, it waits a
//! little for durable appenders that are on their way, so that one sync covers them too
//! instead of leaving them for the sync after.
//!
//! Without it, a sync that completes wakes its waiters, and the first one to run starts the
//! next sync at once, before the others (woken a few microseconds later, on a machine with
//! fewer cores than writers) have written again: syncs cover fewer appends than there are
//! writers. So the next sync waits until as many appenders have written as the last sync
//! covered (or as have arrived and not written yet, if more), for at most half the recent
//! sync time ([`MAX_WAIT`] at most): never more than half the sync it saves. With one writer,
//! or the async handle's I/O thread (which does not count as an appender), nobody is expected
//! and nothing waits. Only timing changes: a sync still covers exactly what was written
//! before it started.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// The longest a gathering waits, whatever the syncs cost.
const MAX_WAIT: Duration = Duration::from_micros(200);

/// Durable appenders in flight, and how long syncs take.
#[derive(Debug, Default)]
pub(crate) struct Gathering {
    /// Appenders between their arrival and their return.
    arrived: AtomicUsize,
    /// Of those, the ones that have written their records.
    written: AtomicUsize,
    /// Appenders whose records are written but not yet covered by a started sync (changed
    /// under the writer lock).
    pending: AtomicUsize,
    /// Appenders the last sync covered.
    last_batch: AtomicUsize,
    /// A moving average of recent sync times, in nanoseconds.
    sync_ns: AtomicU64,
}

/// One durable appender's presence; leaves on drop.
#[derive(Debug)]
pub(crate) struct Arrival<'a> {
    g: &'a Gathering,
    wrote: bool,
}

impl Gathering {
    /// A durable appender arrives (before it waits for budget and writes).
    pub(crate) fn arrive(&self) -> Arrival<'_> {
        self.arrived.fetch_add(1, Ordering::SeqCst);
        Arrival {
            g: self,
            wrote: false,
        }
    }

    /// Appenders that arrived and have not written yet.
    fn on_the_way(&self) -> usize {
        let written = self.written.load(Ordering::SeqCst);
        self.arrived.load(Ordering::SeqCst).saturating_sub(written)
    }

    /// How many appenders the next sync should cover, if it waits for them.
    fn expected(&self) -> usize {
        let pending = self.pending.load(Ordering::SeqCst);
        self.last_batch
            .load(Ordering::Relaxed)
            .max(pending + self.on_the_way())
    }

    /// Whether the next sync should wait for appenders on their way.
    pub(crate) fn worth_waiting(&self) -> bool {
        self.pending.load(Ordering::SeqCst) < self.expected()
    }

    /// Whether the caller is the only durable appender about: it arrived (an `append` or
    /// `append_batch`, not a `make_durable` that others' unsynced appends may be racing),
    /// the last sync covered at most one, and no other has arrived. Then nobody is expected
    /// to add to the next sync while it runs, and it may as well run under the writer lock.
    pub(crate) fn alone(&self) -> bool {
        self.last_batch.load(Ordering::Relaxed) <= 1 && self.arrived.load(Ordering::SeqCst) == 1
    }

    /// Waits (without any lock held) until the expected appenders have written, or half the
    /// recent sync time has passed (at most [`MAX_WAIT`]).
    pub(crate) fn wait_for_writers(&self) {
        let limit = Duration::from_nanos(self.sync_ns.load(Ordering::Relaxed) / 2).min(MAX_WAIT);
        let expected = self.expected();
        let start = Instant::now();
        while self.pending.load(Ordering::SeqCst) < expected && start.elapsed() < limit {
            std::thread::yield_now();
        }
    }

    /// A sync starts, covering every pending appender (called under the writer lock).
    pub(crate) fn sync_starts(&self) {
        let batch = self.pending.swap(0, Ordering::SeqCst);
        self.last_batch.store(batch, Ordering::Relaxed);
    }

    /// Records how long a sync took.
    pub(crate) fn note_sync(&self, took: Duration) {
        let ns = u64::try_from(took.as_nanos()).unwrap_or(u64::MAX);
        let old = self.sync_ns.load(Ordering::Relaxed);
        let new = if old == 0 { ns } else { old - old / 8 + ns / 8 };
        self.sync_ns.store(new, Ordering::Relaxed);
    }
}

impl Arrival<'_> {
    /// The appender's records are written, not yet durable (called under the writer lock).
    pub(crate) fn wrote(&mut self) {
        if !self.wrote {
            self.wrote = true;
            self.g.written.fetch_add(1, Ordering::SeqCst);
            self.g.pending.fetch_add(1, Ordering::SeqCst);
        }
    }
}

impl Drop for Arrival<'_> {
    fn drop(&mut self) {
        if self.wrote {
            self.g.written.fetch_sub(1, Ordering::SeqCst);
        }
        self.g.arrived.fetch_sub(1, Ordering::SeqCst);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nobody_expected_means_no_wait_and_arrivals_leave_on_drop() {
        let g = Gathering::default();
        g.note_sync(Duration::from_secs(1));
        assert!(!g.worth_waiting());
        let mut a = g.arrive();
        assert!(g.worth_waiting());
        a.wrote();
        a.wrote();
        assert!(!g.worth_waiting());
        g.sync_starts();
        assert_eq!(g.last_batch.load(Ordering::SeqCst), 1);
        drop(a);
        assert_eq!(
            (
                g.arrived.load(Ordering::SeqCst),
                g.written.load(Ordering::SeqCst)
            ),
            (0, 0)
        );
    }

    #[test]
    fn the_wait_ends_when_the_expected_writers_wrote_or_after_half_a_sync() {
        let g = Gathering::default();
        g.note_sync(Duration::from_micros(400));
        let _late = g.arrive();
        let t = Instant::now();
        g.wait_for_writers();
        let took = t.elapsed();
        assert!(took >= Duration::from_micros(200), "{took:?}");
        // Two wrote and were covered; the next sync expects two.
        let (mut a, mut b) = (g.arrive(), g.arrive());
        a.wrote();
        b.wrote();
        g.sync_starts();
        assert!(g.worth_waiting());
        std::thread::scope(|s| {
            s.spawn(|| {
                let mut c = g.arrive();
                c.wrote();
                let mut d = g.arrive();
                d.wrote();
            });
            g.wait_for_writers();
        });
        assert!(!g.worth_waiting() || g.pending.load(Ordering::SeqCst) >= 2);
    }
}
