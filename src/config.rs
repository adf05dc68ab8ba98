//! Options of a log, each with its documented default, and their validation.

use crate::error::{Error, Result};
use crate::log::format::{frame_size, BARRIER_FIXED_LEN, SEGMENT_END_RESERVE, SEGMENT_HEADER_LEN};
use std::time::Duration;

/// How [`WalSink::open`](crate::WalSink::open) treats damage found in the log.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum RecoveryMode {
    /// Default. A torn or unwritten tail, which a crash during an unfinished sync leaves, is
    /// cut off and reported. Damage in data that a completed sync covered is corruption: open
    /// fails with [`ErrorKind::Corruption`](crate::ErrorKind::Corruption) naming the segment
    /// and offset.
    #[default]
    TolerateTornTail,
    /// Lenient: keep the valid prefix up to the first damage, move the damaged and all later
    /// segments aside (renamed `*.damaged`, never deleted) and report every checkpoint dropped.
    /// Checkpoints after the damage are lost; use it only to get a damaged log running again.
    TruncateAtCorruption,
    /// Open fails on anything but a clean log, torn tails included. For inspection tools.
    Strict,
}

/// How records become durable and how epochs are formed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Mode {
    /// Default. An embedding stream processor drives epochs with `checkpoint`,
    /// `checkpoint_complete` and `restore`; appends between checkpoints are not synced (the
    /// source replays them after a crash).
    #[default]
    Checkpointed,
    /// Durable buffer: `append` returns only once its record is durable. Concurrent appends
    /// share one sync (group commit); each sync seals the records it covers as an automatic
    /// checkpoint (ids counting up from 1) that is complete at once, so the committer delivers
    /// them without an external coordinator. `checkpoint`, `checkpoint_complete` and `restore`
    /// are refused in this mode.
    Durable,
}

/// What an append does when the backlog reaches [`Options::max_backlog_bytes`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum FullPolicy {
    /// Default. Wait until the committer frees space (backpressure).
    #[default]
    Block,
    /// Fail at once with [`ErrorKind::BacklogFull`](crate::ErrorKind::BacklogFull); nothing is
    /// written and nothing is dropped silently.
    Reject,
}

/// Exponential backoff with full jitter, for sink and commit-store retries. Build with
/// [`RetryPolicy::new`] or [`RetryPolicy::default`]; fields may be added.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct RetryPolicy {
    /// First delay. Default 10 ms.
    pub initial: Duration,
    /// Largest delay. Default 5 s.
    pub max: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            initial: Duration::from_millis(10),
            max: Duration::from_secs(5),
        }
    }
}

impl RetryPolicy {
    /// A policy whose first delay is at most `initial` and whose delays never exceed `max`.
    pub fn new(initial: Duration, max: Duration) -> RetryPolicy {
        RetryPolicy { initial, max }
    }

    /// The delay before retry number `attempt` (1-based): a uniformly random duration between
    /// zero and [`RetryPolicy::cap`] ("full jitter"), drawn from a thread-local generator.
    pub fn delay(&self, attempt: u32) -> Duration {
        self.delay_from(attempt, fastrand::u64(..))
    }

    /// The delay before retry number `attempt` for a given uniformly random `random` (any
    /// `u64`; `0` gives no delay, `u64::MAX` the cap): [`RetryPolicy::delay`] with the caller's
    /// own randomness, for a deterministic schedule.
    pub fn delay_from(&self, attempt: u32, random: u64) -> Duration {
        let nanos = self.cap(attempt).as_nanos().min(u64::MAX as u128) as u64;
        // random * nanos / u64::MAX, without overflow: uniform over 0..=nanos.
        let scaled = (u128::from(random) * u128::from(nanos)) / u128::from(u64::MAX);
        Duration::from_nanos(scaled as u64)
    }

    /// The longest delay before retry number `attempt` (1-based):
    /// `min(max, initial * 2^(attempt-1))`.
    pub fn cap(&self, attempt: u32) -> Duration {
        self.initial
            .saturating_mul(1u32 << attempt.saturating_sub(1).min(20))
            .min(self.max)
    }
}

