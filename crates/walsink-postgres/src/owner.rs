//! The owners table: which log owns each shard `(sink_id, subtask)`, and at which generation
//! (see [`walsink::Owner`]).
//!
//! ```sql
//! CREATE TABLE IF NOT EXISTS walsink_owners (     -- in the marker table's schema
//!     sink_id    text        NOT NULL,
//!     subtask    integer     NOT NULL,
//!     owner      text        NOT NULL,   -- the owning log's id
//!     generation bigint      NOT NULL,   -- raised by every claim
//!     claimed_at timestamptz NOT NULL DEFAULT now(),
//!     PRIMARY KEY (sink_id, subtask)
//! );
//! ```
//!
//! [`OwnerTable::claim_in`] (inside [`PgSink::claim`](crate::PgSink::claim)) reads the row `FOR UPDATE`, applies [`walsink::decide_claim`] and
//! writes the new owner and generation in one transaction. Every epoch's transaction reads
//! the row `FOR SHARE` first ([`OwnerTable::check`]) and rolls back, writing nothing, when it
//! no longer holds the claim. The two locks conflict, so a claim waits for every epoch
//! transaction already past its check and every later one sees the new generation: a log that
//! was taken over can never commit after the claim that fenced it.

use crate::table::TableName;
use tokio_postgres::{Error, GenericClient};
use walsink::Claim;

/// The name of the owners table, in the schema of the marker table.
pub const DEFAULT_TABLE: &str = "walsink_owners";

/// An owners table by name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OwnerTable {
    table: TableName,
}

impl OwnerTable {
    /// The owners table beside the marker table `marker` (same schema, name
    /// [`DEFAULT_TABLE`]).
    pub fn beside(marker: &TableName) -> Self {
        let name = match marker.schema() {
            Some(s) => format!("{s}.{DEFAULT_TABLE}"),
            None => DEFAULT_TABLE.to_string(),
        };
        OwnerTable {
            table: TableName::parse(&name, "marker_table").expect("a valid schema and name"),
        }
    }

    /// Its name.
    pub fn name(&self) -> &TableName {
        &self.table
    }

    /// Creates the table if it is missing (idempotent; concurrent creators are fine).
    ///
    /// # Errors
    /// The server's error for the `CREATE TABLE`.
    ///
    /// # Cancel safety
    /// If dropped, the statement may or may not have run; it is idempotent, so call it again.
    pub async fn create<C: GenericClient + Sync>(&self, c: &C) -> Result<(), Error> {
        let sql = format!(
            "CREATE TABLE IF NOT EXISTS {} (
                sink_id text NOT NULL,
                subtask integer NOT NULL,
                owner text NOT NULL,
                generation bigint NOT NULL,
                claimed_at timestamptz NOT NULL DEFAULT now(),
                PRIMARY KEY (sink_id, subtask))",
            self.table
        );
        match c.batch_execute(&sql).await {
            Err(e) if crate::marker::is_creation_race(&e) => {
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
            r => r,
        }
    }

    /// The owner record of `(sink_id, subtask)`: `(owner, generation)`, `None` when no log
    /// claimed it. `lock` is `""`, `"FOR SHARE"` or `"FOR UPDATE"`.
    async fn read<C: GenericClient + Sync>(
        &self,
        c: &C,
        sink_id: &str,
        subtask: u32,
        lock: &str,
    ) -> Result<Option<(String, u64)>, Error> {
        let sql = format!(
            "SELECT owner, generation FROM {} WHERE sink_id = $1 AND subtask = $2 {lock}",
            self.table
        );
        let row = c.query_opt(&sql, &[&sink_id, &(subtask as i32)]).await?;
        Ok(row.map(|r| (r.get::<_, String>(0), r.get::<_, i64>(1) as u64)))
    }

