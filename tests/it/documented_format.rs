//! The on-disk format is the one docs/design.md documents, checked against an independent
//! implementation of the layout: frames written by this build and the golden v1 log carry the
//! documented header checksum, a log built from the documentation opens and delivers, a
//! checksum computed otherwise does not verify, and the search after damage finds barriers
//! by that checksum (before a durable claim, after a damaged segment header, above 4 GiB).

use crate::support::durable_logs::*;
use std::path::Path;
use walsink::storage::FsStorage;
use walsink::{ErrorKind, MemorySink, Mode, Options, RecoveryMode, WalSink};

fn crc(parts: &[&[u8]]) -> u32 {
    let mut h = crc32fast::Hasher::new();
    for p in parts {
        h.update(p);
    }
    h.finalize()
}

fn le64(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().unwrap())
}

fn le32(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().unwrap())
}

#[derive(Debug, Clone)]
struct Fr {
    off: u64,
    kind: u8,
    payload: Vec<u8>,
}

fn header_crc(seq: u64, salt: u64, off: u64, rest: &[u8]) -> u32 {
    crc(&[
        &seq.to_le_bytes(),
        &salt.to_le_bytes(),
        &off.to_le_bytes(),
        rest,
    ])
}

/// Parses one segment by the documented layout: (salt, frames up to the end of data, offset
/// after the last frame). Panics on any frame that does not verify.
fn parse_segment(bytes: &[u8], seq: u64, what: &str) -> (u64, Vec<Fr>, u64) {
    assert!(bytes.len() >= 40, "{what}: short");
    assert_eq!(&bytes[0..8], b"WSNKSEG\0", "{what}: magic");
    assert_eq!(le32(bytes, 8), 1, "{what}: version");
    assert_eq!(le64(bytes, 16), seq, "{what}: sequence number");
    assert_eq!(le32(bytes, 32), crc(&[&bytes[0..32]]), "{what}: header CRC");
    let salt = le64(bytes, 24);
    let mut off = 40u64;
    let mut frames = Vec::new();
    while off as usize + 16 <= bytes.len() {
        let h = &bytes[off as usize..off as usize + 16];
        if h.iter().all(|&b| b == 0) {
            break;
        }
        let len = le32(h, 4) as usize;
        let kind = h[8];
        assert_eq!(
            le32(h, 0),
            header_crc(seq, salt, off, &h[4..16]),
            "{what}: header CRC of the frame at {off} (kind {kind}, len {len})"
        );
        assert_eq!(&h[9..12], &[0, 0, 0], "{what}: reserved at {off}");
        let p = &bytes[off as usize + 16..off as usize + 16 + len];
        assert_eq!(le32(h, 12), crc(&[p]), "{what}: payload CRC at {off}");
        frames.push(Fr {
            off,
            kind,
            payload: p.to_vec(),
        });
        off += 16 + (len as u64).div_ceil(8) * 8;
        if kind == 4 {
            break;
        }
    }
    (salt, frames, off)
}

/// One parsed segment: (seq, salt, frames, end of data, bytes).
type ParsedSegment = (u64, u64, Vec<Fr>, u64, Vec<u8>);

/// A way to compute a header checksum: (seq, salt, offset, header bytes 4..16) to CRC.
type HeaderCrc = Box<dyn Fn(u64, u64, u64, &[u8]) -> u32>;

/// The segments of a log directory, parsed: (seq, salt, frames, end of data).
fn parse_log(dir: &Path) -> Vec<ParsedSegment> {
    let mut v = Vec::new();
    for (name, _) in wseg_files(dir) {
        if !name.ends_with(".wseg") {
            continue;
        }
        let seq: u64 = name[..20].parse().unwrap();
        let bytes = std::fs::read(dir.join(&name)).unwrap();
        let (salt, frames, end) = parse_segment(&bytes, seq, &name);
        v.push((seq, salt, frames, end, bytes));
    }
    v
}

fn frame(seq: u64, salt: u64, off: u64, kind: u8, payload: &[u8]) -> Vec<u8> {
    let mut rest = Vec::new();
    rest.extend((payload.len() as u32).to_le_bytes());
    rest.push(kind);
    rest.extend([0, 0, 0]);
    rest.extend(crc(&[payload]).to_le_bytes());
    let mut f = header_crc(seq, salt, off, &rest).to_le_bytes().to_vec();
    f.extend(rest);
    f.extend(payload);
    while !f.len().is_multiple_of(8) {
        f.push(0);
    }
    f
}

