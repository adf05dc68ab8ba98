//! The committer: delivers deliverable epochs strictly in checkpoint order to a [`Sink`],
//! records them in the commit store, then frees the segments they occupied.
//!
//! Per epoch (`docs/design.md`, "Delivery"): ask the commit store whether it is committed
//! (a crash after marking but before cleanup), ask a marker-keeping sink the same, deliver,
//! mark, collect garbage. Any error stops at that epoch; it is retried with backoff and never
//! skipped, so a later checkpoint is never committed before an earlier one.

use crate::delivery::catalog::EpochInfo;
use crate::error::{Error, ErrorKind, Result};
use crate::log::reader;
use crate::wal::{Shared, WalSink};
use crate::{EpochKey, Sink, SinkErrorClass};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

/// Named failpoints, compiled in with the `failpoints` feature: a test arms one with
/// [`fail::arm`] and the committer returns an injected error when it passes it.
#[cfg(feature = "failpoints")]
pub mod fail {
    use parking_lot::Mutex;
    static ARMED: Mutex<Vec<&'static str>> = Mutex::new(Vec::new());

    /// Arms failpoint `name` for one hit. Names: `committer::deliver::after` (after the sink
    /// accepted an epoch, before it is marked), `committer::mark::after` (after the mark,
    /// before segments are freed).
    pub fn arm(name: &'static str) {
        ARMED.lock().push(name);
    }

    pub(crate) fn hit(name: &str) -> bool {
        let mut armed = ARMED.lock();
        match armed.iter().position(|n| *n == name) {
            Some(i) => {
                armed.remove(i);
                true
            }
            None => false,
        }
    }
}

fn failpoint(_name: &str) -> Result<()> {
    #[cfg(feature = "failpoints")]
    if fail::hit(_name) {
        return Err(Error::io(
            format!("failpoint {_name}"),
            std::io::Error::other("injected"),
        ));
    }
    Ok(())
}

/// Delivery progress that survives between steps and between deliverers (it lives in the
/// log's shared state): epochs delivered but not yet marked.
#[derive(Debug, Default)]
pub(crate) struct Delivery {
    delivered: Option<u64>,
    unmarked: usize,
}

/// What one step did.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Step {
    /// Nothing is deliverable.
    Idle,
    /// Checkpoint delivered (or found committed already).
    Done(u64),
}

impl Shared {
    fn key(&self, checkpoint: u64) -> EpochKey {
        EpochKey {
            sink_id: self.sink_id.clone(),
            subtask: self.opts.subtask,
            checkpoint,
        }
    }

    /// Records every checkpoint `<= id` as committed, then frees segments.
    fn mark(&self, d: &mut Delivery, id: u64) -> Result<()> {
        self.store
            .lock()
            .mark_committed(&self.sink_id, self.opts.subtask, id)?;
        d.unmarked = 0;
        {
            let mut cat = self.cat.lock();
            let latency = cat.committed_through(id);
            if latency.is_some() {
                cat.health.last_commit_latency = latency;
            }
            cat.health.retries = 0;
            cat.health.last_error = None;
            self.cat_cv.notify_all();
        }
        failpoint("committer::mark::after")?;
        self.collect_garbage()
    }

