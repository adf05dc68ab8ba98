//! The real filesystem behind the [`Storage`] seam.

use super::{Storage, StorageFile, DIRECT_BLOCK};
use parking_lot::Mutex;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// The default mode of a directory that a log or a directory sink creates: the owner's only.
pub const PRIVATE_DIR_MODE: u32 = 0o700;
/// The default mode of a file that a log or a directory sink creates: the owner's only.
pub const PRIVATE_FILE_MODE: u32 = 0o600;

/// Checks a directory and a file mode: no bits above `0o777`, and the owner keeps what the
/// log needs (`0o700` on the directory, `0o600` on files). The error says which is wrong.
pub fn check_modes(dir_mode: u32, file_mode: u32) -> Result<(), String> {
    if dir_mode & !0o777 != 0 || dir_mode & 0o700 != 0o700 {
        return Err(format!(
            "dir_mode {dir_mode:#o} is not allowed: it must include 0o700 (the owner's read, \
             write and search) and have no bits above 0o777"
        ));
    }
    if file_mode & !0o777 != 0 || file_mode & 0o600 != 0o600 {
        return Err(format!(
            "file_mode {file_mode:#o} is not allowed: it must include 0o600 (the owner's read \
             and write) and have no bits above 0o777"
        ));
    }
    Ok(())
}

/// A log directory on the real filesystem.
#[derive(Debug, Clone)]
pub struct FsStorage {
    dir: PathBuf,
    /// The directory itself, held open for `fsync` and to notice its removal.
    handle: Arc<File>,
    /// Mode bits of every file [`Storage::create`] and [`Storage::lock`] make.
    file_mode: u32,
}

impl FsStorage {
    /// Uses `dir` as the log directory, creating it (and its parents) if missing, private to
    /// the owner: [`PRIVATE_DIR_MODE`] and [`PRIVATE_FILE_MODE`]; see [`FsStorage::with_modes`].
    pub fn new(dir: impl AsRef<Path>) -> io::Result<Self> {
        Self::with_modes(dir, PRIVATE_DIR_MODE, PRIVATE_FILE_MODE)
    }

    /// Uses `dir` as the log directory. When it is missing it is created with exactly
    /// `dir_mode` (the umask does not apply; missing parents get `0o777` less the umask).
    /// An existing directory keeps its mode; when it grants more than `dir_mode` a warning
    /// is logged. Files created later get exactly `file_mode`.
    ///
    /// # Errors
    /// `InvalidInput` when the modes fail [`check_modes`]; the I/O error of creating or
    /// opening the directory.
    pub fn with_modes(dir: impl AsRef<Path>, dir_mode: u32, file_mode: u32) -> io::Result<Self> {
        use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
        check_modes(dir_mode, file_mode)
            .map_err(|m| io::Error::new(io::ErrorKind::InvalidInput, m))?;
        let dir = dir.as_ref().to_path_buf();
        if let Some(parent) = dir.parent().filter(|p| !p.as_os_str().is_empty()) {
            std::fs::create_dir_all(parent)?;
        }
        match std::fs::DirBuilder::new().mode(dir_mode).create(&dir) {
            Ok(()) => std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(dir_mode))?,
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists && dir.is_dir() => {
                let mode = std::fs::metadata(&dir)?.permissions().mode() & 0o7777;
                if mode & !dir_mode != 0 {
                    tracing::warn!(
                        dir = %dir.display(),
                        mode = format_args!("{mode:#o}"),
                        wanted = format_args!("{dir_mode:#o}"),
                        "the directory exists and grants more than wanted; its mode is left \
                         as it is (chmod it to make it private)"
                    );
                }
            }
            Err(e) => return Err(e),
        }
        let handle = Arc::new(File::open(&dir)?);
        Ok(FsStorage {
            dir,
            handle,
            file_mode,
        })
    }

    /// Uses the existing directory `dir`, creating nothing: for readers of a directory that
    /// must not appear because it was named (`walsink dlq list` of a mistyped path).
    ///
    /// # Errors
    /// `NotFound` when `dir` does not exist; the I/O error of opening it.
    pub fn existing(dir: impl AsRef<Path>) -> io::Result<Self> {
        let dir = dir.as_ref().to_path_buf();
        let handle = Arc::new(File::open(&dir)?);
        if !handle.metadata()?.is_dir() {
            return Err(io::Error::new(
                io::ErrorKind::NotADirectory,
                format!("{} is not a directory", dir.display()),
            ));
        }
        Ok(FsStorage {
            dir,
            handle,
            file_mode: PRIVATE_FILE_MODE,
        })
    }

    /// Gives `f` exactly the file mode (the umask may have taken bits away).
    fn set_mode(&self, f: &File) -> io::Result<()> {
        use std::os::unix::fs::PermissionsExt;
        if f.metadata()?.permissions().mode() & 0o7777 != self.file_mode {
            f.set_permissions(std::fs::Permissions::from_mode(self.file_mode))?;
        }
        Ok(())
    }

    /// The directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }
}

