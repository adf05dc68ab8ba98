//! Change data capture through walsink: Debezium change events applied to PostgreSQL exactly
//! once, and a PostgreSQL logical-decoding source that produces them.
//!
//! - [`event`]: the Debezium event model and its parser (with or without the
//!   `schema`/`payload` wrapper; tombstones carry nothing; bad input is a typed error).
//! - [`plan`]: how an epoch's events become a few set-based statements with the same result as
//!   applying them one by one under the position guard (pure, property-tested).
//! - [`CdcSink`]: the [`AsyncSink`](walsink_tokio::AsyncSink): one transaction per epoch with
//!   the commit marker, upserts and deletes by the target table's primary key, truncates, and
//!   the position guard that makes replayed or rewound events change nothing.
//! - [`capture`]: the source: a logical replication slot read with pgoutput through SQL
//!   functions, a snapshot first, and the slot advanced only after the target committed.
//! - [`mysql`] (feature `mysql`): [`MySqlCdcSink`], the same events applied to MySQL or
//!   MariaDB, with the marker, the guard and tombstones in MySQL's SQL.
//! - [`shape`]: a captured table's columns as the replica holds them, and the schema changes
//!   the stream's relation messages show (followed, or refused by name).
//!
//! The guarantees, the guard and the differences from the Debezium JDBC sink are in
//! `docs/targets/cdc.md`.
#![warn(missing_docs)]

mod apply;
pub mod capture;
pub mod check;
mod columns;
pub mod config;
pub mod event;
mod image;
#[cfg(feature = "mysql")]
pub mod mysql;
pub mod pgoutput;
pub mod plan;
mod read;
mod scan;
pub mod shape;

pub use apply::{CdcSink, Stats};
pub use config::Config;
pub use event::{BadEvent, Event, EventError, Op, PositionField};
#[cfg(feature = "mysql")]
pub use mysql::{MySqlCdcConfig, MySqlCdcSink, MySqlCdcStats};
pub use tokio_postgres;
