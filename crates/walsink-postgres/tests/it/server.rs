//! Against the shared PostgreSQL server: the conformance suite in marker mode, a backend
//! terminated mid-epoch, permanent errors that skip nothing, two-phase mode refused by a
//! server without prepared transactions, and sinks starting at once into tables that do not
//! exist yet.

use crate::common::*;
use std::time::Duration;
use walsink::{ErrorKind, SinkErrorClass};
use walsink_postgres::{Config, PgSink};
use walsink_tokio::{deliver_ready, spawn_committer};

const IGNORE: &str = "needs WALSINK_TEST_SERVERS=1 and a local PostgreSQL";

fn sink_class(e: &walsink::Error) -> SinkErrorClass {
    match e.kind() {
        ErrorKind::Sink(s) => s.class(),
        other => panic!("not a sink error: {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread")]
#[cfg_attr(
    not(servers),
    ignore = "needs WALSINK_TEST_SERVERS=1 and a local PostgreSQL"
)]
async fn conformance_in_marker_mode() {
    let _ = IGNORE;
    walsink_tokio::conformance::run_all(&Pg::new(SHARED, "")).await;
}

#[tokio::test(flavor = "multi_thread")]
#[cfg_attr(
    not(servers),
    ignore = "needs WALSINK_TEST_SERVERS=1 and a local PostgreSQL"
)]
async fn markers_hold_the_checkpoint_metadata() {
    let pg = Pg::new(SHARED, "");
    let id = unique("meta");
    let log = open(&id);
    epoch(&log.wal, 1, 0..10);
    epoch(&log.wal, 2, 10..10);
    epoch(&log.wal, 5, 10..30);
    let mut sink = PgSink::new(pg.config());
    assert_eq!(deliver_ready(&log.wal, &mut sink).await.unwrap(), 3);
    let m = sink.committed(&id, 0).await.unwrap();
    let got: Vec<(u64, Vec<u8>, u64)> = m
        .into_iter()
        .map(|m| (m.checkpoint, m.metadata, m.records))
        .collect();
    assert_eq!(
        got,
        vec![(1, b"meta 1".to_vec(), 10), (5, b"meta 5".to_vec(), 20)],
        "an empty epoch never reaches the sink (walsink commits it without delivery)"
    );
    assert!(sink.committed("nobody", 0).await.unwrap().is_empty());
}

