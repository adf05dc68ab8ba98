//! Delivery's read-ahead through walsink-tokio's drivers (`deliver_ready` and
//! `spawn_committer` / `AsyncCommitter`), which read the next epoch on tokio's blocking pool
//! while the sink takes one: each epoch whole, in checkpoint order, completed by the sink
//! exactly once without a crash (an epoch whose `deliver` future was dropped never completed,
//! so it may be offered again); errors are the log's when a read fails; a dropped future or a
//! failed call never locks the next deliverer out; reads ahead do not pile up in memory across
//! calls; restores void what was read ahead; a crash after a shutdown cut short loses nothing
//! with a marker sink. Random choices use fastrand with the fixed seeds named in each test.
//! Timeouts are hang guards or the cancellation under test, never a pass criterion by
//! themselves. The memory tests re-run themselves in a child process; the counting global
//! allocator below is the whole test binary's, and its counts are read only in that child.

use parking_lot::Mutex;
use std::alloc::{GlobalAlloc, Layout, System};
use std::collections::HashMap;
use std::io;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;
use walsink::storage::{CrashOptions, FaultOp, SimStorage};
use walsink::{
    Epoch, EpochKey, ErrorKind, Options, RetryPolicy, SinkError, SinkErrorClass, WalSink,
};
use walsink_tokio::{deliver_ready, spawn_committer, AsyncChunks, AsyncSink};

// ---------------------------------------------------------------------------------------------
// Counting allocator (meaningful only in the memory child process)
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
// Records and epochs
// ---------------------------------------------------------------------------------------------

const KIB: usize = 1 << 10;
const MIB: usize = 1 << 20;
const GUARD: Duration = Duration::from_secs(120);

fn pattern(cp: u64, idx: u64) -> u8 {
    (cp.wrapping_mul(31) ^ idx.wrapping_mul(7) ^ 0x5a) as u8
}

fn rec(cp: u64, idx: u64, len: usize) -> Vec<u8> {
    let mut v = vec![pattern(cp, idx); len];
    v[0..8].copy_from_slice(&cp.to_le_bytes());
    v[8..16].copy_from_slice(&idx.to_le_bytes());
    v[16..20].copy_from_slice(&(len as u32).to_le_bytes());
    v
}

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

#[derive(Clone, Debug)]
struct Spec {
    cp: u64,
    sizes: Vec<usize>,
}

fn digest_of(sizes: impl IntoIterator<Item = usize>) -> u64 {
    sizes.into_iter().fold(0xcbf2_9ce4_8422_2325u64, |h, l| {
        (h ^ l as u64).wrapping_mul(0x100_0000_01b3)
    })
}

fn seal(wal: &WalSink, s: &Spec) {
    for (i, &l) in s.sizes.iter().enumerate() {
        wal.append(&rec(s.cp, i as u64, l)).unwrap();
    }
    wal.checkpoint(s.cp, format!("meta-{}", s.cp).as_bytes())
        .unwrap();
}

fn tiny(cp: u64) -> Spec {
    Spec {
        cp,
        sizes: vec![40, 100, 33],
    }
}
fn mid(cp: u64) -> Spec {
    Spec {
        cp,
        sizes: vec![20 * KIB; 20],
    }
}
fn big(cp: u64) -> Spec {
    Spec {
        cp,
        sizes: vec![30 * KIB + 7; 40],
    }
}
fn mixed(n: u64) -> Vec<Spec> {
    (1..=n)
        .map(|cp| {
            if cp % 3 == 0 {
                tiny(cp)
            } else if cp % 2 == 0 {
                mid(cp)
            } else {
                big(cp)
            }
        })
        .collect()
}

fn opts(chunk: usize) -> Options {
    Options::new("probe4a")
        .segment_size(4 << 20)
        .max_record_size(1 << 20)
        .read_chunk_size(chunk)
        .retry(RetryPolicy::new(
            Duration::from_millis(1),
            Duration::from_millis(4),
        ))
}

fn open(sim: &SimStorage, o: Options) -> Arc<WalSink> {
    Arc::new(
        WalSink::open_with_storage(Arc::new(sim.clone()), o)
            .unwrap()
            .0,
    )
}

// ---------------------------------------------------------------------------------------------
// The async probe sink
// ---------------------------------------------------------------------------------------------

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Pass {
    Once,
    Twice,
    Skip,
}

