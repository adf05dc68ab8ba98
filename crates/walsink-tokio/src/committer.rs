//! The async committer: the log's delivery protocol ([`walsink::Deliverer`], the same steps
//! the committer thread takes) driven on a tokio runtime into an [`AsyncSink`]. Every step
//! that touches the disk runs on the blocking pool; only the sink's futures run on the
//! runtime.

use crate::AsyncSink;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{watch, Notify};
use tracing::Instrument;
use walsink::{Deliverer, Loaded, Plan, ReadAheadEpoch, Result, SinkError, WalSink};

/// Runs `f` with the deliverer on the blocking pool and hands it back.
async fn blocking<T: Send + 'static>(
    d: Deliverer,
    f: impl FnOnce(&mut Deliverer) -> T + Send + 'static,
) -> (Deliverer, T) {
    tokio::task::spawn_blocking(move || {
        let mut d = d;
        let r = f(&mut d);
        (d, r)
    })
    .await
    .expect("a delivery step on the blocking pool panicked")
}

/// Runs a sink's call with a panic (in making the future or in polling it) turned into
/// [`SinkError::from_panic`]: a panicking sink is counted, shown in `Health` and retried like
/// any permanent error, as by the committer thread, instead of ending the task without a
/// word. The panicked future is not polled again; the sink is called again on the retry, which
/// the sink contract already allows.
async fn guarded<'a, T, F>(call: impl FnOnce() -> F + 'a) -> std::result::Result<T, SinkError>
where
    F: std::future::Future<Output = std::result::Result<T, SinkError>> + 'a,
{
    use std::panic::{catch_unwind, AssertUnwindSafe};
    use std::task::Poll;
    let fut = match catch_unwind(AssertUnwindSafe(call)) {
        Ok(f) => f,
        Err(payload) => return Err(SinkError::from_panic(&*payload)),
    };
    let mut fut = std::pin::pin!(fut);
    std::future::poll_fn(
        move |cx| match catch_unwind(AssertUnwindSafe(|| fut.as_mut().poll(cx))) {
            Ok(p) => p,
            Err(payload) => Poll::Ready(Err(SinkError::from_panic(&*payload))),
        },
    )
    .await
}

/// What one step did.
enum Step {
    Idle,
    Done,
}

/// The epoch after the one being delivered, read on the blocking pool meanwhile, tagged with
/// its checkpoint id ([`Turn::take_ahead`](walsink::Turn::take_ahead)).
type Ahead = Option<(u64, tokio::task::JoinHandle<ReadAheadEpoch>)>;

/// One step of the protocol into an async sink, through the turn API of [`Deliverer`] that
/// the committer thread drives too: every step that touches the disk runs on the blocking
/// pool, and the mark due for the epochs before this one and the read of the next epoch run
/// there beside the sink's call.
async fn step<S: AsyncSink>(
    d: Deliverer,
    sink: &mut S,
    ahead: &mut Ahead,
) -> (Deliverer, Result<Step>) {
    let (d, plan) = blocking(d, |d| d.plan()).await;
    let t = match plan {
        Err(e) => return (d, Err(e)),
        Ok(Plan::Idle) => return (d, Ok(Step::Idle)),
        Ok(Plan::Committed(_)) => return (d, Ok(Step::Done)),
        Ok(Plan::Due(t)) => t,
    };
    if sink.stores_marker() {
        match guarded(|| sink.is_committed(t.pending().key())).await {
            Ok(true) => {
                let (d, r) = blocking(d, move |d| d.skip(t)).await;
                return (d, r.map(|()| Step::Done));
            }
            Ok(false) => {}
            Err(e) => {
                let (d, e) = blocking(d, move |d| d.abandon(t, e.into())).await;
                return (d, Err(e));
            }
        }
    }
    // A read of a later epoch is kept for its turn; any other not taken is dropped (it
    // finishes on its own).
    let mine = match t.take_ahead(ahead) {
        Some(h) => h.await.ok(),
        None => None,
    };
    let (mut d, loaded) = blocking(d, move |d| d.load(t, mine)).await;
    let Loaded {
        epoch,
        mark,
        next,
        landing,
    } = match loaded {
        Ok(l) => l,
        Err(e) => return (d, Err(e)),
    };
    let span = tracing::info_span!(
        "deliver",
        sink_id = %landing.pending().key().sink_id,
        subtask = landing.pending().key().subtask,
        checkpoint = landing.pending().checkpoint(),
        records = landing.pending().records(),
        bytes = landing.pending().bytes(),
    );
    let marking = mark.map(|due| tokio::task::spawn_blocking(move || due.run()));
    if let Some(next) = next {
        let id = next.checkpoint();
        *ahead = Some((id, tokio::task::spawn_blocking(move || next.read())));
    }
    let outcome = if !epoch.goes_to(sink.stores_marker()) {
        Ok(())
    } else {
        guarded(|| sink.deliver(&epoch).instrument(span)).await
    };
    // The sink's outcome is recorded before anything else is awaited: dropped while the mark
    // is still being made, the step must not leave an epoch the sink took uncounted (it would
    // go to the target again without a crash).
    let finished = d.complete(landing, &epoch, outcome);
    // A mark whose task failed is made by a later step, as after a failed mark; one still
    // running when this future is dropped finishes on its own, and a later step marks again.
    let marked = match marking {
        Some(h) => h.await.ok(),
        None => None,
    };
    let mark = marked.map_or(Ok(()), |m| d.marked(m));
    (d, finished.and(mark).map(|()| Step::Done))
}

