//! Against a private PostgreSQL cluster (feature `testkit`): the helper itself, two-phase
//! commit (the shared server has max_prepared_transactions = 0), prepared transactions left
//! by a crash, voided by a restore or forgotten, permission denied, a server restart, and a
//! delivery killed while its PREPARE or COMMIT is still on a slow or cut link (the restarted
//! sink must not wait for ever behind the old backend's transaction).

use crate::common::proxy::{Hold, Proxy};
use crate::common::*;
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
    // As a claimed sink does: the owner row locked for the transaction's life (when the shard
    // has one).
    c.batch_execute(&format!(
        "DO $$ BEGIN IF to_regclass('walsink_owners') IS NOT NULL THEN PERFORM 1 FROM walsink_owners WHERE sink_id = '{}' FOR SHARE; END IF; END $$",
        e.key().sink_id
    ))
    .await
    .unwrap();
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

/// What the server's sessions are waiting for, for failure messages.
async fn waits(url: &str) -> String {
    client(url)
        .await
        .query(
            "SELECT format('%s %s/%s: %s', pid, state, coalesce(wait_event, '-'), left(query, 80)) \
             FROM pg_stat_activity WHERE backend_type = 'client backend' AND pid <> pg_backend_pid()",
            &[],
        )
        .await
        .map(|rows| {
            rows.iter()
                .map(|r| r.get::<_, String>(0))
                .collect::<Vec<_>>()
                .join("\n")
        })
        .unwrap_or_else(|e| e.to_string())
}

/// The prepared transactions of `sink_id` (subtask 0).
async fn prepared_of(url: &str, sink_id: &str) -> Vec<String> {
    let prefix = walsink_postgres::gid_prefix(sink_id, 0);
    prepared(url)
        .await
        .into_iter()
        .filter(|g| g.starts_with(&prefix))
        .collect()
}

/// Delivers checkpoint 1 of a fresh log through `proxy` (which cuts the client when the
/// delivery's PREPARE or COMMIT goes out: the first run is killed there), then runs a second
/// sink on the same log directly against the server (the restarted run) and checks, within a
/// bound, that the epoch lands exactly once and no prepared transaction is left.
async fn killed_then_restarted(url: &str, extra: &str, proxy: &Proxy) {
    let h = Pg::new(url, extra);
    PgSink::new(h.config()).connect().await.unwrap();
    let id = unique("killed");
    let log = open(&id);
    let want = epoch(&log.wal, 1, 0..200);
    let via = Config::from_url(&format!(
        "postgres://postgres@127.0.0.1:{}/postgres?table={}{extra}",
        proxy.port(),
        h.table
    ))
    .unwrap();
    let mut first = PgSink::new(via);
    let r = tokio::time::timeout(Duration::from_secs(30), deliver_ready(&log.wal, &mut first))
        .await
        .expect("the first run ends when its connection is cut");
    assert!(r.is_err(), "the first run was cut: {r:?}");
    assert!(
        proxy.wait_held(Duration::ZERO).await,
        "the statement is held"
    );
    drop(first);
    let committer = spawn_committer(&log.wal, PgSink::new(h.config())).unwrap();
    let done = wait_committed(&log.wal, 1, 60).await;
    let stuck = if done {
        String::new()
    } else {
        waits(url).await
    };
    let report = committer.shutdown(Duration::from_secs(5)).await;
    assert!(
        done,
        "{extra:?}: the restarted run did not deliver within 60 s: {:?}\n{stuck}",
        log.wal.health()
    );
    assert!(report.clean, "{report:?}");
    assert_eq!(rows(url, &h.table, &id, 0).await, want, "{extra:?}: once");
    let markers = MarkerTable::default()
        .committed(&client(url).await, &id, 0)
        .await
        .unwrap();
    assert_eq!(markers.len(), 1, "{markers:?}");
    assert_eq!(
        prepared_of(url, &id).await,
        Vec::<String>::new(),
        "{extra:?}"
    );
}

