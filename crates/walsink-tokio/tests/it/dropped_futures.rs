//! Cancellation safety, checked with power loss: a checkpoint, an append batch, a durable
//! append, `deliver_ready`, a shutdown, a committer handle, `wait_committed`, a restore, an
//! open or an `AsyncChunks` read dropped at any poll point leaves the log as the `# Cancel
//! safety` sections say: whole epochs or none, nothing half sealed after a power loss, ids
//! never reused, epochs offered again but never resent once marked, no chunk skipped.

use crate::support::*;
use parking_lot::Mutex;
use std::future::Future;
use std::pin::{pin, Pin};
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::Duration;
use walsink::storage::{CrashOptions, SimStorage};
use walsink::{Epoch, ErrorKind, MemorySink, Mode, SinkError, WalSink};
use walsink_tokio::{AsyncChunks, AsyncSink, AsyncWal};

/// Polls `f` up to `n` times with a waker that does nothing; `Some` if it completed.
fn poll_n<F: Future>(mut f: Pin<&mut F>, n: usize) -> Option<F::Output> {
    let mut cx = Context::from_waker(Waker::noop());
    for _ in 0..n {
        if let Poll::Ready(v) = f.as_mut().poll(&mut cx) {
            return Some(v);
        }
    }
    None
}

/// A sink that abandons a `next()` mid-read and then keeps using the same iterator.
#[derive(Clone, Default)]
struct Abandon {
    report: Arc<Mutex<Vec<String>>>,
}

