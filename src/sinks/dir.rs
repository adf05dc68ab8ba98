//! The directory sink: one file per epoch, where the rename is the commit marker.
//!
//! Its file I/O goes through the [`Storage`] seam like the log's, so the crash simulation
//! can run it on a simulated disk of its own and lose, after a power loss, whatever it did
//! not make durable.

use crate::storage::{self, FsStorage, Storage, StorageFile, PRIVATE_DIR_MODE, PRIVATE_FILE_MODE};
use crate::{decide_claim, Claim, Epoch, EpochKey, Owner, Sink, SinkError};
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;

const TMP_PREFIX: &str = ".tmp-";
const META_EXT: &str = "meta";
const OWNER_EXT: &str = "owner";
/// How long a claim or a delivery waits for another process's step on the same shard's owner
/// lock before it gives up (retryably).
const OWNER_LOCK_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

/// Writes each epoch as one file in a directory: to a temporary file, synced, renamed to its
/// final name, and the directory synced. The final name exists if and only if the whole epoch
/// is in the target, so the file itself is the commit marker and delivery is exactly-once.
///
/// Names sort by checkpoint id: `{checkpoint:020}-{sink_id}-{subtask:05}.txt`. The format is
/// chosen per epoch: when every record is UTF-8 without a newline the file is `.txt` with one
/// record per line; otherwise the whole epoch goes to `.bin` with each record prefixed by its
/// length (u32, little-endian). [`DirSink::read_records`] reads both.
///
/// With [`DirSink::keep_metadata`], each epoch's checkpoint metadata is also written to
/// `{stem}.meta`, made durable before the epoch's file is renamed into place, so whenever the
/// epoch's file exists its metadata does too ([`DirSink::committed`] reads them back). An
/// embedder resumes from the target's newest metadata when the target is ahead of its log.
#[derive(Debug, Clone)]
pub struct DirSink {
    storage: Arc<dyn Storage>,
    /// The directory, for messages and [`DirSink::dir`].
    dir: PathBuf,
    keep_metadata: bool,
    /// Makes each temporary file's name unique: a rename can then only move the file this
    /// attempt wrote and synced, never a leftover of a failed one (whose contents were never
    /// synced) that happens to carry the same name.
    attempt: u64,
    /// The shard this sink claimed ([`DirSink::claim`]): every delivery checks it under the
    /// shard's owner lock.
    claim: Option<Claim>,
}

/// One epoch found in a directory sink's target by [`DirSink::committed`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CommittedEpoch {
    /// The checkpoint id in the file name.
    pub checkpoint: u64,
    /// The epoch's file name.
    pub file: String,
    /// The epoch's checkpoint metadata, when it was kept (`None` when the sink did not keep
    /// metadata or the `.meta` file is missing).
    pub metadata: Option<Vec<u8>>,
}

fn with_path(e: io::Error, what: &str, path: &Path) -> SinkError {
    let message = format!("{what} {}: {e}", path.display());
    // Errors an operator has to fix before a retry can succeed.
    let permanent = matches!(
        e.kind(),
        io::ErrorKind::PermissionDenied
            | io::ErrorKind::ReadOnlyFilesystem
            | io::ErrorKind::NotADirectory
            | io::ErrorKind::IsADirectory
            | io::ErrorKind::NotFound
    );
    let err = if permanent {
        SinkError::permanent(message)
    } else {
        SinkError::retryable(message)
    };
    err.with_source(e)
}

/// Sequential writes into a [`StorageFile`] (which writes at offsets), for a `BufWriter`.
struct Appender<'a> {
    file: &'a dyn StorageFile,
    at: u64,
}

