//! Outside probes: tests written from the public documentation only (README, docs/design.md,
//! rustdoc) by an acceptance tester who did not read the implementation. Each test states the
//! documented contract it checks: damaged logs (fresh, header bits, lost and truncated newest
//! segments, repeated lenient recovery), delivery bookkeeping, restores with clean-up, commit
//! stores that forget, and the directory sink. Four of them failed when written and led to
//! fixes (a deleted or frame-aligned truncated newest segment, ids dropped by lenient recovery
//! handed out again by a later open).

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use walsink::storage::FsStorage;
use walsink::{
    CommitStore, DirSink, Epoch, EpochKey, ErrorKind, MemoryCommitStore, MemorySink, Options,
    RecoveryMode, RecoveryReport, RetryPolicy, Sink, SinkError, WalSink,
};

// ---------------------------------------------------------------- helpers

fn opts() -> Options {
    Options::new("probe")
        .segment_size(4096)
        .max_record_size(512)
        .max_metadata_size(256)
        .retry(RetryPolicy {
            initial: Duration::from_millis(1),
            max: Duration::from_millis(10),
        })
}

fn segs(dir: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().map(|e| e == "wseg").unwrap_or(false))
        .collect();
    v.sort();
    v
}

fn files_with_suffix(dir: &Path, suffix: &str) -> BTreeMap<String, Vec<u8>> {
    let mut m = BTreeMap::new();
    for e in fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        let name = p.file_name().unwrap().to_string_lossy().to_string();
        if name.ends_with(suffix) {
            m.insert(name, fs::read(&p).unwrap());
        }
    }
    m
}

fn copy_dir(from: &Path, to: &Path) {
    fs::create_dir_all(to).unwrap();
    for e in fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        if e.file_type().unwrap().is_file() {
            fs::copy(e.path(), to.join(e.file_name())).unwrap();
        }
    }
}

fn rec(ck: u64, i: u64) -> Vec<u8> {
    format!("ck{ck:04}-rec{i:04}-{}", "x".repeat(60)).into_bytes()
}

/// Writes checkpoints 1..=n (each with `per` records) and closes the log. Returns the ids
/// whose `checkpoint()` returned Ok.
fn build_log(dir: &Path, o: Options, n: u64, per: u64) -> Vec<u64> {
    let (wal, _) = WalSink::open(dir, o).unwrap();
    let mut ok = vec![];
    for ck in 1..=n {
        for i in 0..per {
            wal.append(&rec(ck, i)).unwrap();
        }
        wal.checkpoint(ck, format!("meta{ck}").as_bytes()).unwrap();
        ok.push(ck);
    }
    drop(wal);
    ok
}

fn verify_ok(dir: &Path) -> bool {
    walsink::verify(&FsStorage::new(dir).unwrap()).unwrap().ok
}

fn loss_reported(r: &RecoveryReport) -> bool {
    r.torn_tail.is_some() || r.corruption.is_some() || !r.checkpoints_dropped.is_empty()
}

