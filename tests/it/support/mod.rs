//! Helpers of the integration tests. `logs` holds what most modules use (and walsink-tokio's
//! Flink scenarios and the failpoint tests include by path); the other modules hold the
//! helpers that several behaviour modules share.

pub mod closed_logs;
pub mod durable_logs;
pub mod frames;
mod logs;

pub use logs::*;
