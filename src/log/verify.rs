//! `verify`: a read-only check of a log directory, for operators and the CLI.
//!
//! It takes no lock and changes nothing, so it can run beside a live writer (a writer's
//! unsynced tail then shows as a torn tail). Every problem names a file, an offset and a kind.

use crate::delivery::commit_store::LocalCommitStore;
use crate::error::{CorruptionReason, Damage};
use crate::error::{Error, ErrorKind, Result};
use crate::log::format;
use crate::log::layout::{self, IDENTITY_FILE};
use crate::log::reader;
use crate::log::scan::{self, Event};
use crate::storage::Storage;
use crate::{Epoch, EpochKey};
use std::sync::Arc;

/// One problem found by [`verify`]: where it is and what it is.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Problem {
    /// The file (a segment, or another file of the directory).
    pub segment: String,
    /// Byte offset in that file.
    pub offset: u64,
    /// What is wrong; [`ProblemKind::name`] is its machine-readable name.
    pub kind: ProblemKind,
    /// Human-readable detail.
    pub detail: String,
}

/// What kind of problem [`verify`] found.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum ProblemKind {
    /// The log ends with what an unfinished sync (or a lost newest segment) left: the next
    /// open, or `walsink repair`, cuts it off and reports it.
    TornTail(CorruptionReason),
    /// Damage in data a completed sync covered.
    Corruption(CorruptionReason),
    /// A file of a format version this build cannot read.
    UnknownVersion,
    /// A file that is not part of a walsink log.
    UnexpectedFile,
    /// The identity file is missing or does not verify.
    BadIdentity,
    /// The local commit store does not verify.
    BadCommitStore,
}

impl ProblemKind {
    /// Machine-readable name: `torn_tail`, a [`CorruptionReason::name`] (`checksum`,
    /// `bad_header`, `bad_length`, `unknown_kind`, `torn_frame`, `unwritten`, `bad_payload`,
    /// `missing_segment`, `incomplete_epoch`), `unknown_version`, `unexpected_file`,
    /// `bad_identity` or `bad_commit_store`.
    pub fn name(&self) -> &'static str {
        match self {
            ProblemKind::TornTail(_) => "torn_tail",
            ProblemKind::Corruption(r) => r.name(),
            ProblemKind::UnknownVersion => "unknown_version",
            ProblemKind::UnexpectedFile => "unexpected_file",
            ProblemKind::BadIdentity => "bad_identity",
            ProblemKind::BadCommitStore => "bad_commit_store",
        }
    }
}

impl std::fmt::Display for ProblemKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl PartialEq<&str> for ProblemKind {
    fn eq(&self, other: &&str) -> bool {
        self.name() == *other
    }
}

/// A checkpoint found by [`verify`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct CheckpointSummary {
    /// Checkpoint id.
    pub id: u64,
    /// Records in its epoch.
    pub records: u64,
    /// Payload bytes in its epoch.
    pub bytes: u64,
    /// Checkpoint time, milliseconds since the Unix epoch.
    pub timestamp_ms: u64,
    /// True when the commit store covers it.
    pub committed: bool,
    /// True when a later restore voided it.
    pub voided: bool,
    /// Its metadata blob.
    pub metadata: Vec<u8>,
}

/// What [`verify`] found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct VerifyReport {
    /// True when no problem was found.
    pub ok: bool,
    /// Sink id and subtask from the identity file, when it reads.
    pub identity: Option<(String, u32)>,
    /// The log's id from the identity file (`None` when it does not read, or in a log made
    /// before log ids).
    pub log_id: Option<String>,
    /// Segment files with their sizes, in log order.
    pub segments: Vec<(String, u64)>,
    /// Data records in the valid prefix (sealed and unsealed).
    pub records: u64,
    /// Records after the last checkpoint (a crash or a live writer leaves these).
    pub unsealed_records: u64,
    /// Checkpoints in the valid prefix, in log order.
    pub checkpoints: Vec<CheckpointSummary>,
    /// Highest committed checkpoint according to the local commit store.
    pub committed: Option<u64>,
    /// Problems, in the order found.
    pub problems: Vec<Problem>,
}

