//! The segment writer: appends frames to the active segment through a write buffer, rolls to
//! a new (or recycled) segment when it is full, and knows which files a sync must cover.

use crate::log::format::{self, FrameKind, Position, Seed, FRAME_HEADER_LEN, SEGMENT_END_RESERVE};
use crate::storage::{Storage, StorageFile, DIRECT_BLOCK};
use std::io;
use std::sync::Arc;

/// Files a sync must make durable, taken from the writer under its lock and synced outside it.
#[derive(Debug, Default)]
pub(crate) struct SyncSet {
    files: Vec<(String, Arc<dyn StorageFile>)>,
    dir: bool,
}

impl SyncSet {
    /// Syncs every file, then the directory if segments were created or renamed.
    /// Exactly `files.len()` data syncs plus one directory sync when `dir` is set.
    pub fn sync(&self, storage: &dyn Storage) -> Result<(), (String, io::Error)> {
        for (name, f) in &self.files {
            f.sync_data()
                .map_err(|e| (format!("sync segment {name}"), e))?;
        }
        if self.dir {
            storage
                .sync_dir()
                .map_err(|e| (format!("sync directory {}", storage.describe()), e))?;
        }
        storage
            .check_alive()
            .map_err(|e| (format!("check directory {}", storage.describe()), e))
    }

    /// Number of data syncs this set will issue.
    #[cfg(test)]
    pub fn data_syncs(&self) -> usize {
        self.files.len()
    }
}

/// Where a new segment comes from.
pub(crate) enum NewSegment {
    /// Create a file.
    Create,
    /// Rename this free (recycled) segment.
    Recycle(u64),
}

/// The active segment and its write buffer.
///
/// Invariants: `buf` holds the bytes from offset `flushed` on; `flushed + buf.len()` is the
/// next frame's offset and a multiple of the frame alignment; every frame leaves
/// `SEGMENT_END_RESERVE` bytes free before `capacity` for the closing segment end.
#[derive(Debug)]
pub(crate) struct SegmentWriter {
    storage: Arc<dyn Storage>,
    seed: Seed,
    name: String,
    file: Arc<dyn StorageFile>,
    capacity: u64,
    flushed: u64,
    buf: Vec<u8>,
    buf_limit: usize,
    /// The active file has bytes written since its last sync.
    active_dirty: bool,
    /// Earlier segments with unsynced bytes.
    dirty: Vec<(String, Arc<dyn StorageFile>)>,
    /// Segments were created or renamed since the last directory sync.
    dir_dirty: bool,
    /// Write zeros ahead of the data (see [`Self::zero_ahead`]).
    zero_ahead: bool,
    /// Bytes of the active file from its start that have been written (with data or zeros),
    /// so their blocks exist: of a recycled file, up to its first hole.
    written: u64,
    /// The active file's bytes from the start of the block holding `flushed` up to
    /// `flushed`: what a block-aligned write of the buffer must repeat.
    tail: Vec<u8>,
    /// The active file is durable up to here (a sync or a durable write covered it).
    durable_to: u64,
    /// The block-aligned bytes of the last [`Self::write_through`], kept for its allocation.
    scratch: Vec<u8>,
}

/// How far [`SegmentWriter::zero_ahead`] writes zeros past the data at a time.
const ZERO_STEP: u64 = 256 << 10;
static ZEROS: [u8; ZERO_STEP as usize] = [0; ZERO_STEP as usize];

impl SegmentWriter {
    /// Starts the segment with `seed`, created anew or recycled from a free segment.
    pub fn start(
        storage: Arc<dyn Storage>,
        seed: Seed,
        source: NewSegment,
        capacity: u64,
        buf_limit: usize,
    ) -> io::Result<Self> {
        let (name, file, written) = open_segment(&*storage, seed.seq, source, capacity)?;
        let mut buf = Vec::with_capacity(buf_limit + 4096);
        buf.extend_from_slice(&format::encode_segment_header(seed));
        let mut w = SegmentWriter {
            storage,
            seed,
            name,
            file,
            capacity,
            flushed: 0,
            buf,
            buf_limit,
            active_dirty: true,
            dirty: Vec::new(),
            dir_dirty: true,
            zero_ahead: false,
            written,
            tail: Vec::with_capacity(DIRECT_BLOCK),
            durable_to: 0,
            scratch: Vec::new(),
        };
        // The header goes out at once, so a segment file is never seen without one unless
        // a crash dropped it.
        w.flush()?;
        Ok(w)
    }

    /// Keeps zeros written ahead of the data in new segments ([`ZERO_STEP`] at a time), for a
    /// log that syncs after every few frames (durable mode). A new segment's blocks do not
    /// exist until written, and a sync that has to allocate one also writes the file's
    /// extent map: one more disk write in every sync that enters a new 4 KiB block. Zeros
    /// written ahead allocate the blocks in one sync per step instead. The zeros lie past the
    /// end of the log, where a segment reads as unwritten anyway.
    pub fn zero_ahead(mut self, on: bool) -> Self {
        self.zero_ahead = on;
        self
    }

