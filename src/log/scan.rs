//! Recovery: reading a log directory back, finding where its valid prefix ends, and deciding
//! whether the damage after it is a torn tail (cut off) or corruption (an error).
//!
//! The rule is `docs/design.md` ("Recovery"): the first frame that does not verify ends the
//! valid prefix at position `p`. Every control frame records `durable_through`, a position the
//! log was known durable up to when it was written. If any frame that still verifies after `p`
//! claims `durable_through > p`, then `p` was durable and is now damaged: corruption. Otherwise
//! everything from `p` on is what an unfinished sync left: a torn tail.

use crate::delivery::catalog::EpochInfo;
use crate::error::{CorruptionReason, Damage, Error, ErrorKind, Result};
use crate::log::format::{
    self, FrameError, FrameKind, HeaderError, Position, Seed, FRAME_ALIGN, SEGMENT_HEADER_LEN,
};
use crate::log::layout::{
    leading_seq, COMMIT_FILE, DAMAGED_SUFFIX, FREE_EXT, IDENTITY_FILE, LOCK_FILE, RESERVE_FILE,
    SEGMENT_EXT, TMP_SUFFIX,
};
use crate::log::window::Window;
use crate::storage::Storage;
use bytes::Bytes;

/// A sealed epoch as read back from the log: its catalog entry, and how much of it is there.
#[derive(Debug, Clone)]
pub(crate) struct ScannedEpoch {
    /// What the catalog keeps of it.
    pub info: EpochInfo,
    /// Fewer data frames than the barrier claims were found (the front was removed).
    pub partial: bool,
    /// Data frames found for the epoch (equal to `info.records` unless `partial`).
    pub found: u64,
}

/// A control frame of the valid prefix.
#[derive(Debug, Clone)]
pub(crate) enum Event {
    Barrier(ScannedEpoch),
    Restore {
        restored_to: Option<u64>,
    },
    /// An id reservation ([`format::RESERVATION_TIMESTAMP`]): not a checkpoint.
    Reserve(u64),
}

/// Everything a scan of a directory found.
#[derive(Debug, Default)]
pub(crate) struct Scan {
    /// Segment sequence numbers present, ascending.
    pub segments: Vec<u64>,
    /// Free (recycled) segments present that can be reused.
    pub free: Vec<u64>,
    /// Free files holding another segment's frames: removed, never reused.
    pub stale_free: Vec<String>,
    /// Files that are not part of a log.
    pub unexpected: Vec<String>,
    /// Leftover temporary files and damaged segments set aside earlier.
    pub leftovers: Vec<String>,
    /// Control frames of the valid prefix, in log order.
    pub events: Vec<Event>,
    /// End of the last control frame of the valid prefix: the recovery cut.
    pub cut: Position,
    /// True when the frame at `cut` is already a segment end.
    pub cut_is_segment_end: bool,
    /// Seed of the segment holding `cut`.
    pub cut_seed: Option<Seed>,
    /// Unsealed data frames after the cut, and their payload bytes.
    pub tail_records: u64,
    /// Payload bytes of those frames.
    pub tail_bytes: u64,
    /// Bytes the frames after the cut take in the log (headers, padding and segment ends
    /// included), up to the end of the valid prefix.
    pub tail_frame_bytes: u64,
    /// End of the valid prefix.
    pub valid_end: Position,
    /// The first damage, if the prefix did not end cleanly.
    pub damage: Option<(Position, Damage)>,
    /// The largest `durable_through` claimed by a control frame after the damage.
    pub claim_after_damage: Option<Position>,
    /// Checkpoint ids of barriers that verify but lie after the damage.
    pub barriers_after_damage: Vec<u64>,
    /// Highest segment number of any file seen (segments, free, damaged).
    pub max_seq_seen: u64,
    /// `durable_through` of the first control frame of the valid prefix.
    pub first_claim: Option<Position>,
    /// The directory holds a commit mark (`COMMITTED`).
    pub has_commit_mark: bool,
    /// The directory holds an identity file (`WALSINK`).
    pub has_identity: bool,
}