    /// The owner record of `(sink_id, subtask)`, without a lock (for reports).
    ///
    /// # Errors
    /// The server's error (42P01 when the table does not exist).
    ///
    /// # Cancel safety
    /// Cancel safe: it only reads.
    pub async fn owner<C: GenericClient + Sync>(
        &self,
        c: &C,
        sink_id: &str,
        subtask: u32,
    ) -> Result<Option<(String, u64)>, Error> {
        self.read(c, sink_id, subtask, "").await
    }

    /// Inside the caller's open transaction, first thing in it: the owner record, read
    /// `FOR SHARE` (held to the transaction's end, so no claim passes it meanwhile). The caller
    /// gives it to [`Claim::check`] and rolls back on a fenced answer.
    ///
    /// # Errors
    /// The server's error.
    ///
    /// # Cancel safety
    /// If dropped, the caller's transaction holds or waits for the lock; the caller rolls it
    /// back (it must not commit after a dropped call).
    pub async fn check<C: GenericClient + Sync>(
        &self,
        tx: &C,
        claim: &Claim,
    ) -> Result<Option<(String, u64)>, Error> {
        self.read(tx, &claim.sink_id, claim.subtask, "FOR SHARE")
            .await
    }

    /// Inside the caller's open transaction: reads the record `FOR UPDATE` and writes the
    /// claim `decide` makes of it. Returns `Ok(Err(_))` when `decide` refuses (the caller
    /// rolls back), and `Ok(Ok(None))` when another session inserted the first record at the
    /// same moment (the caller rolls back and claims again).
    ///
    /// # Errors
    /// The server's error.
    ///
    /// # Cancel safety
    /// If dropped, the caller rolls its transaction back.
    pub async fn claim_in<C: GenericClient + Sync>(
        &self,
        tx: &C,
        sink_id: &str,
        subtask: u32,
        decide: impl FnOnce(Option<(&str, u64)>) -> Result<Claim, walsink::SinkError>,
    ) -> Result<Result<Option<Claim>, walsink::SinkError>, Error> {
        let found = self.read(tx, sink_id, subtask, "FOR UPDATE").await?;
        let claim = match decide(found.as_ref().map(|(o, g)| (o.as_str(), *g))) {
            Ok(c) => c,
            Err(e) => return Ok(Err(e)),
        };
        let generation = claim.generation as i64;
        let n = if found.is_some() {
            tx.execute(
                &format!(
                    "UPDATE {} SET owner = $3, generation = $4, claimed_at = now() WHERE sink_id = $1 AND subtask = $2",
                    self.table
                ),
                &[&sink_id, &(subtask as i32), &&*claim.owner, &generation],
            )
            .await?
        } else {
            tx.execute(
                &format!(
                    "INSERT INTO {} (sink_id, subtask, owner, generation) VALUES ($1, $2, $3, $4) ON CONFLICT DO NOTHING",
                    self.table
                ),
                &[&sink_id, &(subtask as i32), &&*claim.owner, &generation],
            )
            .await?
        };
        Ok(Ok((n == 1).then_some(claim)))
    }

    /// One claim in a transaction of its own on `c`: `BEGIN`, [`claim_in`] with
    /// [`walsink::decide_claim`] for `owner`, then `COMMIT` (granted) or `ROLLBACK`. The
    /// answers are [`OwnerTable::claim_in`]'s; a lock held by an epoch of the old owner
    /// (55P03, 40001, 40P01) or a first record inserted at the same moment (23505) is the
    /// server's error, and the caller claims again.
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
        c: &tokio_postgres::Client,
        sink_id: &str,
        subtask: u32,
        owner: &walsink::Owner,
    ) -> Result<Result<Option<Claim>, walsink::SinkError>, Error> {
        c.batch_execute("BEGIN").await?;
        let r = self
            .claim_in(c, sink_id, subtask, |found| {
                walsink::decide_claim(sink_id, subtask, found, owner)
            })
            .await?;
        match &r {
            Ok(Some(_)) => c.batch_execute("COMMIT").await?,
            _ => c.batch_execute("ROLLBACK").await?,
        }
        Ok(r)
    }
}