/// Delivers every deliverable epoch into `sink`, in order, on the calling task, and marks
/// them committed: the async [`WalSink::deliver_ready`]. Stops at the first error and returns
/// it (nothing is skipped; the next call retries the same epoch). Returns the number of
/// epochs handled. While another deliverer holds the log (a committer, or a step of an
/// earlier call that was dropped and is finishing on the blocking pool), it waits up to 2 s
/// for it, then fails with an invalid-operation error.
///
/// # Errors
/// The first sink, commit-store or read error; a panic in the sink's `deliver` or
/// `is_committed` comes back as a permanent sink error
/// ([`SinkError::from_panic`](walsink::SinkError::from_panic)), counted in
/// [`Health::errors`](walsink::Health::errors) and shown in
/// [`Health::last_error`](walsink::Health::last_error); `InvalidOperation` while another
/// deliverer holds the log.
///
/// # Cancel safety
/// Cancel safe in the sense of the sink contract: an epoch whose delivery is dropped
/// half-way is not counted as delivered and is offered again by the next call; epochs
/// delivered before are marked by the next deliverer, never sent again without a crash.
pub async fn deliver_ready<S: AsyncSink>(wal: &Arc<WalSink>, sink: &mut S) -> Result<usize> {
    let mut d = claim(wal).await?;
    let mut n = 0;
    let mut ahead = None;
    loop {
        let (back, r) = step(d, sink, &mut ahead).await;
        d = back;
        match r {
            Ok(Step::Done) => n += 1,
            Ok(Step::Idle) => return Ok(n),
            Err(e) if matches!(e.kind(), walsink::ErrorKind::DeadLettered { .. }) => {
                // The record is in the dead-letter log; the epoch goes again without it.
                tracing::warn!(error = %e, "a record went to the dead-letter log");
                d.note_error(&e, 1);
            }
            Err(e) => {
                d.note_error(&e, 1);
                let _ = blocking(d, |d| d.flush()).await;
                return Err(e);
            }
        }
    }
}

/// How long [`deliver_ready`] waits for a deliverer still held by a step of an earlier,
/// dropped call (it runs to its end on the blocking pool, then gives the right back).
const CLAIM_WAIT: Duration = Duration::from_secs(2);

/// Takes the log's deliverer. A call dropped in the middle of a blocking step leaves that
/// step running on the blocking pool with the deliverer for a moment; the next call waits for
/// it (at most [`CLAIM_WAIT`]) instead of failing as if another deliverer ran.
async fn claim(wal: &Arc<WalSink>) -> Result<Deliverer> {
    let started = std::time::Instant::now();
    loop {
        // Claiming takes a lock and does no I/O, so it runs here, not on the blocking pool.
        match wal.deliverer() {
            Err(e)
                if matches!(e.kind(), walsink::ErrorKind::InvalidOperation { .. })
                    && started.elapsed() < CLAIM_WAIT =>
            {
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
            other => return other,
        }
    }
}

/// A committer task delivering one log into an [`AsyncSink`]; from
/// [`AsyncWal::spawn_committer`](crate::AsyncWal::spawn_committer) or [`spawn_committer`].
///
/// Errors are retried with exponential backoff and full jitter, the same rules as the
/// committer thread's; [`WalSink::health`] shows the last error and the retry count. A panic
/// in the sink's `deliver` or `is_committed` does not end the task: it becomes a permanent
/// sink error ([`SinkError::from_panic`](walsink::SinkError::from_panic)), shown and counted
/// the same way, and the epoch is retried at the longest backoff. Dropping the handle stops
/// the task at the next epoch boundary without waiting for it.
#[derive(Debug)]
pub struct AsyncCommitter {
    stop: watch::Sender<bool>,
    /// Set while an epoch is between `next_step` and `finish`: a stop then cuts it short.
    busy: Arc<std::sync::atomic::AtomicBool>,
    task: Option<tokio::task::JoinHandle<Deliverer>>,
    wal: Arc<WalSink>,
}

/// What [`AsyncCommitter::shutdown`] found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShutdownReport {
    /// True when the committer stopped at an epoch boundary (before the deadline, or idle
    /// when it passed); false when the deadline cut a delivery step short (that epoch is
    /// delivered again later).
    pub clean: bool,
    /// Sealed checkpoints not yet committed when it stopped, oldest first.
    pub pending: Vec<u64>,
    /// The highest committed checkpoint.
    pub committed: Option<u64>,
}

