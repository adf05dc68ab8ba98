//! How a JSON value of a row image reaches a target column: as text for the column's input
//! function, sent in one `text[]` array per column and cast on the server.
//!
//! The rule is the one `jsonb_populate_record` follows, so both paths write the same values:
//! a JSON string gives its contents, any other JSON value the text `jsonb` writes for it
//! ([`jsonb_text`]: numbers as `numeric` writes them, `1e3` as `1000`, keys sorted as `jsonb`
//! sorts them), and `null` gives SQL `NULL`. Numbers keep their literal digits from the event
//! on (`serde_json`'s `arbitrary_precision`), so `1.10` and 30-digit integers arrive exact.
//!
//! A `json` or `jsonb` column follows Debezium instead, which sends such a column as a
//! string holding the value's JSON text (`io.debezium.data.Json`): a string is JSON text,
//! read by the server with the column's own JSON type's input (`json` keeps the text exactly:
//! its spacing, key order and duplicate keys; `jsonb` normalizes it as `jsonb` does), so
//! `"null"` is JSON `null`, and text that is not JSON is refused; any other JSON value is
//! taken as itself (written as `jsonb` writes it), and `null` gives SQL `NULL`.
//! Array and composite columns are the exception: `jsonb_populate_record` turns a JSON array
//! or object into them, which text input cannot, so a statement touching one goes through
//! JSON instead ([`ColumnKind::ViaJson`]); its `json` and `jsonb` columns are read from their
//! JSON text there too ([`json_text`]).

use serde_json::Value;

/// How the values of one target column are sent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum ColumnKind {
    /// Text for the input function of the column's type, cast with `::TYPE`.
    Text(String),
    /// A `json` or `jsonb` column: a string is the value's JSON text, any other value is
    /// itself. Holds the whole cast: `json::TYPE` for a column whose base type is `json`
    /// (the text kept exactly), `jsonb::TYPE` for `jsonb`.
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
            (_, "json") => ColumnKind::Json(format!("json::{sql_type}")),
            (_, "jsonb") => ColumnKind::Json(format!("jsonb::{sql_type}")),
            _ => ColumnKind::Text(sql_type),
        }
    }

    /// Whether the column's values go in a typed text array.
    pub(crate) fn typed(&self) -> bool {
        !matches!(self, ColumnKind::ViaJson)
    }

    /// The cast that turns the sent text into the column's type (`integer`,
    /// `json::pg_catalog.json`), or `None` for a column sent through JSON. A `json` column's
    /// text goes through `json` only, so it arrives exactly as sent (never through `jsonb`,
    /// which would reorder keys, drop duplicates and respace it).
    pub(crate) fn cast(&self) -> Option<String> {
        match self {
            ColumnKind::Text(t) | ColumnKind::Json(t) => Some(t.clone()),
            ColumnKind::ViaJson => None,
        }
    }

    /// The text sent for `v` (`None` is SQL `NULL`).
    pub(crate) fn text(&self, v: Option<&Value>) -> Option<String> {
        match (self, v) {
            (_, None | Some(Value::Null)) => None,
            (ColumnKind::Text(_), Some(Value::String(s))) => Some(s.clone()),
            (ColumnKind::Text(_), Some(Value::Number(n))) => Some(numeric_text(n.as_str())),
            (ColumnKind::Text(_), Some(other)) => {
                let mut out = String::new();
                jsonb_text(other, &mut out);
                Some(out)
            }
            (ColumnKind::Json(_), Some(v)) => json_text(v),
            (ColumnKind::ViaJson, Some(other)) => Some(other.to_string()),
        }
    }

    /// Whether the column is a `json` or `jsonb` column.
    pub(crate) fn is_json(&self) -> bool {
        matches!(self, ColumnKind::Json(_))
    }
}

/// The JSON text a `json` or `jsonb` column gets for `v`: a string is JSON text already
/// (Debezium's encoding), kept exactly; any other value was parsed already (its spacing,
/// key order and duplicate keys are gone), so it is written as `jsonb` writes it, as
/// `jsonb_populate_record` would ([`jsonb_text`]); `null` is SQL `NULL`.
pub(crate) fn json_text(v: &Value) -> Option<String> {
    match v {
        Value::Null => None,
        Value::String(s) => Some(s.clone()),
        other => {
            let mut out = String::new();
            jsonb_text(other, &mut out);
            Some(out)
        }
    }
}

/// Longest number text written out in full; a longer one (an exponent in the thousands) goes
/// as written, and the server's own limits decide.
const MAX_NUMBER_TEXT: i64 = 1 << 16;

/// Writes `v` as PostgreSQL's `jsonb` output writes it: numbers as `numeric` writes them,
/// object keys shortest first and then bytewise, `", "` and `": "` between items, strings
/// with `jsonb`'s escapes.
pub(crate) fn jsonb_text(v: &Value, out: &mut String) {
    match v {
        Value::Null => out.push_str("null"),
        Value::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        Value::Number(n) => out.push_str(&numeric_text(n.as_str())),
        Value::String(s) => escaped(s, out),
        Value::Array(a) => {
            out.push('[');
            for (i, x) in a.iter().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                jsonb_text(x, out);
            }
            out.push(']');
        }
        Value::Object(m) => {
            let mut keys: Vec<&String> = m.keys().collect();
            keys.sort_by(|a, b| a.len().cmp(&b.len()).then_with(|| a.cmp(b)));
            out.push('{');
            for (i, k) in keys.into_iter().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                escaped(k, out);
                out.push_str(": ");
                jsonb_text(&m[k.as_str()], out);
            }
            out.push('}');
        }
    }
}

