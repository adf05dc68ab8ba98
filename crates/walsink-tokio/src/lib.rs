//! walsink for tokio programs.
//!
//! - [`AsyncWal`]: the log handle with async methods that never block a runtime worker:
//!   appends between checkpoints are buffered in place, and everything that waits for the
//!   disk (syncs, checkpoints, restores) runs on the handle's I/O thread (durable mode only,
//!   started by the first durable append) or tokio's blocking pool; calls on a handle stay
//!   in order even when a future is dropped while its work runs.
//! - [`AsyncSink`]: the sink contract with async methods, driven in checkpoint order by an
//!   [`AsyncCommitter`] task (the same protocol steps, [`walsink::Deliverer`], as the
//!   committer thread), or by [`deliver_ready`]. [`BlockingSink`] turns an async sink into a
//!   blocking one for the committer thread and the command-line tool.
//! - [`TypedWal`]: records of any `serde` type, in compact binary ([`Postcard`]) or
//!   [`Json`].
//!
//! The synchronous core, `walsink`, stays free of async and network dependencies.
#![warn(missing_docs)]

mod blocking;
mod committer;
#[cfg(feature = "conformance")]
pub mod conformance;
mod handle;
mod sink;
mod typed;
mod url_error;

pub use blocking::BlockingSink;
pub use committer::{deliver_ready, spawn_committer, AsyncCommitter, ShutdownReport};
pub use handle::AsyncWal;
pub use sink::{AsyncChunks, AsyncSink};
pub use typed::{Codec, DecodeError, Json, Postcard, TypedWal};
pub use url_error::UrlError;
pub use walsink;

/// A task on tokio's blocking pool that panicked or was cancelled, as the crate's error.
pub(crate) fn join_error(e: tokio::task::JoinError) -> walsink::Error {
    walsink::Error::io(
        "a task on tokio's blocking pool",
        std::io::Error::other(e.to_string()),
    )
}
