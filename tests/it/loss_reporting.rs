//! Damage to a closed log's files is never a silent loss: after a zeroed, truncated or random
//! first header, a destroyed or bit-flipped segment header, an emptied, deleted or cut newest
//! segment, or a corrupt older one, every checkpoint whose `checkpoint()` returned `Ok` is still
//! pending or committed after the reopen, or the report names its loss (torn tail, corruption
//! or dropped ids); the next checkpoint id is above every id the report names; the log keeps
//! working; and lenient recovery never overwrites a damaged segment nor hands a dropped id out
//! again. Written from the public documentation only; four of these failed when written and led
//! to fixes (a deleted or frame-aligned truncated newest segment, ids dropped by lenient
//! recovery handed out again by a later open).

use crate::support::closed_logs::*;
use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};
use walsink::storage::FsStorage;
use walsink::{ErrorKind, Options, RecoveryMode, RecoveryReport, WalSink};

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

/// A fresh log (no checkpoint) whose only segment header is zeroed, truncated or random:
/// open must not panic, must succeed (nothing was promised) and the log must keep working.
#[test]
fn a_fresh_log_with_a_zeroed_truncated_or_random_first_header_loses_nothing_unreported() {
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
fn a_destroyed_header_of_the_only_segment_reports_the_loss() {
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
fn a_flipped_bit_in_any_header_byte_of_any_segment_loses_nothing_unreported() {
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
fn an_emptied_or_deleted_newest_segment_loses_nothing_unreported() {
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
fn the_newest_segment_cut_at_any_offset_loses_nothing_unreported() {
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
fn repeated_lenient_recovery_never_overwrites_a_damaged_segment_and_ids_only_grow() {
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
fn a_corrupt_older_segment_is_refused_then_lenient_recovery_reports_the_dropped_ids() {
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

/// Focused: ids dropped by a lenient recovery must not be handed out again by a LATER open
/// (design invariant 3: "never reused, even after ... a lenient recovery dropped them").
#[test]
fn ids_dropped_by_lenient_recovery_are_not_reused_by_a_later_open() {
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
fn a_deleted_newest_segment_is_reported() {
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
fn the_newest_segment_cut_at_a_frame_boundary_is_reported() {
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
