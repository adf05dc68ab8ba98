//! Debezium change events: the model and the parser.
//!
//! One record of the log holds one event, as Debezium's JSON converter writes it: with the
//! `{"schema": …, "payload": …}` wrapper (`value.converter.schemas.enable=true`) or without it.
//! A tombstone (the JSON `null`, an empty record or one of JSON whitespace only: space, tab,
//! line feed, carriage return; or a wrapper whose payload is `null`) is accepted and carries
//! no change.
//!
//! Parsing never panics: whatever the bytes, the answer is an [`Event`], a tombstone, or an
//! [`EventError`] saying what is wrong (the caller adds where: [`BadEvent`]).

use serde_json::{Map, Value};
use std::fmt;

/// What a change event does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Op {
    /// `c`: a row was inserted; `after` is upserted.
    Create,
    /// `r`: a row read by a snapshot; `after` is upserted.
    Read,
    /// `u`: a row was updated; `after` is upserted, after deleting `before`'s key when the key
    /// changed.
    Update,
    /// `d`: a row was deleted; `before`'s key is deleted.
    Delete,
    /// `t`: the table was truncated.
    Truncate,
}

impl Op {
    /// The op's letter in Debezium's `op` field.
    pub fn letter(self) -> &'static str {
        match self {
            Op::Create => "c",
            Op::Read => "r",
            Op::Update => "u",
            Op::Delete => "d",
            Op::Truncate => "t",
        }
    }

    pub(crate) fn parse(s: &str) -> Option<Op> {
        Some(match s {
            "c" => Op::Create,
            "r" => Op::Read,
            "u" => Op::Update,
            "d" => Op::Delete,
            "t" => Op::Truncate,
            _ => return None,
        })
    }
}

/// A row image (`before` or `after`): column name to JSON value.
pub type Row = Map<String, Value>;

/// One parsed change event; its images are [`Row`]s unless the sink reads them its own way
/// (see [`crate::plan::Image`]).
#[derive(Debug, Clone, PartialEq)]
pub struct Event<R = Row> {
    /// What the event does.
    pub op: Op,
    /// `source.db`, when present.
    pub db: Option<String>,
    /// `source.schema`, when present (the target schema comes from the sink's configuration).
    pub schema: Option<String>,
    /// `source.table`: the target table's name.
    pub table: String,
    /// The source position (`source.lsn`, or the configured field): below 2^63.
    pub position: u64,
    /// The row before the change (`u` with a key change or a full replica identity, `d`).
    pub before: Option<R>,
    /// The row after the change (`c`, `r`, `u`).
    pub after: Option<R>,
}

impl<R> Event<R> {
    /// The rank that orders this event against what a row already holds: a snapshot read
    /// (`r`) ranks below every streamed change whatever its position, streamed changes rank
    /// by position. A row keeps the rank of the event that wrote it, and an event whose rank
    /// is not above the row's changes nothing (see `docs/targets/cdc.md`, "The position
    /// guard").
    ///
    /// Why reads rank low: a snapshot's rows carry the position of the slot's consistent
    /// point, and a transaction that committed after that point (so is not in the snapshot)
    /// can have changes logged before it. Ranked by position alone, its streamed update would
    /// lose to the older snapshot row.
    pub fn rank(&self) -> i64 {
        // position < 2^63 (checked by the parser), so both arms stay in range and every read
        // ranks below every streamed change.
        let p = self.position as i64;
        match self.op {
            Op::Read => i64::MIN + p,
            _ => p,
        }
    }
}

/// Where the source position is read from in each event: a path of object fields, by default
/// `source.lsn`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PositionField(Vec<String>);

impl PositionField {
    /// A dotted path inside the payload, such as `source.lsn` or `source.sequence_no`.
    pub fn new(path: &str) -> Result<Self, String> {
        let parts: Vec<String> = path.split('.').map(str::to_string).collect();
        if parts.iter().any(String::is_empty) {
            return Err(format!(
                "position field {path:?} must be a dotted path of field names, such as source.lsn"
            ));
        }
        Ok(PositionField(parts))
    }

    /// The path as written.
    pub fn path(&self) -> String {
        self.0.join(".")
    }
}

impl Default for PositionField {
    fn default() -> Self {
        PositionField(vec!["source".into(), "lsn".into()])
    }
}

