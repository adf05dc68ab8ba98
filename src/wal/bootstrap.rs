//! Opening a log's directory before recovery: the lock, the identity file, and after
//! recovery the reservation of the checkpoint ids it dropped.

use crate::config::Options;
use crate::error::{CorruptionReason, Error, ErrorKind, Result};
use crate::log::format::{self, FrameKind, Position};
use crate::log::layout::{IDENTITY_FILE, LOCK_FILE};
use crate::log::recover::RecoveryReport;
use crate::log::segment::SegmentWriter;
use crate::storage::Storage;

/// Takes the directory lock. A lock released a moment ago can still look held while a child
/// process forked by any thread has not yet exec'd (it shares the lock file's description), so
/// a busy lock is retried for up to 100 ms before it is reported as `Locked`.
pub(super) fn take_lock(storage: &dyn Storage) -> Result<Box<dyn Send + Sync + std::fmt::Debug>> {
    let mut attempts = 0;
    loop {
        match storage.lock(LOCK_FILE) {
            Ok(guard) => return Ok(guard),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock && attempts < 20 => {
                attempts += 1;
                std::thread::sleep(std::time::Duration::from_millis(5));
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                return Err(ErrorKind::Locked {
                    dir: storage.describe(),
                }
                .into())
            }
            Err(e) => return Err(Error::io(format!("lock {}", storage.describe()), e)),
        }
    }
}

/// Checks (or, for a new log, writes) the identity file. Returns whether this call created the
/// log, and the log's id (written now for a new log, or for one made before log ids).
pub(super) fn check_identity(storage: &dyn Storage, options: &Options) -> Result<(bool, String)> {
    let names = storage
        .list()
        .map_err(|e| Error::io(format!("list {}", storage.describe()), e))?;
    let given = format!("{}/{}", options.sink_id, options.subtask);
    let write = |log_id: &str| {
        crate::log::files::replace(
            storage,
            IDENTITY_FILE,
            &format::encode_identity(&options.sink_id, options.subtask, log_id),
        )
        .map_err(|e| Error::io("write the identity file", e))
    };
    if let Some(found) = crate::log::files::read_identity(storage)? {
        if found.sink_id != options.sink_id || found.subtask != options.subtask {
            return Err(ErrorKind::IdentityMismatch {
                stored: format!("{}/{}", found.sink_id, found.subtask),
                given,
            }
            .into());
        }
        let log_id = match found.log_id {
            Some(l) => l,
            None => {
                let l = new_log_id();
                write(&l)?;
                l
            }
        };
        return Ok((false, log_id));
    }
    if names
        .iter()
        .any(|n| format::parse_numbered(n, "wseg").is_some())
    {
        // Segments without an identity: someone removed it. Refuse to guess whose log it is.
        return Err(Error::corruption(
            IDENTITY_FILE,
            0,
            CorruptionReason::BadHeader,
        ));
    }
    if !options.create {
        return Err(ErrorKind::NotALog {
            dir: storage.describe(),
        }
        .into());
    }
    let log_id = new_log_id();
    write(&log_id)?;
    Ok((true, log_id))
}

/// A new log id: 128 random bits as 32 lowercase hex digits, from the operating system's
/// randomness mixed with the time and the process id (two logs made at once by two processes
/// must not share one).
fn new_log_id() -> String {
    use std::hash::{BuildHasher, Hasher};
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let mut words = [0u64; 2];
    for (i, w) in words.iter_mut().enumerate() {
        // RandomState is seeded from the operating system's randomness per process (and
        // differs per instance within one).
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u128(nanos);
        h.write_u32(std::process::id());
        h.write_usize(i);
        *w = h.finish() ^ fastrand::u64(..);
    }
    format!("{:016x}{:016x}", words[0], words[1])
}

/// Recovery dropped checkpoints whose barriers it could still read (after damage, in any
/// mode), and their segments are gone or set aside now. So that no later open hands out those
/// ids again (a target keeping its own marker may hold their epochs), the newest of them is
/// reserved: an id-reservation barrier (`docs/design.md`, "Recovery") goes into the new
/// segment and is made durable before `open` returns. Returns the position everything before
/// is durable up to when it wrote one.
pub(super) fn reserve_dropped_ids(
    storage: &dyn Storage,
    seg: &mut SegmentWriter,
    report: &RecoveryReport,
    durable_end: Position,
) -> Result<Option<Position>> {
    let start = Position {
        seq: seg.seq(),
        offset: 0,
    };
    // Ids at or below the commit mark can never be handed out again anyway.
    let Some(&id) = report
        .checkpoints_dropped
        .iter()
        .filter(|&&id| report.committed.is_none_or(|c| id > c))
        .max()
    else {
        return Ok(None);
    };
    let io = |e| {
        Error::io(
            format!("write segment {}", format::segment_name(start.seq)),
            e,
        )
    };
    let reservation = format::Barrier::reservation(id, durable_end);
    seg.append(FrameKind::Barrier, &[&reservation.encode_fixed()])
        .map_err(io)?;
    seg.take_sync_set()
        .map_err(io)?
        .sync(storage)
        .map_err(|(context, e)| Error::io(context, e))?;
    Ok(Some(seg.position()))
}
