//! The target conformance suite: one test body that every target's tests run against their
//! real server, so all targets keep the same contract (the `conformance` feature).
//!
//! A target's test implements [`Harness`] (how to make a sink for a sink id and how to read
//! back what the target holds for it) and calls [`run_all`]. Each check uses its own sink
//! id, made unique per run, so checks never see each other's data.
//!
//! The checks: epochs arrive in order and whole, through both drivers (the async committer
//! task and the committer thread through [`BlockingSink`](crate::BlockingSink)); an epoch
//! delivered but not marked before a crash is not applied twice (marker sinks skip it, the
//! others are deduplicated by the target by idempotency key, which the harness's read-back
//! applies); an epoch larger than one read chunk streams; empty epochs (committed without a
//! call to `deliver`, as with every driver) and empty records
//! pass; subtasks of one sink id stay apart; and `is_committed` answers from the target.
//!
//! Run it from a multi-threaded runtime (`#[tokio::test(flavor = "multi_thread")]`): the
//! committer-thread check drives the sink through the test's runtime handle.

use crate::AsyncSink;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;
use walsink::{MemoryCommitStore, Next, Options, RetryPolicy, WalSink};

/// What a target's test gives the suite.
pub trait Harness: Send + Sync {
    /// The target's sink type.
    type Sink: AsyncSink + 'static;

    /// A new sink (its own connection) delivering into the target for `sink_id`.
    fn sink(&self, sink_id: &str) -> impl Future<Output = Self::Sink> + Send;

    /// What the target holds for `sink_id` and `subtask`, in delivery order, after any
    /// deduplication the target or its consumers apply (by idempotency key).
    fn read_back(&self, sink_id: &str, subtask: u32) -> impl Future<Output = Vec<Vec<u8>>> + Send;

    /// Record number `i` of a test (default: its decimal digits). Targets that need records
    /// in a format of their own (for example `FIELD<TAB>VALUE`) override it; it must be
    /// unique per `i`.
    fn record(&self, i: u64) -> Vec<u8> {
        i.to_string().into_bytes()
    }

    /// Whether empty records are meaningful for this target (default true).
    fn empty_records(&self) -> bool {
        true
    }
}

/// A sink id unique to this run and check.
pub fn unique_id(check: &str) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    format!(
        "conf-{check}-{}-{:x}",
        std::process::id(),
        nanos & 0xffff_ffff
    )
}

fn opts(sink_id: &str, subtask: u32) -> Options {
    Options::new(sink_id)
        .subtask(subtask)
        .segment_size(1 << 20)
        .max_record_size(64 << 10)
        .max_metadata_size(1 << 10)
        .read_chunk_size(4096)
        .retry(RetryPolicy::new(
            Duration::from_millis(5),
            Duration::from_millis(200),
        ))
}

struct Log {
    _dir: tempfile::TempDir,
    wal: Arc<WalSink>,
}

fn open(sink_id: &str, subtask: u32) -> Log {
    let dir = tempfile::tempdir().expect("tempdir");
    // A commit store that forgets: the suite simulates crashes by dropping deliverers, and
    // a fresh store per log keeps each check alone.
    let (wal, _) = WalSink::open_with(
        Arc::new(walsink::storage::FsStorage::new(dir.path()).expect("storage")),
        opts(sink_id, subtask),
        Box::new(MemoryCommitStore::new()),
    )
    .expect("open the log");
    Log {
        _dir: dir,
        wal: Arc::new(wal),
    }
}

/// Appends records `range` of harness `h` and seals them as checkpoint `cp`, complete.
fn epoch<H: Harness>(h: &H, wal: &WalSink, cp: u64, range: std::ops::Range<u64>) -> Vec<Vec<u8>> {
    let recs: Vec<Vec<u8>> = range.map(|i| h.record(i)).collect();
    wal.append_batch(recs.iter().map(|r| r.as_slice()))
        .expect("append");
    wal.checkpoint(cp, b"").expect("checkpoint");
    wal.checkpoint_complete(cp).expect("complete");
    recs
}

async fn wait_committed(wal: &Arc<WalSink>, id: u64) {
    let w = wal.clone();
    let ok = tokio::task::spawn_blocking(move || w.wait_committed(id, Duration::from_secs(60)))
        .await
        .expect("wait");
    assert!(
        ok,
        "checkpoint {id} was not committed within 60 s: {:?}",
        wal.health()
    );
}

/// Epochs go in order and whole through the async committer task.
pub async fn in_order_through_the_async_committer<H: Harness>(h: &H) {
    let id = unique_id("async");
    let log = open(&id, 0);
    let committer = crate::spawn_committer(&log.wal, h.sink(&id).await).expect("committer");
    let mut want = Vec::new();
    for cp in 1..=3u64 {
        want.extend(epoch(h, &log.wal, cp, cp * 100..cp * 100 + 20));
    }
    wait_committed(&log.wal, 3).await;
    let report = committer.shutdown(Duration::from_secs(30)).await;
    assert!(report.clean, "{report:?}");
    assert!(report.pending.is_empty(), "{report:?}");
    assert_eq!(
        h.read_back(&id, 0).await,
        want,
        "target contents (async committer)"
    );
    assert!(log.wal.health().last_error.is_none());
}