#[derive(Default)]
struct State {
    attempts: HashMap<u64, u32>,
    calls: Vec<u64>,
    /// (checkpoint, records, digest or None when not read), on each completed Ok.
    done: Vec<(u64, u64, Option<u64>)>,
    bad: Vec<String>,
    read_errors: u64,
}

type FailFn = dyn Fn(u64, u32) -> Option<SinkError> + Send + Sync;

#[derive(Clone)]
struct Probe {
    st: Arc<Mutex<State>>,
    fail: Arc<FailFn>,
    pass: Arc<dyn Fn(u64) -> Pass + Send + Sync>,
    /// Sleep per chunk read, and once per epoch.
    delay: Duration,
    marker: bool,
}

impl Probe {
    fn new() -> Self {
        Probe {
            st: Arc::default(),
            fail: Arc::new(|_, _| None),
            pass: Arc::new(|_| Pass::Once),
            delay: Duration::ZERO,
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
    fn passes(mut self, f: impl Fn(u64) -> Pass + Send + Sync + 'static) -> Self {
        self.pass = Arc::new(f);
        self
    }
    fn slow(mut self, d: Duration) -> Self {
        self.delay = d;
        self
    }
    fn done(&self) -> Vec<(u64, u64, Option<u64>)> {
        self.st.lock().done.clone()
    }
    fn done_cps(&self) -> Vec<u64> {
        self.st.lock().done.iter().map(|d| d.0).collect()
    }
    fn bad(&self) -> Vec<String> {
        self.st.lock().bad.clone()
    }
}

async fn read_once(
    epoch: &Epoch,
    delay: Duration,
    bad: &mut Vec<String>,
) -> Result<(u64, u64), String> {
    let cp = epoch.checkpoint();
    let mut it = AsyncChunks::new(epoch);
    let mut next = 0u64;
    let mut lens = Vec::new();
    while let Some(c) = it.next().await {
        let c = c.map_err(|e| e.to_string())?;
        if c.first_index() != next {
            bad.push(format!(
                "epoch {cp}: chunk at {} after {next}",
                c.first_index()
            ));
        }
        for r in c.records() {
            if r.position.checkpoint != cp || r.position.index != next || !rec_ok(cp, next, &r.data)
            {
                bad.push(format!(
                    "epoch {cp}: record {next} wrong ({:?}, {} bytes)",
                    r.position,
                    r.data.len()
                ));
            }
            lens.push(r.data.len());
            next += 1;
        }
        if !delay.is_zero() {
            tokio::time::sleep(delay / 4).await;
        }
    }
    if next != epoch.len() {
        bad.push(format!("epoch {cp}: len {} but {next} read", epoch.len()));
    }
    Ok((next, digest_of(lens)))
}

impl AsyncSink for Probe {
    async fn deliver(&mut self, epoch: &Epoch) -> Result<(), SinkError> {
        let cp = epoch.checkpoint();
        let attempt = {
            let mut st = self.st.lock();
            st.calls.push(cp);
            if let Some(last) = st.done.last() {
                if cp <= last.0 {
                    let m = format!("epoch {cp} offered after {} completed", last.0);
                    st.bad.push(m);
                }
            }
            let a = st.attempts.entry(cp).or_insert(0);
            *a += 1;
            *a
        };
        let mode = (self.pass)(cp);
        let mut bad = Vec::new();
        let digest = if mode == Pass::Skip {
            None
        } else {
            let first = read_once(epoch, self.delay, &mut bad).await;
            let first = match first {
                Ok(x) => x,
                Err(e) => {
                    let mut st = self.st.lock();
                    st.read_errors += 1;
                    st.bad.extend(bad);
                    return Err(SinkError::permanent(format!("probe: read error {e}")));
                }
            };
            if mode == Pass::Twice {
                match read_once(epoch, Duration::ZERO, &mut bad).await {
                    Ok(second) if second == first => {}
                    Ok(second) => {
                        bad.push(format!("epoch {cp}: passes differ {first:?} {second:?}"))
                    }
                    Err(e) => {
                        let mut st = self.st.lock();
                        st.read_errors += 1;
                        st.bad.extend(bad);
                        return Err(SinkError::permanent(format!("probe: read error (2nd) {e}")));
                    }
                }
            }
            Some(first.1)
        };
        if !self.delay.is_zero() {
            tokio::time::sleep(self.delay).await;
        }
        let mut st = self.st.lock();
        st.bad.extend(bad);
        if let Some(e) = (self.fail)(cp, attempt) {
            return Err(e);
        }
        st.done.push((cp, epoch.len(), digest));
        Ok(())
    }
    fn stores_marker(&self) -> bool {
        self.marker
    }
    async fn is_committed(&mut self, key: &EpochKey) -> Result<bool, SinkError> {
        Ok(self.marker && self.st.lock().done.iter().any(|d| d.0 == key.checkpoint))
    }
}

fn assert_done(got: &[(u64, u64, Option<u64>)], want: &[Spec], what: &str) {
    let g: Vec<(u64, u64)> = got.iter().map(|d| (d.0, d.1)).collect();
    let w: Vec<(u64, u64)> = want.iter().map(|s| (s.cp, s.sizes.len() as u64)).collect();
    assert_eq!(
        g, w,
        "{what}: completed (checkpoint, records) differ from the expected sequence"
    );
    for (d, s) in got.iter().zip(want) {
        if let Some(h) = d.2 {
            assert_eq!(
                h,
                digest_of(s.sizes.iter().copied()),
                "{what}: epoch {} had other records",
                d.0
            );
        }
    }
}

async fn deliver_until_ok(wal: &Arc<WalSink>, sink: &mut Probe, max: usize) -> Vec<walsink::Error> {
    let mut errs = Vec::new();
    for _ in 0..max {
        match tokio::time::timeout(GUARD, deliver_ready(wal, sink))
            .await
            .expect("hang guard")
        {
            Ok(_) => return errs,
            Err(e) => errs.push(e),
        }
    }
    panic!("deliver_ready did not succeed in {max} calls: {errs:?}");
}

fn is_invalid_op(e: &walsink::Error) -> bool {
    matches!(e.kind(), ErrorKind::InvalidOperation { .. })
}

// =============================================================================================
// deliver_ready
// =============================================================================================

/// Mixed epochs (tiny, one chunk >= 256 KiB, several chunks) through async deliver_ready with
/// sinks that read once, twice, not at all, slowly: each whole, in order, once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn async_deliver_ready_mixed_sizes_with_every_kind_of_sink() {
    for chunk in [MIB, 64 * KIB] {
        for mode in [Pass::Once, Pass::Twice, Pass::Skip] {
            for slow in [Duration::ZERO, Duration::from_millis(8)] {
                let sim = SimStorage::new();
                let wal = open(&sim, opts(chunk));
                let specs = mixed(9);
                for s in &specs {
                    seal(&wal, s);
                }
                wal.checkpoint_complete(9).unwrap();
                let mut sink = Probe::new()
                    .passes(move |cp| {
                        if mode == Pass::Skip && cp % 2 == 0 {
                            Pass::Once
                        } else {
                            mode
                        }
                    })
                    .slow(slow);
                let what = format!("chunk {chunk} {mode:?} slow {slow:?}");
                let n = deliver_ready(&wal, &mut sink)
                    .await
                    .unwrap_or_else(|e| panic!("{what}: {e:?}"));
                assert_eq!(n, 9, "{what}");
                assert_done(&sink.done(), &specs, &what);
                assert!(sink.bad().is_empty(), "{what}: {:?}", sink.bad());
                assert_eq!(
                    sink.st.lock().calls.len(),
                    9,
                    "{what}: an epoch offered twice"
                );
                assert!(wal.pending().is_empty(), "{what}");
                assert_eq!(wal.health().committed, Some(9));
            }
        }
    }
}

/// The sink fails each epoch in turn (retryable / permanent): the call returns the sink's
/// error, what came before is marked, the next call starts at the failed epoch; the next call
/// is never refused as another deliverer (a read ahead left on the blocking pool must not hold
/// the log).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn async_deliver_ready_sink_failure_at_each_epoch_never_skips_or_repeats() {
    for chunk in [MIB, 64 * KIB] {
        for fail_cp in 1..=6u64 {
            for permanent in [false, true] {
                let sim = SimStorage::new();
                let wal = open(&sim, opts(chunk));
                let specs = mixed(6);
                for s in &specs {
                    seal(&wal, s);
                }
                wal.checkpoint_complete(6).unwrap();
                let mut sink = Probe::new()
                    .passes(|cp| if cp % 2 == 0 { Pass::Twice } else { Pass::Once })
                    .failing(move |cp, a| {
                        (cp == fail_cp && a <= 2).then(|| {
                            if permanent {
                                SinkError::permanent("injected")
                            } else {
                                SinkError::retryable("injected")
                            }
                        })
                    });
                let what = format!("chunk {chunk} fail {fail_cp} permanent {permanent}");
                for _ in 0..2 {
                    let e = deliver_ready(&wal, &mut sink).await.expect_err(&what);
                    match e.kind() {
                        ErrorKind::Sink(se) => assert_eq!(
                            se.class(),
                            if permanent {
                                SinkErrorClass::Permanent
                            } else {
                                SinkErrorClass::Retryable
                            },
                            "{what}"
                        ),
                        _ => panic!("{what}: want the sink's error, got {e:?}"),
                    }
                    assert_done(&sink.done(), &specs[..fail_cp as usize - 1], &what);
                    assert_eq!(
                        wal.health().committed,
                        (fail_cp > 1).then_some(fail_cp - 1),
                        "{what}"
                    );
                }
                let n = deliver_ready(&wal, &mut sink)
                    .await
                    .unwrap_or_else(|e| panic!("{what}: {e:?}"));
                assert_eq!(n as u64, 7 - fail_cp, "{what}");
                assert_done(&sink.done(), &specs, &what);
                assert!(sink.bad().is_empty(), "{what}: {:?}", sink.bad());
                let calls = sink.st.lock().calls.clone();
                let want: Vec<u64> = (1..=6u64)
                    .flat_map(|c| std::iter::repeat_n(c, if c == fail_cp { 3 } else { 1 }))
                    .collect();
                assert_eq!(calls, want, "{what}");
            }
        }
    }
}

