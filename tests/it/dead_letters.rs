//! Dead letters: a record the target refuses for good goes to the dead-letter log, durably,
//! before the rest of its epoch is delivered without it; every other record arrives exactly
//! once and in order; the records the dead-letter log holds stay out of their epochs after a
//! crash and a reopen; without a dead-letter log, or past its limit, or when it fails, nothing
//! is skipped and delivery stops at the epoch.

use crate::support::*;
use parking_lot::Mutex;
use std::collections::BTreeSet;
use std::sync::Arc;
use walsink::{
    DeadLetter, DeadLetters, DirDeadLetters, Epoch, EpochKey, ErrorKind, Sink, SinkError,
    SinkErrorClass, WalSink,
};

/// A target with transactions: an epoch lands whole, with its marker, or not at all. It
/// refuses records that start with `bad`, naming the first such record of a delivery.
/// A row: checkpoint, index, record.
type Row = (u64, u64, Vec<u8>);

#[derive(Clone, Default)]
struct Table {
    rows: Arc<Mutex<Vec<Row>>>,
    markers: Arc<Mutex<BTreeSet<u64>>>,
    /// When set, the sink names a record outside the delivery (a broken target mapping).
    wrong_index: bool,
}

impl Sink for Table {
    fn deliver(&mut self, epoch: &Epoch) -> Result<(), SinkError> {
        let mut batch = Vec::new();
        for r in epoch.records() {
            let r = r?;
            if r.data.starts_with(b"bad") {
                let index = if self.wrong_index {
                    r.position.index + 1_000
                } else {
                    r.position.index
                };
                return Err(SinkError::rejected(format!(
                    "new row violates check constraint \"good\" (record {index})"
                ))
                .with_code("23514")
                .at_record(index));
            }
            batch.push((epoch.checkpoint(), r.position.index, r.data.to_vec()));
        }
        self.rows.lock().extend(batch);
        self.markers.lock().insert(epoch.checkpoint());
        Ok(())
    }
    fn stores_marker(&self) -> bool {
        true
    }
    fn is_committed(&mut self, key: &EpochKey) -> Result<bool, SinkError> {
        Ok(self.markers.lock().contains(&key.checkpoint))
    }
}

/// Checkpoint `cp`'s records: `r{cp}-{i}`, or `bad{cp}-{i}` where `bad(cp, i)`.
fn seal(wal: &WalSink, cp: u64, n: u64, bad: impl Fn(u64, u64) -> bool) -> Vec<Vec<u8>> {
    let mut good = Vec::new();
    for i in 0..n {
        if bad(cp, i) {
            wal.append(format!("bad{cp}-{i}").as_bytes()).unwrap();
        } else {
            let r = format!("r{cp}-{i}").into_bytes();
            wal.append(&r).unwrap();
            good.push(r);
        }
    }
    wal.checkpoint(cp, b"").unwrap();
    wal.checkpoint_complete(cp).unwrap();
    good
}

fn open(dir: &std::path::Path) -> WalSink {
    WalSink::open(dir.join("log"), opts("dl").create(true))
        .expect("open")
        .0
}

#[test]
fn refused_records_go_to_the_dead_letter_log_and_the_rest_arrive_once_in_order() {
    let dir = tempfile::tempdir().unwrap();
    let wal = open(dir.path());
    let dl = Arc::new(DirDeadLetters::open(dir.path().join("dlq"), "dl", 0).unwrap());
    wal.set_dead_letters(Some(dl.clone()));
    let bad = |cp: u64, i: u64| (cp * 7 + i).is_multiple_of(13);
    let mut want = Vec::new();
    for cp in 1..=6 {
        want.extend(seal(&wal, cp, 40, bad));
    }
    let mut t = Table::default();
    wal.deliver_ready(&mut t).unwrap();
    let got: Vec<Vec<u8>> = t.rows.lock().iter().map(|r| r.2.clone()).collect();
    assert_eq!(got, want);
    let letters = DirDeadLetters::read_all(dir.path().join("dlq")).unwrap();
    let expect: Vec<(u64, u64)> = (1..=6u64)
        .flat_map(|cp| (0..40).filter(move |&i| bad(cp, i)).map(move |i| (cp, i)))
        .collect();
    assert_eq!(
        letters
            .iter()
            .map(|l| (l.checkpoint, l.index))
            .collect::<Vec<_>>(),
        expect
    );
    for (n, l) in letters.iter().enumerate() {
        assert_eq!(l.seq, n as u64);
        assert_eq!(
            l.data,
            format!("bad{}-{}", l.checkpoint, l.index).as_bytes()
        );
        assert_eq!(l.class, SinkErrorClass::Rejected);
        assert_eq!(l.code.as_deref(), Some("23514"));
        assert!(l.message.contains("check constraint"), "{}", l.message);
        assert_eq!((l.sink_id.as_str(), l.subtask, l.attempt), ("dl", 0, 1));
    }
    let h = wal.health();
    assert_eq!(h.dead_letters, expect.len() as u64);
    assert_eq!(h.errors, 0, "a dead letter is not a failure");
    assert_eq!(h.delivered_records, want.len() as u64);
    assert_eq!(h.committed, Some(6));
}