/// The brief's invariant: every Ok checkpoint is pending/committed after reopen, or the loss
/// is reported; next id above everything the report names. Returns a description of the
/// violation, if any.
fn check_reopen(
    dir: &Path,
    o: Options,
    ok: &[u64],
    label: &str,
) -> Result<Option<RecoveryReport>, String> {
    let res = std::panic::catch_unwind(|| WalSink::open(dir, o.clone()));
    let res = match res {
        Ok(r) => r,
        Err(_) => return Err(format!("{label}: open PANICKED")),
    };
    match res {
        Err(e) => match e.kind() {
            ErrorKind::Corruption(_) | ErrorKind::UnsupportedVersion { .. } => Ok(None),
            other => Err(format!(
                "{label}: open failed with non-corruption error {other:?}"
            )),
        },
        Ok((wal, r)) => {
            let committed = r.committed.unwrap_or(0);
            let pending: BTreeSet<u64> = r.pending.iter().copied().collect();
            let missing: Vec<u64> = ok
                .iter()
                .copied()
                .filter(|id| !(pending.contains(id) || (*id <= committed && r.committed.is_some())))
                .collect();
            if !missing.is_empty() && !loss_reported(&r) {
                return Err(format!(
                    "{label}: checkpoints {missing:?} silently lost (report {r:?})"
                ));
            }
            let mut named: Vec<u64> = r.pending.clone();
            named.extend(r.checkpoints_dropped.iter().copied());
            if let Some(c) = r.committed {
                named.push(c);
            }
            if let Some(c) = r.last_checkpoint {
                named.push(c);
            }
            if let Some(m) = named.iter().max() {
                if r.next_checkpoint_id <= *m {
                    return Err(format!(
                        "{label}: next_checkpoint_id {} not above id {m} named in the report",
                        r.next_checkpoint_id
                    ));
                }
            }
            // The log must keep working.
            let next = r.next_checkpoint_id;
            wal.append(b"after-recovery")
                .map_err(|e| format!("{label}: append after recovery: {e:?}"))?;
            wal.checkpoint(next, b"after")
                .map_err(|e| format!("{label}: checkpoint({next}) after recovery: {e:?}"))?;
            drop(wal);
            // And reopen cleanly with that checkpoint pending.
            let (_w2, r2) = WalSink::open(dir, o.clone())
                .map_err(|e| format!("{label}: second reopen failed: {e:?}"))?;
            if !r2.pending.contains(&next) {
                return Err(format!(
                    "{label}: checkpoint {next} written after recovery lost on reopen: {r2:?}"
                ));
            }
            if loss_reported(&r2) {
                return Err(format!(
                    "{label}: second reopen after a repaired log reports damage again: {r2:?}"
                ));
            }
            Ok(Some(r))
        }
    }
}

// ---------------------------------------------------------------- 1. recovery & damage