/// What is wrong with one event.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum EventError {
    /// The record is not JSON.
    #[error("not JSON: {0}")]
    NotJson(String),
    /// The event (or its payload) is not a JSON object.
    #[error("the event is a JSON {0}, not an object")]
    NotObject(&'static str),
    /// A field the op needs is missing or null.
    #[error("field {0} is missing")]
    Missing(String),
    /// A field has the wrong JSON type.
    #[error("field {field} must be {expected}, found {found}")]
    WrongType {
        /// The field's path.
        field: String,
        /// What it must be.
        expected: &'static str,
        /// What it is, shortened.
        found: String,
    },
    /// `op` is not one of `c`, `r`, `u`, `d`, `t`.
    #[error("op {0:?} is not one of c, r, u, d, t")]
    UnknownOp(String),
    /// The position is not an integer in `[0, 2^63)` (a JSON number, or a string of decimal
    /// digits), or an LSN `X/Y` of two hex numbers below that.
    #[error("position field {field} is {found}: expected an integer in [0, 2^63), a decimal string or an LSN such as 16/B374D848")]
    BadPosition {
        /// The position field's path.
        field: String,
        /// What it holds, shortened.
        found: String,
    },
}

/// An event that cannot be applied, with where it is: the log position and, when known, the
/// source position.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("event at checkpoint {checkpoint}, index {index}: {error}")]
pub struct BadEvent {
    /// The checkpoint id of the epoch holding the event.
    pub checkpoint: u64,
    /// The index of the event in its epoch.
    pub index: u64,
    /// What is wrong.
    pub error: EventError,
}

fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

fn short(v: &Value) -> String {
    let mut s = v.to_string();
    if s.len() > 60 {
        let mut cut = 57;
        while !s.is_char_boundary(cut) {
            cut -= 1;
        }
        s.truncate(cut);
        s.push_str("...");
    }
    s
}

/// Parses a PostgreSQL LSN written `X/Y` (two hex numbers of up to 32 bits).
pub fn parse_lsn(s: &str) -> Option<u64> {
    let (hi, lo) = s.split_once('/')?;
    let hex = |x: &str| !x.is_empty() && x.len() <= 8 && x.bytes().all(|b| b.is_ascii_hexdigit());
    if !hex(hi) || !hex(lo) {
        return None;
    }
    let hi = u64::from_str_radix(hi, 16).ok()?;
    let lo = u64::from_str_radix(lo, 16).ok()?;
    Some((hi << 32) | lo)
}

/// Formats an LSN as PostgreSQL writes it (`16/B374D848`).
pub fn format_lsn(lsn: u64) -> String {
    format!("{:X}/{:X}", lsn >> 32, lsn & 0xffff_ffff)
}

/// A position written as a string: decimal digits only, or an LSN.
fn string_position(s: &str) -> Option<u64> {
    if !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()) {
        return s.parse().ok();
    }
    parse_lsn(s)
}

fn position(v: Option<&Value>, field: &PositionField) -> Result<u64, EventError> {
    let bad = |v: &Value| EventError::BadPosition {
        field: field.path(),
        found: short(v),
    };
    let (p, v) = match v {
        None | Some(Value::Null) => return Err(EventError::Missing(field.path())),
        Some(v @ Value::Number(n)) => (n.as_u64(), v),
        Some(v @ Value::String(s)) => (string_position(s), v),
        Some(other) => return Err(bad(other)),
    };
    match p {
        Some(p) if p < 1 << 63 => Ok(p),
        _ => Err(bad(v)),
    }
}

fn image(payload: &mut Map<String, Value>, name: &str) -> Result<Option<Row>, EventError> {
    match payload.remove(name) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Object(m)) => Ok(Some(m)),
        Some(other) => Err(EventError::WrongType {
            field: name.into(),
            expected: "an object or null",
            found: format!("{} {}", kind(&other), short(&other)),
        }),
    }
}

fn string(map: &Map<String, Value>, field: &str, path: &str) -> Result<Option<String>, EventError> {
    match map.get(field) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(other) => Err(EventError::WrongType {
            field: path.into(),
            expected: "a string",
            found: format!("{} {}", kind(other), short(other)),
        }),
    }
}

/// Parses one record. `Ok(None)` is a tombstone.
pub fn parse(record: &[u8], field: &PositionField) -> Result<Option<Event>, EventError> {
    if record
        .iter()
        .all(|b| matches!(b, b' ' | b'\t' | b'\n' | b'\r'))
    {
        return Ok(None);
    }
    if let Some(parsed) = quick::parse(record, field) {
        return Ok(parsed);
    }
    let v: Value =
        serde_json::from_slice(record).map_err(|e| EventError::NotJson(e.to_string()))?;
    from_value(v, field)
}