impl Write for Appender<'_> {
    fn write(&mut self, data: &[u8]) -> io::Result<usize> {
        self.file.write_at(self.at, data)?;
        self.at += data.len() as u64;
        Ok(data.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl DirSink {
    /// A sink writing into `dir`, created if missing. Temporary files left by a crash are
    /// removed. The error names `dir`. Private to the owner: a missing `dir` is created
    /// `0o700` and every file `0o600`; see [`DirSink::with_modes`].
    pub fn new(dir: impl AsRef<Path>) -> io::Result<Self> {
        Self::with_modes(dir, PRIVATE_DIR_MODE, PRIVATE_FILE_MODE)
    }

    /// [`DirSink::new`] with other modes: a missing `dir` is created with exactly `dir_mode`
    /// and every file the sink writes gets exactly `file_mode` (the umask does not apply). An
    /// existing directory keeps its mode (a warning is logged when it grants more). The modes
    /// must pass [`check_modes`](crate::storage::check_modes), else `InvalidInput`.
    pub fn with_modes(dir: impl AsRef<Path>, dir_mode: u32, file_mode: u32) -> io::Result<Self> {
        let dir = dir.as_ref();
        let named = |e: io::Error| {
            io::Error::new(
                e.kind(),
                format!("cannot use {} as a sink directory: {e}", dir.display()),
            )
        };
        if dir.exists() && !dir.is_dir() {
            return Err(named(io::Error::new(
                io::ErrorKind::NotADirectory,
                "it exists and is not a directory",
            )));
        }
        let storage = FsStorage::with_modes(dir, dir_mode, file_mode).map_err(named)?;
        Self::with_storage(Arc::new(storage)).map_err(named)
    }

    /// A sink writing into the directory behind any [`Storage`] (the crash simulation gives it
    /// a simulated disk). Temporary files left by a crash are removed.
    pub fn with_storage(storage: Arc<dyn Storage>) -> io::Result<Self> {
        let mut removed = false;
        for name in storage.list()? {
            if name.starts_with(TMP_PREFIX) {
                storage.remove(&name)?;
                removed = true;
            }
        }
        if removed {
            storage.sync_dir()?;
        }
        Ok(DirSink {
            dir: PathBuf::from(storage.describe()),
            storage,
            keep_metadata: false,
            attempt: fastrand::u64(..),
            claim: None,
        })
    }

    /// Also keep each epoch's checkpoint metadata in `{stem}.meta` beside its file. Default
    /// off. Costs one more file sync and one more directory sync per epoch.
    pub fn keep_metadata(mut self, on: bool) -> Self {
        self.keep_metadata = on;
        self
    }

    /// The target directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Claims the shard `(sink_id, subtask)` in the directory for `owner` (see
    /// [`Owner`]): under the shard's lock file `{sink_id}-{subtask:05}.owner.lock`, reads
    /// the owner file `{sink_id}-{subtask:05}.owner` (`{log id} {generation}`), applies
    /// [`decide_claim`] and replaces the file durably with the new generation. From then on
    /// every delivery takes the same lock and writes nothing unless the owner file still
    /// holds this claim; otherwise it fails with [`SinkError::fenced`]. A sink that never
    /// claims does not look at owners (as before owners existed).
    ///
    /// The lock is `flock`, so the fence holds between processes on one machine's file
    /// system (not across machines sharing a network file system).
    ///
    /// # Errors
    /// [`SinkError::fenced`] when another log owns the shard and `owner` does not take it
    /// over; a retryable error when the lock stays busy for 10 s; the I/O error, naming the
    /// file, otherwise.
    pub fn claim(
        &mut self,
        sink_id: &str,
        subtask: u32,
        owner: &Owner,
    ) -> Result<Claim, SinkError> {
        let stem = format!("{sink_id}-{subtask:05}");
        let _guard = self.owner_lock(&stem)?;
        let found = self.read_owner(&stem)?;
        let claim = decide_claim(
            sink_id,
            subtask,
            found.as_ref().map(|(o, g)| (o.as_str(), *g)),
            owner,
        )?;
        let line = format!("{} {}\n", claim.owner, claim.generation);
        self.write_file(&format!("{stem}.{OWNER_EXT}"), |w| {
            w.write_all(line.as_bytes())
        })?;
        self.sync_dir()?;
        self.claim = Some(claim.clone());
        Ok(claim)
    }

    /// The owner record of `(sink_id, subtask)` in `dir`: `(log id, generation)`, `None` when
    /// no log claimed the shard.
    ///
    /// # Errors
    /// The I/O error; `InvalidData` for an owner file that does not parse.
    pub fn owner_of(
        dir: impl AsRef<Path>,
        sink_id: &str,
        subtask: u32,
    ) -> io::Result<Option<(String, u64)>> {
        let dir = dir.as_ref();
        if !dir.exists() {
            return Ok(None);
        }
        let storage = FsStorage::new(dir)?;
        read_owner_in(&storage, &format!("{sink_id}-{subtask:05}"))
    }

    /// The shard's owner lock, waited for up to [`OWNER_LOCK_WAIT`].
    fn owner_lock(&self, stem: &str) -> Result<Box<dyn Send + Sync + std::fmt::Debug>, SinkError> {
        let name = format!("{stem}.{OWNER_EXT}.lock");
        let start = std::time::Instant::now();
        loop {
            match self.storage.lock(&name) {
                Ok(g) => return Ok(g),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    if start.elapsed() >= OWNER_LOCK_WAIT {
                        return Err(SinkError::retryable(format!(
                            "the owner lock {} stayed busy for {OWNER_LOCK_WAIT:?} (another process is claiming or delivering this shard)",
                            self.path(&name).display()
                        )));
                    }
                    std::thread::sleep(std::time::Duration::from_millis(2));
                }
                Err(e) => return Err(with_path(e, "lock", &self.path(&name))),
            }
        }
    }

    fn read_owner(&self, stem: &str) -> Result<Option<(String, u64)>, SinkError> {
        read_owner_in(&*self.storage, stem).map_err(|e| {
            with_path(
                e,
                "read the owner file",
                &self.path(&format!("{stem}.{OWNER_EXT}")),
            )
        })
    }

    fn stem(key: &EpochKey) -> String {
        format!("{:020}-{}-{:05}", key.checkpoint, key.sink_id, key.subtask)
    }

    /// Splits an epoch file name into checkpoint, sink id, subtask and extension.
    fn parse_name(name: &str) -> Option<(u64, &str, u32, &str)> {
        let (stem, ext) = name.rsplit_once('.')?;
        let checkpoint = stem.get(..20)?.parse().ok()?;
        let rest = stem.get(20..)?.strip_prefix('-')?;
        let (sink_id, subtask) = rest.rsplit_once('-')?;
        if subtask.len() != 5 {
            return None;
        }
        Some((checkpoint, sink_id, subtask.parse().ok()?, ext))
    }

    /// The epochs of `(sink_id, subtask)` that the target in `dir` holds, by checkpoint id,
    /// with their kept metadata. A missing directory holds none.
    pub fn committed(
        dir: impl AsRef<Path>,
        sink_id: &str,
        subtask: u32,
    ) -> io::Result<Vec<CommittedEpoch>> {
        let dir = dir.as_ref();
        if !dir.exists() {
            return Ok(Vec::new());
        }
        Self::committed_in(&FsStorage::new(dir)?, sink_id, subtask)
    }

    /// [`DirSink::committed`] for a target behind any [`Storage`].
    pub fn committed_in(
        storage: &dyn Storage,
        sink_id: &str,
        subtask: u32,
    ) -> io::Result<Vec<CommittedEpoch>> {
        let mut out = Vec::new();
        for name in storage.list()? {
            let Some((checkpoint, id, sub, ext)) = Self::parse_name(&name) else {
                continue;
            };
            if id != sink_id || sub != subtask || !matches!(ext, "txt" | "bin") {
                continue;
            }
            let meta = format!("{}.{META_EXT}", &name[..name.len() - ext.len() - 1]);
            let metadata = match storage.open(&meta) {
                Ok(f) => Some(storage::read_all(&*f)?),
                Err(e) if e.kind() == io::ErrorKind::NotFound => None,
                Err(e) => return Err(e),
            };
            out.push(CommittedEpoch {
                checkpoint,
                file: name,
                metadata,
            });
        }
        out.sort_by_key(|c| c.checkpoint);
        Ok(out)
    }

    /// Reads back every record of every epoch file in `dir`, in file-name order.
    pub fn read_records(dir: impl AsRef<Path>) -> io::Result<Vec<Vec<u8>>> {
        let dir = dir.as_ref();
        if !dir.is_dir() {
            return Err(io::Error::new(
                io::ErrorKind::NotFound,
                format!("{} is not a directory", dir.display()),
            ));
        }
        Ok(Self::read_epochs_in(&FsStorage::new(dir)?)?
            .into_iter()
            .flat_map(|(_, records)| records)
            .collect())
    }

    /// Reads back every epoch file of a target behind any [`Storage`], in file-name order:
    /// the file name and the records it holds.
    pub fn read_epochs_in(storage: &dyn Storage) -> io::Result<Vec<(String, Vec<Vec<u8>>)>> {
        let mut names: Vec<String> = storage
            .list()?
            .into_iter()
            .filter(|n| !n.starts_with(TMP_PREFIX))
            .collect();
        names.sort();
        let mut out = Vec::new();
        for name in names {
            let ext = name.rsplit_once('.').map(|(_, e)| e);
            if !matches!(ext, Some("txt" | "bin")) {
                continue;
            }
            let data = storage::read_all(&*storage.open(&name)?)?;
            let mut records = Vec::new();
            if ext == Some("txt") {
                for line in data.split(|&b| b == b'\n') {
                    records.push(line.to_vec());
                }
                // The file ends with a newline: the last split is empty.
                records.pop();
            } else {
                let mut at = 0;
                while at + 4 <= data.len() {
                    let len =
                        u32::from_le_bytes(data[at..at + 4].try_into().expect("4 bytes")) as usize;
                    let end = (at + 4).saturating_add(len).min(data.len());
                    records.push(data[at + 4..end].to_vec());
                    at = end;
                }
            }
            out.push((name, records));
        }
        Ok(out)
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    /// Makes the directory's entries (names created or renamed in it) durable.
    fn sync_dir(&self) -> Result<(), SinkError> {
        self.storage
            .sync_dir()
            .map_err(|e| with_path(e, "sync directory", &self.dir))
    }

    /// Writes `name` in the directory through a synced temporary file and a rename (the
    /// directory is not synced here).
    fn write_file(
        &mut self,
        name: &str,
        write: impl FnOnce(&mut dyn Write) -> io::Result<()>,
    ) -> Result<(), SinkError> {
        self.attempt = self.attempt.wrapping_add(1);
        let tmp = format!("{TMP_PREFIX}{name}.{:016x}", self.attempt);
        let f = self
            .storage
            .create(&tmp)
            .map_err(|e| with_path(e, "create", &self.path(&tmp)))?;
        let mut w = io::BufWriter::with_capacity(1 << 20, Appender { file: &*f, at: 0 });
        write(&mut w)
            .and_then(|_| w.flush())
            .map_err(|e| with_path(e, "write", &self.path(&tmp)))?;
        drop(w);
        f.sync_data()
            .map_err(|e| with_path(e, "sync", &self.path(&tmp)))?;
        drop(f);
        self.storage
            .rename(&tmp, name)
            .map_err(|e| with_path(e, "rename into place", &self.path(name)))
    }

    fn exists(&self, name: &str) -> Result<bool, SinkError> {
        match self.storage.open(name) {
            Ok(_) => Ok(true),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
            Err(e) => Err(with_path(e, "look up", &self.path(name))),
        }
    }
}

/// Reads the owner file of shard `stem` (`{sink_id}-{subtask:05}`).
fn read_owner_in(storage: &dyn Storage, stem: &str) -> io::Result<Option<(String, u64)>> {
    let name = format!("{stem}.{OWNER_EXT}");
    let data = match storage.open(&name) {
        Ok(f) => storage::read_all(&*f)?,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e),
    };
    let text = std::str::from_utf8(&data).ok();
    let parsed = text
        .and_then(|t| t.strip_suffix('\n'))
        .and_then(|t| t.split_once(' '))
        .and_then(|(o, g)| Some((o.to_string(), g.parse::<u64>().ok()?)))
        .filter(|(o, _)| !o.is_empty() && !o.contains(char::is_whitespace));
    parsed.map(Some).ok_or_else(|| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!("the owner file {name} does not read as `LOG-ID GENERATION`"),
        )
    })
}

