//! walsink-http's integration tests, one binary with one module per behaviour; each module
//! opens with what it proves. `support` holds the log with epochs, the sink, the unique
//! sink ids and the sink error inside a delivery error that the modules share. Every
//! receiver runs in this process, so these need no external server.

mod support;

mod body_reuse;
mod conformance;
mod faults;
mod scripted_answers;
mod tls;
