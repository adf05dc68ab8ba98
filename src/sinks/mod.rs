//! Built-in sinks: a directory of one file per epoch (exactly-once), an in-memory sink
//! for tests that can be told to fail, and a dead-letter log in a directory.

mod dead_letters;
mod dir;
mod memory;

pub use dead_letters::{DirDeadLetters, DEAD_LETTER_EXT};
pub use dir::{CommittedEpoch, DirSink};
pub use memory::MemorySink;