/// The n-th read of the disk fails, for every n: the errors are the log's (never the sink's),
/// and the epochs are completed once each, in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn async_deliver_ready_read_fault_at_every_read_loses_and_repeats_nothing() {
    for chunk in [MIB, 64 * KIB] {
        for nth in 0..50u64 {
            let sim = SimStorage::new();
            let wal = open(&sim, opts(chunk));
            let specs = [tiny(1), mid(2), big(3), mid(4), tiny(5), big(6)];
            for s in &specs {
                seal(&wal, s);
            }
            wal.checkpoint_complete(6).unwrap();
            sim.inject_fault(FaultOp::Read, nth, io::ErrorKind::Other);
            let mut sink = Probe::new().passes(|cp| if cp == 3 { Pass::Twice } else { Pass::Once });
            let errs = deliver_until_ok(&wal, &mut sink, 10).await;
            sim.clear_faults();
            let what = format!("chunk {chunk} nth {nth}");
            for e in &errs {
                assert!(
                    !matches!(e.kind(), ErrorKind::Sink(_)),
                    "{what}: the sink's error surfaced: {e:?}"
                );
                assert!(
                    !is_invalid_op(e),
                    "{what}: the next call was locked out: {e:?}"
                );
            }
            assert_done(&sink.done(), &specs, &what);
            assert!(sink.bad().is_empty(), "{what}: {:?}", sink.bad());
        }
    }
}

