//! Faults on the real filesystem: a full disk (a 2 MiB tmpfs, mounted when running as root),
//! permission denied (an immutable directory, which stops root too), and the log directory
//! deleted underneath. Each gives a typed error and poisons the log; after the fault is gone a
//! reopen recovers every checkpoint that returned Ok. (EIO and failed fsyncs are injected on
//! the simulated disk: tests/durability.rs.)

use crate::support::*;
use std::path::Path;
use std::process::Command;
use walsink::{ErrorKind, MemorySink, WalSink};

fn is_enospc(e: &walsink::Error) -> bool {
    matches!(e.kind(), ErrorKind::Io { source, .. } if source.raw_os_error() == Some(28))
}

#[test]
fn full_disk_is_a_typed_error_and_recovers_after_space_is_freed() {
    if !need_root("full_disk") {
        return;
    }
    let fs = Tmpfs::mount("2m");
    let wal_dir = fs.0.join("wal");
    // Most of the disk is taken by a file we can delete later.
    std::fs::write(fs.0.join("filler"), vec![1u8; 1200 << 10]).unwrap();
    let o = opts("full").segment_size(64 << 10);
    let (wal, _) = WalSink::open(&wal_dir, o.clone()).unwrap();
    let mut durable = Vec::new();
    let mut failure = None;
    'outer: for cp in 1..10_000u64 {
        for i in 0..50 {
            if let Err(e) = wal.append(format!("cp {cp} rec {i} {}", "p".repeat(100)).as_bytes()) {
                failure = Some(e);
                break 'outer;
            }
        }
        match wal.checkpoint(cp, b"") {
            Ok(()) => durable.push(cp),
            Err(e) => {
                failure = Some(e);
                break;
            }
        }
    }
    let e = failure.expect("the disk fills up");
    assert!(is_enospc(&e), "{e}");
    assert!(durable.len() > 3, "{durable:?}");
    assert!(wal.append(b"x").unwrap_err().is_poisoned());
    drop(wal);
    // Reopening on the still-full disk must not lose or corrupt anything either.
    match WalSink::open(&wal_dir, o.clone()) {
        Ok((_, r)) => assert!(durable.iter().all(|id| r.pending.contains(id))),
        Err(e) => assert!(is_enospc(&e), "{e}"),
    }
    std::fs::remove_file(fs.0.join("filler")).unwrap();
    let (wal, report) = WalSink::open(&wal_dir, o).unwrap();
    for id in &durable {
        assert!(
            report.pending.contains(id),
            "checkpoint {id} lost: {report:?}"
        );
    }
    wal.checkpoint_complete(*durable.last().unwrap()).unwrap();
    let mut sink = MemorySink::new();
    wal.deliver_ready(&mut sink).unwrap();
    assert_eq!(sink.records().len(), durable.len() * 50);
    wal.append(b"after").unwrap();
    wal.checkpoint(100_000, b"").unwrap();
    let v = walsink::verify(&walsink::storage::FsStorage::new(&wal_dir).unwrap()).unwrap();
    assert!(v.ok, "{:?}", v.problems);
}

/// Delivery frees segments only after it records the commit, and that record is a new file:
/// on a disk with no block left it would fail for ever, and the log could never drain what
/// fills the disk. The reserve an open log keeps (`RESERVE`) makes room for it: with the disk
/// full, every complete epoch is delivered, segments are freed, and a reopened log appends
/// again, without anyone freeing space by hand.
#[test]
fn a_full_disk_drains_through_delivery_by_itself() {
    if !need_root("full_disk_drains") {
        return;
    }
    let fs = Tmpfs::mount("2m");
    let wal_dir = fs.0.join("wal");
    let o = opts("drain").segment_size(128 << 10);
    let (wal, _) = WalSink::open(&wal_dir, o.clone()).unwrap();
    let mut complete = Vec::new();
    'outer: for cp in 1..100_000u64 {
        for i in 0..40 {
            if wal
                .append(format!("cp {cp} rec {i} {}", "f".repeat(200)).as_bytes())
                .is_err()
            {
                break 'outer;
            }
        }
        if wal.checkpoint(cp, b"").is_err() {
            break;
        }
        wal.checkpoint_complete(cp).unwrap();
        complete.push(cp);
    }
    assert!(complete.len() > 20, "{complete:?}");
    // The disk is full: nothing more fits.
    assert!(std::fs::write(fs.0.join("probe"), vec![0u8; 8192]).is_err());
    let mut sink = MemorySink::new();
    let n = wal
        .deliver_ready(&mut sink)
        .expect("delivery drains a full disk");
    assert_eq!(n, complete.len());
    assert_eq!(sink.records().len(), complete.len() * 40);
    drop(wal);
    // Reopened (the poisoned handle is gone), the log takes appends again in the room the
    // delivered segments left, and the reserve is back.
    let (wal, report) = WalSink::open(&wal_dir, o).unwrap();
    assert!(report.pending.is_empty(), "{report:?}");
    for i in 0..200 {
        wal.append(format!("after {i} {}", "a".repeat(200)).as_bytes())
            .unwrap();
    }
    wal.checkpoint(1_000_000, b"").unwrap();
    wal.checkpoint_complete(1_000_000).unwrap();
    let mut sink = MemorySink::new();
    assert_eq!(wal.deliver_ready(&mut sink).unwrap(), 1);
    assert_eq!(sink.records().len(), 200);
    assert!(wal_dir.join("RESERVE").exists());
    let v = walsink::verify(&walsink::storage::FsStorage::new(&wal_dir).unwrap()).unwrap();
    assert!(v.ok, "{:?}", v.problems);
}

