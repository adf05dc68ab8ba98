//! The sink's own reading of one record: the common shapes by the hand-written reader
//! ([`crate::scan`]), the rest of the usable ones by serde into spans of the record
//! ([`Spans`]), both giving an event over [`Img`]s; `None` sends the record to the general
//! reading ([`crate::event::parse`]).

use crate::event::{Event, PositionField};
use crate::image::{sorted, Img, Spanned, Val};
use bytes::Bytes;
use serde::Deserialize;
use serde_json::value::RawValue;

/// A row image as its columns' names and JSON texts, borrowed from the record: the
/// sink's own reading ([`crate::image::Img`]), which builds no JSON value for a string
/// without escapes, a plain integer or `null`. A name with escapes fails it (the record is
/// then read the general way). Every other value is read here as [`Row`](crate::event::Row) reads it, so
/// what is refused is refused here too.
pub(crate) struct Spans<'a>(pub(crate) Vec<(&'a str, Val<&'a str>)>);

impl<'de> Deserialize<'de> for Spans<'de> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Spans<'de>, D::Error> {
        struct Visit;
        impl<'de> serde::de::Visitor<'de> for Visit {
            type Value = Spans<'de>;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a row image")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut map: A,
            ) -> Result<Spans<'de>, A::Error> {
                let mut cols = Vec::with_capacity(map.size_hint().unwrap_or(8));
                while let Some(column) = map.next_key::<&'de str>()? {
                    let raw: &'de RawValue = map.next_value()?;
                    let text = raw.get();
                    let val = match text.as_bytes().first() {
                        Some(b'"')
                            if text.len() >= 2
                                && text.ends_with('"')
                                && !text[1..text.len() - 1].contains('\\') =>
                        {
                            Val::Str(&text[1..text.len() - 1])
                        }
                        Some(b'-' | b'0'..=b'9') if crate::columns::plain_integer(text) => {
                            Val::Int(text)
                        }
                        Some(b'n') if text == "null" => Val::Null,
                        _ => Val::Json(Box::new(
                            crate::event::quick::value(raw).map_err(serde::de::Error::custom)?,
                        )),
                    };
                    cols.push((column, val));
                }
                Ok(Spans(cols))
            }
        }
        d.deserialize_map(Visit)
    }
}