    /// Sequence number of the active segment.
    pub fn seq(&self) -> u64 {
        self.seed.seq
    }

    /// Where the next frame goes.
    pub fn position(&self) -> Position {
        Position {
            seq: self.seed.seq,
            offset: self.flushed + self.buf.len() as u64,
        }
    }

    /// True if a frame with a payload of `len` bytes fits in the active segment.
    pub fn fits(&self, len: usize) -> bool {
        self.position().offset + (format::frame_size(len) + SEGMENT_END_RESERVE) as u64
            <= self.capacity
    }

    /// True if frames with payloads of `lens` bytes go into the write buffer without a write
    /// to the file and without a roll to a new segment: appending them does no I/O.
    pub fn fits_buffered(&self, lens: impl Iterator<Item = usize>) -> bool {
        let total: usize = lens.map(format::frame_size).sum();
        self.buf.len() + total < self.buf_limit
            && self.position().offset + (total + SEGMENT_END_RESERVE) as u64 <= self.capacity
    }

    /// Appends a frame to the active segment, which must have room (see [`Self::fits`]).
    /// Returns the frame's position.
    pub fn append(&mut self, kind: FrameKind, parts: &[&[u8]]) -> io::Result<Position> {
        let pos = self.position();
        format::encode_frame_parts(&mut self.buf, self.seed, pos.offset, kind, parts);
        self.active_dirty = true;
        if self.buf.len() >= self.buf_limit {
            self.flush()?;
        }
        Ok(pos)
    }

    /// Closes the active segment with a segment-end frame and continues in segment `seq + 1`,
    /// salted with `salt`.
    pub fn roll(&mut self, source: NewSegment, salt: u64) -> io::Result<()> {
        let pos = self.position();
        format::encode_frame(
            &mut self.buf,
            self.seed,
            pos.offset,
            FrameKind::SegmentEnd,
            &[],
        );
        self.flush()?;
        let next = Seed {
            seq: self.seed.seq + 1,
            salt,
        };
        let (name, file, written) = open_segment(&*self.storage, next.seq, source, self.capacity)?;
        self.written = written;
        let old_name = std::mem::replace(&mut self.name, name);
        let old_file = std::mem::replace(&mut self.file, file);
        self.dirty.push((old_name, old_file));
        self.seed = next;
        self.flushed = 0;
        self.tail.clear();
        self.durable_to = 0;
        self.buf
            .extend_from_slice(&format::encode_segment_header(next));
        self.active_dirty = true;
        self.dir_dirty = true;
        self.flush()
    }

    /// The caller synced the directory after the active segment was created.
    pub fn dir_synced(&mut self) {
        self.dir_dirty = false;
    }

    /// Writes the buffer to the active file. When there is room, a zeroed frame header goes
    /// with it just past the data, so the end of the log reads as unwritten even in a
    /// recycled file full of stale frames; the next flush overwrites it.
    pub fn flush(&mut self) -> io::Result<()> {
        if self.buf.is_empty() {
            return Ok(());
        }
        let len = self.buf.len();
        let marker = self.flushed + (len + FRAME_HEADER_LEN) as u64 <= self.capacity;
        if marker {
            self.buf.resize(len + FRAME_HEADER_LEN, 0);
        }
        let res = self.file.write_at(self.flushed, &self.buf);
        self.buf.truncate(len);
        res?;
        self.keep_tail();
        self.flushed += len as u64;
        self.buf.clear();
        self.written = self.written.max(self.flushed);
        if self.zero_ahead && self.flushed + ZERO_STEP / 2 > self.written {
            self.write_zeros();
        }
        Ok(())
    }

    /// Updates `tail` for the buffer's bytes about to be counted as flushed.
    fn keep_tail(&mut self) {
        let end = self.flushed + self.buf.len() as u64;
        let block = end - end % DIRECT_BLOCK as u64;
        if block > self.flushed {
            self.tail.clear();
            let from = (block - self.flushed) as usize;
            self.tail.extend_from_slice(&self.buf[from..]);
        } else {
            self.tail.extend_from_slice(&self.buf);
        }
    }

