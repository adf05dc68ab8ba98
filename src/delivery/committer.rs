//! The committer: delivers deliverable epochs strictly in checkpoint order to a [`Sink`],
//! records them in the commit store, then frees the segments they occupied.
//!
//! Per epoch (`docs/design.md`, "Delivery"): ask the commit store whether it is committed
//! (a crash after marking but before cleanup), ask a marker-keeping sink the same, deliver,
//! mark, collect garbage. Any error stops at that epoch; it is retried with backoff and never
//! skipped, so a later checkpoint is never committed before an earlier one. A panic in the sink
//! counts as a permanent sink error ([`SinkError::from_panic`]).

use crate::delivery::deliverer::{Deliverer, Loaded, Plan, ReadAheadEpoch};
use crate::delivery::log::DeliveryLog;
use crate::error::{Error, ErrorKind, Result};
use crate::{Sink, SinkError};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

/// Calls into the sink with a panic turned into [`SinkError::from_panic`]: a panicking sink
/// is counted, shown in `Health` and retried like any permanent error, and never unwinds
/// through the committer (which would stop it without a word). The sink is called again after
/// a panic; its contract already requires that a second delivery of an epoch is correct.
fn guarded<T>(
    call: impl FnOnce() -> std::result::Result<T, SinkError>,
) -> std::result::Result<T, SinkError> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(call))
        .unwrap_or_else(|payload| Err(SinkError::from_panic(&*payload)))
}

/// What one step did.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Step {
    /// Nothing is deliverable.
    Idle,
    /// Checkpoint delivered (or found committed already).
    Done(u64),
}

/// A read ahead held between steps, tagged with its checkpoint id ([`Turn::take_ahead`]).
pub(crate) type Ahead = Option<(u64, ReadAheadEpoch)>;

/// One step of the protocol with a blocking sink, through the turn API of [`Deliverer`].
/// While the sink takes an epoch, the mark due for the epochs before it is made, and the next
/// epoch (if deliverable and large enough) is read into `ahead` for the next step, each on a
/// scoped thread.
pub(crate) fn step(d: &mut Deliverer, sink: &mut dyn Sink, ahead: &mut Ahead) -> Result<Step> {
    let t = match d.plan()? {
        Plan::Idle => return Ok(Step::Idle),
        Plan::Committed(id) => return Ok(Step::Done(id)),
        Plan::Due(t) => t,
    };
    let id = t.pending().checkpoint();
    if sink.stores_marker() {
        match guarded(|| sink.is_committed(t.pending().key())) {
            Ok(true) => {
                d.skip(t)?;
                return Ok(Step::Done(id));
            }
            Ok(false) => {}
            Err(e) => return Err(d.abandon(t, e.into())),
        }
    }
    let mine = t.take_ahead(ahead);
    let Loaded {
        epoch,
        mark,
        next,
        landing,
    } = d.load(t, mine)?;
    let _span = tracing::info_span!(
        "deliver",
        sink_id = %landing.pending().key().sink_id,
        subtask = landing.pending().key().subtask,
        checkpoint = id,
        records = landing.pending().records(),
        bytes = landing.pending().bytes(),
    )
    .entered();
    let deliver = |sink: &mut dyn Sink| {
        if !epoch.goes_to(sink.stores_marker()) {
            Ok(())
        } else {
            guarded(|| sink.deliver(&epoch))
        }
    };
    let (outcome, marked) = if next.is_none() && mark.is_none() {
        (deliver(sink), None)
    } else {
        std::thread::scope(|s| {
            let reading = next.and_then(|n| {
                std::thread::Builder::new()
                    .name("walsink-read-ahead".into())
                    .spawn_scoped(s, move || n.read())
                    .ok()
            });
            // A mark that cannot get a thread is not made now; the epochs it covers stay
            // unmarked, as after a failed mark, and a later step marks them.
            let marking = mark.and_then(|due| {
                std::thread::Builder::new()
                    .name("walsink-mark".into())
                    .spawn_scoped(s, move || due.run())
                    .ok()
            });
            let outcome = deliver(sink);
            // A read that failed (or a thread that panicked) is done again in its turn.
            if let Some(r) = reading.and_then(|h| h.join().ok()) {
                *ahead = Some((r.checkpoint(), r));
            }
            let marked = marking.and_then(|h| h.join().ok());
            (outcome, marked)
        })
    };
    drop(_span);
    let finished = d.complete(landing, &epoch, outcome);
    // The mark covers only epochs before this one, whatever the sink said.
    let mark = marked.map_or(Ok(()), |m| d.marked(m));
    finished.and(mark)?;
    Ok(Step::Done(id))
}

