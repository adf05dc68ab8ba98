//! The storage seam: every file operation of the log goes through [`Storage`] and
//! [`StorageFile`], so tests can swap the real filesystem ([`FsStorage`]) for a simulated disk
//! ([`SimStorage`]) that models power loss.
//!
//! The contract below is what the engine relies on; `docs/design.md` ("Assumptions about the
//! disk") states the same for the real disk.

use bytes::Bytes;
use std::fmt::Debug;
use std::io;
use std::sync::Arc;

mod fs;
pub(crate) mod reserve;
mod sim;

pub use fs::{check_modes, FsStorage, PRIVATE_DIR_MODE, PRIVATE_FILE_MODE};
pub use sim::{CrashOptions, FaultOp, SimStats, SimStorage};

/// The block size of [`StorageFile::write_durable`]'s offsets and lengths: the largest
/// logical block size of common disks, so `O_DIRECT` accepts them.
pub const DIRECT_BLOCK: usize = 4096;

/// A flat directory of named files: the log directory.
///
/// Directory changes (create, rename, remove) are durable only after [`Storage::sync_dir`]
/// returns; file contents only after [`StorageFile::sync_data`]. Implementations must be safe
/// to call from several threads.
pub trait Storage: Send + Sync + Debug {
    /// Names of the files in the directory, in no particular order.
    fn list(&self) -> io::Result<Vec<String>>;
    /// Opens an existing file for reading and writing.
    fn open(&self, name: &str) -> io::Result<Arc<dyn StorageFile>>;
    /// Creates a file, or truncates it to zero length if it exists, and opens it.
    fn create(&self, name: &str) -> io::Result<Arc<dyn StorageFile>>;
    /// Atomically renames `from` to `to`, replacing `to` if it exists.
    fn rename(&self, from: &str, to: &str) -> io::Result<()>;
    /// Removes a file. Open handles stay usable.
    fn remove(&self, name: &str) -> io::Result<()>;
    /// Makes all earlier directory changes durable.
    fn sync_dir(&self) -> io::Result<()>;
    /// Fails if the directory was removed underneath (syncs of files in a removed directory
    /// succeed but protect nothing). Called after every sync; must be cheap. Default: Ok.
    fn check_alive(&self) -> io::Result<()> {
        Ok(())
    }
    /// Takes the exclusive lock of the directory, held on the file `name` (created if
    /// missing), until the returned guard is dropped; a second attempt, from any handle or
    /// process, fails with [`io::ErrorKind::WouldBlock`].
    fn lock(&self, name: &str) -> io::Result<Box<dyn Send + Sync + Debug>>;
    /// A human-readable name of the directory, for error messages.
    fn describe(&self) -> String;
}

/// One open file. Offsets are absolute; there is no cursor.
#[allow(clippy::len_without_is_empty)] // a file length is an I/O result, not a collection size
pub trait StorageFile: Send + Sync + Debug {
    /// Current length in bytes.
    fn len(&self) -> io::Result<u64>;
    /// Reads up to `buf.len()` bytes at `offset`; returns how many were read (0 at the end).
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<usize>;
    /// Writes all of `data` at `offset`, extending the file if needed.
    fn write_at(&self, offset: u64, data: &[u8]) -> io::Result<()>;
    /// Makes the file's contents and length durable (`fdatasync`).
    fn sync_data(&self) -> io::Result<()>;
    /// Sets the file length, cutting or zero-extending it. Durable after `sync_data`.
    fn set_len(&self, len: u64) -> io::Result<()>;
    /// Writes all of `data` at `offset` and returns once exactly that range is durable, as
    /// `write_at` followed by a `sync_data` that covers only this range: writes of other
    /// ranges not yet synced stay unsynced. The log calls it with `offset` and `data.len()`
    /// multiples of [`DIRECT_BLOCK`], so a real file can write them with `O_DIRECT |
    /// O_DSYNC` (one device write, no separate flush of the file). Default: `write_at`,
    /// then `sync_data`.
    fn write_durable(&self, offset: u64, data: &[u8]) -> io::Result<()> {
        self.write_at(offset, data)?;
        self.sync_data()
    }
    /// Bytes from the start of the file up to its first hole (a range with no blocks
    /// allocated, as a file extended by `set_len` has), or its length if it has none: what
    /// a write can cover without allocating. The log asks it of a recycled segment, whose
    /// blocks a durable write should not have to allocate. Default: the length, which trusts
    /// every byte to have blocks; a storage that wraps another should forward this call, or
    /// durable writes into a recycled file's holes allocate (correct, but slower).
    fn data_prefix(&self) -> io::Result<u64> {
        self.len()
    }
    /// Reads up to `len` bytes at `offset` into one shared buffer (shorter at the end of the
    /// file). Records handed to sinks are slices of it, so there is one copy per range, none
    /// per record. Files are read, never memory-mapped: through a mapping an I/O error, or a
    /// hole that a full filesystem cannot back, arrives as SIGBUS instead of an error.
    fn read_range(&self, offset: u64, len: usize) -> io::Result<Bytes> {
        let mut buf = Vec::new();
        self.read_range_into(offset, len, &mut buf)?;
        Ok(Bytes::from(buf))
    }

    /// Like [`StorageFile::read_range`], into `buf`, reusing its allocation: a buffer whose
    /// pages are already mapped is filled several times faster than a fresh one.
    fn read_range_into(&self, offset: u64, len: usize, buf: &mut Vec<u8>) -> io::Result<()> {
        // A reused buffer still holds old bytes: overwritten, never zeroed first.
        if buf.len() < len {
            buf.resize(len, 0);
        } else {
            buf.truncate(len);
        }
        let at = read_full(self, offset, buf)?;
        buf.truncate(at);
        Ok(())
    }
}

/// Fills `buf` from `offset` of `file` on, with as many `read_at` calls as it takes; fewer
/// bytes only at the file's end. Returns the bytes read.
pub(crate) fn read_full<F: StorageFile + ?Sized>(
    file: &F,
    offset: u64,
    buf: &mut [u8],
) -> io::Result<usize> {
    let mut at = 0;
    while at < buf.len() {
        match file.read_at(offset + at as u64, &mut buf[at..])? {
            0 => break,
            n => at += n,
        }
    }
    Ok(at)
}

/// Reads a whole small file into memory.
pub(crate) fn read_all(file: &dyn StorageFile) -> io::Result<Vec<u8>> {
    let len = file.len()?;
    let len = usize::try_from(len).map_err(|_| io::Error::other("file too large"))?;
    let mut buf = vec![0u8; len];
    let mut at = 0;
    while at < len {
        let n = file.read_at(at as u64, &mut buf[at..])?;
        if n == 0 {
            buf.truncate(at);
            break;
        }
        at += n;
    }
    Ok(buf)
}

/// Replaces `name` atomically with `data`: write the temporary file `tmp`, sync it, rename
/// it over `name`, sync the directory. Two data/dir syncs; a crash leaves either the old or
/// the new file (and perhaps `tmp`, for its owner to recognise).
pub(crate) fn replace_file(
    storage: &dyn Storage,
    name: &str,
    tmp: &str,
    data: &[u8],
) -> io::Result<()> {
    let f = storage.create(tmp)?;
    f.write_at(0, data)?;
    f.sync_data()?;
    drop(f);
    storage.rename(tmp, name)?;
    storage.sync_dir()
}
