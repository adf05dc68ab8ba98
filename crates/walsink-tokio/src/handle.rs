//! [`AsyncWal`]: the log handle for tokio programs.
//!
//! Where each call runs:
//! - an append that fits in the log's write buffer is copied there in place (no I/O, no
//!   wait: [`WalSink::try_append_batch`]); one that needs a write to the file, a new
//!   segment or a wait for backlog budget runs on tokio's blocking pool;
//! - in [`Mode::Durable`](walsink::Mode::Durable) the wait for the disk goes to the handle's
//!   I/O thread, which syncs once for every append that reached it in the meantime and
//!   wakes their tasks (group commit without a blocked thread per task);
//! - checkpoints, restores and opening run on the blocking pool.
//!
//! Ordering: a future dropped while its work runs on the blocking pool leaves that work
//! running. So that it cannot land after later calls, every call that starts such work first
//! takes the handle's turn (a [`Gate`] shared by all clones) and hands it to the blocking
//! closure, which gives it back only when the work has ended; a later call on the handle or a
//! clone waits for the turn, and the in-place append path is taken only while no turn is out.
//! A wait for backlog budget happens in async code, without the turn, so a dropped append that
//! was waiting for budget appends nothing and never holds up a restore.
//!
//! `docs/benchmarks.md` has the measurements behind these choices.

use crate::{AsyncCommitter, AsyncSink};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{oneshot, Notify, OwnedMutexGuard};
use walsink::{
    DurablePoint, Error, Health, Options, PendingCheckpoint, RecoveryReport, Result, WalSink,
};

type SyncRequest = (DurablePoint, oneshot::Sender<Result<()>>);

