//! The commit-marker table: one row per epoch a sink committed, written in the same InnoDB
//! transaction as the epoch's rows, so the target itself says what it holds.
//!
//! ```sql
//! CREATE TABLE IF NOT EXISTS walsink_markers (
//!     sink_id      VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
//!     subtask      INT UNSIGNED    NOT NULL,
//!     checkpoint   BIGINT UNSIGNED NOT NULL,
//!     metadata     LONGBLOB        NOT NULL,  -- the checkpoint's metadata, as the log sealed it
//!     records      BIGINT UNSIGNED NOT NULL,  -- rows the epoch wrote
//!     committed_at TIMESTAMP(6)    NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
//!     PRIMARY KEY (sink_id, subtask, checkpoint)
//! ) ENGINE=InnoDB;
//! ```
//!
//! The primary key makes the marker the epoch's lock: [`MarkerTable::write`] inserts it
//! *first* in the transaction, so a second delivery of an epoch (after a lost COMMIT
//! acknowledgement, or by a second writer) meets the duplicate key (1062), or waits for the
//! first writer's transaction and then meets it, and the caller rolls back its own
//! transaction instead of writing the rows twice. The sink id's collation is binary, so sink
//! ids that differ only in case stay apart. The table must be InnoDB (transactional): the
//! sink checks its engine when it creates or first uses it.

use crate::table::TableName;
use mysql_async::prelude::Queryable;
use mysql_async::{Conn, Error};
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use walsink::EpochKey;

/// The default name of the marker table.
pub const DEFAULT_TABLE: &str = "walsink_markers";

/// One committed epoch, as the marker table records it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Marker {
    /// The epoch's checkpoint id.
    pub checkpoint: u64,
    /// The checkpoint's metadata.
    pub metadata: Vec<u8>,
    /// Rows the epoch wrote.
    pub records: u64,
    /// When the transaction that wrote the marker ran (the server's clock, microseconds).
    pub committed_at: SystemTime,
}

/// A marker table by name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MarkerTable {
    table: TableName,
}

impl Default for MarkerTable {
    fn default() -> Self {
        MarkerTable::new(TableName::parse(DEFAULT_TABLE, "marker_table").expect("valid name"))
    }
}

impl MarkerTable {
    /// The marker table `table`.
    pub fn new(table: TableName) -> Self {
        MarkerTable { table }
    }

    /// Its name.
    pub fn name(&self) -> &TableName {
        &self.table
    }

    /// The `CREATE TABLE IF NOT EXISTS` statement (idempotent, and safe for two sessions at
    /// once: MySQL serializes DDL on a table name by its metadata lock).
    pub fn create_sql(&self) -> String {
        format!(
            "CREATE TABLE IF NOT EXISTS {} (
                sink_id VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
                subtask INT UNSIGNED NOT NULL,
                checkpoint BIGINT UNSIGNED NOT NULL,
                metadata LONGBLOB NOT NULL,
                records BIGINT UNSIGNED NOT NULL,
                committed_at TIMESTAMP(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
                PRIMARY KEY (sink_id, subtask, checkpoint)
            ) ENGINE=InnoDB",
            self.table
        )
    }

    /// Creates the table if it is missing.
    ///
    /// # Cancel safety
    /// If dropped, the statement may or may not have run; it is idempotent, so call it again.
    pub async fn create(&self, c: &mut Conn) -> Result<(), Error> {
        c.query_drop(self.create_sql()).await
    }

    /// Whether the target holds the epoch `key` (its marker is committed). A consistent
    /// read: it never waits for a transaction that is writing the marker.
    ///
    /// # Cancel safety
    /// Cancel safe: it only reads; call it again.
    pub async fn is_committed(&self, c: &mut Conn, key: &EpochKey) -> Result<bool, Error> {
        let sql = format!(
            "SELECT 1 FROM {} WHERE sink_id = ? AND subtask = ? AND checkpoint = ?",
            self.table
        );
        let row: Option<u8> = c
            .exec_first(sql, (&*key.sink_id, key.subtask, key.checkpoint))
            .await?;
        Ok(row.is_some())
    }

