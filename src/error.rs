//! The one public error type of walsink.
//!
//! [`Error`] is a small boxed handle around a [`#[non_exhaustive]`](ErrorKind) kind, so
//! `Result<T, Error>` stays one pointer wide on the hot append path. Corruption is structured
//! (segment, offset, reason), never a string, so tools can act on it.

use std::fmt;
use std::io;

/// The result type of every fallible walsink operation.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// An error from walsink. Inspect it with [`Error::kind`].
pub struct Error(Box<ErrorKind>);

/// What went wrong. New variants may be added in minor releases.
#[derive(Debug)]
#[non_exhaustive]
pub enum ErrorKind {
    /// An operating-system I/O error.
    Io {
        /// What walsink was doing, for example `sync segment 00000000000000000003.wseg`.
        context: String,
        /// The underlying error.
        source: io::Error,
    },
    /// Damage in the durable part of the log: data that a completed sync covered no longer
    /// verifies. Open fails with this unless [`RecoveryMode::TruncateAtCorruption`] is chosen.
    ///
    /// [`RecoveryMode::TruncateAtCorruption`]: crate::RecoveryMode::TruncateAtCorruption
    Corruption(Damage),
    /// A file was written by a format version this build cannot read.
    UnsupportedVersion {
        /// The file with the unknown version.
        file: String,
        /// The version found in its header.
        found: u32,
        /// The newest version this build understands.
        supported: u32,
    },
    /// The sink returned an error (the committer retries it; the embedder sees it through
    /// [`Health::last_error`](crate::Health::last_error) or from a synchronous delivery call).
    Sink(SinkError),
    /// The commit store failed to answer or to record a commit.
    CommitStore {
        /// What the commit store was asked to do.
        context: String,
        /// The underlying error.
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// A write or sync failed earlier; the log refuses further writes until it is reopened,
    /// because after a failed fsync the page cache may no longer match the disk, and after a
    /// failed write the segment's state is unknown. Reopening re-reads the disk.
    Poisoned {
        /// The error that poisoned the log.
        cause: String,
    },
    /// Another handle (in this or another process) holds the log directory's lock.
    Locked {
        /// The locked directory.
        dir: String,
    },
    /// A checkpoint id that breaks the protocol: ids must strictly increase.
    InvalidCheckpoint {
        /// The id passed by the caller.
        id: u64,
        /// The smallest id that would have been accepted; `None` once checkpoint `u64::MAX`
        /// exists and no larger id is left.
        min_allowed: Option<u64>,
    },
    /// The directory belongs to another sink id or subtask than the one given to `open`.
    IdentityMismatch {
        /// `sink_id/subtask` stored in the directory.
        stored: String,
        /// `sink_id/subtask` given by the caller.
        given: String,
    },
    /// A record longer than [`Options::max_record_size`](crate::Options::max_record_size).
    RecordTooLarge {
        /// Length of the rejected record.
        len: usize,
        /// The configured maximum.
        max: usize,
    },
    /// An option value is out of range, or a name is not allowed.
    InvalidConfig {
        /// Which option, and why.
        message: String,
    },
    /// The operation is not available in this mode or state.
    InvalidOperation {
        /// Why it was refused.
        message: String,
    },
    /// The directory is not a walsink log (no identity file) and `create` was not asked for.
    NotALog {
        /// The directory.
        dir: String,
    },
    /// The disk budget ([`Options::max_backlog_bytes`](crate::Options::max_backlog_bytes))
    /// is used up and the policy is to reject rather than wait.
    BacklogFull {
        /// Bytes held in the log that are not yet committed.
        backlog_bytes: u64,
        /// The configured budget.
        limit: u64,
    },
    /// The committer or the log was shut down while the caller waited.
    Shutdown,
    /// Not a failure: the target refused one record of the epoch for good
    /// ([`SinkErrorClass::Rejected`](crate::SinkErrorClass::Rejected)), and the record is now
    /// durably in the log's dead-letter log. The driver delivers the epoch again at once,
    /// without it (`docs/design.md`, "Dead letters").
    DeadLettered {
        /// The checkpoint of the record's epoch.
        checkpoint: u64,
        /// The record's index in the epoch.
        index: u64,
        /// What the target said.
        reason: String,
    },
    /// The dead-letter log holds as many records as it may
    /// ([`DirDeadLetters::with_limit`](crate::DirDeadLetters::with_limit)): the refused record
    /// stays in the log, delivery stops at its epoch.
    DeadLetterLimit {
        /// The limit.
        limit: u64,
        /// The record the target refused, as [`ErrorKind::DeadLettered`] names it.
        checkpoint: u64,
        /// Its index.
        index: u64,
        /// What the target said.
        reason: String,
    },
}

/// Why a frame, header or file failed verification.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum CorruptionReason {
    /// A checksum does not match.
    Checksum {
        /// The checksum stored in the file.
        expected: u32,
        /// The checksum computed over the bytes read.
        got: u32,
    },
    /// A segment header with bad magic bytes, a bad checksum, or a sequence number that does not
    /// match the file name.
    BadHeader,
    /// A frame length above the format's maximum ([`MAX_PAYLOAD`](crate::log::format::MAX_PAYLOAD)).
    BadLength {
        /// The length field.
        len: u64,
    },
    /// A frame kind this version does not know.
    UnknownKind(u8),
    /// A frame ends past the end of the file: a torn write.
    TornFrame,
    /// Bytes that are not a frame where a frame must start (for example zeros before the end
    /// of a segment that has a successor).
    Unwritten,
    /// A payload that does not decode (a barrier or control frame of the wrong size).
    BadPayload,
    /// A segment number is missing between two present segments.
    MissingSegment {
        /// The missing sequence number.
        seq: u64,
    },
    /// A checkpoint barrier counts more records than the log holds for its epoch.
    IncompleteEpoch {
        /// The checkpoint id of the barrier.
        checkpoint: u64,
        /// Records the barrier claims.
        expected: u64,
        /// Records found.
        found: u64,
    },
}

