//! Finding a followed file again after a rotation: its identity (device and inode), the
//! fingerprint of a prefix, and the search of the input's directory for the file that holds
//! a given prefix (the renamed file by its inode, or the copy `copytruncate` left).

use serde::{Deserialize, Serialize};
use std::fs::{File, Metadata};
use std::io::Read;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};
use xxhash_rust::xxh3::Xxh3;

/// Bytes of a file's start that a reader keeps, to recognise the file rewritten in place
/// (truncated and written again past the reader's position before it looked).
pub const HEAD_BYTES: usize = 4096;

/// A file's identity on this machine: its device and inode. A renamed file keeps it; a new
/// file at the same path has another (an inode number can be reused once a file is deleted,
/// so a match is always confirmed by the prefix fingerprint).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileId {
    /// `st_dev`.
    pub dev: u64,
    /// `st_ino`.
    pub ino: u64,
}

impl FileId {
    /// The identity in `md`.
    pub fn of(md: &Metadata) -> FileId {
        FileId {
            dev: md.dev(),
            ino: md.ino(),
        }
    }
}

/// A file's bytes `[0, offset)`, read: their fingerprint state, newline count and first
/// [`HEAD_BYTES`].
pub struct Prefixed {
    /// xxh3 state over the prefix.
    pub hasher: Xxh3,
    /// Newlines in the prefix.
    pub lines: u64,
    /// The prefix's first bytes (at most [`HEAD_BYTES`]).
    pub head: Vec<u8>,
}

/// Reads `f`'s bytes `[0, offset)` from its current position (its start); `None` when the
/// file ends before `offset`.
pub fn read_prefix(f: &mut File, offset: u64) -> std::io::Result<Option<Prefixed>> {
    let mut p = Prefixed {
        hasher: Xxh3::new(),
        lines: 0,
        head: Vec::new(),
    };
    let mut left = offset;
    let mut buf = vec![0u8; 1 << 20];
    while left > 0 {
        let want = buf.len().min(usize::try_from(left).unwrap_or(usize::MAX));
        let n = f.read(&mut buf[..want])?;
        if n == 0 {
            return Ok(None);
        }
        let chunk = &buf[..n];
        p.hasher.update(chunk);
        p.lines += chunk.iter().filter(|&&b| b == b'\n').count() as u64;
        let room = HEAD_BYTES - p.head.len();
        p.head.extend_from_slice(&chunk[..room.min(n)]);
        left -= n as u64;
    }
    Ok(Some(p))
}

/// What [`find`] looks for: a file whose bytes `[0, offset)` have the fingerprint `digest`.
pub struct Wanted<'a> {
    /// The file's identity, when the checkpoint recorded it: that file is tried first, and
    /// is the only one tried when `offset` is 0 (every file has an empty prefix).
    pub id: Option<FileId>,
    /// Bytes of the prefix.
    pub offset: u64,
    /// xxh3-64 of the prefix.
    pub digest: u64,
    /// The prefix's first bytes, when known: a cheap test before the whole prefix is read.
    pub head: &'a [u8],
    /// A file not to take (the truncated file itself).
    pub not: Option<FileId>,
}

/// A file found by [`find`], open, positioned at the end of its prefix.
pub struct Found {
    /// Its path.
    pub path: PathBuf,
    /// The open file.
    pub file: File,
    /// Its identity.
    pub id: FileId,
    /// Its prefix, read.
    pub prefix: Prefixed,
}

/// Compressed rotations cannot hold the prefix as bytes: not read.
const COMPRESSED: &[&str] = &[".gz", ".bz2", ".xz", ".zst", ".lz4", ".z", ".zip"];