fn segment_header(seq: u64, salt: u64) -> Vec<u8> {
    let mut h = b"WSNKSEG\0".to_vec();
    h.extend(1u32.to_le_bytes());
    h.extend(0u32.to_le_bytes());
    h.extend(seq.to_le_bytes());
    h.extend(salt.to_le_bytes());
    let c = crc(&[&h]);
    h.extend(c.to_le_bytes());
    h.extend(0u32.to_le_bytes());
    h
}

fn envelope(magic: &[u8; 8], body: &[u8]) -> Vec<u8> {
    let mut f = magic.to_vec();
    f.extend(1u32.to_le_bytes());
    f.extend((body.len() as u32).to_le_bytes());
    f.extend(body);
    let c = crc(&[&f]);
    f.extend(c.to_le_bytes());
    f
}

/// Writes segments: each a list of (kind, payload); barriers' `durable_through` is the
/// frame's own position. Returns the records and (seq, off) of each frame.
struct Seg {
    seq: u64,
    salt: u64,
    frames: Vec<(u8, Vec<u8>)>,
}

const CRAFT_SEG: u64 = 64 << 10;

fn write_crafted(dir: &Path, sink: &str, segs: &[Seg]) -> Vec<(u64, u64, u8)> {
    std::fs::create_dir_all(dir).unwrap();
    let mut body = 0u32.to_le_bytes().to_vec();
    body.extend(sink.as_bytes());
    std::fs::write(dir.join("WALSINK"), envelope(b"WSNKID\0\0", &body)).unwrap();
    let mut c = 0u64.to_le_bytes().to_vec();
    c.extend(0u64.to_le_bytes());
    std::fs::write(dir.join("COMMITTED"), envelope(b"WSNKCMT\0", &c)).unwrap();
    let mut pos = Vec::new();
    for s in segs {
        let mut b = segment_header(s.seq, s.salt);
        for (kind, payload) in &s.frames {
            let off = b.len() as u64;
            let payload = if *kind == 2 {
                // Patch durable_through to this frame's own position.
                let mut p = payload.clone();
                p[24..32].copy_from_slice(&s.seq.to_le_bytes());
                p[32..40].copy_from_slice(&off.to_le_bytes());
                p
            } else {
                payload.clone()
            };
            b.extend(frame(s.seq, s.salt, off, *kind, &payload));
            pos.push((s.seq, off, *kind));
        }
        b.resize(CRAFT_SEG as usize, 0);
        std::fs::write(dir.join(seg_name(s.seq)), b).unwrap();
    }
    pos
}

fn crafted_segments() -> (Vec<Seg>, Vec<Vec<u8>>) {
    // A sequence number and salts with every byte in use (and the top bits set).
    let seq = 0x0000_0A0B_0C0D_0E0Fu64;
    let lens = [0usize, 1, 7, 8, 9, 15, 16, 17, 100, 255, 1000];
    let mut recs = Vec::new();
    let mut s1 = Vec::new();
    for (k, l) in lens.iter().enumerate() {
        let r: Vec<u8> = (0..*l).map(|x| (x * 7 + k * 13) as u8).collect();
        s1.push((1u8, r.clone()));
        recs.push(r);
    }
    s1.push((2, barrier(5, lens.len() as u64, (0, 0), b"m5")));
    for k in 0..3 {
        let r = format!("second epoch {k}").into_bytes();
        s1.push((1, r.clone()));
        recs.push(r);
    }
    s1.push((2, barrier(7, 3, (0, 0), b"")));
    s1.push((4, Vec::new()));
    let mut s2 = Vec::new();
    for k in 0..2 {
        let r = vec![0xFFu8; 33 + k];
        s2.push((1, r.clone()));
        recs.push(r);
    }
    s2.push((2, barrier(9, 2, (0, 0), b"m9 metadata")));
    (
        vec![
            Seg {
                seq,
                salt: 0xFEDC_BA98_7654_3210,
                frames: s1,
            },
            Seg {
                seq: seq + 1,
                salt: 0x8000_0000_0000_0001,
                frames: s2,
            },
        ],
        recs,
    )
}

