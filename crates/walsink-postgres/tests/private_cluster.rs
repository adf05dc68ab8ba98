//! Against a private PostgreSQL cluster (feature `testkit`): the helper itself, two-phase
//! commit (the shared server has max_prepared_transactions = 0), prepared transactions left
//! by a crash, voided by a restore or forgotten, permission denied, and a server restart.

mod common;

use common::*;
use std::time::Duration;
use walsink::{ErrorKind, Next, SinkErrorClass};
use walsink_postgres::testkit::{Cluster, StopMode};
use walsink_postgres::{fingerprint, gid, Config, MarkerTable, PgSink};
use walsink_tokio::{deliver_ready, spawn_committer};

fn cluster() -> Cluster {
    Cluster::start(&[("max_prepared_transactions", "10")]).expect("start a private cluster")
}

#[tokio::test]
#[cfg_attr(
    not(servers),
    ignore = "needs WALSINK_TEST_SERVERS=1 and the PostgreSQL binaries"
)]
async fn a_private_cluster_has_its_settings_and_is_removed() {
    let pg = Cluster::start(&[("max_prepared_transactions", "7")]).expect("start");
    let dir = pg.dir().to_path_buf();
    let show = |url: String| async move {
        let c = client(&url).await;
        let row = c
            .query_one("SHOW max_prepared_transactions", &[])
            .await
            .unwrap();
        row.get::<_, String>(0)
    };
    assert_eq!(show(pg.url("postgres")).await, "7", "{}", pg.server_log());
    pg.restart(StopMode::Fast).expect("restart");
    assert_eq!(show(pg.url("postgres")).await, "7");
    drop(pg);
    assert!(!dir.exists(), "the cluster's directory is removed");
}

#[tokio::test(flavor = "multi_thread")]
#[cfg_attr(
    not(servers),
    ignore = "needs WALSINK_TEST_SERVERS=1 and the PostgreSQL binaries"
)]
async fn conformance_in_two_phase_mode() {
    let pg = cluster();
    walsink_tokio::conformance::run_all(&Pg::new(&pg.url("postgres"), "&mode=2pc")).await;
    let c = client(&pg.url("postgres")).await;
    let left: i64 = c
        .query_one("SELECT count(*) FROM pg_prepared_xacts", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(left, 0, "no prepared transaction left behind");
}

/// Prepares epoch `cp` of `log` by hand, as a sink that died between PREPARE and COMMIT
/// PREPARED leaves it (marker and rows), under the global id for fingerprint `fp` (the
/// epoch's own when `None`). Returns the gid and the epoch's records.
async fn prepare_by_hand(
    url: &str,
    table: &str,
    log: &Log,
    fp: Option<u64>,
) -> (String, Vec<Vec<u8>>) {
    let mut d = log.wal.deliverer().unwrap();
    let Next::Deliver(p) = d.next_step().unwrap() else {
        panic!("an epoch should be due")
    };
    let e = d.read(&p).unwrap();
    let g = gid(e.key(), fp.unwrap_or_else(|| fingerprint(&e)));
    let c = client(url).await;
    c.batch_execute("BEGIN").await.unwrap();
    assert!(MarkerTable::default()
        .write(&c, e.key(), e.metadata(), e.len())
        .await
        .unwrap());
    let mut recs = Vec::new();
    for r in e.records() {
        let r = r.unwrap();
        c.execute(
            &format!("INSERT INTO {table} VALUES ($1, $2, $3, $4, $5)"),
            &[
                &&*e.key().sink_id,
                &(e.key().subtask as i32),
                &(e.checkpoint() as i64),
                &(r.position.index as i64),
                &&r.data[..],
            ],
        )
        .await
        .unwrap();
        recs.push(r.data.to_vec());
    }
    c.batch_execute(&format!("PREPARE TRANSACTION '{g}'"))
        .await
        .unwrap();
    (g, recs)
}

async fn prepared(url: &str) -> Vec<String> {
    client(url)
        .await
        .query("SELECT gid FROM pg_prepared_xacts ORDER BY gid", &[])
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect()
}

/// A sink died between PREPARE and COMMIT PREPARED: the next delivery of that epoch commits
/// the prepared transaction and writes nothing again.
#[tokio::test(flavor = "multi_thread")]
#[cfg_attr(
    not(servers),
    ignore = "needs WALSINK_TEST_SERVERS=1 and the PostgreSQL binaries"
)]
async fn a_prepared_epoch_left_by_a_crash_is_committed_once() {
    let pg = cluster();
    let url = pg.url("postgres");
    let h = Pg::new(&url, "&mode=2pc");
    PgSink::new(h.config()).connect().await.unwrap();
    let id = unique("left");
    let log = open(&id);
    epoch(&log.wal, 1, 0..50);
    let (g, want1) = prepare_by_hand(&url, &h.table, &log, None).await;
    assert_eq!(prepared(&url).await, vec![g]);
    let mut want = want1;
    want.extend(epoch(&log.wal, 2, 50..80));
    let mut sink = PgSink::new(h.config());
    assert_eq!(deliver_ready(&log.wal, &mut sink).await.unwrap(), 2);
    assert!(prepared(&url).await.is_empty());
    assert_eq!(rows(&url, &h.table, &id, 0).await, want, "each record once");
    assert_eq!(sink.prepared_status().get().count, 0);
}