/// A fresh log (no checkpoint) whose only segment header is zeroed, truncated or random:
/// open must not panic, must succeed (nothing was promised) and the log must keep working.
#[test]
fn probe_fresh_log_first_header_zeroed_truncated_random() {
    type Damage = Box<dyn Fn(&Path)>;
    let variants: Vec<(&str, Damage)> = vec![
        (
            "zeroed",
            Box::new(|p: &Path| {
                let mut b = fs::read(p).unwrap();
                for x in b.iter_mut().take(40) {
                    *x = 0;
                }
                fs::write(p, b).unwrap();
            }),
        ),
        ("empty", Box::new(|p: &Path| fs::write(p, b"").unwrap())),
        (
            "truncated17",
            Box::new(|p: &Path| {
                let b = fs::read(p).unwrap();
                fs::write(p, &b[..17]).unwrap();
            }),
        ),
        (
            "truncated39",
            Box::new(|p: &Path| {
                let b = fs::read(p).unwrap();
                fs::write(p, &b[..39]).unwrap();
            }),
        ),
        (
            "random",
            Box::new(|p: &Path| {
                let mut b = fs::read(p).unwrap();
                let mut r = fastrand::Rng::with_seed(7);
                for x in b.iter_mut().take(40) {
                    *x = r.u8(..);
                }
                fs::write(p, b).unwrap();
            }),
        ),
        (
            "random_whole_file",
            Box::new(|p: &Path| {
                let mut r = fastrand::Rng::with_seed(9);
                let b: Vec<u8> = (0..4096).map(|_| r.u8(..)).collect();
                fs::write(p, b).unwrap();
            }),
        ),
    ];
    let mut failures = vec![];
    for (name, damage) in variants {
        let t = tempfile::tempdir().unwrap();
        let dir = t.path().join("wal");
        {
            let (_w, _r) = WalSink::open(&dir, opts()).unwrap();
        }
        let s = segs(&dir);
        assert!(!s.is_empty(), "a fresh log has a segment");
        damage(s.last().unwrap());
        if let Err(e) = check_reopen(&dir, opts(), &[], name) {
            failures.push(e);
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
}

/// A log with checkpoints whose only segment header is zeroed/truncated/random: the
/// checkpoints are gone, so the loss must be reported (or open must fail with Corruption).
#[test]
fn probe_single_segment_with_checkpoints_header_destroyed_loss_reported() {
    let mut failures = vec![];
    for variant in ["zeroed", "truncated20", "random", "emptied"] {
        let t = tempfile::tempdir().unwrap();
        let dir = t.path().join("wal");
        let o = Options::new("probe"); // default 64 MiB segments: one segment
        let ok = build_log(&dir, o.clone(), 3, 5);
        let s = segs(&dir);
        // After close+reopen recovery may have started a second segment; damage the one
        // that holds the checkpoints (the oldest) only when it is the only one, and the
        // newest otherwise is fresh.
        let target = s[0].clone();
        let mut b = fs::read(&target).unwrap();
        match variant {
            "zeroed" => b[..40].iter_mut().for_each(|x| *x = 0),
            "truncated20" => b.truncate(20),
            "random" => {
                let mut r = fastrand::Rng::with_seed(3);
                b[..40].iter_mut().for_each(|x| *x = r.u8(..))
            }
            _ => b.clear(),
        }
        fs::write(&target, b).unwrap();
        let verify_clean = verify_ok(&dir);
        if verify_clean {
            failures.push(format!(
                "{variant}: verify() calls a log whose segment header was destroyed clean"
            ));
        }
        match check_reopen(&dir, o.clone(), &ok, variant) {
            Err(e) => failures.push(e),
            Ok(Some(r)) => {
                if !r.pending.contains(&3) && !loss_reported(&r) {
                    failures.push(format!("{variant}: silent loss {r:?}"));
                }
            }
            Ok(None) => {}
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
}

/// Flip each bit pattern in every header byte 0..40 of the newest data segment, an older one
/// and the oldest: the invariant must hold, verify must not call it clean when anything was
/// lost or reported, nothing panics.
#[test]
fn probe_header_bitflips_every_byte_of_newest_and_older_segments() {
    let t = tempfile::tempdir().unwrap();
    let base = t.path().join("base");
    let ok = build_log(&base, opts(), 40, 6);
    let s = segs(&base);
    assert!(s.len() >= 5, "need several segments, got {}", s.len());
    // The newest file may be the fresh segment started at the last open (nothing in it).
    let picks: Vec<usize> = vec![0, s.len() / 2, s.len() - 2, s.len() - 1];
    let mut failures = vec![];
    let mut n = 0;
    for &si in &picks {
        for byte in 0..40usize {
            for mask in [0x01u8, 0x80] {
                n += 1;
                let case = t.path().join(format!("c{n}"));
                copy_dir(&base, &case);
                let p = case.join(s[si].file_name().unwrap());
                let mut b = fs::read(&p).unwrap();
                b[byte] ^= mask;
                fs::write(&p, &b).unwrap();
                let label = format!("seg#{si}/{} byte {byte} mask {mask:#x}", s.len());
                let v = walsink::verify(&FsStorage::new(&case).unwrap()).unwrap();
                match check_reopen(&case, opts(), &ok, &label) {
                    Err(e) => failures.push(e),
                    Ok(None) => {
                        if v.ok {
                            failures.push(format!(
                                "{label}: open says Corruption but verify() says clean"
                            ));
                        }
                    }
                    Ok(Some(r)) => {
                        if loss_reported(&r) && v.ok {
                            failures.push(format!("{label}: recovery reported damage {:?}/{:?} but verify() called the log clean", r.torn_tail, r.corruption));
                        }
                    }
                }
                let _ = fs::remove_dir_all(&case);
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {n} cases failed:\n{:#?}",
        failures.len(),
        &failures[..failures.len().min(25)]
    );
}

/// The newest segment holding checkpoints is emptied or deleted: the loss must be reported.
#[test]
fn probe_lost_newest_data_segment_emptied_or_deleted() {
    let mut failures = vec![];
    for how in ["emptied", "deleted", "zero_filled"] {
        let t = tempfile::tempdir().unwrap();
        let dir = t.path().join("wal");
        let (wal, _) = WalSink::open(&dir, opts()).unwrap();
        let mut ok = vec![];
        for ck in 1..=20u64 {
            for i in 0..6 {
                wal.append(&rec(ck, i)).unwrap();
            }
            wal.checkpoint(ck, b"m").unwrap();
            ok.push(ck);
        }
        // Simulated crash: leak the handle so no clean-close path runs, but release the lock by
        // dropping normally is the only public way; drop it.
        drop(wal);
        let s = segs(&dir);
        // newest segment that holds data: with a clean close the newest one may be fresh.
        let newest = s.last().unwrap().clone();
        match how {
            "emptied" => fs::write(&newest, b"").unwrap(),
            "deleted" => fs::remove_file(&newest).unwrap(),
            _ => {
                let len = fs::metadata(&newest).unwrap().len();
                fs::write(&newest, vec![0u8; len as usize]).unwrap();
            }
        }
        if verify_ok(&dir) && how != "deleted" {
            failures.push(format!(
                "{how}: verify() calls a log with a lost newest segment clean"
            ));
        }
        match check_reopen(&dir, opts(), &ok, how) {
            Err(e) => failures.push(e),
            Ok(Some(r)) => {
                if r.next_checkpoint_id <= 20 && !r.pending.contains(&20) {
                    // Known limit per design (barriers of a lost segment cannot be found), but
                    // record it: the next id may reuse an id a marker target holds.
                    eprintln!("{how}: next_checkpoint_id {} <= 20 after losing the newest segment (report {r:?})", r.next_checkpoint_id);
                }
            }
            Ok(None) => {}
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
}

/// Truncate the newest data-holding segment at every offset: invariant holds, no panic.
#[test]
fn probe_truncate_newest_segment_at_every_offset() {
    let t = tempfile::tempdir().unwrap();
    let base = t.path().join("base");
    // Keep the log open-less: write, drop. After drop the newest segment holds the last
    // checkpoints (no reopen has started a fresh one).
    let ok = build_log(&base, opts(), 12, 6);
    let s = segs(&base);
    let newest = s.last().unwrap().clone();
    let full = fs::read(&newest).unwrap();
    // find the data end: last non-zero byte
    let end = full
        .iter()
        .rposition(|&x| x != 0)
        .map(|p| p + 1)
        .unwrap_or(0);
    let mut failures = vec![];
    let case = t.path().join("case");
    for cut in 0..=(end + 16).min(full.len()) {
        let _ = fs::remove_dir_all(&case);
        copy_dir(&base, &case);
        let p = case.join(newest.file_name().unwrap());
        fs::write(&p, &full[..cut]).unwrap();
        let v_ok = verify_ok(&case);
        match check_reopen(&case, opts(), &ok, &format!("cut at {cut} of {end}")) {
            Err(e) => failures.push(e),
            Ok(Some(r)) => {
                let lost = ok.iter().any(|id| !r.pending.contains(id));
                if lost && v_ok {
                    failures.push(format!(
                        "cut at {cut}: checkpoints lost but verify() said clean"
                    ));
                }
            }
            Ok(None) => {}
        }
    }
    assert!(
        failures.is_empty(),
        "{} failures, first: {:#?}",
        failures.len(),
        &failures[..failures.len().min(15)]
    );
}

/// Lenient recovery run repeatedly, each time after new damage, then continuing: *.damaged
/// files are never overwritten, dropped ids are never reused, the log keeps working.
#[test]
fn probe_lenient_recovery_repeated_never_overwrites_damaged_and_ids_monotonic() {
    let t = tempfile::tempdir().unwrap();
    let dir = t.path().join("wal");
    let lenient = opts().recovery_mode(RecoveryMode::TruncateAtCorruption);
    let mut next = 1u64;
    let mut ever_seen: Option<u64> = None;
    let mut damaged_before: BTreeMap<String, Vec<u8>> = BTreeMap::new();
    let mut failures = vec![];
    for round in 0..5 {
        {
            let (wal, r) = WalSink::open(&dir, lenient.clone()).unwrap();
            if let Some(seen) = ever_seen {
                if r.next_checkpoint_id <= seen {
                    failures.push(format!("round {round}: plain reopen after an earlier lenient repair: next id {} <= id {seen} checkpointed (and reported dropped) before", r.next_checkpoint_id));
                }
            }
            next = next.max(r.next_checkpoint_id);
            for _ in 0..15 {
                for i in 0..6 {
                    wal.append(&rec(next, i)).unwrap();
                }
                wal.checkpoint(next, b"m").unwrap();
                ever_seen = Some(next);
                next += 1;
            }
        }
        // damage: flip a byte in the first frame of the 2nd segment (older, synced data)
        let s = segs(&dir);
        assert!(s.len() >= 3, "round {round}: segments {}", s.len());
        let p = &s[1];
        let mut b = fs::read(p).unwrap();
        b[40 + 20] ^= 0xff;
        fs::write(p, b).unwrap();
        let (_wal, r) = match WalSink::open(&dir, lenient.clone()) {
            Ok(x) => x,
            Err(e) => {
                failures.push(format!("round {round}: lenient open failed: {e:?}"));
                break;
            }
        };
        if r.corruption.is_none() {
            failures.push(format!("round {round}: corruption not reported: {r:?}"));
        }
        if r.moved_aside.is_empty() {
            failures.push(format!("round {round}: nothing moved aside: {r:?}"));
        }
        if r.next_checkpoint_id <= ever_seen.unwrap() {
            failures.push(format!(
                "round {round}: after lenient recovery next id {} <= id {:?} that had been checkpointed (dropped {:?})",
                r.next_checkpoint_id, ever_seen, r.checkpoints_dropped
            ));
        }
        let now = files_with_suffix(&dir, ".damaged");
        for (name, content) in &damaged_before {
            match now.get(name) {
                None => failures.push(format!("round {round}: {name} disappeared")),
                Some(c) if c != content => {
                    failures.push(format!("round {round}: {name} was overwritten"))
                }
                _ => {}
            }
        }
        damaged_before = now;
        drop(_wal);
        // A second lenient open with no new damage reports nothing.
        let (_w, r2) = WalSink::open(&dir, lenient.clone()).unwrap();
        if r2.next_checkpoint_id <= ever_seen.unwrap() {
            failures.push(format!(
                "round {round}: second open right after the lenient repair: next id {} <= {:?}",
                r2.next_checkpoint_id, ever_seen
            ));
        }
        if loss_reported(&r2) || !r2.moved_aside.is_empty() {
            failures.push(format!(
                "round {round}: a repaired log reports damage again: {r2:?}"
            ));
        }
        drop(_w);
        if !verify_ok(&dir) {
            let v = walsink::verify(&FsStorage::new(&dir).unwrap()).unwrap();
            let real: Vec<_> = v
                .problems
                .iter()
                .filter(|p| p.kind != "unexpected_file")
                .collect();
            if !real.is_empty() {
                failures.push(format!(
                    "round {round}: verify after lenient repair: {real:?}"
                ));
            }
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
}

/// Default-mode open of a log with corruption in an older segment fails with Corruption and
/// changes nothing; lenient then repairs and reports every dropped checkpoint.
#[test]
fn probe_older_segment_corruption_default_then_lenient_reports_dropped() {
    let t = tempfile::tempdir().unwrap();
    let dir = t.path().join("wal");
    let ok = build_log(&dir, opts(), 30, 6);
    let s = segs(&dir);
    let p = &s[2];
    let mut b = fs::read(p).unwrap();
    b[40 + 20] ^= 0x55;
    fs::write(p, b).unwrap();
    assert!(!verify_ok(&dir), "verify calls corrupted log clean");
    let before: BTreeMap<String, Vec<u8>> = files_with_suffix(&dir, "");
    match WalSink::open(&dir, opts()) {
        Err(e) => assert!(matches!(e.kind(), ErrorKind::Corruption(_)), "{e:?}"),
        Ok((_, r)) => panic!("default mode accepted corruption: {r:?}"),
    }
    let after: BTreeMap<String, Vec<u8>> = files_with_suffix(&dir, "");
    let seg_before: Vec<_> = before
        .iter()
        .filter(|(k, _)| k.ends_with(".wseg"))
        .collect();
    let seg_after: Vec<_> = after.iter().filter(|(k, _)| k.ends_with(".wseg")).collect();
    assert_eq!(
        seg_before, seg_after,
        "a failed default-mode open changed segments"
    );
    let (_w, r) = WalSink::open(
        &dir,
        opts().recovery_mode(RecoveryMode::TruncateAtCorruption),
    )
    .unwrap();
    let kept: BTreeSet<u64> = r.pending.iter().copied().collect();
    let dropped: BTreeSet<u64> = r.checkpoints_dropped.iter().copied().collect();
    let unaccounted: Vec<u64> = ok
        .iter()
        .copied()
        .filter(|i| !kept.contains(i) && !dropped.contains(i))
        .collect();
    // The checkpoint whose epoch holds the damaged frame cannot list itself only if its barrier
    // is damaged; here only a data frame was flipped, so every id must be accounted for.
    assert!(
        unaccounted.is_empty(),
        "ids neither kept nor reported dropped: {unaccounted:?}; report {r:?}"
    );
    assert!(
        r.next_checkpoint_id > 30,
        "next id {} must be above dropped ids",
        r.next_checkpoint_id
    );
}

// ---------------------------------------------------------------- 2. delivery bookkeeping

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
fn probe_deliver_ready_after_error_does_not_resend() {
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
fn probe_committer_shutdown_marks_what_it_delivered() {
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
fn probe_health_errors_cleared_after_success_with_committer() {
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
fn probe_wait_committed_huge_timeouts() {
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
fn probe_checkpoint_u64_max_twice_and_after_reopen() {
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
fn probe_restore_with_small_segments_and_cleanup() {
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
fn probe_restore_then_reopen_voided_stay_voided() {
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
fn probe_memory_commit_store_with_marker_sink_across_restarts() {
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
fn probe_dirsink_exactly_once_across_reopen() {
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
fn probe_memory_commit_store_plain_sink_reopen_after_cleanup() {
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

/// Focused: ids dropped by a lenient recovery must not be handed out again by a LATER open
/// (design invariant 3: "never reused, even after ... a lenient recovery dropped them").
#[test]
fn probe_lenient_dropped_ids_not_reused_by_later_open() {
    let t = tempfile::tempdir().unwrap();
    let dir = t.path().join("wal");
    build_log(&dir, opts(), 20, 6);
    let s = segs(&dir);
    let mut b = fs::read(&s[1]).unwrap();
    b[40 + 20] ^= 0xff;
    fs::write(&s[1], b).unwrap();
    let lenient = opts().recovery_mode(RecoveryMode::TruncateAtCorruption);
    let (w, r1) = WalSink::open(&dir, lenient.clone()).unwrap();
    assert!(r1.corruption.is_some());
    let max_dropped = *r1.checkpoints_dropped.iter().max().expect("some dropped");
    assert!(r1.next_checkpoint_id > max_dropped, "{r1:?}");
    drop(w);
    // plain reopen, default mode, nothing new written
    let (w, r2) = WalSink::open(&dir, opts()).unwrap();
    assert!(
        r2.next_checkpoint_id > max_dropped,
        "after lenient recovery dropped {:?} (next id then {}), a plain reopen allows next id {}: dropped ids can be reused",
        r1.checkpoints_dropped, r1.next_checkpoint_id, r2.next_checkpoint_id
    );
    // and the log refuses a reused id
    let e = w.checkpoint(max_dropped, b"x");
    assert!(
        e.is_err(),
        "checkpoint({max_dropped}) accepted after it was dropped by lenient recovery"
    );
}

/// Focused: deleting the newest segment (a name lost after a segment end) is a torn tail per
/// the crash table; checkpoints in it are lost and this must be reported; verify must not say
/// clean.
#[test]
fn probe_deleted_newest_segment_is_reported() {
    let t = tempfile::tempdir().unwrap();
    let dir = t.path().join("wal");
    let ok = build_log(&dir, opts(), 20, 6);
    let s = segs(&dir);
    fs::remove_file(s.last().unwrap()).unwrap();
    let v = walsink::verify(&FsStorage::new(&dir).unwrap()).unwrap();
    let (_w, r) = WalSink::open(&dir, opts()).unwrap();
    let lost: Vec<u64> = ok
        .iter()
        .copied()
        .filter(|i| !r.pending.contains(i))
        .collect();
    assert!(
        !lost.is_empty(),
        "test setup: expected the deleted segment to hold checkpoints"
    );
    assert!(
        loss_reported(&r) && !v.ok,
        "checkpoints {lost:?} lost with the deleted newest segment; report torn_tail={:?} corruption={:?} dropped={:?}; verify ok={} problems={:?}",
        r.torn_tail, r.corruption, r.checkpoints_dropped, v.ok, v.problems
    );
}

/// Focused: the newest segment truncated exactly at a frame boundary (below its preallocated
/// size) loses synced checkpoints; design: "It is reported (torn_tail, checkpoints_dropped)".
#[test]
fn probe_truncate_newest_at_frame_boundary_is_reported() {
    let t = tempfile::tempdir().unwrap();
    let dir = t.path().join("wal");
    let ok = build_log(&dir, opts(), 12, 6);
    let s = segs(&dir);
    let newest = s.last().unwrap();
    let b = fs::read(newest).unwrap();
    // 40 = end of the segment header: the first frame boundary.
    fs::write(newest, &b[..40]).unwrap();
    let v = walsink::verify(&FsStorage::new(&dir).unwrap()).unwrap();
    let (_w, r) = WalSink::open(&dir, opts()).unwrap();
    let lost: Vec<u64> = ok
        .iter()
        .copied()
        .filter(|i| !r.pending.contains(i))
        .collect();
    assert!(!lost.is_empty());
    assert!(
        loss_reported(&r) && !v.ok,
        "newest segment {} cut from {} to 40 bytes: checkpoints {lost:?} lost; report torn_tail={:?} corruption={:?} dropped={:?}; verify ok={} problems={:?}",
        newest.file_name().unwrap().to_string_lossy(), b.len(), r.torn_tail, r.corruption, r.checkpoints_dropped, v.ok, v.problems
    );
}

/// deliver_ready with mark_every(1): after it returns a sink error, health().last_error shows
/// it (README: health shows "the last error").
#[test]
fn probe_deliver_ready_error_visible_in_health() {
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
fn probe_backlog_block_without_sealed_epoch_fails_fast() {
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
fn probe_durable_mode_refuses_checkpoint_calls() {
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
fn probe_wait_committed_times_out_while_sink_fails() {
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

#[allow(dead_code)]
fn _uses(_: &dyn CommitStore, _: EpochKey) {}