impl Scan {
    /// Checkpoint ids that a later restore frame voided (committed ones are never voided).
    pub fn voided(&self, committed: Option<u64>) -> std::collections::HashSet<u64> {
        let mut seen = Vec::new();
        let mut voided = std::collections::HashSet::new();
        for ev in &self.events {
            match ev {
                Event::Barrier(e) => seen.push(e.info.id),
                Event::Reserve(_) => {}
                Event::Restore { restored_to } => {
                    voided.extend(seen.iter().copied().filter(|&id| {
                        restored_to.is_none_or(|t| id > t) && committed.is_none_or(|c| id > c)
                    }))
                }
            }
        }
        voided
    }

    /// Segments lost from the front of a log in which nothing was ever committed (so nothing
    /// could have been freed): the first control frame claims data durable in a segment
    /// before the oldest one present. (Recovery's own claim reaches back to its cut, so this
    /// holds across restarts.)
    pub fn lost_front(&self, committed: Option<u64>) -> Option<Damage> {
        let first = *self.segments.first()?;
        let claim = self.first_claim?;
        if claim.seq >= first {
            return None;
        }
        // Clean-up frees segments only after a commit: with nothing committed, none was.
        if committed.is_some() {
            return None;
        }
        let seq = first - 1;
        Some(Damage {
            segment: format::segment_name(seq),
            offset: 0,
            reason: CorruptionReason::MissingSegment { seq },
        })
    }

    /// True when the damage lies in data that a completed sync covered.
    pub fn damage_is_durable(&self) -> bool {
        match (&self.damage, self.claim_after_damage) {
            (Some((p, _)), Some(claim)) => claim > *p,
            _ => false,
        }
    }
}

/// The largest segment number a log uses: 2^63 - 1 rolls are never reached, and the numbers
/// after it (`seq + 1`) cannot overflow.
pub(crate) const MAX_SEQ: u64 = u64::MAX >> 1;

/// Reads the directory and scans every segment. Fails only on I/O errors, on files of an
/// unsupported version and on a file numbered above [`MAX_SEQ`]; damage is described in the
/// result.
pub(crate) fn scan(storage: &dyn Storage) -> Result<Scan> {
    let mut scan = Scan::default();
    let names = storage
        .list()
        .map_err(|e| Error::io(format!("list {}", storage.describe()), e))?;
    for name in names {
        if let Some(seq) = format::parse_numbered(&name, SEGMENT_EXT) {
            scan.segments.push(seq);
            scan.max_seq_seen = scan.max_seq_seen.max(seq);
        } else if let Some(seq) = format::parse_numbered(&name, FREE_EXT) {
            scan.free.push(seq);
            scan.max_seq_seen = scan.max_seq_seen.max(seq);
        } else if name.ends_with(DAMAGED_SUFFIX) || name.ends_with(TMP_SUFFIX) {
            if let Some(seq) = leading_seq(&name) {
                scan.max_seq_seen = scan.max_seq_seen.max(seq);
            }
            scan.leftovers.push(name);
        } else if name == COMMIT_FILE {
            scan.has_commit_mark = true;
        } else if name == IDENTITY_FILE {
            scan.has_identity = true;
        } else if name != LOCK_FILE && name != RESERVE_FILE {
            scan.unexpected.push(name);
        }
    }
    if scan.max_seq_seen > MAX_SEQ {
        return Err(Error::io(
            format!("open {}", storage.describe()),
            std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!(
                    "a file numbered {} is there, above the largest segment number a log \
                     uses ({MAX_SEQ}): not a file this log wrote (renamed or made by hand?)",
                    scan.max_seq_seen
                ),
            ),
        ));
    }
    scan.segments.sort_unstable();
    scan.free.sort_unstable();
    // A free file is reused under a new number with a new header. Its old frames never verify
    // again because their checksums cover the old number. That holds only if the file holds
    // its own number's frames: after a rename `.free -> .wseg` whose directory sync failed, a
    // power loss can leave a `K.free` holding segment N's frames, and reusing it as N while
    // the new header is not yet durable could bring them back. Such files are not reused.
    let mut reusable = Vec::with_capacity(scan.free.len());
    for seq in std::mem::take(&mut scan.free) {
        if free_holds_its_own_frames(storage, seq)? {
            reusable.push(seq);
        } else {
            scan.stale_free.push(format::free_name(seq));
        }
    }
    scan.free = reusable;
    scan.unexpected.sort();
    read_prefix(storage, &mut scan)?;
    if scan.damage.is_some() {
        scan_after_damage(storage, &mut scan)?;
    }
    Ok(scan)
}

