//! The async handle and the async committer on their own: durable appends from many tasks,
//! dropped futures, shutdown with a deadline, large records through the blocking path,
//! typed records that do not decode, evolving a postcard record type, a sink that panics
//! (caught, counted, shown and retried), and which threads a handle starts.

use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use std::sync::Arc;
use std::time::Duration;
use walsink::storage::{CrashOptions, SimStorage};
use walsink::{Epoch, ErrorKind, FullPolicy, MemorySink, Mode, Options, SinkError, WalSink};
use walsink_tokio::{AsyncChunks, AsyncSink, AsyncWal, Codec, Json, Postcard, TypedWal};

/// Collects delivered records; optionally hangs forever in `deliver`.
#[derive(Clone, Default)]
struct Collect {
    records: Arc<Mutex<Vec<Vec<u8>>>>,
    hang: bool,
}

impl AsyncSink for Collect {
    async fn deliver(&mut self, epoch: &Epoch) -> Result<(), SinkError> {
        if self.hang {
            std::future::pending::<()>().await;
        }
        let mut got = Vec::new();
        let mut chunks = AsyncChunks::new(epoch);
        while let Some(c) = chunks.next().await {
            let c = c.map_err(|e| SinkError::retryable(e.to_string()))?;
            got.extend(c.records().map(|r| r.data.to_vec()));
        }
        self.records.lock().extend(got);
        Ok(())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn durable_appends_from_many_tasks_are_each_delivered_once() {
    let dir = tempfile::tempdir().unwrap();
    let (wal, _) = AsyncWal::open(dir.path(), Options::new("many").mode(Mode::Durable))
        .await
        .unwrap();
    let sink = Collect::default();
    let committer = wal.spawn_committer(sink.clone()).unwrap();
    let tasks: Vec<_> = (0..16u32)
        .map(|t| {
            let wal = wal.clone();
            tokio::spawn(async move {
                for i in 0..100u32 {
                    wal.append(format!("{t}:{i}").as_bytes()).await.unwrap();
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.unwrap();
    }
    // Every append returned, so every record is durable and its automatic checkpoint sealed.
    let last = wal
        .pending()
        .last()
        .map(|p| p.id)
        .or(wal.health().committed)
        .expect("sealed");
    assert!(wal.wait_committed(last, Duration::from_secs(30)).await);
    let report = committer.shutdown(Duration::from_secs(10)).await;
    assert!(report.clean && report.pending.is_empty(), "{report:?}");
    let mut got = sink.records.lock().clone();
    got.sort();
    let mut want: Vec<Vec<u8>> = (0..16u32)
        .flat_map(|t| (0..100u32).map(move |i| format!("{t}:{i}").into_bytes()))
        .collect();
    want.sort();
    assert_eq!(got, want);
}

#[tokio::test]
async fn a_dropped_checkpoint_future_never_leaves_a_half_sealed_epoch() {
    for crash_seed in 0..20u64 {
        let sim = SimStorage::new();
        let opts = || {
            Options::new("dropped")
                .segment_size(64 << 10)
                .max_record_size(4 << 10)
                .max_metadata_size(1 << 10)
        };
        let (wal, _) = WalSink::open_with_storage(Arc::new(sim.clone()), opts()).unwrap();
        let wal = AsyncWal::from_sync(wal).unwrap();
        for i in 0..50u32 {
            wal.append(format!("{i}").as_bytes()).await.unwrap();
        }
        // Drop the checkpoint future at once or after a yield, then lose power.
        {
            let fut = wal.checkpoint(1, b"m");
            tokio::pin!(fut);
            for _ in 0..crash_seed % 3 {
                if futures_poll_once(fut.as_mut()).await {
                    break;
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(crash_seed % 4)).await;
        let sealed = wal.pending().iter().any(|p| p.id == 1);
        wal.clone().shutdown().await;
        drop(wal);
        // Give the blocking pool time to finish the checkpoint it started, if any.
        tokio::time::sleep(Duration::from_millis(20)).await;
        sim.crash(CrashOptions::power_loss(crash_seed));
        let (wal, report) = WalSink::open_with_storage(Arc::new(sim.clone()), opts()).unwrap();
        if sealed {
            assert_eq!(report.pending, vec![1], "seed {crash_seed}");
        }
        // Either checkpoint 1 is whole, with all 50 records, or it is absent.
        match report.pending.as_slice() {
            [] => {}
            [1] => {
                wal.checkpoint_complete(1).unwrap();
                let mut sink = MemorySink::new();
                wal.deliver_ready(&mut sink).unwrap();
                assert_eq!(sink.records().len(), 50, "seed {crash_seed}");
            }
            other => panic!("seed {crash_seed}: {other:?}"),
        }
    }
}

/// Polls a future once, returning whether it finished.
async fn futures_poll_once<F: std::future::Future>(f: std::pin::Pin<&mut F>) -> bool {
    let mut f = Some(f);
    std::future::poll_fn(move |cx| {
        let done = f.take().unwrap().poll(cx).is_ready();
        std::task::Poll::Ready(done)
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_with_a_deadline_reports_the_epoch_a_hung_sink_holds() {
    let dir = tempfile::tempdir().unwrap();
    let (wal, _) = AsyncWal::open(dir.path(), Options::new("hung"))
        .await
        .unwrap();
    let hung = Collect {
        hang: true,
        ..Default::default()
    };
    let committer = wal.spawn_committer(hung).unwrap();
    wal.append(b"a").await.unwrap();
    wal.checkpoint(1, b"").await.unwrap();
    wal.checkpoint_complete(1).unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    let report = committer.shutdown(Duration::from_millis(200)).await;
    assert!(!report.clean, "{report:?}");
    assert_eq!(report.pending, vec![1]);
    assert_eq!(report.committed, None);
    // The next committer delivers it.
    let sink = Collect::default();
    let mut tries = 0;
    let committer = loop {
        match wal.spawn_committer(sink.clone()) {
            Ok(c) => break c,
            Err(e) if tries < 100 => {
                assert!(
                    matches!(e.kind(), ErrorKind::InvalidOperation { .. }),
                    "{e}"
                );
                tries += 1;
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            Err(e) => panic!("{e}"),
        }
    };
    assert!(wal.wait_committed(1, Duration::from_secs(10)).await);
    let report = committer.shutdown(Duration::from_secs(10)).await;
    assert!(report.clean && report.pending.is_empty(), "{report:?}");
    assert_eq!(*sink.records.lock(), vec![b"a".to_vec()]);
}

#[tokio::test]
async fn records_larger_than_the_write_buffer_and_a_full_backlog_go_the_blocking_way() {
    let dir = tempfile::tempdir().unwrap();
    let opts = Options::new("big")
        .write_buffer_size(4096)
        .max_backlog_bytes(64 << 10, FullPolicy::Reject);
    let (wal, _) = AsyncWal::open(dir.path(), opts).await.unwrap();
    let big = vec![9u8; 20_000];
    wal.append(&big).await.unwrap();
    wal.append_batch(&[&big, &big]).await.unwrap();
    wal.append_batch(&[&big, &big]).await.unwrap();
    let e = wal.append(b"x").await.unwrap_err();
    assert!(matches!(e.kind(), ErrorKind::BacklogFull { .. }), "{e}");
    wal.checkpoint(1, b"").await.unwrap();
    wal.checkpoint_complete(1).unwrap();
    let mut sink = Collect::default();
    assert_eq!(wal.deliver_ready(&mut sink).await.unwrap(), 1);
    assert_eq!(sink.records.lock().len(), 5);
    // Too large for the log: refused, nothing appended.
    let e = wal.append(&vec![0u8; 32 << 20]).await.unwrap_err();
    assert!(matches!(e.kind(), ErrorKind::RecordTooLarge { .. }), "{e}");
}

#[derive(Serialize, Deserialize, Debug, PartialEq, Clone)]
struct Order {
    id: u64,
    cents: i64,
}

/// A typed sink: decodes every record, failing with the codec's error.
struct Decode<C>(C, Arc<Mutex<Vec<Order>>>);

impl<C: Codec> AsyncSink for Decode<C> {
    async fn deliver(&mut self, epoch: &Epoch) -> Result<(), SinkError> {
        for r in epoch.records() {
            let r = r.map_err(|e| SinkError::retryable(e.to_string()))?;
            let o: Order = self.0.decode_record(&r)?;
            self.1.lock().push(o);
        }
        Ok(())
    }
}

#[tokio::test]
async fn a_record_that_does_not_decode_is_an_error_naming_its_position() {
    for json in [false, true] {
        let dir = tempfile::tempdir().unwrap();
        let (wal, _) = AsyncWal::open(dir.path(), Options::new("typed"))
            .await
            .unwrap();
        let orders = [Order { id: 1, cents: 5 }, Order { id: 2, cents: -7 }];
        if json {
            TypedWal::new(wal.clone(), Json)
                .append_batch(&orders)
                .await
                .unwrap();
        } else {
            TypedWal::new(wal.clone(), Postcard)
                .append_batch(&orders)
                .await
                .unwrap();
        }
        wal.append(b"\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff")
            .await
            .unwrap();
        wal.checkpoint(3, b"").await.unwrap();
        wal.checkpoint_complete(3).unwrap();
        let got = Arc::new(Mutex::new(Vec::new()));
        let e = if json {
            wal.deliver_ready(&mut Decode(Json, got.clone())).await
        } else {
            wal.deliver_ready(&mut Decode(Postcard, got.clone())).await
        }
        .unwrap_err();
        let msg = e.to_string();
        assert!(
            matches!(e.kind(), ErrorKind::Sink(s) if s.class() == walsink::SinkErrorClass::Permanent),
            "{msg}"
        );
        assert!(msg.contains("record 2 of checkpoint 3"), "{msg}");
        assert_eq!(*got.lock(), orders.to_vec());
        // Nothing was skipped: the epoch is still pending.
        assert_eq!(wal.pending().len(), 1);
    }
}

#[tokio::test]
async fn a_postcard_envelope_with_a_new_version_still_reads_the_old_records() {
    #[derive(Serialize, Deserialize, Debug, PartialEq)]
    enum EventV1Only {
        V1 { id: u64 },
    }
    #[derive(Serialize, Deserialize, Debug, PartialEq)]
    enum Event {
        V1 { id: u64 },
        V2 { id: u64, note: String },
    }
    let mut old = Vec::new();
    Postcard
        .encode(&EventV1Only::V1 { id: 9 }, &mut old)
        .unwrap();
    assert_eq!(Postcard.decode::<Event>(&old).unwrap(), Event::V1 { id: 9 });
    let mut new = Vec::new();
    Postcard
        .encode(
            &Event::V2 {
                id: 1,
                note: "n".into(),
            },
            &mut new,
        )
        .unwrap();
    // A rollback reads a newer record as an error, never as something else.
    assert!(Postcard.decode::<EventV1Only>(&new).is_err());
}

#[test]
fn a_blocking_sink_works_inside_spawn_blocking_and_refuses_on_a_worker() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let (w, _) = WalSink::open(dir.path(), Options::new("inside")).unwrap();
    let w = Arc::new(w);
    w.append(b"a").unwrap();
    w.checkpoint(1, b"").unwrap();
    w.checkpoint_complete(1).unwrap();
    let sink = Collect::default();
    // On a worker: an error, not a panic; the epoch stays pending.
    let (w2, s2) = (w.clone(), sink.clone());
    let e = rt
        .block_on(async move {
            let mut b = walsink_tokio::BlockingSink::new(s2).unwrap();
            w2.deliver_ready(&mut b)
        })
        .unwrap_err();
    assert!(e.to_string().contains("runtime thread"), "{e}");
    assert_eq!(w.pending().len(), 1);
    // On the blocking pool, with the program's runtime or one of its own: delivered.
    let (w2, s2) = (w.clone(), sink.clone());
    let n = rt
        .block_on(async move {
            let h = tokio::runtime::Handle::current();
            tokio::task::spawn_blocking(move || {
                let mut b = walsink_tokio::BlockingSink::with_handle(s2, h);
                w2.deliver_ready(&mut b)
            })
            .await
            .unwrap()
        })
        .unwrap();
    assert_eq!(n, 1);
    assert_eq!(*sink.records.lock(), vec![b"a".to_vec()]);
}

/// One epoch as a sink took it: its checkpoint and records.
type Taken = (u64, Vec<Vec<u8>>);

/// Fails the first two deliveries of epochs 2 and 5 (after the driver read the next epoch
/// ahead), and keeps what it took per epoch.
#[derive(Clone, Default)]
struct FailTwice {
    got: Arc<Mutex<Vec<Taken>>>,
    failures: Arc<Mutex<Vec<u64>>>,
}

impl AsyncSink for FailTwice {
    async fn deliver(&mut self, epoch: &Epoch) -> Result<(), SinkError> {
        let cp = epoch.checkpoint();
        {
            let mut f = self.failures.lock();
            if (cp == 2 || cp == 5) && f.iter().filter(|&&c| c == cp).count() < 2 {
                f.push(cp);
                return Err(SinkError::retryable("injected failure"));
            }
        }
        let mut got = Vec::new();
        let mut chunks = AsyncChunks::new(epoch);
        while let Some(c) = chunks.next().await {
            let c = c.map_err(|e| SinkError::retryable(e.to_string()))?;
            got.extend(c.records().map(|r| r.data.to_vec()));
        }
        self.got.lock().push((cp, got));
        Ok(())
    }
}

/// The async drivers read the next epoch on the blocking pool while the sink takes one;
/// failures, retried, still give every epoch whole, once and in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn epochs_read_ahead_arrive_whole_once_and_in_order_through_failures() {
    for committer in [false, true] {
        let dir = tempfile::tempdir().unwrap();
        let (wal, _) = WalSink::open(
            dir.path(),
            Options::new("ahead")
                .segment_size(1 << 20)
                .max_record_size(4 << 10)
                .retry(walsink::RetryPolicy::new(
                    Duration::from_millis(1),
                    Duration::from_millis(5),
                )),
        )
        .unwrap();
        let wal = Arc::new(wal);
        let mut expected = Vec::new();
        for cp in 1..=6u64 {
            let recs: Vec<Vec<u8>> = (0..300)
                .map(|i| {
                    let mut r = format!("cp {cp} rec {i} ").into_bytes();
                    r.resize(1024, b'a' + cp as u8);
                    r
                })
                .collect();
            wal.append_batch(recs.iter().map(|r| r.as_slice())).unwrap();
            wal.checkpoint(cp, b"").unwrap();
            expected.push((cp, recs));
        }
        wal.checkpoint_complete(6).unwrap();
        let sink = FailTwice::default();
        if committer {
            let c = walsink_tokio::spawn_committer(&wal, sink.clone()).unwrap();
            for _ in 0..3000 {
                if wal.health().committed == Some(6) {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            c.shutdown(Duration::from_secs(10)).await;
        } else {
            let mut s = sink.clone();
            for _ in 0..10 {
                if walsink_tokio::deliver_ready(&wal, &mut s).await.is_ok() {
                    break;
                }
            }
        }
        assert_eq!(wal.health().committed, Some(6), "committer: {committer}");
        assert_eq!(*sink.got.lock(), expected, "committer: {committer}");
        assert_eq!(sink.failures.lock().len(), 4);
    }
}

/// Keeps the checkpoint of every epoch it takes; never fails.
#[derive(Clone, Default)]
struct Taking {
    got: Arc<Mutex<Vec<u64>>>,
}

impl AsyncSink for Taking {
    async fn deliver(&mut self, epoch: &Epoch) -> Result<(), SinkError> {
        self.got.lock().push(epoch.checkpoint());
        Ok(())
    }
}

/// The filesystem, except that directory syncs wait while `hold` is set (bounded), so a
/// commit mark made beside the sink is still running when the sink is done.
#[derive(Debug)]
struct SlowMarks {
    fs: walsink::storage::FsStorage,
    hold: Arc<std::sync::atomic::AtomicBool>,
}

impl walsink::storage::Storage for SlowMarks {
    fn list(&self) -> std::io::Result<Vec<String>> {
        self.fs.list()
    }
    fn open(&self, name: &str) -> std::io::Result<Arc<dyn walsink::storage::StorageFile>> {
        self.fs.open(name)
    }
    fn create(&self, name: &str) -> std::io::Result<Arc<dyn walsink::storage::StorageFile>> {
        self.fs.create(name)
    }
    fn rename(&self, from: &str, to: &str) -> std::io::Result<()> {
        self.fs.rename(from, to)
    }
    fn remove(&self, name: &str) -> std::io::Result<()> {
        self.fs.remove(name)
    }
    fn sync_dir(&self) -> std::io::Result<()> {
        for _ in 0..5000 {
            if !self.hold.load(std::sync::atomic::Ordering::SeqCst) {
                break;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        self.fs.sync_dir()
    }
    fn lock(&self, name: &str) -> std::io::Result<Box<dyn Send + Sync + std::fmt::Debug>> {
        self.fs.lock(name)
    }
    fn describe(&self) -> String {
        self.fs.describe()
    }
}

/// A `deliver_ready` dropped after the sink took an epoch, while the mark of the epochs before
/// it is still being made beside the sink: the epoch counts as delivered and is not sent again
/// by the next call (only a crash may send an epoch twice).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_dropped_while_the_mark_beside_the_sink_runs_does_not_resend_the_epoch() {
    let dir = tempfile::tempdir().unwrap();
    let hold = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let storage = Arc::new(SlowMarks {
        fs: walsink::storage::FsStorage::new(dir.path()).unwrap(),
        hold: hold.clone(),
    });
    let (wal, _) = WalSink::open_with_storage(
        storage,
        Options::new("slow-marks")
            .segment_size(1 << 20)
            .max_record_size(4 << 10),
    )
    .unwrap();
    let wal = Arc::new(wal);
    for cp in 1..=2u64 {
        let recs: Vec<Vec<u8>> = (0..300).map(|i| vec![b'a' + cp as u8; 1000 + i]).collect();
        wal.append_batch(recs.iter().map(|r| r.as_slice())).unwrap();
        wal.checkpoint(cp, b"").unwrap();
    }
    wal.checkpoint_complete(2).unwrap();
    hold.store(true, std::sync::atomic::Ordering::SeqCst);
    let sink = Taking::default();
    let mut s = sink.clone();
    // Epoch 1 goes, then epoch 2 while the mark of epoch 1 waits in its directory sync.
    let r = tokio::time::timeout(
        Duration::from_millis(500),
        walsink_tokio::deliver_ready(&wal, &mut s),
    )
    .await;
    assert!(r.is_err(), "the call was cut while the mark waited");
    let taken = sink.got.lock().clone();
    assert_eq!(
        taken,
        vec![1, 2],
        "the sink took both epochs before the cut"
    );
    hold.store(false, std::sync::atomic::Ordering::SeqCst);
    let mut s = sink.clone();
    walsink_tokio::deliver_ready(&wal, &mut s).await.unwrap();
    let taken = sink.got.lock().clone();
    assert_eq!(taken, vec![1, 2], "an epoch the sink took was sent again");
    assert_eq!(wal.health().committed, Some(2));
}

/// Panics in `deliver` (or, for a marker sink, in `is_committed`) until `healed` is set, then
/// records the checkpoints it takes.
#[derive(Clone, Default)]
struct PanicsUntilHealed {
    healed: Arc<std::sync::atomic::AtomicBool>,
    in_is_committed: bool,
    got: Arc<Mutex<Vec<u64>>>,
}

impl AsyncSink for PanicsUntilHealed {
    async fn deliver(&mut self, epoch: &Epoch) -> Result<(), SinkError> {
        if !self.in_is_committed && !self.healed.load(std::sync::atomic::Ordering::SeqCst) {
            panic!("sink bug at checkpoint {}", epoch.checkpoint());
        }
        self.got.lock().push(epoch.checkpoint());
        Ok(())
    }

    fn stores_marker(&self) -> bool {
        self.in_is_committed
    }

    async fn is_committed(&mut self, key: &walsink::EpochKey) -> Result<bool, SinkError> {
        if !self.healed.load(std::sync::atomic::Ordering::SeqCst) {
            panic!("marker lookup bug at checkpoint {}", key.checkpoint);
        }
        Ok(self.got.lock().contains(&key.checkpoint))
    }
}

fn fast_retries(id: &str) -> Options {
    Options::new(id).retry(walsink::RetryPolicy::new(
        Duration::from_millis(1),
        Duration::from_millis(20),
    ))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panicking_sink_is_counted_shown_and_retried_by_the_async_committer() {
    for in_is_committed in [false, true] {
        let dir = tempfile::tempdir().unwrap();
        let (wal, _) = AsyncWal::open(dir.path(), fast_retries("panics"))
            .await
            .unwrap();
        wal.append(b"r").await.unwrap();
        wal.checkpoint(1, b"").await.unwrap();
        wal.checkpoint_complete(1).unwrap();
        let sink = PanicsUntilHealed {
            in_is_committed,
            ..Default::default()
        };
        let committer = wal.spawn_committer(sink.clone()).unwrap();
        // Two errors: the panic was counted and the epoch tried again after it.
        let seen = tokio::time::timeout(Duration::from_secs(20), async {
            loop {
                let h = wal.health();
                if h.errors >= 2
                    && h.last_error
                        .as_deref()
                        .is_some_and(|e| e.contains("panicked"))
                {
                    return h;
                }
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        })
        .await;
        let h = seen.unwrap_or_else(|_| {
            panic!(
                "in_is_committed={in_is_committed}: the panic was not shown: {:?}",
                wal.health()
            )
        });
        assert!(
            h.last_error
                .as_deref()
                .unwrap()
                .contains("bug at checkpoint 1"),
            "the panic's message is shown: {h:?}"
        );
        assert_eq!(h.committed, None);
        sink.healed.store(true, std::sync::atomic::Ordering::SeqCst);
        assert!(wal.wait_committed(1, Duration::from_secs(20)).await);
        assert_eq!(
            *sink.got.lock(),
            vec![1],
            "in_is_committed={in_is_committed}"
        );
        let report = committer.shutdown(Duration::from_secs(10)).await;
        assert!(report.clean && report.pending.is_empty(), "{report:?}");
        assert_eq!(wal.health().last_error, None);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panicking_sink_makes_async_deliver_ready_return_a_permanent_error() {
    let dir = tempfile::tempdir().unwrap();
    let (wal, _) = AsyncWal::open(dir.path(), fast_retries("panics-ready"))
        .await
        .unwrap();
    wal.append(b"r").await.unwrap();
    wal.checkpoint(1, b"").await.unwrap();
    wal.checkpoint_complete(1).unwrap();
    let mut sink = PanicsUntilHealed::default();
    let e = wal.deliver_ready(&mut sink).await.unwrap_err();
    assert!(
        matches!(e.kind(), ErrorKind::Sink(s) if s.class() == walsink::SinkErrorClass::Permanent),
        "{e:?}"
    );
    assert!(e.to_string().contains("panicked"), "{e}");
    let h = wal.health();
    assert_eq!(h.errors, 1);
    assert!(h.last_error.unwrap().contains("sink bug at checkpoint 1"));
    sink.healed.store(true, std::sync::atomic::Ordering::SeqCst);
    assert_eq!(wal.deliver_ready(&mut sink).await.unwrap(), 1);
    assert_eq!(*sink.got.lock(), vec![1]);
}

/// Threads of this process whose name (as the kernel keeps it, 15 bytes) is `name`.
fn threads_named(name: &str) -> usize {
    std::fs::read_dir("/proc/self/task")
        .unwrap()
        .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("comm")).ok())
        .filter(|comm| comm.trim_end() == name)
        .count()
}

/// Sink ids starting with `thrd` are used only here, so the I/O threads named
/// `walsink-io-thrd` (the kernel keeps 15 bytes of `walsink-io-<sink id>`) are this test's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_io_thread_starts_only_with_the_first_durable_append_that_waits_for_the_disk() {
    const NAME: &str = "walsink-io-thrd";
    let dirs: Vec<_> = (0..17).map(|_| tempfile::tempdir().unwrap()).collect();
    let mut handles = Vec::new();
    for (i, dir) in dirs[..16].iter().enumerate() {
        let (wal, _) = AsyncWal::open(dir.path(), Options::new(format!("thrd{i}")))
            .await
            .unwrap();
        wal.append(b"r").await.unwrap();
        wal.checkpoint(1, b"").await.unwrap();
        handles.push(wal);
    }
    assert_eq!(
        threads_named(NAME),
        0,
        "16 handles in checkpointed mode started I/O threads"
    );
    let (durable, _) = AsyncWal::open(
        dirs[16].path(),
        Options::new("thrd-durable").mode(Mode::Durable),
    )
    .await
    .unwrap();
    assert_eq!(threads_named(NAME), 0, "opening started the I/O thread");
    let clone = durable.clone();
    durable.append(b"d1").await.unwrap();
    clone.append(b"d2").await.unwrap();
    assert_eq!(
        threads_named(NAME),
        1,
        "one I/O thread per log, shared by clones"
    );
    durable.shutdown().await;
    assert_eq!(threads_named(NAME), 0, "shutdown stopped the I/O thread");
    let e = clone.append(b"d3").await.unwrap_err();
    assert!(
        matches!(e.kind(), ErrorKind::InvalidOperation { .. }),
        "a clone refuses durable appends after shutdown: {e:?}"
    );
    assert_eq!(threads_named(NAME), 0, "shutdown is final");
}
