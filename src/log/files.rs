//! The log's small files through the storage seam: the one reader of the identity file and
//! of the commit mark's file, and the atomic replace that writes them (`docs/design.md`,
//! "Directory layout"). File names come from [`layout`]; the storage seam knows none.

use crate::error::{CorruptionReason, Error, ErrorKind, Result};
use crate::log::format;
use crate::log::layout::{self, IDENTITY_FILE};
use crate::storage::{self, Storage};

/// Reads the identity file: `Ok(None)` when there is none; an unreadable one is corruption
/// (or an unknown version).
pub(crate) fn read_identity(storage: &dyn Storage) -> Result<Option<format::Identity>> {
    read_small_file(storage, IDENTITY_FILE, format::decode_identity)
}

/// Reads and decodes the small checksummed file `name` (identity, commit mark): `Ok(None)`
/// when it is not there; one that does not decode is corruption naming it, or an unknown
/// version.
pub(crate) fn read_small_file<T>(
    storage: &dyn Storage,
    name: &str,
    decode: impl FnOnce(&[u8]) -> std::result::Result<T, format::HeaderError>,
) -> Result<Option<T>> {
    let names = storage
        .list()
        .map_err(|e| Error::io(format!("list {}", storage.describe()), e))?;
    if !names.iter().any(|n| n == name) {
        return Ok(None);
    }
    let bytes = storage
        .open(name)
        .and_then(|f| storage::read_all(&*f))
        .map_err(|e| Error::io(format!("read {name}"), e))?;
    match decode(&bytes) {
        Ok(v) => Ok(Some(v)),
        Err(format::HeaderError::Version(found)) => Err(ErrorKind::UnsupportedVersion {
            file: name.into(),
            found,
            supported: format::FORMAT_VERSION,
        }
        .into()),
        Err(format::HeaderError::Bad) => {
            Err(Error::corruption(name, 0, CorruptionReason::BadHeader))
        }
    }
}

/// Replaces the log's file `name` atomically with `data` through its temporary file
/// (`NAME.tmp`); see [`storage::replace_file`].
pub(crate) fn replace(storage: &dyn Storage, name: &str, data: &[u8]) -> std::io::Result<()> {
    storage::replace_file(
        storage,
        name,
        &format!("{name}{}", layout::TMP_SUFFIX),
        data,
    )
}

/// Removes free file `name` and syncs the directory, as every removal of the log's; a file
/// already gone counts as removed. `now`: cut it to nothing first, so that its blocks come back
/// at once (a removed file's blocks come back only at its last close, which may come later);
/// harmless at a crash, as an empty free file is reused as any other.
pub(crate) fn remove_free_file(
    storage: &dyn Storage,
    name: &str,
    now: bool,
) -> std::io::Result<()> {
    if now {
        match storage.open(name) {
            Ok(f) => f.set_len(0)?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
    }
    match storage.remove(name) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
        _ => storage.sync_dir(),
    }
}
