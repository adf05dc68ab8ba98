//! Row mappings: how a record becomes a row of the target table.
//!
//! A [`RowMapping`] names the table's columns and writes one row per record through a
//! [`RowWriter`], which writes each value into the `LOAD DATA` stream the sink sends (a
//! tab-separated line) or, where the server refuses `LOAD DATA LOCAL`, as an SQL literal of a
//! multi-row `INSERT`. The server converts each literal to its column's type under a strict
//! `sql_mode`, so a value that does not fit its column is a permanent error naming the
//! column (1406 data too long, 1366 incorrect value, 1264 out of range) before anything is
//! committed. [`RawRows`] is the default: the record's bytes and its position.

use crate::table::{push_binary_literal, push_escaped, quote_ident, TableName};
use std::fmt;
use std::io::Write;
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

    /// Writes the row of `record` of epoch `key`: one push per column, in order.
    fn write_row(
        &self,
        key: &EpochKey,
        record: &Record,
        row: &mut RowWriter<'_>,
    ) -> Result<(), MapError>;
}

/// How a row is written: as SQL literals for a multi-row INSERT, or as a tab-separated line
/// for `LOAD DATA` (`FIELDS TERMINATED BY '\t' ESCAPED BY '\\' LINES TERMINATED BY '\n'`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Encoding {
    Sql,
    Tsv,
}

/// Writes one row as a parenthesised list of SQL literals, or a tab-separated line; see
/// [`RowMapping::write_row`].
#[derive(Debug)]
pub struct RowWriter<'a> {
    buf: &'a mut Vec<u8>,
    columns: usize,
    at: usize,
    encoding: Encoding,
}

/// Appends `bytes` escaped for a `LOAD DATA` field (`ESCAPED BY '\\'`).
fn push_tsv_escaped(out: &mut Vec<u8>, bytes: &[u8]) {
    let mut start = 0;
    for (i, &b) in bytes.iter().enumerate() {
        let esc: &[u8] = match b {
            0 => b"\\0",
            b'\\' => b"\\\\",
            b'\t' => b"\\t",
            b'\n' => b"\\n",
            _ => continue,
        };
        out.extend_from_slice(&bytes[start..i]);
        out.extend_from_slice(esc);
        start = i + 1;
    }
    out.extend_from_slice(&bytes[start..]);
}

impl RowWriter<'_> {
    fn next(&mut self) -> Result<(), MapError> {
        if self.at >= self.columns {
            return Err(MapError(format!(
                "the mapping pushed more values than its {} columns",
                self.columns
            )));
        }
        if self.at > 0 {
            self.buf.push(match self.encoding {
                Encoding::Sql => b',',
                Encoding::Tsv => b'\t',
            });
        }
        self.at += 1;
        Ok(())
    }

    /// Bytes for the next column (a `BLOB`, `BINARY` or, when they are UTF-8 in the
    /// column's character set, a text column).
    pub fn push_bytes(&mut self, v: &[u8]) -> Result<(), MapError> {
        self.next()?;
        match self.encoding {
            Encoding::Sql => push_binary_literal(self.buf, v),
            Encoding::Tsv => push_tsv_escaped(self.buf, v),
        }
        Ok(())
    }

    /// Text for the next column.
    pub fn push_str(&mut self, v: &str) -> Result<(), MapError> {
        self.next()?;
        match self.encoding {
            Encoding::Sql => {
                self.buf.push(b'\'');
                push_escaped(self.buf, v.as_bytes());
                self.buf.push(b'\'');
            }
            Encoding::Tsv => push_tsv_escaped(self.buf, v.as_bytes()),
        }
        Ok(())
    }

    /// An unsigned integer for the next column.
    pub fn push_u64(&mut self, v: u64) -> Result<(), MapError> {
        self.next()?;
        write!(self.buf, "{v}").expect("a Vec takes writes");
        Ok(())
    }

    /// A signed integer for the next column.
    pub fn push_i64(&mut self, v: i64) -> Result<(), MapError> {
        self.next()?;
        write!(self.buf, "{v}").expect("a Vec takes writes");
        Ok(())
    }

    /// A floating-point number for the next column (finite: MySQL has no NaN or infinity).
    pub fn push_f64(&mut self, v: f64) -> Result<(), MapError> {
        if !v.is_finite() {
            return Err(MapError(format!(
                "column {} cannot take {v}: MySQL has no NaN or infinity",
                self.at + 1
            )));
        }
        self.next()?;
        write!(self.buf, "{v:e}").expect("a Vec takes writes");
        Ok(())
    }

    /// NULL for the next column.
    pub fn push_null(&mut self) -> Result<(), MapError> {
        self.next()?;
        self.buf.extend_from_slice(match self.encoding {
            Encoding::Sql => b"NULL",
            Encoding::Tsv => b"\\N",
        });
        Ok(())
    }
}

