//! Delivery's read-ahead (`Deliverer::read_ahead`, `Deliverer::read_or_take`, `ReadAhead`,
//! `ReadAheadEpoch`, `READ_AHEAD_MIN_BYTES`) through every synchronous driver
//! (`WalSink::deliver_ready`, `WalSink::spawn_committer`, a hand-written driver over the
//! public `Deliverer` steps): every epoch is delivered whole, in checkpoint order, exactly once
//! except after a crash; a read error is reported for the epoch being delivered (the log's
//! error, not the sink's); memory stays bounded (at most two epochs' read chunks); nothing is
//! skipped; a read ahead is used only for the same epoch at the same place.
//!
//! Every record carries its checkpoint id, its index and its length, and every byte after that
//! is a pattern of the two, so a sink checks each record it sees against its position: a record
//! of another epoch, a torn or shifted record, or a missing one is caught where it happens.
//!
//! A storage wrapper over `SimStorage` (public `Storage` trait) tells reads of the driver's
//! thread from reads of other threads (the read-ahead runs "on another thread", per the
//! design), so a read ahead can be made to fail, or the driver's own reads, deterministically.
//! Random rounds use fastrand with the fixed seeds named in each test. Waits are bounded.
//! The memory tests re-run themselves in a child process; the counting global allocator below
//! is the whole test binary's, and its counts are read only in that child.

use parking_lot::{Condvar, Mutex};
use std::alloc::{GlobalAlloc, Layout, System};
use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::io;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::ThreadId;
use std::time::{Duration, Instant};
use walsink::storage::{CrashOptions, FaultOp, SimStorage, Storage, StorageFile};
use walsink::{
    Deliverer, DirSink, Epoch, ErrorKind, Next, Options, Pending, RetryPolicy, Sink, SinkError,
    SinkErrorClass, WalSink, READ_AHEAD_MIN_BYTES,
};

// ---------------------------------------------------------------------------------------------
// Counting allocator (used for real only in the memory child process)
// ---------------------------------------------------------------------------------------------

