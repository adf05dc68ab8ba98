//! Dead letters: where a record goes that the target refused for good, so that the rest of
//! its epoch can be delivered (`docs/design.md`, "Dead letters").
//!
//! Delivery knows only the [`DeadLetters`] trait: before an epoch is handed to the sink, the
//! records the dead-letter log already holds for it are left out ([`Epoch::skipped`]); when
//! the sink answers with a [`SinkErrorClass::Rejected`] error that names a record
//! ([`SinkError::record`]), the record is put into the dead-letter log, durably, and only then
//! is the epoch delivered again without it. A crash between the two delivers the epoch
//! without the record on the next run (the dead-letter log says so); a crash before the put
//! finds the record refused again. So the commit mark never passes a record that is neither
//! in the target nor in the dead-letter log.
//!
//! [`Epoch::skipped`]: crate::Epoch::skipped
//! [`SinkErrorClass::Rejected`]: crate::SinkErrorClass::Rejected
//! [`SinkError::record`]: crate::SinkError::record

use crate::error::Result;
use crate::{EpochKey, SinkErrorClass};
use bytes::Bytes;

/// Where a dead-lettered record came from, when it is not the epoch it was refused in: a
/// record that a redrive delivered again and the target refused again.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Origin {
    /// The sink id of the log that first held the record.
    pub sink_id: String,
    /// Its subtask.
    pub subtask: u32,
    /// The checkpoint of its epoch there.
    pub checkpoint: u64,
    /// Its index in that epoch.
    pub index: u64,
}

/// One record the target refused for good, with where it was and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeadLetter {
    /// Its number in the dead-letter log, from 0 (set by the log when it is put).
    pub seq: u64,
    /// The epoch it was refused in: sink id, subtask, checkpoint.
    pub sink_id: String,
    /// The subtask.
    pub subtask: u32,
    /// The checkpoint.
    pub checkpoint: u64,
    /// Its index in the epoch.
    pub index: u64,
    /// How the target's error was classed (always [`SinkErrorClass::Rejected`] for records
    /// delivery puts here; an operator's skip puts others).
    pub class: SinkErrorClass,
    /// The target's own code (a SQLSTATE, an HTTP status), when it gave one.
    pub code: Option<String>,
    /// What the target said.
    pub message: String,
    /// When it was put, milliseconds since the Unix epoch.
    pub time_ms: u64,
    /// How many times it was refused: 1 the first time, one more after each redrive that the
    /// target refused again.
    pub attempt: u32,
    /// Where it first came from, when it was refused in a redrive.
    pub origin: Option<Origin>,
    /// The record's bytes.
    pub data: Bytes,
}

/// A dead-letter log, for [`WalSink::set_dead_letters`](crate::WalSink::set_dead_letters).
///
/// # Contract
/// - [`DeadLetters::put`] returns `Ok` only when the letter is durable: delivery goes on
///   without the record right after, and the commit mark may then pass it.
/// - [`DeadLetters::held`] answers, for an epoch, every record index put for it, whatever
///   process put it: these records are left out of every later delivery of the epoch.
/// - An error from either stops delivery at the epoch (it is retried, never skipped).
pub trait DeadLetters: Send + Sync + std::fmt::Debug {
    /// The indices of the records of epoch `key` held here, with each one's payload length.
    fn held(&self, key: &EpochKey) -> Result<Vec<(u64, u64)>>;

    /// Stores `letter` durably (its `seq` is assigned here). Fails with
    /// [`ErrorKind::DeadLetterLimit`](crate::ErrorKind::DeadLetterLimit) when the log may hold
    /// no more.
    fn put(&self, letter: DeadLetter) -> Result<()>;
}