fn crafted_opts() -> Options {
    Options::new("crafted")
        .segment_size(CRAFT_SEG)
        .max_record_size(4096)
        .max_metadata_size(256)
}

/// Logs written by this build, in both modes, with recycled files full of stale frames:
/// every frame up to the end of data verifies under the documented checksum (seq, salt and
/// offset as u64 little-endian, then bytes 4..16); segments but the newest end with a
/// segment end; no 8-byte-aligned stale header after the end of data verifies under the
/// segment's seed; data frames are exactly the records kept.
#[test]
fn frames_written_by_this_build_match_the_documented_checksum() {
    for mode in [Mode::Checkpointed, Mode::Durable] {
        let dir = tempfile::tempdir().unwrap();
        let seg = 8192u64;
        let opts = || {
            let mut o = durable("crc", seg, true).mode(mode);
            o.max_free_segments = 4;
            o
        };
        let (wal, _) = WalSink::open(dir.path(), opts()).unwrap();
        let mut rng = Rng::new(mode as u64 + 3);
        let mut kept: Vec<Vec<u8>> = Vec::new();
        let mut cp = 0;
        let mut sink = MemorySink::new();
        let mut stale_checked = 0;
        for round in 0..60u64 {
            let n = 1 + rng.below(20);
            for k in 0..n {
                let r = rec(0, 0, round * 100 + k, rng.below(1800) as usize);
                wal.append(&r).unwrap();
                kept.push(r);
            }
            if mode == Mode::Checkpointed {
                cp += 1;
                wal.checkpoint(cp, format!("meta {cp}").as_bytes()).unwrap();
                if round % 3 != 2 {
                    wal.checkpoint_complete(cp).unwrap();
                }
            }
            if round % 4 == 0 {
                wal.deliver_ready(&mut sink).unwrap();
            }
            // Parse the live directory each round: recycled files appear as they are reused.
            for (seq, salt, frames, end, bytes) in parse_log(dir.path()) {
                assert!(!frames.is_empty() || end == 40);
                let mut off = end.div_ceil(8) * 8 + 16;
                while off as usize + 16 <= bytes.len() {
                    let h = &bytes[off as usize..off as usize + 16];
                    if h.iter().any(|&b| b != 0) {
                        assert_ne!(
                            le32(h, 0),
                            header_crc(seq, salt, off, &h[4..16]),
                            "{}: a stale frame at {off}, after the end of data at {end}, \
                             verifies under the segment's seed",
                            seg_name(seq)
                        );
                        stale_checked += 1;
                    }
                    off += 8;
                }
            }
        }
        wal.deliver_ready(&mut sink).unwrap();
        drop(wal);
        let log = parse_log(dir.path());
        let n = log.len();
        let mut data = Vec::new();
        for (k, (seq, _, frames, _, _)) in log.iter().enumerate() {
            if k + 1 < n {
                assert_eq!(frames.last().map(|f| f.kind), Some(4), "{}", seg_name(*seq));
                assert_eq!(log[k + 1].0, seq + 1, "segments contiguous");
            }
            for f in frames {
                assert!((1..=4).contains(&f.kind), "kind {} at {}", f.kind, f.off);
                if f.kind == 1 {
                    data.push(f.payload.clone());
                }
            }
        }
        // What the kept segments hold is the tail of what was appended.
        assert!(!data.is_empty());
        assert_eq!(&kept[kept.len() - data.len()..], &data[..], "{mode:?}");
        let v = walsink::verify(&FsStorage::new(dir.path()).unwrap()).unwrap();
        assert!(v.ok, "{:?}", v.problems);
        eprintln!("{mode:?}: {n} segments, {stale_checked} stale headers checked");
    }
}

/// The golden v1 log of tests/data parses under the same independent checksum (so the
/// checksum above is the one older versions wrote).
#[test]
fn the_golden_v1_log_matches_the_documented_checksum() {
    let g = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/v1-basic");
    let log = parse_log(&g);
    assert_eq!(log.len(), 3);
    let frames: usize = log.iter().map(|l| l.2.len()).sum();
    assert!(frames > 100, "{frames}");
    let barriers: Vec<u64> = log
        .iter()
        .flat_map(|l| l.2.iter())
        .filter(|f| f.kind == 2)
        .map(|f| le64(&f.payload, 0))
        .collect();
    assert_eq!(barriers, vec![1, 2, 3]);
}

