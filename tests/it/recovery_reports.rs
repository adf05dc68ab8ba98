//! The recovery report across reopens after damage: its invariants hold from one reopen to
//! the next (pending, committed, dropped and next ids), lenient recovery opens a log whose
//! oldest segment was lost under an uncommitted epoch, and such a loss is reported.

// These bodies are kept as they were written; the lints are about style, not about what
// is checked.
#![allow(
    clippy::useless_vec,
    clippy::type_complexity,
    clippy::manual_is_multiple_of
)]

use crate::support::frames::*;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use walsink::storage::{CrashOptions, SimStorage, Storage};
use walsink::{MemorySink, RecoveryMode, WalSink};

/// Ids of every barrier frame (reservations included) that still verifies anywhere in the
/// segments of `sim`, found by testing every 8-byte-aligned offset with the documented
/// header CRC (seed = file's sequence number and the salt at header bytes 24..32).
fn intact_barrier_ids(sim: &SimStorage) -> BTreeSet<u64> {
    let mut ids = BTreeSet::new();
    for (name, img) in sim_segments(sim) {
        let Ok(seq) = name[..20].parse::<u64>() else {
            continue;
        };
        if img.len() < 40 {
            continue;
        }
        let salt = u64::from_le_bytes(img[24..32].try_into().unwrap());
        let mut off = 40;
        while off + 16 <= img.len() {
            let h = &img[off..off + 16];
            let mut buf = Vec::with_capacity(36);
            buf.extend_from_slice(&seq.to_le_bytes());
            buf.extend_from_slice(&salt.to_le_bytes());
            buf.extend_from_slice(&(off as u64).to_le_bytes());
            buf.extend_from_slice(&h[4..16]);
            let crc = u32::from_le_bytes(h[0..4].try_into().unwrap());
            let len = u32::from_le_bytes(h[4..8].try_into().unwrap()) as usize;
            if crc == crc32fast::hash(&buf) && h[8] == 2 && off + 16 + len <= img.len() && len >= 40
            {
                let payload = &img[off + 16..off + 16 + len];
                if crc32fast::hash(payload) == u32::from_le_bytes(h[12..16].try_into().unwrap()) {
                    ids.insert(u64::from_le_bytes(payload[0..8].try_into().unwrap()));
                }
            }
            off += 8;
        }
    }
    ids
}

