//! [`WalSink`]: the log handle an embedder drives with append, checkpoint, complete and restore.
//!
//! Locking: `Shared::w` (the writer) is always taken before `Shared::cat` (the catalog) when
//! both are needed; syncs run with neither held, so appends continue during a sync.

mod bootstrap;
mod cleanup;
mod gather;
mod open;
mod seam;

use crate::config::{FullPolicy, Mode, Options};
use crate::delivery::catalog::{now_ms, Catalog, EpochInfo, Health, PendingCheckpoint};
use crate::delivery::commit_store::{CommitStore, LocalCommitStore};
use crate::delivery::committer::{self, Committer};
use crate::delivery::deliverer::Deliverer;
use crate::delivery::log::DeliveryState;
use crate::error::{Error, ErrorKind, Result};
use crate::log::format::{self, FrameKind, Position};
use crate::log::segment::{NewSegment, SegmentWriter};
use crate::storage::Storage;
use crate::Sink;
use parking_lot::{Condvar, Mutex, MutexGuard};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

#[derive(Debug)]
pub(crate) struct Writer {
    pub seg: SegmentWriter,
    /// Everything before this position is durable.
    pub synced: Position,
    sync_in_flight: bool,
    poisoned: Option<String>,
    /// Smallest id the next checkpoint may use; `None` once checkpoint `u64::MAX` exists.
    min_next_id: Option<u64>,
    open_records: u64,
    open_bytes: u64,
    /// Position of the open epoch's first frame.
    pub open_start: Option<Position>,
    /// Barriers written but not yet covered by a sync, in log order.
    pub unsynced: Vec<EpochInfo>,
    /// While a restore frame is not durable (until `synced` passes `.1`), the epochs it voided
    /// can come back after a power loss: nothing at or after `.0` may be freed.
    restore_guard: Option<(Position, Position)>,
    salt_rng: fastrand::Rng,
}

/// What the freeing passes share (`cleanup.rs`), under [`Shared::freeing`].
#[derive(Debug, Default)]
pub(crate) struct Freeing {
    /// Segments freed since a free file was last removed while delivery was busy.
    pub(crate) since_trim: u32,
}

/// A wake-up registered with [`WalSink::on_change`].
type Listener = Box<dyn Fn() + Send + Sync>;

/// A point in the log that must be durable for some appended records to be; see
/// [`WalSink::append_batch_unsynced`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct DurablePoint(Position);

pub(crate) struct Shared {
    storage: Arc<dyn Storage>,
    opts: Options,
    sink_id: Arc<str>,
    /// The log's own id, from its identity file ([`WalSink::log_id`]).
    log_id: Arc<str>,
    w: Mutex<Writer>,
    synced_cv: Condvar,
    /// Durable appenders on their way, for group commit's gathering.
    gather: gather::Gathering,
    cat: Mutex<Catalog>,
    cat_cv: Condvar,
    store: Mutex<Box<dyn CommitStore>>,
    /// When `store` forgets across restarts: the durable floor raised before segments are
    /// freed (see [`CommitStore::survives_restart`]).
    floor: Option<Mutex<LocalCommitStore>>,
    /// What delivery keeps between its deliverers (delivery's state; the log only holds it).
    delivery: DeliveryState,
    /// Called whenever the catalog changes (sealed, completed, committed, restored, shut
    /// down): wakes waiters that cannot sit on `cat_cv`, such as async tasks.
    listeners: Mutex<Vec<Listener>>,
    /// Held while segments are freed: one pass at a time, also when a mark made beside the
    /// sink outlives the deliverer that started it (a dropped async call).
    pub(crate) freeing: Mutex<Freeing>,
    open_bytes: AtomicU64,
    /// Read buffers reused between delivered epochs.
    read_pool: Arc<crate::BufferPool>,
    _lock: Box<dyn Send + Sync + std::fmt::Debug>,
}

