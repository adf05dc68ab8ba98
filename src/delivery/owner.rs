//! Owners and generations: which log may deliver a shard `(sink id, subtask)` into a target.
//!
//! Exactly-once through a marker holds only while one log delivers a shard: two logs under one
//! sink id number their checkpoints alike, so each finds the other's markers and skips its own
//! epochs as delivered. Every target that keeps a marker therefore keeps an owner record per
//! shard, `(owner log id, generation)`, and checks it in the same transaction, script or
//! locked step that writes an epoch (`docs/design.md`, "Owners and generations"):
//!
//! - [`Owner`] is who asks: a log's id ([`WalSink::log_id`](crate::WalSink::log_id)) and
//!   whether it takes the shard over from another log.
//! - [`decide_claim`] is the one rule every target applies to the record it finds: a shard
//!   without an owner, or owned by the same log, is claimed with the next generation (so a
//!   zombie copy of the same log, still running with the older generation, is fenced); one
//!   owned by another log is refused unless the claim takes it over.
//! - [`Claim`] is what a target granted: the generation every later write must still find.
//!   A write that finds another owner or generation is refused with
//!   [`SinkError::fenced`](crate::SinkError::fenced), writing nothing.

use crate::error::SinkError;
use std::sync::Arc;

/// Who claims a shard: a log's id, and whether it may take the shard over from another log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Owner {
    log: Arc<str>,
    take_over: bool,
}

impl Owner {
    /// The owner `log` (a log's id, for example [`WalSink::log_id`](crate::WalSink::log_id)),
    /// not taking over.
    pub fn new(log: impl Into<Arc<str>>) -> Self {
        Owner {
            log: log.into(),
            take_over: false,
        }
    }

    /// Whether the claim takes the shard over from another log (an operator's choice: the
    /// other log is fenced at its next write; its epochs not yet in the target are abandoned,
    /// so the new owner must resume its source from what the target holds).
    pub fn take_over(mut self, take_over: bool) -> Self {
        self.take_over = take_over;
        self
    }

    /// The owner's log id.
    pub fn log(&self) -> &str {
        &self.log
    }

    /// True when the claim takes the shard over from another log.
    pub fn takes_over(&self) -> bool {
        self.take_over
    }
}

/// A shard claimed in a target: the owner and the generation it was granted. Every write of
/// an epoch must still find both in the target's owner record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Claim {
    /// The shard's sink id.
    pub sink_id: Arc<str>,
    /// The shard's subtask.
    pub subtask: u32,
    /// The owner's log id.
    pub owner: Arc<str>,
    /// The generation granted (from 1; each claim raises it).
    pub generation: u64,
    /// The owner the shard had before this claim (`None`: it had none): the same log for a
    /// claim after a restart, another for a take-over.
    pub previous: Option<Arc<str>>,
}

impl Claim {
    /// Whether `key` is an epoch of the claimed shard; a sink given another shard's epoch
    /// writes nothing.
    ///
    /// # Errors
    /// [`SinkError::permanent`] naming both shards when `key` is of another one.
    pub fn check_key(&self, key: &crate::EpochKey) -> Result<(), SinkError> {
        if *key.sink_id == *self.sink_id && key.subtask == self.subtask {
            Ok(())
        } else {
            Err(SinkError::permanent(format!(
                "this sink claimed shard {}/{} and was given an epoch of {}/{}",
                self.sink_id, self.subtask, key.sink_id, key.subtask
            )))
        }
    }

    /// Whether an owner record `(owner, generation)` found at a write still belongs to this
    /// claim; `Err` is the fenced error to return, naming the record found.
    ///
    /// # Errors
    /// [`SinkError::fenced`] when the record is missing or names another owner or generation.
    pub fn check(&self, found: Option<(&str, u64)>) -> Result<(), SinkError> {
        match found {
            Some((owner, generation))
                if owner == &*self.owner && generation == self.generation =>
            {
                Ok(())
            }
            Some((owner, generation)) => Err(SinkError::fenced(format!(
                "shard {}/{} is owned by log {owner} at generation {generation} in the target; this log ({}) holds generation {}, so it was taken over (--take-over) or reopened elsewhere: nothing was written, and this log must stop",
                self.sink_id, self.subtask, self.owner, self.generation
            ))),
            None => Err(SinkError::fenced(format!(
                "shard {}/{} has no owner record in the target any more (removed by hand?); this log ({}) held generation {}: nothing was written",
                self.sink_id, self.subtask, self.owner, self.generation
            ))),
        }
    }
}