/// Options of a log. Build with [`Options::new`] and the setters; every field documents its
/// default. Fields may be added in any release: read and set them, but build the value with
/// [`Options::new`].
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct Options {
    /// Stable identity of the sink, chosen by the embedder and stored in the directory:
    /// 1 to 64 characters of `A-Z a-z 0-9 . _ -`. Opening with another id is an error. No default.
    pub sink_id: String,
    /// Index of the parallel sink subtask this log belongs to. Default 0.
    pub subtask: u32,
    /// Checkpointed (default) or durable-buffer mode.
    pub mode: Mode,
    /// Create the directory and its identity if it is not a log yet. Default true.
    pub create: bool,
    /// Bytes per segment file, header included. Default 64 MiB; at least 4 KiB and large
    /// enough for one record of `max_record_size`.
    pub segment_size: u64,
    /// Largest record accepted by `append`. Default 16 MiB; at most 1 GiB.
    pub max_record_size: usize,
    /// Largest checkpoint metadata blob. Default 64 KiB.
    pub max_metadata_size: usize,
    /// Appends are buffered in memory up to this many bytes before they are written to the
    /// segment file (they are not durable before the next checkpoint anyway). Default 256 KiB.
    pub write_buffer_size: usize,
    /// Delivery reads an epoch in chunks of at most this many bytes (one frame when a frame is
    /// larger), so its memory is bounded whatever the epoch's size; an epoch that fits in one
    /// chunk is read and verified whole before the sink sees it. Default 8 MiB; at least 1 KiB.
    pub read_chunk_size: usize,
    /// How open treats damage. Default [`RecoveryMode::TolerateTornTail`].
    pub recovery_mode: RecoveryMode,
    /// Keep fully committed segments for reuse instead of deleting them (their blocks are
    /// already allocated, which makes later syncs cheaper). Default true.
    pub recycle_segments: bool,
    /// Free files (`.free`) kept for reuse once delivery is idle (none when
    /// `recycle_segments` is off). While a backlog drains, every segment it frees is kept as a
    /// free file, one beyond this many is removed per 16 freed, and the rest when a deliverer
    /// finds nothing deliverable (a delivery that keeps failing keeps them until then):
    /// removing a file is slow on some filesystems (those mounted with `discard` wait for the
    /// device) and would hold delivery back. The log's disk use never grows for it: appends
    /// take free files first, and a commit mark or an open that finds the disk full gives a
    /// free file's blocks back first. Default 2.
    pub max_free_segments: usize,
    /// Disk budget: appends wait or fail (see `full_policy`) while the bytes held for epochs
    /// not yet committed exceed this. Default `u64::MAX` (no limit).
    pub max_backlog_bytes: u64,
    /// What appends do when the budget is used up. Default [`FullPolicy::Block`].
    pub full_policy: FullPolicy,
    /// Backoff of sink and commit-store retries. Default [`RetryPolicy::default`].
    pub retry: RetryPolicy,
    /// The committer marks progress in the commit store after at most this many delivered
    /// epochs (fewer when no more epochs are ready). With a commit store that survives a
    /// restart (the default), a crash re-delivers at most this many epochs to a sink without
    /// its own marker. Default 1.
    pub mark_every: usize,
    /// Seed of the random salts of new segments. Default `None` (seeded from the OS);
    /// simulations set it so that a run replays exactly.
    pub salt_seed: Option<u64>,
    /// Permission bits of the log directory when open creates it. Default `0o700`, private
    /// to the owner (a log holds user data; PostgreSQL's data directory is `0o700` too). Set
    /// exactly, whatever the umask; parents that open creates get the usual `0o777` less the
    /// umask. A directory that exists already keeps its mode: open logs a warning when it
    /// grants more than this. Must include `0o700`; no bits above `0o777`.
    pub dir_mode: u32,
    /// Permission bits of every file the log creates (segments, identity, commit store, lock,
    /// moved-aside copies; recycled segments keep the mode they were created with). Default
    /// `0o600`. Set exactly, whatever the umask; files that exist already keep their mode,
    /// except the empty lock file, which is set to this. Must include `0o600`; no bits above
    /// `0o777`.
    pub file_mode: u32,
}

