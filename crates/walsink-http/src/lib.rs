//! The HTTP target of walsink: each epoch is POSTed in chunks of newline-delimited
//! records, each under `Idempotency-Key: SINK:SUBTASK:CHECKPOINT:CHUNK`.
//!
//! # Guarantee
//! **Effectively-once with a receiver that deduplicates by `Idempotency-Key`**, at-least-once
//! with one that does not. HTTP has no place for a commit marker, so after a crash between
//! a delivery and walsink's commit mark the epoch is POSTed again. The cut into chunks is
//! deterministic ([`chunking`]): the replay sends the same bodies, byte for byte, under the
//! same keys, so a receiver that keeps the first request of each key (and answers 2xx to a
//! repeat) holds every record exactly once.
//!
//! That holds while the chunking settings (`max_records`, `max_bytes`, `newline`) stay the
//! same between the crash and the replay: with other settings the same key names other
//! records. Every request carries them in its `Walsink-Chunk` header
//! (`first=F; count=N; last=BOOL; max_records=R; max_bytes=B; newline=MODE`), so a receiver
//! can refuse a changed cut, or deduplicate by record position instead (records `F..F+N` of
//! checkpoint `CHECKPOINT`), which is correct under any settings.
//!
//! # Delivery
//! An epoch counts as delivered only when every one of its chunks was answered 2xx; the
//! next epoch starts after that, so epochs never overlap. With `concurrency` above 1 the
//! chunks of one epoch are in flight together and may arrive in any order; their keys
//! (and `first=` in `Walsink-Chunk`) give the order. 408, 409, 425, 429, 5xx, connection
//! errors, timeouts and responses that break off are retried (`Retry-After` honoured, in
//! seconds or as a date, up to `retry_after_max`), `retries` times per chunk, and then the
//! epoch fails retryably and the committer retries it with its backoff (chunks already
//! answered are not sent again). Any other status is a permanent error carrying the status
//! and the start of the response body; nothing is skipped.
//!
//! ```no_run
//! # async fn f() -> Result<(), Box<dyn std::error::Error>> {
//! use walsink_http::{Config, HttpSink};
//! let cfg = Config::from_url("http://127.0.0.1:8080/ingest?max_records=500&timeout=5s")?;
//! let sink = HttpSink::new(cfg)?;
//! // Give `sink` to walsink_tokio::spawn_committer, or wrap it in a BlockingSink.
//! # let _ = sink; Ok(()) }
//! ```
#![warn(missing_docs)]

pub mod chunking;
pub mod classify;
mod config;
#[cfg(feature = "receiver")]
pub mod receiver;
mod sink;

pub use config::{
    Config, ConfigError, DEFAULT_CONTENT_TYPE, DEFAULT_MAX_BYTES, DEFAULT_MAX_RECORDS,
    DEFAULT_RETRIES, DEFAULT_RETRY_AFTER_MAX, DEFAULT_TIMEOUT,
};
pub use sink::{
    idempotency_key, BuildError, HttpSink, CONNECT_CHECK_TIMEOUT, IDEMPOTENCY_KEY, WALSINK_CHUNK,
};
