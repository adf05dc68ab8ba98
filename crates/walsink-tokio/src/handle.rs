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
//! `docs/benchmarks.md` has the measurements behind these choices.

use crate::{AsyncCommitter, AsyncSink};
use std::path::Path;
use std::sync::mpsc;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{oneshot, Notify};
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
    changed: Arc<Notify>,
}

#[derive(Debug)]
struct IoThread {
    tx: parking_lot::Mutex<Option<mpsc::Sender<SyncRequest>>>,
    handle: parking_lot::Mutex<Option<std::thread::JoinHandle<()>>>,
}

impl IoThread {
    fn start(wal: Arc<WalSink>) -> Result<IoThread> {
        let (tx, rx) = mpsc::channel::<SyncRequest>();
        let handle = std::thread::Builder::new()
            .name(format!("walsink-io-{}", wal.sink_id()))
            .spawn(move || sync_loop(&wal, &rx))
            .map_err(|e| Error::io("start the log's I/O thread", e))?;
        Ok(IoThread {
            tx: parking_lot::Mutex::new(Some(tx)),
            handle: parking_lot::Mutex::new(Some(handle)),
        })
    }

    fn stop(&self) {
        self.tx.lock().take();
        if let Some(h) = self.handle.lock().take() {
            let _ = h.join();
        }
    }
}

impl Drop for IoThread {
    fn drop(&mut self) {
        self.tx.lock().take();
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
    /// disk with [`WalSink::open_with_storage`]).
    pub fn from_sync(wal: WalSink) -> Result<Self> {
        let wal = Arc::new(wal);
        let changed = Arc::new(Notify::new());
        let c2 = changed.clone();
        wal.on_change(move || c2.notify_waiters());
        Ok(AsyncWal {
            io: Arc::new(IoThread::start(wal.clone())?),
            wal,
            changed,
        })
    }

    /// The blocking handle underneath, for what has no async form (health, pending, ids).
    pub fn blocking(&self) -> &Arc<WalSink> {
        &self.wal
    }

    /// Appends one record; see [`AsyncWal::append_batch`].
    ///
    /// # Cancel safety
    /// As [`AsyncWal::append_batch`].
    pub async fn append(&self, record: &[u8]) -> Result<()> {
        self.append_batch(&[record]).await
    }

    /// Appends records in order (none if one is too large), as [`WalSink::append_batch`]:
    /// in checkpointed mode they are buffered for the next checkpoint; in durable mode this
    /// returns once they are durable, and appends of concurrent tasks share one sync.
    ///
    /// # Cancel safety
    /// Not cancel safe. A dropped future may have appended the records or not; in durable
    /// mode, records appended by a dropped future become durable with the next sync (of any
    /// append) and are delivered, although the caller never saw them acknowledged. A stream
    /// processor restores from its last checkpoint after such a drop, which voids what was
    /// appended since.
    pub async fn append_batch(&self, records: &[&[u8]]) -> Result<()> {
        let point = match self.wal.try_append_batch(records)? {
            Some(p) => p,
            None => {
                let owned: Vec<Vec<u8>> = records.iter().map(|r| r.to_vec()).collect();
                let wal = self.wal.clone();
                let span = tracing::debug_span!("append_batch", records = owned.len());
                blocking(move || {
                    let _e = span.enter();
                    let refs: Vec<&[u8]> = owned.iter().map(|r| r.as_slice()).collect();
                    wal.append_batch_unsynced(&refs)
                })
                .await?
            }
        };
        if self.wal.mode() != walsink::Mode::Durable {
            return Ok(());
        }
        let (tx, rx) = oneshot::channel();
        {
            let sender = self.io.tx.lock();
            let Some(sender) = sender.as_ref() else {
                return Err(Error::invalid_op("the log handle was shut down"));
            };
            sender
                .send((point, tx))
                .map_err(|_| Error::invalid_op("the log's I/O thread has stopped"))?;
        }
        rx.await
            .map_err(|_| Error::invalid_op("the log's I/O thread has stopped"))?
    }

    /// Seals the open epoch as checkpoint `id`, durably; see [`WalSink::checkpoint`].
    ///
    /// # Cancel safety
    /// A dropped future never leaves a half-sealed epoch: the checkpoint runs to its end on
    /// the blocking pool, and recovery treats a barrier whose sync did not finish as absent
    /// (`docs/design.md`). Whether it was sealed shows in [`WalSink::pending`]; calling
    /// `checkpoint` again with the same id then fails with `InvalidCheckpoint`.
    pub async fn checkpoint(&self, id: u64, metadata: &[u8]) -> Result<()> {
        let wal = self.wal.clone();
        let metadata = metadata.to_vec();
        blocking(move || wal.checkpoint(id, &metadata)).await
    }

    /// Checkpoint `id` is complete; see [`WalSink::checkpoint_complete`]. Needs no I/O, so
    /// it is not async.
    pub fn checkpoint_complete(&self, id: u64) -> Result<()> {
        self.wal.checkpoint_complete(id)
    }

    /// The engine restored from checkpoint `id`; see [`WalSink::restore`].
    ///
    /// # Cancel safety
    /// The restore runs to its end on the blocking pool even if the future is dropped.
    pub async fn restore(&self, id: Option<u64>) -> Result<()> {
        let wal = self.wal.clone();
        blocking(move || wal.restore(id)).await
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

    /// Closes the handle: stops its I/O thread after the syncs it was asked for, and
    /// returns the checkpoints still pending. Clones of the handle stop working for durable
    /// appends; stop a committer first ([`AsyncCommitter::shutdown`]). The log itself closes
    /// when the last clone and committer are gone.
    ///
    /// # Cancel safety
    /// If dropped, the I/O thread still stops on its own.
    pub async fn shutdown(self) -> Vec<PendingCheckpoint> {
        let io = self.io.clone();
        let _ = tokio::task::spawn_blocking(move || io.stop()).await;
        self.wal.pending()
    }
}
