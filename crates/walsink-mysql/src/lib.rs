//! walsink into MySQL and MariaDB, exactly-once.
//!
//! [`MySqlSink`] is an [`AsyncSink`](walsink_tokio::AsyncSink): each epoch walsink delivers
//! goes into the target table in **one InnoDB transaction** that also inserts the epoch's
//! commit marker `(sink_id, subtask, checkpoint, metadata)` into a marker table ([`marker`]).
//! `is_committed` reads the marker, so after a crash anywhere (before, during or after the
//! COMMIT, before walsink's own commit store is updated) an epoch is never written twice
//! and never lost.
//!
//! - **Rows** go in by `LOAD DATA LOCAL INFILE` streamed from memory (or, with `bulk=insert`
//!   or a server with `local_infile=OFF`, multi-row `INSERT`s) in statements of at most
//!   `batch_size` bytes (16 MiB), capped by the server's `max_allowed_packet`, built chunk by
//!   chunk from the log
//!   ([`walsink_tokio::AsyncChunks`]), so an epoch of any size takes bounded memory. A
//!   [`RowMapping`] turns records into rows; the default, [`RawRows`], fills
//!   `(sink_id, subtask, checkpoint, idx, payload LONGBLOB)`.
//! - **XA** (`mode=xa`, [`Mode::Xa`]): the same transaction as an XA transaction, `XA END`
//!   and `XA PREPARE`d under a deterministic [`Xid`] and then `XA COMMIT`ted; a restarted
//!   sink finds it in `XA RECOVER`, commits the one of the epoch it is delivering and rolls
//!   back the others ([`MySqlSink::roll_back_voided`] after a restore).
//! - **Errors** are classified by the server's error number ([`classify_code`]) into
//!   retryable (1213 deadlock, 1205 lock wait timeout, lost connections…) and permanent
//!   (1146 no such table, 1054 unknown column…) [`SinkError`](walsink::SinkError)s carrying
//!   the number ([`server_code`]) and the server's message.
//!
//! `docs/targets/mysql.md` in the repository describes the guarantee, the URL parameters,
//! the modes and the caveats of MySQL's and MariaDB's XA.
#![warn(missing_docs)]

pub mod config;
mod connect;
pub mod error;
mod failpoint;
pub mod mapping;
pub mod marker;
pub mod owner;
mod sink;
pub mod table;
#[cfg(feature = "testkit")]
pub mod testkit;
pub mod xa;

pub use config::{Bulk, Config, Mode, SslMode};
pub use error::{classify, classify_code, server_code, sink_error, Class, ConfigError};
pub use mapping::{MapError, RawRows, RowMapping, RowWriter};
pub use marker::{Marker, MarkerTable};
/// The client crate, so that users of [`Config::connect`] name the same `Conn`.
pub use mysql_async;
pub use owner::OwnerTable;
pub use sink::{ConnectionId, MySqlSink};
pub use table::TableName;
pub use xa::{fingerprint, Xid};
