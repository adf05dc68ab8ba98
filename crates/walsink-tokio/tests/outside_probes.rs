//! Outside acceptance probes of the async API (issue 11), written only from the public docs
//! (`README.md`, `docs/async.md`, `docs/architecture.md` and the rustdoc of `walsink` and
//! `walsink-tokio`), never from the implementation: each test attacks one documented promise
//! of `AsyncWal`, `AsyncSink` and the async committer, `AsyncChunks`, `TypedWal` with its codecs
//! and `BlockingSink` (runtime workers never blocked, per-method cancellation safety, power loss
//! after dropped futures, shutdown deadlines, retries without skips or duplicates, typed decode
//! errors instead of panics, budgets, odd timeouts) and asserts exactly what the docs promise.
//! A disk wrapper over `SimStorage` holds syncs, writes or reads at a gate so that a blocked
//! worker is detected without depending on timing; timeouts are hang guards only. Tests that
//! found a defect are kept with `#[ignore = "DEFECT: ..."]` so the suite stays green.

use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::future::Future;
use std::io;
use std::panic::AssertUnwindSafe;
use std::path::Path;
use std::pin::{pin, Pin};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::Duration;
use walsink::storage::{CrashOptions, SimStorage, Storage, StorageFile};
use walsink::{
    CommitStore, Epoch, EpochKey, ErrorKind, FullPolicy, MemorySink, Mode, Options, RecoveryReport,
    RetryPolicy, SinkError, SinkErrorClass, WalSink,
};
use walsink_tokio::{
    AsyncChunks, AsyncSink, AsyncWal, BlockingSink, Codec, DecodeError, Json, Postcard, TypedWal,
};

// ---------------------------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------------------------

/// Hang guard for awaited operations (never a pass/fail criterion by itself).
const GUARD: Duration = Duration::from_secs(120);

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

async fn guard<F: Future>(what: &str, f: F) -> F::Output {
    match tokio::time::timeout(GUARD, f).await {
        Ok(v) => v,
        Err(_) => panic!("hang guard: {what} did not finish within {GUARD:?}"),
    }
}

async fn wait_until(what: &str, mut cond: impl FnMut() -> bool) {
    guard(what, async {
        while !cond() {
            tokio::time::sleep(ms(2)).await;
        }
    })
    .await
}

/// Options with fast retries, so that failing sinks are retried quickly.
fn opts(id: &str) -> Options {
    Options::new(id).retry(RetryPolicy {
        initial: ms(1),
        max: ms(20),
    })
}

fn rec(cp: u64, i: usize) -> Vec<u8> {
    format!("cp{cp}-record{i}").into_bytes()
}

fn recs(cp: u64, n: usize) -> Vec<Vec<u8>> {
    (0..n).map(|i| rec(cp, i)).collect()
}

fn refs(v: &[Vec<u8>]) -> Vec<&[u8]> {
    v.iter().map(|r| r.as_slice()).collect()
}

/// Appends `records` and seals them as checkpoint `cp`.
async fn seal(wal: &AsyncWal, cp: u64, records: &[Vec<u8>]) {
    wal.append_batch(&refs(records))
        .await
        .expect("append_batch");
    wal.checkpoint(cp, &cp.to_le_bytes())
        .await
        .expect("checkpoint");
}

fn pending_ids(wal: &AsyncWal) -> Vec<u64> {
    wal.pending().iter().map(|p| p.id).collect()
}

fn sim_wal(sim: &SimStorage, o: Options) -> (AsyncWal, RecoveryReport) {
    let (w, r) = WalSink::open_with_storage(Arc::new(sim.clone()), o).expect("open on SimStorage");
    (AsyncWal::from_sync(w).expect("from_sync"), r)
}

/// Reopens a log on the real disk, waiting while the old handle's tasks still hold the lock
/// (as the crate's example does).
async fn reopen(dir: &Path, o: Options) -> (AsyncWal, RecoveryReport) {
    guard("reopening the log (lock released)", async {
        loop {
            match AsyncWal::open(dir, o.clone()).await {
                Err(e) if matches!(e.kind(), ErrorKind::Locked { .. }) => {
                    tokio::time::sleep(ms(20)).await
                }
                r => return r.expect("reopen"),
            }
        }
    })
    .await
}

/// Polls `f` up to `n` times with a waker that does nothing; `Some` if it completed.
fn poll_n<F: Future>(mut f: Pin<&mut F>, n: usize) -> Option<F::Output> {
    let mut cx = Context::from_waker(Waker::noop());
    for _ in 0..n {
        if let Poll::Ready(v) = f.as_mut().poll(&mut cx) {
            return Some(v);
        }
    }
    None
}

/// Runs `f` on a fresh current-thread runtime on a thread of its own and fails (instead of
/// hanging) if it makes no progress: a blocked worker on a current-thread runtime stops
/// everything, the runtime's own timers included.
fn on_current_thread<F, Fut>(what: &'static str, f: F)
where
    F: FnOnce() -> Fut + Send + 'static,
    Fut: Future<Output = ()>,
{
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let r = std::panic::catch_unwind(AssertUnwindSafe(|| rt.block_on(f())));
        let _ = tx.send(r);
    });
    match rx.recv_timeout(Duration::from_secs(300)) {
        Ok(Ok(())) => {}
        Ok(Err(p)) => std::panic::resume_unwind(p),
        Err(_) => panic!(
            "{what}: the current-thread runtime made no progress in 300 s (a blocked worker or a deadlock)"
        ),
    }
}

/// A std thread that runs `on_fire` if it is not dropped within `secs` seconds.
struct Watchdog {
    fired: Arc<AtomicBool>,
    done: Arc<AtomicBool>,
}

impl Watchdog {
    fn start(secs: u64, on_fire: impl FnOnce() + Send + 'static) -> Self {
        let fired = Arc::new(AtomicBool::new(false));
        let done = Arc::new(AtomicBool::new(false));
        let (f, d) = (fired.clone(), done.clone());
        std::thread::spawn(move || {
            for _ in 0..secs * 10 {
                if d.load(Ordering::SeqCst) {
                    return;
                }
                std::thread::sleep(ms(100));
            }
            f.store(true, Ordering::SeqCst);
            on_fire();
        });
        Watchdog { fired, done }
    }

    fn fired(&self) -> bool {
        self.fired.load(Ordering::SeqCst)
    }
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        self.done.store(true, Ordering::SeqCst);
    }
}

// ----- a disk whose syncs, writes or reads can be held at a gate -----------------------------

#[derive(Debug, Default)]
struct Gate {
    st: std::sync::Mutex<(bool, usize)>,
    cv: std::sync::Condvar,
}

impl Gate {
    fn close(&self) {
        self.st.lock().unwrap().0 = true;
    }
    fn open(&self) {
        self.st.lock().unwrap().0 = false;
        self.cv.notify_all();
    }
    /// Threads held at the gate now.
    fn waiting(&self) -> usize {
        self.st.lock().unwrap().1
    }
    fn pass(&self) {
        let mut g = self.st.lock().unwrap();
        if !g.0 {
            return;
        }
        g.1 += 1;
        while g.0 {
            g = self.cv.wait(g).unwrap();
        }
        g.1 -= 1;
    }
}

#[derive(Debug, Clone, Default)]
struct Gated {
    sim: SimStorage,
    sync: Arc<Gate>,
    write: Arc<Gate>,
    read: Arc<Gate>,
}

#[derive(Debug)]
struct GatedFile {
    f: Arc<dyn StorageFile>,
    g: Gated,
}

impl StorageFile for GatedFile {
    fn len(&self) -> io::Result<u64> {
        self.f.len()
    }
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<usize> {
        self.g.read.pass();
        self.f.read_at(offset, buf)
    }
    fn write_at(&self, offset: u64, data: &[u8]) -> io::Result<()> {
        self.g.write.pass();
        self.f.write_at(offset, data)
    }
    fn sync_data(&self) -> io::Result<()> {
        self.g.sync.pass();
        self.f.sync_data()
    }
    fn set_len(&self, len: u64) -> io::Result<()> {
        self.g.write.pass();
        self.f.set_len(len)
    }
}

impl Storage for Gated {
    fn list(&self) -> io::Result<Vec<String>> {
        self.sim.list()
    }
    fn open(&self, name: &str) -> io::Result<Arc<dyn StorageFile>> {
        Ok(Arc::new(GatedFile {
            f: self.sim.open(name)?,
            g: self.clone(),
        }))
    }
    fn create(&self, name: &str) -> io::Result<Arc<dyn StorageFile>> {
        Ok(Arc::new(GatedFile {
            f: self.sim.create(name)?,
            g: self.clone(),
        }))
    }
    fn rename(&self, from: &str, to: &str) -> io::Result<()> {
        self.sim.rename(from, to)
    }
    fn remove(&self, name: &str) -> io::Result<()> {
        self.sim.remove(name)
    }
    fn sync_dir(&self) -> io::Result<()> {
        self.sync.pass();
        self.sim.sync_dir()
    }
    fn check_alive(&self) -> io::Result<()> {
        self.sim.check_alive()
    }
    fn lock(&self, name: &str) -> io::Result<Box<dyn Send + Sync + std::fmt::Debug>> {
        self.sim.lock(name)
    }
    fn describe(&self) -> String {
        format!("gated {}", self.sim.describe())
    }
}

impl Gated {
    fn wal(&self, o: Options) -> AsyncWal {
        let (w, _) = WalSink::open_with_storage(Arc::new(self.clone()), o).expect("open gated");
        AsyncWal::from_sync(w).expect("from_sync")
    }
}

/// Runs `op` as a task while `gate` is closed, and checks that the calling task (on the same
/// runtime) keeps running while `op` is held at the gate. Returns `op`'s output and whether
/// it reached the gate at all. A 60 s watchdog opens the gate if nothing else can.
async fn stuck_on<T: Send + 'static>(
    gate: &Arc<Gate>,
    op: impl Future<Output = T> + Send + 'static,
) -> (T, bool) {
    gate.close();
    let g2 = gate.clone();
    let wd = Watchdog::start(60, move || g2.open());
    let task = tokio::spawn(op);
    let reached = guard("the operation reaching the held disk", async {
        loop {
            if gate.waiting() > 0 {
                return true;
            }
            if task.is_finished() || wd.fired() {
                return false;
            }
            tokio::time::sleep(ms(1)).await;
        }
    })
    .await;
    if reached {
        // This task keeps ticking while the operation is stuck in the disk.
        for _ in 0..5 {
            tokio::time::sleep(ms(1)).await;
        }
    }
    let fired = wd.fired();
    gate.open();
    let out = guard("the operation after the disk was released", task)
        .await
        .expect("operation task");
    assert!(
        !fired,
        "a runtime worker was blocked while a disk operation was held (the watchdog had to release it)"
    );
    (out, reached)
}

// ----- a scriptable async sink -----------------------------------------------------------------

#[derive(Default)]
struct Script {
    /// Every `deliver` call, failed ones included.
    calls: Vec<u64>,
    /// Successful deliveries with their records.
    ok: Vec<(u64, Vec<Vec<u8>>)>,
    /// The target's own marker (for marker sinks).
    marked: BTreeSet<u64>,
    violations: Vec<String>,
    fail_retryable: HashMap<u64, u32>,
    fail_permanent: HashMap<u64, u32>,
    fail_always: bool,
    hang: HashSet<u64>,
    hold: HashSet<u64>,
    hang_is_committed: bool,
    is_committed_calls: Vec<u64>,
}

#[derive(Clone, Default)]
struct Probe {
    s: Arc<Mutex<Script>>,
    marker: bool,
}

impl Probe {
    fn new() -> Self {
        Self::default()
    }
    fn with_marker() -> Self {
        Probe {
            marker: true,
            ..Self::default()
        }
    }
    fn edit(&self, f: impl FnOnce(&mut Script)) {
        f(&mut self.s.lock())
    }
    fn ok_ids(&self) -> Vec<u64> {
        self.s.lock().ok.iter().map(|(c, _)| *c).collect()
    }
    fn calls(&self) -> Vec<u64> {
        self.s.lock().calls.clone()
    }
    fn ok(&self) -> Vec<(u64, Vec<Vec<u8>>)> {
        self.s.lock().ok.clone()
    }
    fn records(&self) -> Vec<Vec<u8>> {
        self.s
            .lock()
            .ok
            .iter()
            .flat_map(|(_, r)| r.iter().cloned())
            .collect()
    }
    fn violations(&self) -> Vec<String> {
        self.s.lock().violations.clone()
    }
}

impl AsyncSink for Probe {
    async fn deliver(&mut self, epoch: &Epoch) -> Result<(), SinkError> {
        let cp = epoch.checkpoint();
        let (hang, hold) = {
            let mut s = self.s.lock();
            s.calls.push(cp);
            (s.hang.contains(&cp), s.hold.contains(&cp))
        };
        if hang {
            std::future::pending::<()>().await;
        }
        if hold {
            loop {
                let held = self.s.lock().hold.contains(&cp);
                if !held {
                    break;
                }
                tokio::time::sleep(ms(2)).await;
            }
        }
        let mut out = Vec::new();
        let mut next = 0u64;
        let mut bad = Vec::new();
        let mut chunks = AsyncChunks::new(epoch);
        while let Some(chunk) = chunks.next().await {
            let chunk = chunk.map_err(|e| SinkError::retryable(e.to_string()))?;
            if chunk.first_index() != next {
                bad.push(format!(
                    "cp {cp}: chunk starts at {} after {next} records",
                    chunk.first_index()
                ));
            }
            for r in chunk.records() {
                if r.position.checkpoint != cp || r.position.index != next {
                    bad.push(format!(
                        "cp {cp}: record {next} has position {:?}",
                        r.position
                    ));
                }
                next += 1;
                out.push(r.data.to_vec());
            }
        }
        if next != epoch.len() {
            bad.push(format!("cp {cp}: read {next} records of {}", epoch.len()));
        }
        let mut s = self.s.lock();
        s.violations.extend(bad);
        if s.fail_always {
            return Err(SinkError::retryable("failing on purpose"));
        }
        if let Some(n) = s.fail_retryable.get_mut(&cp) {
            if *n > 0 {
                *n -= 1;
                return Err(SinkError::retryable(format!("retryable failure of {cp}")));
            }
        }
        if let Some(n) = s.fail_permanent.get_mut(&cp) {
            if *n > 0 {
                *n -= 1;
                return Err(SinkError::permanent(format!("permanent failure of {cp}")));
            }
        }
        if self.marker && s.marked.contains(&cp) {
            s.violations.push(format!(
                "cp {cp} delivered again to a sink holding its marker"
            ));
        }
        if let Some((last, _)) = s.ok.last() {
            if *last >= cp && self.marker {
                let last = *last;
                s.violations
                    .push(format!("cp {cp} delivered after cp {last} (out of order)"));
            }
        }
        s.ok.push((cp, out));
        if self.marker {
            s.marked.insert(cp);
        }
        Ok(())
    }

    fn stores_marker(&self) -> bool {
        self.marker
    }

    async fn is_committed(&mut self, key: &EpochKey) -> Result<bool, SinkError> {
        let hang = {
            let mut s = self.s.lock();
            s.is_committed_calls.push(key.checkpoint);
            s.hang_is_committed
        };
        if hang {
            std::future::pending::<()>().await;
        }
        Ok(self.s.lock().marked.contains(&key.checkpoint))
    }
}

fn assert_each_once(delivered: &[Vec<u8>], expected: &[Vec<u8>]) {
    let mut count: BTreeMap<&[u8], usize> = BTreeMap::new();
    for r in delivered {
        *count.entry(r.as_slice()).or_default() += 1;
    }
    for e in expected {
        assert_eq!(
            count.get(e.as_slice()).copied().unwrap_or(0),
            1,
            "record {:?} must be delivered exactly once",
            String::from_utf8_lossy(e)
        );
    }
    assert_eq!(delivered.len(), expected.len(), "no unexpected records");
}

