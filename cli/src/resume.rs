//! What `pipe` stores in each checkpoint's metadata, and where a run resumes.
//!
//! Every checkpoint's metadata is one JSON object ([`PipeMeta`]): a random id of the log,
//! the input (path, the identity of the file being read, bytes consumed of it, their
//! fingerprint, lines) and whether the last record was a final line without a newline. The directory sink keeps each epoch's metadata beside its
//! file, so the target knows which log its commits came from and how far into the input
//! they reach. A run resumes after whichever is further on, the log or the target, and
//! refuses a target that holds another log's commits and an input that is not the one the
//! log consumed.

use crate::source::FileId;
use serde::{Deserialize, Serialize};
use walsink::sinks::CommittedEpoch;
use walsink::RecoveryReport;

/// The metadata of one `pipe` checkpoint.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PipeMeta {
    /// Layout of this record: 3 (2 had no `file`; 1 was the bare text `input-offset=N`).
    pub v: u32,
    /// Random id of the log, chosen for its first checkpoint and carried by every later one.
    pub log: String,
    /// `file` or `stdin`.
    pub source: String,
    /// Canonical path of the input file.
    #[serde(default)]
    pub path: Option<String>,
    /// Device and inode of the file being read (files, layout 3): the file at `path`, or
    /// after a rotation the old file while it is being finished. `offset`, `hash`, `size` and
    /// `lines` are of this file.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub file: Option<FileId>,
    /// Input bytes consumed through this checkpoint (of the file being read).
    pub offset: u64,
    /// xxh3-64 of the file's bytes `[0, offset)`, hex (files only).
    #[serde(default)]
    pub hash: Option<String>,
    /// Size of the file being read when the checkpoint was taken.
    #[serde(default)]
    pub size: Option<u64>,
    /// Lines consumed through this checkpoint (of the file being read).
    #[serde(default)]
    pub lines: Option<u64>,
    /// True when the last record was a final line shipped without a newline.
    #[serde(default)]
    pub unterminated: bool,
}

impl PipeMeta {
    /// Decodes a checkpoint's metadata, including the earlier `input-offset=N` layout.
    pub fn decode(meta: &[u8]) -> Option<PipeMeta> {
        if let Ok(m) = serde_json::from_slice::<PipeMeta>(meta) {
            return Some(m);
        }
        let offset = std::str::from_utf8(meta)
            .ok()?
            .strip_prefix("input-offset=")?
            .parse()
            .ok()?;
        Some(PipeMeta {
            v: 1,
            log: String::new(),
            source: "file".into(),
            path: None,
            file: None,
            offset,
            hash: None,
            size: None,
            lines: None,
            unterminated: false,
        })
    }

    /// The JSON bytes stored in a checkpoint.
    pub fn encode(&self) -> Vec<u8> {
        serde_json::to_vec(self).expect("plain struct serializes")
    }
}

/// Which side a run resumes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum From {
    /// Nothing was consumed yet.
    Start,
    /// The log's newest checkpoint.
    Log(u64),
    /// The target's newest epoch, which is ahead of the log (the log lost checkpoints to a
    /// `repair --force`).
    Target(u64),
}

/// Where and how a run continues.
#[derive(Debug, Clone)]
pub struct Resume {
    /// The log's id (kept, adopted from the target, or new).
    pub log_id: String,
    /// Where the resume point comes from.
    pub from: From,
    /// The metadata of the resume point.
    pub meta: Option<PipeMeta>,
    /// The first checkpoint id this run may use: above every id in the log, the commit store
    /// and the target.
    pub next_id: u64,
}

fn new_log_id() -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let mut rng = fastrand::Rng::with_seed(
        fastrand::u64(..) ^ (nanos as u64) ^ (u64::from(std::process::id()) << 32),
    );
    format!("{:016x}{:016x}", rng.u64(..), rng.u64(..))
}

