//! Damage that a power loss or a disk can leave where recovery used to look away: a fresh
//! log's only segment without its header, a segment header with one flipped bit, a lost newest
//! segment, a second lenient recovery of the same segment, and record counts from disk that do
//! not add up. Every checkpoint that returned `Ok` stays reachable, or its loss is reported
//! (an error, a torn tail with what was cut, or the dropped ids); ids are never reused.

use crate::support::*;
use std::fs;
use std::path::Path;
use walsink::format::{self, FrameKind, Position, Seed};
use walsink::storage::FsStorage;
use walsink::{ErrorKind, Options, RecoveryMode, WalSink};

fn small() -> Options {
    opts("dmg").segment_size(8192)
}

fn lenient() -> Options {
    small().recovery_mode(RecoveryMode::TruncateAtCorruption)
}

/// Checkpoints `ids`, each of `n` records of `size` bytes.
fn write_checkpoints(
    dir: &Path,
    o: Options,
    ids: std::ops::RangeInclusive<u64>,
    n: u32,
    size: usize,
) {
    let (wal, _) = WalSink::open(dir, o).unwrap();
    for cp in ids {
        for v in values(cp as u32 * 1000, cp as u32 * 1000 + n - 1) {
            let mut r = v;
            r.resize(size, b'x');
            wal.append(&r).unwrap();
        }
        wal.checkpoint(cp, format!("meta-{cp}").as_bytes()).unwrap();
    }
}

/// Opens, checkpoints once more, reopens: the new checkpoint must be there.
fn checkpoint_survives_reopen(dir: &Path, o: Options, id: u64) {
    let (wal, _) = WalSink::open(dir, o.clone()).unwrap();
    append_values(&wal, 1, 5);
    wal.checkpoint(id, b"after").unwrap();
    drop(wal);
    let (_, report) = WalSink::open(dir, o).unwrap_or_else(|e| panic!("reopen: {e}"));
    assert!(report.pending.contains(&id), "{report:?}");
    assert_eq!(report.last_metadata.as_deref(), Some(&b"after"[..]));
}

#[test]
fn a_fresh_log_whose_segment_header_was_never_synced_stays_usable() {
    for damage in ["zero header", "truncate", "random"] {
        let dir = tempfile::tempdir().unwrap();
        drop(WalSink::open(dir.path(), small()).unwrap());
        let seg = segments(dir.path()).pop().unwrap();
        let mut b = fs::read(&seg).unwrap();
        match damage {
            "zero header" => b[..format::SEGMENT_HEADER_LEN].fill(0),
            "truncate" => b.clear(),
            _ => {
                let mut rng = fastrand::Rng::with_seed(9);
                b.iter_mut().for_each(|x| *x = rng.u8(..));
            }
        }
        fs::write(&seg, &b).unwrap();
        let o = match WalSink::open(dir.path(), small()) {
            Ok(_) => small(),
            Err(_) => lenient(),
        };
        checkpoint_survives_reopen(dir.path(), o.clone(), 100);
        // And again, through one more open without new data.
        drop(WalSink::open(dir.path(), o.clone()).unwrap());
        checkpoint_survives_reopen(dir.path(), o, 101);
    }
}

#[test]
fn a_log_cut_before_any_checkpoint_stays_usable() {
    // Records without a checkpoint, then a crash: no control frame survives, and the cut lands
    // at the start of the first segment.
    let dir = tempfile::tempdir().unwrap();
    {
        let (wal, _) = WalSink::open(dir.path(), small()).unwrap();
        append_values(&wal, 1, 50);
    }
    checkpoint_survives_reopen(dir.path(), small(), 1);
}

