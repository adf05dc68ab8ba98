//! One home for what a log directory holds: the names of its files and the format's size
//! limits (`docs/design.md`, "Directory layout"). Pure: reading and writing those files goes
//! through `log::files`.

/// The identity file: sink id and subtask.
pub const IDENTITY_FILE: &str = "WALSINK";
/// The local commit store (also the durable floor of commit stores that forget).
pub const COMMIT_FILE: &str = "COMMITTED";
/// The lock file, held while a handle is open.
pub const LOCK_FILE: &str = "LOCK";
/// Room kept for the commit mark on a full disk: zeros, removed to make the mark that lets
/// delivery free segments (see `storage::reserve`).
pub const RESERVE_FILE: &str = "RESERVE";
/// Extension of a segment.
pub(crate) const SEGMENT_EXT: &str = "wseg";
/// Extension of a segment kept for reuse.
pub(crate) const FREE_EXT: &str = "free";
/// Suffix of the temporary file of an atomic replace.
pub(crate) const TMP_SUFFIX: &str = ".tmp";
/// Suffix of a segment set aside by lenient recovery.
pub(crate) const DAMAGED_SUFFIX: &str = ".damaged";

/// Largest record the format allows (`Options::max_record_size` is at most this).
pub const MAX_RECORD_LIMIT: usize = 1 << 30;
/// Largest checkpoint metadata the format allows (`Options::max_metadata_size`).
pub const MAX_METADATA_LIMIT: usize = 16 << 20;

/// File name of segment `seq`: 20 decimal digits so names sort like numbers.
pub fn segment_name(seq: u64) -> String {
    format!("{seq:020}.{SEGMENT_EXT}")
}

/// File name of a recycled segment waiting for reuse.
pub fn free_name(seq: u64) -> String {
    format!("{seq:020}.{FREE_EXT}")
}

/// Parses a segment (`.wseg`) or free (`.free`) file name.
pub fn parse_numbered(name: &str, ext: &str) -> Option<u64> {
    let digits = name.strip_suffix(ext)?.strip_suffix('.')?;
    if digits.len() != 20 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

/// The name under which file `name` is set aside: `NAME.damaged`, or `NAME.K.damaged` with
/// the smallest `K` from 1 whose name is not `taken`. Set-aside files are never overwritten.
pub fn set_aside_name(name: &str, taken: impl Fn(&str) -> bool) -> String {
    let first = format!("{name}{DAMAGED_SUFFIX}");
    if !taken(&first) {
        return first;
    }
    (1u64..)
        .map(|k| format!("{name}.{k}{DAMAGED_SUFFIX}"))
        .find(|n| !taken(n))
        .expect("a free name exists")
}

/// The segment number a set-aside or temporary file name starts with, if any.
pub(crate) fn leading_seq(name: &str) -> Option<u64> {
    name.get(..20).and_then(|d| d.parse().ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn set_aside_names_never_repeat_and_stay_recognisable() {
        let mut taken = std::collections::HashSet::new();
        for _ in 0..3 {
            let n = set_aside_name(COMMIT_FILE, |n| taken.contains(n));
            assert!(n.ends_with(DAMAGED_SUFFIX), "{n}");
            assert!(taken.insert(n));
        }
        assert!(taken.contains("COMMITTED.2.damaged"));
    }
}
