//! Logs for the streaming, directory-sink, dump and recovery-report tests: options with small
//! segments, records that carry their checkpoint and index, a checking sink, and a frame walk
//! over segment bytes by the documented layout (docs/design.md, format version 1).

#![allow(dead_code)]

use std::os::unix::fs::FileExt;
use std::path::Path;
use std::time::Duration;
use walsink::storage::SimStorage;
use walsink::{ErrorKind, Options, RetryPolicy, WalSink};

pub fn pad8(n: usize) -> usize {
    (n + 7) & !7
}

/// Deterministic record content for (checkpoint, index, len).
pub fn rec(ck: u64, i: u64, len: usize) -> Vec<u8> {
    let mut v = Vec::with_capacity(len);
    let mut x = ck.wrapping_mul(0x9E37_79B9_7F4A_7C15)
        ^ i.wrapping_mul(0xD1B5_4A32_D192_ED03)
        ^ (len as u64).wrapping_add(1);
    while v.len() < len {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        v.push(x as u8);
    }
    v
}

pub fn fast_retry() -> RetryPolicy {
    RetryPolicy::new(Duration::from_millis(1), Duration::from_millis(5))
}

pub fn small_opts(sink: &str, segment: u64, chunk: usize, max_record: usize) -> Options {
    Options::new(sink)
        .segment_size(segment)
        .read_chunk_size(chunk)
        .max_record_size(max_record)
        .max_metadata_size(256)
        .retry(fast_retry())
}

/// Appends records of the given sizes as checkpoint `ck`'s epoch and seals it.
pub fn fill(wal: &WalSink, ck: u64, sizes: &[usize]) -> Vec<Vec<u8>> {
    let recs: Vec<Vec<u8>> = sizes
        .iter()
        .enumerate()
        .map(|(i, &n)| rec(ck, i as u64, n))
        .collect();
    for r in &recs {
        wal.append(r).expect("append");
    }
    wal.checkpoint(ck, format!("meta-{ck}").as_bytes())
        .expect("checkpoint");
    recs
}

pub fn is_corruption(e: &walsink::Error) -> bool {
    matches!(e.kind(), ErrorKind::Corruption(_))
}

pub fn tail(s: &str) -> String {
    let lines: Vec<&str> = s.lines().collect();
    lines[lines.len().saturating_sub(12)..].join("\n")
}

#[derive(Debug, Clone, Copy)]
pub struct FrameAt {
    pub offset: usize,
    pub len: usize,
    pub kind: u8,
}

/// The frames of one segment image, from offset 40, up to a zero header or a segment end.
pub fn parse_frames(seg: &[u8]) -> Vec<FrameAt> {
    let mut v = vec![];
    let mut off = 40;
    while off + 16 <= seg.len() {
        let h = &seg[off..off + 16];
        if h.iter().all(|&b| b == 0) {
            break;
        }
        let len = u32::from_le_bytes(h[4..8].try_into().unwrap()) as usize;
        let kind = h[8];
        v.push(FrameAt {
            offset: off,
            len,
            kind,
        });
        if kind == 4 || off + 16 + len > seg.len() {
            break;
        }
        off += 16 + pad8(len);
    }
    v
}

pub fn barrier_id(seg: &[u8], f: &FrameAt) -> u64 {
    u64::from_le_bytes(seg[f.offset + 16..f.offset + 24].try_into().unwrap())
}

/// Sorted segment names and images of a real log directory.
pub fn fs_segments(dir: &Path) -> Vec<(String, Vec<u8>)> {
    let mut v: Vec<(String, Vec<u8>)> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap())
        .filter(|e| e.file_name().to_string_lossy().ends_with(".wseg"))
        .map(|e| {
            (
                e.file_name().to_string_lossy().into_owned(),
                std::fs::read(e.path()).unwrap(),
            )
        })
        .collect();
    v.sort();
    v
}

pub fn sim_segments(sim: &SimStorage) -> Vec<(String, Vec<u8>)> {
    sim.snapshot()
        .into_iter()
        .filter(|(n, _)| n.ends_with(".wseg"))
        .collect()
}

pub fn flip_fs(path: &Path, off: usize) {
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .unwrap();
    let mut b = [0u8; 1];
    f.read_at(&mut b, off as u64).unwrap();
    b[0] ^= 0x5a;
    f.write_at(&b, off as u64).unwrap();
    f.sync_all().unwrap();
}
