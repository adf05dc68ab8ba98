//! walsink-postgres's integration tests, one binary with one module per behaviour; each module
//! opens with what it proves. `common` holds the unique names, the raw client, the options and
//! the conformance harness that every module shares, and the cutting proxy. `private_cluster`
//! and `tls` start private clusters and so need the `testkit` feature (the README's
//! `--all-features` test command has it); `server` runs against the shared server.

mod common;

mod dead_letters;

mod ownership;
#[cfg(feature = "testkit")]
mod private_cluster;
mod server;
#[cfg(feature = "testkit")]
mod tls;
