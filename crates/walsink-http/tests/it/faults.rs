//! Each failure an HTTP receiver can show, injected by the in-process receiver: 503s, 429s
//! with `Retry-After` (seconds, a date, too long), answers slower than the timeout,
//! connections closed before and in the middle of an answer, refused connections, other 4xx,
//! records holding newlines, credentials. After each, the receiver holds every record once
//! (deduplicated by `Idempotency-Key`), in order, and a replay sends the same bodies.

use crate::support::*;
use std::time::{Duration, Instant};
use walsink::SinkErrorClass;
use walsink_http::receiver::{Fault, Mode, Receiver};
use walsink_tokio::deliver_ready;

fn no_conflicts(r: &Receiver) {
    r.seen(|s| assert!(s.conflicts.is_empty(), "{:?}", s.conflicts));
}

#[tokio::test(flavor = "multi_thread")]
async fn every_fault_is_retried_and_each_record_arrives_once_in_order() {
    let r = Receiver::start(Mode::Keep).await.unwrap();
    let sid = id("faults");
    let log = open(&sid);
    let mut want = Vec::new();
    for cp in 1..=3 {
        let recs = records("f", cp * 100, cp * 100 + 40);
        epoch(&log, cp, &recs);
        want.extend(recs);
    }
    r.inject([
        Fault::Status(503),
        Fault::RetryAfter(429, "0".into()),
        Fault::Slow(Duration::from_millis(700)),
        Fault::CloseBeforeAnswer { keep: false },
        Fault::Pass,
        Fault::CloseBeforeAnswer { keep: true },
        Fault::CloseMidAnswer,
        Fault::Status(500),
        Fault::Status(408),
        Fault::Status(409),
        Fault::Status(425),
        Fault::Status(502),
    ]);
    let mut sink = sink(&format!(
        "{}?max_records=10&timeout=300ms&retries=20",
        r.url("/in")
    ));
    assert_eq!(deliver_ready(&log.wal, &mut sink).await.unwrap(), 3);
    assert_eq!(r.records(&sid, 0), want);
    let arrival = r.arrival(&sid, 0);
    let mut sorted = arrival.clone();
    sorted.sort();
    assert_eq!(
        arrival, sorted,
        "one chunk in flight: first arrivals in key order"
    );
    assert_eq!(arrival.len(), 12, "3 epochs of 4 chunks");
    r.seen(|s| {
        assert_eq!(s.faults, 11);
        // Slow, closed after keeping, closed mid-answer: kept, then sent again.
        assert!(s.duplicates >= 3, "{} duplicates", s.duplicates);
    });
    no_conflicts(&r);
}

#[tokio::test(flavor = "multi_thread")]
async fn retry_after_is_honoured_in_seconds_and_as_a_date_and_capped() {
    let r = Receiver::start(Mode::Keep).await.unwrap();
    let sid = id("retry-after");
    let log = open(&sid);
    let recs = records("r", 0, 5);
    epoch(&log, 1, &recs);
    epoch(&log, 2, &recs);
    epoch(&log, 3, &recs);
    let in_4s = httpdate::fmt_http_date(std::time::SystemTime::now() + Duration::from_secs(4));
    r.inject([
        Fault::RetryAfter(503, "1".into()),
        Fault::RetryAfter(429, in_4s),
        // An hour, cut to retry_after_max.
        Fault::RetryAfter(429, "3600".into()),
    ]);
    let mut sink = sink(&format!("{}?retry_after_max=2500ms", r.url("in")));
    let t = Instant::now();
    assert_eq!(deliver_ready(&log.wal, &mut sink).await.unwrap(), 3);
    let took = t.elapsed();
    // 1 s; then at least 1.9 s until the date (whole seconds, set 4 s ahead, met about 1 s
    // later); then 2.5 s instead of an hour. Lower bounds only, and a bound far below the
    // hour.
    assert!(took >= Duration::from_millis(5300), "waited only {took:?}");
    assert!(
        took < Duration::from_secs(120),
        "the cap did not hold: {took:?}"
    );
    assert_eq!(r.records(&sid, 0).len(), 15);
    no_conflicts(&r);
}

#[tokio::test(flavor = "multi_thread")]
async fn other_4xx_is_permanent_with_the_status_and_the_start_of_the_body() {
    let r = Receiver::start(Mode::Keep).await.unwrap();
    for status in [400, 404, 413, 422, 307] {
        let sid = id(&format!("perm{status}"));
        let log = open(&sid);
        let recs = records("p", 0, 30);
        epoch(&log, 1, &recs);
        r.inject([Fault::Pass, Fault::Status(status)]);
        let mut sink = sink(&format!("{}?max_records=10", r.url("in")));
        let e = deliver_ready(&log.wal, &mut sink).await.unwrap_err();
        let se = sink_error(&e);
        assert_eq!(se.class(), SinkErrorClass::Permanent, "{status}: {se}");
        let msg = se.to_string();
        assert!(
            msg.contains(&format!("HTTP {status}")) && msg.contains("injected failure"),
            "{msg}"
        );
        assert!(
            msg.contains(&format!("{sid}:0:1:1")),
            "names the key: {msg}"
        );
        // Nothing skipped: the epoch is still due, and goes through once the receiver takes it.
        assert_eq!(deliver_ready(&log.wal, &mut sink).await.unwrap(), 1);
        assert_eq!(r.records(&sid, 0), recs);
    }
    no_conflicts(&r);
}

