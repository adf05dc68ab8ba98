//! Applying recovery: deciding on the damage a scan found (per [`RecoveryMode`]), rebuilding
//! the epoch catalog from the control frames of the valid prefix, and repairing the directory
//! (cut, set aside, sync) before anything new is written. The rules are `docs/design.md`
//! ("Recovery"); the scan itself is `scan.rs`.

use crate::config::{Mode, Options, RecoveryMode};
use crate::delivery::catalog::Catalog;
use crate::error::{CorruptionReason, Damage, Error, Result};
use crate::log::format::{self, FrameKind, Position};
use crate::log::layout::{self, TMP_SUFFIX};
use crate::log::scan::{self, Event, Scan};
use crate::storage::Storage;

/// What [`WalSink::open`](crate::WalSink::open) found and did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct RecoveryReport {
    /// Segment files in the log after recovery (the new active one included).
    pub segments: usize,
    /// Newest sealed checkpoint that survives (committed or not, not voided by a restore).
    pub last_checkpoint: Option<u64>,
    /// Its metadata blob (for example the source offset to resume from).
    pub last_metadata: Option<Vec<u8>>,
    /// Sealed checkpoints not yet committed, oldest first.
    pub pending: Vec<u64>,
    /// Records in those checkpoints.
    pub pending_records: u64,
    /// Highest committed checkpoint according to the commit store.
    pub committed: Option<u64>,
    /// The smallest id the next `checkpoint` may use.
    pub next_checkpoint_id: u64,
    /// Unsealed records after the last checkpoint, discarded (the source replays them).
    pub unsealed_records_dropped: u64,
    /// Payload bytes of those records.
    pub unsealed_bytes_dropped: u64,
    /// Bytes of valid frames after the cut that recovery dropped (the unsealed records with
    /// their headers and padding); torn bytes beyond them are located by `torn_tail`.
    pub bytes_after_cut: u64,
    /// Where a torn tail (left by a sync that did not finish) was cut off.
    pub torn_tail: Option<Damage>,
    /// Corruption of durable data, kept going past only in
    /// [`RecoveryMode::TruncateAtCorruption`].
    pub corruption: Option<Damage>,
    /// Checkpoint ids whose barriers verified but lay after the damage, and were dropped.
    pub checkpoints_dropped: Vec<u64>,
    /// Files renamed to `*.damaged` (lenient mode only; never deleted).
    pub moved_aside: Vec<String>,
    /// Files in the directory that are not part of a log (left alone).
    pub unexpected_files: Vec<String>,
}

/// The outcome of [`recover`]: what the log holds and where new frames go.
pub(crate) struct Recovered {
    pub cat: Catalog,
    pub report: RecoveryReport,
    /// Smallest id the next checkpoint may use; `None` when checkpoint `u64::MAX` exists.
    pub min_next_id: Option<u64>,
    /// Sequence number of the segment new frames go to.
    pub next_seq: u64,
    /// Everything before this position is durable once recovery returns: the cut (all kept
    /// segments were synced). New control frames claim it, so a front lost later is seen.
    pub durable_end: Position,
    /// Segments kept, ascending.
    pub keep: Vec<u64>,
    /// Free segments available for reuse.
    pub free: Vec<u64>,
}

/// Scans the log in `storage`, decides, rebuilds the catalog and repairs the directory. On
/// return everything kept is durable and the directory holds no segment after the cut.
pub(crate) fn recover(
    storage: &dyn Storage,
    options: &Options,
    committed: Option<u64>,
    fresh: bool,
) -> Result<Recovered> {
    let mut scan = scan::scan(storage)?;
    if fresh && scan.segments.is_empty() {
        // This open created the log: no segment is missing.
        scan.damage = None;
    }
    let mut report = decide(&scan, options.recovery_mode, committed)?;
    let (cat, min_next_id) = rebuild_catalog(&scan, committed, options, &mut report)?;
    let keep = repair(storage, &scan, &mut report)?;
    let next_seq = match scan.segments.first() {
        Some(_) => scan.cut.seq + 1,
        None => scan.max_seq_seen + 1,
    };
    Ok(Recovered {
        cat,
        report,
        min_next_id,
        next_seq,
        durable_end: match scan.segments.first() {
            Some(_) if scan.cut_seed.is_some() => scan.cut,
            _ => Position {
                seq: next_seq,
                offset: 0,
            },
        },
        keep,
        free: scan.free.clone(),
    })
}