impl fmt::Display for CorruptionReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Checksum { expected, got } => {
                write!(
                    f,
                    "checksum mismatch (stored {expected:#010x}, computed {got:#010x})"
                )
            }
            Self::BadHeader => f.write_str("bad header (magic, version, checksum or number)"),
            Self::BadLength { len } => write!(f, "frame length {len} exceeds the format's maximum"),
            Self::UnknownKind(k) => write!(f, "unknown frame kind {k}"),
            Self::TornFrame => f.write_str("torn frame (ends past the end of the file)"),
            Self::Unwritten => f.write_str("unwritten bytes where a frame must be"),
            Self::BadPayload => f.write_str("control frame payload does not decode"),
            Self::MissingSegment { seq } => write!(f, "segment {seq} is missing"),
            Self::IncompleteEpoch {
                checkpoint,
                expected,
                found,
            } => write!(
                f,
                "checkpoint {checkpoint} claims {expected} records but the log holds {found}"
            ),
        }
    }
}

impl CorruptionReason {
    /// A short machine-readable name, used by `verify --json`.
    pub fn name(&self) -> &'static str {
        match self {
            Self::Checksum { .. } => "checksum",
            Self::BadHeader => "bad_header",
            Self::BadLength { .. } => "bad_length",
            Self::UnknownKind(_) => "unknown_kind",
            Self::TornFrame => "torn_frame",
            Self::Unwritten => "unwritten",
            Self::BadPayload => "bad_payload",
            Self::MissingSegment { .. } => "missing_segment",
            Self::IncompleteEpoch { .. } => "incomplete_epoch",
        }
    }
}

impl Error {
    /// What went wrong.
    pub fn kind(&self) -> &ErrorKind {
        &self.0
    }

    /// Consumes the error and returns its kind.
    pub fn into_kind(self) -> ErrorKind {
        *self.0
    }

    /// True when the error says the log must be reopened before further writes.
    pub fn is_poisoned(&self) -> bool {
        matches!(*self.0, ErrorKind::Poisoned { .. })
    }

    /// A copy of this error, for a failure that is reported in two places (to a sink while
    /// it reads an epoch, and to the committer): I/O errors keep their kind and message.
    pub(crate) fn duplicate(&self) -> Self {
        match &*self.0 {
            ErrorKind::Io { context, source } => Error::io(
                context.clone(),
                io::Error::new(source.kind(), source.to_string()),
            ),
            ErrorKind::Corruption(d) => ErrorKind::Corruption(d.clone()).into(),
            _ => Error::invalid_op(self.to_string()),
        }
    }

