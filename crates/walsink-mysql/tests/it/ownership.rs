//! Owners and generations in MySQL and MariaDB: a second log under one sink id is refused at
//! its claim; one that takes the shard over fences the first, whose next transaction writes
//! nothing; an old owner delivering while the claim lands gets no commit in after the claim
//! returned.

use crate::common::*;
use mysql_async::prelude::Queryable;
use std::time::Duration;
use walsink::{ErrorKind, Owner, SinkErrorClass};
use walsink_mysql::MySqlSink;
use walsink_tokio::deliver_ready;

fn class(e: &walsink::Error) -> SinkErrorClass {
    match e.kind() {
        ErrorKind::Sink(s) => s.class(),
        other => panic!("not a sink error: {other:?}"),
    }
}

async fn markers(sink_id: &str) -> Vec<u64> {
    let mut c = client(SHARED).await;
    let v: Vec<u64> = c
        .exec(
            "SELECT checkpoint FROM walsink_markers WHERE sink_id = ? ORDER BY checkpoint",
            (sink_id,),
        )
        .await
        .unwrap();
    c.disconnect().await.ok();
    v
}

#[tokio::test(flavor = "multi_thread")]
#[cfg_attr(
    not(servers),
    ignore = "needs WALSINK_TEST_SERVERS=1 and a local MariaDB"
)]
async fn a_second_log_is_refused_and_a_take_over_fences_the_first_writing_nothing() {
    let my = My::new(SHARED, "");
    let id = unique("own");
    let (a, b) = (open(&id), open(&id));
    let mut sa = MySqlSink::new(my.config());
    assert_eq!(
        sa.claim(&id, 0, &Owner::new(a.wal.log_id()))
            .await
            .unwrap()
            .generation,
        1
    );
    let mut sb = MySqlSink::new(my.config());
    let e = sb
        .claim(&id, 0, &Owner::new(b.wal.log_id()))
        .await
        .unwrap_err();
    assert_eq!(e.class(), SinkErrorClass::Fenced, "{e}");
    assert!(e.message().contains(a.wal.log_id()), "names the owner: {e}");
    let mut want = epoch(&a.wal, 1, 0..10);
    assert_eq!(deliver_ready(&a.wal, &mut sa).await.unwrap(), 1);
    let cb = sb
        .claim(&id, 0, &Owner::new(b.wal.log_id()).take_over(true))
        .await
        .unwrap();
    assert_eq!(cb.generation, 2);
    epoch(&a.wal, 2, 10..20);
    let e = deliver_ready(&a.wal, &mut sa).await.unwrap_err();
    assert_eq!(class(&e), SinkErrorClass::Fenced, "{e}");
    assert_eq!(markers(&id).await, vec![1]);
    want.extend(epoch(&b.wal, 2, 100..110));
    assert_eq!(deliver_ready(&b.wal, &mut sb).await.unwrap(), 1);
    assert_eq!(rows(SHARED, &my.table, &id, 0).await, want);
}

/// The old owner delivers in a loop while a new log takes the shard over: no marker of the
/// old owner appears after the claim returned.
#[tokio::test(flavor = "multi_thread")]
#[cfg_attr(
    not(servers),
    ignore = "needs WALSINK_TEST_SERVERS=1 and a local MariaDB"
)]
async fn no_commit_of_the_old_owner_lands_after_the_claim_returned() {
    let my = My::new(SHARED, "");
    let id = unique("race");
    let (a, b) = (open(&id), open(&id));
    let mut sa = MySqlSink::new(my.config());
    sa.claim(&id, 0, &Owner::new(a.wal.log_id())).await.unwrap();
    let wal = a.wal.clone();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let stop2 = stop.clone();
    let old = tokio::spawn(async move {
        let mut fenced = 0;
        let mut cp = 1;
        'outer: while !stop2.load(std::sync::atomic::Ordering::Relaxed) {
            epoch(&wal, cp, cp * 1000..cp * 1000 + 1000);
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
    tokio::time::sleep(Duration::from_millis(500)).await;
    let mut sb = MySqlSink::new(my.config());
    sb.claim(&id, 0, &Owner::new(b.wal.log_id()).take_over(true))
        .await
        .unwrap();
    let at_claim = markers(&id).await;
    assert!(
        !at_claim.is_empty(),
        "the old owner delivered before the claim"
    );
    tokio::time::sleep(Duration::from_millis(500)).await;
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    assert!(old.await.unwrap() > 0, "the old owner was fenced");
    assert_eq!(
        markers(&id).await,
        at_claim,
        "nothing landed after the claim"
    );
}
