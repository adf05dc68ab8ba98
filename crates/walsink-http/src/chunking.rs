//! Deterministic chunking: the records of an epoch cut into request bodies, pure and
//! without I/O.
//!
//! A body is the chunk's records, each followed by `\n`. Records are taken in epoch order;
//! a chunk is closed before a record that would make it exceed `max_records` records or
//! `max_bytes` body bytes (a record larger than `max_bytes` on its own makes a chunk of one
//! record). So the cut depends only on the records and the three settings in [`Chunking`]:
//! the same epoch under the same settings gives the same bodies, byte for byte, as chunk
//! 0, 1, 2, … on every delivery.
//!
//! A record holding `\n` would be read back as two records. With [`Newline::Reject`] (the
//! default) such a record is a [`NewlineInRecord`] error naming its position; with
//! [`Newline::Escape`] every record is escaped: `\` becomes `\\` and a newline becomes
//! `\n` (backslash, `n`), which [`unescape`] reverses.

use bytes::Bytes;
use std::fmt;
use std::sync::Arc;
use walsink::BufferPool;

/// What a record holding a newline does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Newline {
    /// The delivery fails with a permanent error naming the record (the default).
    Reject,
    /// Every record is escaped: `\` as `\\`, newline as `\n`.
    Escape,
}

impl fmt::Display for Newline {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Newline::Reject => "reject",
            Newline::Escape => "escape",
        })
    }
}

/// The settings that decide the cut. Sent with every request in the `Walsink-Chunk`
/// header, so a receiver can tell that they changed between a crash and a replay.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Chunking {
    /// Most records in one body.
    pub max_records: usize,
    /// Most bytes in one body (before compression).
    pub max_bytes: usize,
    /// What a record holding a newline does.
    pub newline: Newline,
}

/// One request body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Body {
    /// The chunk's number in its epoch, from 0: the last part of the idempotency key.
    pub chunk: u64,
    /// Index in the epoch of the chunk's first record.
    pub first: u64,
    /// Records in the chunk.
    pub records: u64,
    /// The newline-delimited records.
    pub bytes: Bytes,
}

/// A record that holds a newline, under [`Newline::Reject`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewlineInRecord {
    /// Index of the record in its epoch.
    pub index: u64,
    /// Byte offset of the first newline inside the record.
    pub offset: usize,
}

/// Cuts one epoch's records into bodies; see the module docs.
#[derive(Debug)]
pub struct Chunker {
    rules: Chunking,
    buf: Vec<u8>,
    pool: Option<Arc<BufferPool>>,
    count: u64,
    first: u64,
    next_chunk: u64,
    next_index: u64,
}

impl Chunker {
    /// A chunker for one epoch.
    pub fn new(rules: Chunking) -> Chunker {
        Chunker {
            rules,
            buf: Vec::new(),
            pool: None,
            count: 0,
            first: 0,
            next_chunk: 0,
            next_index: 0,
        }
    }

    /// A chunker that takes its body buffers from `pool` (the bodies are the same). A body of
    /// hundreds of KiB allocated afresh costs more than copying the records into it; give
    /// each body back once the request that carried it is answered.
    pub fn with_pool(rules: Chunking, pool: Arc<BufferPool>) -> Chunker {
        Chunker {
            pool: Some(pool),
            ..Chunker::new(rules)
        }
    }

