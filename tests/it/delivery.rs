//! Delivery bookkeeping between the log, the commit store and the sink: what is known after a
//! reopen, what a graceful shutdown or a retried `deliver_ready` may send again (nothing: only
//! a crash may cause redelivery), what health shows after a recovered error, what may be freed
//! while a restore is not yet durable, what a commit store that forgets across restarts
//! still lets the log recover, and that a panicking sink is caught, counted, shown and retried.

use crate::support::*;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;
use walsink::storage::{CrashOptions, FaultOp, SimStorage};
use walsink::{
    CommitStore, Epoch, Error, MemoryCommitStore, MemorySink, Result, Sink, SinkError, WalSink,
};

/// Records the checkpoints it receives; fails the first delivery of `fail_on` once; may block
/// inside `deliver` until released.
#[derive(Clone, Default)]
struct ScriptedSink {
    got: Arc<parking_lot::Mutex<Vec<u64>>>,
    fail_on: Option<u64>,
    failed: Arc<AtomicBool>,
    /// (entered, release): `deliver` raises `entered` and waits for `release`.
    gate: Option<Arc<(AtomicBool, AtomicBool)>>,
}

impl Sink for ScriptedSink {
    fn deliver(&mut self, epoch: &Epoch) -> std::result::Result<(), SinkError> {
        if let Some(g) = &self.gate {
            g.0.store(true, Ordering::SeqCst);
            while !g.1.load(Ordering::SeqCst) {
                std::thread::sleep(Duration::from_millis(1));
            }
        }
        if self.fail_on == Some(epoch.checkpoint()) && !self.failed.swap(true, Ordering::SeqCst) {
            return Err(SinkError::retryable("injected failure"));
        }
        self.got.lock().push(epoch.checkpoint());
        Ok(())
    }
}

fn seal(wal: &WalSink, cp: u64) {
    append_values(wal, cp as u32 * 10, cp as u32 * 10 + 4);
    wal.checkpoint(cp, format!("m{cp}").as_bytes()).unwrap();
}

#[test]
fn the_stored_commit_mark_is_known_after_reopen() {
    let sim = SimStorage::new();
    let wal = open_sim(&sim, opts("known"));
    seal(&wal, 1);
    complete_and_deliver(&wal, 1);
    drop(wal);
    let (wal, report) = WalSink::open_with_storage(Arc::new(sim.clone()), opts("known")).unwrap();
    assert_eq!(report.committed, Some(1));
    assert_eq!(wal.health().committed, Some(1));
    assert!(wal.wait_committed(1, Duration::ZERO));
    assert!(!wal.wait_committed(2, Duration::ZERO));
}

#[test]
fn wait_committed_accepts_an_unbounded_timeout() {
    let sim = SimStorage::new();
    let wal = open_sim(&sim, opts("forever"));
    seal(&wal, 1);
    complete_and_deliver(&wal, 1);
    assert!(wal.wait_committed(1, Duration::MAX));
}

#[test]
fn graceful_shutdown_marks_the_epoch_it_delivered() {
    let sim = SimStorage::new();
    let wal = open_sim(&sim, opts("shutdown").mark_every(8));
    seal(&wal, 1);
    let gate = Arc::new((AtomicBool::new(false), AtomicBool::new(false)));
    let sink = ScriptedSink {
        gate: Some(gate.clone()),
        ..Default::default()
    };
    let committer = wal.spawn_committer(sink.clone()).unwrap();
    wal.checkpoint_complete(1).unwrap();
    while !gate.0.load(Ordering::SeqCst) {
        std::thread::sleep(Duration::from_millis(1));
    }
    // Shut down while the sink is inside `deliver`; release it a moment later.
    let releaser = {
        let gate = gate.clone();
        std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(50));
            gate.1.store(true, Ordering::SeqCst);
        })
    };
    committer.shutdown();
    releaser.join().unwrap();
    assert_eq!(*sink.got.lock(), vec![1]);
    assert_eq!(wal.health().committed, Some(1));
    // A later delivery, to a target without its own marker, must not get epoch 1 again.
    let mut again = MemorySink::new();
    assert_eq!(wal.deliver_ready(&mut again).unwrap(), 0);
    assert!(again.checkpoints().is_empty());
}