fn problem(
    segment: impl Into<String>,
    offset: u64,
    kind: ProblemKind,
    detail: impl Into<String>,
) -> Problem {
    Problem {
        segment: segment.into(),
        offset,
        kind,
        detail: detail.into(),
    }
}

/// How often a read-only pass starts over when a live writer changed the log underneath it.
/// A writer that frees a small segment every few milliseconds can make most passes over a
/// busy log meet a vanished file (measured: more than half), so the bound is generous; a
/// pass starts over only after a file vanished or the set of segments changed.
const LIVE_RETRIES: u32 = 32;

/// True for an error caused by a file that vanished: a live writer freed (removed or recycled)
/// a segment between the listing and the read.
fn vanished(e: &Error) -> bool {
    matches!(e.kind(), ErrorKind::Io { source, .. } if source.kind() == std::io::ErrorKind::NotFound)
}

/// The error of a pass (`what`: verify or dump) that started over [`LIVE_RETRIES`] times: it
/// says that the log is busy, not damaged, and that another try may get through.
fn busy(what: &str, e: Error) -> Error {
    Error::io(
        format!(
            "{what} a live log (a writer freed segments during each of {LIVE_RETRIES} passes; that is not damage: try again, or stop the writer); the last pass failed"
        ),
        std::io::Error::new(std::io::ErrorKind::NotFound, e.to_string()),
    )
}

/// The segment names in the directory, sorted, to tell whether a writer changed the log.
fn segment_list(storage: &dyn Storage) -> Result<Vec<String>> {
    let mut names: Vec<String> = storage
        .list()
        .map_err(|e| Error::io(format!("list {}", storage.describe()), e))?
        .into_iter()
        .filter(|n| n.ends_with(".wseg"))
        .collect();
    names.sort();
    Ok(names)
}

/// Checks every segment header and frame, the identity file and the commit store of the log
/// in `storage`. Fails only on I/O errors; damage is listed in [`VerifyReport::problems`].
///
/// A log that is being written can be checked: when a segment vanishes during the pass (a
/// live writer freed it), or problems were found, the pass starts over, up to 32 times;
/// problems are reported once two passes in a row over the same segments found the same
/// ones (a frame read while the writer was still writing it does not verify once). The commit mark is read after the segments, so a segment freed
/// during the pass is known to be committed. A log that changes under every pass is reported as
/// busy (an I/O error that says so), never as damage.
pub fn verify(storage: &dyn Storage) -> Result<VerifyReport> {
    let mut attempt = 0;
    // The problems the previous pass found, if it found any: a pass that read a frame while a
    // live writer was still writing it sees a checksum mismatch there, with a later barrier of
    // the same writer vouching for it. Problems are believed only when two passes in a row
    // over the same segments find the same ones (as `dump` does).
    let mut seen: Option<Vec<Problem>> = None;
    loop {
        attempt += 1;
        let before = segment_list(storage)?;
        match verify_once(storage) {
            Err(e) if attempt < LIVE_RETRIES && vanished(&e) => continue,
            Err(e) if vanished(&e) => return Err(busy("verify", e)),
            Ok(r) if !r.ok && attempt < LIVE_RETRIES => {
                if segment_list(storage)? != before {
                    seen = None;
                } else if seen.as_ref() == Some(&r.problems) {
                    return Ok(r);
                } else {
                    seen = Some(r.problems.clone());
                }
            }
            other => return other,
        }
    }
}

