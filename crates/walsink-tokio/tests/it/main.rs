//! walsink-tokio's integration tests, one binary with one module per behaviour; each module
//! opens with what it proves. `support` holds the hang guards, the gated simulated disk and
//! the scriptable async sink that several modules share. `conformance_memory` needs the
//! `conformance` feature (the README's `--all-features` test command has it).

mod support;

mod async_handle;
mod blocking_sink;
mod cancel_safety;
#[cfg(feature = "conformance")]
mod conformance_memory;
mod delivery;
mod dropped_futures;
mod flink_scenarios;
mod power_loss_and_faults;
mod read_ahead;
mod runtime_workers;
mod shutdown;
mod sizes_and_budgets;
mod typed_records;