/// Epochs go in order and whole through the committer thread, with the sink wrapped in a
/// [`BlockingSink`](crate::BlockingSink).
pub async fn in_order_through_the_committer_thread<H: Harness>(h: &H) {
    let id = unique_id("thread");
    let log = open(&id, 0);
    let sink =
        crate::BlockingSink::with_handle(h.sink(&id).await, tokio::runtime::Handle::current());
    let committer = log.wal.spawn_committer(sink).expect("committer");
    let mut want = Vec::new();
    for cp in 1..=3u64 {
        want.extend(epoch(h, &log.wal, cp, cp * 100..cp * 100 + 20));
    }
    wait_committed(&log.wal, 3).await;
    tokio::task::spawn_blocking(move || committer.shutdown())
        .await
        .expect("shutdown");
    assert_eq!(
        h.read_back(&id, 0).await,
        want,
        "target contents (committer thread)"
    );
}

/// An epoch delivered and then "crashed" before it was marked is delivered again by the
/// next deliverer, and the target still holds it once.
pub async fn a_replay_after_a_crash_is_not_applied_twice<H: Harness>(h: &H) {
    let id = unique_id("replay");
    let log = open(&id, 0);
    let mut want = epoch(h, &log.wal, 1, 0..10);
    want.extend(epoch(h, &log.wal, 2, 10..30));
    let mut sink = h.sink(&id).await;
    // First life: deliver epoch 1, and die between the sink's Ok and the mark.
    {
        let mut d = log.wal.deliverer().expect("deliverer");
        let Next::Deliver(p) = d.next_step().expect("next") else {
            panic!("epoch 1 should be due")
        };
        let e = d.read(&p).expect("read");
        sink.deliver(&e).await.expect("deliver");
        // No `finish`: the epoch does not count as delivered in this process.
    }
    // Second life: a new log handle on the same directory has no mark and no memory.
    let dir = log._dir.path().to_path_buf();
    drop(log.wal);
    let (wal, report) = WalSink::open_with(
        Arc::new(walsink::storage::FsStorage::new(&dir).expect("storage")),
        opts(&id, 0),
        Box::new(MemoryCommitStore::new()),
    )
    .expect("reopen");
    assert_eq!(report.pending, vec![1, 2]);
    wal.checkpoint_complete(2).expect("complete");
    let wal = Arc::new(wal);
    let mut sink = h.sink(&id).await;
    if sink.stores_marker() {
        let key = walsink::EpochKey {
            sink_id: id.as_str().into(),
            subtask: 0,
            checkpoint: 1,
        };
        assert!(
            sink.is_committed(&key).await.expect("is_committed"),
            "a marker sink must report a delivered epoch as committed"
        );
    }
    let n = crate::deliver_ready(&wal, &mut sink)
        .await
        .expect("deliver");
    assert_eq!(n, 2);
    assert_eq!(
        h.read_back(&id, 0).await,
        want,
        "target contents after the replay"
    );
}

/// An epoch of many read chunks streams through the sink whole and in order, next to
/// empty epochs and (where meaningful) empty records.
pub async fn large_and_empty_epochs<H: Harness>(h: &H) {
    let id = unique_id("large");
    let log = open(&id, 0);
    let mut want = Vec::new();
    // About 40 read chunks of 4 KiB.
    let big: Vec<Vec<u8>> = (0..2000u64).map(|i| h.record(i)).collect();
    log.wal
        .append_batch(big.iter().map(|r| r.as_slice()))
        .expect("append");
    log.wal.checkpoint(1, b"").expect("checkpoint");
    want.extend(big);
    log.wal.checkpoint(2, b"").expect("empty checkpoint");
    if h.empty_records() {
        log.wal.append(b"").expect("append");
        want.push(Vec::new());
    }
    want.extend(epoch(h, &log.wal, 3, 5000..5005));
    let mut sink = h.sink(&id).await;
    let n = crate::deliver_ready(&log.wal, &mut sink)
        .await
        .expect("deliver");
    assert_eq!(n, 3);
    assert_eq!(
        h.read_back(&id, 0).await,
        want,
        "target contents (large epoch)"
    );
}

/// Two subtasks of one sink id deliver into the same target without seeing each other.
pub async fn subtasks_stay_apart<H: Harness>(h: &H) {
    let id = unique_id("subtasks");
    let (a, b) = (open(&id, 0), open(&id, 1));
    let wa = epoch(h, &a.wal, 7, 0..5);
    let wb = epoch(h, &b.wal, 7, 100..105);
    let mut sa = h.sink(&id).await;
    let mut sb = h.sink(&id).await;
    crate::deliver_ready(&a.wal, &mut sa)
        .await
        .expect("deliver 0");
    crate::deliver_ready(&b.wal, &mut sb)
        .await
        .expect("deliver 1");
    assert_eq!(h.read_back(&id, 0).await, wa);
    assert_eq!(h.read_back(&id, 1).await, wb);
}

/// Runs every check of the suite.
pub async fn run_all<H: Harness>(h: &H) {
    in_order_through_the_async_committer(h).await;
    in_order_through_the_committer_thread(h).await;
    a_replay_after_a_crash_is_not_applied_twice(h).await;
    large_and_empty_epochs(h).await;
    subtasks_stay_apart(h).await;
}