/// The same full disk, with the process gone before anything was delivered (the sink was
/// down): the log must open again on the still-full disk, its new segment taking the first
/// block from the reserve, and then drain through delivery, with nobody freeing space by hand.
#[test]
fn a_full_disk_drains_after_a_restart() {
    if !need_root("full_disk_restart") {
        return;
    }
    for mode in [walsink::Mode::Checkpointed, walsink::Mode::Durable] {
        let fs = Tmpfs::mount("2m");
        let wal_dir = fs.0.join("wal");
        let o = opts("restart").segment_size(64 << 10).mode(mode);
        let (wal, _) = WalSink::open(&wal_dir, o.clone()).unwrap();
        let mut complete = Vec::new();
        let mut acked = 0;
        'outer: for cp in 1..100_000u64 {
            for i in 0..40 {
                let r = format!("cp {cp} rec {i} {}", "f".repeat(200));
                if wal.append(r.as_bytes()).is_err() {
                    break 'outer;
                }
                acked += 1;
            }
            if mode == walsink::Mode::Durable {
                continue;
            }
            if wal.checkpoint(cp, b"").is_err() {
                break;
            }
            wal.checkpoint_complete(cp).unwrap();
            complete.push(cp);
        }
        drop(wal);
        assert!(std::fs::write(fs.0.join("probe"), vec![0u8; 8192]).is_err());
        let (wal, report) = WalSink::open(&wal_dir, o.clone())
            .unwrap_or_else(|e| panic!("{mode:?}: reopen on the full disk: {e}"));
        if let Some(&last) = complete.last() {
            wal.checkpoint_complete(last).unwrap();
        }
        let mut sink = MemorySink::new();
        wal.deliver_ready(&mut sink)
            .unwrap_or_else(|e| panic!("{mode:?}: delivery after the restart: {e}"));
        let want = if mode == walsink::Mode::Durable {
            acked
        } else {
            complete.len() * 40
        };
        assert!(want > 800, "{mode:?}: {want} {report:?}");
        assert_eq!(sink.records().len(), want, "{mode:?}");
        drop(wal);
        let (wal, _) = WalSink::open(&wal_dir, o).unwrap();
        for i in 0..200 {
            wal.append(format!("after {i} {}", "a".repeat(200)).as_bytes())
                .unwrap_or_else(|e| panic!("{mode:?}: append after the drain: {e}"));
        }
    }
}

fn chattr(flag: &str, p: &Path) {
    assert!(Command::new("chattr")
        .arg(flag)
        .arg(p)
        .status()
        .unwrap()
        .success());
}

#[test]
fn permission_denied_is_a_typed_error_and_clears_on_reopen() {
    if !need_root("permission_denied") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let o = opts("perm").segment_size(8192);
    let (wal, _) = WalSink::open(dir.path(), o.clone()).unwrap();
    append_values(&wal, 1, 10);
    wal.checkpoint(1, b"").unwrap();
    // No new file can be created in the directory: the next roll fails.
    chattr("+i", dir.path());
    let mut err = None;
    for i in 0..2000 {
        if let Err(e) = wal.append(format!("{i:0200}").as_bytes()) {
            err = Some(e);
            break;
        }
    }
    chattr("-i", dir.path());
    let e = err.expect("roll fails");
    assert!(
        matches!(e.kind(), ErrorKind::Io { source, .. } if source.kind() == std::io::ErrorKind::PermissionDenied),
        "{e}"
    );
    assert!(wal.checkpoint(2, b"").unwrap_err().is_poisoned());
    drop(wal);
    let (wal, report) = WalSink::open(dir.path(), o).unwrap();
    assert_eq!(report.pending, vec![1]);
    assert_eq!(complete_and_deliver(&wal, 1), values(1, 10));
}

#[test]
fn directory_deleted_underneath_fails_the_next_checkpoint() {
    let base = tempfile::tempdir().unwrap();
    let dir = base.path().join("wal");
    let (wal, _) = WalSink::open(&dir, opts("gone")).unwrap();
    append_values(&wal, 1, 10);
    wal.checkpoint(1, b"").unwrap();
    std::fs::remove_dir_all(&dir).unwrap();
    append_values(&wal, 11, 20);
    // The files are unlinked: a sync would "succeed" and protect nothing. It must fail.
    let e = wal.checkpoint(2, b"").unwrap_err();
    assert!(matches!(e.kind(), ErrorKind::Io { .. }), "{e}");
    assert!(e.to_string().contains("removed"), "{e}");
    assert!(wal.append(b"x").unwrap_err().is_poisoned());
    drop(wal);
    // Reopening starts a new, empty log in a new directory.
    let (_, report) = WalSink::open(&dir, opts("gone")).unwrap();
    assert!(report.pending.is_empty());
}