/// Reads one record the sink's own way; `None` when it is not one of the common shapes
/// (then [`crate::event::parse`] reads it, and gives the same event where both answer).
pub(crate) fn parse(record: &Bytes, field: &PositionField) -> Option<Option<Event<Img>>> {
    if u32::try_from(record.len()).is_err() || !crate::event::quick::usable(record, field) {
        return None;
    }
    let text = std::str::from_utf8(record).ok()?;
    if let Some(e) = crate::scan::scan(record, text) {
        return Some(e);
    }
    let e = crate::event::quick::parse_text_as::<Spans>(text, field)?;
    let Some(e) = e else { return Some(None) };
    let base = text.as_ptr() as usize;
    let at = |s: &str| {
        let a = s.as_ptr() as usize - base;
        (a as u32, (a + s.len()) as u32)
    };
    let img = |spans: Spans| {
        let cols: Vec<Spanned> = spans
            .0
            .into_iter()
            .map(|(n, v)| {
                let v = match v {
                    Val::Str(s) => Val::Str(at(s)),
                    Val::Int(s) => Val::Int(at(s)),
                    Val::Null => Val::Null,
                    Val::Json(v) => Val::Json(v),
                };
                (at(n), v)
            })
            .collect();
        sorted(record, cols)
    };
    Some(Some(Event {
        op: e.op,
        db: e.db,
        schema: e.schema,
        table: e.table,
        position: e.position,
        before: e.before.map(img),
        after: e.after.map(img),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::{PositionField, Row};
    use crate::scan::scan;
    use proptest::prelude::*;

    fn rows(e: Event<Img>) -> Event<Row> {
        Event {
            op: e.op,
            db: e.db,
            schema: e.schema,
            table: e.table,
            position: e.position,
            before: e.before.map(|i| i.to_row()),
            after: e.after.map(|i| i.to_row()),
        }
    }

    const TEMPLATES: &[&str] = &[
        r#"{"before":null,"after":{"id":1,"n":1,"v":"value 1 xx"},"op":"c","source":{"db":"bench","lsn":1000,"schema":"public","table":"t"},"ts_ms":0}"#,
        r#"{"before": {"id": -7, "v": "a\u00e9\"b"}, "after": {"id": 2, "n": 1.50, "v": [1, {"h": null}], "w": true, "j": "{\"a\": 1}"}, "source": {"version": "2.5", "table": "t\u00e9", "lsn": "0/1A", "txId": 7}, "op": "u", "transaction": null}"#,
        r#"{"before":{"id":12345678901234567890123,"k":"x"},"after":null,"source":{"table":"t","lsn":"16/B374D848"},"op":"d","ts_ms":1e3}"#,
        r#" { "op" : "t" , "source" : { "table" : "t" , "lsn" : 9 } } "#,
        r#"{"after":{"id":0,"a":-0,"b":1E-2,"c":"","id":"again"},"source":{"table":"t","lsn":5,"db":null},"op":"r"}"#,
    ];

    /// Where the hand reading answers, it answers what the general reading does, and what
    /// serde's reading of the spans does; over the templates, each mutated by a few edits of
    /// JSON's significant characters.
    #[test]
    fn the_hand_reading_takes_the_templates() {
        let f = PositionField::default();
        for t in TEMPLATES {
            let record = Bytes::from(t.to_string());
            let got = scan(&record, t).unwrap_or_else(|| panic!("not taken: {t}"));
            let want = crate::event::parse(t.as_bytes(), &f).unwrap();
            assert_eq!(got.map(rows), want, "{t}");
        }
    }

    proptest! {
        #[test]
        fn the_hand_reading_decides_as_the_general_reading(
            which in 0..TEMPLATES.len(),
            edits in proptest::collection::vec((0usize..400, 0usize..3, proptest::sample::select(
                vec!['"', '\\', '{', '}', '[', ']', ',', ':', ' ', '0', '1', '-', '.', 'e', 'n', 'u', 'l', 't', 'x', 'é', '\n', '\u{1}'])), 0..4),
        ) {
            let mut chars: Vec<char> = TEMPLATES[which].chars().collect();
            for (at, how, c) in edits {
                let at = at % (chars.len() + 1);
                match how {
                    0 => chars.insert(at, c),
                    1 if at < chars.len() => { chars.remove(at); }
                    _ if at < chars.len() => chars[at] = c,
                    _ => {}
                }
            }
            let text: String = chars.into_iter().collect();
            let record = Bytes::from(text.clone());
            let f = PositionField::default();
            if let Some(got) = scan(&record, &text) {
                let want = crate::event::parse(text.as_bytes(), &f);
                prop_assert_eq!(Ok(got.clone().map(rows)), want, "{}", text);
                let serde = crate::event::quick::parse_text_as::<Spans>(&text, &f);
                prop_assert!(serde.is_some(), "serde's reading refused what the hand took: {}", text);
            }
            // The sink's whole reading, whichever way it goes, against the general one.
            let sink = parse(&record, &f);
            if let Some(e) = sink {
                prop_assert_eq!(Ok(e.map(rows)), crate::event::parse(text.as_bytes(), &f), "{}", text);
            }
        }
    }
}

#[cfg(test)]
mod image_tests {
    use super::*;
    use crate::columns::ColumnKind;
    use crate::event::PositionField;
    use crate::plan::key_of;
    use crate::plan::Image;
    use crate::plan::TableMeta;
    use std::borrow::Cow;

    /// The sink's own reading gives the images the general one gives, and the same keys.
    #[test]
    fn spans_read_as_rows_read() {
        let f = PositionField::default();
        let meta = TableMeta {
            name: "t".into(),
            columns: vec!["a".into(), "b".into(), "id".into()],
            key: vec!["id".into()],
        };
        for image in [
            r#"{"id": 1, "b": "x", "a": null}"#,
            r#"{"id": "7", "b": 1.50, "a": [1, {"h": null}]}"#,
            r#"{"id": -12, "b": "x\"y\u00e9", "a": true, "b": "again"}"#,
            r#"{"id": 12345678901234567890123, "a": 1e3, "b": -0}"#,
            r#"{"b": "", "id": 0, "a": {"z": 1, "y": "2"}}"#,
        ] {
            let record = format!(
                r#"{{"before": null, "after": {image}, "source": {{"table": "t", "lsn": 5}}, "op": "c"}}"#
            );
            let lean = parse(&Bytes::from(record.clone()), &f).unwrap().unwrap();
            let general = crate::event::parse(record.as_bytes(), &f).unwrap().unwrap();
            let (l, g) = (lean.after.unwrap(), general.after.unwrap());
            assert_eq!(l.to_row(), g, "{image}");
            assert_eq!(key_of(&l, &meta, "after"), key_of(&g, &meta, "after"));
            assert!(l.names().eq(g.names()), "{image}");
            for c in ["a", "b", "id"] {
                let kind = ColumnKind::Text("text".into());
                assert_eq!(
                    l.get(c).and_then(|v| v.text(&kind)).map(Cow::into_owned),
                    kind.text(g.get(c)),
                    "{image} {c}"
                );
                let json = ColumnKind::Json("jsonb::jsonb".into());
                assert_eq!(
                    l.get(c).and_then(|v| v.text(&json)).map(Cow::into_owned),
                    json.text(g.get(c)),
                    "{image} {c}"
                );
            }
        }
        // A name with an escape: read the general way.
        let record = r#"{"after": {"i\u0064": 1}, "source": {"table": "t", "lsn": 5}, "op": "c"}"#;
        assert!(parse(&Bytes::from(record), &f).is_none());
    }
}