fn verify_once(storage: &dyn Storage) -> Result<VerifyReport> {
    let mut r = VerifyReport::default();
    match crate::log::files::read_identity(storage) {
        Ok(Some(id)) => {
            r.log_id = id.log_id;
            r.identity = Some((id.sink_id, id.subtask));
        }
        Ok(None) => r.problems.push(problem(
            IDENTITY_FILE,
            0,
            ProblemKind::BadIdentity,
            "no identity file: not a walsink log",
        )),
        Err(e) if matches!(e.kind(), ErrorKind::Io { .. }) => return Err(e),
        Err(_) => r.problems.push(problem(
            IDENTITY_FILE,
            0,
            ProblemKind::BadIdentity,
            "identity file does not verify",
        )),
    }
    let scan = scan::scan(storage);
    // The commit store is read after the scan: a live writer marks before it frees, so the
    // mark read now covers every segment freed before or during the scan.
    match LocalCommitStore::read(storage) {
        Ok(c) => r.committed = c,
        Err(e) => r.problems.push(problem(
            layout::COMMIT_FILE,
            0,
            ProblemKind::BadCommitStore,
            e.to_string(),
        )),
    }
    let scan = match scan {
        Ok(s) => s,
        Err(e) => {
            match e.into_kind() {
                ErrorKind::UnsupportedVersion { file, found, .. } => r.problems.push(problem(
                    file,
                    0,
                    ProblemKind::UnknownVersion,
                    format!("format version {found}"),
                )),
                ErrorKind::Corruption(Damage {
                    segment,
                    offset,
                    reason,
                }) => r.problems.push(problem(
                    segment,
                    offset,
                    ProblemKind::Corruption(reason.clone()),
                    reason.to_string(),
                )),
                other => return Err(other.into()),
            }
            return Ok(r);
        }
    };
    for &seq in &scan.segments {
        let name = format::segment_name(seq);
        match storage.open(&name).and_then(|f| f.len()) {
            Ok(len) => r.segments.push((name, len)),
            // Freed by a live writer since the scan read it: committed meanwhile.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(Error::io(format!("stat {name}"), e)),
        }
    }
    for name in &scan.unexpected {
        r.problems.push(problem(
            name.clone(),
            0,
            ProblemKind::UnexpectedFile,
            "not part of a walsink log",
        ));
    }
    let mut partial = Vec::new();
    let voided = scan.voided(r.committed);
    for ev in &scan.events {
        let Event::Barrier(e) = ev else { continue };
        // Counts from disk are untrusted: count the records present, never the claim.
        r.records = r.records.saturating_add(e.found);
        if e.partial {
            partial.push(e);
        }
        r.checkpoints.push(CheckpointSummary {
            id: e.info.id,
            records: e.info.records,
            bytes: e.info.bytes,
            timestamp_ms: e.info.timestamp_ms,
            committed: r.committed.is_some_and(|c| e.info.id <= c),
            voided: voided.contains(&e.info.id),
            metadata: e.info.metadata.to_vec(),
        });
    }
    for e in partial {
        let live = r
            .checkpoints
            .iter()
            .any(|c| c.id == e.info.id && !c.committed && !c.voided);
        if live {
            let reason = crate::CorruptionReason::IncompleteEpoch {
                checkpoint: e.info.id,
                expected: e.info.records,
                found: 0,
            };
            r.problems.push(problem(
                format::segment_name(e.info.barrier.seq),
                e.info.barrier.offset,
                ProblemKind::Corruption(reason),
                "the start of this uncommitted epoch was removed",
            ));
        }
    }
    r.unsealed_records = scan.tail_records;
    r.records = r.records.saturating_add(scan.tail_records);
    if let Some((_, d)) = &scan.damage {
        if scan.damage_is_durable() {
            r.problems.push(problem(
                d.segment.clone(),
                d.offset,
                ProblemKind::Corruption(d.reason.clone()),
                format!("corruption of synced data: {}", d.reason),
            ));
        } else {
            r.problems.push(problem(
                d.segment.clone(),
                d.offset,
                ProblemKind::TornTail(d.reason.clone()),
                format!("the log ends with a torn tail ({}); `walsink repair` or the next open cuts it off", d.reason),
            ));
        }
    }
    if let Some(d) = scan.lost_front(r.committed) {
        r.problems.push(problem(
            d.segment,
            d.offset,
            ProblemKind::Corruption(d.reason.clone()),
            format!(
                "nothing was ever committed, yet the oldest segment present is not the first: {}",
                d.reason
            ),
        ));
    }
    r.ok = r.problems.is_empty();
    Ok(r)
}

