//! The on-disk format: names, segment headers, frames and control payloads.
//!
//! Pure code without I/O, so property tests and fuzzers reach it directly. The normative
//! description, with byte tables, is `docs/design.md` ("On-disk format"); this module is its
//! only implementation. All integers are little-endian.

pub use super::layout::{
    free_name, parse_numbered, segment_name, set_aside_name, COMMIT_FILE, IDENTITY_FILE, LOCK_FILE,
    MAX_METADATA_LIMIT, MAX_RECORD_LIMIT,
};
use crate::error::CorruptionReason;

/// Magic bytes at the start of every segment file.
pub const SEGMENT_MAGIC: [u8; 8] = *b"WSNKSEG\0";
/// Magic bytes at the start of the identity file.
pub const IDENTITY_MAGIC: [u8; 8] = *b"WSNKID\0\0";
/// Magic bytes at the start of the local commit store file.
pub const COMMIT_MAGIC: [u8; 8] = *b"WSNKCMT\0";
/// The format version this build writes and the newest it reads.
pub const FORMAT_VERSION: u32 = 1;

const U32: usize = std::mem::size_of::<u32>();
const U64: usize = std::mem::size_of::<u64>();

/// Segment header: magic, version, reserved u32, sequence number, salt, header CRC,
/// reserved u32.
pub const SEGMENT_HEADER_LEN: usize = SEGMENT_MAGIC.len() + U32 + U32 + U64 + U64 + U32 + U32;
const SEG_CRC_AT: usize = SEGMENT_MAGIC.len() + U32 + U32 + U64 + U64;

/// What every frame checksum of a segment is bound to: the segment's sequence number and the
/// random salt chosen when the segment was started. A frame left in a file by an earlier use
/// of the file, or of the same sequence number, never verifies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Seed {
    /// Segment sequence number.
    pub seq: u64,
    /// Random salt from the segment header.
    pub salt: u64,
}

/// Every frame starts at a multiple of this many bytes.
pub const FRAME_ALIGN: usize = 8;
const _: () = assert!(SEGMENT_HEADER_LEN.is_multiple_of(FRAME_ALIGN));
/// Frame header: header CRC, payload length, kind, three reserved bytes, payload CRC.
pub const FRAME_HEADER_LEN: usize = U32 + U32 + 1 + 3 + U32;
/// Largest payload a frame may have: the largest record (1 GiB) or the largest barrier
/// (40 bytes plus 16 MiB of metadata). Readers reject longer length fields before reading.
pub const MAX_PAYLOAD: usize = MAX_RECORD_LIMIT + BARRIER_FIXED_LEN + MAX_METADATA_LIMIT;

/// Bytes kept free at the end of every segment for its closing [`FrameKind::SegmentEnd`].
pub const SEGMENT_END_RESERVE: usize = FRAME_HEADER_LEN;

/// A position in the log: segment sequence number and byte offset inside that segment.
/// Positions order lexicographically, which is log order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Position {
    /// Segment sequence number.
    pub seq: u64,
    /// Byte offset inside the segment file.
    pub offset: u64,
}

impl Position {
    /// The position of the first frame of segment `seq`.
    pub fn segment_start(seq: u64) -> Self {
        Position {
            seq,
            offset: SEGMENT_HEADER_LEN as u64,
        }
    }
}

/// What a frame holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum FrameKind {
    /// One record of the open epoch.
    Data = 1,
    /// Seals the records since the previous control frame as a checkpoint.
    Barrier = 2,
    /// Voids sealed, uncommitted epochs above an id and the unsealed records before it.
    Restore = 3,
    /// Closes a segment: the log continues in the next segment.
    SegmentEnd = 4,
}

impl FrameKind {
    /// Decodes a kind byte.
    pub fn from_u8(b: u8) -> Option<Self> {
        match b {
            1 => Some(Self::Data),
            2 => Some(Self::Barrier),
            3 => Some(Self::Restore),
            4 => Some(Self::SegmentEnd),
            _ => None,
        }
    }
}

/// Rounds `n` up to the frame alignment.
pub const fn align_up(n: usize) -> usize {
    (n + FRAME_ALIGN - 1) & !(FRAME_ALIGN - 1)
}

/// Total bytes a frame with a payload of `len` bytes takes in a segment, padding included.
pub const fn frame_size(len: usize) -> usize {
    align_up(FRAME_HEADER_LEN + len)
}

