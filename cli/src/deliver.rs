//! `pipe`'s sinks and the watch over their failures: when to give up on a target, and a
//! closed standard output.
//!
//! The stdout sink commits an epoch only once its reader took every byte of it: when standard
//! output is a pipe, a write only fills the pipe's buffer, so after writing an epoch the sink
//! waits until the buffer is empty (`FIONREAD`), and a reader that closes the pipe first
//! (`| head -3`) fails the epoch. Such an epoch is not committed: the next run prints it again
//! from its first record.

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
    /// The class of the most recent error.
    pub last_class: Option<SinkErrorClass>,
    /// The target's own code for the most recent error (SQLSTATE, error number, HTTP status).
    pub last_code: Option<String>,
    /// Standard output was closed by its reader.
    pub stdout_closed: bool,
    /// A dead-letter log is set: a rejection that names its record goes there and is not a
    /// failed attempt.
    pub dead_letters: bool,
    /// The dead-letter log is full (`--max-dead-letters`): what it refused.
    pub dead_letter_limit: Option<String>,
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
    /// SIGINT or SIGTERM asked the run to stop (see `stop`).
    Signal(crate::stop::Signal),
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
    if let Some(full) = &w.dead_letter_limit {
        return Some(Stop::GaveUp(format!(
            "delivery to {target} stopped: {full}"
        )));
    }
    let err = w.last_error.as_deref().unwrap_or("unknown error");
    if w.last_class == Some(SinkErrorClass::Fenced) {
        // Another log took the shard over (or this log was started again elsewhere): nothing
        // was written, and no retry can help.
        return Some(Stop::GaveUp(format!(
            "delivery to {target} was fenced: {err}"
        )));
    }
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
                w.last_class = None;
                w.last_code = None;
            }
            Err(e) => {
                w.failing_since.get_or_insert_with(Instant::now);
                let dead_lettered =
                    w.dead_letters && e.class() == SinkErrorClass::Rejected && e.record().is_some();
                if dead_lettered {
                    // Not a failure: the record goes to the dead-letter log and the
                    // checkpoint again at once without it.
                    return r;
                }
                w.attempts += 1;
                if matches!(
                    e.class(),
                    SinkErrorClass::Permanent | SinkErrorClass::Rejected
                ) {
                    w.permanent += 1;
                }
                w.last_error = Some(e.to_string());
                w.last_class = Some(e.class());
                w.last_code = e.code().map(str::to_owned);
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
/// and the commit mark prints the epoch again, and so does a reader that leaves in the middle
/// of an epoch: the epoch is committed only once a pipe's reader took all of it). A closed
/// output stops delivery for good.
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
            out.flush()?;
            wait_until_read()
        })();
        match r {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => {
                self.watch
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .stdout_closed = true;
                Err(SinkError::permanent(
                    "standard output was closed by its reader before it read the whole epoch",
                )
                .with_source(e))
            }
            Err(e) => {
                Err(SinkError::retryable(format!("write to standard output: {e}")).with_source(e))
            }
        }
    }
}

/// When standard output is a pipe: waits until its reader has taken every byte written to it,
/// or fails with `BrokenPipe` when the reader closed it with bytes unread. Other kinds of
/// output (a file, a terminal, a socket) hold what was written once the write returned.
fn wait_until_read() -> std::io::Result<()> {
    use std::os::fd::FromRawFd;
    use std::os::unix::fs::FileTypeExt;
    // SAFETY: descriptor 1 stays open for the life of the process; ManuallyDrop keeps this
    // File from closing it.
    let stdout = std::mem::ManuallyDrop::new(unsafe { std::fs::File::from_raw_fd(1) });
    if !stdout.metadata().is_ok_and(|m| m.file_type().is_fifo()) {
        return Ok(());
    }
    let mut wait_ms = 1;
    loop {
        let mut unread: libc::c_int = 0;
        // SAFETY: FIONREAD writes one c_int, the size of the pipe's unread contents.
        if unsafe { libc::ioctl(1, libc::FIONREAD, &mut unread) } < 0 || unread <= 0 {
            // Read through (or a pipe that cannot tell: the write is all there is to go on).
            return Ok(());
        }
        // No events asked for: poll wakes on POLLERR, which a pipe reports to its writer once
        // its last reader is gone.
        let mut pfd = libc::pollfd {
            fd: 1,
            events: 0,
            revents: 0,
        };
        // SAFETY: one valid pollfd, for the duration of the call.
        let n = unsafe { libc::poll(&mut pfd, 1, wait_ms) };
        if n > 0 && pfd.revents & (libc::POLLERR | libc::POLLHUP) != 0 {
            return Err(std::io::ErrorKind::BrokenPipe.into());
        }
        wait_ms = (wait_ms * 2).min(50);
    }
}

