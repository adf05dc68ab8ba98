//! No `AsyncWal` method blocks a runtime worker and nothing deadlocks: durable appends,
//! checkpoints, restores, appends that write the file, large epochs read through
//! `AsyncChunks` and marks leave a current-thread runtime running while the disk is held at a
//! gate; an append waiting for backlog budget leaves the runtime to a committer on it; and
//! `wait_committed` is woken by a committer on the same runtime or on a thread.

use crate::support::*;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::Duration;
use walsink::{FullPolicy, MemorySink, Mode};
use walsink_tokio::AsyncWal;

/// Runs `f` on a fresh current-thread runtime on a thread of its own and fails (instead of
/// hanging) if it makes no progress: a blocked worker on a current-thread runtime stops
/// everything, the runtime's own timers included.
fn on_current_thread<F, Fut>(what: &'static str, f: F)
where
    F: FnOnce() -> Fut + Send + 'static,
    Fut: Future<Output = ()>,
{
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let r = std::panic::catch_unwind(AssertUnwindSafe(|| rt.block_on(f())));
        let _ = tx.send(r);
    });
    match rx.recv_timeout(Duration::from_secs(300)) {
        Ok(Ok(())) => {}
        Ok(Err(p)) => std::panic::resume_unwind(p),
        Err(_) => panic!(
            "{what}: the current-thread runtime made no progress in 300 s (a blocked worker or a deadlock)"
        ),
    }
}

/// Runs `op` as a task while `gate` is closed, and checks that the calling task (on the same
/// runtime) keeps running while `op` is held at the gate. Returns `op`'s output and whether
/// it reached the gate at all. A 60 s watchdog opens the gate if nothing else can.
async fn stuck_on<T: Send + 'static>(
    gate: &Arc<Gate>,
    op: impl Future<Output = T> + Send + 'static,
) -> (T, bool) {
    gate.close();
    let g2 = gate.clone();
    let wd = Watchdog::start(60, move || g2.open());
    let task = tokio::spawn(op);
    let reached = guard("the operation reaching the held disk", async {
        loop {
            if gate.waiting() > 0 {
                return true;
            }
            if task.is_finished() || wd.fired() {
                return false;
            }
            tokio::time::sleep(ms(1)).await;
        }
    })
    .await;
    if reached {
        // This task keeps ticking while the operation is stuck in the disk.
        for _ in 0..5 {
            tokio::time::sleep(ms(1)).await;
        }
    }
    let fired = wd.fired();
    gate.open();
    let out = guard("the operation after the disk was released", task)
        .await
        .expect("operation task");
    assert!(
        !fired,
        "a runtime worker was blocked while a disk operation was held (the watchdog had to release it)"
    );
    (out, reached)
}

