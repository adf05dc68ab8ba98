//! Checks for tests, the demo and operators: a replica table compared with its source both
//! ways, and what the commit markers say was applied.

use crate::config::ident;
use tokio_postgres::{Client, Error};

/// A comparison of two tables of one database.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Comparison {
    /// Rows in the source.
    pub source_rows: u64,
    /// Rows in the replica.
    pub replica_rows: u64,
    /// Rows of the source the replica lacks (`source EXCEPT replica`).
    pub missing: u64,
    /// Rows of the replica the source lacks (`replica EXCEPT source`).
    pub extra: u64,
}

impl Comparison {
    /// True when the two hold the same rows.
    pub fn identical(&self) -> bool {
        self.missing == 0 && self.extra == 0 && self.source_rows == self.replica_rows
    }
}

/// Compares `source` with `replica` (each `schema.table`) on the source's columns, both ways
/// with `EXCEPT ALL` over each column's text form (`::text`: so `json` columns, which have no
/// equality, compare too, and `1.0` is not `1.00`; the replica's hidden `_walsink_pos` column
/// is left out).
///
/// # Cancel safety
/// Cancel safe: it only reads; call it again.
pub async fn compare(
    c: &Client,
    source: (&str, &str),
    replica: (&str, &str),
) -> Result<Comparison, Error> {
    let src = format!("{}.{}", ident(source.0), ident(source.1));
    let cols: Vec<String> = c
        .query(
            "SELECT a.attname::text FROM pg_attribute a WHERE a.attrelid = to_regclass($1) \
             AND a.attnum > 0 AND NOT a.attisdropped AND a.attname <> '_walsink_pos' ORDER BY a.attnum",
            &[&src],
        )
        .await?
        .iter()
        .map(|r| format!("{}::text", ident(r.get(0))))
        .collect();
    let cols = cols.join(", ");
    let a = format!("SELECT {cols} FROM {src}");
    let b = format!(
        "SELECT {cols} FROM {}.{}",
        ident(replica.0),
        ident(replica.1)
    );
    let row = c
        .query_one(
            &format!(
                "SELECT (SELECT count(*) FROM ({a}) p), (SELECT count(*) FROM ({b}) q), \
                 (SELECT count(*) FROM ({a} EXCEPT ALL {b}) x), \
                 (SELECT count(*) FROM ({b} EXCEPT ALL {a}) y)"
            ),
            &[],
        )
        .await?;
    let n = |i: usize| row.get::<_, i64>(i) as u64;
    Ok(Comparison {
        source_rows: n(0),
        replica_rows: n(1),
        missing: n(2),
        extra: n(3),
    })
}

/// The epochs committed for `sink_id` (all subtasks) and the events they held, from the
/// marker table in `schema`.
///
/// # Cancel safety
/// Cancel safe: it only reads; call it again.
pub async fn applied(c: &Client, schema: &str, sink_id: &str) -> Result<(u64, u64), Error> {
    let row = c
        .query_one(
            &format!(
                "SELECT count(*), coalesce(sum(records), 0)::bigint FROM {}.{} WHERE sink_id = $1",
                ident(schema),
                walsink_postgres::marker::DEFAULT_TABLE
            ),
            &[&sink_id],
        )
        .await?;
    Ok((row.get::<_, i64>(0) as u64, row.get::<_, i64>(1) as u64))
}
