//! Reading frames back from the log: the records of a sealed epoch for delivery, and the
//! unsealed tail for inspection. Every frame is verified again on the way out.
//!
//! Each segment's byte range of an epoch is read with one `pread` into one buffer; records are
//! ranges in it, so there is no copy per record. Buffers come from a [`BufferPool`]: a buffer
//! whose pages are already mapped is filled several times faster than a fresh allocation (for
//! 64 MiB epochs the page faults of a fresh buffer took more than half of delivery's time).

use crate::checkpoint::EpochInfo;
use crate::error::{CorruptionReason, Error, Result};
use crate::format::{self, FrameKind, Position};
use crate::sink::{Epoch, EpochKey};
use crate::storage::Storage;
use bytes::Bytes;
use parking_lot::Mutex;

/// Read buffers kept for reuse between epochs.
#[derive(Debug, Default)]
pub(crate) struct BufferPool(Mutex<Vec<Vec<u8>>>);

impl BufferPool {
    /// Buffers kept at most.
    const KEEP: usize = 4;

    fn take(&self) -> Vec<u8> {
        self.0.lock().pop().unwrap_or_default()
    }

    /// Takes back the buffers of a delivered epoch that nothing else refers to any more.
    pub fn give_back(&self, epoch: Epoch) {
        let mut pool = self.0.lock();
        for b in epoch.into_buffers() {
            if pool.len() >= Self::KEEP {
                break;
            }
            if let Ok(m) = b.try_into_mut() {
                pool.push(Vec::from(m));
            }
        }
    }
}

/// The bytes of a segment from `base` on, as read for one epoch.
struct Window {
    seed: format::Seed,
    base: u64,
    buf: Bytes,
}

/// Reads segment `seq` from `from` up to `to` (or its end) and its seed.
fn window(
    storage: &dyn Storage,
    pool: &BufferPool,
    seq: u64,
    from: u64,
    to: Option<u64>,
) -> Result<Window> {
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
    let mut buf = pool.take();
    f.read_range_into(from, (end - from) as usize, &mut buf)
        .map_err(|e| io("read", e))?;
    Ok(Window {
        seed,
        base: from,
        buf: Bytes::from(buf),
    })
}

/// The data frames from `start` up to `stop` (exclusive), following segment ends.
struct Runs {
    buffers: Vec<Bytes>,
    parts: Vec<(usize, std::ops::Range<usize>)>,
    count: u64,
    /// The last segment's window: its seed and base, and its buffer is `buffers.last()`.
    seed: format::Seed,
    base: u64,
}

/// Collects the data frames from `start` up to `stop` (exclusive). `tail` is how many bytes
/// past `stop` to read too (the barrier frame).
fn data_runs(
    storage: &dyn Storage,
    pool: &BufferPool,
    start: Position,
    stop: Position,
    tail: u64,
) -> Result<Runs> {
    let mut runs = Runs {
        buffers: Vec::new(),
        parts: Vec::new(),
        count: 0,
        seed: format::Seed { seq: 0, salt: 0 },
        base: 0,
    };
    let mut pos = start;
    loop {
        let name = format::segment_name(pos.seq);
        let to = (pos.seq == stop.seq).then_some(stop.offset + tail);
        let w = window(storage, pool, pos.seq, pos.offset, to)?;
        let index = runs.buffers.len();
        (runs.seed, runs.base) = (w.seed, w.base);
        runs.buffers.push(w.buf.clone());
        let mut at = 0usize;
        loop {
            let offset = w.base + at as u64;
            if (Position {
                seq: pos.seq,
                offset,
            }) >= stop
            {
                if at > 0 {
                    runs.parts.push((index, 0..at));
                }
                return Ok(runs);
            }
            match format::decode_frame_in(&w.buf, w.seed, w.base, at) {
                Ok(f) if f.kind == FrameKind::Data => {
                    runs.count += 1;
                    at += f.size;
                }
                Ok(f) if f.kind == FrameKind::SegmentEnd => {
                    if at > 0 {
                        runs.parts.push((index, 0..at));
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

/// Reads a sealed epoch back, verifying each frame and the barrier.
pub(crate) fn load_epoch(
    storage: &dyn Storage,
    pool: &BufferPool,
    e: &EpochInfo,
    key: EpochKey,
) -> Result<Epoch> {
    let barrier_size = format::frame_size(format::BARRIER_FIXED_LEN + e.metadata.len()) as u64;
    let runs = data_runs(storage, pool, e.start, e.barrier, barrier_size)?;
    let name = format::segment_name(e.barrier.seq);
    let last = runs.buffers.last().cloned().unwrap_or_default();
    let at = (e.barrier.offset - runs.base) as usize;
    let ok = format::decode_frame_in(&last, runs.seed, runs.base, at)
        .ok()
        .filter(|f| f.kind == FrameKind::Barrier)
        .and_then(|f| format::Barrier::decode(f.payload))
        .is_some_and(|b| b.checkpoint == e.id);
    drop(last);
    if !ok {
        return Err(Error::corruption(
            name,
            e.barrier.offset,
            CorruptionReason::BadPayload,
        ));
    }
    if runs.count != e.records {
        let reason = CorruptionReason::IncompleteEpoch {
            checkpoint: e.id,
            expected: e.records,
            found: runs.count,
        };
        return Err(Error::corruption(name, e.barrier.offset, reason));
    }
    Ok(Epoch {
        key,
        timestamp_ms: e.timestamp_ms,
        metadata: e.metadata.clone(),
        records: e.records,
        bytes: e.bytes,
        buffers: runs.buffers,
        parts: runs.parts,
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
    let runs = data_runs(storage, &BufferPool::default(), start, stop, 0)?;
    let mut epoch = Epoch {
        key,
        timestamp_ms: 0,
        metadata: Bytes::new(),
        records: runs.count,
        bytes: 0,
        buffers: runs.buffers,
        parts: runs.parts,
    };
    epoch.bytes = epoch.records().map(|r| r.data.len() as u64).sum();
    Ok(epoch)
}