/// A prepared epoch voided by a restore is rolled back; one under the same checkpoint id
/// but of other content is rolled back and the epoch written anew.
#[tokio::test(flavor = "multi_thread")]
#[cfg_attr(
    not(servers),
    ignore = "needs WALSINK_TEST_SERVERS=1 and the PostgreSQL binaries"
)]
async fn prepared_epochs_not_of_the_log_are_rolled_back() {
    let pg = cluster();
    let url = pg.url("postgres");
    let h = Pg::new(&url, "&mode=2pc");
    PgSink::new(h.config()).connect().await.unwrap();
    // Voided by a restore: epoch 1 prepared, then the engine restores from no checkpoint.
    let id = unique("void");
    let log = open(&id);
    epoch(&log.wal, 1, 0..10);
    prepare_by_hand(&url, &h.table, &log, None).await;
    log.wal.restore(None).unwrap();
    let want = epoch(&log.wal, 2, 100..120);
    let mut sink = PgSink::new(h.config());
    assert_eq!(deliver_ready(&log.wal, &mut sink).await.unwrap(), 1);
    assert!(
        prepared(&url).await.is_empty(),
        "the voided epoch rolled back"
    );
    assert_eq!(rows(&url, &h.table, &id, 0).await, want);
    // The explicit start-up sweep: what the log does not hold pending goes.
    let id2 = unique("sweep");
    let log2 = open(&id2);
    epoch(&log2.wal, 3, 0..5);
    let (g, _) = prepare_by_hand(&url, &h.table, &log2, None).await;
    let gone = sink.roll_back_voided(&id2, 0, |c| c == 3).await.unwrap();
    assert!(gone.is_empty(), "a pending epoch's transaction is kept");
    let gone = sink.roll_back_voided(&id2, 0, |_| false).await.unwrap();
    assert_eq!(gone, vec![g]);
    // Same checkpoint id, other content (another fingerprint).
    let id3 = unique("other");
    let log3 = open(&id3);
    let want3 = epoch(&log3.wal, 1, 0..7);
    prepare_by_hand(&url, &h.table, &log3, Some(42)).await;
    assert_eq!(deliver_ready(&log3.wal, &mut sink).await.unwrap(), 1);
    assert!(prepared(&url).await.is_empty());
    assert_eq!(
        rows(&url, &h.table, &id3, 0).await,
        want3,
        "written anew, once"
    );
}

/// A prepared transaction committed by an operator before the sink came back: the epoch is
/// in the target, the delivery writes nothing (a commit of an already committed id).
#[tokio::test(flavor = "multi_thread")]
#[cfg_attr(
    not(servers),
    ignore = "needs WALSINK_TEST_SERVERS=1 and the PostgreSQL binaries"
)]
async fn an_epoch_committed_by_someone_else_is_success() {
    let pg = cluster();
    let url = pg.url("postgres");
    let h = Pg::new(&url, "&mode=2pc");
    PgSink::new(h.config()).connect().await.unwrap();
    let id = unique("op");
    let log = open(&id);
    epoch(&log.wal, 1, 0..10);
    let (g, want) = prepare_by_hand(&url, &h.table, &log, None).await;
    client(&url)
        .await
        .batch_execute(&format!("COMMIT PREPARED '{g}'"))
        .await
        .unwrap();
    let mut sink = PgSink::new(h.config());
    assert_eq!(deliver_ready(&log.wal, &mut sink).await.unwrap(), 1);
    assert_eq!(rows(&url, &h.table, &id, 0).await, want);
}

