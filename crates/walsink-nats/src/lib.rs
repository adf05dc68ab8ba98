//! walsink target for NATS JetStream: every record is published with
//! `Nats-Msg-Id: SINK:SUBTASK:CHECKPOINT:INDEX` (its position, the same on every delivery),
//! and an epoch counts as delivered only when the stream acknowledged all of its records.
//! A replay after a crash publishes the same ids and the stream drops the ones it holds:
//! effectively-once **within the stream's duplicate window**. Outside it a replayed record
//! can be stored twice; the sink warns and shows it in its [`Status`].
//!
//! ```no_run
//! # async fn f() -> Result<(), Box<dyn std::error::Error>> {
//! use walsink_nats::{Config, NatsSink};
//! let mut sink = NatsSink::new(Config::from_url("nats://127.0.0.1:4222/?stream=ORDERS&subject=orders.in")?)?;
//! sink.connect().await?; // the stream must exist (or add create=true)
//! let status = sink.status(); // readable while a committer owns the sink
//! # Ok(()) }
//! ```
#![warn(missing_docs)]

mod config;
mod error;
mod sink;
#[cfg(feature = "testkit")]
pub mod testkit;

pub use config::{Config, ConfigError};
pub use error::{classify_connect, classify_publish, classify_stream};
pub use sink::{message_id, BeyondWindow, NatsSink, Status, StatusHandle};
