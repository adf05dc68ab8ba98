//! [`DirDeadLetters`]: a dead-letter log in a directory, one append-only, checksummed file per
//! (sink id, subtask), through the [`Storage`] seam like the log's own files.
//!
//! File `{sink_id}@{subtask}.wdl`: a 16-byte header (`WALSINKDLQ`, two zero bytes, format
//! version 1 as u32 little-endian), then one frame per letter: payload length (u32 LE),
//! the payload's CRC-32 (IEEE, u32 LE), payload. A put appends one frame and
//! syncs the file (and the directory, for the file's first letter) before it returns. A frame
//! cut short at the end of the file (a crash in the middle of a put, which then never returned)
//! is cut off when the file is opened for writing and passed over when it is read; damage
//! anywhere else is an error that names the file and the offset. The format is
//! `docs/design.md`'s, "Dead letters".

use crate::delivery::dead_letter::{DeadLetter, DeadLetters, Origin};
use crate::error::{CorruptionReason, Error, ErrorKind, Result};
use crate::storage::{FsStorage, Storage, StorageFile};
use crate::{EpochKey, SinkErrorClass};
use bytes::Bytes;
use parking_lot::Mutex;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// The file header: magic, then the format version.
const MAGIC: &[u8; 12] = b"WALSINKDLQ\0\0";
const VERSION: u32 = 1;
const HEADER_LEN: u64 = 16;
/// The file name's extension.
pub const DEAD_LETTER_EXT: &str = "wdl";
/// A letter's frame kind.
const KIND_LETTER: u8 = 1;
/// Largest payload a frame may declare: a record (at most the log's largest) and its texts.
const MAX_FRAME: u32 = 1 << 30;

/// A dead-letter log in a directory (created, private, if missing); see the module docs.
///
/// One handle per (sink id, subtask) at a time: [`DirDeadLetters::open`] takes the file's
/// lock. The letters of every process that held it are kept, so a restart leaves the records
/// it had put out of their epochs.
#[derive(Debug)]
pub struct DirDeadLetters {
    storage: Arc<dyn Storage>,
    dir: PathBuf,
    name: String,
    sink_id: String,
    subtask: u32,
    limit: Option<u64>,
    inner: Mutex<Inner>,
    _lock: Box<dyn Send + Sync + std::fmt::Debug>,
}

#[derive(Debug)]
struct Inner {
    file: Option<Arc<dyn StorageFile>>,
    /// Where the next frame goes.
    end: u64,
    /// Letters held, by checkpoint: (index, payload length).
    held: BTreeMap<u64, Vec<(u64, u64)>>,
    /// Letters in the file.
    count: u64,
    /// A put failed half-way: the file may hold part of a letter past `end`, cut off
    /// before the next put.
    broken: Option<String>,
}

impl DirDeadLetters {
    /// Opens (or creates) the dead-letter log of `sink_id`'s `subtask` in `dir`.
    ///
    /// # Errors
    /// I/O errors naming the directory; [`ErrorKind::Locked`] while another handle holds it;
    /// [`ErrorKind::Corruption`] for damage before the file's last frame.
    pub fn open(dir: impl AsRef<Path>, sink_id: &str, subtask: u32) -> Result<DirDeadLetters> {
        let dir = dir.as_ref().to_path_buf();
        crate::validate_sink_id(sink_id)?;
        let storage: Arc<dyn Storage> = Arc::new(FsStorage::new(&dir).map_err(|e| {
            Error::io(
                format!("open the dead-letter directory {}", dir.display()),
                e,
            )
        })?);
        Self::on(storage, dir, sink_id, subtask)
    }