/// `pipe --dead-letter`'s log: a [`walsink::DirDeadLetters`] whose limit, once reached, stops
/// the run (the watch says so) instead of retrying for ever.
#[derive(Debug)]
pub struct DeadLetterLog {
    inner: walsink::DirDeadLetters,
    watch: Watch,
}

impl DeadLetterLog {
    /// Opens `spec` (`dir:PATH`) for `sink_id`'s shard 0, at most `limit` letters.
    pub fn open(
        spec: &str,
        wal: &std::path::Path,
        sink_id: &str,
        limit: Option<u64>,
        watch: Watch,
    ) -> Result<DeadLetterLog, String> {
        let Some(path) = spec.strip_prefix("dir:").filter(|p| !p.is_empty()) else {
            return Err(format!(
                "--dead-letter {spec}: give a directory as dir:PATH (the only kind of dead-letter log this build has)"
            ));
        };
        let same = |a: &std::path::Path, b: &std::path::Path| {
            a == b || matches!((a.canonicalize(), b.canonicalize()), (Ok(x), Ok(y)) if x == y)
        };
        if same(std::path::Path::new(path), wal) {
            return Err(format!(
                "--dead-letter {spec}: that is the --wal directory; give the dead-letter log a directory of its own"
            ));
        }
        if std::path::Path::new(path).exists() && !std::path::Path::new(path).is_dir() {
            return Err(format!("--dead-letter {spec}: not a directory"));
        }
        let mut inner = walsink::DirDeadLetters::open(path, sink_id, 0)
            .map_err(|e| format!("--dead-letter {spec}: {e}"))?;
        if let Some(n) = limit {
            inner = inner.with_limit(n);
        }
        watch.lock().unwrap_or_else(|p| p.into_inner()).dead_letters = true;
        Ok(DeadLetterLog { inner, watch })
    }

    /// Letters in the log's file (this run's and earlier runs').
    pub fn len(&self) -> u64 {
        self.inner.len()
    }
}

impl walsink::DeadLetters for DeadLetterLog {
    fn held(&self, key: &EpochKey) -> walsink::Result<Vec<(u64, u64)>> {
        self.inner.held(key)
    }
    fn put(&self, letter: walsink::DeadLetter) -> walsink::Result<()> {
        let r = self.inner.put(letter);
        if let Err(e) = &r {
            let mut w = self.watch.lock().unwrap_or_else(|p| p.into_inner());
            if let walsink::ErrorKind::DeadLetterLimit { limit, .. } = e.kind() {
                w.dead_letter_limit = Some(format!("{e} (--max-dead-letters {limit})"));
            } else {
                // The target is not at fault: say where the failure is, for the progress line
                // and for giving up (--retry-deadline).
                w.failing_since.get_or_insert_with(Instant::now);
                w.attempts += 1;
                w.last_error = Some(format!(
                    "the dead-letter log in {} cannot take a refused record: {e}",
                    self.inner.dir().display()
                ));
                w.last_class = None;
                w.last_code = None;
            }
        }
        r
    }
}
