//! The committer: delivers deliverable epochs strictly in checkpoint order to a [`Sink`],
//! records them in the commit store, then frees the segments they occupied.
//!
//! Per epoch (`docs/design.md`, "Delivery"): ask the commit store whether it is committed
//! (a crash after marking but before cleanup), ask a marker-keeping sink the same, deliver,
//! mark, collect garbage. Any error stops at that epoch; it is retried with backoff and never
//! skipped, so a later checkpoint is never committed before an earlier one.

use crate::error::{Error, ErrorKind, Result};
use crate::wal::Shared;
use crate::{Sink, SinkErrorClass};
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

/// Marks through the last epoch delivered, then frees segments.
fn mark(sh: &Shared, d: &mut Delivery, id: u64) -> Result<()> {
    sh.record_mark(id)?;
    d.unmarked = 0;
    failpoint("committer::mark::after")?;
    sh.collect_garbage()
}

/// Delivers the next deliverable epoch, or marks what was delivered when nothing more is
/// ready (or `mark_every` is reached).
pub(crate) fn step(sh: &Shared, d: &mut Delivery, sink: &mut dyn Sink) -> Result<Step> {
    let next = sh.next_deliverable(d.delivered);
    if let Some(done) = d.delivered {
        if d.unmarked > 0 && (next.is_none() || d.unmarked >= sh.mark_every()) {
            mark(sh, d, done)?;
        }
    }
    let Some(e) = next else { return Ok(Step::Idle) };
    let committed = sh.stored_mark()?;
    if let Some(c) = committed.filter(|&c| c >= e.id) {
        sh.forget_through(c);
        d.delivered = Some(c);
        sh.collect_garbage()?;
        return Ok(Step::Done(e.id));
    }
    if sink.stores_marker() && sink.is_committed(&sh.epoch_key(e.id))? {
        d.delivered = Some(e.id);
        d.unmarked += 1;
        return Ok(Step::Done(e.id));
    }
    let epoch = sh.read_epoch(&e)?;
    let delivered = if epoch.is_empty() {
        Ok(())
    } else {
        sink.deliver(&epoch)
    };
    // A sink that met a read failure half-way reports its own error (or none): the log's is
    // the one to act on.
    if let Some(failure) = epoch.reader.take_failure() {
        return Err(failure);
    }
    delivered?;
    failpoint("committer::deliver::after")?;
    d.delivered = Some(e.id);
    d.unmarked += 1;
    sh.note_delivered(e.records);
    Ok(Step::Done(e.id))
}

/// Marks the epochs delivered but not yet marked, if any: before a deliverer stops or returns
/// an error, so that nothing but a crash sends an epoch twice.
fn flush_marks(sh: &Shared, d: &mut Delivery) -> Result<()> {
    match d.delivered {
        Some(done) if d.unmarked > 0 => mark(sh, d, done),
        _ => Ok(()),
    }
}

/// [`WalSink::deliver_ready`](crate::WalSink::deliver_ready): every deliverable epoch, on the
/// calling thread.
pub(crate) fn deliver_ready(shared: &Arc<Shared>, sink: &mut dyn Sink) -> Result<usize> {
    let _claim = Claim::take(shared).ok_or_else(|| {
        Error::invalid_op(
            "a committer thread is delivering this log; shut it down before delivering by hand",
        )
    })?;
    let mut d = shared.delivery();
    let mut n = 0;
    loop {
        match step(shared, &mut d, sink) {
            Ok(Step::Done(_)) => n += 1,
            Ok(Step::Idle) => return Ok(n),
            Err(e) => {
                shared.note_error(&e, 1);
                // What succeeded before the error is marked now (the next call retries only
                // the failed epoch); if marking fails too, the next call marks first.
                let _ = flush_marks(shared, &mut d);
                return Err(e);
            }
        }
    }
}

/// [`WalSink::spawn_committer`](crate::WalSink::spawn_committer).
pub(crate) fn spawn<S: Sink + 'static>(shared: &Arc<Shared>, sink: S) -> Result<Committer> {
    let claim = Claim::take(shared)
        .ok_or_else(|| Error::invalid_op("a committer is already delivering this log"))?;
    let stop = Arc::new(AtomicBool::new(false));
    let stop2 = stop.clone();
    let shared2 = shared.clone();
    let handle = std::thread::Builder::new()
        .name(shared.committer_name())
        .spawn(move || {
            let _claim = claim;
            run(&shared2, sink, &stop2)
        })
        .map_err(|e| Error::io("start the committer thread", e))?;
    Ok(Committer {
        shared: shared.clone(),
        stop,
        handle: Some(handle),
    })
}

/// The right to deliver, held by one deliverer at a time and given back on drop.
struct Claim(Arc<Shared>);

impl Claim {
    fn take(shared: &Arc<Shared>) -> Option<Claim> {
        shared.try_claim().then(|| Claim(shared.clone()))
    }
}

impl Drop for Claim {
    fn drop(&mut self) {
        self.0.release_claim();
    }
}

fn run<S: Sink>(shared: &Shared, mut sink: S, stop: &AtomicBool) {
    let mut d = std::mem::take(&mut *shared.delivery());
    let mut attempt = 0u32;
    let mut rng = fastrand::Rng::new();
    while !stop.load(Ordering::Acquire) {
        match step(shared, &mut d, &mut sink) {
            Ok(Step::Done(_)) => attempt = 0,
            Ok(Step::Idle) => shared.wait_for_epoch(stop, d.delivered, Duration::from_millis(200)),
            Err(e) => {
                attempt = attempt.saturating_add(1);
                shared.note_error(&e, attempt);
                let permanent = matches!(e.kind(), ErrorKind::Sink(s) if s.class() == SinkErrorClass::Permanent);
                let retry = shared.retry_policy();
                let delay = if permanent {
                    retry.max
                } else {
                    retry.delay(attempt, &mut rng)
                };
                shared.pause(stop, delay);
            }
        }
    }
    // A graceful stop marks what was delivered; if that fails, the next deliverer marks it.
    if let Err(e) = flush_marks(shared, &mut d) {
        shared.note_error(&e, attempt.saturating_add(1));
    }
    *shared.delivery() = d;
}

/// A running committer thread. Dropping it stops the thread (after the epoch in progress).
#[derive(Debug)]
pub struct Committer {
    shared: Arc<Shared>,
    stop: Arc<AtomicBool>,
    handle: Option<JoinHandle<()>>,
}

impl Committer {
    /// Stops the thread after the epoch in progress, marks every epoch it delivered as
    /// committed, and waits for it. Nothing it delivered is sent again without a crash.
    pub fn shutdown(mut self) {
        self.stop_and_join();
    }

    fn stop_and_join(&mut self) {
        self.stop.store(true, Ordering::Release);
        self.shared.wake();
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