fn le_u32(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + U32].try_into().expect("slice of 4"))
}

fn le_u64(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + U64].try_into().expect("slice of 8"))
}

/// Encodes the header of a segment.
pub fn encode_segment_header(seed: Seed) -> [u8; SEGMENT_HEADER_LEN] {
    let mut h = [0u8; SEGMENT_HEADER_LEN];
    h[..8].copy_from_slice(&SEGMENT_MAGIC);
    h[8..12].copy_from_slice(&FORMAT_VERSION.to_le_bytes());
    h[16..24].copy_from_slice(&seed.seq.to_le_bytes());
    h[24..32].copy_from_slice(&seed.salt.to_le_bytes());
    let crc = crc32(&h[..SEG_CRC_AT]);
    h[SEG_CRC_AT..SEG_CRC_AT + 4].copy_from_slice(&crc.to_le_bytes());
    h
}

/// Why a segment header was rejected.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HeaderError {
    /// Not a header written by walsink, or damaged.
    Bad,
    /// A valid header of a format version this build cannot read.
    Version(u32),
}

/// Decodes a segment header, checks that it belongs to segment `expected_seq`, and returns the
/// segment's seed.
pub fn decode_segment_header(b: &[u8], expected_seq: u64) -> Result<Seed, HeaderError> {
    if b.len() < SEGMENT_HEADER_LEN || b[..8] != SEGMENT_MAGIC {
        return Err(HeaderError::Bad);
    }
    let crc = le_u32(b, SEG_CRC_AT);
    if crc32(&b[..SEG_CRC_AT]) != crc {
        return Err(HeaderError::Bad);
    }
    let version = le_u32(b, 8);
    if version != FORMAT_VERSION {
        return Err(HeaderError::Version(version));
    }
    if le_u64(b, 16) != expected_seq {
        return Err(HeaderError::Bad);
    }
    Ok(Seed {
        seq: expected_seq,
        salt: le_u64(b, 24),
    })
}

/// The seed a damaged segment header may still hold: the file's sequence number and the salt
/// stored in the header, read without checking magic, version or checksum. Frames verified
/// with it are genuine (their checksums cover both, and a stale header of a recycled file
/// carries another salt), so recovery can see what a segment with a damaged header held
/// instead of taking it for never written.
pub fn salvage_segment_seed(b: &[u8], expected_seq: u64) -> Option<Seed> {
    if b.len() < SEGMENT_HEADER_LEN {
        return None;
    }
    Some(Seed {
        seq: expected_seq,
        salt: le_u64(b, 24),
    })
}

/// A new CRC-32 hasher. `crc32fast::Hasher::new` asks the CPU which implementation to use
/// each time (about 37 instructions, as much as checksumming 32 bytes); the answer is taken
/// once and the hasher cloned from it.
fn hasher() -> crc32fast::Hasher {
    static PROTOTYPE: std::sync::OnceLock<crc32fast::Hasher> = std::sync::OnceLock::new();
    PROTOTYPE.get_or_init(crc32fast::Hasher::new).clone()
}

/// CRC-32 (IEEE) of `b`, as `crc32fast::hash`, from the cached [`hasher`].
fn crc32(b: &[u8]) -> u32 {
    let mut h = hasher();
    h.update(b);
    h.finalize()
}

/// The header checksum: over the seed, the offset and header bytes 4..16, gathered into one
/// buffer so the checksum runs once over 36 bytes instead of four short pieces.
fn header_crc(seed: Seed, offset: u64, rest: &[u8]) -> u32 {
    let mut b = [0u8; 36];
    b[0..8].copy_from_slice(&seed.seq.to_le_bytes());
    b[8..16].copy_from_slice(&seed.salt.to_le_bytes());
    b[16..24].copy_from_slice(&offset.to_le_bytes());
    b[24..36].copy_from_slice(rest);
    crc32(&b)
}

/// Appends one frame at `offset` of the segment with `seed` to `out`, padding included. The
/// frame is bound to its place: its header checksum covers the seed and the offset, so a stale
/// frame in a recycled file, or a frame copied elsewhere, never verifies.
pub fn encode_frame(out: &mut Vec<u8>, seed: Seed, offset: u64, kind: FrameKind, payload: &[u8]) {
    encode_frame_parts(out, seed, offset, kind, &[payload]);
}