/// The common shapes, read straight into an [`Event`]: the fields an event does not need
/// (the converter's `schema`, most of `source`, `ts_ms`, `transaction`) are skipped unread
/// instead of built as JSON values, and strings are borrowed from the record. Anything
/// unusual (a wrong type, a duplicate field, a bare `payload`, a position field other than
/// `source.lsn`) answers `None`, and the record is read again the general way, which gives
/// the same event or names what is wrong: this path never decides differently, it only
/// decides sooner.
pub(crate) mod quick {
    use super::{Event, Op, PositionField, Row};
    use serde::de::IgnoredAny;
    use serde::Deserialize;
    use serde_json::value::RawValue;
    use serde_json::Value;
    use std::borrow::Cow;

    /// An event's fields, its images read as `I`: [`Image`] (a [`Row`]) or the sink's spans (`crate::read::Spans`).
    #[derive(Deserialize)]
    #[serde(bound(deserialize = "I: Deserialize<'de>"))]
    struct Envelope<'a, I> {
        /// `None`: absent; `Some(None)`: `null` (the general way tells the two apart).
        #[serde(borrow, default, deserialize_with = "present")]
        op: Option<Option<&'a str>>,
        #[serde(default = "none")]
        before: Option<I>,
        #[serde(default = "none")]
        after: Option<I>,
        #[serde(borrow, default)]
        source: Option<Source<'a>>,
        #[serde(borrow, default)]
        payload: Option<&'a RawValue>,
        #[serde(default)]
        schema: Option<IgnoredAny>,
    }

    #[derive(Deserialize)]
    struct Source<'a> {
        #[serde(borrow, default)]
        table: Option<Text<'a>>,
        #[serde(borrow, default)]
        db: Option<Text<'a>>,
        #[serde(borrow, default)]
        schema: Option<Text<'a>>,
        /// The position as written: read below without building a JSON value.
        #[serde(borrow, default)]
        lsn: Option<&'a RawValue>,
    }

    /// A string, borrowed from the record unless it holds escapes. (Serde borrows a
    /// `Cow<str>` field marked `borrow`, but not one inside an `Option`: it would copy every
    /// `source` string into a `String` first.)
    #[derive(Deserialize)]
    struct Text<'a>(#[serde(borrow)] Cow<'a, str>);

    /// Whether `record` holds `\uD800`–`\uDFFF` (either case) anywhere.
    fn has_surrogate_escape(record: &[u8]) -> bool {
        // Most records hold no escape at all: one quick search for a backslash first.
        record.contains(&b'\\')
            && record.windows(4).any(|w| {
                w[0] == b'\\'
                    && w[1] == b'u'
                    && w[2] | 0x20 == b'd'
                    && matches!(w[3] | 0x20, b'8' | b'9' | b'a'..=b'f')
            })
    }

    /// The position from its JSON text: a plain decimal number, or a string without escapes
    /// holding one or an LSN, below 2^63, as [`position`](super::position) reads them; `None` for anything
    /// else, which the general way reads (and names if it is wrong).
    fn raw_position(raw: &RawValue) -> Option<u64> {
        position_text(raw.get())
    }

    /// [`raw_position`] of a value's JSON text.
    pub(crate) fn position_text(text: &str) -> Option<u64> {
        // A number's text is its digits; a string's, its contents when it has no escapes.
        let digits = match text.strip_prefix('"') {
            Some(quoted) => quoted.strip_suffix('"').filter(|s| !s.contains('\\'))?,
            None => text,
        };
        super::string_position(digits).filter(|&p| p < 1 << 63)
    }

    /// A row image, read with less work than `Row`'s own reading for the common values: each
    /// value's JSON text is found first, then a string without escapes is copied as it is
    /// and a plain integer becomes its number directly; anything else is read as `Row` reads
    /// it. The map is the same (a repeated column keeps its last value, as there).
    struct Image(Row);

    impl<'de> Deserialize<'de> for Image {
        fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Image, D::Error> {
            struct Visit;
            impl<'de> serde::de::Visitor<'de> for Visit {
                type Value = Image;
                fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                    f.write_str("a row image")
                }
                fn visit_map<A: serde::de::MapAccess<'de>>(
                    self,
                    mut map: A,
                ) -> Result<Image, A::Error> {
                    let mut row = Row::new();
                    while let Some(column) = map.next_key::<String>()? {
                        let raw: &'de RawValue = map.next_value()?;
                        row.insert(column, value(raw).map_err(serde::de::Error::custom)?);
                    }
                    Ok(Image(row))
                }
            }
            d.deserialize_map(Visit)
        }
    }

    /// The JSON value `raw` holds, as `Value`'s own reading gives it.
    pub(crate) fn value(raw: &RawValue) -> Result<Value, serde_json::Error> {
        let text = raw.get();
        match text.as_bytes().first() {
            Some(b'"') => {
                if let Some(inner) = text[1..].strip_suffix('"') {
                    if !inner.contains('\\') {
                        return Ok(Value::String(inner.to_string()));
                    }
                }
            }
            Some(b'-' | b'0'..=b'9') if crate::columns::plain_integer(text) => {
                // Written back as the same digits (no sign on zero, no leading zeros).
                if let Ok(i) = text.parse::<i64>() {
                    return Ok(Value::Number(i.into()));
                }
            }
            Some(b'n') if text == "null" => return Ok(Value::Null),
            Some(b't') if text == "true" => return Ok(Value::Bool(true)),
            Some(b'f') if text == "false" => return Ok(Value::Bool(false)),
            _ => {}
        }
        serde_json::from_str(text)
    }

    fn none<I>() -> Option<I> {
        None
    }

    fn present<'de, D: serde::Deserializer<'de>>(
        d: D,
    ) -> Result<Option<Option<&'de str>>, D::Error> {
        Option::<&'de str>::deserialize(d).map(Some)
    }

    pub(super) fn parse(record: &[u8], field: &PositionField) -> Option<Option<Event>> {
        parse_as::<Image>(record, field).map(|e| {
            e.map(|e| Event {
                op: e.op,
                db: e.db,
                schema: e.schema,
                table: e.table,
                position: e.position,
                before: e.before.map(|i| i.0),
                after: e.after.map(|i| i.0),
            })
        })
    }

    /// [`parse`], the images read as `I`; `text` is the record as text.
    pub(crate) fn parse_text_as<'a, I: Deserialize<'a>>(
        text: &'a str,
        field: &PositionField,
    ) -> Option<Option<Event<I>>> {
        if !usable(text.as_bytes(), field) {
            return None;
        }
        envelope(text)
    }

    fn parse_as<'a, I: Deserialize<'a>>(
        record: &'a [u8],
        field: &PositionField,
    ) -> Option<Option<Event<I>>> {
        if !usable(record, field) {
            return None;
        }
        // Checked as UTF-8 once, so the parser need not check each string again (not UTF-8:
        // the general way names it).
        let text = std::str::from_utf8(record).ok()?;
        envelope(text)
    }

    /// Whether the record may be read this way at all.
    pub(crate) fn usable(record: &[u8], field: &PositionField) -> bool {
        if field.0.len() != 2 || field.0[0] != "source" || field.0[1] != "lsn" {
            return false;
        }
        // The general way refuses JSON nested deeper than its parser's limit (128), also in
        // fields this way skips unread; a record with that many openers goes the general way.
        // serde_json does not check the `\u` escapes of what it skips, where the general way
        // refuses a lone surrogate: a record with a surrogate escape anywhere goes that way.
        if has_surrogate_escape(record) {
            return false;
        }
        !(record.len() > 128
            && record
                .iter()
                .fold(0usize, |n, &b| n + usize::from(b == b'[' || b == b'{'))
                > 128)
    }

    fn envelope<'a, I: Deserialize<'a>>(text: &'a str) -> Option<Option<Event<I>>> {
        let top: Envelope<I> = serde_json::from_str(text).ok()?;
        let e = match (&top.payload, &top.op, &top.schema) {
            // The converter's wrapper.
            (Some(payload), None, Some(_)) => {
                if payload.get() == "null" {
                    return Some(None);
                }
                let inner: Envelope<I> = serde_json::from_str(payload.get()).ok()?;
                if inner.payload.is_some() {
                    return None;
                }
                inner
            }
            // A bare `payload` may be the wrapper without its schema: the general way decides.
            (Some(_), None, None) => return None,
            _ => top,
        };
        let op = Op::parse(e.op.flatten()?)?;
        let source = e.source?;
        let table = source.table?.0.into_owned();
        let position = raw_position(source.lsn?)?;
        match op {
            Op::Create | Op::Read | Op::Update if e.after.is_none() => return None,
            Op::Delete if e.before.is_none() => return None,
            _ => {}
        }
        Some(Some(Event {
            op,
            db: source.db.map(|t| t.0.into_owned()),
            schema: source.schema.map(|t| t.0.into_owned()),
            table,
            position,
            before: e.before,
            after: e.after,
        }))
    }
}