    /// Delivers the next deliverable epoch, or marks what was delivered when nothing more is
    /// ready (or `mark_every` is reached).
    pub(crate) fn step(&self, d: &mut Delivery, sink: &mut dyn Sink) -> Result<Step> {
        let next: Option<EpochInfo> = {
            let cat = self.cat.lock();
            cat.epochs
                .iter()
                .find(|e| d.delivered.is_none_or(|x| e.id > x))
                .filter(|e| cat.is_deliverable(e.id))
                .cloned()
        };
        if let Some(done) = d.delivered {
            if d.unmarked > 0 && (next.is_none() || d.unmarked >= self.opts.mark_every) {
                self.mark(d, done)?;
            }
        }
        let Some(e) = next else { return Ok(Step::Idle) };
        let committed = self
            .store
            .lock()
            .last_committed(&self.sink_id, self.opts.subtask)?;
        if committed.is_some_and(|c| c >= e.id) {
            let c = committed.unwrap_or(e.id);
            self.cat.lock().committed_through(c);
            d.delivered = Some(c);
            self.collect_garbage()?;
            return Ok(Step::Done(e.id));
        }
        let key = self.key(e.id);
        if sink.stores_marker() && sink.is_committed(&key)? {
            d.delivered = Some(e.id);
            d.unmarked += 1;
            return Ok(Step::Done(e.id));
        }
        let epoch = reader::load_epoch(
            &self.storage,
            &self.read_pool,
            self.opts.read_chunk_size,
            &e,
            key,
        )?;
        let delivered = if epoch.is_empty() {
            Ok(())
        } else {
            sink.deliver(&epoch)
        };
        // A sink that met a read failure half-way reports its own error (or none): the
        // log's is the one to act on.
        if let Some(failure) = epoch.reader.take_failure() {
            return Err(failure);
        }
        delivered?;
        failpoint("committer::deliver::after")?;
        d.delivered = Some(e.id);
        d.unmarked += 1;
        let mut cat = self.cat.lock();
        cat.health.delivered_epochs += 1;
        cat.health.delivered_records += e.records;
        cat.health.retries = 0;
        cat.health.last_error = None;
        Ok(Step::Done(e.id))
    }

    /// Marks the epochs delivered but not yet marked, if any: before a deliverer stops or
    /// returns an error, so that nothing but a crash sends an epoch twice.
    fn flush_marks(&self, d: &mut Delivery) -> Result<()> {
        match d.delivered {
            Some(done) if d.unmarked > 0 => self.mark(d, done),
            _ => Ok(()),
        }
    }

    fn note_error(&self, e: &Error, attempt: u32) {
        let mut cat = self.cat.lock();
        cat.health.errors += 1;
        cat.health.retries = attempt;
        cat.health.last_error = Some(e.to_string());
    }
}

impl WalSink {
    /// Delivers every epoch that is deliverable now, in order, on the calling thread, and
    /// marks them committed. Stops at the first error and returns it (nothing is skipped; the
    /// next call retries the same epoch). Returns the number of epochs handled. Fails with
    /// `InvalidOperation` while a committer thread ([`WalSink::spawn_committer`]) runs.
    pub fn deliver_ready(&self, sink: &mut dyn Sink) -> Result<usize> {
        let sh = &*self.shared;
        let _claim = Claim::take(&self.shared).ok_or_else(|| {
            Error::invalid_op(
                "a committer thread is delivering this log; shut it down before delivering by hand",
            )
        })?;
        let mut d = sh.delivery.lock();
        let mut n = 0;
        loop {
            match sh.step(&mut d, sink) {
                Ok(Step::Done(_)) => n += 1,
                Ok(Step::Idle) => return Ok(n),
                Err(e) => {
                    sh.note_error(&e, 1);
                    // What succeeded before the error is marked now (the next call retries
                    // only the failed epoch); if marking fails too, the next call marks first.
                    let _ = sh.flush_marks(&mut d);
                    return Err(e);
                }
            }
        }
    }

