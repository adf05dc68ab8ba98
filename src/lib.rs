#![doc = include_str!("../README.md")]
#![warn(missing_docs)]
#![deny(unsafe_op_in_unsafe_fn)]

mod checkpoint;
mod commit_store;
mod committer;
mod config;
mod error;
pub mod format;
mod reader;
mod recovery;
mod repair;
mod segment;
pub mod simulation;
mod sink;
pub mod sinks;
pub mod storage;
mod verify;
mod wal;
mod window;

pub use checkpoint::{CheckpointState, Health, PendingCheckpoint};
pub use commit_store::{CommitStore, LocalCommitStore, MemoryCommitStore};
#[cfg(feature = "failpoints")]
pub use committer::fail;
pub use committer::Committer;
pub use config::{validate_sink_id, FullPolicy, Mode, Options, RecoveryMode, RetryPolicy};
pub use error::{CorruptionReason, Error, ErrorKind, Result};
pub use recovery::Damage;
pub use repair::RecoveryReport;
pub use sink::{
    Chunk, ChunkRecords, Chunks, Epoch, EpochKey, Record, RecordPosition, Records, Sink, SinkError,
    SinkErrorClass,
};
pub use sinks::{DirSink, MemorySink};
pub use verify::{dump, verify, CheckpointSummary, DumpState, Problem, VerifyReport};
pub use wal::WalSink;