#[test]
fn a_retried_deliver_ready_does_not_resend_epochs_that_succeeded() {
    let sim = SimStorage::new();
    let wal = open_sim(&sim, opts("retry").mark_every(8));
    for cp in 1..=3 {
        seal(&wal, cp);
    }
    wal.checkpoint_complete(3).unwrap();
    let mut sink = ScriptedSink {
        fail_on: Some(3),
        ..Default::default()
    };
    assert!(wal.deliver_ready(&mut sink).is_err());
    wal.deliver_ready(&mut sink).unwrap();
    assert_eq!(*sink.got.lock(), vec![1, 2, 3]);
    assert_eq!(wal.health().committed, Some(3));
}

/// A commit store whose marks fail while `fail_marks` is above zero.
#[derive(Clone, Default)]
struct FlakyStore {
    inner: MemoryCommitStore,
    fail_marks: Arc<parking_lot::Mutex<u32>>,
}

impl CommitStore for FlakyStore {
    fn last_committed(&mut self, sink_id: &str, subtask: u32) -> Result<Option<u64>> {
        self.inner.last_committed(sink_id, subtask)
    }
    fn mark_committed(&mut self, sink_id: &str, subtask: u32, checkpoint: u64) -> Result<()> {
        let mut n = self.fail_marks.lock();
        if *n > 0 {
            *n -= 1;
            return Err(Error::commit_store("mark", "injected mark failure"));
        }
        self.inner.mark_committed(sink_id, subtask, checkpoint)
    }
}

#[test]
fn health_clears_the_last_error_after_a_recovered_mark_failure() {
    for threaded in [false, true] {
        let sim = SimStorage::new();
        let store = FlakyStore::default();
        // The first mark and the flush after it fail: the error stays until a later success.
        *store.fail_marks.lock() = 2;
        let (wal, _) =
            WalSink::open_with(Arc::new(sim.clone()), opts("health"), Box::new(store)).unwrap();
        seal(&wal, 1);
        wal.checkpoint_complete(1).unwrap();
        let sink = MemorySink::with_marker();
        if threaded {
            let c = wal.spawn_committer(sink.clone()).unwrap();
            assert!(wal.wait_committed(1, Duration::from_secs(10)));
            c.shutdown();
        } else {
            let mut s = sink.clone();
            assert!(wal.deliver_ready(&mut s).is_err());
            assert!(wal.health().last_error.is_some());
            wal.deliver_ready(&mut s).unwrap();
        }
        let h = wal.health();
        assert_eq!(h.committed, Some(1), "threaded={threaded}");
        assert_eq!(h.last_error, None, "threaded={threaded}");
        assert_eq!(h.retries, 0, "threaded={threaded}");
        assert!(h.errors >= 1);
        assert_eq!(sink.checkpoints(), vec![1]);
    }
}

#[test]
fn the_largest_checkpoint_id_is_accepted_once() {
    let sim = SimStorage::new();
    let wal = open_sim(&sim, opts("max"));
    append_values(&wal, 1, 3);
    wal.checkpoint(u64::MAX, b"a").unwrap();
    append_values(&wal, 4, 6);
    assert!(wal.checkpoint(u64::MAX, b"b").is_err());
    drop(wal);
    // Also after a reopen: the id space is used up, and nothing is lost silently.
    let (wal, report) = WalSink::open_with_storage(Arc::new(sim.clone()), opts("max")).unwrap();
    assert_eq!(report.pending, vec![u64::MAX]);
    append_values(&wal, 7, 9);
    assert!(wal.checkpoint(u64::MAX, b"c").is_err());
    assert_eq!(complete_and_deliver(&wal, u64::MAX), values(1, 3));
    drop(wal);
    let (wal, report) = WalSink::open_with_storage(Arc::new(sim.clone()), opts("max")).unwrap();
    assert_eq!(report.committed, Some(u64::MAX));
    assert!(wal.checkpoint(u64::MAX, b"d").is_err());
}