/// [`WalSink::deliver_ready`](crate::WalSink::deliver_ready): every deliverable epoch, on the
/// calling thread.
pub(crate) fn deliver_ready(log: Arc<dyn DeliveryLog>, sink: &mut dyn Sink) -> Result<usize> {
    let mut d = Deliverer::claim(log)?;
    let mut n = 0;
    let mut ahead = None;
    loop {
        match step(&mut d, sink, &mut ahead) {
            Ok(Step::Done(_)) => n += 1,
            Ok(Step::Idle) => return Ok(n),
            Err(e) if matches!(e.kind(), ErrorKind::DeadLettered { .. }) => {
                // The record is in the dead-letter log; the epoch goes again without it.
                tracing::warn!(error = %e, "a record went to the dead-letter log");
                d.note_error(&e, 1);
            }
            Err(e) => {
                d.note_error(&e, 1);
                // What succeeded before the error is marked now (the next call retries only
                // the failed epoch); if marking fails too, the next call marks first.
                let _ = d.flush();
                return Err(e);
            }
        }
    }
}

/// [`WalSink::spawn_committer`](crate::WalSink::spawn_committer).
pub(crate) fn spawn<S: Sink + 'static>(log: Arc<dyn DeliveryLog>, sink: S) -> Result<Committer> {
    let name = log.committer_name();
    let d = Deliverer::claim(log.clone())?;
    let stop = Arc::new(AtomicBool::new(false));
    let stop2 = stop.clone();
    let handle = std::thread::Builder::new()
        .name(name)
        .spawn(move || run(d, sink, &stop2))
        .map_err(|e| Error::io("start the committer thread", e))?;
    Ok(Committer {
        log,
        stop,
        handle: Some(handle),
    })
}

fn run<S: Sink>(mut d: Deliverer, mut sink: S, stop: &AtomicBool) {
    let log = d.log().clone();
    let mut attempt = 0u32;
    let mut ahead = None;
    while !stop.load(Ordering::Acquire) {
        match step(&mut d, &mut sink, &mut ahead) {
            Ok(Step::Done(_)) => attempt = 0,
            Ok(Step::Idle) => log.wait_for_epoch(stop, d.delivered(), Duration::from_millis(200)),
            Err(e) if matches!(e.kind(), ErrorKind::DeadLettered { .. }) => {
                tracing::warn!(error = %e, "a record went to the dead-letter log");
                d.note_error(&e, attempt);
            }
            Err(e) => {
                attempt = attempt.saturating_add(1);
                d.note_error(&e, attempt);
                let delay = d.retry_delay(&e, attempt);
                tracing::warn!(error = %e, attempt, ?delay, "delivery failed; retrying");
                log.pause(stop, delay);
            }
        }
    }
    // A graceful stop marks what was delivered; if that fails, the next deliverer marks it.
    if let Err(e) = d.flush() {
        d.note_error(&e, attempt.saturating_add(1));
    }
}

/// A running committer thread. Dropping it stops the thread (after the epoch in progress).
#[derive(Debug)]
pub struct Committer {
    log: Arc<dyn DeliveryLog>,
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
        self.log.wake();
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
