//! # walsink
//!
//! A checkpointed, segmented, checksummed write-ahead-log sink. Records are appended to an
//! on-disk log and grouped into epochs by checkpoints; when a checkpoint completes, a
//! committer delivers its epoch to a pluggable [`Sink`] strictly in checkpoint order and
//! records the commit, so a replay after a crash never delivers twice to a target that keeps
//! its own marker, and never loses a checkpointed record.
//!
//! It follows the contract of Flink's write-ahead sink (`invoke` = [`WalSink::append`],
//! `snapshotState` = [`WalSink::checkpoint`], `notifyCheckpointComplete` =
//! [`WalSink::checkpoint_complete`]), without an async runtime. The on-disk format and the
//! protocol are specified in `docs/design.md`.
//!
//! # Example
//! ```
//! use walsink::{DirSink, Options, WalSink};
//! use std::time::Duration;
//!
//! let dir = tempfile::tempdir()?;
//! let (wal, report) = WalSink::open(dir.path().join("wal"), Options::new("orders"))?;
//! assert!(report.pending.is_empty());
//! let committer = wal.spawn_committer(DirSink::new(dir.path().join("out"))?)?;
//!
//! for i in 0..100 {
//!     wal.append(format!("order {i}").as_bytes())?;
//! }
//! wal.checkpoint(1, b"offset=100")?;  // sealed and durable
//! wal.checkpoint_complete(1)?;         // deliverable
//! assert!(wal.wait_committed(1, Duration::from_secs(10)));
//! committer.shutdown();
//!
//! let delivered = DirSink::read_records(dir.path().join("out"))?;
//! assert_eq!(delivered.len(), 100);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
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
mod segment;
pub mod simulation;
mod sink;
pub mod sinks;
pub mod storage;
mod verify;
mod wal;

pub use checkpoint::{CheckpointState, Health, PendingCheckpoint};
pub use commit_store::{CommitStore, LocalCommitStore, MemoryCommitStore};
#[cfg(feature = "failpoints")]
pub use committer::fail;
pub use committer::Committer;
pub use config::{validate_sink_id, FullPolicy, Mode, Options, RecoveryMode, RetryPolicy};
pub use error::{CorruptionReason, Error, ErrorKind, Result};
pub use recovery::Damage;
pub use sink::{Epoch, EpochKey, Record, RecordPosition, Records, Sink, SinkError, SinkErrorClass};
pub use sinks::{DirSink, MemorySink};
pub use verify::{dump, verify, CheckpointSummary, DumpState, Problem, VerifyReport};
pub use wal::{RecoveryReport, WalSink};