/// deliver_ready futures dropped at many points (timeouts from 0 to a few ms) while a slow sink
/// takes large epochs and the next is read ahead: each later call goes on, no call is refused
/// as another deliverer for good, and every epoch is completed exactly once, in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn async_dropped_deliver_ready_futures_then_everything_once() {
    for seed in [7u64, 8, 9] {
        for chunk in [MIB, 64 * KIB] {
            let mut rng = fastrand::Rng::with_seed(seed);
            let sim = SimStorage::new();
            let wal = open(&sim, opts(chunk));
            let specs = mixed(12);
            for s in &specs {
                seal(&wal, s);
            }
            wal.checkpoint_complete(12).unwrap();
            let mut sink = Probe::new().slow(Duration::from_millis(4)).passes(|cp| {
                if cp % 4 == 0 {
                    Pass::Twice
                } else {
                    Pass::Once
                }
            });
            let what = format!("seed {seed} chunk {chunk}");
            let mut invalid = 0;
            let mut rounds = 0;
            while wal.health().committed != Some(12) {
                rounds += 1;
                assert!(rounds < 2000, "{what}: no progress");
                // Mostly short deadlines; now and then one long enough for a large epoch.
                let t = if rounds % 8 == 0 {
                    GUARD
                } else {
                    Duration::from_micros(rng.u64(0..40_000))
                };
                match tokio::time::timeout(t, deliver_ready(&wal, &mut sink)).await {
                    Err(_) => {}
                    Ok(Ok(_)) => {}
                    Ok(Err(e)) if is_invalid_op(&e) => invalid += 1,
                    Ok(Err(e)) => panic!("{what}: unexpected error {e:?}"),
                }
            }
            // Whatever the drops, a last call finds nothing to do.
            let n = deliver_ready(&wal, &mut sink).await.unwrap();
            assert_eq!(n, 0, "{what}");
            assert_eq!(
                invalid, 0,
                "{what}: a call was refused as another deliverer {invalid} times"
            );
            assert_done(&sink.done(), &specs, &what);
            assert!(sink.bad().is_empty(), "{what}: {:?}", sink.bad());
        }
    }
}