/// The log handle with async methods for tokio programs; cheap to clone (clones share the
/// log).
///
/// No method blocks a runtime worker (see the module docs for where each runs). Each method
/// documents what happens when its future is dropped before it completes.
///
/// # Example
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> walsink::Result<()> {
/// use std::time::Duration;
/// use walsink::{Epoch, Options, SinkError};
/// use walsink_tokio::{AsyncSink, AsyncWal};
///
/// struct Print;
/// impl AsyncSink for Print {
///     async fn deliver(&mut self, epoch: &Epoch) -> Result<(), SinkError> {
///         println!("checkpoint {}: {} records", epoch.checkpoint(), epoch.len());
///         Ok(())
///     }
/// }
///
/// let dir = tempfile::tempdir().unwrap();
/// let (wal, _report) = AsyncWal::open(dir.path(), Options::new("example")).await?;
/// let committer = wal.spawn_committer(Print)?;
/// wal.append_batch(&[b"hello".as_slice(), b"world"]).await?;
/// wal.checkpoint(1, b"offset=2").await?; // durable when this returns
/// wal.checkpoint_complete(1)?;           // the engine says checkpoint 1 is complete
/// assert!(wal.wait_committed(1, Duration::from_secs(10)).await);
/// let report = committer.shutdown(Duration::from_secs(5)).await;
/// assert!(report.clean && report.pending.is_empty());
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct AsyncWal {
    wal: Arc<WalSink>,
    io: Arc<IoThread>,
    gate: Gate,
    changed: Arc<Notify>,
}

/// The order of the calls on one log handle and its clones: the work a call starts on the
/// blocking pool holds a [`Turn`] until it ends, even when the call's future was dropped, and
/// the next call that would start work waits for it.
///
/// Invariant: `busy` is true exactly while a turn is out (set after `lock` is taken, cleared
/// when the turn is given back). The in-place append path reads only `busy`: one relaxed-cost
/// atomic load per append, on a line written only when a call takes a turn.
#[derive(Debug, Clone, Default)]
struct Gate {
    lock: Arc<tokio::sync::Mutex<()>>,
    busy: Arc<AtomicBool>,
}

/// The right to start work on the log's blocking path; see [`Gate`]. Moved into the blocking
/// closure, so it is given back when the work ends, not when the caller's future is dropped.
struct Turn {
    _lock: OwnedMutexGuard<()>,
    busy: Arc<AtomicBool>,
}

impl Gate {
    /// Waits for the turn (cancel safe: a dropped wait takes nothing).
    async fn turn(&self) -> Turn {
        let lock = self.lock.clone().lock_owned().await;
        self.busy.store(true, Ordering::Release);
        Turn {
            _lock: lock,
            busy: self.busy.clone(),
        }
    }

    /// True while work a call started (perhaps one whose future was dropped) may still run.
    fn busy(&self) -> bool {
        self.busy.load(Ordering::Acquire)
    }
}

impl Drop for Turn {
    fn drop(&mut self) {
        // Cleared before the lock is given back: a call that sees `busy` false after this
        // comes after the work, which has ended.
        self.busy.store(false, Ordering::Release);
    }
}

/// The handle's I/O thread for durable appends, started by the first append that waits for
/// the disk (never in checkpointed mode, where appends do not wait for it).
#[derive(Debug, Default)]
struct IoThread {
    state: parking_lot::Mutex<IoState>,
    handle: parking_lot::Mutex<Option<std::thread::JoinHandle<()>>>,
}

#[derive(Debug, Default)]
enum IoState {
    /// Not started yet.
    #[default]
    Idle,
    Running(mpsc::Sender<SyncRequest>),
    /// [`AsyncWal::shutdown`] stopped it; it is not started again.
    Stopped,
}

impl IoThread {
    /// Hands `request` to the thread, starting it first if this is the first one.
    fn send(&self, wal: &Arc<WalSink>, request: SyncRequest) -> Result<()> {
        let mut state = self.state.lock();
        if matches!(*state, IoState::Idle) {
            let (tx, rx) = mpsc::channel::<SyncRequest>();
            let w = wal.clone();
            let handle = std::thread::Builder::new()
                .name(format!("walsink-io-{}", wal.sink_id()))
                .spawn(move || sync_loop(&w, &rx))
                .map_err(|e| Error::io("start the log's I/O thread", e))?;
            *self.handle.lock() = Some(handle);
            *state = IoState::Running(tx);
        }
        match &*state {
            IoState::Running(tx) => tx
                .send(request)
                .map_err(|_| Error::invalid_op("the log's I/O thread has stopped")),
            _ => Err(Error::invalid_op("the log handle was shut down")),
        }
    }

    fn stop(&self) {
        *self.state.lock() = IoState::Stopped;
        if let Some(h) = self.handle.lock().take() {
            let _ = h.join();
        }
    }
}

impl Drop for IoThread {
    fn drop(&mut self) {
        // Closing the channel stops the thread once it answered what it holds.
        *self.state.get_mut() = IoState::Stopped;
    }
}

/// Takes every waiting request, syncs once through the furthest point, answers them all.
///
/// The tasks answered by one sync append again at about the same time, but not at once: a
/// sync started on the first of them would cover one append and leave the rest for the next.
/// So the thread waits briefly (at most [`GATHER`]) for as many requests as the previous
/// sync answered.
fn sync_loop(wal: &WalSink, rx: &mpsc::Receiver<SyncRequest>) {
    const GATHER: Duration = Duration::from_micros(200);
    let mut batch: Vec<SyncRequest> = Vec::new();
    let mut expect = 1;
    while let Ok(first) = rx.recv() {
        batch.push(first);
        batch.extend(rx.try_iter());
        let deadline = std::time::Instant::now() + GATHER;
        while batch.len() < expect {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            match rx.recv_timeout(left) {
                Ok(r) => {
                    batch.push(r);
                    batch.extend(rx.try_iter());
                }
                Err(_) => break,
            }
        }
        expect = batch.len();
        let furthest = batch.iter().map(|(p, _)| *p).max().expect("one request");
        match wal.make_durable(furthest) {
            Ok(()) => {
                for (_, tx) in batch.drain(..) {
                    let _ = tx.send(Ok(()));
                }
            }
            Err(_) => {
                // The log is poisoned now: each waiter gets the error for its own point.
                for (p, tx) in batch.drain(..) {
                    let _ = tx.send(wal.make_durable(p));
                }
            }
        }
    }
}

async fn blocking<T: Send + 'static>(f: impl FnOnce() -> Result<T> + Send + 'static) -> Result<T> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(crate::join_error)?
}

impl AsyncWal {
    /// Opens (or creates) the log in `dir` on the blocking pool; see [`WalSink::open`].
    ///
    /// # Cancel safety
    /// If the future is dropped, the open still finishes on the blocking pool and the log is
    /// closed again; open it anew.
    pub async fn open(dir: impl AsRef<Path>, options: Options) -> Result<(Self, RecoveryReport)> {
        let dir = dir.as_ref().to_path_buf();
        let (wal, report) = blocking(move || WalSink::open(dir, options)).await?;
        Ok((Self::from_sync(wal)?, report))
    }

    /// An async handle for a log opened with the blocking API (for example on a simulated
    /// disk with [`WalSink::open_with_storage`]). Starts no thread: in
    /// [`Mode::Durable`](walsink::Mode::Durable) the handle's I/O thread starts with the
    /// first append that waits for the disk.
    ///
    /// # Errors
    /// None today; the `Result` leaves room for setup that can fail.
    pub fn from_sync(wal: WalSink) -> Result<Self> {
        let wal = Arc::new(wal);
        let changed = Arc::new(Notify::new());
        let c2 = changed.clone();
        wal.on_change(move || c2.notify_waiters());
        Ok(AsyncWal {
            io: Arc::default(),
            gate: Gate::default(),
            wal,
            changed,
        })
    }