struct Counting;
static CUR: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        let p = System.alloc(l);
        if !p.is_null() {
            let c = CUR.fetch_add(l.size(), Ordering::Relaxed) + l.size();
            PEAK.fetch_max(c, Ordering::Relaxed);
        }
        p
    }
    unsafe fn alloc_zeroed(&self, l: Layout) -> *mut u8 {
        let p = System.alloc_zeroed(l);
        if !p.is_null() {
            let c = CUR.fetch_add(l.size(), Ordering::Relaxed) + l.size();
            PEAK.fetch_max(c, Ordering::Relaxed);
        }
        p
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        System.dealloc(p, l);
        CUR.fetch_sub(l.size(), Ordering::Relaxed);
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, new: usize) -> *mut u8 {
        let q = System.realloc(p, l, new);
        if !q.is_null() {
            if new >= l.size() {
                let c = CUR.fetch_add(new - l.size(), Ordering::Relaxed) + (new - l.size());
                PEAK.fetch_max(c, Ordering::Relaxed);
            } else {
                CUR.fetch_sub(l.size() - new, Ordering::Relaxed);
            }
        }
        q
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

// ---------------------------------------------------------------------------------------------
// Records, epochs, the model
// ---------------------------------------------------------------------------------------------

const KIB: usize = 1 << 10;
const MIB: usize = 1 << 20;
/// Hang guard for waits; never a pass criterion by itself.
const GUARD: Duration = Duration::from_secs(120);

fn pattern(cp: u64, idx: u64) -> u8 {
    (cp.wrapping_mul(31) ^ idx.wrapping_mul(7) ^ 0x5a) as u8
}

/// Record `idx` of checkpoint `cp`: cp (8, le), idx (8, le), len (4, le), then a pattern byte.
fn rec(cp: u64, idx: u64, len: usize) -> Vec<u8> {
    assert!(len >= 20);
    let mut v = vec![pattern(cp, idx); len];
    v[0..8].copy_from_slice(&cp.to_le_bytes());
    v[8..16].copy_from_slice(&idx.to_le_bytes());
    v[16..20].copy_from_slice(&(len as u32).to_le_bytes());
    v
}

/// Whether `data` is record `idx` of `cp`, whole.
fn rec_ok(cp: u64, idx: u64, data: &[u8]) -> bool {
    if data.len() < 20 {
        return false;
    }
    let len = u32::from_le_bytes(data[16..20].try_into().unwrap()) as usize;
    data.len() == len
        && data[0..8] == cp.to_le_bytes()
        && data[8..16] == idx.to_le_bytes()
        && data[20..].iter().all(|&b| b == pattern(cp, idx))
}

fn digest_step(h: u64, len: usize) -> u64 {
    (h ^ len as u64).wrapping_mul(0x100_0000_01b3)
}

fn digest_of(sizes: &[usize]) -> u64 {
    sizes
        .iter()
        .fold(0xcbf2_9ce4_8422_2325, |h, &l| digest_step(h, l))
}

#[derive(Clone, Debug, PartialEq, Eq)]
struct Summary {
    cp: u64,
    n: u64,
    /// None when the sink did not read the records.
    digest: Option<u64>,
}

#[derive(Clone, Debug)]
struct Spec {
    cp: u64,
    sizes: Vec<usize>,
}

/// Appends the records of `spec` and seals them as its checkpoint.
fn seal(wal: &WalSink, spec: &Spec) {
    for (i, &len) in spec.sizes.iter().enumerate() {
        wal.append(&rec(spec.cp, i as u64, len)).expect("append");
    }
    wal.checkpoint(spec.cp, format!("meta-{}", spec.cp).as_bytes())
        .expect("checkpoint");
}

/// `n` records of `len` bytes.
fn sizes(n: usize, len: usize) -> Vec<usize> {
    vec![len; n]
}

fn tiny(cp: u64) -> Spec {
    Spec {
        cp,
        sizes: vec![40, 100, 33],
    }
}
/// Above READ_AHEAD_MIN_BYTES, within one 1 MiB chunk.
fn mid(cp: u64) -> Spec {
    Spec {
        cp,
        sizes: sizes(20, 20 * KIB),
    }
}
/// Several read chunks of 64 KiB, and above the read-ahead threshold.
fn big(cp: u64) -> Spec {
    Spec {
        cp,
        sizes: sizes(40, 30 * KIB + 7),
    }
}

fn fast_retry() -> RetryPolicy {
    RetryPolicy::new(Duration::from_millis(1), Duration::from_millis(4))
}

fn opts(chunk: usize) -> Options {
    Options::new("probe4")
        .segment_size(4 << 20)
        .max_record_size(1 << 20)
        .read_chunk_size(chunk)
        .retry(fast_retry())
}

fn open_on(storage: Arc<dyn Storage>, o: Options) -> WalSink {
    WalSink::open_with_storage(storage, o).expect("open").0
}

// ---------------------------------------------------------------------------------------------
// A storage wrapper that tells the driver's reads from other threads' reads
// ---------------------------------------------------------------------------------------------

#[derive(Default, Debug)]
struct ReadCtl {
    driver: Mutex<Option<ThreadId>>,
    /// Reads of threads other than the driver fail.
    fail_other: AtomicBool,
    /// Reads of the driver's thread fail.
    fail_driver: AtomicBool,
    other_reads: AtomicU64,
    driver_reads: AtomicU64,
    /// While set, reads of other threads wait (bounded) until it is cleared.
    hold_other: Mutex<bool>,
    hold_cv: Condvar,
    held_now: AtomicU64,
}

impl ReadCtl {
    fn set_driver_here(&self) {
        *self.driver.lock() = Some(std::thread::current().id());
    }
    fn check(&self) -> io::Result<()> {
        let me = std::thread::current().id();
        let is_driver = *self.driver.lock() == Some(me);
        if is_driver {
            self.driver_reads.fetch_add(1, Ordering::SeqCst);
            if self.fail_driver.load(Ordering::SeqCst) {
                return Err(io::Error::other("probe: driver read fails"));
            }
        } else {
            self.other_reads.fetch_add(1, Ordering::SeqCst);
            let mut h = self.hold_other.lock();
            if *h {
                self.held_now.fetch_add(1, Ordering::SeqCst);
                let end = Instant::now() + GUARD;
                while *h && Instant::now() < end {
                    self.hold_cv.wait_for(&mut h, Duration::from_millis(50));
                }
                self.held_now.fetch_sub(1, Ordering::SeqCst);
            }
            drop(h);
            if self.fail_other.load(Ordering::SeqCst) {
                return Err(io::Error::other("probe: read-ahead read fails"));
            }
        }
        Ok(())
    }
    fn release(&self) {
        *self.hold_other.lock() = false;
        self.hold_cv.notify_all();
    }
}

#[derive(Clone, Debug)]
struct Probed {
    inner: SimStorage,
    ctl: Arc<ReadCtl>,
}

#[derive(Debug)]
struct ProbedFile {
    inner: Arc<dyn StorageFile>,
    ctl: Arc<ReadCtl>,
}

impl StorageFile for ProbedFile {
    fn len(&self) -> io::Result<u64> {
        self.inner.len()
    }
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<usize> {
        self.ctl.check()?;
        self.inner.read_at(offset, buf)
    }
    fn write_at(&self, offset: u64, data: &[u8]) -> io::Result<()> {
        self.inner.write_at(offset, data)
    }
    fn sync_data(&self) -> io::Result<()> {
        self.inner.sync_data()
    }
    fn set_len(&self, len: u64) -> io::Result<()> {
        self.inner.set_len(len)
    }
    fn read_range(&self, offset: u64, len: usize) -> io::Result<bytes::Bytes> {
        self.ctl.check()?;
        self.inner.read_range(offset, len)
    }
    fn read_range_into(&self, offset: u64, len: usize, buf: &mut Vec<u8>) -> io::Result<()> {
        self.ctl.check()?;
        self.inner.read_range_into(offset, len, buf)
    }
}

impl Storage for Probed {
    fn list(&self) -> io::Result<Vec<String>> {
        self.inner.list()
    }
    fn open(&self, name: &str) -> io::Result<Arc<dyn StorageFile>> {
        Ok(Arc::new(ProbedFile {
            inner: self.inner.open(name)?,
            ctl: self.ctl.clone(),
        }))
    }
    fn create(&self, name: &str) -> io::Result<Arc<dyn StorageFile>> {
        Ok(Arc::new(ProbedFile {
            inner: self.inner.create(name)?,
            ctl: self.ctl.clone(),
        }))
    }
    fn rename(&self, from: &str, to: &str) -> io::Result<()> {
        self.inner.rename(from, to)
    }
    fn remove(&self, name: &str) -> io::Result<()> {
        self.inner.remove(name)
    }
    fn sync_dir(&self) -> io::Result<()> {
        self.inner.sync_dir()
    }
    fn lock(&self, name: &str) -> io::Result<Box<dyn Send + Sync + fmt::Debug>> {
        self.inner.lock(name)
    }
    fn describe(&self) -> String {
        format!("probed {}", self.inner.describe())
    }
    fn check_alive(&self) -> io::Result<()> {
        self.inner.check_alive()
    }
}

fn probed() -> (Probed, Arc<ReadCtl>) {
    let ctl = Arc::new(ReadCtl::default());
    (
        Probed {
            inner: SimStorage::new(),
            ctl: ctl.clone(),
        },
        ctl,
    )
}

// ---------------------------------------------------------------------------------------------
// The probe sink
// ---------------------------------------------------------------------------------------------

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Pass {
    /// Reads the chunks once.
    Once,
    /// Reads the chunks twice and compares the passes.
    Twice,
    /// Reads through `Epoch::records`.
    Records,
    /// Does not read the epoch at all.
    Skip,
}

type FailFn = dyn Fn(u64, u32) -> Option<SinkError> + Send + Sync;
type PassFn = dyn Fn(u64, u32) -> Pass + Send + Sync;

#[derive(Default)]
struct SinkState {
    attempts: HashMap<u64, u32>,
    /// Every `deliver` call's checkpoint, in order.
    calls: Vec<u64>,
    /// Epochs `deliver` returned Ok for, in order.
    delivered: Vec<Summary>,
    /// Iterations that met an Err.
    read_errors: u64,
    /// Anything wrong seen inside `deliver` (a record not at its place, passes that differ).
    bad: Vec<String>,
    /// Thread the sink was called on.
    thread: Option<ThreadId>,
}

struct Gate {
    cp: u64,
    st: Mutex<(bool, bool)>, // (entered, open)
    cv: Condvar,
}

impl Gate {
    fn new(cp: u64) -> Arc<Self> {
        Arc::new(Gate {
            cp,
            st: Mutex::new((false, false)),
            cv: Condvar::new(),
        })
    }
    fn pass(&self, cp: u64) {
        if cp != self.cp {
            return;
        }
        let mut g = self.st.lock();
        g.0 = true;
        self.cv.notify_all();
        let end = Instant::now() + GUARD;
        while !g.1 && Instant::now() < end {
            self.cv.wait_for(&mut g, Duration::from_millis(50));
        }
    }
    fn wait_entered(&self) -> bool {
        let mut g = self.st.lock();
        let end = Instant::now() + GUARD;
        while !g.0 && Instant::now() < end {
            self.cv.wait_for(&mut g, Duration::from_millis(50));
        }
        g.0
    }
    fn open(&self) {
        self.st.lock().1 = true;
        self.cv.notify_all();
    }
}

#[derive(Clone)]
struct ProbeSink {
    st: Arc<Mutex<SinkState>>,
    fail: Arc<FailFn>,
    pass: Arc<PassFn>,
    delay: Duration,
    gates: Vec<Arc<Gate>>,
    marker: bool,
}

impl ProbeSink {
    fn new() -> Self {
        ProbeSink {
            st: Arc::default(),
            fail: Arc::new(|_, _| None),
            pass: Arc::new(|_, _| Pass::Once),
            delay: Duration::ZERO,
            gates: Vec::new(),
            marker: false,
        }
    }
    fn failing(
        mut self,
        f: impl Fn(u64, u32) -> Option<SinkError> + Send + Sync + 'static,
    ) -> Self {
        self.fail = Arc::new(f);
        self
    }
    fn passes(mut self, f: impl Fn(u64, u32) -> Pass + Send + Sync + 'static) -> Self {
        self.pass = Arc::new(f);
        self
    }
    fn delay(mut self, d: Duration) -> Self {
        self.delay = d;
        self
    }
    fn gate(mut self, g: Arc<Gate>) -> Self {
        self.gates.push(g);
        self
    }
    fn delivered(&self) -> Vec<Summary> {
        self.st.lock().delivered.clone()
    }
    fn delivered_cps(&self) -> Vec<u64> {
        self.st.lock().delivered.iter().map(|s| s.cp).collect()
    }
    fn bad(&self) -> Vec<String> {
        self.st.lock().bad.clone()
    }
    fn calls(&self) -> Vec<u64> {
        self.st.lock().calls.clone()
    }
    fn read_errors(&self) -> u64 {
        self.st.lock().read_errors
    }
}

/// Reads the epoch once through its chunks (or records): Ok((count, digest)) or the read error.
fn read_pass(
    epoch: &Epoch,
    via_records: bool,
    bad: &mut Vec<String>,
) -> Result<(u64, u64), String> {
    struct Checker {
        cp: u64,
        h: u64,
        next: u64,
    }
    impl Checker {
        fn check(&mut self, pos_cp: u64, pos_idx: u64, data: &[u8], bad: &mut Vec<String>) {
            let (cp, next) = (self.cp, self.next);
            if pos_cp != cp || pos_idx != next || !rec_ok(cp, next, data) {
                bad.push(format!(
                    "epoch {cp}: record {next} wrong (position ({pos_cp},{pos_idx}), {} bytes, head {:?})",
                    data.len(),
                    &data[..data.len().min(20)]
                ));
            }
            self.h = digest_step(self.h, data.len());
            self.next += 1;
        }
    }
    let cp = epoch.checkpoint();
    let mut k = Checker {
        cp,
        h: 0xcbf2_9ce4_8422_2325u64,
        next: 0,
    };
    if via_records {
        for r in epoch.records() {
            let r = r.map_err(|e| e.to_string())?;
            k.check(r.position.checkpoint, r.position.index, &r.data, bad);
        }
    } else {
        for c in epoch.chunks() {
            let c = c.map_err(|e| e.to_string())?;
            if c.first_index() != k.next {
                bad.push(format!(
                    "epoch {cp}: chunk starts at {} after {} records",
                    c.first_index(),
                    k.next
                ));
            }
            for r in c.records() {
                k.check(r.position.checkpoint, r.position.index, &r.data, bad);
            }
        }
    }
    if k.next != epoch.len() {
        bad.push(format!(
            "epoch {cp}: len() says {} but {} records were read",
            epoch.len(),
            k.next
        ));
    }
    Ok((k.next, k.h))
}

impl Sink for ProbeSink {
    fn deliver(&mut self, epoch: &Epoch) -> Result<(), SinkError> {
        let cp = epoch.checkpoint();
        let attempt = {
            let mut st = self.st.lock();
            st.thread = Some(std::thread::current().id());
            st.calls.push(cp);
            if let Some(last) = st.delivered.last() {
                if cp <= last.cp {
                    let m = format!("epoch {cp} offered after {} was delivered", last.cp);
                    st.bad.push(m);
                }
            }
            let a = st.attempts.entry(cp).or_insert(0);
            *a += 1;
            *a
        };
        for g in &self.gates {
            g.pass(cp);
        }
        let mode = (self.pass)(cp, attempt);
        let mut bad = Vec::new();
        let digest = match mode {
            Pass::Skip => None,
            Pass::Once | Pass::Records | Pass::Twice => {
                match read_pass(epoch, mode == Pass::Records, &mut bad) {
                    Err(e) => {
                        let mut st = self.st.lock();
                        st.read_errors += 1;
                        st.bad.extend(bad);
                        // The sink's own error, permanent: the log's error must be reported instead.
                        return Err(SinkError::permanent(format!(
                            "probe sink met a read error: {e}"
                        )));
                    }
                    Ok((n, h)) => {
                        if mode == Pass::Twice {
                            match read_pass(epoch, false, &mut bad) {
                                Err(e) => {
                                    let mut st = self.st.lock();
                                    st.read_errors += 1;
                                    st.bad.extend(bad);
                                    return Err(SinkError::permanent(format!(
                                        "probe sink met a read error (2nd pass): {e}"
                                    )));
                                }
                                Ok(second) => {
                                    if second != (n, h) {
                                        bad.push(format!(
                                            "epoch {cp}: passes differ {:?} vs {second:?}",
                                            (n, h)
                                        ));
                                    }
                                }
                            }
                        }
                        Some(h)
                    }
                }
            }
        };
        if !self.delay.is_zero() {
            std::thread::sleep(self.delay);
        }
        let mut st = self.st.lock();
        st.bad.extend(bad);
        if let Some(e) = (self.fail)(cp, attempt) {
            return Err(e);
        }
        st.delivered.push(Summary {
            cp,
            n: epoch.len(),
            digest,
        });
        Ok(())
    }
    fn stores_marker(&self) -> bool {
        self.marker
    }
    fn is_committed(&mut self, key: &walsink::EpochKey) -> Result<bool, SinkError> {
        Ok(self.marker
            && self
                .st
                .lock()
                .delivered
                .iter()
                .any(|s| s.cp == key.checkpoint))
    }
}

/// Compares what was delivered with the specs, allowing `None` digests (epochs not read).
fn assert_delivered(got: &[Summary], want: &[Spec], what: &str) {
    let g: Vec<(u64, u64)> = got.iter().map(|s| (s.cp, s.n)).collect();
    let w: Vec<(u64, u64)> = want.iter().map(|s| (s.cp, s.sizes.len() as u64)).collect();
    assert_eq!(
        g, w,
        "{what}: delivered (checkpoint, records) differ from the expected sequence"
    );
    for (s, spec) in got.iter().zip(want) {
        if let Some(d) = s.digest {
            assert_eq!(
                d,
                digest_of(&spec.sizes),
                "{what}: epoch {} delivered with other records",
                s.cp
            );
        }
    }
}

fn deliver_until_ok(wal: &WalSink, sink: &mut ProbeSink, max_calls: usize) -> Vec<walsink::Error> {
    let mut errs = Vec::new();
    for _ in 0..max_calls {
        match wal.deliver_ready(sink) {
            Ok(_) => return errs,
            Err(e) => errs.push(e),
        }
    }
    panic!("deliver_ready did not succeed in {max_calls} calls; errors: {errs:?}");
}

fn expect_deliver(d: &mut Deliverer) -> Pending {
    match d.next_step().expect("next_step") {
        Next::Deliver(p) => p,
        other => panic!("expected an epoch to deliver, got {other:?}"),
    }
}

/// Delivers one epoch by hand through `read_or_take` and `finish`.
fn hand_deliver(
    d: &mut Deliverer,
    p: Pending,
    ahead: Option<walsink::ReadAheadEpoch>,
    sink: &mut ProbeSink,
) -> walsink::Result<()> {
    let epoch = d.read_or_take(&p, ahead)?;
    let outcome = sink.deliver(&epoch);
    d.finish(p, &epoch, outcome)
}

// =============================================================================================
// Group A: the public Deliverer steps, driven by hand
// =============================================================================================

/// `read_ahead` is the next deliverable epoch, only at least READ_AHEAD_MIN_BYTES, only when
/// deliverable now.
#[test]
fn api_read_ahead_offered_only_for_a_next_deliverable_epoch_of_at_least_256k() {
    assert_eq!(READ_AHEAD_MIN_BYTES, 256 * 1024);
    let (st, _ctl) = probed();
    let wal = open_on(Arc::new(st), opts(MIB));
    let specs = [
        tiny(1),
        Spec {
            cp: 2,
            sizes: sizes(4, 64 * KIB),
        }, // exactly 256 KiB of payload
        tiny(3),
        tiny(4),
        mid(5),
    ];
    for s in &specs {
        seal(&wal, s);
    }
    wal.checkpoint_complete(4).unwrap(); // 5 is sealed, not complete
    let mut d = wal.deliverer().unwrap();
    let mut sink = ProbeSink::new();

    let p1 = expect_deliver(&mut d);
    assert_eq!(p1.checkpoint(), 1);
    let ra = d
        .read_ahead(&p1)
        .expect("epoch 2 holds 256 KiB: it must be read ahead");
    assert_eq!(
        ra.checkpoint(),
        2,
        "the read ahead must be of the epoch after p"
    );
    drop(ra);
    hand_deliver(&mut d, p1, None, &mut sink).unwrap();

    let p2 = expect_deliver(&mut d);
    assert_eq!(p2.checkpoint(), 2);
    assert!(
        d.read_ahead(&p2).is_none(),
        "epoch 3 is tiny: no read ahead"
    );
    hand_deliver(&mut d, p2, None, &mut sink).unwrap();
    let p3 = expect_deliver(&mut d);
    hand_deliver(&mut d, p3, None, &mut sink).unwrap();
    let p4 = expect_deliver(&mut d);
    assert_eq!(p4.checkpoint(), 4);
    assert!(
        d.read_ahead(&p4).is_none(),
        "epoch 5 is sealed but not complete: nothing to read ahead"
    );
    hand_deliver(&mut d, p4, None, &mut sink).unwrap();
    wal.checkpoint_complete(5).unwrap();
    let p5 = expect_deliver(&mut d);
    assert!(d.read_ahead(&p5).is_none(), "nothing after the last epoch");
    hand_deliver(&mut d, p5, None, &mut sink).unwrap();
    d.flush().unwrap();
    assert!(matches!(d.next_step().unwrap(), Next::Idle));
    drop(d);
    assert_delivered(&sink.delivered(), &specs, "hand driver");
    assert!(sink.bad().is_empty(), "{:?}", sink.bad());
    assert!(wal.pending().is_empty());
}

/// A read ahead whose read failed is dropped and the epoch read in its turn; the failure never
/// becomes the epoch's.
#[test]
fn api_failed_read_ahead_is_dropped_and_the_epoch_read_in_its_turn() {
    // The read ahead of an epoch within one chunk reads it whole (as `Deliverer::read` would).
    for (chunk, second) in [
        (MIB, mid(2)),
        (
            4 * MIB,
            Spec {
                cp: 2,
                sizes: sizes(3, MIB - 5),
            },
        ),
    ] {
        let sim = SimStorage::new();
        let wal = open_on(Arc::new(sim.clone()), opts(chunk));
        let specs = [tiny(1), second, mid(3)];
        for s in &specs {
            seal(&wal, s);
        }
        wal.checkpoint_complete(3).unwrap();
        let mut d = wal.deliverer().unwrap();
        let mut sink = ProbeSink::new().passes(|_, _| Pass::Twice);
        let p1 = expect_deliver(&mut d);
        let ra = d.read_ahead(&p1).expect("read ahead of epoch 2");
        sim.inject_fault(FaultOp::Read, 0, io::ErrorKind::Other);
        let failed = ra.read();
        assert_eq!(
            sim.pending_faults(),
            0,
            "the read ahead must have read (and met the fault)"
        );
        hand_deliver(&mut d, p1, None, &mut sink).unwrap();
        let p2 = expect_deliver(&mut d);
        assert_eq!(p2.checkpoint(), 2);
        hand_deliver(&mut d, p2, Some(failed), &mut sink)
            .expect("a failed read ahead must be dropped and epoch 2 read again, successfully");
        let p3 = expect_deliver(&mut d);
        hand_deliver(&mut d, p3, None, &mut sink).unwrap();
        d.flush().unwrap();
        drop(d);
        assert_delivered(&sink.delivered(), &specs, &format!("chunk {chunk}"));
        assert!(sink.bad().is_empty(), "{:?}", sink.bad());
        assert_eq!(sink.read_errors(), 0);
    }
}

/// The sink fails epoch 1 after epoch 2 was read ahead: the same epoch 1 comes again and the
/// read ahead of 2 must not be passed off as 1; then 2 comes with its own records.
#[test]
fn api_stale_read_ahead_after_a_sink_failure_is_never_passed_off() {
    for chunk in [MIB, 64 * KIB] {
        let sim = SimStorage::new();
        let wal = open_on(Arc::new(sim.clone()), opts(chunk));
        // Same sizes: only the ids and bytes tell them apart.
        let specs = [big(1), big(2), big(3)];
        for s in &specs {
            seal(&wal, s);
        }
        wal.checkpoint_complete(3).unwrap();
        let mut d = wal.deliverer().unwrap();
        let mut sink = ProbeSink::new().failing(|cp, a| {
            (cp == 1 && a == 1).then(|| SinkError::retryable("first try of 1 fails"))
        });
        let p1 = expect_deliver(&mut d);
        let ahead2 = d.read_ahead(&p1).expect("epoch 2 is read ahead").read();
        let err = hand_deliver(&mut d, p1, None, &mut sink).unwrap_err();
        assert!(matches!(err.kind(), ErrorKind::Sink(_)), "{err:?}");
        let p1b = expect_deliver(&mut d);
        assert_eq!(
            p1b.checkpoint(),
            1,
            "the failed epoch comes again, nothing skipped"
        );
        let e = d.read_or_take(&p1b, Some(ahead2)).unwrap();
        assert_eq!(
            e.checkpoint(),
            1,
            "read_or_take(p=1, ahead=2) returned another epoch"
        );
        let outcome = sink.deliver(&e);
        d.finish(p1b, &e, outcome).unwrap();
        drop(e);
        // The next read ahead, taken now, is used for 2; a stale one of 3 held for 2 is not.
        let p2 = expect_deliver(&mut d);
        let ahead3 = d.read_ahead(&p2).expect("epoch 3 is read ahead").read();
        let e2 = d.read_or_take(&p2, Some(ahead3)).unwrap();
        assert_eq!(e2.checkpoint(), 2, "a read ahead of 3 passed off as 2");
        let o = sink.deliver(&e2);
        d.finish(p2, &e2, o).unwrap();
        drop(e2);
        let p3 = expect_deliver(&mut d);
        hand_deliver(&mut d, p3, None, &mut sink).unwrap();
        d.flush().unwrap();
        drop(d);
        assert_delivered(&sink.delivered(), &specs, &format!("chunk {chunk}"));
        assert!(sink.bad().is_empty(), "{:?}", sink.bad());
    }
}

/// Epoch 2 is read ahead, then a restore voids it and a new checkpoint 3 of the same shape is
/// completed: 3 must be delivered with its own records, 2 never.
#[test]
fn api_read_ahead_voided_by_restore_is_never_delivered() {
    for chunk in [MIB, 64 * KIB] {
        let sim = SimStorage::new();
        let wal = open_on(Arc::new(sim.clone()), opts(chunk));
        seal(&wal, &tiny(1));
        seal(&wal, &big(2));
        wal.checkpoint_complete(2).unwrap();
        let mut d = wal.deliverer().unwrap();
        let mut sink = ProbeSink::new().passes(|_, _| Pass::Twice);
        let p1 = expect_deliver(&mut d);
        let ahead2 = d.read_ahead(&p1).expect("epoch 2 is read ahead").read();
        hand_deliver(&mut d, p1, None, &mut sink).unwrap();
        wal.restore(Some(1)).unwrap();
        let pend: Vec<u64> = wal.pending().iter().map(|p| p.id).collect();
        assert!(
            !pend.contains(&2),
            "epoch 2 was voided by the restore: {pend:?}"
        );
        seal(&wal, &big(3));
        wal.checkpoint_complete(3).unwrap();
        let p3 = expect_deliver(&mut d);
        assert_eq!(p3.checkpoint(), 3, "the voided epoch 2 was offered");
        let e = d.read_or_take(&p3, Some(ahead2)).unwrap();
        assert_eq!(e.checkpoint(), 3);
        let o = sink.deliver(&e);
        d.finish(p3, &e, o).unwrap();
        drop(e);
        d.flush().unwrap();
        assert!(matches!(d.next_step().unwrap(), Next::Idle));
        drop(d);
        assert_delivered(
            &sink.delivered(),
            &[tiny(1), big(3)],
            &format!("chunk {chunk}"),
        );
        assert!(sink.bad().is_empty(), "{:?}", sink.bad());
        assert!(wal.pending().is_empty());
    }
}

/// A read ahead that is used gives the same epoch as a plain read, pass after pass, and the
/// read of the epoch in its turn is the one whose error counts.
#[test]
fn api_read_ahead_used_in_its_turn_is_the_same_epoch_pass_after_pass() {
    let sim = SimStorage::new();
    let wal = open_on(Arc::new(sim.clone()), opts(64 * KIB));
    let specs = [
        tiny(1),
        big(2),
        Spec {
            cp: 3,
            sizes: sizes(5, 200 * KIB),
        },
        mid(4),
    ];
    for s in &specs {
        seal(&wal, s);
    }
    wal.checkpoint_complete(4).unwrap();
    let mut d = wal.deliverer().unwrap();
    let mut sink = ProbeSink::new().passes(|_, _| Pass::Twice);
    let mut ahead = None;
    let mut n = 0;
    while let Next::Deliver(p) = d.next_step().unwrap() {
        let next_ahead = d.read_ahead(&p).map(|r| r.read());
        let e = d.read_or_take(&p, ahead.take()).unwrap();
        assert_eq!(e.checkpoint(), p.checkpoint());
        assert_eq!(e.len(), p.records());
        assert_eq!(e.bytes(), p.bytes());
        assert_eq!(e.metadata(), format!("meta-{}", p.checkpoint()).as_bytes());
        // Three passes through a clone too.
        let c = e.clone();
        let mut bad = Vec::new();
        let a = read_pass(&c, false, &mut bad).unwrap();
        let b = read_pass(&c, true, &mut bad).unwrap();
        assert_eq!(a, b);
        assert!(bad.is_empty(), "{bad:?}");
        drop(c);
        let o = sink.deliver(&e);
        d.finish(p, &e, o).unwrap();
        ahead = next_ahead;
        n += 1;
    }
    assert_eq!(n, 4);
    d.flush().unwrap();
    drop(d);
    assert_delivered(&sink.delivered(), &specs, "hand driver with read-ahead");
    assert!(sink.bad().is_empty(), "{:?}", sink.bad());
}

/// The current epoch's own read fails (no read ahead): the log's I/O error is returned, and the
/// same epoch is delivered next time.
#[test]
fn api_current_read_error_is_reported_then_the_epoch_is_retried() {
    let sim = SimStorage::new();
    let wal = open_on(Arc::new(sim.clone()), opts(MIB));
    let specs = [mid(1), mid(2)];
    for s in &specs {
        seal(&wal, s);
    }
    wal.checkpoint_complete(2).unwrap();
    let mut d = wal.deliverer().unwrap();
    let mut sink = ProbeSink::new();
    let p1 = expect_deliver(&mut d);
    let ahead2 = d.read_ahead(&p1).expect("epoch 2 is read ahead").read();
    sim.inject_fault(FaultOp::Read, 0, io::ErrorKind::Other);
    let err = d.read_or_take(&p1, None).unwrap_err();
    assert!(
        matches!(err.kind(), ErrorKind::Io { .. }),
        "want the log's I/O error, got {err:?}"
    );
    // The step failed: the same epoch comes again.
    let p1b = expect_deliver(&mut d);
    assert_eq!(p1b.checkpoint(), 1);
    hand_deliver(&mut d, p1b, None, &mut sink).unwrap();
    let p2 = expect_deliver(&mut d);
    hand_deliver(&mut d, p2, Some(ahead2), &mut sink).unwrap();
    d.flush().unwrap();
    drop(d);
    assert_delivered(&sink.delivered(), &specs, "after a current read error");
}

/// A multi-chunk epoch read ahead (its first chunk) whose later chunk fails while the sink
/// iterates: `finish` reports the log's error, not the sink's (permanent) one; the retry
/// delivers the epoch whole.
#[test]
fn api_half_way_read_error_of_a_read_ahead_epoch_reports_the_logs_error() {
    let sim = SimStorage::new();
    let wal = open_on(Arc::new(sim.clone()), opts(64 * KIB));
    let specs = [tiny(1), big(2)];
    for s in &specs {
        seal(&wal, s);
    }
    wal.checkpoint_complete(2).unwrap();
    let mut d = wal.deliverer().unwrap();
    let mut sink = ProbeSink::new();
    let p1 = expect_deliver(&mut d);
    let ahead2 = d.read_ahead(&p1).expect("epoch 2 is read ahead").read();
    hand_deliver(&mut d, p1, None, &mut sink).unwrap();
    let p2 = expect_deliver(&mut d);
    let e = d.read_or_take(&p2, Some(ahead2)).unwrap();
    assert!(
        !e.is_loaded(),
        "a 1.2 MiB epoch with 64 KiB chunks is read as it is iterated"
    );
    sim.inject_fault(FaultOp::Read, 0, io::ErrorKind::Other);
    let o = sink.deliver(&e);
    assert!(o.is_err(), "the sink met the read error");
    assert_eq!(o.as_ref().unwrap_err().class(), SinkErrorClass::Permanent);
    let err = d.finish(p2, &e, o).unwrap_err();
    assert!(
        !matches!(err.kind(), ErrorKind::Sink(_)),
        "finish must report the log's read error, not the sink's: {err:?}"
    );
    drop(e);
    let p2b = expect_deliver(&mut d);
    assert_eq!(p2b.checkpoint(), 2);
    hand_deliver(&mut d, p2b, None, &mut sink).unwrap();
    d.flush().unwrap();
    drop(d);
    assert_delivered(&sink.delivered(), &specs, "after a half-way read error");
    assert_eq!(sink.read_errors(), 1);
}

// =============================================================================================
// Group B: WalSink::deliver_ready
// =============================================================================================

/// Mixed small, mid and multi-chunk epochs through deliver_ready with sinks that read once,
/// twice, through records, not at all, and slowly: each epoch whole, in order, once.
#[test]
fn deliver_ready_mixed_sizes_with_every_kind_of_sink() {
    let modes = [Pass::Once, Pass::Twice, Pass::Records, Pass::Skip];
    for (mi, &mode) in modes.iter().enumerate() {
        for (slow, chunk) in [
            (false, MIB),
            (true, MIB),
            (false, 64 * KIB),
            (true, 64 * KIB),
        ] {
            let (st, ctl) = probed();
            let wal = open_on(Arc::new(st), opts(chunk));
            let mut specs = Vec::new();
            for cp in 1..=9u64 {
                let s = match cp % 4 {
                    0 => tiny(cp),
                    1 => big(cp),
                    2 => mid(cp),
                    _ => Spec {
                        cp,
                        sizes: sizes(3, 100 * KIB),
                    },
                };
                seal(&wal, &s);
                specs.push(s);
            }
            wal.checkpoint_complete(9).unwrap();
            // Skip only every other epoch, so read epochs sit between unread ones.
            let mut sink = ProbeSink::new()
                .passes(move |cp, _| {
                    if mode == Pass::Skip && cp % 2 == 0 {
                        Pass::Once
                    } else {
                        mode
                    }
                })
                .delay(if slow {
                    Duration::from_millis(15)
                } else {
                    Duration::ZERO
                });
            ctl.set_driver_here();
            let n = wal.deliver_ready(&mut sink).expect("deliver_ready");
            assert_eq!(n, 9, "mode {mi} slow {slow} chunk {chunk}: epochs handled");
            assert_delivered(
                &sink.delivered(),
                &specs,
                &format!("mode {mode:?} slow {slow}"),
            );
            assert!(sink.bad().is_empty(), "{:?}", sink.bad());
            assert_eq!(
                sink.calls().len(),
                9,
                "no epoch offered twice without an error"
            );
            let h = wal.health();
            assert_eq!(h.delivered_epochs, 9, "health().delivered_epochs");
            assert_eq!(
                h.delivered_records,
                specs.iter().map(|s| s.sizes.len() as u64).sum::<u64>()
            );
            assert!(wal.pending().is_empty());
            assert_eq!(wal.health().committed, Some(9));
            // With 1 MiB chunks the mid epochs (400 KiB, one chunk) are read whole ahead.
            if chunk == MIB {
                assert!(
                    ctl.other_reads.load(Ordering::SeqCst) > 0,
                    "epochs of >= 256 KiB within one chunk were never read on another thread"
                );
            }
            // A second call has nothing to do.
            assert_eq!(wal.deliver_ready(&mut sink).unwrap(), 0);
            assert_eq!(sink.calls().len(), 9);
        }
    }
}

/// Below the threshold nothing is read ahead: no read on another thread.
#[test]
fn deliver_ready_small_epochs_are_not_read_ahead() {
    let (st, ctl) = probed();
    let wal = open_on(Arc::new(st), opts(MIB));
    let specs: Vec<Spec> = (1..=6)
        .map(|cp| Spec {
            cp,
            sizes: sizes(10, 20 * KIB),
        })
        .collect(); // 200 KiB each
    for s in &specs {
        seal(&wal, s);
    }
    wal.checkpoint_complete(6).unwrap();
    ctl.set_driver_here();
    let mut sink = ProbeSink::new();
    wal.deliver_ready(&mut sink).unwrap();
    assert_delivered(&sink.delivered(), &specs, "small epochs");
    assert_eq!(
        ctl.other_reads.load(Ordering::SeqCst),
        0,
        "an epoch below READ_AHEAD_MIN_BYTES was read ahead"
    );
}

/// Every epoch in turn fails (retryable, then permanent, once or three times): deliver_ready
/// stops there with the sink's error, what came before is committed, nothing is skipped, and
/// the next calls finish the job with each epoch delivered once.
#[test]
fn deliver_ready_sink_failure_at_each_epoch_never_skips_or_repeats() {
    let build = |cp: u64| match cp % 3 {
        0 => tiny(cp),
        1 => big(cp),
        _ => mid(cp),
    };
    for fail_cp in 1..=6u64 {
        for (permanent, times) in [(false, 1u32), (true, 1), (false, 3), (true, 2)] {
            let sim = SimStorage::new();
            let wal = open_on(Arc::new(sim.clone()), opts(64 * KIB));
            let specs: Vec<Spec> = (1..=6).map(build).collect();
            for s in &specs {
                seal(&wal, s);
            }
            wal.checkpoint_complete(6).unwrap();
            let mut sink = ProbeSink::new()
                .passes(|cp, _| if cp % 2 == 0 { Pass::Twice } else { Pass::Once })
                .failing(move |cp, a| {
                    (cp == fail_cp && a <= times).then(|| {
                        if permanent {
                            SinkError::permanent("injected permanent")
                        } else {
                            SinkError::retryable("injected retryable")
                        }
                    })
                });
            let what = format!("fail {fail_cp} permanent {permanent} x{times}");
            for t in 0..times {
                let err = wal.deliver_ready(&mut sink).expect_err(&what);
                match err.kind() {
                    ErrorKind::Sink(se) => assert_eq!(
                        se.class(),
                        if permanent {
                            SinkErrorClass::Permanent
                        } else {
                            SinkErrorClass::Retryable
                        },
                        "{what}"
                    ),
                    other => panic!("{what}: want the sink's error, got {other:?}"),
                }
                assert_delivered(
                    &sink.delivered(),
                    &specs[..fail_cp as usize - 1],
                    &format!("{what} try {t}"),
                );
                let committed = wal.health().committed;
                assert_eq!(
                    committed,
                    (fail_cp > 1).then_some(fail_cp - 1),
                    "{what}: marked before the error returns"
                );
            }
            let n = wal.deliver_ready(&mut sink).expect(&what);
            assert_eq!(n as u64, 6 - fail_cp + 1, "{what}");
            assert_delivered(&sink.delivered(), &specs, &what);
            assert!(sink.bad().is_empty(), "{what}: {:?}", sink.bad());
            let calls = sink.calls();
            let want_calls: Vec<u64> = (1..=6u64)
                .flat_map(|c| {
                    std::iter::repeat_n(c, if c == fail_cp { times as usize + 1 } else { 1 })
                })
                .collect();
            assert_eq!(calls, want_calls, "{what}: offers to the sink");
            assert!(wal.pending().is_empty(), "{what}");
        }
    }
}

/// Every read made on a thread other than the driver's fails (so every read ahead fails):
/// deliver_ready must not report those errors, and delivers everything whole.
#[test]
fn deliver_ready_read_ahead_failures_never_surface() {
    for chunk in [MIB, 4 * MIB] {
        let (st, ctl) = probed();
        let wal = open_on(Arc::new(st), opts(chunk));
        let specs: Vec<Spec> = (1..=8u64)
            .map(|cp| {
                if cp % 3 == 0 {
                    tiny(cp)
                } else if cp % 2 == 0 {
                    mid(cp)
                } else {
                    big(cp)
                }
            })
            .collect();
        for s in &specs {
            seal(&wal, s);
        }
        wal.checkpoint_complete(8).unwrap();
        ctl.set_driver_here();
        ctl.fail_other.store(true, Ordering::SeqCst);
        let mut sink = ProbeSink::new().passes(|_, _| Pass::Twice);
        let r = wal.deliver_ready(&mut sink);
        ctl.fail_other.store(false, Ordering::SeqCst);
        assert!(
            ctl.other_reads.load(Ordering::SeqCst) > 0,
            "chunk {chunk}: no read ahead was attempted"
        );
        let n =
            r.unwrap_or_else(|e| panic!("chunk {chunk}: a failed read ahead surfaced as {e:?}"));
        assert_eq!(n, 8);
        assert_delivered(&sink.delivered(), &specs, &format!("chunk {chunk}"));
        assert!(sink.bad().is_empty(), "{:?}", sink.bad());
        assert_eq!(
            wal.health().errors,
            0,
            "chunk {chunk}: a read-ahead failure counted as an error"
        );
    }
}

/// The driver's own reads fail while reads ahead succeed: the error is the log's (I/O), for the
/// epoch being delivered, nothing after it is delivered, and once reads work again everything
/// is delivered once.
#[test]
fn deliver_ready_driver_read_failures_report_the_logs_error_for_that_epoch() {
    let (st, ctl) = probed();
    let wal = open_on(Arc::new(st), opts(64 * KIB));
    let specs = [tiny(1), big(2), big(3), mid(4)];
    for s in &specs {
        seal(&wal, s);
    }
    wal.checkpoint_complete(4).unwrap();
    ctl.set_driver_here();
    let mut sink = ProbeSink::new();
    ctl.fail_driver.store(true, Ordering::SeqCst);
    let err = wal
        .deliver_ready(&mut sink)
        .expect_err("the driver's reads fail");
    assert!(
        matches!(err.kind(), ErrorKind::Io { .. } | ErrorKind::Corruption(_)),
        "want the log's error, got {err:?}"
    );
    let got = sink.delivered_cps();
    assert!(
        got.iter().zip(1..).all(|(&c, i)| c == i),
        "a non-prefix was delivered: {got:?}"
    );
    ctl.fail_driver.store(false, Ordering::SeqCst);
    let _ = wal.deliver_ready(&mut sink).expect("reads work again");
    assert_delivered(&sink.delivered(), &specs, "after driver read failures");
    assert!(sink.bad().is_empty(), "{:?}", sink.bad());
}

/// The n-th read of the disk fails, for every n over a delivery of mixed epochs: each error
/// is the log's, never the sink's; nothing is skipped or repeated.
#[test]
fn deliver_ready_read_fault_at_every_read_loses_and_repeats_nothing() {
    for chunk in [MIB, 64 * KIB] {
        // How many reads one delivery makes, roughly: sweep well past it.
        for nth in 0..60u64 {
            let sim = SimStorage::new();
            let wal = open_on(Arc::new(sim.clone()), opts(chunk));
            let specs = [tiny(1), big(2), mid(3), tiny(4), big(5)];
            for s in &specs {
                seal(&wal, s);
            }
            wal.checkpoint_complete(5).unwrap();
            sim.inject_fault(FaultOp::Read, nth, io::ErrorKind::Other);
            let mut sink =
                ProbeSink::new().passes(|cp, _| if cp == 2 { Pass::Twice } else { Pass::Once });
            let errs = deliver_until_ok(&wal, &mut sink, 10);
            for e in &errs {
                assert!(
                    !matches!(e.kind(), ErrorKind::Sink(_)),
                    "chunk {chunk} nth {nth}: sink's error reported: {e:?}"
                );
            }
            sim.clear_faults();
            assert_delivered(
                &sink.delivered(),
                &specs,
                &format!("chunk {chunk} nth {nth}"),
            );
            assert!(
                sink.bad().is_empty(),
                "chunk {chunk} nth {nth}: {:?}",
                sink.bad()
            );
            assert!(wal.pending().is_empty());
        }
    }
}

/// The sink fails epoch 2 while 3 was read ahead; then the engine restores from 2, voiding 3
/// and 4; then 5 and 6 are sealed and completed. deliver_ready must give 2, 5, 6.
#[test]
fn deliver_ready_restore_after_a_failure_voids_the_read_ahead() {
    for chunk in [MIB, 64 * KIB] {
        let sim = SimStorage::new();
        let wal = open_on(Arc::new(sim.clone()), opts(chunk));
        for s in [tiny(1), big(2), big(3), mid(4)] {
            seal(&wal, &s);
        }
        wal.checkpoint_complete(4).unwrap();
        let mut sink = ProbeSink::new()
            .passes(|_, _| Pass::Twice)
            .failing(|cp, a| (cp == 2 && a == 1).then(|| SinkError::retryable("2 fails once")));
        wal.deliver_ready(&mut sink).expect_err("2 fails");
        assert_eq!(sink.delivered_cps(), vec![1]);
        // Unsealed records, voided too.
        wal.append(&rec(99, 0, 64)).unwrap();
        wal.restore(Some(2)).unwrap();
        let pend: Vec<u64> = wal.pending().iter().map(|p| p.id).collect();
        assert_eq!(
            pend,
            vec![2],
            "chunk {chunk}: after restore(2) only 2 is pending"
        );
        seal(&wal, &big(5));
        seal(&wal, &mid(6));
        wal.checkpoint_complete(6).unwrap();
        wal.deliver_ready(&mut sink).unwrap();
        assert_delivered(
            &sink.delivered(),
            &[tiny(1), big(2), big(5), mid(6)],
            &format!("chunk {chunk}"),
        );
        assert!(sink.bad().is_empty(), "{:?}", sink.bad());
        assert!(wal.pending().is_empty());
    }
}

/// An empty epoch between read-ahead epochs is not sent and does not shift anything.
#[test]
fn deliver_ready_empty_epochs_between_large_ones() {
    let sim = SimStorage::new();
    let wal = open_on(Arc::new(sim.clone()), opts(64 * KIB));
    seal(&wal, &big(1));
    wal.checkpoint(2, b"empty").unwrap();
    seal(&wal, &big(3));
    wal.checkpoint(4, b"empty").unwrap();
    wal.checkpoint(5, b"empty").unwrap();
    seal(&wal, &mid(6));
    wal.checkpoint_complete(6).unwrap();
    let mut sink = ProbeSink::new().passes(|_, _| Pass::Twice);
    wal.deliver_ready(&mut sink).unwrap();
    assert_delivered(
        &sink.delivered(),
        &[big(1), big(3), mid(6)],
        "empty epochs skipped",
    );
    assert!(wal.pending().is_empty());
    assert_eq!(wal.health().committed, Some(6));
}

/// Epochs larger than the default 8 MiB read chunk, mixed with small ones, default options.
#[test]
fn deliver_ready_epochs_larger_than_the_default_8mib_chunk() {
    let sim = SimStorage::new();
    let o = Options::new("probe4")
        .segment_size(16 << 20)
        .max_record_size(2 << 20)
        .retry(fast_retry());
    let wal = open_on(Arc::new(sim.clone()), o);
    let specs = [
        Spec {
            cp: 1,
            sizes: sizes(9, MIB + 3),
        }, // > 8 MiB
        tiny(2),
        Spec {
            cp: 3,
            sizes: sizes(5, 2 * MIB - 1),
        }, // > 8 MiB
        Spec {
            cp: 4,
            sizes: sizes(80, 100 * KIB),
        }, // 7.8 MiB: one chunk
        Spec {
            cp: 5,
            sizes: sizes(1100, 8 * KIB),
        }, // 8.6 MiB, small records
    ];
    for s in &specs {
        seal(&wal, s);
    }
    wal.checkpoint_complete(5).unwrap();
    let mut sink = ProbeSink::new()
        .passes(|cp, _| {
            if cp % 2 == 1 {
                Pass::Twice
            } else {
                Pass::Records
            }
        })
        .failing(|cp, a| (cp == 3 && a == 1).then(|| SinkError::retryable("3 fails once")));
    wal.deliver_ready(&mut sink).expect_err("3 fails once");
    wal.deliver_ready(&mut sink).unwrap();
    assert_delivered(&sink.delivered(), &specs, "default chunk");
    assert!(sink.bad().is_empty(), "{:?}", sink.bad());
}

/// A sink keeps the `Bytes` of every record and a clone of every epoch past `deliver`: later
/// epochs (read ahead into pooled buffers) must never change them. A kept epoch read again
/// later gives its own records or an error, never other bytes.
#[test]
fn retained_records_and_epoch_clones_never_change() {
    struct Keeper {
        kept: Vec<(u64, u64, bytes::Bytes)>,
        epochs: Vec<Epoch>,
    }
    impl Sink for Keeper {
        fn deliver(&mut self, epoch: &Epoch) -> Result<(), SinkError> {
            for c in epoch.chunks() {
                for r in c?.records() {
                    self.kept
                        .push((r.position.checkpoint, r.position.index, r.data.clone()));
                }
            }
            self.epochs.push(epoch.clone());
            Ok(())
        }
    }
    for chunk in [MIB, 64 * KIB] {
        for driver in ["deliver_ready", "committer"] {
            let sim = SimStorage::new();
            let wal = open_on(Arc::new(sim.clone()), opts(chunk).recycle_segments(true));
            let specs: Vec<Spec> = (1..=10u64)
                .map(|cp| {
                    if cp % 3 == 0 {
                        tiny(cp)
                    } else if cp % 2 == 0 {
                        mid(cp)
                    } else {
                        big(cp)
                    }
                })
                .collect();
            let keeper = Keeper {
                kept: Vec::new(),
                epochs: Vec::new(),
            };
            let keeper = match driver {
                "deliver_ready" => {
                    let mut k = keeper;
                    for s in &specs {
                        seal(&wal, s);
                        wal.checkpoint_complete(s.cp).unwrap();
                        if s.cp % 3 == 0 {
                            wal.deliver_ready(&mut k).unwrap();
                        }
                    }
                    wal.deliver_ready(&mut k).unwrap();
                    k
                }
                _ => {
                    let shared = Arc::new(Mutex::new(keeper));
                    struct Shared(Arc<Mutex<Keeper>>);
                    impl Sink for Shared {
                        fn deliver(&mut self, e: &Epoch) -> Result<(), SinkError> {
                            self.0.lock().deliver(e)
                        }
                    }
                    let c = wal.spawn_committer(Shared(shared.clone())).unwrap();
                    for s in &specs {
                        seal(&wal, s);
                        wal.checkpoint_complete(s.cp).unwrap();
                    }
                    assert!(wal.wait_committed(10, GUARD));
                    c.shutdown();
                    Arc::try_unwrap(shared)
                        .ok()
                        .expect("committer gone")
                        .into_inner()
                }
            };
            let what = format!("chunk {chunk} {driver}");
            let total: usize = specs.iter().map(|s| s.sizes.len()).sum();
            assert_eq!(keeper.kept.len(), total, "{what}");
            for (cp, idx, data) in &keeper.kept {
                assert!(
                    rec_ok(*cp, *idx, data),
                    "{what}: kept record ({cp},{idx}) changed after delivery"
                );
            }
            for e in &keeper.epochs {
                let mut bad = Vec::new();
                // Its segments may be gone: an error is allowed, wrong bytes are not.
                if let Ok((n, _)) = read_pass(e, false, &mut bad) {
                    assert_eq!(n, e.len(), "{what}");
                }
                assert!(
                    bad.is_empty(),
                    "{what}: a kept epoch read later gave other records: {bad:?}"
                );
            }
        }
    }
}

// =============================================================================================
// Group C: the committer thread
// =============================================================================================

/// Mixed epochs through the committer thread with a slow sink that fails (retryable and
/// permanent) at several epochs and reads some epochs twice: each whole, in order, once.
#[test]
fn committer_mixed_sizes_slow_failing_sink() {
    for chunk in [MIB, 64 * KIB] {
        let sim = SimStorage::new();
        let wal = open_on(Arc::new(sim.clone()), opts(chunk));
        let sink = ProbeSink::new()
            .delay(Duration::from_millis(3))
            .passes(|cp, a| match (cp + a as u64) % 3 {
                0 => Pass::Twice,
                1 => Pass::Records,
                _ => Pass::Once,
            })
            .failing(|cp, a| match cp % 5 {
                0 if a <= 2 => Some(SinkError::retryable("r")),
                3 if a == 1 => Some(SinkError::permanent("p")),
                _ => None,
            });
        let probe = sink.clone();
        let c = wal.spawn_committer(sink).unwrap();
        let mut specs = Vec::new();
        for cp in 1..=16u64 {
            let s = match cp % 4 {
                0 => tiny(cp),
                1 => big(cp),
                2 => mid(cp),
                _ => Spec {
                    cp,
                    sizes: sizes(2, 150 * KIB),
                },
            };
            seal(&wal, &s);
            specs.push(s);
            if cp % 4 == 0 {
                wal.checkpoint_complete(cp).unwrap();
            }
        }
        assert!(
            wal.wait_committed(16, GUARD),
            "chunk {chunk}: not all committed"
        );
        c.shutdown();
        assert_delivered(
            &probe.delivered(),
            &specs,
            &format!("committer chunk {chunk}"),
        );
        assert!(probe.bad().is_empty(), "{:?}", probe.bad());
        assert!(wal.pending().is_empty());
    }
}

/// Learns the committer's thread at the gate of epoch 1, then makes it the "driver" of `ctl`.
fn learn_committer_thread(probe: &ProbeSink, g1: &Gate, ctl: &ReadCtl) {
    assert!(g1.wait_entered(), "the committer never delivered epoch 1");
    let t = probe.st.lock().thread.expect("sink thread");
    *ctl.driver.lock() = Some(t);
}

fn wait_until(what: &str, f: impl Fn() -> bool) {
    let end = Instant::now() + GUARD;
    while !f() {
        assert!(Instant::now() < end, "bounded wait ran out: {what}");
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// The committer is held inside the delivery of epoch 2 while 3 (one chunk, >= 256 KiB) is
/// being read ahead on another thread; the engine restores from 2 (voiding 3 and 4) and seals
/// 5: the committer delivers 2 then 5, never 3 or 4.
#[test]
fn committer_restore_while_a_read_ahead_is_held_voids_it() {
    for (chunk, held) in [(MIB, false), (MIB, true), (4 * MIB, true)] {
        let (st, ctl) = probed();
        let wal = open_on(Arc::new(st), opts(chunk));
        let (g1, g2) = (Gate::new(1), Gate::new(2));
        let sink = ProbeSink::new()
            .gate(g1.clone())
            .gate(g2.clone())
            .passes(|_, _| Pass::Twice);
        let probe = sink.clone();
        for s in [tiny(1), tiny(2), mid(3), big(4)] {
            seal(&wal, &s);
        }
        wal.checkpoint_complete(4).unwrap();
        let c = wal.spawn_committer(sink).unwrap();
        learn_committer_thread(&probe, &g1, &ctl);
        *ctl.hold_other.lock() = held;
        g1.open();
        assert!(g2.wait_entered(), "the committer never delivered 2");
        // 3 is read (or being read) on another thread than the committer's.
        wait_until("a read ahead of 3", || {
            ctl.other_reads.load(Ordering::SeqCst) > 0
        });
        wal.restore(Some(2)).unwrap();
        seal(&wal, &big(5));
        wal.checkpoint_complete(5).unwrap();
        ctl.release();
        g2.open();
        assert!(
            wal.wait_committed(5, GUARD),
            "chunk {chunk} held {held}: 5 never committed"
        );
        c.shutdown();
        assert_delivered(
            &probe.delivered(),
            &[tiny(1), tiny(2), big(5)],
            &format!("chunk {chunk} held {held}"),
        );
        assert!(probe.bad().is_empty(), "{:?}", probe.bad());
        let calls = probe.calls();
        assert!(
            !calls.contains(&3) && !calls.contains(&4),
            "a voided epoch was offered: {calls:?}"
        );
    }
}

/// `Committer::shutdown` while the sink is inside epoch 2 and the read ahead of epoch 3 is
/// held inside the disk: shutdown returns after epoch 2, marks it, and a new deliverer
/// delivers the rest, each epoch once.
#[test]
fn committer_shutdown_with_a_read_ahead_in_flight_then_the_rest_once() {
    for chunk in [MIB, 4 * MIB] {
        let (st, ctl) = probed();
        let wal = Arc::new(open_on(Arc::new(st), opts(chunk)));
        let (g1, g2) = (Gate::new(1), Gate::new(2));
        let sink = ProbeSink::new().gate(g1.clone()).gate(g2.clone());
        let probe = sink.clone();
        let specs = [tiny(1), tiny(2), mid(3), mid(4), big(5)];
        for s in &specs {
            seal(&wal, s);
        }
        wal.checkpoint_complete(5).unwrap();
        let c = wal.spawn_committer(sink).unwrap();
        learn_committer_thread(&probe, &g1, &ctl);
        *ctl.hold_other.lock() = true; // reads ahead now wait inside the disk
        g1.open();
        assert!(g2.wait_entered());
        wait_until("the read ahead of 3 held in the disk", || {
            ctl.held_now.load(Ordering::SeqCst) > 0
        });
        let done = Arc::new(AtomicBool::new(false));
        let d2 = done.clone();
        let t = std::thread::spawn(move || {
            c.shutdown();
            d2.store(true, Ordering::SeqCst);
        });
        g2.open();
        ctl.release();
        t.join().unwrap();
        assert!(done.load(Ordering::SeqCst));
        let before = probe.delivered_cps();
        assert!(before.starts_with(&[1, 2]), "chunk {chunk}: {before:?}");
        let committed = wal.health().committed;
        assert_eq!(
            committed,
            before.last().copied(),
            "chunk {chunk}: shutdown marks what it delivered"
        );
        let mut rest = probe.clone();
        wal.deliver_ready(&mut rest).expect("the next deliverer");
        assert_delivered(&probe.delivered(), &specs, &format!("chunk {chunk}"));
        assert!(probe.bad().is_empty(), "{:?}", probe.bad());
        assert!(wal.pending().is_empty());
    }
}

/// Read faults at many points while the committer delivers large epochs: every epoch once, in
/// order; the errors counted in health are the log's.
#[test]
fn committer_read_faults_are_retried_and_nothing_is_lost_or_repeated() {
    for seed in [11u64, 12, 13] {
        let sim = SimStorage::new();
        let wal = open_on(Arc::new(sim.clone()), opts(64 * KIB));
        let mut rng = fastrand::Rng::with_seed(seed);
        let specs: Vec<Spec> = (1..=12u64)
            .map(|cp| match rng.u8(0..3) {
                0 => tiny(cp),
                1 => mid(cp),
                _ => big(cp),
            })
            .collect();
        for s in &specs {
            seal(&wal, s);
        }
        for _ in 0..6 {
            sim.inject_fault(FaultOp::Read, rng.u64(0..80), io::ErrorKind::Other);
        }
        let sink =
            ProbeSink::new().passes(|cp, _| if cp % 2 == 0 { Pass::Twice } else { Pass::Once });
        let probe = sink.clone();
        let c = wal.spawn_committer(sink).unwrap();
        wal.checkpoint_complete(12).unwrap();
        assert!(wal.wait_committed(12, GUARD), "seed {seed}");
        c.shutdown();
        assert_delivered(&probe.delivered(), &specs, &format!("seed {seed}"));
        assert!(probe.bad().is_empty(), "{:?}", probe.bad());
    }
}

// =============================================================================================
// Group D: crashes, kills, reopen
// =============================================================================================

/// The simulated process is killed after n mutating operations while deliver_ready (or the
/// committer) delivers large epochs into a marker sink; after the crash a reopened log delivers
/// the rest: every epoch exactly once, in order.
#[test]
fn sim_kill_mid_delivery_then_reopen_delivers_the_rest_exactly_once() {
    for use_committer in [false, true] {
        for kill_after in [0u64, 1, 2, 3, 5, 8, 13] {
            for power in [false, true] {
                let sim = SimStorage::new();
                let o = opts(64 * KIB).mark_every(if kill_after % 2 == 0 { 1 } else { 3 });
                let wal = open_on(Arc::new(sim.clone()), o.clone());
                let specs: Vec<Spec> = (1..=8u64)
                    .map(|cp| {
                        if cp % 3 == 0 {
                            tiny(cp)
                        } else if cp % 2 == 0 {
                            mid(cp)
                        } else {
                            big(cp)
                        }
                    })
                    .collect();
                for s in &specs {
                    seal(&wal, s);
                }
                wal.checkpoint_complete(8).unwrap();
                let mut sink = ProbeSink::new();
                sink.marker = true;
                let probe = sink.clone();
                sim.kill_after(kill_after);
                if use_committer {
                    let c = wal.spawn_committer(sink.clone()).unwrap();
                    let end = Instant::now() + Duration::from_secs(5);
                    while !sim.is_dead()
                        && Instant::now() < end
                        && !wal.wait_committed(8, Duration::from_millis(5))
                    {}
                    drop(c);
                } else {
                    let _ = wal.deliver_ready(&mut sink);
                }
                drop(wal);
                sim.crash(if power {
                    CrashOptions::power_loss(kill_after)
                } else {
                    CrashOptions::process_kill()
                });
                let what = format!("committer {use_committer} kill {kill_after} power {power}");
                let wal = open_on(Arc::new(sim.clone()), o);
                // Completions are forgotten across a restart: the engine completes again.
                wal.checkpoint_complete(8).unwrap();
                let mut sink2 = probe.clone();
                deliver_until_ok(&wal, &mut sink2, 10);
                assert_delivered(&probe.delivered(), &specs, &what);
                assert!(probe.bad().is_empty(), "{what}: {:?}", probe.bad());
                assert!(wal.pending().is_empty(), "{what}");
            }
        }
    }
}

/// A real directory: a committer delivers large epochs into a DirSink with a slow disk-side
/// sink; the handle and committer are dropped mid-delivery without shutdown; reopened, the
/// rest is delivered: the target holds every record exactly once.
#[test]
fn tempdir_drop_mid_delivery_then_reopen_target_holds_everything_once() {
    struct Slow(DirSink, Duration);
    impl Sink for Slow {
        fn deliver(&mut self, e: &Epoch) -> Result<(), SinkError> {
            std::thread::sleep(self.1);
            self.0.deliver(e)
        }
        fn stores_marker(&self) -> bool {
            self.0.stores_marker()
        }
        fn is_committed(&mut self, k: &walsink::EpochKey) -> Result<bool, SinkError> {
            self.0.is_committed(k)
        }
    }
    let dir = tempfile::tempdir().unwrap();
    let wal_dir = dir.path().join("wal");
    let out = dir.path().join("out");
    let o = Options::new("probe4")
        .segment_size(2 << 20)
        .max_record_size(1 << 20)
        .read_chunk_size(128 * KIB)
        .retry(fast_retry());
    let specs: Vec<Spec> = (1..=10u64)
        .map(|cp| {
            if cp % 3 == 0 {
                tiny(cp)
            } else if cp % 2 == 0 {
                mid(cp)
            } else {
                big(cp)
            }
        })
        .collect();
    {
        let (wal, _) = WalSink::open(&wal_dir, o.clone()).unwrap();
        for s in &specs {
            seal(&wal, s);
        }
        let c = wal
            .spawn_committer(Slow(DirSink::new(&out).unwrap(), Duration::from_millis(20)))
            .unwrap();
        wal.checkpoint_complete(10).unwrap();
        assert!(wal.wait_committed(3, GUARD));
        drop(wal);
        drop(c);
    }
    let (wal, report) = WalSink::open(&wal_dir, o).unwrap();
    let mut sink = DirSink::new(&out).unwrap();
    // Completions are forgotten across a reopen: the engine restores from its last checkpoint.
    wal.restore(Some(10)).unwrap();
    let _ = report;
    wal.deliver_ready(&mut sink).unwrap();
    assert!(wal.pending().is_empty());
    let got = DirSink::read_records(&out).unwrap();
    let mut want = Vec::new();
    for s in &specs {
        for (i, &l) in s.sizes.iter().enumerate() {
            want.push(rec(s.cp, i as u64, l));
        }
    }
    assert_eq!(got.len(), want.len(), "records in the target");
    assert!(
        got == want,
        "the target does not hold every record exactly once, in order"
    );
}

// =============================================================================================
// Group E: random rounds against a model
// =============================================================================================

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum St {
    Sealed,
    Deliverable,
    Voided,
    Committed,
}

struct Model {
    epochs: BTreeMap<u64, (Spec, St)>,
    next_id: u64,
    delivered: Vec<Spec>,
}

impl Model {
    fn deliverable(&self) -> Vec<Spec> {
        self.epochs
            .values()
            .filter(|(_, s)| *s == St::Deliverable)
            .map(|(sp, _)| sp.clone())
            .collect()
    }
    fn complete(&mut self, id: u64) {
        for (cp, (_, s)) in self.epochs.iter_mut() {
            if *cp <= id && *s == St::Sealed {
                *s = St::Deliverable;
            }
        }
    }
    fn restore(&mut self, id: Option<u64>) {
        for (cp, (_, s)) in self.epochs.iter_mut() {
            let above = id.is_none_or(|k| *cp > k);
            if above && matches!(*s, St::Sealed | St::Deliverable) {
                *s = St::Voided;
            } else if !above && *s == St::Sealed {
                *s = St::Deliverable;
            }
        }
    }
    fn pending(&self) -> Vec<u64> {
        self.epochs
            .iter()
            .filter(|(_, (_, s))| matches!(s, St::Sealed | St::Deliverable))
            .map(|(c, _)| *c)
            .collect()
    }
}

fn random_spec(rng: &mut fastrand::Rng, cp: u64) -> Spec {
    let sizes = match rng.u8(0..10) {
        0..=2 => (0..rng.usize(1..5)).map(|_| rng.usize(20..400)).collect(),
        3..=5 => (0..rng.usize(8..30))
            .map(|_| rng.usize(9 * KIB..40 * KIB))
            .collect(),
        6..=8 => (0..rng.usize(6..40))
            .map(|_| rng.usize(20 * KIB..100 * KIB))
            .collect(),
        _ => (0..rng.usize(1..4))
            .map(|_| rng.usize(300 * KIB..900 * KIB))
            .collect(),
    };
    Spec { cp, sizes }
}

/// Seeds 1..=12: random epoch sizes (tiny to multi-chunk), completions, restores (with unsealed
/// records), sink failures at a random offer and random read faults, driven by deliver_ready;
/// after each call the delivered sequence must be a prefix of the model's deliverable epochs
/// (the whole of it on Ok), `pending()` must match the model, and at the end the sink holds
/// exactly the model's sequence.
#[test]
fn random_rounds_deliver_ready_against_the_model() {
    for seed in 1..=12u64 {
        let mut rng = fastrand::Rng::with_seed(seed);
        let (st, ctl) = probed();
        let sim = st.inner.clone();
        let wal = open_on(
            Arc::new(st),
            opts(if seed % 2 == 0 { 64 * KIB } else { 256 * KIB }),
        );
        ctl.set_driver_here();
        let fail_at = Arc::new(AtomicU64::new(u64::MAX));
        let offers = Arc::new(AtomicU64::new(0));
        let (fa, of) = (fail_at.clone(), offers.clone());
        let permanent = seed % 3 == 0;
        let mut sink = ProbeSink::new()
            .passes(move |cp, a| match (cp * 7 + a as u64 + seed) % 4 {
                0 => Pass::Twice,
                1 => Pass::Records,
                2 => Pass::Skip,
                _ => Pass::Once,
            })
            .failing(move |_, _| {
                let n = of.fetch_add(1, Ordering::SeqCst);
                (n == fa.load(Ordering::SeqCst)).then(|| {
                    if permanent {
                        SinkError::permanent("model: injected")
                    } else {
                        SinkError::retryable("model: injected")
                    }
                })
            });
        let mut m = Model {
            epochs: BTreeMap::new(),
            next_id: 1,
            delivered: Vec::new(),
        };
        for round in 0..40 {
            let what = format!("seed {seed} round {round}");
            match rng.u8(0..10) {
                0..=3 => {
                    let cp = m.next_id + rng.u64(0..3);
                    m.next_id = cp + 1;
                    let s = random_spec(&mut rng, cp);
                    seal(&wal, &s);
                    m.epochs.insert(cp, (s, St::Sealed));
                }
                4 | 5 => {
                    if let Some(&last) = m.epochs.keys().last() {
                        let id = if rng.bool() { last } else { rng.u64(1..=last) };
                        wal.checkpoint_complete(id).unwrap();
                        m.complete(id);
                    }
                }
                6 => {
                    if rng.bool() {
                        wal.append(&rec(777, 0, 50)).unwrap();
                    }
                    let ids: Vec<u64> = m.epochs.keys().copied().collect();
                    let id = if ids.is_empty() || rng.u8(0..5) == 0 {
                        None
                    } else {
                        Some(ids[rng.usize(0..ids.len())])
                    };
                    wal.restore(id).unwrap();
                    m.restore(id);
                }
                _ => {
                    let want = m.deliverable();
                    let before = sink.delivered().len();
                    let inject_sink = rng.bool() && !want.is_empty();
                    if inject_sink {
                        fail_at.store(
                            offers.load(Ordering::SeqCst) + rng.u64(0..want.len() as u64),
                            Ordering::SeqCst,
                        );
                    }
                    let read_fault = rng.u8(0..4) == 0;
                    if read_fault {
                        sim.inject_fault(FaultOp::Read, rng.u64(0..30), io::ErrorKind::Other);
                    }
                    if rng.u8(0..4) == 0 {
                        ctl.fail_other.store(true, Ordering::SeqCst);
                    }
                    let r = wal.deliver_ready(&mut sink);
                    ctl.fail_other.store(false, Ordering::SeqCst);
                    fail_at.store(u64::MAX, Ordering::SeqCst);
                    sim.clear_faults();
                    let got = sink.delivered()[before..].to_vec();
                    assert!(
                        got.len() <= want.len(),
                        "{what}: more delivered than deliverable"
                    );
                    assert_delivered(&got, &want[..got.len()], &what);
                    match &r {
                        Ok(n) => {
                            assert_eq!(
                                got.len(),
                                want.len(),
                                "{what}: Ok but not everything delivered"
                            );
                            assert_eq!(*n, want.len(), "{what}: count");
                        }
                        Err(e) => {
                            if !inject_sink {
                                assert!(
                                    !matches!(e.kind(), ErrorKind::Sink(_)),
                                    "{what}: the sink's own error surfaced: {e:?}"
                                );
                            }
                        }
                    }
                    for s in &got {
                        m.epochs.get_mut(&s.cp).unwrap().1 = St::Committed;
                        m.delivered.push(m.epochs[&s.cp].0.clone());
                    }
                }
            }
            let pend: Vec<u64> = wal.pending().iter().map(|p| p.id).collect();
            assert_eq!(pend, m.pending(), "{what}: pending()");
            assert!(sink.bad().is_empty(), "{what}: {:?}", sink.bad());
        }
        // Finish: everything sealed becomes deliverable and is delivered.
        if let Some(&last) = m.epochs.keys().last() {
            wal.checkpoint_complete(last).unwrap();
            m.complete(last);
        }
        let want = m.deliverable();
        let before = sink.delivered().len();
        deliver_until_ok(&wal, &mut sink, 5);
        assert_delivered(
            &sink.delivered()[before..],
            &want,
            &format!("seed {seed} final"),
        );
        m.delivered.extend(want);
        assert_delivered(
            &sink.delivered(),
            &m.delivered,
            &format!("seed {seed} whole run"),
        );
        assert!(wal.pending().is_empty());
    }
}

/// Seeds 101..=106: the committer thread with random sizes and a sink failing at random offers
/// (decided from the seed), restores only at quiescent points; the whole delivered sequence
/// equals the model's.
#[test]
fn random_rounds_committer_against_the_model() {
    for seed in 101..=106u64 {
        let mut rng = fastrand::Rng::with_seed(seed);
        let sim = SimStorage::new();
        let wal = open_on(
            Arc::new(sim.clone()),
            opts(if seed % 2 == 0 { 64 * KIB } else { MIB }),
        );
        let sink = ProbeSink::new()
            .passes(move |cp, a| {
                if (cp + a as u64 + seed).is_multiple_of(3) {
                    Pass::Twice
                } else {
                    Pass::Once
                }
            })
            .failing(move |cp, a| {
                let h = (cp.wrapping_mul(0x9e37_79b9) ^ seed.wrapping_mul(31) ^ a as u64) % 5;
                (a <= 2 && h == 0).then(|| SinkError::retryable("seeded"))
            });
        let probe = sink.clone();
        let c = wal.spawn_committer(sink).unwrap();
        let mut m = Model {
            epochs: BTreeMap::new(),
            next_id: 1,
            delivered: Vec::new(),
        };
        for round in 0..30 {
            match rng.u8(0..6) {
                0..=2 => {
                    let cp = m.next_id + rng.u64(0..2);
                    m.next_id = cp + 1;
                    let s = random_spec(&mut rng, cp);
                    seal(&wal, &s);
                    m.epochs.insert(cp, (s, St::Sealed));
                }
                3 | 4 => {
                    if let Some(&last) = m.epochs.keys().last() {
                        wal.checkpoint_complete(last).unwrap();
                        m.complete(last);
                        let due = m.deliverable();
                        for s in &due {
                            m.epochs.get_mut(&s.cp).unwrap().1 = St::Committed;
                            m.delivered.push(s.clone());
                        }
                        if let Some(t) = due.last() {
                            assert!(wal.wait_committed(t.cp, GUARD), "seed {seed} round {round}");
                        }
                    }
                }
                _ => {
                    let ids: Vec<u64> = m.epochs.keys().copied().collect();
                    let committed = m
                        .epochs
                        .iter()
                        .filter(|(_, (_, s))| *s == St::Committed)
                        .map(|(c, _)| *c)
                        .max();
                    let id = if ids.is_empty() {
                        None
                    } else {
                        Some(ids[rng.usize(0..ids.len())])
                    };
                    let id = id.max(committed);
                    wal.restore(id).unwrap();
                    m.restore(id);
                    // Restore made everything up to its id deliverable: wait for it.
                    let due = m.deliverable();
                    for s in &due {
                        m.epochs.get_mut(&s.cp).unwrap().1 = St::Committed;
                        m.delivered.push(s.clone());
                    }
                    if let Some(t) = due.last() {
                        assert!(wal.wait_committed(t.cp, GUARD), "seed {seed} round {round}");
                    }
                }
            }
            assert_eq!(
                wal.pending().iter().map(|p| p.id).collect::<Vec<_>>(),
                m.pending(),
                "seed {seed} round {round}: pending()"
            );
        }
        c.shutdown();
        assert_delivered(
            &probe.delivered(),
            &m.delivered,
            &format!("committer seed {seed}"),
        );
        assert!(probe.bad().is_empty(), "{:?}", probe.bad());
    }
}

// =============================================================================================
// Group F: memory bound (child process with a counting allocator)
// =============================================================================================

const CHILD_ENV: &str = "WALSINK_PROBE4_MEM_CHILD";

fn run_in_child(test: &str) -> bool {
    if std::env::var(CHILD_ENV).is_ok() {
        return false;
    }
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            &crate::support::test_path(module_path!(), test),
            "--exact",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD_ENV, "1")
        .output()
        .unwrap();
    let text = format!(
        "{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    eprintln!("{text}");
    assert!(out.status.success(), "child {test} failed:\n{text}");
    assert!(
        text.contains("1 passed"),
        "child did not run {test}:\n{text}"
    );
    true
}

fn measure<T>(f: impl FnOnce() -> T) -> (T, usize) {
    let base = CUR.load(Ordering::SeqCst);
    PEAK.store(base, Ordering::SeqCst);
    let t = f();
    (t, PEAK.load(Ordering::SeqCst).saturating_sub(base))
}

/// Delivery of 12 MiB epochs read in 1 MiB chunks, through deliver_ready and the committer,
/// with a sink that reads chunk by chunk slowly: the peak of heap memory during delivery stays
/// far below one whole epoch (two epochs' chunks and the pool are a few MiB). Also repeated
/// deliver_ready calls that fail on a tiny epoch before a 900 KiB one: reads ahead must not
/// pile up.
#[test]
fn memory_stays_bounded_during_read_ahead() {
    if run_in_child("memory_stays_bounded_during_read_ahead") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let o = Options::new("probe4mem")
        .segment_size(32 << 20)
        .max_record_size(1 << 20)
        .read_chunk_size(MIB)
        .recycle_segments(false)
        .retry(fast_retry());
    let (wal, _) = WalSink::open(dir.path().join("wal"), o).unwrap();
    let big12 = |cp: u64| Spec {
        cp,
        sizes: sizes(48, 256 * KIB),
    };
    for cp in 1..=5 {
        seal(&wal, &big12(cp));
    }
    wal.checkpoint_complete(5).unwrap();
    struct ChunkSink(u64, Vec<String>);
    impl Sink for ChunkSink {
        fn deliver(&mut self, e: &Epoch) -> Result<(), SinkError> {
            let mut idx = 0;
            for c in e.chunks() {
                for r in c?.records() {
                    if !rec_ok(e.checkpoint(), idx, &r.data) {
                        self.1.push(format!("{} {idx}", e.checkpoint()));
                    }
                    idx += 1;
                }
                std::thread::sleep(Duration::from_millis(2));
            }
            self.0 += 1;
            Ok(())
        }
    }
    let mut sink = ChunkSink(0, Vec::new());
    let (r, peak) = measure(|| wal.deliver_ready(&mut sink));
    r.unwrap();
    assert_eq!(sink.0, 5);
    assert!(sink.1.is_empty());
    eprintln!("deliver_ready peak heap growth: {peak} bytes");
    assert!(
        peak < 8 * MIB,
        "deliver_ready: peak heap growth {peak} bytes for 12 MiB epochs in 1 MiB chunks"
    );

    for cp in 6..=10 {
        seal(&wal, &big12(cp));
    }
    let (_, peak) = measure(|| {
        let c = wal.spawn_committer(ChunkSink(0, Vec::new())).unwrap();
        wal.checkpoint_complete(10).unwrap();
        assert!(wal.wait_committed(10, GUARD));
        c.shutdown();
    });
    eprintln!("committer peak heap growth: {peak} bytes");
    assert!(
        peak < 10 * MIB,
        "committer: peak heap growth {peak} bytes for 12 MiB epochs in 1 MiB chunks"
    );

    seal(&wal, &tiny(11));
    seal(
        &wal,
        &Spec {
            cp: 12,
            sizes: sizes(9, 100 * KIB),
        },
    );
    wal.checkpoint_complete(12).unwrap();
    let mut failing =
        ProbeSink::new().failing(|cp, _| (cp == 11).then(|| SinkError::retryable("always")));
    let (_, peak) = measure(|| {
        for _ in 0..30 {
            wal.deliver_ready(&mut failing).expect_err("11 fails");
        }
    });
    eprintln!("30 failing deliver_ready peak heap growth: {peak} bytes");
    assert!(
        peak < 6 * MIB,
        "failing deliver_ready calls: peak heap growth {peak} bytes"
    );
}

// =============================================================================================
// Group G: more attacks on the read-ahead's identity check and on durable-buffer mode
// =============================================================================================

/// A read ahead from another log (same sink id, same salt seed, same ids and epoch shapes, other
/// bytes) handed to `read_or_take`: the docs promise it is used only when it holds `p` "read
/// from the same place in the log"; another log's epoch must not be passed off.
///
/// DEFECT (observed, kept failing): in all three variants log B's `read_or_take` returns log
/// A's epoch (A's records, A's key with A's sink id). A misuse of the public API by a driver of
/// several logs, but the documented identity check does not catch it.
#[test]
fn api_read_ahead_of_another_log_is_not_passed_off() {
    // (same salt seed, log B's sink id): a twin log; random salts; another sink id.
    let mut passed_off = Vec::new();
    for (salt, id_b) in [(true, "probe4"), (false, "probe4"), (false, "other-sink")] {
        let what = format!("salt seed {salt} sink id of B {id_b}");
        let oa = if salt {
            opts(MIB).salt_seed(1)
        } else {
            opts(MIB)
        };
        let mut ob = oa.clone();
        ob.sink_id = id_b.to_string();
        let (sim_a, sim_b) = (SimStorage::new(), SimStorage::new());
        let wal_a = open_on(Arc::new(sim_a.clone()), oa);
        let wal_b = open_on(Arc::new(sim_b.clone()), ob);
        let seal_with = |wal: &WalSink, cp: u64, tag: u64, n: usize, len: usize| {
            for i in 0..n {
                wal.append(&rec(cp + tag, i as u64, len)).unwrap();
            }
            wal.checkpoint(cp, b"same").unwrap();
        };
        for (wal, tag) in [(&wal_a, 0u64), (&wal_b, 1000)] {
            seal_with(wal, 1, tag, 3, 40);
            seal_with(wal, 2, tag, 20, 20 * KIB);
            wal.checkpoint_complete(2).unwrap();
        }
        let mut da = wal_a.deliverer().unwrap();
        let pa1 = expect_deliver(&mut da);
        let ahead_a2 = da
            .read_ahead(&pa1)
            .expect("A's epoch 2 is read ahead")
            .read();
        let mut db = wal_b.deliverer().unwrap();
        let pb1 = expect_deliver(&mut db);
        let e1 = db.read_or_take(&pb1, None).unwrap();
        db.finish(pb1, &e1, Ok(())).unwrap();
        drop(e1);
        let pb2 = expect_deliver(&mut db);
        let e2 = db.read_or_take(&pb2, Some(ahead_a2)).unwrap();
        let first = e2.records().next().expect("a record").unwrap();
        let tag_cp = u64::from_le_bytes(first.data[0..8].try_into().unwrap());
        let got = (tag_cp, e2.key().sink_id.to_string());
        if got != (1002, id_b.to_string()) {
            passed_off.push(format!(
                "{what}: got (first record's id tag, key sink id) = {got:?}, want (1002, {id_b:?})"
            ));
        }
        db.finish(pb2, &e2, Ok(())).unwrap();
    }
    assert!(
        passed_off.is_empty(),
        "log B's read_or_take(p = B's epoch 2, ahead = A's epoch 2) returned log A's epoch:\n{}",
        passed_off.join("\n")
    );
}

/// Durable-buffer mode: four writers append batches of about 320 KiB concurrently (each sync
/// seals an automatic epoch, most above READ_AHEAD_MIN_BYTES) while the committer delivers
/// with read-ahead and a sink that fails now and then: per writer, every record arrives once, in
/// order, whole.
#[test]
fn durable_mode_concurrent_writers_committer_read_ahead_every_record_once_in_order() {
    #[derive(Default)]
    struct Seen {
        next: HashMap<u64, u64>,
        bad: Vec<String>,
        records: u64,
        tries: u64,
    }
    struct PerWriter(Arc<Mutex<Seen>>);
    impl Sink for PerWriter {
        fn deliver(&mut self, e: &Epoch) -> Result<(), SinkError> {
            let mut s = self.0.lock();
            s.tries += 1;
            if s.tries % 7 == 3 {
                return Err(SinkError::retryable("now and then"));
            }
            // Check first, apply only when the whole epoch read fine.
            let mut next = s.next.clone();
            let mut n = 0;
            let mut bad = Vec::new();
            for c in e.chunks() {
                let c = c?;
                for r in c.records() {
                    let w = u64::from_le_bytes(r.data[0..8].try_into().unwrap());
                    let q = u64::from_le_bytes(r.data[8..16].try_into().unwrap());
                    let want = next.entry(w).or_insert(0);
                    if q != *want || !rec_ok(w, q, &r.data) {
                        bad.push(format!(
                            "writer {w}: got seq {q}, want {want} (epoch {})",
                            e.checkpoint()
                        ));
                    }
                    *want = q + 1;
                    n += 1;
                }
            }
            s.next = next;
            s.records += n;
            s.bad.extend(bad);
            Ok(())
        }
    }
    let sim = SimStorage::new();
    let o = opts(MIB).mode(walsink::Mode::Durable).segment_size(8 << 20);
    let wal = Arc::new(open_on(Arc::new(sim.clone()), o));
    let seen = Arc::new(Mutex::new(Seen::default()));
    let c = wal.spawn_committer(PerWriter(seen.clone())).unwrap();
    let (writers, batches, per_batch) = (4u64, 12u64, 20u64);
    std::thread::scope(|sc| {
        for w in 0..writers {
            let wal = wal.clone();
            sc.spawn(move || {
                for b in 0..batches {
                    let recs: Vec<Vec<u8>> = (0..per_batch)
                        .map(|i| rec(w, b * per_batch + i, 16 * KIB))
                        .collect();
                    wal.append_batch(recs.iter().map(|r| r.as_slice())).unwrap();
                }
            });
        }
    });
    let total = writers * batches * per_batch;
    wait_until("every durable record delivered", || {
        seen.lock().records >= total && wal.pending().is_empty()
    });
    c.shutdown();
    let s = seen.lock();
    assert!(s.bad.is_empty(), "{:?}", &s.bad[..s.bad.len().min(10)]);
    assert_eq!(s.records, total, "records delivered");
    for w in 0..writers {
        assert_eq!(s.next.get(&w), Some(&(batches * per_batch)), "writer {w}");
    }
    let h = wal.health();
    assert_eq!(h.delivered_records, total, "health().delivered_records");
}

/// Sync drivers with an epoch read ahead whole (7 MiB, one 8 MiB chunk) behind an epoch whose
/// sink always fails: 30 failing deliver_ready calls in a row, and the committer thread
/// retrying for a second, keep heap growth under three epochs' worth.
#[test]
fn memory_sync_drivers_failing_calls_do_not_pile_reads_ahead_up() {
    if run_in_child("memory_sync_drivers_failing_calls_do_not_pile_reads_ahead_up") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let o = Options::new("probe4mem2")
        .segment_size(32 << 20)
        .max_record_size(1 << 20)
        .recycle_segments(false)
        .retry(RetryPolicy::new(
            Duration::from_millis(1),
            Duration::from_millis(2),
        ));
    let (wal, _) = WalSink::open(dir.path().join("wal"), o).unwrap();
    seal(&wal, &tiny(1));
    seal(
        &wal,
        &Spec {
            cp: 2,
            sizes: sizes(28, 256 * KIB),
        },
    );
    wal.checkpoint_complete(2).unwrap();
    let mut failing =
        ProbeSink::new().failing(|cp, _| (cp == 1).then(|| SinkError::retryable("always")));
    let (_, peak) = measure(|| {
        for _ in 0..30 {
            wal.deliver_ready(&mut failing).expect_err("1 fails");
        }
    });
    eprintln!("sync: 30 failing deliver_ready: peak heap growth {peak} bytes");
    assert!(
        peak < 21 * MIB,
        "30 failing deliver_ready calls: peak heap growth {peak} bytes (epoch 2 is 7 MiB)"
    );
    let probe = failing.clone();
    let before = probe.calls().len();
    let (_, peak) = measure(|| {
        let c = wal.spawn_committer(failing).unwrap();
        assert!(!wal.wait_committed(1, Duration::from_secs(1)));
        c.shutdown();
    });
    let tries = probe.calls().len() - before;
    eprintln!("sync committer, {tries} failed tries: peak heap growth {peak} bytes");
    assert!(tries >= 5);
    assert!(
        peak < 21 * MIB,
        "committer retries: peak heap growth {peak} bytes (epoch 2 is 7 MiB)"
    );
}
