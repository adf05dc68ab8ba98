//! The commit-marker table: one row per epoch a sink committed, written in the same
//! transaction as the epoch's rows, so the target itself says what it holds.
//!
//! ```sql
//! CREATE TABLE IF NOT EXISTS walsink_markers (
//!     sink_id      text        NOT NULL,
//!     subtask      integer     NOT NULL,
//!     checkpoint   bigint      NOT NULL,
//!     metadata     bytea       NOT NULL,   -- the checkpoint's metadata, as the log sealed it
//!     records      bigint      NOT NULL,   -- rows the epoch wrote
//!     committed_at timestamptz NOT NULL DEFAULT now(),
//!     PRIMARY KEY (sink_id, subtask, checkpoint)
//! );
//! ```
//!
//! The primary key makes the marker the epoch's lock: [`MarkerTable::write`] inserts with
//! `ON CONFLICT DO NOTHING` *first* in the transaction, so a second delivery of an epoch
//! (after a lost COMMIT acknowledgement, or by a second writer) finds the marker, or waits
//! for the first writer's transaction and then finds it, and the caller rolls back its own
//! transaction instead of writing the rows twice.
//!
//! Every function takes any [`GenericClient`] (a `Client` or a `Transaction`), so other
//! appliers (the change-data-capture apply path) can write the marker inside transactions of
//! their own. The metadata column holds the checkpoint's metadata so a program can resume
//! from the target when its log was lost (`walsink pipe` does).

use crate::table::TableName;
use std::time::SystemTime;
use tokio_postgres::{Error, GenericClient};
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
    /// When the transaction that wrote the marker ran (the server's clock).
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

fn to_i64(v: u64, what: &str) -> i64 {
    i64::try_from(v).unwrap_or_else(|_| panic!("{what} {v} does not fit PostgreSQL's bigint"))
}