/// Closes removed files on a thread of its own: see [`FsStorage::remove`].
mod release {
    use std::fs::File;
    use std::sync::mpsc::{sync_channel, SyncSender};
    use std::sync::OnceLock;

    /// Files waiting to be closed at most: each holds a descriptor, so a burst of removals
    /// faster than the thread closes them must not pile up without bound.
    const WAITING: usize = 64;

    static QUEUE: OnceLock<Option<SyncSender<File>>> = OnceLock::new();

    /// Hands `file` to the release thread, started on first use. When the thread could not
    /// start, or already has [`WAITING`] files to close, the file is closed here.
    pub(super) fn close_later(file: File) {
        let queue = QUEUE.get_or_init(|| {
            let (tx, rx) = sync_channel::<File>(WAITING);
            std::thread::Builder::new()
                .name("walsink-release".into())
                .spawn(move || rx.into_iter().for_each(drop))
                .ok()
                .map(|_| tx)
        });
        if let Some(tx) = queue {
            // A full queue or a thread that is gone hands the file back; it closes here.
            let _ = tx.try_send(file);
        }
    }
}

/// One open file, and a second descriptor of it for [`StorageFile::write_durable`].
#[derive(Debug)]
struct FsFile {
    file: File,
    /// The same file opened with `O_DIRECT | O_DSYNC`, on the first durable write; `None`
    /// once the filesystem refused it (tmpfs, some network filesystems): the file then falls
    /// back to `pwrite` + `fdatasync` for good.
    direct: Mutex<Direct>,
}

#[derive(Debug, Default)]
enum Direct {
    /// Not tried yet.
    #[default]
    Untried,
    /// Open, with a buffer whose aligned part holds what a write sends.
    Open(File, Vec<u8>),
    /// Refused: write and sync through the page cache.
    Refused,
}

impl FsFile {
    fn new(file: File) -> FsFile {
        FsFile {
            file,
            direct: Mutex::new(Direct::Untried),
        }
    }

    /// Writes `data` at `offset` through the direct descriptor. `Ok(false)` when the
    /// filesystem refuses direct writes (nothing of `data` was written then, or it will be
    /// written again by the caller's fallback).
    fn write_direct(&self, offset: u64, data: &[u8]) -> io::Result<bool> {
        let mut d = self.direct.lock();
        if matches!(*d, Direct::Untried) {
            *d = open_direct(&self.file).map_or(Direct::Refused, |f| Direct::Open(f, Vec::new()));
        }
        let Direct::Open(f, buf) = &mut *d else {
            return Ok(false);
        };
        // O_DIRECT wants the memory aligned too: use the aligned part of a larger buffer.
        buf.resize(data.len() + DIRECT_BLOCK, 0);
        let at = buf.as_ptr().align_offset(DIRECT_BLOCK);
        let aligned = &mut buf[at..at + data.len()];
        aligned.copy_from_slice(data);
        match f.write_all_at(aligned, offset) {
            Ok(()) => Ok(true),
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
                *d = Direct::Refused;
                Ok(false)
            }
            Err(e) => Err(e),
        }
    }
}

/// Opens `file` again, for writes that bypass the page cache and are durable on return.
fn open_direct(file: &File) -> io::Result<File> {
    use std::os::fd::AsRawFd;
    use std::os::unix::fs::OpenOptionsExt;
    // The descriptor's own link, not the file's name: it stays right across renames.
    OpenOptions::new()
        .write(true)
        .custom_flags(libc::O_DIRECT | libc::O_DSYNC)
        .open(format!("/proc/self/fd/{}", file.as_raw_fd()))
}