/// Searches the directory of `input` for the file `want` describes: the file with `want.id`
/// anywhere in it, else (when `want.offset > 0`) a regular file whose name starts with the
/// input's name (`app.log.1`, `app.log-20260101`), newest first. A candidate is taken only
/// when its prefix has the fingerprint. I/O errors on a candidate skip it.
pub fn find(input: &Path, want: &Wanted) -> Option<Found> {
    let dir = input.parent()?;
    let name = input.file_name()?.to_string_lossy().into_owned();
    let mut candidates: Vec<(bool, SystemTime, PathBuf)> = Vec::new();
    for e in std::fs::read_dir(dir).ok()?.flatten() {
        let fname = e.file_name().to_string_lossy().into_owned();
        if fname == name {
            continue;
        }
        let Ok(md) = e.metadata() else { continue };
        if !md.is_file() || md.len() < want.offset {
            continue;
        }
        let id = FileId::of(&md);
        let by_id = want.id == Some(id);
        let lower = fname.to_ascii_lowercase();
        let by_name = want.offset > 0
            && fname.starts_with(&name)
            && want.not != Some(id)
            && !COMPRESSED.iter().any(|c| lower.ends_with(c));
        if by_id || by_name {
            let mtime = md.modified().unwrap_or(SystemTime::UNIX_EPOCH);
            candidates.push((by_id, mtime, e.path()));
        }
    }
    // The recorded identity first, then the newest.
    candidates.sort_by(|a, b| b.0.cmp(&a.0).then(b.1.cmp(&a.1)));
    candidates.into_iter().find_map(|(_, _, path)| {
        let mut file = File::open(&path).ok()?;
        let md = file.metadata().ok()?;
        let id = FileId::of(&md);
        if want.not == Some(id) && want.id != Some(id) {
            return None;
        }
        let head = &want.head[..want.head.len().min(usize::try_from(want.offset).ok()?)];
        if !head.is_empty() {
            let mut got = vec![0u8; head.len()];
            std::os::unix::fs::FileExt::read_exact_at(&file, &mut got, 0).ok()?;
            if got != head {
                return None;
            }
        }
        let prefix = read_prefix(&mut file, want.offset).ok()??;
        (prefix.hasher.digest() == want.digest).then_some(Found {
            path,
            file,
            id,
            prefix,
        })
    })
}

/// How long ago `md`'s file last changed (written, or renamed: a rename sets its ctime);
/// zero for a change in the future.
pub fn unchanged_for(md: &Metadata) -> Duration {
    let at = |s: i64, ns: i64| {
        SystemTime::UNIX_EPOCH
            + Duration::new(
                u64::try_from(s).unwrap_or(0),
                u32::try_from(ns).unwrap_or(0),
            )
    };
    let last = at(md.mtime(), md.mtime_nsec()).max(at(md.ctime(), md.ctime_nsec()));
    SystemTime::now()
        .duration_since(last)
        .unwrap_or(Duration::ZERO)
}

/// Parses a fingerprint as [`super::hex`] writes it.
pub fn parse_hex(h: &str) -> Option<u64> {
    u64::from_str_radix(h, 16).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn digest(b: &[u8]) -> u64 {
        xxhash_rust::xxh3::xxh3_64(b)
    }

    #[test]
    fn the_renamed_file_is_found_by_inode_and_a_copy_by_its_prefix() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("app.log");
        std::fs::write(&p, b"one\ntwo\n").unwrap();
        let id = FileId::of(&std::fs::metadata(&p).unwrap());
        std::fs::rename(&p, d.path().join("renamed-elsewhere")).unwrap();
        std::fs::write(&p, b"new\n").unwrap();
        std::fs::write(d.path().join("app.log.2"), b"other\n").unwrap();
        let want = Wanted {
            id: Some(id),
            offset: 4,
            digest: digest(b"one\n"),
            head: b"",
            not: None,
        };
        let f = find(&p, &want).unwrap();
        assert_eq!(f.path, d.path().join("renamed-elsewhere"));
        assert_eq!(f.prefix.lines, 1);
        // Without an identity only names that start with the input's are tried.
        let want = Wanted { id: None, ..want };
        assert!(find(&p, &want).is_none());
        std::fs::copy(
            d.path().join("renamed-elsewhere"),
            d.path().join("app.log.1"),
        )
        .unwrap();
        assert_eq!(find(&p, &want).unwrap().path, d.path().join("app.log.1"));
        // Nothing read: only the recorded identity can say which file it was.
        let want = Wanted {
            offset: 0,
            digest: digest(b""),
            ..want
        };
        assert!(find(&p, &want).is_none());
    }
}
