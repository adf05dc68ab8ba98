//! What `health()` counts for metrics: payload bytes delivered, one commit-duration
//! observation per committed epoch, failures by class (retryable, permanent, the log's own),
//! the wall time appends waited for the backlog budget, and corruption met in a sealed epoch.
//! These are the figures `walsink pipe --metrics-addr` exports; each is checked against what
//! the test itself wrote or did.

use crate::support::frames::*;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use walsink::{Epoch, FullPolicy, MemorySink, Sink, SinkError, WalSink, COMMIT_DURATION_BOUNDS};

/// A sink that answers with the queued errors first, then takes every epoch.
#[derive(Clone, Default)]
struct Scripted {
    errors: Arc<Mutex<Vec<SinkError>>>,
}

impl Sink for Scripted {
    fn deliver(&mut self, _epoch: &Epoch) -> Result<(), SinkError> {
        match self.errors.lock().unwrap().pop() {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }
}

/// Delivered bytes are the payload bytes appended; each committed epoch is one observation
/// of the commit-duration histogram, whose cumulative buckets end at the count.
#[test]
fn delivered_bytes_and_one_commit_duration_per_epoch() {
    let t = tempfile::tempdir().unwrap();
    let (wal, _) =
        WalSink::open(t.path(), small_opts("health-bytes", 1 << 20, 1 << 16, 4096)).unwrap();
    let mut bytes = 0u64;
    for ck in 1..=4u64 {
        bytes += fill(&wal, ck, &[100 + ck as usize; 7])
            .iter()
            .map(|r| r.len() as u64)
            .sum::<u64>();
    }
    let before = wal.health();
    assert_eq!(
        (before.delivered_bytes, before.commit_durations.count),
        (0, 0)
    );
    wal.checkpoint_complete(4).unwrap();
    wal.deliver_ready(&mut MemorySink::new()).unwrap();
    let h = wal.health();
    assert_eq!(h.delivered_bytes, bytes, "{h:?}");
    assert_eq!(h.delivered_records, 28);
    assert_eq!(h.commit_durations.count, 4, "{h:?}");
    let cumulative = h.commit_durations.cumulative();
    assert_eq!(cumulative.len(), COMMIT_DURATION_BOUNDS.len() + 1);
    assert_eq!(*cumulative.last().unwrap(), 4);
    assert!(
        cumulative.windows(2).all(|w| w[0] <= w[1]),
        "{cumulative:?}"
    );
    assert!(h.commit_durations.sum >= h.last_commit_latency.unwrap());
    // A reopen starts the figures of this process afresh; nothing is pending, nothing counts.
    drop(wal);
    let (wal, _) =
        WalSink::open(t.path(), small_opts("health-bytes", 1 << 20, 1 << 16, 4096)).unwrap();
    wal.deliver_ready(&mut MemorySink::new()).unwrap();
    let h = wal.health();
    assert_eq!(
        (h.delivered_bytes, h.commit_durations.count),
        (0, 0),
        "{h:?}"
    );
}

/// Failures are counted by class and add up to `errors`.
#[test]
fn failures_are_counted_by_class() {
    let t = tempfile::tempdir().unwrap();
    let (wal, _) =
        WalSink::open(t.path(), small_opts("health-class", 1 << 20, 1 << 16, 4096)).unwrap();
    fill(&wal, 1, &[10, 10]);
    wal.checkpoint_complete(1).unwrap();
    let sink = Scripted::default();
    sink.errors.lock().unwrap().extend([
        SinkError::permanent("no such table"),
        SinkError::retryable("connection reset"),
        SinkError::retryable("timeout"),
    ]);
    let mut s = sink.clone();
    for _ in 0..3 {
        assert!(wal.deliver_ready(&mut s).is_err());
    }
    wal.deliver_ready(&mut s).unwrap();
    let h = wal.health();
    assert_eq!(h.error_counts.retryable, 2, "{h:?}");
    assert_eq!(h.error_counts.permanent, 1, "{h:?}");
    assert_eq!(h.error_counts.log, 0, "{h:?}");
    assert_eq!(h.errors, 3);
    assert_eq!(h.delivered_epochs, 1);
}

/// An append waiting for the backlog budget is counted while it waits and after; appends that
/// never wait count nothing.
#[test]
fn time_appends_wait_for_the_budget_is_counted() {
    let t = tempfile::tempdir().unwrap();
    let o = small_opts("health-blocked", 1 << 20, 1 << 16, 4096)
        .max_backlog_bytes(1000, FullPolicy::Block);
    let (wal, _) = WalSink::open(t.path(), o).unwrap();
    let wal = Arc::new(wal);
    fill(&wal, 1, &[600]);
    assert_eq!(
        wal.health().append_blocked,
        Duration::ZERO,
        "nothing waited yet"
    );
    fill(&wal, 2, &[500]);
    assert_eq!(
        wal.health().append_blocked,
        Duration::ZERO,
        "under the budget: no wait"
    );
    let w = wal.clone();
    let appender = std::thread::spawn(move || w.append(&[7u8; 100]));
    // The appender waits: the figure grows while it does.
    let mut first = Duration::ZERO;
    for _ in 0..2000 {
        first = wal.health().append_blocked;
        if first > Duration::ZERO {
            break;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    assert!(
        first > Duration::ZERO,
        "health never showed the waiting append"
    );
    assert!(
        !appender.is_finished(),
        "the append did not wait for the budget"
    );
    std::thread::sleep(Duration::from_millis(5));
    assert!(
        wal.health().append_blocked > first,
        "the figure does not grow while it waits"
    );
    wal.checkpoint_complete(2).unwrap();
    wal.deliver_ready(&mut MemorySink::new()).unwrap();
    appender.join().unwrap().unwrap();
    let done = wal.health().append_blocked;
    assert!(done > first);
    std::thread::sleep(Duration::from_millis(5));
    assert_eq!(
        wal.health().append_blocked,
        done,
        "a finished wait does not grow"
    );
}

/// A sealed epoch whose bytes changed on disk: the read fails with corruption, which counts
/// as a corruption and as a failure of the log.
#[test]
fn corruption_met_in_a_sealed_epoch_is_counted() {
    let root = tempfile::tempdir().unwrap();
    let wdir = root.path().join("wal");
    let (wal, _) = WalSink::open(&wdir, small_opts("health-damage", 65536, 8192, 2000)).unwrap();
    fill(&wal, 1, &[100; 4]);
    let segs = fs_segments(&wdir);
    let (name, img) = &segs[0];
    let f = *parse_frames(img).iter().find(|f| f.kind == 1).unwrap();
    flip_fs(&wdir.join(name), f.offset + 16 + 3);
    wal.checkpoint_complete(1).unwrap();
    assert_eq!(wal.health().corruptions, 0);
    let r = wal.deliver_ready(&mut MemorySink::new());
    assert!(matches!(&r, Err(e) if is_corruption(e)), "{r:?}");
    let h = wal.health();
    assert_eq!((h.corruptions, h.error_counts.log), (1, 1), "{h:?}");
}