/// Appends the row of `record` to `buf` as `(v1,v2,…)` (SQL) or `v1\tv2…\n` (LOAD DATA).
pub(crate) fn encode_row(
    mapping: &dyn RowMapping,
    columns: usize,
    key: &EpochKey,
    record: &Record,
    buf: &mut Vec<u8>,
    encoding: Encoding,
) -> Result<(), MapError> {
    if encoding == Encoding::Sql {
        buf.push(b'(');
    }
    let mut w = RowWriter {
        buf,
        columns,
        at: 0,
        encoding,
    };
    mapping.write_row(key, record, &mut w)?;
    if w.at != columns {
        return Err(MapError(format!(
            "the mapping wrote {} of its {} columns for record {} of checkpoint {}",
            w.at, columns, record.position.index, key.checkpoint
        )));
    }
    buf.push(match encoding {
        Encoding::Sql => b')',
        Encoding::Tsv => b'\n',
    });
    Ok(())
}

/// The default mapping: one row per record,
/// `(sink_id VARCHAR(255), subtask INT UNSIGNED, checkpoint BIGINT UNSIGNED, idx BIGINT UNSIGNED, payload LONGBLOB)`
/// with the primary key `(sink_id, subtask, checkpoint, idx)`.
///
/// The payload is `LONGBLOB` because a record is arbitrary bytes: a text column cannot hold
/// bytes that are not valid in its character set, and `BLOB` stops at 64 KiB, so either
/// would turn some records into permanent errors. Read lines back as text with
/// `CONVERT(payload USING utf8mb4)`. The primary key is the record's deterministic
/// position: the marker, not the key, makes delivery exactly-once, but the key turns a write
/// twice (which the marker rules out) into a loud 1062 instead of a silent duplicate, and
/// rows arrive in its order, so it costs InnoDB little.
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
            "CREATE TABLE IF NOT EXISTS {table} (\
             sink_id VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL, \
             subtask INT UNSIGNED NOT NULL, checkpoint BIGINT UNSIGNED NOT NULL, \
             idx BIGINT UNSIGNED NOT NULL, payload LONGBLOB NOT NULL, \
             PRIMARY KEY (sink_id, subtask, checkpoint, idx)) ENGINE=InnoDB"
        ))
    }

    fn write_row(
        &self,
        key: &EpochKey,
        record: &Record,
        row: &mut RowWriter<'_>,
    ) -> Result<(), MapError> {
        row.push_str(&key.sink_id)?;
        row.push_u64(u64::from(key.subtask))?;
        row.push_u64(key.checkpoint)?;
        row.push_u64(record.position.index)?;
        row.push_bytes(&record.data)
    }
}

/// The column list for `INSERT INTO table (…)`.
pub(crate) fn column_list(columns: &[String]) -> String {
    columns
        .iter()
        .map(|c| quote_ident(c))
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn load_data_fields_escape_what_the_server_reads() {
        let mut out = Vec::new();
        push_tsv_escaped(&mut out, b"a\tb\nc\\d\0e'f\r\x1a");
        assert_eq!(out, b"a\\tb\\nc\\\\d\\0e'f\r\x1a".to_vec());
    }
}
