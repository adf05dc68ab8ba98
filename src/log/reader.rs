//! Reading frames back from the log in bounded chunks: the records of a sealed epoch for
//! delivery, and the unsealed tail for inspection. Every frame is verified again on the way
//! out.
//!
//! An epoch is read one chunk at a time (at most [`CHUNK`] bytes, or one frame when a frame is
//! larger), so memory stays bounded whatever the epoch's size, and the same epoch can be read
//! again (a retry, or a sink that makes two passes). An epoch that fits in one chunk is read
//! and verified whole before the sink sees it, as every epoch was before streaming; a larger
//! one is verified chunk by chunk, and its barrier and record count when the last chunk is
//! read, so a sink can meet a read error half-way (see [`Sink`](crate::Sink)).
//!
//! Records are slices of the chunk buffer (no copy per record). Buffers go back to a small
//! [`BufferPool`] once nothing refers to them: a buffer whose pages are already mapped is
//! filled several times faster than a fresh allocation.

use crate::delivery::catalog::EpochInfo;
use crate::error::{CorruptionReason, Error, Result};
use crate::log::format::{self, FrameError, FrameKind, Position, Seed};
use crate::storage::Storage;
use crate::{Epoch, EpochKey};
use bytes::Bytes;
use parking_lot::Mutex;
use std::sync::Arc;

/// The default bound on a chunk ([`Options::read_chunk_size`](crate::Options::read_chunk_size)).
pub(crate) const CHUNK: usize = 8 << 20;

/// Read buffers kept for reuse.
#[derive(Debug, Default)]
pub(crate) struct BufferPool(Mutex<Vec<Vec<u8>>>);

impl BufferPool {
    /// Buffers kept at most: with [`CHUNK`] they bound the pool at 16 MiB.
    const KEEP: usize = 2;

    fn take(&self) -> Vec<u8> {
        self.0.lock().pop().unwrap_or_default()
    }

    /// Takes a buffer back if nothing else refers to it.
    fn give_back(&self, buf: Bytes) {
        if let Ok(m) = buf.try_into_mut() {
            let mut pool = self.0.lock();
            if pool.len() < Self::KEEP && m.capacity() <= 2 * CHUNK {
                pool.push(Vec::from(m));
            }
        }
    }
}

/// Where an epoch's frames are and what must be found there.
#[derive(Debug, Clone)]
pub(crate) struct Extent {
    /// Position of the first frame.
    pub start: Position,
    /// Where the data frames end: the barrier's position, or the end of the valid prefix.
    pub stop: Position,
    /// The barrier expected at `stop` (checkpoint id and record count), if any.
    pub barrier: Option<(u64, u64)>,
    /// Bytes read at once (unless one frame is larger).
    pub chunk: usize,
}

/// One chunk of an epoch: verified data frames in one buffer.
#[derive(Debug, Clone)]
pub(crate) struct RawChunk {
    pub buf: Bytes,
    /// Index in the epoch of the first record.
    pub first: u64,
    /// Records in the chunk.
    pub count: u64,
}

/// Reads one epoch's chunks. Shared by an [`Epoch`](crate::Epoch) and its iterators.
#[derive(Debug)]
pub(crate) struct Reader {
    storage: Arc<dyn Storage>,
    pool: Arc<BufferPool>,
    pub extent: Extent,
    /// The first read failure handed to a sink, kept for the committer: a sink turns it into
    /// its own error, and the committer reports the log's instead.
    failure: Mutex<Option<Error>>,
}

/// Where the next chunk of an epoch starts.
#[derive(Debug, Clone)]
pub(crate) struct Cursor {
    pos: Position,
    seed: Option<Seed>,
    index: u64,
    done: bool,
}

impl Reader {
    pub fn new(storage: Arc<dyn Storage>, pool: Arc<BufferPool>, extent: Extent) -> Self {
        Reader {
            storage,
            pool,
            extent,
            failure: Mutex::new(None),
        }
    }

    pub fn cursor(&self) -> Cursor {
        Cursor {
            pos: self.extent.start,
            seed: None,
            index: 0,
            done: false,
        }
    }

    pub fn give_back(&self, buf: Bytes) {
        self.pool.give_back(buf);
    }

    /// Remembers a failure handed out (the first one).
    pub fn note_failure(&self, e: &Error) {
        let mut f = self.failure.lock();
        if f.is_none() {
            *f = Some(e.duplicate());
        }
    }

    /// The first read failure a sink was handed, if any.
    pub fn take_failure(&self) -> Option<Error> {
        self.failure.lock().take()
    }