// ---------------------------------------------------------------------------------------------
// 1. No method blocks a runtime worker; nothing deadlocks
// ---------------------------------------------------------------------------------------------

#[test]
fn durable_appends_from_many_tasks_leave_a_current_thread_runtime_running_while_the_disk_syncs() {
    on_current_thread("durable appends", || async {
        let g = Gated::default();
        let wal = g.wal(opts("ct-durable").mode(Mode::Durable));
        let w = wal.clone();
        let ((), reached) = stuck_on(&g.sync, async move {
            let mut hs = Vec::new();
            for t in 0..16 {
                let w = w.clone();
                hs.push(tokio::spawn(async move {
                    for i in 0..5 {
                        w.append(format!("t{t}-{i}").as_bytes())
                            .await
                            .expect("durable append");
                    }
                }));
            }
            for h in hs {
                h.await.unwrap();
            }
        })
        .await;
        assert!(reached, "durable appends must wait for a sync");
        let mut sink = Probe::new();
        guard("deliver_ready", wal.deliver_ready(&mut sink))
            .await
            .unwrap();
        let got = sink.records();
        let expected: Vec<Vec<u8>> = (0..16)
            .flat_map(|t| (0..5).map(move |i| format!("t{t}-{i}").into_bytes()))
            .collect();
        assert_each_once(&got, &expected);
        // each task's records in its own order
        for t in 0..16 {
            let mine: Vec<_> = got
                .iter()
                .filter(|r| r.starts_with(format!("t{t}-").as_bytes()))
                .cloned()
                .collect();
            let want: Vec<_> = (0..5).map(|i| format!("t{t}-{i}").into_bytes()).collect();
            assert_eq!(mine, want, "task {t}'s records in order");
        }
        assert!(sink.violations().is_empty(), "{:?}", sink.violations());
    });
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn durable_appends_from_many_tasks_on_multi_thread_with_a_running_committer_arrive_once() {
    let dir = tempfile::tempdir().unwrap();
    let (wal, _) = AsyncWal::open(dir.path(), opts("mt-durable").mode(Mode::Durable))
        .await
        .unwrap();
    let probe = Probe::with_marker();
    let committer = wal.spawn_committer(probe.clone()).unwrap();
    let mut hs = Vec::new();
    for t in 0..32 {
        let w = wal.clone();
        hs.push(tokio::spawn(async move {
            for i in 0..20 {
                if i % 5 == 4 {
                    let batch = [format!("t{t}-{i}-a"), format!("t{t}-{i}-b")];
                    w.append_batch(&[batch[0].as_bytes(), batch[1].as_bytes()])
                        .await
                        .expect("durable batch");
                } else {
                    w.append(format!("t{t}-{i}").as_bytes())
                        .await
                        .expect("durable append");
                }
            }
        }));
    }
    for h in hs {
        guard("appending tasks", h).await.unwrap();
    }
    let expected: Vec<Vec<u8>> = (0..32)
        .flat_map(|t| {
            (0..20).flat_map(move |i| {
                if i % 5 == 4 {
                    vec![
                        format!("t{t}-{i}-a").into_bytes(),
                        format!("t{t}-{i}-b").into_bytes(),
                    ]
                } else {
                    vec![format!("t{t}-{i}").into_bytes()]
                }
            })
        })
        .collect();
    wait_until("every acknowledged durable record delivered", || {
        probe.records().len() >= expected.len()
    })
    .await;
    let report = guard("shutdown", committer.shutdown(Duration::from_secs(30))).await;
    assert!(report.clean, "{report:?}");
    assert!(report.pending.is_empty(), "{report:?}");
    assert_each_once(&probe.records(), &expected);
    assert!(probe.violations().is_empty(), "{:?}", probe.violations());
}

#[test]
fn checkpoint_and_restore_leave_a_current_thread_runtime_running_while_the_disk_syncs() {
    on_current_thread("checkpoint and restore", || async {
        let g = Gated::default();
        let wal = g.wal(opts("ct-cp"));
        wal.append_batch(&[b"a".as_slice(), b"b"]).await.unwrap();
        let w = wal.clone();
        let (r, reached) = stuck_on(&g.sync, async move { w.checkpoint(1, b"one").await }).await;
        r.expect("checkpoint");
        assert!(reached, "a checkpoint is durable when it returns: it syncs");
        wal.append(b"c").await.unwrap();
        wal.checkpoint(2, b"two").await.unwrap();
        let w = wal.clone();
        let (r, reached) = stuck_on(&g.sync, async move { w.restore(Some(1)).await }).await;
        r.expect("restore");
        assert!(reached, "a restore is durable when it returns: it syncs");
        assert_eq!(pending_ids(&wal), vec![1]);
    });
}

#[test]
fn an_append_that_must_write_the_file_leaves_a_current_thread_runtime_running() {
    on_current_thread("large append", || async {
        let g = Gated::default();
        let wal = g.wal(opts("ct-big").write_buffer_size(4096));
        let w = wal.clone();
        let (r, reached) = stuck_on(&g.write, async move {
            let big = vec![7u8; 20_000];
            w.append(&big).await
        })
        .await;
        r.expect("append of a record larger than the write buffer");
        assert!(
            reached,
            "a record larger than the write buffer must be written to the file"
        );
        wal.checkpoint(1, b"").await.unwrap();
        wal.checkpoint_complete(1).unwrap();
        let mut sink = Probe::new();
        wal.deliver_ready(&mut sink).await.unwrap();
        assert_eq!(sink.records(), vec![vec![7u8; 20_000]]);
    });
}

#[test]
fn reading_a_large_epoch_through_async_chunks_leaves_a_current_thread_runtime_running() {
    on_current_thread("async chunks", || async {
        let g = Gated::default();
        let wal = g.wal(opts("ct-chunks").read_chunk_size(1024));
        let records: Vec<Vec<u8>> = (0..300).map(|i| vec![(i % 251) as u8; 100]).collect();
        seal(&wal, 1, &records).await;
        wal.checkpoint_complete(1).unwrap();
        let w = wal.clone();
        let sink = Probe::new();
        let mut s2 = sink.clone();
        let (n, reached) = stuck_on(&g.read, async move { w.deliver_ready(&mut s2).await }).await;
        assert_eq!(n.expect("deliver_ready"), 1);
        assert!(reached, "an epoch of many chunks must be read from the log");
        assert_eq!(sink.records(), records);
        assert!(sink.violations().is_empty(), "{:?}", sink.violations());
    });
}

#[test]
fn marking_a_delivery_leaves_a_current_thread_runtime_running_while_the_disk_syncs() {
    on_current_thread("marking", || async {
        let g = Gated::default();
        let wal = g.wal(opts("ct-mark"));
        seal(&wal, 1, &recs(1, 3)).await;
        wal.checkpoint_complete(1).unwrap();
        let w = wal.clone();
        let sink = Probe::new();
        let mut s2 = sink.clone();
        let (n, reached) = stuck_on(&g.sync, async move { w.deliver_ready(&mut s2).await }).await;
        assert_eq!(n.expect("deliver_ready"), 1);
        assert!(reached, "the local commit store syncs its mark");
        assert_eq!(sink.ok_ids(), vec![1]);
        assert_eq!(wal.health().committed, Some(1));
    });
}

#[test]
fn an_append_waiting_for_backlog_budget_leaves_the_runtime_to_a_committer_on_it() {
    on_current_thread("backlog block", || async {
        let dir = tempfile::tempdir().unwrap();
        let (wal, _) = AsyncWal::open(
            dir.path(),
            opts("ct-block").max_backlog_bytes(4096, FullPolicy::Block),
        )
        .await
        .unwrap();
        let big: Vec<Vec<u8>> = (0..10).map(|i| vec![i as u8; 1000]).collect();
        seal(&wal, 1, &big).await;
        wal.checkpoint_complete(1).unwrap();
        // If the waiting append blocked this runtime's only worker, nothing on the runtime
        // could free the budget: the watchdog then frees it from a thread of its own.
        let blocking = wal.blocking().clone();
        let wd = Watchdog::start(60, move || {
            let _ = blocking.deliver_ready(&mut MemorySink::new());
        });
        let w = wal.clone();
        let waiting = tokio::spawn(async move { w.append(b"after the budget").await });
        for _ in 0..20 {
            tokio::time::sleep(ms(1)).await;
        }
        assert!(
            !waiting.is_finished() || wd.fired(),
            "with the budget used up and no deliverer, a blocking append must wait"
        );
        let probe = Probe::new();
        let committer = wal.spawn_committer(probe.clone()).unwrap();
        guard("the waiting append", waiting)
            .await
            .unwrap()
            .expect("append after the committer freed the budget");
        assert!(
            !wd.fired(),
            "the append waiting for budget blocked the runtime's worker"
        );
        wal.checkpoint(2, b"").await.unwrap();
        wal.checkpoint_complete(2).unwrap();
        assert!(guard("commit 2", wal.wait_committed(2, Duration::MAX)).await);
        committer.shutdown(Duration::from_secs(10)).await;
        assert_eq!(probe.ok_ids(), vec![1, 2]);
        assert_eq!(probe.records().last().unwrap(), b"after the budget");
    });
}

#[test]
fn durable_appends_over_a_small_budget_with_a_committer_on_the_same_current_thread_runtime() {
    on_current_thread("durable budget", || async {
        let dir = tempfile::tempdir().unwrap();
        let (wal, _) = AsyncWal::open(
            dir.path(),
            opts("ct-durable-block")
                .mode(Mode::Durable)
                .max_backlog_bytes(3000, FullPolicy::Block),
        )
        .await
        .unwrap();
        let w = wal.clone();
        let writer = tokio::spawn(async move {
            for i in 0..10u8 {
                w.append(&vec![i; 1000]).await.expect("durable append");
            }
        });
        for _ in 0..20 {
            tokio::time::sleep(ms(1)).await;
        }
        assert!(
            !writer.is_finished(),
            "10 KB of durable appends cannot fit a 3 KB budget without a deliverer"
        );
        let probe = Probe::new();
        let committer = wal.spawn_committer(probe.clone()).unwrap();
        guard("durable appends over the budget", writer)
            .await
            .unwrap();
        wait_until("all delivered", || probe.records().len() == 10).await;
        committer.shutdown(Duration::from_secs(10)).await;
        let expected: Vec<Vec<u8>> = (0..10u8).map(|i| vec![i; 1000]).collect();
        assert_eq!(probe.records(), expected);
    });
}

#[test]
fn wait_committed_is_woken_by_a_committer_on_the_same_current_thread_runtime() {
    on_current_thread("wait_committed", || async {
        let dir = tempfile::tempdir().unwrap();
        let (wal, _) = AsyncWal::open(dir.path(), opts("ct-wait")).await.unwrap();
        let probe = Probe::with_marker();
        let committer = wal.spawn_committer(probe.clone()).unwrap();
        for cp in 1..=5 {
            let w = wal.clone();
            let waiter = tokio::spawn(async move { w.wait_committed(cp, Duration::MAX).await });
            tokio::task::yield_now().await;
            seal(&wal, cp, &recs(cp, 2)).await;
            wal.checkpoint_complete(cp).unwrap();
            assert!(guard("waiter", waiter).await.unwrap());
        }
        let report = committer.shutdown(Duration::from_secs(10)).await;
        assert_eq!(report.committed, Some(5));
        assert_eq!(probe.ok_ids(), vec![1, 2, 3, 4, 5]);
    });
}

// ---------------------------------------------------------------------------------------------
// 2. Cancellation safety, checked with power loss
// ---------------------------------------------------------------------------------------------

/// Reopens `sim` after a crash and delivers everything sealed; returns the report and the
/// delivered epochs.
/// Delivered epochs: checkpoint id and records.
type Drained = Vec<(u64, Vec<Vec<u8>>)>;

fn reopen_and_drain(sim: &SimStorage, o: Options) -> (RecoveryReport, Drained) {
    let (w, report) = WalSink::open_with_storage(Arc::new(sim.clone()), o)
        .expect("a power loss never makes the default recovery refuse the log");
    if let Some(last) = report.last_checkpoint {
        w.checkpoint_complete(last).unwrap();
    }
    let mut ms = MemorySink::new();
    w.deliver_ready(&mut ms).expect("deliver after reopen");
    let got = ms
        .batches()
        .into_iter()
        .map(|(k, r)| (k.checkpoint, r))
        .collect();
    (report, got)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_checkpoint_dropped_at_any_poll_then_a_power_loss_never_reopens_half_sealed() {
    let o = opts("cp-drop")
        .write_buffer_size(4096)
        .max_record_size(16 * 1024)
        .max_metadata_size(1024)
        .segment_size(64 * 1024);
    let one = recs(1, 10);
    let two: Vec<Vec<u8>> = (0..2000)
        .map(|i| format!("two-{i:06}-{}", "x".repeat(i % 40)).into_bytes())
        .collect();
    for k in 0..4usize {
        for seed in 0..5u64 {
            let sim = SimStorage::new();
            let (wal, _) = sim_wal(&sim, o.clone());
            seal(&wal, 1, &one).await;
            wal.append_batch(&refs(&two)).await.unwrap();
            let finished = {
                let f = pin!(wal.checkpoint(2, b"two"));
                poll_n(f, k)
            };
            sim.crash(CrashOptions::power_loss(seed * 7 + k as u64));
            drop(wal);
            let (report, got) = reopen_and_drain(&sim, o.clone());
            assert!(
                report.pending.contains(&1),
                "k={k} seed={seed}: checkpoint 1 was durable: {report:?}"
            );
            for (cp, records) in &got {
                match cp {
                    1 => assert_eq!(records, &one, "k={k} seed={seed}"),
                    2 => assert_eq!(
                        records.len(),
                        two.len(),
                        "k={k} seed={seed}: checkpoint 2 reopened half-sealed"
                    ),
                    other => panic!("k={k} seed={seed}: unexpected checkpoint {other}"),
                }
                if *cp == 2 {
                    assert_eq!(records, &two, "k={k} seed={seed}");
                }
            }
            if let Some(Ok(())) = finished {
                assert!(
                    got.iter().any(|(c, _)| *c == 2),
                    "k={k} seed={seed}: a checkpoint that returned Ok was lost"
                );
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_checkpoint_dropped_while_its_sync_is_stuck_then_a_power_loss_never_reopens_half_sealed()
{
    let o = opts("cp-drop-sync")
        .write_buffer_size(4096)
        .max_record_size(16 * 1024)
        .max_metadata_size(1024)
        .segment_size(64 * 1024);
    let one = recs(1, 10);
    let two: Vec<Vec<u8>> = (0..1500)
        .map(|i| format!("two-{i:06}-{}", "y".repeat(i % 50)).into_bytes())
        .collect();
    for seed in 0..12u64 {
        let g = Gated::default();
        let wal = g.wal(o.clone());
        seal(&wal, 1, &one).await;
        wal.append_batch(&refs(&two)).await.unwrap();
        g.sync.close();
        let g2 = g.sync.clone();
        let _wd = Watchdog::start(120, move || g2.open());
        {
            let mut f = pin!(wal.checkpoint(2, b"two"));
            guard("checkpoint reaching its sync", async {
                loop {
                    if poll_n(f.as_mut(), 1).is_some() {
                        panic!("checkpoint returned while its sync was held");
                    }
                    if g.sync.waiting() > 0 {
                        break;
                    }
                    tokio::time::sleep(ms(1)).await;
                }
            })
            .await;
        } // dropped half-way through its sync
        g.sim.crash(CrashOptions::power_loss(seed));
        g.sync.open();
        drop(wal);
        let (report, got) = reopen_and_drain(&g.sim, o.clone());
        assert!(report.pending.contains(&1), "seed={seed}: {report:?}");
        for (cp, records) in &got {
            match cp {
                1 => assert_eq!(records, &one),
                2 => assert_eq!(
                    records, &two,
                    "seed={seed}: checkpoint 2 reopened half-sealed"
                ),
                other => panic!("seed={seed}: unexpected checkpoint {other}"),
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_checkpoint_runs_to_its_end_shows_in_pending_and_its_id_is_then_refused() {
    let dir = tempfile::tempdir().unwrap();
    let (wal, _) = AsyncWal::open(dir.path(), opts("cp-pending"))
        .await
        .unwrap();
    wal.append_batch(&refs(&recs(1, 100))).await.unwrap();
    {
        let f = pin!(wal.checkpoint(1, b"m"));
        let _ = poll_n(f, 1);
    }
    wait_until("the dropped checkpoint to show in pending()", || {
        pending_ids(&wal) == vec![1]
    })
    .await;
    assert_eq!(wal.pending()[0].records, 100);
    assert_eq!(wal.pending()[0].metadata, b"m".to_vec());
    let e = wal.checkpoint(1, b"again").await.unwrap_err();
    assert!(
        matches!(e.kind(), ErrorKind::InvalidCheckpoint { .. }),
        "the same id again must fail with InvalidCheckpoint: {e:?}"
    );
    wal.checkpoint(2, b"").await.unwrap();
    assert_eq!(pending_ids(&wal), vec![1, 2]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retrying_a_dropped_checkpoint_at_once_seals_exactly_one_whole_epoch() {
    for round in 0..10u64 {
        let dir = tempfile::tempdir().unwrap();
        let (wal, _) = AsyncWal::open(dir.path(), opts("cp-retry")).await.unwrap();
        let records = recs(round, 50);
        wal.append_batch(&refs(&records)).await.unwrap();
        {
            let f = pin!(wal.checkpoint(1, b"first"));
            let _ = poll_n(f, 1);
        }
        match wal.checkpoint(1, b"retry").await {
            Ok(()) => {}
            Err(e) => assert!(
                matches!(e.kind(), ErrorKind::InvalidCheckpoint { .. }),
                "round {round}: a retry may only fail with InvalidCheckpoint: {e:?}"
            ),
        }
        wait_until("the dropped checkpoint to settle", || {
            !wal.pending().is_empty()
        })
        .await;
        // give the dropped one every chance to finish, then check the whole picture
        wal.checkpoint(2, b"").await.unwrap();
        let p = wal.pending();
        assert_eq!(
            p.iter().map(|p| p.id).collect::<Vec<_>>(),
            vec![1, 2],
            "round {round}"
        );
        assert_eq!(
            p[0].records, 50,
            "round {round}: epoch 1 holds every record"
        );
        assert_eq!(p[1].records, 0, "round {round}");
        wal.checkpoint_complete(2).unwrap();
        let mut sink = Probe::new();
        wal.deliver_ready(&mut sink).await.unwrap();
        assert_eq!(sink.records(), records);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn append_batches_dropped_at_any_poll_are_all_or_nothing_and_in_order() {
    let sim = SimStorage::new();
    let o = opts("append-drop").write_buffer_size(4096);
    let (wal, _) = sim_wal(&sim, o.clone());
    let batch = |k: usize| -> Vec<Vec<u8>> {
        (0..3)
            .map(|j| format!("batch{k}-{j}-{}", "z".repeat(3000)).into_bytes())
            .collect()
    };
    for k in 0..6usize {
        let b = batch(k);
        let r = refs(&b);
        {
            let f = pin!(wal.append_batch(&r));
            let _ = poll_n(f, k % 3);
        }
        wal.append(format!("marker{k}").as_bytes()).await.unwrap();
        wal.checkpoint(k as u64 + 1, b"").await.unwrap();
    }
    wal.checkpoint_complete(6).unwrap();
    let check = |all: &[Vec<u8>], when: &str| {
        for k in 0..6 {
            let b = batch(k);
            let pos: Vec<usize> = all
                .iter()
                .enumerate()
                .filter(|(_, r)| r.starts_with(format!("batch{k}-").as_bytes()))
                .map(|(i, _)| i)
                .collect();
            assert!(
                pos.is_empty() || pos.len() == 3,
                "{when}: batch {k} partly appended ({} of 3 records)",
                pos.len()
            );
            if pos.len() == 3 {
                assert_eq!(pos[2] - pos[0], 2, "{when}: batch {k} split");
                assert_eq!(
                    &all[pos[0]..=pos[2]],
                    &b[..],
                    "{when}: batch {k} out of order"
                );
            }
        }
    };
    let mut sink = Probe::new();
    wal.deliver_ready(&mut sink).await.unwrap();
    check(&sink.records(), "before the crash");
    // a power loss after everything was sealed loses nothing sealed
    let before = sink.records();
    drop(wal);
    sim.crash(CrashOptions::power_loss(3));
    let (w, report) = WalSink::open_with_storage(Arc::new(sim.clone()), o).unwrap();
    assert!(report.pending.is_empty(), "{report:?}");
    assert_eq!(report.committed, Some(6));
    drop(w);
    assert!(before.len() >= 6);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_durable_append_dropped_during_its_sync_is_durable_after_the_next_sync() {
    for seed in 0..6u64 {
        let g = Gated::default();
        let o = opts("durable-drop").mode(Mode::Durable);
        let wal = g.wal(o.clone());
        g.sync.close();
        let g2 = g.sync.clone();
        let _wd = Watchdog::start(120, move || g2.open());
        {
            let mut f = pin!(wal.append(b"dropped but written"));
            guard("the durable append reaching its sync", async {
                loop {
                    if poll_n(f.as_mut(), 1).is_some() {
                        panic!("a durable append returned while its sync was held");
                    }
                    if g.sync.waiting() > 0 {
                        break;
                    }
                    tokio::time::sleep(ms(1)).await;
                }
            })
            .await;
        }
        g.sync.open();
        guard("the next durable append", wal.append(b"acknowledged"))
            .await
            .expect("append after the dropped one");
        g.sim.crash(CrashOptions::power_loss(seed));
        drop(wal);
        let (w, report) = WalSink::open_with_storage(Arc::new(g.sim.clone()), o.clone()).unwrap();
        let mut ms = MemorySink::new();
        w.deliver_ready(&mut ms).unwrap();
        assert_eq!(
            ms.records(),
            vec![b"dropped but written".to_vec(), b"acknowledged".to_vec()],
            "seed {seed}: {report:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_deliver_ready_offers_the_epoch_again_and_never_resends_earlier_ones() {
    let dir = tempfile::tempdir().unwrap();
    let o = opts("dr-drop").mark_every(100);
    let (wal, _) = AsyncWal::open(dir.path(), o.clone()).await.unwrap();
    for cp in 1..=5 {
        seal(&wal, cp, &recs(cp, 3)).await;
    }
    wal.checkpoint_complete(5).unwrap();
    let first = Probe::new();
    first.edit(|s| {
        s.hang.insert(3);
    });
    {
        let mut p = first.clone();
        let mut f = pin!(wal.deliver_ready(&mut p));
        guard("delivery reaching epoch 3", async {
            loop {
                if let Some(r) = poll_n(f.as_mut(), 1) {
                    panic!("deliver_ready returned while epoch 3 hangs: {r:?}");
                }
                if first.calls().contains(&3) {
                    break;
                }
                tokio::time::sleep(ms(1)).await;
            }
        })
        .await;
    } // dropped while epoch 3 is in the sink
    assert_eq!(first.ok_ids(), vec![1, 2]);
    let second = Probe::new();
    let mut s2 = second.clone();
    let n = guard("the next deliver_ready", async {
        loop {
            match wal.deliver_ready(&mut s2).await {
                Err(e) if matches!(e.kind(), ErrorKind::InvalidOperation { .. }) => {
                    tokio::time::sleep(ms(5)).await
                }
                r => return r,
            }
        }
    })
    .await
    .unwrap();
    assert_eq!(
        second.ok_ids(),
        vec![3, 4, 5],
        "the dropped epoch is offered again, the ones before are never sent again"
    );
    assert!(n >= 3);
    assert_eq!(wal.health().committed, Some(5));
    drop(wal);
    let (_wal, report) = reopen(dir.path(), o).await;
    assert!(report.pending.is_empty(), "{report:?}");
    assert_eq!(report.committed, Some(5));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_shutdown_future_still_stops_the_committer() {
    let dir = tempfile::tempdir().unwrap();
    let (wal, _) = AsyncWal::open(dir.path(), opts("sd-drop")).await.unwrap();
    let probe = Probe::new();
    let committer = wal.spawn_committer(probe.clone()).unwrap();
    seal(&wal, 1, &recs(1, 2)).await;
    wal.checkpoint_complete(1).unwrap();
    assert!(guard("commit 1", wal.wait_committed(1, Duration::MAX)).await);
    {
        let f = pin!(committer.shutdown(Duration::from_secs(30)));
        let _ = poll_n(f, 1);
    }
    // The task stops on its own; the right to deliver comes back.
    let other = Probe::new();
    let mut o2 = other.clone();
    guard("deliver_ready after the committer stopped", async {
        loop {
            match wal.deliver_ready(&mut o2).await {
                Err(e) if matches!(e.kind(), ErrorKind::InvalidOperation { .. }) => {
                    tokio::time::sleep(ms(5)).await
                }
                r => return r.unwrap(),
            }
        }
    })
    .await;
    seal(&wal, 2, &recs(2, 2)).await;
    wal.checkpoint_complete(2).unwrap();
    wal.deliver_ready(&mut o2).await.unwrap();
    assert_eq!(probe.ok_ids(), vec![1]);
    assert_eq!(other.ok_ids(), vec![2]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_committer_handle_stops_at_an_epoch_boundary_and_gives_the_log_back() {
    let dir = tempfile::tempdir().unwrap();
    let (wal, _) = AsyncWal::open(dir.path(), opts("c-drop")).await.unwrap();
    let probe = Probe::new();
    let committer = wal.spawn_committer(probe.clone()).unwrap();
    seal(&wal, 1, &recs(1, 2)).await;
    wal.checkpoint_complete(1).unwrap();
    assert!(guard("commit 1", wal.wait_committed(1, Duration::MAX)).await);
    drop(committer);
    let other = Probe::new();
    let mut o2 = other.clone();
    guard(
        "deliver_ready after the committer handle was dropped",
        async {
            loop {
                match wal.deliver_ready(&mut o2).await {
                    Err(e) if matches!(e.kind(), ErrorKind::InvalidOperation { .. }) => {
                        tokio::time::sleep(ms(5)).await
                    }
                    r => return r.unwrap(),
                }
            }
        },
    )
    .await;
    seal(&wal, 2, &recs(2, 1)).await;
    wal.checkpoint_complete(2).unwrap();
    wal.deliver_ready(&mut o2).await.unwrap();
    assert_eq!(probe.ok_ids(), vec![1]);
    assert_eq!(other.ok_ids(), vec![2]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wait_committed_futures_dropped_again_and_again_leave_it_working() {
    let dir = tempfile::tempdir().unwrap();
    let (wal, _) = AsyncWal::open(dir.path(), opts("wait-drop")).await.unwrap();
    let probe = Probe::new();
    probe.edit(|s| {
        s.hold.insert(1);
    });
    let committer = wal.spawn_committer(probe.clone()).unwrap();
    seal(&wal, 1, &recs(1, 2)).await;
    wal.checkpoint_complete(1).unwrap();
    for _ in 0..200 {
        let f = pin!(wal.wait_committed(1, Duration::MAX));
        assert_eq!(poll_n(f, 2), None);
    }
    for _ in 0..10 {
        assert!(
            tokio::time::timeout(ms(1), wal.wait_committed(1, Duration::MAX))
                .await
                .is_err()
        );
    }
    let w = wal.clone();
    let waiter = tokio::spawn(async move { w.wait_committed(1, Duration::MAX).await });
    probe.edit(|s| {
        s.hold.clear();
    });
    assert!(guard("wait_committed", waiter).await.unwrap());
    committer.shutdown(Duration::from_secs(10)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_restore_runs_to_its_end_and_ids_are_never_reused() {
    let dir = tempfile::tempdir().unwrap();
    let (wal, _) = AsyncWal::open(dir.path(), opts("restore-drop"))
        .await
        .unwrap();
    for cp in 1..=3 {
        seal(&wal, cp, &recs(cp, 2)).await;
    }
    wal.append(b"unsealed").await.unwrap();
    {
        let f = pin!(wal.restore(Some(1)));
        let _ = poll_n(f, 1);
    }
    wait_until("the dropped restore to finish", || {
        pending_ids(&wal) == vec![1]
    })
    .await;
    wait_until("the unsealed records voided", || {
        wal.health().open_records == 0
    })
    .await;
    for id in [2, 3] {
        let e = wal.checkpoint(id, b"").await.unwrap_err();
        assert!(
            matches!(e.kind(), ErrorKind::InvalidCheckpoint { .. }),
            "id {id} was seen before the restore and must not be reused: {e:?}"
        );
    }
    seal(&wal, 4, &recs(4, 1)).await;
    wal.checkpoint_complete(4).unwrap();
    let mut p = Probe::new();
    wal.deliver_ready(&mut p).await.unwrap();
    assert_eq!(p.ok_ids(), vec![1, 4]);
    assert!(!p.records().contains(&b"unsealed".to_vec()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_open_closes_the_log_again_so_it_can_be_opened_anew() {
    let dir = tempfile::tempdir().unwrap();
    {
        let (wal, _) = AsyncWal::open(dir.path(), opts("open-drop")).await.unwrap();
        seal(&wal, 1, &recs(1, 2)).await;
    }
    for k in 1..4 {
        let f = pin!(AsyncWal::open(dir.path(), opts("open-drop")));
        let _ = poll_n(f, k);
    }
    let (wal, report) = reopen(dir.path(), opts("open-drop")).await;
    assert_eq!(report.pending, vec![1]);
    drop(wal);
}

// ---------------------------------------------------------------------------------------------
// 3. Graceful shutdown with a deadline
// ---------------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_with_a_hung_sink_returns_unclean_names_what_is_pending_and_the_log_reopens() {
    let dir = tempfile::tempdir().unwrap();
    let o = opts("sd-hang");
    let (wal, _) = AsyncWal::open(dir.path(), o.clone()).await.unwrap();
    let probe = Probe::new();
    probe.edit(|s| {
        s.hang.insert(2);
    });
    let committer = wal.spawn_committer(probe.clone()).unwrap();
    for cp in 1..=3 {
        seal(&wal, cp, &recs(cp, 2)).await;
    }
    wal.checkpoint_complete(3).unwrap();
    wait_until("the sink to hang in epoch 2", || probe.calls().contains(&2)).await;
    let report = guard("shutdown with a deadline", committer.shutdown(ms(300))).await;
    assert!(
        !report.clean,
        "the deadline cut a delivery short: {report:?}"
    );
    assert_eq!(report.pending, vec![2, 3], "{report:?}");
    assert_eq!(report.committed, Some(1), "{report:?}");
    assert_eq!(pending_ids(&wal), vec![2, 3]);
    drop(wal);
    let (wal, report) = reopen(dir.path(), o).await;
    assert_eq!(report.pending, vec![2, 3]);
    wal.checkpoint_complete(3).unwrap();
    let mut p2 = Probe::new();
    wal.deliver_ready(&mut p2).await.unwrap();
    assert_eq!(p2.ok_ids(), vec![2, 3]);
    assert_eq!(probe.ok_ids(), vec![1]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_lets_a_slow_delivery_finish_before_the_deadline_and_reports_clean() {
    let dir = tempfile::tempdir().unwrap();
    let (wal, _) = AsyncWal::open(dir.path(), opts("sd-slow")).await.unwrap();
    let probe = Probe::new();
    probe.edit(|s| {
        s.hold.insert(1);
    });
    let committer = wal.spawn_committer(probe.clone()).unwrap();
    for cp in 1..=3 {
        seal(&wal, cp, &recs(cp, 2)).await;
    }
    wal.checkpoint_complete(3).unwrap();
    wait_until("the sink to be in epoch 1", || probe.calls().contains(&1)).await;
    let sd = tokio::spawn(committer.shutdown(Duration::from_secs(60)));
    for _ in 0..5 {
        tokio::task::yield_now().await;
    }
    probe.edit(|s| {
        s.hold.clear();
    });
    let report = guard("shutdown", sd).await.unwrap();
    assert!(report.clean, "{report:?}");
    let delivered = probe.ok_ids();
    assert!(delivered.starts_with(&[1]), "{delivered:?}");
    for cp in 1..=3u64 {
        assert!(
            delivered.contains(&cp) != report.pending.contains(&cp),
            "checkpoint {cp} must be either delivered or pending: {report:?} {delivered:?}"
        );
    }
    assert_eq!(
        report.committed,
        delivered.last().copied(),
        "delivered epochs are marked"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_of_a_committer_backing_off_from_a_failing_sink_returns_by_the_deadline() {
    let dir = tempfile::tempdir().unwrap();
    let hour = Duration::from_secs(3600);
    let (wal, _) = AsyncWal::open(
        dir.path(),
        Options::new("sd-fail").retry(RetryPolicy {
            initial: hour,
            max: hour,
        }),
    )
    .await
    .unwrap();
    let probe = Probe::new();
    probe.edit(|s| s.fail_always = true);
    let committer = wal.spawn_committer(probe.clone()).unwrap();
    seal(&wal, 1, &recs(1, 2)).await;
    wal.checkpoint_complete(1).unwrap();
    wait_until("a failed attempt", || wal.health().errors >= 1).await;
    let report = guard(
        "shutdown while the committer backs off for up to an hour",
        committer.shutdown(ms(500)),
    )
    .await;
    assert_eq!(report.pending, vec![1], "{report:?}");
    assert_eq!(report.committed, None, "{report:?}");
    assert!(probe.ok_ids().is_empty());
    assert!(wal.health().last_error.is_some());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_with_a_hung_is_committed_returns_by_the_deadline() {
    let dir = tempfile::tempdir().unwrap();
    let (wal, _) = AsyncWal::open(dir.path(), opts("sd-hang-ic"))
        .await
        .unwrap();
    let probe = Probe::with_marker();
    probe.edit(|s| s.hang_is_committed = true);
    let committer = wal.spawn_committer(probe.clone()).unwrap();
    seal(&wal, 1, &recs(1, 2)).await;
    wal.checkpoint_complete(1).unwrap();
    wait_until("is_committed to be asked", || {
        !probe.s.lock().is_committed_calls.is_empty()
    })
    .await;
    let report = guard("shutdown", committer.shutdown(ms(300))).await;
    assert_eq!(report.pending, vec![1], "{report:?}");
    assert!(
        !report.clean,
        "the deadline cut the delivery of 1 short: {report:?}"
    );
    // the next deliverer gets the log
    probe.edit(|s| s.hang_is_committed = false);
    let mut p = probe.clone();
    let n = guard("deliver_ready", wal.deliver_ready(&mut p))
        .await
        .unwrap();
    assert_eq!(n, 1);
    assert_eq!(probe.ok_ids(), vec![1]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_of_an_idle_committer_with_zero_and_max_deadlines_is_clean() {
    for deadline in [Duration::ZERO, Duration::from_nanos(1), Duration::MAX] {
        let dir = tempfile::tempdir().unwrap();
        let (wal, _) = AsyncWal::open(dir.path(), opts("sd-idle")).await.unwrap();
        let probe = Probe::new();
        let committer = wal.spawn_committer(probe.clone()).unwrap();
        seal(&wal, 1, &recs(1, 2)).await;
        wal.checkpoint_complete(1).unwrap();
        assert!(guard("commit", wal.wait_committed(1, Duration::MAX)).await);
        let report = guard("shutdown", committer.shutdown(deadline)).await;
        assert!(
            report.clean,
            "{deadline:?}: an idle committer is at a boundary: {report:?}"
        );
        assert!(report.pending.is_empty(), "{deadline:?}: {report:?}");
        assert_eq!(report.committed, Some(1), "{deadline:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn async_wal_shutdown_reports_pending_and_clones_then_refuse_durable_appends() {
    let dir = tempfile::tempdir().unwrap();
    let (wal, _) = AsyncWal::open(dir.path(), opts("wal-sd").mode(Mode::Durable))
        .await
        .unwrap();
    wal.append(b"one").await.unwrap();
    let clone = wal.clone();
    let pending = guard("AsyncWal::shutdown", wal.shutdown()).await;
    assert_eq!(
        pending.len(),
        1,
        "the acknowledged record's epoch is pending: {pending:?}"
    );
    let r = guard(
        "a durable append on a clone after shutdown",
        clone.append(b"two"),
    )
    .await;
    assert!(
        r.is_err(),
        "clones stop working for durable appends after shutdown: it must fail, got Ok"
    );
}

// ---------------------------------------------------------------------------------------------
// 4. Delivery: order, retries, no skips, no duplicates, restarts, restores, exclusion
// ---------------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sink_that_fails_then_succeeds_sees_every_epoch_in_order_without_skips_or_duplicates() {
    let dir = tempfile::tempdir().unwrap();
    let (wal, _) = AsyncWal::open(dir.path(), opts("retry")).await.unwrap();
    let probe = Probe::with_marker();
    probe.edit(|s| {
        s.fail_retryable.insert(2, 3);
        s.fail_permanent.insert(3, 2);
        s.fail_retryable.insert(5, 1);
    });
    let committer = wal.spawn_committer(probe.clone()).unwrap();
    let mut expected = Vec::new();
    for cp in 1..=6 {
        let r = recs(cp, 4);
        expected.extend(r.clone());
        seal(&wal, cp, &r).await;
        if cp % 2 == 0 {
            wal.checkpoint_complete(cp).unwrap();
        }
    }
    assert!(guard("commit 6", wal.wait_committed(6, Duration::MAX)).await);
    let report = committer.shutdown(Duration::from_secs(10)).await;
    assert!(report.clean && report.pending.is_empty(), "{report:?}");
    assert_eq!(probe.ok_ids(), vec![1, 2, 3, 4, 5, 6]);
    assert_eq!(probe.records(), expected);
    let calls = probe.calls();
    assert!(
        calls.windows(2).all(|w| w[0] <= w[1]),
        "calls never go back: {calls:?}"
    );
    assert_eq!(calls.iter().filter(|&&c| c == 2).count(), 4, "{calls:?}");
    assert_eq!(calls.iter().filter(|&&c| c == 3).count(), 3, "{calls:?}");
    assert!(probe.violations().is_empty(), "{:?}", probe.violations());
    let h = wal.health();
    assert!(h.errors >= 6, "{h:?}");
    assert_eq!(h.last_error, None, "cleared by the next success: {h:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deliver_ready_stops_at_the_first_error_marks_what_went_before_and_retries_the_same_epoch()
{
    let dir = tempfile::tempdir().unwrap();
    let (wal, _) = AsyncWal::open(dir.path(), opts("dr-err").mark_every(100))
        .await
        .unwrap();
    for cp in 1..=4 {
        seal(&wal, cp, &recs(cp, 2)).await;
    }
    wal.checkpoint_complete(4).unwrap();
    let probe = Probe::new();
    probe.edit(|s| {
        s.fail_retryable.insert(3, 2);
    });
    let mut p = probe.clone();
    let e = wal.deliver_ready(&mut p).await.unwrap_err();
    assert!(matches!(e.kind(), ErrorKind::Sink(_)), "{e:?}");
    assert_eq!(probe.ok_ids(), vec![1, 2]);
    assert_eq!(
        wal.health().committed,
        Some(2),
        "what succeeded before the error is marked"
    );
    assert!(wal.deliver_ready(&mut p).await.is_err());
    let n = wal.deliver_ready(&mut p).await.unwrap();
    assert_eq!(n, 2);
    assert_eq!(probe.ok_ids(), vec![1, 2, 3, 4]);
    assert_eq!(probe.calls(), vec![1, 2, 3, 3, 3, 4]);
    assert_eq!(wal.health().committed, Some(4));
}

/// A commit store whose marks always fail (and that remembers nothing).
struct BrokenStore;
impl CommitStore for BrokenStore {
    fn last_committed(&mut self, _: &str, _: u32) -> walsink::Result<Option<u64>> {
        Ok(None)
    }
    fn mark_committed(&mut self, _: &str, _: u32, _: u64) -> walsink::Result<()> {
        Err(walsink::Error::invalid_op("the commit store is down"))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_marker_sink_never_sees_an_epoch_twice_when_marks_were_lost_in_a_crash() {
    let sim = SimStorage::new();
    let o = opts("marker-crash");
    let (w, _) =
        WalSink::open_with(Arc::new(sim.clone()), o.clone(), Box::new(BrokenStore)).unwrap();
    let wal = AsyncWal::from_sync(w).unwrap();
    let probe = Probe::with_marker();
    let committer = wal.spawn_committer(probe.clone()).unwrap();
    for cp in 1..=3 {
        seal(&wal, cp, &recs(cp, 2)).await;
    }
    wal.checkpoint_complete(3).unwrap();
    wait_until("epoch 1 delivered", || probe.ok_ids().contains(&1)).await;
    wait_until("a failed mark", || wal.health().errors >= 1).await;
    let report = guard("shutdown", committer.shutdown(ms(500))).await;
    assert_eq!(report.committed, None, "{report:?}");
    sim.crash(CrashOptions::power_loss(11));
    drop(wal);
    let (wal, report) = sim_wal(&sim, o);
    assert_eq!(
        report.pending,
        vec![1, 2, 3],
        "nothing was marked: {report:?}"
    );
    wal.checkpoint_complete(3).unwrap();
    let committer = wal.spawn_committer(probe.clone()).unwrap();
    assert!(guard("commit 3", wal.wait_committed(3, Duration::MAX)).await);
    committer.shutdown(Duration::from_secs(10)).await;
    assert_eq!(probe.ok_ids(), vec![1, 2, 3], "each epoch once");
    assert!(probe.violations().is_empty(), "{:?}", probe.violations());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_with_pending_epochs_delivers_each_once_through_the_async_committer() {
    let dir = tempfile::tempdir().unwrap();
    let o = opts("restart");
    let mut expected = Vec::new();
    {
        let (wal, _) = AsyncWal::open(dir.path(), o.clone()).await.unwrap();
        let probe = Probe::new();
        let committer = wal.spawn_committer(probe.clone()).unwrap();
        for cp in 1..=4 {
            let r = recs(cp, 3);
            expected.extend(r.clone());
            seal(&wal, cp, &r).await;
        }
        wal.checkpoint_complete(1).unwrap();
        assert!(guard("commit 1", wal.wait_committed(1, Duration::MAX)).await);
        wal.append(b"lost in the crash").await.unwrap();
        committer.shutdown(Duration::from_secs(10)).await;
        assert_eq!(probe.ok_ids(), vec![1]);
    }
    let (wal, report) = reopen(dir.path(), o.clone()).await;
    assert_eq!(report.pending, vec![2, 3, 4], "{report:?}");
    assert_eq!(report.committed, Some(1));
    assert_eq!(report.last_checkpoint, Some(4));
    assert_eq!(report.last_metadata, Some(4u64.to_le_bytes().to_vec()));
    wal.restore(Some(4)).await.unwrap();
    let probe = Probe::with_marker();
    let committer = wal.spawn_committer(probe.clone()).unwrap();
    let next = report.next_checkpoint_id;
    assert!(next > 4);
    seal(&wal, next, &recs(next, 1)).await;
    wal.checkpoint_complete(next).unwrap();
    assert!(guard("commit next", wal.wait_committed(next, Duration::MAX)).await);
    committer.shutdown(Duration::from_secs(10)).await;
    assert_eq!(probe.ok_ids(), vec![2, 3, 4, next]);
    assert!(!probe.records().contains(&b"lost in the crash".to_vec()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restore_during_a_delivery_voids_only_the_epochs_above_and_the_one_in_flight_completes() {
    let dir = tempfile::tempdir().unwrap();
    let (wal, _) = AsyncWal::open(dir.path(), opts("restore-during"))
        .await
        .unwrap();
    let probe = Probe::with_marker();
    probe.edit(|s| {
        s.hold.insert(1);
    });
    let committer = wal.spawn_committer(probe.clone()).unwrap();
    for cp in 1..=3 {
        seal(&wal, cp, &recs(cp, 2)).await;
    }
    wal.checkpoint_complete(1).unwrap();
    wait_until("epoch 1 in the sink", || probe.calls().contains(&1)).await;
    guard("restore during delivery", wal.restore(Some(2)))
        .await
        .unwrap();
    assert_eq!(pending_ids(&wal), vec![1, 2]);
    probe.edit(|s| {
        s.hold.clear();
    });
    assert!(guard("commit 2", wal.wait_committed(2, Duration::MAX)).await);
    let e = wal.checkpoint(3, b"").await.unwrap_err();
    assert!(
        matches!(e.kind(), ErrorKind::InvalidCheckpoint { .. }),
        "{e:?}"
    );
    seal(&wal, 4, &recs(4, 2)).await;
    wal.checkpoint_complete(4).unwrap();
    assert!(guard("commit 4", wal.wait_committed(4, Duration::MAX)).await);
    committer.shutdown(Duration::from_secs(10)).await;
    assert_eq!(probe.ok_ids(), vec![1, 2, 4]);
    let mut want = recs(1, 2);
    want.extend(recs(2, 2));
    want.extend(recs(4, 2));
    assert_eq!(probe.records(), want);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_async_committer_and_every_other_deliverer_exclude_each_other() {
    let dir = tempfile::tempdir().unwrap();
    let (wal, _) = AsyncWal::open(dir.path(), opts("exclusive")).await.unwrap();
    let probe = Probe::new();
    let committer = wal.spawn_committer(probe.clone()).unwrap();
    let refused = |r: walsink::Result<()>, what: &str| match r {
        Err(e) => assert!(
            matches!(e.kind(), ErrorKind::InvalidOperation { .. }),
            "{what}: {e:?}"
        ),
        Ok(()) => panic!("{what} must be refused while the async committer runs"),
    };
    let mut other = Probe::new();
    refused(
        wal.deliver_ready(&mut other).await.map(|_| ()),
        "async deliver_ready",
    );
    refused(
        walsink_tokio::deliver_ready(wal.blocking(), &mut other)
            .await
            .map(|_| ()),
        "free deliver_ready",
    );
    refused(
        wal.blocking()
            .deliver_ready(&mut MemorySink::new())
            .map(|_| ()),
        "blocking deliver_ready",
    );
    refused(
        wal.spawn_committer(Probe::new()).map(|_| ()),
        "a second async committer",
    );
    refused(
        wal.blocking()
            .spawn_committer(MemorySink::new())
            .map(|_| ()),
        "a committer thread",
    );
    refused(wal.blocking().deliverer().map(|_| ()), "a deliverer");
    seal(&wal, 1, &recs(1, 2)).await;
    wal.checkpoint_complete(1).unwrap();
    assert!(guard("commit 1", wal.wait_committed(1, Duration::MAX)).await);
    committer.shutdown(Duration::from_secs(10)).await;
    seal(&wal, 2, &recs(2, 2)).await;
    wal.checkpoint_complete(2).unwrap();
    assert_eq!(wal.deliver_ready(&mut other).await.unwrap(), 1);
    assert_eq!(probe.ok_ids(), vec![1]);
    assert_eq!(other.ok_ids(), vec![2]);
    assert!(
        other.calls() == vec![2],
        "refused deliverers delivered nothing"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn async_committers_racing_deliver_ready_deliver_each_epoch_exactly_once() {
    let dir = tempfile::tempdir().unwrap();
    let (wal, _) = AsyncWal::open(dir.path(), opts("race").mark_every(3))
        .await
        .unwrap();
    let sinks: Arc<Mutex<Vec<Probe>>> = Arc::default();
    let stop = Arc::new(AtomicBool::new(false));
    let mut racers = Vec::new();
    for r in 0..3 {
        let (w, sinks, stop) = (wal.clone(), sinks.clone(), stop.clone());
        racers.push(tokio::spawn(async move {
            while !stop.load(Ordering::SeqCst) {
                let p = Probe::new();
                sinks.lock().push(p.clone());
                if r == 0 {
                    if let Ok(c) = w.spawn_committer(p) {
                        tokio::time::sleep(ms(3)).await;
                        let _ = c.shutdown(Duration::from_secs(30)).await;
                    }
                } else {
                    let mut p = p;
                    let _ = w.deliver_ready(&mut p).await;
                }
                tokio::task::yield_now().await;
            }
        }));
    }
    let mut expected = Vec::new();
    for cp in 1..=40 {
        let r = recs(cp, 2);
        expected.extend(r.clone());
        seal(&wal, cp, &r).await;
        wal.checkpoint_complete(cp).unwrap();
    }
    wait_until("every epoch committed", || {
        wal.health().committed == Some(40)
    })
    .await;
    stop.store(true, Ordering::SeqCst);
    for r in racers {
        guard("racer", r).await.unwrap();
    }
    let mut all: Vec<(u64, Vec<Vec<u8>>)> = sinks.lock().iter().flat_map(|p| p.ok()).collect();
    all.sort_by_key(|(c, _)| *c);
    let ids: Vec<u64> = all.iter().map(|(c, _)| *c).collect();
    assert_eq!(ids, (1..=40).collect::<Vec<_>>(), "each epoch exactly once");
    let got: Vec<Vec<u8>> = all.into_iter().flat_map(|(_, r)| r).collect();
    assert_eq!(got, expected);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropping_every_async_wal_clone_while_a_committer_runs_still_delivers_and_frees_the_log() {
    let dir = tempfile::tempdir().unwrap();
    let o = opts("drop-wal");
    let (wal, _) = AsyncWal::open(dir.path(), o.clone()).await.unwrap();
    let probe = Probe::new();
    probe.edit(|s| {
        s.hold.insert(1);
    });
    let committer = wal.spawn_committer(probe.clone()).unwrap();
    for cp in 1..=3 {
        seal(&wal, cp, &recs(cp, 2)).await;
    }
    wal.checkpoint_complete(3).unwrap();
    wait_until("epoch 1 in the sink", || probe.calls().contains(&1)).await;
    drop(wal);
    probe.edit(|s| {
        s.hold.clear();
    });
    wait_until("all three delivered without any handle", || {
        probe.ok_ids().len() == 3
    })
    .await;
    let report = guard("shutdown", committer.shutdown(Duration::from_secs(10))).await;
    assert!(report.clean, "{report:?}");
    assert!(report.pending.is_empty(), "{report:?}");
    assert_eq!(report.committed, Some(3));
    let (_wal, report) = reopen(dir.path(), o).await;
    assert!(report.pending.is_empty(), "{report:?}");
    assert_eq!(report.committed, Some(3));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_deadline_cut_the_log_can_be_reopened_in_process() {
    let dir = tempfile::tempdir().unwrap();
    let o = opts("cut-reopen");
    let (wal, _) = AsyncWal::open(dir.path(), o.clone()).await.unwrap();
    let probe = Probe::new();
    probe.edit(|s| {
        s.hang.insert(1);
    });
    let committer = wal.spawn_committer(probe.clone()).unwrap();
    seal(&wal, 1, &recs(1, 2)).await;
    wal.checkpoint_complete(1).unwrap();
    wait_until("the sink hangs", || probe.calls().contains(&1)).await;
    let report = guard("shutdown", committer.shutdown(ms(200))).await;
    assert!(!report.clean);
    guard("AsyncWal::shutdown", wal.shutdown()).await;
    let (_wal, report) = reopen(dir.path(), o).await;
    assert_eq!(report.pending, vec![1]);
}

// ---------------------------------------------------------------------------------------------
// 5. Huge, empty and limit-sized data; budgets; odd timeouts
// ---------------------------------------------------------------------------------------------

/// A sink that checks how a large epoch streams through `AsyncChunks`.
#[derive(Clone, Default)]
struct Streamer {
    out: Arc<Mutex<Vec<Vec<u8>>>>,
    chunks: Arc<AtomicUsize>,
    loaded: Arc<Mutex<Option<bool>>>,
    problems: Arc<Mutex<Vec<String>>>,
}

impl AsyncSink for Streamer {
    async fn deliver(&mut self, epoch: &Epoch) -> Result<(), SinkError> {
        *self.loaded.lock() = Some(epoch.is_loaded());
        // A first pass, abandoned half-way with a next() future dropped after one poll.
        let mut it = AsyncChunks::new(epoch);
        for _ in 0..3 {
            match it.next().await {
                Some(Ok(_)) => {}
                other => self.problems.lock().push(format!(
                    "early chunk: {:?}",
                    other.map(|r| r.map(|c| c.len()))
                )),
            }
        }
        tokio::select! {
            biased;
            _ = it.next() => {}
            _ = std::future::ready(()) => {}
        }
        drop(it);
        // The full pass.
        let mut it = AsyncChunks::new(epoch);
        let mut next = 0u64;
        let mut out = Vec::new();
        let mut n = 0;
        while let Some(c) = it.next().await {
            let c = c.map_err(|e| SinkError::retryable(e.to_string()))?;
            n += 1;
            if c.first_index() != next || c.is_empty() {
                self.problems.lock().push(format!(
                    "chunk at {} (len {}) after {next}",
                    c.first_index(),
                    c.len()
                ));
            }
            for r in c.records() {
                if r.position.index != next || r.position.checkpoint != epoch.checkpoint() {
                    self.problems
                        .lock()
                        .push(format!("position {:?} at {next}", r.position));
                }
                next += 1;
                out.push(r.data.to_vec());
            }
        }
        for _ in 0..3 {
            if it.next().await.is_some() {
                self.problems.lock().push("a chunk after the end".into());
            }
        }
        self.chunks.store(n, Ordering::SeqCst);
        *self.out.lock() = out;
        Ok(())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_huge_epoch_streams_through_async_chunks_whole_and_in_order_even_after_a_dropped_read() {
    let dir = tempfile::tempdir().unwrap();
    let (wal, _) = AsyncWal::open(
        dir.path(),
        opts("huge")
            .read_chunk_size(1024)
            .max_record_size(16 * 1024)
            .segment_size(256 * 1024),
    )
    .await
    .unwrap();
    let records: Vec<Vec<u8>> = (0..20_000)
        .map(|i| format!("{i:08}{}", "h".repeat(i % 90)).into_bytes())
        .collect();
    seal(&wal, 1, &records).await;
    wal.checkpoint_complete(1).unwrap();
    let s = Streamer::default();
    let committer = wal.spawn_committer(s.clone()).unwrap();
    assert!(
        guard(
            "commit the huge epoch",
            wal.wait_committed(1, Duration::MAX)
        )
        .await
    );
    committer.shutdown(Duration::from_secs(10)).await;
    assert_eq!(
        *s.loaded.lock(),
        Some(false),
        "an epoch of many chunks is not loaded up front"
    );
    assert!(
        s.chunks.load(Ordering::SeqCst) > 100,
        "read in bounded chunks"
    );
    assert!(s.problems.lock().is_empty(), "{:?}", s.problems.lock());
    assert!(*s.out.lock() == records, "every record, in order");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn empty_batches_empty_records_and_empty_epochs_pass_in_both_modes() {
    let dir = tempfile::tempdir().unwrap();
    let (wal, _) = AsyncWal::open(dir.path(), opts("empty")).await.unwrap();
    let probe = Probe::new();
    let committer = wal.spawn_committer(probe.clone()).unwrap();
    wal.append_batch(&[]).await.unwrap();
    assert_eq!(wal.health().open_records, 0);
    wal.checkpoint(1, b"").await.unwrap();
    wal.append(b"").await.unwrap();
    wal.append_batch(&[b"".as_slice(), b""]).await.unwrap();
    wal.checkpoint(2, b"").await.unwrap();
    wal.checkpoint_complete(2).unwrap();
    assert!(guard("commit 2", wal.wait_committed(2, Duration::MAX)).await);
    committer.shutdown(Duration::from_secs(10)).await;
    // The blocking driver, given the same log shape, is the reference of the contract.
    let dir2 = tempfile::tempdir().unwrap();
    let (w2, _) = WalSink::open(dir2.path(), opts("empty-sync")).unwrap();
    w2.append_batch(Vec::<&[u8]>::new()).unwrap();
    w2.checkpoint(1, b"").unwrap();
    w2.append(b"").unwrap();
    w2.append_batch([b"".as_slice(), b""]).unwrap();
    w2.checkpoint(2, b"").unwrap();
    w2.checkpoint_complete(2).unwrap();
    let mut ms = MemorySink::new();
    w2.deliver_ready(&mut ms).unwrap();
    assert_eq!(
        probe.ok_ids(),
        ms.checkpoints(),
        "the async committer delivers the same epochs as the blocking driver"
    );
    assert!(
        wal.wait_committed(1, Duration::ZERO).await,
        "the empty epoch is committed"
    );
    assert_eq!(
        probe.ok().last(),
        Some(&(2, vec![vec![], vec![], vec![]])),
        "empty records are delivered"
    );

    let dir = tempfile::tempdir().unwrap();
    let (wal, _) = AsyncWal::open(dir.path(), opts("empty-durable").mode(Mode::Durable))
        .await
        .unwrap();
    guard("empty durable batch", wal.append_batch(&[]))
        .await
        .unwrap();
    guard("empty durable record", wal.append(b""))
        .await
        .unwrap();
    let mut p = Probe::new();
    wal.deliver_ready(&mut p).await.unwrap();
    assert_eq!(p.records(), vec![Vec::<u8>::new()]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn records_at_the_size_limit_pass_and_one_byte_more_fails_the_whole_batch() {
    for (limit, buffer) in [(100usize, 256 * 1024usize), (5000, 4096)] {
        for mode in [Mode::Checkpointed, Mode::Durable] {
            let what = format!("limit {limit}, buffer {buffer}, {mode:?}");
            let dir = tempfile::tempdir().unwrap();
            let (wal, _) = AsyncWal::open(
                dir.path(),
                opts("limit")
                    .mode(mode)
                    .max_record_size(limit)
                    .write_buffer_size(buffer),
            )
            .await
            .unwrap();
            let at = vec![1u8; limit];
            let over = vec![2u8; limit + 1];
            wal.append(&at)
                .await
                .unwrap_or_else(|e| panic!("{what}: at the limit: {e:?}"));
            let e = wal.append(&over).await.unwrap_err();
            assert!(
                matches!(e.kind(), ErrorKind::RecordTooLarge { .. }),
                "{what}: {e:?}"
            );
            let e = wal
                .append_batch(&[at.as_slice(), over.as_slice(), at.as_slice()])
                .await
                .unwrap_err();
            assert!(
                matches!(e.kind(), ErrorKind::RecordTooLarge { .. }),
                "{what}: {e:?}"
            );
            let typed = TypedWal::<Vec<u8>, Json>::new(wal.clone(), Json);
            assert!(
                typed.append(&vec![0u8; limit]).await.is_err(),
                "{what}: json is larger"
            );
            if mode == Mode::Checkpointed {
                assert_eq!(wal.health().open_records, 1, "{what}: nothing of the batch");
                wal.checkpoint(1, b"").await.unwrap();
                wal.checkpoint_complete(1).unwrap();
            }
            let mut p = Probe::new();
            wal.deliver_ready(&mut p).await.unwrap();
            assert_eq!(p.records(), vec![at.clone()], "{what}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_backlog_with_reject_fails_typed_writes_nothing_and_recovers_after_delivery() {
    let dir = tempfile::tempdir().unwrap();
    let (wal, _) = AsyncWal::open(
        dir.path(),
        opts("reject").max_backlog_bytes(2000, FullPolicy::Reject),
    )
    .await
    .unwrap();
    let big: Vec<Vec<u8>> = (0..3).map(|i| vec![i as u8; 1000]).collect();
    seal(&wal, 1, &big).await;
    wal.checkpoint_complete(1).unwrap();
    let before = wal.health();
    for r in [
        guard("append", wal.append(b"x")).await,
        guard("batch", wal.append_batch(&[b"y".as_slice(), b"z"])).await,
        guard("big", wal.append(&vec![9u8; 50_000])).await,
        guard(
            "typed",
            TypedWal::<u32, Postcard>::new(wal.clone(), Postcard).append(&5),
        )
        .await,
    ] {
        let e = r.expect_err("the budget is used up: reject");
        assert!(matches!(e.kind(), ErrorKind::BacklogFull { .. }), "{e:?}");
    }
    let after = wal.health();
    assert_eq!(after.open_records, before.open_records, "nothing written");
    assert_eq!(after.open_bytes, before.open_bytes, "nothing written");
    let mut p = Probe::new();
    wal.deliver_ready(&mut p).await.unwrap();
    wal.append(b"after").await.unwrap();
    wal.checkpoint(2, b"").await.unwrap();
    wal.checkpoint_complete(2).unwrap();
    wal.deliver_ready(&mut p).await.unwrap();
    let mut want = big.clone();
    want.push(b"after".to_vec());
    assert_eq!(p.records(), want);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wait_committed_with_odd_timeouts() {
    let dir = tempfile::tempdir().unwrap();
    let (wal, _) = AsyncWal::open(dir.path(), opts("odd-timeouts"))
        .await
        .unwrap();
    assert!(!guard("zero", wal.wait_committed(1, Duration::ZERO)).await);
    assert!(!guard("1 ns", wal.wait_committed(1, Duration::from_nanos(1))).await);
    assert!(!guard("u64::MAX id", wal.wait_committed(u64::MAX, ms(5))).await);
    let w = wal.clone();
    let early =
        tokio::spawn(async move { w.wait_committed(2, Duration::from_secs(u64::MAX)).await });
    let w = wal.clone();
    let max = tokio::spawn(async move { w.wait_committed(2, Duration::MAX).await });
    let probe = Probe::new();
    let committer = wal.spawn_committer(probe.clone()).unwrap();
    seal(&wal, 1, &recs(1, 1)).await;
    seal(&wal, 2, &recs(2, 1)).await;
    wal.checkpoint_complete(2).unwrap();
    assert!(guard("u64::MAX secs", early).await.unwrap());
    assert!(guard("Duration::MAX", max).await.unwrap());
    assert!(
        wal.wait_committed(1, Duration::ZERO).await,
        "already committed: true at once"
    );
    assert!(wal.wait_committed(2, Duration::ZERO).await);
    assert!(!wal.wait_committed(3, ms(10)).await);
    committer.shutdown(Duration::from_secs(10)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn durable_mode_refuses_checkpoint_complete_and_restore_with_typed_errors() {
    let dir = tempfile::tempdir().unwrap();
    let (wal, _) = AsyncWal::open(dir.path(), opts("durable-refuse").mode(Mode::Durable))
        .await
        .unwrap();
    wal.append(b"a").await.unwrap();
    let e = guard("checkpoint", wal.checkpoint(100, b""))
        .await
        .unwrap_err();
    assert!(
        matches!(e.kind(), ErrorKind::InvalidOperation { .. }),
        "{e:?}"
    );
    let e = guard("restore", wal.restore(None)).await.unwrap_err();
    assert!(
        matches!(e.kind(), ErrorKind::InvalidOperation { .. }),
        "{e:?}"
    );
    let e = wal.checkpoint_complete(100).unwrap_err();
    assert!(
        matches!(e.kind(), ErrorKind::InvalidOperation { .. }),
        "{e:?}"
    );
    let mut p = Probe::new();
    wal.deliver_ready(&mut p).await.unwrap();
    assert_eq!(p.records(), vec![b"a".to_vec()]);
}

// ---------------------------------------------------------------------------------------------
// 6. Typed records
// ---------------------------------------------------------------------------------------------

#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
enum EvOld {
    V1 { id: u64, name: String },
}

#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
enum EvNew {
    V1 {
        id: u64,
        name: String,
    },
    V2 {
        id: u64,
        name: String,
        tags: Vec<u32>,
    },
}

#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
struct Other {
    ratio: f64,
    flag: bool,
}

/// Collects, per record, what decoding it as `T` with codec `C` gave (inside catch_unwind).
struct Decoding<T, C> {
    codec: C,
    out: Outcomes<T>,
}

/// Per record: a panic, or what decoding gave.
type Outcomes<T> = Arc<Mutex<Vec<std::thread::Result<Result<T, DecodeError>>>>>;

impl<T: serde::de::DeserializeOwned + Send + 'static, C: Codec + Clone> AsyncSink
    for Decoding<T, C>
{
    async fn deliver(&mut self, epoch: &Epoch) -> Result<(), SinkError> {
        let mut chunks = AsyncChunks::new(epoch);
        while let Some(c) = chunks.next().await {
            for r in c
                .map_err(|e| SinkError::retryable(e.to_string()))?
                .records()
            {
                let codec = self.codec.clone();
                let res =
                    std::panic::catch_unwind(AssertUnwindSafe(|| codec.decode_record::<T>(&r)));
                self.out.lock().push(res);
            }
        }
        Ok(())
    }
}

async fn decode_all<T, C>(
    codec: C,
    records: &[Vec<u8>],
    cp: u64,
) -> Vec<std::thread::Result<Result<T, DecodeError>>>
where
    T: serde::de::DeserializeOwned + Send + 'static,
    C: Codec + Clone,
{
    let dir = tempfile::tempdir().unwrap();
    let (wal, _) = AsyncWal::open(dir.path(), opts("typed")).await.unwrap();
    for c in 1..cp {
        wal.checkpoint(c, b"").await.unwrap();
    }
    seal(&wal, cp, records).await;
    wal.checkpoint_complete(cp).unwrap();
    let out = Arc::new(Mutex::new(Vec::new()));
    let mut sink = Decoding::<T, C> {
        codec,
        out: out.clone(),
    };
    wal.deliver_ready(&mut sink).await.unwrap();
    let v = std::mem::take(&mut *out.lock());
    v
}

fn expect_decode_error<T: std::fmt::Debug>(
    r: &std::thread::Result<Result<T, DecodeError>>,
    cp: u64,
    index: u64,
    codec: &str,
    what: &str,
) {
    match r {
        Err(_) => panic!("{what}: decoding panicked"),
        Ok(Ok(v)) => panic!("{what}: decoded as {v:?} instead of a DecodeError"),
        Ok(Err(e)) => {
            assert_eq!(e.position.checkpoint, cp, "{what}: {e:?}");
            assert_eq!(e.position.index, index, "{what}: {e:?}");
            assert_eq!(e.codec, codec, "{what}");
            let text = e.to_string();
            assert!(
                text.contains(&cp.to_string()) && text.contains(&index.to_string()),
                "{what}: the message names the position: {text}"
            );
            let se: SinkError = e.clone().into();
            assert_eq!(se.class(), SinkErrorClass::Permanent, "{what}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postcard_records_that_do_not_decode_are_typed_errors_naming_their_position() {
    let mut good = Vec::new();
    Postcard
        .encode(
            &EvOld::V1 {
                id: 7,
                name: "seven".into(),
            },
            &mut good,
        )
        .unwrap();
    let mut newer = Vec::new();
    Postcard
        .encode(
            &EvNew::V2 {
                id: 8,
                name: "eight".into(),
                tags: vec![1, 2],
            },
            &mut newer,
        )
        .unwrap();
    let records = vec![
        good.clone(),                             // 0 ok
        vec![0xff; 9],                            // 1 garbage
        good[..good.len() - 1].to_vec(),          // 2 truncated
        newer,                                    // 3 a newer version
        vec![],                                   // 4 empty
        vec![0x00, 0xff, 0xff, 0xff, 0xff, 0x0f], // 5 a huge string length
    ];
    let got = decode_all::<EvOld, Postcard>(Postcard, &records, 37).await;
    assert_eq!(got.len(), records.len());
    match &got[0] {
        Ok(Ok(v)) => assert_eq!(
            v,
            &EvOld::V1 {
                id: 7,
                name: "seven".into()
            }
        ),
        other => panic!(
            "a good record: {:?}",
            other
                .as_ref()
                .map(|r| r.as_ref().map_err(|e| e.to_string()))
        ),
    }
    for (i, what) in [
        (1, "garbage"),
        (2, "truncated"),
        (3, "newer version"),
        (4, "empty"),
        (5, "huge length"),
    ] {
        expect_decode_error(&got[i], 37, i as u64, Postcard::NAME, what);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_postcard_record_with_bytes_after_the_value_is_not_misread() {
    let mut longer = Vec::new();
    Postcard
        .encode(
            &EvOld::V1 {
                id: 7,
                name: "seven".into(),
            },
            &mut longer,
        )
        .unwrap();
    longer.extend_from_slice(&[1, 2, 3]);
    let got = decode_all::<EvOld, Postcard>(Postcard, &[longer], 2).await;
    expect_decode_error(&got[0], 2, 0, Postcard::NAME, "trailing bytes");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_records_that_do_not_decode_are_typed_errors_naming_their_position() {
    let mut good = Vec::new();
    Json.encode(
        &EvOld::V1 {
            id: 1,
            name: "one".into(),
        },
        &mut good,
    )
    .unwrap();
    let mut other = Vec::new();
    Json.encode(
        &Other {
            ratio: 0.5,
            flag: true,
        },
        &mut other,
    )
    .unwrap();
    let mut newer = Vec::new();
    Json.encode(
        &EvNew::V2 {
            id: 2,
            name: "two".into(),
            tags: vec![],
        },
        &mut newer,
    )
    .unwrap();
    let mut trailing = good.clone();
    trailing.extend_from_slice(b" {}");
    let records = vec![
        good.clone(),
        b"\xff\xfe not json".to_vec(),
        good[..good.len() / 2].to_vec(),
        other,
        newer,
        vec![],
        trailing,
    ];
    let got = decode_all::<EvOld, Json>(Json, &records, 3).await;
    assert!(matches!(&got[0], Ok(Ok(EvOld::V1 { id: 1, .. }))));
    for (i, what) in [
        (1, "garbage"),
        (2, "truncated"),
        (3, "another type"),
        (4, "newer version"),
        (5, "empty"),
        (6, "trailing"),
    ] {
        expect_decode_error(&got[i], 3, i as u64, Json::NAME, what);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn random_garbage_never_panics_either_codec() {
    let mut rng = fastrand::Rng::with_seed(11);
    let mut records: Vec<Vec<u8>> = (0..600)
        .map(|_| {
            let n = rng.usize(0..48);
            (0..n).map(|_| rng.u8(..)).collect()
        })
        .collect();
    records.push(vec![0xff, 0xff, 0xff, 0xff, 0x0f]);
    records.push(vec![0x01, 0x00, 0xff, 0xff, 0xff, 0xff, 0x0f]);
    let a = decode_all::<EvNew, Postcard>(Postcard, &records, 1).await;
    let b = decode_all::<Vec<String>, Postcard>(Postcard, &records, 1).await;
    let c = decode_all::<(u64, String, Option<Vec<u8>>), Json>(Json, &records, 1).await;
    let d = decode_all::<BTreeMap<String, Other>, Json>(Json, &records, 1).await;
    for (name, panics) in [
        ("postcard EvNew", a.iter().filter(|r| r.is_err()).count()),
        (
            "postcard Vec<String>",
            b.iter().filter(|r| r.is_err()).count(),
        ),
        ("json tuple", c.iter().filter(|r| r.is_err()).count()),
        ("json map", d.iter().filter(|r| r.is_err()).count()),
    ] {
        assert_eq!(panics, 0, "{name}: decoding garbage panicked");
    }
    for (i, r) in a.iter().enumerate() {
        if let Ok(Err(e)) = r {
            assert_eq!(e.position.index, i as u64);
        }
    }
}

/// A value no codec can encode.
#[derive(Debug, Clone)]
enum Enc {
    Fine(u32),
    Broken,
}

impl Serialize for Enc {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            Enc::Fine(v) => s.serialize_u32(*v),
            Enc::Broken => Err(serde::ser::Error::custom("this value cannot be encoded")),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_typed_batch_with_a_value_that_cannot_encode_appends_none_and_names_its_index() {
    let dir = tempfile::tempdir().unwrap();
    let (wal, _) = AsyncWal::open(dir.path(), opts("typed-enc")).await.unwrap();
    let pc = TypedWal::<Enc, Postcard>::new(wal.clone(), Postcard);
    let js = TypedWal::<Enc, Json>::new(wal.clone(), Json);
    let batch = [
        Enc::Fine(1),
        Enc::Fine(2),
        Enc::Fine(3),
        Enc::Broken,
        Enc::Fine(5),
    ];
    for (name, r) in [
        ("postcard", pc.append_batch(&batch).await),
        ("json", js.append_batch(&batch).await),
    ] {
        let e = r.expect_err("a value that cannot be encoded fails the batch");
        assert!(
            matches!(e.kind(), ErrorKind::InvalidOperation { .. }),
            "{name}: {e:?}"
        );
        assert!(e.to_string().contains('3'), "{name}: names index 3: {e}");
    }
    assert!(pc.append(&Enc::Broken).await.is_err());
    assert_eq!(wal.health().open_records, 0, "all or none");
    pc.append_batch(&[]).await.unwrap();
    pc.append_batch(&[Enc::Fine(9)]).await.unwrap();
    assert_eq!(wal.health().open_records, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_undecodable_record_stops_delivery_at_its_epoch_and_nothing_after_it_is_skipped() {
    #[derive(Clone)]
    struct Typed(Arc<Mutex<Vec<u64>>>);
    impl AsyncSink for Typed {
        async fn deliver(&mut self, epoch: &Epoch) -> Result<(), SinkError> {
            let mut chunks = AsyncChunks::new(epoch);
            while let Some(c) = chunks.next().await {
                for r in c
                    .map_err(|e| SinkError::retryable(e.to_string()))?
                    .records()
                {
                    let _: EvOld = Postcard.decode_record(&r)?;
                }
            }
            self.0.lock().push(epoch.checkpoint());
            Ok(())
        }
    }
    let dir = tempfile::tempdir().unwrap();
    let (wal, _) = AsyncWal::open(dir.path(), opts("typed-stop"))
        .await
        .unwrap();
    let typed = TypedWal::new(wal.clone(), Postcard);
    typed
        .append(&EvOld::V1 {
            id: 1,
            name: "a".into(),
        })
        .await
        .unwrap();
    wal.checkpoint(1, b"").await.unwrap();
    typed
        .append(&EvOld::V1 {
            id: 2,
            name: "b".into(),
        })
        .await
        .unwrap();
    wal.append(&[0xff, 0xff, 0xff]).await.unwrap();
    wal.checkpoint(2, b"").await.unwrap();
    typed
        .append(&EvOld::V1 {
            id: 3,
            name: "c".into(),
        })
        .await
        .unwrap();
    wal.checkpoint(3, b"").await.unwrap();
    wal.checkpoint_complete(3).unwrap();
    let s = Typed(Arc::default());
    let committer = wal.spawn_committer(s.clone()).unwrap();
    assert!(guard("commit 1", wal.wait_committed(1, Duration::MAX)).await);
    wait_until("repeated failures of epoch 2", || wal.health().errors >= 3).await;
    let h = wal.health();
    assert_eq!(
        *s.0.lock(),
        vec![1],
        "epoch 3 is never delivered past epoch 2"
    );
    assert_eq!(h.committed, Some(1));
    let last = h.last_error.expect("the decode error shows in health");
    assert!(
        last.contains('2') && last.contains('1'),
        "names checkpoint 2, index 1: {last}"
    );
    let report = guard("shutdown", committer.shutdown(ms(500))).await;
    assert_eq!(report.pending, vec![2, 3]);
}

// ---------------------------------------------------------------------------------------------
// 7. BlockingSink
// ---------------------------------------------------------------------------------------------

#[test]
fn blocking_sink_drives_an_async_marker_sink_from_the_committer_thread() {
    let dir = tempfile::tempdir().unwrap();
    let (w, _) = WalSink::open(dir.path(), opts("blocking-own")).unwrap();
    let probe = Probe::with_marker();
    probe.edit(|s| {
        s.fail_retryable.insert(2, 2);
    });
    let committer = w
        .spawn_committer(BlockingSink::new(probe.clone()).unwrap())
        .unwrap();
    let mut expected = Vec::new();
    for cp in 1..=3 {
        let r = recs(cp, 3);
        expected.extend(r.clone());
        w.append_batch(refs(&r)).unwrap();
        w.checkpoint(cp, b"").unwrap();
    }
    w.checkpoint_complete(3).unwrap();
    assert!(w.wait_committed(3, Duration::from_secs(120)));
    committer.shutdown();
    assert_eq!(probe.ok_ids(), vec![1, 2, 3]);
    assert_eq!(probe.records(), expected);
    assert!(probe.violations().is_empty(), "{:?}", probe.violations());
    // and with deliver_ready on a plain thread, block_on for inspection
    let mut bs = BlockingSink::new(Probe::new()).unwrap();
    let n = bs.block_on(async |s: &mut Probe| s.calls().len());
    assert_eq!(n, 0);
    w.append(b"x").unwrap();
    w.checkpoint(4, b"").unwrap();
    w.checkpoint_complete(4).unwrap();
    assert_eq!(w.deliver_ready(&mut bs).unwrap(), 1);
    assert_eq!(bs.get_ref().ok_ids(), vec![4]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn blocking_sink_with_the_program_runtime_handle_from_a_committer_thread() {
    let handle = tokio::runtime::Handle::current();
    let probe = Probe::with_marker();
    let p2 = probe.clone();
    guard(
        "the committer thread",
        tokio::task::spawn_blocking(move || {
            let dir = tempfile::tempdir().unwrap();
            let (w, _) = WalSink::open(dir.path(), opts("blocking-handle")).unwrap();
            let c = w
                .spawn_committer(BlockingSink::with_handle(p2, handle))
                .unwrap();
            for cp in 1..=3 {
                w.append_batch(refs(&recs(cp, 2))).unwrap();
                w.checkpoint(cp, b"").unwrap();
            }
            w.checkpoint_complete(3).unwrap();
            assert!(w.wait_committed(3, Duration::from_secs(120)));
            c.shutdown();
        }),
    )
    .await
    .unwrap();
    assert_eq!(probe.ok_ids(), vec![1, 2, 3]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn blocking_sink_called_on_a_runtime_worker_fails_with_an_error_not_a_panic() {
    let dir = tempfile::tempdir().unwrap();
    let (w, _) = WalSink::open(dir.path(), opts("blocking-worker")).unwrap();
    w.append(b"a").unwrap();
    w.checkpoint(1, b"").unwrap();
    w.checkpoint_complete(1).unwrap();
    let mut bs = BlockingSink::with_handle(Probe::new(), tokio::runtime::Handle::current());
    let r = std::panic::catch_unwind(AssertUnwindSafe(|| w.deliver_ready(&mut bs)));
    let r = r.expect("a BlockingSink on a runtime worker must fail with an error, not panic");
    assert!(r.is_err(), "the misuse is reported");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sink_that_panics_in_deliver_ready_does_not_leave_the_log_undeliverable() {
    // The misuse above panics inside deliver_ready; whatever it does, the log must not stay
    // taken by a deliverer that no longer exists.
    let dir = tempfile::tempdir().unwrap();
    let (w, _) = WalSink::open(dir.path(), opts("blocking-worker-after")).unwrap();
    w.append(b"a").unwrap();
    w.checkpoint(1, b"").unwrap();
    w.checkpoint_complete(1).unwrap();
    let mut bs = BlockingSink::with_handle(Probe::new(), tokio::runtime::Handle::current());
    let _ = std::panic::catch_unwind(AssertUnwindSafe(|| w.deliver_ready(&mut bs)));
    let mut ms = MemorySink::new();
    let w = Arc::new(w);
    let w2 = w.clone();
    let n = tokio::task::spawn_blocking(move || w2.deliver_ready(&mut ms).map(|n| (n, ms)))
        .await
        .unwrap();
    let (n, ms) = n.expect("the log stays usable after a sink panicked");
    assert_eq!(n, 1);
    assert_eq!(
        ms.records(),
        vec![b"a".to_vec()],
        "the epoch is offered again"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_blocking_sink_refused_by_spawn_committer_in_async_code_does_not_panic() {
    let dir = tempfile::tempdir().unwrap();
    let (wal, _) = AsyncWal::open(dir.path(), opts("blocking-refused"))
        .await
        .unwrap();
    let committer = wal.spawn_committer(Probe::new()).unwrap();
    let r = std::panic::catch_unwind(AssertUnwindSafe(|| {
        wal.blocking()
            .spawn_committer(BlockingSink::new(Probe::new()).unwrap())
            .map(|_| ())
    }));
    let r = r.expect("refusing a committer must not panic");
    assert!(matches!(
        r.unwrap_err().kind(),
        ErrorKind::InvalidOperation { .. }
    ));
    committer.shutdown(Duration::from_secs(10)).await;
}

// ---------------------------------------------------------------------------------------------
// 8. More crashes, shutdowns and runtimes
// ---------------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acknowledged_durable_appends_from_many_tasks_survive_a_power_loss_in_the_middle() {
    for seed in 0..4u64 {
        let sim = SimStorage::new();
        let o = opts("durable-crash").mode(Mode::Durable);
        let (wal, _) = sim_wal(&sim, o.clone());
        let acked: Arc<Mutex<Vec<Vec<u8>>>> = Arc::default();
        let mut tasks = Vec::new();
        for t in 0..8 {
            let (w, acked) = (wal.clone(), acked.clone());
            tasks.push(tokio::spawn(async move {
                for i in 0..5000 {
                    let r = format!("s{seed}-t{t}-{i}").into_bytes();
                    match w.append(&r).await {
                        Ok(()) => acked.lock().push(r),
                        Err(_) => return,
                    }
                }
            }));
        }
        wait_until("some acknowledged appends", || acked.lock().len() >= 200).await;
        sim.crash(CrashOptions::power_loss(seed));
        let acked_at_crash = acked.lock().len();
        for t in tasks {
            guard("an appending task after the power loss", t)
                .await
                .unwrap();
        }
        drop(wal);
        let (w, report) = WalSink::open_with_storage(Arc::new(sim.clone()), o.clone())
            .expect("reopen after power loss");
        let mut ms = MemorySink::new();
        w.deliver_ready(&mut ms).unwrap();
        let got = ms.records();
        let set: HashSet<&Vec<u8>> = got.iter().collect();
        assert_eq!(set.len(), got.len(), "seed {seed}: no record twice");
        let acked = acked.lock().clone();
        assert!(acked.len() >= acked_at_crash);
        for r in &acked {
            assert!(
                set.contains(r),
                "seed {seed}: acknowledged durable record {} lost ({report:?})",
                String::from_utf8_lossy(r)
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn durable_appends_racing_async_wal_shutdown_all_return_and_the_acknowledged_arrive_once() {
    let dir = tempfile::tempdir().unwrap();
    let o = opts("durable-sd-race").mode(Mode::Durable);
    let (wal, _) = AsyncWal::open(dir.path(), o.clone()).await.unwrap();
    let acked: Arc<Mutex<Vec<Vec<u8>>>> = Arc::default();
    let mut tasks = Vec::new();
    for t in 0..8 {
        let (w, acked) = (wal.clone(), acked.clone());
        tasks.push(tokio::spawn(async move {
            for i in 0..3000 {
                let r = format!("t{t}-{i}").into_bytes();
                match w.append(&r).await {
                    Ok(()) => acked.lock().push(r),
                    Err(_) => return,
                }
            }
        }));
    }
    wait_until("some acknowledged appends", || acked.lock().len() >= 100).await;
    guard("AsyncWal::shutdown under load", wal.shutdown()).await;
    for t in tasks {
        guard("an appending task after shutdown", t).await.unwrap();
    }
    let (wal, _) = reopen(dir.path(), o).await;
    let mut p = Probe::new();
    wal.deliver_ready(&mut p).await.unwrap();
    let got = p.records();
    let set: HashSet<&Vec<u8>> = got.iter().collect();
    assert_eq!(set.len(), got.len(), "no record twice");
    for r in acked.lock().iter() {
        assert!(
            set.contains(r),
            "acknowledged {} lost",
            String::from_utf8_lossy(r)
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn async_wal_shutdown_finishes_the_sync_a_waiting_durable_append_asked_for() {
    let g = Gated::default();
    let o = opts("sd-sync").mode(Mode::Durable);
    let wal = g.wal(o.clone());
    g.sync.close();
    let g2 = g.sync.clone();
    let wd = Watchdog::start(100, move || g2.open());
    let w = wal.clone();
    let waiting = tokio::spawn(async move { w.append(b"asked before shutdown").await });
    wait_until("the append's sync to be held", || g.sync.waiting() > 0).await;
    let sd = tokio::spawn(wal.shutdown());
    for _ in 0..5 {
        tokio::time::sleep(ms(1)).await;
    }
    g.sync.open();
    guard("shutdown", sd).await.unwrap();
    guard("the waiting append", waiting)
        .await
        .unwrap()
        .expect("a sync asked for before shutdown is finished");
    assert!(!wd.fired());
    g.sim.crash(CrashOptions::power_loss(5));
    let (w, _) = WalSink::open_with_storage(Arc::new(g.sim.clone()), o).unwrap();
    let mut ms = MemorySink::new();
    w.deliver_ready(&mut ms).unwrap();
    assert_eq!(ms.records(), vec![b"asked before shutdown".to_vec()]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_returns_by_its_deadline_while_a_commit_mark_is_stuck_in_the_disk() {
    let g = Gated::default();
    let wal = g.wal(opts("sd-mark-stuck"));
    let probe = Probe::new();
    let committer = wal.spawn_committer(probe.clone()).unwrap();
    seal(&wal, 1, &recs(1, 2)).await;
    g.sync.close();
    let g2 = g.sync.clone();
    let wd = Watchdog::start(100, move || g2.open());
    wal.checkpoint_complete(1).unwrap();
    wait_until("the mark of epoch 1 held in the disk", || {
        g.sync.waiting() > 0
    })
    .await;
    let report = guard("shutdown with a deadline", committer.shutdown(ms(300))).await;
    let fired = wd.fired();
    g.sync.open();
    assert!(
        !fired,
        "shutdown(300 ms) waited for a stuck disk until the watchdog freed it"
    );
    assert_eq!(probe.ok_ids(), vec![1]);
    assert!(
        report.pending == vec![1] || report.committed == Some(1),
        "epoch 1 is pending or committed: {report:?}"
    );
}

#[test]
fn a_committer_whose_runtime_is_dropped_mid_delivery_gives_the_log_back() {
    let dir = tempfile::tempdir().unwrap();
    let o = opts("rt-drop");
    let probe = Probe::new();
    probe.edit(|s| {
        s.hang.insert(2);
    });
    {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let committer = rt.block_on(async {
            let (wal, _) = AsyncWal::open(dir.path(), o.clone()).await.unwrap();
            let c = wal.spawn_committer(probe.clone()).unwrap();
            for cp in 1..=3 {
                seal(&wal, cp, &recs(cp, 2)).await;
            }
            wal.checkpoint_complete(3).unwrap();
            wait_until("the sink hangs in 2", || probe.calls().contains(&2)).await;
            c
        });
        drop(rt); // the program's runtime goes away with the delivery of 2 in flight
        drop(committer);
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let (wal, report) = reopen(dir.path(), o.clone()).await;
        assert_eq!(report.pending, vec![2, 3], "{report:?}");
        wal.checkpoint_complete(3).unwrap();
        let mut p2 = Probe::new();
        wal.deliver_ready(&mut p2).await.unwrap();
        assert_eq!(p2.ok_ids(), vec![2, 3]);
    });
    assert_eq!(probe.ok_ids(), vec![1]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_graceful_shutdown_in_a_stream_of_epochs_marks_all_it_delivered() {
    let dir = tempfile::tempdir().unwrap();
    let o = opts("sd-stream").mark_every(1000);
    let (wal, _) = AsyncWal::open(dir.path(), o.clone()).await.unwrap();
    for cp in 1..=50 {
        seal(&wal, cp, &recs(cp, 1)).await;
    }
    let probe = Probe::new();
    probe.edit(|s| {
        s.hold.insert(30);
    });
    let committer = wal.spawn_committer(probe.clone()).unwrap();
    wal.checkpoint_complete(50).unwrap();
    wait_until("the sink in epoch 30", || probe.calls().contains(&30)).await;
    let sd = tokio::spawn(committer.shutdown(Duration::from_secs(60)));
    for _ in 0..5 {
        tokio::task::yield_now().await;
    }
    probe.edit(|s| {
        s.hold.clear();
    });
    let report = guard("shutdown", sd).await.unwrap();
    assert!(report.clean, "{report:?}");
    let delivered = probe.ok_ids();
    let last = *delivered.last().unwrap();
    assert_eq!(delivered, (1..=last).collect::<Vec<_>>());
    assert_eq!(
        report.committed,
        Some(last),
        "shutdown marks what was delivered"
    );
    assert_eq!(report.pending, ((last + 1)..=50).collect::<Vec<_>>());
    drop(wal);
    let (wal, r2) = reopen(dir.path(), o).await;
    assert_eq!(r2.committed, Some(last));
    assert_eq!(r2.pending, report.pending);
    wal.checkpoint_complete(50).unwrap();
    let mut p2 = Probe::new();
    wal.deliver_ready(&mut p2).await.unwrap();
    assert_eq!(
        p2.ok_ids(),
        report.pending,
        "nothing delivered twice without a crash"
    );
}

#[test]
fn wait_committed_on_a_current_thread_runtime_is_woken_by_a_committer_thread() {
    on_current_thread("wait_committed with a committer thread", || async {
        let dir = tempfile::tempdir().unwrap();
        let (wal, _) = AsyncWal::open(dir.path(), opts("ct-thread")).await.unwrap();
        let c = wal.blocking().spawn_committer(MemorySink::new()).unwrap();
        for cp in 1..=3 {
            let w = wal.clone();
            let waiter = tokio::spawn(async move { w.wait_committed(cp, Duration::MAX).await });
            seal(&wal, cp, &recs(cp, 1)).await;
            wal.checkpoint_complete(cp).unwrap();
            assert!(guard("waiter", waiter).await.unwrap());
        }
        tokio::task::spawn_blocking(move || c.shutdown())
            .await
            .unwrap();
    });
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn opening_a_log_that_is_open_fails_with_locked_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let (_wal, _) = AsyncWal::open(dir.path(), opts("locked")).await.unwrap();
    let e = guard("second open", AsyncWal::open(dir.path(), opts("locked")))
        .await
        .expect_err("a second open must fail");
    assert!(matches!(e.kind(), ErrorKind::Locked { .. }), "{e:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_error_in_the_middle_of_async_chunks_is_retried_and_the_epoch_arrives_whole() {
    let sim = SimStorage::new();
    let o = opts("read-fault").read_chunk_size(1024);
    let (wal, _) = sim_wal(&sim, o);
    let records: Vec<Vec<u8>> = (0..2000)
        .map(|i| format!("{i:06}-{}", "r".repeat(i % 30)).into_bytes())
        .collect();
    seal(&wal, 1, &records).await;
    wal.checkpoint_complete(1).unwrap();
    sim.inject_fault(walsink::storage::FaultOp::Read, 7, io::ErrorKind::Other);
    let probe = Probe::with_marker();
    let committer = wal.spawn_committer(probe.clone()).unwrap();
    assert!(guard("commit 1", wal.wait_committed(1, Duration::MAX)).await);
    committer.shutdown(Duration::from_secs(10)).await;
    assert_eq!(sim.pending_faults(), 0, "the injected read fault was hit");
    assert!(
        wal.health().errors >= 1,
        "the failed attempt counts: {:?}",
        wal.health()
    );
    assert_eq!(probe.ok_ids(), vec![1]);
    assert_eq!(probe.records(), records);
    assert!(probe.violations().is_empty(), "{:?}", probe.violations());
}

#[test]
fn a_huge_epoch_streams_through_async_chunks_inside_a_blocking_sink() {
    let dir = tempfile::tempdir().unwrap();
    let (w, _) = WalSink::open(dir.path(), opts("huge-blocking").read_chunk_size(1024)).unwrap();
    let records: Vec<Vec<u8>> = (0..5000)
        .map(|i| format!("{i:06}{}", "b".repeat(i % 70)).into_bytes())
        .collect();
    w.append_batch(refs(&records)).unwrap();
    w.checkpoint(1, b"").unwrap();
    w.checkpoint_complete(1).unwrap();
    let s = Streamer::default();
    let c = w
        .spawn_committer(BlockingSink::new(s.clone()).unwrap())
        .unwrap();
    assert!(w.wait_committed(1, Duration::from_secs(120)));
    c.shutdown();
    assert_eq!(*s.loaded.lock(), Some(false));
    assert!(s.problems.lock().is_empty(), "{:?}", s.problems.lock());
    assert!(*s.out.lock() == records);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn appends_racing_checkpoints_land_in_exactly_one_epoch_each_in_task_order() {
    let dir = tempfile::tempdir().unwrap();
    let (wal, _) = AsyncWal::open(dir.path(), opts("race-cp").write_buffer_size(4096))
        .await
        .unwrap();
    let probe = Probe::with_marker();
    let committer = wal.spawn_committer(probe.clone()).unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let mut tasks = Vec::new();
    for t in 0..4 {
        let (w, stop) = (wal.clone(), stop.clone());
        tasks.push(tokio::spawn(async move {
            let mut rng = fastrand::Rng::with_seed(t);
            let mut mine = Vec::new();
            let mut i = 0;
            while !stop.load(Ordering::SeqCst) {
                let pad = if rng.u8(..) < 20 {
                    6000
                } else {
                    rng.usize(0..40)
                };
                let r = format!("t{t}-{i:06}-{}", "p".repeat(pad)).into_bytes();
                if rng.bool() {
                    w.append(&r).await.unwrap();
                } else {
                    let r2 = format!("t{t}-{:06}-b", i + 1).into_bytes();
                    w.append_batch(&[r.as_slice(), r2.as_slice()])
                        .await
                        .unwrap();
                    mine.push(r);
                    i += 1;
                    mine.push(r2);
                    i += 1;
                    continue;
                }
                mine.push(r);
                i += 1;
            }
            mine
        }));
    }
    for cp in 1..=40 {
        tokio::time::sleep(ms(1)).await;
        wal.checkpoint(cp, b"").await.unwrap();
        wal.checkpoint_complete(cp).unwrap();
    }
    stop.store(true, Ordering::SeqCst);
    let mut expected = Vec::new();
    for t in tasks {
        expected.push(guard("appender", t).await.unwrap());
    }
    wal.checkpoint(41, b"").await.unwrap();
    wal.checkpoint_complete(41).unwrap();
    assert!(guard("commit 41", wal.wait_committed(41, Duration::MAX)).await);
    committer.shutdown(Duration::from_secs(10)).await;
    let got = probe.records();
    let all: Vec<Vec<u8>> = expected.iter().flatten().cloned().collect();
    assert_each_once(&got, &all);
    for (t, mine) in expected.iter().enumerate() {
        let seen: Vec<&Vec<u8>> = got
            .iter()
            .filter(|r| r.starts_with(format!("t{t}-").as_bytes()))
            .collect();
        assert!(
            seen.iter().copied().eq(mine.iter()),
            "task {t}'s records out of order"
        );
    }
    assert!(probe.violations().is_empty(), "{:?}", probe.violations());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn records_larger_than_a_read_chunk_arrive_whole_one_per_chunk() {
    let dir = tempfile::tempdir().unwrap();
    let (wal, _) = AsyncWal::open(dir.path(), opts("big-frames").read_chunk_size(1024))
        .await
        .unwrap();
    let records: Vec<Vec<u8>> = [5000usize, 10, 3000, 1, 20000, 0, 1024, 1023]
        .iter()
        .enumerate()
        .map(|(i, &n)| (0..n).map(|j| ((i * 31 + j) % 251) as u8).collect())
        .collect();
    seal(&wal, 1, &records).await;
    wal.checkpoint_complete(1).unwrap();
    let mut p = Probe::new();
    wal.deliver_ready(&mut p).await.unwrap();
    assert_eq!(p.records(), records);
    assert!(p.violations().is_empty(), "{:?}", p.violations());
}

/// A sink that abandons a `next()` mid-read and then keeps using the same iterator.
#[derive(Clone, Default)]
struct Abandon {
    report: Arc<Mutex<Vec<String>>>,
}

impl AsyncSink for Abandon {
    async fn deliver(&mut self, epoch: &Epoch) -> Result<(), SinkError> {
        let mut it = AsyncChunks::new(epoch);
        let mut expected_next = 0u64;
        for _ in 0..2 {
            if let Some(Ok(c)) = it.next().await {
                expected_next = c.first_index() + c.len();
            }
        }
        let consumed = tokio::select! {
            biased;
            c = it.next() => Some(c),
            _ = std::future::ready(()) => None,
        };
        if let Some(Some(Ok(c))) = &consumed {
            expected_next = c.first_index() + c.len();
        }
        if consumed.is_none() {
            // the read in flight was dropped: the iterator must end, never skip that chunk
            if let Some(Ok(c)) = it.next().await {
                if c.first_index() != expected_next {
                    self.report.lock().push(format!(
                        "after a dropped read the iterator went on at record {} instead of {expected_next} (or ending)",
                        c.first_index()
                    ));
                }
            }
        }
        self.report.lock().push("done".into());
        Ok(())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_async_chunks_iterator_whose_read_was_dropped_ends_and_never_skips_a_chunk() {
    for round in 0..10 {
        let dir = tempfile::tempdir().unwrap();
        let (wal, _) = AsyncWal::open(dir.path(), opts("abandon").read_chunk_size(1024))
            .await
            .unwrap();
        let records: Vec<Vec<u8>> = (0..3000)
            .map(|i| format!("{round}-{i:06}").into_bytes())
            .collect();
        seal(&wal, 1, &records).await;
        wal.checkpoint_complete(1).unwrap();
        let mut s = Abandon::default();
        wal.deliver_ready(&mut s).await.unwrap();
        let report = s.report.lock().clone();
        assert_eq!(report.last().map(String::as_str), Some("done"));
        assert_eq!(report.len(), 1, "round {round}: {report:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_typed_batch_with_one_value_over_the_size_limit_appends_none() {
    let dir = tempfile::tempdir().unwrap();
    let (wal, _) = AsyncWal::open(dir.path(), opts("typed-limit").max_record_size(64))
        .await
        .unwrap();
    let typed = TypedWal::<String, Postcard>::new(wal.clone(), Postcard);
    let e = typed
        .append_batch(&["a".to_string(), "x".repeat(100), "b".to_string()])
        .await
        .unwrap_err();
    assert!(
        matches!(e.kind(), ErrorKind::RecordTooLarge { .. }),
        "{e:?}"
    );
    assert_eq!(wal.health().open_records, 0, "all or none");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropping_every_handle_without_shutdown_releases_the_log_in_both_modes() {
    for mode in [Mode::Checkpointed, Mode::Durable] {
        let dir = tempfile::tempdir().unwrap();
        let o = opts("drop-all").mode(mode);
        {
            let (wal, _) = AsyncWal::open(dir.path(), o.clone()).await.unwrap();
            wal.append(b"a").await.unwrap();
            if mode == Mode::Checkpointed {
                wal.checkpoint(1, b"").await.unwrap();
            }
            let _c2 = wal.clone();
        }
        let (wal, report) = reopen(dir.path(), o.clone()).await;
        assert_eq!(report.pending, vec![1], "{mode:?}: {report:?}");
        // and with a committer whose handle is dropped instead of shut down
        let c = wal.spawn_committer(Probe::new()).unwrap();
        if mode == Mode::Checkpointed {
            wal.checkpoint_complete(1).unwrap();
        }
        assert!(guard("commit", wal.wait_committed(1, Duration::MAX)).await);
        drop(c);
        drop(wal);
        let (_wal, report) = reopen(dir.path(), o).await;
        assert!(report.pending.is_empty(), "{mode:?}: {report:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restore_that_returned_survives_a_power_loss_and_its_voided_ids_stay_used() {
    for seed in 0..8u64 {
        let sim = SimStorage::new();
        let o = opts("restore-crash");
        let (wal, _) = sim_wal(&sim, o.clone());
        for cp in 1..=3 {
            seal(&wal, cp, &recs(cp, 5)).await;
        }
        wal.append(b"unsealed").await.unwrap();
        wal.restore(Some(1)).await.unwrap();
        sim.crash(CrashOptions::power_loss(seed));
        drop(wal);
        let (report, got) = reopen_and_drain(&sim, o.clone());
        assert_eq!(
            report.pending,
            vec![1],
            "seed {seed}: voided epochs came back: {report:?}"
        );
        assert!(
            report.next_checkpoint_id > 3,
            "seed {seed}: ids 2 and 3 were used before the restore: {report:?}"
        );
        assert_eq!(got, vec![(1, recs(1, 5))], "seed {seed}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forgetful_commit_store_with_a_marker_sink_never_reuses_a_committed_id_after_restart() {
    for mode in [Mode::Checkpointed, Mode::Durable] {
        let sim = SimStorage::new();
        let o = opts("forgetful")
            .mode(mode)
            .segment_size(4096)
            .max_record_size(1024)
            .max_metadata_size(256);
        let probe = Probe::with_marker();
        let mut expected = Vec::new();
        {
            let (w, _) = WalSink::open_with(
                Arc::new(sim.clone()),
                o.clone(),
                Box::new(walsink::MemoryCommitStore::new()),
            )
            .unwrap();
            let wal = AsyncWal::from_sync(w).unwrap();
            let committer = wal.spawn_committer(probe.clone()).unwrap();
            for i in 0..30u64 {
                let r = format!("first-{i:03}-{}", "f".repeat(400)).into_bytes();
                expected.push(r.clone());
                wal.append(&r).await.unwrap();
                if mode == Mode::Checkpointed {
                    wal.checkpoint(i + 1, b"").await.unwrap();
                    wal.checkpoint_complete(i + 1).unwrap();
                }
            }
            wait_until("first run delivered", || probe.records().len() == 30).await;
            committer.shutdown(Duration::from_secs(10)).await;
            wal.shutdown().await;
        }
        sim.crash(CrashOptions::process_kill());
        let (w, report) = WalSink::open_with(
            Arc::new(sim.clone()),
            o.clone(),
            Box::new(walsink::MemoryCommitStore::new()),
        )
        .unwrap();
        let wal = AsyncWal::from_sync(w).unwrap();
        let mut next = report.next_checkpoint_id;
        for i in 0..5u64 {
            let r = format!("second-{i:03}").into_bytes();
            expected.push(r.clone());
            wal.append(&r).await.unwrap();
            if mode == Mode::Checkpointed {
                wal.checkpoint(next, b"").await.unwrap();
                wal.checkpoint_complete(next).unwrap();
                next += 1;
            }
        }
        let mut p = probe.clone();
        wal.deliver_ready(&mut p).await.unwrap();
        assert_eq!(
            probe.records(),
            expected,
            "{mode:?}: records after the restart were skipped as committed (reused ids?) {report:?}"
        );
        assert!(
            probe.violations().is_empty(),
            "{mode:?}: {:?}",
            probe.violations()
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failed_syncs_answer_every_waiting_durable_append_with_an_error() {
    let sim = SimStorage::new();
    let o = opts("sync-fault").mode(Mode::Durable);
    let (wal, _) = sim_wal(&sim, o);
    wal.append(b"before").await.unwrap();
    sim.inject_fault(walsink::storage::FaultOp::SyncData, 0, io::ErrorKind::Other);
    let mut tasks = Vec::new();
    for t in 0..8 {
        let w = wal.clone();
        tasks.push(tokio::spawn(async move {
            let mut results = Vec::new();
            for i in 0..5 {
                results.push(w.append(format!("t{t}-{i}").as_bytes()).await.is_ok());
            }
            results
        }));
    }
    let mut oks = 0;
    for t in tasks {
        let r = guard("a durable append after a failed sync", t)
            .await
            .unwrap();
        oks += r.iter().filter(|&&ok| ok).count();
    }
    assert!(
        oks < 40,
        "a failed sync must fail the appends waiting for it"
    );
    let h = wal.health();
    assert!(h.poisoned, "{h:?}");
    let e = guard("append on a poisoned log", wal.append(b"after"))
        .await
        .unwrap_err();
    assert!(e.is_poisoned(), "{e:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_write_poisons_the_log_and_every_async_method_reports_it() {
    let sim = SimStorage::new();
    let o = opts("write-fault").write_buffer_size(4096);
    let (wal, _) = sim_wal(&sim, o);
    seal(&wal, 1, &recs(1, 2)).await;
    sim.inject_fault(
        walsink::storage::FaultOp::Write,
        0,
        io::ErrorKind::StorageFull,
    );
    let e = guard("a large append", wal.append(&vec![0u8; 10_000]))
        .await
        .unwrap_err();
    assert!(
        matches!(e.kind(), ErrorKind::Io { .. } | ErrorKind::Poisoned { .. }),
        "{e:?}"
    );
    let e = guard("checkpoint", wal.checkpoint(2, b""))
        .await
        .unwrap_err();
    assert!(e.is_poisoned(), "{e:?}");
    let e = guard("small append", wal.append(b"x")).await.unwrap_err();
    assert!(e.is_poisoned(), "{e:?}");
    // what was sealed before can still be delivered
    wal.checkpoint_complete(1).unwrap();
    let mut p = Probe::new();
    let _ = guard("deliver", wal.deliver_ready(&mut p)).await;
    assert_eq!(p.ok_ids(), vec![1]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reports_name_sealed_but_incomplete_epochs_and_earlier_commits_after_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let o = opts("reports");
    {
        let (wal, _) = AsyncWal::open(dir.path(), o.clone()).await.unwrap();
        for cp in 1..=4 {
            seal(&wal, cp, &recs(cp, 1)).await;
        }
        wal.checkpoint_complete(2).unwrap();
        let probe = Probe::new();
        let committer = wal.spawn_committer(probe.clone()).unwrap();
        assert!(guard("commit 2", wal.wait_committed(2, Duration::MAX)).await);
        let report = committer.shutdown(Duration::from_secs(10)).await;
        assert!(report.clean);
        assert_eq!(
            report.pending,
            vec![3, 4],
            "sealed but not complete is pending: {report:?}"
        );
        assert_eq!(report.committed, Some(2));
        let pending: Vec<u64> = wal.shutdown().await.iter().map(|p| p.id).collect();
        assert_eq!(pending, vec![3, 4]);
    }
    let (wal, report) = reopen(dir.path(), o).await;
    assert_eq!(report.committed, Some(2));
    assert!(
        wal.wait_committed(1, Duration::ZERO).await,
        "committed before the restart"
    );
    assert!(wal.wait_committed(2, Duration::ZERO).await);
    assert!(!wal.wait_committed(3, Duration::ZERO).await);
    let committer = wal.spawn_committer(Probe::new()).unwrap();
    let report = committer.shutdown(Duration::from_secs(10)).await;
    assert_eq!(
        report.committed,
        Some(2),
        "an idle committer reports the earlier commit"
    );
    assert_eq!(report.pending, vec![3, 4]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_checkpoint_refused_for_its_metadata_seals_nothing_and_loses_no_record() {
    let dir = tempfile::tempdir().unwrap();
    let (wal, _) = AsyncWal::open(dir.path(), opts("meta-limit").max_metadata_size(100))
        .await
        .unwrap();
    wal.append_batch(&refs(&recs(1, 7))).await.unwrap();
    assert!(
        wal.checkpoint(1, &[0u8; 101]).await.is_err(),
        "metadata over the limit"
    );
    assert!(wal.pending().is_empty(), "nothing sealed");
    assert_eq!(wal.health().open_records, 7);
    wal.checkpoint(1, &[1u8; 100])
        .await
        .expect("metadata at the limit");
    let p = wal.pending();
    assert_eq!(p.len(), 1);
    assert_eq!(p[0].records, 7);
    assert_eq!(p[0].metadata, vec![1u8; 100]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deliver_ready_dropped_at_every_poll_point_never_loses_or_repeats_an_epoch() {
    for mark_every in [1usize, 3] {
        for k in 1..30usize {
            let dir = tempfile::tempdir().unwrap();
            let o = opts("dr-every-poll")
                .mark_every(mark_every)
                .read_chunk_size(1024);
            let (wal, _) = AsyncWal::open(dir.path(), o.clone()).await.unwrap();
            for cp in 1..=5u64 {
                // epoch 3 spans many chunks
                let n = if cp == 3 { 400 } else { 3 };
                seal(&wal, cp, &recs(cp, n)).await;
            }
            wal.checkpoint_complete(5).unwrap();
            let first = Probe::new();
            {
                let mut p = first.clone();
                let mut f = pin!(wal.deliver_ready(&mut p));
                for _ in 0..k {
                    if poll_n(f.as_mut(), 1).is_some() {
                        break;
                    }
                    tokio::time::sleep(Duration::from_micros(200)).await;
                }
            }
            let second = Probe::new();
            let mut s2 = second.clone();
            guard("the next deliver_ready", async {
                loop {
                    match wal.deliver_ready(&mut s2).await {
                        Err(e) if matches!(e.kind(), ErrorKind::InvalidOperation { .. }) => {
                            tokio::time::sleep(ms(2)).await
                        }
                        r => return r.unwrap(),
                    }
                }
            })
            .await;
            let mut ids = first.ok_ids();
            ids.extend(second.ok_ids());
            assert_eq!(
                ids,
                vec![1, 2, 3, 4, 5],
                "mark_every {mark_every}, dropped after {k} polls: first {:?} second {:?}",
                first.ok_ids(),
                second.ok_ids()
            );
            assert_eq!(wal.health().committed, Some(5));
            drop(wal);
            let (_w, report) = reopen(dir.path(), o).await;
            assert!(report.pending.is_empty(), "k={k}: {report:?}");
        }
    }
}
