//! walsink into PostgreSQL, exactly-once.
//!
//! [`PgSink`] is an [`AsyncSink`](walsink_tokio::AsyncSink): each epoch walsink delivers
//! goes into the target table in **one transaction** that also inserts the epoch's commit
//! marker `(sink_id, subtask, checkpoint, metadata)` into a marker table ([`marker`]).
//! `is_committed` reads the marker, so after a crash anywhere (before, during or after the
//! COMMIT, before walsink's own commit store is updated) an epoch is never written twice
//! and never lost.
//!
//! - **Rows** go in with binary `COPY`, streamed chunk by chunk from the log
//!   ([`walsink_tokio::AsyncChunks`]), so an epoch of any size takes bounded memory. A
//!   [`RowMapping`] turns records into rows; the default, [`RawRows`], fills
//!   `(sink_id text, subtask integer, checkpoint bigint, idx bigint, payload bytea)`.
//! - **Two-phase commit** (`mode=2pc`, [`Mode::TwoPhase`]): the same transaction is
//!   `PREPARE`d under a deterministic global id ([`gid`]) and then `COMMIT PREPARED`; a
//!   restarted sink commits the prepared transaction of the epoch it is delivering and rolls
//!   back the others ([`PgSink::roll_back_voided`] after a restore). The age of the oldest
//!   prepared transaction is in [`PgSink::prepared_status`].
//! - **Errors** are classified by SQLSTATE ([`classify_sqlstate`]) into retryable and
//!   permanent [`SinkError`](walsink::SinkError)s carrying the SQLSTATE and the server's
//!   message.
//!
//! `docs/targets/postgres.md` in the repository describes the guarantee, the URL
//! parameters and when to choose which mode.
#![warn(missing_docs)]

pub mod config;
pub mod error;
mod failpoint;
pub mod mapping;
pub mod marker;
pub mod owner;
pub mod pgpass;
#[cfg(feature = "private-cluster")]
pub mod private_cluster;
mod sink;
pub mod table;

/// The [`private_cluster`] under its test-kit name (feature `testkit`), as the tests of this
/// and the other target crates use it.
#[cfg(feature = "testkit")]
pub mod testkit {
    pub use crate::private_cluster::*;
}
pub mod tls;

pub use config::{Config, Mode, SslMode};
pub use error::{classify, classify_sqlstate, sink_error, Class, ConfigError};
pub use mapping::{MapError, RawRows, RowMapping, RowWriter};
pub use marker::{Marker, MarkerTable};
pub use owner::OwnerTable;
pub use sink::{
    class_of, fingerprint, gid, gid_prefix, PgSink, PreparedStatus, PreparedStatusHandle,
    PreparedXact,
};
pub use table::TableName;