/// A restore between calls voids the epoch read ahead during the failed call: the next call
/// delivers the failed epoch and then the new ones, never the voided ones.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn async_restore_after_a_failure_voids_the_read_ahead() {
    for chunk in [MIB, 64 * KIB] {
        let sim = SimStorage::new();
        let wal = open(&sim, opts(chunk));
        for s in [tiny(1), mid(2), mid(3), big(4)] {
            seal(&wal, &s);
        }
        wal.checkpoint_complete(4).unwrap();
        let mut sink = Probe::new()
            .passes(|_| Pass::Twice)
            .failing(|cp, a| (cp == 2 && a == 1).then(|| SinkError::retryable("once")));
        deliver_ready(&wal, &mut sink).await.expect_err("2 fails");
        let w = wal.clone();
        tokio::task::spawn_blocking(move || w.restore(Some(2)))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(
            wal.pending().iter().map(|p| p.id).collect::<Vec<_>>(),
            vec![2]
        );
        seal(&wal, &big(5));
        seal(&wal, &mid(6));
        wal.checkpoint_complete(6).unwrap();
        deliver_ready(&wal, &mut sink).await.unwrap();
        assert_done(
            &sink.done(),
            &[tiny(1), mid(2), big(5), mid(6)],
            &format!("chunk {chunk}"),
        );
        let calls = sink.st.lock().calls.clone();
        assert!(
            !calls.contains(&3) && !calls.contains(&4),
            "chunk {chunk}: voided epoch offered: {calls:?}"
        );
        assert!(sink.bad().is_empty(), "{:?}", sink.bad());
    }
}

// =============================================================================================
// AsyncCommitter
// =============================================================================================

/// The async committer with a slow, sometimes failing sink over mixed epochs: each whole, in
/// order, completed once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn async_committer_mixed_sizes_slow_failing_sink() {
    for chunk in [MIB, 64 * KIB] {
        let sim = SimStorage::new();
        let wal = open(&sim, opts(chunk));
        let sink = Probe::new()
            .slow(Duration::from_millis(2))
            .passes(|cp| if cp % 3 == 0 { Pass::Twice } else { Pass::Once })
            .failing(|cp, a| match cp % 5 {
                0 if a <= 2 => Some(SinkError::retryable("r")),
                3 if a == 1 => Some(SinkError::permanent("p")),
                _ => None,
            });
        let probe = sink.clone();
        let c = spawn_committer(&wal, sink).unwrap();
        let specs = mixed(15);
        for s in &specs {
            seal(&wal, s);
            if s.cp % 4 == 0 {
                wal.checkpoint_complete(s.cp).unwrap();
            }
        }
        wal.checkpoint_complete(15).unwrap();
        let w = wal.clone();
        assert!(
            tokio::task::spawn_blocking(move || w.wait_committed(15, GUARD))
                .await
                .unwrap(),
            "chunk {chunk}"
        );
        let report = c.shutdown(Duration::from_secs(10)).await;
        assert!(
            report.clean && report.pending.is_empty(),
            "chunk {chunk}: {report:?}"
        );
        assert_eq!(report.committed, Some(15));
        assert_done(&probe.done(), &specs, &format!("chunk {chunk}"));
        assert!(probe.bad().is_empty(), "{:?}", probe.bad());
    }
}

