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

use crate::buffer_pool::BufferPool;
use crate::error::{CorruptionReason, Error, Result};
use crate::log::format::{self, FrameError, FrameKind, Position, Seed};
use crate::log::halves;
use crate::storage::{Storage, StorageFile};
use bytes::Bytes;
use parking_lot::Mutex;
use std::sync::Arc;

/// The default bound on a chunk ([`Options::read_chunk_size`](crate::Options::read_chunk_size)).
pub(crate) const CHUNK: usize = 8 << 20;

/// The pool of read buffers: two kept, each at most two chunks large, which bounds it at
/// 16 MiB with the default [`CHUNK`].
pub(crate) fn read_pool() -> Arc<BufferPool> {
    Arc::new(BufferPool::new(2, 2 * CHUNK))
}

/// Where an epoch's frames are and what must be found there.
#[derive(Debug, Clone)]
pub(crate) struct Extent {
    /// Position of the first frame.
    pub start: Position,
    /// Where the data frames end: the barrier's position, or the end of the valid prefix.
    pub stop: Position,
    /// The barrier expected at `stop`, if any.
    pub barrier: Option<Barrier>,
    /// Bytes read at once (unless one frame is larger).
    pub chunk: usize,
}

/// The barrier an epoch's data frames end at: what it must say, and its size on disk.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Barrier {
    /// Checkpoint id.
    pub id: u64,
    /// Records it counts.
    pub records: u64,
    /// Bytes its frame takes (known from the metadata's length).
    pub frame_size: usize,
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

/// Reads one epoch's chunks. Shared by an `Epoch` and its iterators.
#[derive(Debug)]
pub(crate) struct Reader {
    storage: Arc<dyn Storage>,
    pool: Arc<BufferPool>,
    pub extent: Extent,
    /// The first read failure handed to a sink, kept for the committer: a sink turns it into
    /// its own error, and the committer reports the log's instead.
    failure: Mutex<Option<Error>>,
}

/// Where the next chunk of an epoch starts, and the segment being read.
#[derive(Debug, Clone)]
pub(crate) struct Cursor {
    pos: Position,
    /// The segment `pos` is in, once opened: opened, its header read and its length taken
    /// once per segment, not once per chunk.
    seg: Option<OpenSegment>,
    index: u64,
    done: bool,
}

/// A segment opened for reading.
#[derive(Debug, Clone)]
struct OpenSegment {
    seq: u64,
    file: Arc<dyn StorageFile>,
    seed: Seed,
    len: u64,
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
            seg: None,
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

    /// Segment `seq`, opened once per cursor: the file, its seed (from a verified header) and
    /// its length.
    fn segment<'c>(&self, cur: &'c mut Cursor, seq: u64) -> Result<&'c OpenSegment> {
        if cur.seg.as_ref().is_none_or(|s| s.seq != seq) {
            let name = format::segment_name(seq);
            let io = |what: &str, e| Error::io(format!("{what} segment {name}"), e);
            let file = self.storage.open(&name).map_err(|e| io("open", e))?;
            let header = file
                .read_range(0, format::SEGMENT_HEADER_LEN)
                .map_err(|e| io("read", e))?;
            let seed = format::decode_segment_header(&header, seq)
                .map_err(|_| Error::corruption(&name, 0, CorruptionReason::BadHeader))?;
            let len = file.len().map_err(|e| io("stat", e))?;
            cur.seg = Some(OpenSegment {
                seq,
                file,
                seed,
                len,
            });
        }
        Ok(cur.seg.as_ref().expect("opened above"))
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
            let seg = self.segment(cur, cur.pos.seq)?.clone();
            let (file, seed) = (&seg.file, seg.seed);
            let io = |what: &str, e| {
                Error::io(
                    format!("{what} segment {}", format::segment_name(seg.seq)),
                    e,
                )
            };
            // Read up to the barrier in its segment, or the file's end in an earlier one.
            let limit = if cur.pos.seq == ext.stop.seq {
                ext.stop.offset
            } else {
                seg.len
            };
            let left = limit.saturating_sub(cur.pos.offset) as usize;
            let mut want = left.min(ext.chunk);
            let (buf, end, count, next) = loop {
                let mut v = self.pool.take();
                let verified = halves::read_chunk(
                    &**file,
                    seed,
                    cur.pos.offset,
                    want,
                    &mut v,
                    halves::split_min(),
                )
                .map_err(|e| io("read", e))?;
                let buf = Bytes::from(v);
                let cut_short = want < left;
                match scan_chunk(&buf, seed, cur.pos, cut_short, verified) {
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
    fn finish(&self, cur: &mut Cursor) -> Result<()> {
        let ext = &self.extent;
        let Some(Barrier {
            id,
            records,
            frame_size,
        }) = ext.barrier
        else {
            return Ok(());
        };
        let name = format::segment_name(ext.stop.seq);
        let bad = |reason| Error::corruption(&name, ext.stop.offset, reason);
        let seg = self.segment(cur, ext.stop.seq)?;
        let frame = seg
            .file
            .read_range(ext.stop.offset, frame_size)
            .map_err(|e| Error::io(format!("read segment {name}"), e))?;
        let ok = format::decode_frame_in(&frame, seg.seed, ext.stop.offset, 0)
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

/// Verifies the data frames at the start of `buf` (segment bytes from `at` on), from `from`:
/// the bytes and the number of data frames at its start already verified. `cut_short`: the
/// read stopped before the limit, so a frame cut off at the end continues in the next chunk
/// rather than being torn.
fn scan_chunk(
    buf: &[u8],
    seed: Seed,
    at: Position,
    cut_short: bool,
    from: (usize, u64),
) -> Result<Scanned> {
    let name = || format::segment_name(at.seq);
    let (mut i, mut count) = from;
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
