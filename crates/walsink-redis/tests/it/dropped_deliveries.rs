//! Outside probes of the Redis target, written from docs/targets/redis.md and the public API.
//! Keys are prefixed `probe:`; marker keys are `walsink:{TAG}:committed:…` by the sink's
//! design and are removed at the end of each test.

use std::sync::Arc;
use std::time::Duration;
use walsink::{EpochKey, MemoryCommitStore, Options, WalSink};
use walsink_redis::{Config, Mode, RedisSink};
use walsink_tokio::{deliver_ready, AsyncSink};

/// One `XRANGE` entry: its id and its field-value pairs.
type StreamEntry = (String, Vec<(String, Vec<u8>)>);

const URL: &str = "redis://127.0.0.1:6379/0";

async fn admin() -> redis::aio::MultiplexedConnection {
    redis::Client::open(URL)
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .expect("local redis")
}

fn uniq(tag: &str) -> String {
    let n = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    format!("{tag}{}x{:x}", std::process::id(), n & 0xffffffff)
}

fn open_log(dir: &std::path::Path, sink_id: &str) -> Arc<WalSink> {
    let (wal, _) = WalSink::open_with(
        Arc::new(walsink::storage::FsStorage::new(dir).unwrap()),
        Options::new(sink_id).read_chunk_size(64 << 10),
        Box::new(MemoryCommitStore::new()),
    )
    .unwrap();
    Arc::new(wal)
}

fn seal(wal: &WalSink, cp: u64, records: &[Vec<u8>]) {
    wal.append_batch(records.iter().map(|r| r.as_slice()))
        .unwrap();
    wal.checkpoint(cp, format!("meta-{cp}").as_bytes()).unwrap();
    wal.checkpoint_complete(cp).unwrap();
}

fn cfg(key: &str, mode: Mode, chunk_records: usize, in_flight: usize) -> Config {
    let mut c = Config::new(key).mode(mode);
    c.chunk_records = chunk_records;
    c.in_flight = in_flight;
    c
}

async fn list(key: &str) -> Vec<Vec<u8>> {
    let mut a = admin().await;
    redis::cmd("LRANGE")
        .arg(key)
        .arg(0)
        .arg(-1)
        .query_async(&mut a)
        .await
        .unwrap()
}

async fn stream(key: &str) -> Vec<Vec<u8>> {
    let mut a = admin().await;
    let v: Vec<StreamEntry> = redis::cmd("XRANGE")
        .arg(key)
        .arg("-")
        .arg("+")
        .query_async(&mut a)
        .await
        .unwrap();
    v.into_iter()
        .map(|(_, mut f)| {
            assert_eq!(f.len(), 1);
            let (n, v) = f.remove(0);
            assert_eq!(n, "record");
            v
        })
        .collect()
}

async fn hash(key: &str) -> std::collections::BTreeMap<Vec<u8>, Vec<u8>> {
    let mut a = admin().await;
    let v: Vec<(Vec<u8>, Vec<u8>)> = redis::cmd("HGETALL")
        .arg(key)
        .query_async(&mut a)
        .await
        .unwrap();
    v.into_iter().collect()
}

async fn del(keys: &[String]) {
    let mut a = admin().await;
    for k in keys {
        let _: () = redis::cmd("DEL").arg(k).query_async(&mut a).await.unwrap();
    }
}

fn ekey(sink: &str, cp: u64) -> EpochKey {
    EpochKey {
        sink_id: sink.into(),
        subtask: 0,
        checkpoint: cp,
    }
}

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
    let mut a = admin().await;
    let _: () = redis::cmd("HSET")
        .arg(&mk)
        .arg("marker")
        .arg(format!("{:020}:5000:0", 1))
        .query_async(&mut a)
        .await
        .unwrap();
    let r = deliver_ready(&wal, &mut s).await;
    let held = list(&key).await;
    let committed_in_redis = s.is_committed(&ekey(&sink_id, 1)).await.unwrap();
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
        let mut a = admin().await;
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