/// A write-ahead-log sink: a segmented, checksummed log of records grouped into checkpointed
/// epochs, delivered to a [`Sink`](crate::Sink) once their checkpoint completes.
///
/// All methods take `&self`; the handle is `Send + Sync` and can be shared (for example in an
/// `Arc`) between appending threads and the thread that delivers.
///
/// # Example
/// ```
/// use walsink::{MemorySink, Options, WalSink};
///
/// let dir = tempfile::tempdir()?;
/// let (wal, _report) = WalSink::open(dir.path(), Options::new("example"))?;
/// wal.append(b"hello")?;
/// wal.append(b"world")?;
/// wal.checkpoint(1, b"source-offset=2")?; // durable when this returns
/// wal.checkpoint_complete(1)?;             // the engine says checkpoint 1 is complete
/// let mut sink = MemorySink::new();
/// wal.deliver_ready(&mut sink)?;           // or wal.spawn_committer(sink) for a thread
/// assert_eq!(sink.records(), vec![b"hello".to_vec(), b"world".to_vec()]);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct WalSink {
    pub(crate) shared: Arc<Shared>,
}

impl std::fmt::Debug for Shared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shared")
            .field("sink_id", &self.sink_id)
            .finish()
    }
}

impl std::fmt::Debug for WalSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WalSink")
            .field("dir", &self.shared.storage.describe())
            .field("sink_id", &self.shared.sink_id)
            .field("subtask", &self.shared.opts.subtask)
            .finish()
    }
}

fn poisoned_err(cause: &str) -> Error {
    ErrorKind::Poisoned {
        cause: cause.to_string(),
    }
    .into()
}

impl WalSink {
    /// Appends one record to the open epoch.
    ///
    /// In [`Mode::Checkpointed`] the record is buffered and written without a sync: it becomes
    /// durable with the next [`WalSink::checkpoint`]. In [`Mode::Durable`] this returns only
    /// once the record is durable.
    pub fn append(&self, record: &[u8]) -> Result<()> {
        self.check_size(record)?;
        self.append_checked(std::iter::once(record))
    }

    /// Appends records in order; in [`Mode::Durable`], one sync covers the whole batch. If
    /// any record is too large, none is appended.
    pub fn append_batch<'a, I>(&self, records: I) -> Result<()>
    where
        I: IntoIterator<Item = &'a [u8]>,
    {
        let records: Vec<&[u8]> = records.into_iter().collect();
        if records.is_empty() {
            return Ok(());
        }
        for r in &records {
            self.check_size(r)?;
        }
        self.append_checked(records)
    }

    fn check_size(&self, record: &[u8]) -> Result<()> {
        let max = self.shared.opts.max_record_size;
        if record.len() > max {
            return Err(ErrorKind::RecordTooLarge {
                len: record.len(),
                max,
            }
            .into());
        }
        Ok(())
    }