/// A dead-letter log that ends the run right after a put: the put is durable, the epoch has
/// not gone again yet.
#[derive(Debug)]
struct CrashAfterPut(DirDeadLetters, Mutex<bool>);

impl DeadLetters for CrashAfterPut {
    fn held(&self, key: &EpochKey) -> walsink::Result<Vec<(u64, u64)>> {
        self.0.held(key)
    }
    fn put(&self, letter: DeadLetter) -> walsink::Result<()> {
        self.0.put(letter)?;
        *self.1.lock() = true;
        Err(walsink::Error::invalid_op("crash right after the put"))
    }
}

#[test]
fn after_a_crash_right_after_a_put_the_record_stays_out_of_its_epoch() {
    let dir = tempfile::tempdir().unwrap();
    let t = Table::default();
    let want;
    {
        let wal = open(dir.path());
        let dl = DirDeadLetters::open(dir.path().join("dlq"), "dl", 0).unwrap();
        let dl = Arc::new(CrashAfterPut(dl, Mutex::new(false)));
        wal.set_dead_letters(Some(dl.clone()));
        want = seal(&wal, 1, 10, |_, i| i == 4 || i == 7);
        let e = wal.deliver_ready(&mut t.clone()).unwrap_err();
        assert!(e.to_string().contains("crash right after the put"), "{e}");
        assert!(*dl.1.lock());
        assert!(t.rows.lock().is_empty());
    }
    // The next run: the first refused record is held, so only the second is refused now.
    let wal = open(dir.path());
    let dl = Arc::new(DirDeadLetters::open(dir.path().join("dlq"), "dl", 0).unwrap());
    assert_eq!(
        dl.held(&EpochKey {
            sink_id: "dl".into(),
            subtask: 0,
            checkpoint: 1
        })
        .unwrap(),
        vec![(4, 6)]
    );
    wal.set_dead_letters(Some(dl));
    wal.checkpoint_complete(1).unwrap();
    wal.deliver_ready(&mut t.clone()).unwrap();
    let got: Vec<Vec<u8>> = t.rows.lock().iter().map(|r| r.2.clone()).collect();
    assert_eq!(got, want);
    let indices: Vec<u64> = t.rows.lock().iter().map(|r| r.1).collect();
    assert_eq!(indices, vec![0, 1, 2, 3, 5, 6, 8, 9], "positions are kept");
    let letters = DirDeadLetters::read_all(dir.path().join("dlq")).unwrap();
    assert_eq!(
        letters.iter().map(|l| l.index).collect::<Vec<_>>(),
        vec![4, 7]
    );
}

#[test]
fn without_a_dead_letter_log_a_refusal_stops_delivery_and_skips_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let wal = open(dir.path());
    seal(&wal, 1, 5, |_, _| false);
    seal(&wal, 2, 5, |_, i| i == 2);
    let mut t = Table::default();
    let e = wal.deliver_ready(&mut t).unwrap_err();
    assert!(
        matches!(e.kind(), ErrorKind::Sink(s) if s.class() == SinkErrorClass::Rejected && s.record() == Some(2)),
        "{e}"
    );
    assert_eq!(t.rows.lock().len(), 5);
    let h = wal.health();
    assert_eq!(h.committed, Some(1));
    assert_eq!(h.backlog_records, 5, "checkpoint 2 is kept whole");
    assert_eq!(h.error_counts.rejected, 1);
    assert_eq!(h.dead_letters, 0);
}

#[test]
fn past_its_limit_the_refused_record_stays_and_delivery_stops_at_its_epoch() {
    let dir = tempfile::tempdir().unwrap();
    let wal = open(dir.path());
    let dl = DirDeadLetters::open(dir.path().join("dlq"), "dl", 0)
        .unwrap()
        .with_limit(2);
    wal.set_dead_letters(Some(Arc::new(dl)));
    seal(&wal, 1, 10, |_, i| i == 1);
    seal(&wal, 2, 10, |_, i| i == 3 || i == 8);
    let mut t = Table::default();
    let e = wal.deliver_ready(&mut t).unwrap_err();
    assert!(
        matches!(
            e.kind(),
            ErrorKind::DeadLetterLimit {
                limit: 2,
                checkpoint: 2,
                index: 8,
                ..
            }
        ),
        "{e}"
    );
    assert!(e.to_string().contains("limit"), "{e}");
    assert_eq!(wal.health().committed, Some(1));
    assert_eq!(t.rows.lock().len(), 9);
    assert_eq!(wal.health().backlog_records, 10);
    assert_eq!(
        DirDeadLetters::read_all(dir.path().join("dlq"))
            .unwrap()
            .len(),
        2
    );
}

