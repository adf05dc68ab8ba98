//! Helpers of the async tests: hang guards (timeouts are hang guards only, never a pass
//! criterion), options and records, a simulated disk whose syncs, writes or reads can be held
//! at a gate (so that a blocked worker is detected without depending on timing), and a
//! scriptable async sink that checks each epoch arrives once.

#![allow(dead_code)]

use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::future::Future;
use std::io;
use std::panic::AssertUnwindSafe;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;
use walsink::storage::{SimStorage, Storage, StorageFile};
use walsink::{
    Epoch, EpochKey, ErrorKind, MemorySink, Options, RecoveryReport, RetryPolicy, SinkError,
    WalSink,
};
use walsink_tokio::{AsyncChunks, AsyncSink, AsyncWal, Codec, DecodeError};

/// Hang guard for awaited operations (never a pass/fail criterion by itself).
pub const GUARD: Duration = Duration::from_secs(120);

pub fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

pub async fn guard<F: Future>(what: &str, f: F) -> F::Output {
    match tokio::time::timeout(GUARD, f).await {
        Ok(v) => v,
        Err(_) => panic!("hang guard: {what} did not finish within {GUARD:?}"),
    }
}

pub async fn wait_until(what: &str, mut cond: impl FnMut() -> bool) {
    guard(what, async {
        while !cond() {
            tokio::time::sleep(ms(2)).await;
        }
    })
    .await
}

/// Options with fast retries, so that failing sinks are retried quickly.
pub fn opts(id: &str) -> Options {
    Options::new(id).retry(RetryPolicy::new(ms(1), ms(20)))
}

pub fn rec(cp: u64, i: usize) -> Vec<u8> {
    format!("cp{cp}-record{i}").into_bytes()
}

pub fn recs(cp: u64, n: usize) -> Vec<Vec<u8>> {
    (0..n).map(|i| rec(cp, i)).collect()
}

pub fn refs(v: &[Vec<u8>]) -> Vec<&[u8]> {
    v.iter().map(|r| r.as_slice()).collect()
}

/// Appends `records` and seals them as checkpoint `cp`.
pub async fn seal(wal: &AsyncWal, cp: u64, records: &[Vec<u8>]) {
    wal.append_batch(&refs(records))
        .await
        .expect("append_batch");
    wal.checkpoint(cp, &cp.to_le_bytes())
        .await
        .expect("checkpoint");
}

pub fn pending_ids(wal: &AsyncWal) -> Vec<u64> {
    wal.pending().iter().map(|p| p.id).collect()
}

pub fn sim_wal(sim: &SimStorage, o: Options) -> (AsyncWal, RecoveryReport) {
    let (w, r) = WalSink::open_with_storage(Arc::new(sim.clone()), o).expect("open on SimStorage");
    (AsyncWal::from_sync(w).expect("from_sync"), r)
}