    /// Appends records already checked against the size limit.
    fn append_checked<'a>(&self, records: impl IntoIterator<Item = &'a [u8]>) -> Result<()> {
        let sh = &*self.shared;
        if sh.opts.mode != Mode::Durable {
            self.write_records(records, None)?;
            return Ok(());
        }
        let mut arrival = sh.gather.arrive();
        let target = self.write_records(records, Some(&mut arrival))?;
        sh.sync_to(target)
    }

    /// Writes records already checked against the size limit, after waiting for budget;
    /// returns the position that must be durable for them to be.
    /// A durable appender's `arrival` is told, under the writer lock, once they are written.
    fn write_records<'a>(
        &self,
        records: impl IntoIterator<Item = &'a [u8]>,
        arrival: Option<&mut gather::Arrival<'_>>,
    ) -> Result<Position> {
        self.budget_room(true)?;
        self.write_now(records, arrival)
    }

    /// Writes records already checked against the size limit and the budget.
    fn write_now<'a>(
        &self,
        records: impl IntoIterator<Item = &'a [u8]>,
        arrival: Option<&mut gather::Arrival<'_>>,
    ) -> Result<Position> {
        let sh = &*self.shared;
        tracing::trace!(sink_id = %sh.sink_id, "append batch");
        let mut w = sh.w.lock();
        check_poison(&w)?;
        let end = self.shared.write_data(&mut w, records)?;
        if let Some(a) = arrival {
            a.wrote();
        }
        Ok(end)
    }

    /// Appends `records` only if that needs neither I/O nor a wait: the frames fit in the
    /// write buffer of the active segment, the writer is free and the backlog budget is not
    /// used up. Returns the point the records need to be durable (as
    /// [`WalSink::append_batch_unsynced`] does), or `None` with nothing appended. For async
    /// drivers, which append in place when this succeeds and off the runtime when it does
    /// not; in [`Mode::Durable`] they then wait for [`WalSink::make_durable`] elsewhere.
    pub fn try_append_batch(&self, records: &[&[u8]]) -> Result<Option<DurablePoint>> {
        let sh = &*self.shared;
        for r in records {
            self.check_size(r)?;
        }
        let limit = sh.opts.max_backlog_bytes;
        if limit != u64::MAX {
            let Some(cat) = sh.cat.try_lock() else {
                return Ok(None);
            };
            if cat.backlog_bytes() + sh.open_bytes.load(Ordering::Relaxed) >= limit {
                return Ok(None);
            }
        }
        let Some(mut w) = sh.w.try_lock() else {
            return Ok(None);
        };
        check_poison(&w)?;
        if !w.seg.fits_buffered(records.iter().map(|r| r.len())) {
            return Ok(None);
        }
        let end = sh.write_data(&mut w, records.iter().copied())?;
        Ok(Some(DurablePoint(end)))
    }

    /// [`Mode::Durable`] in two steps, for drivers that wait for the disk elsewhere (an
    /// async handle's I/O thread): writes `records` without a sync and returns the point
    /// that must be durable for them to be; [`WalSink::make_durable`] then syncs through it
    /// (one sync covers every point written before it). Until then the records are neither
    /// durable nor delivered. In [`Mode::Checkpointed`] the records are appended as by
    /// [`WalSink::append_batch`], and the point needs no sync beyond the next checkpoint.
    pub fn append_batch_unsynced(&self, records: &[&[u8]]) -> Result<DurablePoint> {
        for r in records {
            self.check_size(r)?;
        }
        Ok(DurablePoint(
            self.write_records(records.iter().copied(), None)?,
        ))
    }

    /// [`WalSink::append_batch_unsynced`] without waiting for backlog budget, for drivers
    /// that wait for it where a wait can be given up (an async handle): where
    /// `append_batch_unsynced` would wait (the budget of
    /// [`Options::max_backlog_bytes`] is used up, [`FullPolicy::Block`], and sealed epochs
    /// are there whose delivery frees it), returns `None` with nothing appended. Wait for a
    /// [`WalSink::on_change`] wake-up (registered before this call) and call again. May write
    /// to the file (I/O, blocking) when the budget has room.
    ///
    /// # Errors
    /// As [`WalSink::append_batch`]: `RecordTooLarge` (none appended), `BacklogFull` with
    /// [`FullPolicy::Reject`] or with nothing sealed to drain, `Shutdown`, `Poisoned`, or the
    /// write's I/O error.
    pub fn append_batch_within_budget(&self, records: &[&[u8]]) -> Result<Option<DurablePoint>> {
        for r in records {
            self.check_size(r)?;
        }
        if !self.budget_room(false)? {
            return Ok(None);
        }
        Ok(Some(DurablePoint(
            self.write_now(records.iter().copied(), None)?,
        )))
    }

    /// Returns once everything written up to `point` is durable (group commit: concurrent
    /// callers share syncs); in [`Mode::Durable`] that seals and completes the records'
    /// automatic checkpoint. In [`Mode::Checkpointed`] it does nothing: records there become
    /// durable with a checkpoint.
    pub fn make_durable(&self, point: DurablePoint) -> Result<()> {
        if self.shared.opts.mode != Mode::Durable {
            return Ok(());
        }
        self.shared.sync_to(point.0)
    }

    /// Seals the open epoch as checkpoint `id` with an opaque `metadata` blob (Flink's
    /// `snapshotState`). Returns once the epoch and its barrier are durable: one data sync per
    /// segment written since the last sync, plus one directory sync if segments were created
    /// or renamed. Ids must strictly increase (an empty epoch is allowed).
    pub fn checkpoint(&self, id: u64, metadata: &[u8]) -> Result<()> {
        let sh = &*self.shared;
        if sh.opts.mode == Mode::Durable {
            return Err(Error::invalid_op(
                "checkpoint is driven automatically in durable mode",
            ));
        }
        if metadata.len() > sh.opts.max_metadata_size {
            return Err(Error::config(format!(
                "checkpoint metadata of {} bytes exceeds max_metadata_size ({})",
                metadata.len(),
                sh.opts.max_metadata_size
            )));
        }
        let target = {
            let mut w = sh.w.lock();
            check_poison(&w)?;
            tracing::debug!(
                sink_id = %sh.sink_id,
                subtask = sh.opts.subtask,
                checkpoint = id,
                records = w.open_records,
                bytes = w.open_bytes,
                "checkpoint"
            );
            sh.write_barrier(&mut w, id, metadata)?;
            w.seg.position()
        };
        sh.sync_to(target)
    }

    /// Checkpoint `id` is complete (Flink's `notifyCheckpointComplete`): every sealed epoch
    /// with an id `<= id` becomes deliverable. A later notification covers a missed one; a
    /// late or repeated one does nothing.
    pub fn checkpoint_complete(&self, id: u64) -> Result<()> {
        let sh = &*self.shared;
        if sh.opts.mode == Mode::Durable {
            return Err(Error::invalid_op(
                "checkpoints complete automatically in durable mode",
            ));
        }
        let mut cat = sh.cat.lock();
        if cat.complete(id) {
            sh.catalog_changed();
        }
        Ok(())
    }

    /// The engine restored from checkpoint `id` (`None`: from no checkpoint). Sealed,
    /// uncommitted epochs above `id` and the unsealed records are voided (the source replays
    /// them); epochs up to `id` become deliverable. Durable when it returns. Checkpoint ids
    /// are never reused: the next checkpoint still needs an id above every id seen before.
    pub fn restore(&self, id: Option<u64>) -> Result<()> {
        let sh = &*self.shared;
        if sh.opts.mode == Mode::Durable {
            return Err(Error::invalid_op(
                "restore is not available in durable mode",
            ));
        }
        let target = {
            let mut w = sh.w.lock();
            check_poison(&w)?;
            tracing::info!(sink_id = %sh.sink_id, subtask = sh.opts.subtask, restored_to = ?id, "restore");
            let restore = format::Restore {
                restored_to: id,
                durable_through: w.synced,
            };
            sh.write_frame(&mut w, FrameKind::Restore, &[&restore.encode()])?;
            let end = w.seg.position();
            let voided = |e: &EpochInfo| id.is_none_or(|t| e.id > t);
            let mut cat = sh.cat.lock();
            // Until the frame is durable a power loss brings the voided epochs back, so
            // clean-up must keep them whole (`oldest_needed`).
            let floor = cat
                .epochs
                .iter()
                .chain(w.unsynced.iter())
                .filter(|e| voided(e))
                .map(|e| e.start)
                .chain(w.open_start)
                .min();
            if let Some(floor) = floor {
                w.restore_guard = Some(match w.restore_guard {
                    Some((f, e)) => (f.min(floor), e.max(end)),
                    None => (floor, end),
                });
            }
            w.unsynced.retain(|e| !voided(e));
            sh.reset_open(&mut w);
            cat.restore(id);
            sh.catalog_changed();
            end
        };
        sh.sync_to(target)
    }

    /// Health figures: backlog, ages, latency, errors.
    pub fn health(&self) -> Health {
        let sh = &*self.shared;
        let (open_records, open_bytes, poisoned) = {
            let w = sh.w.lock();
            (w.open_records, w.open_bytes, w.poisoned.is_some())
        };
        let mut h = sh.cat.lock().health();
        h.open_records = open_records;
        h.open_bytes = open_bytes;
        h.poisoned = poisoned;
        h
    }

    /// Sealed checkpoints not yet committed, oldest first.
    pub fn pending(&self) -> Vec<PendingCheckpoint> {
        self.shared.cat.lock().pending()
    }

    /// The sink id this log belongs to.
    pub fn sink_id(&self) -> &str {
        &self.shared.sink_id
    }

    /// The log's own id: 32 lowercase hex digits, random, made when the log was created and
    /// kept in its identity file, so it stays the same across opens (and in a copy of the
    /// directory). A target that fences owners records it as the owner of the log's shard
    /// (see [`Owner`](crate::Owner)).
    pub fn log_id(&self) -> &str {
        &self.shared.log_id
    }

    /// How this log makes records durable.
    pub fn mode(&self) -> Mode {
        self.shared.opts.mode
    }

    /// The subtask this log belongs to.
    pub fn subtask(&self) -> u32 {
        self.shared.opts.subtask
    }

    /// Delivers every epoch that is deliverable now, in order, on the calling thread, and
    /// marks them committed. Stops at the first error and returns it (nothing is skipped; the
    /// next call retries the same epoch, and what succeeded before the error is marked first).
    /// Returns the number of epochs handled. Fails with `InvalidOperation` while a committer
    /// thread ([`WalSink::spawn_committer`]) runs.
    ///
    /// # Errors
    /// The first sink, commit-store or read error; a panic in the sink comes back as a
    /// permanent sink error ([`SinkError::from_panic`](crate::SinkError::from_panic)), counted
    /// in [`Health::errors`] and shown in [`Health::last_error`] like any other.
    pub fn deliver_ready(&self, sink: &mut dyn Sink) -> Result<usize> {
        committer::deliver_ready(self.shared.clone(), sink)
    }

    /// Starts a committer thread that delivers to `sink` until [`Committer::shutdown`]. Sink
    /// and commit-store errors are retried with exponential backoff and full jitter
    /// ([`Options::retry`](crate::Options::retry)); [`WalSink::health`] shows the last error
    /// and the retry count. A panic in the sink does not stop the thread: it becomes a
    /// permanent sink error ([`SinkError::from_panic`](crate::SinkError::from_panic)), and the
    /// epoch is retried at the longest backoff.
    ///
    /// # Errors
    /// `InvalidOperation` while another deliverer runs; an I/O error if the thread cannot be
    /// started.
    pub fn spawn_committer<S: Sink + 'static>(&self, sink: S) -> Result<Committer> {
        committer::spawn(self.shared.clone(), sink)
    }

    /// Sets the dead-letter log (or, with `None`, removes it): from the next epoch a deliverer
    /// reads on, records it holds for an epoch are left out of it
    /// ([`Epoch::skipped`](crate::Epoch::skipped)), and a record the sink refuses with a
    /// [`SinkErrorClass::Rejected`](crate::SinkErrorClass::Rejected) error naming it
    /// ([`SinkError::at_record`](crate::SinkError::at_record)) is put there durably before the
    /// epoch is delivered again without it (`docs/design.md`, "Dead letters"). Without one, such
    /// an error is retried like a permanent one and nothing is skipped. Set it before the
    /// first delivery, and keep it across restarts: the records it holds stay out of their
    /// epochs only while it is set.
    pub fn set_dead_letters(&self, dead_letters: Option<std::sync::Arc<dyn crate::DeadLetters>>) {
        self.shared.delivery.set_dead_letters(dead_letters);
    }

    /// Takes the right to deliver this log and returns the delivery protocol as steps, for a
    /// driver of its own (an async runtime, a sink that needs its own thread). Fails with
    /// `InvalidOperation` while another deliverer (a committer thread, `deliver_ready`) runs.
    pub fn deliverer(&self) -> Result<Deliverer> {
        Deliverer::claim(self.shared.clone())
    }

    /// Registers `f` to be called whenever the set of deliverable or committed checkpoints
    /// changes, or the log shuts down: a wake-up for waiters that cannot block a thread
    /// (async tasks). `f` runs under an internal lock: it must be quick and must not call
    /// back into the log.
    pub fn on_change(&self, f: impl Fn() + Send + Sync + 'static) {
        self.shared.listeners.lock().push(Box::new(f));
    }

    /// Waits until checkpoint `id` is committed, or `timeout` passes. Returns whether it is.
    /// `Duration::MAX` waits without a deadline.
    pub fn wait_committed(&self, id: u64, timeout: std::time::Duration) -> bool {
        self.shared.wait_committed(id, timeout)
    }

    /// Whether the budget of [`Options::max_backlog_bytes`] has room for an append. With
    /// `wait`, blocks while it is used up and then answers true; without, answers false where
    /// it would block. Fails where waiting cannot help (see [`WalSink::append_batch`]).
    fn budget_room(&self, wait: bool) -> Result<bool> {
        let sh = &*self.shared;
        let limit = sh.opts.max_backlog_bytes;
        if limit == u64::MAX {
            return Ok(true);
        }
        let mut cat = sh.cat.lock();
        loop {
            let backlog = cat.backlog_bytes() + sh.open_bytes.load(Ordering::Relaxed);
            if backlog < limit {
                cat.unblocked();
                return Ok(true);
            }
            if cat.shutdown {
                return Err(ErrorKind::Shutdown.into());
            }
            // Waiting helps only when sealed epochs can be delivered to free space.
            if sh.opts.full_policy == FullPolicy::Reject || cat.epochs.is_empty() {
                return Err(ErrorKind::BacklogFull {
                    backlog_bytes: backlog,
                    limit,
                }
                .into());
            }
            cat.blocked();
            if !wait {
                return Ok(false);
            }
            sh.cat_cv.wait(&mut cat);
        }
    }
}