#[test]
fn a_refusal_naming_a_record_the_delivery_does_not_hold_is_a_permanent_error() {
    let dir = tempfile::tempdir().unwrap();
    let wal = open(dir.path());
    wal.set_dead_letters(Some(Arc::new(
        DirDeadLetters::open(dir.path().join("dlq"), "dl", 0).unwrap(),
    )));
    seal(&wal, 1, 5, |_, i| i == 0);
    let mut t = Table {
        wrong_index: true,
        ..Table::default()
    };
    let e = wal.deliver_ready(&mut t).unwrap_err();
    assert!(
        matches!(e.kind(), ErrorKind::Sink(s) if s.class() == SinkErrorClass::Permanent),
        "{e}"
    );
    assert!(e.to_string().contains("record 1000"), "{e}");
    assert!(DirDeadLetters::read_all(dir.path().join("dlq"))
        .unwrap()
        .is_empty());
    assert_eq!(wal.health().committed, None);
}

/// A dead-letter log whose disk refuses writes.
#[derive(Debug)]
struct Down;

impl DeadLetters for Down {
    fn held(&self, _: &EpochKey) -> walsink::Result<Vec<(u64, u64)>> {
        Ok(Vec::new())
    }
    fn put(&self, _: DeadLetter) -> walsink::Result<()> {
        Err(walsink::Error::io(
            "write a dead letter",
            std::io::Error::from_raw_os_error(28),
        ))
    }
}

#[test]
fn a_dead_letter_log_that_cannot_write_stops_delivery_and_skips_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let wal = open(dir.path());
    wal.set_dead_letters(Some(Arc::new(Down)));
    seal(&wal, 1, 5, |_, i| i == 3);
    let mut t = Table::default();
    for _ in 0..3 {
        let e = wal.deliver_ready(&mut t).unwrap_err();
        assert!(matches!(e.kind(), ErrorKind::Io { .. }), "{e}");
    }
    assert!(t.rows.lock().is_empty());
    assert_eq!(wal.health().committed, None);
    assert_eq!(wal.health().backlog_records, 5);
    assert_eq!(wal.health().error_counts.log, 3);
}

#[test]
fn the_committer_thread_dead_letters_without_waiting_for_a_backoff() {
    let dir = tempfile::tempdir().unwrap();
    let wal = WalSink::open(
        dir.path().join("log"),
        opts("dl").create(true).retry(walsink::RetryPolicy::new(
            std::time::Duration::from_secs(30),
            std::time::Duration::from_secs(60),
        )),
    )
    .unwrap()
    .0;
    wal.set_dead_letters(Some(Arc::new(
        DirDeadLetters::open(dir.path().join("dlq"), "dl", 0).unwrap(),
    )));
    let want = seal(&wal, 1, 50, |_, i| i % 10 == 9);
    let t = Table::default();
    let c = wal.spawn_committer(t.clone()).unwrap();
    assert!(
        wal.wait_committed(1, std::time::Duration::from_secs(10)),
        "5 dead letters took a backoff each: {:?}",
        wal.health().last_error
    );
    c.shutdown();
    let got: Vec<Vec<u8>> = t.rows.lock().iter().map(|r| r.2.clone()).collect();
    assert_eq!(got, want);
    assert_eq!(wal.health().dead_letters, 5);
}

fn letter(checkpoint: u64, index: u64, data: &[u8]) -> DeadLetter {
    DeadLetter {
        seq: 0,
        sink_id: "dl".into(),
        subtask: 0,
        checkpoint,
        index,
        class: SinkErrorClass::Rejected,
        code: Some("23514".into()),
        message: "refused".into(),
        time_ms: 1_700_000_000_000,
        attempt: 1,
        origin: None,
        data: bytes::Bytes::copy_from_slice(data),
    }
}

