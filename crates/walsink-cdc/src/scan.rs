//! The commonest event records read by hand: one pass over the bytes, no serde, for an event
//! object of `before`, `after`, `op` and `source` (any other field is skipped, checked as
//! JSON), its images read into spans ([`Img::Spans`]). Anything else it answers `None` for
//! (the `schema`/`payload` wrapper, a field given twice, a name or an `op` with escapes, a
//! `null` where a value is needed, a value of the wrong type, input that is not JSON), and
//! the record is read by serde ([`crate::image::parse`]) and, failing that, the general way:
//! this path never decides differently, it only decides sooner (see the differential test
//! below).

use crate::event::{Event, Op};
use crate::image::{Img, Spanned, Val};
use bytes::Bytes;
use serde_json::Value;

struct Scan<'a> {
    b: &'a [u8],
    text: &'a str,
    i: usize,
}

impl<'a> Scan<'a> {
    fn ws(&mut self) {
        while let Some(b' ' | b'\t' | b'\n' | b'\r') = self.b.get(self.i) {
            self.i += 1;
        }
    }

    fn peek(&mut self) -> Option<u8> {
        self.ws();
        self.b.get(self.i).copied()
    }

    fn eat(&mut self, c: u8) -> Option<()> {
        (self.peek()? == c).then(|| self.i += 1)
    }

    /// A string: its contents' byte range, and whether it holds escapes.
    fn string(&mut self) -> Option<(usize, usize, bool)> {
        self.eat(b'"')?;
        let start = self.i;
        let mut escaped = false;
        loop {
            match *self.b.get(self.i)? {
                b'"' => {
                    self.i += 1;
                    return Some((start, self.i - 1, escaped));
                }
                b'\\' => {
                    escaped = true;
                    match *self.b.get(self.i + 1)? {
                        b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't' => self.i += 2,
                        b'u' => {
                            let hex = self.b.get(self.i + 2..self.i + 6)?;
                            if !hex.iter().all(u8::is_ascii_hexdigit) {
                                return None;
                            }
                            self.i += 6;
                        }
                        _ => return None,
                    }
                }
                0..=0x1f => return None,
                _ => self.i += 1,
            }
        }
    }

    fn digits(&mut self) -> usize {
        let start = self.i;
        while self.b.get(self.i).is_some_and(u8::is_ascii_digit) {
            self.i += 1;
        }
        self.i - start
    }

    /// A number, by JSON's grammar: its byte range.
    fn number(&mut self) -> Option<(usize, usize)> {
        self.ws();
        let start = self.i;
        if self.b.get(self.i) == Some(&b'-') {
            self.i += 1;
        }
        match self.b.get(self.i)? {
            b'0' => self.i += 1,
            b'1'..=b'9' => {
                self.digits();
            }
            _ => return None,
        }
        if self.b.get(self.i) == Some(&b'.') {
            self.i += 1;
            if self.digits() == 0 {
                return None;
            }
        }
        if let Some(b'e' | b'E') = self.b.get(self.i) {
            self.i += 1;
            if let Some(b'+' | b'-') = self.b.get(self.i) {
                self.i += 1;
            }
            if self.digits() == 0 {
                return None;
            }
        }
        Some((start, self.i))
    }

    fn literal(&mut self, word: &[u8]) -> Option<()> {
        self.ws();
        (self.b.get(self.i..self.i + word.len())? == word).then(|| self.i += word.len())
    }

    /// Any value, checked as JSON: its byte range.
    fn value(&mut self, depth: usize) -> Option<(usize, usize)> {
        if depth > 128 {
            return None;
        }
        let c = self.peek()?;
        let start = self.i;
        match c {
            b'"' => {
                self.string()?;
            }
            b'-' | b'0'..=b'9' => {
                self.number()?;
            }
            b't' => self.literal(b"true")?,
            b'f' => self.literal(b"false")?,
            b'n' => self.literal(b"null")?,
            b'[' => {
                self.i += 1;
                if self.peek()? == b']' {
                    self.i += 1;
                } else {
                    loop {
                        self.value(depth + 1)?;
                        match self.peek()? {
                            b',' => self.i += 1,
                            b']' => {
                                self.i += 1;
                                break;
                            }
                            _ => return None,
                        }
                    }
                }
            }
            b'{' => {
                self.i += 1;
                if self.peek()? == b'}' {
                    self.i += 1;
                } else {
                    loop {
                        self.string()?;
                        self.eat(b':')?;
                        self.value(depth + 1)?;
                        match self.peek()? {
                            b',' => self.i += 1,
                            b'}' => {
                                self.i += 1;
                                break;
                            }
                            _ => return None,
                        }
                    }
                }
            }
            _ => return None,
        }
        Some((start, self.i))
    }