impl Sink for DirSink {
    fn deliver(&mut self, epoch: &Epoch) -> Result<(), SinkError> {
        // A claimed shard: the owner file must still hold this claim, checked under the lock
        // that a claim takes, and held until the epoch's name is durable.
        let _owner_guard = match &self.claim {
            Some(claim) => {
                claim.check_key(epoch.key())?;
                let stem = format!("{}-{:05}", claim.sink_id, claim.subtask);
                let guard = self.owner_lock(&stem)?;
                let found = self.read_owner(&stem)?;
                claim.check(found.as_ref().map(|(o, g)| (o.as_str(), *g)))?;
                Some(guard)
            }
            None => None,
        };
        // A first pass decides the format (the epoch is read again to write it).
        let mut text = true;
        'scan: for chunk in epoch.chunks() {
            for r in chunk?.records() {
                if r.data.contains(&b'\n') || std::str::from_utf8(&r.data).is_err() {
                    text = false;
                    break 'scan;
                }
            }
        }
        let stem = Self::stem(epoch.key());
        if self.keep_metadata {
            // Durable before the epoch's file exists: whoever sees the file finds its metadata.
            self.write_file(&format!("{stem}.{META_EXT}"), |w| {
                w.write_all(epoch.metadata())
            })?;
            self.sync_dir()?;
        }
        let name = format!("{stem}.{}", if text { "txt" } else { "bin" });
        self.write_file(&name, |w| {
            for r in epoch.records() {
                let r = r.map_err(io::Error::other)?;
                if text {
                    w.write_all(&r.data)?;
                    w.write_all(b"\n")?;
                } else {
                    let len = u32::try_from(r.data.len()).map_err(|_| {
                        io::Error::new(io::ErrorKind::InvalidInput, "record over 4 GiB")
                    })?;
                    w.write_all(&len.to_le_bytes())?;
                    w.write_all(&r.data)?;
                }
            }
            Ok(())
        })?;
        self.sync_dir()
    }

    fn stores_marker(&self) -> bool {
        true
    }

    /// True when the epoch's file exists *and* its name is durable. A file found here may be
    /// the rename of a delivery whose directory sync failed or never ran (a crash between the
    /// rename and the sync): it is visible in the page cache but a power loss could still
    /// remove it. So the directory is synced before the answer is yes, and a failed sync is
    /// an error, never a yes; otherwise the committer would durably mark an epoch the target
    /// could lose.
    fn is_committed(&mut self, key: &EpochKey) -> Result<bool, SinkError> {
        let stem = Self::stem(key);
        let exists = self.exists(&format!("{stem}.txt"))? || self.exists(&format!("{stem}.bin"))?;
        if exists {
            self.sync_dir()?;
        }
        Ok(exists)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::{CrashOptions, FaultOp, SimStorage};
    use crate::{Options, WalSink};

    fn one_epoch(dir: &Path) -> WalSink {
        let (wal, _) = WalSink::open(dir, Options::new("dirsink")).unwrap();
        wal.append(b"a").unwrap();
        wal.append(b"b").unwrap();
        wal.checkpoint(1, b"offset=2").unwrap();
        wal.checkpoint_complete(1).unwrap();
        wal
    }

    #[test]
    fn names_parse_back() {
        let key = EpochKey {
            sink_id: "a-b".into(),
            subtask: 7,
            checkpoint: 42,
        };
        let name = format!("{}.txt", DirSink::stem(&key));
        assert_eq!(DirSink::parse_name(&name), Some((42, "a-b", 7, "txt")));
        assert_eq!(DirSink::parse_name("notes.txt"), None);
    }

    fn records_in(sim: &SimStorage) -> usize {
        DirSink::read_epochs_in(sim)
            .unwrap()
            .iter()
            .map(|(_, r)| r.len())
            .sum()
    }

    /// A delivery whose directory sync failed after the rename leaves the file visible; the
    /// retry must not count it as committed until the name is durable.
    #[test]
    fn is_committed_makes_the_name_durable_before_answering_yes() {
        let d = tempfile::tempdir().unwrap();
        let wal = one_epoch(&d.path().join("wal"));
        let target = SimStorage::new();
        let mut sink = DirSink::with_storage(Arc::new(target.clone())).unwrap();
        let fail_next_dir_sync = || target.inject_fault(FaultOp::SyncDir, 0, io::ErrorKind::Other);
        fail_next_dir_sync();
        assert!(
            wal.deliver_ready(&mut sink).is_err(),
            "the sync after the rename failed"
        );
        assert_eq!(records_in(&target), 2, "renamed, not durable");
        let key = EpochKey {
            sink_id: "dirsink".into(),
            subtask: 0,
            checkpoint: 1,
        };
        // The retry: while the directory cannot be synced, the epoch is not committed.
        fail_next_dir_sync();
        assert!(sink.is_committed(&key).is_err());
        assert!(wal.health().committed.is_none());
        fail_next_dir_sync();
        assert!(
            wal.deliver_ready(&mut sink).is_err(),
            "no mark without a durable name"
        );
        assert!(wal.health().committed.is_none());
        // Once the directory syncs, the answer is yes and the mark follows.
        let before = target.stats().dir_syncs;
        assert!(sink.is_committed(&key).unwrap());
        assert_eq!(
            target.stats().dir_syncs,
            before + 1,
            "yes only after a directory sync"
        );
        assert_eq!(wal.deliver_ready(&mut sink).unwrap(), 1);
        assert_eq!(wal.health().committed, Some(1));
        // And the name survives a power loss of the target.
        target.crash(CrashOptions {
            seed: 1,
            lose_all_unsynced: true,
            process_only: false,
        });
        assert_eq!(records_in(&target), 2);
    }

    /// A delivery whose temporary file was never synced, then a new sink (which clears
    /// leftovers) delivering again with a failing directory sync, then a power loss: the
    /// epoch's name holds the whole epoch or nothing, never the unsynced leftover.
    #[test]
    fn a_leftover_temporary_file_never_ends_up_under_the_epochs_name() {
        for seed in 0..64 {
            let d = tempfile::tempdir().unwrap();
            let wal = one_epoch(&d.path().join("wal"));
            let target = SimStorage::new();
            let sink = || DirSink::with_storage(Arc::new(target.clone())).unwrap();
            target.inject_fault(FaultOp::SyncData, 0, io::ErrorKind::Other);
            assert!(wal.deliver_ready(&mut sink()).is_err());
            let mut again = sink();
            target.inject_fault(FaultOp::SyncDir, 0, io::ErrorKind::Other);
            assert!(wal.deliver_ready(&mut again).is_err());
            target.crash(CrashOptions::power_loss(seed));
            let got = records_in(&target);
            assert!(got == 0 || got == 2, "seed {seed}: {got} records");
            for (name, records) in DirSink::read_epochs_in(&target).unwrap() {
                assert_eq!(
                    records,
                    vec![b"a".to_vec(), b"b".to_vec()],
                    "seed {seed}: {name}"
                );
            }
        }
    }

    #[test]
    fn kept_metadata_reads_back_with_the_epoch() {
        let d = tempfile::tempdir().unwrap();
        let wal = one_epoch(&d.path().join("wal"));
        let out = d.path().join("out");
        let mut sink = DirSink::new(&out).unwrap().keep_metadata(true);
        assert_eq!(wal.deliver_ready(&mut sink).unwrap(), 1);
        let c = DirSink::committed(&out, "dirsink", 0).unwrap();
        assert_eq!(c.len(), 1);
        assert_eq!(c[0].checkpoint, 1);
        assert_eq!(c[0].metadata.as_deref(), Some(&b"offset=2"[..]));
        assert!(DirSink::committed(&out, "other", 0).unwrap().is_empty());
        assert!(DirSink::committed(d.path().join("none"), "dirsink", 0)
            .unwrap()
            .is_empty());
        // The .meta file is not a record.
        assert_eq!(DirSink::read_records(&out).unwrap().len(), 2);
    }

    #[test]
    fn errors_name_the_path() {
        let d = tempfile::tempdir().unwrap();
        let file = d.path().join("afile");
        FsStorage::new(d.path())
            .unwrap()
            .create("afile")
            .unwrap()
            .write_at(0, b"x")
            .unwrap();
        let e = DirSink::new(&file).unwrap_err().to_string();
        assert!(e.contains("afile") && e.contains("not a directory"), "{e}");
    }

    /// Two logs under one sink id into one directory: the second is refused at its claim;
    /// taking over fences the first at its next delivery, which writes nothing.
    #[test]
    fn a_second_log_is_refused_and_a_take_over_fences_the_first() {
        let d = tempfile::tempdir().unwrap();
        let out = d.path().join("out");
        let first = one_epoch(&d.path().join("wal-a"));
        let second = one_epoch(&d.path().join("wal-b"));
        assert_ne!(first.log_id(), second.log_id());
        let mut a = DirSink::new(&out).unwrap();
        let ca = a.claim("dirsink", 0, &Owner::new(first.log_id())).unwrap();
        assert_eq!(ca.generation, 1);
        let mut b = DirSink::new(&out).unwrap();
        let e = b
            .claim("dirsink", 0, &Owner::new(second.log_id()))
            .unwrap_err();
        assert_eq!(e.class(), crate::SinkErrorClass::Fenced, "{e}");
        assert!(e.message().contains(first.log_id()), "{e}");
        let cb = b
            .claim("dirsink", 0, &Owner::new(second.log_id()).take_over(true))
            .unwrap();
        assert_eq!(cb.generation, 2);
        assert_eq!(
            DirSink::owner_of(&out, "dirsink", 0).unwrap(),
            Some((second.log_id().to_string(), 2))
        );
        let e = first.deliver_ready(&mut a).unwrap_err();
        assert!(
            matches!(e.kind(), crate::ErrorKind::Sink(s) if s.class() == crate::SinkErrorClass::Fenced),
            "{e}"
        );
        assert!(DirSink::committed(&out, "dirsink", 0).unwrap().is_empty());
        assert_eq!(second.deliver_ready(&mut b).unwrap(), 1);
        assert_eq!(
            DirSink::read_records(&out).unwrap(),
            vec![b"a".to_vec(), b"b".to_vec()]
        );
    }

    /// The same log claiming again (a restart, or a copy of its directory) raises the
    /// generation: the older claim is fenced.
    #[test]
    fn a_new_claim_of_the_same_log_fences_its_older_claim() {
        let d = tempfile::tempdir().unwrap();
        let out = d.path().join("out");
        let wal = one_epoch(&d.path().join("wal"));
        let mut old = DirSink::new(&out).unwrap();
        old.claim("dirsink", 0, &Owner::new(wal.log_id())).unwrap();
        let mut new = DirSink::new(&out).unwrap();
        assert_eq!(
            new.claim("dirsink", 0, &Owner::new(wal.log_id()))
                .unwrap()
                .generation,
            2
        );
        assert!(wal.deliver_ready(&mut old).is_err());
        assert_eq!(wal.deliver_ready(&mut new).unwrap(), 1);
    }

    /// An owner file that does not parse is an error naming it, never taken as no owner.
    #[test]
    fn a_damaged_owner_file_is_refused_by_name() {
        let d = tempfile::tempdir().unwrap();
        let out = d.path().join("out");
        let st = FsStorage::new(&out).unwrap();
        st.create("dirsink-00000.owner")
            .unwrap()
            .write_at(0, b"garbage")
            .unwrap();
        let mut s = DirSink::new(&out).unwrap();
        let e = s.claim("dirsink", 0, &Owner::new("x")).unwrap_err();
        assert!(e.message().contains("dirsink-00000.owner"), "{e}");
    }

    /// The log id is made once and kept: the same across opens.
    #[test]
    fn the_log_id_survives_reopening() {
        let d = tempfile::tempdir().unwrap();
        let id = {
            let (wal, _) = WalSink::open(d.path(), Options::new("dirsink")).unwrap();
            assert!(crate::format::is_log_id(wal.log_id()), "{}", wal.log_id());
            wal.log_id().to_string()
        };
        let (wal, _) = WalSink::open(d.path(), Options::new("dirsink")).unwrap();
        assert_eq!(wal.log_id(), id);
    }
}