#[test]
fn a_torn_last_letter_is_cut_off_and_damage_before_it_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("dl@0.wdl");
    let key = EpochKey {
        sink_id: "dl".into(),
        subtask: 0,
        checkpoint: 1,
    };
    let d = DirDeadLetters::open(dir.path(), "dl", 0).unwrap();
    d.put(letter(1, 0, b"one")).unwrap();
    let one = std::fs::metadata(&path).unwrap().len() as usize;
    d.put(letter(1, 1, b"two")).unwrap();
    drop(d);
    let full = std::fs::read(&path).unwrap();
    // Every cut inside the second letter (a put that never returned) leaves the first, and
    // the put made again writes the same bytes.
    for cut in one..full.len() {
        std::fs::write(&path, &full[..cut]).unwrap();
        let d = DirDeadLetters::open(dir.path(), "dl", 0).unwrap();
        assert_eq!(d.held(&key).unwrap(), vec![(0, 3)], "cut at {cut}");
        assert_eq!(DirDeadLetters::read_all(dir.path()).unwrap().len(), 1);
        d.put(letter(1, 1, b"two")).unwrap();
        drop(d);
        assert_eq!(std::fs::read(&path).unwrap(), full, "cut at {cut}");
    }
    // A flipped byte in the first letter, with a whole letter after it, is damage.
    let mut bad = full.clone();
    bad[one - 2] ^= 1;
    std::fs::write(&path, &bad).unwrap();
    let e = DirDeadLetters::open(dir.path(), "dl", 0).unwrap_err();
    assert!(matches!(e.kind(), ErrorKind::Corruption(_)), "{e}");
    assert!(e.to_string().contains("dl@0.wdl"), "{e}");
    let e = DirDeadLetters::read_all(dir.path()).unwrap_err();
    assert!(matches!(e.kind(), ErrorKind::Corruption(_)), "{e}");
}

#[test]
fn reading_a_missing_dead_letter_directory_creates_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let e = DirDeadLetters::read_all(dir.path().join("nope")).unwrap_err();
    assert!(e.to_string().contains("nope"), "{e}");
    assert!(!dir.path().join("nope").exists());
}

#[test]
fn dead_letter_files_are_private() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let d = DirDeadLetters::open(dir.path().join("dlq"), "dl", 0).unwrap();
    d.put(letter(1, 0, b"secret row")).unwrap();
    let mode = |p: &std::path::Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(&dir.path().join("dlq")), 0o700);
    assert_eq!(mode(&dir.path().join("dlq/dl@0.wdl")), 0o600);
}

#[test]
fn an_epoch_whose_every_record_is_refused_still_leaves_its_marker_in_the_target() {
    let dir = tempfile::tempdir().unwrap();
    let wal = open(dir.path());
    wal.set_dead_letters(Some(Arc::new(
        DirDeadLetters::open(dir.path().join("dlq"), "dl", 0).unwrap(),
    )));
    seal(&wal, 1, 3, |_, _| true);
    seal(&wal, 2, 3, |_, i| i != 1);
    let mut t = Table::default();
    wal.deliver_ready(&mut t).unwrap();
    assert_eq!(
        t.markers.lock().iter().copied().collect::<Vec<_>>(),
        vec![1, 2],
        "the target knows checkpoint 1 is done, though it holds none of its records"
    );
    assert_eq!(t.rows.lock().len(), 1);
    assert_eq!(wal.health().dead_letters, 5);
}

#[test]
fn a_damaged_last_letter_is_an_error_not_cut_off() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("dl@0.wdl");
    let d = DirDeadLetters::open(dir.path(), "dl", 0).unwrap();
    d.put(letter(1, 0, b"one")).unwrap();
    d.put(letter(1, 1, b"two")).unwrap();
    drop(d);
    let mut bad = std::fs::read(&path).unwrap();
    let n = bad.len();
    bad[n - 5] ^= 1;
    std::fs::write(&path, &bad).unwrap();
    let e = DirDeadLetters::open(dir.path(), "dl", 0).unwrap_err();
    assert!(matches!(e.kind(), ErrorKind::Corruption(_)), "{e}");
    assert!(DirDeadLetters::read_all(dir.path()).is_err());
    assert_eq!(std::fs::read(&path).unwrap(), bad, "nothing was cut");
}

/// Holds letters a log never wrote for this epoch: an index past its end, and one twice.
#[derive(Debug)]
struct Foreign;

impl DeadLetters for Foreign {
    fn held(&self, _: &EpochKey) -> walsink::Result<Vec<(u64, u64)>> {
        Ok(vec![(1, 4), (1, 4), (99, 1_000_000)])
    }
    fn put(&self, _: DeadLetter) -> walsink::Result<()> {
        Ok(())
    }
}

#[test]
fn letters_naming_records_an_epoch_does_not_have_are_passed_over() {
    let dir = tempfile::tempdir().unwrap();
    let wal = open(dir.path());
    wal.set_dead_letters(Some(Arc::new(Foreign)));
    let want = seal(&wal, 1, 3, |_, _| false);
    let mut t = Table::default();
    wal.deliver_ready(&mut t).unwrap();
    let got: Vec<Vec<u8>> = t.rows.lock().iter().map(|r| r.2.clone()).collect();
    assert_eq!(got, vec![want[0].clone(), want[2].clone()]);
    assert_eq!(wal.health().delivered_records, 2);
    assert_eq!(
        wal.health().delivered_bytes,
        8,
        "r1-0 and r1-2, 4 bytes each"
    );
}