    /// The blocking handle underneath, for what has no async form (health, pending, ids).
    /// Calls made through it are not ordered after work that dropped async calls started
    /// (see [`AsyncWal::settle`]).
    pub fn blocking(&self) -> &Arc<WalSink> {
        &self.wal
    }

    /// Appends one record; see [`AsyncWal::append_batch`].
    ///
    /// # Errors
    /// As [`AsyncWal::append_batch`].
    ///
    /// # Cancel safety
    /// As [`AsyncWal::append_batch`].
    pub async fn append(&self, record: &[u8]) -> Result<()> {
        self.append_batch(&[record]).await
    }

    /// Appends records in order (none if one is too large), as [`WalSink::append_batch`]:
    /// in checkpointed mode they are buffered for the next checkpoint; in durable mode this
    /// returns once they are durable, and appends of concurrent tasks share one sync. While
    /// the backlog budget ([`Options::max_backlog_bytes`](walsink::Options::max_backlog_bytes)
    /// with [`FullPolicy::Block`](walsink::FullPolicy::Block)) is used up, it waits on the
    /// task, without holding a thread, until a delivery frees it.
    ///
    /// # Errors
    /// As [`WalSink::append_batch`]: `RecordTooLarge`, `BacklogFull` (with
    /// `FullPolicy::Reject`, or nothing sealed to drain), `Poisoned`, `Shutdown`, an I/O
    /// error; in durable mode `InvalidOperation` after [`AsyncWal::shutdown`].
    ///
    /// # Cancel safety
    /// Not cancel safe, but what a drop leaves is exact:
    /// - dropped while it waits for backlog budget, or for work an earlier dropped call
    ///   started: nothing was appended;
    /// - dropped while its write runs on the blocking pool: the write runs to its end, all
    ///   the records or none (an error) are appended, and every later call on this handle or
    ///   a clone comes after it, so a [`AsyncWal::restore`] made after the drop voids them;
    /// - in durable mode, dropped while it waits for the disk: the records are appended and
    ///   become durable with the next sync (of any append) and are delivered, although the
    ///   caller never saw them acknowledged.
    ///
    /// A stream processor restores from its last checkpoint after such a drop, which voids
    /// what was appended since.
    pub async fn append_batch(&self, records: &[&[u8]]) -> Result<()> {
        // In place only while no work of an earlier call may still run: one atomic load.
        let in_place = if self.gate.busy() {
            None
        } else {
            self.wal.try_append_batch(records)?
        };
        let point = match in_place {
            Some(p) => p,
            None => self.append_in_turn(records).await?,
        };
        if self.wal.mode() != walsink::Mode::Durable {
            return Ok(());
        }
        let (tx, rx) = oneshot::channel();
        self.io.send(&self.wal, (point, tx))?;
        rx.await
            .map_err(|_| Error::invalid_op("the log's I/O thread has stopped"))?
    }

    /// The way of an append that cannot go in place: waits for the turn, appends in place if
    /// it can now, else writes on the blocking pool; while the budget is used up it gives the
    /// turn back and waits for the log to change (a delivery, a restore), then tries again.
    async fn append_in_turn(&self, records: &[&[u8]]) -> Result<walsink::DurablePoint> {
        let mut owned: Option<Arc<Vec<Vec<u8>>>> = None;
        loop {
            // Registered before the budget is looked at, so a change in between still wakes.
            let changed = self.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            let turn = self.gate.turn().await;
            if let Some(p) = self.wal.try_append_batch(records)? {
                return Ok(p);
            }
            let owned = owned
                .get_or_insert_with(|| Arc::new(records.iter().map(|r| r.to_vec()).collect()))
                .clone();
            let wal = self.wal.clone();
            let span = tracing::debug_span!("append_batch", records = owned.len());
            let written = blocking(move || {
                let _turn = turn;
                let _e = span.enter();
                let refs: Vec<&[u8]> = owned.iter().map(|r| r.as_slice()).collect();
                wal.append_batch_within_budget(&refs)
            })
            .await?;
            match written {
                Some(p) => return Ok(p),
                None => changed.await,
            }
        }
    }

