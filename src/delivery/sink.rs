//! The [`Sink`] trait: where the committer delivers sealed, completed epochs.

use crate::buffer_pool::BufferPool;
use crate::delivery::catalog::EpochInfo;
use crate::error::Result;
use crate::error::SinkError;
use crate::log::format::{self, Position};
use crate::log::reader::{read_pool, Barrier, Cursor, Extent, RawChunk, Reader, CHUNK};
use crate::storage::Storage;
use bytes::Bytes;
use std::sync::Arc;

/// Identifies one epoch across restarts: the stable sink id, the subtask and the checkpoint id.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct EpochKey {
    /// The sink id chosen by the embedder (stored in the log directory).
    pub sink_id: Arc<str>,
    /// The parallel subtask that wrote the epoch.
    pub subtask: u32,
    /// The checkpoint id that sealed the epoch.
    pub checkpoint: u64,
}

/// A record's deterministic position: the same record gets the same position on every
/// delivery, so `(sink_id, subtask, checkpoint, index)` is an idempotency key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct RecordPosition {
    /// The checkpoint id of the record's epoch.
    pub checkpoint: u64,
    /// Index of the record inside the epoch, from 0.
    pub index: u64,
}

/// One sealed epoch handed to a [`Sink`]: its key, checkpoint time and metadata, and a way to
/// read its records.
///
/// Records are read from the log in bounded chunks ([`Epoch::chunks`], or record by record
/// with [`Epoch::records`]), so an epoch of any size is delivered in bounded memory, and the
/// epoch can be read as often as a sink needs (a second pass, a retry). An epoch that fits in
/// one chunk (8 MiB) was read and verified whole before it was handed out; a larger one is
/// verified as it is read, so reading can fail half-way: a sink that meets an `Err` must
/// return an error without committing anything (walsink then reports the log's error, not
/// the sink's, and retries the epoch).
#[derive(Debug, Clone)]
pub struct Epoch {
    pub(crate) key: EpochKey,
    pub(crate) timestamp_ms: u64,
    pub(crate) metadata: Bytes,
    pub(crate) records: u64,
    pub(crate) bytes: u64,
    pub(crate) reader: Arc<Reader>,
    /// The chunks, read and verified before delivery, for an epoch within one chunk.
    pub(crate) loaded: Option<Vec<RawChunk>>,
    /// Indices of records left out (already in the dead-letter log), ascending.
    pub(crate) skip: Skip,
}

/// The records an [`Epoch`] leaves out, and their payload bytes.
#[derive(Debug, Clone, Default)]
pub(crate) struct Skip {
    indices: Arc<[u64]>,
    bytes: u64,
}

impl Skip {
    /// The records `held` names, each as (index, payload length), in any order, for an
    /// epoch of `records` records: each index once, and none the epoch does not have (a
    /// letter of another log under the same sink id and checkpoint), so that the counts of
    /// what is handed over can never go below zero.
    pub(crate) fn new(mut held: Vec<(u64, u64)>, records: u64) -> Skip {
        held.retain(|&(i, _)| i < records);
        held.sort_unstable_by_key(|&(i, _)| i);
        held.dedup_by_key(|&mut (i, _)| i);
        Skip {
            bytes: held.iter().map(|&(_, len)| len).sum(),
            indices: held.into_iter().map(|(i, _)| i).collect(),
        }
    }

    #[inline]
    fn has(&self, index: u64) -> bool {
        !self.indices.is_empty() && self.indices.binary_search(&index).is_ok()
    }

    /// How many of the indices lie in `first..first + count`.
    fn within(&self, first: u64, count: u64) -> u64 {
        if self.indices.is_empty() {
            return 0;
        }
        let lo = self.indices.partition_point(|&i| i < first);
        let hi = self
            .indices
            .partition_point(|&i| i < first.saturating_add(count));
        (hi - lo) as u64
    }
}

impl Epoch {
    /// Sink id, subtask and checkpoint id.
    pub fn key(&self) -> &EpochKey {
        &self.key
    }

    /// The checkpoint id.
    pub fn checkpoint(&self) -> u64 {
        self.key.checkpoint
    }