    /// [`DirDeadLetters::open`] on any storage (a simulated disk in tests).
    pub fn on(
        storage: Arc<dyn Storage>,
        dir: PathBuf,
        sink_id: &str,
        subtask: u32,
    ) -> Result<DirDeadLetters> {
        let name = file_name(sink_id, subtask);
        let lock = storage.lock(&format!("{name}.lock")).map_err(|e| {
            if e.kind() == std::io::ErrorKind::WouldBlock {
                Error::from(ErrorKind::Locked {
                    dir: format!("{} (dead letters of {sink_id}/{subtask})", dir.display()),
                })
            } else {
                Error::io(format!("lock {}", dir.join(&name).display()), e)
            }
        })?;
        let mut inner = Inner {
            file: None,
            end: HEADER_LEN,
            held: BTreeMap::new(),
            count: 0,
            broken: None,
        };
        if storage
            .list()
            .map_err(|e| io(&dir, "list", e))?
            .contains(&name)
        {
            let file = storage.open(&name).map_err(|e| io(&dir, "open", e))?;
            let read = read_file(&*file, &name)?;
            if read.end < file.len().map_err(|e| io(&dir, "read", e))? {
                // A put that never returned: cut it off before appending after it.
                file.set_len(read.end)
                    .map_err(|e| io(&dir, "truncate", e))?;
                file.sync_data().map_err(|e| io(&dir, "sync", e))?;
            }
            for l in &read.letters {
                if l.sink_id == sink_id && l.subtask == subtask {
                    inner
                        .held
                        .entry(l.checkpoint)
                        .or_default()
                        .push((l.index, l.data.len() as u64));
                }
            }
            inner.count = read.letters.len() as u64;
            inner.end = read.end;
            inner.file = Some(file);
        }
        Ok(DirDeadLetters {
            storage,
            dir,
            name,
            sink_id: sink_id.to_string(),
            subtask,
            limit: None,
            inner: Mutex::new(inner),
            _lock: lock,
        })
    }

    /// Lets the log hold at most `limit` letters: a put past it fails with
    /// [`ErrorKind::DeadLetterLimit`], which stops delivery at the refused record's epoch.
    pub fn with_limit(mut self, limit: u64) -> DirDeadLetters {
        self.limit = Some(limit);
        self
    }

    /// Letters in this handle's file.
    pub fn len(&self) -> u64 {
        self.inner.lock().count
    }

    /// True when the file holds no letter.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Every letter in `dir`'s files, in file-name order and then in the order they were
    /// put; read-only, beside a running writer (a frame being written is passed over).
    ///
    /// # Errors
    /// I/O errors naming the directory; [`ErrorKind::Corruption`] for a damaged file.
    pub fn read_all(dir: impl AsRef<Path>) -> Result<Vec<DeadLetter>> {
        let dir = dir.as_ref();
        let storage = FsStorage::existing(dir).map_err(|e| io(dir, "open", e))?;
        let mut names: Vec<String> = storage
            .list()
            .map_err(|e| io(dir, "list", e))?
            .into_iter()
            .filter(|n| n.ends_with(&format!(".{DEAD_LETTER_EXT}")))
            .collect();
        names.sort();
        let mut out = Vec::new();
        for n in names {
            let file = storage.open(&n).map_err(|e| io(dir, "open", e))?;
            out.extend(read_file(&*file, &n)?.letters);
        }
        Ok(out)
    }

    fn put_locked(&self, inner: &mut Inner, mut letter: DeadLetter) -> Result<()> {
        if inner.broken.is_some() {
            // A put failed half-way (a full disk): cut the file back to its last whole letter
            // and go on, once the disk takes that again.
            if let Some(f) = &inner.file {
                f.set_len(inner.end)
                    .and_then(|()| f.sync_data())
                    .map_err(|e| io(&self.dir, "repair", e))?;
            }
            inner.broken = None;
        }
        let first = inner.file.is_none();
        let file = match &inner.file {
            Some(f) => f.clone(),
            None => {
                let f = self
                    .storage
                    .create(&self.name)
                    .map_err(|e| io(&self.dir, "create", e))?;
                let mut h = Vec::with_capacity(HEADER_LEN as usize);
                h.extend_from_slice(MAGIC);
                h.extend_from_slice(&VERSION.to_le_bytes());
                f.write_at(0, &h).map_err(|e| io(&self.dir, "write", e))?;
                f
            }
        };
        letter.seq = inner.count;
        let frame = encode(&letter);
        let written = file
            .write_at(inner.end, &frame)
            .and_then(|()| file.sync_data())
            .and_then(|()| {
                if first {
                    self.storage.sync_dir()
                } else {
                    Ok(())
                }
            });
        if let Err(e) = written {
            inner.broken = Some(e.to_string());
            return Err(io(&self.dir, "write a dead letter to", e));
        }
        inner.file = Some(file);
        inner.end += frame.len() as u64;
        inner.count += 1;
        if letter.sink_id == self.sink_id && letter.subtask == self.subtask {
            inner
                .held
                .entry(letter.checkpoint)
                .or_default()
                .push((letter.index, letter.data.len() as u64));
        }
        Ok(())
    }
}