    /// The fields of an object, each name without escapes, `f` reading each value.
    fn object(&mut self, mut f: impl FnMut(&mut Self, &'a str) -> Option<()>) -> Option<()> {
        self.eat(b'{')?;
        if self.peek()? == b'}' {
            self.i += 1;
            return Some(());
        }
        loop {
            let (a, b, escaped) = self.string()?;
            if escaped {
                return None;
            }
            self.eat(b':')?;
            let text = self.text;
            f(self, text.get(a..b)?)?;
            match self.peek()? {
                b',' => self.i += 1,
                b'}' => {
                    self.i += 1;
                    return Some(());
                }
                _ => return None,
            }
        }
    }

    /// A row image: each column's value as [`crate::image`]'s serde reading gives it.
    fn image(&mut self) -> Option<Vec<Spanned>> {
        let mut cols: Vec<Spanned> = Vec::with_capacity(8);
        let base = self.text.as_ptr() as usize;
        self.object(|s, name| {
            let at = name.as_ptr() as usize - base;
            let name = (at as u32, (at + name.len()) as u32);
            let v = match s.peek()? {
                b'"' => {
                    let (a, b, escaped) = s.string()?;
                    if escaped {
                        json(s.text.get(a - 1..b + 1)?)?
                    } else {
                        Val::Str((a as u32, b as u32))
                    }
                }
                b'-' | b'0'..=b'9' => {
                    let (a, b) = s.number()?;
                    if crate::columns::plain_integer(s.text.get(a..b)?) {
                        Val::Int((a as u32, b as u32))
                    } else {
                        json(s.text.get(a..b)?)?
                    }
                }
                b'n' => {
                    s.literal(b"null")?;
                    Val::Null
                }
                _ => {
                    let (a, b) = s.value(1)?;
                    json(s.text.get(a..b)?)?
                }
            };
            cols.push((name, v));
            Some(())
        })?;
        Some(cols)
    }

    /// A string field of `source`: `None` for `null`.
    fn text_field(&mut self) -> Option<Option<String>> {
        if self.peek()? == b'n' {
            self.literal(b"null")?;
            return Some(None);
        }
        let (a, b, escaped) = self.string()?;
        Some(Some(if escaped {
            serde_json::from_str::<String>(self.text.get(a - 1..b + 1)?).ok()?
        } else {
            self.text.get(a..b)?.to_string()
        }))
    }
}

fn json(text: &str) -> Option<Val<(u32, u32)>> {
    serde_json::from_str::<Value>(text)
        .ok()
        .map(|v| Val::Json(Box::new(v)))
}

/// Reads `record` (its text `text`, checked as UTF-8) by hand; see the module docs.
pub(crate) fn scan(record: &Bytes, text: &str) -> Option<Option<Event<Img>>> {
    let mut s = Scan {
        b: text.as_bytes(),
        text,
        i: 0,
    };
    let (mut op, mut before, mut after) = (None, None, None);
    let (mut table, mut db, mut schema, mut lsn) = (None, None, None, None);
    let mut seen_source = false;
    s.object(|s, field| {
        match field {
            "op" => {
                let (a, b, escaped) = s.string()?;
                if escaped || op.is_some() {
                    return None;
                }
                op = Some(Op::parse(s.text.get(a..b)?)?);
            }
            "before" | "after" => {
                let slot = if field == "before" {
                    &mut before
                } else {
                    &mut after
                };
                if slot.is_some() {
                    return None;
                }
                let img = if s.peek()? == b'n' {
                    s.literal(b"null")?;
                    None
                } else {
                    Some(s.image()?)
                };
                *slot = Some(img);
            }
            "source" => {
                if std::mem::replace(&mut seen_source, true) {
                    return None;
                }
                let (mut t, mut d, mut sc, mut l) = (None, None, None, None);
                s.object(|s, f| {
                    let slot = match f {
                        "table" => &mut t,
                        "db" => &mut d,
                        "schema" => &mut sc,
                        "lsn" => {
                            if l.is_some() {
                                return None;
                            }
                            let (a, b) = s.value(1)?;
                            l = Some(crate::event::quick::position_text(s.text.get(a..b)?)?);
                            return Some(());
                        }
                        _ => {
                            s.value(1)?;
                            return Some(());
                        }
                    };
                    if slot.is_some() {
                        return None;
                    }
                    *slot = Some(s.text_field()?);
                    Some(())
                })?;
                (table, db, schema, lsn) = (t.flatten(), d.flatten(), sc.flatten(), l);
            }
            // The converter's wrapper: serde's reading decides it.
            "payload" | "schema" => return None,
            _ => {
                s.value(0)?;
            }
        }
        Some(())
    })?;
    s.ws();
    if s.i != s.b.len() {
        return None;
    }
    let op = op?;
    let img = |cols: Option<Vec<Spanned>>| cols.map(|cols| crate::image::sorted(record, cols));
    let (before, after) = (img(before.flatten()), img(after.flatten()));
    match op {
        Op::Create | Op::Read | Op::Update if after.is_none() => return None,
        Op::Delete if before.is_none() => return None,
        _ => {}
    }
    Some(Some(Event {
        op,
        db,
        schema,
        table: table?,
        position: lsn?,
        before,
        after,
    }))
}
