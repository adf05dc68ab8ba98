//! Logs written by released format versions still read. `tests/data/v1-basic/` is a small log
//! made by format version 1 (regenerate only for a new version, with
//! `WALSINK_WRITE_GOLDEN=1 cargo test --test it backward_compatibility`).

use std::path::{Path, PathBuf};
use walsink::{MemorySink, Options, WalSink};

fn golden() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/v1-basic")
}

fn opts() -> Options {
    Options::new("golden")
        .segment_size(4096)
        .max_record_size(1024)
        .max_metadata_size(64)
        .salt_seed(1)
}

fn write_golden(dir: &Path) {
    let (wal, _) = WalSink::open(dir, opts()).unwrap();
    for cp in 1..=3u64 {
        for i in 0..40 {
            wal.append(format!("v1 checkpoint {cp} record {i:02} {}", "z".repeat(30)).as_bytes())
                .unwrap();
        }
        wal.checkpoint(cp, format!("offset={}", cp * 40).as_bytes())
            .unwrap();
    }
    wal.checkpoint_complete(1).unwrap();
    let mut sink = MemorySink::new();
    wal.deliver_ready(&mut sink).unwrap();
    wal.restore(Some(2)).unwrap();
    wal.append(b"unsealed tail").unwrap();
}

fn copy_dir(from: &Path, to: &Path) {
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        std::fs::copy(e.path(), to.join(e.file_name())).unwrap();
    }
}

#[test]
fn version_1_log_reads() {
    if std::env::var("WALSINK_WRITE_GOLDEN").is_ok() {
        let g = golden();
        let _ = std::fs::remove_dir_all(&g);
        std::fs::create_dir_all(&g).unwrap();
        write_golden(&g);
        std::fs::remove_file(g.join("LOCK")).unwrap();
    }
    let tmp = tempfile::tempdir().unwrap();
    copy_dir(&golden(), tmp.path());
    let report = walsink::verify(&walsink::storage::FsStorage::new(tmp.path()).unwrap()).unwrap();
    assert!(
        report.problems.iter().all(|p| p.kind == "torn_tail"),
        "{:?}",
        report.problems
    );
    let (wal, report) = WalSink::open(tmp.path(), opts()).unwrap();
    assert_eq!(report.committed, Some(1));
    assert_eq!(report.pending, vec![2]);
    assert_eq!(report.last_checkpoint, Some(2));
    assert_eq!(report.last_metadata.as_deref(), Some(&b"offset=80"[..]));
    assert_eq!(report.next_checkpoint_id, 4);
    wal.checkpoint_complete(2).unwrap();
    let mut sink = MemorySink::new();
    wal.deliver_ready(&mut sink).unwrap();
    let got = sink.records();
    assert_eq!(got.len(), 40);
    assert_eq!(
        got[0],
        format!("v1 checkpoint 2 record 00 {}", "z".repeat(30)).into_bytes()
    );
}
