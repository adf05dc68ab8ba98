//! Stopping `pipe` and `cdc` on SIGINT and SIGTERM, gracefully the first time and at once
//! the second.
//!
//! [`install`] registers the handlers through `signal-hook`: the first SIGINT or SIGTERM only
//! sets a flag, which the reading loops poll between lines ([`requested`]); a second one
//! (of either kind) ends the process at once from the handler, with exit code 130 (SIGINT)
//! or 143 (SIGTERM). What a graceful stop does is up to the command (`pipe`: stop reading,
//! checkpoint what was read, deliver it within `--stop-timeout`, print the summary, exit 3).
//!
//! Standard input is read through [`StdinReader`], which waits for data with `poll(2)` and
//! hands control back every 100 ms without data, so a stop is seen (and what was read is
//! checkpointed) even while no line arrives; after a stop it reads nothing more: bytes still
//! in the stream stay there, and every complete line it took was handed out (the start of a
//! line whose newline had not arrived at the stop is dropped with the process).

use std::fs::File;
use std::io::Read;
use std::mem::ManuallyDrop;
use std::os::fd::{AsRawFd, FromRawFd};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

/// Exit code of a run that stopped gracefully after a signal.
pub const EXIT_STOPPED: u8 = 3;

/// Set by the first SIGINT or SIGTERM; arms the immediate exit for the second.
static STOPPING: AtomicBool = AtomicBool::new(false);
/// The number of the signal that asked for the stop (0: none).
static SIGNAL: AtomicUsize = AtomicUsize::new(0);

/// A signal that stops a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Signal {
    /// SIGINT (Ctrl-C).
    Int,
    /// SIGTERM (`kill`, a service manager).
    Term,
}

impl Signal {
    /// `SIGINT` or `SIGTERM`.
    pub fn name(self) -> &'static str {
        match self {
            Signal::Int => "SIGINT",
            Signal::Term => "SIGTERM",
        }
    }
}

/// Installs the handlers of SIGINT and SIGTERM (see the module docs).
///
/// # Errors
///
/// When a handler cannot be registered (the operating system refused it).
pub fn install() -> std::io::Result<()> {
    use signal_hook::consts::{SIGINT, SIGTERM};
    use signal_hook::flag;
    for (sig, code) in [(SIGINT, 130), (SIGTERM, 143)] {
        // The order matters: the exit checks the flag before this signal sets it.
        flag::register_conditional_shutdown(sig, code, &STOPPING)?;
        flag::register_usize(sig, &SIGNAL, sig as usize)?;
        flag::register(sig, &STOPPING)?;
    }
    Ok(())
}

/// The signal that asked the run to stop, if one did.
pub fn requested() -> Option<Signal> {
    if !STOPPING.load(Ordering::Relaxed) {
        return None;
    }
    match SIGNAL.load(Ordering::SeqCst) as i32 {
        signal_hook::consts::SIGINT => Some(Signal::Int),
        _ => Some(Signal::Term),
    }
}

/// The error [`StdinReader`] returns once a stop was requested.
#[derive(Debug)]
pub struct Stopped;

impl std::fmt::Display for Stopped {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("stopped by a signal")
    }
}

impl std::error::Error for Stopped {}

/// Whether `e` is [`StdinReader`]'s "stopped" error.
pub fn is_stopped(e: &std::io::Error) -> bool {
    e.get_ref().is_some_and(|inner| inner.is::<Stopped>())
}

/// The error [`StdinReader`] returns when no data came for 100 ms: the caller gets a turn
/// (to checkpoint what it read, report progress) and reads again; nothing was consumed.
#[derive(Debug)]
pub struct Waiting;

impl std::fmt::Display for Waiting {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("no data on standard input yet")
    }
}

impl std::error::Error for Waiting {}

/// Whether `e` is [`StdinReader`]'s "no data yet" error.
pub fn is_waiting(e: &std::io::Error) -> bool {
    e.get_ref().is_some_and(|inner| inner.is::<Waiting>())
}

/// Standard input read directly from descriptor 0 (no buffer of its own, so `poll` tells the
/// truth about what is left). A read waits at most 100 ms for data, then fails with
/// [`Waiting`] (see [`is_waiting`]), and fails with [`Stopped`] once a stop was requested.
pub struct StdinReader {
    fd: ManuallyDrop<File>,
}

impl StdinReader {
    /// The reader of this process's standard input.
    pub fn new() -> StdinReader {
        // SAFETY: descriptor 0 stays open for the life of the process, and ManuallyDrop
        // keeps this File from closing it.
        let fd = ManuallyDrop::new(unsafe { File::from_raw_fd(0) });
        StdinReader { fd }
    }
}

impl Read for StdinReader {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        loop {
            if requested().is_some() {
                return Err(std::io::Error::other(Stopped));
            }
            let mut pfd = libc::pollfd {
                fd: self.fd.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            };
            // SAFETY: one valid pollfd, for the duration of the call.
            let n = unsafe { libc::poll(&mut pfd, 1, 100) };
            if n < 0 {
                let e = std::io::Error::last_os_error();
                if e.kind() == std::io::ErrorKind::Interrupted {
                    continue;
                }
                return Err(e);
            }
            if n > 0 {
                // Readable, at its end, or in error: read tells which.
                return self.fd.read(buf);
            }
            return Err(std::io::Error::other(Waiting));
        }
    }
}
