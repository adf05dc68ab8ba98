//! [`AsyncSink`]: the [`Sink`](walsink::Sink) contract with async methods, and
//! [`AsyncChunks`], which reads an epoch's chunks without blocking the runtime.

use std::future::Future;
use walsink::{Chunk, Epoch, EpochKey, IntoChunks, SinkError};

/// A target that sealed, completed epochs are delivered to, with async methods.
///
/// # Contract
/// The same as [`walsink::Sink`]'s:
/// - [`AsyncSink::deliver`] is called with epochs strictly in checkpoint order, one at a time.
///   Epoch `n + 1` is never delivered before `n` succeeded.
/// - It returns `Ok` only when the whole epoch is durable in the target. An `Err` makes the
///   committer retry the *same* epoch later, with backoff; nothing is skipped.
///   [`SinkError::retryable`] and [`SinkError::permanent`] say which kind of failure it was
///   (a permanent one is retried at the longest backoff until an operator acts).
/// - After a crash the same epoch (same key, records and positions) may be delivered again.
///   A sink without its own marker must be idempotent per
///   [`RecordPosition`](walsink::RecordPosition) to be effectively-once.
/// - A sink that stores the commit marker atomically with the data returns `true` from
///   [`AsyncSink::stores_marker`] and answers [`AsyncSink::is_committed`] from the target:
///   then delivery is exactly-once.
/// - A panic in `deliver` or `is_committed` (in making the future or while it runs) is caught
///   and treated as a permanent error, as [`walsink::Sink`]'s contract says: counted and
///   shown in [`Health`](walsink::Health), the same epoch retried at the longest backoff with
///   the same sink value.
///
/// # Cancellation
/// A committer stopped with a deadline ([`AsyncCommitter::shutdown`](crate::AsyncCommitter::shutdown))
/// drops a `deliver` future half-way. The epoch then does not count as delivered and is
/// delivered again later, which the contract above already allows: a sink must leave the
/// target so that a second delivery of the same epoch is correct (a transaction that was
/// never committed, or idempotent writes).
///
/// # Reading large epochs
/// An epoch within one read chunk (8 MiB by default) is in memory when `deliver` is called.
/// A larger one is read as it is iterated; read it with [`AsyncChunks`], which runs those
/// reads off the runtime, rather than with [`Epoch::chunks`], which blocks.
pub trait AsyncSink: Send {
    /// Delivers one epoch durably.
    fn deliver(&mut self, epoch: &Epoch) -> impl Future<Output = Result<(), SinkError>> + Send;

    /// True if the target stores the commit marker atomically with the data. Default false.
    fn stores_marker(&self) -> bool {
        false
    }

    /// For sinks that store the marker: whether the target already holds this epoch. Called
    /// before each delivery. The default answers false.
    fn is_committed(
        &mut self,
        key: &EpochKey,
    ) -> impl Future<Output = Result<bool, SinkError>> + Send {
        let _ = key;
        std::future::ready(Ok(false))
    }
}

/// The chunks of an [`Epoch`], read without blocking the runtime: an epoch that was loaded
/// before delivery is iterated in place, a larger one is read chunk by chunk on tokio's
/// blocking pool. Needs a tokio runtime.
///
/// A read failure is returned once, and then iteration ends; as with [`Epoch::chunks`], a
/// sink that meets one must return an error without committing anything.
#[derive(Debug)]
pub struct AsyncChunks {
    inner: Option<IntoChunks>,
}

impl AsyncChunks {
    /// Starts reading `epoch` from its first record.
    pub fn new(epoch: &Epoch) -> Self {
        AsyncChunks {
            inner: Some(epoch.clone().into_chunks()),
        }
    }

    /// The next chunk, `None` at the end.
    ///
    /// # Cancel safety
    /// Not cancel safe: a chunk being read when the future is dropped is lost to this
    /// iterator (which then ends). Start again with [`AsyncChunks::new`].
    pub async fn next(&mut self) -> Option<walsink::Result<Chunk>> {
        let mut it = self.inner.take()?;
        if !it.reads_log() {
            let next = it.next();
            self.inner = Some(it);
            return next;
        }
        match tokio::task::spawn_blocking(move || {
            let next = it.next();
            (it, next)
        })
        .await
        {
            Ok((it, next)) => {
                self.inner = Some(it);
                next
            }
            Err(e) => Some(Err(crate::join_error(e))),
        }
    }
}