    /// Seals the open epoch as checkpoint `id`, durably; see [`WalSink::checkpoint`].
    ///
    /// # Errors
    /// As [`WalSink::checkpoint`]: `InvalidCheckpoint` for an id that does not increase,
    /// `InvalidOperation` in durable mode, a configuration error for metadata over
    /// `max_metadata_size`, `Poisoned` or an I/O error.
    ///
    /// # Cancel safety
    /// Dropped before its work started (while an earlier dropped call's work still ran),
    /// nothing happens. Dropped later, the checkpoint runs to its end on the blocking pool and
    /// seals exactly the records appended before the call (never a half-sealed epoch: recovery
    /// treats a barrier whose sync did not finish as absent, `docs/design.md`); every later
    /// call on this handle or a clone waits for it. Whether it was sealed shows in
    /// [`WalSink::pending`] once any later call on the handle has returned, or after
    /// [`AsyncWal::settle`]; calling `checkpoint` again with the same id then fails with
    /// `InvalidCheckpoint` if it was.
    pub async fn checkpoint(&self, id: u64, metadata: &[u8]) -> Result<()> {
        let wal = self.wal.clone();
        let metadata = metadata.to_vec();
        let turn = self.gate.turn().await;
        blocking(move || {
            let _turn = turn;
            wal.checkpoint(id, &metadata)
        })
        .await
    }

    /// Checkpoint `id` is complete; see [`WalSink::checkpoint_complete`]. Needs no I/O, so
    /// it is not async.
    ///
    /// # Errors
    /// `InvalidOperation` in durable mode.
    pub fn checkpoint_complete(&self, id: u64) -> Result<()> {
        self.wal.checkpoint_complete(id)
    }

    /// The engine restored from checkpoint `id`; see [`WalSink::restore`].
    ///
    /// # Errors
    /// As [`WalSink::restore`]: `InvalidOperation` in durable mode, `Poisoned` or an I/O
    /// error.
    ///
    /// # Cancel safety
    /// Dropped before its work started (while an earlier dropped call's work still ran),
    /// nothing happens. Dropped later, the restore runs to its end on the blocking pool and
    /// voids only what was appended or sealed before the call: every later call on this
    /// handle or a clone waits for it, so an append acknowledged after the drop is never
    /// voided by it.
    pub async fn restore(&self, id: Option<u64>) -> Result<()> {
        let wal = self.wal.clone();
        let turn = self.gate.turn().await;
        blocking(move || {
            let _turn = turn;
            wal.restore(id)
        })
        .await
    }

    /// Waits until the work that earlier calls on this handle or its clones started has
    /// ended, including calls whose futures were dropped: then [`AsyncWal::pending`] and
    /// [`AsyncWal::health`] show its outcome. Every `append`, `checkpoint` and `restore`
    /// waits for the same first.
    ///
    /// # Cancel safety
    /// Cancel safe.
    pub async fn settle(&self) {
        drop(self.gate.turn().await);
    }

    /// Health figures; see [`WalSink::health`]. Needs no I/O.
    pub fn health(&self) -> Health {
        self.wal.health()
    }

    /// Sealed checkpoints not yet committed, oldest first.
    pub fn pending(&self) -> Vec<PendingCheckpoint> {
        self.wal.pending()
    }

    /// Waits until checkpoint `id` is committed, or `timeout` passes; returns whether it is.
    ///
    /// # Cancel safety
    /// Cancel safe.
    pub async fn wait_committed(&self, id: u64, timeout: Duration) -> bool {
        let wait = async {
            loop {
                let changed = self.changed.notified();
                tokio::pin!(changed);
                changed.as_mut().enable();
                if self.wal.health().committed.is_some_and(|c| c >= id) {
                    return;
                }
                changed.await;
            }
        };
        tokio::time::timeout(timeout, wait).await.is_ok()
    }

    /// Starts a committer task on the current runtime delivering into `sink`; see
    /// [`spawn_committer`](crate::spawn_committer).
    pub fn spawn_committer<S: AsyncSink + 'static>(&self, sink: S) -> Result<AsyncCommitter> {
        crate::spawn_committer(&self.wal, sink)
    }

    /// Delivers every deliverable epoch into `sink` on this task; see
    /// [`deliver_ready`](crate::deliver_ready).
    pub async fn deliver_ready<S: AsyncSink>(&self, sink: &mut S) -> Result<usize> {
        crate::deliver_ready(&self.wal, sink).await
    }

    /// Closes the handle: waits for the work earlier calls started (as
    /// [`AsyncWal::settle`]), stops its I/O thread (if durable appends started it) after the
    /// syncs it was asked for, and returns the checkpoints still pending. Clones of the
    /// handle stop working for durable appends; stop a committer first
    /// ([`AsyncCommitter::shutdown`]). The log itself closes when the last clone and
    /// committer are gone.
    ///
    /// # Cancel safety
    /// If dropped while it waits for earlier work, nothing is stopped; if dropped later, the
    /// I/O thread still stops on its own.
    pub async fn shutdown(self) -> Vec<PendingCheckpoint> {
        self.settle().await;
        let io = self.io.clone();
        let _ = tokio::task::spawn_blocking(move || io.stop()).await;
        self.wal.pending()
    }
}
