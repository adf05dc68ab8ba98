//! Reading a chunk of an epoch on two threads: the copy out of the page cache and the
//! checksums of a large chunk are split in two halves, one on the calling thread and one on a
//! scoped helper, so delivery uses a second core where it has one (docs/benchmarks.md).
//!
//! The outcome is that of reading the chunk on one thread and verifying it frame by frame:
//! what this module returns is only a verified prefix (the bytes and the number of the data
//! frames at the start of the chunk that verified, in order), and the reader's scan goes on
//! from its end with every rule (the frame cut off by the chunk's end, the segment-end frame,
//! damage and its offset). The split point is found by following the unverified frame sizes
//! from the start; the second half's frames count only when every frame of the first half
//! verified and they end exactly there, so damage anywhere is found by the scan in order, and a
//! wrong split point found through a damaged size only costs the second half's work.

use crate::log::format::{self, FrameKind, Seed};
use crate::storage::{read_full, StorageFile};
use std::io;

/// Chunks of at least this many bytes are read and verified in two halves; smaller ones are
/// not worth a thread.
pub(crate) const SPLIT_MIN: usize = 2 << 20;

/// The chunk size from which [`read_chunk`] uses a second thread here: [`SPLIT_MIN`], or
/// `usize::MAX` (never) when the process may run on one core only.
pub(crate) fn split_min() -> usize {
    static MIN: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *MIN.get_or_init(|| {
        if std::thread::available_parallelism().is_ok_and(|n| n.get() > 1) {
            SPLIT_MIN
        } else {
            usize::MAX
        }
    })
}

/// Reads `want` bytes at `offset` of `file` into `v` (fewer at the file's end: `v` is cut to
/// what was read) and verifies the data frames at its start, in two halves on two threads when
/// `want` is at least `split_min` ([`split_min`] here; `usize::MAX` for one thread). Returns the
/// verified prefix: its length in bytes and its number of data frames.
pub(crate) fn read_chunk(
    file: &dyn StorageFile,
    seed: Seed,
    offset: u64,
    want: usize,
    v: &mut Vec<u8>,
    split_min: usize,
) -> io::Result<(usize, u64)> {
    if want < split_min.max(2) {
        file.read_range_into(offset, want, v)?;
        return Ok(verified_prefix(v, seed, offset, 0, v.len()));
    }
    // A kept buffer still holds old bytes: overwritten below, never zeroed first.
    if v.len() < want {
        v.resize(want, 0);
    } else {
        v.truncate(want);
    }
    let half = want / 2;
    let (a, b) = v.split_at_mut(half);
    let (got_a, got_b) = std::thread::scope(|s| {
        let second = s.spawn(|| read_full(file, offset + half as u64, b));
        let first = read_full(file, offset, a);
        (first, join(second))
    });
    let (got_a, got_b) = (got_a?, got_b?);
    // The file ended in the first half: the second read found nothing, or bytes past a gap.
    let got = if got_a < half { got_a } else { half + got_b };
    v.truncate(got);
    let Some(mid) = split_point(v, half) else {
        return Ok(verified_prefix(v, seed, offset, 0, got));
    };
    let v = &v[..];
    let (first, second) = std::thread::scope(|s| {
        let second = s.spawn(|| verified_prefix(v, seed, offset, mid, got));
        let first = verified_prefix(v, seed, offset, 0, mid);
        (first, join(second))
    });
    Ok(if first.0 == mid {
        (second.0, first.1 + second.1)
    } else {
        first
    })
}

/// The result of a scoped thread; its panic goes on in the caller.
fn join<T>(h: std::thread::ScopedJoinHandle<'_, T>) -> T {
    h.join().unwrap_or_else(|p| std::panic::resume_unwind(p))
}