/// True unless free file `seq` has a header naming another segment.
fn free_holds_its_own_frames(storage: &dyn Storage, seq: u64) -> Result<bool> {
    let name = format::free_name(seq);
    let file = storage
        .open(&name)
        .map_err(|e| Error::io(format!("open {name}"), e))?;
    let header = file
        .read_range(0, format::SEGMENT_HEADER_LEN)
        .map_err(|e| Error::io(format!("read {name}"), e))?;
    Ok(match header.get(16..24) {
        Some(stored) => stored == seq.to_le_bytes() || header.iter().all(|&b| b == 0),
        None => true,
    })
}

/// Walks frames from the first segment until the valid prefix ends.
fn read_prefix(storage: &dyn Storage, scan: &mut Scan) -> Result<()> {
    let Some(&first) = scan.segments.first() else {
        // No segment at all, in a log that exists (its identity file is there): its first open
        // was cut short before the first segment's name was durable, or every segment was
        // lost. The two cannot be told apart, so it is reported as a torn tail ("unwritten":
        // even strict recovery accepts it, as nothing may have been written).
        if scan.has_identity
            || scan.has_commit_mark
            || !scan.free.is_empty()
            || !scan.leftovers.is_empty()
        {
            let seq = scan.max_seq_seen + 1;
            set_damage(
                scan,
                Position { seq, offset: 0 },
                format::segment_name(seq),
                0,
                CorruptionReason::Unwritten,
            );
        }
        return Ok(());
    };
    scan.cut = Position::segment_start(first);
    scan.valid_end = scan.cut;
    let (mut records, mut bytes) = (0u64, 0u64);
    let mut epoch_start: Option<Position> = None;
    let mut first_epoch = true;
    let mut expect = first;
    for (i, &seq) in scan.segments.clone().iter().enumerate() {
        let last = i + 1 == scan.segments.len();
        let name = format::segment_name(seq);
        if seq != expect {
            let pos = Position::segment_start(expect);
            set_damage(
                scan,
                pos,
                format::segment_name(expect),
                0,
                CorruptionReason::MissingSegment { seq: expect },
            );
            return Ok(());
        }
        let mut seg = Window::open(storage, seq)?;
        let seed = match seg.seed(seq) {
            Ok(seed) => seed,
            Err(HeaderError::Version(found)) => {
                return Err(ErrorKind::UnsupportedVersion {
                    file: name,
                    found,
                    supported: format::FORMAT_VERSION,
                }
                .into())
            }
            Err(HeaderError::Bad) if last && seg.zero_from(0)? => {
                // Created but its header never became durable (a roll or an open cut short
                // by a power loss), or a segment whose contents were lost (even the only
                // one, after clean-up freed the others). The two cannot be told apart, so
                // the cut is reported as a torn tail, never passed over in silence. After a
                // clean close or a process kill the header is in the file.
                set_damage(
                    scan,
                    Position { seq, offset: 0 },
                    name,
                    0,
                    CorruptionReason::Unwritten,
                );
                finish_tail(scan, records, bytes);
                return Ok(());
            }
            Err(HeaderError::Bad) => {
                set_damage(
                    scan,
                    Position { seq, offset: 0 },
                    name,
                    0,
                    CorruptionReason::BadHeader,
                );
                return Ok(());
            }
        };
        if i == 0 {
            scan.cut_seed = Some(seed);
        }
        let mut at = SEGMENT_HEADER_LEN;
        loop {
            let pos = Position {
                seq,
                offset: at as u64,
            };
            scan.valid_end = pos;
            let frame = match seg.frame(seed, at as u64)? {
                Ok(f) => f,
                Err(FrameError::Zero)
                    if last && at as u64 + format::FRAME_HEADER_LEN as u64 > seg.len() =>
                {
                    // The file ends within a frame header's length of the last frame.
                    // Segments are created at their full size and roll with room left for a
                    // segment end, so this file was cut short: what stood after this point
                    // is lost, and it is reported.
                    set_damage(scan, pos, name, at as u64, CorruptionReason::TornFrame);
                    finish_tail(scan, records, bytes);
                    return Ok(());
                }
                Err(FrameError::Zero) if last => {
                    finish_tail(scan, records, bytes);
                    return Ok(());
                }
                Err(FrameError::Zero) => {
                    set_damage(scan, pos, name, at as u64, CorruptionReason::Unwritten);
                    finish_tail(scan, records, bytes);
                    return Ok(());
                }
                Err(FrameError::ShortHeader) => {
                    set_damage(scan, pos, name, at as u64, CorruptionReason::TornFrame);
                    finish_tail(scan, records, bytes);
                    return Ok(());
                }
                Err(FrameError::Bad(reason)) => {
                    set_damage(scan, pos, name, at as u64, reason);
                    finish_tail(scan, records, bytes);
                    return Ok(());
                }
            };
            let payload = &seg.buf()[frame.payload.clone()];
            let next = Position {
                seq,
                offset: (at + frame.size) as u64,
            };
            scan.tail_frame_bytes += frame.size as u64;
            match frame.kind {
                FrameKind::Data => {
                    records += 1;
                    bytes += payload.len() as u64;
                    epoch_start.get_or_insert(pos);
                }
                FrameKind::Barrier => {
                    let Some(b) = format::Barrier::decode(payload) else {
                        set_damage(scan, pos, name, at as u64, CorruptionReason::BadPayload);
                        finish_tail(scan, records, bytes);
                        return Ok(());
                    };
                    if b.records < records || (!first_epoch && b.records != records) {
                        let reason = CorruptionReason::IncompleteEpoch {
                            checkpoint: b.checkpoint,
                            expected: b.records,
                            found: records,
                        };
                        return Err(Error::corruption(name, at as u64, reason));
                    }
                    scan.first_claim.get_or_insert(b.durable_through);
                    if b.is_reservation() && records == 0 {
                        scan.events.push(Event::Reserve(b.checkpoint));
                    } else {
                        scan.events.push(Event::Barrier(ScannedEpoch {
                            info: EpochInfo {
                                id: b.checkpoint,
                                timestamp_ms: b.timestamp_ms,
                                metadata: Bytes::copy_from_slice(b.metadata),
                                records: b.records,
                                bytes,
                                start: epoch_start.unwrap_or(pos),
                                barrier: pos,
                            },
                            partial: b.records != records,
                            found: records,
                        }));
                    }
                    (records, bytes, epoch_start, first_epoch) = (0, 0, None, false);
                    scan.tail_frame_bytes = 0;
                    scan.cut = next;
                    scan.cut_is_segment_end = false;
                    scan.cut_seed = Some(seed);
                }
                FrameKind::Restore => {
                    let Some(r) = format::Restore::decode(payload) else {
                        set_damage(scan, pos, name, at as u64, CorruptionReason::BadPayload);
                        finish_tail(scan, records, bytes);
                        return Ok(());
                    };
                    scan.first_claim.get_or_insert(r.durable_through);
                    scan.events.push(Event::Restore {
                        restored_to: r.restored_to,
                    });
                    (records, bytes, epoch_start, first_epoch) = (0, 0, None, false);
                    scan.tail_frame_bytes = 0;
                    scan.cut = next;
                    scan.cut_is_segment_end = false;
                    scan.cut_seed = Some(seed);
                }
                FrameKind::SegmentEnd => {
                    if scan.cut == pos {
                        scan.cut_is_segment_end = true;
                    }
                    scan.valid_end = Position::segment_start(seq + 1);
                    break;
                }
            }
            at += frame.size;
        }
        expect = seq + 1;
        if last {
            // The newest segment ends with a segment end, so the log went on in a segment
            // that is not there: its name was never made durable (a crash during a roll), or
            // it was lost. Either way it is reported as a torn tail.
            let next = Position::segment_start(seq + 1);
            if scan.valid_end == next {
                set_damage(
                    scan,
                    Position {
                        seq: seq + 1,
                        offset: 0,
                    },
                    format::segment_name(seq + 1),
                    0,
                    CorruptionReason::MissingSegment { seq: seq + 1 },
                );
            }
            finish_tail(scan, records, bytes);
        }
    }
    Ok(())
}