    /// Makes the buffer durable with one [`StorageFile::write_durable`] of the blocks it
    /// touches (the tail of the block before it repeated, zeros after it to the block's end),
    /// when that alone makes everything written durable: nothing flushed since the last sync,
    /// no other segment or directory change to sync, and the blocks already written and
    /// synced (so the write allocates nothing). Returns false, having done nothing, when
    /// that does not hold; then [`Self::take_sync_set`] and a sync do the work.
    pub fn write_through(&mut self) -> io::Result<bool> {
        let end = self.flushed + self.buf.len() as u64;
        let start = self.flushed - self.flushed % DIRECT_BLOCK as u64;
        // The zeroed frame header past the data, as in `flush`, lies inside the write.
        let stop = (end + FRAME_HEADER_LEN as u64).next_multiple_of(DIRECT_BLOCK as u64);
        let eligible = !self.buf.is_empty()
            && self.dirty.is_empty()
            && !self.dir_dirty
            && self.durable_to == self.flushed
            && stop <= self.capacity
            && stop <= self.durable_written()
            && !(self.zero_ahead
                && self.written < self.capacity
                && end + ZERO_STEP / 2 > self.written);
        if !eligible {
            return Ok(false);
        }
        self.scratch.clear();
        self.scratch.extend_from_slice(&self.tail);
        self.scratch.extend_from_slice(&self.buf);
        self.scratch.resize((stop - start) as usize, 0);
        self.file.write_durable(start, &self.scratch)?;
        self.keep_tail();
        self.flushed = end;
        self.buf.clear();
        self.durable_to = end;
        self.active_dirty = false;
        Ok(true)
    }

    /// Bytes of the active file whose blocks are written and durable: of a recycled file,
    /// up to its first hole; of a new one, what the syncs so far covered (data and zeros
    /// written ahead).
    fn durable_written(&self) -> u64 {
        if self.durable_to == self.flushed {
            self.written
        } else {
            self.durable_to
        }
    }

    /// Writes zeros from the end of what is written to a step past the data. A failure is
    /// ignored: the zeros only save work, and the log's own writes report the disk's state.
    fn write_zeros(&mut self) {
        let to = (self.flushed.next_multiple_of(ZERO_STEP) + ZERO_STEP).min(self.capacity);
        let mut at = self.written;
        while at < to {
            let n = (to - at).min(ZERO_STEP);
            if self.file.write_at(at, &ZEROS[..n as usize]).is_err() {
                break;
            }
            at += n;
        }
        self.written = at.max(self.written);
    }

    /// Flushes and takes the set of files that must be synced for everything written so far
    /// to be durable.
    pub fn take_sync_set(&mut self) -> io::Result<SyncSet> {
        self.flush()?;
        let mut files = std::mem::take(&mut self.dirty);
        if self.active_dirty {
            files.push((self.name.clone(), self.file.clone()));
            self.active_dirty = false;
        }
        // The sync about to run covers everything written to the active file (or fails and
        // poisons the log, which then writes nothing more).
        self.durable_to = self.flushed;
        let dir = std::mem::take(&mut self.dir_dirty);
        Ok(SyncSet { files, dir })
    }
}

/// Opens the segment file: its name, the file, and how many bytes from its start are
/// known to have blocks (see [`SegmentWriter::written`]).
fn open_segment(
    storage: &dyn Storage,
    seq: u64,
    source: NewSegment,
    capacity: u64,
) -> io::Result<(String, Arc<dyn StorageFile>, u64)> {
    let name = format::segment_name(seq);
    // Preallocate: a sync that does not have to grow the file is measurably cheaper
    // (docs/benchmarks.md). The size is set without writing, so it costs no bandwidth.
    let (file, written) = match source {
        NewSegment::Create => {
            let f = storage.create(&name)?;
            f.set_len(capacity)?;
            (f, 0)
        }
        NewSegment::Recycle(free) => {
            storage.rename(&format::free_name(free), &name)?;
            let f = storage.open(&name)?;
            // A recycled file has blocks up to its first hole only: it may be shorter than
            // the segment size (the size grew since it was written), or end in a hole (its
            // segment was closed early, as at every open).
            let written = f.data_prefix()?.min(capacity);
            // Only a file with a hole before `capacity` can be shorter than it.
            if written < capacity && f.len()? < capacity {
                f.set_len(capacity)?;
            }
            (f, written)
        }
    };
    // The caller writes the header at once; stale frames of a recycled file stay behind it
    // but never verify, as every frame's checksum covers the segment's seed.
    Ok((name, file, written))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::SimStorage;

    #[test]
    fn roll_closes_segment_and_sync_set_covers_both() {
        let sim = SimStorage::new();
        let mut w = SegmentWriter::start(
            Arc::new(sim.clone()),
            Seed { seq: 1, salt: 5 },
            NewSegment::Create,
            4096,
            1024,
        )
        .unwrap();
        let rec = [7u8; 100];
        let mut n = 0;
        while w.fits(rec.len()) {
            w.append(FrameKind::Data, &[&rec]).unwrap();
            n += 1;
        }
        assert!(n > 10);
        w.roll(NewSegment::Create, 6).unwrap();
        w.append(FrameKind::Data, &[&rec]).unwrap();
        let set = w.take_sync_set().unwrap();
        assert_eq!(set.data_syncs(), 2);
        assert!(set.dir);
        set.sync(&sim).unwrap();
        let snap = sim.snapshot();
        assert!(snap[&format::segment_name(1)].len() <= 4096);
        assert_eq!(w.take_sync_set().unwrap().data_syncs(), 0);
    }
}
