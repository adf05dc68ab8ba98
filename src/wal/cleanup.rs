//! Freeing segments: which part of the log is still needed, and removing or recycling the
//! segments below it, oldest first; and trimming the free files kept for reuse.
//!
//! Removing a file is the slow part of freeing: at its last close the kernel drops its cached
//! pages and frees its blocks, and on a filesystem mounted with `discard` it waits for the
//! device to discard them. Done while delivery runs, that work competes with it for the
//! device and the CPU (it halved delivery on a machine measured in docs/benchmarks.md). So a
//! freed segment is renamed to `.free` (when recycling is on), and the free files beyond
//! `max_free_segments` are removed when delivery has nothing to do, and, while a backlog
//! drains, one per [`TRIM_EVERY`] segments freed, so the log's disk use never grows and still
//! shrinks during a long drain. Appends take free files before they create one, so a surplus
//! never makes the log need more space, and a commit mark that finds the disk full gives a
//! free file's blocks back first ([`Shared::with_room`]), so a surplus never keeps a full disk
//! from draining.

use super::{Freeing, Shared};
use crate::delivery::commit_store::CommitStore;
use crate::error::{Error, ErrorKind, Result};
use crate::log::files::remove_free_file;
use crate::log::format::{self, Position};
use crate::storage::reserve;

/// While delivery is busy, one free file beyond `max_free_segments` is removed per this many
/// segments freed; the rest wait until nothing is deliverable.
pub(crate) const TRIM_EVERY: u32 = 16;

impl Shared {
    /// Position below which no live frame remains: the start of the oldest uncommitted epoch,
    /// the open epoch, the epochs voided by a restore that is not durable yet, or the barrier
    /// of the highest committed checkpoint (kept for its metadata), whichever is first.
    pub(crate) fn oldest_needed(&self) -> Position {
        let mut w = self.w.lock();
        let mut oldest = w.open_start.unwrap_or_else(|| w.seg.position());
        if let Some(e) = w.unsynced.first() {
            oldest = oldest.min(e.start);
        }
        if let Some((floor, end)) = w.restore_guard {
            if w.synced >= end {
                w.restore_guard = None;
            } else {
                oldest = oldest.min(floor);
            }
        }
        let cat = self.cat.lock();
        if let Some(e) = cat.epochs.front() {
            oldest = oldest.min(e.start);
        }
        if let Some(b) = cat.committed_barrier {
            oldest = oldest.min(b);
        }
        oldest
    }