    /// An I/O error, with what was being done (`context`, for example "sync directory
    /// /var/log/x"); for storage backends and drivers outside this crate.
    pub fn io(context: impl Into<String>, source: io::Error) -> Self {
        ErrorKind::Io {
            context: context.into(),
            source,
        }
        .into()
    }

    pub(crate) fn corruption(
        segment: impl Into<String>,
        offset: u64,
        reason: CorruptionReason,
    ) -> Self {
        ErrorKind::Corruption(Damage {
            segment: segment.into(),
            offset,
            reason,
        })
        .into()
    }

    pub(crate) fn config(message: impl Into<String>) -> Self {
        ErrorKind::InvalidConfig {
            message: message.into(),
        }
        .into()
    }

    /// A call that is not allowed in the current state (`message` says why and what to do).
    pub fn invalid_op(message: impl Into<String>) -> Self {
        ErrorKind::InvalidOperation {
            message: message.into(),
        }
        .into()
    }

    /// Wraps an error of a [`CommitStore`](crate::CommitStore) implementation.
    pub fn commit_store(
        context: impl Into<String>,
        source: impl Into<Box<dyn std::error::Error + Send + Sync>>,
    ) -> Self {
        ErrorKind::CommitStore {
            context: context.into(),
            source: source.into(),
        }
        .into()
    }
}

impl From<ErrorKind> for Error {
    fn from(kind: ErrorKind) -> Self {
        Error(Box::new(kind))
    }
}

impl From<crate::SinkError> for Error {
    fn from(e: crate::SinkError) -> Self {
        ErrorKind::Sink(e).into()
    }
}

impl fmt::Debug for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&self.0, f)
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &*self.0 {
            ErrorKind::Io { context, source } => write!(f, "I/O error while trying to {context}: {source}"),
            ErrorKind::Corruption(Damage {
                segment,
                offset,
                reason,
            }) => write!(
                f,
                "corruption in {segment} at offset {offset}: {reason}; run `walsink verify` for a \
                 full report, or open with RecoveryMode::TruncateAtCorruption to keep the valid prefix"
            ),
            ErrorKind::UnsupportedVersion {
                file,
                found,
                supported,
            } => write!(
                f,
                "{file} has format version {found}, this build reads up to {supported}; use a newer walsink"
            ),
            ErrorKind::Sink(e) => write!(f, "sink error: {e}"),
            ErrorKind::CommitStore { context, source } => {
                write!(f, "commit store failed to {context}: {source}")
            }
            ErrorKind::Poisoned { cause } => write!(
                f,
                "the log is poisoned after a failed write or sync ({cause}); reopen it to recover"
            ),
            ErrorKind::Locked { dir } => write!(
                f,
                "{dir} is locked by another walsink handle or process; close it first"
            ),
            ErrorKind::InvalidCheckpoint {
                id,
                min_allowed: Some(min),
            } => write!(
                f,
                "checkpoint id {id} is not allowed here: ids must strictly increase (next allowed: {min})"
            ),
            ErrorKind::InvalidCheckpoint {
                id,
                min_allowed: None,
            } => write!(
                f,
                "checkpoint id {id} is not allowed here: ids must strictly increase, and checkpoint {} already exists, so no id is left; start a new log",
                u64::MAX
            ),
            ErrorKind::IdentityMismatch { stored, given } => write!(
                f,
                "this log belongs to {stored}, not {given}; open it with its own sink id and subtask"
            ),
            ErrorKind::RecordTooLarge { len, max } => write!(
                f,
                "record of {len} bytes exceeds max_record_size ({max} bytes)"
            ),
            ErrorKind::InvalidConfig { message } => write!(f, "invalid configuration: {message}"),
            ErrorKind::InvalidOperation { message } => write!(f, "invalid operation: {message}"),
            ErrorKind::NotALog { dir } => write!(
                f,
                "{dir} is not a walsink log (no WALSINK identity file); open with create enabled to start one"
            ),
            ErrorKind::BacklogFull {
                backlog_bytes,
                limit,
            } => write!(
                f,
                "backlog of {backlog_bytes} bytes reached the budget of {limit} bytes; wait for the committer"
            ),
            ErrorKind::Shutdown => f.write_str("walsink was shut down"),
            ErrorKind::DeadLettered {
                checkpoint,
                index,
                reason,
            } => write!(
                f,
                "record {index} of checkpoint {checkpoint} went to the dead-letter log: {reason}"
            ),
            ErrorKind::DeadLetterLimit {
                limit,
                checkpoint,
                index,
                reason,
            } => write!(
                f,
                "the dead-letter log already holds {limit} records, its limit, so record {index} of checkpoint {checkpoint} stays in the log and delivery stops there: {reason}"
            ),
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match &*self.0 {
            ErrorKind::Io { source, .. } => Some(source),
            ErrorKind::Sink(e) => Some(e),
            ErrorKind::CommitStore { source, .. } => Some(&**source),
            _ => None,
        }
    }
}

