//! [`BlockingSink`]: an [`AsyncSink`] used where a blocking [`Sink`] is expected (the
//! committer thread, `deliver_ready`, the command-line tool).

use crate::AsyncSink;
use walsink::{Epoch, EpochKey, Sink, SinkError};

/// Wraps an [`AsyncSink`] as a blocking [`Sink`], driving its futures on a tokio runtime.
///
/// The sink's calls run on the calling thread (the committer thread), which blocks on them;
/// so it must not be a runtime worker. The runtime is either one the wrapper owns (a
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
    Owned(tokio::runtime::Runtime),
    Handle(tokio::runtime::Handle),
}

impl<S: AsyncSink> BlockingSink<S> {
    /// Wraps `sink` with a runtime of its own.
    pub fn new(sink: S) -> std::io::Result<Self> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        Ok(BlockingSink {
            sink,
            rt: Runtime::Owned(rt),
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
    pub fn block_on<T>(&mut self, f: impl AsyncFnOnce(&mut S) -> T) -> T {
        let fut = f(&mut self.sink);
        match &self.rt {
            Runtime::Owned(rt) => rt.block_on(fut),
            Runtime::Handle(h) => h.block_on(fut),
        }
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
        self.block_on(async |s| s.deliver(epoch).await)
    }

    fn stores_marker(&self) -> bool {
        self.sink.stores_marker()
    }

    fn is_committed(&mut self, key: &EpochKey) -> Result<bool, SinkError> {
        self.block_on(async |s| s.is_committed(key).await)
    }
}
