//! Graceful shutdown with a deadline: a hung sink, a slow delivery, a backing-off committer, a
//! hung `is_committed` or a commit mark stuck in the disk return by the deadline, say whether
//! the stop was clean and name what is pending; a graceful shutdown marks all it delivered;
//! durable appends racing `AsyncWal::shutdown` all return; a dropped runtime or dropped
//! handles give the log back so it reopens in the process.

use crate::support::*;
use parking_lot::Mutex;
use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;
use walsink::storage::CrashOptions;
use walsink::{MemorySink, Mode, Options, RetryPolicy, WalSink};
use walsink_tokio::AsyncWal;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_with_a_hung_sink_returns_unclean_names_what_is_pending_and_the_log_reopens() {
    let dir = tempfile::tempdir().unwrap();
    let o = opts("sd-hang");
    let (wal, _) = AsyncWal::open(dir.path(), o.clone()).await.unwrap();
    let probe = Probe::new();
    probe.edit(|s| {
        s.hang.insert(2);
    });
    let committer = wal.spawn_committer(probe.clone()).unwrap();
    for cp in 1..=3 {
        seal(&wal, cp, &recs(cp, 2)).await;
    }
    wal.checkpoint_complete(3).unwrap();
    wait_until("the sink to hang in epoch 2", || probe.calls().contains(&2)).await;
    let report = guard("shutdown with a deadline", committer.shutdown(ms(300))).await;
    assert!(
        !report.clean,
        "the deadline cut a delivery short: {report:?}"
    );
    assert_eq!(report.pending, vec![2, 3], "{report:?}");
    assert_eq!(report.committed, Some(1), "{report:?}");
    assert_eq!(pending_ids(&wal), vec![2, 3]);
    drop(wal);
    let (wal, report) = reopen(dir.path(), o).await;
    assert_eq!(report.pending, vec![2, 3]);
    wal.checkpoint_complete(3).unwrap();
    let mut p2 = Probe::new();
    wal.deliver_ready(&mut p2).await.unwrap();
    assert_eq!(p2.ok_ids(), vec![2, 3]);
    assert_eq!(probe.ok_ids(), vec![1]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_lets_a_slow_delivery_finish_before_the_deadline_and_reports_clean() {
    let dir = tempfile::tempdir().unwrap();
    let (wal, _) = AsyncWal::open(dir.path(), opts("sd-slow")).await.unwrap();
    let probe = Probe::new();
    probe.edit(|s| {
        s.hold.insert(1);
    });
    let committer = wal.spawn_committer(probe.clone()).unwrap();
    for cp in 1..=3 {
        seal(&wal, cp, &recs(cp, 2)).await;
    }
    wal.checkpoint_complete(3).unwrap();
    wait_until("the sink to be in epoch 1", || probe.calls().contains(&1)).await;
    let sd = tokio::spawn(committer.shutdown(Duration::from_secs(60)));
    for _ in 0..5 {
        tokio::task::yield_now().await;
    }
    probe.edit(|s| {
        s.hold.clear();
    });
    let report = guard("shutdown", sd).await.unwrap();
    assert!(report.clean, "{report:?}");
    let delivered = probe.ok_ids();
    assert!(delivered.starts_with(&[1]), "{delivered:?}");
    for cp in 1..=3u64 {
        assert!(
            delivered.contains(&cp) != report.pending.contains(&cp),
            "checkpoint {cp} must be either delivered or pending: {report:?} {delivered:?}"
        );
    }
    assert_eq!(
        report.committed,
        delivered.last().copied(),
        "delivered epochs are marked"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_of_a_committer_backing_off_from_a_failing_sink_returns_by_the_deadline() {
    let dir = tempfile::tempdir().unwrap();
    let hour = Duration::from_secs(3600);
    let (wal, _) = AsyncWal::open(
        dir.path(),
        Options::new("sd-fail").retry(RetryPolicy::new(hour, hour)),
    )
    .await
    .unwrap();
    let probe = Probe::new();
    probe.edit(|s| s.fail_always = true);
    let committer = wal.spawn_committer(probe.clone()).unwrap();
    seal(&wal, 1, &recs(1, 2)).await;
    wal.checkpoint_complete(1).unwrap();
    wait_until("a failed attempt", || wal.health().errors >= 1).await;
    let report = guard(
        "shutdown while the committer backs off for up to an hour",
        committer.shutdown(ms(500)),
    )
    .await;
    assert_eq!(report.pending, vec![1], "{report:?}");
    assert_eq!(report.committed, None, "{report:?}");
    assert!(probe.ok_ids().is_empty());
    assert!(wal.health().last_error.is_some());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_with_a_hung_is_committed_returns_by_the_deadline() {
    let dir = tempfile::tempdir().unwrap();
    let (wal, _) = AsyncWal::open(dir.path(), opts("sd-hang-ic"))
        .await
        .unwrap();
    let probe = Probe::with_marker();
    probe.edit(|s| s.hang_is_committed = true);
    let committer = wal.spawn_committer(probe.clone()).unwrap();
    seal(&wal, 1, &recs(1, 2)).await;
    wal.checkpoint_complete(1).unwrap();
    wait_until("is_committed to be asked", || {
        !probe.s.lock().is_committed_calls.is_empty()
    })
    .await;
    let report = guard("shutdown", committer.shutdown(ms(300))).await;
    assert_eq!(report.pending, vec![1], "{report:?}");
    assert!(
        !report.clean,
        "the deadline cut the delivery of 1 short: {report:?}"
    );
    // the next deliverer gets the log
    probe.edit(|s| s.hang_is_committed = false);
    let mut p = probe.clone();
    let n = guard("deliver_ready", wal.deliver_ready(&mut p))
        .await
        .unwrap();
    assert_eq!(n, 1);
    assert_eq!(probe.ok_ids(), vec![1]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_of_an_idle_committer_with_zero_and_max_deadlines_is_clean() {
    for deadline in [Duration::ZERO, Duration::from_nanos(1), Duration::MAX] {
        let dir = tempfile::tempdir().unwrap();
        let (wal, _) = AsyncWal::open(dir.path(), opts("sd-idle")).await.unwrap();
        let probe = Probe::new();
        let committer = wal.spawn_committer(probe.clone()).unwrap();
        seal(&wal, 1, &recs(1, 2)).await;
        wal.checkpoint_complete(1).unwrap();
        assert!(guard("commit", wal.wait_committed(1, Duration::MAX)).await);
        let report = guard("shutdown", committer.shutdown(deadline)).await;
        assert!(
            report.clean,
            "{deadline:?}: an idle committer is at a boundary: {report:?}"
        );
        assert!(report.pending.is_empty(), "{deadline:?}: {report:?}");
        assert_eq!(report.committed, Some(1), "{deadline:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn async_wal_shutdown_reports_pending_and_clones_then_refuse_durable_appends() {
    let dir = tempfile::tempdir().unwrap();
    let (wal, _) = AsyncWal::open(dir.path(), opts("wal-sd").mode(Mode::Durable))
        .await
        .unwrap();
    wal.append(b"one").await.unwrap();
    let clone = wal.clone();
    let pending = guard("AsyncWal::shutdown", wal.shutdown()).await;
    assert_eq!(
        pending.len(),
        1,
        "the acknowledged record's epoch is pending: {pending:?}"
    );
    let r = guard(
        "a durable append on a clone after shutdown",
        clone.append(b"two"),
    )
    .await;
    assert!(
        r.is_err(),
        "clones stop working for durable appends after shutdown: it must fail, got Ok"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn durable_appends_racing_async_wal_shutdown_all_return_and_the_acknowledged_arrive_once() {
    let dir = tempfile::tempdir().unwrap();
    let o = opts("durable-sd-race").mode(Mode::Durable);
    let (wal, _) = AsyncWal::open(dir.path(), o.clone()).await.unwrap();
    let acked: Arc<Mutex<Vec<Vec<u8>>>> = Arc::default();
    let mut tasks = Vec::new();
    for t in 0..8 {
        let (w, acked) = (wal.clone(), acked.clone());
        tasks.push(tokio::spawn(async move {
            for i in 0..3000 {
                let r = format!("t{t}-{i}").into_bytes();
                match w.append(&r).await {
                    Ok(()) => acked.lock().push(r),
                    Err(_) => return,
                }
            }
        }));
    }
    wait_until("some acknowledged appends", || acked.lock().len() >= 100).await;
    guard("AsyncWal::shutdown under load", wal.shutdown()).await;
    for t in tasks {
        guard("an appending task after shutdown", t).await.unwrap();
    }
    let (wal, _) = reopen(dir.path(), o).await;
    let mut p = Probe::new();
    wal.deliver_ready(&mut p).await.unwrap();
    let got = p.records();
    let set: HashSet<&Vec<u8>> = got.iter().collect();
    assert_eq!(set.len(), got.len(), "no record twice");
    for r in acked.lock().iter() {
        assert!(
            set.contains(r),
            "acknowledged {} lost",
            String::from_utf8_lossy(r)
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn async_wal_shutdown_finishes_the_sync_a_waiting_durable_append_asked_for() {
    let g = Gated::default();
    let o = opts("sd-sync").mode(Mode::Durable);
    let wal = g.wal(o.clone());
    g.sync.close();
    let g2 = g.sync.clone();
    let wd = Watchdog::start(100, move || g2.open());
    let w = wal.clone();
    let waiting = tokio::spawn(async move { w.append(b"asked before shutdown").await });
    wait_until("the append's sync to be held", || g.sync.waiting() > 0).await;
    let sd = tokio::spawn(wal.shutdown());
    for _ in 0..5 {
        tokio::time::sleep(ms(1)).await;
    }
    g.sync.open();
    guard("shutdown", sd).await.unwrap();
    guard("the waiting append", waiting)
        .await
        .unwrap()
        .expect("a sync asked for before shutdown is finished");
    assert!(!wd.fired());
    g.sim.crash(CrashOptions::power_loss(5));
    let (w, _) = WalSink::open_with_storage(Arc::new(g.sim.clone()), o).unwrap();
    let mut ms = MemorySink::new();
    w.deliver_ready(&mut ms).unwrap();
    assert_eq!(ms.records(), vec![b"asked before shutdown".to_vec()]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_returns_by_its_deadline_while_a_commit_mark_is_stuck_in_the_disk() {
    let g = Gated::default();
    let wal = g.wal(opts("sd-mark-stuck"));
    let probe = Probe::new();
    let committer = wal.spawn_committer(probe.clone()).unwrap();
    seal(&wal, 1, &recs(1, 2)).await;
    g.sync.close();
    let g2 = g.sync.clone();
    let wd = Watchdog::start(100, move || g2.open());
    wal.checkpoint_complete(1).unwrap();
    wait_until("the mark of epoch 1 held in the disk", || {
        g.sync.waiting() > 0
    })
    .await;
    let report = guard("shutdown with a deadline", committer.shutdown(ms(300))).await;
    let fired = wd.fired();
    g.sync.open();
    assert!(
        !fired,
        "shutdown(300 ms) waited for a stuck disk until the watchdog freed it"
    );
    assert_eq!(probe.ok_ids(), vec![1]);
    assert!(
        report.pending == vec![1] || report.committed == Some(1),
        "epoch 1 is pending or committed: {report:?}"
    );
}

#[test]
fn a_committer_whose_runtime_is_dropped_mid_delivery_gives_the_log_back() {
    let dir = tempfile::tempdir().unwrap();
    let o = opts("rt-drop");
    let probe = Probe::new();
    probe.edit(|s| {
        s.hang.insert(2);
    });
    {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let committer = rt.block_on(async {
            let (wal, _) = AsyncWal::open(dir.path(), o.clone()).await.unwrap();
            let c = wal.spawn_committer(probe.clone()).unwrap();
            for cp in 1..=3 {
                seal(&wal, cp, &recs(cp, 2)).await;
            }
            wal.checkpoint_complete(3).unwrap();
            wait_until("the sink hangs in 2", || probe.calls().contains(&2)).await;
            c
        });
        drop(rt); // the program's runtime goes away with the delivery of 2 in flight
        drop(committer);
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let (wal, report) = reopen(dir.path(), o.clone()).await;
        assert_eq!(report.pending, vec![2, 3], "{report:?}");
        wal.checkpoint_complete(3).unwrap();
        let mut p2 = Probe::new();
        wal.deliver_ready(&mut p2).await.unwrap();
        assert_eq!(p2.ok_ids(), vec![2, 3]);
    });
    assert_eq!(probe.ok_ids(), vec![1]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_graceful_shutdown_in_a_stream_of_epochs_marks_all_it_delivered() {
    let dir = tempfile::tempdir().unwrap();
    let o = opts("sd-stream").mark_every(1000);
    let (wal, _) = AsyncWal::open(dir.path(), o.clone()).await.unwrap();
    for cp in 1..=50 {
        seal(&wal, cp, &recs(cp, 1)).await;
    }
    let probe = Probe::new();
    probe.edit(|s| {
        s.hold.insert(30);
    });
    let committer = wal.spawn_committer(probe.clone()).unwrap();
    wal.checkpoint_complete(50).unwrap();
    wait_until("the sink in epoch 30", || probe.calls().contains(&30)).await;
    let sd = tokio::spawn(committer.shutdown(Duration::from_secs(60)));
    for _ in 0..5 {
        tokio::task::yield_now().await;
    }
    probe.edit(|s| {
        s.hold.clear();
    });
    let report = guard("shutdown", sd).await.unwrap();
    assert!(report.clean, "{report:?}");
    let delivered = probe.ok_ids();
    let last = *delivered.last().unwrap();
    assert_eq!(delivered, (1..=last).collect::<Vec<_>>());
    assert_eq!(
        report.committed,
        Some(last),
        "shutdown marks what was delivered"
    );
    assert_eq!(report.pending, ((last + 1)..=50).collect::<Vec<_>>());
    drop(wal);
    let (wal, r2) = reopen(dir.path(), o).await;
    assert_eq!(r2.committed, Some(last));
    assert_eq!(r2.pending, report.pending);
    wal.checkpoint_complete(50).unwrap();
    let mut p2 = Probe::new();
    wal.deliver_ready(&mut p2).await.unwrap();
    assert_eq!(
        p2.ok_ids(),
        report.pending,
        "nothing delivered twice without a crash"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropping_every_handle_without_shutdown_releases_the_log_in_both_modes() {
    for mode in [Mode::Checkpointed, Mode::Durable] {
        let dir = tempfile::tempdir().unwrap();
        let o = opts("drop-all").mode(mode);
        {
            let (wal, _) = AsyncWal::open(dir.path(), o.clone()).await.unwrap();
            wal.append(b"a").await.unwrap();
            if mode == Mode::Checkpointed {
                wal.checkpoint(1, b"").await.unwrap();
            }
            let _c2 = wal.clone();
        }
        let (wal, report) = reopen(dir.path(), o.clone()).await;
        assert_eq!(report.pending, vec![1], "{mode:?}: {report:?}");
        // and with a committer whose handle is dropped instead of shut down
        let c = wal.spawn_committer(Probe::new()).unwrap();
        if mode == Mode::Checkpointed {
            wal.checkpoint_complete(1).unwrap();
        }
        assert!(guard("commit", wal.wait_committed(1, Duration::MAX)).await);
        drop(c);
        drop(wal);
        let (_wal, report) = reopen(dir.path(), o).await;
        assert!(report.pending.is_empty(), "{mode:?}: {report:?}");
    }
}