/// Reopens a log on the real disk, waiting while the old handle's tasks still hold the lock
/// (as the crate's example does).
pub async fn reopen(dir: &Path, o: Options) -> (AsyncWal, RecoveryReport) {
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

/// A std thread that runs `on_fire` if it is not dropped within `secs` seconds.
pub struct Watchdog {
    pub fired: Arc<AtomicBool>,
    pub done: Arc<AtomicBool>,
}

impl Watchdog {
    pub fn start(secs: u64, on_fire: impl FnOnce() + Send + 'static) -> Self {
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

    pub fn fired(&self) -> bool {
        self.fired.load(Ordering::SeqCst)
    }
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        self.done.store(true, Ordering::SeqCst);
    }
}

#[derive(Debug, Default)]
pub struct Gate {
    pub st: std::sync::Mutex<(bool, usize)>,
    pub cv: std::sync::Condvar,
}

impl Gate {
    pub fn close(&self) {
        self.st.lock().unwrap().0 = true;
    }
    pub fn open(&self) {
        self.st.lock().unwrap().0 = false;
        self.cv.notify_all();
    }
    /// Threads held at the gate now.
    pub fn waiting(&self) -> usize {
        self.st.lock().unwrap().1
    }
    pub fn pass(&self) {
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
pub struct Gated {
    pub sim: SimStorage,
    pub sync: Arc<Gate>,
    pub write: Arc<Gate>,
    pub read: Arc<Gate>,
}

#[derive(Debug)]
pub struct GatedFile {
    pub f: Arc<dyn StorageFile>,
    pub g: Gated,
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
    pub fn wal(&self, o: Options) -> AsyncWal {
        let (w, _) = WalSink::open_with_storage(Arc::new(self.clone()), o).expect("open gated");
        AsyncWal::from_sync(w).expect("from_sync")
    }
}

#[derive(Default)]
pub struct Script {
    /// Every `deliver` call, failed ones included.
    pub calls: Vec<u64>,
    /// Successful deliveries with their records.
    pub ok: Vec<(u64, Vec<Vec<u8>>)>,
    /// The target's own marker (for marker sinks).
    pub marked: BTreeSet<u64>,
    pub violations: Vec<String>,
    pub fail_retryable: HashMap<u64, u32>,
    pub fail_permanent: HashMap<u64, u32>,
    pub fail_always: bool,
    pub hang: HashSet<u64>,
    pub hold: HashSet<u64>,
    pub hang_is_committed: bool,
    pub is_committed_calls: Vec<u64>,
}

#[derive(Clone, Default)]
pub struct Probe {
    pub s: Arc<Mutex<Script>>,
    pub marker: bool,
}

impl Probe {
    pub fn new() -> Self {
        Self::default()
    }
    pub fn with_marker() -> Self {
        Probe {
            marker: true,
            ..Self::default()
        }
    }
    pub fn edit(&self, f: impl FnOnce(&mut Script)) {
        f(&mut self.s.lock())
    }
    pub fn ok_ids(&self) -> Vec<u64> {
        self.s.lock().ok.iter().map(|(c, _)| *c).collect()
    }
    pub fn calls(&self) -> Vec<u64> {
        self.s.lock().calls.clone()
    }
    pub fn ok(&self) -> Vec<(u64, Vec<Vec<u8>>)> {
        self.s.lock().ok.clone()
    }
    pub fn records(&self) -> Vec<Vec<u8>> {
        self.s
            .lock()
            .ok
            .iter()
            .flat_map(|(_, r)| r.iter().cloned())
            .collect()
    }
    pub fn violations(&self) -> Vec<String> {
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

pub fn assert_each_once(delivered: &[Vec<u8>], expected: &[Vec<u8>]) {
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

/// Reopens `sim` after a crash and delivers everything sealed; returns the report and the
/// delivered epochs.
/// Delivered epochs: checkpoint id and records.
pub type Drained = Vec<(u64, Vec<Vec<u8>>)>;

pub fn reopen_and_drain(sim: &SimStorage, o: Options) -> (RecoveryReport, Drained) {
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

/// A sink that checks how a large epoch streams through `AsyncChunks`.
#[derive(Clone, Default)]
pub struct Streamer {
    pub out: Arc<Mutex<Vec<Vec<u8>>>>,
    pub chunks: Arc<AtomicUsize>,
    pub loaded: Arc<Mutex<Option<bool>>>,
    pub problems: Arc<Mutex<Vec<String>>>,
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

#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct Other {
    pub ratio: f64,
    pub flag: bool,
}

/// Collects, per record, what decoding it as `T` with codec `C` gave (inside catch_unwind).
pub struct Decoding<T, C> {
    pub codec: C,
    pub out: Outcomes<T>,
}

/// Per record: a panic, or what decoding gave.
pub type Outcomes<T> = Arc<Mutex<Vec<std::thread::Result<Result<T, DecodeError>>>>>;

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

/// The name libtest knows test `test` of module `module` by (`module_path!()` without the
/// crate), for tests that re-run themselves in a child process with `--exact`.
pub fn test_path(module: &str, test: &str) -> String {
    match module.split_once("::") {
        Some((_, path)) => format!("{path}::{test}"),
        None => test.to_string(),
    }
}