/// Like [`encode_frame`], with the payload given as consecutive parts (no concatenation copy).
pub fn encode_frame_parts(
    out: &mut Vec<u8>,
    seed: Seed,
    offset: u64,
    kind: FrameKind,
    parts: &[&[u8]],
) {
    let len: usize = parts.iter().map(|p| p.len()).sum();
    debug_assert!(len <= u32::MAX as usize);
    debug_assert_eq!(offset as usize % FRAME_ALIGN, 0);
    let total = frame_size(len);
    // The header first, in a local (the payload's checksum is in it), then one reserve and
    // straight copies: header, payload parts, padding.
    let mut payload_crc = hasher();
    for p in parts {
        payload_crc.update(p);
    }
    let mut h = [0u8; FRAME_HEADER_LEN];
    h[4..8].copy_from_slice(&(len as u32).to_le_bytes());
    h[8] = kind as u8;
    h[12..16].copy_from_slice(&payload_crc.finalize().to_le_bytes());
    let crc = header_crc(seed, offset, &h[4..16]);
    h[0..4].copy_from_slice(&crc.to_le_bytes());
    out.reserve(total);
    out.extend_from_slice(&h);
    for p in parts {
        out.extend_from_slice(p);
    }
    const ZEROS: [u8; FRAME_ALIGN] = [0; FRAME_ALIGN];
    out.extend_from_slice(&ZEROS[..total - FRAME_HEADER_LEN - len]);
}

/// A frame that verified.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FrameRef<'a> {
    /// The frame's kind.
    pub kind: FrameKind,
    /// The payload bytes.
    pub payload: &'a [u8],
    /// Bytes the frame takes, padding included: the next frame starts this far on.
    pub size: usize,
}

/// The outcome of reading a frame at a position.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FrameError {
    /// All header bytes are zero: nothing was ever written here.
    Zero,
    /// The header is cut off by the end of the buffer.
    ShortHeader,
    /// Damage of this kind.
    Bad(CorruptionReason),
}

/// Reads and verifies the frame at offset `at` of a segment with `seed` whose bytes are `buf`.
/// Never allocates and never trusts the length field beyond the buffer.
pub fn decode_frame(buf: &[u8], seed: Seed, at: usize) -> Result<FrameRef<'_>, FrameError> {
    decode_frame_in(buf, seed, 0, at)
}

/// Like [`decode_frame`] for a buffer that holds the segment's bytes from offset `base` on:
/// the frame is at `buf[at..]`, which is segment offset `base + at`.
pub fn decode_frame_in(
    buf: &[u8],
    seed: Seed,
    base: u64,
    at: usize,
) -> Result<FrameRef<'_>, FrameError> {
    let Some(h) = buf.get(at..at.saturating_add(FRAME_HEADER_LEN)) else {
        if buf.len() > at && buf[at..].iter().any(|&b| b != 0) {
            return Err(FrameError::ShortHeader);
        }
        return Err(FrameError::Zero);
    };
    if h.iter().all(|&b| b == 0) {
        return Err(FrameError::Zero);
    }
    let stored = le_u32(h, 0);
    let got = header_crc(seed, base + at as u64, &h[4..16]);
    if stored != got {
        return Err(FrameError::Bad(CorruptionReason::Checksum {
            expected: stored,
            got,
        }));
    }
    let len = le_u32(h, 4) as usize;
    let Some(kind) = FrameKind::from_u8(h[8]) else {
        return Err(FrameError::Bad(CorruptionReason::UnknownKind(h[8])));
    };
    if len > MAX_PAYLOAD {
        return Err(FrameError::Bad(CorruptionReason::BadLength {
            len: len as u64,
        }));
    }
    let body = at + FRAME_HEADER_LEN;
    // The whole frame, padding included, must be in the buffer: readers step by `size`.
    if buf.len() < at + frame_size(len) {
        return Err(FrameError::Bad(CorruptionReason::TornFrame));
    }
    let payload = &buf[body..body + len];
    let stored = le_u32(h, 12);
    let got = crc32(payload);
    if stored != got {
        return Err(FrameError::Bad(CorruptionReason::Checksum {
            expected: stored,
            got,
        }));
    }
    Ok(FrameRef {
        kind,
        payload,
        size: frame_size(len),
    })
}

