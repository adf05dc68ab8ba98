//! [`BlockingSink`]: an [`AsyncSink`] used where a blocking [`Sink`] is expected (the
//! committer thread, `deliver_ready`, the command-line tool).

use crate::AsyncSink;
use walsink::{Epoch, EpochKey, Sink, SinkError};

/// Wraps an [`AsyncSink`] as a blocking [`Sink`], driving its futures on a tokio runtime.
///
/// The sink's calls run on the calling thread (the committer thread), which blocks on them;
/// so it must not be a runtime worker: called from inside a runtime, `deliver` and
/// `is_committed` fail with a permanent [`SinkError`] saying so (nothing is delivered, and
/// the epoch stays pending). tokio refuses such a call with a panic that the wrapper catches
/// (tokio gives no way to tell a worker from its blocking pool beforehand), so the process's
/// panic hook still sees it (the default hook prints it), and a build with `panic = "abort"`
/// aborts there. The wrapper can be created and dropped anywhere; dropping one
/// with a runtime of its own does not wait for that runtime's tasks. The runtime is either one the wrapper owns (a
/// current-thread runtime with I/O and timers, from [`BlockingSink::new`]) or a handle to
/// one the program runs ([`BlockingSink::with_handle`]; the async client of the sink may
/// then run its background tasks there).
#[derive(Debug)]
pub struct BlockingSink<S> {
    sink: S,
    rt: Runtime,
}

#[derive(Debug)]
enum Runtime {
    /// Always `Some` until dropped.
    Owned(Option<tokio::runtime::Runtime>),
    Handle(tokio::runtime::Handle),
}

impl Drop for Runtime {
    fn drop(&mut self) {
        // Dropping a runtime blocks on its tasks, which panics inside async code; the
        // wrapper may be dropped there (for example when a committer refuses it).
        if let Runtime::Owned(rt) = self {
            if let Some(rt) = rt.take() {
                rt.shutdown_background();
            }
        }
    }
}

/// The error for a call from inside a runtime, where blocking on a future would panic.
fn on_runtime_thread() -> SinkError {
    SinkError::permanent(
        "a BlockingSink was called on a tokio runtime thread, where it cannot block; deliver \
         from a thread of its own (WalSink::spawn_committer, or deliver_ready inside \
         spawn_blocking) or drive the AsyncSink with the async committer",
    )
}

impl<S: AsyncSink> BlockingSink<S> {
    /// Wraps `sink` with a runtime of its own.
    pub fn new(sink: S) -> std::io::Result<Self> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        Ok(BlockingSink {
            sink,
            rt: Runtime::Owned(Some(rt)),
        })
    }

    /// Wraps `sink`, driving it on the runtime behind `handle`.
    pub fn with_handle(sink: S, handle: tokio::runtime::Handle) -> Self {
        BlockingSink {
            sink,
            rt: Runtime::Handle(handle),
        }
    }

    /// Runs `f` on this wrapper's runtime: for setting the sink up or inspecting it
    /// (`f` gets the wrapped sink).
    ///
    /// # Panics
    /// When called from inside a tokio runtime, where blocking is not allowed (tokio's own
    /// rule); the sink methods catch that panic and return an error instead (see the type's
    /// docs for what the panic hook sees).
    pub fn block_on<T>(&mut self, f: impl AsyncFnOnce(&mut S) -> T) -> T {
        let fut = f(&mut self.sink);
        match &self.rt {
            Runtime::Owned(rt) => rt.as_ref().expect("the runtime").block_on(fut),
            Runtime::Handle(h) => h.block_on(fut),
        }
    }

    /// `block_on`, or an error when blocking would panic.
    fn block_on_checked<T>(
        &mut self,
        f: impl AsyncFnOnce(&mut S) -> Result<T, SinkError>,
    ) -> Result<T, SinkError> {
        if tokio::runtime::Handle::try_current().is_err() {
            return self.block_on(f);
        }
        // Inside a runtime's context: fine on its blocking pool, a panic on a worker, where
        // tokio refuses before the future is first polled. tokio offers no way to tell the
        // two apart beforehand, so the refusal is caught and reported as an error.
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| self.block_on(f)))
            .unwrap_or_else(|_| Err(on_runtime_thread()))
    }

    /// The wrapped sink.
    pub fn get_ref(&self) -> &S {
        &self.sink
    }

    /// The wrapped sink, mutably.
    pub fn get_mut(&mut self) -> &mut S {
        &mut self.sink
    }
}

impl<S: AsyncSink> Sink for BlockingSink<S> {
    fn deliver(&mut self, epoch: &Epoch) -> Result<(), SinkError> {
        self.block_on_checked(async |s| s.deliver(epoch).await)
    }

    fn stores_marker(&self) -> bool {
        self.sink.stores_marker()
    }

    fn is_committed(&mut self, key: &EpochKey) -> Result<bool, SinkError> {
        self.block_on_checked(async |s| s.is_committed(key).await)
    }
}
