//! The commit marker: one row per epoch in `SCHEMA.walsink_cdc_commits`, written in the
//! epoch's transaction, with the checkpoint's metadata beside it.
//!
//! Stand-in until the PostgreSQL target's public marker module lands on this branch; the
//! functions here are the seam the apply side uses, so swapping is local to this file.

use crate::config::ident;
use tokio_postgres::{Client, GenericClient};
use walsink::sinks::CommittedEpoch;
use walsink::EpochKey;

fn table(schema: &str) -> String {
    format!("{}.walsink_cdc_commits", ident(schema))
}

/// Creates the marker table if it is missing.
pub async fn ensure(c: &Client, schema: &str) -> Result<(), tokio_postgres::Error> {
    c.batch_execute(&format!(
        "CREATE TABLE IF NOT EXISTS {} (sink_id text NOT NULL, subtask integer NOT NULL, \
         checkpoint bigint NOT NULL, metadata bytea NOT NULL, committed_at timestamptz NOT NULL DEFAULT now(), \
         PRIMARY KEY (sink_id, subtask, checkpoint))",
        table(schema)
    ))
    .await
}

/// Writes the marker of `key` with `metadata`, inside the caller's transaction. A marker that
/// already exists is a unique violation (23505): the epoch was applied already.
pub async fn write(
    tx: &impl GenericClient,
    schema: &str,
    key: &EpochKey,
    metadata: &[u8],
) -> Result<(), tokio_postgres::Error> {
    tx.execute(
        &format!(
            "INSERT INTO {} (sink_id, subtask, checkpoint, metadata) VALUES ($1, $2, $3, $4)",
            table(schema)
        ),
        &[
            &&*key.sink_id,
            &(key.subtask as i32),
            &(key.checkpoint as i64),
            &metadata,
        ],
    )
    .await
    .map(|_| ())
}

/// Whether the target holds `key`.
pub async fn is_committed(
    c: &Client,
    schema: &str,
    key: &EpochKey,
) -> Result<bool, tokio_postgres::Error> {
    let row = c
        .query_one(
            &format!(
                "SELECT EXISTS (SELECT 1 FROM {} WHERE sink_id = $1 AND subtask = $2 AND checkpoint = $3)",
                table(schema)
            ),
            &[&&*key.sink_id, &(key.subtask as i32), &(key.checkpoint as i64)],
        )
        .await?;
    Ok(row.get(0))
}

/// The epochs the target holds for `(sink_id, subtask)`, oldest first, with their metadata.
pub async fn committed(
    c: &Client,
    schema: &str,
    sink_id: &str,
    subtask: u32,
) -> Result<Vec<CommittedEpoch>, tokio_postgres::Error> {
    let rows = c
        .query(
            &format!(
                "SELECT checkpoint, metadata FROM {} WHERE sink_id = $1 AND subtask = $2 ORDER BY checkpoint",
                table(schema)
            ),
            &[&sink_id, &(subtask as i32)],
        )
        .await?;
    Ok(rows
        .iter()
        .map(|r| {
            let cp: i64 = r.get(0);
            CommittedEpoch {
                checkpoint: cp as u64,
                file: format!("{schema}.walsink_cdc_commits checkpoint {cp}"),
                metadata: Some(r.get::<_, Vec<u8>>(1)),
            }
        })
        .collect())
}