/// A JSON string as `jsonb` writes it.
fn escaped(s: &str, out: &mut String) {
    use std::fmt::Write;
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

/// Whether a JSON number literal is a plain integer (`7`, `-12`, `0`; not `-0`, `1.0` or
/// `1e3`), which `numeric` writes as it is.
pub(crate) fn plain_integer(lit: &str) -> bool {
    let unsigned = lit.strip_prefix('-').unwrap_or(lit);
    lit == "0"
        || (!unsigned.is_empty()
            && !unsigned.starts_with('0')
            && unsigned.bytes().all(|b| b.is_ascii_digit()))
}

/// The text `numeric` writes for the JSON number literal `lit`: no exponent, the scale the
/// literal implies (`1.50e1` is `15.0`, `1e3` is `1000`), no sign on zero.
pub(crate) fn numeric_text(lit: &str) -> String {
    // The common case, a plain integer (`7`, `-12`), is written as it is.
    if plain_integer(lit) {
        return lit.to_string();
    }
    let (neg, rest) = match lit.strip_prefix('-') {
        Some(r) => (true, r),
        None => (false, lit),
    };
    let (mantissa, exp) = match rest.find(['e', 'E']) {
        Some(i) => match rest[i + 1..].parse::<i64>() {
            Ok(e) => (&rest[..i], e),
            Err(_) => return lit.to_string(),
        },
        None => (rest, 0),
    };
    let (int, frac) = mantissa.split_once('.').unwrap_or((mantissa, ""));
    if int.is_empty() || !int.bytes().chain(frac.bytes()).all(|b| b.is_ascii_digit()) {
        return lit.to_string();
    }
    let digits = format!("{int}{frac}");
    let scale = frac.len() as i64 - exp;
    if scale.abs() > MAX_NUMBER_TEXT || digits.len() as i64 > MAX_NUMBER_TEXT {
        return lit.to_string();
    }
    let (whole, fraction) = if scale <= 0 {
        (
            format!("{digits}{}", "0".repeat((-scale) as usize)),
            String::new(),
        )
    } else if digits.len() as i64 > scale {
        let cut = digits.len() - scale as usize;
        (digits[..cut].to_string(), digits[cut..].to_string())
    } else {
        (
            String::new(),
            format!("{}{digits}", "0".repeat(scale as usize - digits.len())),
        )
    };
    let whole = whole.trim_start_matches('0');
    let whole = if whole.is_empty() { "0" } else { whole };
    let zero = whole == "0" && fraction.bytes().all(|b| b == b'0');
    let mut out = String::with_capacity(whole.len() + fraction.len() + 2);
    if neg && !zero {
        out.push('-');
    }
    out.push_str(whole);
    if !fraction.is_empty() {
        out.push('.');
        out.push_str(&fraction);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn numbers_are_written_as_numeric_writes_them() {
        for (lit, want) in [
            ("0", "0"),
            ("-0", "0"),
            ("-0.00", "0.00"),
            ("7", "7"),
            ("-7", "-7"),
            ("1.10", "1.10"),
            ("1e3", "1000"),
            ("1E+3", "1000"),
            ("1.50e1", "15.0"),
            ("1.5e-3", "0.0015"),
            ("-2.5E-1", "-0.25"),
            ("0.000", "0.000"),
            (
                "123456789012345678901234567890",
                "123456789012345678901234567890",
            ),
            ("1e999999999", "1e999999999"),
        ] {
            assert_eq!(numeric_text(lit), want, "{lit}");
        }
    }

    #[test]
    fn values_become_what_jsonb_populate_record_would_feed_the_column_and_json_columns_take_json_text(
    ) {
        let text = ColumnKind::from_catalog("integer".into(), "N", "int4");
        assert_eq!(text.text(Some(&json!(7))), Some("7".into()));
        assert_eq!(text.text(Some(&json!("7"))), Some("7".into()));
        assert_eq!(text.text(Some(&json!(true))), Some("true".into()));
        assert_eq!(text.text(Some(&json!({"a": 1}))), Some("{\"a\": 1}".into()));
        assert_eq!(text.text(Some(&Value::Null)), None);
        assert_eq!(text.text(None), None);
        let j = ColumnKind::from_catalog("jsonb".into(), "U", "jsonb");
        // A string is JSON text (Debezium's encoding), any other value JSON to write.
        assert_eq!(j.text(Some(&json!("\"x\""))), Some("\"x\"".into()));
        assert_eq!(j.text(Some(&json!("null"))), Some("null".into()));
        assert_eq!(
            j.text(Some(&json!({"a": [1, null]}))),
            Some("{\"a\": [1, null]}".into())
        );
        assert_eq!(j.text(Some(&Value::Null)), None);
        assert_eq!(j.cast().as_deref(), Some("jsonb::jsonb"));
        // A `json` column takes the text as it is: never through `jsonb`.
        let exact = ColumnKind::from_catalog("pg_catalog.json".into(), "U", "json");
        assert_eq!(exact.cast().as_deref(), Some("json::pg_catalog.json"));
        let odd = r#"{"b":1,  "a":2, "a":3}"#;
        assert_eq!(exact.text(Some(&json!(odd))).as_deref(), Some(odd));
        let parsed: Value =
            serde_json::from_str(r#"{"bb": [1e3, -0, 1.10], "a": "x\ny\u0001"}"#).unwrap();
        assert_eq!(
            text.text(Some(&parsed)),
            Some(r#"{"a": "x\ny\u0001", "bb": [1000, 0, 1.10]}"#.into())
        );
        let arr = ColumnKind::from_catalog("integer[]".into(), "A", "_int4");
        assert_eq!(arr, ColumnKind::ViaJson);
        assert_eq!(arr.cast(), None);
    }
}