/// For many seeds, 5 rounds each: open (default mode; on a Corruption error, lenient mode),
/// check the report, write epochs (some delivered), then one of: a power loss, a flipped byte
/// in a random segment, a removed segment, a truncated newest segment, a clean close.
/// Checks: every checkpoint whose checkpoint() returned Ok is pending or committed, or its loss
/// is reported (torn_tail, corruption, checkpoints_dropped, or the default open failing);
/// after a plain power loss or a clean close nothing is lost; next_checkpoint_id is above every
/// id any earlier report or call showed (pending, committed, last_checkpoint, dropped,
/// checkpoint() Ok), and the id it names is accepted.
#[test]
fn recovery_report_invariants_hold_across_reopens() {
    let seeds: u64 = std::env::var("PROBE_SEEDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(60);
    let mut failures = vec![];
    let mut ids_reused_after_destroying_damage: Vec<String> = vec![];
    let mut stats = BTreeMap::<&str, u64>::new();
    // Seed 596 lost checkpoint 1 without a report before recovery's claims reached back to
    // its cut; it is kept. Seeds 518 (the lost oldest segment is followed by no control frame)
    // and 739 (something was committed, so a missing front looks like clean-up) are the limit
    // documented in docs/design.md ("Failure model"): they are not run here.
    for seed in (0..seeds).chain([596]) {
        let mut rng = fastrand::Rng::with_seed(seed * 31 + 7);
        let sim = Arc::new(SimStorage::new());
        let o = small_opts("p40", 4096, 1024, 1500).salt_seed(seed);
        let mut live: BTreeSet<u64> = BTreeSet::new(); // checkpoint() Ok, loss not reported yet
        let mut seen_max: Option<u64> = None;
        let mut prev_session_max: Option<u64> = None;
        let mut last_damage = "none";
        let mut detail = String::new();
        for round in 0..5 {
            let ctx = format!("seed {seed} round {round} after {last_damage}");
            let mut open_failed = false;
            let visible_before_open = intact_barrier_ids(&sim);
            let (wal, rep) = match WalSink::open_with_storage(sim.clone(), o.clone()) {
                Ok(x) => x,
                Err(e) if is_corruption(&e) => {
                    open_failed = true;
                    *stats
                        .entry("default open failed with corruption")
                        .or_default() += 1;
                    match WalSink::open_with_storage(
                        sim.clone(),
                        o.clone().recovery_mode(RecoveryMode::TruncateAtCorruption),
                    ) {
                        Ok(x) => x,
                        Err(e) if is_corruption(&e) => {
                            // an open error reports the loss; the lenient mode failing is
                            // checked on its own by lenient_open_succeeds_after_the_oldest_segment_is_lost
                            *stats
                                .entry("lenient open failed with corruption (seed ends)")
                                .or_default() += 1;
                            break;
                        }
                        Err(e) => {
                            failures.push(format!("{ctx}: lenient open failed: {e}"));
                            break;
                        }
                    }
                }
                Err(e) => {
                    failures.push(format!("{ctx}: open failed: {e}"));
                    break;
                }
            };
            let committed = rep.committed.unwrap_or(0);
            let reported = open_failed
                || rep.torn_tail.is_some()
                || rep.corruption.is_some()
                || !rep.checkpoints_dropped.is_empty();
            let lost: Vec<u64> = live
                .iter()
                .copied()
                .filter(|id| *id > committed && !rep.pending.contains(id))
                .collect();
            if !lost.is_empty() {
                if !reported {
                    failures.push(format!("{ctx}: checkpoints {lost:?} vanished without a report (pending {:?}, committed {:?}, last {:?}, segments {}, moved_aside {:?}) [{detail}]", rep.pending, rep.committed, rep.last_checkpoint, rep.segments, rep.moved_aside));
                } else if last_damage == "power loss" || last_damage == "clean close" {
                    failures.push(format!("{ctx}: checkpoints {lost:?} lost after a {last_damage} (torn {:?} corr {:?} dropped {:?})", rep.torn_tail, rep.corruption, rep.checkpoints_dropped));
                }
                for id in &lost {
                    live.remove(id);
                }
            }
            let rep_ids: Vec<u64> = rep
                .pending
                .iter()
                .chain(rep.checkpoints_dropped.iter())
                .chain(rep.committed.iter())
                .chain(rep.last_checkpoint.iter())
                .copied()
                .collect();
            if let Some(m) = visible_before_open.iter().next_back() {
                if rep.next_checkpoint_id <= *m {
                    failures.push(format!(
                        "{ctx}: next_checkpoint_id {} not above {m}, a barrier id still intact in the directory before open (intact: {visible_before_open:?}; report: pending {:?} committed {:?} last {:?} dropped {:?} torn {:?} corruption {:?})",
                        rep.next_checkpoint_id, rep.pending, rep.committed, rep.last_checkpoint, rep.checkpoints_dropped,
                        rep.torn_tail.as_ref().map(|d| (&d.segment, d.offset, d.reason.name())),
                        rep.corruption.as_ref().map(|d| (&d.segment, d.offset, d.reason.name()))
                    ));
                }
            }
            if let (Some(m), true) = (
                prev_session_max,
                last_damage == "power loss" || last_damage == "clean close",
            ) {
                if rep.next_checkpoint_id <= m {
                    failures.push(format!("{ctx}: next_checkpoint_id {} not above {m}, an id of the previous session (its report or checkpoint() Ok)", rep.next_checkpoint_id));
                }
            }
            if let Some(m) = seen_max {
                if rep.next_checkpoint_id <= m {
                    ids_reused_after_destroying_damage.push(format!(
                        "{ctx}: next_checkpoint_id {} not above {m}, an id seen before (report: pending {:?} committed {:?} last {:?} dropped {:?} torn {:?} corruption {:?}; open_failed {open_failed})",
                        rep.next_checkpoint_id, rep.pending, rep.committed, rep.last_checkpoint, rep.checkpoints_dropped,
                        rep.torn_tail.as_ref().map(|d| (&d.segment, d.offset, d.reason.name())),
                        rep.corruption.as_ref().map(|d| (&d.segment, d.offset, d.reason.name()))
                    ));
                }
            }
            if let Some(m) = rep_ids.iter().max() {
                if rep.next_checkpoint_id <= *m {
                    failures.push(format!(
                        "{ctx}: next_checkpoint_id {} not above {m}, an id of this very report",
                        rep.next_checkpoint_id
                    ));
                }
            }
            for id in &rep_ids {
                seen_max = Some(seen_max.unwrap_or(0).max(*id));
            }
            prev_session_max = rep_ids.iter().max().copied();
            // work
            let mut id = rep.next_checkpoint_id + rng.u64(0..2);
            for _ in 0..rng.usize(1..4) {
                let n = rng.usize(0..25);
                for i in 0..n {
                    wal.append(&rec(id, i as u64, rng.usize(0..1200))).unwrap();
                }
                match wal.checkpoint(id, b"m") {
                    Ok(()) => {
                        live.insert(id);
                        seen_max = Some(seen_max.unwrap_or(0).max(id));
                        prev_session_max = Some(prev_session_max.unwrap_or(0).max(id));
                    }
                    Err(e) => failures.push(format!(
                        "{ctx}: checkpoint {id} (next allowed {}) failed: {e}",
                        rep.next_checkpoint_id
                    )),
                }
                id += 1 + rng.u64(0..2);
            }
            if rng.bool() {
                if let Some(&top) = live.iter().next_back() {
                    let upto = if rng.bool() {
                        top
                    } else {
                        *live.iter().next().unwrap()
                    };
                    let _ = wal.checkpoint_complete(upto);
                    let _ = wal.deliver_ready(&mut MemorySink::with_marker());
                }
            }
            for i in 0..rng.usize(0..10) {
                wal.append(&rec(0, i as u64, 300)).unwrap();
            }
            // damage
            let segs: Vec<(String, Vec<u8>)> = sim_segments(&sim);
            let choice = rng.usize(0..5);
            match choice {
                0 => {
                    sim.crash(CrashOptions::power_loss(seed * 100 + round));
                    drop(wal);
                    last_damage = "power loss";
                }
                1 if !segs.is_empty() => {
                    drop(wal);
                    let (name, mut img) = segs[rng.usize(0..segs.len())].clone();
                    let frames = parse_frames(&img);
                    let end = frames
                        .last()
                        .map(|f| (f.offset + 16 + f.len).min(img.len()))
                        .unwrap_or(40);
                    let off = rng.usize(0..end.max(1));
                    img[off] ^= 1 << rng.u8(0..8);
                    sim.put_file(&name, &img);
                    last_damage = "flipped byte";
                }
                2 if segs.len() >= 2 => {
                    drop(wal);
                    let (name, _) = &segs[rng.usize(0..segs.len())];
                    let _ = sim.remove(name);
                    last_damage = "removed segment";
                    detail = format!(
                        "removed {name} of {:?}; barriers per segment {:?}",
                        segs.iter().map(|s| &s.0[15..20]).collect::<Vec<_>>(),
                        segs.iter()
                            .map(|(_, img)| parse_frames(img)
                                .iter()
                                .filter(|f| f.kind == 2)
                                .map(|f| barrier_id(img, f))
                                .collect::<Vec<_>>())
                            .collect::<Vec<_>>()
                    );
                }
                3 if !segs.is_empty() => {
                    drop(wal);
                    let (name, mut img) = segs.last().unwrap().clone();
                    let cut = rng.usize(40..img.len().max(41));
                    img.truncate(cut);
                    sim.put_file(&name, &img);
                    last_damage = "truncated newest segment";
                }
                _ => {
                    drop(wal);
                    last_damage = "clean close";
                }
            }
            *stats.entry(last_damage).or_default() += 1;
        }
    }
    eprintln!("p40 stats: {stats:?}");
    eprintln!("p40: {} reopens reused an id whose barrier the damage destroyed (not a failure: walsink cannot see it):", ids_reused_after_destroying_damage.len());
    for m in ids_reused_after_destroying_damage.iter().take(8) {
        eprintln!("  {m}");
    }
    assert!(
        failures.is_empty(),
        "{} failures:\n{}",
        failures.len(),
        failures[..failures.len().min(20)].join("\n")
    );
}

/// The oldest segment of a log with nothing committed is lost (its epoch is now incomplete).
/// The default open fails with Corruption (IncompleteEpoch), as documented. The lenient mode,
/// documented as the way "to get a damaged log running again" (keep the valid prefix, move the
/// rest aside, report every checkpoint dropped), must open it, and must not answer with an
/// error that recommends the very mode it was opened in.
#[test]
fn lenient_open_succeeds_after_the_oldest_segment_is_lost() {
    let sim = Arc::new(SimStorage::new());
    let o = small_opts("p41", 4096, 1024, 1500).salt_seed(1);
    let (wal, _) = WalSink::open_with_storage(sim.clone(), o.clone()).unwrap();
    fill(&wal, 1, &vec![700; 12]);
    fill(&wal, 2, &vec![700; 12]);
    fill(&wal, 3, &vec![700; 3]);
    drop(wal);
    let segs = sim_segments(&sim);
    assert!(segs.len() >= 4, "setup");
    sim.remove(&segs[0].0).unwrap();
    sim.sync_dir().unwrap();
    let d = WalSink::open_with_storage(sim.clone(), o.clone());
    match &d {
        Err(e) => assert!(is_corruption(e), "default open: {e}"),
        Ok((_, r)) => panic!(
            "default open accepted a log missing its oldest segment: pending {:?} torn {:?}",
            r.pending, r.torn_tail
        ),
    }
    drop(d);
    match WalSink::open_with_storage(
        sim.clone(),
        o.recovery_mode(RecoveryMode::TruncateAtCorruption),
    ) {
        Ok((_, r)) => {
            assert!(
                r.corruption.is_some() || r.torn_tail.is_some(),
                "lenient report shows no damage: {r:?}"
            );
        }
        Err(e) => panic!(
            "lenient open (RecoveryMode::TruncateAtCorruption) failed: {e}\n(kind {:?})",
            e.kind()
        ),
    }
}

/// Nothing committed; segment 1 holds all of epoch 1 and its barrier, epoch 2 starts in
/// segment 2. Segment 1 is lost. Since nothing was committed, no segment can have been freed
/// (design.md invariant 7), so checkpoint 1, which returned Ok, is lost: recovery must report
/// it (torn_tail, corruption, checkpoints_dropped) or open must fail; it must not vanish, and
/// verify must not call the log clean.
#[test]
fn a_lost_oldest_segment_holding_a_whole_uncommitted_epoch_is_reported() {
    let sim = Arc::new(SimStorage::new());
    let o = small_opts("p42", 4096, 1024, 1500).salt_seed(3);
    let (wal, rep0) = WalSink::open_with_storage(sim.clone(), o.clone()).unwrap();
    assert_eq!(rep0.committed, None);
    fill(&wal, 1, &vec![1000; 3]);
    fill(&wal, 2, &vec![1000; 3]);
    drop(wal);
    let segs = sim_segments(&sim);
    let barriers: Vec<Vec<u64>> = segs
        .iter()
        .map(|(_, img)| {
            parse_frames(img)
                .iter()
                .filter(|f| f.kind == 2)
                .map(|f| barrier_id(img, f))
                .collect()
        })
        .collect();
    let data_in_first: usize = parse_frames(&segs[0].1)
        .iter()
        .filter(|f| f.kind == 1)
        .count();
    assert_eq!(
        (barriers[0].clone(), data_in_first),
        (vec![1], 3),
        "setup: segment 1 should hold exactly epoch 1; barriers {barriers:?}"
    );
    sim.remove(&segs[0].0).unwrap();
    sim.sync_dir().unwrap();
    let v = walsink::verify(&*sim).unwrap();
    let vk: Vec<&str> = v.problems.iter().map(|p| p.kind.name()).collect();
    match WalSink::open_with_storage(sim.clone(), o) {
        Err(e) => eprintln!("p42: open failed (loss reported): {e}"),
        Ok((_, rep)) => {
            let reported = rep.torn_tail.is_some()
                || rep.corruption.is_some()
                || rep.checkpoints_dropped.contains(&1);
            assert!(
                reported || rep.pending.contains(&1),
                "checkpoint 1 vanished without a report: removed {} (nothing committed); report: pending {:?} committed {:?} last {:?} next_checkpoint_id {} torn {:?} corruption {:?} dropped {:?}; verify ok={} problems {vk:?}",
                segs[0].0, rep.pending, rep.committed, rep.last_checkpoint, rep.next_checkpoint_id, rep.torn_tail, rep.corruption, rep.checkpoints_dropped, v.ok
            );
        }
    }
    assert!(!v.ok, "verify called a log that lost checkpoint 1 clean");
}