/// `AsyncCommitter::shutdown` with short deadlines (0 to 20 ms) while a slow sink takes large
/// epochs and the next is read ahead on the blocking pool: the report agrees with the log, and
/// a new deliverer (not refused) completes the rest, each epoch once in total.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn async_committer_shutdown_with_short_deadlines_then_the_rest_once() {
    for chunk in [MIB, 64 * KIB] {
        for deadline_ms in [0u64, 1, 3, 7, 20] {
            let sim = SimStorage::new();
            let wal = open(&sim, opts(chunk));
            let specs = mixed(10);
            for s in &specs {
                seal(&wal, s);
            }
            wal.checkpoint_complete(10).unwrap();
            let sink = Probe::new().slow(Duration::from_millis(6));
            let probe = sink.clone();
            let c = spawn_committer(&wal, sink).unwrap();
            // Let it get going: wait (bounded) until the first epoch completed.
            let end = tokio::time::Instant::now() + GUARD;
            while probe.done().is_empty() {
                assert!(tokio::time::Instant::now() < end);
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
            let report = c.shutdown(Duration::from_millis(deadline_ms)).await;
            let what = format!("chunk {chunk} deadline {deadline_ms} ms");
            let done_now = probe.done_cps();
            // What the report says is committed was completed by the sink.
            if let Some(k) = report.committed {
                assert!(
                    done_now.contains(&k),
                    "{what}: report says {k} committed, sink completed {done_now:?}"
                );
            }
            let mut sink2 = probe.clone();
            let errs = deliver_until_ok(&wal, &mut sink2, 5).await;
            for e in &errs {
                assert!(
                    !is_invalid_op(e),
                    "{what}: the next deliverer was refused: {e:?}"
                );
            }
            assert_done(&probe.done(), &specs, &what);
            assert!(probe.bad().is_empty(), "{what}: {:?}", probe.bad());
            assert!(wal.pending().is_empty());
        }
    }
}

/// A shutdown cut short, then a power loss: a reopened log (completions given again) delivers
/// the rest into a marker sink: every epoch completed exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn async_shutdown_cut_short_then_crash_and_reopen_marker_sink_exactly_once() {
    for (i, deadline_ms) in [0u64, 2, 9].into_iter().enumerate() {
        for power in [false, true] {
            let sim = SimStorage::new();
            let o = opts(64 * KIB).mark_every(1 + i);
            let wal = open(&sim, o.clone());
            let specs = mixed(9);
            for s in &specs {
                seal(&wal, s);
            }
            wal.checkpoint_complete(9).unwrap();
            let mut sink = Probe::new().slow(Duration::from_millis(5));
            sink.marker = true;
            let probe = sink.clone();
            let c = spawn_committer(&wal, sink).unwrap();
            let end = tokio::time::Instant::now() + GUARD;
            while probe.done().len() < 2 {
                assert!(tokio::time::Instant::now() < end);
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
            let _report = c.shutdown(Duration::from_millis(deadline_ms)).await;
            // The handle goes; a cut-short step may still finish on the blocking pool, so wait
            // (bounded) until the log can be opened again after the crash.
            drop(wal);
            sim.crash(if power {
                CrashOptions::power_loss(deadline_ms)
            } else {
                CrashOptions::process_kill()
            });
            let wal = {
                let end = std::time::Instant::now() + GUARD;
                loop {
                    match WalSink::open_with_storage(Arc::new(sim.clone()), o.clone()) {
                        Ok((w, _)) => break Arc::new(w),
                        Err(e) => {
                            assert!(std::time::Instant::now() < end, "reopen: {e:?}");
                            tokio::time::sleep(Duration::from_millis(5)).await;
                        }
                    }
                }
            };
            wal.checkpoint_complete(9).unwrap();
            let mut sink2 = probe.clone();
            deliver_until_ok(&wal, &mut sink2, 5).await;
            let what = format!("deadline {deadline_ms} power {power}");
            assert_done(&probe.done(), &specs, &what);
            assert!(probe.bad().is_empty(), "{what}: {:?}", probe.bad());
        }
    }
}

