//! `BlockingSink`: it drives an async marker sink from the committer thread, with the
//! program's runtime handle, and through a huge epoch; called on a runtime worker it fails with
//! an error, not a panic; a sink that panics in `deliver_ready` does not leave the log
//! undeliverable.

use crate::support::*;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::Duration;
use walsink::{ErrorKind, MemorySink, WalSink};
use walsink_tokio::{AsyncWal, BlockingSink};

#[test]
fn blocking_sink_drives_an_async_marker_sink_from_the_committer_thread() {
    let dir = tempfile::tempdir().unwrap();
    let (w, _) = WalSink::open(dir.path(), opts("blocking-own")).unwrap();
    let probe = Probe::with_marker();
    probe.edit(|s| {
        s.fail_retryable.insert(2, 2);
    });
    let committer = w
        .spawn_committer(BlockingSink::new(probe.clone()).unwrap())
        .unwrap();
    let mut expected = Vec::new();
    for cp in 1..=3 {
        let r = recs(cp, 3);
        expected.extend(r.clone());
        w.append_batch(refs(&r)).unwrap();
        w.checkpoint(cp, b"").unwrap();
    }
    w.checkpoint_complete(3).unwrap();
    assert!(w.wait_committed(3, Duration::from_secs(120)));
    committer.shutdown();
    assert_eq!(probe.ok_ids(), vec![1, 2, 3]);
    assert_eq!(probe.records(), expected);
    assert!(probe.violations().is_empty(), "{:?}", probe.violations());
    // and with deliver_ready on a plain thread, block_on for inspection
    let mut bs = BlockingSink::new(Probe::new()).unwrap();
    let n = bs.block_on(async |s: &mut Probe| s.calls().len());
    assert_eq!(n, 0);
    w.append(b"x").unwrap();
    w.checkpoint(4, b"").unwrap();
    w.checkpoint_complete(4).unwrap();
    assert_eq!(w.deliver_ready(&mut bs).unwrap(), 1);
    assert_eq!(bs.get_ref().ok_ids(), vec![4]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn blocking_sink_with_the_program_runtime_handle_from_a_committer_thread() {
    let handle = tokio::runtime::Handle::current();
    let probe = Probe::with_marker();
    let p2 = probe.clone();
    guard(
        "the committer thread",
        tokio::task::spawn_blocking(move || {
            let dir = tempfile::tempdir().unwrap();
            let (w, _) = WalSink::open(dir.path(), opts("blocking-handle")).unwrap();
            let c = w
                .spawn_committer(BlockingSink::with_handle(p2, handle))
                .unwrap();
            for cp in 1..=3 {
                w.append_batch(refs(&recs(cp, 2))).unwrap();
                w.checkpoint(cp, b"").unwrap();
            }
            w.checkpoint_complete(3).unwrap();
            assert!(w.wait_committed(3, Duration::from_secs(120)));
            c.shutdown();
        }),
    )
    .await
    .unwrap();
    assert_eq!(probe.ok_ids(), vec![1, 2, 3]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn blocking_sink_called_on_a_runtime_worker_fails_with_an_error_not_a_panic() {
    let dir = tempfile::tempdir().unwrap();
    let (w, _) = WalSink::open(dir.path(), opts("blocking-worker")).unwrap();
    w.append(b"a").unwrap();
    w.checkpoint(1, b"").unwrap();
    w.checkpoint_complete(1).unwrap();
    let mut bs = BlockingSink::with_handle(Probe::new(), tokio::runtime::Handle::current());
    let r = std::panic::catch_unwind(AssertUnwindSafe(|| w.deliver_ready(&mut bs)));
    let r = r.expect("a BlockingSink on a runtime worker must fail with an error, not panic");
    assert!(r.is_err(), "the misuse is reported");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sink_that_panics_in_deliver_ready_does_not_leave_the_log_undeliverable() {
    // The misuse above panics inside deliver_ready; whatever it does, the log must not stay
    // taken by a deliverer that no longer exists.
    let dir = tempfile::tempdir().unwrap();
    let (w, _) = WalSink::open(dir.path(), opts("blocking-worker-after")).unwrap();
    w.append(b"a").unwrap();
    w.checkpoint(1, b"").unwrap();
    w.checkpoint_complete(1).unwrap();
    let mut bs = BlockingSink::with_handle(Probe::new(), tokio::runtime::Handle::current());
    let _ = std::panic::catch_unwind(AssertUnwindSafe(|| w.deliver_ready(&mut bs)));
    let mut ms = MemorySink::new();
    let w = Arc::new(w);
    let w2 = w.clone();
    let n = tokio::task::spawn_blocking(move || w2.deliver_ready(&mut ms).map(|n| (n, ms)))
        .await
        .unwrap();
    let (n, ms) = n.expect("the log stays usable after a sink panicked");
    assert_eq!(n, 1);
    assert_eq!(
        ms.records(),
        vec![b"a".to_vec()],
        "the epoch is offered again"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_blocking_sink_refused_by_spawn_committer_in_async_code_does_not_panic() {
    let dir = tempfile::tempdir().unwrap();
    let (wal, _) = AsyncWal::open(dir.path(), opts("blocking-refused"))
        .await
        .unwrap();
    let committer = wal.spawn_committer(Probe::new()).unwrap();
    let r = std::panic::catch_unwind(AssertUnwindSafe(|| {
        wal.blocking()
            .spawn_committer(BlockingSink::new(Probe::new()).unwrap())
            .map(|_| ())
    }));
    let r = r.expect("refusing a committer must not panic");
    assert!(matches!(
        r.unwrap_err().kind(),
        ErrorKind::InvalidOperation { .. }
    ));
    committer.shutdown(Duration::from_secs(10)).await;
}

#[test]
fn a_huge_epoch_streams_through_async_chunks_inside_a_blocking_sink() {
    let dir = tempfile::tempdir().unwrap();
    let (w, _) = WalSink::open(dir.path(), opts("huge-blocking").read_chunk_size(1024)).unwrap();
    let records: Vec<Vec<u8>> = (0..5000)
        .map(|i| format!("{i:06}{}", "b".repeat(i % 70)).into_bytes())
        .collect();
    w.append_batch(refs(&records)).unwrap();
    w.checkpoint(1, b"").unwrap();
    w.checkpoint_complete(1).unwrap();
    let s = Streamer::default();
    let c = w
        .spawn_committer(BlockingSink::new(s.clone()).unwrap())
        .unwrap();
    assert!(w.wait_committed(1, Duration::from_secs(120)));
    c.shutdown();
    assert_eq!(*s.loaded.lock(), Some(false));
    assert!(s.problems.lock().is_empty(), "{:?}", s.problems.lock());
    assert!(*s.out.lock() == records);
}
