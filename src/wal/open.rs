//! Opening a log: the lock and identity ([`bootstrap`](super::bootstrap)), the committed
//! floor, recovery, the first segment of this run, the disk reserve, and the shared state the
//! handle's methods work on. Writing is in the parent module; nothing here runs after `open`.

use super::{bootstrap, Shared, WalSink, Writer};
use crate::config::{Mode, Options};
use crate::delivery::commit_store::{CommitStore, LocalCommitStore};
use crate::delivery::log::DeliveryState;
use crate::error::{Error, Result};
use crate::log::files;
use crate::log::format;
use crate::log::recover::{self, Recovered, RecoveryReport};
use crate::log::segment::{NewSegment, SegmentWriter};
use crate::storage::{FsStorage, Storage};
use parking_lot::{Condvar, Mutex};
use std::path::Path;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;

impl WalSink {
    /// Opens (or creates) the log in `dir`, recovers it, and reports what recovery found.
    /// A missing `dir` is created with [`Options::dir_mode`] (default `0o700`) and the log's
    /// files with [`Options::file_mode`] (default `0o600`); an existing directory keeps its
    /// mode (a warning is logged when it grants more).
    ///
    /// # Errors
    /// [`ErrorKind::InvalidConfig`](crate::ErrorKind::InvalidConfig) for options that
    /// [`Options::sanitize`] refuses; `Locked` when another handle holds the directory;
    /// `IdentityMismatch` when it holds another sink's log; `NotALog` when it holds no log
    /// and [`Options::create`] is off; `UnsupportedVersion` for a log written by a newer format;
    /// `Corruption` for damage that recovery must not repair silently; `Io` when the
    /// directory cannot be created, read, written or synced.
    pub fn open(dir: impl AsRef<Path>, options: Options) -> Result<(Self, RecoveryReport)> {
        let dir = dir.as_ref();
        options.sanitize()?;
        let storage = FsStorage::with_modes(dir, options.dir_mode, options.file_mode)
            .map_err(|e| Error::io(format!("create directory {}", dir.display()), e))?;
        Self::open_with_storage(Arc::new(storage), options)
    }

    /// Opens the log on any [`Storage`], with the local commit store.
    ///
    /// # Errors
    /// As [`WalSink::open`], the storage's own failures reported as `Io`.
    pub fn open_with_storage(
        storage: Arc<dyn Storage>,
        options: Options,
    ) -> Result<(Self, RecoveryReport)> {
        let store = LocalCommitStore::new(storage.clone(), &options.sink_id, options.subtask);
        Self::open_with(storage, options, Box::new(store))
    }

    /// Opens the log on any [`Storage`] with a custom [`CommitStore`].
    ///
    /// # Errors
    /// As [`WalSink::open`], and `CommitStore` when the commit store's `last_committed` fails.
    pub fn open_with(
        storage: Arc<dyn Storage>,
        options: Options,
        mut store: Box<dyn CommitStore>,
    ) -> Result<(Self, RecoveryReport)> {
        options.sanitize()?;
        let lock = bootstrap::take_lock(&*storage)?;
        let (fresh, log_id) = bootstrap::check_identity(&*storage, &options)?;
        let (committed, floor) = committed_floor(&storage, &options, &mut *store)?;
        let Recovered {
            mut cat,
            mut report,
            min_next_id,
            next_seq,
            durable_end,
            mut keep,
            mut free,
        } = recover::recover(&*storage, &options, committed, fresh)?;
        let mut salt_rng = match options.salt_seed {
            Some(s) => fastrand::Rng::with_seed(s ^ next_seq),
            None => fastrand::Rng::new(),
        };
        let seed = format::Seed {
            seq: next_seq,
            salt: salt_rng.u64(..),
        };
        let mut seg = first_segment(&storage, &options, seed, &mut free)?;
        give_back_for_reserve(&*storage, &mut free);
        let synced = bootstrap::reserve_dropped_ids(&*storage, &mut seg, &report, durable_end)?
            .unwrap_or(durable_end);
        keep.push(next_seq);
        cat.segments = keep.into_iter().collect();
        cat.free = free;
        report.segments = cat.segments.len();
        report.pending = cat.epochs.iter().map(|e| e.id).collect();
        report.pending_records = cat.epochs.iter().map(|e| e.records).sum();
        report.next_checkpoint_id = min_next_id.unwrap_or(u64::MAX);
        cat.health.corruptions = u64::from(report.corruption.is_some());

        let writer = Writer {
            seg,
            synced,
            sync_in_flight: false,
            poisoned: None,
            min_next_id,
            open_records: 0,
            open_bytes: 0,
            open_start: None,
            unsynced: Vec::new(),
            restore_guard: None,
            salt_rng,
        };
        tracing::info!(
            sink_id = %options.sink_id,
            subtask = options.subtask,
            segments = report.segments,
            pending = report.pending.len(),
            pending_records = report.pending_records,
            torn_tail = report.torn_tail.is_some(),
            "recovered the log"
        );
        let sink_id: Arc<str> = options.sink_id.as_str().into();
        let shared = Shared {
            storage,
            opts: options,
            sink_id,
            log_id: log_id.into(),
            w: Mutex::new(writer),
            synced_cv: Condvar::new(),
            gather: Default::default(),
            cat: Mutex::new(cat),
            cat_cv: Condvar::new(),
            store: Mutex::new(store),
            floor,
            delivery: DeliveryState::default(),
            listeners: Mutex::new(Vec::new()),
            freeing: Mutex::new(Default::default()),
            open_bytes: AtomicU64::new(0),
            read_pool: crate::log::reader::read_pool(),
            _lock: lock,
        };
        Ok((
            WalSink {
                shared: Arc::new(shared),
            },
            report,
        ))
    }
}

