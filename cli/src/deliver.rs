//! `pipe`'s sinks and the watch over their failures: when to give up on a target, and a
//! closed standard output.

use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use walsink::{Epoch, EpochKey, Sink, SinkError, SinkErrorClass};

/// Failures of the current epoch, shared between the committer thread and `pipe`'s loop.
#[derive(Debug, Default)]
pub struct WatchState {
    /// When the epoch now failing first failed.
    pub failing_since: Option<Instant>,
    /// Consecutive failed attempts with a permanent error.
    pub permanent: u32,
    /// Consecutive failed attempts of any kind.
    pub attempts: u32,
    /// The most recent error.
    pub last_error: Option<String>,
    /// Standard output was closed by its reader.
    pub stdout_closed: bool,
}

/// Shared handle on [`WatchState`].
pub type Watch = Arc<Mutex<WatchState>>;

/// Why delivery cannot go on.
#[derive(Debug, PartialEq, Eq)]
pub enum Stop {
    /// The reader of standard output went away.
    StdoutClosed,
    /// Retries are used up; the message says why.
    GaveUp(String),
}

/// Limits on retrying a failing target.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Retries after a failure with a permanent error before giving up (attempts: one more).
    pub max_retries: u32,
    /// Time one epoch may keep failing, whatever the error, before giving up.
    pub deadline: Option<Duration>,
}

/// Whether delivery must stop, and why.
pub fn check(watch: &Watch, limits: Limits, target: &str) -> Option<Stop> {
    let w = watch.lock().unwrap_or_else(|p| p.into_inner());
    if w.stdout_closed {
        return Some(Stop::StdoutClosed);
    }
    let err = w.last_error.as_deref().unwrap_or("unknown error");
    if w.permanent > limits.max_retries {
        return Some(Stop::GaveUp(format!(
            "delivery to {target} failed {} times with a permanent error (--max-retries {}): {err}",
            w.attempts, limits.max_retries
        )));
    }
    if let (Some(since), Some(deadline)) = (w.failing_since, limits.deadline) {
        if since.elapsed() >= deadline {
            return Some(Stop::GaveUp(format!(
                "delivery to {target} kept failing for {} (--retry-deadline): {err}",
                humantime::format_duration(Duration::from_secs(since.elapsed().as_secs()))
            )));
        }
    }
    None
}

/// A sink with its failures recorded in a [`Watch`].
pub struct Watched<S> {
    inner: S,
    watch: Watch,
}

impl<S: Sink> Watched<S> {
    /// Wraps `inner`.
    pub fn new(inner: S, watch: Watch) -> Self {
        Watched { inner, watch }
    }

    fn note<T>(&self, r: Result<T, SinkError>) -> Result<T, SinkError> {
        let mut w = self.watch.lock().unwrap_or_else(|p| p.into_inner());
        match &r {
            Ok(_) => {
                w.failing_since = None;
                w.permanent = 0;
                w.attempts = 0;
                w.last_error = None;
            }
            Err(e) => {
                w.failing_since.get_or_insert_with(Instant::now);
                w.attempts += 1;
                if e.class() == SinkErrorClass::Permanent {
                    w.permanent += 1;
                }
                w.last_error = Some(e.to_string());
            }
        }
        r
    }
}

impl<S: Sink> Sink for Watched<S> {
    fn deliver(&mut self, epoch: &Epoch) -> Result<(), SinkError> {
        let r = self.inner.deliver(epoch);
        self.note(r)
    }
    fn stores_marker(&self) -> bool {
        self.inner.stores_marker()
    }
    fn is_committed(&mut self, key: &EpochKey) -> Result<bool, SinkError> {
        // The committer asks before every attempt: an answer says nothing about whether the
        // delivery itself now works, so only a failure counts (a success here must not reset
        // a failing epoch's streak, or a marker target would never be given up on).
        let r = self.inner.is_committed(key);
        match r {
            Ok(v) => Ok(v),
            Err(e) => self.note(Err(e)),
        }
    }
}

/// Writes each record as a line to standard output: at-least-once (a crash between the write
/// and the commit mark prints the epoch again). A closed output stops delivery for good.
pub struct StdoutSink {
    /// Shared with the [`Watched`] wrapper, to say that the output is gone.
    pub watch: Watch,
}

impl Sink for StdoutSink {
    fn deliver(&mut self, epoch: &Epoch) -> Result<(), SinkError> {
        let out = std::io::stdout();
        let mut out = std::io::BufWriter::new(out.lock());
        let r = (|| {
            for r in epoch.records() {
                let r = r.map_err(std::io::Error::other)?;
                out.write_all(&r.data)?;
                out.write_all(b"\n")?;
            }
            out.flush()
        })();
        match r {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => {
                self.watch
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .stdout_closed = true;
                Err(SinkError::permanent("standard output was closed by its reader").with_source(e))
            }
            Err(e) => {
                Err(SinkError::retryable(format!("write to standard output: {e}")).with_source(e))
            }
        }
    }
}