/// Two epochs over 4 KiB segments, so that epoch 2 starts in a segment before its barrier's.
fn two_epochs_over_segments(wal: &WalSink) {
    for cp in 1..=2u32 {
        for v in values(cp * 1000, cp * 1000 + 29) {
            let mut r = v;
            r.resize(200, b'x');
            wal.append(&r).unwrap();
        }
        wal.checkpoint(cp as u64, format!("m{cp}").as_bytes())
            .unwrap();
    }
}

#[test]
fn nothing_is_freed_on_the_strength_of_a_restore_that_is_not_durable() {
    let sim = SimStorage::new();
    let o = opts("restore-race")
        .segment_size(4096)
        .max_record_size(1024);
    let wal = open_sim(&sim, o.clone());
    two_epochs_over_segments(&wal);
    // The restore's fdatasync fails: the log is poisoned and the restore frame is not durable.
    sim.inject_fault(FaultOp::SyncData, 0, std::io::ErrorKind::Other);
    assert!(wal.restore(Some(1)).is_err());
    // Delivery of the committed-to-be epoch 1 goes on and cleans up.
    let mut sink = MemorySink::new();
    let _ = wal.deliver_ready(&mut sink);
    drop(wal);
    sim.crash(CrashOptions {
        seed: 1,
        lose_all_unsynced: true,
        process_only: false,
    });
    // The restore frame is lost, epoch 2 is back whole: the log must open, in every mode.
    let (wal, report) = WalSink::open_with_storage(Arc::new(sim.clone()), o).unwrap();
    assert!(report.pending.contains(&2), "{report:?}");
    wal.restore(Some(1)).unwrap();
}

#[test]
fn a_restore_keeps_the_barrier_it_restored_to() {
    let sim = SimStorage::new();
    let o = opts("restore-meta")
        .segment_size(4096)
        .max_record_size(1024);
    let wal = open_sim(&sim, o.clone());
    seal(&wal, 1);
    drop(wal);
    // After a reopen, epoch 2 starts in a later segment than barrier 1.
    let wal = open_sim(&sim, o.clone());
    seal(&wal, 2);
    complete_and_deliver(&wal, 1);
    wal.restore(Some(1)).unwrap();
    let mut sink = MemorySink::new();
    wal.deliver_ready(&mut sink).unwrap();
    drop(wal);
    let (_wal, report) = WalSink::open_with_storage(Arc::new(sim.clone()), o).unwrap();
    assert_eq!(report.committed, Some(1));
    assert_eq!(report.last_checkpoint, Some(1), "{report:?}");
    assert_eq!(report.last_metadata.as_deref(), Some(&b"m1"[..]));
}

#[test]
fn a_memory_commit_store_with_a_marker_sink_reopens_after_a_clean_restart() {
    let sim = SimStorage::new();
    let o = opts("memstore").segment_size(4096).max_record_size(1024);
    let sink = MemorySink::with_marker();
    for round in 0..3u32 {
        let (wal, report) = WalSink::open_with(
            Arc::new(sim.clone()),
            o.clone(),
            Box::new(MemoryCommitStore::new()),
        )
        .unwrap_or_else(|e| panic!("round {round}: {e}"));
        let base = report.next_checkpoint_id;
        for cp in base..base + 3 {
            for v in values(cp as u32 * 100, cp as u32 * 100 + 19) {
                let mut r = v;
                r.resize(150, b'y');
                wal.append(&r).unwrap();
            }
            wal.checkpoint(cp, b"").unwrap();
        }
        wal.checkpoint_complete(base + 2).unwrap();
        let mut s = sink.clone();
        wal.deliver_ready(&mut s).unwrap();
    }
    let got = sink.checkpoints();
    let mut dedup = got.clone();
    dedup.dedup();
    assert_eq!(got, dedup, "an epoch was delivered twice");
    assert_eq!(got.len(), 9);
}

