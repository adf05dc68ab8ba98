//! How a JSON value of a row image reaches a target column: as text for the column's input
//! function, sent in one `text[]` array per column and cast on the server.
//!
//! The rule is the one `jsonb_populate_record` follows, so both paths write the same values:
//! a JSON string gives its contents, any other JSON value its JSON text, and `null` gives
//! SQL `NULL`; a `json` or `jsonb` column takes the value's JSON text as it is. Array and
//! composite columns are the exception: `jsonb_populate_record` turns a JSON array or object
//! into them, which text input cannot, so a statement touching one goes through JSON instead
//! ([`ColumnKind::ViaJson`]).

use serde_json::Value;

/// How the values of one target column are sent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum ColumnKind {
    /// Text for the input function of the column's type, cast with `::TYPE`.
    Text(String),
    /// A `json` or `jsonb` column: the value's JSON text, cast with `::TYPE`.
    Json(String),
    /// An array or composite column: the statement reads its rows from JSON.
    ViaJson,
}

impl ColumnKind {
    /// The kind of a column from its catalog entry: `format_type(atttypid, atttypmod)`,
    /// the type's `typcategory` and the name of its base type.
    pub(crate) fn from_catalog(sql_type: String, category: &str, base: &str) -> ColumnKind {
        match (category, base) {
            ("A", _) | ("C", _) => ColumnKind::ViaJson,
            (_, "json") | (_, "jsonb") => ColumnKind::Json(sql_type),
            _ => ColumnKind::Text(sql_type),
        }
    }

    /// Whether the column's values go in a typed text array.
    pub(crate) fn typed(&self) -> bool {
        !matches!(self, ColumnKind::ViaJson)
    }

    /// The cast that turns the sent text into the column's type (`integer`,
    /// `jsonb::json`), or `None` for a column sent through JSON. JSON goes through `jsonb`
    /// first, so a `json` column gets the text `jsonb` writes, as with `jsonb_populate_record`.
    pub(crate) fn cast(&self) -> Option<String> {
        match self {
            ColumnKind::Text(t) => Some(t.clone()),
            ColumnKind::Json(t) => Some(format!("jsonb::{t}")),
            ColumnKind::ViaJson => None,
        }
    }

    /// The text sent for `v` (`None` is SQL `NULL`).
    pub(crate) fn text(&self, v: Option<&Value>) -> Option<String> {
        match (self, v) {
            (_, None | Some(Value::Null)) => None,
            (ColumnKind::Text(_), Some(Value::String(s))) => Some(s.clone()),
            (_, Some(other)) => Some(other.to_string()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn values_become_what_jsonb_populate_record_would_feed_the_column() {
        let text = ColumnKind::from_catalog("integer".into(), "N", "int4");
        assert_eq!(text.text(Some(&json!(7))), Some("7".into()));
        assert_eq!(text.text(Some(&json!("7"))), Some("7".into()));
        assert_eq!(text.text(Some(&json!(true))), Some("true".into()));
        assert_eq!(text.text(Some(&json!({"a": 1}))), Some("{\"a\":1}".into()));
        assert_eq!(text.text(Some(&Value::Null)), None);
        assert_eq!(text.text(None), None);
        let j = ColumnKind::from_catalog("jsonb".into(), "U", "jsonb");
        assert_eq!(j.text(Some(&json!("x"))), Some("\"x\"".into()));
        assert_eq!(j.cast().as_deref(), Some("jsonb::jsonb"));
        let arr = ColumnKind::from_catalog("integer[]".into(), "A", "_int4");
        assert_eq!(arr, ColumnKind::ViaJson);
        assert_eq!(arr.cast(), None);
    }
}
