//! walsink target for Redis: each epoch is applied in optimistic transactions (`WATCH` on a
//! commit marker, then `MULTI`, the records as native commands and the marker move, `EXEC`),
//! so every record lands in Redis exactly once across crashes, retries and killed
//! connections.
//!
//! ```no_run
//! # async fn f() -> Result<(), Box<dyn std::error::Error>> {
//! use walsink_redis::{Config, RedisSink};
//! let mut sink = RedisSink::new(Config::from_url("redis://127.0.0.1:6379/0?key=orders&mode=list")?)?;
//! sink.connect().await?;
//! // hand `sink` to walsink_tokio::spawn_committer, or wrap it in a BlockingSink
//! # Ok(()) }
//! ```
//!
//! What Redis itself does not promise: the data and the marker are only as durable as the
//! server's persistence. With neither AOF nor RDB a restart of Redis loses both together,
//! and walsink cannot tell: see `docs/targets/redis.md`.
#![warn(missing_docs)]

mod config;
mod error;
pub mod script;
mod sink;

pub use config::{hash_tag, Config, ConfigError, Mode};
pub use error::classify;
pub use sink::{Committed, RedisSink, Stats};
#[doc(hidden)]
pub use sink::{HookPoint, TestHook};
#[cfg(feature = "testkit")]
pub mod testkit;
