//! Power loss and disk faults under the async API: acknowledged durable appends survive a power
//! loss, a restore that returned survives one and its voided ids stay used, a forgetful commit
//! store with a marker sink never reuses a committed id, failed syncs answer every waiting
//! durable append with an error, a failed write poisons the log for every method, a read error
//! in the middle of `AsyncChunks` is retried, and reports after a restart name sealed but
//! incomplete epochs.

use crate::support::*;
use parking_lot::Mutex;
use std::collections::HashSet;
use std::io;
use std::sync::Arc;
use std::time::Duration;
use walsink::storage::{CrashOptions, SimStorage};
use walsink::{ErrorKind, MemorySink, Mode, WalSink};
use walsink_tokio::AsyncWal;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acknowledged_durable_appends_from_many_tasks_survive_a_power_loss_in_the_middle() {
    for seed in 0..4u64 {
        let sim = SimStorage::new();
        let o = opts("durable-crash").mode(Mode::Durable);
        let (wal, _) = sim_wal(&sim, o.clone());
        let acked: Arc<Mutex<Vec<Vec<u8>>>> = Arc::default();
        let mut tasks = Vec::new();
        for t in 0..8 {
            let (w, acked) = (wal.clone(), acked.clone());
            tasks.push(tokio::spawn(async move {
                for i in 0..5000 {
                    let r = format!("s{seed}-t{t}-{i}").into_bytes();
                    match w.append(&r).await {
                        Ok(()) => acked.lock().push(r),
                        Err(_) => return,
                    }
                }
            }));
        }
        wait_until("some acknowledged appends", || acked.lock().len() >= 200).await;
        sim.crash(CrashOptions::power_loss(seed));
        let acked_at_crash = acked.lock().len();
        for t in tasks {
            guard("an appending task after the power loss", t)
                .await
                .unwrap();
        }
        drop(wal);
        let (w, report) = WalSink::open_with_storage(Arc::new(sim.clone()), o.clone())
            .expect("reopen after power loss");
        let mut ms = MemorySink::new();
        w.deliver_ready(&mut ms).unwrap();
        let got = ms.records();
        let set: HashSet<&Vec<u8>> = got.iter().collect();
        assert_eq!(set.len(), got.len(), "seed {seed}: no record twice");
        let acked = acked.lock().clone();
        assert!(acked.len() >= acked_at_crash);
        for r in &acked {
            assert!(
                set.contains(r),
                "seed {seed}: acknowledged durable record {} lost ({report:?})",
                String::from_utf8_lossy(r)
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_error_in_the_middle_of_async_chunks_is_retried_and_the_epoch_arrives_whole() {
    let sim = SimStorage::new();
    let o = opts("read-fault").read_chunk_size(1024);
    let (wal, _) = sim_wal(&sim, o);
    let records: Vec<Vec<u8>> = (0..2000)
        .map(|i| format!("{i:06}-{}", "r".repeat(i % 30)).into_bytes())
        .collect();
    seal(&wal, 1, &records).await;
    wal.checkpoint_complete(1).unwrap();
    sim.inject_fault(walsink::storage::FaultOp::Read, 7, io::ErrorKind::Other);
    let probe = Probe::with_marker();
    let committer = wal.spawn_committer(probe.clone()).unwrap();
    assert!(guard("commit 1", wal.wait_committed(1, Duration::MAX)).await);
    committer.shutdown(Duration::from_secs(10)).await;
    assert_eq!(sim.pending_faults(), 0, "the injected read fault was hit");
    assert!(
        wal.health().errors >= 1,
        "the failed attempt counts: {:?}",
        wal.health()
    );
    assert_eq!(probe.ok_ids(), vec![1]);
    assert_eq!(probe.records(), records);
    assert!(probe.violations().is_empty(), "{:?}", probe.violations());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restore_that_returned_survives_a_power_loss_and_its_voided_ids_stay_used() {
    for seed in 0..8u64 {
        let sim = SimStorage::new();
        let o = opts("restore-crash");
        let (wal, _) = sim_wal(&sim, o.clone());
        for cp in 1..=3 {
            seal(&wal, cp, &recs(cp, 5)).await;
        }
        wal.append(b"unsealed").await.unwrap();
        wal.restore(Some(1)).await.unwrap();
        sim.crash(CrashOptions::power_loss(seed));
        drop(wal);
        let (report, got) = reopen_and_drain(&sim, o.clone());
        assert_eq!(
            report.pending,
            vec![1],
            "seed {seed}: voided epochs came back: {report:?}"
        );
        assert!(
            report.next_checkpoint_id > 3,
            "seed {seed}: ids 2 and 3 were used before the restore: {report:?}"
        );
        assert_eq!(got, vec![(1, recs(1, 5))], "seed {seed}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forgetful_commit_store_with_a_marker_sink_never_reuses_a_committed_id_after_restart() {
    for mode in [Mode::Checkpointed, Mode::Durable] {
        let sim = SimStorage::new();
        let o = opts("forgetful")
            .mode(mode)
            .segment_size(4096)
            .max_record_size(1024)
            .max_metadata_size(256);
        let probe = Probe::with_marker();
        let mut expected = Vec::new();
        {
            let (w, _) = WalSink::open_with(
                Arc::new(sim.clone()),
                o.clone(),
                Box::new(walsink::MemoryCommitStore::new()),
            )
            .unwrap();
            let wal = AsyncWal::from_sync(w).unwrap();
            let committer = wal.spawn_committer(probe.clone()).unwrap();
            for i in 0..30u64 {
                let r = format!("first-{i:03}-{}", "f".repeat(400)).into_bytes();
                expected.push(r.clone());
                wal.append(&r).await.unwrap();
                if mode == Mode::Checkpointed {
                    wal.checkpoint(i + 1, b"").await.unwrap();
                    wal.checkpoint_complete(i + 1).unwrap();
                }
            }
            wait_until("first run delivered", || probe.records().len() == 30).await;
            committer.shutdown(Duration::from_secs(10)).await;
            wal.shutdown().await;
        }
        sim.crash(CrashOptions::process_kill());
        let (w, report) = WalSink::open_with(
            Arc::new(sim.clone()),
            o.clone(),
            Box::new(walsink::MemoryCommitStore::new()),
        )
        .unwrap();
        let wal = AsyncWal::from_sync(w).unwrap();
        let mut next = report.next_checkpoint_id;
        for i in 0..5u64 {
            let r = format!("second-{i:03}").into_bytes();
            expected.push(r.clone());
            wal.append(&r).await.unwrap();
            if mode == Mode::Checkpointed {
                wal.checkpoint(next, b"").await.unwrap();
                wal.checkpoint_complete(next).unwrap();
                next += 1;
            }
        }
        let mut p = probe.clone();
        wal.deliver_ready(&mut p).await.unwrap();
        assert_eq!(
            probe.records(),
            expected,
            "{mode:?}: records after the restart were skipped as committed (reused ids?) {report:?}"
        );
        assert!(
            probe.violations().is_empty(),
            "{mode:?}: {:?}",
            probe.violations()
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failed_syncs_answer_every_waiting_durable_append_with_an_error() {
    let sim = SimStorage::new();
    let o = opts("sync-fault").mode(Mode::Durable);
    let (wal, _) = sim_wal(&sim, o);
    wal.append(b"before").await.unwrap();
    sim.inject_fault(walsink::storage::FaultOp::SyncData, 0, io::ErrorKind::Other);
    let mut tasks = Vec::new();
    for t in 0..8 {
        let w = wal.clone();
        tasks.push(tokio::spawn(async move {
            let mut results = Vec::new();
            for i in 0..5 {
                results.push(w.append(format!("t{t}-{i}").as_bytes()).await.is_ok());
            }
            results
        }));
    }
    let mut oks = 0;
    for t in tasks {
        let r = guard("a durable append after a failed sync", t)
            .await
            .unwrap();
        oks += r.iter().filter(|&&ok| ok).count();
    }
    assert!(
        oks < 40,
        "a failed sync must fail the appends waiting for it"
    );
    let h = wal.health();
    assert!(h.poisoned, "{h:?}");
    let e = guard("append on a poisoned log", wal.append(b"after"))
        .await
        .unwrap_err();
    assert!(e.is_poisoned(), "{e:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_write_poisons_the_log_and_every_async_method_reports_it() {
    let sim = SimStorage::new();
    let o = opts("write-fault").write_buffer_size(4096);
    let (wal, _) = sim_wal(&sim, o);
    seal(&wal, 1, &recs(1, 2)).await;
    sim.inject_fault(
        walsink::storage::FaultOp::Write,
        0,
        io::ErrorKind::StorageFull,
    );
    let e = guard("a large append", wal.append(&vec![0u8; 10_000]))
        .await
        .unwrap_err();
    assert!(
        matches!(e.kind(), ErrorKind::Io { .. } | ErrorKind::Poisoned { .. }),
        "{e:?}"
    );
    let e = guard("checkpoint", wal.checkpoint(2, b""))
        .await
        .unwrap_err();
    assert!(e.is_poisoned(), "{e:?}");
    let e = guard("small append", wal.append(b"x")).await.unwrap_err();
    assert!(e.is_poisoned(), "{e:?}");
    // what was sealed before can still be delivered
    wal.checkpoint_complete(1).unwrap();
    let mut p = Probe::new();
    let _ = guard("deliver", wal.deliver_ready(&mut p)).await;
    assert_eq!(p.ok_ids(), vec![1]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reports_name_sealed_but_incomplete_epochs_and_earlier_commits_after_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let o = opts("reports");
    {
        let (wal, _) = AsyncWal::open(dir.path(), o.clone()).await.unwrap();
        for cp in 1..=4 {
            seal(&wal, cp, &recs(cp, 1)).await;
        }
        wal.checkpoint_complete(2).unwrap();
        let probe = Probe::new();
        let committer = wal.spawn_committer(probe.clone()).unwrap();
        assert!(guard("commit 2", wal.wait_committed(2, Duration::MAX)).await);
        let report = committer.shutdown(Duration::from_secs(10)).await;
        assert!(report.clean);
        assert_eq!(
            report.pending,
            vec![3, 4],
            "sealed but not complete is pending: {report:?}"
        );
        assert_eq!(report.committed, Some(2));
        let pending: Vec<u64> = wal.shutdown().await.iter().map(|p| p.id).collect();
        assert_eq!(pending, vec![3, 4]);
    }
    let (wal, report) = reopen(dir.path(), o).await;
    assert_eq!(report.committed, Some(2));
    assert!(
        wal.wait_committed(1, Duration::ZERO).await,
        "committed before the restart"
    );
    assert!(wal.wait_committed(2, Duration::ZERO).await);
    assert!(!wal.wait_committed(3, Duration::ZERO).await);
    let committer = wal.spawn_committer(Probe::new()).unwrap();
    let report = committer.shutdown(Duration::from_secs(10)).await;
    assert_eq!(
        report.committed,
        Some(2),
        "an idle committer reports the earlier commit"
    );
    assert_eq!(report.pending, vec![3, 4]);
}
