//! What delivery sends, marks and shows around errors, shutdowns, restores and restarts: a
//! retried `deliver_ready` and a clean reopen send nothing twice, a committer's shutdown marks
//! what it delivered, health shows an error and clears it after success, restores void for good
//! and clean up, a memory commit store (with or without a marker sink) and a directory sink
//! keep exactly-once across restarts, `wait_committed` takes any timeout, checkpoint id
//! `u64::MAX` is accepted once, a blocking backlog without a sealed epoch fails at once, and
//! durable mode refuses the checkpoint calls.

use crate::support::closed_logs::*;
use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use walsink::storage::FsStorage;
use walsink::{DirSink, Epoch, ErrorKind, MemoryCommitStore, MemorySink, Sink, SinkError, WalSink};

/// A sink that fails once on a chosen checkpoint and records every delivered epoch.
#[derive(Clone)]
struct FlakySink {
    fail_on: u64,
    failures_left: Arc<Mutex<u32>>,
    delivered: Arc<Mutex<Vec<u64>>>,
    delay: Duration,
}

impl FlakySink {
    fn new(fail_on: u64, times: u32) -> Self {
        FlakySink {
            fail_on,
            failures_left: Arc::new(Mutex::new(times)),
            delivered: Arc::new(Mutex::new(vec![])),
            delay: Duration::ZERO,
        }
    }
    fn got(&self) -> Vec<u64> {
        self.delivered.lock().unwrap().clone()
    }
}

impl Sink for FlakySink {
    fn deliver(&mut self, epoch: &Epoch) -> Result<(), SinkError> {
        std::thread::sleep(self.delay);
        if epoch.checkpoint() == self.fail_on {
            let mut f = self.failures_left.lock().unwrap();
            if *f > 0 {
                *f -= 1;
                return Err(SinkError::retryable("injected"));
            }
        }
        self.delivered.lock().unwrap().push(epoch.checkpoint());
        Ok(())
    }
}

fn write_epochs(wal: &WalSink, ids: std::ops::RangeInclusive<u64>) {
    for ck in ids {
        for i in 0..3 {
            wal.append(&rec(ck, i)).unwrap();
        }
        wal.checkpoint(ck, b"m").unwrap();
    }
}

/// deliver_ready after a sink error must not resend epochs that succeeded before the error,
/// neither on the next call nor after a clean reopen (no crash happened). mark_every large.
#[test]
fn deliver_ready_after_a_sink_error_does_not_resend_what_was_delivered() {
    let t = tempfile::tempdir().unwrap();
    let dir = t.path().join("wal");
    let o = opts().mark_every(100);
    let mut sink = FlakySink::new(3, 1);
    {
        let (wal, _) = WalSink::open(&dir, o.clone()).unwrap();
        write_epochs(&wal, 1..=5);
        wal.checkpoint_complete(5).unwrap();
        let r = wal.deliver_ready(&mut sink);
        assert!(r.is_err(), "the injected error must surface");
        assert_eq!(sink.got(), vec![1, 2]);
        let h = wal.health();
        assert!(h.errors >= 1, "health counts the error: {h:?}");
        eprintln!("health right after deliver_ready returned Err (mark_every 100): {h:?}");
        let n = wal.deliver_ready(&mut sink).unwrap();
        assert_eq!(
            sink.got(),
            vec![1, 2, 3, 4, 5],
            "second deliver_ready resent or skipped (handled {n})"
        );
        let h = wal.health();
        assert!(
            h.last_error.is_none(),
            "last_error not cleared after success: {h:?}"
        );
        assert_eq!(h.retries, 0, "retries not cleared after success: {h:?}");
        assert_eq!(h.committed, Some(5));
    }
    // Error then clean close without a second call: reopen must know 1,2 were delivered.
    let t2 = tempfile::tempdir().unwrap();
    let dir2 = t2.path().join("wal");
    let mut sink2 = FlakySink::new(3, 1);
    {
        let (wal, _) = WalSink::open(&dir2, o.clone()).unwrap();
        write_epochs(&wal, 1..=5);
        wal.checkpoint_complete(5).unwrap();
        assert!(wal.deliver_ready(&mut sink2).is_err());
    }
    let (wal, r) = WalSink::open(&dir2, o).unwrap();
    assert_eq!(
        r.committed,
        Some(2),
        "epochs delivered before the error were not marked: {r:?}"
    );
    assert_eq!(
        wal.health().committed,
        Some(2),
        "health after reopen does not show the stored mark"
    );
    wal.restore(Some(5)).unwrap();
    wal.deliver_ready(&mut sink2).unwrap();
    assert_eq!(
        sink2.got(),
        vec![1, 2, 3, 4, 5],
        "epochs resent after a clean reopen"
    );
}

