//! Records the table refuses for good (a CHECK constraint, a NOT NULL column, a value too
//! long) are named by the row of the COPY that failed, so with a dead-letter log they go
//! there and every other record lands exactly once, in order; without one, nothing of the
//! epoch is written and the error says which record it was.

use crate::common::*;
use std::sync::Arc;
use walsink::{DirDeadLetters, ErrorKind, SinkErrorClass};
use walsink_postgres::PgSink;
use walsink_tokio::deliver_ready;

/// A table whose CHECK refuses payloads that start with `bad`.
async fn checked_table(table: &str) {
    client(SHARED)
        .await
        .batch_execute(&format!(
            "CREATE TABLE {table} (sink_id text NOT NULL, subtask integer NOT NULL, checkpoint bigint NOT NULL, idx bigint NOT NULL, payload bytea NOT NULL CONSTRAINT good CHECK (substring(payload from 1 for 3) <> 'bad'::bytea))"
        ))
        .await
        .unwrap();
}

fn append(wal: &walsink::WalSink, cp: u64, n: u64, bad: impl Fn(u64) -> bool) -> Vec<Vec<u8>> {
    let mut good = Vec::new();
    for i in 0..n {
        let r = if bad(i) {
            format!("bad {cp} {i}").into_bytes()
        } else {
            let r = format!("ok {cp} {i}").into_bytes();
            good.push(r.clone());
            r
        };
        wal.append(&r).unwrap();
    }
    wal.checkpoint(cp, b"").unwrap();
    wal.checkpoint_complete(cp).unwrap();
    good
}

#[tokio::test(flavor = "multi_thread")]
#[cfg_attr(
    not(servers),
    ignore = "needs WALSINK_TEST_SERVERS=1 and a local PostgreSQL"
)]
async fn rows_a_check_constraint_refuses_go_to_the_dead_letter_log_and_the_rest_land_once() {
    let pg = Pg::new(SHARED, "");
    checked_table(&pg.table).await;
    let id = unique("dlq");
    let log = open(&id);
    let dlq = log.dir.path().join("dlq");
    log.wal
        .set_dead_letters(Some(Arc::new(DirDeadLetters::open(&dlq, &id, 0).unwrap())));
    let bad = |i: u64| i % 97 == 3 || i == 0 || i == 999;
    let mut want = Vec::new();
    for cp in 1..=3 {
        want.extend(append(&log.wal, cp, 1000, bad));
    }
    let mut sink = PgSink::new(pg.config());
    deliver_ready(&log.wal, &mut sink).await.unwrap();
    assert_eq!(rows(SHARED, &pg.table, &id, 0).await, want);
    let letters = DirDeadLetters::read_all(&dlq).unwrap();
    let expect: Vec<(u64, u64)> = (1..=3)
        .flat_map(|cp| (0..1000).filter(|&i| bad(i)).map(move |i| (cp, i)))
        .collect();
    assert_eq!(
        letters
            .iter()
            .map(|l| (l.checkpoint, l.index))
            .collect::<Vec<_>>(),
        expect
    );
    for l in &letters {
        assert_eq!(
            l.data,
            format!("bad {} {}", l.checkpoint, l.index).as_bytes()
        );
        assert_eq!(l.code.as_deref(), Some("23514"));
        assert!(l.message.contains("good"), "{}", l.message);
    }
    // The markers count the rows that landed.
    let m = sink.committed(&id, 0).await.unwrap();
    let per: Vec<u64> = m.iter().map(|m| m.records).collect();
    let bad_per = (0..1000).filter(|&i| bad(i)).count() as u64;
    assert_eq!(per, vec![1000 - bad_per; 3]);
    assert_eq!(log.wal.health().dead_letters, 3 * bad_per);
}

#[tokio::test(flavor = "multi_thread")]
#[cfg_attr(
    not(servers),
    ignore = "needs WALSINK_TEST_SERVERS=1 and a local PostgreSQL"
)]
async fn without_a_dead_letter_log_a_refused_row_writes_nothing_and_names_its_record() {
    let pg = Pg::new(SHARED, "");
    checked_table(&pg.table).await;
    let id = unique("dlq_none");
    let log = open(&id);
    append(&log.wal, 1, 50, |i| i == 17);
    let mut sink = PgSink::new(pg.config());
    let e = deliver_ready(&log.wal, &mut sink).await.unwrap_err();
    match e.kind() {
        ErrorKind::Sink(s) => {
            assert_eq!(s.class(), SinkErrorClass::Rejected, "{e}");
            assert_eq!(s.record(), Some(17), "{e}");
            assert_eq!(s.code(), Some("23514"));
        }
        other => panic!("{other:?}"),
    }
    assert!(rows(SHARED, &pg.table, &id, 0).await.is_empty());
    assert_eq!(log.wal.health().committed, None);
}

#[tokio::test(flavor = "multi_thread")]
#[cfg_attr(
    not(servers),
    ignore = "needs WALSINK_TEST_SERVERS=1 and a local PostgreSQL"
)]
async fn a_refusal_that_is_not_a_rows_fault_stops_delivery() {
    // A missing column is the table's fault, not a record's: permanent, nothing dead-lettered.
    let pg = Pg::new(SHARED, "");
    client(SHARED)
        .await
        .batch_execute(&format!("CREATE TABLE {} (sink_id text)", pg.table))
        .await
        .unwrap();
    let id = unique("dlq_perm");
    let log = open(&id);
    let dlq = log.dir.path().join("dlq");
    log.wal
        .set_dead_letters(Some(Arc::new(DirDeadLetters::open(&dlq, &id, 0).unwrap())));
    append(&log.wal, 1, 5, |_| false);
    let mut sink = PgSink::new(pg.config());
    let e = deliver_ready(&log.wal, &mut sink).await.unwrap_err();
    assert!(
        matches!(e.kind(), ErrorKind::Sink(s) if s.class() == SinkErrorClass::Permanent),
        "{e}"
    );
    assert!(DirDeadLetters::read_all(&dlq).unwrap().is_empty());
}

#[tokio::test(flavor = "multi_thread")]
#[cfg_attr(
    not(servers),
    ignore = "needs WALSINK_TEST_SERVERS=1 and a local PostgreSQL"
)]
async fn a_not_null_column_the_sink_does_not_write_is_the_tables_fault_not_a_records() {
    // An outside run found every row dead-lettered for such a column.
    let pg = Pg::new(SHARED, "");
    client(SHARED)
        .await
        .batch_execute(&format!(
            "CREATE TABLE {} (sink_id text NOT NULL, subtask integer NOT NULL, checkpoint bigint NOT NULL, idx bigint NOT NULL, payload bytea NOT NULL, extra text NOT NULL)",
            pg.table
        ))
        .await
        .unwrap();
    let id = unique("dlq_nn");
    let log = open(&id);
    let dlq = log.dir.path().join("dlq");
    log.wal
        .set_dead_letters(Some(Arc::new(DirDeadLetters::open(&dlq, &id, 0).unwrap())));
    append(&log.wal, 1, 5, |_| false);
    let mut sink = PgSink::new(pg.config());
    let e = deliver_ready(&log.wal, &mut sink).await.unwrap_err();
    assert!(
        matches!(e.kind(), ErrorKind::Sink(s) if s.class() == SinkErrorClass::Permanent && s.code() == Some("23502")),
        "{e}"
    );
    assert!(DirDeadLetters::read_all(&dlq).unwrap().is_empty());
}
