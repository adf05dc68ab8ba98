//! walsink-cdc's integration tests, one binary with one module per behaviour; each module
//! opens with what it proves. `common` holds the shared server's URL, the admin connection,
//! unique names and `Feed` (a log whose epochs are sealed one by one). The `capture*` modules
//! start private clusters with `wal_level=logical` (walsink-postgres's test kit); the others
//! run against the shared server.

mod common;

mod apply;
mod capture;
mod capture_added;
mod capture_exact;
mod created_key_inserts;
mod guard_skip_and_pipelining;
mod holding_window;
#[cfg(feature = "mysql")]
mod mysql_apply;
mod parse_agrees_with_serde;
mod unguarded_in_order;
mod values_guard_and_reduction;