/// Seals checkpoint `cp` with `n` records of 1 KiB, each naming its checkpoint and index, so
/// that an epoch is large enough to be read ahead.
fn seal_large(wal: &WalSink, cp: u64, n: usize) -> Vec<Vec<u8>> {
    let recs: Vec<Vec<u8>> = (0..n)
        .map(|i| {
            let mut r = format!("cp {cp} rec {i} ").into_bytes();
            r.resize(1024, b'a' + (cp % 26) as u8);
            r
        })
        .collect();
    wal.append_batch(recs.iter().map(|r| r.as_slice())).unwrap();
    wal.checkpoint(cp, b"").unwrap();
    recs
}

/// One epoch as a sink took it: its checkpoint and records.
type Taken = (u64, Vec<Vec<u8>>);

fn read_all(e: &Epoch) -> Vec<Vec<u8>> {
    e.records().map(|r| r.unwrap().data.to_vec()).collect()
}

fn large_opts(sink: &str) -> walsink::Options {
    opts(sink).segment_size(1 << 20)
}

#[test]
fn an_epoch_read_ahead_is_the_epoch_and_is_not_read_again() {
    let sim = SimStorage::new();
    let wal = open_sim(&sim, large_opts("ahead"));
    let one = seal_large(&wal, 1, 300);
    let two = seal_large(&wal, 2, 300);
    wal.checkpoint_complete(2).unwrap();
    let mut d = wal.deliverer().unwrap();
    let walsink::Next::Deliver(p1) = d.next_step().unwrap() else {
        panic!("epoch 1 is due")
    };
    let ahead = d.read_ahead(&p1).expect("epoch 2 is deliverable and large");
    assert_eq!(ahead.checkpoint(), 2);
    let ahead = ahead.read();
    let e1 = d.read(&p1).unwrap();
    assert_eq!(read_all(&e1), one);
    d.finish(p1, &e1, Ok(())).unwrap();
    let walsink::Next::Deliver(p2) = d.next_step().unwrap() else {
        panic!("epoch 2 is due")
    };
    // Every read fails from here: epoch 2 comes only from the read ahead.
    for nth in 0..64 {
        sim.inject_fault(FaultOp::Read, nth, std::io::ErrorKind::Other);
    }
    let e2 = d
        .read_or_take(&p2, Some(ahead))
        .expect("the read ahead is used");
    assert_eq!(read_all(&e2), two);
    sim.clear_faults();
    assert!(d.read_ahead(&p2).is_none(), "nothing after epoch 2");
}

#[test]
fn a_read_ahead_of_another_epoch_or_a_failed_one_is_not_used() {
    let sim = SimStorage::new();
    let wal = open_sim(&sim, large_opts("ahead-other"));
    let one = seal_large(&wal, 1, 300);
    let two = seal_large(&wal, 2, 300);
    seal_large(&wal, 3, 300);
    wal.checkpoint_complete(3).unwrap();
    let mut d = wal.deliverer().unwrap();
    let walsink::Next::Deliver(p1) = d.next_step().unwrap() else {
        panic!("epoch 1 is due")
    };
    // The read ahead of epoch 2 handed in for epoch 1 (the sink failed and epoch 1 comes
    // again): epoch 1 is read, not epoch 2 passed off as it.
    let of_two = d.read_ahead(&p1).unwrap().read();
    let e1 = d.read_or_take(&p1, Some(of_two)).unwrap();
    assert_eq!(read_all(&e1), one);
    // A read ahead that failed is read again in its turn, and its error is not reported.
    let ahead_of_two = d.read_ahead(&p1);
    d.finish(p1, &e1, Ok(())).unwrap();
    let walsink::Next::Deliver(p2) = d.next_step().unwrap() else {
        panic!("epoch 2 is due")
    };
    sim.inject_fault(FaultOp::Read, 0, std::io::ErrorKind::Other);
    let failed = ahead_of_two.unwrap().read();
    sim.clear_faults();
    let e2 = d.read_or_take(&p2, Some(failed)).unwrap();
    assert_eq!(read_all(&e2), two);
}