/// The rule of a claim: given the owner record a target holds for `(sink_id, subtask)`
/// (`None` when it holds none), the generation to record for `owner`, or the fenced error that
/// refuses the claim. A target reads the record, applies this and writes the result in one
/// transaction (or under one lock), so two claims at once end with one owner.
///
/// # Errors
/// [`SinkError::fenced`] when another log owns the shard and `owner` does not take it over;
/// [`SinkError::permanent`] when the generation would pass `i64::MAX` (what SQL targets
/// store).
pub fn decide_claim(
    sink_id: &str,
    subtask: u32,
    found: Option<(&str, u64)>,
    owner: &Owner,
) -> Result<Claim, SinkError> {
    let generation = match found {
        None => 1,
        Some((log, generation)) if log == owner.log() || owner.takes_over() => {
            generation.saturating_add(1)
        }
        Some((log, generation)) => {
            return Err(SinkError::fenced(format!(
                "shard {sink_id}/{subtask} is owned in the target by another log ({log}, generation {generation}); this log ({}) may deliver it only by taking it over (--take-over), after which the other log is refused at its next write",
                owner.log()
            )))
        }
    };
    if generation > i64::MAX as u64 {
        return Err(SinkError::permanent(format!(
            "shard {sink_id}/{subtask}: the owner generation would pass {}",
            i64::MAX
        )));
    }
    Ok(Claim {
        sink_id: sink_id.into(),
        subtask,
        owner: owner.log.clone(),
        generation,
        previous: found.map(|(log, _)| log.into()),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::SinkErrorClass;

    #[test]
    fn a_free_shard_is_claimed_at_generation_one() {
        let c = decide_claim("s", 0, None, &Owner::new("a")).unwrap();
        assert_eq!((&*c.owner, c.generation), ("a", 1));
    }

    #[test]
    fn the_same_log_claims_again_with_a_higher_generation_and_fences_its_older_claim() {
        let first = decide_claim("s", 0, None, &Owner::new("a")).unwrap();
        let again = decide_claim("s", 0, Some(("a", 1)), &Owner::new("a")).unwrap();
        assert_eq!(again.generation, 2);
        assert!(again.check(Some(("a", 2))).is_ok());
        let e = first.check(Some(("a", 2))).unwrap_err();
        assert_eq!(e.class(), SinkErrorClass::Fenced);
    }

    #[test]
    fn another_log_is_refused_unless_it_takes_over() {
        let e = decide_claim("s", 3, Some(("a", 7)), &Owner::new("b")).unwrap_err();
        assert_eq!(e.class(), SinkErrorClass::Fenced);
        assert!(e.message().contains("s/3") && e.message().contains("(a, generation 7)"));
        let c = decide_claim("s", 3, Some(("a", 7)), &Owner::new("b").take_over(true)).unwrap();
        assert_eq!((&*c.owner, c.generation), ("b", 8));
        assert!(c.check(Some(("a", 7))).is_err());
        assert!(c.check(None).is_err());
    }

    #[test]
    fn an_epoch_of_another_shard_is_refused() {
        let c = decide_claim("s", 1, None, &Owner::new("a")).unwrap();
        let key = |sink: &str, subtask| crate::EpochKey {
            sink_id: sink.into(),
            subtask,
            checkpoint: 1,
        };
        assert!(c.check_key(&key("s", 1)).is_ok());
        assert!(c.check_key(&key("s", 2)).is_err());
        assert!(c.check_key(&key("t", 1)).is_err());
    }

    #[test]
    fn a_generation_past_what_sql_stores_is_refused() {
        let found = Some(("a", i64::MAX as u64));
        let e = decide_claim("s", 0, found, &Owner::new("a")).unwrap_err();
        assert_eq!(e.class(), SinkErrorClass::Permanent);
    }
}
