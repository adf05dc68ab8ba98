//! Writers that share a data key each get their own records once and in their own order:
//! two keys that share a hash tag under one sink id, and two sink ids pushing to one list
//! concurrently with random cuts.

use crate::common::*;
use std::time::Duration;
use walsink_redis::{Config, Mode, RedisSink};
use walsink_tokio::deliver_ready;

/// Two data keys that share a hash tag (the point of hash tags: keys grouped in one slot),
/// each written by its own log under the same sink id (the command line's default `pipe`).
/// The docs: "The marker key is the hash `walsink:{TAG}:committed:SINK/SUBTASK`, written by
/// that sink id and subtask only" and "Every record of every checkpoint is applied to the
/// data key once". Both keys get the same marker key, so the second log's epochs are taken
/// as committed and never written.
#[tokio::test(flavor = "multi_thread")]
#[cfg_attr(
    not(servers),
    ignore = "needs WALSINK_TEST_SERVERS=1 and a local Redis"
)]
async fn keys_sharing_a_hash_tag_under_one_sink_id_each_get_their_records() {
    let tag = uniq("probetag");
    let ka = format!("probe:{{{tag}}}:orders");
    let kb = format!("probe:{{{tag}}}:payments");
    let sink_id = "pipe";
    let (da, db) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let (wa, wb) = (open_log(da.path(), sink_id), open_log(db.path(), sink_id));
    let ra: Vec<Vec<u8>> = (0..50).map(|i| format!("order-{i}").into_bytes()).collect();
    let rb: Vec<Vec<u8>> = (0..50)
        .map(|i| format!("payment-{i}").into_bytes())
        .collect();
    seal(&wa, 1, &ra);
    seal(&wb, 1, &rb);
    let mut sa = RedisSink::new(cfg(&ka, Mode::List, 1000, 4)).unwrap();
    let mut sb = RedisSink::new(cfg(&kb, Mode::List, 1000, 4)).unwrap();
    let marker_a = sa.config().marker_key(sink_id, 0);
    let marker_b = sb.config().marker_key(sink_id, 0);
    deliver_ready(&wa, &mut sa).await.unwrap();
    deliver_ready(&wb, &mut sb).await.unwrap();
    let (got_a, got_b) = (list(&ka).await, list(&kb).await);
    del(&[ka.clone(), kb.clone(), marker_a.clone(), marker_b.clone()]).await;
    assert_eq!(got_a, ra, "key {ka}");
    assert!(
        got_b == rb,
        "key {kb} holds {} of its {} records: its epoch was skipped because it shares the marker key {marker_b} (== {marker_a}: {}) with {ka}",
        got_b.len(),
        rb.len(),
        marker_a == marker_b
    );
}

/// Two sink ids (and two subtask-like writers) pushing to one list concurrently with
/// random cuts: each writer's records appear once and in its own order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(servers),
    ignore = "needs WALSINK_TEST_SERVERS=1 and a local Redis"
)]
async fn two_sink_ids_sharing_a_key_with_cuts() {
    let key = format!("probe:{}", uniq("share"));
    let mut handles = Vec::new();
    let mut markers = Vec::new();
    for w in 0..2u64 {
        let key = key.clone();
        let sink_id = uniq(&format!("w{w}"));
        markers.push(Config::new(key.as_str()).marker_key(&sink_id, 0));
        handles.push(tokio::spawn(async move {
            let d = tempfile::tempdir().unwrap();
            let wal = open_log(d.path(), &sink_id);
            let recs: Vec<Vec<u8>> = (0..3000)
                .map(|i| format!("w{w}-{i:05}").into_bytes())
                .collect();
            for (cp, part) in recs.chunks(1000).enumerate() {
                seal(&wal, cp as u64 + 1, part);
            }
            let mut rng = fastrand::Rng::with_seed(w + 100);
            let mut sink = RedisSink::new(cfg(&key, Mode::List, 17, 2)).unwrap();
            let mut aborts = 0;
            for _ in 0..300 {
                let d = Duration::from_micros(rng.u64(100..4000));
                let _ = tokio::time::timeout(d, deliver_ready(&wal, &mut sink)).await;
                aborts += sink.stats().aborts;
                if wal.health().committed == Some(3) {
                    break;
                }
            }
            deliver_ready(&wal, &mut sink).await.unwrap();
            assert_eq!(wal.health().committed, Some(3));
            (recs, aborts)
        }));
    }
    let mut wants = Vec::new();
    for h in handles {
        wants.push(h.await.unwrap().0);
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    let got = list(&key).await;
    let mut all = vec![key.clone()];
    all.extend(markers);
    del(&all).await;
    for (w, want) in wants.iter().enumerate() {
        let mine: Vec<Vec<u8>> = got
            .iter()
            .filter(|r| r.starts_with(format!("w{w}-").as_bytes()))
            .cloned()
            .collect();
        assert_eq!(mine.len(), want.len(), "writer {w}");
        assert!(&mine == want, "writer {w}: order");
    }
}