    /// Reads every chunk now (for an epoch small enough to verify whole before delivery).
    pub fn read_all(&self) -> Result<Vec<RawChunk>> {
        let mut cur = self.cursor();
        let mut out = Vec::new();
        while let Some(c) = self.next_chunk(&mut cur)? {
            out.push(c);
        }
        Ok(out)
    }

    /// The next chunk of data frames, or `None` after the last one (once the barrier and the
    /// record count are verified).
    pub fn next_chunk(&self, cur: &mut Cursor) -> Result<Option<RawChunk>> {
        let ext = &self.extent;
        loop {
            if cur.done {
                return Ok(None);
            }
            if cur.pos >= ext.stop {
                self.finish(cur)?;
                cur.done = true;
                return Ok(None);
            }
            let name = format::segment_name(cur.pos.seq);
            let io = |what: &str, e| Error::io(format!("{what} segment {name}"), e);
            let file = self.storage.open(&name).map_err(|e| io("open", e))?;
            let seed = match cur.seed {
                Some(s) => s,
                None => {
                    let header = file
                        .read_range(0, format::SEGMENT_HEADER_LEN)
                        .map_err(|e| io("read", e))?;
                    let seed = format::decode_segment_header(&header, cur.pos.seq)
                        .map_err(|_| Error::corruption(&name, 0, CorruptionReason::BadHeader))?;
                    cur.seed = Some(seed);
                    seed
                }
            };
            // Read up to the barrier in its segment, or the file's end in an earlier one.
            let limit = if cur.pos.seq == ext.stop.seq {
                ext.stop.offset
            } else {
                file.len().map_err(|e| io("stat", e))?
            };
            let left = limit.saturating_sub(cur.pos.offset) as usize;
            let mut want = left.min(ext.chunk);
            let (buf, end, count, next) = loop {
                let mut v = self.pool.take();
                file.read_range_into(cur.pos.offset, want, &mut v)
                    .map_err(|e| io("read", e))?;
                let buf = Bytes::from(v);
                let cut_short = want < left;
                match scan_chunk(&buf, seed, cur.pos, cut_short) {
                    Ok(Scanned::Frames { end, count, next }) => break (buf, end, count, next),
                    Ok(Scanned::NeedMore(size)) => {
                        self.pool.give_back(buf);
                        want = size.min(left).max(want.saturating_add(1).min(left));
                    }
                    Err(e) => {
                        self.pool.give_back(buf);
                        return Err(e);
                    }
                }
            };
            let first = cur.index;
            cur.index += count;
            if next.seq != cur.pos.seq {
                // On to the next segment: its header gives the seed.
                cur.seed = None;
            }
            cur.pos = next;
            if count == 0 {
                self.pool.give_back(buf);
                continue;
            }
            return Ok(Some(RawChunk {
                buf: buf.slice(..end),
                first,
                count,
            }));
        }
    }

    /// At the end of the data frames: the barrier is there and counts what was read.
    fn finish(&self, cur: &Cursor) -> Result<()> {
        let ext = &self.extent;
        let Some((id, records)) = ext.barrier else {
            return Ok(());
        };
        let name = format::segment_name(ext.stop.seq);
        let bad = |reason| Error::corruption(&name, ext.stop.offset, reason);
        let file = self
            .storage
            .open(&name)
            .map_err(|e| Error::io(format!("open segment {name}"), e))?;
        let seed = match cur.seed.filter(|s| s.seq == ext.stop.seq) {
            Some(s) => s,
            None => {
                let header = file
                    .read_range(0, format::SEGMENT_HEADER_LEN)
                    .map_err(|e| Error::io(format!("read segment {name}"), e))?;
                format::decode_segment_header(&header, ext.stop.seq)
                    .map_err(|_| Error::corruption(&name, 0, CorruptionReason::BadHeader))?
            }
        };
        let head = file
            .read_range(ext.stop.offset, format::FRAME_HEADER_LEN)
            .map_err(|e| Error::io(format!("read segment {name}"), e))?;
        let size = format::declared_frame_size(&head, 0).unwrap_or(format::FRAME_HEADER_LEN);
        let frame = file
            .read_range(ext.stop.offset, size)
            .map_err(|e| Error::io(format!("read segment {name}"), e))?;
        let ok = format::decode_frame_in(&frame, seed, ext.stop.offset, 0)
            .ok()
            .filter(|f| f.kind == FrameKind::Barrier)
            .and_then(|f| format::Barrier::decode(f.payload))
            .is_some_and(|b| b.checkpoint == id);
        if !ok {
            return Err(bad(CorruptionReason::BadPayload));
        }
        if cur.index != records {
            return Err(bad(CorruptionReason::IncompleteEpoch {
                checkpoint: id,
                expected: records,
                found: cur.index,
            }));
        }
        Ok(())
    }
}

