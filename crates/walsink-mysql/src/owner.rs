//! The owners table: which log owns each shard `(sink_id, subtask)`, and at which generation
//! (see [`walsink::Owner`]), beside the marker table (same database).
//!
//! ```sql
//! CREATE TABLE IF NOT EXISTS walsink_owners (
//!     sink_id    VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
//!     subtask    INT UNSIGNED NOT NULL,
//!     owner      VARCHAR(255) NOT NULL,   -- the owning log's id
//!     generation BIGINT UNSIGNED NOT NULL, -- raised by every claim
//!     claimed_at TIMESTAMP(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
//!     PRIMARY KEY (sink_id, subtask)
//! ) ENGINE=InnoDB;
//! ```
//!
//! A claim reads the row `FOR UPDATE` and writes the new owner and generation in one
//! transaction; every epoch's transaction reads it `LOCK IN SHARE MODE` first (both MySQL and
//! MariaDB spell it so) and rolls back, writing nothing, when it no longer holds its claim.
//! The two locks conflict, so no commit of a taken-over log lands after the claim returned.

use crate::table::TableName;
use mysql_async::prelude::Queryable;
use mysql_async::{Conn, Error};
use walsink::Claim;

/// The name of the owners table, in the marker table's database.
pub const DEFAULT_TABLE: &str = "walsink_owners";

/// An owners table by name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OwnerTable {
    table: TableName,
}

impl OwnerTable {
    /// The owners table beside the marker table `marker` (same database, name
    /// [`DEFAULT_TABLE`]).
    pub fn beside(marker: &TableName) -> Self {
        let name = match marker.database() {
            Some(d) => format!("{d}.{DEFAULT_TABLE}"),
            None => DEFAULT_TABLE.to_string(),
        };
        OwnerTable {
            table: TableName::parse(&name, "marker_table").expect("a valid database and name"),
        }
    }

    /// Its name.
    pub fn name(&self) -> &TableName {
        &self.table
    }

    /// Creates the table if it is missing (idempotent).
    ///
    /// # Errors
    /// The server's error for the `CREATE TABLE`.
    ///
    /// # Cancel safety
    /// If dropped, the statement may or may not have run; it is idempotent, so call it again.
    pub async fn create(&self, c: &mut Conn) -> Result<(), Error> {
        c.query_drop(format!(
            "CREATE TABLE IF NOT EXISTS {} (
                sink_id VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
                subtask INT UNSIGNED NOT NULL,
                owner VARCHAR(255) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
                generation BIGINT UNSIGNED NOT NULL,
                claimed_at TIMESTAMP(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
                PRIMARY KEY (sink_id, subtask)
            ) ENGINE=InnoDB",
            self.table
        ))
        .await
    }

    async fn read(
        &self,
        c: &mut Conn,
        sink_id: &str,
        subtask: u32,
        lock: &str,
    ) -> Result<Option<(String, u64)>, Error> {
        c.exec_first(
            format!(
                "SELECT owner, generation FROM {} WHERE sink_id = ? AND subtask = ? {lock}",
                self.table
            ),
            (sink_id, subtask),
        )
        .await
    }

    /// The owner record of `(sink_id, subtask)`, without a lock (for reports).
    ///
    /// # Errors
    /// The server's error (1146 when the table does not exist).
    ///
    /// # Cancel safety
    /// Cancel safe: it only reads.
    pub async fn owner(
        &self,
        c: &mut Conn,
        sink_id: &str,
        subtask: u32,
    ) -> Result<Option<(String, u64)>, Error> {
        self.read(c, sink_id, subtask, "").await
    }

    /// Inside the caller's open transaction, first thing in it: the owner record, read
    /// `LOCK IN SHARE MODE` (held to the transaction's end). The caller gives it to
    /// [`Claim::check`] and rolls back on a fenced answer.
    ///
    /// # Errors
    /// The server's error.
    ///
    /// # Cancel safety
    /// If dropped, the caller rolls its transaction back.
    pub async fn check(
        &self,
        tx: &mut Conn,
        claim: &Claim,
    ) -> Result<Option<(String, u64)>, Error> {
        self.read(tx, &claim.sink_id, claim.subtask, "LOCK IN SHARE MODE")
            .await
    }

    /// Inside the caller's open transaction: reads the record `FOR UPDATE` and writes the
    /// claim `decide` makes of it. `Ok(Err(_))`: `decide` refused (the caller rolls back);
    /// `Ok(Ok(None))`: another session inserted the first record at the same moment (the
    /// caller rolls back and claims again).
    ///
    /// # Errors
    /// The server's error.
    ///
    /// # Cancel safety
    /// If dropped, the caller rolls its transaction back.
    pub async fn claim_in(
        &self,
        tx: &mut Conn,
        sink_id: &str,
        subtask: u32,
        decide: impl FnOnce(Option<(&str, u64)>) -> Result<Claim, walsink::SinkError>,
    ) -> Result<Result<Option<Claim>, walsink::SinkError>, Error> {
        let found = self.read(tx, sink_id, subtask, "FOR UPDATE").await?;
        let claim = match decide(found.as_ref().map(|(o, g)| (o.as_str(), *g))) {
            Ok(c) => c,
            Err(e) => return Ok(Err(e)),
        };
        let sql = if found.is_some() {
            format!(
                "UPDATE {} SET owner = ?, generation = ?, claimed_at = CURRENT_TIMESTAMP(6) WHERE sink_id = ? AND subtask = ?",
                self.table
            )
        } else {
            format!(
                "INSERT IGNORE INTO {} (owner, generation, sink_id, subtask) VALUES (?, ?, ?, ?)",
                self.table
            )
        };
        tx.exec_drop(sql, (&*claim.owner, claim.generation, sink_id, subtask))
            .await?;
        let n = tx.affected_rows();
        Ok(Ok((n == 1).then_some(claim)))
    }

    /// One claim in a transaction of its own on `c`: `START TRANSACTION`, [`claim_in`] with
    /// [`walsink::decide_claim`] for `owner`, then `COMMIT` (granted) or `ROLLBACK`. The
    /// answers are [`OwnerTable::claim_in`]'s; a lock wait timeout or deadlock (1205, 1213:
    /// an epoch of the old owner holds the row) is the server's error, and the caller claims
    /// again.
    ///
    /// [`claim_in`]: OwnerTable::claim_in
    ///
    /// # Errors
    /// The server's error.
    ///
    /// # Cancel safety
    /// If dropped, the claim may or may not be committed, and a transaction may be left open
    /// on `c`: drop the connection and claim again.
    pub async fn claim_once(
        &self,
        c: &mut Conn,
        sink_id: &str,
        subtask: u32,
        owner: &walsink::Owner,
    ) -> Result<Result<Option<Claim>, walsink::SinkError>, Error> {
        c.query_drop("START TRANSACTION").await?;
        let r = self
            .claim_in(c, sink_id, subtask, |found| {
                walsink::decide_claim(sink_id, subtask, found, owner)
            })
            .await?;
        match &r {
            Ok(Some(_)) => c.query_drop("COMMIT").await?,
            _ => c.query_drop("ROLLBACK").await?,
        }
        Ok(r)
    }
}