/// Delivery futures dropped at random moments (`timeout` with random deadlines from 0 to a
/// few ms), sometimes with a new sink (a crash), sometimes with a `CLIENT KILL` racing it,
/// then delivered again: every record lands exactly once, in order, in each mode.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(servers),
    ignore = "needs WALSINK_TEST_SERVERS=1 and a local Redis"
)]
async fn random_drops_and_kills_give_each_record_once_in_order() {
    let mut total_attempts = 0u32;
    let mut total_cut = 0u32;
    let mut busy = 0u32;
    for seed in 0..9u64 {
        let mode = [Mode::List, Mode::Stream, Mode::Hash][seed as usize % 3];
        let mut rng = fastrand::Rng::with_seed(seed * 7919 + 1);
        let key = format!("probe:{}:{}", uniq("drop"), mode.name());
        let sink_id = uniq("s");
        let d = tempfile::tempdir().unwrap();
        let wal = open_log(d.path(), &sink_id);
        let mut want = Vec::new();
        let mut n = 0u64;
        for cp in 1..=4u64 {
            let len = [0usize, 1, 37, 1200][rng.usize(0..4)];
            let recs: Vec<Vec<u8>> = (0..len)
                .map(|_| {
                    n += 1;
                    let body = match rng.u8(0..4) {
                        0 => vec![],
                        1 => b"with\r\nCRLF".to_vec(),
                        2 => vec![0xff, 0x00, 0xfe],
                        _ => b"plain".to_vec(),
                    };
                    let mut r = format!("{n:08}").into_bytes();
                    if mode == Mode::Hash {
                        r.push(b'\t');
                    }
                    r.extend_from_slice(&body);
                    r
                })
                .collect();
            want.extend(recs.iter().cloned());
            seal(&wal, cp, &recs);
        }
        let mk_cfg = |rng: &mut fastrand::Rng| cfg(&key, mode, rng.usize(1..40), rng.usize(1..4));
        let mut sink = RedisSink::new(mk_cfg(&mut rng)).unwrap();
        let marker_key = sink.config().marker_key(&sink_id, 0);
        let mut attempts = 0;
        loop {
            attempts += 1;
            assert!(attempts < 400, "seed {seed}: no progress");
            if rng.u8(0..4) == 0 {
                sink = RedisSink::new(mk_cfg(&mut rng)).unwrap(); // a crash
            }
            let deadline = Duration::from_micros(rng.u64(0..6000));
            let kill = rng.u8(0..5) == 0;
            let killer = if kill {
                let _ = sink.connect().await;
                let cid = sink.client_id();
                let delay = Duration::from_micros(rng.u64(0..3000));
                Some(tokio::spawn(async move {
                    tokio::time::sleep(delay).await;
                    if let Some(cid) = cid {
                        let mut a = admin().await;
                        let _: redis::RedisResult<i64> = redis::cmd("CLIENT")
                            .arg("KILL")
                            .arg("ID")
                            .arg(cid)
                            .query_async(&mut a)
                            .await;
                    }
                }))
            } else {
                None
            };
            let r = tokio::time::timeout(deadline, deliver_ready(&wal, &mut sink)).await;
            if let Some(k) = killer {
                k.await.unwrap();
            }
            match r {
                Err(_) => total_cut += 1,
                Ok(Err(e)) if e.to_string().contains("another deliverer") => {
                    // The dropped call's blocking task still holds the deliverer (see
                    // a_dropped_deliver_ready_does_not_block_the_next_call).
                    busy += 1;
                    tokio::time::sleep(Duration::from_millis(2)).await;
                }
                Ok(Err(e)) => assert!(
                    e.to_string().contains("retryable"),
                    "seed {seed}: only retryable errors expected: {e}"
                ),
                Ok(Ok(_)) => {}
            }
            if wal.health().committed == Some(4) {
                break;
            }
            if attempts > 60 {
                // Give it time to finish without cuts.
                let _ =
                    tokio::time::timeout(Duration::from_secs(20), deliver_ready(&wal, &mut sink))
                        .await;
            }
        }
        total_attempts += attempts;
        // Let any transaction a dropped future left running land.
        tokio::time::sleep(Duration::from_millis(100)).await;
        let got: Vec<Vec<u8>> = match mode {
            Mode::List => list(&key).await,
            Mode::Stream => stream(&key).await,
            Mode::Hash => hash(&key)
                .await
                .into_iter()
                .map(|(f, v)| [f, b"\t".to_vec(), v].concat())
                .collect(),
        };
        let mut check = RedisSink::new(cfg(&key, mode, 10, 1)).unwrap();
        let committed = check.committed(&sink_id, 0).await.unwrap();
        let covered = check.is_committed(&ekey(&sink_id, 4)).await.unwrap();
        del(&[key.clone(), marker_key]).await;
        assert_eq!(got.len(), want.len(), "seed {seed} {mode:?}: count");
        assert!(got == want, "seed {seed} {mode:?}: order/content differ");
        // The last epoch may be empty and never sent; the metadata is of the newest complete
        // epoch Redis holds.
        if let Some(c) = committed {
            assert!(
                c.checkpoint <= 4 && c.metadata == format!("meta-{}", c.checkpoint).into_bytes()
            );
        }
        let _ = covered;
    }
    eprintln!("attempts {total_attempts}, cut {total_cut}, 'another deliverer' {busy}");
    assert!(
        total_cut > 5,
        "few cuts landed: {total_cut} of {total_attempts}"
    );
    // docs/async.md: a dropped deliver_ready's epoch "is offered again by the next call";
    // the next call should not be refused as if another deliverer ran.
    assert_eq!(busy, 0, "calls refused with 'another deliverer … is delivering this log' after a dropped or failed call");
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

/// Hash mode: an empty record has no tab and must be refused naming its position, with
/// nothing of the epoch written; records of a tab only, binary fields, CRLF, and a 6 MB value.
#[tokio::test(flavor = "multi_thread")]
#[cfg_attr(
    not(servers),
    ignore = "needs WALSINK_TEST_SERVERS=1 and a local Redis"
)]
async fn hash_mode_odd_records() {
    let key = format!("probe:{}", uniq("hash"));
    let sink_id = uniq("s");
    let d = tempfile::tempdir().unwrap();
    let wal = open_log(d.path(), &sink_id);
    let big = vec![b'v'; 6 << 20];
    let mut r_big = b"big\t".to_vec();
    r_big.extend_from_slice(&big);
    let good: Vec<Vec<u8>> = vec![
        b"\t".to_vec(),
        b"a\tb\tc".to_vec(),
        b"cr\r\nlf\tx\r\ny".to_vec(),
        vec![0xff, 0xfe, b'\t', 0x00, 0x80],
        b"dup\tfirst".to_vec(),
        r_big,
        b"dup\tsecond".to_vec(),
    ];
    seal(&wal, 1, &good);
    let bad = vec![
        b"k\tv".to_vec(),
        b"x\ty".to_vec(),
        b"".to_vec(),
        b"z\tw".to_vec(),
    ];
    seal(&wal, 2, &bad);
    let mut s = RedisSink::new(cfg(&key, Mode::Hash, 2, 2)).unwrap();
    let mk = s.config().marker_key(&sink_id, 0);
    let r = deliver_ready(&wal, &mut s).await;
    let got = hash(&key).await;
    del(&[key.clone(), mk]).await;
    let e = r.expect_err("the empty record of checkpoint 2 has no tab");
    assert!(
        e.to_string().contains("record 2 of checkpoint 2") && e.to_string().contains("permanent"),
        "{e}"
    );
    assert_eq!(wal.health().committed, Some(1));
    let mut want = std::collections::BTreeMap::new();
    want.insert(b"".to_vec(), b"".to_vec());
    want.insert(b"a".to_vec(), b"b\tc".to_vec());
    want.insert(b"cr\r\nlf".to_vec(), b"x\r\ny".to_vec());
    want.insert(vec![0xff, 0xfe], vec![0x00, 0x80]);
    want.insert(b"dup".to_vec(), b"second".to_vec());
    want.insert(b"big".to_vec(), big);
    assert!(
        got == want,
        "hash holds {} fields: {:?}",
        got.len(),
        got.keys().collect::<Vec<_>>()
    );
}