/// Committer::shutdown marks every epoch it delivered (mark_every large, slow sink, shutdown
/// mid-way): reopen shows the mark and nothing is resent.
#[test]
fn committer_shutdown_marks_what_it_delivered() {
    let t = tempfile::tempdir().unwrap();
    let dir = t.path().join("wal");
    let o = opts().mark_every(1000);
    let mut sink = FlakySink::new(u64::MAX, 0);
    sink.delay = Duration::from_millis(60);
    let delivered;
    {
        let (wal, _) = WalSink::open(&dir, o.clone()).unwrap();
        write_epochs(&wal, 1..=20);
        wal.checkpoint_complete(20).unwrap();
        let c = wal.spawn_committer(sink.clone()).unwrap();
        let start = Instant::now();
        while sink.got().len() < 3 && start.elapsed() < Duration::from_secs(5) {
            std::thread::sleep(Duration::from_millis(5));
        }
        c.shutdown();
        delivered = sink.got();
        assert!(
            delivered.len() >= 3 && delivered.len() < 20,
            "delivered {delivered:?}"
        );
        let h = wal.health();
        assert_eq!(
            h.committed,
            delivered.last().copied(),
            "health after shutdown: {h:?}"
        );
    }
    let (wal, r) = WalSink::open(&dir, o).unwrap();
    assert_eq!(
        r.committed,
        delivered.last().copied(),
        "shutdown did not mark what it delivered: {r:?}"
    );
    wal.restore(Some(20)).unwrap();
    wal.deliver_ready(&mut sink).unwrap();
    let all = sink.got();
    let uniq: BTreeSet<u64> = all.iter().copied().collect();
    assert_eq!(
        uniq.len(),
        all.len(),
        "an epoch was delivered twice without a crash: {all:?}"
    );
    assert_eq!(uniq, (1..=20).collect());
}

/// Committer with a sink that fails a few times: health().last_error and retries are set,
/// then cleared after the success; errors counts them.
#[test]
fn health_clears_the_error_once_the_committer_delivers_again() {
    let t = tempfile::tempdir().unwrap();
    let (wal, _) = WalSink::open(t.path(), opts()).unwrap();
    let sink = MemorySink::new();
    sink.fail_next(4);
    let c = wal.spawn_committer(sink.clone()).unwrap();
    write_epochs(&wal, 1..=2);
    wal.checkpoint_complete(2).unwrap();
    assert!(wal.wait_committed(2, Duration::from_secs(10)));
    let h = wal.health();
    assert!(h.errors >= 4, "errors {h:?}");
    assert!(h.last_error.is_none(), "last_error not cleared: {h:?}");
    assert_eq!(h.retries, 0, "retries not cleared: {h:?}");
    c.shutdown();
}

