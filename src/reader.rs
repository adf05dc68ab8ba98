//! Reading frames back from the log: the records of a sealed epoch for delivery, and the
//! unsealed tail for inspection. Every frame is verified again on the way out.

use crate::checkpoint::EpochInfo;
use crate::error::{CorruptionReason, Error, Result};
use crate::format::{self, FrameKind, Position};
use crate::sink::{Epoch, EpochKey};
use crate::storage::Storage;
use bytes::Bytes;

/// The bytes of a segment from `base` on, as read for one epoch.
struct Window {
    seed: format::Seed,
    base: u64,
    buf: Bytes,
}

/// Reads segment `seq` from `from` up to `to` (or its end) and its seed.
fn window(storage: &dyn Storage, seq: u64, from: u64, to: Option<u64>) -> Result<Window> {
    let name = format::segment_name(seq);
    let io = |what: &str, e| Error::io(format!("{what} segment {name}"), e);
    let f = storage.open(&name).map_err(|e| io("open", e))?;
    let header = f
        .read_range(0, format::SEGMENT_HEADER_LEN)
        .map_err(|e| io("read", e))?;
    let seed = format::decode_segment_header(&header, seq)
        .map_err(|_| Error::corruption(name.clone(), 0, CorruptionReason::BadHeader))?;
    let len = f.len().map_err(|e| io("stat", e))?;
    let end = to.map_or(len, |t| t.min(len)).max(from);
    let buf = f
        .read_range(from, (end - from) as usize)
        .map_err(|e| io("read", e))?;
    Ok(Window {
        seed,
        base: from,
        buf,
    })
}

/// Collects the data frames from `start` up to `stop` (exclusive) as runs of slices of one
/// buffer per segment, following segment ends. `tail` is how many bytes past `stop` to read
/// too (the barrier frame). Returns the runs, the number of records and the last window.
fn data_runs(
    storage: &dyn Storage,
    start: Position,
    stop: Position,
    tail: u64,
) -> Result<(Vec<Bytes>, u64, Window)> {
    let mut parts = Vec::new();
    let mut count = 0u64;
    let mut pos = start;
    loop {
        let name = format::segment_name(pos.seq);
        let to = (pos.seq == stop.seq).then_some(stop.offset + tail);
        let w = window(storage, pos.seq, pos.offset, to)?;
        let mut at = 0usize;
        let run = at;
        loop {
            let offset = w.base + at as u64;
            if (Position {
                seq: pos.seq,
                offset,
            }) >= stop
            {
                if at > run {
                    parts.push(w.buf.slice(run..at));
                }
                return Ok((parts, count, w));
            }
            match format::decode_frame_in(&w.buf, w.seed, w.base, at) {
                Ok(f) if f.kind == FrameKind::Data => {
                    count += 1;
                    at += f.size;
                }
                Ok(f) if f.kind == FrameKind::SegmentEnd => {
                    if at > run {
                        parts.push(w.buf.slice(run..at));
                    }
                    pos = Position::segment_start(pos.seq + 1);
                    break;
                }
                Ok(_) => {
                    return Err(Error::corruption(
                        name,
                        offset,
                        CorruptionReason::BadPayload,
                    ))
                }
                Err(format::FrameError::Bad(reason)) => {
                    return Err(Error::corruption(name, offset, reason))
                }
                Err(_) => return Err(Error::corruption(name, offset, CorruptionReason::Unwritten)),
            }
        }
    }
}

/// Reads a sealed epoch back, verifying each frame and the barrier; records are slices of
/// one buffer per segment range.
pub(crate) fn load_epoch(storage: &dyn Storage, e: &EpochInfo, key: EpochKey) -> Result<Epoch> {
    let barrier_size = format::frame_size(format::BARRIER_FIXED_LEN + e.metadata.len()) as u64;
    let (parts, count, w) = data_runs(storage, e.start, e.barrier, barrier_size)?;
    let name = format::segment_name(e.barrier.seq);
    let at = (e.barrier.offset - w.base) as usize;
    let ok = format::decode_frame_in(&w.buf, w.seed, w.base, at)
        .ok()
        .filter(|f| f.kind == FrameKind::Barrier)
        .and_then(|f| format::Barrier::decode(f.payload))
        .is_some_and(|b| b.checkpoint == e.id);
    if !ok {
        return Err(Error::corruption(
            name,
            e.barrier.offset,
            CorruptionReason::BadPayload,
        ));
    }
    if count != e.records {
        let reason = CorruptionReason::IncompleteEpoch {
            checkpoint: e.id,
            expected: e.records,
            found: count,
        };
        return Err(Error::corruption(name, e.barrier.offset, reason));
    }
    Ok(Epoch {
        key,
        timestamp_ms: e.timestamp_ms,
        metadata: e.metadata.clone(),
        records: e.records,
        bytes: e.bytes,
        parts,
    })
}

/// Reads the unsealed records between `start` and `stop` as an epoch without a checkpoint
/// (its key's checkpoint is `u64::MAX`).
pub(crate) fn load_tail(
    storage: &dyn Storage,
    start: Position,
    stop: Position,
    key: EpochKey,
) -> Result<Epoch> {
    let (parts, count, _) = data_runs(storage, start, stop, 0)?;
    let mut epoch = Epoch {
        key,
        timestamp_ms: 0,
        metadata: Bytes::new(),
        records: count,
        bytes: 0,
        parts,
    };
    epoch.bytes = epoch.records().map(|r| r.data.len() as u64).sum();
    Ok(epoch)
}
