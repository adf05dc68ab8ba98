//! Owners and generations in Redis: the owner fields of the shard's marker key, read under
//! the `WATCH` every transaction takes. A second log is refused at its claim; one that takes
//! the shard over fences the first, whose next transaction sends nothing; an old owner
//! delivering while the claim lands gets nothing in after the claim returned; a marker still
//! in the old shared hash survives the claim.

use crate::common::*;
use std::time::Duration;
use walsink::{ErrorKind, Owner, SinkErrorClass};
use walsink_redis::{Mode, RedisSink};
use walsink_tokio::deliver_ready;

fn class(e: &walsink::Error) -> SinkErrorClass {
    match e.kind() {
        ErrorKind::Sink(s) => s.class(),
        other => panic!("not a sink error: {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread")]
#[cfg_attr(
    not(servers),
    ignore = "needs WALSINK_TEST_SERVERS=1 and a local Redis"
)]
async fn a_second_log_is_refused_and_a_take_over_fences_the_first_writing_nothing() {
    let key = format!("own:{}", uniq("k"));
    let id = uniq("s");
    let (_da, a) = log(&id);
    let (_db, b) = log(&id);
    let mut sa = RedisSink::new(cfg(&key, Mode::List, 10, 2)).unwrap();
    assert_eq!(
        sa.claim(&id, 0, &Owner::new(a.log_id()))
            .await
            .unwrap()
            .generation,
        1
    );
    let mut sb = RedisSink::new(cfg(&key, Mode::List, 10, 2)).unwrap();
    let e = sb.claim(&id, 0, &Owner::new(b.log_id())).await.unwrap_err();
    assert_eq!(e.class(), SinkErrorClass::Fenced, "{e}");
    assert!(e.message().contains(a.log_id()), "names the owner: {e}");
    let mut want = numbered(0, 25);
    seal(&a, 1, &want);
    assert_eq!(deliver_ready(&a, &mut sa).await.unwrap(), 1);
    let cb = sb
        .claim(&id, 0, &Owner::new(b.log_id()).take_over(true))
        .await
        .unwrap();
    assert_eq!(cb.generation, 2);
    assert_eq!(
        sb.owner(&id, 0).await.unwrap(),
        Some((b.log_id().to_string(), 2))
    );
    seal(&a, 2, &numbered(25, 50));
    let e = deliver_ready(&a, &mut sa).await.unwrap_err();
    assert_eq!(class(&e), SinkErrorClass::Fenced, "{e}");
    assert_eq!(list(&key).await, want, "the fenced epoch wrote nothing");
    let more = numbered(100, 130);
    seal(&b, 2, &more);
    assert_eq!(deliver_ready(&b, &mut sb).await.unwrap(), 1);
    want.extend(more);
    assert_eq!(list(&key).await, want);
    del(&[key, sa.config().marker_key(&id, 0)]).await;
}

/// The old owner delivers epochs of many transactions in a loop while a new log takes the
/// shard over: the list only grows before the claim returned, never after.
#[tokio::test(flavor = "multi_thread")]
#[cfg_attr(
    not(servers),
    ignore = "needs WALSINK_TEST_SERVERS=1 and a local Redis"
)]
async fn no_write_of_the_old_owner_lands_after_the_claim_returned() {
    let key = format!("own:{}", uniq("race"));
    let id = uniq("s");
    let (_da, a) = log(&id);
    let (_db, b) = log(&id);
    let mut sa = RedisSink::new(cfg(&key, Mode::List, 20, 2)).unwrap();
    sa.claim(&id, 0, &Owner::new(a.log_id())).await.unwrap();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let (wal, stop2) = (a.clone(), stop.clone());
    let old = tokio::spawn(async move {
        let mut fenced = 0;
        let mut cp = 1;
        'outer: while !stop2.load(std::sync::atomic::Ordering::Relaxed) {
            seal(&wal, cp, &numbered(cp * 1000, cp * 1000 + 500));
            cp += 1;
            loop {
                match deliver_ready(&wal, &mut sa).await {
                    Ok(_) => break,
                    Err(e) if class(&e) == SinkErrorClass::Fenced => {
                        fenced += 1;
                        if stop2.load(std::sync::atomic::Ordering::Relaxed) {
                            break 'outer;
                        }
                        tokio::time::sleep(Duration::from_millis(5)).await;
                    }
                    Err(e) => panic!("{e}"),
                }
            }
        }
        fenced
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    let mut sb = RedisSink::new(cfg(&key, Mode::List, 20, 2)).unwrap();
    sb.claim(&id, 0, &Owner::new(b.log_id()).take_over(true))
        .await
        .unwrap();
    let at_claim = list(&key).await.len();
    assert!(at_claim > 0, "the old owner delivered before the claim");
    tokio::time::sleep(Duration::from_millis(500)).await;
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    assert!(old.await.unwrap() > 0, "the old owner was fenced");
    assert_eq!(
        list(&key).await.len(),
        at_claim,
        "nothing landed after the claim"
    );
    del(&[key, sb.config().marker_key(&id, 0)]).await;
}

/// A shard whose marker is still in the old shared hash: the claim moves it to the per-sink
/// key with the owner fields, so the delivered epochs stay delivered.
#[tokio::test(flavor = "multi_thread")]
#[cfg_attr(
    not(servers),
    ignore = "needs WALSINK_TEST_SERVERS=1 and a local Redis"
)]
async fn a_claim_keeps_a_marker_of_the_old_shared_hash() {
    let key = format!("own:{}", uniq("old"));
    let id = uniq("s");
    let (_d, wal) = log(&id);
    let mut s = RedisSink::new(cfg(&key, Mode::List, 10, 2)).unwrap();
    let (mk, old) = (s.config().marker_key(&id, 0), s.config().old_marker_key(0));
    let mut c = redis().await;
    let _: () = redis::cmd("HSET")
        .arg(&old)
        .arg(format!("{id}/0"))
        .arg(format!("{:020}:0:1", 1))
        .arg(format!("{id}/0:meta"))
        .arg("1\nmeta-1")
        .query_async(&mut c)
        .await
        .unwrap();
    s.claim(&id, 0, &Owner::new(wal.log_id())).await.unwrap();
    let committed = s.committed(&id, 0).await.unwrap().unwrap();
    assert_eq!(
        (committed.checkpoint, committed.metadata),
        (1, b"meta-1".to_vec())
    );
    seal(&wal, 1, &numbered(0, 5));
    seal(&wal, 2, &numbered(5, 8));
    assert_eq!(deliver_ready(&wal, &mut s).await.unwrap(), 2);
    assert_eq!(
        list(&key).await,
        numbered(5, 8),
        "checkpoint 1 was delivered before"
    );
    let _: () = redis::cmd("HDEL")
        .arg(&old)
        .arg(format!("{id}/0"))
        .query_async(&mut c)
        .await
        .unwrap();
    del(&[key, mk]).await;
}