/// wait_committed with huge timeouts must not panic (Instant overflow) and must return.
#[test]
fn wait_committed_accepts_huge_timeouts() {
    let t = tempfile::tempdir().unwrap();
    let (wal, _) = WalSink::open(t.path(), opts()).unwrap();
    let wal = Arc::new(wal);
    write_epochs(&wal, 1..=1);
    wal.checkpoint_complete(1).unwrap();
    wal.deliver_ready(&mut MemorySink::new()).unwrap();
    // already committed
    for d in [
        Duration::MAX,
        Duration::from_secs(u64::MAX),
        Duration::from_secs(u64::MAX / 2),
    ] {
        let w = wal.clone();
        let h = std::thread::spawn(move || w.wait_committed(1, d));
        let start = Instant::now();
        while !h.is_finished() && start.elapsed() < Duration::from_secs(3) {
            std::thread::sleep(Duration::from_millis(5));
        }
        assert!(
            h.is_finished(),
            "wait_committed(committed id, {d:?}) did not return"
        );
        assert!(
            h.join().expect("wait_committed panicked"),
            "committed id reported not committed"
        );
    }
    // zero timeout on a not-committed id
    assert!(!wal.wait_committed(2, Duration::ZERO));
    // not yet committed, huge timeout, commit arrives later from another thread
    write_epochs(&wal, 2..=2);
    let w = wal.clone();
    let h = std::thread::spawn(move || w.wait_committed(2, Duration::MAX));
    std::thread::sleep(Duration::from_millis(100));
    wal.checkpoint_complete(2).unwrap();
    wal.deliver_ready(&mut MemorySink::new()).unwrap();
    let start = Instant::now();
    while !h.is_finished() && start.elapsed() < Duration::from_secs(3) {
        std::thread::sleep(Duration::from_millis(5));
    }
    assert!(
        h.is_finished(),
        "wait_committed(2, MAX) did not wake on commit"
    );
    assert!(h.join().expect("panicked"));
}

/// checkpoint(u64::MAX) twice: the second is InvalidCheckpoint { min_allowed: None }; also
/// after reopen; delivery of the MAX epoch works.
#[test]
fn checkpoint_id_u64_max_is_accepted_once_also_after_reopen() {
    let t = tempfile::tempdir().unwrap();
    {
        let (wal, _) = WalSink::open(t.path(), opts()).unwrap();
        wal.append(b"a").unwrap();
        wal.checkpoint(u64::MAX, b"m").unwrap();
        let e = wal.checkpoint(u64::MAX, b"m").unwrap_err();
        assert!(
            matches!(
                e.kind(),
                ErrorKind::InvalidCheckpoint {
                    id: u64::MAX,
                    min_allowed: None
                }
            ),
            "{e:?}"
        );
        let e = wal.checkpoint(7, b"m").unwrap_err();
        assert!(
            matches!(
                e.kind(),
                ErrorKind::InvalidCheckpoint {
                    min_allowed: None,
                    ..
                }
            ),
            "{e:?}"
        );
        // appending more is still allowed (open epoch), delivery of MAX works
        wal.append(b"b").unwrap();
        wal.checkpoint_complete(u64::MAX).unwrap();
        let mut s = MemorySink::new();
        wal.deliver_ready(&mut s).unwrap();
        assert_eq!(s.checkpoints(), vec![u64::MAX]);
        assert!(wal.wait_committed(u64::MAX, Duration::from_secs(1)));
    }
    let (wal, r) = WalSink::open(t.path(), opts()).unwrap();
    assert_eq!(r.committed, Some(u64::MAX));
    let e = wal.checkpoint(u64::MAX, b"m").unwrap_err();
    assert!(
        matches!(
            e.kind(),
            ErrorKind::InvalidCheckpoint {
                min_allowed: None,
                ..
            }
        ),
        "after reopen: {e:?} (report next id {})",
        r.next_checkpoint_id
    );
    let e = wal.checkpoint(r.next_checkpoint_id, b"m");
    assert!(
        e.is_err(),
        "after MAX, checkpoint(next_checkpoint_id={}) was accepted",
        r.next_checkpoint_id
    );
    // restore(Some(MAX)) must not panic
    let _ = wal.restore(Some(u64::MAX));
    let _ = wal.restore(None);
}

