//! The marker decides what is delivered, and only a marker the sink wrote counts: a marker
//! set past the epoch's end by someone else is not taken as delivered, garbage markers are
//! refused permanently (`WALSINK_MARKER`), and the old shared-hash layout is read and
//! moved after a partial epoch without touching another sink's fields.

use crate::common::*;
use std::time::Duration;
use walsink_redis::{Mode, RedisSink};
use walsink_tokio::{deliver_ready, AsyncSink};

/// A marker that someone else set past the end of the epoch (`CP:NEXT:0` with NEXT beyond
/// the epoch's records). The docs list `WALSINK_GAP`/`WALSINK_MARKER` as "the marker was
/// changed by someone else" (permanent). A delivery must not report the epoch delivered
/// while Redis holds none of its records and the marker does not show it complete.
#[tokio::test(flavor = "multi_thread")]
#[cfg_attr(
    not(servers),
    ignore = "needs WALSINK_TEST_SERVERS=1 and a local Redis"
)]
async fn a_marker_past_the_epochs_end_is_not_taken_as_delivered() {
    let key = format!("probe:{}", uniq("past"));
    let sink_id = uniq("s");
    let d = tempfile::tempdir().unwrap();
    let wal = open_log(d.path(), &sink_id);
    let recs: Vec<Vec<u8>> = (0..100).map(|i| format!("r{i}").into_bytes()).collect();
    seal(&wal, 1, &recs);
    let mut s = RedisSink::new(cfg(&key, Mode::List, 10, 2)).unwrap();
    let mk = s.config().marker_key(&sink_id, 0);
    let mut a = redis().await;
    let _: () = redis::cmd("HSET")
        .arg(&mk)
        .arg("marker")
        .arg(format!("{:020}:5000:0", 1))
        .query_async(&mut a)
        .await
        .unwrap();
    let r = deliver_ready(&wal, &mut s).await;
    let held = list(&key).await;
    let committed_in_redis = s.is_committed(&epoch_key(&sink_id, 1)).await.unwrap();
    let health = wal.health();
    del(&[key.clone(), mk]).await;
    // Either an error, or the records are there: never Ok with nothing written.
    assert!(
        r.is_err() || held == recs,
        "deliver_ready returned {r:?}; Redis holds {} of 100 records; marker complete: {committed_in_redis}; log committed through {:?}",
        held.len(),
        health.committed
    );
}

/// A garbage marker is refused permanently (documented `WALSINK_MARKER`).
#[tokio::test(flavor = "multi_thread")]
#[cfg_attr(
    not(servers),
    ignore = "needs WALSINK_TEST_SERVERS=1 and a local Redis"
)]
async fn garbage_markers_are_refused() {
    for garbage in ["hello", "1:2", "x:1:1", "00000000000000000001:-1:0", ""] {
        let key = format!("probe:{}", uniq("garb"));
        let sink_id = uniq("s");
        let d = tempfile::tempdir().unwrap();
        let wal = open_log(d.path(), &sink_id);
        seal(&wal, 1, &[b"a".to_vec(), b"b".to_vec()]);
        let mut s = RedisSink::new(cfg(&key, Mode::List, 10, 2)).unwrap();
        let mk = s.config().marker_key(&sink_id, 0);
        let mut a = redis().await;
        let _: () = redis::cmd("HSET")
            .arg(&mk)
            .arg("marker")
            .arg(garbage)
            .query_async(&mut a)
            .await
            .unwrap();
        let r = deliver_ready(&wal, &mut s).await;
        let held = list(&key).await;
        del(&[key.clone(), mk]).await;
        let e = r.expect_err(&format!("garbage marker {garbage:?} accepted"));
        assert!(
            e.to_string().contains("not a walsink marker") && e.to_string().contains("permanent"),
            "{garbage:?}: {e}"
        );
        assert!(held.is_empty(), "{garbage:?}: wrote {held:?}");
    }
}

/// Old shared-hash layout: progress read, metadata carried over, fields moved, another
/// sink's fields left alone; and `committed()` after a partial epoch shows the old metadata.
#[tokio::test(flavor = "multi_thread")]
#[cfg_attr(
    not(servers),
    ignore = "needs WALSINK_TEST_SERVERS=1 and a local Redis"
)]
async fn old_layout_migration_with_a_partial_epoch() {
    let key = format!("probe:{}", uniq("mig"));
    let sink_id = uniq("s");
    let c = cfg(&key, Mode::List, 10, 1);
    let old = c.old_marker_key(0);
    let mk = c.marker_key(&sink_id, 0);
    let mut a = redis().await;
    let _: () = redis::cmd("HSET")
        .arg(&old)
        .arg(format!("{sink_id}/0"))
        .arg(format!("{:020}:3:1", 2))
        .arg(format!("{sink_id}/0:meta"))
        .arg("2\nold-meta")
        .arg("other/0")
        .arg(format!("{:020}:1:1", 9))
        .query_async(&mut a)
        .await
        .unwrap();
    let d = tempfile::tempdir().unwrap();
    let wal = open_log(d.path(), &sink_id);
    seal(&wal, 1, &[b"e1".to_vec()]);
    seal(
        &wal,
        2,
        &[b"e2a".to_vec(), b"e2b".to_vec(), b"e2c".to_vec()],
    );
    let e3: Vec<Vec<u8>> = (0..200).map(|i| format!("e3-{i}").into_bytes()).collect();
    seal(&wal, 3, &e3);
    let mut s = RedisSink::new(c.clone()).unwrap();
    assert!(s.is_committed(&epoch_key(&sink_id, 2)).await.unwrap());
    assert!(!s.is_committed(&epoch_key(&sink_id, 3)).await.unwrap());
    // Cut epoch 3 after its first transaction.
    let mut watcher = RedisSink::new(c.clone()).unwrap();
    tokio::select! {
        _ = deliver_ready(&wal, &mut s) => {}
        _ = async {
            loop {
                if let Some(m) = watcher.marker(&sink_id, 0).await.unwrap() {
                    if m.checkpoint == 3 && m.next > 0 { break; }
                }
                tokio::time::sleep(Duration::from_micros(200)).await;
            }
        } => {}
    }
    drop(s);
    tokio::time::sleep(Duration::from_millis(100)).await;
    let mid = watcher.committed(&sink_id, 0).await.unwrap();
    let partial_covered = watcher.is_committed(&epoch_key(&sink_id, 3)).await.unwrap();
    let mut s2 = RedisSink::new(c.clone()).unwrap();
    deliver_ready(&wal, &mut s2).await.unwrap();
    let got = list(&key).await;
    let fin = s2.committed(&sink_id, 0).await.unwrap();
    let old_fields: Vec<String> = redis::cmd("HKEYS")
        .arg(&old)
        .query_async(&mut a)
        .await
        .unwrap();
    del(&[key.clone(), mk, old.clone()]).await;
    assert_eq!(got, e3, "only epoch 3, once");
    assert!(!partial_covered);
    if let Some(mid) = mid {
        assert_eq!(mid.checkpoint, 2);
        assert_eq!(mid.metadata, b"old-meta");
    }
    assert_eq!(fin.unwrap().checkpoint, 3);
    assert_eq!(old_fields, vec!["other/0".to_string()]);
}