impl Options {
    /// Options with every default and the given sink id.
    pub fn new(sink_id: impl Into<String>) -> Self {
        Options {
            sink_id: sink_id.into(),
            subtask: 0,
            mode: Mode::Checkpointed,
            create: true,
            segment_size: 64 << 20,
            max_record_size: 16 << 20,
            max_metadata_size: 64 << 10,
            write_buffer_size: 256 << 10,
            read_chunk_size: 8 << 20,
            recovery_mode: RecoveryMode::default(),
            recycle_segments: true,
            max_free_segments: 2,
            max_backlog_bytes: u64::MAX,
            full_policy: FullPolicy::default(),
            retry: RetryPolicy::default(),
            mark_every: 1,
            salt_seed: None,
            dir_mode: crate::storage::PRIVATE_DIR_MODE,
            file_mode: crate::storage::PRIVATE_FILE_MODE,
        }
    }

    /// Sets [`Options::dir_mode`].
    pub fn dir_mode(mut self, mode: u32) -> Self {
        self.dir_mode = mode;
        self
    }

    /// Sets [`Options::file_mode`].
    pub fn file_mode(mut self, mode: u32) -> Self {
        self.file_mode = mode;
        self
    }

    /// Sets [`Options::subtask`].
    pub fn subtask(mut self, subtask: u32) -> Self {
        self.subtask = subtask;
        self
    }

    /// Sets [`Options::mode`].
    pub fn mode(mut self, mode: Mode) -> Self {
        self.mode = mode;
        self
    }

    /// Sets [`Options::create`].
    pub fn create(mut self, create: bool) -> Self {
        self.create = create;
        self
    }

    /// Sets [`Options::segment_size`].
    pub fn segment_size(mut self, bytes: u64) -> Self {
        self.segment_size = bytes;
        self
    }

    /// Sets [`Options::max_record_size`].
    pub fn max_record_size(mut self, bytes: usize) -> Self {
        self.max_record_size = bytes;
        self
    }

    /// Sets [`Options::max_metadata_size`].
    pub fn max_metadata_size(mut self, bytes: usize) -> Self {
        self.max_metadata_size = bytes;
        self
    }

    /// Sets [`Options::write_buffer_size`].
    pub fn write_buffer_size(mut self, bytes: usize) -> Self {
        self.write_buffer_size = bytes;
        self
    }

    /// Sets [`Options::read_chunk_size`].
    pub fn read_chunk_size(mut self, bytes: usize) -> Self {
        self.read_chunk_size = bytes;
        self
    }

    /// Sets [`Options::recovery_mode`].
    pub fn recovery_mode(mut self, mode: RecoveryMode) -> Self {
        self.recovery_mode = mode;
        self
    }

    /// Sets [`Options::max_backlog_bytes`] and [`Options::full_policy`].
    pub fn max_backlog_bytes(mut self, bytes: u64, policy: FullPolicy) -> Self {
        self.max_backlog_bytes = bytes;
        self.full_policy = policy;
        self
    }

    /// Sets [`Options::retry`].
    pub fn retry(mut self, retry: RetryPolicy) -> Self {
        self.retry = retry;
        self
    }

    /// Sets [`Options::mark_every`].
    pub fn mark_every(mut self, epochs: usize) -> Self {
        self.mark_every = epochs;
        self
    }

    /// Sets [`Options::salt_seed`].
    pub fn salt_seed(mut self, seed: u64) -> Self {
        self.salt_seed = Some(seed);
        self
    }

    /// Sets [`Options::max_free_segments`].
    pub fn max_free_segments(mut self, files: usize) -> Self {
        self.max_free_segments = files;
        self
    }