/// State of an epoch as [`dump`] sees it on disk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DumpState {
    /// Covered by the commit store.
    Committed,
    /// Sealed and not committed.
    Pending,
    /// Voided by a later restore.
    Voided,
    /// Records after the last checkpoint (not durable; dropped at the next open).
    Unsealed,
}

impl DumpState {
    /// Lower-case name, for output.
    pub fn name(self) -> &'static str {
        match self {
            DumpState::Committed => "committed",
            DumpState::Pending => "pending",
            DumpState::Voided => "voided",
            DumpState::Unsealed => "unsealed",
        }
    }
}

/// Reads the records of every epoch in the valid prefix of the log, read-only, and hands each
/// epoch to `f` with its checkpoint id (`None` for the unsealed tail) and state. Epochs whose
/// first segments were already freed are skipped, and so are epochs (and the unsealed tail)
/// whose segments a live writer frees while the dump runs.
///
/// Damage to synced data is believed when two passes in a row find it at the same place (a
/// pass can read a frame a live writer is still writing); the epochs before it are dumped,
/// then the damage is returned.
///
/// Epochs are read in bounded chunks as `f` iterates them. A read failure (damage, or an I/O
/// error) reaches `f` through the iterator and is also what `dump` returns, whatever `f` made
/// of it.
pub fn dump(
    storage: Arc<dyn Storage>,
    mut f: impl FnMut(Option<u64>, DumpState, &Epoch) -> std::io::Result<()>,
) -> Result<()> {
    let storage_arc = storage;
    let storage: &dyn Storage = &*storage_arc;
    storage
        .list()
        .map_err(|e| Error::io(format!("list {}", storage.describe()), e))?;
    let identity = crate::log::files::read_identity(storage).ok().flatten();
    let (sink_id, subtask) =
        identity.map_or_else(|| ("unknown".into(), 0), |i| (i.sink_id, i.subtask));
    let sink_id: std::sync::Arc<str> = sink_id.into();
    let mut attempt = 0;
    // Damage to synced data where the previous pass found it, if it found any: a pass that
    // read a frame while a live writer was still writing it sees a checksum mismatch there,
    // and a later barrier of the same writer vouching for it. Such damage is believed only
    // when two passes in a row find it at the same place.
    let mut seen_damage: Option<format::Position> = None;
    let scan = loop {
        attempt += 1;
        match scan::scan(storage) {
            Err(e) if attempt < LIVE_RETRIES && vanished(&e) => continue,
            Err(e) if vanished(&e) => return Err(busy("dump", e)),
            Ok(s) if s.damage_is_durable() => {
                let at = s.damage.as_ref().map(|(p, _)| *p);
                if at == seen_damage || attempt >= LIVE_RETRIES {
                    break s;
                }
                seen_damage = at;
            }
            other => break other?,
        }
    };
    // Read after the scan, as in `verify`: it covers every segment a live writer freed.
    let committed = LocalCommitStore::read(storage).unwrap_or(None);
    let voided = scan.voided(committed);
    let pool = reader::read_pool();
    for ev in &scan.events {
        let Event::Barrier(e) = ev else { continue };
        if e.partial {
            continue;
        }
        let info = e.info.clone();
        let key = EpochKey {
            sink_id: sink_id.clone(),
            subtask,
            checkpoint: e.info.id,
        };
        // A live writer committed the epoch and freed its segment after the scan: the file is
        // gone, or was recycled under the reader (its new frames do not verify under the old
        // segment's seed). The mark, written before any segment is freed, then covers it.
        let id = e.info.id;
        let freed_meanwhile = |err: &Error| {
            vanished(err)
                || LocalCommitStore::read(storage)
                    .ok()
                    .flatten()
                    .is_some_and(|c| c >= id)
        };
        let epoch =
            match crate::delivery::sink::load_epoch(&storage_arc, &pool, reader::CHUNK, &info, key)
            {
                Err(e) if freed_meanwhile(&e) => continue,
                other => other?,
            };
        let state = if committed.is_some_and(|c| e.info.id <= c) {
            DumpState::Committed
        } else if voided.contains(&e.info.id) {
            DumpState::Voided
        } else {
            DumpState::Pending
        };
        let written = f(Some(e.info.id), state, &epoch);
        match epoch.reader.take_failure() {
            // A live writer freed the segment while it was read: committed meanwhile.
            Some(e) if freed_meanwhile(&e) => continue,
            Some(e) => return Err(e),
            None => written.map_err(|e| Error::io("write the dump", e))?,
        }
    }
    // Damage to synced data ends what can be read: the records between the last checkpoint
    // and it belong to a damaged epoch, not to an unsealed tail, and the damage is the result.
    let damage = match &scan.damage {
        Some((_, d)) if scan.damage_is_durable() => Some(d.clone()),
        _ => scan.lost_front(committed),
    };
    if let Some(d) = damage {
        return Err(Error::corruption(d.segment, d.offset, d.reason));
    }
    if scan.tail_records > 0 {
        let key = EpochKey {
            sink_id,
            subtask,
            checkpoint: u64::MAX,
        };
        let tail = crate::delivery::sink::load_tail(
            &storage_arc,
            scan.cut,
            scan.valid_end,
            scan.tail_records,
            scan.tail_bytes,
            key,
        );
        let written = f(None, DumpState::Unsealed, &tail);
        match tail.reader.take_failure() {
            // A live writer sealed, committed and freed the tail's segment while it was read.
            Some(e) if vanished(&e) => {}
            Some(e) => return Err(e),
            None => written.map_err(|e| Error::io("write the dump", e))?,
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::{FsStorage, StorageFile};
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;

    /// The hook of [`OnOpen`]: opens `name` through the filesystem it is given, or not.
    type OpenHook =
        Box<dyn Fn(&FsStorage, &str) -> std::io::Result<Arc<dyn StorageFile>> + Send + Sync>;

    /// The filesystem, with `open` replaced by a hook: what a live writer does to a reader
    /// (files that vanish, bytes read mid-write, segments recycled), simulated.
    struct OnOpen {
        fs: FsStorage,
        open: OpenHook,
    }

    impl OnOpen {
        fn new(
            dir: &std::path::Path,
            open: impl Fn(&FsStorage, &str) -> std::io::Result<Arc<dyn StorageFile>>
                + Send
                + Sync
                + 'static,
        ) -> OnOpen {
            OnOpen {
                fs: FsStorage::new(dir).unwrap(),
                open: Box::new(open),
            }
        }
    }

    impl std::fmt::Debug for OnOpen {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.debug_struct("OnOpen").field("fs", &self.fs).finish()
        }
    }

    impl Storage for OnOpen {
        fn list(&self) -> std::io::Result<Vec<String>> {
            self.fs.list()
        }
        fn open(&self, name: &str) -> std::io::Result<Arc<dyn StorageFile>> {
            (self.open)(&self.fs, name)
        }
        fn create(&self, name: &str) -> std::io::Result<Arc<dyn StorageFile>> {
            self.fs.create(name)
        }
        fn rename(&self, from: &str, to: &str) -> std::io::Result<()> {
            self.fs.rename(from, to)
        }
        fn remove(&self, name: &str) -> std::io::Result<()> {
            self.fs.remove(name)
        }
        fn sync_dir(&self) -> std::io::Result<()> {
            self.fs.sync_dir()
        }
        fn lock(&self, name: &str) -> std::io::Result<Box<dyn Send + Sync + std::fmt::Debug>> {
            self.fs.lock(name)
        }
        fn describe(&self) -> String {
            self.fs.describe()
        }
    }

    /// The filesystem, except that the first open of a segment (every open, with `always`, as
    /// under a writer that frees faster than a pass) fails with "No such file or directory",
    /// as when a live writer recycles the segment between the listing and the read. The flag
    /// returned says that the one segment vanished already; clear it to make the next open
    /// fail again.
    fn vanishing(dir: &std::path::Path, always: bool) -> (OnOpen, Arc<AtomicBool>) {
        let vanished = Arc::new(AtomicBool::new(false));
        let flag = vanished.clone();
        let st = OnOpen::new(dir, move |fs, name| {
            if name.ends_with(".wseg") && (always || !flag.swap(true, Ordering::SeqCst)) {
                return Err(std::io::ErrorKind::NotFound.into());
            }
            fs.open(name)
        });
        (st, vanished)
    }

    /// A segment read while a live writer was still writing it: one byte of the first
    /// record flipped.
    #[derive(Debug)]
    struct TornFile(Arc<dyn StorageFile>);

    const TORN_AT: u64 = (format::SEGMENT_HEADER_LEN + format::FRAME_HEADER_LEN) as u64;

    impl StorageFile for TornFile {
        fn len(&self) -> std::io::Result<u64> {
            self.0.len()
        }
        fn read_at(&self, offset: u64, buf: &mut [u8]) -> std::io::Result<usize> {
            let n = self.0.read_at(offset, buf)?;
            if (offset..offset + n as u64).contains(&TORN_AT) {
                buf[(TORN_AT - offset) as usize] ^= 0x55;
            }
            Ok(n)
        }
        fn write_at(&self, offset: u64, data: &[u8]) -> std::io::Result<()> {
            self.0.write_at(offset, data)
        }
        fn sync_data(&self) -> std::io::Result<()> {
            self.0.sync_data()
        }
        fn set_len(&self, len: u64) -> std::io::Result<()> {
            self.0.set_len(len)
        }
    }

    #[test]
    fn verify_believes_damage_only_when_two_passes_find_it() {
        let d = tempfile::tempdir().unwrap();
        {
            let (wal, _) = crate::WalSink::open(d.path(), crate::Options::new("live")).unwrap();
            for cp in 1..=3 {
                wal.append(format!("record of {cp}").as_bytes()).unwrap();
                wal.checkpoint(cp, b"").unwrap();
            }
        }
        // Every read through the first handle opened on a segment is torn: a pass that read
        // the frame while the writer was still writing it. Later handles read the real bytes.
        let torn = Arc::new(AtomicBool::new(false));
        let seen = torn.clone();
        let st = OnOpen::new(d.path(), move |fs, name| {
            let f = fs.open(name)?;
            if name.ends_with(".wseg") && !seen.swap(true, Ordering::SeqCst) {
                return Ok(Arc::new(TornFile(f)));
            }
            Ok(f)
        });
        let r = verify(&st).unwrap();
        assert!(
            torn.load(Ordering::SeqCst),
            "the first pass read torn bytes"
        );
        assert!(
            r.ok,
            "a frame read mid-write is not damage: {:?}",
            r.problems
        );
        // Damage that stays is reported.
        let st = FsStorage::new(d.path()).unwrap();
        let seg = st.open(&format::segment_name(1)).unwrap();
        let mut byte = [0u8; 1];
        seg.read_at(TORN_AT, &mut byte).unwrap();
        seg.write_at(TORN_AT, &[byte[0] ^ 0x55]).unwrap();
        let r = verify(&st).unwrap();
        assert!(!r.ok);
        assert!(
            r.problems
                .iter()
                .any(|p| matches!(p.kind, ProblemKind::Corruption(_))),
            "{:?}",
            r.problems
        );
    }

    #[test]
    fn dump_skips_an_epoch_committed_and_recycled_while_it_is_read() {
        let d = tempfile::tempdir().unwrap();
        {
            let (wal, _) = crate::WalSink::open(d.path(), crate::Options::new("live")).unwrap();
            for cp in 1..=2 {
                wal.append(format!("record of {cp}").as_bytes()).unwrap();
                wal.checkpoint(cp, b"").unwrap();
            }
        }
        // The second open of segment 1 (the epoch read after the scan) first moves the commit
        // mark to `mark` (if set), as a live writer that committed the epochs and freed their
        // segment would, then reads its first frame torn, as from a recycled file holding
        // another segment's frames.
        let dumped = |mark: Option<u64>| {
            let opens = std::sync::atomic::AtomicU32::new(0);
            let st = OnOpen::new(d.path(), move |fs, name| {
                let f = fs.open(name)?;
                if name == format::segment_name(1) && opens.fetch_add(1, Ordering::SeqCst) == 1 {
                    if let Some(m) = mark {
                        crate::log::files::replace(
                            fs,
                            layout::COMMIT_FILE,
                            &format::encode_commit(Some(m)),
                        )?;
                    }
                    return Ok(Arc::new(TornFile(f)));
                }
                Ok(f)
            });
            let mut ids = Vec::new();
            let r = dump(Arc::new(st), |id, _, _| {
                ids.push(id);
                Ok(())
            });
            (r, ids)
        };
        // Committed meanwhile: epoch 1, read torn, is skipped, not reported as damage
        // (epoch 2 is read through a later handle, with the real bytes).
        let (r, ids) = dumped(Some(2));
        r.unwrap();
        assert_eq!(ids, vec![Some(2)]);
        // Not committed: the same torn read is damage.
        FsStorage::new(d.path())
            .unwrap()
            .remove(layout::COMMIT_FILE)
            .unwrap();
        let (r, _) = dumped(None);
        let e = r.unwrap_err();
        assert!(matches!(e.kind(), ErrorKind::Corruption(_)), "{e}");
    }

    fn log_with_one_checkpoint(dir: &std::path::Path) {
        let (wal, _) = crate::WalSink::open(dir, crate::Options::new("live")).unwrap();
        wal.append(b"r").unwrap();
        wal.checkpoint(1, b"").unwrap();
    }

    #[test]
    fn verify_and_dump_tolerate_a_segment_that_vanishes_during_the_pass() {
        let d = tempfile::tempdir().unwrap();
        log_with_one_checkpoint(d.path());
        let (st, vanished) = vanishing(d.path(), false);
        let r = verify(&st).unwrap();
        assert!(r.ok, "{:?}", r.problems);
        assert_eq!(r.checkpoints.len(), 1);
        vanished.store(false, Ordering::SeqCst);
        let mut records = 0;
        let st: Arc<dyn Storage> = Arc::new(st);
        dump(st, |_, _, e| {
            records += e.len();
            Ok(())
        })
        .unwrap();
        assert_eq!(records, 1);
    }

    #[test]
    fn a_log_that_changes_under_every_pass_is_reported_busy_not_damaged() {
        let d = tempfile::tempdir().unwrap();
        log_with_one_checkpoint(d.path());
        let (st, _) = vanishing(d.path(), true);
        let e = verify(&st).unwrap_err().to_string();
        assert!(e.contains("live log") && e.contains("not damage"), "{e}");
        let st: Arc<dyn Storage> = Arc::new(st);
        let e = dump(st, |_, _, _| Ok(())).unwrap_err().to_string();
        assert!(e.contains("dump a live log"), "{e}");
    }

    #[test]
    fn dump_skips_an_unsealed_tail_whose_segment_is_freed_while_it_is_read() {
        let d = tempfile::tempdir().unwrap();
        {
            let (wal, _) = crate::WalSink::open(d.path(), crate::Options::new("live")).unwrap();
            wal.append(b"sealed").unwrap();
            wal.checkpoint(1, b"").unwrap();
            wal.append(b"second").unwrap();
            wal.checkpoint(2, b"").unwrap();
            // Appended without a checkpoint, more than the write buffer holds, so that part
            // of it reaches the file: the unsealed tail.
            for _ in 0..100 {
                wal.append(&[7u8; 4096]).unwrap();
            }
        }
        let (st, vanished) = vanishing(d.path(), false);
        vanished.store(true, Ordering::SeqCst);
        let (mut seen, mut tail_read) = (Vec::new(), false);
        let storage: Arc<dyn Storage> = Arc::new(st);
        dump(storage, |id, _, e| {
            if id.is_none() {
                tail_read = true;
                // A live writer frees the tail's segment now: its next open fails.
                vanished.store(false, Ordering::SeqCst);
            }
            let mut n = 0;
            for c in e.chunks() {
                n += c
                    .map_err(|e| std::io::Error::other(e.to_string()))?
                    .records()
                    .count();
            }
            seen.push((id, n));
            Ok(())
        })
        .unwrap();
        assert!(tail_read, "the log has an unsealed tail");
        assert_eq!(
            seen,
            [(Some(1), 1), (Some(2), 1)],
            "the tail was freed, not read"
        );
    }
}
