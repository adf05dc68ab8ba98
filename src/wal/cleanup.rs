//! Freeing segments: which part of the log is still needed, and removing or recycling the
//! segments below it, oldest first.

use super::Shared;
use crate::delivery::commit_store::CommitStore;
use crate::error::{Error, Result};
use crate::log::format::{self, Position};

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
    /// Called only after the commit store durably covers every epoch in them.
    pub(crate) fn collect_garbage(&self) -> Result<()> {
        let _one_pass = self.freeing.lock();
        let oldest = self.oldest_needed();
        let mut floor_raised = false;
        loop {
            let (seq, recycle) = {
                let cat = self.cat.lock();
                match cat.segments.front() {
                    Some(&s) if s < oldest.seq && cat.segments.len() > 1 => (
                        s,
                        self.opts.recycle_segments && cat.free.len() < self.opts.max_free_segments,
                    ),
                    _ => return Ok(()),
                }
            };
            if let (Some(floor), false) = (&self.floor, floor_raised) {
                let committed = self.cat.lock().committed;
                if let Some(c) = committed {
                    floor
                        .lock()
                        .mark_committed(&self.sink_id, self.opts.subtask, c)?;
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
                Ok(()) => Ok(recycle),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                    Ok(self.storage.open(&free).is_ok())
                }
                Err(e) => Err(e),
            };
            let recycled = recycled
                .and_then(|r| self.storage.sync_dir().map(|_| r))
                .map_err(|e| Error::io(format!("remove committed segment {name}"), e))?;
            let mut cat = self.cat.lock();
            cat.segments.pop_front();
            if recycled {
                cat.free.push(seq);
            }
        }
    }
}