/// The sink's backend is terminated while its COPY waits (the table is locked by another
/// session): the error is retryable, the committer retries, the epoch lands once.
#[tokio::test(flavor = "multi_thread")]
#[cfg_attr(
    not(servers),
    ignore = "needs WALSINK_TEST_SERVERS=1 and a local PostgreSQL"
)]
async fn a_backend_terminated_mid_epoch_is_retried_and_lands_once() {
    let app = unique("term");
    let pg = Pg::new(SHARED, &format!("&application_name={app}"));
    let id = unique("term");
    let mut sink = PgSink::new(pg.config());
    sink.connect().await.expect("connect and create the tables");
    let locker = client(SHARED).await;
    locker
        .batch_execute(&format!(
            "BEGIN; LOCK TABLE {} IN ACCESS EXCLUSIVE MODE",
            pg.table
        ))
        .await
        .unwrap();
    let log = open(&id);
    let committer = spawn_committer(&log.wal, sink).unwrap();
    let want = epoch(&log.wal, 1, 0..5000);
    let admin = client(SHARED).await;
    let mut terminated = 0;
    for _ in 0..2000 {
        let n = admin
            .query(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
                 WHERE application_name = $1 AND wait_event_type = 'Lock' AND query LIKE 'COPY%'",
                &[&app],
            )
            .await
            .unwrap()
            .len();
        if n > 0 {
            terminated += n;
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(
        terminated, 1,
        "the sink's COPY was seen waiting and terminated"
    );
    locker.batch_execute("ROLLBACK").await.unwrap();
    assert!(
        wait_committed(&log.wal, 1, 60).await,
        "{:?}",
        log.wal.health()
    );
    let h = log.wal.health();
    assert!(h.errors >= 1, "the termination was an error: {h:?}");
    let report = committer.shutdown(Duration::from_secs(30)).await;
    assert!(report.clean);
    assert_eq!(
        rows(SHARED, &pg.table, &id, 0).await,
        want,
        "once, in order"
    );
}

/// A table without the payload column: a permanent error naming SQLSTATE 42703; the epoch
/// stays in the log and lands once the column exists.
#[tokio::test(flavor = "multi_thread")]
#[cfg_attr(
    not(servers),
    ignore = "needs WALSINK_TEST_SERVERS=1 and a local PostgreSQL"
)]
async fn a_missing_column_is_permanent_and_nothing_is_skipped() {
    let pg = Pg::new(SHARED, "");
    let admin = client(SHARED).await;
    admin
        .batch_execute(&format!(
            "CREATE TABLE {} (sink_id text, subtask int, checkpoint bigint, idx bigint)",
            pg.table
        ))
        .await
        .unwrap();
    let id = unique("col");
    let log = open(&id);
    let want = epoch(&log.wal, 1, 0..100);
    let mut sink = PgSink::new(pg.config());
    let e = sink.connect().await.unwrap_err();
    assert_eq!(e.class(), SinkErrorClass::Permanent, "{e}");
    assert!(e.to_string().contains("42703"), "{e}");
    assert!(e.to_string().contains("payload"), "{e}");
    let e = deliver_ready(&log.wal, &mut sink).await.unwrap_err();
    assert_eq!(sink_class(&e), SinkErrorClass::Permanent);
    assert_eq!(log.wal.health().committed, None, "nothing skipped");
    let n: i64 = admin
        .query_one(&format!("SELECT count(*) FROM {}", pg.table), &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(n, 0);
    admin
        .batch_execute(&format!(
            "ALTER TABLE {} ADD COLUMN payload bytea",
            pg.table
        ))
        .await
        .unwrap();
    assert_eq!(deliver_ready(&log.wal, &mut sink).await.unwrap(), 1);
    assert_eq!(rows(SHARED, &pg.table, &id, 0).await, want);
}

/// A payload column of the wrong type: a permanent error naming the column and its type,
/// before anything is committed.
#[tokio::test(flavor = "multi_thread")]
#[cfg_attr(
    not(servers),
    ignore = "needs WALSINK_TEST_SERVERS=1 and a local PostgreSQL"
)]
async fn an_incompatible_column_type_is_permanent() {
    let pg = Pg::new(SHARED, "");
    let admin = client(SHARED).await;
    admin
        .batch_execute(&format!(
            "CREATE TABLE {} (sink_id text, subtask int, checkpoint bigint, idx bigint, payload integer)",
            pg.table
        ))
        .await
        .unwrap();
    let id = unique("type");
    let log = open(&id);
    epoch(&log.wal, 1, 0..10);
    let mut sink = PgSink::new(pg.config());
    let e = deliver_ready(&log.wal, &mut sink).await.unwrap_err();
    assert_eq!(sink_class(&e), SinkErrorClass::Permanent, "{e}");
    let msg = e.to_string();
    assert!(msg.contains("payload") && msg.contains("int4"), "{msg}");
    assert_eq!(log.wal.health().committed, None);
    let n: i64 = admin
        .query_one(&format!("SELECT count(*) FROM {}", pg.table), &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(n, 0, "nothing committed");
    let m: i64 = admin
        .query_one(
            "SELECT count(*) FROM walsink_markers WHERE sink_id = $1",
            &[&id],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(m, 0, "no marker without the rows");
}

/// Two-phase mode against the shared server (max_prepared_transactions = 0): PREPARE is
/// refused with 55000, a permanent error; nothing committed.
#[tokio::test(flavor = "multi_thread")]
#[cfg_attr(
    not(servers),
    ignore = "needs WALSINK_TEST_SERVERS=1 and a local PostgreSQL"
)]
async fn two_phase_mode_without_prepared_transactions_is_permanent() {
    let pg = Pg::new(SHARED, "&mode=2pc");
    let id = unique("no2pc");
    let log = open(&id);
    epoch(&log.wal, 1, 0..10);
    let mut sink = PgSink::new(pg.config());
    let e = deliver_ready(&log.wal, &mut sink).await.unwrap_err();
    assert_eq!(sink_class(&e), SinkErrorClass::Permanent, "{e}");
    assert!(e.to_string().contains("55000"), "{e}");
    assert!(rows(SHARED, &pg.table, &id, 0).await.is_empty());
    assert_eq!(log.wal.health().committed, None);
}

