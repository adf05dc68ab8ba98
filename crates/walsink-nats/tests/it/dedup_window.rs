//! JetStream's duplicate window decides what a replay does: a replay within the window is
//! dropped by the stream (each record stored once), a replay after it is stored twice and
//! flagged, and an epoch older than the window is shown in `NatsSink::status()` and cleared
//! by the next delivery within it.

use crate::common::*;
use std::time::Duration;
use walsink_nats::{message_id, NatsSink};
use walsink_tokio::AsyncSink;

#[tokio::test(flavor = "multi_thread")]
#[cfg_attr(
    not(servers),
    ignore = "needs WALSINK_TEST_SERVERS=1 and a local NATS with JetStream"
)]
async fn a_replay_within_the_window_is_dropped_by_the_stream() {
    let s = TestStream::new("replay", None).await;
    let id = walsink_tokio::conformance::unique_id("replay");
    let (_d, wal) = log(&id);
    let want = numbered(0, 3000);
    seal(&wal, 5, &want);
    let e = epochs(&wal).remove(0);
    let mut first = NatsSink::new(s.config()).unwrap();
    first.deliver(&e).await.unwrap();
    // A second life delivers the same epoch again, as after a crash before the mark.
    let mut second = NatsSink::new(s.config()).unwrap();
    second.deliver(&e).await.unwrap();
    let st = second.status().get();
    assert_eq!((st.published, st.duplicates), (0, 3000), "{st:?}");
    assert!(
        st.duplicate_window.is_some() && st.beyond_window.is_none(),
        "{st:?}"
    );
    let held = s.read().await;
    assert_eq!(held.len(), 3000);
    assert_eq!(held[17].0, message_id(&id, 0, 5, 17));
    assert_eq!(held.into_iter().map(|(_, p)| p).collect::<Vec<_>>(), want);
    s.delete().await;
}

#[tokio::test(flavor = "multi_thread")]
#[cfg_attr(
    not(servers),
    ignore = "needs WALSINK_TEST_SERVERS=1 and a local NATS with JetStream"
)]
async fn a_replay_after_the_window_is_stored_twice_and_flagged() {
    let window = Duration::from_millis(500);
    let s = TestStream::new("window", Some(window)).await;
    let id = walsink_tokio::conformance::unique_id("window");
    let (_d, wal) = log(&id);
    seal(&wal, 1, &numbered(0, 100));
    let e = epochs(&wal).remove(0);
    let mut sink = NatsSink::new(s.config()).unwrap();
    let status = sink.status();
    sink.deliver(&e).await.unwrap();
    assert!(status.get().beyond_window.is_none());
    tokio::time::sleep(window + Duration::from_millis(300)).await;
    sink.deliver(&e).await.unwrap();
    let st = status.get();
    let beyond = st.beyond_window.clone().expect("flagged");
    assert_eq!((beyond.checkpoint, beyond.window), (1, window));
    assert!(beyond.age > window);
    // What the docs say: outside the window the stream no longer drops the replay.
    assert_eq!(st.duplicates, 0, "{st:?}");
    assert_eq!(s.read().await.len(), 200);
    s.delete().await;
}

/// "An epoch whose checkpoint is older than the window … shown in `NatsSink::status()` …
/// cleared by the next delivery within the window."
#[tokio::test(flavor = "multi_thread")]
#[cfg_attr(
    not(servers),
    ignore = "needs WALSINK_TEST_SERVERS=1 and a local NATS with JetStream"
)]
async fn beyond_the_window_is_flagged_then_cleared() {
    let s = TestStream::new("probe2-window", Some(Duration::from_millis(800))).await;
    let id = walsink_tokio::conformance::unique_id("p2-window");
    let (_d, wal) = log(&id);
    seal(&wal, 1, &numbered(0, 10));
    tokio::time::sleep(Duration::from_millis(1500)).await;
    seal(&wal, 2, &numbered(10, 20));
    let es = epochs(&wal);
    let mut sink = NatsSink::new(s.config()).unwrap();
    let st = sink.status();
    bounded(sink.deliver(&es[0])).await.unwrap();
    let flagged = st.get();
    bounded(sink.deliver(&es[1])).await.unwrap();
    let cleared = st.get();
    let held = s.records_of(&id, 0).await;
    s.delete().await;
    let b = flagged
        .beyond_window
        .expect("epoch 1 is older than the window");
    assert_eq!(b.checkpoint, 1);
    assert!(b.age > b.window, "{b:?}");
    assert_eq!(b.window, Duration::from_millis(800));
    assert!(cleared.beyond_window.is_none(), "{cleared:?}");
    assert_eq!((cleared.published, cleared.epochs), (20, 2), "{cleared:?}");
    assert_eq!(held, numbered(0, 20));
}