#[test]
fn durable_appends_from_many_tasks_leave_a_current_thread_runtime_running_while_the_disk_syncs() {
    on_current_thread("durable appends", || async {
        let g = Gated::default();
        let wal = g.wal(opts("ct-durable").mode(Mode::Durable));
        let w = wal.clone();
        let ((), reached) = stuck_on(&g.sync, async move {
            let mut hs = Vec::new();
            for t in 0..16 {
                let w = w.clone();
                hs.push(tokio::spawn(async move {
                    for i in 0..5 {
                        w.append(format!("t{t}-{i}").as_bytes())
                            .await
                            .expect("durable append");
                    }
                }));
            }
            for h in hs {
                h.await.unwrap();
            }
        })
        .await;
        assert!(reached, "durable appends must wait for a sync");
        let mut sink = Probe::new();
        guard("deliver_ready", wal.deliver_ready(&mut sink))
            .await
            .unwrap();
        let got = sink.records();
        let expected: Vec<Vec<u8>> = (0..16)
            .flat_map(|t| (0..5).map(move |i| format!("t{t}-{i}").into_bytes()))
            .collect();
        assert_each_once(&got, &expected);
        // each task's records in its own order
        for t in 0..16 {
            let mine: Vec<_> = got
                .iter()
                .filter(|r| r.starts_with(format!("t{t}-").as_bytes()))
                .cloned()
                .collect();
            let want: Vec<_> = (0..5).map(|i| format!("t{t}-{i}").into_bytes()).collect();
            assert_eq!(mine, want, "task {t}'s records in order");
        }
        assert!(sink.violations().is_empty(), "{:?}", sink.violations());
    });
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn durable_appends_from_many_tasks_on_multi_thread_with_a_running_committer_arrive_once() {
    let dir = tempfile::tempdir().unwrap();
    let (wal, _) = AsyncWal::open(dir.path(), opts("mt-durable").mode(Mode::Durable))
        .await
        .unwrap();
    let probe = Probe::with_marker();
    let committer = wal.spawn_committer(probe.clone()).unwrap();
    let mut hs = Vec::new();
    for t in 0..32 {
        let w = wal.clone();
        hs.push(tokio::spawn(async move {
            for i in 0..20 {
                if i % 5 == 4 {
                    let batch = [format!("t{t}-{i}-a"), format!("t{t}-{i}-b")];
                    w.append_batch(&[batch[0].as_bytes(), batch[1].as_bytes()])
                        .await
                        .expect("durable batch");
                } else {
                    w.append(format!("t{t}-{i}").as_bytes())
                        .await
                        .expect("durable append");
                }
            }
        }));
    }
    for h in hs {
        guard("appending tasks", h).await.unwrap();
    }
    let expected: Vec<Vec<u8>> = (0..32)
        .flat_map(|t| {
            (0..20).flat_map(move |i| {
                if i % 5 == 4 {
                    vec![
                        format!("t{t}-{i}-a").into_bytes(),
                        format!("t{t}-{i}-b").into_bytes(),
                    ]
                } else {
                    vec![format!("t{t}-{i}").into_bytes()]
                }
            })
        })
        .collect();
    wait_until("every acknowledged durable record delivered", || {
        probe.records().len() >= expected.len()
    })
    .await;
    let report = guard("shutdown", committer.shutdown(Duration::from_secs(30))).await;
    assert!(report.clean, "{report:?}");
    assert!(report.pending.is_empty(), "{report:?}");
    assert_each_once(&probe.records(), &expected);
    assert!(probe.violations().is_empty(), "{:?}", probe.violations());
}

#[test]
fn checkpoint_and_restore_leave_a_current_thread_runtime_running_while_the_disk_syncs() {
    on_current_thread("checkpoint and restore", || async {
        let g = Gated::default();
        let wal = g.wal(opts("ct-cp"));
        wal.append_batch(&[b"a".as_slice(), b"b"]).await.unwrap();
        let w = wal.clone();
        let (r, reached) = stuck_on(&g.sync, async move { w.checkpoint(1, b"one").await }).await;
        r.expect("checkpoint");
        assert!(reached, "a checkpoint is durable when it returns: it syncs");
        wal.append(b"c").await.unwrap();
        wal.checkpoint(2, b"two").await.unwrap();
        let w = wal.clone();
        let (r, reached) = stuck_on(&g.sync, async move { w.restore(Some(1)).await }).await;
        r.expect("restore");
        assert!(reached, "a restore is durable when it returns: it syncs");
        assert_eq!(pending_ids(&wal), vec![1]);
    });
}

#[test]
fn an_append_that_must_write_the_file_leaves_a_current_thread_runtime_running() {
    on_current_thread("large append", || async {
        let g = Gated::default();
        let wal = g.wal(opts("ct-big").write_buffer_size(4096));
        let w = wal.clone();
        let (r, reached) = stuck_on(&g.write, async move {
            let big = vec![7u8; 20_000];
            w.append(&big).await
        })
        .await;
        r.expect("append of a record larger than the write buffer");
        assert!(
            reached,
            "a record larger than the write buffer must be written to the file"
        );
        wal.checkpoint(1, b"").await.unwrap();
        wal.checkpoint_complete(1).unwrap();
        let mut sink = Probe::new();
        wal.deliver_ready(&mut sink).await.unwrap();
        assert_eq!(sink.records(), vec![vec![7u8; 20_000]]);
    });
}

#[test]
fn reading_a_large_epoch_through_async_chunks_leaves_a_current_thread_runtime_running() {
    on_current_thread("async chunks", || async {
        let g = Gated::default();
        let wal = g.wal(opts("ct-chunks").read_chunk_size(1024));
        let records: Vec<Vec<u8>> = (0..300).map(|i| vec![(i % 251) as u8; 100]).collect();
        seal(&wal, 1, &records).await;
        wal.checkpoint_complete(1).unwrap();
        let w = wal.clone();
        let sink = Probe::new();
        let mut s2 = sink.clone();
        let (n, reached) = stuck_on(&g.read, async move { w.deliver_ready(&mut s2).await }).await;
        assert_eq!(n.expect("deliver_ready"), 1);
        assert!(reached, "an epoch of many chunks must be read from the log");
        assert_eq!(sink.records(), records);
        assert!(sink.violations().is_empty(), "{:?}", sink.violations());
    });
}

#[test]
fn marking_a_delivery_leaves_a_current_thread_runtime_running_while_the_disk_syncs() {
    on_current_thread("marking", || async {
        let g = Gated::default();
        let wal = g.wal(opts("ct-mark"));
        seal(&wal, 1, &recs(1, 3)).await;
        wal.checkpoint_complete(1).unwrap();
        let w = wal.clone();
        let sink = Probe::new();
        let mut s2 = sink.clone();
        let (n, reached) = stuck_on(&g.sync, async move { w.deliver_ready(&mut s2).await }).await;
        assert_eq!(n.expect("deliver_ready"), 1);
        assert!(reached, "the local commit store syncs its mark");
        assert_eq!(sink.ok_ids(), vec![1]);
        assert_eq!(wal.health().committed, Some(1));
    });
}

#[test]
fn an_append_waiting_for_backlog_budget_leaves_the_runtime_to_a_committer_on_it() {
    on_current_thread("backlog block", || async {
        let dir = tempfile::tempdir().unwrap();
        let (wal, _) = AsyncWal::open(
            dir.path(),
            opts("ct-block").max_backlog_bytes(4096, FullPolicy::Block),
        )
        .await
        .unwrap();
        let big: Vec<Vec<u8>> = (0..10).map(|i| vec![i as u8; 1000]).collect();
        seal(&wal, 1, &big).await;
        wal.checkpoint_complete(1).unwrap();
        // If the waiting append blocked this runtime's only worker, nothing on the runtime
        // could free the budget: the watchdog then frees it from a thread of its own.
        let blocking = wal.blocking().clone();
        let wd = Watchdog::start(60, move || {
            let _ = blocking.deliver_ready(&mut MemorySink::new());
        });
        let w = wal.clone();
        let waiting = tokio::spawn(async move { w.append(b"after the budget").await });
        for _ in 0..20 {
            tokio::time::sleep(ms(1)).await;
        }
        assert!(
            !waiting.is_finished() || wd.fired(),
            "with the budget used up and no deliverer, a blocking append must wait"
        );
        let probe = Probe::new();
        let committer = wal.spawn_committer(probe.clone()).unwrap();
        guard("the waiting append", waiting)
            .await
            .unwrap()
            .expect("append after the committer freed the budget");
        assert!(
            !wd.fired(),
            "the append waiting for budget blocked the runtime's worker"
        );
        wal.checkpoint(2, b"").await.unwrap();
        wal.checkpoint_complete(2).unwrap();
        assert!(guard("commit 2", wal.wait_committed(2, Duration::MAX)).await);
        committer.shutdown(Duration::from_secs(10)).await;
        assert_eq!(probe.ok_ids(), vec![1, 2]);
        assert_eq!(probe.records().last().unwrap(), b"after the budget");
    });
}

#[test]
fn durable_appends_over_a_small_budget_with_a_committer_on_the_same_current_thread_runtime() {
    on_current_thread("durable budget", || async {
        let dir = tempfile::tempdir().unwrap();
        let (wal, _) = AsyncWal::open(
            dir.path(),
            opts("ct-durable-block")
                .mode(Mode::Durable)
                .max_backlog_bytes(3000, FullPolicy::Block),
        )
        .await
        .unwrap();
        let w = wal.clone();
        let writer = tokio::spawn(async move {
            for i in 0..10u8 {
                w.append(&vec![i; 1000]).await.expect("durable append");
            }
        });
        for _ in 0..20 {
            tokio::time::sleep(ms(1)).await;
        }
        assert!(
            !writer.is_finished(),
            "10 KB of durable appends cannot fit a 3 KB budget without a deliverer"
        );
        let probe = Probe::new();
        let committer = wal.spawn_committer(probe.clone()).unwrap();
        guard("durable appends over the budget", writer)
            .await
            .unwrap();
        wait_until("all delivered", || probe.records().len() == 10).await;
        committer.shutdown(Duration::from_secs(10)).await;
        let expected: Vec<Vec<u8>> = (0..10u8).map(|i| vec![i; 1000]).collect();
        assert_eq!(probe.records(), expected);
    });
}

#[test]
fn wait_committed_is_woken_by_a_committer_on_the_same_current_thread_runtime() {
    on_current_thread("wait_committed", || async {
        let dir = tempfile::tempdir().unwrap();
        let (wal, _) = AsyncWal::open(dir.path(), opts("ct-wait")).await.unwrap();
        let probe = Probe::with_marker();
        let committer = wal.spawn_committer(probe.clone()).unwrap();
        for cp in 1..=5 {
            let w = wal.clone();
            let waiter = tokio::spawn(async move { w.wait_committed(cp, Duration::MAX).await });
            tokio::task::yield_now().await;
            seal(&wal, cp, &recs(cp, 2)).await;
            wal.checkpoint_complete(cp).unwrap();
            assert!(guard("waiter", waiter).await.unwrap());
        }
        let report = committer.shutdown(Duration::from_secs(10)).await;
        assert_eq!(report.committed, Some(5));
        assert_eq!(probe.ok_ids(), vec![1, 2, 3, 4, 5]);
    });
}

#[test]
fn wait_committed_on_a_current_thread_runtime_is_woken_by_a_committer_thread() {
    on_current_thread("wait_committed with a committer thread", || async {
        let dir = tempfile::tempdir().unwrap();
        let (wal, _) = AsyncWal::open(dir.path(), opts("ct-thread")).await.unwrap();
        let c = wal.blocking().spawn_committer(MemorySink::new()).unwrap();
        for cp in 1..=3 {
            let w = wal.clone();
            let waiter = tokio::spawn(async move { w.wait_committed(cp, Duration::MAX).await });
            seal(&wal, cp, &recs(cp, 1)).await;
            wal.checkpoint_complete(cp).unwrap();
            assert!(guard("waiter", waiter).await.unwrap());
        }
        tokio::task::spawn_blocking(move || c.shutdown())
            .await
            .unwrap();
    });
}