    /// Checkpoint time, milliseconds since the Unix epoch.
    pub fn timestamp_ms(&self) -> u64 {
        self.timestamp_ms
    }

    /// The metadata blob given to `checkpoint`.
    pub fn metadata(&self) -> &[u8] {
        &self.metadata
    }

    /// Number of records handed to the sink: the records of the epoch, less those left out
    /// ([`Epoch::skipped`]).
    pub fn len(&self) -> u64 {
        self.records - self.skip.indices.len() as u64
    }

    /// True for an epoch without records to deliver.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Total payload bytes of the records handed to the sink.
    pub fn bytes(&self) -> u64 {
        self.bytes.saturating_sub(self.skip.bytes)
    }

    /// Whether a driver hands this epoch to a sink (which keeps its own marker when
    /// `stores_marker`): an epoch with records, and an epoch every record of which is in the
    /// dead-letter log when the sink keeps a marker, so that the target records the checkpoint
    /// as done (without its marker, a log that later resumes from the target would write that
    /// checkpoint again). A log's empty epochs are never handed over.
    pub fn goes_to(&self, stores_marker: bool) -> bool {
        !self.is_empty() || (stores_marker && !self.skipped().is_empty())
    }

    /// Indices of the records left out of this delivery, ascending: records the target
    /// refused for good, already held by the log's dead-letter log (`docs/design.md`, "Dead
    /// letters"). Reading the epoch passes over them; every other record keeps its
    /// position, so positions stay idempotency keys. Empty for almost every epoch.
    pub fn skipped(&self) -> &[u64] {
        &self.skip.indices
    }

    /// The records in append order, in verified chunks of at most 8 MiB (or one record, when
    /// a record is larger). Each call reads the epoch again from the start.
    ///
    /// # Example
    /// ```
    /// # use walsink::{Epoch, Sink, SinkError};
    /// struct CountingSink(u64);
    /// impl Sink for CountingSink {
    ///     fn deliver(&mut self, epoch: &Epoch) -> Result<(), SinkError> {
    ///         for chunk in epoch.chunks() {
    ///             for record in chunk?.records() {
    ///                 self.0 += record.data.len() as u64;
    ///             }
    ///         }
    ///         Ok(())
    ///     }
    /// }
    /// ```
    pub fn chunks(&self) -> Chunks<'_> {
        Chunks {
            epoch: self,
            state: self.first_state(),
        }
    }

    /// Like [`Epoch::chunks`], but owning a handle to the epoch, so the iterator can move
    /// between threads (for example into `spawn_blocking`). Cheap: the epoch's buffers are
    /// shared, not copied.
    pub fn into_chunks(self) -> IntoChunks {
        IntoChunks {
            state: self.first_state(),
            epoch: self,
        }
    }

    /// True when the epoch was read and verified whole before it was handed out, so reading
    /// its chunks never touches the log; false for an epoch larger than one chunk, whose
    /// chunks are read (blocking) as they are iterated.
    pub fn is_loaded(&self) -> bool {
        self.loaded.is_some()
    }

    fn first_state(&self) -> ChunksState {
        match &self.loaded {
            Some(_) => ChunksState::Loaded(0),
            None => ChunksState::Reading(self.reader.cursor()),
        }
    }

    /// The records in append order, each with its position; reads the epoch chunk by chunk
    /// like [`Epoch::chunks`]. An `Err` ends the iteration.
    pub fn records(&self) -> Records<'_> {
        Records {
            chunks: self.chunks(),
            current: None,
            at: 0,
            index: 0,
            failed: false,
        }
    }
}

impl Drop for Epoch {
    fn drop(&mut self) {
        for c in self.loaded.take().unwrap_or_default() {
            self.reader.give_back(c.buf);
        }
    }
}

/// A run of verified records of an [`Epoch`], in one buffer.
#[derive(Debug)]
pub struct Chunk {
    buf: Bytes,
    first: u64,
    count: u64,
    checkpoint: u64,
    reader: Arc<Reader>,
    skip: Skip,
}

