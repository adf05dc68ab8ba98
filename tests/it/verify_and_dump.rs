//! `walsink::dump` and `walsink::verify` on large and damaged logs: dump walks large epochs,
//! neither panics on damage, verify reports the documented problem kinds by their documented
//! names, and dump returns an error for damage inside what the log vouches for. Three of these
//! failed when written and led to fixes (dump returned Ok on a corrupted log).

// These bodies are kept as they were written; the lints are about style, not about what
// is checked.
#![allow(
    clippy::useless_vec,
    clippy::type_complexity,
    clippy::manual_is_multiple_of
)]

use crate::support::frames::*;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::io;
use std::sync::Arc;
use walsink::storage::{FsStorage, SimStorage, Storage};
use walsink::{CorruptionReason, DumpState, MemorySink, Options, ProblemKind, WalSink};

struct BuiltLog {
    snap: BTreeMap<String, Vec<u8>>,
    expected: HashMap<u64, Vec<Vec<u8>>>,
    /// (segment, frame) of every frame, with the epoch id it belongs to (barrier id that
    /// seals it) when known.
    frames: Vec<(String, FrameAt, Option<u64>)>,
    last_ck: u64,
}

/// A log on a simulated disk: 8 epochs over 8 KiB segments, nothing committed, no unsealed tail.
fn build_sim_log(seed: u64) -> BuiltLog {
    let sim = SimStorage::new();
    let o = small_opts("pdump", 8192, 2048, 3000).salt_seed(seed);
    let (wal, _) = WalSink::open_with_storage(Arc::new(sim.clone()), o).unwrap();
    let mut rng = fastrand::Rng::with_seed(seed);
    let mut expected = HashMap::new();
    for ck in 1..=8u64 {
        let sizes: Vec<usize> = (0..rng.usize(1..25)).map(|_| rng.usize(0..2500)).collect();
        expected.insert(ck, fill(&wal, ck, &sizes));
    }
    drop(wal);
    let snap = sim.snapshot();
    let mut frames = vec![];
    let mut pending_frames = vec![];
    for (name, img) in snap.iter().filter(|(n, _)| n.ends_with(".wseg")) {
        for f in parse_frames(img) {
            if f.kind == 2 {
                let id = barrier_id(img, &f);
                for (n, fr) in pending_frames.drain(..) {
                    frames.push((n, fr, Some(id)));
                }
                frames.push((name.clone(), f, Some(id)));
            } else {
                pending_frames.push((name.clone(), f));
            }
        }
    }
    for (n, fr) in pending_frames {
        frames.push((n, fr, None));
    }
    BuiltLog {
        snap,
        expected,
        frames,
        last_ck: 8,
    }
}

fn sim_from(snap: &BTreeMap<String, Vec<u8>>) -> SimStorage {
    let s = SimStorage::new();
    for (n, d) in snap {
        s.put_file(n, d);
    }
    s
}

