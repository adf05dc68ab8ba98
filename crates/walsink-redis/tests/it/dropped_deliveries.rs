//! Delivery futures dropped at any moment lose and double nothing: dropped at random
//! deadlines, sometimes with a new sink (a crash) and sometimes with a `CLIENT KILL` racing
//! them, then delivered again, every record lands once and in order in each mode; and a
//! dropped `deliver_ready` does not block the next call.

use crate::common::*;
use std::time::Duration;
use walsink_redis::{Mode, RedisSink};
use walsink_tokio::{deliver_ready, AsyncSink};

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
                        let mut a = redis().await;
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
        let covered = check.is_committed(&epoch_key(&sink_id, 4)).await.unwrap();
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
