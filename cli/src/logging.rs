//! The CLI's `tracing` subscriber: the warnings and events of walsink and its target crates
//! (a NATS epoch beyond the duplicate window, an old prepared transaction, a delivery being
//! retried) on stderr.
//!
//! Which events show is `RUST_LOG`'s choice (`tracing-subscriber`'s `EnvFilter` syntax:
//! `info`, `walsink_nats=debug,warn`); without it, warnings and errors. `--log-format text`
//! (the default) writes one readable line per event, `--log-format json` one JSON object per
//! line for a log collector.

use clap::ValueEnum;
use std::io::IsTerminal;
use tracing_subscriber::EnvFilter;

/// How events are written to stderr (`--log-format`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    /// One readable line per event.
    Text,
    /// One JSON object per line: `timestamp`, `level`, `target`, `fields` (with `message`)
    /// and the spans the event happened in.
    Json,
}

/// The level shown when `RUST_LOG` is not set.
pub const DEFAULT_FILTER: &str = "warn";

/// Installs the subscriber. A `RUST_LOG` that does not parse is named on stderr and the
/// default filter is used instead.
pub fn init(format: LogFormat) {
    let filter = match std::env::var("RUST_LOG") {
        Ok(v) if !v.trim().is_empty() => EnvFilter::try_new(&v).unwrap_or_else(|e| {
            eprintln!("warning: RUST_LOG={v:?} is not a log filter ({e}); showing warnings");
            EnvFilter::new(DEFAULT_FILTER)
        }),
        _ => EnvFilter::new(DEFAULT_FILTER),
    };
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(std::io::stderr);
    // Another subscriber already set (none in this binary) is not an error worth stopping for.
    let _ = match format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder.json().with_current_span(true).try_init(),
    };
}