/// dump on a log with epochs larger than the default 8 MiB chunk: every pending epoch is
/// handed to f with the right state and exactly its records (read in chunks); a committed one
/// is either skipped (segments freed) or exact; dump returns Ok.
#[test]
fn dump_walks_large_epochs() {
    let root = tempfile::tempdir().unwrap();
    let wdir = root.path().join("wal");
    let o = Options::new("p30")
        .segment_size(1 << 20)
        .max_record_size(100_000)
        .retry(fast_retry());
    let (wal, _) = WalSink::open(&wdir, o).unwrap();
    let mut expected = HashMap::new();
    expected.insert(1u64, fill(&wal, 1, &vec![65_000; 140])); // ~9.1 MB
    wal.checkpoint_complete(1).unwrap();
    wal.deliver_ready(&mut MemorySink::new()).unwrap();
    expected.insert(2, fill(&wal, 2, &vec![3; 10]));
    let sizes: Vec<usize> = (0..200).map(|i| [50_000, 1, 99_000][i % 3]).collect();
    expected.insert(3, fill(&wal, 3, &sizes)); // ~10 MB
    drop(wal);
    let mut seen = BTreeMap::new();
    let mut problems = vec![];
    let r = walsink::dump(
        Arc::new(FsStorage::new(&wdir).unwrap()),
        |id, state, epoch| {
            let Some(id) = id else { return Ok(()) };
            let mut n = 0usize;
            let mut nchunks = 0;
            for c in epoch.chunks() {
                let c = c.map_err(io::Error::other)?;
                nchunks += 1;
                for r in c.records() {
                    if r.position.checkpoint != id || r.position.index != n as u64 {
                        problems.push(format!("epoch {id}: position {:?} at {n}", r.position));
                    }
                    if expected[&id].get(n).map(|e| &e[..]) != Some(&r.data[..]) {
                        problems.push(format!("epoch {id}: record {n} differs"));
                    }
                    n += 1;
                }
            }
            seen.insert(id, (state, n, nchunks));
            Ok(())
        },
    );
    assert!(r.is_ok(), "dump failed: {:?}", r.err());
    assert!(problems.is_empty(), "{problems:?}");
    assert_eq!(
        seen.get(&2).map(|s| (s.0, s.1)),
        Some((DumpState::Pending, 10)),
        "{seen:?}"
    );
    assert_eq!(
        seen.get(&3).map(|s| (s.0, s.1)),
        Some((DumpState::Pending, 200)),
        "{seen:?}"
    );
    if let Some(s) = seen.get(&1) {
        assert_eq!((s.0, s.1), (DumpState::Committed, 140), "{seen:?}");
    }
}

