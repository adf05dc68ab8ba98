//! Reading frames back from the log: the records of a sealed epoch for delivery, and the
//! unsealed tail for inspection. Every frame is verified again on the way out.

use crate::checkpoint::EpochInfo;
use crate::error::{CorruptionReason, Error, Result};
use crate::format::{self, FrameKind, Position};
use crate::sink::{Epoch, EpochKey};
use crate::storage::Storage;
use bytes::Bytes;

/// Collects the data frames from `start` up to `stop` (exclusive) as runs of zero-copy
/// slices, following segment ends. Returns the runs and the number of records.
fn data_runs(
    storage: &dyn Storage,
    start: Position,
    stop: Position,
) -> Result<(Vec<Bytes>, u64, Bytes)> {
    let mut parts = Vec::new();
    let mut count = 0u64;
    let mut pos = start;
    loop {
        let name = format::segment_name(pos.seq);
        let map: Bytes = storage
            .open(&name)
            .and_then(|f| f.map())
            .map_err(|e| Error::io(format!("read segment {name}"), e))?;
        let seed = format::decode_segment_header(&map, pos.seq)
            .map_err(|_| Error::corruption(name.clone(), 0, CorruptionReason::BadHeader))?;
        let mut at = pos.offset as usize;
        let run = at;
        loop {
            if (Position {
                seq: pos.seq,
                offset: at as u64,
            }) >= stop
            {
                if at > run {
                    parts.push(map.slice(run..at));
                }
                return Ok((parts, count, map));
            }
            match format::decode_frame(&map, seed, at) {
                Ok(f) if f.kind == FrameKind::Data => {
                    count += 1;
                    at += f.size;
                }
                Ok(f) if f.kind == FrameKind::SegmentEnd => {
                    if at > run {
                        parts.push(map.slice(run..at));
                    }
                    pos = Position::segment_start(pos.seq + 1);
                    break;
                }
                Ok(_) => {
                    return Err(Error::corruption(
                        name,
                        at as u64,
                        CorruptionReason::BadPayload,
                    ))
                }
                Err(format::FrameError::Bad(reason)) => {
                    return Err(Error::corruption(name, at as u64, reason))
                }
                Err(_) => {
                    return Err(Error::corruption(
                        name,
                        at as u64,
                        CorruptionReason::Unwritten,
                    ))
                }
            }
        }
    }
}

/// Reads a sealed epoch back, verifying each frame and the barrier, as zero-copy slices.
pub(crate) fn load_epoch(storage: &dyn Storage, e: &EpochInfo, key: EpochKey) -> Result<Epoch> {
    let (parts, count, map) = data_runs(storage, e.start, e.barrier)?;
    let name = format::segment_name(e.barrier.seq);
    let at = e.barrier.offset as usize;
    let seed = format::decode_segment_header(&map, e.barrier.seq)
        .map_err(|_| Error::corruption(name.clone(), 0, CorruptionReason::BadHeader))?;
    let ok = format::decode_frame(&map, seed, at)
        .ok()
        .filter(|f| f.kind == FrameKind::Barrier)
        .and_then(|f| format::Barrier::decode(f.payload))
        .is_some_and(|b| b.checkpoint == e.id);
    if !ok {
        return Err(Error::corruption(
            name,
            at as u64,
            CorruptionReason::BadPayload,
        ));
    }
    if count != e.records {
        let reason = CorruptionReason::IncompleteEpoch {
            checkpoint: e.id,
            expected: e.records,
            found: count,
        };
        return Err(Error::corruption(name, at as u64, reason));
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
    let (parts, count, _) = data_runs(storage, start, stop)?;
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