impl AsyncSink for Abandon {
    async fn deliver(&mut self, epoch: &Epoch) -> Result<(), SinkError> {
        let mut it = AsyncChunks::new(epoch);
        let mut expected_next = 0u64;
        for _ in 0..2 {
            if let Some(Ok(c)) = it.next().await {
                expected_next = c.first_index() + c.len();
            }
        }
        let consumed = tokio::select! {
            biased;
            c = it.next() => Some(c),
            _ = std::future::ready(()) => None,
        };
        if let Some(Some(Ok(c))) = &consumed {
            expected_next = c.first_index() + c.len();
        }
        if consumed.is_none() {
            // the read in flight was dropped: the iterator must end, never skip that chunk
            if let Some(Ok(c)) = it.next().await {
                if c.first_index() != expected_next {
                    self.report.lock().push(format!(
                        "after a dropped read the iterator went on at record {} instead of {expected_next} (or ending)",
                        c.first_index()
                    ));
                }
            }
        }
        self.report.lock().push("done".into());
        Ok(())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_checkpoint_dropped_at_any_poll_then_a_power_loss_never_reopens_half_sealed() {
    let o = opts("cp-drop")
        .write_buffer_size(4096)
        .max_record_size(16 * 1024)
        .max_metadata_size(1024)
        .segment_size(64 * 1024);
    let one = recs(1, 10);
    let two: Vec<Vec<u8>> = (0..2000)
        .map(|i| format!("two-{i:06}-{}", "x".repeat(i % 40)).into_bytes())
        .collect();
    for k in 0..4usize {
        for seed in 0..5u64 {
            let sim = SimStorage::new();
            let (wal, _) = sim_wal(&sim, o.clone());
            seal(&wal, 1, &one).await;
            wal.append_batch(&refs(&two)).await.unwrap();
            let finished = {
                let f = pin!(wal.checkpoint(2, b"two"));
                poll_n(f, k)
            };
            sim.crash(CrashOptions::power_loss(seed * 7 + k as u64));
            drop(wal);
            let (report, got) = reopen_and_drain(&sim, o.clone());
            assert!(
                report.pending.contains(&1),
                "k={k} seed={seed}: checkpoint 1 was durable: {report:?}"
            );
            for (cp, records) in &got {
                match cp {
                    1 => assert_eq!(records, &one, "k={k} seed={seed}"),
                    2 => assert_eq!(
                        records.len(),
                        two.len(),
                        "k={k} seed={seed}: checkpoint 2 reopened half-sealed"
                    ),
                    other => panic!("k={k} seed={seed}: unexpected checkpoint {other}"),
                }
                if *cp == 2 {
                    assert_eq!(records, &two, "k={k} seed={seed}");
                }
            }
            if let Some(Ok(())) = finished {
                assert!(
                    got.iter().any(|(c, _)| *c == 2),
                    "k={k} seed={seed}: a checkpoint that returned Ok was lost"
                );
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_checkpoint_dropped_while_its_sync_is_stuck_then_a_power_loss_never_reopens_half_sealed()
{
    let o = opts("cp-drop-sync")
        .write_buffer_size(4096)
        .max_record_size(16 * 1024)
        .max_metadata_size(1024)
        .segment_size(64 * 1024);
    let one = recs(1, 10);
    let two: Vec<Vec<u8>> = (0..1500)
        .map(|i| format!("two-{i:06}-{}", "y".repeat(i % 50)).into_bytes())
        .collect();
    for seed in 0..12u64 {
        let g = Gated::default();
        let wal = g.wal(o.clone());
        seal(&wal, 1, &one).await;
        wal.append_batch(&refs(&two)).await.unwrap();
        g.sync.close();
        let g2 = g.sync.clone();
        let _wd = Watchdog::start(120, move || g2.open());
        {
            let mut f = pin!(wal.checkpoint(2, b"two"));
            guard("checkpoint reaching its sync", async {
                loop {
                    if poll_n(f.as_mut(), 1).is_some() {
                        panic!("checkpoint returned while its sync was held");
                    }
                    if g.sync.waiting() > 0 {
                        break;
                    }
                    tokio::time::sleep(ms(1)).await;
                }
            })
            .await;
        } // dropped half-way through its sync
        g.sim.crash(CrashOptions::power_loss(seed));
        g.sync.open();
        drop(wal);
        let (report, got) = reopen_and_drain(&g.sim, o.clone());
        assert!(report.pending.contains(&1), "seed={seed}: {report:?}");
        for (cp, records) in &got {
            match cp {
                1 => assert_eq!(records, &one),
                2 => assert_eq!(
                    records, &two,
                    "seed={seed}: checkpoint 2 reopened half-sealed"
                ),
                other => panic!("seed={seed}: unexpected checkpoint {other}"),
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_checkpoint_runs_to_its_end_shows_in_pending_and_its_id_is_then_refused() {
    let dir = tempfile::tempdir().unwrap();
    let (wal, _) = AsyncWal::open(dir.path(), opts("cp-pending"))
        .await
        .unwrap();
    wal.append_batch(&refs(&recs(1, 100))).await.unwrap();
    {
        let f = pin!(wal.checkpoint(1, b"m"));
        let _ = poll_n(f, 1);
    }
    wait_until("the dropped checkpoint to show in pending()", || {
        pending_ids(&wal) == vec![1]
    })
    .await;
    assert_eq!(wal.pending()[0].records, 100);
    assert_eq!(wal.pending()[0].metadata, b"m".to_vec());
    let e = wal.checkpoint(1, b"again").await.unwrap_err();
    assert!(
        matches!(e.kind(), ErrorKind::InvalidCheckpoint { .. }),
        "the same id again must fail with InvalidCheckpoint: {e:?}"
    );
    wal.checkpoint(2, b"").await.unwrap();
    assert_eq!(pending_ids(&wal), vec![1, 2]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retrying_a_dropped_checkpoint_at_once_seals_exactly_one_whole_epoch() {
    for round in 0..10u64 {
        let dir = tempfile::tempdir().unwrap();
        let (wal, _) = AsyncWal::open(dir.path(), opts("cp-retry")).await.unwrap();
        let records = recs(round, 50);
        wal.append_batch(&refs(&records)).await.unwrap();
        {
            let f = pin!(wal.checkpoint(1, b"first"));
            let _ = poll_n(f, 1);
        }
        match wal.checkpoint(1, b"retry").await {
            Ok(()) => {}
            Err(e) => assert!(
                matches!(e.kind(), ErrorKind::InvalidCheckpoint { .. }),
                "round {round}: a retry may only fail with InvalidCheckpoint: {e:?}"
            ),
        }
        wait_until("the dropped checkpoint to settle", || {
            !wal.pending().is_empty()
        })
        .await;
        // give the dropped one every chance to finish, then check the whole picture
        wal.checkpoint(2, b"").await.unwrap();
        let p = wal.pending();
        assert_eq!(
            p.iter().map(|p| p.id).collect::<Vec<_>>(),
            vec![1, 2],
            "round {round}"
        );
        assert_eq!(
            p[0].records, 50,
            "round {round}: epoch 1 holds every record"
        );
        assert_eq!(p[1].records, 0, "round {round}");
        wal.checkpoint_complete(2).unwrap();
        let mut sink = Probe::new();
        wal.deliver_ready(&mut sink).await.unwrap();
        assert_eq!(sink.records(), records);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn append_batches_dropped_at_any_poll_are_all_or_nothing_and_in_order() {
    let sim = SimStorage::new();
    let o = opts("append-drop").write_buffer_size(4096);
    let (wal, _) = sim_wal(&sim, o.clone());
    let batch = |k: usize| -> Vec<Vec<u8>> {
        (0..3)
            .map(|j| format!("batch{k}-{j}-{}", "z".repeat(3000)).into_bytes())
            .collect()
    };
    for k in 0..6usize {
        let b = batch(k);
        let r = refs(&b);
        {
            let f = pin!(wal.append_batch(&r));
            let _ = poll_n(f, k % 3);
        }
        wal.append(format!("marker{k}").as_bytes()).await.unwrap();
        wal.checkpoint(k as u64 + 1, b"").await.unwrap();
    }
    wal.checkpoint_complete(6).unwrap();
    let check = |all: &[Vec<u8>], when: &str| {
        for k in 0..6 {
            let b = batch(k);
            let pos: Vec<usize> = all
                .iter()
                .enumerate()
                .filter(|(_, r)| r.starts_with(format!("batch{k}-").as_bytes()))
                .map(|(i, _)| i)
                .collect();
            assert!(
                pos.is_empty() || pos.len() == 3,
                "{when}: batch {k} partly appended ({} of 3 records)",
                pos.len()
            );
            if pos.len() == 3 {
                assert_eq!(pos[2] - pos[0], 2, "{when}: batch {k} split");
                assert_eq!(
                    &all[pos[0]..=pos[2]],
                    &b[..],
                    "{when}: batch {k} out of order"
                );
            }
        }
    };
    let mut sink = Probe::new();
    wal.deliver_ready(&mut sink).await.unwrap();
    check(&sink.records(), "before the crash");
    // a power loss after everything was sealed loses nothing sealed
    let before = sink.records();
    drop(wal);
    sim.crash(CrashOptions::power_loss(3));
    let (w, report) = WalSink::open_with_storage(Arc::new(sim.clone()), o).unwrap();
    assert!(report.pending.is_empty(), "{report:?}");
    assert_eq!(report.committed, Some(6));
    drop(w);
    assert!(before.len() >= 6);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_durable_append_dropped_during_its_sync_is_durable_after_the_next_sync() {
    for seed in 0..6u64 {
        let g = Gated::default();
        let o = opts("durable-drop").mode(Mode::Durable);
        let wal = g.wal(o.clone());
        g.sync.close();
        let g2 = g.sync.clone();
        let _wd = Watchdog::start(120, move || g2.open());
        {
            let mut f = pin!(wal.append(b"dropped but written"));
            guard("the durable append reaching its sync", async {
                loop {
                    if poll_n(f.as_mut(), 1).is_some() {
                        panic!("a durable append returned while its sync was held");
                    }
                    if g.sync.waiting() > 0 {
                        break;
                    }
                    tokio::time::sleep(ms(1)).await;
                }
            })
            .await;
        }
        g.sync.open();
        guard("the next durable append", wal.append(b"acknowledged"))
            .await
            .expect("append after the dropped one");
        g.sim.crash(CrashOptions::power_loss(seed));
        drop(wal);
        let (w, report) = WalSink::open_with_storage(Arc::new(g.sim.clone()), o.clone()).unwrap();
        let mut ms = MemorySink::new();
        w.deliver_ready(&mut ms).unwrap();
        assert_eq!(
            ms.records(),
            vec![b"dropped but written".to_vec(), b"acknowledged".to_vec()],
            "seed {seed}: {report:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_deliver_ready_offers_the_epoch_again_and_never_resends_earlier_ones() {
    let dir = tempfile::tempdir().unwrap();
    let o = opts("dr-drop").mark_every(100);
    let (wal, _) = AsyncWal::open(dir.path(), o.clone()).await.unwrap();
    for cp in 1..=5 {
        seal(&wal, cp, &recs(cp, 3)).await;
    }
    wal.checkpoint_complete(5).unwrap();
    let first = Probe::new();
    first.edit(|s| {
        s.hang.insert(3);
    });
    {
        let mut p = first.clone();
        let mut f = pin!(wal.deliver_ready(&mut p));
        guard("delivery reaching epoch 3", async {
            loop {
                if let Some(r) = poll_n(f.as_mut(), 1) {
                    panic!("deliver_ready returned while epoch 3 hangs: {r:?}");
                }
                if first.calls().contains(&3) {
                    break;
                }
                tokio::time::sleep(ms(1)).await;
            }
        })
        .await;
    } // dropped while epoch 3 is in the sink
    assert_eq!(first.ok_ids(), vec![1, 2]);
    let second = Probe::new();
    let mut s2 = second.clone();
    let n = guard("the next deliver_ready", async {
        loop {
            match wal.deliver_ready(&mut s2).await {
                Err(e) if matches!(e.kind(), ErrorKind::InvalidOperation { .. }) => {
                    tokio::time::sleep(ms(5)).await
                }
                r => return r,
            }
        }
    })
    .await
    .unwrap();
    assert_eq!(
        second.ok_ids(),
        vec![3, 4, 5],
        "the dropped epoch is offered again, the ones before are never sent again"
    );
    assert!(n >= 3);
    assert_eq!(wal.health().committed, Some(5));
    drop(wal);
    let (_wal, report) = reopen(dir.path(), o).await;
    assert!(report.pending.is_empty(), "{report:?}");
    assert_eq!(report.committed, Some(5));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_shutdown_future_still_stops_the_committer() {
    let dir = tempfile::tempdir().unwrap();
    let (wal, _) = AsyncWal::open(dir.path(), opts("sd-drop")).await.unwrap();
    let probe = Probe::new();
    let committer = wal.spawn_committer(probe.clone()).unwrap();
    seal(&wal, 1, &recs(1, 2)).await;
    wal.checkpoint_complete(1).unwrap();
    assert!(guard("commit 1", wal.wait_committed(1, Duration::MAX)).await);
    {
        let f = pin!(committer.shutdown(Duration::from_secs(30)));
        let _ = poll_n(f, 1);
    }
    // The task stops on its own; the right to deliver comes back.
    let other = Probe::new();
    let mut o2 = other.clone();
    guard("deliver_ready after the committer stopped", async {
        loop {
            match wal.deliver_ready(&mut o2).await {
                Err(e) if matches!(e.kind(), ErrorKind::InvalidOperation { .. }) => {
                    tokio::time::sleep(ms(5)).await
                }
                r => return r.unwrap(),
            }
        }
    })
    .await;
    seal(&wal, 2, &recs(2, 2)).await;
    wal.checkpoint_complete(2).unwrap();
    wal.deliver_ready(&mut o2).await.unwrap();
    assert_eq!(probe.ok_ids(), vec![1]);
    assert_eq!(other.ok_ids(), vec![2]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_committer_handle_stops_at_an_epoch_boundary_and_gives_the_log_back() {
    let dir = tempfile::tempdir().unwrap();
    let (wal, _) = AsyncWal::open(dir.path(), opts("c-drop")).await.unwrap();
    let probe = Probe::new();
    let committer = wal.spawn_committer(probe.clone()).unwrap();
    seal(&wal, 1, &recs(1, 2)).await;
    wal.checkpoint_complete(1).unwrap();
    assert!(guard("commit 1", wal.wait_committed(1, Duration::MAX)).await);
    drop(committer);
    let other = Probe::new();
    let mut o2 = other.clone();
    guard(
        "deliver_ready after the committer handle was dropped",
        async {
            loop {
                match wal.deliver_ready(&mut o2).await {
                    Err(e) if matches!(e.kind(), ErrorKind::InvalidOperation { .. }) => {
                        tokio::time::sleep(ms(5)).await
                    }
                    r => return r.unwrap(),
                }
            }
        },
    )
    .await;
    seal(&wal, 2, &recs(2, 1)).await;
    wal.checkpoint_complete(2).unwrap();
    wal.deliver_ready(&mut o2).await.unwrap();
    assert_eq!(probe.ok_ids(), vec![1]);
    assert_eq!(other.ok_ids(), vec![2]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wait_committed_futures_dropped_again_and_again_leave_it_working() {
    let dir = tempfile::tempdir().unwrap();
    let (wal, _) = AsyncWal::open(dir.path(), opts("wait-drop")).await.unwrap();
    let probe = Probe::new();
    probe.edit(|s| {
        s.hold.insert(1);
    });
    let committer = wal.spawn_committer(probe.clone()).unwrap();
    seal(&wal, 1, &recs(1, 2)).await;
    wal.checkpoint_complete(1).unwrap();
    for _ in 0..200 {
        let f = pin!(wal.wait_committed(1, Duration::MAX));
        assert_eq!(poll_n(f, 2), None);
    }
    for _ in 0..10 {
        assert!(
            tokio::time::timeout(ms(1), wal.wait_committed(1, Duration::MAX))
                .await
                .is_err()
        );
    }
    let w = wal.clone();
    let waiter = tokio::spawn(async move { w.wait_committed(1, Duration::MAX).await });
    probe.edit(|s| {
        s.hold.clear();
    });
    assert!(guard("wait_committed", waiter).await.unwrap());
    committer.shutdown(Duration::from_secs(10)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_restore_runs_to_its_end_and_ids_are_never_reused() {
    let dir = tempfile::tempdir().unwrap();
    let (wal, _) = AsyncWal::open(dir.path(), opts("restore-drop"))
        .await
        .unwrap();
    for cp in 1..=3 {
        seal(&wal, cp, &recs(cp, 2)).await;
    }
    wal.append(b"unsealed").await.unwrap();
    {
        let f = pin!(wal.restore(Some(1)));
        let _ = poll_n(f, 1);
    }
    wait_until("the dropped restore to finish", || {
        pending_ids(&wal) == vec![1]
    })
    .await;
    wait_until("the unsealed records voided", || {
        wal.health().open_records == 0
    })
    .await;
    for id in [2, 3] {
        let e = wal.checkpoint(id, b"").await.unwrap_err();
        assert!(
            matches!(e.kind(), ErrorKind::InvalidCheckpoint { .. }),
            "id {id} was seen before the restore and must not be reused: {e:?}"
        );
    }
    seal(&wal, 4, &recs(4, 1)).await;
    wal.checkpoint_complete(4).unwrap();
    let mut p = Probe::new();
    wal.deliver_ready(&mut p).await.unwrap();
    assert_eq!(p.ok_ids(), vec![1, 4]);
    assert!(!p.records().contains(&b"unsealed".to_vec()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_open_closes_the_log_again_so_it_can_be_opened_anew() {
    let dir = tempfile::tempdir().unwrap();
    {
        let (wal, _) = AsyncWal::open(dir.path(), opts("open-drop")).await.unwrap();
        seal(&wal, 1, &recs(1, 2)).await;
    }
    for k in 1..4 {
        let f = pin!(AsyncWal::open(dir.path(), opts("open-drop")));
        let _ = poll_n(f, k);
    }
    let (wal, report) = reopen(dir.path(), opts("open-drop")).await;
    assert_eq!(report.pending, vec![1]);
    drop(wal);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_async_chunks_iterator_whose_read_was_dropped_ends_and_never_skips_a_chunk() {
    for round in 0..10 {
        let dir = tempfile::tempdir().unwrap();
        let (wal, _) = AsyncWal::open(dir.path(), opts("abandon").read_chunk_size(1024))
            .await
            .unwrap();
        let records: Vec<Vec<u8>> = (0..3000)
            .map(|i| format!("{round}-{i:06}").into_bytes())
            .collect();
        seal(&wal, 1, &records).await;
        wal.checkpoint_complete(1).unwrap();
        let mut s = Abandon::default();
        wal.deliver_ready(&mut s).await.unwrap();
        let report = s.report.lock().clone();
        assert_eq!(report.last().map(String::as_str), Some("done"));
        assert_eq!(report.len(), 1, "round {round}: {report:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deliver_ready_dropped_at_every_poll_point_never_loses_or_repeats_an_epoch() {
    for mark_every in [1usize, 3] {
        for k in 1..30usize {
            let dir = tempfile::tempdir().unwrap();
            let o = opts("dr-every-poll")
                .mark_every(mark_every)
                .read_chunk_size(1024);
            let (wal, _) = AsyncWal::open(dir.path(), o.clone()).await.unwrap();
            for cp in 1..=5u64 {
                // epoch 3 spans many chunks
                let n = if cp == 3 { 400 } else { 3 };
                seal(&wal, cp, &recs(cp, n)).await;
            }
            wal.checkpoint_complete(5).unwrap();
            let first = Probe::new();
            {
                let mut p = first.clone();
                let mut f = pin!(wal.deliver_ready(&mut p));
                for _ in 0..k {
                    if poll_n(f.as_mut(), 1).is_some() {
                        break;
                    }
                    tokio::time::sleep(Duration::from_micros(200)).await;
                }
            }
            let second = Probe::new();
            let mut s2 = second.clone();
            guard("the next deliver_ready", async {
                loop {
                    match wal.deliver_ready(&mut s2).await {
                        Err(e) if matches!(e.kind(), ErrorKind::InvalidOperation { .. }) => {
                            tokio::time::sleep(ms(2)).await
                        }
                        r => return r.unwrap(),
                    }
                }
            })
            .await;
            let mut ids = first.ok_ids();
            ids.extend(second.ok_ids());
            assert_eq!(
                ids,
                vec![1, 2, 3, 4, 5],
                "mark_every {mark_every}, dropped after {k} polls: first {:?} second {:?}",
                first.ok_ids(),
                second.ok_ids()
            );
            assert_eq!(wal.health().committed, Some(5));
            drop(wal);
            let (_w, report) = reopen(dir.path(), o).await;
            assert!(report.pending.is_empty(), "k={k}: {report:?}");
        }
    }
}