/// Where the first frame at or after `half` starts, following the frame sizes the headers
/// declare (unverified) from the start of `buf`; `None` when the walk meets a header that
/// declares nothing usable, or leaves `buf`, before that.
fn split_point(buf: &[u8], half: usize) -> Option<usize> {
    let mut i = 0;
    while i < half {
        i += format::declared_frame_size(buf, i).filter(|&s| s > 0)?;
    }
    (i < buf.len()).then_some(i)
}

/// The data frames at `buf[start..]` that verify, in order, stopping at `stop` (or at the
/// first frame that is not a whole, verified data frame in `buf`): the end of the last one and
/// how many there are. `buf` holds a segment's bytes from offset `base` on.
fn verified_prefix(buf: &[u8], seed: Seed, base: u64, start: usize, stop: usize) -> (usize, u64) {
    let (mut i, mut count) = (start, 0u64);
    while i < stop {
        match format::decode_frame_in(buf, seed, base, i) {
            Ok(f) if f.kind == FrameKind::Data => {
                i += f.size;
                count += 1;
            }
            _ => break,
        }
    }
    (i, count)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::{SimStorage, Storage};

    /// A segment's bytes from `base` on: data frames of random sizes, then maybe a control
    /// frame, then zeros.
    fn frames(rng: &mut fastrand::Rng, seed: Seed, base: u64, n: usize) -> Vec<u8> {
        let mut out = Vec::new();
        for _ in 0..n {
            let len = match rng.u8(..10) {
                0 => rng.usize(2000..9000),
                1 => 0,
                _ => rng.usize(1..400),
            };
            let payload: Vec<u8> = (0..len).map(|_| rng.u8(..)).collect();
            let at = base + out.len() as u64;
            format::encode_frame(&mut out, seed, at, FrameKind::Data, &payload);
        }
        if rng.bool() {
            let at = base + out.len() as u64;
            format::encode_frame(&mut out, seed, at, FrameKind::SegmentEnd, &[]);
        }
        out.resize(out.len() + rng.usize(0..64), 0);
        out
    }

    /// Reading on two threads gives exactly the verified prefix of reading on one, whatever
    /// the damage (a flipped byte anywhere, a declared size changed, the file cut short) and
    /// wherever the split falls.
    #[test]
    fn two_halves_verify_exactly_what_one_thread_does() {
        let mut rng = fastrand::Rng::with_seed(7);
        let sim = SimStorage::new();
        let seed = Seed { seq: 3, salt: 99 };
        let mut split_seen = 0;
        for case in 0..400 {
            let base = 8 * rng.u64(0..1000);
            let n = rng.usize(1..60);
            let mut bytes = frames(&mut rng, seed, base, n);
            match rng.u8(..4) {
                0 => {}
                1 => {
                    let i = rng.usize(..bytes.len());
                    bytes[i] ^= 1 << rng.u8(..8);
                }
                2 => {
                    // A header's length field: the walk to the split point goes astray.
                    let i = (rng.usize(..bytes.len()) & !7).min(bytes.len().saturating_sub(8));
                    if i + 8 <= bytes.len() {
                        bytes[i + 4] ^= 0x40;
                    }
                }
                _ => bytes.truncate(rng.usize(..bytes.len())),
            }
            let name = format!("{case}.seg");
            let f = sim.create(&name).unwrap();
            f.write_at(base, &bytes).unwrap();
            let want = bytes.len() + rng.usize(0..3) * rng.usize(0..500);
            let mut one = Vec::new();
            let expect = read_chunk(&*f, seed, base, want, &mut one, usize::MAX).unwrap();
            let mut two = vec![0xAAu8; rng.usize(0..want + 10)];
            let got = read_chunk(&*f, seed, base, want, &mut two, 64).unwrap();
            assert_eq!(got, expect, "case {case}");
            assert_eq!(two, one, "case {case}: the same bytes");
            if split_point(&one, want / 2).is_some() {
                split_seen += 1;
            }
        }
        assert!(split_seen > 200, "only {split_seen} cases split");
    }
}
