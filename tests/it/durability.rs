//! Durability contract, measured through the storage layer: the exact number of syncs per
//! checkpoint and per durable append batch, group commit across threads, poisoning after a
//! failed sync, durable-buffer mode surviving power loss, and the disk budget.

use crate::support::*;
use std::io;
use std::sync::Arc;
use std::time::Duration;
use walsink::storage::{CrashOptions, FaultOp, SimStorage};
use walsink::{ErrorKind, FullPolicy, MemorySink, Mode, WalSink};

fn lose_everything_unsynced(sim: &SimStorage) {
    sim.crash(CrashOptions {
        seed: 0,
        lose_all_unsynced: true,
        process_only: false,
    });
}

#[test]
fn checkpoint_costs_one_data_sync_per_touched_segment() {
    let sim = SimStorage::new();
    let wal = open_sim(&sim, opts("syncs").segment_size(16 << 10));
    // Within one segment: exactly one data sync, no directory sync.
    sim.reset_stats();
    append_values(&wal, 1, 20);
    wal.checkpoint(1, b"m").unwrap();
    let s = sim.stats();
    assert_eq!((s.data_syncs, s.dir_syncs), (1, 0), "{s:?}");
    // An empty checkpoint still syncs its barrier.
    sim.reset_stats();
    wal.checkpoint(2, b"").unwrap();
    assert_eq!((sim.stats().data_syncs, sim.stats().dir_syncs), (1, 0));
    // Completing does no I/O at all.
    sim.reset_stats();
    wal.checkpoint_complete(2).unwrap();
    assert_eq!(
        sim.stats().writes + sim.stats().data_syncs + sim.stats().dir_syncs,
        0
    );
    // Spanning three segments: three data syncs and one directory sync for the new names.
    sim.reset_stats();
    let big = vec![b'x'; 3000];
    let mut segments_before = 0;
    for _ in 0..12 {
        wal.append(&big).unwrap();
        segments_before += 1;
    }
    assert!(segments_before > 0);
    let rolled = sim.stats().creates;
    assert_eq!(rolled, 2, "12 x 3 KB in 16 KiB segments rolls twice");
    wal.checkpoint(3, b"").unwrap();
    let s = sim.stats();
    assert_eq!((s.data_syncs, s.dir_syncs), (3, 1), "{s:?}");
}

#[test]
fn durable_append_batch_costs_one_data_sync() {
    let sim = SimStorage::new();
    let wal = open_sim(&sim, opts("dsyncs").mode(Mode::Durable));
    sim.reset_stats();
    wal.append(b"one").unwrap();
    let s = sim.stats();
    assert_eq!((s.data_syncs, s.dir_syncs), (1, 0), "{s:?}");
    sim.reset_stats();
    let batch: Vec<Vec<u8>> = values(1, 100);
    wal.append_batch(batch.iter().map(|v| v.as_slice()))
        .unwrap();
    let s = sim.stats();
    assert_eq!((s.data_syncs, s.dir_syncs), (1, 0), "{s:?}");
    // One writer alone, nothing else to sync: the sync is one write durable on return
    // (`O_DIRECT | O_DSYNC` on a real disk), one write in all.
    assert_eq!((s.durable_writes, s.writes), (1, 1), "{s:?}");
    sim.reset_stats();
    wal.append(&[7u8; 4000]).unwrap();
    let s = sim.stats();
    assert_eq!(
        (s.data_syncs, s.durable_writes, s.writes),
        (1, 1, 1),
        "{s:?}"
    );
}

