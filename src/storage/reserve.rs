//! Room kept in a log directory for the commit mark on a full disk.
//!
//! Delivery frees segments only after it has recorded the commit (`COMMITTED`, replaced
//! through a temporary file); on a disk with no block left, that record would fail for ever,
//! and the log could never drain the data that fills the disk. So an open log keeps
//! [`RESERVE_FILE`](crate::log::layout::RESERVE_FILE): [`SIZE`] bytes of
//! zeros, written and synced so their blocks exist. A record that fails for want of space
//! removes it and tries once more; the reserve comes back at a later record, once delivery
//! has freed room. It holds nothing: losing it in a crash, or finding it cut short, changes
//! nothing but the room it keeps.

use super::Storage;
use crate::log::layout::RESERVE_FILE;
use std::io;

/// Bytes kept: room for a few temporary files of the commit mark, whatever the block size.
pub(crate) const SIZE: usize = 64 << 10;

/// Whether `e` says the disk (or the quota) is full.
pub(crate) fn is_full(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::StorageFull | io::ErrorKind::QuotaExceeded
    )
}

/// Writes the reserve if it is missing or short. Best effort: false if it could not (a
/// full disk), and then what it had taken is given back at once.
pub(crate) fn keep(storage: &dyn Storage) -> bool {
    if let Ok(f) = storage.open(RESERVE_FILE) {
        if f.len().is_ok_and(|n| n >= SIZE as u64) {
            return true;
        }
    }
    let made = storage.create(RESERVE_FILE).and_then(|f| {
        f.write_at(0, &[0u8; SIZE])?;
        f.sync_data()
    });
    if made.is_err() {
        release(storage);
    }
    made.is_ok()
}

/// Frees the reserve's room now; false if there was none. It is cut to nothing first: a
/// removed file's blocks come back only when its last handle closes, which a storage may
/// do later.
pub(crate) fn release(storage: &dyn Storage) -> bool {
    let Ok(f) = storage.open(RESERVE_FILE) else {
        return false;
    };
    let cut = f.set_len(0);
    drop(f);
    let _ = storage.remove(RESERVE_FILE);
    cut.is_ok()
}