/// Huge records (1–10 MB) in list and stream mode, mixed with empty ones, cut and resumed.
#[tokio::test(flavor = "multi_thread")]
#[cfg_attr(
    not(servers),
    ignore = "needs WALSINK_TEST_SERVERS=1 and a local Redis"
)]
async fn huge_records_land_once() {
    for mode in [Mode::List, Mode::Stream] {
        let key = format!("probe:{}:{}", uniq("huge"), mode.name());
        let sink_id = uniq("s");
        let d = tempfile::tempdir().unwrap();
        let wal = open_log(d.path(), &sink_id);
        let recs: Vec<Vec<u8>> = vec![
            vec![1u8; 1 << 20],
            vec![],
            vec![2u8; 10 << 20],
            b"small".to_vec(),
            vec![3u8; 3 << 20],
        ];
        seal(&wal, 1, &recs);
        let mut s = RedisSink::new(cfg(&key, mode, 1000, 2)).unwrap();
        let mk = s.config().marker_key(&sink_id, 0);
        let _ = tokio::time::timeout(Duration::from_millis(5), deliver_ready(&wal, &mut s)).await;
        let mut s2 = RedisSink::new(cfg(&key, mode, 1000, 2)).unwrap();
        deliver_ready(&wal, &mut s2).await.unwrap();
        tokio::time::sleep(Duration::from_millis(200)).await;
        let got = if mode == Mode::List {
            list(&key).await
        } else {
            stream(&key).await
        };
        del(&[key.clone(), mk]).await;
        assert_eq!(got.len(), recs.len(), "{mode:?}");
        assert!(got == recs, "{mode:?}: contents differ");
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
    let mut a = admin().await;
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
    assert!(s.is_committed(&ekey(&sink_id, 2)).await.unwrap());
    assert!(!s.is_committed(&ekey(&sink_id, 3)).await.unwrap());
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
    let partial_covered = watcher.is_committed(&ekey(&sink_id, 3)).await.unwrap();
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

/// docs/async.md: "`deliver_ready` … an epoch whose delivery is dropped is not counted as
/// delivered and is offered again by the next call". The next call right after a drop must
/// not fail with "another deliverer … is delivering this log": there is no other deliverer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(servers),
    ignore = "needs WALSINK_TEST_SERVERS=1 and a local Redis"
)]
async fn a_dropped_deliver_ready_does_not_block_the_next_call() {
    let key = format!("probe:{}", uniq("next"));
    let sink_id = uniq("s");
    let d = tempfile::tempdir().unwrap();
    let wal = open_log(d.path(), &sink_id);
    let mut s = RedisSink::new(cfg(&key, Mode::List, 5, 1)).unwrap();
    let mk = s.config().marker_key(&sink_id, 0);
    let mut rng = fastrand::Rng::with_seed(3);
    let mut refused = Vec::new();
    for cp in 1..=200u64 {
        let recs: Vec<Vec<u8>> = (0..300)
            .map(|i| format!("r{cp}-{i}").into_bytes())
            .collect();
        seal(&wal, cp, &recs);
        let deadline = Duration::from_micros(rng.u64(0..3000));
        let _ = tokio::time::timeout(deadline, deliver_ready(&wal, &mut s)).await;
        if let Err(e) = deliver_ready(&wal, &mut s).await {
            refused.push((cp, e.to_string()));
        }
    }
    let _ = deliver_ready(&wal, &mut s).await;
    del(&[key.clone(), mk]).await;
    assert!(
        refused.is_empty(),
        "{} of 200 calls right after a dropped one were refused, first: {:?}",
        refused.len(),
        refused.first()
    );
}
