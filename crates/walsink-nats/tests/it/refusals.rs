//! What the stream refuses is refused once and named, and nothing after it is skipped: a
//! missing stream (permanent unless `create=true`), a subject the stream does not capture
//! (named as such, not blamed on a restart), and a record over the server's `max_payload`
//! (permanent, the record after it not published).

use crate::common::*;
use std::time::Duration;
use walsink::SinkErrorClass;
use walsink_nats::NatsSink;
use walsink_tokio::AsyncSink;

/// The URL doc: "`subject` … the stream must capture it". A subject the stream does not
/// capture can never be delivered; the error must say so, not blame a JetStream restart.
#[tokio::test(flavor = "multi_thread")]
#[cfg_attr(
    not(servers),
    ignore = "needs WALSINK_TEST_SERVERS=1 and a local NATS with JetStream"
)]
async fn a_subject_the_stream_does_not_capture_is_named_as_such() {
    let s = TestStream::new("probe2-subj", None).await;
    let id = walsink_tokio::conformance::unique_id("p2-subj");
    let (_d, wal) = log(&id);
    seal(&wal, 1, &numbered(0, 3));
    let e = epochs(&wal).remove(0);
    let mut cfg = s.config();
    cfg.subject = format!("{}.elsewhere", s.subject);
    cfg.timeout = Duration::from_secs(2);
    let mut sink = NatsSink::new(cfg).unwrap();
    let err = bounded(sink.deliver(&e)).await.unwrap_err();
    let msg = err.to_string();
    s.delete().await;
    assert!(
        msg.contains("captur") || msg.contains("not cover") || msg.contains("not in the stream"),
        "the error does not say that the stream does not capture the subject: {msg}"
    );
    assert!(!msg.contains("restarting"), "blames a restart: {msg}");
}

/// The failure table: "a record over the server's `max_payload` | permanent". Nothing is
/// skipped: the record after it is not published, the next attempt fails the same way.
#[tokio::test(flavor = "multi_thread")]
#[cfg_attr(
    not(servers),
    ignore = "needs WALSINK_TEST_SERVERS=1 and a local NATS with JetStream"
)]
async fn a_record_over_max_payload_is_permanent_and_nothing_is_skipped() {
    let s = TestStream::new("probe2-payload", None).await;
    let id = walsink_tokio::conformance::unique_id("p2-payload");
    let (_d, wal) = log(&id);
    let recs = vec![b"before".to_vec(), vec![b'x'; 8 << 20], b"after".to_vec()];
    seal(&wal, 1, &recs);
    let e = epochs(&wal).remove(0);
    let mut cfg = s.config();
    cfg.timeout = Duration::from_secs(3);
    let mut sink = NatsSink::new(cfg).unwrap();
    let mut results = Vec::new();
    for _ in 0..2 {
        results.push(bounded(sink.deliver(&e)).await);
    }
    let held = s.read().await;
    s.delete().await;
    for r in &results {
        let err = r.as_ref().expect_err("an 8 MiB record was acknowledged");
        assert_eq!(err.class(), SinkErrorClass::Permanent, "{err}");
        assert!(err.to_string().contains("record 1"), "{err}");
    }
    let payloads: Vec<Vec<u8>> = held.into_iter().map(|(_, p)| p).collect();
    assert!(
        !payloads.iter().any(|p| p == b"after"),
        "the record after the refused one was stored"
    );
    assert!(payloads.len() <= 1, "{} stored", payloads.len());
}

#[tokio::test(flavor = "multi_thread")]
#[cfg_attr(
    not(servers),
    ignore = "needs WALSINK_TEST_SERVERS=1 and a local NATS with JetStream"
)]
async fn a_missing_stream_is_permanent_unless_created() {
    let u = walsink_tokio::conformance::unique_id("missing").replace(['.', '-'], "_");
    let mut cfg =
        walsink_nats::Config::new(format!("WALSINK_TEST_{u}"), format!("walsink-test.{u}"));
    let mut sink = NatsSink::new(cfg.clone()).unwrap();
    let e = sink.connect().await.unwrap_err();
    assert_eq!(e.class(), SinkErrorClass::Permanent, "{e}");
    assert!(e.to_string().contains("create=true"), "{e}");
    assert_eq!(
        e.code(),
        Some("10059"),
        "JetStream's number is the code: {e}"
    );
    cfg.create = true;
    let mut sink = NatsSink::new(cfg.clone()).unwrap();
    sink.connect().await.unwrap();
    let (_d, wal) = log("created");
    seal(&wal, 1, &numbered(0, 10));
    walsink_tokio::deliver_ready(&wal, &mut sink).await.unwrap();
    let _ = js().await.delete_stream(&cfg.stream).await;
}
