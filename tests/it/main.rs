//! The core's integration tests, one binary with one module per behaviour. Each module opens
//! with what it proves. Tests that need a cargo feature are in modules compiled only with it
//! (`simulation`); the README's test command (`cargo test --workspace --all-features`) runs
//! them all. The failpoint tests are their own binary (`tests/failpoints.rs`), because an armed
//! failpoint is process-wide and would fail whatever else runs the committer at that moment.

mod support;

mod backward_compatibility;
#[cfg(feature = "simulation")]
mod crash_consistency;
mod damaged_logs;
mod dead_letters;
mod delivery;
mod delivery_bookkeeping;
mod dir_sink;
mod documented_format;
mod durability;
mod durable_buffer;
mod faults;
mod flink_scenarios;
#[cfg(feature = "simulation")]
mod fuzz_targets;
mod group_commit;
mod health_figures;
mod loss_reporting;
#[cfg(feature = "simulation")]
mod model;
mod private_files;
mod read_ahead;
mod readme;
mod recovery;
mod recovery_reports;
mod segment_freeing;
mod segment_release;
mod split_reads;
mod storage_seam;
mod streaming;
mod verify_and_dump;