impl DeadLetters for DirDeadLetters {
    fn held(&self, key: &EpochKey) -> Result<Vec<(u64, u64)>> {
        if *key.sink_id != *self.sink_id || key.subtask != self.subtask {
            return Ok(Vec::new());
        }
        Ok(self
            .inner
            .lock()
            .held
            .get(&key.checkpoint)
            .cloned()
            .unwrap_or_default())
    }

    fn put(&self, letter: DeadLetter) -> Result<()> {
        let mut inner = self.inner.lock();
        if let Some(limit) = self.limit {
            if inner.count >= limit {
                return Err(ErrorKind::DeadLetterLimit {
                    limit,
                    checkpoint: letter.checkpoint,
                    index: letter.index,
                    reason: letter.message,
                }
                .into());
            }
        }
        self.put_locked(&mut inner, letter)
    }
}

fn file_name(sink_id: &str, subtask: u32) -> String {
    format!("{sink_id}@{subtask}.{DEAD_LETTER_EXT}")
}

fn io(dir: &Path, what: &str, e: std::io::Error) -> Error {
    Error::io(
        format!("{what} the dead-letter log in {}", dir.display()),
        e,
    )
}

struct Read {
    letters: Vec<DeadLetter>,
    /// The end of the last whole frame.
    end: u64,
}

fn read_file(file: &dyn StorageFile, name: &str) -> Result<Read> {
    let len = file
        .len()
        .map_err(|e| Error::io(format!("read {name}"), e))?;
    let mut buf = vec![0u8; len as usize];
    let mut at = 0;
    while at < buf.len() {
        let n = file
            .read_at(at as u64, &mut buf[at..])
            .map_err(|e| Error::io(format!("read {name}"), e))?;
        if n == 0 {
            buf.truncate(at);
            break;
        }
        at += n;
    }
    if buf.len() < HEADER_LEN as usize {
        // Created, and the header not yet (or never) written whole: no letter in it.
        return Ok(Read {
            letters: Vec::new(),
            end: HEADER_LEN.min(buf.len() as u64),
        });
    }
    if &buf[..12] != MAGIC {
        return Err(Error::corruption(name, 0, CorruptionReason::BadHeader));
    }
    let version = u32::from_le_bytes(buf[12..16].try_into().expect("4 bytes"));
    if version != VERSION {
        return Err(ErrorKind::UnsupportedVersion {
            file: name.to_string(),
            found: version,
            supported: VERSION,
        }
        .into());
    }
    let mut letters = Vec::new();
    let mut at = HEADER_LEN as usize;
    loop {
        let rest = &buf[at..];
        if rest.is_empty() {
            break;
        }
        if rest.len() < 8 {
            break; // a torn frame header at the end
        }
        let plen = u32::from_le_bytes(rest[..4].try_into().expect("4 bytes"));
        let crc = u32::from_le_bytes(rest[4..8].try_into().expect("4 bytes"));
        if plen > MAX_FRAME {
            return Err(Error::corruption(
                name,
                at as u64,
                CorruptionReason::BadLength { len: plen as u64 },
            ));
        }
        let Some(payload) = rest.get(8..8 + plen as usize) else {
            break; // a torn frame at the end
        };
        let got = crc32fast::hash(payload);
        if got != crc {
            // The last frame, whole in length but with bytes that never reached the disk
            // (zeros): a put that never returned. Any other mismatch is damage to a letter
            // that was acknowledged, never cut off.
            let unwritten = payload.iter().all(|&b| b == 0);
            if at + 8 + plen as usize == buf.len() && unwritten {
                break;
            }
            return Err(Error::corruption(
                name,
                at as u64,
                CorruptionReason::Checksum { expected: crc, got },
            ));
        }
        let letter = decode(payload)
            .ok_or_else(|| Error::corruption(name, at as u64, CorruptionReason::BadPayload))?;
        letters.push(letter);
        at += 8 + plen as usize;
    }
    Ok(Read {
        letters,
        end: at as u64,
    })
}