/// A server that does not answer: a retryable connection error naming the target without
/// its password.
#[tokio::test]
async fn an_unreachable_server_is_retryable_and_shows_no_password() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let c = Config::from_url(&format!(
        "postgres://u:hunter2@127.0.0.1:{port}/d?table=t&connect_timeout=2"
    ))
    .unwrap();
    let mut sink = PgSink::new(c);
    let e = sink.connect().await.unwrap_err();
    assert_eq!(e.class(), SinkErrorClass::Retryable, "{e}");
    assert!(!e.to_string().contains("hunter2"), "{e}");
    assert!(e.to_string().contains(&format!(":{port}/")), "{e}");
}

/// A server that accepts the connection and never answers (a stopped postmaster, a proxy in
/// front of a dead one): `connect` gives up after `connect_timeout` with a retryable error,
/// instead of waiting for ever.
#[tokio::test]
async fn a_server_that_accepts_and_never_answers_times_out_at_connect() {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    // Accepts and holds each connection without a byte, until the test ends.
    std::thread::spawn(move || {
        let mut held = Vec::new();
        for c in l.incoming().take(8) {
            held.push(c);
        }
        std::thread::sleep(Duration::from_secs(120));
    });
    let c = Config::from_url(&format!(
        "postgres://u:hunter2@127.0.0.1:{port}/d?table=t&connect_timeout=2"
    ))
    .unwrap();
    let mut sink = PgSink::new(c);
    let started = std::time::Instant::now();
    let r = tokio::time::timeout(Duration::from_secs(30), sink.connect()).await;
    let e = r
        .expect("connect still waits after 30 s on a server that never answers")
        .unwrap_err();
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(e.class(), SinkErrorClass::Retryable, "{e}");
    assert!(e.to_string().contains("connect_timeout"), "{e}");
    assert!(!e.to_string().contains("hunter2"), "{e}");
}

/// A delivery cut while the server runs its COMMIT (a deferred trigger on the marker table
/// holds the COMMIT for 1.5 s; the delivery is dropped at 0.5 s): the epoch commits without
/// its caller hearing so, and the next delivery finds the marker and writes nothing twice.
#[tokio::test(flavor = "multi_thread")]
#[cfg_attr(
    not(servers),
    ignore = "needs WALSINK_TEST_SERVERS=1 and a local PostgreSQL"
)]
async fn a_delivery_cut_during_its_commit_is_found_committed_by_the_next() {
    let markers = unique("mk");
    let pg = Pg::new(SHARED, &format!("&marker_table={markers}"));
    let id = unique("incommit");
    let log = open(&id);
    let mut sink = PgSink::new(pg.config());
    let mut want = epoch(&log.wal, 1, 0..10);
    assert_eq!(deliver_ready(&log.wal, &mut sink).await.unwrap(), 1);
    let admin = client(SHARED).await;
    admin
        .batch_execute(&format!(
            "CREATE FUNCTION {markers}_slow() RETURNS trigger LANGUAGE plpgsql AS \
             $$ BEGIN PERFORM pg_sleep(1.5); RETURN NULL; END $$; \
             CREATE CONSTRAINT TRIGGER slow AFTER INSERT OR UPDATE ON {markers} \
             DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION {markers}_slow();"
        ))
        .await
        .unwrap();
    want.extend(epoch(&log.wal, 2, 10..30));
    let cut = tokio::time::timeout(
        Duration::from_millis(500),
        deliver_ready(&log.wal, &mut sink),
    )
    .await;
    assert!(cut.is_err(), "the delivery was not cut: {cut:?}");
    tokio::time::sleep(Duration::from_millis(2000)).await;
    assert_eq!(
        rows(SHARED, &pg.table, &id, 0).await,
        want,
        "the server committed the epoch its caller never heard of"
    );
    admin
        .batch_execute(&format!("DROP TRIGGER slow ON {markers}"))
        .await
        .unwrap();
    assert_eq!(deliver_ready(&log.wal, &mut sink).await.unwrap(), 1);
    want.extend(epoch(&log.wal, 3, 30..35));
    assert_eq!(deliver_ready(&log.wal, &mut sink).await.unwrap(), 1);
    assert_eq!(
        rows(SHARED, &pg.table, &id, 0).await,
        want,
        "once, in order"
    );
    let cps: Vec<u64> = sink
        .committed(&id, 0)
        .await
        .unwrap()
        .iter()
        .map(|m| m.checkpoint)
        .collect();
    assert_eq!(cps, vec![1, 2, 3]);
    admin
        .batch_execute(&format!(
            "DROP TABLE {markers}; DROP FUNCTION {markers}_slow(); DROP TABLE {}",
            pg.table
        ))
        .await
        .unwrap();
}