#[test]
fn small_epochs_are_not_read_ahead() {
    let sim = SimStorage::new();
    let wal = open_sim(&sim, opts("ahead-small"));
    seal(&wal, 1);
    seal(&wal, 2);
    wal.checkpoint_complete(2).unwrap();
    let mut d = wal.deliverer().unwrap();
    let walsink::Next::Deliver(p1) = d.next_step().unwrap() else {
        panic!("epoch 1 is due")
    };
    assert!(d.read_ahead(&p1).is_none());
}

/// The drivers read the next epoch while the sink takes one: a failure of the sink, retried,
/// still gives every epoch whole, once, in order, on the committer thread and in
/// `deliver_ready` alike.
#[test]
fn epochs_read_ahead_arrive_whole_once_and_in_order_through_failures() {
    for threaded in [false, true] {
        let sim = SimStorage::new();
        let wal = open_sim(&sim, large_opts("ahead-order"));
        let mut expected = Vec::new();
        for cp in 1..=6 {
            expected.push((cp, seal_large(&wal, cp, 300)));
        }
        wal.checkpoint_complete(6).unwrap();
        #[derive(Clone, Default)]
        struct Keeping {
            got: Arc<parking_lot::Mutex<Vec<Taken>>>,
            failures: Arc<parking_lot::Mutex<Vec<u64>>>,
        }
        impl Sink for Keeping {
            fn deliver(&mut self, epoch: &Epoch) -> std::result::Result<(), SinkError> {
                let cp = epoch.checkpoint();
                // Epochs 2 and 5 fail twice each, after the next one was read ahead.
                let mut f = self.failures.lock();
                if (cp == 2 || cp == 5) && f.iter().filter(|&&c| c == cp).count() < 2 {
                    f.push(cp);
                    return Err(SinkError::retryable("injected failure"));
                }
                self.got.lock().push((cp, read_all(epoch)));
                Ok(())
            }
        }
        let sink = Keeping::default();
        if threaded {
            let c = wal.spawn_committer(sink.clone()).unwrap();
            assert!(wal.wait_committed(6, Duration::from_secs(30)));
            c.shutdown();
        } else {
            let mut s = sink.clone();
            let mut tries = 0;
            while wal.health().committed != Some(6) {
                let _ = wal.deliver_ready(&mut s);
                tries += 1;
                assert!(tries < 10);
            }
        }
        let got = sink.got.lock().clone();
        assert_eq!(got, expected, "threaded: {threaded}");
        assert_eq!(sink.failures.lock().len(), 4);
    }
}

#[test]
fn a_mark_due_before_a_large_epoch_is_handed_to_the_driver() {
    let sim = SimStorage::new();
    let wal = open_sim(&sim, large_opts("due"));
    seal_large(&wal, 1, 300);
    seal_large(&wal, 2, 300);
    wal.checkpoint_complete(2).unwrap();
    let mut d = wal.deliverer().unwrap();
    let (walsink::Next::Deliver(p1), None) = d.next_step_deferring_mark().unwrap() else {
        panic!("epoch 1 is due, nothing to mark")
    };
    let e1 = d.read(&p1).unwrap();
    d.finish(p1, &e1, Ok(())).unwrap();
    let syncs = sim.stats().data_syncs;
    let (walsink::Next::Deliver(p2), Some(due)) = d.next_step_deferring_mark().unwrap() else {
        panic!("epoch 2 is due, and the mark of epoch 1 handed over")
    };
    assert_eq!(due.checkpoint(), 1);
    assert_eq!(sim.stats().data_syncs, syncs, "nothing marked yet");
    assert_eq!(wal.health().committed, None);
    let outcome = due.run();
    assert_eq!(wal.health().committed, Some(1));
    d.marked(outcome).unwrap();
    let e2 = d.read(&p2).unwrap();
    d.finish(p2, &e2, Ok(())).unwrap();
    // Epoch 2 waits for its own mark, made when nothing more is due.
    assert!(matches!(
        d.next_step_deferring_mark().unwrap(),
        (walsink::Next::Idle, None)
    ));
    assert_eq!(wal.health().committed, Some(2));
}

