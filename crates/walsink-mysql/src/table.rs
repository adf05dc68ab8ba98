//! [`TableName`]: a table name checked once and quoted wherever it goes into SQL.

use crate::error::ConfigError;
use std::fmt;

/// A table name, `table` or `database.table`, each part 1 to 64 characters of letters, digits
/// and `_`, not starting with a digit. It is always backtick-quoted in SQL. Whether `Events`
/// and `events` are one table is the server's `lower_case_table_names`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct TableName {
    database: Option<String>,
    name: String,
}

fn valid_part(p: &str) -> bool {
    !p.is_empty()
        && p.len() <= 64
        && !p.as_bytes()[0].is_ascii_digit()
        && p.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
}

impl TableName {
    /// Checks `s` (`table` or `database.table`). `what` names the parameter in the error.
    pub fn parse(s: &str, what: &str) -> Result<TableName, ConfigError> {
        let (database, name) = match s.split_once('.') {
            Some((a, b)) => (Some(a), b),
            None => (None, s),
        };
        if database.is_some_and(|a| !valid_part(a)) || !valid_part(name) {
            return Err(ConfigError::new(
                "mysql",
                what,
                format!("{s:?} is not a table name: use `table` or `database.table`, each 1 to 64 letters, digits or _ and not starting with a digit"),
            ));
        }
        Ok(TableName {
            database: database.map(str::to_string),
            name: name.to_string(),
        })
    }

    /// The unquoted table name (without the database).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The database, if one was given.
    pub fn database(&self) -> Option<&str> {
        self.database.as_deref()
    }

    /// The name as written, unquoted (`database.table`), for messages.
    pub fn plain(&self) -> String {
        match &self.database {
            Some(s) => format!("{s}.{}", self.name),
            None => self.name.clone(),
        }
    }
}

/// The quoted form for SQL: `` `database`.`table` ``.
impl fmt::Display for TableName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(s) = &self.database {
            write!(f, "`{s}`.")?;
        }
        write!(f, "`{}`", self.name)
    }
}

/// `s` backtick-quoted as an SQL identifier (for column names of a mapping).
pub fn quote_ident(s: &str) -> String {
    format!("`{}`", s.replace('`', "``"))
}

/// Appends `bytes` to `out` as a MySQL string literal, `_binary'…'`, escaping the bytes the
/// server's lexer treats specially (NUL, `'`, `\`, newline, carriage return and Ctrl-Z). It
/// holds for any bytes under a connection character set of utf8mb4, whose multi-byte
/// sequences never contain those bytes, and needs the session's `sql_mode` without
/// `NO_BACKSLASH_ESCAPES` (the sink sets it).
pub fn push_binary_literal(out: &mut Vec<u8>, bytes: &[u8]) {
    out.extend_from_slice(b"_binary'");
    push_escaped(out, bytes);
    out.push(b'\'');
}

/// Appends `bytes` escaped for the inside of a quoted string literal.
pub(crate) fn push_escaped(out: &mut Vec<u8>, bytes: &[u8]) {
    let mut start = 0;
    for (i, &b) in bytes.iter().enumerate() {
        let esc: &[u8] = match b {
            0 => b"\\0",
            b'\'' => b"\\'",
            b'\\' => b"\\\\",
            b'\n' => b"\\n",
            b'\r' => b"\\r",
            0x1a => b"\\Z",
            _ => continue,
        };
        out.extend_from_slice(&bytes[start..i]);
        out.extend_from_slice(esc);
        start = i + 1;
    }
    out.extend_from_slice(&bytes[start..]);
}

/// `s` as an SQL string literal (for the few statements that take no parameters, such as
/// `XA COMMIT 'gtrid'`).
pub fn quote_literal(s: &str) -> String {
    let mut out = Vec::with_capacity(s.len() + 2);
    out.push(b'\'');
    push_escaped(&mut out, s.as_bytes());
    out.push(b'\'');
    String::from_utf8(out).expect("escaping keeps UTF-8")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_checked_and_quoted() {
        assert_eq!(
            TableName::parse("events", "table").unwrap().to_string(),
            "`events`"
        );
        assert_eq!(
            TableName::parse("app.Events_2", "table")
                .unwrap()
                .to_string(),
            "`app`.`Events_2`"
        );
        for bad in ["", "1x", "a;drop", "a.b.c", "a`b", "x y", &"a".repeat(65)] {
            let e = TableName::parse(bad, "table").unwrap_err();
            assert_eq!(e.parameter, "table", "{e}");
        }
        assert_eq!(quote_ident("a`b"), "`a``b`");
        assert_eq!(quote_literal("it's"), "'it\\'s'");
    }

    #[test]
    fn binary_literals_escape_what_the_lexer_reads() {
        let mut out = Vec::new();
        push_binary_literal(&mut out, b"a'b\\c\0d\ne\rf\x1ag\xff");
        assert_eq!(out, b"_binary'a\\'b\\\\c\\0d\\ne\\rf\\Zg\xff'".to_vec());
    }
}