/// Interprets one JSON value as an event. `Ok(None)` is a tombstone.
pub fn from_value(v: Value, field: &PositionField) -> Result<Option<Event>, EventError> {
    let mut top = match v {
        Value::Null => return Ok(None),
        Value::Object(m) => m,
        other => return Err(EventError::NotObject(kind(&other))),
    };
    // The converter's wrapper: {"schema": …, "payload": …}. An event itself never has a
    // `payload` field, so its presence (with `schema`, or alone) means the wrapper.
    let wrapped = top.contains_key("payload")
        && (top.contains_key("schema") || top.len() == 1)
        && !top.contains_key("op");
    let mut payload = if wrapped {
        match top.remove("payload") {
            Some(Value::Null) | None => return Ok(None),
            Some(Value::Object(m)) => m,
            Some(other) => return Err(EventError::NotObject(kind(&other))),
        }
    } else {
        top
    };
    let op_s = string(&payload, "op", "op")?.ok_or_else(|| EventError::Missing("op".into()))?;
    let op = Op::parse(&op_s).ok_or(EventError::UnknownOp(op_s))?;
    let source = match payload.get("source") {
        Some(Value::Object(m)) => m,
        None | Some(Value::Null) => return Err(EventError::Missing("source".into())),
        Some(other) => {
            return Err(EventError::WrongType {
                field: "source".into(),
                expected: "an object",
                found: format!("{} {}", kind(other), short(other)),
            })
        }
    };
    let table = string(source, "table", "source.table")?
        .ok_or_else(|| EventError::Missing("source.table".into()))?;
    let db = string(source, "db", "source.db")?;
    let schema = string(source, "schema", "source.schema")?;
    // Walk the position path inside the payload.
    let mut at: Option<&Value> = payload.get(&field.0[0]);
    for part in &field.0[1..] {
        at = at.and_then(|v| v.get(part));
    }
    let position = position(at, field)?;
    let before = image(&mut payload, "before")?;
    let after = image(&mut payload, "after")?;
    match op {
        Op::Create | Op::Read | Op::Update if after.is_none() => {
            return Err(EventError::Missing(format!("after (op {})", op.letter())))
        }
        Op::Delete if before.is_none() => return Err(EventError::Missing("before (op d)".into())),
        _ => {}
    }
    Ok(Some(Event {
        op,
        db,
        schema,
        table,
        position,
        before,
        after,
    }))
}