/// True when the frame at `buf[i..]` does not end inside `buf`: its header is cut off, or
/// the size it declares goes past the end.
fn frame_cut_off(buf: &[u8], i: usize) -> bool {
    i + format::FRAME_HEADER_LEN >= buf.len()
        || format::declared_frame_size(buf, i).is_some_and(|s| i + s > buf.len())
}

/// What one read of a chunk holds.
enum Scanned {
    /// Data frames in `buf[..end]`; the next chunk starts at `next`.
    Frames {
        end: usize,
        count: u64,
        next: Position,
    },
    /// The first frame does not fit: read at least this many bytes.
    NeedMore(usize),
}

/// Verifies the data frames at the start of `buf` (segment bytes from `at` on). `cut_short`:
/// the read stopped before the limit, so a frame cut off at the end continues in the next
/// chunk rather than being torn.
fn scan_chunk(buf: &[u8], seed: Seed, at: Position, cut_short: bool) -> Result<Scanned> {
    let name = || format::segment_name(at.seq);
    let mut i = 0usize;
    let mut count = 0u64;
    // The data frames up to `i`; the next chunk starts right after them.
    let stop_here = |i: usize, count: u64| Scanned::Frames {
        end: i,
        count,
        next: Position {
            seq: at.seq,
            offset: at.offset + i as u64,
        },
    };
    loop {
        let offset = at.offset + i as u64;
        if i == buf.len() && !cut_short {
            // Reached the limit (the barrier, or a segment's end without a segment-end frame).
            return Ok(stop_here(i, count));
        }
        match format::decode_frame_in(buf, seed, at.offset, i) {
            Ok(f) if f.kind == FrameKind::Data => {
                count += 1;
                i += f.size;
            }
            Ok(f) if f.kind == FrameKind::SegmentEnd => {
                return Ok(Scanned::Frames {
                    end: i,
                    count,
                    next: Position::segment_start(at.seq + 1),
                });
            }
            Ok(_) => {
                return Err(Error::corruption(
                    name(),
                    offset,
                    CorruptionReason::BadPayload,
                ))
            }
            // The read stopped inside this frame: it continues in the next chunk.
            Err(
                FrameError::ShortHeader
                | FrameError::Zero
                | FrameError::Bad(CorruptionReason::TornFrame),
            ) if cut_short && frame_cut_off(buf, i) => {
                if i > 0 {
                    return Ok(stop_here(i, count));
                }
                let size = format::declared_frame_size(buf, 0).unwrap_or(format::FRAME_HEADER_LEN);
                return Ok(Scanned::NeedMore(size));
            }
            Err(FrameError::Bad(reason)) => return Err(Error::corruption(name(), offset, reason)),
            Err(_) => {
                return Err(Error::corruption(
                    name(),
                    offset,
                    CorruptionReason::Unwritten,
                ))
            }
        }
    }
}

/// Sealed epoch `e` of the log in `storage`, ready for a sink: read and verified whole now when
/// it fits in one chunk, read chunk by chunk as it is iterated otherwise.
pub(crate) fn load_epoch(
    storage: &Arc<dyn Storage>,
    pool: &Arc<BufferPool>,
    chunk: usize,
    e: &EpochInfo,
    key: EpochKey,
) -> Result<Epoch> {
    let reader = Arc::new(Reader::new(
        storage.clone(),
        pool.clone(),
        Extent {
            start: e.start,
            stop: e.barrier,
            barrier: Some((e.id, e.records)),
            chunk,
        },
    ));
    // Frames take at most a header and 7 bytes of padding more than their payload.
    let span = e.bytes.saturating_add(
        e.records
            .saturating_mul((format::FRAME_HEADER_LEN + 7) as u64),
    );
    let loaded = if span <= chunk as u64 {
        Some(reader.read_all()?)
    } else {
        None
    };
    Ok(Epoch {
        key,
        timestamp_ms: e.timestamp_ms,
        metadata: e.metadata.clone(),
        records: e.records,
        bytes: e.bytes,
        reader,
        loaded,
    })
}

/// The unsealed records between `start` and `stop` (`records` of them, `bytes` of payload, as
/// a scan counted them), as an epoch without a checkpoint: its key's checkpoint is `u64::MAX`.
pub(crate) fn load_tail(
    storage: &Arc<dyn Storage>,
    start: Position,
    stop: Position,
    records: u64,
    bytes: u64,
    key: EpochKey,
) -> Epoch {
    let reader = Arc::new(Reader::new(
        storage.clone(),
        Arc::default(),
        Extent {
            start,
            stop,
            barrier: None,
            chunk: CHUNK,
        },
    ));
    Epoch {
        key,
        timestamp_ms: 0,
        metadata: Bytes::new(),
        records,
        bytes,
        reader,
        loaded: None,
    }
}
