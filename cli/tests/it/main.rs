//! The `walsink` binary's integration tests, one binary with one module per behaviour; each
//! module opens with what it proves. `common` holds running the binary, the pipe arguments,
//! the kill loops and the reading of a `dir:` target that the modules share. Tests that need
//! a server run only with `WALSINK_TEST_SERVERS=1` and say they are skipped otherwise; `http`
//! needs the `http` feature and `nats_tls` the `nats` feature (both on by default).

mod common;

mod cdc;
mod cdc_exact_contents;
mod cdc_kill_loop;
mod cli;
mod dead_letters;
mod exactly_once;
mod follow_rotation;
#[cfg(feature = "http")]
mod http;
mod large_epochs;
mod metrics;
mod mysql;
mod nats_pipe;
#[cfg(feature = "nats")]
mod nats_tls;
mod owners;
mod pipe_inputs_and_secrets;
mod postgres;
mod postgres_table_ownership;
mod readme_contract;
mod redis_pipe;
mod redis_tls;
mod reporting;
mod rough_edges;
mod stopping;