impl Chunk {
    /// The records of this chunk in order, each a slice of the chunk's buffer (no copy).
    pub fn records(&self) -> ChunkRecords<'_> {
        ChunkRecords {
            chunk: self,
            at: 0,
            index: self.first,
        }
    }

    /// Records of the chunk handed to the sink (those its epoch leaves out,
    /// [`Epoch::skipped`], do not count).
    pub fn len(&self) -> u64 {
        self.count - self.skip.within(self.first, self.count)
    }

    /// True for a chunk without records to deliver.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Index in the epoch of the chunk's first record (left out or not).
    pub fn first_index(&self) -> u64 {
        self.first
    }
}

impl Drop for Chunk {
    fn drop(&mut self) {
        self.reader.give_back(std::mem::take(&mut self.buf));
    }
}

/// Iterator over the records of a [`Chunk`].
#[derive(Debug)]
pub struct ChunkRecords<'a> {
    chunk: &'a Chunk,
    at: usize,
    index: u64,
}

impl Iterator for ChunkRecords<'_> {
    type Item = Record;

    fn next(&mut self) -> Option<Record> {
        loop {
            let f = crate::log::format::peek_frame(&self.chunk.buf, self.at)?;
            let start = self.at + crate::log::format::FRAME_HEADER_LEN;
            let len = f.payload.len();
            self.at += f.size;
            let index = self.index;
            self.index += 1;
            if self.chunk.skip.has(index) {
                continue;
            }
            let position = RecordPosition {
                checkpoint: self.chunk.checkpoint,
                index,
            };
            let data = self.chunk.buf.slice(start..start + len);
            return Some(Record { position, data });
        }
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        let end = self.chunk.first + self.chunk.count;
        let left =
            (end - self.index - self.chunk.skip.within(self.index, end - self.index)) as usize;
        (left, Some(left))
    }
}

#[derive(Debug)]
enum ChunksState {
    Loaded(usize),
    Reading(Cursor),
    Done,
}

/// Iterator over the chunks of an [`Epoch`]; see [`Epoch::chunks`].
#[derive(Debug)]
pub struct Chunks<'a> {
    epoch: &'a Epoch,
    state: ChunksState,
}

impl Iterator for Chunks<'_> {
    type Item = crate::Result<Chunk>;

    fn next(&mut self) -> Option<crate::Result<Chunk>> {
        next_chunk(self.epoch, &mut self.state)
    }
}

/// Owning iterator over the chunks of an [`Epoch`]; see [`Epoch::into_chunks`].
#[derive(Debug)]
pub struct IntoChunks {
    epoch: Epoch,
    state: ChunksState,
}

impl IntoChunks {
    /// True when the next call to `next` may read the log (a blocking read): the epoch was
    /// too large to be read before delivery. Async code runs such calls off the runtime.
    pub fn reads_log(&self) -> bool {
        matches!(self.state, ChunksState::Reading(_))
    }
}

impl Iterator for IntoChunks {
    type Item = crate::Result<Chunk>;

    fn next(&mut self) -> Option<crate::Result<Chunk>> {
        next_chunk(&self.epoch, &mut self.state)
    }
}

fn next_chunk(epoch: &Epoch, state: &mut ChunksState) -> Option<crate::Result<Chunk>> {
    let reader = &epoch.reader;
    let raw = match state {
        ChunksState::Done => return None,
        ChunksState::Loaded(i) => {
            let raw = epoch.loaded.as_ref()?.get(*i)?;
            *i += 1;
            RawChunk {
                buf: raw.buf.clone(),
                first: raw.first,
                count: raw.count,
            }
        }
        ChunksState::Reading(cursor) => match reader.next_chunk(cursor) {
            Ok(Some(raw)) => raw,
            Ok(None) => {
                *state = ChunksState::Done;
                return None;
            }
            Err(e) => {
                reader.note_failure(&e);
                *state = ChunksState::Done;
                return Some(Err(e));
            }
        },
    };
    Some(Ok(Chunk {
        buf: raw.buf,
        first: raw.first,
        count: raw.count,
        checkpoint: epoch.key.checkpoint,
        reader: reader.clone(),
        skip: epoch.skip.clone(),
    }))
}

/// One record of an epoch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    /// Deterministic position, usable as an idempotency key.
    pub position: RecordPosition,
    /// The record's bytes: a slice of the chunk buffer it was read into (no copy).
    pub data: Bytes,
}