/// restore() with small segments: voided epochs are never delivered (also after reopen and
/// after clean-up freed segments), kept ones exactly once, the log verifies clean.
#[test]
fn a_restore_over_small_segments_cleans_up_and_loses_nothing() {
    let t = tempfile::tempdir().unwrap();
    let dir = t.path().join("wal");
    let sink = MemorySink::new();
    {
        let (wal, _) = WalSink::open(&dir, opts()).unwrap();
        write_epochs(&wal, 1..=10);
        wal.checkpoint_complete(2).unwrap();
        let mut s = sink.clone();
        wal.deliver_ready(&mut s).unwrap();
        wal.restore(Some(4)).unwrap(); // voids 5..=10, makes 3,4 deliverable
        wal.deliver_ready(&mut s).unwrap();
        assert_eq!(sink.checkpoints(), vec![1, 2, 3, 4]);
        let e = wal.checkpoint(8, b"m");
        assert!(e.is_err(), "a voided id was reused");
        write_epochs(&wal, 11..=30);
        wal.checkpoint_complete(30).unwrap();
        wal.deliver_ready(&mut s).unwrap();
        let h = wal.health();
        assert_eq!(h.committed, Some(30));
        assert!(h.segments <= 6, "committed segments not freed: {h:?}");
    }
    let mut expect: Vec<u64> = (1..=4).collect();
    expect.extend(11..=30);
    assert_eq!(sink.checkpoints(), expect);
    assert!(
        verify_ok(&dir),
        "{:?}",
        walsink::verify(&FsStorage::new(&dir).unwrap())
            .unwrap()
            .problems
    );
    let (wal, r) = WalSink::open(&dir, opts()).unwrap();
    assert!(r.pending.is_empty(), "{r:?}");
    assert!(r.next_checkpoint_id > 30);
    assert!(!loss_reported(&r), "{r:?}");
    // restore(None) now: nothing to void; then a new epoch
    wal.restore(None).unwrap();
    write_epochs(&wal, 31..=31);
    wal.checkpoint_complete(31).unwrap();
    let mut s = sink.clone();
    wal.deliver_ready(&mut s).unwrap();
    assert_eq!(*sink.checkpoints().last().unwrap(), 31);
}

/// restore(Some(k)) then reopen before delivery: voided epochs stay voided.
#[test]
fn epochs_voided_by_a_restore_stay_voided_after_reopen() {
    let t = tempfile::tempdir().unwrap();
    let dir = t.path().join("wal");
    {
        let (wal, _) = WalSink::open(&dir, opts()).unwrap();
        write_epochs(&wal, 1..=12);
        wal.restore(Some(3)).unwrap();
        wal.append(b"open-epoch-after-restore").unwrap();
    }
    let (wal, r) = WalSink::open(&dir, opts()).unwrap();
    assert_eq!(r.pending, vec![1, 2, 3], "{r:?}");
    assert!(r.next_checkpoint_id > 12, "{r:?}");
    wal.restore(Some(3)).unwrap();
    let mut s = MemorySink::new();
    wal.deliver_ready(&mut s).unwrap();
    assert_eq!(s.checkpoints(), vec![1, 2, 3]);
}