    /// Adds the epoch's next record; returns the body it closed, if any. Records must come
    /// in epoch order, from index 0.
    pub fn push(&mut self, record: &[u8]) -> Result<Option<Body>, NewlineInRecord> {
        let index = self.next_index;
        let nl = memchr::memchr(b'\n', record);
        let encoded = match (nl, self.rules.newline) {
            (Some(offset), Newline::Reject) => return Err(NewlineInRecord { index, offset }),
            (_, Newline::Escape) => {
                record.len() + memchr::memchr2_iter(b'\n', b'\\', record).count()
            }
            (None, Newline::Reject) => record.len(),
        } + 1;
        let closed = if self.count > 0
            && (self.count as usize >= self.rules.max_records
                || self.buf.len() + encoded > self.rules.max_bytes)
        {
            Some(self.take())
        } else {
            None
        };
        if self.count == 0 {
            self.first = index;
            if self.buf.capacity() == 0 {
                if let Some(pool) = &self.pool {
                    self.buf = pool.take();
                    self.buf.clear();
                }
            }
            self.buf
                .reserve(encoded.max(self.rules.max_bytes.min(1 << 20)));
        }
        match self.rules.newline {
            Newline::Escape => escape_into(&mut self.buf, record),
            Newline::Reject => self.buf.extend_from_slice(record),
        }
        self.buf.extend_from_slice(b"\n");
        self.count += 1;
        self.next_index += 1;
        Ok(closed)
    }

    /// The last body of the epoch, if any records are left.
    pub fn finish(&mut self) -> Option<Body> {
        (self.count > 0).then(|| self.take())
    }

    fn take(&mut self) -> Body {
        let body = Body {
            chunk: self.next_chunk,
            first: self.first,
            records: self.count,
            bytes: Bytes::from(std::mem::take(&mut self.buf)),
        };
        self.next_chunk += 1;
        self.count = 0;
        body
    }
}

fn escape_into(buf: &mut Vec<u8>, record: &[u8]) {
    let mut start = 0;
    for i in memchr::memchr2_iter(b'\n', b'\\', record) {
        let esc: &[u8] = if record[i] == b'\n' { b"\\n" } else { b"\\\\" };
        buf.extend_from_slice(&record[start..i]);
        buf.extend_from_slice(esc);
        start = i + 1;
    }
    buf.extend_from_slice(&record[start..]);
}

/// Reverses [`Newline::Escape`] for one line (`\\` to `\`, `\n` to a newline; any other
/// backslash is kept).
pub fn unescape(line: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(line.len());
    let mut i = 0;
    while i < line.len() {
        if line[i] == b'\\' && i + 1 < line.len() {
            match line[i + 1] {
                b'\\' => {
                    out.push(b'\\');
                    i += 2;
                    continue;
                }
                b'n' => {
                    out.push(b'\n');
                    i += 2;
                    continue;
                }
                _ => {}
            }
        }
        out.push(line[i]);
        i += 1;
    }
    out
}

