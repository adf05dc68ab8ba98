//! The sink's own row images: each column's name and value as spans of the record the event
//! was read from (which the image keeps, a reference-counted slice of the epoch's chunk: no
//! copy), so reading an event builds no map and no string for its common values (a string
//! without escapes, a plain integer, `null`); any other value is read as [`Row`] reads it.
//! Their text goes straight from the record into the statement's arrays ([`TextArray`]).
//!
//! An event the sink reads the general way (an unusual record) keeps its [`Row`]s
//! ([`Img::Row`]): both kinds answer the planner ([`Image`]) and the statements alike, so one
//! epoch may hold both.

use crate::columns::ColumnKind;
use crate::event::Row;
use crate::plan::{Image, TableMeta};
use bytes::Bytes;
use serde_json::Value;
use std::borrow::Cow;

/// One column's value in an image. `S` is how a span is held: `&str` while the record is
/// read, a `(start, end)` byte range of the record afterwards.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Val<S> {
    /// A JSON string without escapes: its contents.
    Str(S),
    /// A plain integer ([`crate::columns::plain_integer`]): its digits.
    Int(S),
    /// `null`.
    Null,
    /// Any other value, read as [`Row`] reads it.
    Json(Box<Value>),
}

/// A column's value, seen through either kind of image.
#[derive(Debug, Clone, Copy)]
pub(crate) enum View<'a> {
    /// A string's contents.
    Str(&'a str),
    /// A plain integer's digits (a JSON number whose text `numeric` writes as it is).
    Int(&'a str),
    /// `null`.
    Null,
    /// Any other JSON value.
    Json(&'a Value),
}

impl<'a> View<'a> {
    fn of(v: &'a Value) -> View<'a> {
        match v {
            Value::Null => View::Null,
            Value::String(s) => View::Str(s),
            other => View::Json(other),
        }
    }

    /// The value as a JSON value (for the rare paths that need one).
    pub(crate) fn to_value(self) -> Value {
        match self {
            View::Str(s) => Value::String(s.to_string()),
            View::Int(t) => serde_json::from_str(t).unwrap_or(Value::Null),
            View::Null => Value::Null,
            View::Json(v) => v.clone(),
        }
    }

    /// The text the column of `kind` gets for this value ([`ColumnKind::text`]), borrowed
    /// where it can be.
    pub(crate) fn text(self, kind: &ColumnKind) -> Option<Cow<'a, str>> {
        match (kind, self) {
            (_, View::Null) => None,
            (ColumnKind::Text(_) | ColumnKind::Json(_), View::Str(s)) => Some(Cow::Borrowed(s)),
            // `numeric` (and `jsonb`) write a plain integer as it is written.
            (ColumnKind::Text(_) | ColumnKind::Json(_), View::Int(t)) => Some(Cow::Borrowed(t)),
            (_, View::Json(v)) => kind.text(Some(v)).map(Cow::Owned),
            (ColumnKind::ViaJson, v) => kind.text(Some(&v.to_value())).map(Cow::Owned),
        }
    }
}

/// A row image: spans of the record it was read from, or a [`Row`].
#[derive(Debug, Clone)]
pub(crate) enum Img {
    /// Read by the sink's own way: the record and each column's spans, sorted by name, each
    /// name once.
    Spans {
        /// The record (UTF-8, checked when it was read).
        data: Bytes,
        /// Each column: its name's byte range in `data`, and its value.
        cols: Vec<Spanned>,
    },
    /// Read the general way.
    Row(Row),
}

impl PartialEq for Img {
    fn eq(&self, other: &Img) -> bool {
        self.to_row() == other.to_row()
    }
}

/// The text of a span of `data`, which was checked as UTF-8 when it was read and is cut at
/// JSON's ASCII delimiters.
fn span(data: &Bytes, (a, b): (u32, u32)) -> &str {
    std::str::from_utf8(&data[a as usize..b as usize]).unwrap_or_default()
}

impl Img {
    /// The value of `column`, if the image carries it.
    pub(crate) fn get(&self, column: &str) -> Option<View<'_>> {
        match self {
            Img::Row(r) => r.get(column).map(View::of),
            Img::Spans { data, cols } => Some(view(data, find(data, cols, column)?)),
        }
    }

    /// Each column with its value, sorted by name.
    pub(crate) fn columns(&self) -> Columns<'_> {
        match self {
            Img::Row(r) => Columns::Row(r.iter()),
            Img::Spans { data, cols } => Columns::Spans(data, cols.iter()),
        }
    }

    /// The image as a [`Row`].
    pub(crate) fn to_row(&self) -> Row {
        match self {
            Img::Row(r) => r.clone(),
            _ => self
                .columns()
                .map(|(k, v)| (k.to_string(), v.to_value()))
                .collect(),
        }
    }

    /// The number of columns.
    pub(crate) fn len(&self) -> usize {
        match self {
            Img::Row(r) => r.len(),
            Img::Spans { cols, .. } => cols.len(),
        }
    }
}

/// The columns of an [`Img`], sorted by name ([`Img::columns`]).
pub(crate) enum Columns<'a> {
    Row(serde_json::map::Iter<'a>),
    Spans(&'a Bytes, std::slice::Iter<'a, Spanned>),
}

impl<'a> Iterator for Columns<'a> {
    type Item = (&'a str, View<'a>);

    fn next(&mut self) -> Option<Self::Item> {
        match self {
            Columns::Row(i) => i.next().map(|(k, v)| (k.as_str(), View::of(v))),
            Columns::Spans(data, i) => i.next().map(|(n, v)| (span(data, *n), view(data, v))),
        }
    }
}

/// One column of an image read as spans: its name's byte range, and its value.
pub(crate) type Spanned = ((u32, u32), Val<(u32, u32)>);