/// Damage (a flipped byte in a frame header or payload, a segment header byte, a removed
/// middle segment, a truncated segment) in logs of many seeds: dump never panics, never hands
/// f a record that differs from what was appended (with f returning the iterator's Err or
/// ignoring it); verify never fails, never calls the log clean, and reports Corruption for
/// damage that a later barrier vouches for.
#[test]
fn dump_and_verify_report_damaged_logs_without_panicking() {
    let mut failures = vec![];
    let mut dump_ok_on_covered = BTreeSet::new();
    let mut cases = 0;
    for seed in 0..12u64 {
        let log = build_sim_log(seed);
        let mut rng = fastrand::Rng::with_seed(seed + 1000);
        let segs: Vec<String> = log
            .snap
            .keys()
            .filter(|n| n.ends_with(".wseg"))
            .cloned()
            .collect();
        let mut damages: Vec<(String, Box<dyn Fn(&mut BTreeMap<String, Vec<u8>>)>, bool)> = vec![];
        for _ in 0..14 {
            let (seg, f, ck) = log.frames[rng.usize(0..log.frames.len())].clone();
            if f.kind == 4 {
                continue; // the segment end frame of a closed segment
            }
            let covered = matches!(ck, Some(c) if c < log.last_ck);
            let in_header = rng.bool() || f.len == 0;
            let off = if in_header {
                f.offset + [0, 4, 8, 9, 12][rng.usize(0..5)] + rng.usize(0..4).min(3)
            } else {
                f.offset + 16 + rng.usize(0..f.len)
            };
            let off = if in_header {
                off.min(f.offset + 15)
            } else {
                off
            };
            let s2 = seg.clone();
            damages.push((
                format!(
                    "flip {seg}@{off} (frame kind {} at {}, epoch {ck:?})",
                    f.kind, f.offset
                ),
                Box::new(move |m: &mut BTreeMap<String, Vec<u8>>| {
                    m.get_mut(&s2).unwrap()[off] ^= 0x21
                }),
                covered,
            ));
        }
        if segs.len() >= 3 {
            let mid = segs[segs.len() / 2].clone();
            let m2 = mid.clone();
            damages.push((
                format!("remove {mid}"),
                Box::new(move |m| {
                    m.remove(&m2);
                }),
                true,
            ));
            let m3 = mid.clone();
            let hoff = rng.usize(0..32);
            damages.push((
                format!("segment header flip {mid}@{hoff}"),
                Box::new(move |m| m.get_mut(&m3).unwrap()[hoff] ^= 0x01),
                true,
            ));
            let m4 = mid.clone();
            damages.push((
                format!("truncate {mid} to 1000"),
                Box::new(move |m| m.get_mut(&m4).unwrap().truncate(1000)),
                true,
            ));
        }
        for (what, damage, covered) in damages {
            cases += 1;
            let mut snap = log.snap.clone();
            damage(&mut snap);
            let ctx = format!("seed {seed}: {what}");
            for ignore_errors in [false, true] {
                let sim: Arc<dyn Storage> = Arc::new(sim_from(&snap));
                let expected = log.expected.clone();
                let res = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    let mut bad = vec![];
                    let mut last_sealed = 0u64;
                    let r = walsink::dump(sim.clone(), |id, _state, epoch| {
                        // the unsealed tail of a damaged log is the start of the epoch after
                        // the last sealed one
                        let eid = id.unwrap_or(last_sealed + 1);
                        if let Some(id) = id {
                            last_sealed = id;
                        }
                        for r in epoch.records() {
                            match r {
                                Ok(r) => {
                                    let e = expected
                                        .get(&eid)
                                        .and_then(|v| v.get(r.position.index as usize));
                                    if e.map(|e| &e[..]) != Some(&r.data[..]) {
                                        bad.push(format!(
                                            "dump handed out a wrong record at {:?} (id {id:?})",
                                            r.position
                                        ));
                                    }
                                }
                                Err(e) if !ignore_errors => return Err(io::Error::other(e)),
                                Err(_) => {}
                            }
                        }
                        Ok(())
                    });
                    (r.map_err(|e| format!("{:?}", e.kind())), bad)
                }));
                match res {
                    Err(_) => failures.push(format!(
                        "{ctx}: dump panicked (ignore_errors={ignore_errors})"
                    )),
                    Ok((r, bad)) => {
                        failures.extend(bad.into_iter().map(|b| format!("{ctx}: {b}")));
                        if covered && r.is_ok() {
                            dump_ok_on_covered.insert(ctx.clone());
                        }
                    }
                }
            }
            let sim = sim_from(&snap);
            match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| walsink::verify(&sim))) {
                Err(_) => failures.push(format!("{ctx}: verify panicked")),
                Ok(Err(e)) => failures.push(format!("{ctx}: verify failed: {e}")),
                Ok(Ok(rep)) => {
                    if rep.ok || rep.problems.is_empty() {
                        failures.push(format!("{ctx}: verify called the damaged log clean"));
                    }
                    if covered
                        && !rep
                            .problems
                            .iter()
                            .any(|p| matches!(p.kind, ProblemKind::Corruption(_)))
                    {
                        failures.push(format!(
                            "{ctx}: verify found no Corruption, only {:?}",
                            rep.problems
                                .iter()
                                .map(|p| p.kind.name())
                                .collect::<Vec<_>>()
                        ));
                    }
                }
            }
        }
    }
    eprintln!("p31: {cases} damage cases; dump returned Ok on {} cases of damage a later barrier vouches for (checked by p34):", dump_ok_on_covered.len());
    for c in dump_ok_on_covered.iter().take(10) {
        eprintln!("  {c}");
    }
    assert!(
        failures.is_empty(),
        "{} failures:\n{}",
        failures.len(),
        failures[..failures.len().min(20)].join("\n")
    );
}