impl Drop for WalSink {
    fn drop(&mut self) {
        let mut cat = self.shared.cat.lock();
        cat.shutdown = true;
        self.shared.catalog_changed();
    }
}

fn check_poison(w: &Writer) -> Result<()> {
    match &w.poisoned {
        Some(cause) => Err(poisoned_err(cause)),
        None => Ok(()),
    }
}

impl Shared {
    /// Writes one frame, rolling to a new segment first when it does not fit. Any I/O error
    /// poisons the log.
    pub(crate) fn write_frame(
        &self,
        w: &mut MutexGuard<'_, Writer>,
        kind: FrameKind,
        parts: &[&[u8]],
    ) -> Result<Position> {
        let len: usize = parts.iter().map(|p| p.len()).sum();
        if !w.seg.fits(len) {
            let source = {
                let mut cat = self.cat.lock();
                match cat.free.pop() {
                    Some(f) if self.opts.recycle_segments => NewSegment::Recycle(f),
                    Some(f) => {
                        cat.free.push(f);
                        NewSegment::Create
                    }
                    None => NewSegment::Create,
                }
            };
            let next = w.seg.seq() + 1;
            let salt = w.salt_rng.u64(..);
            if let Err(e) = w.seg.roll(source, salt) {
                return Err(self.poison(
                    w,
                    format!("roll to segment {}", format::segment_name(next)),
                    e,
                ));
            }
            self.cat.lock().segments.push_back(next);
        }
        match w.seg.append(kind, parts) {
            Ok(pos) => Ok(pos),
            Err(e) => Err(self.poison(w, "write to the active segment", e)),
        }
    }

