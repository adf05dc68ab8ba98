//! [`dump_segment`]: the records of one segment file, read with the format's own decoder
//! (no recovery, nothing changed), each with the checkpoint that sealed it. The command line's
//! `dump --segment` prints what this returns.

use crate::delivery::commit_store::LocalCommitStore;
use crate::error::{CorruptionReason, Damage, Error, ErrorKind, Result};
use crate::log::format::{self, FrameError, FrameKind};
use crate::storage::{self, Storage};
use bytes::Bytes;

/// What a record of one segment is, as far as that segment (and the commit mark) tells.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum SegmentRecordState {
    /// Sealed by a barrier in this segment and covered by the commit mark.
    Committed,
    /// Sealed by a barrier in this segment, not committed.
    Sealed,
    /// Voided by a restore frame in this segment.
    Voided,
    /// After the segment's last control frame: its epoch continues in a later segment (or is
    /// the open epoch).
    Continues,
    /// In a segment without any control frame: which epoch it belongs to is not known from
    /// this segment alone.
    Unknown,
}

impl SegmentRecordState {
    /// Lower-case name, for output.
    pub fn name(self) -> &'static str {
        match self {
            SegmentRecordState::Committed => "committed",
            SegmentRecordState::Sealed => "sealed",
            SegmentRecordState::Voided => "voided",
            SegmentRecordState::Continues => "continues",
            SegmentRecordState::Unknown => "unknown",
        }
    }
}

/// One record of a segment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SegmentRecord {
    /// The checkpoint that sealed it, when a barrier in this segment did.
    pub checkpoint: Option<u64>,
    /// Its index within its epoch, where this segment tells it: records of an epoch that
    /// began in an earlier segment get their index from the barrier's record count.
    pub index: Option<u64>,
    /// What it is.
    pub state: SegmentRecordState,
    /// The record's bytes.
    pub data: Bytes,
}

/// The records of one segment file, in log order, and where its frames stop verifying.
#[derive(Debug, Clone)]
pub struct SegmentDump {
    /// The segment's file name.
    pub segment: String,
    /// Its records, in log order.
    pub records: Vec<SegmentRecord>,
    /// Where the frames stop verifying, if they do before the segment's end (a torn tail if
    /// this is the newest segment of a live or crashed log); frames after it are not read.
    pub damage: Option<Damage>,
}

/// Reads segment `seq` of the log in `storage` and attributes its records to checkpoints,
/// read-only.
///
/// # Errors
/// `Io` when the file cannot be read (naming it), `UnsupportedVersion` for a segment of
/// another format version, and `Corruption` (`BadHeader`) when its header does not verify.
///
/// # Example
/// ```
/// use walsink::{dump_segment, storage::FsStorage, Options, WalSink};
///
/// let dir = tempfile::tempdir()?;
/// let (wal, _) = WalSink::open(dir.path(), Options::new("seg"))?;
/// wal.append(b"a")?;
/// wal.checkpoint(1, b"")?;
/// drop(wal);
/// let d = dump_segment(&FsStorage::new(dir.path())?, 1)?;
/// assert_eq!(d.records[0].checkpoint, Some(1));
/// assert_eq!(&d.records[0].data[..], b"a");
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn dump_segment(storage: &dyn Storage, seq: u64) -> Result<SegmentDump> {
    let name = format::segment_name(seq);
    let file = storage
        .open(&name)
        .map_err(|e| Error::io(format!("open {name} in {}", storage.describe()), e))?;
    let bytes = storage::read_all(&*file)
        .map_err(|e| Error::io(format!("read {name} in {}", storage.describe()), e))?;
    let committed = LocalCommitStore::read(storage).unwrap_or(None);
    walk(&name, seq, &bytes, committed)
}