/// Splits a body back into its records (the receiver's side; for tests and tools). A body
/// always holds at least one record, so `"\n"` is one empty record.
pub fn split(body: &[u8], newline: Newline) -> Vec<Vec<u8>> {
    let body = body.strip_suffix(b"\n").unwrap_or(body);
    body.split(|&b| b == b'\n')
        .map(|l| match newline {
            Newline::Reject => l.to_vec(),
            Newline::Escape => unescape(l),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cut(rules: Chunking, recs: &[&[u8]]) -> Result<Vec<Body>, NewlineInRecord> {
        let mut c = Chunker::new(rules);
        let mut out = Vec::new();
        for r in recs {
            out.extend(c.push(r)?);
        }
        out.extend(c.finish());
        Ok(out)
    }

    fn rules(max_records: usize, max_bytes: usize, newline: Newline) -> Chunking {
        Chunking {
            max_records,
            max_bytes,
            newline,
        }
    }

    #[test]
    fn limits_on_records_and_bytes_cut_the_same_way_every_time() {
        let recs: Vec<Vec<u8>> = (0..25u32).map(|i| vec![b'a'; (i % 7) as usize]).collect();
        let refs: Vec<&[u8]> = recs.iter().map(|r| r.as_slice()).collect();
        let r = rules(4, 12, Newline::Reject);
        let a = cut(r, &refs).unwrap();
        assert_eq!(a, cut(r, &refs).unwrap(), "deterministic");
        let mut next = 0;
        for (i, b) in a.iter().enumerate() {
            assert_eq!((b.chunk, b.first), (i as u64, next));
            assert!(b.records as usize <= 4);
            assert!(b.bytes.len() <= 12 || b.records == 1, "{b:?}");
            let got = split(&b.bytes, Newline::Reject);
            assert_eq!(got.len() as u64, b.records);
            assert_eq!(got, recs[next as usize..(next + b.records) as usize]);
            next += b.records;
        }
        assert_eq!(next, 25);
    }

    #[test]
    fn an_oversized_record_goes_alone() {
        let big = vec![b'x'; 50];
        let a = cut(rules(100, 10, Newline::Reject), &[b"a", &big, b"b"]).unwrap();
        assert_eq!(a.iter().map(|b| b.records).collect::<Vec<_>>(), [1, 1, 1]);
        assert_eq!(a[1].bytes.len(), 51);
    }

    #[test]
    fn a_newline_is_refused_with_its_position_or_escaped() {
        let e = cut(rules(10, 100, Newline::Reject), &[b"ok", b"ab\ncd"]).unwrap_err();
        assert_eq!(
            e,
            NewlineInRecord {
                index: 1,
                offset: 2
            }
        );
        let recs: [&[u8]; 4] = [b"a\\n", b"x\ny", b"", b"\\\n\\"];
        let a = cut(rules(10, 100, Newline::Escape), &recs).unwrap();
        assert_eq!(a.len(), 1);
        assert_eq!(&a[0].bytes[..], b"a\\\\n\nx\\ny\n\n\\\\\\n\\\\\n");
        assert_eq!(
            split(&a[0].bytes, Newline::Escape),
            recs.map(|r| r.to_vec())
        );
    }

    #[test]
    fn a_pooled_chunker_cuts_the_same_bodies_and_reuses_answered_buffers() {
        let recs: Vec<Vec<u8>> = (0..40u32)
            .map(|i| vec![b'a' + (i % 26) as u8; 100])
            .collect();
        let refs: Vec<&[u8]> = recs.iter().map(|r| r.as_slice()).collect();
        let r = rules(5, 1000, Newline::Reject);
        let pool = Arc::new(BufferPool::new(2, usize::MAX));
        // Bodies given back at once (answered requests) are filled again: the same bytes.
        let mut c = Chunker::with_pool(r, pool.clone());
        let (mut pooled, mut seen) = (Vec::new(), std::collections::HashSet::new());
        for rec in &refs {
            if let Some(b) = c.push(rec).unwrap() {
                seen.insert(b.bytes.as_ptr() as usize);
                pooled.push(Body {
                    bytes: Bytes::copy_from_slice(&b.bytes),
                    ..b.clone()
                });
                pool.give_back(b.bytes);
            }
        }
        pooled.extend(c.finish());
        assert_eq!(
            pooled,
            cut(r, &refs).unwrap(),
            "the same bodies as without a pool"
        );
        // A body closes when the next record arrives, so that record is written into a second
        // buffer before the first comes back: two buffers serve all eight bodies.
        assert_eq!(seen.len(), 2, "two buffers served every body");
        // A body still referred to (a request in flight) is not taken back.
        let mut c = Chunker::with_pool(r, pool.clone());
        c.push(refs[0]).unwrap();
        let held = c.finish().unwrap();
        let keep = held.bytes.clone();
        pool.give_back(held.bytes);
        c.push(refs[1]).unwrap();
        assert_ne!(c.buf.as_ptr(), keep.as_ptr());
    }

    #[test]
    fn empty_records_survive() {
        let a = cut(rules(10, 100, Newline::Reject), &[b""]).unwrap();
        assert_eq!(split(&a[0].bytes, Newline::Reject), vec![Vec::<u8>::new()]);
        let a = cut(rules(10, 100, Newline::Reject), &[b"", b"", b"z"]).unwrap();
        assert_eq!(
            split(&a[0].bytes, Newline::Reject),
            vec![vec![], vec![], b"z".to_vec()]
        );
    }
}