#[test]
fn a_due_mark_never_reported_is_made_by_the_next_step() {
    let sim = SimStorage::new();
    let wal = open_sim(&sim, large_opts("due-dropped"));
    seal_large(&wal, 1, 300);
    seal_large(&wal, 2, 300);
    wal.checkpoint_complete(2).unwrap();
    let mut d = wal.deliverer().unwrap();
    let (walsink::Next::Deliver(p1), _) = d.next_step_deferring_mark().unwrap() else {
        panic!()
    };
    let e1 = d.read(&p1).unwrap();
    d.finish(p1, &e1, Ok(())).unwrap();
    let (walsink::Next::Deliver(p2), Some(due)) = d.next_step_deferring_mark().unwrap() else {
        panic!()
    };
    drop(due);
    // The sink fails epoch 2: the next step marks epoch 1 itself, and offers epoch 2 again.
    let e2 = d.read(&p2).unwrap();
    assert!(d
        .finish(p2, &e2, Err(SinkError::retryable("down")))
        .is_err());
    let (walsink::Next::Deliver(again), due) = d.next_step_deferring_mark().unwrap() else {
        panic!("epoch 2 again")
    };
    assert_eq!(again.checkpoint(), 2);
    if let Some(due) = due {
        d.mark_now(due).unwrap();
    }
    assert_eq!(wal.health().committed, Some(1));
    drop(d);
    // And a deliverer dropped with a mark owed marks it when the next one flushes.
    let mut sink = MemorySink::new();
    wal.deliver_ready(&mut sink).unwrap();
    assert_eq!(wal.health().committed, Some(2));
}

/// Kills the process at every mutating operation of a delivery of large epochs, where marks
/// run beside the sink: after the crash, nothing marked is lost or sent again, and the rest
/// arrives whole and in order.
#[test]
fn marks_made_beside_the_sink_survive_a_kill_at_every_operation() {
    let mut kills = 0;
    for n in 0.. {
        let sim = SimStorage::new();
        let wal = open_sim(&sim, large_opts("kill-marks"));
        let mut expected = Vec::new();
        for cp in 1..=5 {
            expected.push((cp, seal_large(&wal, cp, 300)));
        }
        wal.checkpoint_complete(5).unwrap();
        // The first sink also fails once, at an epoch that varies with the kill point, while
        // the mark of the epochs before it is being made.
        let first = KeepAll {
            fail_at: Some(2 + n % 4),
            ..KeepAll::default()
        };
        sim.kill_after(n);
        let mut r = wal.deliver_ready(&mut first.clone());
        if r.is_err() && !sim.is_dead() {
            r = wal.deliver_ready(&mut first.clone());
        }
        let killed = sim.is_dead();
        drop(wal);
        if !killed {
            r.unwrap();
            assert_eq!(*first.got.lock(), expected);
            break;
        }
        kills += 1;
        sim.crash(CrashOptions::power_loss(n));
        let (wal, report) =
            WalSink::open_with_storage(Arc::new(sim.clone()), large_opts("kill-marks")).unwrap();
        let committed = report.committed.unwrap_or(0);
        let got = first.got.lock().clone();
        // What was taken before the kill: a prefix, in order, each epoch whole.
        assert_eq!(got, expected[..got.len()], "kill at op {n}");
        // A mark covers only what the sink took.
        assert!(
            committed as usize <= got.len(),
            "kill at op {n}: mark {committed}, delivered {}",
            got.len()
        );
        wal.checkpoint_complete(5).unwrap();
        let second = KeepAll::default();
        wal.deliver_ready(&mut second.clone()).unwrap();
        // Everything above the mark, nothing at or below it.
        assert_eq!(
            *second.got.lock(),
            expected[committed as usize..],
            "kill at op {n}, mark {committed}"
        );
        assert!(n < 500, "the delivery never finished");
    }
    eprintln!("{kills} kills");
    assert!(kills > 10, "{kills}");
}

