//! The [`Sink`] trait: where the committer delivers sealed, completed epochs.

use bytes::Bytes;
use std::fmt;
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

/// One sealed epoch handed to a [`Sink`]: its key, checkpoint time and metadata, and its
/// records as slices of the buffers the epoch's byte ranges were read into (one read per
/// segment, no copy per record). Every frame was verified against its checksum before the
/// epoch was handed out.
#[derive(Debug, Clone)]
pub struct Epoch {
    pub(crate) key: EpochKey,
    pub(crate) timestamp_ms: u64,
    pub(crate) metadata: Bytes,
    pub(crate) records: u64,
    pub(crate) bytes: u64,
    /// The buffers the epoch's byte ranges were read into.
    pub(crate) buffers: Vec<Bytes>,
    /// Runs of consecutive verified data frames, each starting at a frame boundary: a buffer
    /// index and a range in it.
    pub(crate) parts: Vec<(usize, std::ops::Range<usize>)>,
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

    /// Number of records.
    pub fn len(&self) -> u64 {
        self.records
    }

    /// True for an epoch without records.
    pub fn is_empty(&self) -> bool {
        self.records == 0
    }

    /// Total payload bytes.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// Gives the read buffers back (for reuse) once nothing else refers to them.
    pub(crate) fn into_buffers(self) -> Vec<Bytes> {
        self.buffers
    }

    /// The records in append order, each with its position.
    pub fn records(&self) -> Records<'_> {
        Records {
            epoch: self,
            part: 0,
            at: 0,
            index: 0,
        }
    }
}

/// One record of an epoch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Record<'a> {
    /// Deterministic position, usable as an idempotency key.
    pub position: RecordPosition,
    /// The record's bytes.
    pub data: &'a [u8],
}

/// Iterator over the records of an [`Epoch`].
#[derive(Debug)]
pub struct Records<'a> {
    epoch: &'a Epoch,
    part: usize,
    at: usize,
    index: u64,
}

impl<'a> Iterator for Records<'a> {
    type Item = Record<'a>;

    fn next(&mut self) -> Option<Record<'a>> {
        loop {
            let (buffer, range) = self.epoch.parts.get(self.part)?;
            let part = &self.epoch.buffers[*buffer][range.clone()];
            match crate::format::peek_frame(part, self.at) {
                Some(f) => {
                    self.at += f.size;
                    let position = RecordPosition {
                        checkpoint: self.epoch.key.checkpoint,
                        index: self.index,
                    };
                    self.index += 1;
                    return Some(Record {
                        position,
                        data: f.payload,
                    });
                }
                None => {
                    self.part += 1;
                    self.at = 0;
                }
            }
        }
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        let left = (self.epoch.records - self.index) as usize;
        (left, Some(left))
    }
}

/// How the committer should treat a sink error.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SinkErrorClass {
    /// A passing failure (timeout, connection refused): retry with exponential backoff.
    Retryable,
    /// A failure that retrying is unlikely to fix (bad credentials, missing table): retried at
    /// the longest backoff so an operator can fix the target; never skipped.
    Permanent,
}

/// An error returned by a [`Sink`].
#[derive(Debug)]
pub struct SinkError {
    class: SinkErrorClass,
    message: String,
    source: Option<Box<dyn std::error::Error + Send + Sync>>,
}

impl SinkError {
    /// A retryable error.
    pub fn retryable(message: impl Into<String>) -> Self {
        SinkError {
            class: SinkErrorClass::Retryable,
            message: message.into(),
            source: None,
        }
    }

    /// A permanent error.
    pub fn permanent(message: impl Into<String>) -> Self {
        SinkError {
            class: SinkErrorClass::Permanent,
            message: message.into(),
            source: None,
        }
    }

    /// Attaches the underlying error.
    pub fn with_source(
        mut self,
        source: impl Into<Box<dyn std::error::Error + Send + Sync>>,
    ) -> Self {
        self.source = Some(source.into());
        self
    }

    /// Retryable or permanent.
    pub fn class(&self) -> SinkErrorClass {
        self.class
    }
}

impl From<std::io::Error> for SinkError {
    fn from(e: std::io::Error) -> Self {
        SinkError::retryable(e.to_string()).with_source(e)
    }
}

impl fmt::Display for SinkError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let class = match self.class {
            SinkErrorClass::Retryable => "retryable",
            SinkErrorClass::Permanent => "permanent",
        };
        write!(f, "{} ({class})", self.message)
    }
}

impl std::error::Error for SinkError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.source.as_deref().map(|e| e as _)
    }
}

/// A target that sealed, completed epochs are delivered to.
///
/// # Contract
/// - [`Sink::deliver`] is called with epochs strictly in checkpoint order, one at a time,
///   from the committer's thread. Epoch `n + 1` is never delivered before `n` succeeded.
/// - It returns `Ok` only when the whole epoch is durable in the target. An `Err` makes the
///   committer retry the *same* epoch later, with backoff; nothing is skipped.
/// - After a crash, the same epoch (same key, same records, same positions) may be delivered
///   again: between a successful delivery and the commit store recording it, walsink cannot
///   know whether the target has it. Sinks without their own marker must therefore be
///   idempotent per [`RecordPosition`] to be effectively-once.
/// - A sink that stores the commit marker in the target atomically with the data (a file
///   rename, a SQL row in the same transaction) returns `true` from [`Sink::stores_marker`]
///   and answers [`Sink::is_committed`] from the target: then delivery is exactly-once.
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
