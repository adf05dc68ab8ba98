//! Durable-mode logs for the durable-buffer, segment-release and documented-format tests:
//! options, records that name their writer and sequence, a seeded generator, the segment
//! files, disk use and open descriptors.

#![allow(dead_code)]

use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use walsink::{Epoch, Mode, Options, Sink, SinkError, WalSink};

pub struct Rng(pub u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

/// `r{run:03}-t{t:02}-{i:08}-` then `pad` bytes of a letter derived from i.
pub fn rec(run: u64, t: u64, i: u64, pad: usize) -> Vec<u8> {
    let mut r = format!("r{run:03}-t{t:02}-{i:08}-").into_bytes();
    let c = b'a' + (i % 26) as u8;
    r.extend(std::iter::repeat_n(c, pad));
    r
}

pub const PREFIX: usize = 18;

pub fn parse(r: &[u8]) -> (u64, u64, u64) {
    assert!(
        r.len() >= PREFIX,
        "short record {:?}",
        String::from_utf8_lossy(r)
    );
    let s = std::str::from_utf8(&r[..PREFIX]).unwrap();
    let run = s[1..4].parse().unwrap();
    let t = s[6..8].parse().unwrap();
    let i: u64 = s[9..17].parse().unwrap();
    // The padding is a function of i: a record whose bytes were damaged shows here.
    let c = b'a' + (i % 26) as u8;
    assert!(
        r[PREFIX..].iter().all(|&b| b == c),
        "record {s} has damaged padding"
    );
    (run, t, i)
}

pub fn durable(sink: &str, seg: u64, recycle: bool) -> Options {
    Options::new(sink)
        .mode(Mode::Durable)
        .segment_size(seg)
        .max_record_size((seg / 4) as usize)
        .max_metadata_size(256)
        .recycle_segments(recycle)
        .retry(walsink::RetryPolicy::new(
            Duration::from_millis(1),
            Duration::from_millis(50),
        ))
}

pub fn wseg_files(dir: &Path) -> Vec<(String, u64)> {
    let mut v: Vec<(String, u64)> = std::fs::read_dir(dir)
        .unwrap()
        .filter_map(|e| {
            let e = e.ok()?;
            let n = e.file_name().to_string_lossy().into_owned();
            (n.ends_with(".wseg") || n.ends_with(".free"))
                .then(|| (n, e.metadata().map(|m| m.len()).unwrap_or(0)))
        })
        .collect();
    v.sort();
    v
}

/// Bytes allocated on disk for the files of `dir` (what `du` shows).
pub fn du(dir: &Path) -> u64 {
    std::fs::read_dir(dir)
        .unwrap()
        .filter_map(|e| e.ok()?.metadata().ok())
        .map(|m| m.blocks() * 512)
        .sum()
}

/// (fds of this process on `dir` or files under it, those of them on deleted files).
pub fn fds(dir: &Path) -> (usize, usize) {
    let d = dir.to_string_lossy().into_owned();
    let mut all = 0;
    let mut deleted = 0;
    for e in std::fs::read_dir("/proc/self/fd").unwrap().flatten() {
        if let Ok(t) = std::fs::read_link(e.path()) {
            let t = t.to_string_lossy().into_owned();
            if t.starts_with(&d) {
                all += 1;
                if t.ends_with("(deleted)") {
                    deleted += 1;
                }
            }
        }
    }
    (all, deleted)
}

/// A sink that counts and checks records (the padding) without keeping them.
#[derive(Clone, Default)]
pub struct CountSink {
    pub records: Arc<AtomicU64>,
    pub epochs: Arc<AtomicU64>,
}

impl Sink for CountSink {
    fn deliver(&mut self, epoch: &Epoch) -> Result<(), SinkError> {
        let mut n = 0;
        for c in epoch.chunks() {
            for r in c?.records() {
                parse(&r.data);
                n += 1;
            }
        }
        self.records.fetch_add(n, Ordering::SeqCst);
        self.epochs.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }
}

/// One durable append of `n` records by writer `t` from index `i`, by one of the four ways.
pub fn append_some(wal: &WalSink, way: u64, recs: &[Vec<u8>]) -> walsink::Result<()> {
    let refs: Vec<&[u8]> = recs.iter().map(|r| r.as_slice()).collect();
    match way % 4 {
        0 => {
            for r in &refs {
                wal.append(r)?;
            }
            Ok(())
        }
        1 => wal.append_batch(refs.iter().copied()),
        2 => match wal.try_append_batch(&refs)? {
            Some(p) => wal.make_durable(p),
            None => wal.append_batch(refs.iter().copied()),
        },
        _ => {
            let p = wal.append_batch_unsynced(&refs)?;
            wal.make_durable(p)
        }
    }
}

pub fn wait_until(what: &str, limit: Duration, mut f: impl FnMut() -> bool) {
    let start = Instant::now();
    while !f() {
        assert!(
            start.elapsed() < limit,
            "gave up waiting {limit:?} for: {what}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

pub fn idle(wal: &WalSink) -> bool {
    let h = wal.health();
    h.backlog_epochs == 0 && h.open_records == 0
}

pub fn seg_name(seq: u64) -> String {
    format!("{seq:020}.wseg")
}

pub fn barrier(id: u64, count: u64, dt: (u64, u64), meta: &[u8]) -> Vec<u8> {
    let mut p = Vec::new();
    p.extend(id.to_le_bytes());
    p.extend(1_700_000_000_000u64.to_le_bytes());
    p.extend(count.to_le_bytes());
    p.extend(dt.0.to_le_bytes());
    p.extend(dt.1.to_le_bytes());
    p.extend(meta);
    p
}
