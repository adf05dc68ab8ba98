//! walsink-mysql's integration tests, one binary with one module per behaviour; each module
//! opens with what it proves. `common` holds what every module shares (the unique names, the
//! logs and epochs, the admin connection). `private_server` and `tls` start private MariaDB
//! servers and so need the `testkit` feature (the README's `--all-features` test command has
//! it); `server` and `faults` run against the shared server.

mod common;

mod faults;
mod ownership;
#[cfg(feature = "testkit")]
mod private_server;
mod server;
#[cfg(feature = "testkit")]
mod tls;
mod typed_mapping;