fn put_str(out: &mut Vec<u8>, s: &[u8]) {
    out.extend_from_slice(&(s.len() as u32).to_le_bytes());
    out.extend_from_slice(s);
}

fn class_byte(c: SinkErrorClass) -> u8 {
    match c {
        SinkErrorClass::Retryable => 0,
        SinkErrorClass::Permanent => 1,
        SinkErrorClass::Fenced => 2,
        SinkErrorClass::Rejected => 3,
    }
}

fn encode(l: &DeadLetter) -> Vec<u8> {
    let mut p = Vec::with_capacity(96 + l.message.len() + l.data.len());
    p.push(KIND_LETTER);
    p.extend_from_slice(&l.seq.to_le_bytes());
    p.extend_from_slice(&l.checkpoint.to_le_bytes());
    p.extend_from_slice(&l.index.to_le_bytes());
    p.extend_from_slice(&l.subtask.to_le_bytes());
    p.extend_from_slice(&l.time_ms.to_le_bytes());
    p.extend_from_slice(&l.attempt.to_le_bytes());
    p.push(class_byte(l.class));
    p.push(u8::from(l.code.is_some()) | (u8::from(l.origin.is_some()) << 1));
    put_str(&mut p, l.sink_id.as_bytes());
    if let Some(c) = &l.code {
        put_str(&mut p, c.as_bytes());
    }
    put_str(&mut p, l.message.as_bytes());
    if let Some(o) = &l.origin {
        put_str(&mut p, o.sink_id.as_bytes());
        p.extend_from_slice(&o.subtask.to_le_bytes());
        p.extend_from_slice(&o.checkpoint.to_le_bytes());
        p.extend_from_slice(&o.index.to_le_bytes());
    }
    put_str(&mut p, &l.data);
    let mut frame = Vec::with_capacity(8 + p.len());
    frame.extend_from_slice(&(p.len() as u32).to_le_bytes());
    frame.extend_from_slice(&crc32fast::hash(&p).to_le_bytes());
    frame.extend_from_slice(&p);
    frame
}

struct Cur<'a>(&'a [u8]);

impl<'a> Cur<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        if self.0.len() < n {
            return None;
        }
        let (a, b) = self.0.split_at(n);
        self.0 = b;
        Some(a)
    }
    fn u8(&mut self) -> Option<u8> {
        Some(self.take(1)?[0])
    }
    fn u32(&mut self) -> Option<u32> {
        Some(u32::from_le_bytes(self.take(4)?.try_into().ok()?))
    }
    fn u64(&mut self) -> Option<u64> {
        Some(u64::from_le_bytes(self.take(8)?.try_into().ok()?))
    }
    fn bytes(&mut self) -> Option<&'a [u8]> {
        let n = self.u32()? as usize;
        self.take(n)
    }
    fn text(&mut self) -> Option<String> {
        String::from_utf8(self.bytes()?.to_vec()).ok()
    }
}

