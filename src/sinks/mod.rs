//! Built-in sinks: a directory of one file per epoch (exactly-once) and an in-memory sink
//! for tests that can be told to fail.

mod dir;
mod memory;

pub use dir::{CommittedEpoch, DirSink};
pub use memory::MemorySink;