/// A log built byte by byte from the documented format (a sequence number above 2^32, salts
/// with the top bit set, payloads of every length mod 8, a segment end) opens cleanly, keeps
/// its three checkpoints with their metadata and delivers every record.
#[test]
fn a_log_built_from_the_documented_format_opens_and_delivers() {
    let tmp = tempfile::tempdir().unwrap();
    let (segs, recs) = crafted_segments();
    write_crafted(tmp.path(), "crafted", &segs);
    let v = walsink::verify(&FsStorage::new(tmp.path()).unwrap()).unwrap();
    assert!(v.ok, "verify: {:?}", v.problems);
    assert_eq!(v.records, recs.len() as u64);
    let (wal, report) = WalSink::open(tmp.path(), crafted_opts()).unwrap();
    assert!(report.torn_tail.is_none(), "{:?}", report.torn_tail);
    assert!(report.corruption.is_none(), "{:?}", report.corruption);
    assert_eq!(report.pending, vec![5, 7, 9]);
    assert_eq!(report.last_checkpoint, Some(9));
    assert_eq!(report.last_metadata.as_deref(), Some(&b"m9 metadata"[..]));
    assert_eq!(report.next_checkpoint_id, 10);
    wal.checkpoint_complete(9).unwrap();
    let mut sink = MemorySink::new();
    assert_eq!(wal.deliver_ready(&mut sink).unwrap(), 3);
    assert_eq!(sink.records(), recs);
    assert_eq!(sink.checkpoints(), vec![5, 7, 9]);
    // And the library continues it: a new checkpoint after a reopen.
    wal.append(b"after").unwrap();
    wal.checkpoint(10, b"").unwrap();
    drop(wal);
    let (_wal, report) = WalSink::open(tmp.path(), crafted_opts()).unwrap();
    assert_eq!(report.pending, vec![10]);
}

/// The same log with the header checksum of the newest barrier computed in ways the
/// documented formula does not allow (seq and salt swapped, the offset as u32, big-endian
/// seq): that barrier must not verify, so checkpoint 9 is cut as a torn tail.
#[test]
fn a_header_checksum_computed_otherwise_does_not_verify() {
    let variants: Vec<(&str, HeaderCrc)> = vec![
        (
            "seq and salt swapped",
            Box::new(|seq, salt, off, rest| {
                crc(&[
                    &salt.to_le_bytes(),
                    &seq.to_le_bytes(),
                    &off.to_le_bytes(),
                    rest,
                ])
            }),
        ),
        (
            "offset as u32",
            Box::new(|seq, salt, off, rest| {
                crc(&[
                    &seq.to_le_bytes(),
                    &salt.to_le_bytes(),
                    &(off as u32).to_le_bytes(),
                    rest,
                ])
            }),
        ),
        (
            "big-endian seq",
            Box::new(|seq, salt, off, rest| {
                crc(&[
                    &seq.to_be_bytes(),
                    &salt.to_le_bytes(),
                    &off.to_le_bytes(),
                    rest,
                ])
            }),
        ),
        (
            "without the offset",
            Box::new(|seq, salt, _off, rest| crc(&[&seq.to_le_bytes(), &salt.to_le_bytes(), rest])),
        ),
        ("control: documented", Box::new(header_crc)),
    ];
    for (what, f) in variants {
        let tmp = tempfile::tempdir().unwrap();
        let (segs, recs) = crafted_segments();
        let pos = write_crafted(tmp.path(), "crafted", &segs);
        // Rewrite the checksum of the last frame (barrier 9) in the second segment.
        let (seq, off, kind) = *pos.last().unwrap();
        assert_eq!(kind, 2);
        let p = tmp.path().join(seg_name(seq));
        let mut b = std::fs::read(&p).unwrap();
        let o = off as usize;
        let c = f(seq, segs[1].salt, off, &b[o + 4..o + 16]);
        b[o..o + 4].copy_from_slice(&c.to_le_bytes());
        std::fs::write(&p, b).unwrap();
        let (wal, report) = WalSink::open(tmp.path(), crafted_opts()).unwrap();
        if what.starts_with("control") {
            assert_eq!(report.pending, vec![5, 7, 9], "{what}");
            continue;
        }
        assert_eq!(report.pending, vec![5, 7], "{what}: {report:?}");
        assert!(report.torn_tail.is_some(), "{what}");
        assert!(report.corruption.is_none(), "{what}");
        wal.checkpoint_complete(7).unwrap();
        let mut sink = MemorySink::new();
        wal.deliver_ready(&mut sink).unwrap();
        assert_eq!(sink.records(), recs[..recs.len() - 2].to_vec(), "{what}");
    }
}

