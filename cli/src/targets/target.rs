//! [`Target`]: what every URL target of `--sink` gives `pipe` and `inspect`, and the start-up
//! retry every target's connect goes through.

use crate::outcome::CliResult;
use walsink::sinks::CommittedEpoch;
use walsink::{Claim, Owner, Sink, SinkError};

/// A URL target of `--sink`.
pub(crate) trait Target {
    /// The target for messages: the URL without its password.
    fn shown(&self) -> String;

    /// A sink delivering into the target (connects; errors name the target, not secrets).
    /// A target that fences owners claims the shard `(sink_id, subtask)` for `owner` first
    /// (refused when another log owns it and `owner` does not take it over); the others
    /// ignore `owner`. Returns the sink and the claim it was granted (`None` for a target
    /// without owners).
    fn open_sink(
        &self,
        sink_id: &str,
        subtask: u32,
        owner: &Owner,
    ) -> CliResult<(Box<dyn Sink>, Option<walsink::Claim>)>;

    /// The epochs the target itself holds as committed for `(sink_id, subtask)`, with the
    /// checkpoint metadata kept beside each marker, oldest first; `None` for a target that
    /// keeps no marker (its exactly-once rests on idempotency keys).
    fn committed(&self, sink_id: &str, subtask: u32) -> CliResult<Option<Vec<CommittedEpoch>>>;

    /// What the target writes to (a table, a key, a stream and subject), for the default
    /// sink id of a new log (`pipe-OBJECT`); `None` when nothing names it (HTTP).
    fn object(&self) -> Option<String> {
        None
    }

    /// Whether the target keeps only its newest commit marker, so that
    /// [`Target::committed`] returns at most one epoch however many it holds.
    fn keeps_newest_marker_only(&self) -> bool {
        false
    }

    /// Lines about the target's own state for `walsink inspect --sink` (for example
    /// transactions it holds prepared); none by default.
    fn status(&self, sink_id: &str, subtask: u32) -> CliResult<Vec<String>> {
        let _ = (sink_id, subtask);
        Ok(Vec::new())
    }
}

/// Runs a start-up call to a target again while it fails with a retryable error (a
/// connection the server dropped, a restart under way), for up to 5 s with the project's
/// backoff ([`walsink::RetryPolicy`], 50 ms to 1 s), so that a blip at start does not end the
/// run; a permanent error, or one that lasts, is returned.
pub(crate) fn retry_at_start<T>(
    mut f: impl FnMut() -> Result<T, walsink::SinkError>,
) -> Result<T, walsink::SinkError> {
    let policy = walsink::RetryPolicy::new(
        std::time::Duration::from_millis(50),
        std::time::Duration::from_secs(1),
    );
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    let mut attempt = 0;
    loop {
        attempt += 1;
        let wait = policy.delay(attempt);
        match f() {
            Err(e)
                if e.class() == walsink::SinkErrorClass::Retryable
                    && std::time::Instant::now() + wait < deadline =>
            {
                std::thread::sleep(wait)
            }
            other => return other,
        }
    }
}

/// A claim to make before the first delivery: what [`claim_or_defer`] leaves when the target
/// failed at start for another reason than another owner.
type PendingClaim<S> = Box<dyn FnMut(&mut S) -> Result<Claim, SinkError> + Send>;

/// A sink whose shard is claimed at its first delivery.
struct ClaimFirst<S> {
    inner: S,
    pending: Option<PendingClaim<S>>,
}

impl<S: Sink> Sink for ClaimFirst<S> {
    fn deliver(&mut self, epoch: &walsink::Epoch) -> Result<(), SinkError> {
        if let Some(claim) = &mut self.pending {
            claim(&mut self.inner)?;
            self.pending = None;
        }
        self.inner.deliver(epoch)
    }
    fn stores_marker(&self) -> bool {
        self.inner.stores_marker()
    }
    fn is_committed(&mut self, key: &walsink::EpochKey) -> Result<bool, SinkError> {
        self.inner.is_committed(key)
    }
}

/// Claims the shard with `claim` now (retried at start like a connect). Another log owning it
/// is returned as the refusal it is; any other failure (a target that refuses writes, a
/// server out of memory) defers the claim to the first delivery, so that it fails there and is
/// retried, reported and given up on like any delivery (`--max-retries`, `--retry-deadline`).
pub(crate) fn claim_or_defer<S: Sink + Send + 'static>(
    mut inner: S,
    mut claim: impl FnMut(&mut S) -> Result<Claim, SinkError> + Send + 'static,
) -> Result<(Box<dyn Sink>, Option<Claim>), SinkError> {
    match retry_at_start(|| claim(&mut inner)) {
        Ok(c) => Ok((Box::new(inner), Some(c))),
        Err(e) if e.class() == walsink::SinkErrorClass::Fenced => Err(e),
        Err(e) => {
            tracing::warn!(
                "the shard could not be claimed at start ({e}); claimed at the first delivery"
            );
            Ok((
                Box::new(ClaimFirst {
                    inner,
                    pending: Some(Box::new(claim)),
                }),
                None,
            ))
        }
    }
}
