//! The commit store: which checkpoints are committed, per (sink id, subtask).
//!
//! walsink commits strictly in checkpoint order and never passes a failed epoch, so a
//! high-water mark is exact: "committed through `k`" means every checkpoint `<= k` of that
//! sink and subtask is in the target, and none above it was committed out of order.

use crate::error::{Error, Result};
use crate::log::format;
use crate::log::layout::COMMIT_FILE;
use crate::storage::{self, Storage};
use std::sync::Arc;

/// Records committed checkpoints outside the log's own state.
///
/// # Contract
/// - `mark_committed(sink, subtask, k)` returns `Ok` only once the mark is durable; it is
///   called with increasing `k` for a given `(sink, subtask)`, possibly skipping ids (a run of
///   epochs is marked by its last id).
/// - `last_committed` answers the highest `k` marked for `(sink, subtask)`, or `None`.
/// - Errors lose nothing: the committer retries with backoff and never delivers past them.
pub trait CommitStore: Send {
    /// The highest checkpoint committed for `(sink_id, subtask)`.
    fn last_committed(&mut self, sink_id: &str, subtask: u32) -> Result<Option<u64>>;
    /// Records that every checkpoint `<= checkpoint` of `(sink_id, subtask)` is committed.
    fn mark_committed(&mut self, sink_id: &str, subtask: u32, checkpoint: u64) -> Result<()>;

    /// Whether marks are still there after a restart. Default true.
    ///
    /// A store that forgets (such as [`MemoryCommitStore`]) returns false. walsink then keeps
    /// its own durable floor in the log directory (the `COMMITTED` file of
    /// [`LocalCommitStore`]) and raises it before it frees any segment, because after a
    /// restart only what is durable can tell a committed epoch whose segments were freed from
    /// a pending one that lost its data.
    fn survives_restart(&self) -> bool {
        true
    }
}

/// The default commit store: a small checksummed file `COMMITTED` in the log directory,
/// replaced atomically (temporary file, sync, rename, directory sync) on each mark.
#[derive(Debug)]
pub struct LocalCommitStore {
    storage: Arc<dyn Storage>,
    sink_id: String,
    subtask: u32,
    cached: Option<Option<u64>>,
    /// The directory's reserve is known to be there (see [`storage::reserve`]).
    reserved: bool,
}

impl LocalCommitStore {
    /// The store of the log in `storage`, which belongs to `(sink_id, subtask)`.
    pub fn new(storage: Arc<dyn Storage>, sink_id: &str, subtask: u32) -> Self {
        LocalCommitStore {
            storage,
            sink_id: sink_id.to_string(),
            subtask,
            cached: None,
            reserved: false,
        }
    }

    fn check_key(&self, sink_id: &str, subtask: u32) -> Result<()> {
        if sink_id != self.sink_id || subtask != self.subtask {
            return Err(Error::invalid_op(format!(
                "the local commit store belongs to {}/{}, not {sink_id}/{subtask}",
                self.sink_id, self.subtask
            )));
        }
        Ok(())
    }

    /// Reads the mark from disk (no cache).
    pub(crate) fn read(storage: &dyn Storage) -> Result<Option<u64>> {
        Ok(
            crate::log::files::read_small_file(storage, COMMIT_FILE, format::decode_commit)?
                .flatten(),
        )
    }
}

impl CommitStore for LocalCommitStore {
    fn last_committed(&mut self, sink_id: &str, subtask: u32) -> Result<Option<u64>> {
        self.check_key(sink_id, subtask)?;
        if let Some(c) = self.cached {
            return Ok(c);
        }
        let c = Self::read(&*self.storage)?;
        self.cached = Some(c);
        Ok(c)
    }

    fn mark_committed(&mut self, sink_id: &str, subtask: u32, checkpoint: u64) -> Result<()> {
        let current = self.last_committed(sink_id, subtask)?;
        if current.is_some_and(|c| c >= checkpoint) {
            return Ok(());
        }
        let data = format::encode_commit(Some(checkpoint));
        let st = &*self.storage;
        let mut released = false;
        match crate::log::files::replace(st, COMMIT_FILE, &data) {
            // The disk is full: the reserve kept room for this record, which lets delivery
            // free the segments that fill it.
            Err(e) if storage::reserve::is_full(&e) && storage::reserve::release(st) => {
                released = true;
                self.reserved = false;
                crate::log::files::replace(st, COMMIT_FILE, &data)
            }
            r => r,
        }
        .map_err(|e| Error::io("record a commit in the commit store", e))?;
        self.cached = Some(Some(checkpoint));
        // The reserve comes back at a later record, once delivery may have freed room (not
        // now: it would take the room the next record needs).
        if !self.reserved && !released {
            self.reserved = storage::reserve::keep(st);
        }
        Ok(())
    }
}

/// A commit store that keeps marks in memory only, for tests and for sinks that store their
/// own marker. Clones share the marks.
///
/// Marks are gone after a restart ([`CommitStore::survives_restart`] is false): walsink then
/// keeps a durable floor of its own before it frees segments, and a sink that stores its
/// marker answers for the epochs above it, so delivery stays exactly-once.
#[derive(Debug, Clone, Default)]
pub struct MemoryCommitStore {
    marks: Arc<parking_lot::Mutex<std::collections::HashMap<(String, u32), u64>>>,
}

impl MemoryCommitStore {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }
}

impl CommitStore for MemoryCommitStore {
    fn last_committed(&mut self, sink_id: &str, subtask: u32) -> Result<Option<u64>> {
        Ok(self
            .marks
            .lock()
            .get(&(sink_id.to_string(), subtask))
            .copied())
    }

    fn mark_committed(&mut self, sink_id: &str, subtask: u32, checkpoint: u64) -> Result<()> {
        let mut m = self.marks.lock();
        let e = m
            .entry((sink_id.to_string(), subtask))
            .or_insert(checkpoint);
        *e = (*e).max(checkpoint);
        Ok(())
    }

    fn survives_restart(&self) -> bool {
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::{CrashOptions, SimStorage};

    #[test]
    fn local_mark_survives_crash_and_is_monotonic() {
        let sim = SimStorage::new();
        let mut s = LocalCommitStore::new(Arc::new(sim.clone()), "a", 0);
        assert_eq!(s.last_committed("a", 0).unwrap(), None);
        s.mark_committed("a", 0, 5).unwrap();
        s.mark_committed("a", 0, 3).unwrap();
        assert_eq!(s.last_committed("a", 0).unwrap(), Some(5));
        assert!(s.last_committed("b", 0).is_err());
        sim.crash(CrashOptions {
            seed: 3,
            lose_all_unsynced: true,
            process_only: false,
        });
        assert_eq!(LocalCommitStore::read(&sim).unwrap(), Some(5));
    }
}