/// The first run is killed while its PREPARE TRANSACTION (2pc) or COMMIT (marker mode) is
/// held 7 s on a slow link; the restarted run starts meanwhile, finds nothing prepared and
/// writes its marker, behind the old backend's transaction, which then prepares (or commits).
/// The restarted run must not wait for ever: its marker write gives up at `lock_timeout`,
/// it looks at the prepared transactions again and commits the late one (2pc), or finds the
/// marker committed (marker mode). Each record once, nothing left prepared.
#[tokio::test(flavor = "multi_thread")]
#[cfg_attr(
    not(servers),
    ignore = "needs WALSINK_TEST_SERVERS=1 and the PostgreSQL binaries"
)]
async fn a_late_prepare_of_a_killed_run_is_settled_by_the_restarted_run() {
    let pg = cluster();
    let url = pg.url("postgres");
    for (extra, pattern) in [
        ("&mode=2pc", &b"PREPARE TRANSACTION"[..]),
        ("", &b"COMMIT\0"[..]),
    ] {
        let proxy = Proxy::start(pg.port(), pattern, Hold::For(Duration::from_secs(7))).await;
        killed_then_restarted(&url, extra, &proxy).await;
    }
}

/// The first run's link is cut while its PREPARE TRANSACTION (2pc) or COMMIT (marker mode)
/// is on the way, and the server never sees the connection close: its backend sits idle in
/// the transaction, holding the epoch's marker. `idle_in_transaction_timeout` makes the
/// server end it, so the restarted run (retrying at `lock_timeout` meanwhile) writes the
/// epoch: each record once, nothing prepared.
#[tokio::test(flavor = "multi_thread")]
#[cfg_attr(
    not(servers),
    ignore = "needs WALSINK_TEST_SERVERS=1 and the PostgreSQL binaries"
)]
async fn a_transaction_of_a_vanished_client_is_ended_by_the_idle_timeout() {
    let pg = cluster();
    let url = pg.url("postgres");
    for (extra, pattern) in [
        (
            "&mode=2pc&lock_timeout=1s&idle_in_transaction_timeout=2s",
            &b"PREPARE TRANSACTION"[..],
        ),
        (
            "&lock_timeout=1s&idle_in_transaction_timeout=2s",
            &b"COMMIT\0"[..],
        ),
    ] {
        let proxy = Proxy::start(pg.port(), pattern, Hold::Forever).await;
        killed_then_restarted(&url, extra, &proxy).await;
    }
}

/// Two-phase mode under owners: an old owner's prepared epoch (left by a crash between
/// PREPARE and COMMIT PREPARED) holds the owner row's lock; a take-over claim rolls it back
/// instead of waiting for ever, the old owner is fenced, and the new owner's epochs land once.
#[tokio::test(flavor = "multi_thread")]
#[cfg_attr(
    not(servers),
    ignore = "needs WALSINK_TEST_SERVERS=1 and the PostgreSQL binaries"
)]
async fn a_take_over_rolls_back_the_old_owners_prepared_epoch_and_fences_it() {
    use walsink::Owner;
    let pg = cluster();
    let url = pg.url("postgres");
    let h = Pg::new(&url, "&mode=2pc");
    let id = unique("own2pc");
    let (a, b) = (open(&id), open(&id));
    let mut sa = PgSink::new(h.config());
    sa.claim(&id, 0, &Owner::new(a.wal.log_id())).await.unwrap();
    epoch(&a.wal, 1, 0..20);
    let (g, _) = prepare_by_hand(&url, &h.table, &a, None).await;
    assert_eq!(prepared(&url).await, vec![g]);
    let mut sb = PgSink::new(h.config());
    let claim = tokio::time::timeout(
        Duration::from_secs(60),
        sb.claim(&id, 0, &Owner::new(b.wal.log_id()).take_over(true)),
    )
    .await
    .expect("the claim does not wait behind the prepared transaction")
    .unwrap();
    assert_eq!(claim.generation, 2);
    assert!(prepared(&url).await.is_empty(), "rolled back at the claim");
    let e = deliver_ready(&a.wal, &mut sa).await.unwrap_err();
    assert!(
        matches!(e.kind(), ErrorKind::Sink(s) if s.class() == SinkErrorClass::Fenced),
        "{e}"
    );
    let want = epoch(&b.wal, 1, 100..130);
    assert_eq!(deliver_ready(&b.wal, &mut sb).await.unwrap(), 1);
    assert_eq!(rows(&url, &h.table, &id, 0).await, want, "each record once");
    assert!(prepared(&url).await.is_empty());
}
