//! [`TableName`]: a table name checked once and quoted wherever it goes into SQL.

use crate::error::ConfigError;
use std::fmt;

/// A table name, `table` or `schema.table`, each part 1 to 63 characters of letters, digits
/// and `_`, not starting with a digit. It is always double-quoted in SQL, so the case is kept
/// as written (`Events` and `events` are two tables).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct TableName {
    schema: Option<String>,
    name: String,
}

fn valid_part(p: &str) -> bool {
    !p.is_empty()
        && p.len() <= 63
        && !p.as_bytes()[0].is_ascii_digit()
        && p.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
}

impl TableName {
    /// Checks `s` (`table` or `schema.table`). `what` names the parameter in the error.
    pub fn parse(s: &str, what: &str) -> Result<TableName, ConfigError> {
        let (schema, name) = match s.split_once('.') {
            Some((a, b)) => (Some(a), b),
            None => (None, s),
        };
        if schema.is_some_and(|a| !valid_part(a)) || !valid_part(name) {
            return Err(ConfigError::new(
                "postgres",
                what,
                format!("{s:?} is not a table name: use `table` or `schema.table`, each 1 to 63 letters, digits or _ and not starting with a digit"),
            ));
        }
        Ok(TableName {
            schema: schema.map(str::to_string),
            name: name.to_string(),
        })
    }

    /// The unquoted table name (without the schema).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The schema, if one was given.
    pub fn schema(&self) -> Option<&str> {
        self.schema.as_deref()
    }

    /// The name as written, unquoted (`schema.table`), for messages.
    pub fn plain(&self) -> String {
        match &self.schema {
            Some(s) => format!("{s}.{}", self.name),
            None => self.name.clone(),
        }
    }
}

/// The quoted form for SQL: `"schema"."table"`.
impl fmt::Display for TableName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(s) = &self.schema {
            write!(f, "\"{s}\".")?;
        }
        write!(f, "\"{}\"", self.name)
    }
}

/// `s` double-quoted as an SQL identifier (for column names of a mapping).
pub fn quote_ident(s: &str) -> String {
    format!("\"{}\"", s.replace('"', "\"\""))
}

/// `s` as an SQL string literal (for the few statements that take no parameters, such as
/// `COMMIT PREPARED 'gid'`).
pub fn quote_literal(s: &str) -> String {
    format!("'{}'", s.replace('\'', "''"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_checked_and_quoted() {
        assert_eq!(
            TableName::parse("events", "table").unwrap().to_string(),
            "\"events\""
        );
        assert_eq!(
            TableName::parse("app.Events_2", "table")
                .unwrap()
                .to_string(),
            "\"app\".\"Events_2\""
        );
        for bad in ["", "1x", "a;drop", "a.b.c", "a\"b", "x y", &"a".repeat(64)] {
            let e = TableName::parse(bad, "table").unwrap_err();
            assert!(e.to_string().contains(": table: "), "{e}");
        }
        assert_eq!(quote_ident("a\"b"), "\"a\"\"b\"");
        assert_eq!(quote_literal("it's"), "'it''s'");
    }
}