/// Decides where to resume from the log's recovery report and, for a directory sink, the
/// epochs its target holds under this sink id. `Err` is a refusal, in words for the user.
pub fn decide(
    report: &RecoveryReport,
    target: Option<(&str, &[CommittedEpoch])>,
    wal: &str,
    sink_id: &str,
    take_over: bool,
) -> Result<Resume, String> {
    let log_meta = match &report.last_metadata {
        Some(m) => Some(PipeMeta::decode(m).ok_or_else(|| {
            format!(
                "the newest checkpoint of the log {wal} has metadata that walsink pipe did not write ({:?}); use a log directory of its own for pipe",
                String::from_utf8_lossy(m)
            )
        })?),
        None => None,
    };
    let mut log_id = log_meta
        .as_ref()
        .map(|m| m.log.clone())
        .filter(|l| !l.is_empty());
    let mut newest_target: Option<(u64, PipeMeta)> = None;
    if let Some((out, epochs)) = target {
        let mut owner: Option<String> = None;
        for e in epochs {
            let meta = e.metadata.as_deref().and_then(PipeMeta::decode);
            let Some(meta) = meta.filter(|m| !m.log.is_empty()) else {
                return Err(format!(
                    "the target {out} holds {} for sink id {sink_id:?} whose metadata does not name a log of walsink pipe or walsink cdc --input (another kind of run wrote it, such as walsink cdc --source, or an earlier walsink, or another program); its checkpoint ids would collide with this log's. Use an empty target (a new directory, key or schema), or another --sink-id",
                    e.file
                ));
            };
            // The newest marker's log is the one the target's position belongs to (after a
            // take-over, older markers are of the log taken over).
            owner = Some(meta.log.clone());
            newest_target = Some((e.checkpoint, meta));
        }
        if let (Some(owner), Some((last, _))) = (&owner, &newest_target) {
            let first = epochs.first().map_or(0, |e| e.checkpoint);
            match &log_id {
                Some(l) if l == owner => {}
                // Taking the shard over: this log resumes from the target's position, and its
                // checkpoints are numbered above the target's.
                _ if take_over => {}
                Some(l) => {
                    return Err(format!(
                        "the target {out} already holds checkpoints {first}..={last} of sink id {sink_id:?} from another log (log id {owner}); this log ({wal}, log id {l}) numbers its checkpoints the same way, so they would be skipped as already delivered. Use an empty target (a new directory, key or schema) for this log, or give it its own --sink-id, or take the target over from that log with --take-over (that log is then refused at its next commit)"
                    ))
                }
                // The log lost the metadata of its checkpoints (repair --force dropped them)
                // but its commit store shows it delivered, or it has used checkpoint ids up to
                // the target's newest (walsink never hands out an id again, even one repair
                // dropped): the target's epochs are its own.
                None if report.committed.is_some() || report.next_checkpoint_id > *last => {
                    log_id = Some(owner.clone())
                }
                None => {
                    return Err(format!(
                        "the target {out} already holds checkpoints {first}..={last} of sink id {sink_id:?} from log {owner}, and the log {wal} holds no checkpoint (it is new: was the old log deleted to start over?); its checkpoints would be skipped as already delivered. Use an empty target (a new directory, key or schema) for a new log, or another --sink-id, or take the target over from that log with --take-over (this run then resumes from the target's newest checkpoint)"
                    ))
                }
            }
        }
    }
    let log_cp = report.last_checkpoint;
    let (from, meta) = match (newest_target, log_meta) {
        (Some((t, tm)), _) if Some(t) > log_cp => (From::Target(t), Some(tm)),
        (_, Some(lm)) => (From::Log(log_cp.unwrap_or(0)), Some(lm)),
        (_, None) => (From::Start, None),
    };
    let target_next = match &from {
        From::Target(t) => t.saturating_add(1),
        _ => 0,
    };
    let next_id = report
        .next_checkpoint_id
        .max(report.committed.map_or(0, |c| c.saturating_add(1)))
        .max(target_next);
    Ok(Resume {
        log_id: log_id.unwrap_or_else(new_log_id),
        from,
        meta,
        next_id,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta(log: &str, offset: u64) -> PipeMeta {
        PipeMeta {
            v: 3,
            log: log.into(),
            source: "file".into(),
            path: Some("/in".into()),
            file: Some(FileId { dev: 1, ino: 2 }),
            offset,
            hash: Some("00".into()),
            size: Some(offset),
            lines: Some(1),
            unterminated: false,
        }
    }

    fn epoch(cp: u64, m: Option<PipeMeta>) -> CommittedEpoch {
        CommittedEpoch {
            checkpoint: cp,
            file: format!("{cp:020}-pipe-00000.txt"),
            metadata: m.map(|m| m.encode()),
        }
    }

    #[test]
    fn metadata_round_trips_and_reads_the_old_layout() {
        let m = meta("ab", 7);
        assert_eq!(PipeMeta::decode(&m.encode()), Some(m.clone()));
        assert_eq!(PipeMeta::decode(b"input-offset=42").unwrap().offset, 42);
        assert_eq!(PipeMeta::decode(b"garbage"), None);
        // Layout 2, as the previous version wrote it: no file identity.
        let v2 = br#"{"v":2,"log":"ab","source":"file","path":"/in","offset":7,"hash":"00","size":7,"lines":1,"unterminated":false}"#;
        let m2 = PipeMeta::decode(v2).unwrap();
        assert_eq!((m2.v, m2.file, m2.offset), (2, None, 7));
        assert!(String::from_utf8(m.encode())
            .unwrap()
            .contains(r#""file":{"dev":1,"ino":2}"#));
    }

    #[test]
    fn another_logs_target_is_refused() {
        let mut r = RecoveryReport::default();
        r.last_metadata = Some(meta("mine", 10).encode());
        r.last_checkpoint = Some(1);
        let t = [epoch(1, Some(meta("theirs", 10)))];
        let e = decide(&r, Some(("out", &t)), "wal", "pipe", false).unwrap_err();
        assert!(e.contains("another log") && e.contains("out"), "{e}");
        let fresh = RecoveryReport::default();
        let e = decide(&fresh, Some(("out", &t)), "wal", "pipe", false).unwrap_err();
        assert!(e.contains("is new"), "{e}");
        let t = [epoch(1, None)];
        assert!(decide(&fresh, Some(("out", &t)), "wal", "pipe", false).is_err());
    }

    #[test]
    fn a_take_over_resumes_from_the_other_logs_newest_checkpoint_above_its_ids() {
        let t = [
            epoch(1, Some(meta("theirs", 10))),
            epoch(4, Some(meta("theirs", 40))),
        ];
        let res = decide(
            &RecoveryReport::default(),
            Some(("out", &t)),
            "wal",
            "pipe",
            true,
        )
        .unwrap();
        assert_eq!(res.from, From::Target(4));
        assert_eq!(res.meta.unwrap().offset, 40);
        assert_eq!(res.next_id, 5);
        assert_ne!(res.log_id, "theirs", "the new owner keeps its own log id");
        // After the take-over the target holds both logs' markers; the newest decides.
        let t = [
            epoch(4, Some(meta("theirs", 40))),
            epoch(5, Some(meta("mine", 50))),
        ];
        let mut r = RecoveryReport::default();
        r.last_metadata = Some(meta("mine", 50).encode());
        r.last_checkpoint = Some(5);
        r.next_checkpoint_id = 6;
        let res = decide(&r, Some(("out", &t)), "wal", "pipe", false).unwrap();
        assert_eq!((res.from, res.next_id), (From::Log(5), 6));
    }

    #[test]
    fn a_target_ahead_of_the_log_is_where_the_run_resumes() {
        let mut r = RecoveryReport::default();
        r.last_metadata = Some(meta("mine", 10).encode());
        r.last_checkpoint = Some(0);
        r.committed = Some(3);
        r.next_checkpoint_id = 1;
        let t = [
            epoch(2, Some(meta("mine", 20))),
            epoch(3, Some(meta("mine", 30))),
        ];
        let res = decide(&r, Some(("out", &t)), "wal", "pipe", false).unwrap();
        assert_eq!(res.from, From::Target(3));
        assert_eq!(res.meta.unwrap().offset, 30);
        assert_eq!(res.next_id, 4);
    }
}