#[test]
fn a_flipped_bit_in_the_newest_segment_header_is_reported() {
    let dir = tempfile::tempdir().unwrap();
    write_checkpoints(dir.path(), small(), 1..=3, 60, 300);
    // Reopen so that checkpoints 4..=8 share a fresh newest segment.
    write_checkpoints(dir.path(), small(), 4..=8, 5, 100);
    let newest = segments(dir.path()).pop().unwrap();
    let mut b = fs::read(&newest).unwrap();
    b[12] ^= 0x01;
    fs::write(&newest, &b).unwrap();
    let report = walsink::verify(&FsStorage::new(dir.path()).unwrap()).unwrap();
    assert!(!report.ok, "{report:?}");
    let e = WalSink::open(dir.path(), small()).unwrap_err();
    assert!(matches!(e.kind(), ErrorKind::Corruption(_)), "{e}");
    // Lenient recovery names every checkpoint it loses.
    let (_, report) = WalSink::open(dir.path(), lenient()).unwrap();
    assert_eq!(report.pending, vec![1, 2, 3]);
    assert_eq!(
        report.checkpoints_dropped,
        vec![4, 5, 6, 7, 8],
        "{report:?}"
    );
    assert!(report.next_checkpoint_id >= 9);
}

#[test]
fn a_lost_newest_segment_is_reported_as_a_torn_tail() {
    let dir = tempfile::tempdir().unwrap();
    write_checkpoints(dir.path(), small(), 1..=3, 60, 300);
    let newest = segments(dir.path()).pop().unwrap();
    fs::write(&newest, b"").unwrap();
    let report = walsink::verify(&FsStorage::new(dir.path()).unwrap()).unwrap();
    assert!(
        !report.ok,
        "verify called a log clean that lost its newest segment"
    );
    let (_, report) = WalSink::open(dir.path(), small()).unwrap();
    let torn = report.torn_tail.expect("the lost segment is reported");
    assert_eq!(torn.segment, newest.file_name().unwrap().to_str().unwrap());
    assert!(report.unsealed_records_dropped > 0);
    assert!(!report.pending.contains(&3));
    // The repair is durable: the next open is clean.
    let (_, again) = WalSink::open(dir.path(), small()).unwrap();
    assert_eq!(again.torn_tail, None);
}

#[test]
fn lenient_recovery_never_lets_a_dropped_id_be_reused() {
    let dir = tempfile::tempdir().unwrap();
    write_checkpoints(dir.path(), small(), 1..=3, 60, 300);
    // Damage synced data in the second segment: checkpoints after it are dropped.
    let segs = segments(dir.path());
    let mut b = fs::read(&segs[1]).unwrap();
    b[format::SEGMENT_HEADER_LEN + 64] ^= 0x10;
    fs::write(&segs[1], &b).unwrap();
    let (wal, report) = WalSink::open(dir.path(), lenient()).unwrap();
    assert!(!report.checkpoints_dropped.is_empty(), "{report:?}");
    let highest = *report.checkpoints_dropped.iter().max().unwrap();
    assert!(report.next_checkpoint_id > highest, "{report:?}");
    for &id in &report.checkpoints_dropped {
        assert!(wal.checkpoint(id, b"").is_err(), "dropped id {id} reused");
    }
}

#[test]
fn a_second_lenient_recovery_never_overwrites_a_set_aside_segment() {
    let dir = tempfile::tempdir().unwrap();
    let mut next = 1;
    let mut aside = Vec::new();
    for round in 0..2 {
        // Checkpoints over several segments, then damage to the first frame of the second
        // segment, which later barriers claim durable: both rounds set aside the same names.
        write_checkpoints(dir.path(), lenient(), next..=next + 2, 60, 300);
        let segs = segments(dir.path());
        let mut b = fs::read(&segs[1]).unwrap();
        b[format::SEGMENT_HEADER_LEN + 8] ^= 0x10;
        fs::write(&segs[1], &b).unwrap();
        let (_, report) = WalSink::open(dir.path(), lenient()).unwrap();
        assert!(report.corruption.is_some(), "round {round}: {report:?}");
        for name in &report.moved_aside {
            aside.push((name.clone(), fs::read(dir.path().join(name)).unwrap()));
        }
        next = report.next_checkpoint_id.max(next + 3);
    }
    let names: std::collections::BTreeSet<_> = aside.iter().map(|(n, _)| n.clone()).collect();
    assert_eq!(names.len(), aside.len(), "a set-aside name was used twice");
    for (name, bytes) in aside {
        assert_eq!(
            fs::read(dir.path().join(&name)).unwrap(),
            bytes,
            "{name} changed"
        );
    }
}