    /// Every committed epoch of `(sink_id, subtask)`, oldest first.
    ///
    /// # Cancel safety
    /// Cancel safe: it only reads; call it again.
    pub async fn committed(
        &self,
        c: &mut Conn,
        sink_id: &str,
        subtask: u32,
    ) -> Result<Vec<Marker>, Error> {
        self.select(c, sink_id, subtask, "ORDER BY checkpoint")
            .await
    }

    /// The newest committed epoch of `(sink_id, subtask)`, with its metadata.
    ///
    /// # Cancel safety
    /// Cancel safe: it only reads; call it again.
    pub async fn latest(
        &self,
        c: &mut Conn,
        sink_id: &str,
        subtask: u32,
    ) -> Result<Option<Marker>, Error> {
        Ok(self
            .select(c, sink_id, subtask, "ORDER BY checkpoint DESC LIMIT 1")
            .await?
            .pop())
    }

    async fn select(
        &self,
        c: &mut Conn,
        sink_id: &str,
        subtask: u32,
        tail: &str,
    ) -> Result<Vec<Marker>, Error> {
        let sql = format!(
            "SELECT checkpoint, metadata, records, CAST(UNIX_TIMESTAMP(committed_at) * 1000000 AS UNSIGNED) \
             FROM {} WHERE sink_id = ? AND subtask = ? {tail}",
            self.table
        );
        let rows: Vec<(u64, Vec<u8>, u64, u64)> = c.exec(sql, (sink_id, subtask)).await?;
        Ok(rows
            .into_iter()
            .map(|(checkpoint, metadata, records, micros)| Marker {
                checkpoint,
                metadata,
                records,
                committed_at: UNIX_EPOCH + Duration::from_micros(micros),
            })
            .collect())
    }

    /// Writes the marker of `key` inside the caller's open transaction, first thing in it.
    /// Returns `false` when the marker is already there (1062, a duplicate key): the epoch is
    /// committed (by an earlier attempt whose acknowledgement was lost, or by a concurrent
    /// writer, whose transaction this call waited for), and the caller must roll back and
    /// write nothing.
    ///
    /// # Cancel safety
    /// If dropped, the marker row may or may not be written inside the caller's transaction;
    /// the caller rolls that transaction back (it must not commit after a dropped call).
    pub async fn write(
        &self,
        tx: &mut Conn,
        key: &EpochKey,
        metadata: &[u8],
        records: u64,
    ) -> Result<bool, Error> {
        let sql = format!(
            "INSERT INTO {} (sink_id, subtask, checkpoint, metadata, records) VALUES (?, ?, ?, ?, ?)",
            self.table
        );
        match tx
            .exec_drop(
                sql,
                (
                    &*key.sink_id,
                    key.subtask,
                    key.checkpoint,
                    metadata,
                    records,
                ),
            )
            .await
        {
            Ok(()) => Ok(true),
            Err(Error::Server(e)) if e.code == 1062 => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Deletes the markers of `(sink_id, subtask)` below checkpoint `below`, keeping the
    /// newer ones (walsink asks only about epochs it has not marked in its own commit store,
    /// and pipe resumes from the newest marker). Returns how many rows went.
    ///
    /// # Cancel safety
    /// If dropped, the statement may or may not have run; it is idempotent, so call it again.
    pub async fn prune(
        &self,
        c: &mut Conn,
        sink_id: &str,
        subtask: u32,
        below: u64,
    ) -> Result<u64, Error> {
        let sql = format!(
            "DELETE FROM {} WHERE sink_id = ? AND subtask = ? AND checkpoint < ?",
            self.table
        );
        c.exec_drop(sql, (sink_id, subtask, below)).await?;
        Ok(c.affected_rows())
    }
}