/// Keeps what it takes; fails the first delivery of `fail_at`.
#[derive(Clone, Default)]
struct KeepAll {
    got: Arc<parking_lot::Mutex<Vec<Taken>>>,
    fail_at: Option<u64>,
    failed: Arc<AtomicBool>,
}

impl Sink for KeepAll {
    fn deliver(&mut self, epoch: &Epoch) -> std::result::Result<(), SinkError> {
        if self.fail_at == Some(epoch.checkpoint()) && !self.failed.swap(true, Ordering::SeqCst) {
            return Err(SinkError::retryable("injected failure"));
        }
        self.got.lock().push((epoch.checkpoint(), read_all(epoch)));
        Ok(())
    }
}

/// Panics in `deliver` (or, as a marker sink, in `is_committed`) until `healed` is set.
#[derive(Clone, Default)]
struct PanicsUntilHealed {
    healed: Arc<AtomicBool>,
    in_is_committed: bool,
    got: Arc<parking_lot::Mutex<Vec<u64>>>,
}

impl Sink for PanicsUntilHealed {
    fn deliver(&mut self, epoch: &Epoch) -> std::result::Result<(), SinkError> {
        if !self.in_is_committed && !self.healed.load(Ordering::SeqCst) {
            panic!("sink bug at checkpoint {}", epoch.checkpoint());
        }
        self.got.lock().push(epoch.checkpoint());
        Ok(())
    }

    fn stores_marker(&self) -> bool {
        self.in_is_committed
    }

    fn is_committed(&mut self, key: &walsink::EpochKey) -> std::result::Result<bool, SinkError> {
        if !self.healed.load(Ordering::SeqCst) {
            panic!("marker lookup bug at checkpoint {}", key.checkpoint);
        }
        Ok(self.got.lock().contains(&key.checkpoint))
    }
}

#[test]
fn a_panicking_sink_is_counted_shown_and_retried_by_the_committer_thread() {
    for in_is_committed in [false, true] {
        let sim = SimStorage::new();
        let wal = open_sim(&sim, opts("panics"));
        seal(&wal, 1);
        wal.checkpoint_complete(1).unwrap();
        let sink = PanicsUntilHealed {
            in_is_committed,
            ..Default::default()
        };
        let c = wal.spawn_committer(sink.clone()).unwrap();
        // Two errors: the panic was counted and the epoch tried again after it.
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        let h = loop {
            let h = wal.health();
            if h.errors >= 2
                && h.last_error
                    .as_deref()
                    .is_some_and(|e| e.contains("panicked"))
            {
                break h;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "in_is_committed={in_is_committed}: the panic was not shown: {h:?}"
            );
            std::thread::sleep(Duration::from_millis(1));
        };
        assert!(h.last_error.unwrap().contains("bug at checkpoint 1"));
        assert_eq!(h.committed, None);
        sink.healed.store(true, Ordering::SeqCst);
        assert!(wal.wait_committed(1, Duration::from_secs(20)));
        c.shutdown();
        assert_eq!(
            *sink.got.lock(),
            vec![1],
            "in_is_committed={in_is_committed}"
        );
        assert_eq!(wal.health().last_error, None);
    }
}

#[test]
fn a_panicking_sink_makes_deliver_ready_return_a_permanent_error() {
    let sim = SimStorage::new();
    let wal = open_sim(&sim, opts("panics-ready"));
    seal(&wal, 1);
    wal.checkpoint_complete(1).unwrap();
    let mut sink = PanicsUntilHealed::default();
    let e = wal.deliver_ready(&mut sink).unwrap_err();
    assert!(
        matches!(e.kind(), walsink::ErrorKind::Sink(s) if s.class() == walsink::SinkErrorClass::Permanent),
        "{e:?}"
    );
    assert!(e.to_string().contains("panicked"), "{e}");
    let h = wal.health();
    assert_eq!(h.errors, 1);
    assert!(h.last_error.unwrap().contains("sink bug at checkpoint 1"));
    sink.healed.store(true, Ordering::SeqCst);
    assert_eq!(wal.deliver_ready(&mut sink).unwrap(), 1);
    assert_eq!(*sink.got.lock(), vec![1]);
}