/// Whether `e` is what `CREATE TABLE IF NOT EXISTS` says to the loser of two sessions
/// creating the same table at once: IF NOT EXISTS sees only committed tables, so the second
/// fails on the catalog's unique index (23505 on `pg_type_typname_nsp_index` or
/// `pg_class_relname_nsp_index`), or finds the relation (42P07) or its row type (42710)
/// already there. The caller looks again before taking the table as created.
pub(crate) fn is_creation_race(e: &Error) -> bool {
    e.code()
        .is_some_and(|s| matches!(s.code(), "23505" | "42P07" | "42710"))
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

    /// Creates the table if it is missing (idempotent; concurrent creators are fine: the
    /// loser of the race is told 23505, 42P07 or 42710 by the server, looks again and finds
    /// the table).
    ///
    /// # Cancel safety
    /// If dropped, the statement may or may not have run; it is idempotent, so call it again.
    pub async fn create<C: GenericClient + Sync>(&self, c: &C) -> Result<(), Error> {
        let sql = format!(
            "CREATE TABLE IF NOT EXISTS {} (
                sink_id text NOT NULL,
                subtask integer NOT NULL,
                checkpoint bigint NOT NULL,
                metadata bytea NOT NULL,
                records bigint NOT NULL,
                committed_at timestamptz NOT NULL DEFAULT now(),
                PRIMARY KEY (sink_id, subtask, checkpoint))",
            self.table
        );
        match c.batch_execute(&sql).await {
            Ok(()) => Ok(()),
            // Two sessions creating the table at once: the loser sees the type or the table
            // already there. Look again, so another conflict (a type of that name) is not
            // taken for the table.
            Err(e) if is_creation_race(&e) => {
                let there = c
                    .query_one(
                        "SELECT to_regclass($1) IS NOT NULL",
                        &[&self.table.to_string()],
                    )
                    .await
                    .is_ok_and(|row| row.get::<_, bool>(0));
                if there {
                    Ok(())
                } else {
                    Err(e)
                }
            }
            Err(e) => Err(e),
        }
    }

    /// Whether the target holds the epoch `key` (its marker is committed).
    ///
    /// # Cancel safety
    /// Cancel safe: it only reads; call it again.
    pub async fn is_committed<C: GenericClient + Sync>(
        &self,
        c: &C,
        key: &EpochKey,
    ) -> Result<bool, Error> {
        let sql = format!(
            "SELECT 1 FROM {} WHERE sink_id = $1 AND subtask = $2 AND checkpoint = $3",
            self.table
        );
        let row = c
            .query_opt(
                &sql,
                &[
                    &&*key.sink_id,
                    &(key.subtask as i32),
                    &to_i64(key.checkpoint, "checkpoint"),
                ],
            )
            .await?;
        Ok(row.is_some())
    }

    /// Every committed epoch of `(sink_id, subtask)`, oldest first.
    ///
    /// # Cancel safety
    /// Cancel safe: it only reads; call it again.
    pub async fn committed<C: GenericClient + Sync>(
        &self,
        c: &C,
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
    pub async fn latest<C: GenericClient + Sync>(
        &self,
        c: &C,
        sink_id: &str,
        subtask: u32,
    ) -> Result<Option<Marker>, Error> {
        Ok(self
            .select(c, sink_id, subtask, "ORDER BY checkpoint DESC LIMIT 1")
            .await?
            .pop())
    }

    async fn select<C: GenericClient + Sync>(
        &self,
        c: &C,
        sink_id: &str,
        subtask: u32,
        tail: &str,
    ) -> Result<Vec<Marker>, Error> {
        let sql = format!(
            "SELECT checkpoint, metadata, records, committed_at FROM {} WHERE sink_id = $1 AND subtask = $2 {tail}",
            self.table
        );
        let rows = c.query(&sql, &[&sink_id, &(subtask as i32)]).await?;
        Ok(rows
            .iter()
            .map(|r| Marker {
                checkpoint: r.get::<_, i64>(0) as u64,
                metadata: r.get(1),
                records: r.get::<_, i64>(2) as u64,
                committed_at: r.get(3),
            })
            .collect())
    }

    /// Writes the marker of `key` inside the caller's open transaction `tx`, first thing in
    /// it. Returns `false` when the marker is already there: the epoch is committed (by an
    /// earlier attempt whose acknowledgement was lost, or by a concurrent writer, whose
    /// transaction this call waited for), and the caller must roll back and write nothing.
    ///
    /// # Cancel safety
    /// If dropped, the marker row may or may not be written inside the caller's transaction;
    /// the caller rolls that transaction back (it must not commit after a dropped call).
    pub async fn write<C: GenericClient + Sync>(
        &self,
        tx: &C,
        key: &EpochKey,
        metadata: &[u8],
        records: u64,
    ) -> Result<bool, Error> {
        let sql = format!(
            "INSERT INTO {} (sink_id, subtask, checkpoint, metadata, records) VALUES ($1, $2, $3, $4, $5) ON CONFLICT DO NOTHING",
            self.table
        );
        let n = tx
            .execute(
                &sql,
                &[
                    &&*key.sink_id,
                    &(key.subtask as i32),
                    &to_i64(key.checkpoint, "checkpoint"),
                    &metadata,
                    &to_i64(records, "records"),
                ],
            )
            .await?;
        Ok(n == 1)
    }

    /// Deletes the markers of `(sink_id, subtask)` below checkpoint `below`, keeping the
    /// newer ones (walsink asks only about epochs it has not marked in its own commit store,
    /// and pipe resumes from the newest marker). Returns how many rows went.
    ///
    /// # Cancel safety
    /// If dropped, the statement may or may not have run; it is idempotent, so call it again.
    pub async fn prune<C: GenericClient + Sync>(
        &self,
        c: &C,
        sink_id: &str,
        subtask: u32,
        below: u64,
    ) -> Result<u64, Error> {
        let sql = format!(
            "DELETE FROM {} WHERE sink_id = $1 AND subtask = $2 AND checkpoint < $3",
            self.table
        );
        c.execute(
            &sql,
            &[&sink_id, &(subtask as i32), &to_i64(below, "checkpoint")],
        )
        .await
    }
}