/// MemoryCommitStore (forgets) + MemorySink::with_marker across restarts with segment
/// clean-up: every epoch exactly once, no IncompleteEpoch corruption on reopen.
#[test]
fn a_memory_commit_store_with_a_marker_sink_delivers_once_across_restarts() {
    let t = tempfile::tempdir().unwrap();
    let dir = t.path().join("wal");
    let sink = MemorySink::with_marker();
    let mut next = 1u64;
    let mut expect = vec![];
    for round in 0..6 {
        let (wal, r) = WalSink::open_with(
            Arc::new(FsStorage::new(&dir).unwrap()),
            opts(),
            Box::new(MemoryCommitStore::new()),
        )
        .unwrap_or_else(|e| panic!("round {round}: reopen failed: {e:?}"));
        assert!(!loss_reported(&r), "round {round}: {r:?}");
        // the engine restores from its last checkpoint
        wal.restore(r.last_checkpoint).unwrap();
        let mut s = sink.clone();
        wal.deliver_ready(&mut s).unwrap();
        next = next.max(r.next_checkpoint_id);
        for _ in 0..8 {
            for i in 0..6 {
                wal.append(&rec(next, i)).unwrap();
            }
            wal.checkpoint(next, b"m").unwrap();
            expect.push(next);
            next += 1;
        }
        // complete only some so that some are pending across the restart
        wal.checkpoint_complete(next - 3).unwrap();
        wal.deliver_ready(&mut s).unwrap();
    }
    let (wal, r) = WalSink::open_with(
        Arc::new(FsStorage::new(&dir).unwrap()),
        opts(),
        Box::new(MemoryCommitStore::new()),
    )
    .unwrap();
    wal.restore(r.last_checkpoint).unwrap();
    let mut s = sink.clone();
    wal.deliver_ready(&mut s).unwrap();
    let got = sink.checkpoints();
    assert_eq!(
        got, expect,
        "marker sink did not get every epoch exactly once in order"
    );
}

/// DirSink exactly-once: deliveries with a forgetting commit store across reopen never
/// duplicate a file's records; read_records equals the appended records once each.
#[test]
fn a_dir_sink_delivers_exactly_once_across_reopen() {
    let t = tempfile::tempdir().unwrap();
    let dir = t.path().join("wal");
    let out = t.path().join("out");
    let mut expect: Vec<Vec<u8>> = vec![];
    let mut next = 1;
    for _round in 0..4 {
        let (wal, r) = WalSink::open_with(
            Arc::new(FsStorage::new(&dir).unwrap()),
            opts(),
            Box::new(MemoryCommitStore::new()),
        )
        .unwrap();
        wal.restore(r.last_checkpoint).unwrap();
        let mut s = DirSink::new(&out).unwrap().keep_metadata(true);
        wal.deliver_ready(&mut s).unwrap();
        next = std::cmp::max(next, r.next_checkpoint_id);
        for _ in 0..5 {
            for i in 0..4 {
                let v = rec(next, i);
                wal.append(&v).unwrap();
                expect.push(v);
            }
            wal.checkpoint(next, format!("m{next}").as_bytes()).unwrap();
            next += 1;
        }
        wal.checkpoint_complete(next - 1).unwrap();
        let c = wal.spawn_committer(s).unwrap();
        assert!(wal.wait_committed(next - 1, Duration::from_secs(10)));
        c.shutdown();
    }
    let got = DirSink::read_records(&out).unwrap();
    assert_eq!(got, expect);
    let committed = DirSink::committed(&out, "probe", 0).unwrap();
    assert_eq!(committed.len(), 20);
    assert!(committed
        .iter()
        .all(|c| c.metadata.as_deref() == Some(format!("m{}", c.checkpoint).as_bytes())));
}

/// A commit store that forgets, a plain sink, checking that the COMMITTED floor never lets
/// freed segments make reopen fail.
#[test]
fn a_memory_commit_store_with_a_plain_sink_reopens_after_cleanup() {
    let t = tempfile::tempdir().unwrap();
    let dir = t.path().join("wal");
    for round in 0..4u64 {
        let (wal, r) = WalSink::open_with(
            Arc::new(FsStorage::new(&dir).unwrap()),
            opts(),
            Box::new(MemoryCommitStore::new()),
        )
        .unwrap_or_else(|e| panic!("round {round}: {e:?}"));
        let base = r.next_checkpoint_id;
        write_epochs(&wal, base..=base + 15);
        wal.checkpoint_complete(base + 15).unwrap();
        wal.deliver_ready(&mut MemorySink::new()).unwrap();
    }
}

