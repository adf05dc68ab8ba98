//! Owners and generations in PostgreSQL: two logs under one sink id never both deliver a
//! shard. A second log is refused at its claim; one that takes the shard over fences the first,
//! whose next transaction writes nothing; a claim waits for an old owner's transaction already
//! past its check, so no commit of the old owner lands after the claim returned; in two-phase
//! mode the shard's prepared transactions are rolled back at the claim and their epochs land
//! once through the new owner.

use crate::common::*;
use std::time::Duration;
use walsink::{ErrorKind, Owner, SinkErrorClass};
use walsink_postgres::{OwnerTable, PgSink, TableName};
use walsink_tokio::deliver_ready;

fn class(e: &walsink::Error) -> SinkErrorClass {
    match e.kind() {
        ErrorKind::Sink(s) => s.class(),
        other => panic!("not a sink error: {other:?}"),
    }
}

async fn markers(url: &str, sink_id: &str) -> Vec<i64> {
    client(url)
        .await
        .query(
            "SELECT checkpoint FROM walsink_markers WHERE sink_id = $1 ORDER BY checkpoint",
            &[&sink_id],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
#[cfg_attr(
    not(servers),
    ignore = "needs WALSINK_TEST_SERVERS=1 and a local PostgreSQL"
)]
async fn a_second_log_is_refused_and_a_take_over_fences_the_first_writing_nothing() {
    let pg = Pg::new(SHARED, "");
    let id = unique("own");
    let (a, b) = (open(&id), open(&id));
    let mut sa = PgSink::new(pg.config());
    let ca = sa.claim(&id, 0, &Owner::new(a.wal.log_id())).await.unwrap();
    assert_eq!(ca.generation, 1);
    let mut sb = PgSink::new(pg.config());
    let e = sb
        .claim(&id, 0, &Owner::new(b.wal.log_id()))
        .await
        .unwrap_err();
    assert_eq!(e.class(), SinkErrorClass::Fenced, "{e}");
    assert!(e.message().contains(a.wal.log_id()), "names the owner: {e}");
    // The owner itself still delivers.
    let mut want = epoch(&a.wal, 1, 0..10);
    assert_eq!(deliver_ready(&a.wal, &mut sa).await.unwrap(), 1);
    let cb = sb
        .claim(&id, 0, &Owner::new(b.wal.log_id()).take_over(true))
        .await
        .unwrap();
    assert_eq!(cb.generation, 2);
    let owners = OwnerTable::beside(&TableName::parse("walsink_markers", "t").unwrap());
    let c = client(SHARED).await;
    assert_eq!(
        owners.owner(&c, &id, 0).await.unwrap(),
        Some((b.wal.log_id().to_string(), 2))
    );
    // The old owner's next epoch is refused, typed, and writes nothing.
    epoch(&a.wal, 2, 10..20);
    let e = deliver_ready(&a.wal, &mut sa).await.unwrap_err();
    assert_eq!(class(&e), SinkErrorClass::Fenced, "{e}");
    assert_eq!(markers(SHARED, &id).await, vec![1]);
    // The new owner numbers its checkpoints above the target's and delivers.
    want.extend(epoch(&b.wal, 2, 100..110));
    assert_eq!(deliver_ready(&b.wal, &mut sb).await.unwrap(), 1);
    assert_eq!(rows(SHARED, &pg.table, &id, 0).await, want);
    // The same log claiming again (a restart elsewhere) fences its own older claim.
    let mut sb2 = PgSink::new(pg.config());
    assert_eq!(
        sb2.claim(&id, 0, &Owner::new(b.wal.log_id()))
            .await
            .unwrap()
            .generation,
        3
    );
    epoch(&b.wal, 3, 110..111);
    let e = deliver_ready(&b.wal, &mut sb).await.unwrap_err();
    assert_eq!(class(&e), SinkErrorClass::Fenced, "{e}");
    assert_eq!(deliver_ready(&b.wal, &mut sb2).await.unwrap(), 1);
}

/// An old owner delivers epochs in a loop while a new log takes the shard over: whatever the
/// old owner committed, it committed before the claim returned; after it, every delivery of
/// the old owner is fenced and no marker of it appears.
#[tokio::test(flavor = "multi_thread")]
#[cfg_attr(
    not(servers),
    ignore = "needs WALSINK_TEST_SERVERS=1 and a local PostgreSQL"
)]
async fn no_commit_of_the_old_owner_lands_after_the_claim_returned() {
    let pg = Pg::new(SHARED, "");
    let id = unique("race");
    let (a, b) = (open(&id), open(&id));
    let mut sa = PgSink::new(pg.config());
    sa.claim(&id, 0, &Owner::new(a.wal.log_id())).await.unwrap();
    let wal = a.wal.clone();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let stop2 = stop.clone();
    let old = tokio::spawn(async move {
        let mut fenced = 0;
        let mut cp = 1;
        while !stop2.load(std::sync::atomic::Ordering::Relaxed) {
            epoch(&wal, cp, cp * 1000..cp * 1000 + 2000);
            cp += 1;
            loop {
                match deliver_ready(&wal, &mut sa).await {
                    Ok(_) => break,
                    Err(e) if class(&e) == SinkErrorClass::Fenced => {
                        fenced += 1;
                        tokio::time::sleep(Duration::from_millis(5)).await;
                        if stop2.load(std::sync::atomic::Ordering::Relaxed) {
                            return fenced;
                        }
                    }
                    Err(e) => panic!("{e}"),
                }
            }
        }
        fenced
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    let mut sb = PgSink::new(pg.config());
    sb.claim(&id, 0, &Owner::new(b.wal.log_id()).take_over(true))
        .await
        .unwrap();
    let at_claim = markers(SHARED, &id).await;
    assert!(
        !at_claim.is_empty(),
        "the old owner delivered before the claim"
    );
    tokio::time::sleep(Duration::from_millis(500)).await;
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let fenced = old.await.unwrap();
    assert!(fenced > 0, "the old owner kept trying and was fenced");
    assert_eq!(
        markers(SHARED, &id).await,
        at_claim,
        "nothing landed after the claim"
    );
}