/// Starts the report and decides on the damage: an error, or what to cut.
fn decide(scan: &Scan, mode: RecoveryMode, committed: Option<u64>) -> Result<RecoveryReport> {
    let mut report = RecoveryReport {
        committed,
        unsealed_records_dropped: scan.tail_records,
        unsealed_bytes_dropped: scan.tail_bytes,
        bytes_after_cut: scan.tail_frame_bytes,
        unexpected_files: scan.unexpected.clone(),
        ..Default::default()
    };
    if let Some((_, damage)) = &scan.damage {
        let durable = scan.damage_is_durable();
        let fail = match mode {
            RecoveryMode::Strict => {
                !matches!(damage.reason, CorruptionReason::Unwritten) || durable
            }
            RecoveryMode::TolerateTornTail => durable,
            RecoveryMode::TruncateAtCorruption => false,
        };
        if fail {
            return Err(Error::corruption(
                damage.segment.clone(),
                damage.offset,
                damage.reason.clone(),
            ));
        }
        if durable {
            report.corruption = Some(damage.clone());
        } else {
            report.torn_tail = Some(damage.clone());
        }
        report.checkpoints_dropped = scan.barriers_after_damage.clone();
    }
    // Segments lost from the front: what they held was durable and is gone. Lenient recovery
    // keeps what is there and reports it.
    if let Some(lost) = scan.lost_front(committed) {
        if mode != RecoveryMode::TruncateAtCorruption {
            return Err(Error::corruption(lost.segment, lost.offset, lost.reason));
        }
        report.corruption.get_or_insert(lost);
    }

    Ok(report)
}

/// Rebuilds the catalog from the control frames; returns it and the smallest allowed next id
/// (`None` once checkpoint `u64::MAX` exists: no id is left).
fn rebuild_catalog(
    scan: &Scan,
    committed: Option<u64>,
    options: &Options,
    report: &mut RecoveryReport,
) -> Result<(Catalog, Option<u64>)> {
    let mut cat = Catalog::default();
    cat.committed = committed;
    // Ids are never reused: not committed ones, not any barrier seen, not even the ones a
    // lenient recovery dropped (a target keeping its own marker may hold them).
    let mut next_id = Some(0u64);
    let mut at_least = |id: u64| {
        next_id = next_id.and_then(|n| Some(n.max(id.checked_add(1)?)));
    };
    if let Some(c) = committed {
        at_least(c);
    }
    for &id in &scan.barriers_after_damage {
        at_least(id);
    }
    // Surviving barriers (not voided by a later restore), with their metadata and position.
    let mut barriers: Vec<(u64, Vec<u8>, crate::log::format::Position)> = Vec::new();
    let mut partial = Vec::new();
    for ev in &scan.events {
        match ev {
            Event::Barrier(e) => {
                if e.partial {
                    partial.push(e);
                }
                at_least(e.info.id);
                barriers.push((e.info.id, e.info.metadata.to_vec(), e.info.barrier));
                if committed.is_none_or(|c| e.info.id > c) {
                    cat.seal(e.info.clone());
                }
            }
            Event::Reserve(id) => at_least(*id),
            Event::Restore { restored_to } => {
                barriers.retain(|(id, _, _)| {
                    restored_to.is_some_and(|t| *id <= t) || committed.is_some_and(|c| *id <= c)
                });
                let completed = cat.completed;
                cat.restore(*restored_to);
                cat.completed = completed;
            }
        }
    }
    // An epoch whose first frames are gone (its segments were freed) is fine only if it
    // was committed or voided; one that is still pending lost data.
    // Lenient recovery drops such an epoch and reports it; the other modes refuse.
    let pending_partial: Vec<_> = partial
        .into_iter()
        .filter(|e| cat.epochs.iter().any(|p| p.id == e.info.id))
        .collect();
    for e in pending_partial {
        let damage = Damage {
            segment: format::segment_name(e.info.barrier.seq),
            offset: e.info.barrier.offset,
            reason: CorruptionReason::IncompleteEpoch {
                checkpoint: e.info.id,
                expected: e.info.records,
                found: e.found,
            },
        };
        if options.recovery_mode != RecoveryMode::TruncateAtCorruption {
            return Err(Error::corruption(
                damage.segment,
                damage.offset,
                damage.reason,
            ));
        }
        cat.forget(e.info.id);
        barriers.retain(|(id, _, _)| *id != e.info.id);
        report.checkpoints_dropped.push(e.info.id);
        report.corruption.get_or_insert(damage);
    }
    cat.committed_barrier = barriers
        .iter()
        .rev()
        .find(|(id, _, _)| committed.is_some_and(|c| *id <= c))
        .map(|(_, _, pos)| *pos);
    if let Some((id, meta, _)) = barriers.pop() {
        report.last_checkpoint = Some(id);
        report.last_metadata = Some(meta);
    }
    if options.mode == Mode::Durable {
        if let Some(last) = cat.epochs.back().map(|e| e.id) {
            cat.complete(last);
        }
    }

    Ok((cat, next_id))
}