/// Starts a committer task on the current tokio runtime that delivers `wal`'s epochs to
/// `sink` until [`AsyncCommitter::shutdown`]. Fails with `InvalidOperation` while another
/// deliverer runs.
pub fn spawn_committer<S: AsyncSink + 'static>(
    wal: &Arc<WalSink>,
    sink: S,
) -> Result<AsyncCommitter> {
    let d = wal.deliverer()?;
    let wake = Arc::new(Notify::new());
    let w2 = Arc::downgrade(&wake);
    wal.on_change(move || {
        if let Some(w) = w2.upgrade() {
            w.notify_one();
        }
    });
    let (stop, stop_rx) = watch::channel(false);
    let busy = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let task = tokio::spawn(run(d, sink, stop_rx, wake, busy.clone()));
    Ok(AsyncCommitter {
        stop,
        busy,
        task: Some(task),
        wal: wal.clone(),
    })
}

async fn run<S: AsyncSink>(
    mut d: Deliverer,
    mut sink: S,
    mut stop: watch::Receiver<bool>,
    wake: Arc<Notify>,
    busy: Arc<std::sync::atomic::AtomicBool>,
) -> Deliverer {
    use std::sync::atomic::Ordering;
    let mut attempt = 0u32;
    let mut ahead = None;
    while !*stop.borrow() {
        busy.store(true, Ordering::Release);
        let (back, r) = step(d, &mut sink, &mut ahead).await;
        busy.store(false, Ordering::Release);
        d = back;
        match r {
            Ok(Step::Done) => attempt = 0,
            Ok(Step::Idle) => {
                if d.has_work() {
                    continue;
                }
                tokio::select! {
                    _ = wake.notified() => {}
                    _ = stop.changed() => {}
                    _ = tokio::time::sleep(Duration::from_millis(200)) => {}
                }
            }
            Err(e) if matches!(e.kind(), walsink::ErrorKind::DeadLettered { .. }) => {
                // The record is in the dead-letter log; the epoch goes again without it.
                tracing::warn!(error = %e, "a record went to the dead-letter log");
                d.note_error(&e, attempt);
            }
            Err(e) => {
                attempt = attempt.saturating_add(1);
                d.note_error(&e, attempt);
                let delay = d.retry_delay(&e, attempt);
                tracing::warn!(error = %e, attempt, ?delay, "delivery failed; retrying");
                tokio::select! {
                    _ = stop.changed() => {}
                    _ = tokio::time::sleep(delay) => {}
                }
            }
        }
    }
    // A graceful stop marks what was delivered; if that fails, the next deliverer marks it.
    let (d, r) = blocking(d, |d| d.flush()).await;
    if let Err(e) = r {
        d.note_error(&e, attempt.saturating_add(1));
    }
    d
}

impl AsyncCommitter {
    /// Stops at the next epoch boundary, marks what was delivered, and reports what is
    /// still pending. If `deadline` passes first, the delivery in progress is dropped (its
    /// epoch is delivered again later, as the sink contract allows) and `clean` is false;
    /// the epochs delivered before it are still marked by the next deliverer.
    ///
    /// # Cancel safety
    /// If this future is dropped, the committer task still stops at the next epoch
    /// boundary on its own.
    pub async fn shutdown(mut self, deadline: Duration) -> ShutdownReport {
        let _ = self.stop.send(true);
        let mut task = self.task.take().expect("committer task");
        let clean = match tokio::time::timeout(deadline, &mut task).await {
            Ok(Ok(d)) => {
                drop(d);
                true
            }
            Ok(Err(_)) => false,
            Err(_) => {
                // Cut short only if a step was under way; an idle committer (waiting for
                // work or backing off) is at an epoch boundary, and what it delivered is
                // marked by the next deliverer.
                let cut = self.busy.load(std::sync::atomic::Ordering::Acquire);
                task.abort();
                let _ = task.await;
                !cut
            }
        };
        let h = self.wal.health();
        ShutdownReport {
            clean,
            pending: self.wal.pending().iter().map(|p| p.id).collect(),
            committed: h.committed,
        }
    }
}

impl Drop for AsyncCommitter {
    fn drop(&mut self) {
        let _ = self.stop.send(true);
    }
}