impl StorageFile for FsFile {
    fn len(&self) -> io::Result<u64> {
        Ok(self.file.metadata()?.len())
    }
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<usize> {
        self.file.read_at(buf, offset)
    }
    fn write_at(&self, offset: u64, data: &[u8]) -> io::Result<()> {
        self.file.write_all_at(data, offset)
    }
    fn sync_data(&self) -> io::Result<()> {
        self.file.sync_data()
    }
    fn set_len(&self, len: u64) -> io::Result<()> {
        self.file.set_len(len)
    }
    /// `lseek(SEEK_HOLE)`; a filesystem without hole reporting answers the length.
    fn data_prefix(&self) -> io::Result<u64> {
        use std::os::fd::AsRawFd;
        // SAFETY: lseek on a descriptor this file owns; the log never reads or writes
        // through the descriptor's offset (only pread and pwrite), so moving it is harmless.
        let at = unsafe { libc::lseek(self.file.as_raw_fd(), 0, libc::SEEK_HOLE) };
        if at < 0 {
            let e = io::Error::last_os_error();
            // ENXIO: the offset (0) is at the end, an empty file.
            return if e.raw_os_error() == Some(libc::ENXIO) {
                Ok(0)
            } else {
                Err(e)
            };
        }
        Ok(at as u64)
    }
    /// One `O_DIRECT | O_DSYNC` write where the filesystem takes it (the device writes the
    /// blocks through its cache; no `fdatasync`), else `pwrite` + `fdatasync`.
    fn write_durable(&self, offset: u64, data: &[u8]) -> io::Result<()> {
        let aligned =
            offset.is_multiple_of(DIRECT_BLOCK as u64) && data.len().is_multiple_of(DIRECT_BLOCK);
        if aligned && self.write_direct(offset, data)? {
            return Ok(());
        }
        self.write_at(offset, data)?;
        self.sync_data()
    }
}

impl Storage for FsStorage {
    fn list(&self) -> io::Result<Vec<String>> {
        let mut names = Vec::new();
        for entry in std::fs::read_dir(&self.dir)? {
            let entry = entry?;
            if let Ok(name) = entry.file_name().into_string() {
                names.push(name);
            } else {
                names.push(entry.file_name().to_string_lossy().into_owned());
            }
        }
        Ok(names)
    }

    fn open(&self, name: &str) -> io::Result<Arc<dyn StorageFile>> {
        let f = OpenOptions::new()
            .read(true)
            .write(true)
            .open(self.dir.join(name))?;
        Ok(Arc::new(FsFile::new(f)))
    }

    fn create(&self, name: &str) -> io::Result<Arc<dyn StorageFile>> {
        use std::os::unix::fs::OpenOptionsExt;
        let f = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .mode(self.file_mode)
            .open(self.dir.join(name))?;
        self.set_mode(&f)?;
        Ok(Arc::new(FsFile::new(f)))
    }

    fn rename(&self, from: &str, to: &str) -> io::Result<()> {
        std::fs::rename(self.dir.join(from), self.dir.join(to))
    }

    fn remove(&self, name: &str) -> io::Result<()> {
        let path = self.dir.join(name);
        // The kernel frees a removed file's cached pages and blocks at its last close. Holding
        // it open across the unlink moves that work (most of the cost of freeing a 64 MiB
        // segment) off the caller, to the release thread.
        let held = File::open(&path).ok();
        std::fs::remove_file(&path)?;
        if let Some(file) = held {
            release::close_later(file);
        }
        Ok(())
    }

    fn sync_dir(&self) -> io::Result<()> {
        self.handle.sync_all()
    }

    fn check_alive(&self) -> io::Result<()> {
        use std::os::unix::fs::MetadataExt;
        if self.handle.metadata()?.nlink() == 0 {
            return Err(io::Error::new(
                io::ErrorKind::NotFound,
                format!("log directory {} was removed", self.dir.display()),
            ));
        }
        Ok(())
    }

    fn lock(&self, name: &str) -> io::Result<Box<dyn Send + Sync + std::fmt::Debug>> {
        use std::os::unix::fs::OpenOptionsExt;
        let f = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(self.file_mode)
            .open(self.dir.join(name))?;
        self.set_mode(&f)?;
        match f.try_lock() {
            Ok(()) => Ok(Box::new(f)),
            Err(std::fs::TryLockError::WouldBlock) => Err(io::Error::new(
                io::ErrorKind::WouldBlock,
                "log directory is locked",
            )),
            Err(std::fs::TryLockError::Error(e)) => Err(e),
        }
    }

