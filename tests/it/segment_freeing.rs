//! How a log frees disk space after delivery: delivered segments become `.free` files (with
//! `recycle_segments`), a draining backlog keeps them and removes one beyond
//! `max_free_segments` per 16 freed, an idle deliverer (`deliver_ready` finishing, the committer
//! going idle, `Next::Idle`) removes every free file beyond the bound, the log's disk use never
//! grows for it, appends take free files first, `Health::free_segments` shows the count, and
//! crashes or failed renames, removals and directory syncs lose nothing and are finished later.

use crate::support::{open_sim, seg_and_free_files};

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use walsink::storage::{CrashOptions, FaultOp, SimStorage};
use walsink::{
    Deliverer, DirSink, MemoryCommitStore, MemorySink, Next, Options, RecoveryReport, RetryPolicy,
    Sink, WalSink,
};

// ---------------------------------------------------------------------------------------------
// helpers

fn opts(name: &str, seg: u64, max_free: usize, recycle: bool, mark_every: usize) -> Options {
    let mut o = Options::new(name)
        .segment_size(seg)
        .max_record_size(2 << 10)
        .max_metadata_size(256)
        .recycle_segments(recycle)
        .mark_every(mark_every)
        .retry(RetryPolicy::new(
            Duration::from_millis(1),
            Duration::from_millis(10),
        ));
    o.max_free_segments = max_free;
    o
}

fn sim_free_names(sim: &SimStorage) -> BTreeSet<String> {
    sim_names(sim, ".free")
}

/// Stems (sequence numbers) of the files with extension `ext` on the simulated disk.
fn sim_names(sim: &SimStorage, ext: &str) -> BTreeSet<String> {
    sim.snapshot()
        .into_keys()
        .filter(|n| n.ends_with(ext))
        .collect()
}

/// The free files a step could leave: those before it and the segments it freed.
fn free_candidates(
    free: &BTreeSet<String>,
    segs_before: &BTreeSet<String>,
    sim: &SimStorage,
) -> BTreeSet<String> {
    let segs_after = sim_names(sim, ".wseg");
    let mut c = free.clone();
    for s in segs_before.difference(&segs_after) {
        c.insert(s.replace(".wseg", ".free"));
    }
    c
}

/// `(segments, free files)` in a real directory.
fn dir_counts(dir: &Path) -> (usize, usize) {
    let (mut s, mut f) = (0, 0);
    for e in std::fs::read_dir(dir).unwrap() {
        let n = e.unwrap().file_name().to_string_lossy().into_owned();
        if n.ends_with(".wseg") {
            s += 1;
        } else if n.ends_with(".free") {
            f += 1;
        }
    }
    (s, f)
}

/// A record of checkpoint `cp`, index `i`, padded to `size` bytes.
fn rec(cp: u64, i: u64, size: usize) -> Vec<u8> {
    let mut v = format!("c{cp}r{i}:").into_bytes();
    v.resize(size.max(v.len()), b'.');
    v
}

fn parse(r: &[u8]) -> (u64, u64) {
    let s = std::str::from_utf8(r).unwrap();
    let s = s.split(':').next().unwrap();
    let (c, i) = s[1..].split_once('r').unwrap();
    (c.parse().unwrap(), i.parse().unwrap())
}

/// Appends epochs `first..first+n` of `per` records of `size` bytes, checkpoints each and
/// (if `complete`) completes it. Returns the ids checkpointed.
fn fill(wal: &WalSink, first: u64, n: u64, per: u64, size: usize, complete: bool) -> Vec<u64> {
    let mut ids = Vec::new();
    for cp in first..first + n {
        for i in 0..per {
            wal.append(&rec(cp, i, size)).unwrap();
        }
        wal.checkpoint(cp, format!("m{cp}").as_bytes()).unwrap();
        if complete {
            wal.checkpoint_complete(cp).unwrap();
        }
        ids.push(cp);
    }
    ids
}

/// One step of a hand-driven deliverer; true when it was `Idle`.
fn step(d: &mut Deliverer, sink: &mut dyn Sink) -> walsink::Result<bool> {
    match d.next_step()? {
        Next::Idle => Ok(true),
        Next::Committed(_) => Ok(false),
        Next::Deliver(p) => {
            if sink.stores_marker() && sink.is_committed(p.key()).unwrap() {
                d.skip_committed(p);
                return Ok(false);
            }
            let e = d.read(&p)?;
            let outcome = sink.deliver(&e);
            d.finish(p, &e, outcome)?;
            Ok(false)
        }
    }
}

/// The records expected for epochs `ids` of `per` records each.
fn expected(ids: &[u64], per: u64) -> BTreeMap<(u64, u64), usize> {
    let mut m = BTreeMap::new();
    for &c in ids {
        for i in 0..per {
            m.insert((c, i), 1);
        }
    }
    m
}

fn tally(records: &[Vec<u8>]) -> BTreeMap<(u64, u64), usize> {
    let mut m = BTreeMap::new();
    for r in records {
        *m.entry(parse(r)).or_insert(0) += 1;
    }
    m
}

/// Every record in `want` arrived exactly once, and nothing else.
fn assert_exactly_once(records: &[Vec<u8>], want: &BTreeMap<(u64, u64), usize>, ctx: &str) {
    let got = tally(records);
    if &got != want {
        let missing: Vec<_> = want
            .keys()
            .filter(|k| !got.contains_key(k))
            .take(5)
            .collect();
        let dup: Vec<_> = got.iter().filter(|(_, &n)| n > 1).take(5).collect();
        let extra: Vec<_> = got
            .keys()
            .filter(|k| !want.contains_key(k))
            .take(5)
            .collect();
        panic!(
            "{ctx}: {} records, want {}; missing {missing:?} dup {dup:?} extra {extra:?}",
            records.len(),
            want.len()
        );
    }
}

/// Every record in `want` arrived at least once, nothing else, and at most `max_dup_epochs`
/// epochs came twice.
fn assert_at_least_once(
    records: &[Vec<u8>],
    want: &BTreeMap<(u64, u64), usize>,
    max_dup_epochs: usize,
    ctx: &str,
) {
    let got = tally(records);
    let missing: Vec<_> = want
        .keys()
        .filter(|k| !got.contains_key(k))
        .take(5)
        .collect();
    assert!(missing.is_empty(), "{ctx}: missing {missing:?}");
    let extra: Vec<_> = got
        .keys()
        .filter(|k| !want.contains_key(k))
        .take(5)
        .collect();
    assert!(extra.is_empty(), "{ctx}: extra {extra:?}");
    let dup_epochs: BTreeSet<u64> = got
        .iter()
        .filter(|(_, &n)| n > 1)
        .map(|((c, _), _)| *c)
        .collect();
    assert!(
        dup_epochs.len() <= max_dup_epochs,
        "{ctx}: {} epochs sent twice, at most {max_dup_epochs}: {dup_epochs:?}",
        dup_epochs.len()
    );
}