/// Where damage is: a file of the log directory, a byte offset in it, and what is wrong
/// there. Shared by [`ErrorKind::Corruption`], the recovery report and `verify`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Damage {
    /// File name of the segment.
    pub segment: String,
    /// Byte offset in it.
    pub offset: u64,
    /// What is wrong.
    pub reason: CorruptionReason,
}

/// How the committer should treat a sink error.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum SinkErrorClass {
    /// A passing failure (timeout, connection refused): retry with exponential backoff.
    Retryable,
    /// A failure that retrying is unlikely to fix (bad credentials, missing table): retried at
    /// the longest backoff so an operator can fix the target; never skipped.
    Permanent,
    /// The target refused the write because another log owns the shard, or this log's claim
    /// is older than the owner's (a newer generation took the shard over): nothing of the
    /// epoch was written, and retrying cannot help, so this log must stop delivering
    /// (`docs/design.md`, "Owners and generations"). Retried like a permanent error by the
    /// committer, which never skips; a program stops the log (the command line exits).
    Fenced,
    /// The target refused the data itself, for good: a constraint, a value too long, a type
    /// it cannot take, an HTTP 422. When the error names the record
    /// ([`SinkError::at_record`]) and the log has a dead-letter log
    /// ([`WalSink::set_dead_letters`](crate::WalSink::set_dead_letters)), the record goes
    /// there and the rest of the epoch is delivered again without it (`docs/design.md`,
    /// "Dead letters"); otherwise it is retried like a permanent error, never skipped.
    Rejected,
}

impl SinkErrorClass {
    /// The class as one word: `retryable`, `permanent`, `fenced`, `rejected`.
    pub fn name(self) -> &'static str {
        match self {
            SinkErrorClass::Retryable => "retryable",
            SinkErrorClass::Permanent => "permanent",
            SinkErrorClass::Fenced => "fenced",
            SinkErrorClass::Rejected => "rejected",
        }
    }

    /// The class named by [`SinkErrorClass::name`].
    pub fn from_name(name: &str) -> Option<SinkErrorClass> {
        [
            SinkErrorClass::Retryable,
            SinkErrorClass::Permanent,
            SinkErrorClass::Fenced,
            SinkErrorClass::Rejected,
        ]
        .into_iter()
        .find(|c| c.name() == name)
    }
}

/// An error returned by a [`Sink`](crate::Sink).
#[derive(Debug)]
pub struct SinkError {
    class: SinkErrorClass,
    message: String,
    code: Option<Box<str>>,
    record: Option<u64>,
    source: Option<Box<dyn std::error::Error + Send + Sync>>,
}

impl SinkError {
    fn new(class: SinkErrorClass, message: String) -> Self {
        SinkError {
            class,
            message,
            code: None,
            record: None,
            source: None,
        }
    }

    /// A retryable error.
    pub fn retryable(message: impl Into<String>) -> Self {
        SinkError::new(SinkErrorClass::Retryable, message.into())
    }

    /// A permanent error.
    pub fn permanent(message: impl Into<String>) -> Self {
        SinkError::new(SinkErrorClass::Permanent, message.into())
    }

    /// A fenced error: another log, or a newer generation of this log, owns the shard in the
    /// target ([`SinkErrorClass::Fenced`]).
    pub fn fenced(message: impl Into<String>) -> Self {
        SinkError::new(SinkErrorClass::Fenced, message.into())
    }