    /// Starts a committer thread that delivers to `sink` until [`Committer::shutdown`]. Sink
    /// and commit-store errors are retried with exponential backoff and full jitter
    /// ([`Options::retry`](crate::Options::retry)); [`WalSink::health`] shows the last error
    /// and the retry count.
    pub fn spawn_committer<S: Sink + 'static>(&self, sink: S) -> Result<Committer> {
        let claim = Claim::take(&self.shared)
            .ok_or_else(|| Error::invalid_op("a committer is already delivering this log"))?;
        let shared = self.shared.clone();
        let stop = Arc::new(AtomicBool::new(false));
        let stop2 = stop.clone();
        let handle = std::thread::Builder::new()
            .name(format!("walsink-committer-{}", shared.sink_id))
            .spawn(move || {
                let _claim = claim;
                run(shared, sink, stop2)
            })
            .map_err(|e| Error::io("start the committer thread", e))?;
        Ok(Committer {
            shared: self.shared.clone(),
            stop,
            handle: Some(handle),
        })
    }

    /// Waits until checkpoint `id` is committed, or `timeout` passes. Returns whether it is.
    pub fn wait_committed(&self, id: u64, timeout: Duration) -> bool {
        // A timeout too large for the clock (`Duration::MAX`) waits without a deadline.
        let deadline = std::time::Instant::now().checked_add(timeout);
        let sh = &*self.shared;
        let mut cat = sh.cat.lock();
        while cat.committed.is_none_or(|c| c < id) {
            match deadline {
                Some(deadline) => {
                    if sh.cat_cv.wait_until(&mut cat, deadline).timed_out() {
                        return cat.committed.is_some_and(|c| c >= id);
                    }
                }
                None => sh.cat_cv.wait(&mut cat),
            }
        }
        true
    }
}

/// The right to deliver, held by one deliverer at a time and given back on drop.
struct Claim(Arc<Shared>);

impl Claim {
    fn take(shared: &Arc<Shared>) -> Option<Claim> {
        shared
            .delivering
            .compare_exchange(false, true, Ordering::AcqRel, Ordering::Acquire)
            .ok()
            .map(|_| Claim(shared.clone()))
    }
}

impl Drop for Claim {
    fn drop(&mut self) {
        self.0.delivering.store(false, Ordering::Release);
    }
}

fn run<S: Sink>(shared: Arc<Shared>, mut sink: S, stop: Arc<AtomicBool>) {
    let mut d = std::mem::take(&mut *shared.delivery.lock());
    let mut attempt = 0u32;
    let mut rng = fastrand::Rng::new();
    while !stop.load(Ordering::Acquire) {
        match shared.step(&mut d, &mut sink) {
            Ok(Step::Done(_)) => attempt = 0,
            Ok(Step::Idle) => {
                let mut cat = shared.cat.lock();
                if !stop.load(Ordering::Acquire)
                    && !cat
                        .epochs
                        .iter()
                        .any(|e| cat.is_deliverable(e.id) && d.delivered.is_none_or(|x| e.id > x))
                {
                    shared.cat_cv.wait_for(&mut cat, Duration::from_millis(200));
                }
            }
            Err(e) => {
                attempt = attempt.saturating_add(1);
                shared.note_error(&e, attempt);
                let permanent = matches!(e.kind(), ErrorKind::Sink(s) if s.class() == SinkErrorClass::Permanent);
                let delay = if permanent {
                    shared.opts.retry.max
                } else {
                    shared.opts.retry.delay(attempt, &mut rng)
                };
                let mut cat = shared.cat.lock();
                if !stop.load(Ordering::Acquire) {
                    shared.cat_cv.wait_for(&mut cat, delay);
                }
            }
        }
    }
    // A graceful stop marks what was delivered; if that fails, the next deliverer marks it.
    if let Err(e) = shared.flush_marks(&mut d) {
        shared.note_error(&e, attempt.saturating_add(1));
    }
    *shared.delivery.lock() = d;
}

/// A running committer thread. Dropping it stops the thread (after the epoch in progress).
#[derive(Debug)]
pub struct Committer {
    shared: Arc<Shared>,
    stop: Arc<AtomicBool>,
    handle: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for Shared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shared")
            .field("sink_id", &self.sink_id)
            .finish()
    }
}

impl Committer {
    /// Stops the thread after the epoch in progress, marks every epoch it delivered as
    /// committed, and waits for it. Nothing it delivered is sent again without a crash.
    pub fn shutdown(mut self) {
        self.stop_and_join();
    }

    fn stop_and_join(&mut self) {
        self.stop.store(true, Ordering::Release);
        {
            let _cat = self.shared.cat.lock();
            self.shared.cat_cv.notify_all();
        }
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}

impl Drop for Committer {
    fn drop(&mut self) {
        self.stop_and_join();
    }
}