    /// Sets [`Options::recycle_segments`].
    pub fn recycle_segments(mut self, on: bool) -> Self {
        self.recycle_segments = on;
        self
    }

    /// Checks every option and returns a typed error naming the first bad one.
    pub fn sanitize(&self) -> Result<()> {
        validate_sink_id(&self.sink_id)?;
        if self.max_record_size == 0 || self.max_record_size > crate::log::format::MAX_RECORD_LIMIT
        {
            return Err(Error::config(
                "max_record_size must be between 1 byte and 1 GiB",
            ));
        }
        if self.max_metadata_size > crate::log::format::MAX_METADATA_LIMIT {
            return Err(Error::config("max_metadata_size must be at most 16 MiB"));
        }
        let largest = frame_size(
            self.max_record_size
                .max(BARRIER_FIXED_LEN + self.max_metadata_size),
        );
        let needed = (SEGMENT_HEADER_LEN + largest + SEGMENT_END_RESERVE) as u64;
        if self.segment_size < 4096 || self.segment_size < needed {
            return Err(Error::config(format!(
                "segment_size {} is too small: it must be at least 4096 and hold one frame of \
                 max_record_size or max_metadata_size ({needed} bytes)",
                self.segment_size
            )));
        }
        if self.segment_size > 1 << 40 {
            return Err(Error::config("segment_size must be at most 1 TiB"));
        }
        if self.read_chunk_size < 1024 {
            return Err(Error::config(format!(
                "read_chunk_size {} is too small: it must be at least 1024",
                self.read_chunk_size
            )));
        }
        if self.write_buffer_size == 0 {
            return Err(Error::config("write_buffer_size must be positive"));
        }
        if self.mark_every == 0 {
            return Err(Error::config("mark_every must be at least 1"));
        }
        if self.retry.initial.is_zero() || self.retry.max < self.retry.initial {
            return Err(Error::config(
                "retry: initial must be positive and not above max",
            ));
        }
        crate::storage::check_modes(self.dir_mode, self.file_mode).map_err(Error::config)?;
        Ok(())
    }
}

/// Checks a sink id: 1 to 64 characters of `A-Z a-z 0-9 . _ -`, not starting with a dot.
pub fn validate_sink_id(id: &str) -> Result<()> {
    let ok = !id.is_empty()
        && id.len() <= 64
        && !id.starts_with('.')
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b));
    if ok {
        Ok(())
    } else {
        Err(Error::config(format!(
            "sink id {id:?} must be 1 to 64 characters of A-Z a-z 0-9 . _ - and not start with a dot"
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_valid() {
        Options::new("s").sanitize().unwrap();
    }

    #[test]
    fn bad_values_are_named() {
        assert!(Options::new("").sanitize().is_err());
        assert!(Options::new("a/b").sanitize().is_err());
        assert!(Options::new("..").sanitize().is_err());
        let e = Options::new("s").segment_size(100).sanitize().unwrap_err();
        assert!(e.to_string().contains("segment_size"), "{e}");
        assert!(Options::new("s").max_record_size(0).sanitize().is_err());
        assert!(Options::new("s").mark_every(0).sanitize().is_err());
    }

    #[test]
    fn backoff_grows_and_is_capped() {
        let p = RetryPolicy {
            initial: Duration::from_millis(10),
            max: Duration::from_millis(100),
        };
        for attempt in 1..40 {
            let d = p.delay(attempt);
            assert!(d <= Duration::from_millis(100));
            if attempt == 1 {
                assert!(d <= Duration::from_millis(10));
            }
        }
        assert_eq!(p.cap(1), Duration::from_millis(10));
        assert_eq!(p.cap(3), Duration::from_millis(40));
        assert_eq!(p.cap(39), Duration::from_millis(100));
        assert_eq!(p.delay_from(3, 0), Duration::ZERO);
        assert_eq!(p.delay_from(3, u64::MAX), Duration::from_millis(40));
        let half = p.delay_from(3, u64::MAX / 2);
        assert!(half > Duration::from_millis(19) && half < Duration::from_millis(21));
    }
}
