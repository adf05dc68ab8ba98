//! Row mappings: how a record becomes a row of the target table.
//!
//! A [`RowMapping`] names the table's columns and writes one row per record through a
//! [`RowWriter`], which encodes each value in PostgreSQL's binary `COPY` format for the
//! column's type as the server reports it (so a value that does not fit its column is a
//! permanent error naming both, before anything is committed). [`RawRows`] is the default:
//! the record's bytes and its position.

use crate::table::{quote_ident, TableName};
use bytes::{BufMut, BytesMut};
use std::fmt;
use tokio_postgres::types::{IsNull, ToSql, Type};
use walsink::{EpochKey, Record};

/// A record the mapping could not turn into a row (permanent: the same record fails again).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MapError(pub String);

impl fmt::Display for MapError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for MapError {}

/// How records become rows.
pub trait RowMapping: Send + Sync + 'static {
    /// The columns each row fills, in the order [`RowMapping::write_row`] pushes them.
    fn columns(&self) -> Vec<String>;

    /// The `CREATE TABLE IF NOT EXISTS` statement for `table`, when the mapping can create
    /// its table (`create=true`, the default); `None`: the table must exist.
    fn create_table(&self, table: &TableName) -> Option<String> {
        let _ = table;
        None
    }

    /// Writes the row of `record` of epoch `key`: one [`RowWriter::push`] (or
    /// [`RowWriter::push_null`]) per column, in order.
    fn write_row(
        &self,
        key: &EpochKey,
        record: &Record,
        row: &mut RowWriter<'_>,
    ) -> Result<(), MapError>;
}

/// Encodes one row in the binary `COPY` format; see [`RowMapping::write_row`].
#[derive(Debug)]
pub struct RowWriter<'a> {
    buf: &'a mut BytesMut,
    columns: &'a [(String, Type)],
    at: usize,
}

impl RowWriter<'_> {
    /// The next column's value.
    pub fn push<T: ToSql + ?Sized>(&mut self, value: &T) -> Result<(), MapError> {
        let Some((name, ty)) = self.columns.get(self.at) else {
            return Err(MapError(format!(
                "the mapping pushed more values than its {} columns",
                self.columns.len()
            )));
        };
        let len_at = self.buf.len();
        self.buf.put_i32(0);
        match value.to_sql_checked(ty, self.buf) {
            Ok(IsNull::No) => {
                let len = self.buf.len() - len_at - 4;
                let len = i32::try_from(len).map_err(|_| {
                    MapError(format!("the value for column {name} is larger than 1 GiB"))
                })?;
                self.buf[len_at..len_at + 4].copy_from_slice(&len.to_be_bytes());
            }
            Ok(IsNull::Yes) => {
                self.buf.truncate(len_at);
                self.buf.put_i32(-1);
            }
            Err(e) => {
                return Err(MapError(format!(
                    "column {name} (type {ty}) cannot take the value: {e}"
                )))
            }
        }
        self.at += 1;
        Ok(())
    }

    /// NULL for the next column.
    pub fn push_null(&mut self) -> Result<(), MapError> {
        if self.at >= self.columns.len() {
            return Err(MapError(format!(
                "the mapping pushed more values than its {} columns",
                self.columns.len()
            )));
        }
        self.buf.put_i32(-1);
        self.at += 1;
        Ok(())
    }
}

/// The header of a binary COPY stream.
pub(crate) fn copy_header(buf: &mut BytesMut) {
    buf.put_slice(b"PGCOPY\n\xff\r\n\0");
    buf.put_i32(0); // flags
    buf.put_i32(0); // header extension length
}

/// The trailer of a binary COPY stream.
pub(crate) fn copy_trailer(buf: &mut BytesMut) {
    buf.put_i16(-1);
}

/// Appends the row of `record` to `buf` (binary COPY tuple), or fails without a usable buffer.
pub(crate) fn encode_row(
    mapping: &dyn RowMapping,
    columns: &[(String, Type)],
    key: &EpochKey,
    record: &Record,
    buf: &mut BytesMut,
) -> Result<(), MapError> {
    buf.put_i16(columns.len() as i16);
    let mut w = RowWriter {
        buf,
        columns,
        at: 0,
    };
    mapping.write_row(key, record, &mut w)?;
    if w.at != columns.len() {
        return Err(MapError(format!(
            "the mapping wrote {} of its {} columns for record {} of checkpoint {}",
            w.at,
            columns.len(),
            record.position.index,
            key.checkpoint
        )));
    }
    Ok(())
}

/// The default mapping: one row per record,
/// `(sink_id text, subtask integer, checkpoint bigint, idx bigint, payload bytea)`.
///
/// The payload is `bytea` because a record is arbitrary bytes: `text` cannot hold a NUL byte
/// or bytes that are not valid in the database encoding, so a text column would turn such a
/// record into a permanent error. Read lines back as text with
/// `convert_from(payload, 'UTF8')`. `(sink_id, subtask, checkpoint, idx)` is the record's
/// deterministic position; the table has no index on it (the marker, not a key, makes
/// delivery exactly-once, and an index would slow `COPY` down); add one if queries need it.
#[derive(Debug, Clone, Copy, Default)]
pub struct RawRows;

impl RowMapping for RawRows {
    fn columns(&self) -> Vec<String> {
        ["sink_id", "subtask", "checkpoint", "idx", "payload"]
            .map(String::from)
            .to_vec()
    }

    fn create_table(&self, table: &TableName) -> Option<String> {
        Some(format!(
            "CREATE TABLE IF NOT EXISTS {table} (sink_id text NOT NULL, subtask integer NOT NULL, checkpoint bigint NOT NULL, idx bigint NOT NULL, payload bytea NOT NULL)"
        ))
    }

    fn write_row(
        &self,
        key: &EpochKey,
        record: &Record,
        row: &mut RowWriter<'_>,
    ) -> Result<(), MapError> {
        let big = |v: u64| {
            i64::try_from(v).map_err(|_| MapError(format!("{v} does not fit a bigint column")))
        };
        row.push(&&*key.sink_id)?;
        row.push(&(key.subtask as i32))?;
        row.push(&big(key.checkpoint)?)?;
        row.push(&big(record.position.index)?)?;
        row.push(&&record.data[..])
    }
}

/// The column list for `COPY table (…)`.
pub(crate) fn column_list(columns: &[String]) -> String {
    columns
        .iter()
        .map(|c| quote_ident(c))
        .collect::<Vec<_>>()
        .join(", ")
}
