//! Freed segments are closed on a background thread shared by all handles: their descriptors
//! and disk space come back, their names are gone when `deliver_ready` returns, the
//! descriptors of the embedding process are never closed under it, and release threads and
//! descriptors do not pile up across handles.

use crate::support::durable_logs::*;
use std::io::{Read, Write};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use walsink::{MemorySink, Mode, WalSink};

/// Opens files of its own while a log frees segments (deliver_ready on this thread, no
/// other thread of the test): every one of those files must stay open until it is dropped.
fn own_fds_survive(mode: Mode, recycle: bool) -> Result<(), String> {
    let base = tempfile::tempdir().unwrap();
    let (wal, _) = WalSink::open(
        base.path().join("wal"),
        durable("fdrepro", 8192, recycle).mode(mode),
    )
    .unwrap();
    let mut sink = MemorySink::new();
    let mut mine = Vec::new();
    for round in 0..200u64 {
        for k in 0..3 {
            wal.append(&rec(0, 0, round * 10 + k, 1500)).unwrap();
        }
        if mode == Mode::Checkpointed {
            wal.checkpoint(round + 1, b"").unwrap();
            wal.checkpoint_complete(round + 1).unwrap();
        }
        wal.deliver_ready(&mut sink).unwrap();
        // A file of our own, opened now (it may get a number a segment had).
        let p = base.path().join(format!("own-{round}"));
        let f = std::fs::File::create(&p).unwrap();
        mine.push((round, p, f));
        std::thread::sleep(Duration::from_millis(2));
        for (r, p, f) in &mine {
            if let Err(e) = f.metadata() {
                return Err(format!(
                    "{mode:?} recycle {recycle}: our file {p:?} (opened in round {r}) lost its \
                     descriptor by round {round}: {e}"
                ));
            }
        }
        if mine.len() > 20 {
            mine.remove(0);
        }
    }
    Ok(())
}

fn threads_named(name: &str) -> usize {
    std::fs::read_dir("/proc/self/task")
        .unwrap()
        .flatten()
        .filter(|t| {
            std::fs::read_to_string(t.path().join("comm"))
                .map(|c| c.trim_end() == name)
                .unwrap_or(false)
        })
        .count()
}

/// Thousands of segments removed (recycling off) under durable appends while a committer
/// delivers: afterwards no descriptor of a deleted segment stays open, the process holds no
/// more descriptors than before, and `du` of the directory is back to a few segments. A
/// sentinel file's descriptor keeps working throughout (a descriptor closed twice would hit
/// whatever reused its number).
#[test]
fn freed_segments_give_back_descriptors_and_space() {
    let base = tempfile::tempdir().unwrap();
    let wdir = base.path().join("wal");
    let seg = 16u64 << 10;
    let (wal, _) = WalSink::open(&wdir, durable("fds", seg, false)).unwrap();
    let wal = Arc::new(wal);
    let sink = CountSink::default();
    let committer = wal.spawn_committer(sink.clone()).unwrap();
    // Sentinels: files opened and checked over and over while segments come and go.
    let stop = Arc::new(AtomicBool::new(false));
    let sentinel_dir = base.path().join("sentinels");
    std::fs::create_dir(&sentinel_dir).unwrap();
    let sh = {
        let (stop, sd) = (stop.clone(), sentinel_dir.clone());
        std::thread::spawn(move || {
            let mut checks = 0u64;
            let mut k = 0u64;
            let keep = std::fs::OpenOptions::new()
                .create(true)
                .truncate(true)
                .read(true)
                .write(true)
                .open(sd.join("keep"))
                .unwrap();
            std::os::unix::fs::FileExt::write_all_at(&keep, b"KEEP-SENTINEL", 0).unwrap();
            while !stop.load(Ordering::SeqCst) {
                k += 1;
                let p = sd.join(format!("s{}", k % 8));
                let mut f = std::fs::OpenOptions::new()
                    .create(true)
                    .truncate(true)
                    .read(true)
                    .write(true)
                    .open(&p)
                    .unwrap();
                let tag = format!("sentinel {k}");
                f.write_all(tag.as_bytes()).unwrap();
                std::thread::sleep(Duration::from_micros(300));
                let mut back = vec![0; tag.len()];
                std::os::unix::fs::FileExt::read_exact_at(&f, &mut back, 0)
                    .unwrap_or_else(|e| panic!("sentinel {k}: read through its fd: {e}"));
                assert_eq!(
                    back,
                    tag.as_bytes(),
                    "sentinel {k}: fd now names another file"
                );
                let mut kb = [0u8; 13];
                std::os::unix::fs::FileExt::read_exact_at(&keep, &mut kb, 0).unwrap_or_else(|e| {
                    let fd = std::os::fd::AsRawFd::as_raw_fd(&keep);
                    panic!(
                        "the kept sentinel file's descriptor {fd} was closed under it: {e}; \
                         /proc/self/fd/{fd} now: {:?}",
                        std::fs::read_link(format!("/proc/self/fd/{fd}"))
                    )
                });
                assert_eq!(&kb, b"KEEP-SENTINEL");
                let mut s = String::new();
                std::fs::File::open(&p)
                    .unwrap()
                    .read_to_string(&mut s)
                    .unwrap();
                assert_eq!(s, tag);
                checks += 1;
            }
            checks
        })
    };
    let appended = Arc::new(AtomicU64::new(0));
    let hs: Vec<_> = (0..3u64)
        .map(|t| {
            let (wal, appended) = (wal.clone(), appended.clone());
            std::thread::spawn(move || {
                let mut rng = Rng::new(t + 99);
                let mut i = 0;
                // ~ 16 MiB per writer in 16 KiB segments: about 3000 segments in all.
                for _ in 0..1000 {
                    let n = 2 + rng.below(3);
                    let recs: Vec<Vec<u8>> = (0..n).map(|k| rec(0, t, i + k, 3000)).collect();
                    append_some(&wal, 1 + rng.below(3), &recs).unwrap();
                    i += n;
                    appended.fetch_add(n, Ordering::SeqCst);
                }
            })
        })
        .collect();
    let mut peak_deleted = 0;
    while hs.iter().any(|h| !h.is_finished()) {
        peak_deleted = peak_deleted.max(fds(&wdir).1);
        std::thread::sleep(Duration::from_millis(10));
    }
    for h in hs {
        h.join().unwrap();
    }
    wait_until("delivery of everything", Duration::from_secs(30), || {
        idle(&wal)
    });
    assert_eq!(
        sink.records.load(Ordering::SeqCst),
        appended.load(Ordering::SeqCst)
    );
    let epochs = sink.epochs.load(Ordering::SeqCst);
    wait_until(
        "no descriptor of a deleted segment left open",
        Duration::from_secs(30),
        || fds(&wdir).1 == 0,
    );
    wait_until(
        "du of the log directory back to a few segments",
        Duration::from_secs(30),
        || du(&wdir) <= 8 * seg + (1 << 20),
    );
    let segs = wseg_files(&wdir).len();
    stop.store(true, Ordering::SeqCst);
    let sentinel_checks = sh.join().unwrap();
    committer.shutdown();
    let h = wal.health();
    assert_eq!(h.errors, 0, "{:?}", h.last_error);
    drop(wal);
    wait_until(
        "no descriptor on the log directory left after the handle is dropped",
        Duration::from_secs(30),
        || fds(&wdir).0 == 0,
    );
    eprintln!(
        "{} records in {epochs} epochs; peak {peak_deleted} deleted segments open; {segs} \
         segment files left; {sentinel_checks} sentinel checks",
        appended.load(Ordering::SeqCst),
    );
    assert!(sentinel_checks > 0);
}