#[tokio::test(flavor = "multi_thread")]
async fn used_up_retries_fail_retryably_and_answered_chunks_are_not_sent_again() {
    let r = Receiver::start(Mode::Keep).await.unwrap();
    let sid = id("resume");
    let log = open(&sid);
    let recs = records("c", 0, 50);
    epoch(&log, 1, &recs);
    r.inject([Fault::Pass, Fault::Pass, Fault::Status(503)]);
    let mut sink = sink(&format!("{}?max_records=10&retries=0", r.url("in")));
    let e = deliver_ready(&log.wal, &mut sink).await.unwrap_err();
    let se = sink_error(&e);
    assert_eq!(se.class(), SinkErrorClass::Retryable, "{se}");
    assert!(se.to_string().contains("HTTP 503"), "{se}");
    assert_eq!(r.seen(|s| s.requests), 3);
    assert_eq!(deliver_ready(&log.wal, &mut sink).await.unwrap(), 1);
    // Chunks 2, 3 and 4 only.
    r.seen(|s| assert_eq!((s.requests, s.duplicates), (6, 0)));
    assert_eq!(r.records(&sid, 0), recs);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_replay_sends_the_same_bytes_under_the_same_keys() {
    for params in [
        "max_records=7&max_bytes=100",
        "max_bytes=64&gzip=true&concurrency=3",
    ] {
        let r = Receiver::start(Mode::Keep).await.unwrap();
        let sid = id("replay");
        let log = open(&sid);
        let recs = records("x", 0, 200);
        epoch(&log, 1, &recs);
        let url = format!("{}?{params}", r.url("in"));
        // Deliver, "crash" before the mark (a new sink, the epoch read again), deliver again.
        let first = {
            let mut d = log.wal.deliverer().unwrap();
            let walsink::Next::Deliver(p) = d.next_step().unwrap() else {
                panic!("epoch 1 is due")
            };
            let e = d.read(&p).unwrap();
            walsink_tokio::AsyncSink::deliver(&mut sink(&url), &e)
                .await
                .unwrap();
            r.seen(|s| s.requests)
        };
        assert_eq!(deliver_ready(&log.wal, &mut sink(&url)).await.unwrap(), 1);
        r.seen(|s| {
            assert_eq!(s.requests, 2 * first, "{params}");
            assert_eq!(
                s.duplicates, first,
                "{params}: every key repeated with the same body"
            );
        });
        no_conflicts(&r);
        assert_eq!(r.records(&sid, 0), recs, "{params}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_record_holding_a_newline_is_refused_by_position_or_escaped() {
    let r = Receiver::start(Mode::Keep).await.unwrap();
    let sid = id("newline");
    let log = open(&sid);
    let recs: Vec<Vec<u8>> = vec![
        b"a".to_vec(),
        b"b\\c".to_vec(),
        b"line\none".to_vec(),
        b"".to_vec(),
    ];
    epoch(&log, 4, &recs);
    let e = deliver_ready(&log.wal, &mut sink(&r.url("in")))
        .await
        .unwrap_err();
    let se = sink_error(&e);
    assert_eq!(se.class(), SinkErrorClass::Permanent);
    let msg = se.to_string();
    assert!(
        msg.contains("record 2 of checkpoint 4")
            && msg.contains("byte 4")
            && msg.contains("newline=escape"),
        "{msg}"
    );
    assert_eq!(
        r.seen(|s| s.requests),
        0,
        "nothing sent before the bad record"
    );
    let mut escaped = sink(&format!("{}?newline=escape", r.url("in")));
    assert_eq!(deliver_ready(&log.wal, &mut escaped).await.unwrap(), 1);
    assert_eq!(r.records(&sid, 0), recs);
    r.seen(|s| assert_eq!(&s.kept[0].body[..], b"a\nb\\\\c\nline\\none\n\n"));
}

#[tokio::test(flavor = "multi_thread")]
async fn refused_connections_and_unknown_certificates_are_retryable() {
    // A port nothing listens on (bound, then closed).
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let sid = id("refused");
    let log = open(&sid);
    epoch(&log, 1, &records("n", 0, 3));
    let mut s = sink(&format!("http://127.0.0.1:{port}/in?retries=1"));
    let e = deliver_ready(&log.wal, &mut s).await.unwrap_err();
    let se = sink_error(&e);
    assert_eq!(se.class(), SinkErrorClass::Retryable);
    assert!(se.to_string().contains("cannot connect"), "{se}");
    // A TLS receiver whose certificate no trusted root signed: retried, never skipped.
    let cert = rcgen::generate_simple_self_signed(vec!["localhost".to_string()]).unwrap();
    let tls = walsink_http::receiver::Tls {
        certs: vec![cert.cert.der().to_vec()],
        key: cert.key_pair.serialize_der(),
    };
    let r = Receiver::start_with(Mode::Keep, Some(tls)).await.unwrap();
    let mut s = sink(&format!("{}?retries=0", r.url("in")));
    let e = deliver_ready(&log.wal, &mut s).await.unwrap_err();
    let se = sink_error(&e);
    assert_eq!(se.class(), SinkErrorClass::Retryable);
    assert!(se.to_string().contains("certificate"), "{se}");
    assert_eq!(r.seen(|s| s.requests), 0);
}

#[tokio::test(flavor = "multi_thread")]
async fn credentials_go_out_and_never_show() {
    let r = Receiver::start(Mode::Keep).await.unwrap();
    r.require_auth("Bearer s3cret-token");
    let sid = id("auth");
    let log = open(&sid);
    let recs = records("a", 0, 10);
    epoch(&log, 1, &recs);
    // A variable name unique to this test (tests run in threads of one process).
    let var = format!("WALSINK_HTTP_TEST_TOKEN_{}", std::process::id());
    std::env::set_var(&var, "wrong-token");
    let mut s = sink(&format!("{}?bearer_env={var}", r.url("in")));
    let e = deliver_ready(&log.wal, &mut s).await.unwrap_err();
    let msg = sink_error(&e).to_string();
    assert!(msg.contains("HTTP 401"), "{msg}");
    assert!(
        !msg.contains("wrong-token") && !format!("{s:?}").contains("wrong-token"),
        "{msg}"
    );
    std::env::set_var(&var, "s3cret-token");
    let mut s = sink(&format!("{}?bearer_env={var}", r.url("in")));
    assert!(!format!("{s:?}").contains("s3cret"));
    assert_eq!(deliver_ready(&log.wal, &mut s).await.unwrap(), 1);
    assert_eq!(r.records(&sid, 0), recs);
    // Basic credentials from the URL: sent, and masked everywhere.
    r.require_auth("Basic dTpwQHNz"); // u:p@ss
    let sid = id("basic");
    let log = open(&sid);
    epoch(&log, 1, &recs);
    let url = r.url("in").replace("http://", "http://u:p%40ss@");
    let mut s = sink(&url);
    assert!(!format!("{s:?}").contains("p@ss") && !format!("{s:?}").contains("p%40ss"));
    assert_eq!(deliver_ready(&log.wal, &mut s).await.unwrap(), 1);
    r.require_auth("Basic other");
    let log2 = open(&id("basic2"));
    epoch(&log2, 1, &recs);
    let e = deliver_ready(&log2.wal, &mut sink(&url)).await.unwrap_err();
    let msg = sink_error(&e).to_string();
    assert!(msg.contains("HTTP 401") && msg.contains("u:***@"), "{msg}");
    assert!(!msg.contains("p@ss") && !msg.contains("p%40ss"), "{msg}");
    let unset = walsink_http::HttpSink::new(
        walsink_http::Config::from_url(&format!("{}?bearer_env=WALSINK_NO_SUCH_VAR", r.url("in")))
            .unwrap(),
    )
    .unwrap_err();
    assert!(unset.to_string().contains("WALSINK_NO_SUCH_VAR"), "{unset}");
}

/// The start-up check (`HttpSink::connect`) against a receiver that accepts connections and
/// never answers: it gives up after `CONNECT_CHECK_TIMEOUT` with a retryable error, even
/// with the default 30 s request timeout, and names what it waited for.
#[tokio::test(flavor = "multi_thread")]
async fn the_start_up_check_gives_up_on_a_silent_receiver_within_its_bound() {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    std::thread::spawn(move || {
        let mut held = Vec::new();
        for c in l.incoming().take(8) {
            held.push(c);
        }
        std::thread::sleep(Duration::from_secs(120));
    });
    let s = sink(&format!("http://127.0.0.1:{port}/in"));
    let started = Instant::now();
    let e = s.connect().await.unwrap_err();
    let took = started.elapsed();
    assert!(
        took >= Duration::from_secs(5) && took < Duration::from_secs(15),
        "{took:?}"
    );
    assert_eq!(e.class(), SinkErrorClass::Retryable, "{e}");
    assert!(e.to_string().contains("timeout of 5s"), "{e}");
}

#[test]
fn a_password_with_url_delimiters_never_shows() {
    let mut leaks = Vec::new();
    for pw in [
        "s3cr#tPW",
        "s3cr?tPW",
        "s3cr/tPW",
        "s3cr tPW",
        "s3cr@tPW",
        "s3cr\\tPW",
    ] {
        let url = format!("http://alice:{pw}@127.0.0.1:9/in");
        let shown = match walsink_http::Config::from_url(&url) {
            Ok(c) => format!("{c} {c:?}"),
            Err(e) => format!("{e} {e:?}"),
        };
        if shown.contains("tPW") {
            leaks.push(format!("password {pw:?} shows: {shown}"));
        }
    }
    assert!(leaks.is_empty(), "{leaks:#?}");
}