/// The last committed checkpoint, and the local floor kept beside a commit store that forgets
/// across restarts (see [`CommitStore::survives_restart`]): the higher of the two is what
/// recovery may drop.
fn committed_floor(
    storage: &Arc<dyn Storage>,
    options: &Options,
    store: &mut dyn CommitStore,
) -> Result<(Option<u64>, Option<Mutex<LocalCommitStore>>)> {
    let committed = store.last_committed(&options.sink_id, options.subtask)?;
    if store.survives_restart() {
        return Ok((committed, None));
    }
    let mut floor = LocalCommitStore::new(storage.clone(), &options.sink_id, options.subtask);
    let committed = committed.max(floor.last_committed(&options.sink_id, options.subtask)?);
    Ok((committed, Some(Mutex::new(floor))))
}

/// Starts this run's first segment, right after the cut so segment numbers stay contiguous.
/// Any earlier file with that number was removed durably during recovery, and its frames (or
/// stale ones in a recycled file) never verify under the new salt. A free file is recycled
/// when the options allow (taken from `free`); the directory is synced once for the repairs
/// recovery made and the new segment's name.
fn first_segment(
    storage: &Arc<dyn Storage>,
    options: &Options,
    seed: format::Seed,
    free: &mut Vec<u64>,
) -> Result<SegmentWriter> {
    let sync_dir = || {
        storage
            .sync_dir()
            .map_err(|e| Error::io(format!("sync directory {}", storage.describe()), e))
    };
    let source = match (options.recycle_segments, free.pop()) {
        (true, Some(f)) => {
            // A `.free` name found by the scan may not be durable (a clean-up whose directory
            // sync failed, then a crash): rewriting the file before its name is durable could
            // leave a live segment's name on the new contents.
            sync_dir()?;
            NewSegment::Recycle(f)
        }
        (_, f) => {
            if let Some(f) = f {
                free.push(f);
            }
            NewSegment::Create
        }
    };
    let create = matches!(source, NewSegment::Create);
    let start = |source| {
        SegmentWriter::start(
            storage.clone(),
            seed,
            source,
            options.segment_size,
            options.write_buffer_size,
        )
    };
    let seg = match start(source) {
        // A full disk, the reserve left from the last run holding the last blocks: it gives
        // the new segment its first block, so the log opens and delivery can drain it (the
        // reserve comes back below or once delivery freed room). A recycled file was renamed
        // already: not retried.
        Err(e)
            if create
                && crate::storage::reserve::is_full(&e)
                && crate::storage::reserve::release(&**storage) =>
        {
            start(NewSegment::Create)
        }
        r => r,
    };
    let mut seg = seg
        .map(|seg| seg.zero_ahead(options.mode == Mode::Durable))
        .map_err(|e| {
            Error::io(
                format!("create segment {}", format::segment_name(seed.seq)),
                e,
            )
        })?;
    sync_dir()?;
    seg.dir_synced();
    Ok(seg)
}

/// Room for the commit mark on a full disk (best effort: a full disk has none to give), taken
/// after the new segment's first block, which the log cannot open without. Free files a drain
/// kept may hold the disk's last blocks: the oldest are given back for it.
fn give_back_for_reserve(storage: &dyn Storage, free: &mut Vec<u64>) {
    while !crate::storage::reserve::keep(storage) && !free.is_empty() {
        if files::remove_free_file(storage, &format::free_name(free[0]), true).is_err() {
            break;
        }
        free.remove(0);
    }
}