fn wait_for(what: &str, timeout: Duration, mut f: impl FnMut() -> bool) {
    let t = Instant::now();
    while !f() {
        assert!(t.elapsed() < timeout, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// Epoch shapes `(records per epoch, record size)` for a segment size: many epochs per
/// segment, about one segment per epoch, several segments per epoch.
fn shapes(seg: u64) -> [(u64, usize); 3] {
    [
        (3, 100),
        ((seg / 560).max(1), 500),
        ((3 * seg / 1040).max(1), 1000),
    ]
}

/// Epochs needed for about `segs` segments of `seg` bytes in a shape.
fn epochs_for(segs: u64, seg: u64, (per, size): (u64, usize)) -> u64 {
    (segs * seg / (per * (size as u64 + 24))).max(1)
}

// ---------------------------------------------------------------------------------------------
// 1. the drain, step by step, over a matrix of options

/// A backlog of about 40 segments drained by hand through `Deliverer::next_step`, for every
/// mix of segment size, `max_free_segments`, `recycle_segments`, `mark_every` and epoch shape.
/// After every step: segments + free files never exceed the peak, `Health` matches the disk,
/// no free file without recycling, at most one removal per 16 freed (exactly that many while
/// free files stay beyond the bound). At `Idle`: the free files are trimmed to the bound,
/// oldest first. Then appends take the free files before any new file, and a last drain
/// delivers everything exactly once.
#[test]
fn drain_matrix_keeps_trims_and_reuses_as_documented() {
    let mut combos = 0;
    for seg in [4096u64, 16384] {
        for max_free in [0usize, 1, 7, 1000] {
            for recycle in [true, false] {
                for mark_every in [1usize, 4] {
                    for shape in shapes(seg) {
                        combos += 1;
                        let ctx = format!(
                            "seg {seg} max_free {max_free} recycle {recycle} mark_every \
                             {mark_every} shape {shape:?}"
                        );
                        drain_once(seg, max_free, recycle, mark_every, shape, &ctx);
                    }
                }
            }
        }
    }
    assert_eq!(combos, 96);
}

fn drain_once(
    seg: u64,
    max_free: usize,
    recycle: bool,
    mark_every: usize,
    (per, size): (u64, usize),
    ctx: &str,
) {
    let sim = SimStorage::new();
    let wal = open_sim(&sim, opts("matrix", seg, max_free, recycle, mark_every));
    let n = epochs_for(40, seg, (per, size));
    let ids = fill(&wal, 1, n, per, size, true);
    let (segs0, free0) = seg_and_free_files(&sim);
    assert_eq!(free0, 0, "{ctx}");
    assert!(segs0 >= 30, "{ctx}: only {segs0} segments");
    let peak = segs0;
    let mut sink = MemorySink::new();
    let mut d = wal.deliverer().unwrap();
    let mut steps = 0;
    let free_before_idle;
    loop {
        steps += 1;
        assert!(steps < 10_000, "{ctx}: no end");
        let before_names = sim_free_names(&sim);
        let before_segs = sim_names(&sim, ".wseg");
        let idle = step(&mut d, &mut sink).unwrap();
        let (segs, free) = seg_and_free_files(&sim);
        let h = wal.health();
        assert!(segs + free <= peak, "{ctx}: {segs} + {free} > {peak}");
        assert_eq!(h.free_segments, free as u64, "{ctx}: health vs disk");
        assert_eq!(h.segments, segs as u64, "{ctx}: health vs disk (segments)");
        if !recycle {
            assert_eq!(free, 0, "{ctx}: free files without recycling");
        }
        if idle {
            free_before_idle = free_candidates(&before_names, &before_segs, &sim);
            break;
        }
        if recycle {
            let freed = segs0 - segs;
            let removed = freed - free;
            assert!(
                removed <= freed / 16,
                "{ctx}: {removed} removed of {freed} freed while draining"
            );
            // Checked exactly here when each pass frees about one segment (passes that
            // free many are their own test below).
            if max_free < 15 && size < 1000 && mark_every == 1 {
                assert_eq!(removed, freed / 16, "{ctx}: one per 16 freed");
            }
            if max_free >= 1000 {
                assert_eq!(removed, 0, "{ctx}");
            }
        }
    }
    // Idle: trimmed to the bound, the newest kept.
    let after = sim_free_names(&sim);
    let (segs, free) = seg_and_free_files(&sim);
    if recycle {
        assert_eq!(
            free,
            free_before_idle.len().min(max_free),
            "{ctx}: idle trims to the bound"
        );
        let newest: BTreeSet<String> = free_before_idle
            .iter()
            .rev()
            .take(max_free)
            .cloned()
            .collect();
        assert_eq!(after, newest, "{ctx}: oldest removed first");
    }
    assert!(segs <= 2, "{ctx}: {segs} segments after the drain");
    assert_eq!(wal.health().free_segments, free as u64, "{ctx}");
    // A second idle step changes nothing.
    assert!(step(&mut d, &mut sink).unwrap(), "{ctx}");
    assert_eq!(seg_and_free_files(&sim), (segs, free), "{ctx}");
    drop(d);
    assert_exactly_once(&sink.records(), &expected(&ids, per), ctx);

    // Appends take free files before they create files.
    let more = epochs_for((max_free.min(20) + 4) as u64, seg, (per, size));
    let mut all = ids.clone();
    for cp in n + 1..=n + more {
        let (s0, f0) = seg_and_free_files(&sim);
        all.extend(fill(&wal, cp, 1, per, size, true));
        let (s1, f1) = seg_and_free_files(&sim);
        let rolls = s1 - s0;
        if recycle {
            assert_eq!(f1, f0 - rolls.min(f0), "{ctx}: cp {cp} free files first");
        }
        assert_eq!(
            s1 + f1,
            s0 + f0 + rolls.saturating_sub(f0),
            "{ctx}: cp {cp} grew beyond what the free files cover"
        );
    }
    wal.deliver_ready(&mut sink).unwrap();
    assert_exactly_once(&sink.records(), &expected(&all, per), ctx);
    let (_, free) = seg_and_free_files(&sim);
    assert!(free <= max_free, "{ctx}: {free} free after the last drain");
    assert_eq!(wal.health().free_segments, free as u64, "{ctx}");
}

/// The documented rate, "one beyond `max_free_segments` is removed per 16 segments freed",
/// also when one pass frees several segments at once (an epoch spanning many segments, or
/// `mark_every` > 1): the removals made while draining come to `freed / 16`. (Found short of
/// it, one per pass, and mended in aaefc0a.)
#[test]
fn drain_removes_one_free_file_per_16_freed_when_passes_free_many() {
    let mut short = Vec::new();
    for (per, size, mark_every) in [(7u64, 500usize, 8usize), (7, 500, 5), (80, 1000, 1)] {
        let seg = 4096u64;
        let sim = SimStorage::new();
        let wal = open_sim(&sim, opts("rate", seg, 0, true, mark_every));
        let n = epochs_for(200, seg, (per, size));
        fill(&wal, 1, n, per, size, true);
        let (segs0, _) = seg_and_free_files(&sim);
        let mut sink = MemorySink::new();
        let mut d = wal.deliverer().unwrap();
        let mut last = (0, 0);
        while !step(&mut d, &mut sink).unwrap() {
            let (segs, free) = seg_and_free_files(&sim);
            last = (segs0 - segs, segs0 - segs - free);
        }
        let (freed, removed) = last;
        assert!(freed > 150, "{freed}");
        if removed < freed / 16 {
            short.push(format!(
                "per {per} size {size} mark_every {mark_every}: {removed} removed while {freed} \
                 were freed, documented one per 16 ({})",
                freed / 16
            ));
        }
    }
    assert!(short.is_empty(), "{short:#?}");
}

// ---------------------------------------------------------------------------------------------
// 2. every driver trims when it finds nothing deliverable

#[derive(Clone, Copy, Debug)]
enum Driver {
    DeliverReady,
    NextStep,
    Deferring,
    Committer,
}

/// Runs `driver` over `wal` until it is idle; returns the sink.
fn drive_idle(wal: &WalSink, driver: Driver, sink: MemorySink, settled: impl Fn() -> bool) {
    match driver {
        Driver::DeliverReady => {
            let mut s = sink;
            wal.deliver_ready(&mut s).unwrap();
        }
        Driver::NextStep => {
            let mut s = sink;
            let mut d = wal.deliverer().unwrap();
            while !step(&mut d, &mut s).unwrap() {}
        }
        Driver::Deferring => {
            let mut s = sink;
            let mut d = wal.deliverer().unwrap();
            loop {
                match d.next_step_deferring_mark().unwrap() {
                    (Next::Idle, _) => break,
                    (Next::Committed(_), due) => {
                        if let Some(due) = due {
                            d.mark_now(due).unwrap();
                        }
                    }
                    (Next::Deliver(p), due) => {
                        if let Some(due) = due {
                            d.mark_now(due).unwrap();
                        }
                        let e = d.read(&p).unwrap();
                        let outcome = s.deliver(&e);
                        d.finish(p, &e, outcome).unwrap();
                    }
                }
            }
        }
        Driver::Committer => {
            let c = wal.spawn_committer(sink).unwrap();
            wait_for(
                "the committer to go idle and trim",
                Duration::from_secs(10),
                &settled,
            );
            c.shutdown();
        }
    }
}

/// A log drained with a large bound keeps its free files; reopened with a smaller bound,
/// `Health` counts the files on disk at once, and the first idle of each driver (with nothing
/// at all to deliver) trims them to the new bound.
#[test]
fn reopen_with_a_smaller_bound_trims_at_the_first_idle_of_every_driver() {
    for driver in [
        Driver::DeliverReady,
        Driver::NextStep,
        Driver::Deferring,
        Driver::Committer,
    ] {
        for new_bound in [0usize, 1, 3] {
            let sim = SimStorage::new();
            let wal = open_sim(&sim, opts("smaller", 4096, 1000, true, 1));
            let ids = fill(&wal, 1, 60, 7, 500, true);
            let sink = MemorySink::new();
            wal.deliver_ready(&mut sink.clone()).unwrap();
            let (_, kept) = seg_and_free_files(&sim);
            assert!(kept > 30, "{kept}");
            assert_eq!(wal.health().free_segments, kept as u64);
            drop(wal);
            let wal = open_sim(&sim, opts("smaller", 4096, new_bound, true, 1));
            let (segs, free) = seg_and_free_files(&sim);
            let h = wal.health();
            assert_eq!(
                (h.segments, h.free_segments),
                (segs as u64, free as u64),
                "{driver:?}: health after reopen vs disk"
            );
            assert!(free + 1 >= kept, "{driver:?}: {free} of {kept}");
            let s2 = sim.clone();
            drive_idle(&wal, driver, sink.clone(), move || {
                seg_and_free_files(&s2).1 <= new_bound
            });
            let (_, free) = seg_and_free_files(&sim);
            assert_eq!(free, new_bound, "{driver:?}: trimmed to the new bound");
            assert_eq!(wal.health().free_segments, free as u64, "{driver:?}");
            assert_exactly_once(&sink.records(), &expected(&ids, 7), "after");
        }
    }
}

/// The same on a real directory, with the committer thread draining a backlog it is handed
/// while running: once idle it trims to the bound, and `Health` matches the directory.
#[test]
fn committer_thread_trims_when_idle_on_a_real_directory() {
    for max_free in [0usize, 2] {
        let dir = tempfile::tempdir().unwrap();
        let o = opts("committer", 8192, max_free, true, 1);
        let (wal, _) = WalSink::open(dir.path(), o).unwrap();
        let sink = MemorySink::with_marker();
        let c = wal.spawn_committer(sink.clone()).unwrap();
        let mut ids = Vec::new();
        for round in 0..3u64 {
            ids.extend(fill(&wal, 1 + round * 30, 30, 7, 1000, true));
            assert!(wal.wait_committed(*ids.last().unwrap(), Duration::from_secs(10)));
            wait_for("the idle trim", Duration::from_secs(10), || {
                dir_counts(dir.path()).1 <= max_free
            });
            let (segs, free) = dir_counts(dir.path());
            let h = wal.health();
            assert_eq!((h.segments, h.free_segments), (segs as u64, free as u64));
            assert!(segs <= 2, "{segs}");
        }
        c.shutdown();
        assert_exactly_once(&sink.records(), &expected(&ids, 7), "committer");
    }
}

/// A log reopened with `recycle_segments(false)` over free files of an earlier run: the docs
/// say appends take free files before they create files and the log's disk use never grows
/// for freeing; without recycling nothing ever reuses a free file, so none should be kept.
/// (They stayed for ever, up to `max_free_segments`, until aaefc0a.)
#[test]
fn recycling_off_keeps_no_free_file_it_will_never_reuse() {
    let sim = SimStorage::new();
    let wal = open_sim(&sim, opts("off", 4096, 1000, true, 1));
    fill(&wal, 1, 60, 7, 500, true);
    wal.deliver_ready(&mut MemorySink::new()).unwrap();
    assert!(seg_and_free_files(&sim).1 > 30);
    drop(wal);
    let wal = open_sim(&sim, opts("off", 4096, 2, false, 1));
    wal.deliver_ready(&mut MemorySink::new()).unwrap();
    let (s0, f0) = seg_and_free_files(&sim);
    fill(&wal, 100, 10, 7, 500, true);
    let (s1, f1) = seg_and_free_files(&sim);
    assert!(
        f0 == 0 || f1 < f0,
        "{f0} free files kept, none reused: segments {s0} -> {s1}, free {f0} -> {f1}"
    );
}

// ---------------------------------------------------------------------------------------------
// 3. appends interleaved with a drain that never goes idle

/// A backlog kept at about 20 segments for 300 rounds: each round appends about one
/// segment's epoch and delivers one epoch by hand (never reaching `Idle`). The freed segments
/// are kept as free files and the appends take them back, so the files never outnumber the
/// starting peak by more than one; then the idle step trims to the bound.
#[test]
fn appends_during_a_drain_reuse_free_files_and_never_grow() {
    for (max_free, recycle) in [(0usize, true), (2, true), (1000, true), (2, false)] {
        let ctx = format!("max_free {max_free} recycle {recycle}");
        let sim = SimStorage::new();
        let wal = open_sim(&sim, opts("steady", 4096, max_free, recycle, 1));
        let mut ids = fill(&wal, 1, 20, 7, 500, true);
        let mut sink = MemorySink::new();
        let mut d = wal.deliverer().unwrap();
        // The peak of the first 20 rounds (delivery marks and frees one step late).
        let (mut peak, mut max_total) = (0, 0);
        for round in 0..300u64 {
            ids.extend(fill(&wal, 21 + round, 1, 7, 500, true));
            assert!(
                !step(&mut d, &mut sink).unwrap(),
                "{ctx}: idle with a backlog"
            );
            let (s, f) = seg_and_free_files(&sim);
            max_total = max_total.max(s + f);
            if round < 20 {
                peak = max_total;
            }
            assert!(
                s + f <= peak + 1,
                "{ctx}: round {round}: {s} + {f} > {peak} + 1"
            );
            assert_eq!(wal.health().free_segments, f as u64, "{ctx}");
        }
        while !step(&mut d, &mut sink).unwrap() {}
        let (_, f) = seg_and_free_files(&sim);
        assert!(f <= max_free, "{ctx}: {f}");
        assert_exactly_once(&sink.records(), &expected(&ids, 7), &ctx);
        eprintln!("{ctx}: peak {peak}, most files {max_total}");
    }
}

static KILLED: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

// ---------------------------------------------------------------------------------------------
// 4. crashes at random points of drains, trims and reusing appends

/// What the test knows of the log across crashes.
struct Book {
    /// Records per acknowledged checkpoint.
    acked: BTreeMap<u64, u64>,
    next_id: u64,
}

impl Book {
    fn want(&self) -> BTreeMap<(u64, u64), usize> {
        let mut m = BTreeMap::new();
        for (&c, &n) in &self.acked {
            for i in 0..n {
                m.insert((c, i), 1);
            }
        }
        m
    }
    fn last(&self) -> Option<u64> {
        self.acked.keys().next_back().copied()
    }
}

/// One run of random operations (appends with checkpoints, delivery steps through a held
/// `Deliverer` or `deliver_ready`) until the first error (the armed kill) or `ops` operations.
fn random_ops(
    wal: &WalSink,
    rng: &mut fastrand::Rng,
    book: &mut Book,
    sink: &mut MemorySink,
    ops: usize,
    size: usize,
) {
    let held = rng.bool();
    let mut d = if held {
        Some(wal.deliverer().unwrap())
    } else {
        None
    };
    for _ in 0..ops {
        let r = rng.u32(0..10);
        if r < 4 {
            let cp = book.next_id;
            book.next_id += 1;
            let per = rng.u64(1..12);
            for i in 0..per {
                if wal.append(&rec(cp, i, size)).is_err() {
                    return;
                }
            }
            if wal.checkpoint(cp, b"m").is_err() {
                return;
            }
            book.acked.insert(cp, per);
            if rng.u32(0..4) != 0 && wal.checkpoint_complete(cp).is_err() {
                return;
            }
        } else if let Some(d) = d.as_mut() {
            if step(d, sink).is_err() {
                return;
            }
        } else if wal.deliver_ready(sink).is_err() {
            return;
        }
    }
}

/// Reopens after a crash: health matches the disk, nothing acknowledged is lost, and a
/// restore to the last acknowledged id makes it all deliverable again.
fn reopen_after_crash(
    sim: &SimStorage,
    open: &dyn Fn(&SimStorage) -> walsink::Result<(WalSink, RecoveryReport)>,
    book: &mut Book,
    ctx: &str,
) -> WalSink {
    let (wal, report) = open(sim).unwrap_or_else(|e| panic!("{ctx}: reopen: {e}"));
    assert!(report.corruption.is_none(), "{ctx}: {report:?}");
    let (segs, free) = seg_and_free_files(sim);
    let h = wal.health();
    assert_eq!(
        (h.segments, h.free_segments),
        (segs as u64, free as u64),
        "{ctx}: health after reopen vs disk"
    );
    let committed = report.committed.unwrap_or(0);
    for &id in book.acked.keys() {
        assert!(
            id <= committed || report.pending.contains(&id),
            "{ctx}: acknowledged checkpoint {id} lost (committed {committed}): {report:?}"
        );
    }
    book.next_id = book.next_id.max(report.next_checkpoint_id);
    wal.restore(book.last()).unwrap();
    wal
}

fn crash_sweep(seeds: std::ops::Range<u64>, memory_store: bool) -> usize {
    let mut crashes = 0;
    for seed in seeds {
        let mut rng = fastrand::Rng::with_seed(seed);
        let seg = [4096u64, 8192][rng.usize(0..2)];
        let max_free = [0usize, 1, 3, 100][rng.usize(0..4)];
        let recycle = rng.u32(0..4) != 0;
        let mark_every = [1usize, 2, 5][rng.usize(0..3)];
        // A store that forgets keeps exactly-once only with a marker sink (README).
        let marker = memory_store || rng.bool();
        let size = [60usize, 400, 1500][rng.usize(0..3)];
        let mut o = opts("crash", seg, max_free, recycle, mark_every);
        o.salt_seed = Some(seed);
        let ctx0 = format!(
            "seed {seed}: seg {seg} max_free {max_free} recycle {recycle} mark_every \
             {mark_every} marker {marker} size {size} memory_store {memory_store}"
        );
        let sim = SimStorage::new();
        let open = |sim: &SimStorage| {
            if memory_store {
                // A store that forgets: a fresh one per process.
                WalSink::open_with(
                    Arc::new(sim.clone()),
                    o.clone(),
                    Box::new(MemoryCommitStore::new()),
                )
            } else {
                WalSink::open_with_storage(Arc::new(sim.clone()), o.clone())
            }
        };
        let mut sink = if marker {
            MemorySink::with_marker()
        } else {
            MemorySink::new()
        };
        let mut book = Book {
            acked: BTreeMap::new(),
            next_id: 1,
        };
        // Free files to start with: a backlog drained and partly refilled.
        let wal = open(&sim).unwrap().0;
        for cp in 1..=30 {
            let per = rng.u64(1..12);
            for i in 0..per {
                wal.append(&rec(cp, i, size)).unwrap();
            }
            wal.checkpoint(cp, b"m").unwrap();
            book.acked.insert(cp, per);
        }
        book.next_id = 31;
        wal.checkpoint_complete(30).unwrap();
        wal.deliver_ready(&mut sink).unwrap();
        let mut wal = Some(wal);
        let cycles = 3;
        for cycle in 0..cycles {
            let ctx = format!("{ctx0} cycle {cycle}");
            let w = wal.take().unwrap();
            sim.kill_after(rng.u64(0..300));
            random_ops(&w, &mut rng, &mut book, &mut sink, 120, size);
            drop(w);
            if sim.is_dead() {
                KILLED.fetch_add(1, Ordering::Relaxed);
            }
            sim.crash(CrashOptions {
                seed: seed * 10 + cycle,
                lose_all_unsynced: rng.u32(0..3) == 0,
                process_only: rng.u32(0..3) == 0,
            });
            crashes += 1;
            wal = Some(reopen_after_crash(&sim, &open, &mut book, &ctx));
        }
        let ctx = format!("{ctx0} final");
        let w = wal.take().unwrap();
        w.deliver_ready(&mut sink)
            .unwrap_or_else(|e| panic!("{ctx}: final delivery: {e}"));
        let (_, free) = seg_and_free_files(&sim);
        assert!(
            free <= max_free,
            "{ctx}: {free} free files after the idle delivery"
        );
        // One more epoch, committed, so that nothing older is needed any more.
        let cp = book.next_id;
        w.append(&rec(cp, 0, size)).unwrap();
        w.checkpoint(cp, b"m").unwrap();
        book.acked.insert(cp, 1);
        w.checkpoint_complete(cp).unwrap();
        w.deliver_ready(&mut sink)
            .unwrap_or_else(|e| panic!("{ctx}: last delivery: {e}"));
        if marker {
            assert_exactly_once(&sink.records(), &book.want(), &ctx);
        } else {
            // At most `mark_every` epochs delivered and not marked per crash.
            assert_at_least_once(
                &sink.records(),
                &book.want(),
                mark_every * cycles as usize,
                &ctx,
            );
        }
        let (segs, free) = seg_and_free_files(&sim);
        assert!(
            free <= max_free,
            "{ctx}: {free} free files after the idle delivery"
        );
        if !recycle {
            assert_eq!(free, 0, "{ctx}");
        }
        let h = w.health();
        assert_eq!(
            (h.segments, h.free_segments),
            (segs as u64, free as u64),
            "{ctx}"
        );
        assert!(segs <= 2, "{ctx}: {segs} segments after the final drain");
    }
    crashes
}

/// 300 seeds, three crashes each (kill after a random number of mutating operations, then a
/// power loss or process kill, seeded), over random mixes of segment size, bound, recycling,
/// `mark_every`, marker or not; local commit store. Every acknowledged checkpoint survives and
/// is delivered exactly once to a marker sink (at least once, with at most `mark_every` epochs
/// again per crash, otherwise), and the free files end at the bound once idle.
#[test]
fn crashes_during_drains_trims_and_reuse_lose_nothing() {
    let n = crash_sweep(0..300, false);
    assert_eq!(n, 900);
    let killed = KILLED.load(Ordering::Relaxed);
    eprintln!("{n} crashes, {killed} after a kill");
}

/// The same with a commit store that forgets across restarts (`MemoryCommitStore`): the local
/// floor stands in for the marks while segments are freed and recycled.
#[test]
fn crashes_with_a_forgetting_commit_store_lose_nothing() {
    let n = crash_sweep(1000..1100, true);
    assert_eq!(n, 300);
}

/// Mutating operations so far (what `SimStorage::kill_after` counts).
fn mutating_ops(sim: &SimStorage) -> u64 {
    let s = sim.stats();
    s.writes + s.data_syncs - s.durable_writes + s.dir_syncs + s.dir_changes + s.creates
}

/// A log with a drained backlog of about 24 segments and its free files, then another backlog
/// of 24 segments complete and not delivered, built the same way each time.
fn prepared(
    seg: u64,
    max_free: usize,
    recycle: bool,
    mark_every: usize,
) -> (SimStorage, Options, Vec<u64>) {
    let sim = SimStorage::new();
    let mut o = opts("every", seg, max_free, recycle, mark_every);
    o.salt_seed = Some(7);
    let wal = open_sim(&sim, o.clone());
    let mut ids = fill(&wal, 1, 24, 7, 500, true);
    wal.deliver_ready(&mut MemorySink::new()).unwrap();
    ids.extend(fill(&wal, 25, 24, 7, 500, true));
    drop(wal);
    (sim, o, ids)
}

/// Kills the process at every mutating operation of a drain by `deliver_ready` (the marks,
/// the renames to `.free`, the trims while draining and at idle), then a power loss (all
/// unsynced lost, or seeded) or a process kill; reopened, every epoch is there or committed, a
/// marker sink gets each exactly once, and the free files end at the bound after the next
/// idle delivery.
#[test]
fn a_kill_at_every_operation_of_a_drain_and_its_trim_loses_nothing() {
    let mut runs = 0;
    for (max_free, recycle, mark_every) in [(0usize, true, 1usize), (2, true, 3), (1, false, 1)] {
        // How many mutating operations the drain takes.
        let (sim, o, _) = prepared(4096, max_free, recycle, mark_every);
        let wal = open_sim(&sim, o.clone());
        wal.checkpoint_complete(48).unwrap();
        sim.reset_stats();
        wal.deliver_ready(&mut MemorySink::new()).unwrap();
        let total = mutating_ops(&sim);
        drop(wal);
        assert!(total > 40, "{total}");
        for k in 0..=total {
            for mode in 0..3u64 {
                runs += 1;
                let ctx = format!(
                    "max_free {max_free} recycle {recycle} mark_every {mark_every} kill at op \
                     {k} of {total}, crash mode {mode}"
                );
                let (sim, o, ids) = prepared(4096, max_free, recycle, mark_every);
                let mut sink = MemorySink::with_marker();
                // The first drain's records are already in a target of their own: this
                // sink holds the second backlog only.
                let wal = open_sim(&sim, o.clone());
                wal.checkpoint_complete(48).unwrap();
                sim.kill_after(k);
                let r = wal.deliver_ready(&mut sink);
                drop(wal);
                sim.crash(CrashOptions {
                    seed: k,
                    lose_all_unsynced: mode == 0,
                    process_only: mode == 2,
                });
                let (wal, report) = WalSink::open_with_storage(Arc::new(sim.clone()), o.clone())
                    .unwrap_or_else(|e| panic!("{ctx}: reopen: {e} (drain: {r:?})"));
                assert!(report.corruption.is_none(), "{ctx}: {report:?}");
                let committed = report.committed.unwrap_or(0);
                for id in 25..=48 {
                    assert!(
                        id <= committed || report.pending.contains(&id),
                        "{ctx}: checkpoint {id} lost: {report:?}"
                    );
                }
                let h = wal.health();
                let (segs, free) = seg_and_free_files(&sim);
                assert_eq!(
                    (h.segments, h.free_segments),
                    (segs as u64, free as u64),
                    "{ctx}"
                );
                wal.checkpoint_complete(48).unwrap();
                wal.deliver_ready(&mut sink)
                    .unwrap_or_else(|e| panic!("{ctx}: delivery after reopen: {e}"));
                assert_exactly_once(&sink.records(), &expected(&ids[24..], 7), &ctx);
                let (_, free) = seg_and_free_files(&sim);
                assert!(free <= max_free, "{ctx}: {free} free files");
                assert_eq!(wal.health().free_segments, free as u64, "{ctx}");
                // Segments a crash left between the mark and their freeing go with the next
                // commit ("freed later").
                let mut ids = ids[24..].to_vec();
                ids.extend(fill(&wal, 49, 1, 7, 500, true));
                wal.deliver_ready(&mut sink).unwrap();
                assert_exactly_once(&sink.records(), &expected(&ids, 7), &ctx);
                let (segs, free) = seg_and_free_files(&sim);
                assert!(free <= max_free, "{ctx}: {free} free files");
                assert!(segs <= 2, "{ctx}: {segs} segments");
                assert_eq!(wal.health().free_segments, free as u64, "{ctx}");
            }
        }
    }
    eprintln!("{runs} kills");
}

/// A log holding about 40 free files (drained with a large bound), reopened with a bound of
/// 2: the first idle `deliver_ready` trims them, then appends roll into the two kept free files
/// and beyond. A kill at every mutating operation of that, then a power loss or process kill:
/// every checkpoint that returned is delivered exactly once after a reopen, and the free
/// files end at the bound.
#[test]
fn a_kill_at_every_operation_of_an_idle_trim_and_of_reusing_appends_loses_nothing() {
    let build = || {
        let sim = SimStorage::new();
        let mut o = opts("trimkill", 4096, 1000, true, 1);
        o.salt_seed = Some(3);
        let wal = open_sim(&sim, o.clone());
        let ids = fill(&wal, 1, 40, 7, 500, true);
        wal.deliver_ready(&mut MemorySink::new()).unwrap();
        assert!(seg_and_free_files(&sim).1 > 30);
        drop(wal);
        o.max_free_segments = 2;
        (sim, o, ids)
    };
    let work =
        |wal: &WalSink, sink: &mut MemorySink, acked: &mut Vec<u64>| -> walsink::Result<()> {
            wal.deliver_ready(sink)?;
            for cp in 41..47u64 {
                for i in 0..7 {
                    wal.append(&rec(cp, i, 500))?;
                }
                wal.checkpoint(cp, b"m")?;
                acked.push(cp);
            }
            Ok(())
        };
    let (sim, o, _) = build();
    let wal = open_sim(&sim, o.clone());
    sim.reset_stats();
    work(&wal, &mut MemorySink::new(), &mut Vec::new()).unwrap();
    let total = mutating_ops(&sim);
    drop(wal);
    assert!(total > 70, "{total}");
    let mut runs = 0;
    for k in 0..=total {
        for mode in 0..3u64 {
            runs += 1;
            let ctx = format!("kill at op {k} of {total}, crash mode {mode}");
            let (sim, o, _) = build();
            let wal = open_sim(&sim, o.clone());
            let mut sink = MemorySink::with_marker();
            let mut acked = Vec::new();
            sim.kill_after(k);
            let r = work(&wal, &mut sink, &mut acked);
            drop(wal);
            sim.crash(CrashOptions {
                seed: k,
                lose_all_unsynced: mode == 0,
                process_only: mode == 2,
            });
            let (wal, report) = WalSink::open_with_storage(Arc::new(sim.clone()), o.clone())
                .unwrap_or_else(|e| panic!("{ctx}: reopen: {e} ({r:?})"));
            assert!(report.corruption.is_none(), "{ctx}: {report:?}");
            for id in &acked {
                assert!(report.pending.contains(id), "{ctx}: {id} lost: {report:?}");
            }
            let h = wal.health();
            let (segs, free) = seg_and_free_files(&sim);
            assert_eq!(
                (h.segments, h.free_segments),
                (segs as u64, free as u64),
                "{ctx}"
            );
            wal.restore(acked.last().copied().or(Some(40))).unwrap();
            wal.deliver_ready(&mut sink)
                .unwrap_or_else(|e| panic!("{ctx}: delivery: {e}"));
            assert_exactly_once(&sink.records(), &expected(&acked, 7), &ctx);
            let (_, free) = seg_and_free_files(&sim);
            assert!(free <= 2, "{ctx}: {free} free files");
            assert_eq!(wal.health().free_segments, free as u64, "{ctx}");
        }
    }
    eprintln!("{runs} kills");
}

// ---------------------------------------------------------------------------------------------
// 5. failed renames, removals and directory syncs while freeing and trimming

/// A fault in the n-th rename, removal or directory sync of a drain (renames to `.free`, the
/// trims while draining and at idle, the commit record): the error is reported, nothing is
/// lost or sent twice (no crash), the next `deliver_ready` finishes the job (free files at the
/// bound, `Health` matching the disk), the log is not poisoned, and it reopens clean.
#[test]
fn failed_renames_removals_and_dir_syncs_while_freeing_are_reported_and_finished_later() {
    let mut runs = 0;
    for (max_free, mark_every) in [(0usize, 1usize), (3, 2)] {
        for op in [FaultOp::Remove, FaultOp::SyncDir, FaultOp::Rename] {
            for nth in 0..80u64 {
                runs += 1;
                let kind = if nth % 2 == 0 {
                    std::io::ErrorKind::Other
                } else {
                    std::io::ErrorKind::PermissionDenied
                };
                let ctx = format!("max_free {max_free} {op:?} fault #{nth} ({kind:?})");
                let (sim, o, ids) = prepared(4096, max_free, true, mark_every);
                let wal = open_sim(&sim, o.clone());
                wal.checkpoint_complete(48).unwrap();
                sim.inject_fault(op, nth, kind);
                let mut sink = MemorySink::new();
                let mut errs = Vec::new();
                for _ in 0..5 {
                    match wal.deliver_ready(&mut sink) {
                        Ok(_) => break,
                        Err(e) => errs.push(e.to_string()),
                    }
                }
                let hit = sim.pending_faults() == 0;
                sim.clear_faults();
                assert!(errs.len() < 5, "{ctx}: never finished: {errs:?}");
                if hit {
                    assert!(
                        !errs.is_empty(),
                        "{ctx}: the fault was hit and not reported"
                    );
                } else {
                    assert!(errs.is_empty(), "{ctx}: {errs:?}");
                }
                assert_exactly_once(&sink.records(), &expected(&ids[24..], 7), &ctx);
                assert!(!wal.health().poisoned, "{ctx}");
                // Appends go on; after the next commit everything is freed and trimmed, and a
                // reopen finds a clean log.
                let more = fill(&wal, 49, 3, 7, 500, true);
                wal.deliver_ready(&mut sink).unwrap();
                let (segs, free) = seg_and_free_files(&sim);
                let h = wal.health();
                assert!(free <= max_free, "{ctx}: {free} free files ({errs:?})");
                assert!(segs <= 2, "{ctx}: {segs} segments ({errs:?})");
                assert_eq!(
                    (h.segments, h.free_segments),
                    (segs as u64, free as u64),
                    "{ctx}"
                );
                drop(wal);
                let (wal, report) = WalSink::open_with_storage(Arc::new(sim.clone()), o.clone())
                    .unwrap_or_else(|e| panic!("{ctx}: reopen: {e}"));
                assert!(
                    report.pending.is_empty()
                        && report.torn_tail.is_none()
                        && report.corruption.is_none()
                        && report.unexpected_files.is_empty(),
                    "{ctx}: {report:?}"
                );
                wal.deliver_ready(&mut sink).unwrap();
                let mut all = ids[24..].to_vec();
                all.extend(more);
                assert_exactly_once(&sink.records(), &expected(&all, 7), &ctx);
                assert!(seg_and_free_files(&sim).1 <= max_free, "{ctx}");
            }
        }
    }
    assert_eq!(runs, 480);
}

/// A committer thread whose idle trim fails (a log reopened with a smaller bound, nothing to
/// deliver): it retries on its own, without new work, until the free files are at the bound,
/// and `Health` counts the error.
#[test]
fn committer_retries_a_failed_idle_trim_without_new_work() {
    for op in [FaultOp::Remove, FaultOp::SyncDir] {
        let sim = SimStorage::new();
        let wal = open_sim(&sim, opts("cf", 4096, 1000, true, 1));
        let ids = fill(&wal, 1, 40, 7, 500, true);
        let sink = MemorySink::new();
        wal.deliver_ready(&mut sink.clone()).unwrap();
        drop(wal);
        let wal = open_sim(&sim, opts("cf", 4096, 2, true, 1));
        sim.inject_fault(op, 3, std::io::ErrorKind::Other);
        let c = wal.spawn_committer(sink.clone()).unwrap();
        wait_for("the retried trim", Duration::from_secs(10), || {
            seg_and_free_files(&sim).1 <= 2
        });
        assert_eq!(sim.pending_faults(), 0, "{op:?}");
        assert!(wal.health().errors >= 1, "{op:?}: the failure is counted");
        assert_eq!(wal.health().free_segments, 2, "{op:?}");
        c.shutdown();
        assert_exactly_once(&sink.records(), &expected(&ids, 7), "committer");
    }
}

/// Once a failed trim was done again successfully, `Health` should not keep showing its error
/// (`last_error`: "cleared by the next success"; `retries`: "retries of the epoch now at the
/// head of the queue", and no epoch is queued). Until aaefc0a the error and `retries: 1`
/// stayed until some later epoch was delivered, although the log was idle and trimmed.
#[test]
fn health_clears_a_trim_error_once_the_trim_is_done() {
    // deliver_ready: the idle trim fails, the next call finishes it.
    let sim = SimStorage::new();
    let wal = open_sim(&sim, opts("clear", 4096, 0, true, 1));
    fill(&wal, 1, 8, 7, 500, true);
    sim.inject_fault(FaultOp::Remove, 0, std::io::ErrorKind::Other);
    let mut sink = MemorySink::new();
    let e = wal.deliver_ready(&mut sink).unwrap_err();
    assert!(e.to_string().contains("remove free segment"), "{e}");
    wal.deliver_ready(&mut sink).unwrap();
    assert_eq!(seg_and_free_files(&sim).1, 0);
    let h = wal.health();
    assert_eq!(
        (h.last_error.as_deref(), h.retries),
        (None, 0),
        "deliver_ready: trimmed, idle, yet Health shows {h:?}"
    );
    // The committer: it retried and trimmed on its own.
    let wal2 = {
        drop(wal);
        let sim2 = SimStorage::new();
        let wal = open_sim(&sim2, opts("clear2", 4096, 1000, true, 1));
        fill(&wal, 1, 20, 7, 500, true);
        wal.deliver_ready(&mut MemorySink::new()).unwrap();
        drop(wal);
        let wal = open_sim(&sim2, opts("clear2", 4096, 2, true, 1));
        sim2.inject_fault(FaultOp::Remove, 0, std::io::ErrorKind::Other);
        let c = wal.spawn_committer(MemorySink::new()).unwrap();
        wait_for("the trim", Duration::from_secs(10), || {
            seg_and_free_files(&sim2).1 <= 2
        });
        std::thread::sleep(Duration::from_millis(100));
        let h = wal.health();
        c.shutdown();
        (h.last_error, h.retries)
    };
    assert_eq!(wal2, (None, 0), "committer: trimmed and idle");
}

/// Freeing with recycling renames a segment to `.free`; when that rename fails, the error
/// names the rename, not a removal (it named a removal until aaefc0a), so an operator looks
/// at the right operation.
#[test]
fn a_failed_rename_to_free_is_reported_as_a_rename() {
    let (sim, o, _) = prepared(4096, 0, true, 1);
    let wal = open_sim(&sim, o);
    wal.checkpoint_complete(48).unwrap();
    // The 47th rename of this drain is that of 47.wseg to 47.free (the others are the
    // commit records' and the earlier segments').
    sim.inject_fault(FaultOp::Rename, 47, std::io::ErrorKind::PermissionDenied);
    let e = wal.deliver_ready(&mut MemorySink::new()).unwrap_err();
    assert!(sim.snapshot().contains_key("00000000000000000047.wseg"));
    assert!(!sim.snapshot().contains_key("00000000000000000047.free"));
    let msg = e.to_string();
    assert!(msg.contains("00000000000000000047"), "{msg}");
    assert!(
        !msg.contains("remove committed segment"),
        "a failed rename reported as a removal: {msg}"
    );
}

/// A delivered segment renamed to `.free` whose directory sync then fails (the last freeing
/// pass of a drain): the error is reported; the next `deliver_ready` (idle, `Ok(0)`) sends
/// nothing again and leaves the segment counted as a segment (the rename's fate is open until
/// a directory sync); the next commit's freeing pass finishes the job (docs/design.md, "Space":
/// segments are freed only by the pass after a mark). Then `Health` matches the disk, the
/// free files are trimmed to the bound, and appends take a free file first.
#[test]
fn a_failed_dir_sync_after_renaming_to_free_is_finished_by_the_next_commit() {
    let (sim, o, ids) = prepared(4096, 0, true, 1);
    let wal = open_sim(&sim, o);
    wal.checkpoint_complete(48).unwrap();
    // The 48th directory sync of this drain is the one after renaming 47.wseg to 47.free.
    sim.inject_fault(FaultOp::SyncDir, 48, std::io::ErrorKind::Other);
    let mut sink = MemorySink::new();
    let e = wal.deliver_ready(&mut sink).unwrap_err();
    assert!(
        sim.snapshot().contains_key("00000000000000000047.free"),
        "{e}"
    );
    assert!(e.to_string().contains("sync the directory"), "{e}");
    assert_eq!(wal.deliver_ready(&mut sink).unwrap(), 0);
    assert_exactly_once(&sink.records(), &expected(&ids[24..], 7), "drain");
    let more = fill(&wal, 49, 1, 7, 500, true);
    assert_eq!(wal.deliver_ready(&mut sink).unwrap(), 1);
    let all: Vec<u64> = ids[24..].iter().chain(&more).copied().collect();
    assert_exactly_once(&sink.records(), &expected(&all, 7), "after the next commit");
    let (segs, free) = seg_and_free_files(&sim);
    let h = wal.health();
    assert_eq!(
        (h.segments, h.free_segments),
        (segs as u64, free as u64),
        "Health vs disk after the next commit ({e})"
    );
    assert_eq!(free, 0, "free files beyond max_free_segments 0 once idle");
    assert!(segs <= 2, "{segs} segments after the next commit");
}

/// The rename of the last delivered segment to `.free` fails: the error names the rename, the
/// next `deliver_ready` returns `Ok(0)` and sends nothing again, and the next commit's freeing
/// pass frees the segment (3 segment files until then, where the drain leaves 2).
#[test]
fn a_failed_rename_to_free_is_done_again_by_the_next_commit() {
    let (sim, o, ids) = prepared(4096, 0, true, 1);
    let wal = open_sim(&sim, o);
    wal.checkpoint_complete(48).unwrap();
    sim.inject_fault(FaultOp::Rename, 47, std::io::ErrorKind::Other);
    let mut sink = MemorySink::new();
    let e = wal.deliver_ready(&mut sink).unwrap_err();
    assert!(e.to_string().contains("rename committed segment"), "{e}");
    assert_eq!(wal.deliver_ready(&mut sink).unwrap(), 0);
    assert_exactly_once(&sink.records(), &expected(&ids[24..], 7), "drain");
    let more = fill(&wal, 49, 1, 7, 500, true);
    assert_eq!(wal.deliver_ready(&mut sink).unwrap(), 1);
    let (segs, free) = seg_and_free_files(&sim);
    assert!(
        segs <= 2 && free == 0,
        "{segs} segments, {free} free, after the next commit ({e})"
    );
    let all: Vec<u64> = ids[24..].iter().chain(&more).copied().collect();
    assert_exactly_once(&sink.records(), &expected(&all, 7), "after the next commit");
}

// ---------------------------------------------------------------------------------------------
// 6. a real full disk (tmpfs, as root)

fn is_enospc(e: &walsink::Error) -> bool {
    matches!(e.kind(), walsink::ErrorKind::Io { source, .. } if source.raw_os_error() == Some(28))
}

/// Appends complete epochs until the disk is full; returns the ids that returned Ok.
fn fill_until_full(wal: &WalSink, first: u64, per: u64) -> Vec<u64> {
    let mut ids = Vec::new();
    for cp in first..first + 100_000 {
        for i in 0..per {
            if let Err(e) = wal.append(&rec(cp, i, 300)) {
                assert!(is_enospc(&e), "{e}");
                return ids;
            }
        }
        if let Err(e) = wal.checkpoint(cp, b"m") {
            assert!(is_enospc(&e), "{e}");
            return ids;
        }
        wal.checkpoint_complete(cp).unwrap();
        ids.push(cp);
    }
    panic!("the disk never filled");
}

/// A 2 MiB tmpfs filled by the log, drained: with a small bound the idle trim gives the space
/// back to the filesystem, and the reopened log holds about as much again (a restart
/// mid-drain and a large bound are the next test). Every epoch arrives exactly once, and
/// the free files on disk match `Health` and the bound.
#[test]
fn a_full_disk_drains_and_fills_again_through_free_files() {
    if !crate::support::need_root("a_full_disk_drains_and_fills_again_through_free_files") {
        return;
    }
    for max_free in [0usize, 2] {
        let fs = crate::support::Tmpfs::mount("2m");
        let wal_dir = fs.0.join("wal");
        let o = opts("full", 64 << 10, max_free, true, 1);
        let (wal, _) = WalSink::open(&wal_dir, o.clone()).unwrap();
        let sink = MemorySink::with_marker();
        let first = fill_until_full(&wal, 1, 40);
        assert!(first.len() > 20, "{max_free}: {}", first.len());
        let n = wal
            .deliver_ready(&mut sink.clone())
            .unwrap_or_else(|e| panic!("{max_free}: drain: {e}"));
        assert_eq!(n, first.len(), "{max_free}");
        let (segs, free) = dir_counts(&wal_dir);
        assert!(free <= max_free, "{max_free}: {free} free files");
        assert_eq!(wal.health().free_segments, free as u64, "{max_free}");
        assert!(segs <= 2, "{max_free}: {segs}");
        if max_free <= 2 {
            // The space is the filesystem's again ("a moment later": removed files are
            // closed on a background thread).
            let probe = fs.0.join("probe");
            wait_for("the drained space back", Duration::from_secs(5), || {
                let ok = std::fs::write(&probe, vec![7u8; 1 << 20]).is_ok();
                let _ = std::fs::remove_file(&probe);
                ok
            });
        }
        drop(wal);
        let (wal, report) = WalSink::open(&wal_dir, o.clone()).unwrap();
        assert!(report.pending.is_empty(), "{report:?}");
        let second = fill_until_full(&wal, first.last().unwrap() + 1, 40);
        assert!(
            second.len() * 10 >= first.len() * 8,
            "{max_free}: the second fill holds {} epochs, the first {}",
            second.len(),
            first.len()
        );
        wal.deliver_ready(&mut sink.clone()).unwrap();
        let mut all = first.clone();
        all.extend(&second);
        assert_exactly_once(
            &sink.records(),
            &expected(&all, 40),
            &format!("max_free {max_free}"),
        );
        let (_, free) = dir_counts(&wal_dir);
        assert!(free <= max_free, "{max_free}: {free}");
        drop(wal);
        // The second fill ended in a failed append (a torn tail for the next open to cut).
        let (wal, report) = WalSink::open(&wal_dir, o.clone()).unwrap();
        assert!(
            report.pending.is_empty() && report.corruption.is_none(),
            "{report:?}"
        );
        wal.append(b"c0r0:last").unwrap();
        wal.checkpoint(1_000_000, b"").unwrap();
        drop(wal);
        let v = walsink::verify(&walsink::storage::FsStorage::new(&wal_dir).unwrap()).unwrap();
        assert!(v.ok, "{max_free}: {:?}", v.problems);
        eprintln!(
            "max_free {max_free}: {} then {} epochs",
            first.len(),
            second.len()
        );
    }
}

/// Lists the log directory's small files and the filesystem's use, for failure messages.
fn full_disk_state(dir: &Path) -> String {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| !n.ends_with(".wseg") && !n.ends_with(".free"))
        .collect();
    v.sort();
    let df = std::process::Command::new("df").arg(dir).output().unwrap();
    let df = String::from_utf8_lossy(&df.stdout)
        .lines()
        .nth(1)
        .unwrap_or("")
        .to_string();
    format!(
        "(segments, free) {:?}, files {v:?}, df: {df}",
        dir_counts(dir)
    )
}

/// "A full disk drains": a log that filled the disk always drains by itself (the reserve
/// gives the commit record room), also when free files hold the drained space: a drain
/// stopped part-way (the process restarted with free files kept, default bound 2) or a large
/// bound leaves the disk full at the next open. Until aaefc0a no reserve could then be
/// written, the reopened log's appends refilled the disk, and every delivery failed with
/// ENOSPC recording the commit; now the open and the commit record give free files back.
#[test]
fn a_full_disk_with_drained_space_in_free_files_still_drains() {
    if !crate::support::need_root("a_full_disk_with_drained_space_in_free_files_still_drains") {
        return;
    }
    let mut failures = Vec::new();
    // (bound, steps of the first drain before the restart; None: drain to idle)
    for (max_free, first_steps) in [(2usize, Some(60usize)), (1000, None)] {
        let fs = crate::support::Tmpfs::mount("2m");
        let wal_dir = fs.0.join("wal");
        let o = opts("fullfree", 64 << 10, max_free, true, 1);
        let ctx = format!("max_free {max_free}, first drain {first_steps:?} steps");
        let (wal, _) = WalSink::open(&wal_dir, o.clone()).unwrap();
        let sink = MemorySink::with_marker();
        let first = fill_until_full(&wal, 1, 40);
        match first_steps {
            Some(n) => {
                let mut d = wal.deliverer().unwrap();
                let mut s = sink.clone();
                for _ in 0..n {
                    assert!(!step(&mut d, &mut s).unwrap(), "{ctx}");
                }
            }
            None => {
                wal.deliver_ready(&mut sink.clone()).unwrap();
            }
        }
        drop(wal);
        let (wal, _) = WalSink::open(&wal_dir, o.clone()).unwrap();
        let second = fill_until_full(&wal, first.last().unwrap() + 1, 40);
        let at_full = full_disk_state(&wal_dir);
        wal.checkpoint_complete(*second.last().unwrap_or(first.last().unwrap()))
            .unwrap();
        let mut errs = Vec::new();
        for _ in 0..3 {
            match wal.deliver_ready(&mut sink.clone()) {
                Ok(_) => break,
                Err(e) => errs.push(e.to_string()),
            }
            std::thread::sleep(Duration::from_millis(300));
        }
        if errs.len() == 3 {
            drop(wal);
            let reopen = WalSink::open(&wal_dir, o.clone()).err();
            failures.push(format!(
                "{ctx}: the full disk never drains: {:?}; when full again: {at_full}; reopen: \
                 {reopen:?}",
                errs[0]
            ));
            continue;
        }
        drop(wal);
        WalSink::open(&wal_dir, o.clone())
            .unwrap_or_else(|e| panic!("{ctx}: reopen: {e}; {}", full_disk_state(&wal_dir)));
        let mut all = first.clone();
        all.extend(&second);
        assert_exactly_once(&sink.records(), &expected(&all, 40), &ctx);
    }
    assert!(failures.is_empty(), "{failures:#?}");
}

// ---------------------------------------------------------------------------------------------
// 7. restore, segment size changes, threads

/// After a drain that left free files, a backlog of uncommitted epochs (taking the free files
/// and more) is partly voided by `restore`: the epochs kept are delivered once, the voided ones
/// never, the free files end at the bound, and after the next commit the log is down to its
/// last segments. `restore(None)` and `restore(Some(id))`.
#[test]
fn restore_after_a_drain_frees_voided_segments_and_trims() {
    for (restore_to, max_free) in [(Some(25u64), 2usize), (None, 0), (Some(40), 5)] {
        let ctx = format!("restore {restore_to:?} max_free {max_free}");
        let sim = SimStorage::new();
        let wal = open_sim(&sim, opts("restore", 4096, max_free, true, 1));
        let mut want = fill(&wal, 1, 20, 7, 500, true);
        let mut sink = MemorySink::with_marker();
        wal.deliver_ready(&mut sink).unwrap();
        assert_eq!(seg_and_free_files(&sim).1, max_free, "{ctx}");
        fill(&wal, 21, 20, 7, 500, false);
        for i in 0..30 {
            wal.append(&rec(99, i, 500)).unwrap();
        }
        let peak = {
            let (s, f) = seg_and_free_files(&sim);
            s + f
        };
        wal.restore(restore_to).unwrap();
        want.extend(21..=restore_to.unwrap_or(20));
        wal.deliver_ready(&mut sink).unwrap();
        let (segs, free) = seg_and_free_files(&sim);
        assert!(segs + free <= peak + 1, "{ctx}: {segs} + {free} > {peak}");
        assert!(free <= max_free, "{ctx}: {free}");
        assert_eq!(wal.health().free_segments, free as u64, "{ctx}");
        want.extend(fill(&wal, 41, 1, 7, 500, true));
        wal.deliver_ready(&mut sink).unwrap();
        assert_exactly_once(&sink.records(), &expected(&want, 7), &ctx);
        let (segs, free) = seg_and_free_files(&sim);
        assert!(segs <= 2 && free <= max_free, "{ctx}: ({segs}, {free})");
        assert_eq!(wal.health().free_segments, free as u64, "{ctx}");
        drop(wal);
        let (_, report) = WalSink::open_with_storage(
            Arc::new(sim.clone()),
            opts("restore", 4096, max_free, true, 1),
        )
        .unwrap();
        assert!(
            report.pending.is_empty() && report.torn_tail.is_none(),
            "{ctx}: {report:?}"
        );
    }
}

/// Free files written at one segment size, reused after a reopen with a larger or a smaller
/// one: every record round-trips, across another reopen too, and the free files still end at
/// the bound.
#[test]
fn free_files_are_reused_across_a_segment_size_change() {
    for (from, to) in [(8192u64, 32768u64), (32768, 8192), (4096, 65536)] {
        let ctx = format!("segment size {from} -> {to}");
        let sim = SimStorage::new();
        let wal = open_sim(&sim, opts("resize", from, 1000, true, 1));
        let n = epochs_for(20, from, (7, 500));
        let mut want = fill(&wal, 1, n, 7, 500, true);
        let mut sink = MemorySink::with_marker();
        wal.deliver_ready(&mut sink).unwrap();
        let kept = seg_and_free_files(&sim).1;
        assert!(kept > 10, "{ctx}: {kept}");
        drop(wal);
        let o = opts("resize", to, 3, true, 1);
        let wal = open_sim(&sim, o.clone());
        let m = epochs_for(kept as u64 + 5, to, (7, 500));
        want.extend(fill(&wal, n + 1, m, 7, 500, false));
        drop(wal);
        let (wal, report) = WalSink::open_with_storage(Arc::new(sim.clone()), o.clone()).unwrap();
        assert_eq!(report.pending.len() as u64, m, "{ctx}: {report:?}");
        assert!(
            report.torn_tail.is_none() && report.corruption.is_none(),
            "{ctx}: {report:?}"
        );
        wal.checkpoint_complete(n + m).unwrap();
        wal.deliver_ready(&mut sink).unwrap();
        assert_exactly_once(&sink.records(), &expected(&want, 7), &ctx);
        let (_, free) = seg_and_free_files(&sim);
        assert!(free <= 3, "{ctx}: {free}");
        assert_eq!(wal.health().free_segments, free as u64, "{ctx}");
        drop(wal);
        let v = walsink::verify(&sim).unwrap();
        assert!(v.ok, "{ctx}: {:?}", v.problems);
    }
}

/// Appending threads (checkpointed and durable mode) beside a committer thread on a real
/// directory with small segments, for every bound: rolls take free files while the committer
/// frees and trims them. No call fails, `Health` shows no error, the files stay bounded, every
/// acknowledged record arrives exactly once in a directory sink or a marker memory sink, and once idle the free files
/// are at the bound and match `Health`.
#[test]
fn appenders_and_a_committer_race_over_free_files_without_errors() {
    for (mode, max_free) in [
        (walsink::Mode::Checkpointed, 0usize),
        (walsink::Mode::Checkpointed, 1),
        (walsink::Mode::Durable, 0),
        (walsink::Mode::Durable, 2),
    ] {
        let ctx = format!("{mode:?} max_free {max_free}");
        let base = tempfile::tempdir().unwrap();
        let wdir = base.path().join("wal");
        let out = base.path().join("out");
        let o = opts("race", 8192, max_free, true, 1).mode(mode);
        let (wal, _) = WalSink::open(&wdir, o.clone()).unwrap();
        let wal = Arc::new(wal);
        // A fast marker sink every other run, so that the committer keeps up and freeing,
        // trimming and rolls into free files interleave closely.
        let mem = MemorySink::with_marker();
        let c = if max_free == 0 {
            wal.spawn_committer(mem.clone()).unwrap()
        } else {
            wal.spawn_committer(DirSink::new(&out).unwrap()).unwrap()
        };
        let stop = Arc::new(AtomicBool::new(false));
        let watcher = {
            let (wal, stop, wdir) = (wal.clone(), stop.clone(), wdir.clone());
            std::thread::spawn(move || {
                let (mut most, mut errors) = (0, Vec::new());
                while !stop.load(Ordering::SeqCst) {
                    let (s, f) = dir_counts(&wdir);
                    most = most.max(s + f);
                    if let Some(e) = wal.health().last_error {
                        errors.push(e);
                    }
                    std::thread::sleep(Duration::from_millis(1));
                }
                (most, errors)
            })
        };
        let threads = 3u64;
        let per_thread = 400u64;
        let hs: Vec<_> = (0..threads)
            .map(|t| {
                let wal = wal.clone();
                std::thread::spawn(move || {
                    for i in 0..per_thread {
                        // cp field: the thread, i: the record.
                        wal.append(&rec(t, i, 200 + (i as usize * 37) % 900))
                            .unwrap();
                        if i % 8 == 0 {
                            std::thread::sleep(Duration::from_micros(300));
                        }
                    }
                })
            })
            .collect();
        let mut cp = 0;
        if mode == walsink::Mode::Checkpointed {
            // Checkpoints from here while the threads append.
            while hs.iter().any(|h| !h.is_finished()) {
                cp += 1;
                wal.checkpoint(1000 + cp, b"").unwrap();
                wal.checkpoint_complete(1000 + cp).unwrap();
                std::thread::sleep(Duration::from_millis(1));
            }
        }
        for h in hs {
            h.join().unwrap();
        }
        if mode == walsink::Mode::Checkpointed {
            cp += 1;
            wal.checkpoint(1000 + cp, b"").unwrap();
            wal.checkpoint_complete(1000 + cp).unwrap();
        }
        wait_for(
            "everything committed and trimmed",
            Duration::from_secs(20),
            || {
                let h = wal.health();
                h.backlog_epochs == 0 && dir_counts(&wdir).1 <= max_free
            },
        );
        c.shutdown();
        stop.store(true, Ordering::SeqCst);
        let (most, errors) = watcher.join().unwrap();
        assert!(
            errors.is_empty(),
            "{ctx}: {:?}",
            &errors[..errors.len().min(3)]
        );
        let (segs, free) = dir_counts(&wdir);
        let h = wal.health();
        assert_eq!(
            (h.segments, h.free_segments),
            (segs as u64, free as u64),
            "{ctx}"
        );
        assert!(free <= max_free, "{ctx}");
        // Never more files than all the data takes (3 x 400 records of about 670 bytes with
        // their headers, about 100 segments of 8 KiB) and the bound: freeing never adds.
        let bytes: u64 = (0..per_thread)
            .map(|i| 16 + (200 + (i * 37) % 900 + 7).next_multiple_of(8))
            .sum::<u64>()
            * threads;
        let needed = bytes.div_ceil(8192 - 40 - 16 - 64) as usize;
        assert!(
            most <= needed + max_free + 3,
            "{ctx}: {most} files at most, data needs {needed}"
        );
        let got = if max_free == 0 {
            mem.records()
        } else {
            DirSink::read_records(&out).unwrap()
        };
        let mut want = BTreeMap::new();
        for t in 0..threads {
            for i in 0..per_thread {
                want.insert((t, i), 1);
            }
        }
        assert_exactly_once(&got, &want, &ctx);
        eprintln!("{ctx}: at most {most} files");
    }
}

/// Epochs of at least `READ_AHEAD_MIN_BYTES` (300 records of 1000 bytes, about five 64 KiB
/// segments each), so that the drivers run the due marks, which free and trim, beside the sink
/// (`next_step_deferring_mark`, `DueMark::run`), while another thread appends into the free
/// files: by hand, through `deliver_ready` and the committer. Once idle `Health` matches the
/// directory, the free files are at the bound, and every record arrives exactly once.
#[test]
fn deferred_marks_free_and_trim_beside_the_sink_and_appends() {
    for (driver, max_free) in [
        (Some(Driver::NextStep), 0usize),
        (Some(Driver::DeliverReady), 2),
        (Some(Driver::Committer), 0),
        (None, 1),
    ] {
        let ctx = format!("{driver:?} max_free {max_free}");
        let dir = tempfile::tempdir().unwrap();
        let o = opts("deferred", 64 << 10, max_free, true, 1);
        let (wal, _) = WalSink::open(dir.path(), o).unwrap();
        let wal = Arc::new(wal);
        let mut want = fill(&wal, 1, 12, 300, 1000, true);
        let appender = {
            let wal = wal.clone();
            std::thread::spawn(move || {
                let mut ids = Vec::new();
                for cp in 13..25 {
                    ids.extend(fill(&wal, cp, 1, 300, 1000, true));
                    std::thread::sleep(Duration::from_millis(3));
                }
                ids
            })
        };
        let sink = MemorySink::with_marker();
        match driver {
            // by hand: each due mark runs on a thread of its own while the sink takes the
            // next epoch
            None | Some(Driver::NextStep) | Some(Driver::Deferring) => {
                let mut d = wal.deliverer().unwrap();
                let mut s = sink.clone();
                let mut idle_seen = 0;
                while idle_seen < 3 {
                    let (next, due) = d.next_step_deferring_mark().unwrap();
                    match next {
                        Next::Idle => {
                            assert!(due.is_none(), "{ctx}");
                            idle_seen += 1;
                            std::thread::sleep(Duration::from_millis(20));
                        }
                        Next::Committed(_) => {}
                        Next::Deliver(p) => {
                            let mark = due.map(|due| std::thread::spawn(move || due.run()));
                            let e = d.read(&p).unwrap();
                            let outcome = s.deliver(&e);
                            if let Some(m) = mark {
                                d.marked(m.join().unwrap()).unwrap();
                            }
                            d.finish(p, &e, outcome).unwrap();
                        }
                    }
                }
                want.extend(appender.join().unwrap());
                while !step(&mut d, &mut s).unwrap() {}
            }
            Some(Driver::DeliverReady) => {
                let mut s = sink.clone();
                while !appender.is_finished() {
                    wal.deliver_ready(&mut s).unwrap();
                }
                want.extend(appender.join().unwrap());
                wal.deliver_ready(&mut s).unwrap();
            }
            Some(Driver::Committer) => {
                let c = wal.spawn_committer(sink.clone()).unwrap();
                want.extend(appender.join().unwrap());
                assert!(wal.wait_committed(24, Duration::from_secs(20)), "{ctx}");
                wait_for("the idle trim", Duration::from_secs(10), || {
                    dir_counts(dir.path()).1 <= max_free
                });
                c.shutdown();
            }
        }
        let (segs, free) = dir_counts(dir.path());
        let h = wal.health();
        assert_eq!(
            (h.segments, h.free_segments),
            (segs as u64, free as u64),
            "{ctx}"
        );
        assert!(free <= max_free, "{ctx}: {free}");
        assert!(segs <= 2, "{ctx}: {segs}");
        assert_exactly_once(&sink.records(), &expected(&want, 300), &ctx);
    }
}

/// A log holding many free files, opened (the new segment takes a free file), appended to
/// (rolls take free files), delivered with a bound of 1, and opened again, twice in a row, with
/// a kill at every mutating operation of the first open and what follows, then a power loss or
/// process kill; then once more a crash before the second open's work is done. Every
/// checkpoint that returned is delivered exactly once, the log never fails to open, and the
/// free files end at the bound.
#[test]
fn a_kill_at_every_operation_of_opens_over_free_files_loses_nothing() {
    let build = || {
        let sim = SimStorage::new();
        let mut o = opts("openkill", 4096, 1000, true, 1);
        o.salt_seed = Some(11);
        let wal = open_sim(&sim, o.clone());
        fill(&wal, 1, 30, 7, 500, true);
        wal.deliver_ready(&mut MemorySink::new()).unwrap();
        assert!(seg_and_free_files(&sim).1 > 20);
        drop(wal);
        o.max_free_segments = 1;
        (sim, o)
    };
    let work = |sim: &SimStorage,
                o: &Options,
                first: u64,
                sink: &mut MemorySink,
                acked: &mut Vec<u64>|
     -> walsink::Result<()> {
        let (wal, _) = WalSink::open_with_storage(Arc::new(sim.clone()), o.clone())?;
        if let Some(&last) = acked.last() {
            wal.restore(Some(last))?;
        }
        for cp in first..first + 4 {
            for i in 0..7 {
                wal.append(&rec(cp, i, 500))?;
            }
            wal.checkpoint(cp, b"m")?;
            acked.push(cp);
            wal.checkpoint_complete(cp)?;
        }
        wal.deliver_ready(sink)?;
        Ok(())
    };
    let (sim, o) = build();
    sim.reset_stats();
    work(&sim, &o, 31, &mut MemorySink::new(), &mut Vec::new()).unwrap();
    let total = mutating_ops(&sim);
    assert!(total > 20, "{total}");
    let mut runs = 0;
    for k in 0..=total {
        for mode in 0..3u64 {
            runs += 1;
            let ctx = format!("kill at op {k} of {total}, crash mode {mode}");
            let (sim, o) = build();
            let mut sink = MemorySink::with_marker();
            let mut acked = Vec::new();
            sim.kill_after(k);
            let r1 = work(&sim, &o, 31, &mut sink, &mut acked);
            sim.crash(CrashOptions {
                seed: k,
                lose_all_unsynced: mode == 0,
                process_only: mode == 2,
            });
            // A second open and run, killed half-way through as well.
            let r2 = {
                let (probe, report) = WalSink::open_with_storage(Arc::new(sim.clone()), o.clone())
                    .unwrap_or_else(|e| panic!("{ctx}: reopen: {e} ({r1:?})"));
                let first = report.next_checkpoint_id.max(35);
                drop(probe);
                sim.kill_after(k / 2 + 3);
                work(&sim, &o, first, &mut sink, &mut acked)
            };
            sim.crash(CrashOptions {
                seed: k + 1000,
                lose_all_unsynced: mode != 0,
                process_only: false,
            });
            let (wal, report) = WalSink::open_with_storage(Arc::new(sim.clone()), o.clone())
                .unwrap_or_else(|e| panic!("{ctx}: last reopen: {e} ({r1:?}, {r2:?})"));
            assert!(report.corruption.is_none(), "{ctx}: {report:?}");
            let committed = report.committed.unwrap_or(0);
            for id in &acked {
                assert!(
                    *id <= committed || report.pending.contains(id),
                    "{ctx}: {id} lost: {report:?}"
                );
            }
            let h = wal.health();
            let (segs, free) = seg_and_free_files(&sim);
            assert_eq!(
                (h.segments, h.free_segments),
                (segs as u64, free as u64),
                "{ctx}"
            );
            wal.restore(acked.last().copied().or(Some(30))).unwrap();
            wal.deliver_ready(&mut sink)
                .unwrap_or_else(|e| panic!("{ctx}: delivery: {e}"));
            assert_exactly_once(&sink.records(), &expected(&acked, 7), &ctx);
            let (_, free) = seg_and_free_files(&sim);
            assert!(free <= 1, "{ctx}: {free} free files");
        }
    }
    eprintln!("{runs} runs of two kills");
}

/// Idle means nothing deliverable, not an empty log: with sealed epochs still waiting for
/// their completion, every driver trims the free files of the drain before them to the bound,
/// and delivers the rest once completed.
#[test]
fn idle_with_sealed_incomplete_epochs_still_trims() {
    for driver in [
        Driver::DeliverReady,
        Driver::NextStep,
        Driver::Deferring,
        Driver::Committer,
    ] {
        let sim = SimStorage::new();
        let wal = open_sim(&sim, opts("incomplete", 4096, 1, true, 1));
        let done = fill(&wal, 1, 40, 7, 500, true);
        let waiting = fill(&wal, 41, 5, 7, 500, false);
        let sink = MemorySink::with_marker();
        drive_idle(&wal, driver, sink.clone(), || {
            wal.health().committed == Some(40) && seg_and_free_files(&sim).1 <= 1
        });
        assert_eq!(wal.health().committed, Some(40), "{driver:?}");
        assert_eq!(wal.health().backlog_epochs, 5, "{driver:?}");
        let (_, free) = seg_and_free_files(&sim);
        assert_eq!(free, 1, "{driver:?}: trimmed with epochs still waiting");
        assert_eq!(wal.health().free_segments, 1, "{driver:?}");
        wal.checkpoint_complete(45).unwrap();
        let mut s = sink.clone();
        wal.deliver_ready(&mut s).unwrap();
        let mut all = done.clone();
        all.extend(waiting);
        assert_exactly_once(&sink.records(), &expected(&all, 7), &format!("{driver:?}"));
    }
}

/// A sink that fails part-way through a drain: `deliver_ready` stops with the sink's error
/// (not idle, so the freed segments stay as free files, never more files than at the start),
/// nothing is skipped or sent twice, and once the sink is back the drain ends idle at the
/// bound. Also through a committer thread retrying the failing sink.
#[test]
fn a_failing_sink_mid_drain_keeps_free_files_until_idle() {
    for use_committer in [false, true] {
        let sim = SimStorage::new();
        let wal = open_sim(&sim, opts("sinkfail", 4096, 1, true, 1));
        let ids = fill(&wal, 1, 40, 7, 500, true);
        let peak = seg_and_free_files(&sim).0;
        let sink = MemorySink::new();
        // Deliver 25 epochs, then fail.
        {
            let mut d = wal.deliverer().unwrap();
            let mut s = sink.clone();
            for _ in 0..26 {
                assert!(!step(&mut d, &mut s).unwrap());
            }
        }
        sink.set_failing(true);
        let during = if use_committer {
            let c = wal.spawn_committer(sink.clone()).unwrap();
            wait_for("retries", Duration::from_secs(10), || {
                wal.health().retries >= 3
            });
            let (s, f) = seg_and_free_files(&sim);
            assert!(wal.health().last_error.is_some());
            sink.set_failing(false);
            assert!(wal.wait_committed(40, Duration::from_secs(10)));
            wait_for("the idle trim", Duration::from_secs(10), || {
                seg_and_free_files(&sim).1 <= 1
            });
            c.shutdown();
            (s, f)
        } else {
            assert!(wal.deliver_ready(&mut sink.clone()).is_err());
            let during = seg_and_free_files(&sim);
            sink.set_failing(false);
            wal.deliver_ready(&mut sink.clone()).unwrap();
            during
        };
        assert!(during.0 + during.1 <= peak, "{during:?} > {peak}");
        assert!(during.1 > 1, "free files kept while not idle: {during:?}");
        let (segs, free) = seg_and_free_files(&sim);
        assert!(free <= 1 && segs <= 2, "({segs}, {free})");
        assert_eq!(wal.health().free_segments, free as u64);
        let good: Vec<Vec<u8>> = sink.records();
        assert_exactly_once(&good, &expected(&ids, 7), "sink failures");
        eprintln!("committer {use_committer}: while the sink failed {during:?}");
    }
}