/// deliver_ready with mark_every(1): after it returns a sink error, health().last_error shows
/// it (README: health shows "the last error").
#[test]
fn a_deliver_ready_error_shows_in_health() {
    let t = tempfile::tempdir().unwrap();
    let (wal, _) = WalSink::open(t.path(), opts()).unwrap();
    write_epochs(&wal, 1..=2);
    wal.checkpoint_complete(2).unwrap();
    let mut sink = FlakySink::new(1, 1);
    let e = wal.deliver_ready(&mut sink);
    assert!(e.is_err());
    let h = wal.health();
    assert!(h.errors >= 1, "{h:?}");
    assert!(
        h.last_error.is_some(),
        "deliver_ready returned {e:?} but health().last_error is None: {h:?}"
    );
    wal.deliver_ready(&mut sink).unwrap();
    let h = wal.health();
    assert!(h.last_error.is_none() && h.retries == 0, "{h:?}");
}

/// Block policy with no sealed epoch: an append that would wait fails at once (design:
/// "waiting could never end"), it must not hang.
#[test]
fn a_blocking_backlog_without_a_sealed_epoch_fails_fast() {
    let t = tempfile::tempdir().unwrap();
    let o = opts().max_backlog_bytes(300, walsink::FullPolicy::Block);
    let (wal, _) = WalSink::open(t.path(), o).unwrap();
    let wal = Arc::new(wal);
    let w = wal.clone();
    let h = std::thread::spawn(move || {
        let mut last = Ok(());
        for i in 0..20 {
            last = w.append(&rec(0, i));
            if last.is_err() {
                break;
            }
        }
        last
    });
    let start = Instant::now();
    while !h.is_finished() && start.elapsed() < Duration::from_secs(3) {
        std::thread::sleep(Duration::from_millis(5));
    }
    assert!(
        h.is_finished(),
        "append blocked forever with no sealed epoch to wait for"
    );
    let r = h.join().unwrap();
    assert!(
        matches!(
            r.as_ref().map_err(|e| e.kind()),
            Err(ErrorKind::BacklogFull { .. })
        ),
        "{r:?}"
    );
}

/// Durable mode refuses checkpoint / checkpoint_complete / restore with InvalidOperation and
/// its automatic epochs are delivered.
#[test]
fn durable_mode_refuses_checkpoint_calls() {
    let t = tempfile::tempdir().unwrap();
    let (wal, _) = WalSink::open(t.path(), opts().mode(walsink::Mode::Durable)).unwrap();
    wal.append(b"d1").unwrap();
    for r in [
        wal.checkpoint(100, b""),
        wal.checkpoint_complete(1),
        wal.restore(None),
    ] {
        assert!(
            matches!(
                r.as_ref().map_err(|e| e.kind()),
                Err(ErrorKind::InvalidOperation { .. })
            ),
            "{r:?}"
        );
    }
    let mut s = MemorySink::new();
    wal.deliver_ready(&mut s).unwrap();
    assert_eq!(s.records(), vec![b"d1".to_vec()]);
}

/// wait_committed on a sink that keeps failing returns false after its timeout.
#[test]
fn wait_committed_times_out_while_the_sink_fails() {
    let t = tempfile::tempdir().unwrap();
    let (wal, _) = WalSink::open(t.path(), opts()).unwrap();
    let sink = MemorySink::new();
    sink.set_failing(true);
    let c = wal.spawn_committer(sink.clone()).unwrap();
    write_epochs(&wal, 1..=1);
    wal.checkpoint_complete(1).unwrap();
    let start = Instant::now();
    assert!(!wal.wait_committed(1, Duration::from_millis(300)));
    assert!(start.elapsed() < Duration::from_secs(3));
    let h = wal.health();
    assert!(h.last_error.is_some() && h.errors > 0, "{h:?}");
    sink.set_failing(false);
    assert!(wal.wait_committed(1, Duration::from_secs(5)));
    let h = wal.health();
    assert!(
        h.last_error.is_none() && h.retries == 0,
        "after recovery of the sink: {h:?}"
    );
    c.shutdown();
}