    /// A rejected error: the target refused the data itself, for good
    /// ([`SinkErrorClass::Rejected`]). Name the record with [`SinkError::at_record`] when the
    /// target says which one it was.
    pub fn rejected(message: impl Into<String>) -> Self {
        SinkError::new(SinkErrorClass::Rejected, message.into())
    }

    /// Names the record the target refused: its index in the epoch
    /// ([`RecordPosition::index`](crate::RecordPosition::index), the index as written, which
    /// records left out of a delivery do not change).
    pub fn at_record(mut self, index: u64) -> Self {
        self.record = Some(index);
        self
    }

    /// The index of the record the target refused, when the error names one
    /// ([`SinkError::at_record`]).
    pub fn record(&self) -> Option<u64> {
        self.record
    }

    /// Attaches the underlying error.
    pub fn with_source(
        mut self,
        source: impl Into<Box<dyn std::error::Error + Send + Sync>>,
    ) -> Self {
        self.source = Some(source.into());
        self
    }

    /// Retryable, permanent, fenced or rejected.
    pub fn class(&self) -> SinkErrorClass {
        self.class
    }

    /// Attaches the target's own code for the failure, as the target spells it: a SQLSTATE
    /// (`23514`), a MySQL error number (`1406`), an HTTP status (`422`), a Redis error prefix
    /// (`WRONGTYPE`). Classification by code belongs to the target's mapping; the code is kept
    /// so that what comes after (the command line's report, a dead-letter record) can name it
    /// without reading it back out of the message.
    pub fn with_code(mut self, code: impl Into<String>) -> Self {
        self.code = Some(code.into().into_boxed_str());
        self
    }

    /// The target's own code for the failure, when the target named one (see
    /// [`SinkError::with_code`]).
    pub fn code(&self) -> Option<&str> {
        self.code.as_deref()
    }

    /// The message, without the class that `Display` adds.
    pub fn message(&self) -> &str {
        &self.message
    }

    /// A sink that panicked, from the panic's payload (what `std::panic::catch_unwind`
    /// returns): a permanent error carrying the panic's message. Every driver (the committer
    /// thread, `deliver_ready`, the async committer) turns a panic in a sink's call into this
    /// error, so it is counted and shown in [`Health`](crate::Health) and the epoch is retried
    /// at the longest backoff like any permanent error, instead of the driver stopping.
    pub fn from_panic(payload: &(dyn std::any::Any + Send)) -> Self {
        let message = payload
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| payload.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "a panic without a message".to_string());
        SinkError::permanent(format!(
            "the sink panicked: {message}; the epoch is retried at the longest backoff until \
             the sink is fixed"
        ))
    }
}

/// A failure to read the epoch from the log, met while iterating it: retryable. The committer
/// reports the log's own error in its place.
impl From<crate::Error> for SinkError {
    fn from(e: crate::Error) -> Self {
        SinkError::retryable(format!("reading the epoch from the log failed: {e}")).with_source(e)
    }
}

impl From<std::io::Error> for SinkError {
    fn from(e: std::io::Error) -> Self {
        SinkError::retryable(e.to_string()).with_source(e)
    }
}

impl fmt::Display for SinkError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({})", self.message, self.class.name())
    }
}

impl std::error::Error for SinkError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.source.as_deref().map(|e| e as _)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sink_error_keeps_the_targets_code_apart_from_its_message() {
        let e = SinkError::permanent("insert failed").with_code("23514");
        assert_eq!(e.code(), Some("23514"));
        assert_eq!(e.message(), "insert failed");
        assert_eq!(e.to_string(), "insert failed (permanent)");
        assert_eq!(SinkError::retryable("x").code(), None);
    }

    #[test]
    fn error_is_one_pointer() {
        assert_eq!(std::mem::size_of::<Error>(), std::mem::size_of::<usize>());
    }

    #[test]
    fn corruption_message_names_segment_and_offset() {
        let e = Error::corruption(
            "00000000000000000002.wseg",
            4096,
            CorruptionReason::BadHeader,
        );
        let s = e.to_string();
        assert!(s.contains("00000000000000000002.wseg"), "{s}");
        assert!(s.contains("4096"), "{s}");
    }

    #[test]
    fn io_error_has_source() {
        use std::error::Error as _;
        let e = Error::io("sync", io::Error::other("boom"));
        assert!(e.source().is_some());
    }
}
