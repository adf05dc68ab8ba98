//! walsink-nats's integration tests, one binary with one module per behaviour; each module
//! opens with what it proves. `common` holds the stream per test, the read-back, the log
//! helpers (`log`, `seal`, `numbered`, `epochs`), the hang guard and the cutting proxy.

mod common;

mod dedup_window;
mod delivery;
mod refusals;
mod tls;
