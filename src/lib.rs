#![doc = include_str!("../README.md")]
#![warn(missing_docs)]
#![deny(unsafe_op_in_unsafe_fn)]

mod buffer_pool;
mod config;
mod delivery;
mod error;
mod log;
mod redact;
#[cfg(feature = "simulation")]
pub mod simulation;
pub mod sinks;
pub mod storage;
mod wal;

pub use buffer_pool::BufferPool;
pub use config::{validate_sink_id, FullPolicy, Mode, Options, RecoveryMode, RetryPolicy};
pub use delivery::catalog::{
    CheckpointState, DurationHistogram, ErrorCounts, Health, PendingCheckpoint,
    COMMIT_DURATION_BOUNDS,
};
pub use delivery::commit_store::{CommitStore, LocalCommitStore, MemoryCommitStore};
pub use delivery::committer::Committer;
pub use delivery::dead_letter::{DeadLetter, DeadLetters, Origin};
#[cfg(feature = "failpoints")]
pub use delivery::deliverer::fail;
pub use delivery::deliverer::{
    Deliverer, DueMark, Landing, Loaded, MarkOutcome, Next, Pending, Plan, ReadAhead,
    ReadAheadEpoch, Turn, READ_AHEAD_MIN_BYTES,
};
pub use delivery::owner::{decide_claim, Claim, Owner};
pub use delivery::sink::{
    Chunk, ChunkRecords, Chunks, Epoch, EpochKey, IntoChunks, Record, RecordPosition, Records, Sink,
};
pub use error::{CorruptionReason, Damage, Error, ErrorKind, Result, SinkError, SinkErrorClass};
pub use log::format;
pub use log::recover::RecoveryReport;
pub use log::segment_dump::{dump_segment, SegmentDump, SegmentRecord, SegmentRecordState};
pub use log::verify::{
    dump, verify, CheckpointSummary, DumpState, Problem, ProblemKind, VerifyReport,
};
pub use redact::redact_url;
pub use sinks::{DirDeadLetters, DirSink, MemorySink};
pub use wal::{DurablePoint, WalSink};