/// The size (padding included) that a frame header at `buf[at..]` declares, unverified: how
/// many bytes to read to see the whole frame. `None` when the header is not all in `buf` or
/// declares more than [`MAX_PAYLOAD`].
pub fn declared_frame_size(buf: &[u8], at: usize) -> Option<usize> {
    let h = buf.get(at..at.checked_add(FRAME_HEADER_LEN)?)?;
    let len = le_u32(h, 4) as usize;
    (len <= MAX_PAYLOAD).then(|| frame_size(len))
}

/// Reads the frame at `buf[at..]` without verifying checksums: for iterating over frames that
/// were verified before. Returns `None` at the end of the buffer or on a header that does not fit.
pub fn peek_frame(buf: &[u8], at: usize) -> Option<FrameRef<'_>> {
    let h = buf.get(at..at + FRAME_HEADER_LEN)?;
    let len = le_u32(h, 4) as usize;
    let kind = FrameKind::from_u8(h[8])?;
    if buf.len() < at + frame_size(len) {
        return None;
    }
    let payload = &buf[at + FRAME_HEADER_LEN..at + FRAME_HEADER_LEN + len];
    Some(FrameRef {
        kind,
        payload,
        size: frame_size(len),
    })
}

/// The payload of a [`FrameKind::Barrier`] frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Barrier<'a> {
    /// The checkpoint id that seals the epoch.
    pub checkpoint: u64,
    /// Wall-clock time of the checkpoint, milliseconds since the Unix epoch.
    pub timestamp_ms: u64,
    /// Number of data frames in the epoch (since the previous control frame).
    pub records: u64,
    /// Everything before this position was durable when the barrier was written.
    pub durable_through: Position,
    /// Opaque bytes from the embedder (for example a source offset).
    pub metadata: &'a [u8],
}

/// Fixed part of a barrier payload.
pub const BARRIER_FIXED_LEN: usize = 5 * U64;

/// The timestamp that marks a barrier as an id reservation, not a checkpoint: recovery
/// writes one for the newest checkpoint id it had to drop, so that no later open hands the id
/// out again. It seals no records and carries no metadata.
pub const RESERVATION_TIMESTAMP: u64 = u64::MAX;

impl<'a> Barrier<'a> {
    /// A barrier that only reserves checkpoint id `checkpoint` (see [`RESERVATION_TIMESTAMP`]).
    pub fn reservation(checkpoint: u64, durable_through: Position) -> Self {
        Barrier {
            checkpoint,
            timestamp_ms: RESERVATION_TIMESTAMP,
            records: 0,
            durable_through,
            metadata: &[],
        }
    }

    /// True for an id reservation rather than a checkpoint.
    pub fn is_reservation(&self) -> bool {
        self.timestamp_ms == RESERVATION_TIMESTAMP && self.records == 0 && self.metadata.is_empty()
    }

    /// The payload without metadata; the metadata follows it as a second part.
    pub fn encode_fixed(&self) -> [u8; BARRIER_FIXED_LEN] {
        let mut b = [0u8; BARRIER_FIXED_LEN];
        b[0..8].copy_from_slice(&self.checkpoint.to_le_bytes());
        b[8..16].copy_from_slice(&self.timestamp_ms.to_le_bytes());
        b[16..24].copy_from_slice(&self.records.to_le_bytes());
        b[24..32].copy_from_slice(&self.durable_through.seq.to_le_bytes());
        b[32..40].copy_from_slice(&self.durable_through.offset.to_le_bytes());
        b
    }

    /// Decodes a barrier payload.
    pub fn decode(p: &'a [u8]) -> Option<Self> {
        if p.len() < BARRIER_FIXED_LEN {
            return None;
        }
        Some(Barrier {
            checkpoint: le_u64(p, 0),
            timestamp_ms: le_u64(p, 8),
            records: le_u64(p, 16),
            durable_through: Position {
                seq: le_u64(p, 24),
                offset: le_u64(p, 32),
            },
            metadata: &p[BARRIER_FIXED_LEN..],
        })
    }
}

/// The payload of a [`FrameKind::Restore`] frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Restore {
    /// Sealed epochs with a larger id (or all, when `None`) written before this frame are void.
    pub restored_to: Option<u64>,
    /// Everything before this position was durable when the frame was written.
    pub durable_through: Position,
}

/// Length of a restore payload.
pub const RESTORE_LEN: usize = U64 + U64 + U64 + U64;