/// Seeds 21..=26: random epoch sizes, random sink failures and read faults, async deliver_ready
/// with random drops; the completed sequence equals the sealed sequence, each once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn async_random_rounds_against_the_model() {
    for seed in 21..=26u64 {
        let mut rng = fastrand::Rng::with_seed(seed);
        let sim = SimStorage::new();
        let wal = open(&sim, opts(if seed % 2 == 0 { 64 * KIB } else { 512 * KIB }));
        let mut sink = Probe::new()
            .passes(move |cp| {
                if (cp + seed) % 3 == 0 {
                    Pass::Twice
                } else {
                    Pass::Once
                }
            })
            .failing(move |cp, a| {
                let h = (cp.wrapping_mul(0x9e37_79b9) ^ seed ^ a as u64) % 4;
                (a <= 2 && h == 0).then(|| SinkError::retryable("seeded"))
            });
        let mut specs = Vec::new();
        let mut cp = 0;
        for round in 0..25 {
            let n = rng.u64(1..4);
            for _ in 0..n {
                cp += 1 + rng.u64(0..2);
                let sizes: Vec<usize> = match rng.u8(0..4) {
                    0 => (0..rng.usize(1..4)).map(|_| rng.usize(20..300)).collect(),
                    1 => (0..rng.usize(10..30))
                        .map(|_| rng.usize(10 * KIB..40 * KIB))
                        .collect(),
                    2 => (0..rng.usize(5..40))
                        .map(|_| rng.usize(20 * KIB..90 * KIB))
                        .collect(),
                    _ => (0..rng.usize(1..3))
                        .map(|_| rng.usize(300 * KIB..700 * KIB))
                        .collect(),
                };
                let s = Spec { cp, sizes };
                seal(&wal, &s);
                specs.push(s);
            }
            wal.checkpoint_complete(cp).unwrap();
            if rng.u8(0..3) == 0 {
                sim.inject_fault(FaultOp::Read, rng.u64(0..20), io::ErrorKind::Other);
            }
            let r = if rng.bool() {
                tokio::time::timeout(
                    Duration::from_micros(rng.u64(0..5000)),
                    deliver_ready(&wal, &mut sink),
                )
                .await
                .ok()
            } else {
                Some(deliver_ready(&wal, &mut sink).await)
            };
            if let Some(Err(e)) = &r {
                assert!(
                    !is_invalid_op(e),
                    "seed {seed} round {round}: refused: {e:?}"
                );
            }
            let done = sink.done();
            assert_done(
                &done,
                &specs[..done.len()],
                &format!("seed {seed} round {round}"),
            );
            // A read fault the round's delivery did not reach (it timed out or found less to
            // read) would otherwise fire in the next round's writer, which reads when it rolls
            // to a segment, and fail the seal: the faults are for delivery only (CI met it
            // once, "roll to segment ...: injected fault").
            sim.clear_faults();
        }
        deliver_until_ok(&wal, &mut sink, 10).await;
        assert_done(&sink.done(), &specs, &format!("seed {seed}"));
        assert!(sink.bad().is_empty(), "seed {seed}: {:?}", sink.bad());
    }
}

// =============================================================================================
// Memory (child process with a counting allocator)
// =============================================================================================

const CHILD_ENV: &str = "WALSINK_PROBE4_ASYNC_MEM_CHILD";

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

/// A log in a fresh directory with epoch 1 tiny and epoch 2 of 7 MiB (within one 8 MiB read
/// chunk, so a read ahead of it reads it whole), both complete.
fn seven_mib_log(dir: &std::path::Path) -> Arc<WalSink> {
    let o = Options::new("probe4amem")
        .segment_size(32 << 20)
        .max_record_size(1 << 20)
        .recycle_segments(false)
        .retry(RetryPolicy::new(
            Duration::from_millis(1),
            Duration::from_millis(2),
        ));
    let wal = Arc::new(WalSink::open(dir.join("wal"), o).unwrap().0);
    seal(&wal, &tiny(1));
    seal(
        &wal,
        &Spec {
            cp: 2,
            sizes: vec![256 * KIB; 28],
        },
    );
    wal.checkpoint_complete(2).unwrap();
    wal
}

fn mem_runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

fn start_measure() -> usize {
    let base = CUR.load(Ordering::SeqCst);
    PEAK.store(base, Ordering::SeqCst);
    base
}

fn peak_since(base: usize) -> usize {
    PEAK.load(Ordering::SeqCst).saturating_sub(base)
}

/// Bound asserted by the memory tests: under three 7 MiB epochs of heap growth (the design
/// allows two epochs' chunks; one more for slack).
const MEM_BOUND: usize = 21 * MIB;