/// An old prepared transaction is reported with its age and flagged past the limit.
#[tokio::test(flavor = "multi_thread")]
#[cfg_attr(
    not(servers),
    ignore = "needs WALSINK_TEST_SERVERS=1 and the PostgreSQL binaries"
)]
async fn an_old_prepared_transaction_is_reported() {
    let pg = cluster();
    let url = pg.url("postgres");
    let h = Pg::new(&url, "&mode=2pc&prepared_warn_after=0ms");
    let mut sink = PgSink::new(h.config());
    sink.connect().await.unwrap();
    let id = unique("old");
    let log = open(&id);
    epoch(&log.wal, 1, 0..3);
    let (g, _) = prepare_by_hand(&url, &h.table, &log, None).await;
    let found = sink.check_prepared(&id, 0).await.unwrap();
    assert_eq!(found.len(), 1);
    assert_eq!(found[0].gid, g);
    assert_eq!(found[0].checkpoint, 1);
    let s = sink.prepared_status().get();
    assert_eq!(s.count, 1);
    assert!(s.oldest_age.is_some());
    assert!(s.over_limit, "{s:?}");
    assert_eq!(
        sink.check_prepared("someone-else", 0).await.unwrap(),
        vec![]
    );
}

/// A role without privileges on the table: 42501, permanent, nothing skipped; after GRANT
/// the epoch lands once.
#[tokio::test(flavor = "multi_thread")]
#[cfg_attr(
    not(servers),
    ignore = "needs WALSINK_TEST_SERVERS=1 and the PostgreSQL binaries"
)]
async fn permission_denied_is_permanent_and_nothing_is_skipped() {
    let pg = cluster();
    let url = pg.url("postgres");
    let h = Pg::new(&url, "");
    PgSink::new(h.config()).connect().await.unwrap();
    let admin = client(&url).await;
    admin
        .batch_execute("CREATE ROLE writer LOGIN")
        .await
        .unwrap();
    let as_writer = Config::from_url(&format!(
        "postgres://writer@127.0.0.1:{}/postgres?table={}",
        pg.port(),
        h.table
    ))
    .unwrap();
    let id = unique("perm");
    let log = open(&id);
    let want = epoch(&log.wal, 1, 0..20);
    let mut sink = PgSink::new(as_writer);
    let e = deliver_ready(&log.wal, &mut sink).await.unwrap_err();
    let ErrorKind::Sink(s) = e.kind() else {
        panic!("{e}")
    };
    assert_eq!(s.class(), SinkErrorClass::Permanent, "{e}");
    assert!(e.to_string().contains("42501"), "{e}");
    assert_eq!(log.wal.health().committed, None, "nothing skipped");
    admin
        .batch_execute(&format!(
            "GRANT SELECT, INSERT ON {}, walsink_markers TO writer",
            h.table
        ))
        .await
        .unwrap();
    assert_eq!(deliver_ready(&log.wal, &mut sink).await.unwrap(), 1);
    assert_eq!(rows(&url, &h.table, &id, 0).await, want);
}

/// The server restarts (fast shutdown: sessions see 57P01, then connections are refused)
/// and crashes (immediate) while the committer delivers, in both modes: retried, every
/// record once.
#[tokio::test(flavor = "multi_thread")]
#[cfg_attr(
    not(servers),
    ignore = "needs WALSINK_TEST_SERVERS=1 and the PostgreSQL binaries"
)]
async fn a_server_restart_is_retried_and_nothing_is_lost_or_doubled() {
    let pg = cluster();
    let url = pg.url("postgres");
    for (mode, stop) in [("", StopMode::Fast), ("&mode=2pc", StopMode::Immediate)] {
        let h = Pg::new(&url, mode);
        let id = unique("restart");
        let log = open(&id);
        let committer = spawn_committer(&log.wal, PgSink::new(h.config())).unwrap();
        let mut want = Vec::new();
        for cp in 1..=20u64 {
            want.extend(epoch(&log.wal, cp, cp * 1000..cp * 1000 + 500));
            if cp == 8 {
                let p = &pg;
                tokio::task::block_in_place(|| p.restart(stop)).expect("restart");
            }
        }
        assert!(
            wait_committed(&log.wal, 20, 120).await,
            "{:?}\n{}",
            log.wal.health(),
            pg.server_log()
        );
        let report = committer.shutdown(Duration::from_secs(30)).await;
        assert!(report.clean);
        assert_eq!(rows(&url, &h.table, &id, 0).await, want, "mode {mode:?}");
        assert!(prepared(&url).await.is_empty());
    }
}