/// Sinks starting at once into a target table and a marker table that do not exist yet (two
/// pipes started together): every one connects, none fails on the creation race (23505 on
/// pg_type or 42P07 from `CREATE TABLE IF NOT EXISTS`), and each delivers its epoch.
#[tokio::test(flavor = "multi_thread")]
#[cfg_attr(
    not(servers),
    ignore = "needs WALSINK_TEST_SERVERS=1 and a local PostgreSQL"
)]
async fn sinks_creating_the_same_new_tables_at_once_all_start() {
    const TRIES: usize = 40;
    const SINKS: usize = 6;
    let admin = client(SHARED).await;
    let mut failed = Vec::new();
    for _ in 0..TRIES {
        let table = unique("race");
        let marker = unique("race_mk");
        let url = format!("{SHARED}?table={table}&marker_table={marker}");
        let start = std::sync::Arc::new(tokio::sync::Barrier::new(SINKS));
        let tasks: Vec<_> = (0..SINKS)
            .map(|_| {
                let (url, start) = (url.clone(), start.clone());
                tokio::spawn(async move {
                    let mut sink = PgSink::new(Config::from_url(&url).unwrap());
                    start.wait().await;
                    sink.connect().await
                })
            })
            .collect();
        for t in tasks {
            if let Err(e) = t.await.unwrap() {
                failed.push(e.to_string());
            }
        }
        admin
            .batch_execute(&format!(
                "DROP TABLE IF EXISTS \"{table}\"; DROP TABLE IF EXISTS \"{marker}\""
            ))
            .await
            .unwrap();
    }
    assert!(
        failed.is_empty(),
        "{} of {} starts failed: {:#?}",
        failed.len(),
        TRIES * SINKS,
        failed
    );
    // And a delivery through sinks that raced to create the tables lands once each.
    let table = unique("race");
    let url = format!("{SHARED}?table={table}");
    let ids: Vec<String> = (0..SINKS).map(|i| unique(&format!("race{i}"))).collect();
    let tasks: Vec<_> = ids
        .iter()
        .map(|id| {
            let (url, id) = (url.clone(), id.clone());
            tokio::spawn(async move {
                let log = open(&id);
                let want = epoch(&log.wal, 1, 0..20);
                let mut sink = PgSink::new(Config::from_url(&url).unwrap());
                let n = deliver_ready(&log.wal, &mut sink).await;
                (want, n.map_err(|e| e.to_string()))
            })
        })
        .collect();
    for (id, t) in ids.iter().zip(tasks) {
        let (want, n) = t.await.unwrap();
        assert_eq!(n, Ok(1), "{id}");
        assert_eq!(rows(SHARED, &format!("\"{table}\""), id, 0).await, want);
    }
    admin
        .batch_execute(&format!("DROP TABLE \"{table}\""))
        .await
        .unwrap();
}