impl Restore {
    /// Encodes the payload.
    pub fn encode(&self) -> [u8; RESTORE_LEN] {
        let mut b = [0u8; RESTORE_LEN];
        let (flag, id) = match self.restored_to {
            Some(id) => (1u64, id),
            None => (0, 0),
        };
        b[0..8].copy_from_slice(&flag.to_le_bytes());
        b[8..16].copy_from_slice(&id.to_le_bytes());
        b[16..24].copy_from_slice(&self.durable_through.seq.to_le_bytes());
        b[24..32].copy_from_slice(&self.durable_through.offset.to_le_bytes());
        b
    }

    /// Decodes a payload.
    pub fn decode(p: &[u8]) -> Option<Self> {
        if p.len() != RESTORE_LEN {
            return None;
        }
        let restored_to = match le_u64(p, 0) {
            0 => None,
            1 => Some(le_u64(p, 8)),
            _ => return None,
        };
        Some(Restore {
            restored_to,
            durable_through: Position {
                seq: le_u64(p, 16),
                offset: le_u64(p, 24),
            },
        })
    }
}

/// Encodes a small checksummed file: magic, version, body length, body, CRC of all before it.
pub fn encode_small_file(magic: [u8; 8], body: &[u8]) -> Vec<u8> {
    let mut v = Vec::with_capacity(8 + 4 + 4 + body.len() + 4);
    v.extend_from_slice(&magic);
    v.extend_from_slice(&FORMAT_VERSION.to_le_bytes());
    v.extend_from_slice(&(body.len() as u32).to_le_bytes());
    v.extend_from_slice(body);
    let crc = crc32(&v);
    v.extend_from_slice(&crc.to_le_bytes());
    v
}

/// Decodes a file made by [`encode_small_file`] and returns its body.
pub fn decode_small_file(magic: [u8; 8], b: &[u8]) -> Result<&[u8], HeaderError> {
    if b.len() < 20 || b[..8] != magic {
        return Err(HeaderError::Bad);
    }
    let len = le_u32(b, 12) as usize;
    if b.len() != 16 + len + 4 {
        return Err(HeaderError::Bad);
    }
    if crc32(&b[..16 + len]) != le_u32(b, 16 + len) {
        return Err(HeaderError::Bad);
    }
    let version = le_u32(b, 8);
    if version != FORMAT_VERSION {
        return Err(HeaderError::Version(version));
    }
    Ok(&b[16..16 + len])
}

/// What the identity file says: whose log a directory holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identity {
    /// The sink id.
    pub sink_id: String,
    /// The subtask.
    pub subtask: u32,
    /// The log's own random id (32 lowercase hex digits), made when the log was created; `None`
    /// in a log made before log ids existed (its next open writes one).
    pub log_id: Option<String>,
}

/// The separator between the sink id and the log id in the identity body: not a character a
/// sink id may hold.
const LOG_ID_SEPARATOR: u8 = b'@';

/// Encodes the identity file body: subtask, sink id and, after `@`, the log id.
pub fn encode_identity(sink_id: &str, subtask: u32, log_id: &str) -> Vec<u8> {
    let mut body = Vec::with_capacity(4 + sink_id.len() + 1 + log_id.len());
    body.extend_from_slice(&subtask.to_le_bytes());
    body.extend_from_slice(sink_id.as_bytes());
    body.push(LOG_ID_SEPARATOR);
    body.extend_from_slice(log_id.as_bytes());
    encode_small_file(IDENTITY_MAGIC, &body)
}

/// Decodes the identity file (with or without a log id).
pub fn decode_identity(b: &[u8]) -> Result<Identity, HeaderError> {
    let body = decode_small_file(IDENTITY_MAGIC, b)?;
    if body.len() < 4 {
        return Err(HeaderError::Bad);
    }
    let subtask = le_u32(body, 0);
    let text = std::str::from_utf8(&body[4..]).map_err(|_| HeaderError::Bad)?;
    let (sink_id, log_id) = match text.split_once(LOG_ID_SEPARATOR as char) {
        Some((s, l)) if is_log_id(l) => (s, Some(l.to_string())),
        Some(_) => return Err(HeaderError::Bad),
        None => (text, None),
    };
    Ok(Identity {
        sink_id: sink_id.to_string(),
        subtask,
        log_id,
    })
}

/// Whether `s` has the shape of a log id: 32 lowercase hex digits.
pub fn is_log_id(s: &str) -> bool {
    s.len() == 32 && s.bytes().all(|c| matches!(c, b'0'..=b'9' | b'a'..=b'f'))
}

