//! Request bodies reused from a pool once answered stay byte-identical (compressed bytes
//! too) under every retry, every replay after a simulated crash, with chunks in flight
//! together, gzip and newline=escape; checked against an independent implementation of the
//! documented cut, on the raw bytes a TCP server read.

use crate::support::id;
use std::collections::{BTreeMap, HashMap};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use walsink::BufferPool;
use walsink::{Options, RetryPolicy, WalSink};
use walsink_http::chunking::{Chunker, Chunking, Newline};
use walsink_http::{Config, HttpSink};
use walsink_tokio::deliver_ready;

// ---------------------------------------------------------------------------------------
// helpers

struct Rng(u64);
impl Rng {
    fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

fn opts(sid: &str) -> Options {
    Options::new(sid)
        .segment_size(8 << 20)
        .max_record_size(1 << 20)
        // Small read chunks: records of one body come from several read buffers.
        .read_chunk_size(8192)
        .retry(RetryPolicy::new(
            Duration::from_millis(2),
            Duration::from_millis(50),
        ))
}

/// Random records; `newlines` puts `\n` in some of them, backslashes always.
fn gen_records(rng: &mut Rng, n: usize, newlines: bool, big: u64) -> Vec<Vec<u8>> {
    (0..n)
        .map(|_| {
            let len = match rng.below(20) {
                0 => big / 2 + rng.below(big),
                1 | 2 => 1000 + rng.below(30_000),
                3 => 0,
                _ => rng.below(200),
            } as usize;
            (0..len)
                .map(|_| match rng.below(60) {
                    0 => b'\\',
                    1 if newlines => b'\n',
                    2 => b'n',
                    _ => b'a' + rng.below(26) as u8,
                })
                .collect()
        })
        .collect()
}

fn escape(r: &[u8]) -> Vec<u8> {
    let mut o = Vec::with_capacity(r.len());
    for &b in r {
        match b {
            b'\\' => o.extend(b"\\\\"),
            b'\n' => o.extend(b"\\n"),
            _ => o.push(b),
        }
    }
    o
}

/// The documented cut, written independently: (first, count, body) per chunk.
fn oracle(
    recs: &[Vec<u8>],
    max_records: usize,
    max_bytes: usize,
    esc: bool,
) -> Vec<(u64, u64, Vec<u8>)> {
    let mut out = Vec::new();
    let (mut first, mut count, mut body) = (0u64, 0u64, Vec::new());
    for (i, r) in recs.iter().enumerate() {
        let line = if esc { escape(r) } else { r.clone() };
        let add = line.len() + 1;
        if count > 0 && (count as usize + 1 > max_records || body.len() + add > max_bytes) {
            out.push((first, count, std::mem::take(&mut body)));
            first = i as u64;
            count = 0;
        }
        body.extend(&line);
        body.push(b'\n');
        count += 1;
    }
    if count > 0 {
        out.push((first, count, body));
    }
    out
}

fn gunzip(b: &[u8]) -> Vec<u8> {
    let mut d = flate2::read::GzDecoder::new(b);
    let mut o = Vec::new();
    d.read_to_end(&mut o).expect("a body that does not gunzip");
    // Nothing after the gzip member.
    let mut rest = Vec::new();
    d.into_inner().read_to_end(&mut rest).unwrap();
    assert!(
        rest.is_empty(),
        "{} bytes after the gzip member",
        rest.len()
    );
    o
}

fn copy_log(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap().flatten() {
        let n = e.file_name();
        if n != "LOCK" {
            std::fs::copy(e.path(), to.join(n)).unwrap();
        }
    }
}

/// Delivers until the log has no backlog (errors are retried by calling again).
async fn deliver_everything(wal: &Arc<WalSink>, sink: &mut HttpSink) -> usize {
    let mut errors = 0;
    for _ in 0..400 {
        match tokio::time::timeout(Duration::from_secs(60), deliver_ready(wal, sink))
            .await
            .expect("a delivery hung for a minute")
        {
            Ok(_) if wal.health().backlog_epochs == 0 => return errors,
            Ok(_) => {}
            Err(_) => errors += 1,
        }
    }
    panic!("not delivered after 400 attempts: {:?}", wal.health());
}

// ---------------------------------------------------------------------------------------
// a raw HTTP/1.1 server that keeps every byte it read

#[derive(Debug, Clone)]
struct Req {
    headers: HashMap<String, String>,
    body: Vec<u8>,
}
impl Req {
    fn key(&self) -> String {
        self.headers
            .get("idempotency-key")
            .cloned()
            .unwrap_or_default()
    }
}

enum Answer {
    Ok,
    /// 200 after this delay.
    Delay(Duration),
    Status(u16, &'static str),
    /// 200 with a content-length of 100, 5 bytes, close.
    CloseMid,
    /// Close without a word.
    Close,
    /// Say nothing for this long (past the client's timeout), then close.
    Hang(Duration),
    /// Stop reading the body after the headers for this long, then close (the client is
    /// still uploading: its timeout fires mid-body).
    StallUpload(Duration),
}

type Script = Box<dyn Fn(usize, &HashMap<String, String>) -> Answer + Send + Sync>;

struct Raw {
    port: u16,
    /// Requests read whole, with the index they arrived as.
    seen: Arc<Mutex<Vec<(usize, Req, bool)>>>,
    count: Arc<AtomicUsize>,
    script: Arc<Mutex<Script>>,
    stop: Arc<AtomicBool>,
}

impl Drop for Raw {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        let _ = TcpStream::connect(("127.0.0.1", self.port));
    }
}

impl Raw {
    fn start(script: Script) -> Raw {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        let r = Raw {
            port,
            seen: Default::default(),
            count: Default::default(),
            script: Arc::new(Mutex::new(script)),
            stop: Default::default(),
        };
        let (seen, count, script, stop) = (
            r.seen.clone(),
            r.count.clone(),
            r.script.clone(),
            r.stop.clone(),
        );
        std::thread::spawn(move || {
            for c in l.incoming() {
                if stop.load(Ordering::SeqCst) {
                    return;
                }
                let Ok(c) = c else { return };
                let (seen, count, script) = (seen.clone(), count.clone(), script.clone());
                std::thread::spawn(move || serve(c, seen, count, script));
            }
        });
        r
    }
    fn url(&self, q: &str) -> String {
        format!("http://127.0.0.1:{}/ingest?{q}", self.port)
    }
    fn set(&self, s: Script) {
        *self.script.lock().unwrap() = s;
    }
    fn seen(&self) -> Vec<(usize, Req, bool)> {
        self.seen.lock().unwrap().clone()
    }
}

fn read_head(r: &mut BufReader<TcpStream>) -> Option<HashMap<String, String>> {
    let mut line = String::new();
    if r.read_line(&mut line).ok()? == 0 {
        return None;
    }
    assert!(line.starts_with("POST "), "not a POST: {line:?}");
    let mut h = HashMap::new();
    loop {
        let mut l = String::new();
        if r.read_line(&mut l).ok()? == 0 {
            return None;
        }
        let l = l.trim_end();
        if l.is_empty() {
            return Some(h);
        }
        let (k, v) = l.split_once(':')?;
        h.insert(k.trim().to_ascii_lowercase(), v.trim().to_string());
    }
}

fn read_body(r: &mut BufReader<TcpStream>, h: &HashMap<String, String>) -> Option<Vec<u8>> {
    if let Some(len) = h.get("content-length") {
        let mut b = vec![0; len.parse().unwrap()];
        r.read_exact(&mut b).ok()?;
        return Some(b);
    }
    assert_eq!(
        h.get("transfer-encoding").map(|s| s.as_str()),
        Some("chunked"),
        "{h:?}"
    );
    let mut b = Vec::new();
    loop {
        let mut l = String::new();
        r.read_line(&mut l).ok()?;
        let n = usize::from_str_radix(l.trim(), 16).ok()?;
        let mut c = vec![0; n + 2];
        r.read_exact(&mut c).ok()?;
        if n == 0 {
            return Some(b);
        }
        b.extend(&c[..n]);
    }
}

fn serve(
    c: TcpStream,
    seen: Arc<Mutex<Vec<(usize, Req, bool)>>>,
    count: Arc<AtomicUsize>,
    script: Arc<Mutex<Script>>,
) {
    let mut w = c.try_clone().unwrap();
    let mut r = BufReader::new(c);
    while let Some(h) = read_head(&mut r) {
        let n = count.fetch_add(1, Ordering::SeqCst);
        let answer = (script.lock().unwrap())(n, &h);
        if let Answer::StallUpload(d) = answer {
            std::thread::sleep(d);
            return;
        }
        let Some(body) = read_body(&mut r, &h) else {
            return;
        };
        let ok = matches!(answer, Answer::Ok | Answer::Delay(_));
        seen.lock().unwrap().push((n, Req { headers: h, body }, ok));
        let res = match answer {
            Answer::Ok => w.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok"),
            Answer::Delay(d) => {
                std::thread::sleep(d);
                w.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
            }
            Answer::Status(s, extra) => w.write_all(
                format!("HTTP/1.1 {s} X\r\n{extra}content-length: 4\r\n\r\nnope").as_bytes(),
            ),
            Answer::CloseMid => {
                let _ = w.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\nshort");
                return;
            }
            Answer::Close => return,
            Answer::Hang(d) => {
                std::thread::sleep(d);
                return;
            }
            Answer::StallUpload(_) => unreachable!(),
        };
        if res.is_err() {
            return;
        }
    }
}

/// Every other request fails, in turn: 503, 429 with Retry-After 0, a 200 cut off
/// mid-answer, a connection closed without an answer, and (rarely) an answer slower than the
/// timeout.
fn every_other_fails() -> Script {
    Box::new(|n, _| {
        if n % 2 == 0 {
            return Answer::Ok;
        }
        match (n / 2) % 9 {
            0 | 4 => Answer::Status(503, ""),
            1 | 5 => Answer::Status(429, "retry-after: 0\r\n"),
            2 | 6 => Answer::CloseMid,
            3 | 7 => Answer::Close,
            _ => Answer::Hang(Duration::from_millis(700)),
        }
    })
}

/// Checks what the raw server read against the oracle: per key, every copy has the same
/// bytes and the same Walsink-Chunk header; gzip iff asked; the decoded body is the oracle's
/// body; every key of the oracle arrived with a 2xx answer at least once. Returns the number
/// of copies beyond the first.
#[allow(clippy::too_many_arguments)] // one checker for several raw-server tests
fn check_raw(
    seen: &[(usize, Req, bool)],
    sid: &str,
    epochs: &BTreeMap<u64, Vec<Vec<u8>>>,
    max_records: usize,
    max_bytes: usize,
    esc: bool,
    gzip: bool,
    what: &str,
) -> usize {
    let mut by_key: BTreeMap<String, Vec<&(usize, Req, bool)>> = BTreeMap::new();
    for s in seen
        .iter()
        .filter(|s| s.1.key().starts_with(&format!("{sid}:")))
    {
        by_key.entry(s.1.key()).or_default().push(s);
    }
    let mut want_keys = 0;
    let mut repeats = 0;
    for (cp, recs) in epochs {
        let chunks = oracle(recs, max_records, max_bytes, esc);
        let last = chunks.len() - 1;
        for (k, (first, count, body)) in chunks.into_iter().enumerate() {
            want_keys += 1;
            let key = format!("{sid}:0:{cp}:{k}");
            let copies = by_key
                .get(&key)
                .unwrap_or_else(|| panic!("{what}: key {key} never arrived"));
            assert!(
                copies.iter().any(|c| c.2),
                "{what}: {key} never answered 2xx"
            );
            let c0 = &copies[0].1;
            for c in copies.iter() {
                assert!(
                    c.1.body == c0.body,
                    "{what}: key {key}: request #{} carried other bytes than request #{} \
                     ({} vs {} bytes; first difference at {:?})",
                    c.0,
                    copies[0].0,
                    c.1.body.len(),
                    c0.body.len(),
                    c.1.body.iter().zip(&c0.body).position(|(a, b)| a != b)
                );
                assert_eq!(
                    c.1.headers.get("walsink-chunk"),
                    c0.headers.get("walsink-chunk"),
                    "{what}: {key}"
                );
            }
            repeats += copies.len() - 1;
            assert_eq!(
                c0.headers.get("content-encoding").map(|s| s.as_str()),
                gzip.then_some("gzip"),
                "{what}: {key}"
            );
            let decoded = if gzip {
                gunzip(&c0.body)
            } else {
                c0.body.clone()
            };
            if decoded != body {
                panic!(
                    "{what}: key {key}: body differs from the documented cut ({} bytes sent, {} \
                     expected; first difference at {:?}); Walsink-Chunk {:?}",
                    decoded.len(),
                    body.len(),
                    decoded.iter().zip(&body).position(|(a, b)| a != b),
                    c0.headers.get("walsink-chunk")
                );
            }
            let wc = c0.headers.get("walsink-chunk").cloned().unwrap_or_default();
            let want_wc = format!(
                "first={first}; count={count}; last={}; max_records={max_records}; \
                 max_bytes={max_bytes}; newline={}",
                k == last,
                if esc { "escape" } else { "reject" }
            );
            assert_eq!(wc, want_wc, "{what}: {key}");
        }
    }
    assert_eq!(by_key.len(), want_keys, "{what}: keys beyond the oracle's");
    repeats
}

// ---------------------------------------------------------------------------------------
// 1. the raw bytes under failures, chunks in flight, gzip, escape, and crash replays

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plain_bodies_stay_byte_identical_across_failures_and_crash_replays() {
    raw_bytes_case(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gzip_bodies_stay_byte_identical_across_failures_and_crash_replays() {
    raw_bytes_case(true).await;
}

async fn raw_bytes_case(gzip: bool) {
    let (max_records, max_bytes) = (37usize, 64usize << 10);
    {
        for esc in [false, true] {
            for conc in [1usize, 4] {
                let what = format!("gzip={gzip} escape={esc} concurrency={conc}");
                let srv = Raw::start(every_other_fails());
                let sid = id("p3raw");
                let base = tempfile::tempdir().unwrap();
                let (wal, _) = WalSink::open(base.path().join("wal"), opts(&sid)).unwrap();
                let wal = Arc::new(wal);
                let mut rng = Rng::new(gzip as u64 * 4 + esc as u64 * 2 + conc as u64);
                let mut epochs = BTreeMap::new();
                for cp in 1..=5u64 {
                    let n = match cp % 4 {
                        0 => 1,
                        1 => 150,
                        _ => 20 + rng.below(80) as usize,
                    };
                    let recs = gen_records(&mut rng, n, esc, 150_000);
                    wal.append_batch(recs.iter().map(|r| r.as_slice())).unwrap();
                    wal.checkpoint(cp, b"").unwrap();
                    epochs.insert(cp, recs);
                }
                // The crash image: the log before anything was delivered or marked.
                copy_log(&base.path().join("wal"), &base.path().join("crash1"));
                copy_log(&base.path().join("wal"), &base.path().join("crash2"));
                wal.checkpoint_complete(5).unwrap();
                let url = srv.url(&format!(
                    "max_records={max_records}&max_bytes=64KiB&timeout=400ms&retries=3\
                     &concurrency={conc}&gzip={gzip}&newline={}",
                    if esc { "escape" } else { "reject" }
                ));
                let mut sink = HttpSink::new(Config::from_url(&url).unwrap()).unwrap();
                let errors = deliver_everything(&wal, &mut sink).await;
                // Crash replays: the same log as it was before, reopened, with new sinks
                // (one of them without failures).
                for (k, dir) in ["crash1", "crash2"].into_iter().enumerate() {
                    if k == 1 {
                        srv.set(Box::new(|_, _| Answer::Ok));
                    }
                    let (w2, report) = WalSink::open(base.path().join(dir), opts(&sid)).unwrap();
                    assert_eq!(report.pending.len(), 5);
                    let w2 = Arc::new(w2);
                    w2.checkpoint_complete(5).unwrap();
                    let mut s2 = HttpSink::new(Config::from_url(&url).unwrap()).unwrap();
                    deliver_everything(&w2, &mut s2).await;
                }
                let seen = srv.seen();
                let repeats = check_raw(
                    &seen,
                    &sid,
                    &epochs,
                    max_records,
                    max_bytes,
                    esc,
                    gzip,
                    &what,
                );
                eprintln!(
                    "{what}: {} requests read whole, {repeats} repeats of a key, {errors} failed \
                     deliveries",
                    seen.len()
                );
                assert!(repeats > 0);
            }
        }
    }
}

// ---------------------------------------------------------------------------------------
// 2. the in-process receiver with random faults, 4 in flight, replays after crashes

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn receiver_with_random_faults_and_crash_replays_keeps_each_record_once_gzip() {
    chaos_case(true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn receiver_with_random_faults_and_crash_replays_keeps_each_record_once_plain() {
    chaos_case(false).await;
}

async fn chaos_case(gzip: bool) {
    use walsink_http::receiver::{Mode, Receiver};
    {
        let r = Receiver::start(Mode::Keep).await.unwrap();
        let sid = id("p3chaos");
        let base = tempfile::tempdir().unwrap();
        let (wal, _) = WalSink::open(base.path().join("wal"), opts(&sid)).unwrap();
        let wal = Arc::new(wal);
        let mut rng = Rng::new(77 + gzip as u64);
        let mut all = Vec::new();
        let epochs = 12u64;
        for cp in 1..=epochs {
            let recs = {
                let n = 1 + rng.below(120) as usize;
                gen_records(&mut rng, n, true, 40_000)
            };
            wal.append_batch(recs.iter().map(|r| r.as_slice())).unwrap();
            wal.checkpoint(cp, b"").unwrap();
            all.extend(recs);
            if cp % 6 == 0 {
                copy_log(
                    &base.path().join("wal"),
                    &base.path().join(format!("crash{cp}")),
                );
            }
        }
        copy_log(&base.path().join("wal"), &base.path().join("crash-all"));
        r.chaos(gzip as u64 + 5, 0.35, Duration::from_millis(500));
        let url = format!(
            "{}?max_records=9&max_bytes=20KiB&timeout=300ms&retries=2&concurrency=4&gzip={gzip}\
             &newline=escape",
            r.url("in")
        );
        wal.checkpoint_complete(epochs).unwrap();
        let mut sink = HttpSink::new(Config::from_url(&url).unwrap()).unwrap();
        deliver_everything(&wal, &mut sink).await;
        // Replays from every crash image, each completed and delivered by a new sink.
        let mut dirs: Vec<String> = (1..=epochs)
            .filter(|cp| cp % 6 == 0)
            .map(|cp| format!("crash{cp}"))
            .collect();
        dirs.push("crash-all".into());
        for d in dirs {
            let (w2, report) = WalSink::open(base.path().join(&d), opts(&sid)).unwrap();
            let w2 = Arc::new(w2);
            w2.checkpoint_complete(*report.pending.last().unwrap())
                .unwrap();
            let mut s2 = HttpSink::new(Config::from_url(&url).unwrap()).unwrap();
            deliver_everything(&w2, &mut s2).await;
        }
        r.calm();
        r.seen(|s| {
            assert!(s.conflicts.is_empty(), "gzip={gzip}: {:?}", s.conflicts);
            assert!(s.duplicates > 0);
            eprintln!(
                "gzip={gzip}: {} requests, {} faults, {} duplicates, {} kept",
                s.requests,
                s.faults,
                s.duplicates,
                s.kept.len()
            );
        });
        assert!(r.records(&sid, 0) == all, "gzip={gzip}: records differ");
    }
}

// ---------------------------------------------------------------------------------------
// 3. the pool itself

fn cut(ch: &mut Chunker, recs: &[Vec<u8>]) -> Vec<walsink_http::chunking::Body> {
    let mut v = Vec::new();
    for r in recs {
        if let Some(b) = ch.push(r).unwrap() {
            v.push(b);
        }
    }
    v.extend(ch.finish());
    v
}

/// Bodies cut with a pool are the bodies cut without one, whatever is given back and when:
/// bodies given back at once, bodies given back while a clone is still held (the clone must
/// never change), slices of bodies, foreign and static bytes; epochs of very different sizes
/// one after another; four threads sharing one pool.
#[test]
fn pooled_bodies_equal_fresh_ones_and_held_bodies_never_change() {
    let pool = std::sync::Arc::new(BufferPool::new(3, usize::MAX));
    let mut held: Vec<(bytes::Bytes, Vec<u8>)> = Vec::new();
    let mut rng = Rng::new(9);
    for round in 0..300u64 {
        let esc = round % 3 == 0;
        let rules = Chunking {
            max_records: 1 + rng.below(60) as usize,
            max_bytes: 16 + rng.below(200_000) as usize,
            newline: if esc {
                Newline::Escape
            } else {
                Newline::Reject
            },
        };
        let big = if round % 7 == 0 { 300_000 } else { 2_000 };
        let recs = {
            let n = 1 + rng.below(200) as usize;
            gen_records(&mut rng, n, esc, big)
        };
        let fresh = cut(&mut Chunker::new(rules), &recs);
        let mut pc = Chunker::with_pool(rules, pool.clone());
        let mut k = 0;
        for r in &recs {
            if let Some(b) = pc.push(r).unwrap() {
                assert_eq!(b.bytes, fresh[k].bytes, "round {round} chunk {k}");
                assert_eq!(
                    (b.chunk, b.first, b.records),
                    (fresh[k].chunk, fresh[k].first, fresh[k].records)
                );
                match rng.below(6) {
                    0 => {
                        // Hold a clone, give the body back: the clone must stay as it is.
                        held.push((b.bytes.clone(), b.bytes.to_vec()));
                        pool.give_back(b.bytes);
                    }
                    1 => pool.give_back(b.bytes.slice(b.bytes.len() / 2..)),
                    2 => {
                        pool.give_back(bytes::Bytes::from_static(b"static"));
                        pool.give_back(bytes::Bytes::from(vec![b'z'; 1 << 16]));
                    }
                    3 => {} // dropped, never given back
                    _ => pool.give_back(b.bytes),
                }
                k += 1;
            }
        }
        if let Some(b) = pc.finish() {
            assert_eq!(b.bytes, fresh[k].bytes, "round {round} last chunk");
            pool.give_back(b.bytes);
            k += 1;
        }
        assert_eq!(k, fresh.len());
        for (n, (b, copy)) in held.iter().enumerate() {
            assert!(
                b[..] == copy[..],
                "round {round}: held body {n} changed under its holder"
            );
        }
        if held.len() > 50 {
            held.drain(..25);
        }
    }
    // Four threads, one pool.
    let hs: Vec<_> = (0..4u64)
        .map(|t| {
            let pool = pool.clone();
            std::thread::spawn(move || {
                let mut rng = Rng::new(100 + t);
                let mut held = Vec::new();
                for _ in 0..150 {
                    let rules = Chunking {
                        max_records: 1 + rng.below(40) as usize,
                        max_bytes: 64 + rng.below(100_000) as usize,
                        newline: Newline::Escape,
                    };
                    let recs = {
                        let n = 1 + rng.below(100) as usize;
                        gen_records(&mut rng, n, true, 50_000)
                    };
                    let fresh = cut(&mut Chunker::new(rules), &recs);
                    let pooled = cut(&mut Chunker::with_pool(rules, pool.clone()), &recs);
                    assert_eq!(fresh.len(), pooled.len());
                    for (a, b) in fresh.iter().zip(pooled) {
                        assert_eq!(a.bytes, b.bytes);
                        if rng.below(4) == 0 {
                            held.push((b.bytes.clone(), b.bytes.to_vec()));
                        }
                        pool.give_back(b.bytes);
                    }
                    for (b, c) in &held {
                        assert!(b[..] == c[..], "a held body changed");
                    }
                    if held.len() > 20 {
                        held.drain(..10);
                    }
                }
            })
        })
        .collect();
    for h in hs {
        h.join().unwrap();
    }
}

// ---------------------------------------------------------------------------------------
// 4. a timeout while the body is still being uploaded

/// Bodies of 12 MiB (more than the loopback socket buffers hold): the server stops reading
/// some of them half-way, so the client's timeout fires while it is still sending that body
/// (and the request is dropped with its body). The retried and the later bodies (4 in
/// flight) must still be exactly the documented bodies.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_timeout_during_the_upload_leaves_later_bodies_intact() {
    let srv = Raw::start(Box::new(|n, _| {
        if n % 3 == 1 {
            Answer::StallUpload(Duration::from_millis(2500))
        } else {
            Answer::Ok
        }
    }));
    let sid = id("p3stall");
    let base = tempfile::tempdir().unwrap();
    let (wal, _) = WalSink::open(
        base.path().join("wal"),
        opts(&sid).segment_size(64 << 20).max_record_size(1 << 20),
    )
    .unwrap();
    let wal = Arc::new(wal);
    let mut rng = Rng::new(3);
    let mut epochs = BTreeMap::new();
    for cp in 1..=2u64 {
        // 40 records of ~1 MiB: about 3 bodies of 12 MiB and a rest.
        let recs: Vec<Vec<u8>> = (0..40)
            .map(|i| {
                let len = (1 << 20) - 64 - rng.below(4096) as usize;
                let c = b'a' + ((i + cp as usize) % 26) as u8;
                let mut r = vec![c; len];
                for _ in 0..16 {
                    let p = rng.below(len as u64) as usize;
                    r[p] = b'A' + rng.below(26) as u8;
                }
                r
            })
            .collect();
        wal.append_batch(recs.iter().map(|r| r.as_slice())).unwrap();
        wal.checkpoint(cp, b"").unwrap();
        epochs.insert(cp, recs);
    }
    wal.checkpoint_complete(2).unwrap();
    let url = srv.url("max_records=1000&max_bytes=12MiB&timeout=1s&retries=4&concurrency=4");
    let mut sink = HttpSink::new(Config::from_url(&url).unwrap()).unwrap();
    let errors = deliver_everything(&wal, &mut sink).await;
    let seen = srv.seen();
    let stalled = srv.count.load(Ordering::SeqCst) - seen.len();
    eprintln!(
        "{} bodies read whole, {stalled} uploads stalled, {errors} failed deliveries",
        seen.len()
    );
    assert!(stalled > 0, "no upload was stalled");
    check_raw(
        &seen,
        &sid,
        &epochs,
        1000,
        12 << 20,
        false,
        false,
        "stalled uploads",
    );
}

// ---------------------------------------------------------------------------------------
// 5. delivery futures dropped half-way

/// The delivery future is dropped at random moments (a timeout around deliver_ready, the
/// sink kept and reused), while the server answers each request only after a delay, so
/// requests are aborted with their bodies in flight, 4 at a time, with and without gzip.
/// Every copy of a key still carries the same bytes, the documented body.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropped_delivery_futures_leave_bodies_intact() {
    for gzip in [false, true] {
        let srv = Raw::start(Box::new(|n, _| {
            Answer::Delay(Duration::from_millis(20 + (n as u64 * 37) % 60))
        }));
        let sid = id("p3drop");
        let base = tempfile::tempdir().unwrap();
        let (wal, _) = WalSink::open(base.path().join("wal"), opts(&sid)).unwrap();
        let wal = Arc::new(wal);
        let mut rng = Rng::new(11 + gzip as u64);
        let mut epochs = BTreeMap::new();
        for cp in 1..=6u64 {
            let recs = gen_records(&mut rng, 200, true, 60_000);
            wal.append_batch(recs.iter().map(|r| r.as_slice())).unwrap();
            wal.checkpoint(cp, b"").unwrap();
            epochs.insert(cp, recs);
        }
        wal.checkpoint_complete(6).unwrap();
        let url = srv.url(&format!(
            "max_records=25&max_bytes=32KiB&timeout=5s&concurrency=4&gzip={gzip}&newline=escape"
        ));
        let mut sink = HttpSink::new(Config::from_url(&url).unwrap()).unwrap();
        let mut drops = 0;
        for _ in 0..500 {
            if wal.health().backlog_epochs == 0 {
                break;
            }
            let budget = Duration::from_millis(30 + rng.below(250));
            match tokio::time::timeout(budget, deliver_ready(&wal, &mut sink)).await {
                Err(_) => drops += 1,
                Ok(Ok(_)) => {}
                Ok(Err(e)) => eprintln!("delivery error (retried): {e}"),
            }
        }
        assert_eq!(wal.health().backlog_epochs, 0, "not delivered");
        // Let aborted requests that still reach the server land, then compare.
        tokio::time::sleep(Duration::from_millis(300)).await;
        let seen = srv.seen();
        let repeats = check_raw(
            &seen,
            &sid,
            &epochs,
            25,
            32 << 10,
            true,
            gzip,
            &format!("drops gzip={gzip}"),
        );
        eprintln!(
            "gzip={gzip}: {drops} dropped deliveries, {} requests, {repeats} repeats",
            seen.len()
        );
        assert!(drops > 0);
    }
}

// ---------------------------------------------------------------------------------------
// 6. durable-buffer mode into HTTP through the blocking committer, many bodies in flight

/// Records appended durably by 4 threads (automatic checkpoints), then delivered by the
/// committer thread through `BlockingSink<HttpSink>` with 16 bodies in flight, every other
/// request failing; then the log as it was before delivery is reopened and delivered
/// again (a crash before any mark), with gzip. The epochs are read back from that copy with
/// `walsink::dump`; every key's copies are byte-identical and the documented bodies.
#[test]
fn durable_epochs_through_the_blocking_committer_replay_identically_plain() {
    durable_case(false);
}

#[test]
fn durable_epochs_through_the_blocking_committer_replay_identically_gzip() {
    durable_case(true);
}

fn durable_case(gzip: bool) {
    {
        let srv = Raw::start(every_other_fails());
        let sid = id("p3durable");
        let base = tempfile::tempdir().unwrap();
        let o = || opts(&sid).mode(walsink::Mode::Durable);
        let (wal, _) = WalSink::open(base.path().join("wal"), o()).unwrap();
        let wal = Arc::new(wal);
        let hs: Vec<_> = (0..4u64)
            .map(|t| {
                let wal = wal.clone();
                std::thread::spawn(move || {
                    let mut rng = Rng::new(t + 1000 * gzip as u64);
                    for _ in 0..12 {
                        let n = 1 + rng.below(25) as usize;
                        let recs = gen_records(&mut rng, n, true, 20_000);
                        wal.append_batch(recs.iter().map(|r| r.as_slice())).unwrap();
                    }
                })
            })
            .collect();
        for h in hs {
            h.join().unwrap();
        }
        copy_log(&base.path().join("wal"), &base.path().join("crash"));
        // The epochs as the log holds them.
        let mut epochs: BTreeMap<u64, Vec<Vec<u8>>> = BTreeMap::new();
        walsink::dump(
            Arc::new(walsink::storage::FsStorage::new(base.path().join("crash")).unwrap()),
            |id, _, e| {
                let recs: Vec<Vec<u8>> = e
                    .records()
                    .map(|r| r.map(|r| r.data.to_vec()))
                    .collect::<Result<_, _>>()
                    .map_err(|e| std::io::Error::other(e.to_string()))?;
                if let (Some(id), false) = (id, recs.is_empty()) {
                    epochs.insert(id, recs);
                }
                Ok(())
            },
        )
        .unwrap();
        assert!(epochs.len() > 5, "{} epochs", epochs.len());
        let url = srv.url(&format!(
            "max_records=4&max_bytes=16KiB&timeout=400ms&retries=3&concurrency=16&gzip={gzip}\
             &newline=escape"
        ));
        let run = |wal: &Arc<WalSink>| {
            let sink = walsink_tokio::BlockingSink::new(
                HttpSink::new(Config::from_url(&url).unwrap()).unwrap(),
            )
            .unwrap();
            let c = wal.spawn_committer(sink).unwrap();
            let start = std::time::Instant::now();
            while wal.health().backlog_epochs > 0 {
                assert!(
                    start.elapsed() < Duration::from_secs(25),
                    "{:?}",
                    wal.health()
                );
                std::thread::sleep(Duration::from_millis(20));
            }
            c.shutdown();
        };
        run(&wal);
        drop(wal);
        let (w2, report) = WalSink::open(base.path().join("crash"), o()).unwrap();
        assert_eq!(report.pending.len(), epochs.len());
        let w2 = Arc::new(w2);
        // Durable-mode epochs are complete at once, after a restart too? Deliver them.
        run(&w2);
        let seen = srv.seen();
        let repeats = check_raw(
            &seen,
            &sid,
            &epochs,
            4,
            16 << 10,
            true,
            gzip,
            &format!("durable gzip={gzip}"),
        );
        eprintln!(
            "gzip={gzip}: {} epochs, {} requests, {repeats} repeats",
            epochs.len(),
            seen.len()
        );
        assert!(repeats > 0);
    }
}

// ---------------------------------------------------------------------------------------
// 7. the cut at max_bytes, escaped lengths, and 256 bodies in flight

/// Records whose line is exactly max_bytes, one byte more or less, records of backslashes
/// that double when escaped, empty records, big after small after big (pooled buffers of
/// every size reused), one record per body with 256 in flight and every other request
/// failing: every body is the documented one, every copy identical.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn edge_sizes_and_256_in_flight_match_the_documented_cut() {
    let mb = 1000usize;
    for (gzip, esc, conc, max_records) in [
        (false, false, 1usize, 50usize),
        (true, true, 4, 50),
        (false, true, 256, 1),
        (true, false, 256, 2),
    ] {
        let srv = Raw::start(every_other_fails());
        let sid = id("p3edge");
        let base = tempfile::tempdir().unwrap();
        let (wal, _) = WalSink::open(base.path().join("wal"), opts(&sid)).unwrap();
        let wal = Arc::new(wal);
        let mut epochs = BTreeMap::new();
        let mut rng = Rng::new(conc as u64);
        for cp in 1..=3u64 {
            let mut recs: Vec<Vec<u8>> = Vec::new();
            for len in [mb - 2, mb - 1, mb, mb + 1, 0, 1, mb / 2, mb / 2 - 1, 3 * mb] {
                recs.push(vec![b'a' + cp as u8; len]);
                // The same length in backslashes: twice as long escaped.
                if esc {
                    recs.push(vec![b'\\'; len / 2]);
                    recs.push(vec![b'\n'; len / 2 + 1]);
                }
            }
            let more = gen_records(&mut rng, 60, esc, 3000);
            recs.extend(more);
            wal.append_batch(recs.iter().map(|r| r.as_slice())).unwrap();
            wal.checkpoint(cp, b"").unwrap();
            epochs.insert(cp, recs);
        }
        wal.checkpoint_complete(3).unwrap();
        let url = srv.url(&format!(
            "max_records={max_records}&max_bytes={mb}B&timeout=2s&retries=5&concurrency={conc}\
             &gzip={gzip}&newline={}",
            if esc { "escape" } else { "reject" }
        ));
        let mut sink = HttpSink::new(Config::from_url(&url).unwrap()).unwrap();
        deliver_everything(&wal, &mut sink).await;
        let what = format!("gzip={gzip} escape={esc} concurrency={conc}");
        let seen = srv.seen();
        let repeats = check_raw(&seen, &sid, &epochs, max_records, mb, esc, gzip, &what);
        eprintln!("{what}: {} requests, {repeats} repeats", seen.len());
    }
}