/// ProblemKind::name and CorruptionReason::name give exactly the documented strings.
#[test]
fn problem_kind_names_match_the_docs() {
    let reasons = [
        (
            CorruptionReason::Checksum {
                expected: 1,
                got: 2,
            },
            "checksum",
        ),
        (CorruptionReason::BadHeader, "bad_header"),
        (CorruptionReason::BadLength { len: 5 }, "bad_length"),
        (CorruptionReason::UnknownKind(9), "unknown_kind"),
        (CorruptionReason::TornFrame, "torn_frame"),
        (CorruptionReason::Unwritten, "unwritten"),
        (CorruptionReason::BadPayload, "bad_payload"),
        (
            CorruptionReason::MissingSegment { seq: 3 },
            "missing_segment",
        ),
        (
            CorruptionReason::IncompleteEpoch {
                checkpoint: 1,
                expected: 2,
                found: 1,
            },
            "incomplete_epoch",
        ),
    ];
    let mut bad = vec![];
    for (r, n) in &reasons {
        if r.name() != *n {
            bad.push(format!("{r:?}.name() = {} expected {n}", r.name()));
        }
        let k = ProblemKind::Corruption(r.clone());
        if k.name() != *n {
            bad.push(format!(
                "ProblemKind::Corruption({r:?}).name() = {} expected {n}",
                k.name()
            ));
        }
        let t = ProblemKind::TornTail(r.clone());
        if t.name() != "torn_tail" {
            bad.push(format!(
                "ProblemKind::TornTail({r:?}).name() = {}",
                t.name()
            ));
        }
    }
    for (k, n) in [
        (ProblemKind::UnknownVersion, "unknown_version"),
        (ProblemKind::UnexpectedFile, "unexpected_file"),
        (ProblemKind::BadIdentity, "bad_identity"),
        (ProblemKind::BadCommitStore, "bad_commit_store"),
    ] {
        if k.name() != n {
            bad.push(format!("{k:?}.name() = {} expected {n}", k.name()));
        }
    }
    assert!(bad.is_empty(), "{bad:#?}");
}

/// verify on real damage reports the documented kinds: a foreign file, a damaged WALSINK and
/// COMMITTED, a flipped payload byte in an early epoch, a removed middle segment, an unknown
/// version (valid header CRC, version 2), a cut newest segment.
#[test]
fn verify_reports_the_documented_problem_kinds() {
    let log = build_sim_log(77);
    let segs: Vec<String> = log
        .snap
        .keys()
        .filter(|n| n.ends_with(".wseg"))
        .cloned()
        .collect();
    assert!(segs.len() >= 4, "setup: {} segments", segs.len());
    let names_for = |snap: &BTreeMap<String, Vec<u8>>| -> Vec<(String, &'static str)> {
        let sim = sim_from(snap);
        let rep = walsink::verify(&sim).expect("verify");
        rep.problems
            .iter()
            .map(|p| (p.segment.clone(), p.kind.name()))
            .collect()
    };
    let mut failures = vec![];
    // clean
    let clean = names_for(&log.snap);
    if !clean.is_empty() {
        failures.push(format!("clean log: {clean:?}"));
    }
    let mut expect = |what: &str, snap: BTreeMap<String, Vec<u8>>, want: &str| {
        let got = names_for(&snap);
        if !got.iter().any(|(_, n)| *n == want) {
            failures.push(format!("{what}: expected a {want} problem, got {got:?}"));
        }
    };
    let mut s = log.snap.clone();
    s.insert("notes.txt".into(), b"hello".to_vec());
    expect("foreign file", s, "unexpected_file");
    let mut s = log.snap.clone();
    if let Some(d) = s.get_mut("WALSINK") {
        let n = d.len();
        d[n - 1] ^= 0xff;
    }
    expect("WALSINK last byte flipped", s, "bad_identity");
    let mut s = log.snap.clone();
    let mut c = b"WSNKCMT\0".to_vec();
    c.extend_from_slice(&1u32.to_le_bytes());
    c.extend_from_slice(&16u32.to_le_bytes());
    c.extend_from_slice(&1u64.to_le_bytes());
    c.extend_from_slice(&3u64.to_le_bytes());
    let crc = crc32fast::hash(&c);
    c.extend_from_slice(&(crc ^ 1).to_le_bytes());
    s.insert("COMMITTED".into(), c);
    expect("COMMITTED with a bad CRC", s, "bad_commit_store");
    // payload flip in the first data frame of the first segment (epoch 1, vouched for)
    let mut s = log.snap.clone();
    {
        let img = s.get_mut(&segs[0]).unwrap();
        let f = parse_frames(img)
            .into_iter()
            .find(|f| f.kind == 1 && f.len > 0)
            .unwrap();
        img[f.offset + 16] ^= 0x10;
    }
    expect("payload flip in epoch 1", s, "checksum");
    let mut s = log.snap.clone();
    s.remove(&segs[1]);
    expect("middle segment removed", s, "missing_segment");
    let mut s = log.snap.clone();
    {
        let img = s.get_mut(&segs[1]).unwrap();
        img[8..12].copy_from_slice(&2u32.to_le_bytes());
        let crc = crc32fast::hash(&img[0..32]);
        img[32..36].copy_from_slice(&crc.to_le_bytes());
    }
    expect("segment header of version 2", s, "unknown_version");
    let mut s = log.snap.clone();
    {
        let last = segs.last().unwrap();
        let img = s.get_mut(last).unwrap();
        let frames = parse_frames(img);
        let f = frames.last().unwrap();
        img.truncate(f.offset + 16 + f.len / 2);
    }
    expect("newest segment cut inside its last frame", s, "torn_tail");
    assert!(failures.is_empty(), "{failures:#?}");
}