fn set_damage(
    scan: &mut Scan,
    pos: Position,
    segment: String,
    offset: u64,
    reason: CorruptionReason,
) {
    scan.damage = Some((
        pos,
        Damage {
            segment,
            offset,
            reason,
        },
    ));
}

fn finish_tail(scan: &mut Scan, records: u64, bytes: u64) {
    scan.tail_records = records;
    scan.tail_bytes = bytes;
    if scan.valid_end != scan.cut {
        scan.cut_is_segment_end = false;
    }
}

/// Looks for frames that still verify after the damage: at every aligned offset of the
/// damaged segment after it, and of every later segment. Each candidate costs one checksum
/// of a 28-byte header before its payload is read, so this stays linear in the bytes scanned.
fn scan_after_damage(storage: &dyn Storage, scan: &mut Scan) -> Result<()> {
    let Some((pos, _)) = scan.damage.clone() else {
        return Ok(());
    };
    for &seq in scan.segments.iter().filter(|&&s| s >= pos.seq) {
        let mut seg = Window::open(storage, seq)?;
        // A damaged header may still hold the seed; frames that verify under it are genuine.
        // Without one, the segment's frames cannot be verified: skip it.
        let Some(seed) = seg.seed(seq).ok().or_else(|| seg.salvage_seed(seq)) else {
            continue;
        };
        let align = FRAME_ALIGN as u64;
        let mut at = if seq == pos.seq {
            (pos.offset + align).max(SEGMENT_HEADER_LEN as u64)
        } else {
            SEGMENT_HEADER_LEN as u64
        };
        while at + format::FRAME_HEADER_LEN as u64 <= seg.len() {
            match seg.frame(seed, at)? {
                Ok(frame) => {
                    let payload = &seg.buf()[frame.payload.clone()];
                    let claim = match frame.kind {
                        FrameKind::Barrier => format::Barrier::decode(payload).map(|b| {
                            scan.barriers_after_damage.push(b.checkpoint);
                            b.durable_through
                        }),
                        FrameKind::Restore => {
                            format::Restore::decode(payload).map(|r| r.durable_through)
                        }
                        _ => None,
                    };
                    if let Some(claim) = claim {
                        scan.claim_after_damage =
                            Some(scan.claim_after_damage.map_or(claim, |c| c.max(claim)));
                    }
                    at += frame.size as u64;
                }
                Err(FrameError::Zero) => at = seg.skip_zeros(at + align)?,
                Err(_) => at += align,
            }
        }
    }
    Ok(())
}