#[test]
fn group_commit_serves_many_writers_with_fewer_syncs() {
    let dir = tempfile::tempdir().unwrap();
    let (wal, _) = WalSink::open(dir.path(), opts("group").mode(Mode::Durable)).unwrap();
    let wal = Arc::new(wal);
    let threads: Vec<_> = (0..16)
        .map(|t| {
            let wal = wal.clone();
            std::thread::spawn(move || {
                for i in 0..50 {
                    wal.append(format!("{t}-{i}").as_bytes()).unwrap();
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    // Every append is durable and sealed in some automatic checkpoint.
    let pending = wal.pending();
    let records: u64 = pending.iter().map(|p| p.records).sum();
    assert_eq!(records, 800);
    assert!(
        pending.len() < 800,
        "group commit should seal several appends per sync, got {} epochs for 800 appends",
        pending.len()
    );
    let mut sink = MemorySink::new();
    wal.deliver_ready(&mut sink).unwrap();
    assert_eq!(sink.records().len(), 800);
}

#[test]
fn group_commit_on_the_simulated_disk_counts_syncs() {
    let sim = SimStorage::new();
    let wal = Arc::new(open_sim(&sim, opts("groupsim").mode(Mode::Durable)));
    sim.reset_stats();
    let threads: Vec<_> = (0..8)
        .map(|t| {
            let wal = wal.clone();
            std::thread::spawn(move || {
                for i in 0..100 {
                    wal.append(format!("{t}-{i}").as_bytes()).unwrap();
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    let syncs = sim.stats().data_syncs;
    let epochs = wal.pending().len() as u64;
    // One data sync per automatic checkpoint, never more.
    assert_eq!(syncs, epochs, "syncs {syncs}, epochs {epochs}");
    assert!(syncs <= 800);
}

#[test]
fn durable_mode_survives_power_loss_and_delivers_automatically() {
    let sim = SimStorage::new();
    {
        let wal = open_sim(&sim, opts("buffer").mode(Mode::Durable));
        for v in values(1, 30) {
            wal.append(&v).unwrap();
        }
        assert!(matches!(
            wal.checkpoint(99, b"").unwrap_err().kind(),
            ErrorKind::InvalidOperation { .. }
        ));
        assert!(matches!(
            wal.restore(None).unwrap_err().kind(),
            ErrorKind::InvalidOperation { .. }
        ));
    }
    lose_everything_unsynced(&sim);
    let (wal, report) =
        WalSink::open_with_storage(Arc::new(sim.clone()), opts("buffer").mode(Mode::Durable))
            .unwrap();
    assert_eq!(report.pending_records, 30);
    let mut sink = MemorySink::new();
    wal.deliver_ready(&mut sink).unwrap();
    assert_eq!(sink.records(), values(1, 30));
}

#[test]
fn failed_sync_poisons_until_reopen() {
    let sim = SimStorage::new();
    let wal = open_sim(&sim, opts("poison"));
    append_values(&wal, 1, 10);
    wal.checkpoint(1, b"").unwrap();
    append_values(&wal, 11, 20);
    sim.inject_fault(FaultOp::SyncData, 0, io::ErrorKind::Other);
    let e = wal.checkpoint(2, b"").unwrap_err();
    assert!(matches!(e.kind(), ErrorKind::Io { .. }), "{e}");
    assert!(wal.append(b"x").unwrap_err().is_poisoned());
    assert!(wal.checkpoint(3, b"").unwrap_err().is_poisoned());
    assert!(wal.health().poisoned);
    assert!(wal.health().poisoned);
    drop(wal);
    // Reopening recovers; checkpoint 1 is intact. Checkpoint 2 may or may not be: its sync
    // failed, so the engine must treat it as failed and restore from 1.
    let (wal, report) = WalSink::open_with_storage(Arc::new(sim.clone()), opts("poison")).unwrap();
    assert!(report.pending.starts_with(&[1]));
    wal.restore(Some(1)).unwrap();
    let mut sink = MemorySink::new();
    wal.deliver_ready(&mut sink).unwrap();
    assert_eq!(sink.records(), values(1, 10));
}

#[test]
fn disk_full_on_write_is_a_typed_error_and_nothing_is_lost() {
    let sim = SimStorage::new();
    let wal = open_sim(&sim, opts("enospc").segment_size(8192));
    append_values(&wal, 1, 10);
    wal.checkpoint(1, b"").unwrap();
    sim.inject_fault(FaultOp::Write, 0, io::ErrorKind::StorageFull);
    let mut err = None;
    for v in values(11, 500) {
        if let Err(e) = wal.append(&v) {
            err = Some(e);
            break;
        }
    }
    let e = err.expect("the injected ENOSPC surfaces");
    match e.kind() {
        ErrorKind::Io { source, .. } => assert_eq!(source.raw_os_error(), Some(28)),
        other => panic!("{other:?}"),
    }
    assert!(wal.append(b"more").unwrap_err().is_poisoned());
    drop(wal);
    let (wal, report) =
        WalSink::open_with_storage(Arc::new(sim.clone()), opts("enospc").segment_size(8192))
            .unwrap();
    assert_eq!(report.pending, vec![1]);
    assert_eq!(complete_and_deliver(&wal, 1), values(1, 10));
}

#[test]
fn budget_rejects_with_a_typed_error_and_never_drops() {
    let sim = SimStorage::new();
    let wal = open_sim(
        &sim,
        opts("budget").max_backlog_bytes(1000, FullPolicy::Reject),
    );
    let rec = vec![b'r'; 100];
    for _ in 0..9 {
        wal.append(&rec).unwrap();
    }
    wal.checkpoint(1, b"").unwrap();
    wal.append(&rec).unwrap();
    let e = wal.append(&rec).unwrap_err();
    assert!(
        matches!(e.kind(), ErrorKind::BacklogFull { limit: 1000, .. }),
        "{e}"
    );
    // Delivering frees the budget; nothing appended before was dropped.
    wal.checkpoint(2, b"").unwrap();
    wal.checkpoint_complete(2).unwrap();
    let mut sink = MemorySink::new();
    wal.deliver_ready(&mut sink).unwrap();
    assert_eq!(sink.records().len(), 10);
    wal.append(&rec).unwrap();
}

#[test]
fn budget_blocks_until_the_committer_frees_space() {
    let sim = SimStorage::new();
    let wal = Arc::new(open_sim(
        &sim,
        opts("block").max_backlog_bytes(1000, FullPolicy::Block),
    ));
    let rec = vec![b'b'; 100];
    for _ in 0..10 {
        wal.append(&rec).unwrap();
    }
    wal.checkpoint(1, b"").unwrap();
    let w2 = wal.clone();
    let writer = std::thread::spawn(move || w2.append(&[b'c'; 100]));
    std::thread::sleep(Duration::from_millis(100));
    assert!(
        !writer.is_finished(),
        "the append must wait while the budget is used up"
    );
    wal.checkpoint_complete(1).unwrap();
    let committer = wal.spawn_committer(MemorySink::new()).unwrap();
    writer.join().unwrap().unwrap();
    committer.shutdown();
}

#[test]
fn an_epoch_larger_than_the_budget_fails_instead_of_waiting_forever() {
    let sim = SimStorage::new();
    let wal = open_sim(&sim, opts("huge").max_backlog_bytes(500, FullPolicy::Block));
    let mut failed = false;
    for _ in 0..10 {
        if let Err(e) = wal.append(&[b'h'; 100]) {
            assert!(matches!(e.kind(), ErrorKind::BacklogFull { .. }));
            failed = true;
            break;
        }
    }
    assert!(failed);
}

#[test]
fn records_above_the_maximum_are_refused() {
    let sim = SimStorage::new();
    let wal = open_sim(&sim, opts("max"));
    let e = wal.append(&vec![0u8; (4 << 10) + 1]).unwrap_err();
    assert!(
        matches!(e.kind(), ErrorKind::RecordTooLarge { max: 4096, .. }),
        "{e}"
    );
    wal.append(&vec![0u8; 4 << 10]).unwrap();
    // A batch with one oversized record appends nothing.
    let big = vec![0u8; (4 << 10) + 1];
    let batch: [&[u8]; 3] = [b"a", &big, b"c"];
    assert!(wal.append_batch(batch).is_err());
    assert_eq!(wal.health().open_records, 1);
}

#[test]
fn committed_segments_are_freed_and_recycled() {
    let sim = SimStorage::new();
    let wal = open_sim(&sim, opts("gc").segment_size(8192));
    let mut sink = MemorySink::new();
    for cp in 1..=20u64 {
        for _ in 0..10 {
            wal.append(&[b'g'; 500]).unwrap();
        }
        wal.checkpoint(cp, b"").unwrap();
        wal.checkpoint_complete(cp).unwrap();
        wal.deliver_ready(&mut sink).unwrap();
    }
    let h = wal.health();
    assert_eq!(h.backlog_epochs, 0);
    assert!(h.segments <= 3, "{h:?}");
    let files = sim.snapshot();
    let free = files.keys().filter(|n| n.ends_with(".free")).count();
    assert!(
        (1..=2).contains(&free),
        "{:?}",
        files.keys().collect::<Vec<_>>()
    );
    assert_eq!(sink.records().len(), 200);
}

/// A backlog of `epochs` epochs of about one 8 KiB segment each, sealed and complete.
fn backlog_of_segments(wal: &WalSink, epochs: u64) {
    backlog_of_segments_from(wal, 1, epochs);
}

/// While a backlog drains, the segments it frees are kept as free files (removing a file is
/// slow and would hold delivery back), one is removed per 16 freed, and the rest once nothing
/// is deliverable: the log's files never outnumber what the backlog took, and end at
/// `max_free_segments`.
#[test]
fn a_draining_backlog_keeps_freed_segments_until_idle_without_growing() {
    let sim = SimStorage::new();
    let wal = open_sim(&sim, opts("drain").segment_size(8192));
    backlog_of_segments(&wal, 40);
    let (segs_before, free_before) = seg_and_free_files(&sim);
    assert!(segs_before >= 30 && free_before == 0, "{segs_before}");
    let mut sink = MemorySink::new();
    let mut d = wal.deliverer().unwrap();
    let (mut freed, mut kept) = (0, 0);
    loop {
        match d.next_step().unwrap() {
            walsink::Next::Idle => break,
            walsink::Next::Committed(_) => {}
            walsink::Next::Deliver(p) => {
                let e = d.read(&p).unwrap();
                let outcome = walsink::Sink::deliver(&mut sink, &e);
                d.finish(p, &e, outcome).unwrap();
            }
        }
        let (segs, free) = seg_and_free_files(&sim);
        assert!(
            segs + free <= segs_before,
            "{segs} + {free} > {segs_before}"
        );
        assert_eq!(wal.health().free_segments, free as u64);
        (freed, kept) = (segs_before - segs, free);
    }
    // Before the idle step: one removed per 16 freed, every other freed segment kept.
    assert!(freed + 2 >= segs_before, "{freed} of {segs_before}");
    assert_eq!(freed - kept, freed / 16, "freed {freed}, kept {kept}");
    drop(d);
    let (segs, free) = seg_and_free_files(&sim);
    assert_eq!(free, 2, "trimmed to max_free_segments once idle");
    assert_eq!(wal.health().free_segments, 2);
    assert!(segs <= 2, "{segs}");
    assert_eq!(sink.records().len(), 40 * 14);
    // Appends take the free files back first.
    backlog_of_segments_from(&wal, 41, 3);
    assert_eq!(seg_and_free_files(&sim).1, 0);
}

/// Epochs `first..first + n` of about one segment each.
fn backlog_of_segments_from(wal: &WalSink, first: u64, n: u64) {
    for cp in first..first + n {
        for _ in 0..14 {
            wal.append(&[b'e'; 500]).unwrap();
        }
        wal.checkpoint(cp, b"").unwrap();
        wal.checkpoint_complete(cp).unwrap();
    }
}

/// A power loss while a drain holds many free files: nothing delivered is lost or sent again
/// beyond the unmarked epoch, and the next drain trims the free files the crash left.
#[test]
fn free_files_kept_through_a_power_loss_are_reused_or_trimmed() {
    for seed in 0..20u64 {
        let sim = SimStorage::new();
        let o = || opts("drainc").segment_size(8192);
        let wal = open_sim(&sim, o());
        backlog_of_segments(&wal, 30);
        let mut sink = MemorySink::new();
        let mut d = wal.deliverer().unwrap();
        for _ in 0..(10 + seed) {
            if let walsink::Next::Deliver(p) = d.next_step().unwrap() {
                let e = d.read(&p).unwrap();
                let outcome = walsink::Sink::deliver(&mut sink, &e);
                d.finish(p, &e, outcome).unwrap();
            }
        }
        let kept = seg_and_free_files(&sim).1;
        assert!(kept > 2, "seed {seed}: {kept}");
        drop(d);
        drop(wal);
        sim.crash(CrashOptions {
            seed,
            lose_all_unsynced: seed % 2 == 0,
            process_only: false,
        });
        let wal = open_sim(&sim, o());
        assert!(
            seg_and_free_files(&sim).1 > 2,
            "seed {seed}: the free files are still there"
        );
        wal.checkpoint_complete(30).unwrap();
        wal.deliver_ready(&mut sink).unwrap();
        assert_eq!(seg_and_free_files(&sim).1, 2, "seed {seed}");
        // Every epoch reached the sink, and only the one delivered but not marked twice.
        let mut got = sink.records();
        got.sort();
        got.dedup();
        assert_eq!(
            got.len(),
            1,
            "seed {seed}: every record is the same byte string"
        );
        let delivered = sink.records().len();
        assert!(
            (30 * 14..=31 * 14).contains(&delivered),
            "seed {seed}: {delivered}"
        );
        backlog_of_segments_from(&wal, 31, 4);
        assert_eq!(seg_and_free_files(&sim).1, 0, "seed {seed}");
    }
}

/// A free file that cannot be removed when delivery goes idle: the call reports it, by name,
/// and the next one removes it.
#[test]
fn a_failed_trim_is_reported_and_done_again() {
    let sim = SimStorage::new();
    let wal = open_sim(&sim, opts("trimfail").segment_size(8192));
    backlog_of_segments(&wal, 8);
    let mut sink = MemorySink::new();
    let mut d = wal.deliverer().unwrap();
    // Deliver everything, up to the step that would find nothing more.
    while d.has_work() {
        match d.next_step().unwrap() {
            walsink::Next::Deliver(p) => {
                let e = d.read(&p).unwrap();
                let outcome = walsink::Sink::deliver(&mut sink, &e);
                d.finish(p, &e, outcome).unwrap();
            }
            other => panic!("{other:?}"),
        }
    }
    assert!(seg_and_free_files(&sim).1 > 2);
    sim.inject_fault(FaultOp::Remove, 0, io::ErrorKind::PermissionDenied);
    let e = d.next_step().unwrap_err();
    assert!(e.to_string().contains("remove free segment"), "{e}");
    assert!(seg_and_free_files(&sim).1 > 2);
    assert!(matches!(d.next_step().unwrap(), walsink::Next::Idle));
    assert_eq!(seg_and_free_files(&sim).1, 2);
    assert_eq!(sink.records().len(), 8 * 14);
}

/// The real filesystem, with every durable write checked before it is made: it must land on
/// blocks the file already has (no hole in its range, not past the end), so that it never
/// has to allocate. Counts durable writes, and those into recycled files.
mod checked_fs {
    use parking_lot::Mutex;
    use std::collections::HashSet;
    use std::io;
    use std::os::fd::AsRawFd;
    use std::path::PathBuf;
    use std::sync::Arc;
    use walsink::storage::{FsStorage, Storage, StorageFile};

    #[derive(Debug, Default)]
    pub struct Seen {
        pub durable_writes: usize,
        pub into_recycled: usize,
        pub violations: Vec<String>,
        recycled: HashSet<String>,
    }

    #[derive(Debug)]
    pub struct Checked {
        pub inner: FsStorage,
        pub dir: PathBuf,
        pub seen: Arc<Mutex<Seen>>,
    }

    #[derive(Debug)]
    struct File {
        inner: Arc<dyn StorageFile>,
        path: PathBuf,
        name: String,
        seen: Arc<Mutex<Seen>>,
    }

    impl Checked {
        fn wrap(&self, name: &str, inner: Arc<dyn StorageFile>) -> Arc<dyn StorageFile> {
            Arc::new(File {
                inner,
                path: self.dir.join(name),
                name: name.to_string(),
                seen: self.seen.clone(),
            })
        }
    }

    impl Storage for Checked {
        fn list(&self) -> io::Result<Vec<String>> {
            self.inner.list()
        }
        fn open(&self, name: &str) -> io::Result<Arc<dyn StorageFile>> {
            Ok(self.wrap(name, self.inner.open(name)?))
        }
        fn create(&self, name: &str) -> io::Result<Arc<dyn StorageFile>> {
            self.seen.lock().recycled.remove(name);
            Ok(self.wrap(name, self.inner.create(name)?))
        }
        fn rename(&self, from: &str, to: &str) -> io::Result<()> {
            self.inner.rename(from, to)?;
            if from.ends_with(".free") {
                self.seen.lock().recycled.insert(to.to_string());
            }
            Ok(())
        }
        fn remove(&self, name: &str) -> io::Result<()> {
            self.inner.remove(name)
        }
        fn sync_dir(&self) -> io::Result<()> {
            self.inner.sync_dir()
        }
        fn check_alive(&self) -> io::Result<()> {
            self.inner.check_alive()
        }
        fn lock(&self, name: &str) -> io::Result<Box<dyn Send + Sync + std::fmt::Debug>> {
            self.inner.lock(name)
        }
        fn describe(&self) -> String {
            self.inner.describe()
        }
    }

    impl StorageFile for File {
        fn len(&self) -> io::Result<u64> {
            self.inner.len()
        }
        fn read_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<usize> {
            self.inner.read_at(offset, buf)
        }
        fn write_at(&self, offset: u64, data: &[u8]) -> io::Result<()> {
            self.inner.write_at(offset, data)
        }
        fn sync_data(&self) -> io::Result<()> {
            self.inner.sync_data()
        }
        fn set_len(&self, len: u64) -> io::Result<()> {
            self.inner.set_len(len)
        }
        fn data_prefix(&self) -> io::Result<u64> {
            self.inner.data_prefix()
        }
        fn write_durable(&self, offset: u64, data: &[u8]) -> io::Result<()> {
            let end = offset + data.len() as u64;
            // Asked of the file itself, not of the library: the next hole at or after
            // `offset` (the end of the file counts as one; past the end is ENXIO).
            let f = std::fs::File::open(&self.path)?;
            // SAFETY: lseek on a descriptor owned by `f`.
            let hole = match unsafe { libc::lseek(f.as_raw_fd(), offset as i64, libc::SEEK_HOLE) } {
                h if h < 0 => Err(io::Error::last_os_error()),
                h => Ok(h as u64),
            };
            let mut seen = self.seen.lock();
            seen.durable_writes += 1;
            if seen.recycled.contains(&self.name) {
                seen.into_recycled += 1;
            }
            if !matches!(hole, Ok(h) if h >= end) {
                let msg = format!(
                    "durable write [{offset}, {end}) of {} allocates: next hole {hole:?}, \
                     file length {:?}",
                    self.name,
                    self.inner.len()
                );
                seen.violations.push(msg);
            }
            drop(seen);
            self.inner.write_durable(offset, data)
        }
    }
}

/// A durable write never has to allocate blocks, also in a recycled file that is shorter than
/// the segment (the segment size grew since it was written) or that ends in a hole (its segment
/// was closed early, as at every open).
#[test]
fn durable_writes_never_allocate_in_recycled_files() {
    use parking_lot::Mutex;
    use walsink::storage::FsStorage;
    let dir = tempfile::tempdir().unwrap();
    let durable = |seg: u64| {
        let mut o = opts("recycled")
            .mode(Mode::Durable)
            .segment_size(seg)
            .recycle_segments(true);
        o.max_free_segments = 8;
        o
    };
    let rec = |i: u32| format!("{i:>1000}").into_bytes();
    let mut want = Vec::new();
    let mut sink = MemorySink::new();
    // Small segments, several of them closed early by reopening, all freed.
    for round in 0..3u32 {
        let (wal, _) = WalSink::open(dir.path(), durable(64 << 10)).unwrap();
        for i in 0..(90 + 20 * round) {
            let r = rec(round * 1000 + i);
            wal.append(&r).unwrap();
            want.push(r);
            if i % 20 == 19 {
                wal.deliver_ready(&mut sink).unwrap();
            }
        }
        wal.deliver_ready(&mut sink).unwrap();
    }
    // Larger segments from now on: the free files are recycled into them.
    let seen = Arc::new(Mutex::new(checked_fs::Seen::default()));
    let storage = checked_fs::Checked {
        inner: FsStorage::new(dir.path()).unwrap(),
        dir: dir.path().to_path_buf(),
        seen: seen.clone(),
    };
    let (wal, _) = WalSink::open_with_storage(Arc::new(storage), durable(256 << 10)).unwrap();
    for i in 0..1200 {
        let r = rec(10_000 + i);
        wal.append(&r).unwrap();
        want.push(r);
        if i % 50 == 49 {
            wal.deliver_ready(&mut sink).unwrap();
        }
    }
    wal.deliver_ready(&mut sink).unwrap();
    assert_eq!(sink.records(), want);
    let seen = seen.lock();
    assert!(seen.violations.is_empty(), "{:#?}", seen.violations);
    // Not vacuous: most appends were one durable write, and many went into recycled files.
    assert!(seen.durable_writes > 600, "{seen:?}");
    assert!(seen.into_recycled > 300, "{seen:?}");
}