    /// Deletes or recycles whole segments below [`Self::oldest_needed`], oldest first, with a
    /// directory sync after each so the remaining segments always form a contiguous run.
    /// Called only right after a mark (or after finding the commit store's mark covers the
    /// next epoch), once the commit store durably covers every epoch in them. With recycling
    /// on, every freed segment becomes a `.free` file; one beyond `max_free_segments` is
    /// removed per [`TRIM_EVERY`] freed, the rest by [`Self::trim_idle`].
    pub(crate) fn collect_garbage(&self) -> Result<()> {
        let mut pass = self.freeing.lock();
        let oldest = self.oldest_needed();
        let mut floor_raised = false;
        loop {
            let seq = {
                let cat = self.cat.lock();
                match cat.segments.front() {
                    Some(&s) if s < oldest.seq && cat.segments.len() > 1 => s,
                    _ => break,
                }
            };
            let recycle = self.opts.recycle_segments;
            if let (Some(floor), false) = (&self.floor, floor_raised) {
                let committed = self.cat.lock().committed;
                if let Some(c) = committed {
                    self.with_room(|| {
                        floor
                            .lock()
                            .mark_committed(&self.sink_id, self.opts.subtask, c)
                    })?;
                }
                floor_raised = true;
            }
            let name = format::segment_name(seq);
            let free = format::free_name(seq);
            let res = if recycle {
                self.storage.rename(&name, &free)
            } else {
                self.storage.remove(&name)
            };
            // Gone already: an earlier attempt removed or renamed it and then failed to sync
            // the directory. The sync below is what still has to happen; the file is reused
            // only if that attempt kept it as `.free`.
            let recycled = match res {
                Ok(()) => recycle,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                    self.storage.open(&free).is_ok()
                }
                Err(e) if recycle => {
                    let what = format!("rename committed segment {name} to {free}");
                    return Err(Error::io(what, e));
                }
                Err(e) => return Err(Error::io(format!("remove committed segment {name}"), e)),
            };
            self.storage.sync_dir().map_err(|e| {
                Error::io(
                    format!("sync the directory after freeing segment {name}"),
                    e,
                )
            })?;
            let mut cat = self.cat.lock();
            cat.segments.pop_front();
            if recycled {
                cat.free.push(seq);
            }
            pass.since_trim = pass.since_trim.saturating_add(1);
        }
        self.trim_free(&mut pass, false)
    }

    /// Free files kept once delivery is idle: `max_free_segments`, or none when recycling is
    /// off (nothing would ever reuse them; an earlier run with recycling may have left some).
    fn free_bound(&self) -> usize {
        if self.opts.recycle_segments {
            self.opts.max_free_segments
        } else {
            0
        }
    }

    /// Removes every free file beyond the bound: for a deliverer that found nothing
    /// deliverable. A lock and a comparison when there is nothing to remove. (Segments are
    /// freed only by the pass after a mark, never here: recovery relies on nothing being freed
    /// before the first commit, and on the highest checkpoint id ever used staying in a kept
    /// frame, which a pass between a restore and the next mark could free.)
    pub(crate) fn trim_idle(&self) -> Result<()> {
        if self.cat.lock().free.len() <= self.free_bound() {
            return Ok(());
        }
        self.trim_free(&mut self.freeing.lock(), true)
    }

    /// Removes free files beyond the bound, oldest first: all of them when `idle`, else one
    /// per [`TRIM_EVERY`] segments freed since the last.
    fn trim_free(&self, pass: &mut Freeing, idle: bool) -> Result<()> {
        loop {
            if !idle && pass.since_trim < TRIM_EVERY {
                return Ok(());
            }
            if !self.remove_oldest_free(self.free_bound(), false)? {
                return Ok(());
            }
            if !idle {
                pass.since_trim -= TRIM_EVERY;
            }
        }
    }

    /// Runs `f` (a write of the commit store), and when it fails for want of space while free
    /// files hold some, gives the oldest free file's blocks back and runs it again: the space
    /// a drain keeps for reuse must never keep a full disk from recording the commits that
    /// drain it.
    pub(crate) fn with_room<T>(&self, mut f: impl FnMut() -> Result<T>) -> Result<T> {
        loop {
            match f() {
                Err(e) if is_disk_full(&e) && self.remove_oldest_free(0, true)? => {}
                r => return r,
            }
        }
    }

    /// Removes the oldest free file (appends reuse the newest first) if more than `keep` are
    /// kept, as [`remove_free_file`] does (`now`: its blocks given back at once). False when
    /// there was none to remove. A file that could not be removed stays in the list, for a
    /// later pass.
    fn remove_oldest_free(&self, keep: usize, now: bool) -> Result<bool> {
        let Some(seq) = ({
            let mut cat = self.cat.lock();
            (cat.free.len() > keep).then(|| cat.free.remove(0))
        }) else {
            return Ok(false);
        };
        let name = format::free_name(seq);
        remove_free_file(&*self.storage, &name, now).map_err(|e| {
            self.cat.lock().free.insert(0, seq);
            Error::io(format!("remove free segment {name}"), e)
        })?;
        Ok(true)
    }
}

/// Whether `e` is an I/O error saying the disk (or the quota) is full.
pub(crate) fn is_disk_full(e: &Error) -> bool {
    matches!(e.kind(), ErrorKind::Io { source, .. } if reserve::is_full(source))
}