/// dump on a log with a flipped payload byte in epoch 1 of 3 (damage that the barriers of 2
/// and 3 vouch for; open fails with Corruption, verify reports "checksum"): dump must return
/// an error (README: `dump` on a damaged log exits 1 after printing what is readable; the
/// brief: dump returns an error for damage), whatever f does.
#[test]
fn dump_returns_an_error_for_vouched_damage() {
    let root = tempfile::tempdir().unwrap();
    let wdir = root.path().join("wal");
    let (wal, _) = WalSink::open(&wdir, small_opts("p34", 65536, 8192, 2000)).unwrap();
    fill(&wal, 1, &vec![100; 10]);
    fill(&wal, 2, &vec![100; 10]);
    fill(&wal, 3, &vec![100; 10]);
    drop(wal);
    let segs = fs_segments(&wdir);
    let (name, img) = &segs[0];
    let f = parse_frames(img)
        .into_iter()
        .filter(|f| f.kind == 1)
        .nth(4)
        .unwrap();
    flip_fs(&wdir.join(name), f.offset + 16 + 10);
    // the log itself calls this corruption
    let open = WalSink::open(&wdir, small_opts("p34", 65536, 8192, 2000));
    assert!(
        matches!(&open, Err(e) if is_corruption(e)),
        "setup: open should fail with Corruption"
    );
    drop(open);
    let v = walsink::verify(&FsStorage::new(&wdir).unwrap()).unwrap();
    let kinds: Vec<&str> = v.problems.iter().map(|p| p.kind.name()).collect();
    assert!(
        kinds.contains(&"checksum"),
        "setup: verify problems {kinds:?}"
    );
    for ignore in [false, true] {
        let mut seen = vec![];
        let r = walsink::dump(
            Arc::new(FsStorage::new(&wdir).unwrap()),
            |id, state, epoch| {
                let mut n = 0;
                let mut err = None;
                for r in epoch.records() {
                    match r {
                        Ok(_) => n += 1,
                        Err(e) => err = Some(e),
                    }
                }
                seen.push((id, state, n, err.is_some()));
                match err {
                    Some(e) if !ignore => Err(io::Error::other(e)),
                    _ => Ok(()),
                }
            },
        );
        assert!(
            r.is_err(),
            "f ignores errors: {ignore}: dump returned Ok on a log whose epoch 1 is corrupt; f was handed (id, state, records, iterator err): {seen:?}"
        );
    }
}