fn decode(p: &[u8]) -> Option<DeadLetter> {
    let mut c = Cur(p);
    if c.u8()? != KIND_LETTER {
        return None;
    }
    let seq = c.u64()?;
    let checkpoint = c.u64()?;
    let index = c.u64()?;
    let subtask = c.u32()?;
    let time_ms = c.u64()?;
    let attempt = c.u32()?;
    let class = match c.u8()? {
        0 => SinkErrorClass::Retryable,
        1 => SinkErrorClass::Permanent,
        2 => SinkErrorClass::Fenced,
        3 => SinkErrorClass::Rejected,
        _ => return None,
    };
    let flags = c.u8()?;
    let sink_id = c.text()?;
    let code = if flags & 1 != 0 {
        Some(c.text()?)
    } else {
        None
    };
    let message = c.text()?;
    let origin = if flags & 2 != 0 {
        Some(Origin {
            sink_id: c.text()?,
            subtask: c.u32()?,
            checkpoint: c.u64()?,
            index: c.u64()?,
        })
    } else {
        None
    };
    let data = Bytes::copy_from_slice(c.bytes()?);
    if !c.0.is_empty() {
        return None;
    }
    Some(DeadLetter {
        seq,
        sink_id,
        subtask,
        checkpoint,
        index,
        class,
        code,
        message,
        time_ms,
        attempt,
        origin,
        data,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn letter(checkpoint: u64, index: u64, data: &[u8]) -> DeadLetter {
        DeadLetter {
            seq: 0,
            sink_id: "s".into(),
            subtask: 2,
            checkpoint,
            index,
            class: SinkErrorClass::Rejected,
            code: Some("23514".into()),
            message: "new row violates check constraint \"c\"".into(),
            time_ms: 1_700_000_000_000,
            attempt: 1,
            origin: None,
            data: Bytes::copy_from_slice(data),
        }
    }

    fn key(checkpoint: u64) -> EpochKey {
        EpochKey {
            sink_id: "s".into(),
            subtask: 2,
            checkpoint,
        }
    }

    #[test]
    fn letters_survive_reopening_and_are_held_by_epoch() {
        let dir = tempfile::tempdir().unwrap();
        let d = DirDeadLetters::open(dir.path(), "s", 2).unwrap();
        d.put(letter(5, 3, b"bad")).unwrap();
        d.put(letter(5, 9, b"\0\xffbytes")).unwrap();
        let mut other = letter(7, 0, b"x");
        other.origin = Some(Origin {
            sink_id: "orig".into(),
            subtask: 0,
            checkpoint: 1,
            index: 4,
        });
        other.code = None;
        d.put(other.clone()).unwrap();
        drop(d);
        let d = DirDeadLetters::open(dir.path(), "s", 2).unwrap();
        assert_eq!(d.held(&key(5)).unwrap(), vec![(3, 3), (9, 7)]);
        assert_eq!(d.held(&key(6)).unwrap(), vec![]);
        let all = DirDeadLetters::read_all(dir.path()).unwrap();
        assert_eq!(all.len(), 3);
        assert_eq!(all[1].data.as_ref(), b"\0\xffbytes");
        assert_eq!(all[2].seq, 2);
        assert_eq!(all[2].origin, other.origin);
        assert_eq!(all[2].code, None);
    }

    #[test]
    fn the_limit_refuses_the_letter_past_it() {
        let dir = tempfile::tempdir().unwrap();
        let d = DirDeadLetters::open(dir.path(), "s", 2)
            .unwrap()
            .with_limit(1);
        d.put(letter(1, 0, b"a")).unwrap();
        let e = d.put(letter(1, 1, b"b")).unwrap_err();
        assert!(
            matches!(
                e.kind(),
                ErrorKind::DeadLetterLimit {
                    limit: 1,
                    index: 1,
                    ..
                }
            ),
            "{e}"
        );
        assert_eq!(d.held(&key(1)).unwrap(), vec![(0, 1)]);
    }

    #[test]
    fn a_second_handle_on_one_shard_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let _d = DirDeadLetters::open(dir.path(), "s", 2).unwrap();
        let e = DirDeadLetters::open(dir.path(), "s", 2).unwrap_err();
        assert!(matches!(e.kind(), ErrorKind::Locked { .. }), "{e}");
        DirDeadLetters::open(dir.path(), "s", 3).unwrap();
    }
}
