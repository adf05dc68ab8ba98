//! A bounded, sliding read window over a segment file. Recovery and verification read
//! segments through it, so their memory stays bounded (by [`Window::MAX`], or one frame of at
//! most [`MAX_PAYLOAD`](crate::log::format::MAX_PAYLOAD) bytes when a frame is larger) whatever
//! the file's size or contents.

use crate::error::{CorruptionReason, Error, Result};
use crate::log::format;
use crate::storage::{Storage, StorageFile};
use bytes::Bytes;
use std::sync::Arc;

/// The bytes `[base, base + buf.len())` of one segment file.
pub(crate) struct Window {
    file: Arc<dyn StorageFile>,
    name: String,
    len: u64,
    base: u64,
    buf: Bytes,
}

impl Window {
    /// First read: small, so the simulated disk's 4–16 KiB segments exercise the growth path.
    const FIRST: usize = 4 << 10;
    /// Largest window, unless one frame needs more.
    pub const MAX: usize = 8 << 20;

    /// Opens segment `seq` and reads its first bytes.
    pub fn open(storage: &dyn Storage, seq: u64) -> Result<Self> {
        let name = format::segment_name(seq);
        let file = storage
            .open(&name)
            .map_err(|e| Error::io(format!("open segment {name}"), e))?;
        let len = file
            .len()
            .map_err(|e| Error::io(format!("stat segment {name}"), e))?;
        let mut w = Window {
            file,
            name,
            len,
            base: 0,
            buf: Bytes::new(),
        };
        w.read(0, Self::FIRST)?;
        Ok(w)
    }

    /// The file's length.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// The bytes in the window.
    pub fn buf(&self) -> &Bytes {
        &self.buf
    }

    fn read(&mut self, at: u64, size: usize) -> Result<()> {
        let size = (size as u64).min(self.len.saturating_sub(at)) as usize;
        // Reuse the last window's buffer when nothing else holds it: its pages are mapped
        // already, and a fresh 8 MiB buffer per read spent most of recovery in page faults.
        let mut v = std::mem::take(&mut self.buf)
            .try_into_mut()
            .map(Vec::from)
            .unwrap_or_default();
        self.file
            .read_range_into(at, size, &mut v)
            .map_err(|e| Error::io(format!("read segment {}", self.name), e))?;
        self.buf = Bytes::from(v);
        self.base = at;
        Ok(())
    }

    /// Makes the bytes `[at, at + need)` available, as far as the file has them, by reading a
    /// new window at `at` (at least twice the last one, up to [`Window::MAX`], never less than
    /// `need`). Returns false when nothing more could be read.
    pub fn ensure(&mut self, at: u64, need: usize) -> Result<bool> {
        let end = at.saturating_add(need as u64).min(self.len);
        let have = self.base + self.buf.len() as u64;
        if at >= self.base && end <= have {
            return Ok(false);
        }
        if at >= self.base && have >= self.len {
            return Ok(false);
        }
        let size = need.max((self.buf.len() * 2).clamp(Self::FIRST, Self::MAX));
        let before = (self.base, self.buf.len());
        self.read(at, size)?;
        Ok((self.base, self.buf.len()) != before)
    }

    /// True when every byte of the file from `at` on is zero (read window by window).
    pub fn zero_from(&mut self, mut at: u64) -> Result<bool> {
        while at < self.len {
            self.ensure(at, Self::MAX)?;
            let idx = (at - self.base) as usize;
            if self.buf[idx..].iter().any(|&b| b != 0) {
                return Ok(false);
            }
            at = self.base + self.buf.len() as u64;
            if self.buf.is_empty() {
                break;
            }
        }
        Ok(true)
    }

    /// The first 8-aligned offset at or after `at` whose 16-byte frame header is not all zero
    /// (or the file's end): lets a search step over unwritten space a window at a time.
    pub fn skip_zeros(&mut self, mut at: u64) -> Result<u64> {
        while at < self.len {
            self.ensure(at, Self::MAX)?;
            let idx = (at - self.base) as usize;
            match self.buf[idx..].iter().position(|&b| b != 0) {
                Some(q) => {
                    // A header that starts up to 15 bytes before the non-zero byte includes it.
                    let q = at + q as u64;
                    let aligned = q & !(format::FRAME_ALIGN as u64 - 1);
                    return Ok(aligned.saturating_sub(format::FRAME_ALIGN as u64).max(at));
                }
                None if self.buf.is_empty() => break,
                None => at = self.base + self.buf.len() as u64,
            }
        }
        Ok(self.len)
    }

    /// The segment header's seed.
    pub fn seed(&mut self, seq: u64) -> std::result::Result<format::Seed, format::HeaderError> {
        if self.ensure(0, format::SEGMENT_HEADER_LEN).is_err() {
            return Err(format::HeaderError::Bad);
        }
        format::decode_segment_header(&self.buf, seq)
    }

    /// The seed a damaged header may still hold ([`format::salvage_segment_seed`]).
    pub fn salvage_seed(&mut self, seq: u64) -> Option<format::Seed> {
        self.ensure(0, format::SEGMENT_HEADER_LEN).ok()?;
        format::salvage_segment_seed(&self.buf, seq)
    }

    /// Decodes the frame at file offset `at`, reading more of the file when the frame may
    /// extend past the window.
    pub fn frame(
        &mut self,
        seed: format::Seed,
        at: u64,
    ) -> Result<std::result::Result<Found, format::FrameError>> {
        loop {
            self.ensure(at, format::FRAME_HEADER_LEN)?;
            let idx = (at - self.base) as usize;
            let r = format::decode_frame_in(&self.buf, seed, self.base, idx);
            let need = match &r {
                Err(format::FrameError::Zero) | Err(format::FrameError::ShortHeader)
                    if idx + format::FRAME_HEADER_LEN > self.buf.len() =>
                {
                    format::FRAME_HEADER_LEN
                }
                Err(format::FrameError::Bad(CorruptionReason::TornFrame)) => {
                    // The header verified, and its length is within the format's maximum.
                    format::declared_frame_size(&self.buf, idx).unwrap_or(0)
                }
                _ => 0,
            };
            let found = r.map(|f| Found {
                kind: f.kind,
                payload: idx + format::FRAME_HEADER_LEN
                    ..idx + format::FRAME_HEADER_LEN + f.payload.len(),
                size: f.size,
            });
            if found.is_err() && need > 0 && self.ensure(at, need)? {
                continue;
            }
            return Ok(found);
        }
    }
}

/// A frame that verified, located in its [`Window`].
#[derive(Debug, Clone)]
pub(crate) struct Found {
    /// Its kind.
    pub kind: format::FrameKind,
    /// Where its payload is in [`Window::buf`].
    pub payload: std::ops::Range<usize>,
    /// Bytes the frame takes, padding included.
    pub size: usize,
}