/// Iterator over the records of an [`Epoch`]; see [`Epoch::records`].
#[derive(Debug)]
pub struct Records<'a> {
    chunks: Chunks<'a>,
    current: Option<Chunk>,
    at: usize,
    index: u64,
    failed: bool,
}

impl Iterator for Records<'_> {
    type Item = crate::Result<Record>;

    fn next(&mut self) -> Option<crate::Result<Record>> {
        loop {
            if let Some(c) = &self.current {
                if let Some(f) = crate::log::format::peek_frame(&c.buf, self.at) {
                    let start = self.at + crate::log::format::FRAME_HEADER_LEN;
                    let len = f.payload.len();
                    self.at += f.size;
                    let index = self.index;
                    self.index += 1;
                    if c.skip.has(index) {
                        continue;
                    }
                    let data = c.buf.slice(start..start + len);
                    return Some(Ok(Record {
                        position: RecordPosition {
                            checkpoint: c.checkpoint,
                            index,
                        },
                        data,
                    }));
                }
                self.current = None;
            }
            if self.failed {
                return None;
            }
            match self.chunks.next()? {
                Ok(c) => {
                    self.index = c.first;
                    self.current = Some(c);
                    self.at = 0;
                }
                Err(e) => {
                    self.failed = true;
                    return Some(Err(e));
                }
            }
        }
    }
}

/// A target that sealed, completed epochs are delivered to.
///
/// # Contract
/// - [`Sink::deliver`] is called with epochs strictly in checkpoint order, one at a time,
///   from the committer's thread. An epoch without records is not delivered, except to a
///   sink that stores its marker when every record of the epoch is in the dead-letter log
///   ([`Epoch::goes_to`]): then it gets the epoch empty, to record the marker. Epoch `n + 1` is never delivered before `n` succeeded.
/// - It returns `Ok` only when the whole epoch is durable in the target. An `Err` makes the
///   committer retry the *same* epoch later, with backoff; nothing is skipped.
/// - After a crash, the same epoch (same key, same records, same positions) may be delivered
///   again: between a successful delivery and the commit store recording it, walsink cannot
///   know whether the target has it. Sinks without their own marker must therefore be
///   idempotent per [`RecordPosition`] to be effectively-once.
/// - A sink that stores the commit marker in the target atomically with the data (a file
///   rename, a SQL row in the same transaction) returns `true` from [`Sink::stores_marker`]
///   and answers [`Sink::is_committed`] from the target: then delivery is exactly-once.
/// - A panic in [`Sink::deliver`] or [`Sink::is_committed`] is caught and treated as a
///   permanent error ([`SinkError::from_panic`]): counted and shown in
///   [`Health`](crate::Health), the same epoch retried at the longest backoff. The same sink
///   is called again afterwards, so a panic must leave it (and the target) fit for a second
///   delivery of that epoch, as an error would. A build with `panic = "abort"` aborts instead.
pub trait Sink: Send {
    /// Delivers one epoch durably.
    fn deliver(&mut self, epoch: &Epoch) -> Result<(), SinkError>;

    /// True if the target stores the commit marker atomically with the data. Default false.
    fn stores_marker(&self) -> bool {
        false
    }

    /// For sinks that store the marker: whether the target already holds this epoch. Called
    /// before each delivery. The default answers false.
    fn is_committed(&mut self, key: &EpochKey) -> Result<bool, SinkError> {
        let _ = key;
        Ok(false)
    }
}

impl<S: Sink + ?Sized> Sink for Box<S> {
    fn deliver(&mut self, epoch: &Epoch) -> Result<(), SinkError> {
        (**self).deliver(epoch)
    }
    fn stores_marker(&self) -> bool {
        (**self).stores_marker()
    }
    fn is_committed(&mut self, key: &EpochKey) -> Result<bool, SinkError> {
        (**self).is_committed(key)
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
            barrier: Some(Barrier {
                id: e.id,
                records: e.records,
                frame_size: format::frame_size(format::BARRIER_FIXED_LEN + e.metadata.len()),
            }),
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
        skip: Skip::default(),
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
        read_pool(),
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
        skip: Skip::default(),
    }
}
