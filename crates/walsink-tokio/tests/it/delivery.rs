//! Async delivery keeps order without skips or duplicates: through failing sinks, lost marks
//! in a crash, restarts with pending epochs and restores during a delivery; the async committer
//! and every other deliverer exclude each other (a second open fails with `Locked` at once);
//! racing deliverers deliver each epoch exactly once; appends racing checkpoints land in
//! exactly one epoch each, in task order.

use crate::support::*;
use parking_lot::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;
use walsink::storage::{CrashOptions, SimStorage};
use walsink::{CommitStore, ErrorKind, MemorySink, WalSink};
use walsink_tokio::AsyncWal;

/// A commit store whose marks always fail (and that remembers nothing).
struct BrokenStore;

impl CommitStore for BrokenStore {
    fn last_committed(&mut self, _: &str, _: u32) -> walsink::Result<Option<u64>> {
        Ok(None)
    }
    fn mark_committed(&mut self, _: &str, _: u32, _: u64) -> walsink::Result<()> {
        Err(walsink::Error::invalid_op("the commit store is down"))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sink_that_fails_then_succeeds_sees_every_epoch_in_order_without_skips_or_duplicates() {
    let dir = tempfile::tempdir().unwrap();
    let (wal, _) = AsyncWal::open(dir.path(), opts("retry")).await.unwrap();
    let probe = Probe::with_marker();
    probe.edit(|s| {
        s.fail_retryable.insert(2, 3);
        s.fail_permanent.insert(3, 2);
        s.fail_retryable.insert(5, 1);
    });
    let committer = wal.spawn_committer(probe.clone()).unwrap();
    let mut expected = Vec::new();
    for cp in 1..=6 {
        let r = recs(cp, 4);
        expected.extend(r.clone());
        seal(&wal, cp, &r).await;
        if cp % 2 == 0 {
            wal.checkpoint_complete(cp).unwrap();
        }
    }
    assert!(guard("commit 6", wal.wait_committed(6, Duration::MAX)).await);
    let report = committer.shutdown(Duration::from_secs(10)).await;
    assert!(report.clean && report.pending.is_empty(), "{report:?}");
    assert_eq!(probe.ok_ids(), vec![1, 2, 3, 4, 5, 6]);
    assert_eq!(probe.records(), expected);
    let calls = probe.calls();
    assert!(
        calls.windows(2).all(|w| w[0] <= w[1]),
        "calls never go back: {calls:?}"
    );
    assert_eq!(calls.iter().filter(|&&c| c == 2).count(), 4, "{calls:?}");
    assert_eq!(calls.iter().filter(|&&c| c == 3).count(), 3, "{calls:?}");
    assert!(probe.violations().is_empty(), "{:?}", probe.violations());
    let h = wal.health();
    assert!(h.errors >= 6, "{h:?}");
    assert_eq!(h.last_error, None, "cleared by the next success: {h:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deliver_ready_stops_at_the_first_error_marks_what_went_before_and_retries_the_same_epoch()
{
    let dir = tempfile::tempdir().unwrap();
    let (wal, _) = AsyncWal::open(dir.path(), opts("dr-err").mark_every(100))
        .await
        .unwrap();
    for cp in 1..=4 {
        seal(&wal, cp, &recs(cp, 2)).await;
    }
    wal.checkpoint_complete(4).unwrap();
    let probe = Probe::new();
    probe.edit(|s| {
        s.fail_retryable.insert(3, 2);
    });
    let mut p = probe.clone();
    let e = wal.deliver_ready(&mut p).await.unwrap_err();
    assert!(matches!(e.kind(), ErrorKind::Sink(_)), "{e:?}");
    assert_eq!(probe.ok_ids(), vec![1, 2]);
    assert_eq!(
        wal.health().committed,
        Some(2),
        "what succeeded before the error is marked"
    );
    assert!(wal.deliver_ready(&mut p).await.is_err());
    let n = wal.deliver_ready(&mut p).await.unwrap();
    assert_eq!(n, 2);
    assert_eq!(probe.ok_ids(), vec![1, 2, 3, 4]);
    assert_eq!(probe.calls(), vec![1, 2, 3, 3, 3, 4]);
    assert_eq!(wal.health().committed, Some(4));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_marker_sink_never_sees_an_epoch_twice_when_marks_were_lost_in_a_crash() {
    let sim = SimStorage::new();
    let o = opts("marker-crash");
    let (w, _) =
        WalSink::open_with(Arc::new(sim.clone()), o.clone(), Box::new(BrokenStore)).unwrap();
    let wal = AsyncWal::from_sync(w).unwrap();
    let probe = Probe::with_marker();
    let committer = wal.spawn_committer(probe.clone()).unwrap();
    for cp in 1..=3 {
        seal(&wal, cp, &recs(cp, 2)).await;
    }
    wal.checkpoint_complete(3).unwrap();
    wait_until("epoch 1 delivered", || probe.ok_ids().contains(&1)).await;
    wait_until("a failed mark", || wal.health().errors >= 1).await;
    let report = guard("shutdown", committer.shutdown(ms(500))).await;
    assert_eq!(report.committed, None, "{report:?}");
    sim.crash(CrashOptions::power_loss(11));
    drop(wal);
    let (wal, report) = sim_wal(&sim, o);
    assert_eq!(
        report.pending,
        vec![1, 2, 3],
        "nothing was marked: {report:?}"
    );
    wal.checkpoint_complete(3).unwrap();
    let committer = wal.spawn_committer(probe.clone()).unwrap();
    assert!(guard("commit 3", wal.wait_committed(3, Duration::MAX)).await);
    committer.shutdown(Duration::from_secs(10)).await;
    assert_eq!(probe.ok_ids(), vec![1, 2, 3], "each epoch once");
    assert!(probe.violations().is_empty(), "{:?}", probe.violations());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_with_pending_epochs_delivers_each_once_through_the_async_committer() {
    let dir = tempfile::tempdir().unwrap();
    let o = opts("restart");
    let mut expected = Vec::new();
    {
        let (wal, _) = AsyncWal::open(dir.path(), o.clone()).await.unwrap();
        let probe = Probe::new();
        let committer = wal.spawn_committer(probe.clone()).unwrap();
        for cp in 1..=4 {
            let r = recs(cp, 3);
            expected.extend(r.clone());
            seal(&wal, cp, &r).await;
        }
        wal.checkpoint_complete(1).unwrap();
        assert!(guard("commit 1", wal.wait_committed(1, Duration::MAX)).await);
        wal.append(b"lost in the crash").await.unwrap();
        committer.shutdown(Duration::from_secs(10)).await;
        assert_eq!(probe.ok_ids(), vec![1]);
    }
    let (wal, report) = reopen(dir.path(), o.clone()).await;
    assert_eq!(report.pending, vec![2, 3, 4], "{report:?}");
    assert_eq!(report.committed, Some(1));
    assert_eq!(report.last_checkpoint, Some(4));
    assert_eq!(report.last_metadata, Some(4u64.to_le_bytes().to_vec()));
    wal.restore(Some(4)).await.unwrap();
    let probe = Probe::with_marker();
    let committer = wal.spawn_committer(probe.clone()).unwrap();
    let next = report.next_checkpoint_id;
    assert!(next > 4);
    seal(&wal, next, &recs(next, 1)).await;
    wal.checkpoint_complete(next).unwrap();
    assert!(guard("commit next", wal.wait_committed(next, Duration::MAX)).await);
    committer.shutdown(Duration::from_secs(10)).await;
    assert_eq!(probe.ok_ids(), vec![2, 3, 4, next]);
    assert!(!probe.records().contains(&b"lost in the crash".to_vec()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restore_during_a_delivery_voids_only_the_epochs_above_and_the_one_in_flight_completes() {
    let dir = tempfile::tempdir().unwrap();
    let (wal, _) = AsyncWal::open(dir.path(), opts("restore-during"))
        .await
        .unwrap();
    let probe = Probe::with_marker();
    probe.edit(|s| {
        s.hold.insert(1);
    });
    let committer = wal.spawn_committer(probe.clone()).unwrap();
    for cp in 1..=3 {
        seal(&wal, cp, &recs(cp, 2)).await;
    }
    wal.checkpoint_complete(1).unwrap();
    wait_until("epoch 1 in the sink", || probe.calls().contains(&1)).await;
    guard("restore during delivery", wal.restore(Some(2)))
        .await
        .unwrap();
    assert_eq!(pending_ids(&wal), vec![1, 2]);
    probe.edit(|s| {
        s.hold.clear();
    });
    assert!(guard("commit 2", wal.wait_committed(2, Duration::MAX)).await);
    let e = wal.checkpoint(3, b"").await.unwrap_err();
    assert!(
        matches!(e.kind(), ErrorKind::InvalidCheckpoint { .. }),
        "{e:?}"
    );
    seal(&wal, 4, &recs(4, 2)).await;
    wal.checkpoint_complete(4).unwrap();
    assert!(guard("commit 4", wal.wait_committed(4, Duration::MAX)).await);
    committer.shutdown(Duration::from_secs(10)).await;
    assert_eq!(probe.ok_ids(), vec![1, 2, 4]);
    let mut want = recs(1, 2);
    want.extend(recs(2, 2));
    want.extend(recs(4, 2));
    assert_eq!(probe.records(), want);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_async_committer_and_every_other_deliverer_exclude_each_other() {
    let dir = tempfile::tempdir().unwrap();
    let (wal, _) = AsyncWal::open(dir.path(), opts("exclusive")).await.unwrap();
    let probe = Probe::new();
    let committer = wal.spawn_committer(probe.clone()).unwrap();
    let refused = |r: walsink::Result<()>, what: &str| match r {
        Err(e) => assert!(
            matches!(e.kind(), ErrorKind::InvalidOperation { .. }),
            "{what}: {e:?}"
        ),
        Ok(()) => panic!("{what} must be refused while the async committer runs"),
    };
    let mut other = Probe::new();
    refused(
        wal.deliver_ready(&mut other).await.map(|_| ()),
        "async deliver_ready",
    );
    refused(
        walsink_tokio::deliver_ready(wal.blocking(), &mut other)
            .await
            .map(|_| ()),
        "free deliver_ready",
    );
    refused(
        wal.blocking()
            .deliver_ready(&mut MemorySink::new())
            .map(|_| ()),
        "blocking deliver_ready",
    );
    refused(
        wal.spawn_committer(Probe::new()).map(|_| ()),
        "a second async committer",
    );
    refused(
        wal.blocking()
            .spawn_committer(MemorySink::new())
            .map(|_| ()),
        "a committer thread",
    );
    refused(wal.blocking().deliverer().map(|_| ()), "a deliverer");
    seal(&wal, 1, &recs(1, 2)).await;
    wal.checkpoint_complete(1).unwrap();
    assert!(guard("commit 1", wal.wait_committed(1, Duration::MAX)).await);
    committer.shutdown(Duration::from_secs(10)).await;
    seal(&wal, 2, &recs(2, 2)).await;
    wal.checkpoint_complete(2).unwrap();
    assert_eq!(wal.deliver_ready(&mut other).await.unwrap(), 1);
    assert_eq!(probe.ok_ids(), vec![1]);
    assert_eq!(other.ok_ids(), vec![2]);
    assert!(
        other.calls() == vec![2],
        "refused deliverers delivered nothing"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn async_committers_racing_deliver_ready_deliver_each_epoch_exactly_once() {
    let dir = tempfile::tempdir().unwrap();
    let (wal, _) = AsyncWal::open(dir.path(), opts("race").mark_every(3))
        .await
        .unwrap();
    let sinks: Arc<Mutex<Vec<Probe>>> = Arc::default();
    let stop = Arc::new(AtomicBool::new(false));
    let mut racers = Vec::new();
    for r in 0..3 {
        let (w, sinks, stop) = (wal.clone(), sinks.clone(), stop.clone());
        racers.push(tokio::spawn(async move {
            while !stop.load(Ordering::SeqCst) {
                let p = Probe::new();
                sinks.lock().push(p.clone());
                if r == 0 {
                    if let Ok(c) = w.spawn_committer(p) {
                        tokio::time::sleep(ms(3)).await;
                        let _ = c.shutdown(Duration::from_secs(30)).await;
                    }
                } else {
                    let mut p = p;
                    let _ = w.deliver_ready(&mut p).await;
                }
                tokio::task::yield_now().await;
            }
        }));
    }
    let mut expected = Vec::new();
    for cp in 1..=40 {
        let r = recs(cp, 2);
        expected.extend(r.clone());
        seal(&wal, cp, &r).await;
        wal.checkpoint_complete(cp).unwrap();
    }
    wait_until("every epoch committed", || {
        wal.health().committed == Some(40)
    })
    .await;
    stop.store(true, Ordering::SeqCst);
    for r in racers {
        guard("racer", r).await.unwrap();
    }
    let mut all: Vec<(u64, Vec<Vec<u8>>)> = sinks.lock().iter().flat_map(|p| p.ok()).collect();
    all.sort_by_key(|(c, _)| *c);
    let ids: Vec<u64> = all.iter().map(|(c, _)| *c).collect();
    assert_eq!(ids, (1..=40).collect::<Vec<_>>(), "each epoch exactly once");
    let got: Vec<Vec<u8>> = all.into_iter().flat_map(|(_, r)| r).collect();
    assert_eq!(got, expected);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropping_every_async_wal_clone_while_a_committer_runs_still_delivers_and_frees_the_log() {
    let dir = tempfile::tempdir().unwrap();
    let o = opts("drop-wal");
    let (wal, _) = AsyncWal::open(dir.path(), o.clone()).await.unwrap();
    let probe = Probe::new();
    probe.edit(|s| {
        s.hold.insert(1);
    });
    let committer = wal.spawn_committer(probe.clone()).unwrap();
    for cp in 1..=3 {
        seal(&wal, cp, &recs(cp, 2)).await;
    }
    wal.checkpoint_complete(3).unwrap();
    wait_until("epoch 1 in the sink", || probe.calls().contains(&1)).await;
    drop(wal);
    probe.edit(|s| {
        s.hold.clear();
    });
    wait_until("all three delivered without any handle", || {
        probe.ok_ids().len() == 3
    })
    .await;
    let report = guard("shutdown", committer.shutdown(Duration::from_secs(10))).await;
    assert!(report.clean, "{report:?}");
    assert!(report.pending.is_empty(), "{report:?}");
    assert_eq!(report.committed, Some(3));
    let (_wal, report) = reopen(dir.path(), o).await;
    assert!(report.pending.is_empty(), "{report:?}");
    assert_eq!(report.committed, Some(3));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_deadline_cut_the_log_can_be_reopened_in_process() {
    let dir = tempfile::tempdir().unwrap();
    let o = opts("cut-reopen");
    let (wal, _) = AsyncWal::open(dir.path(), o.clone()).await.unwrap();
    let probe = Probe::new();
    probe.edit(|s| {
        s.hang.insert(1);
    });
    let committer = wal.spawn_committer(probe.clone()).unwrap();
    seal(&wal, 1, &recs(1, 2)).await;
    wal.checkpoint_complete(1).unwrap();
    wait_until("the sink hangs", || probe.calls().contains(&1)).await;
    let report = guard("shutdown", committer.shutdown(ms(200))).await;
    assert!(!report.clean);
    guard("AsyncWal::shutdown", wal.shutdown()).await;
    let (_wal, report) = reopen(dir.path(), o).await;
    assert_eq!(report.pending, vec![1]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn opening_a_log_that_is_open_fails_with_locked_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let (_wal, _) = AsyncWal::open(dir.path(), opts("locked")).await.unwrap();
    let e = guard("second open", AsyncWal::open(dir.path(), opts("locked")))
        .await
        .expect_err("a second open must fail");
    assert!(matches!(e.kind(), ErrorKind::Locked { .. }), "{e:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn appends_racing_checkpoints_land_in_exactly_one_epoch_each_in_task_order() {
    let dir = tempfile::tempdir().unwrap();
    let (wal, _) = AsyncWal::open(dir.path(), opts("race-cp").write_buffer_size(4096))
        .await
        .unwrap();
    let probe = Probe::with_marker();
    let committer = wal.spawn_committer(probe.clone()).unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let mut tasks = Vec::new();
    for t in 0..4 {
        let (w, stop) = (wal.clone(), stop.clone());
        tasks.push(tokio::spawn(async move {
            let mut rng = fastrand::Rng::with_seed(t);
            let mut mine = Vec::new();
            let mut i = 0;
            while !stop.load(Ordering::SeqCst) {
                let pad = if rng.u8(..) < 20 {
                    6000
                } else {
                    rng.usize(0..40)
                };
                let r = format!("t{t}-{i:06}-{}", "p".repeat(pad)).into_bytes();
                if rng.bool() {
                    w.append(&r).await.unwrap();
                } else {
                    let r2 = format!("t{t}-{:06}-b", i + 1).into_bytes();
                    w.append_batch(&[r.as_slice(), r2.as_slice()])
                        .await
                        .unwrap();
                    mine.push(r);
                    i += 1;
                    mine.push(r2);
                    i += 1;
                    continue;
                }
                mine.push(r);
                i += 1;
            }
            mine
        }));
    }
    for cp in 1..=40 {
        tokio::time::sleep(ms(1)).await;
        wal.checkpoint(cp, b"").await.unwrap();
        wal.checkpoint_complete(cp).unwrap();
    }
    stop.store(true, Ordering::SeqCst);
    let mut expected = Vec::new();
    for t in tasks {
        expected.push(guard("appender", t).await.unwrap());
    }
    wal.checkpoint(41, b"").await.unwrap();
    wal.checkpoint_complete(41).unwrap();
    assert!(guard("commit 41", wal.wait_committed(41, Duration::MAX)).await);
    committer.shutdown(Duration::from_secs(10)).await;
    let got = probe.records();
    let all: Vec<Vec<u8>> = expected.iter().flatten().cloned().collect();
    assert_each_once(&got, &all);
    for (t, mine) in expected.iter().enumerate() {
        let seen: Vec<&Vec<u8>> = got
            .iter()
            .filter(|r| r.starts_with(format!("t{t}-").as_bytes()))
            .collect();
        assert!(
            seen.iter().copied().eq(mine.iter()),
            "task {t}'s records out of order"
        );
    }
    assert!(probe.violations().is_empty(), "{:?}", probe.violations());
}