    fn describe(&self) -> String {
        self.dir.display().to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn open_fds() -> usize {
        std::fs::read_dir("/proc/self/fd").map_or(0, |d| d.count())
    }

    #[test]
    fn a_removed_file_is_gone_at_once_and_closed_later_without_piling_up_descriptors() {
        let dir = tempfile::tempdir().unwrap();
        let st = FsStorage::new(dir.path()).unwrap();
        let before = open_fds();
        for i in 0..500 {
            let name = format!("f{i}");
            st.create(&name).unwrap().write_at(0, &[7u8; 4096]).unwrap();
            st.remove(&name).unwrap();
            assert!(!dir.path().join(&name).exists(), "{name} still listed");
        }
        assert!(st.list().unwrap().is_empty());
        // At most the release thread's queue (and the odd descriptor of another test).
        assert!(
            open_fds() <= before + 64 + 16,
            "{} descriptors open, {before} before",
            open_fds()
        );
        assert_eq!(
            st.remove("f0").unwrap_err().kind(),
            io::ErrorKind::NotFound,
            "removing twice reports the file missing"
        );
    }

    /// Whether some descriptor of this process has `path` open with `O_DIRECT | O_DSYNC`.
    fn direct_descriptor_of(path: &Path) -> bool {
        let want = std::fs::canonicalize(path).unwrap();
        std::fs::read_dir("/proc/self/fd").unwrap().any(|e| {
            let fd = e.unwrap().file_name();
            let fd = fd.to_string_lossy();
            let target = std::fs::read_link(format!("/proc/self/fd/{fd}")).ok();
            let info = std::fs::read_to_string(format!("/proc/self/fdinfo/{fd}")).ok();
            let flags = info.as_deref().and_then(|i| {
                let l = i.lines().find(|l| l.starts_with("flags:"))?;
                i32::from_str_radix(l.split_whitespace().nth(1)?, 8).ok()
            });
            let both = libc::O_DIRECT | libc::O_DSYNC;
            target.as_deref() == Some(want.as_path()) && flags.is_some_and(|f| f & both == both)
        })
    }

    /// Durable writes land where asked, aligned or not; where the filesystem takes
    /// `O_DIRECT` (tried here by opening the file so), they go through a direct descriptor,
    /// and the page cache reads what they wrote; across a rename the descriptor still
    /// writes the same file.
    fn durable_writes_in(dir: &Path) {
        let st = FsStorage::new(dir).unwrap();
        let f = st.create("seg").unwrap();
        f.set_len(64 << 10).unwrap();
        f.write_at(0, &[1u8; 100]).unwrap();
        let block: Vec<u8> = (0..DIRECT_BLOCK * 2).map(|i| (i % 251) as u8).collect();
        f.write_durable(DIRECT_BLOCK as u64, &block).unwrap();
        f.write_durable(100, b"unaligned").unwrap();
        st.rename("seg", "seg2").unwrap();
        f.write_durable(3 * DIRECT_BLOCK as u64, &block[..DIRECT_BLOCK])
            .unwrap();
        let mut got = vec![0u8; 4 * DIRECT_BLOCK];
        assert_eq!(f.read_at(0, &mut got).unwrap(), got.len());
        assert_eq!(&got[..100], &[1u8; 100]);
        assert_eq!(&got[100..109], b"unaligned");
        assert_eq!(&got[DIRECT_BLOCK..3 * DIRECT_BLOCK], &block[..]);
        assert_eq!(&got[3 * DIRECT_BLOCK..], &block[..DIRECT_BLOCK]);
        let on_disk = std::fs::read(dir.join("seg2")).unwrap();
        assert_eq!(&on_disk[..4 * DIRECT_BLOCK], &got[..]);
        let takes_direct = {
            use std::os::unix::fs::OpenOptionsExt;
            OpenOptions::new()
                .write(true)
                .custom_flags(libc::O_DIRECT | libc::O_DSYNC)
                .open(dir.join("seg2"))
                .is_ok()
        };
        assert_eq!(
            direct_descriptor_of(&dir.join("seg2")),
            takes_direct,
            "direct descriptor present exactly when the filesystem takes O_DIRECT ({})",
            dir.display()
        );
    }

    #[test]
    fn durable_writes_on_disk_and_on_tmpfs() {
        let dir = tempfile::tempdir().unwrap();
        durable_writes_in(dir.path());
        let shm = Path::new("/dev/shm");
        if shm.is_dir() {
            let dir = tempfile::tempdir_in(shm).unwrap();
            durable_writes_in(dir.path());
        }
    }

    /// The data prefix ends at the first hole: the end of what was written when the file was
    /// extended by `set_len` (ext4 and tmpfs, where the tests run, report holes).
    #[test]
    fn data_prefix_ends_at_the_first_hole() {
        for dir in [std::env::temp_dir(), "/dev/shm".into()] {
            if !dir.is_dir() {
                continue;
            }
            let dir = tempfile::tempdir_in(dir).unwrap();
            let s = FsStorage::new(dir.path()).unwrap();
            let f = s.create("f").unwrap();
            assert_eq!(f.data_prefix().unwrap(), 0, "{dir:?}: empty file");
            f.write_at(0, &[1; 8192]).unwrap();
            assert_eq!(f.data_prefix().unwrap(), 8192, "{dir:?}: no hole");
            f.set_len(1 << 20).unwrap();
            assert_eq!(f.data_prefix().unwrap(), 8192, "{dir:?}: extended");
            f.write_at((1 << 20) - 10, &[2; 10]).unwrap();
            assert_eq!(f.data_prefix().unwrap(), 8192, "{dir:?}: hole inside");
            f.write_at(8192, &vec![3; (1 << 20) - 8192]).unwrap();
            assert_eq!(f.data_prefix().unwrap(), 1 << 20, "{dir:?}: filled");
        }
    }
}
