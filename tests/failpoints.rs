//! Failpoints inside the committer (feature `failpoints`, its own test binary): a crash in
//! the window between a sink accepting an epoch and the commit store recording it, and in
//! the window between the mark and freeing the segments. Each is followed by a power loss and
//! a reopen on the simulated disk.

#[path = "it/support/logs.rs"]
mod common;
use common::*;
use std::sync::Arc;
use walsink::storage::{CrashOptions, SimStorage};
use walsink::{fail, MemorySink, WalSink};

/// Failpoints are process-wide: the tests of this file take turns.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn three_epochs(sim: &SimStorage) -> WalSink {
    let wal = open_sim(sim, opts("fp").segment_size(8192));
    for cp in 1..=3u32 {
        for v in values(cp * 100, cp * 100 + 29) {
            let mut r = v;
            r.resize(200, b'.');
            wal.append(&r).unwrap();
        }
        wal.checkpoint(cp as u64, b"").unwrap();
    }
    wal.checkpoint_complete(3).unwrap();
    wal
}

fn crash_and_reopen(sim: &SimStorage, wal: WalSink) -> WalSink {
    drop(wal);
    sim.crash(CrashOptions::power_loss(11));
    let (wal, _) =
        WalSink::open_with_storage(Arc::new(sim.clone()), opts("fp").segment_size(8192)).unwrap();
    let last = wal.pending().last().map(|p| p.id);
    wal.restore(last).unwrap();
    wal
}

#[test]
fn crash_between_delivery_and_mark() {
    let _turn = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    // A sink with its own marker sees epoch 1 once; a plain sink sees it again (the
    // documented at-least-once window), and nothing is lost either way.
    for marker in [true, false] {
        let sim = SimStorage::new();
        let sink = if marker {
            MemorySink::with_marker()
        } else {
            MemorySink::new()
        };
        let wal = three_epochs(&sim);
        fail::arm("committer::deliver::after");
        assert!(wal.deliver_ready(&mut sink.clone()).is_err());
        assert_eq!(sink.checkpoints(), vec![1]);
        let wal = crash_and_reopen(&sim, wal);
        wal.deliver_ready(&mut sink.clone()).unwrap();
        if marker {
            assert_eq!(sink.checkpoints(), vec![1, 2, 3]);
        } else {
            assert_eq!(sink.checkpoints(), vec![1, 1, 2, 3]);
        }
        assert_eq!(wal.health().committed, Some(3));
    }
}

#[test]
fn crash_between_mark_and_segment_removal() {
    let _turn = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let sim = SimStorage::new();
    let sink = MemorySink::new();
    let wal = three_epochs(&sim);
    fail::arm("committer::mark::after");
    assert!(wal.deliver_ready(&mut sink.clone()).is_err());
    let before = sim
        .snapshot()
        .keys()
        .filter(|n| n.ends_with(".wseg"))
        .count();
    let wal = crash_and_reopen(&sim, wal);
    // Epoch 1 is committed: not delivered again, and its segments are freed later.
    wal.deliver_ready(&mut sink.clone()).unwrap();
    assert_eq!(sink.checkpoints(), vec![1, 2, 3]);
    let after = sim
        .snapshot()
        .keys()
        .filter(|n| n.ends_with(".wseg"))
        .count();
    assert!(
        after < before,
        "segments freed after the restart: {before} -> {after}"
    );
    assert_eq!(wal.health().backlog_epochs, 0);
}