/// Damage before a barrier that claims it durable is corruption, found by the search that
/// re-verifies frame headers after the damage under each segment's seed: a bad payload in the
/// first segment, and a damaged header of the second segment (searched with the seed its
/// header still holds).
#[test]
fn damage_before_a_durable_claim_is_found_by_the_header_search() {
    // (a) a flipped payload byte of record 3 in the first segment.
    let tmp = tempfile::tempdir().unwrap();
    let (segs, _) = crafted_segments();
    let pos = write_crafted(tmp.path(), "crafted", &segs);
    let (seq, off, _) = pos[3];
    let p = tmp.path().join(seg_name(seq));
    let mut b = std::fs::read(&p).unwrap();
    b[off as usize + 16] ^= 0x40;
    std::fs::write(&p, &b).unwrap();
    let e = WalSink::open(tmp.path(), crafted_opts()).unwrap_err();
    assert!(
        matches!(e.kind(), ErrorKind::Corruption(_)),
        "payload damage under later durable claims: {e}"
    );
    let (_w, report) = WalSink::open(
        tmp.path(),
        crafted_opts().recovery_mode(RecoveryMode::TruncateAtCorruption),
    )
    .unwrap();
    assert!(report.corruption.is_some());
    assert_eq!(report.checkpoints_dropped, vec![5, 7, 9]);
    assert!(report.next_checkpoint_id >= 10);

    // (b) the second segment's header magic damaged: its barrier still verifies under the
    // seed the header holds (seq from the name, salt at 24..32) and claims durability.
    let tmp = tempfile::tempdir().unwrap();
    let pos = write_crafted(tmp.path(), "crafted", &segs);
    let seq2 = segs[1].seq;
    let p = tmp.path().join(seg_name(seq2));
    let mut b = std::fs::read(&p).unwrap();
    b[0] ^= 0x01;
    std::fs::write(&p, &b).unwrap();
    let e = WalSink::open(tmp.path(), crafted_opts()).unwrap_err();
    assert!(
        matches!(e.kind(), ErrorKind::Corruption(_)),
        "damaged header under a durable claim: {e}"
    );
    let (_w, report) = WalSink::open(
        tmp.path(),
        crafted_opts().recovery_mode(RecoveryMode::TruncateAtCorruption),
    )
    .unwrap();
    assert!(report.corruption.is_some(), "{report:?}");
    assert_eq!(report.checkpoints_dropped, vec![9], "{report:?}");
    assert_eq!(report.pending, vec![5, 7]);
    assert!(pos.iter().any(|p| p.0 == seq2));
}