    /// Writes data frames for `records` and accounts for them in the open epoch; returns the
    /// position after them.
    fn write_data<'a>(
        &self,
        w: &mut MutexGuard<'_, Writer>,
        records: impl IntoIterator<Item = &'a [u8]>,
    ) -> Result<Position> {
        for r in records {
            let pos = self.write_frame(w, FrameKind::Data, &[r])?;
            w.open_start.get_or_insert(pos);
            w.open_records += 1;
            w.open_bytes += r.len() as u64;
        }
        self.open_bytes.store(w.open_bytes, Ordering::Relaxed);
        Ok(w.seg.position())
    }

    /// Writes the barrier that seals the open epoch as `id`.
    fn write_barrier(
        &self,
        w: &mut MutexGuard<'_, Writer>,
        id: u64,
        metadata: &[u8],
    ) -> Result<()> {
        if w.min_next_id.is_none_or(|min| id < min) {
            return Err(ErrorKind::InvalidCheckpoint {
                id,
                min_allowed: w.min_next_id,
            }
            .into());
        }
        let barrier = format::Barrier {
            checkpoint: id,
            timestamp_ms: now_ms(),
            records: w.open_records,
            durable_through: w.synced,
            metadata,
        };
        let pos = self.write_frame(w, FrameKind::Barrier, &[&barrier.encode_fixed(), metadata])?;
        let info = EpochInfo {
            id,
            timestamp_ms: barrier.timestamp_ms,
            metadata: bytes::Bytes::copy_from_slice(metadata),
            records: w.open_records,
            bytes: w.open_bytes,
            start: w.open_start.unwrap_or(pos),
            barrier: pos,
        };
        w.unsynced.push(info);
        w.min_next_id = id.checked_add(1);
        self.reset_open(w);
        Ok(())
    }

    /// The open epoch is sealed or voided: a new, empty one begins.
    fn reset_open(&self, w: &mut Writer) {
        w.open_start = None;
        w.open_records = 0;
        w.open_bytes = 0;
        self.open_bytes.store(0, Ordering::Relaxed);
    }

    fn poison(&self, w: &mut Writer, context: impl Into<String>, e: std::io::Error) -> Error {
        let err = Error::io(context, e);
        w.poisoned.get_or_insert_with(|| err.to_string());
        self.synced_cv.notify_all();
        err
    }

    /// What the next sync must cover, after sealing the open epoch with an automatic barrier
    /// in durable mode.
    fn prepare_sync(&self, w: &mut MutexGuard<'_, Writer>) -> Result<crate::log::segment::SyncSet> {
        check_poison(w)?;
        if self.opts.mode == Mode::Durable && w.open_records > 0 {
            let Some(id) = w.min_next_id else {
                return Err(ErrorKind::InvalidCheckpoint {
                    id: u64::MAX,
                    min_allowed: None,
                }
                .into());
            };
            self.write_barrier(w, id.max(1), &[])?;
        }
        // One durable appender alone: one write that is durable on return, under the lock
        // (nobody else is there to append meanwhile), instead of a write and a sync.
        if self.opts.mode == Mode::Durable && self.gather.alone() {
            let done = w
                .seg
                .write_through()
                .map_err(|e| self.poison(w, "write to the active segment", e))?;
            if done {
                self.gather.sync_starts();
                return Ok(crate::log::segment::SyncSet::default());
            }
        }
        let set = w
            .seg
            .take_sync_set()
            .map_err(|e| self.poison(w, "write to the active segment", e))?;
        self.gather.sync_starts();
        Ok(set)
    }

    /// Returns once everything before `target` is durable. One sync runs at a time; callers
    /// that arrive during it wait and are served by the next one (group commit). In durable
    /// mode the syncing thread first seals the open epoch with an automatic barrier.
    pub(crate) fn sync_to(&self, target: Position) -> Result<()> {
        let mut w = self.w.lock();
        loop {
            check_poison(&w)?;
            if w.synced >= target {
                return Ok(());
            }
            if w.sync_in_flight {
                self.synced_cv.wait(&mut w);
                continue;
            }
            w.sync_in_flight = true;
            if self.gather.worth_waiting() {
                // Appenders are on their way: let this sync cover them too.
                MutexGuard::unlocked(&mut w, || self.gather.wait_for_writers());
            }
            // Timed from here: a write through in `prepare_sync` is the sync's work.
            let started = std::time::Instant::now();
            let set = match self.prepare_sync(&mut w) {
                Ok(set) => set,
                Err(e) => {
                    w.sync_in_flight = false;
                    self.synced_cv.notify_all();
                    return Err(e);
                }
            };
            let upto = w.seg.position();
            let res = MutexGuard::unlocked(&mut w, || set.sync(&*self.storage));
            self.gather.note_sync(started.elapsed());
            w.sync_in_flight = false;
            if let Err((context, e)) = res {
                let err = self.poison(&mut w, context, e);
                return Err(err);
            }
            w.synced = upto;
            let sealed: Vec<EpochInfo> = {
                let n = w.unsynced.iter().take_while(|e| e.barrier < upto).count();
                w.unsynced.drain(..n).collect()
            };
            if !sealed.is_empty() {
                let mut cat = self.cat.lock();
                let last = sealed.last().map(|e| e.id);
                for e in sealed {
                    cat.seal(e);
                }
                if self.opts.mode == Mode::Durable {
                    if let Some(id) = last {
                        cat.complete(id);
                    }
                }
                self.catalog_changed();
            }
            self.synced_cv.notify_all();
        }
    }
}
