//! walsink-redis's integration tests against the local Redis (and, for `tls`, a private
//! `redis-server`), one binary with one module per behaviour; each module opens with what it
//! proves. `common` holds the conformance harness, the logs, the sinks and the read-back of
//! each mode that the modules share. `tls` needs the `testkit` feature (the README's
//! `--all-features` test command has it).

mod common;

mod conformance;
mod dropped_deliveries;
mod faults;
mod markers;
mod ownership;
mod record_shapes;
mod shared_keys;
#[cfg(feature = "testkit")]
mod tls;
mod transactions;