/// Cuts at the end of the last control frame, drops (or, after corruption, sets aside) what
/// follows, and makes everything kept durable. Returns the segments kept.
fn repair(storage: &dyn Storage, scan: &Scan, report: &mut RecoveryReport) -> Result<Vec<u64>> {
    // Segments after damage to synced data are set aside, never removed; those after a torn
    // tail are what an unfinished sync left and go.
    let lenient = scan.damage.is_some() && scan.damage_is_durable();
    // Repair: cut at the end of the last control frame, drop (or set aside) what follows,
    // and make everything kept durable before anything new is written.
    let mut keep: Vec<u64> = scan.segments.clone();
    if !scan.segments.is_empty() {
        let cut = scan.cut;
        // A cut segment without a readable header (no control frame survived in the first
        // segment) holds nothing to keep: it goes too. Kept, it would stand before the new
        // segments with an unreadable header, and the next barrier's `durable_through` would
        // turn that into corruption of synced data.
        let headerless = scan.cut_seed.is_none();
        let (kept, dropped): (Vec<u64>, Vec<u64>) = scan
            .segments
            .iter()
            .partition(|&&s| s < cut.seq || (s == cut.seq && !headerless));
        keep = kept;
        let mut names = AsideNames::new(storage)?;
        if lenient {
            let damaged_seq = scan.damage.as_ref().map(|(p, _)| p.seq);
            if damaged_seq == Some(cut.seq) && !headerless {
                let name = format::segment_name(cut.seq);
                let aside = names.next(&name);
                copy_aside(storage, &name, &aside)?;
                report.moved_aside.push(aside);
            }
            for s in &dropped {
                let name = format::segment_name(*s);
                let aside = names.next(&name);
                storage
                    .rename(&name, &aside)
                    .map_err(|e| Error::io(format!("move {name} aside"), e))?;
                report.moved_aside.push(aside);
            }
        } else {
            for s in &dropped {
                let name = format::segment_name(*s);
                storage
                    .remove(&name)
                    .map_err(|e| Error::io(format!("remove torn segment {name}"), e))?;
            }
        }
        // The segments after the cut must be gone for good before the cut segment gets
        // its closing frame: otherwise a crash could let the next recovery read them as
        // the continuation of the log.
        if !dropped.is_empty() {
            storage
                .sync_dir()
                .map_err(|e| Error::io(format!("sync directory {}", storage.describe()), e))?;
        }
        if let (false, Some(seed)) = (scan.cut_is_segment_end, scan.cut_seed) {
            let name = format::segment_name(cut.seq);
            let file = storage
                .open(&name)
                .map_err(|e| Error::io(format!("open segment {name}"), e))?;
            let mut frame = Vec::with_capacity(format::FRAME_HEADER_LEN * 2);
            format::encode_frame(&mut frame, seed, cut.offset, FrameKind::SegmentEnd, &[]);
            file.write_at(cut.offset, &frame).map_err(|e| {
                Error::io(format!("close segment {name} at offset {}", cut.offset), e)
            })?;
        }
        for s in &keep {
            let name = format::segment_name(*s);
            let f = storage
                .open(&name)
                .map_err(|e| Error::io(format!("open segment {name}"), e))?;
            f.sync_data()
                .map_err(|e| Error::io(format!("sync segment {name}"), e))?;
        }
    }
    for name in scan.leftovers.iter().filter(|n| n.ends_with(TMP_SUFFIX)) {
        storage
            .remove(name)
            .map_err(|e| Error::io(format!("remove leftover {name}"), e))?;
    }
    for name in &scan.stale_free {
        storage
            .remove(name)
            .map_err(|e| Error::io(format!("remove stale free segment {name}"), e))?;
    }
    Ok(keep)
}

/// Names for segments set aside: `NAME.damaged`, or `NAME.K.damaged` when an earlier recovery
/// already used that name. Set-aside files are never overwritten (nor deleted).
struct AsideNames(std::collections::HashSet<String>);

impl AsideNames {
    fn new(storage: &dyn Storage) -> Result<Self> {
        let names = storage
            .list()
            .map_err(|e| Error::io(format!("list {}", storage.describe()), e))?;
        Ok(AsideNames(names.into_iter().collect()))
    }

    fn next(&mut self, name: &str) -> String {
        let aside = layout::set_aside_name(name, |n| self.0.contains(n));
        self.0.insert(aside.clone());
        aside
    }
}

fn copy_aside(storage: &dyn Storage, name: &str, aside: &str) -> Result<()> {
    let src = storage
        .open(name)
        .map_err(|e| Error::io(format!("open {name}"), e))?;
    let data = src
        .len()
        .and_then(|len| src.read_range(0, len as usize))
        .map_err(|e| Error::io(format!("read {name}"), e))?;
    let dst = storage
        .create(aside)
        .map_err(|e| Error::io(format!("create {aside}"), e))?;
    dst.write_at(0, &data)
        .and_then(|_| dst.sync_data())
        .map_err(|e| Error::io(format!("write {aside}"), e))
}