/// Epoch 1's sink always fails; epoch 2 (7 MiB, one chunk) is read ahead by each call. 30
/// failing async deliver_ready calls in a row must not pile reads ahead up on the blocking
/// pool. Control: the same calls spaced 300 ms apart.
///
/// DEFECT (observed, kept failing): back to back the peak heap growth is about 139 MB (about 19
/// copies of the 7 MiB epoch) against 7.3 MB spaced out: each call returns its error while its
/// read ahead still runs on the blocking pool, and the next call starts another.
#[test]
fn async_memory_failing_calls_do_not_pile_reads_ahead_up() {
    if run_in_child("async_memory_failing_calls_do_not_pile_reads_ahead_up") {
        return;
    }
    mem_runtime().block_on(async {
        let dir = tempfile::tempdir().unwrap();
        let wal = seven_mib_log(dir.path());
        let mut sink = Probe::new().failing(|cp, _| (cp == 1).then(|| SinkError::retryable("always")));
        let base = start_measure();
        for _ in 0..5 {
            let e = deliver_ready(&wal, &mut sink).await.expect_err("1 fails");
            assert!(!is_invalid_op(&e), "refused: {e:?}");
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
        let spaced = peak_since(base);
        eprintln!("5 spaced failing async deliver_ready: peak heap growth {spaced} bytes");
        let base = start_measure();
        for _ in 0..30 {
            let e = deliver_ready(&wal, &mut sink).await.expect_err("1 fails");
            assert!(!is_invalid_op(&e), "refused: {e:?}");
        }
        let peak = peak_since(base);
        eprintln!("30 failing async deliver_ready in a row: peak heap growth {peak} bytes");
        assert!(spaced < MEM_BOUND, "spaced calls: peak heap growth {spaced} bytes");
        assert!(
            peak < MEM_BOUND,
            "30 failing async deliver_ready calls in a row: peak heap growth {peak} bytes (epoch 2 is 7 MiB; the same calls spaced out: {spaced} bytes): reads ahead pile up"
        );
    });
}

/// The same with deliver_ready futures dropped after 1 ms while a slow sink holds epoch 1.
///
/// DEFECT (observed, kept failing): peak heap growth about 73 MB (about 10 copies of the epoch).
#[test]
fn async_memory_dropped_calls_do_not_pile_reads_ahead_up() {
    if run_in_child("async_memory_dropped_calls_do_not_pile_reads_ahead_up") {
        return;
    }
    mem_runtime().block_on(async {
        let dir = tempfile::tempdir().unwrap();
        let wal = seven_mib_log(dir.path());
        let mut slow = Probe::new().slow(Duration::from_millis(50)).failing(|cp, _| (cp == 1).then(|| SinkError::retryable("always")));
        let base = start_measure();
        for _ in 0..30 {
            let _ = tokio::time::timeout(Duration::from_millis(1), deliver_ready(&wal, &mut slow)).await;
        }
        let r = tokio::time::timeout(GUARD, deliver_ready(&wal, &mut slow)).await.unwrap();
        assert!(matches!(r.as_ref().map_err(|e| e.kind()), Err(ErrorKind::Sink(_))), "{r:?}");
        let peak = peak_since(base);
        eprintln!("30 dropped async deliver_ready: peak heap growth {peak} bytes");
        assert!(peak < MEM_BOUND, "30 dropped async deliver_ready calls: peak heap growth {peak} bytes (epoch 2 is 7 MiB)");
    });
}

/// The async committer retrying a sink that always fails on epoch 1 (backoff 1-2 ms) for one
/// second, with epoch 2 (7 MiB) read ahead on each try.
#[test]
fn async_memory_committer_retries_do_not_pile_reads_ahead_up() {
    if run_in_child("async_memory_committer_retries_do_not_pile_reads_ahead_up") {
        return;
    }
    mem_runtime().block_on(async {
        let dir = tempfile::tempdir().unwrap();
        let wal = seven_mib_log(dir.path());
        let sink = Probe::new().failing(|cp, _| (cp == 1).then(|| SinkError::retryable("always")));
        let probe = sink.clone();
        let base = start_measure();
        let c = spawn_committer(&wal, sink).unwrap();
        tokio::time::sleep(Duration::from_secs(1)).await;
        let report = c.shutdown(Duration::from_secs(10)).await;
        let peak = peak_since(base);
        let tries = probe.st.lock().calls.len();
        eprintln!("async committer, {tries} failed tries: peak heap growth {peak} bytes");
        assert!(tries >= 5, "the committer should have retried: {tries}");
        assert_eq!(report.pending, vec![1, 2]);
        assert!(peak < MEM_BOUND, "async committer retries ({tries} tries): peak heap growth {peak} bytes (epoch 2 is 7 MiB)");
    });
}