/// The pure part of [`dump_segment`]: walks the frames of the segment's `bytes`.
fn walk(name: &str, seq: u64, bytes: &[u8], committed: Option<u64>) -> Result<SegmentDump> {
    let seed = match format::decode_segment_header(bytes, seq) {
        Ok(s) => s,
        Err(format::HeaderError::Version(found)) => {
            return Err(ErrorKind::UnsupportedVersion {
                file: name.to_string(),
                found,
                supported: format::FORMAT_VERSION,
            }
            .into())
        }
        Err(format::HeaderError::Bad) => {
            return Err(ErrorKind::Corruption(Damage {
                segment: name.to_string(),
                offset: 0,
                reason: CorruptionReason::BadHeader,
            })
            .into())
        }
    };
    let damage_at = |offset: usize, reason| Damage {
        segment: name.to_string(),
        offset: offset as u64,
        reason,
    };
    // Data frames wait for the control frame that says what they are.
    let mut pending: Vec<Bytes> = Vec::new();
    let mut records = Vec::new();
    let mut at = format::SEGMENT_HEADER_LEN;
    let mut damage = None;
    let mut seen_control = false;
    loop {
        let f = match format::decode_frame(bytes, seed, at) {
            Ok(f) => f,
            Err(FrameError::Zero) => break,
            Err(FrameError::ShortHeader) => {
                damage = Some(damage_at(at, CorruptionReason::TornFrame));
                break;
            }
            Err(FrameError::Bad(reason)) => {
                damage = Some(damage_at(at, reason));
                break;
            }
        };
        match f.kind {
            FrameKind::Data => pending.push(Bytes::copy_from_slice(f.payload)),
            FrameKind::Barrier => {
                let Some(b) = format::Barrier::decode(f.payload) else {
                    damage = Some(damage_at(at, CorruptionReason::BadPayload));
                    break;
                };
                let state = if committed.is_some_and(|c| b.checkpoint <= c) {
                    SegmentRecordState::Committed
                } else {
                    SegmentRecordState::Sealed
                };
                // Records of an epoch that began in an earlier segment are its last ones.
                let first = if seen_control {
                    0
                } else {
                    b.records.saturating_sub(pending.len() as u64)
                };
                for (i, data) in pending.drain(..).enumerate() {
                    records.push(SegmentRecord {
                        checkpoint: Some(b.checkpoint),
                        index: Some(first + i as u64),
                        state,
                        data,
                    });
                }
                seen_control = true;
            }
            FrameKind::Restore => {
                for data in pending.drain(..) {
                    records.push(SegmentRecord {
                        checkpoint: None,
                        index: None,
                        state: SegmentRecordState::Voided,
                        data,
                    });
                }
                seen_control = true;
            }
            FrameKind::SegmentEnd => break,
        }
        at += f.size;
    }
    let state = if seen_control {
        SegmentRecordState::Continues
    } else {
        SegmentRecordState::Unknown
    };
    for (i, data) in pending.drain(..).enumerate() {
        records.push(SegmentRecord {
            checkpoint: None,
            index: seen_control.then_some(i as u64),
            state,
            data,
        });
    }
    Ok(SegmentDump {
        segment: name.to_string(),
        records,
        damage,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::SimStorage;
    use crate::{Options, WalSink};
    use std::sync::Arc;

    fn log_with(epochs: &[(u64, &[&[u8]])], open: &[&[u8]]) -> Arc<SimStorage> {
        let sim = Arc::new(SimStorage::new());
        let (wal, _) = WalSink::open_with_storage(sim.clone(), Options::new("segdump")).unwrap();
        for (id, records) in epochs {
            for r in *records {
                wal.append(r).unwrap();
            }
            wal.checkpoint(*id, b"").unwrap();
        }
        for r in open {
            wal.append(r).unwrap();
        }
        wal.checkpoint_complete(epochs.first().map_or(0, |e| e.0))
            .unwrap();
        wal.deliver_ready(&mut crate::MemorySink::new()).unwrap();
        drop(wal);
        sim
    }

    #[test]
    fn records_are_attributed_to_their_barrier_and_the_mark() {
        let sim = log_with(&[(1, &[b"a", b"b"]), (2, &[b"c"])], &[]);
        let d = dump_segment(&*sim, 1).unwrap();
        let got: Vec<_> = d
            .records
            .iter()
            .map(|r| (r.checkpoint, r.index, r.state, r.data.to_vec()))
            .collect();
        assert_eq!(
            got,
            vec![
                (
                    Some(1),
                    Some(0),
                    SegmentRecordState::Committed,
                    b"a".to_vec()
                ),
                (
                    Some(1),
                    Some(1),
                    SegmentRecordState::Committed,
                    b"b".to_vec()
                ),
                (Some(2), Some(0), SegmentRecordState::Sealed, b"c".to_vec()),
            ]
        );
        assert!(d.damage.is_none());
    }

    #[test]
    fn a_torn_frame_is_reported_as_damage_after_the_records_before_it() {
        let sim = log_with(&[(1, &[b"first"])], &[]);
        let name = format::segment_name(1);
        let file = sim.open(&name).unwrap();
        let mut bytes = storage::read_all(&*file).unwrap();
        let d = walk(&name, 1, &bytes, None).unwrap();
        assert_eq!(d.records.len(), 1);
        // Flip a byte of the first frame's payload: its checksum no longer matches.
        let at = format::SEGMENT_HEADER_LEN + format::FRAME_HEADER_LEN;
        bytes[at] ^= 0xff;
        let d = walk(&name, 1, &bytes, None).unwrap();
        assert!(d.records.is_empty(), "{:?}", d.records);
        let damage = d.damage.expect("damage");
        assert_eq!(damage.offset, format::SEGMENT_HEADER_LEN as u64);
    }

    #[test]
    fn a_bad_header_and_a_missing_file_are_errors() {
        let sim = log_with(&[(1, &[b"x"])], &[]);
        let e = walk("x.wseg", 1, &[0u8; 64], None).unwrap_err();
        assert!(
            matches!(e.kind(), ErrorKind::Corruption(d) if d.reason == CorruptionReason::BadHeader)
        );
        let e = dump_segment(&*sim, 99).unwrap_err();
        assert!(e.to_string().contains(&format::segment_name(99)), "{e}");
    }
}