/// Writes an event as Debezium's JSON (without the schema wrapper): `before`, `after`,
/// `source` (with `db`, `schema`, `table`, `lsn` and the given extra fields), `op`, `ts_ms`.
pub fn to_json(e: &Event, source_extra: &[(&str, Value)], ts_ms: u64) -> Value {
    let mut source = Map::new();
    source.insert("connector".into(), "postgresql".into());
    if let Some(db) = &e.db {
        source.insert("db".into(), db.clone().into());
    }
    if let Some(s) = &e.schema {
        source.insert("schema".into(), s.clone().into());
    }
    source.insert("table".into(), e.table.clone().into());
    source.insert("lsn".into(), e.position.into());
    for (k, v) in source_extra {
        source.insert((*k).into(), v.clone());
    }
    let img = |r: &Option<Row>| r.clone().map_or(Value::Null, Value::Object);
    let mut m = Map::new();
    m.insert("before".into(), img(&e.before));
    m.insert("after".into(), img(&e.after));
    m.insert("source".into(), Value::Object(source));
    m.insert("op".into(), e.op.letter().into());
    m.insert("ts_ms".into(), ts_ms.into());
    Value::Object(m)
}

impl fmt::Display for Op {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.letter())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn p(v: Value) -> Result<Option<Event>, EventError> {
        parse(v.to_string().as_bytes(), &PositionField::default())
    }

    #[test]
    fn every_op_and_both_envelopes() {
        let ev = json!({"before": null, "after": {"id": 1, "name": "a"},
            "source": {"db": "shop", "schema": "public", "table": "items", "lsn": 100},
            "op": "c", "ts_ms": 1});
        let e = p(ev.clone()).unwrap().unwrap();
        assert_eq!(e.op, Op::Create);
        assert_eq!(e.table, "items");
        assert_eq!(e.db.as_deref(), Some("shop"));
        assert_eq!(e.position, 100);
        assert_eq!(e.after.as_ref().unwrap()["name"], "a");
        let wrapped = json!({"schema": {"type": "struct"}, "payload": ev});
        assert_eq!(p(wrapped).unwrap().unwrap(), e);
        for (op, want) in [("r", Op::Read), ("u", Op::Update)] {
            let ev = json!({"after": {"id": 1}, "source": {"table": "t", "lsn": 5}, "op": op});
            assert_eq!(p(ev).unwrap().unwrap().op, want);
        }
        let d = json!({"before": {"id": 1}, "after": null, "source": {"table": "t", "lsn": 6}, "op": "d"});
        assert_eq!(p(d).unwrap().unwrap().op, Op::Delete);
        let t = json!({"source": {"table": "t", "lsn": 7}, "op": "t"});
        assert_eq!(p(t).unwrap().unwrap().op, Op::Truncate);
    }

    #[test]
    fn tombstones_carry_nothing() {
        let f = PositionField::default();
        assert_eq!(parse(b"null", &f), Ok(None));
        assert_eq!(parse(b"", &f), Ok(None));
        assert_eq!(parse(b"  \n", &f), Ok(None));
        assert_eq!(p(json!({"schema": null, "payload": null})), Ok(None));
    }

    #[test]
    fn positions_as_numbers_strings_and_lsns() {
        let at = |lsn: Value| {
            p(json!({"after": {"id": 1}, "source": {"table": "t", "lsn": lsn}, "op": "c"}))
        };
        assert_eq!(at(json!("42")).unwrap().unwrap().position, 42);
        assert_eq!(
            at(json!("16/B374D848")).unwrap().unwrap().position,
            0x16_B374_D848
        );
        assert!(matches!(at(json!(-1)), Err(EventError::BadPosition { .. })));
        assert!(matches!(
            at(json!(1.5)),
            Err(EventError::BadPosition { .. })
        ));
        assert!(matches!(
            at(json!(u64::MAX)),
            Err(EventError::BadPosition { .. })
        ));
        assert!(matches!(
            at(json!("x/y")),
            Err(EventError::BadPosition { .. })
        ));
        assert!(matches!(at(Value::Null), Err(EventError::Missing(_))));
        let custom = PositionField::new("source.seq").unwrap();
        let e = parse(
            br#"{"after":{"id":1},"source":{"table":"t","seq":9},"op":"c"}"#,
            &custom,
        )
        .unwrap()
        .unwrap();
        assert_eq!(e.position, 9);
        assert!(PositionField::new("source..x").is_err());
    }

    #[test]
    fn what_is_wrong_is_named() {
        assert!(matches!(
            parse(b"{", &PositionField::default()),
            Err(EventError::NotJson(_))
        ));
        assert_eq!(p(json!([1])), Err(EventError::NotObject("array")));
        assert_eq!(
            p(json!({"after": {"id": 1}, "source": {"table": "t", "lsn": 1}, "op": "x"})),
            Err(EventError::UnknownOp("x".into()))
        );
        assert_eq!(
            p(json!({"after": null, "source": {"table": "t", "lsn": 1}, "op": "c"})),
            Err(EventError::Missing("after (op c)".into()))
        );
        assert_eq!(
            p(json!({"before": null, "source": {"table": "t", "lsn": 1}, "op": "d"})),
            Err(EventError::Missing("before (op d)".into()))
        );
        assert_eq!(
            p(json!({"after": {"id": 1}, "source": {"lsn": 1}, "op": "c"})),
            Err(EventError::Missing("source.table".into()))
        );
        assert!(matches!(
            p(json!({"after": [1], "source": {"table": "t", "lsn": 1}, "op": "c"})),
            Err(EventError::WrongType { .. })
        ));
    }

    #[test]
    fn reads_rank_below_every_streamed_change() {
        let ev = |op: &str, lsn: u64| {
            p(json!({"after": {"id": 1}, "source": {"table": "t", "lsn": lsn}, "op": op}))
                .unwrap()
                .unwrap()
        };
        assert!(ev("r", (1 << 63) - 1).rank() < ev("c", 0).rank());
        assert!(ev("r", 5).rank() < ev("r", 6).rank());
        assert!(ev("u", 5).rank() < ev("u", 6).rank());
    }

    #[test]
    fn written_events_read_back() {
        let e = p(json!({"before": {"id": 1}, "after": {"id": 2, "v": [1, 2]},
            "source": {"db": "d", "schema": "s", "table": "t", "lsn": 77}, "op": "u"}))
        .unwrap()
        .unwrap();
        let back = from_value(
            to_json(&e, &[("txId", json!(5))], 3),
            &PositionField::default(),
        );
        assert_eq!(back.unwrap().unwrap(), e);
        assert_eq!(parse_lsn(&format_lsn(0x16_B374_D848)), Some(0x16_B374_D848));
    }

    proptest::proptest! {
        /// Arbitrary JSON and arbitrary bytes: an answer, never a panic.
        #[test]
        fn arbitrary_input_never_panics(bytes in proptest::collection::vec(proptest::num::u8::ANY, 0..200),
                                         op in "[a-z]{0,2}", lsn in proptest::num::i64::ANY,
                                         table in proptest::option::of("[a-z]{0,5}"),
                                         img in proptest::option::of(proptest::collection::vec(("[a-z]{1,3}", proptest::num::i32::ANY), 0..4))) {
            let _ = parse(&bytes, &PositionField::default());
            let mut src = serde_json::Map::new();
            if let Some(t) = table { src.insert("table".into(), t.into()); }
            src.insert("lsn".into(), lsn.into());
            let after = img.map_or(Value::Null, |cols| Value::Object(cols.into_iter().map(|(k, v)| (k, Value::from(v))).collect()));
            let ev = json!({"op": op, "source": src, "after": after.clone(), "before": after});
            let _ = parse(ev.to_string().as_bytes(), &PositionField::default());
            let _ = parse(json!({"schema": {}, "payload": ev}).to_string().as_bytes(), &PositionField::default());
        }

        /// Any JSON value at any place of the event: an answer, never a panic.
        #[test]
        fn arbitrary_json_values_never_panic(v in arb_json(), at in 0usize..6) {
            let mut ev = json!({"before": {"id": 1}, "after": {"id": 1}, "source": {"table": "t", "lsn": 1}, "op": "u"});
            match at {
                0 => ev["op"] = v,
                1 => ev["source"] = v,
                2 => ev["source"]["lsn"] = v,
                3 => ev["after"] = v,
                4 => ev["source"]["table"] = v,
                _ => ev = json!({"schema": null, "payload": v}),
            }
            let _ = parse(ev.to_string().as_bytes(), &PositionField::default());
        }
    }

    /// The general way alone, for comparison with the quick one.
    fn general(record: &[u8]) -> Result<Option<Event>, EventError> {
        let v: Value =
            serde_json::from_slice(record).map_err(|e| EventError::NotJson(e.to_string()))?;
        from_value(v, &PositionField::default())
    }

    proptest::proptest! {
        /// Wherever the quick way answers, it answers what the general way does: over the
        /// shapes it takes, the wrapper with and without its schema, `op` absent and `null`,
        /// duplicate fields, and any JSON value at any place.
        #[test]
        fn the_quick_way_decides_as_the_general_way(v in arb_json(), at in 0usize..9, shape in 0usize..8) {
            let mut ev = json!({"before": {"id": 1, "v": "a\\u00e9"}, "after": {"id": 2, "n": 1.50},
                                "source": {"table": "t", "lsn": "0/1A", "db": "d", "schema": "s", "ts_ms": 5}, "op": "u", "ts_ms": 1});
            match at {
                0 => ev["op"] = v,
                1 => ev["source"] = v,
                2 => ev["source"]["lsn"] = v,
                3 => ev["after"] = v,
                4 => ev["before"] = v,
                5 => ev["source"]["table"] = v,
                6 => ev["source"]["db"] = v,
                7 => ev["payload"] = v,
                _ => { ev.as_object_mut().unwrap().remove("op"); }
            }
            let text = ev.to_string();
            let record = match shape {
                0 => text,
                1 => format!(r#"{{"schema": {{"type": "struct"}}, "payload": {text}}}"#),
                2 => format!(r#"{{"payload": {text}}}"#),
                3 => format!(r#"{{"schema": null, "payload": {text}}}"#),
                4 => format!(r#"{{"op": "c", {}"#, &text[1..]),
                5 => format!(r#"{{"source": {{"table": "x", "lsn": 9}}, {}"#, &text[1..]),
                6 => format!(r#"{{"schema": {{}}, "payload": {text}, "op": null}}"#),
                _ => r#"{"schema": {}, "payload": null}"#.to_string(),
            };
            if let Some(quick) = quick::parse(record.as_bytes(), &PositionField::default()) {
                proptest::prop_assert_eq!(Ok(quick), general(record.as_bytes()), "{}", record);
            }
            proptest::prop_assert_eq!(parse(record.as_bytes(), &PositionField::default()), general(record.as_bytes()));
        }
    }

    #[test]
    fn the_quick_way_takes_the_common_shapes() {
        let f = PositionField::default();
        let ev = r#"{"before": null, "after": {"id": 1}, "source": {"version": "2.5", "connector": "postgresql", "db": "d", "schema": "public", "table": "t", "lsn": 24023128, "txId": 7}, "op": "c", "ts_ms": 1}"#;
        // A position written as an LSN, and names with escapes (copied, not borrowed).
        let lsn_text = ev.replace("24023128", r#""16/B374D848""#);
        let escaped = ev.replace(r#""table": "t""#, r#""table": "t\u00e9\"x""#);
        for record in [
            ev.to_string(),
            format!(r#"{{"schema": {{"type": "struct", "fields": []}}, "payload": {ev}}}"#),
            lsn_text,
            escaped.clone(),
        ] {
            let q = quick::parse(record.as_bytes(), &f).expect("taken the quick way");
            assert_eq!(Ok(q), general(record.as_bytes()));
        }
        // Images of every kind of value and spelling read as the general way reads them.
        for image in [
            r#"{"a": -0, "b": 1e3, "c": 1.50, "d": 12345678901234567890123, "e": "x\"y"}"#,
            r#"{"a": -9223372036854775808, "b": 9223372036854775808, "c": 18446744073709551616}"#,
            r#"{"f": "\u00e9", "g": [1, {"h": null}], "i": true, "j": false, "k": null}"#,
            r#"{ "a" : 1 , "b":"x" , "a": "again" }"#,
            r#"{"": "", "s p": " ", "n": -12, "z": 0, "e": 1E-2, "big": -0.000}"#,
        ] {
            let record = ev.replace(r#""after": {"id": 1}"#, &format!(r#""after": {image}"#));
            assert_ne!(record, ev);
            let q = quick::parse(record.as_bytes(), &f).expect("taken the quick way");
            assert_eq!(Ok(q), general(record.as_bytes()), "{image}");
        }
        // A surrogate escape anywhere (serde_json checks none in what it skips) goes the
        // general way: a lone one is refused, a pair read.
        for (text, ok) in [
            (r#""\ud83d\ude00""#, true),
            (r#""\ud800""#, false),
            (r#""\uDC00x""#, false),
        ] {
            for record in [
                ev.replace(
                    r#""after": {"id": 1}"#,
                    &format!(r#""after": {{"id": 1, "s": {text}}}"#),
                ),
                ev.replace(r#""ts_ms": 1"#, &format!(r#""ts_ms": {text}"#)),
                ev.replace(r#""version": "2.5""#, &format!(r#""version": {text}"#)),
            ] {
                assert!(quick::parse(record.as_bytes(), &f).is_none(), "{record}");
                assert_eq!(parse(record.as_bytes(), &f), general(record.as_bytes()));
                assert_eq!(parse(record.as_bytes(), &f).is_ok(), ok, "{record}");
            }
        }
        let e = parse(escaped.as_bytes(), &f).unwrap().unwrap();
        assert_eq!(e.table, "t\u{e9}\"x");
        assert_eq!(parse(br#"{"schema": {}, "payload": null}"#, &f), Ok(None));
        // Nested past the parser's limit in a field the quick way skips: refused both ways.
        let deep = format!(
            r#"{{"transaction": {}1{}, {}"#,
            "[".repeat(200),
            "]".repeat(200),
            &ev[1..]
        );
        assert!(matches!(
            general(deep.as_bytes()),
            Err(EventError::NotJson(_))
        ));
        assert_eq!(parse(deep.as_bytes(), &f), general(deep.as_bytes()));
        // Another position field, or a bare payload: the general way.
        assert!(quick::parse(
            ev.as_bytes(),
            &PositionField::new("source.sequence").unwrap()
        )
        .is_none());
        assert!(quick::parse(format!(r#"{{"payload": {ev}}}"#).as_bytes(), &f).is_none());
    }

    fn arb_json() -> impl proptest::strategy::Strategy<Value = Value> {
        use proptest::prelude::*;
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::from),
            any::<i64>().prop_map(Value::from),
            any::<f64>()
                .prop_filter("finite", |f| f.is_finite())
                .prop_map(Value::from),
            ".{0,8}".prop_map(Value::from),
        ];
        leaf.prop_recursive(3, 24, 4, |inner| {
            prop_oneof![
                proptest::collection::vec(inner.clone(), 0..4).prop_map(Value::from),
                proptest::collection::btree_map("[a-z]{0,4}", inner, 0..4)
                    .prop_map(|m| Value::Object(m.into_iter().collect())),
            ]
        })
    }
}