/// The value of `column` in `cols` (a few columns: a scan of their names' bytes).
fn find<'a>(data: &Bytes, cols: &'a [Spanned], column: &str) -> Option<&'a Val<(u32, u32)>> {
    let want = column.as_bytes();
    cols.iter()
        .find(|((a, b), _)| &data[*a as usize..*b as usize] == want)
        .map(|(_, v)| v)
}

fn view<'a>(data: &'a Bytes, v: &'a Val<(u32, u32)>) -> View<'a> {
    match v {
        Val::Str(s) => View::Str(span(data, *s)),
        Val::Int(s) => View::Int(span(data, *s)),
        Val::Null => View::Null,
        Val::Json(v) => View::Json(v),
    }
}

impl Image for Img {
    fn names(&self) -> impl Iterator<Item = &str> {
        self.columns().map(|(k, _)| k)
    }

    fn has(&self, column: &str) -> bool {
        match self {
            Img::Row(r) => r.contains_key(column),
            Img::Spans { data, cols } => find(data, cols, column).is_some(),
        }
    }

    fn has_value(&self, column: &str) -> bool {
        match self {
            Img::Row(r) => r.has_value(column),
            Img::Spans { data, cols } => {
                find(data, cols, column).is_some_and(|v| !matches!(v, Val::Null))
            }
        }
    }

    fn same_names(&self, names: &[String]) -> bool {
        match self {
            Img::Row(r) => r.same_names(names),
            Img::Spans { data, cols } => {
                cols.len() == names.len()
                    && cols
                        .iter()
                        .zip(names)
                        .all(|(((a, b), _), n)| &data[*a as usize..*b as usize] == n.as_bytes())
            }
        }
    }

    fn key_part(&self, column: &str) -> Option<Cow<'_, str>> {
        // As `Row`'s: a string as itself, a number as written, anything else as JSON text.
        Some(match self.get(column)? {
            View::Null => return None,
            View::Str(s) | View::Int(s) => Cow::Borrowed(s),
            View::Json(Value::Number(n)) => Cow::Borrowed(n.as_str()),
            View::Json(other) => Cow::Owned(other.to_string()),
        })
    }

    fn key_only(&self, meta: &TableMeta) -> Self {
        match self {
            Img::Row(r) => Img::Row(r.key_only(meta)),
            Img::Spans { data, cols } => Img::Spans {
                data: data.clone(),
                cols: cols
                    .iter()
                    .filter(|(n, _)| meta.key.iter().any(|k| k == span(data, *n)))
                    .cloned()
                    .collect(),
            },
        }
    }
}

/// The image of `cols` (spans of `record`, in the order read): sorted by name, and of a name
/// given twice the last value kept, as `Row` keeps it (a stable sort keeps equal names in the
/// order read).
pub(crate) fn sorted(record: &Bytes, mut cols: Vec<Spanned>) -> Img {
    let name = |c: &Spanned| &record[c.0 .0 as usize..c.0 .1 as usize];
    if !cols.is_sorted_by(|a, b| name(a) < name(b)) {
        cols.sort_by(|a, b| name(a).cmp(name(b)));
        let mut i = 0;
        while i + 1 < cols.len() {
            if name(&cols[i]) == name(&cols[i + 1]) {
                cols.remove(i);
            } else {
                i += 1;
            }
        }
    }
    Img::Spans {
        data: record.clone(),
        cols,
    }
}

/// A `text[]` parameter built value by value from borrowed text, sent in the binary array
/// format: one buffer per column instead of a `String` per value.
#[derive(Debug, Default)]
pub(crate) struct TextArray {
    /// The elements as the binary format writes them: a length (-1: `NULL`) and the bytes.
    body: Vec<u8>,
    len: i32,
    nulls: bool,
}

impl TextArray {
    /// An empty array with room for `n` values of about 16 bytes.
    pub(crate) fn with_capacity(n: usize) -> TextArray {
        TextArray {
            body: Vec::with_capacity(n * 20),
            len: 0,
            nulls: false,
        }
    }

    /// Appends one value (`None`: `NULL`).
    pub(crate) fn push(&mut self, v: Option<&str>) {
        match v {
            None => {
                self.nulls = true;
                self.body.extend_from_slice(&(-1i32).to_be_bytes());
            }
            Some(s) => {
                // A value of 2 GiB or more is beyond what PostgreSQL takes anyway; its length
                // saturates and the server refuses the message.
                let n = i32::try_from(s.len()).unwrap_or(i32::MAX);
                self.body.extend_from_slice(&n.to_be_bytes());
                self.body.extend_from_slice(s.as_bytes());
            }
        }
        self.len += 1;
    }
}

impl tokio_postgres::types::ToSql for TextArray {
    fn to_sql(
        &self,
        ty: &tokio_postgres::types::Type,
        out: &mut bytes::BytesMut,
    ) -> Result<tokio_postgres::types::IsNull, Box<dyn std::error::Error + Sync + Send>> {
        use bytes::BufMut;
        let tokio_postgres::types::Kind::Array(member) = ty.kind() else {
            return Err(format!("a text array cannot be sent as {ty}").into());
        };
        out.reserve(20 + self.body.len());
        out.put_i32(1); // dimensions
        out.put_i32(i32::from(self.nulls));
        out.put_u32(member.oid());
        out.put_i32(self.len);
        out.put_i32(1); // lower bound
        out.extend_from_slice(&self.body);
        Ok(tokio_postgres::types::IsNull::No)
    }

    fn accepts(ty: &tokio_postgres::types::Type) -> bool {
        matches!(ty.kind(), tokio_postgres::types::Kind::Array(m) if *m == tokio_postgres::types::Type::TEXT)
    }

    tokio_postgres::types::to_sql_checked!();
}