#[test]
fn verify_survives_record_counts_that_overflow() {
    let dir = tempfile::tempdir().unwrap();
    drop(WalSink::open(dir.path(), small()).unwrap());
    let seg = segments(dir.path()).pop().unwrap();
    let seed = Seed { seq: 1, salt: 77 };
    let mut b = format::encode_segment_header(seed).to_vec();
    let barrier = format::Barrier {
        checkpoint: 1,
        timestamp_ms: 0,
        records: u64::MAX,
        durable_through: Position::segment_start(1),
        metadata: b"",
    };
    let at = b.len() as u64;
    format::encode_frame(
        &mut b,
        seed,
        at,
        FrameKind::Barrier,
        &barrier.encode_fixed(),
    );
    let at = b.len() as u64;
    format::encode_frame(&mut b, seed, at, FrameKind::Data, b"one");
    fs::write(&seg, &b).unwrap();
    let report = walsink::verify(&FsStorage::new(dir.path()).unwrap()).unwrap();
    assert_eq!(report.unsealed_records, 1);
    assert!(report.records < u64::MAX, "{report:?}");
    assert!(
        !report.ok,
        "a barrier claiming records that are not there is a problem"
    );
}

#[test]
fn a_free_file_holding_another_segments_frames_is_never_reused() {
    use walsink::storage::{CrashOptions, FaultOp, SimStorage};
    let lose_unsynced = CrashOptions {
        seed: 0,
        lose_all_unsynced: true,
        process_only: false,
    };
    let sim = SimStorage::new();
    let o = opts("stale-free")
        .segment_size(4096)
        .max_record_size(1024)
        .recycle_segments(true);
    let wal = open_sim(&sim, o.clone());
    for cp in 1..=4u64 {
        for i in 0..10 {
            wal.append(&[b'a' + i as u8; 300]).unwrap();
        }
        wal.checkpoint(cp, b"").unwrap();
        complete_and_deliver(&wal, cp);
    }
    // The next epoch rolls into a recycled file; the directory sync after it fails, so the
    // rename is not durable while the file's new frames are.
    sim.inject_fault(FaultOp::SyncDir, 0, std::io::ErrorKind::Other);
    for _ in 0..20 {
        wal.append(&[b'z'; 300]).unwrap();
    }
    assert!(wal.checkpoint(5, b"").is_err());
    drop(wal);
    sim.crash(lose_unsynced);
    // Recovery may take a free file for its new segment; a power loss before its header is
    // synced must not bring back frames the file held under that number.
    drop(WalSink::open_with_storage(std::sync::Arc::new(sim.clone()), o.clone()).unwrap());
    sim.crash(lose_unsynced);
    let (_, report) = WalSink::open_with_storage(std::sync::Arc::new(sim.clone()), o).unwrap();
    assert!(!report.pending.contains(&5), "{report:?}");
}

/// A file numbered above the largest segment number a log uses (2^63 - 1), which only a hand
/// can put there, is refused at open with an error naming the number: no panic on the
/// overflowing `seq + 1`, no segment numbers that wrap, nothing of the log changed; without
/// it the log opens with everything it had.
#[test]
fn a_file_numbered_past_the_largest_segment_number_is_refused() {
    for name in [
        "18446744073709551615.wseg",
        "18446744073709551614.free",
        "09223372036854775808.wseg",
        "18446744073709551615.wseg.damaged",
    ] {
        let dir = tempfile::tempdir().unwrap();
        write_checkpoints(dir.path(), small(), 1..=3, 20, 300);
        fs::write(dir.path().join(name), vec![0u8; 8192]).unwrap();
        let before: Vec<_> = segments(dir.path());
        let e = WalSink::open(dir.path(), small())
            .err()
            .unwrap_or_else(|| panic!("{name}: opened"));
        let text = e.to_string();
        let number = name.split('.').next().unwrap().trim_start_matches('0');
        assert!(
            text.contains(number) && text.contains("largest segment number"),
            "{name}: {text}"
        );
        assert_eq!(segments(dir.path()), before, "{name}");
        fs::remove_file(dir.path().join(name)).unwrap();
        let (_, report) = WalSink::open(dir.path(), small()).unwrap();
        assert_eq!(report.pending, vec![1, 2, 3], "{name}");
    }
}
