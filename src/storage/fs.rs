//! The real filesystem behind the [`Storage`] seam.

use super::{Storage, StorageFile};
use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// A log directory on the real filesystem.
#[derive(Debug, Clone)]
pub struct FsStorage {
    dir: PathBuf,
    /// The directory itself, held open for `fsync` and to notice its removal.
    handle: Arc<File>,
}

impl FsStorage {
    /// Uses `dir` as the log directory, creating it (and its parents) if missing.
    pub fn new(dir: impl AsRef<Path>) -> io::Result<Self> {
        let dir = dir.as_ref().to_path_buf();
        std::fs::create_dir_all(&dir)?;
        let handle = Arc::new(File::open(&dir)?);
        Ok(FsStorage { dir, handle })
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

#[derive(Debug)]
struct FsFile(File);

impl StorageFile for FsFile {
    fn len(&self) -> io::Result<u64> {
        Ok(self.0.metadata()?.len())
    }
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<usize> {
        self.0.read_at(buf, offset)
    }
    fn write_at(&self, offset: u64, data: &[u8]) -> io::Result<()> {
        self.0.write_all_at(data, offset)
    }
    fn sync_data(&self) -> io::Result<()> {
        self.0.sync_data()
    }
    fn set_len(&self, len: u64) -> io::Result<()> {
        self.0.set_len(len)
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
        Ok(Arc::new(FsFile(f)))
    }

    fn create(&self, name: &str) -> io::Result<Arc<dyn StorageFile>> {
        let f = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(self.dir.join(name))?;
        Ok(Arc::new(FsFile(f)))
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
        let f = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(self.dir.join(name))?;
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
}