/// Encodes the local commit store body: the highest committed checkpoint, if any.
pub fn encode_commit(committed: Option<u64>) -> Vec<u8> {
    let mut body = [0u8; 16];
    if let Some(id) = committed {
        body[0..8].copy_from_slice(&1u64.to_le_bytes());
        body[8..16].copy_from_slice(&id.to_le_bytes());
    }
    encode_small_file(COMMIT_MAGIC, &body)
}

/// Decodes the local commit store file.
pub fn decode_commit(b: &[u8]) -> Result<Option<u64>, HeaderError> {
    let body = decode_small_file(COMMIT_MAGIC, b)?;
    if body.len() != 16 {
        return Err(HeaderError::Bad);
    }
    match le_u64(body, 0) {
        0 => Ok(None),
        1 => Ok(Some(le_u64(body, 8))),
        _ => Err(HeaderError::Bad),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn layout_constants() {
        assert_eq!(SEGMENT_HEADER_LEN, 40);
        assert_eq!(FRAME_HEADER_LEN, 16);
        assert_eq!(SEGMENT_HEADER_LEN % FRAME_ALIGN, 0);
        assert_eq!(frame_size(0), 16);
        assert_eq!(frame_size(1), 24);
        assert_eq!(frame_size(8), 24);
    }

    #[test]
    fn segment_header_roundtrip_and_mismatch() {
        let seed = Seed { seq: 7, salt: 99 };
        let h = encode_segment_header(seed);
        assert_eq!(decode_segment_header(&h, 7), Ok(seed));
        assert_eq!(decode_segment_header(&h, 8), Err(HeaderError::Bad));
        let mut v = h;
        v[8] = 9;
        let crc = crc32(&v[..SEG_CRC_AT]);
        v[SEG_CRC_AT..SEG_CRC_AT + 4].copy_from_slice(&crc.to_le_bytes());
        assert_eq!(decode_segment_header(&v, 7), Err(HeaderError::Version(9)));
    }

    fn seed(seq: u64) -> Seed {
        Seed { seq, salt: 0x5eed }
    }

    #[test]
    fn zero_header_is_zero() {
        let buf = [0u8; 64];
        assert_eq!(decode_frame(&buf, seed(1), 32), Err(FrameError::Zero));
        assert_eq!(decode_frame(&buf, seed(1), 60), Err(FrameError::Zero));
    }

    #[test]
    fn frame_bound_to_seed_and_offset() {
        let mut v = vec![0u8; 32];
        encode_frame(&mut v, seed(3), 32, FrameKind::Data, b"hello");
        assert!(decode_frame(&v, seed(3), 32).is_ok());
        assert!(matches!(
            decode_frame(&v, seed(4), 32),
            Err(FrameError::Bad(_))
        ));
        let other_salt = Seed { seq: 3, salt: 1 };
        assert!(matches!(
            decode_frame(&v, other_salt, 32),
            Err(FrameError::Bad(_))
        ));
        let mut moved = vec![0u8; 40];
        moved.extend_from_slice(&v[32..]);
        assert!(matches!(
            decode_frame(&moved, seed(3), 40),
            Err(FrameError::Bad(_))
        ));
    }

    #[test]
    fn hostile_length_does_not_allocate_or_panic() {
        let mut v = vec![0u8; 32];
        encode_frame(&mut v, seed(1), 32, FrameKind::Data, b"x");
        v[36..40].copy_from_slice(&u32::MAX.to_le_bytes());
        // Recompute the header CRC so only the length check can reject it.
        let crc = header_crc(seed(1), 32, &v[36..48]);
        v[32..36].copy_from_slice(&crc.to_le_bytes());
        assert_eq!(
            decode_frame(&v, seed(1), 32),
            Err(FrameError::Bad(CorruptionReason::BadLength {
                len: u32::MAX as u64
            }))
        );
    }

    #[test]
    fn frame_with_cut_padding_is_torn() {
        let mut v = vec![0u8; 40];
        encode_frame(&mut v, seed(1), 40, FrameKind::Data, b"abc");
        v.truncate(40 + FRAME_HEADER_LEN + 3);
        assert_eq!(
            decode_frame(&v, seed(1), 40),
            Err(FrameError::Bad(CorruptionReason::TornFrame))
        );
        assert_eq!(peek_frame(&v, 40), None);
    }

    #[test]
    fn small_files_roundtrip() {
        let id = "0123456789abcdef0123456789abcdef";
        let b = encode_identity("orders-sink", 3, id);
        assert_eq!(
            decode_identity(&b),
            Ok(Identity {
                sink_id: "orders-sink".into(),
                subtask: 3,
                log_id: Some(id.into()),
            })
        );
        // A log made before log ids: sink id and subtask only.
        let mut body = 3u32.to_le_bytes().to_vec();
        body.extend_from_slice(b"orders-sink");
        let old = decode_identity(&encode_small_file(IDENTITY_MAGIC, &body)).unwrap();
        assert_eq!((old.sink_id.as_str(), old.log_id), ("orders-sink", None));
        // A separator followed by anything but a log id is damage.
        body.extend_from_slice(b"@xyz");
        assert_eq!(
            decode_identity(&encode_small_file(IDENTITY_MAGIC, &body)),
            Err(HeaderError::Bad)
        );
        assert_eq!(decode_commit(&encode_commit(Some(42))), Ok(Some(42)));
        assert_eq!(decode_commit(&encode_commit(None)), Ok(None));
        let mut bad = encode_commit(Some(1));
        bad[20] ^= 1;
        assert_eq!(decode_commit(&bad), Err(HeaderError::Bad));
    }

    #[test]
    fn names() {
        assert_eq!(segment_name(5), "00000000000000000005.wseg");
        assert_eq!(
            parse_numbered(&segment_name(u64::MAX), "wseg"),
            Some(u64::MAX)
        );
        assert_eq!(parse_numbered("5.wseg", "wseg"), None);
        assert_eq!(parse_numbered(&free_name(9), "free"), Some(9));
    }

    proptest! {
        #[test]
        fn frame_roundtrip(seq in any::<u64>(), slot in 4u64..1000, payload in proptest::collection::vec(any::<u8>(), 0..300)) {
            let offset = slot * FRAME_ALIGN as u64;
            let mut v = vec![0u8; offset as usize];
            let sd = Seed { seq, salt: seq.rotate_left(7) };
            encode_frame(&mut v, sd, offset, FrameKind::Data, &payload);
            prop_assert_eq!(v.len() as u64, offset + frame_size(payload.len()) as u64);
            let f = decode_frame(&v, sd, offset as usize).unwrap();
            prop_assert_eq!(f.kind, FrameKind::Data);
            prop_assert_eq!(f.payload, &payload[..]);
            prop_assert_eq!(peek_frame(&v, offset as usize), Some(f));
        }

        #[test]
        fn any_single_bit_flip_is_detected(payload in proptest::collection::vec(any::<u8>(), 1..64), bit in any::<usize>()) {
            let mut v = vec![0u8; 32];
            encode_frame(&mut v, seed(9), 32, FrameKind::Data, &payload);
            let covered = FRAME_HEADER_LEN + payload.len();
            let bit = bit % (covered * 8);
            v[32 + bit / 8] ^= 1 << (bit % 8);
            prop_assert!(decode_frame(&v, seed(9), 32).is_err());
        }

        #[test]
        fn decode_arbitrary_bytes_never_panics(buf in proptest::collection::vec(any::<u8>(), 0..200), at in 0usize..220, seq in any::<u64>()) {
            let _ = decode_frame(&buf, seed(seq), at);
            let _ = peek_frame(&buf, at);
            let _ = decode_segment_header(&buf, seq);
            let _ = decode_small_file(COMMIT_MAGIC, &buf);
            let _ = Barrier::decode(&buf);
            let _ = Restore::decode(&buf);
        }

        #[test]
        fn control_payloads_roundtrip(id in any::<u64>(), ts in any::<u64>(), n in any::<u64>(), s in any::<u64>(), o in any::<u64>(), meta in proptest::collection::vec(any::<u8>(), 0..50), some in any::<bool>()) {
            let b = Barrier { checkpoint: id, timestamp_ms: ts, records: n, durable_through: Position { seq: s, offset: o }, metadata: &meta };
            let mut p = b.encode_fixed().to_vec();
            p.extend_from_slice(&meta);
            prop_assert_eq!(Barrier::decode(&p), Some(b));
            let r = Restore { restored_to: some.then_some(id), durable_through: Position { seq: s, offset: o } };
            prop_assert_eq!(Restore::decode(&r.encode()), Some(r));
        }
    }
}