#[test]
fn files_of_the_embedding_process_keep_their_descriptors() {
    let mut failures = Vec::new();
    for mode in [Mode::Durable, Mode::Checkpointed] {
        for recycle in [false, true] {
            if let Err(e) = own_fds_survive(mode, recycle) {
                failures.push(e);
            }
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
}

/// 60 handles opened, made to free segments (durable appends and delivery, recycling off)
/// and dropped in turn: the threads that close removed files ("walsink-release") do not
/// pile up with the handles, and no descriptor on any of the directories stays open.
#[test]
fn release_threads_and_descriptors_do_not_pile_up_across_handles() {
    let base = tempfile::tempdir().unwrap();
    let mut seen_max = 0;
    for k in 0..60u64 {
        let wdir = base.path().join(format!("wal{k}"));
        let (wal, _) = WalSink::open(&wdir, durable("handles", 8192, false)).unwrap();
        let mut sink = MemorySink::new();
        for round in 0..6u64 {
            let recs: Vec<Vec<u8>> = (0..3).map(|j| rec(0, 0, round * 3 + j, 1800)).collect();
            wal.append_batch(recs.iter().map(|r| r.as_slice())).unwrap();
            wal.deliver_ready(&mut sink).unwrap();
        }
        assert_eq!(sink.records().len(), 18);
        seen_max = seen_max.max(threads_named("walsink-release"));
        drop(wal);
    }
    wait_until(
        "every descriptor on the 60 log directories closed",
        Duration::from_secs(30),
        || fds(base.path()).0 == 0,
    );
    let now = threads_named("walsink-release");
    eprintln!("walsink-release threads: at most {seen_max} seen, {now} now");
    assert!(
        seen_max <= 8,
        "{seen_max} walsink-release threads alive at once after opening handles in turn"
    );
}

/// Space: "The name is gone (and the directory synced) before the call returns; the space
/// comes back a moment later." After each deliver_ready (recycling off, everything
/// delivered), no more than the active segment and the one holding the last committed
/// barrier are left in the directory, at once, without waiting; in both modes.
#[test]
fn freed_segment_names_are_gone_when_deliver_ready_returns() {
    for mode in [Mode::Durable, Mode::Checkpointed] {
        let base = tempfile::tempdir().unwrap();
        let wdir = base.path().join("wal");
        let (wal, _) = WalSink::open(&wdir, durable("names", 8192, false).mode(mode)).unwrap();
        let mut sink = MemorySink::new();
        let mut most = 0;
        for round in 0..150u64 {
            let recs: Vec<Vec<u8>> = (0..4).map(|k| rec(0, 0, round * 4 + k, 1500)).collect();
            wal.append_batch(recs.iter().map(|r| r.as_slice())).unwrap();
            if mode == Mode::Checkpointed {
                wal.checkpoint(round + 1, b"").unwrap();
                wal.checkpoint_complete(round + 1).unwrap();
            }
            wal.deliver_ready(&mut sink).unwrap();
            let names = wseg_files(&wdir);
            most = most.max(names.len());
            assert!(
                names.len() <= 2,
                "{mode:?} round {round}: {} segment files right after deliver_ready: {names:?}",
                names.len()
            );
        }
        assert_eq!(sink.records().len(), 600);
        eprintln!("{mode:?}: at most {most} segment files after a delivery");
    }
}