/// The same search on a log this build wrote: the header of a middle segment damaged; every
/// checkpoint whose barrier lies at or after it is reported dropped (they still verify under
/// their own seeds), and corruption is reported exactly when a later barrier claims data
/// past the damage durable.
#[test]
fn a_damaged_segment_header_in_a_written_log_drops_exactly_the_later_checkpoints() {
    let tmp = tempfile::tempdir().unwrap();
    let opts = || {
        Options::new("hdr")
            .segment_size(4096)
            .max_record_size(1024)
            .max_metadata_size(64)
            .recycle_segments(false)
    };
    {
        let (wal, _) = WalSink::open(tmp.path(), opts()).unwrap();
        for cp in 1..=20u64 {
            for i in 0..9 {
                wal.append(format!("cp {cp} record {i} {}", "y".repeat(60)).as_bytes())
                    .unwrap();
            }
            wal.checkpoint(cp, format!("m{cp}").as_bytes()).unwrap();
        }
    }
    let log = parse_log(tmp.path());
    assert!(log.len() >= 5, "{} segments", log.len());
    let victim = log[log.len() / 2].0;
    // Expected: barriers in segments >= victim are dropped; corruption if one of them
    // claims durable_through beyond (victim, 0).
    let mut dropped = Vec::new();
    let mut claims_past = false;
    for (seq, _, frames, _, _) in &log {
        for f in frames.iter().filter(|f| f.kind == 2) {
            if *seq >= victim {
                dropped.push(le64(&f.payload, 0));
                let dt = (le64(&f.payload, 24), le64(&f.payload, 32));
                if dt > (victim, 0) {
                    claims_past = true;
                }
            }
        }
    }
    let p = tmp.path().join(seg_name(victim));
    let mut b = std::fs::read(&p).unwrap();
    b[3] ^= 0x10;
    std::fs::write(&p, &b).unwrap();
    let (_w, report) = WalSink::open(
        tmp.path(),
        opts().recovery_mode(RecoveryMode::TruncateAtCorruption),
    )
    .unwrap();
    assert_eq!(report.checkpoints_dropped, dropped, "{report:?}");
    assert_eq!(report.corruption.is_some(), claims_past, "{report:?}");
    assert!(report.next_checkpoint_id > *dropped.last().unwrap());
}

/// One segment: a record at 40, a damaged frame header at 72, then nothing (a hole) up to
/// `at`, where a barrier (id 7, `durable_through` its own position) verifies under the
/// documented checksum with the offset as a u64. Recovery's search after the damage must
/// find it and call the damage corruption at 72 (default mode: an error; lenient, below
/// 4 GiB only: checkpoint 7 dropped). Below 4 GiB and above, where a checksum taking the
/// offset as 32 bits differs. (About 30 s: the search reads the 4 GiB hole.)
#[test]
fn the_search_after_damage_verifies_a_barrier_above_4_gib() {
    for at in [1u64 << 20, (1u64 << 32) + 4096] {
        let tmp = tempfile::tempdir().unwrap();
        let seq = 3u64;
        let salt = 0x1234_5678_9ABC_DEF0u64;
        let seg_size = at + (64 << 10);
        write_crafted(tmp.path(), "huge", &[]);
        let f = std::fs::File::create(tmp.path().join(seg_name(seq))).unwrap();
        f.set_len(seg_size).unwrap();
        use std::os::unix::fs::FileExt;
        let mut head = segment_header(seq, salt);
        head.extend(frame(seq, salt, 40, 1, b"one record"));
        assert_eq!(head.len(), 40 + 16 + 16);
        f.write_all_at(&head, 0).unwrap();
        // A frame header that does not verify right after it, at 72 (random bytes).
        f.write_all_at(&[0xA5; 16], 72).unwrap();
        let b = barrier(7, 1, (seq, at), b"far");
        f.write_all_at(&frame(seq, salt, at, 2, &b), at).unwrap();
        drop(f);
        let o = || {
            Options::new("huge")
                .segment_size(seg_size)
                .max_record_size(4096)
                .max_metadata_size(64)
        };
        let r = WalSink::open(tmp.path(), o());
        match r {
            Err(e) => match e.kind() {
                ErrorKind::Corruption(d) => {
                    assert_eq!((d.segment.as_str(), d.offset), (seg_name(seq).as_str(), 72))
                }
                _ => panic!("barrier at {at:#x}: {e}"),
            },
            Ok((_, report)) => panic!(
                "barrier at {at:#x}: damage before a durable claim opened as {:?} / {:?}, \
                 dropped {:?}",
                report.torn_tail, report.corruption, report.checkpoints_dropped
            ),
        }
        if at > 1 << 32 {
            // Lenient recovery would copy the 4 GiB segment aside (allocated): not here.
            continue;
        }
        let (_w, report) = WalSink::open(
            tmp.path(),
            o().recovery_mode(RecoveryMode::TruncateAtCorruption),
        )
        .unwrap();
        assert!(
            report.corruption.is_some(),
            "barrier at {at:#x}: {report:?}"
        );
        assert_eq!(report.checkpoints_dropped, vec![7], "barrier at {at:#x}");
    }
}
