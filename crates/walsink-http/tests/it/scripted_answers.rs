//! Every answer a receiver can give, scripted byte by byte by a raw TCP server, is read as
//! docs/targets/http.md says: hostile `Retry-After` values neither hang nor panic, every
//! redirect is permanent and never followed, an informational answer before the final 200 is
//! not a refusal, a 2xx with a huge body is delivered once, a hang and an endless 2xx body
//! are retried with identical bytes; and the documented cut holds on the wire, at its edges,
//! with escaped records and with a refused chunk among chunks in flight together.

use crate::support::*;
use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use walsink::SinkErrorClass;
use walsink_http::chunking::{split, Newline};
use walsink_tokio::deliver_ready;

/// One request as the raw server read it.
#[derive(Debug, Clone)]
struct Req {
    method: String,
    path: String,
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

/// What the server does with one request.
enum Answer {
    /// Write these bytes, then keep the connection for the next request.
    Raw(Vec<u8>),
    /// Write these bytes, then close.
    RawClose(Vec<u8>),
    /// Never answer (hold the connection open for this long, then close).
    Hang(Duration),
    /// Write the head, then trickle body bytes forever (until the client goes away).
    Trickle(Vec<u8>),
}

type Script = Box<dyn Fn(usize, &Req) -> Answer + Send + Sync>;

struct Raw {
    port: u16,
    seen: Arc<Mutex<Vec<Req>>>,
    script: Arc<Mutex<Script>>,
}

fn ok() -> Answer {
    Answer::Raw(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n".to_vec())
}

fn status(code: u16, extra: &str) -> Answer {
    Answer::Raw(format!("HTTP/1.1 {code} X\r\n{extra}content-length: 4\r\n\r\nnope").into_bytes())
}

impl Raw {
    fn start(script: Script) -> Raw {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let script = Arc::new(Mutex::new(script));
        let (s2, sc2) = (seen.clone(), script.clone());
        std::thread::spawn(move || {
            for conn in l.incoming() {
                let Ok(conn) = conn else { return };
                let (s3, sc3) = (s2.clone(), sc2.clone());
                std::thread::spawn(move || serve(conn, s3, sc3));
            }
        });
        Raw { port, seen, script }
    }
    fn url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{path}", self.port)
    }
    fn set(&self, script: Script) {
        *self.script.lock().unwrap() = script;
    }
    fn seen(&self) -> Vec<Req> {
        self.seen.lock().unwrap().clone()
    }
}

fn read_req(r: &mut BufReader<TcpStream>) -> Option<Req> {
    let mut line = String::new();
    if r.read_line(&mut line).ok()? == 0 {
        return None;
    }
    let mut parts = line.split_whitespace();
    let method = parts.next()?.to_string();
    let path = parts.next()?.to_string();
    let mut headers = HashMap::new();
    loop {
        let mut h = String::new();
        if r.read_line(&mut h).ok()? == 0 {
            return None;
        }
        let h = h.trim_end();
        if h.is_empty() {
            break;
        }
        let (k, v) = h.split_once(':')?;
        headers.insert(k.trim().to_ascii_lowercase(), v.trim().to_string());
    }
    let len: usize = headers
        .get("content-length")
        .map_or(0, |v| v.parse().unwrap());
    let mut body = vec![0; len];
    r.read_exact(&mut body).ok()?;
    Some(Req {
        method,
        path,
        headers,
        body,
    })
}

fn serve(conn: TcpStream, seen: Arc<Mutex<Vec<Req>>>, script: Arc<Mutex<Script>>) {
    let mut w = conn.try_clone().unwrap();
    let mut r = BufReader::new(conn);
    while let Some(req) = read_req(&mut r) {
        let n = {
            let mut s = seen.lock().unwrap();
            s.push(req.clone());
            s.len() - 1
        };
        let answer = (script.lock().unwrap())(n, &req);
        match answer {
            Answer::Raw(b) => {
                if w.write_all(&b).is_err() {
                    return;
                }
            }
            Answer::RawClose(b) => {
                let _ = w.write_all(&b);
                return;
            }
            Answer::Hang(d) => {
                std::thread::sleep(d);
                return;
            }
            Answer::Trickle(head) => {
                if w.write_all(&head).is_err() {
                    return;
                }
                loop {
                    std::thread::sleep(Duration::from_millis(20));
                    if w.write_all(b"1\r\nx\r\n").is_err() {
                        return;
                    }
                }
            }
        }
    }
}

/// Keeps the first body of each key (a deduplicating receiver) and checks every repeat of
/// a key carried the same bytes; returns the records in key order.
fn dedup(reqs: &[Req], sid: &str, newline: Newline) -> Vec<Vec<u8>> {
    let mut first: HashMap<String, Vec<u8>> = HashMap::new();
    for r in reqs.iter().filter(|r| r.key().starts_with(sid)) {
        match first.get(&r.key()) {
            Some(b) => assert_eq!(b, &r.body, "key {} repeated with other bytes", r.key()),
            None => {
                first.insert(r.key(), r.body.clone());
            }
        }
    }
    let mut keys: Vec<(u64, u64, String)> = first
        .keys()
        .map(|k| {
            let p: Vec<&str> = k.rsplitn(4, ':').collect();
            (p[1].parse().unwrap(), p[0].parse().unwrap(), k.clone())
        })
        .collect();
    keys.sort();
    keys.iter()
        .flat_map(|(_, _, k)| split(&first[k], newline))
        .collect()
}

async fn bounded<T>(f: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(Duration::from_secs(120), f)
        .await
        .expect("the delivery hung for 2 minutes")
}

#[tokio::test(flavor = "multi_thread")]
async fn hostile_retry_after_values_neither_hang_nor_panic() {
    let values = [
        "-5",
        "99999999999999999999999",
        "18446744073709551615",
        "Thu, 01 Jan 1970 00:00:00 GMT",
        "Fri, 31 Dec 9999 23:59:59 GMT",
        "garbage",
        "",
        "1.5",
        "  3600  ",
    ];
    let n = values.len();
    let srv = Raw::start(Box::new(move |i, _| {
        if i < n {
            status(
                if i % 2 == 0 { 503 } else { 429 },
                &format!("retry-after: {}\r\n", values[i]),
            )
        } else {
            ok()
        }
    }));
    let sid = id("p2-ra");
    let log = open(&sid);
    let recs = records("ra", 0, 7);
    epoch(&log, 1, &recs);
    let mut s = sink(&format!(
        "{}?retries=20&retry_after_max=200ms&timeout=5s",
        srv.url("/in")
    ));
    assert_eq!(bounded(deliver_ready(&log.wal, &mut s)).await.unwrap(), 1);
    assert_eq!(dedup(&srv.seen(), &sid, Newline::Reject), recs);
    assert_eq!(srv.seen().len(), n + 1);
}

#[tokio::test(flavor = "multi_thread")]
async fn every_redirect_is_permanent_and_never_followed() {
    for code in [301u16, 302, 303, 307, 308] {
        let srv = Raw::start(Box::new(move |_, req| {
            if req.path == "/in" {
                status(code, "location: /elsewhere\r\n")
            } else {
                ok()
            }
        }));
        let sid = id("p2-redir");
        let log = open(&sid);
        epoch(&log, 1, &records("r", 0, 3));
        let mut s = sink(&format!("{}?retries=2", srv.url("/in")));
        let e = bounded(deliver_ready(&log.wal, &mut s)).await.unwrap_err();
        let se = sink_error(&e);
        assert_eq!(se.class(), SinkErrorClass::Permanent, "{code}: {se}");
        assert!(se.to_string().contains(&code.to_string()), "{se}");
        let seen = srv.seen();
        assert_eq!(seen.len(), 1, "{code}: {seen:?}");
        assert!(
            seen.iter().all(|r| r.method == "POST" && r.path == "/in"),
            "{code} was followed: {seen:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn an_informational_answer_before_the_final_200_is_not_a_refusal() {
    // RFC 9110 §15.2: a client must accept 1xx answers before the final one. The receiver
    // took the chunk and answered 200 in the end.
    let srv = Raw::start(Box::new(|_, _| {
        Answer::Raw(
            b"HTTP/1.1 103 Early Hints\r\nlink: </x>; rel=preload\r\n\r\nHTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n"
                .to_vec(),
        )
    }));
    let sid = id("p2-1xx");
    let log = open(&sid);
    let recs = records("i", 0, 5);
    epoch(&log, 1, &recs);
    let mut s = sink(&format!("{}?retries=0", srv.url("/in")));
    let r = bounded(deliver_ready(&log.wal, &mut s)).await;
    assert_eq!(r.map_err(|e| e.to_string()), Ok(1));
    assert_eq!(dedup(&srv.seen(), &sid, Newline::Reject), recs);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_2xx_with_a_huge_body_is_delivered_once() {
    let big = 24 << 20;
    let srv = Raw::start(Box::new(move |_, _| {
        let mut b = format!("HTTP/1.1 200 OK\r\ncontent-length: {big}\r\n\r\n").into_bytes();
        b.resize(b.len() + big, b'z');
        Answer::Raw(b)
    }));
    let sid = id("p2-bigok");
    let log = open(&sid);
    let recs = records("b", 0, 30);
    epoch(&log, 1, &recs);
    let mut s = sink(&format!("{}?max_records=10&timeout=60s", srv.url("/in")));
    assert_eq!(bounded(deliver_ready(&log.wal, &mut s)).await.unwrap(), 1);
    let seen = srv.seen();
    assert_eq!(seen.len(), 3, "three chunks, each once");
    assert_eq!(dedup(&seen, &sid, Newline::Reject), recs);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_hang_and_an_endless_2xx_body_are_retried_with_identical_bytes() {
    let srv = Raw::start(Box::new(|i, _| match i {
        0 => Answer::Hang(Duration::from_secs(3)),
        1 => Answer::Trickle(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n".to_vec()),
        2 => Answer::RawClose(b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\nshort".to_vec()),
        _ => ok(),
    }));
    let sid = id("p2-hang");
    let log = open(&sid);
    let recs = records("h", 0, 4);
    epoch(&log, 1, &recs);
    let mut s = sink(&format!(
        "{}?timeout=400ms&retries=5&gzip=true",
        srv.url("/in")
    ));
    assert_eq!(bounded(deliver_ready(&log.wal, &mut s)).await.unwrap(), 1);
    let seen = srv.seen();
    assert_eq!(seen.len(), 4);
    for r in &seen {
        assert_eq!(r.key(), seen[0].key());
        assert_eq!(r.body, seen[0].body, "a retry sent other bytes");
        assert_eq!(
            r.headers.get("walsink-chunk"),
            seen[0].headers.get("walsink-chunk")
        );
    }
    let mut d = flate2_free_gunzip(&seen[0].body);
    assert_eq!(split(&std::mem::take(&mut d), Newline::Reject), recs);
}

/// gunzip without a dev-dependency: shell out to `gzip -dc`.
fn flate2_free_gunzip(b: &[u8]) -> Vec<u8> {
    let mut c = std::process::Command::new("gzip")
        .arg("-dc")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    c.stdin.take().unwrap().write_all(b).unwrap();
    let o = c.wait_with_output().unwrap();
    assert!(o.status.success());
    o.stdout
}

#[tokio::test(flavor = "multi_thread")]
async fn the_cut_at_its_edges() {
    let srv = Raw::start(Box::new(|_, _| ok()));
    let sid = id("p2-cut");
    let log = open(&sid);
    // max_bytes=10: "aaaa\n" + "bbbb\n" is exactly 10 bytes and fits; a 25-byte record
    // goes alone; an empty record is one byte.
    let recs: Vec<Vec<u8>> = vec![
        b"aaaa".to_vec(),
        b"bbbb".to_vec(),
        b"c".repeat(25),
        b"".to_vec(),
        b"ddddddddd".to_vec(),
        b"".to_vec(),
    ];
    epoch(&log, 1, &recs);
    let mut s = sink(&format!("{}?max_bytes=10&max_records=2", srv.url("/in")));
    assert_eq!(bounded(deliver_ready(&log.wal, &mut s)).await.unwrap(), 1);
    let seen = srv.seen();
    let heads: Vec<(String, String)> = seen
        .iter()
        .map(|r| (r.key(), r.headers["walsink-chunk"].clone()))
        .collect();
    let want_bodies: Vec<&[u8]> = vec![
        b"aaaa\nbbbb\n",
        b"ccccccccccccccccccccccccc\n",
        b"\n",
        b"ddddddddd\n",
        b"\n",
    ];
    let bodies: Vec<&[u8]> = seen.iter().map(|r| r.body.as_slice()).collect();
    assert_eq!(bodies, want_bodies, "{heads:?}");
    assert!(
        heads[0].1.starts_with("first=0; count=2; last=false"),
        "{heads:?}"
    );
    assert!(
        heads[2].1.starts_with("first=3; count=1; last=false"),
        "{heads:?}"
    );
    assert!(
        heads[4].1.starts_with("first=5; count=1; last=true"),
        "{heads:?}"
    );
    assert_eq!(dedup(&seen, &sid, Newline::Reject), recs);
}

#[tokio::test(flavor = "multi_thread")]
async fn escaped_records_round_trip_through_split() {
    let srv = Raw::start(Box::new(|_, _| ok()));
    let sid = id("p2-esc");
    let log = open(&sid);
    let recs: Vec<Vec<u8>> = vec![
        b"a\nb".to_vec(),
        b"\\".to_vec(),
        b"\\n".to_vec(),
        b"x\\".to_vec(),
        b"\n".to_vec(),
        b"\\\\\n\\".to_vec(),
        b"crlf\r\n".to_vec(),
        b"".to_vec(),
        vec![0, 0xff, b'\n', 0xfe],
    ];
    epoch(&log, 1, &recs);
    let mut s = sink(&format!("{}?newline=escape&max_records=3", srv.url("/in")));
    assert_eq!(bounded(deliver_ready(&log.wal, &mut s)).await.unwrap(), 1);
    assert_eq!(dedup(&srv.seen(), &sid, Newline::Escape), recs);
    assert!(srv.seen()[0].headers["walsink-chunk"].ends_with("newline=escape"));
}

#[tokio::test(flavor = "multi_thread")]
async fn concurrency_with_one_chunk_refused_then_fixed_holds_each_record_once() {
    let srv = Raw::start(Box::new(|_, req| {
        if req.key().ends_with(":5") {
            status(400, "")
        } else {
            ok()
        }
    }));
    let sid = id("p2-conc");
    let log = open(&sid);
    let recs = records("c", 0, 100);
    epoch(&log, 1, &recs);
    epoch(&log, 2, &records("c", 100, 130));
    let mut s = sink(&format!("{}?max_records=7&concurrency=4", srv.url("/in")));
    let e = bounded(deliver_ready(&log.wal, &mut s)).await.unwrap_err();
    assert_eq!(sink_error(&e).class(), SinkErrorClass::Permanent);
    assert!(sink_error(&e).to_string().contains(":1:5"), "{e}");
    assert!(
        srv.seen().iter().all(|r| !r.key().contains(":2:")),
        "epoch 2 started before epoch 1 was delivered"
    );
    let before: Vec<String> = srv.seen().iter().map(Req::key).collect();
    srv.set(Box::new(|_, _| ok()));
    assert_eq!(bounded(deliver_ready(&log.wal, &mut s)).await.unwrap(), 2);
    let mut want = recs.clone();
    want.extend(records("c", 100, 130));
    assert_eq!(dedup(&srv.seen(), &sid, Newline::Reject), want);
    // Chunk 5 was refused; each key is answered 2xx once at most before.
    assert!(before.iter().any(|k| k.ends_with(":1:5")));
}
