//! Against the shared MariaDB server: the conformance suite in marker and XA mode, the sink's
//! own connection killed mid-transaction (`KILL CONNECTION`) in both modes, a missing table
//! and a missing column that are permanent and skip nothing, payloads of every byte value,
//! an XA transaction left prepared by a crash that the next delivery commits, and a server
//! that does not answer.

use crate::common::*;
use mysql_async::prelude::Queryable;
use std::time::Duration;
use walsink::{ErrorKind, Next, SinkErrorClass};
use walsink_mysql::{server_code, xa, Config, MySqlSink, RawRows, RowMapping, TableName, Xid};
use walsink_tokio::{deliver_ready, spawn_committer, AsyncSink};

fn sink_class(e: &walsink::Error) -> SinkErrorClass {
    match e.kind() {
        ErrorKind::Sink(s) => s.class(),
        other => panic!("not a sink error: {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread")]
#[cfg_attr(
    not(servers),
    ignore = "needs WALSINK_TEST_SERVERS=1 and a local MariaDB"
)]
async fn conformance_in_marker_mode() {
    walsink_tokio::conformance::run_all(&My::new(SHARED, "")).await;
}

/// The same suite with the rows as multi-row INSERTs (`bulk=insert`, what a server with
/// `local_infile=OFF` gets).
#[tokio::test(flavor = "multi_thread")]
#[cfg_attr(
    not(servers),
    ignore = "needs WALSINK_TEST_SERVERS=1 and a local MariaDB"
)]
async fn conformance_with_multi_row_inserts() {
    walsink_tokio::conformance::run_all(&My::new(SHARED, "&bulk=insert")).await;
}

#[tokio::test(flavor = "multi_thread")]
#[cfg_attr(
    not(servers),
    ignore = "needs WALSINK_TEST_SERVERS=1 and a local MariaDB"
)]
async fn conformance_in_xa_mode() {
    walsink_tokio::conformance::run_all(&My::new(SHARED, "&mode=xa")).await;
}

#[tokio::test(flavor = "multi_thread")]
#[cfg_attr(
    not(servers),
    ignore = "needs WALSINK_TEST_SERVERS=1 and a local MariaDB"
)]
async fn markers_hold_the_checkpoint_metadata() {
    let my = My::new(SHARED, "");
    let id = unique("meta");
    let log = open(&id);
    epoch(&log.wal, 1, 0..10);
    epoch(&log.wal, 2, 10..10);
    epoch(&log.wal, 5, 10..30);
    let mut sink = MySqlSink::new(my.config());
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

/// Records of every byte value, with quotes, backslashes, NULs and bytes that are not UTF-8,
/// come back as they went in.
#[tokio::test(flavor = "multi_thread")]
#[cfg_attr(
    not(servers),
    ignore = "needs WALSINK_TEST_SERVERS=1 and a local MariaDB"
)]
async fn payloads_of_every_byte_value_round_trip() {
    for bulk in ["load_data", "insert"] {
        every_byte_value(&format!("&bulk={bulk}")).await;
    }
}

async fn every_byte_value(extra: &str) {
    let my = My::new(SHARED, extra);
    let id = unique("bytes");
    let log = open(&id);
    let mut recs: Vec<Vec<u8>> = (0..=255u8).map(|b| vec![b, b'\'', b, b'\\', b]).collect();
    recs.push((0..=255u8).collect());
    recs.push(b"\\' OR 1=1; -- \x1a\r\n\0".to_vec());
    recs.push(Vec::new());
    let want = epoch_of(&log.wal, 1, recs);
    let mut sink = MySqlSink::new(my.config());
    deliver_ready(&log.wal, &mut sink).await.unwrap();
    assert_eq!(rows(SHARED, &my.table, &id, 0).await, want);
}

/// An epoch larger than one INSERT statement (batch_size=64KiB) goes in as many statements
/// inside its one transaction, all of it once.
#[tokio::test(flavor = "multi_thread")]
#[cfg_attr(
    not(servers),
    ignore = "needs WALSINK_TEST_SERVERS=1 and a local MariaDB"
)]
async fn an_epoch_larger_than_one_statement_is_split_and_lands_once() {
    for bulk in ["load_data", "insert"] {
        split_epoch(&format!("&batch_size=64KiB&bulk={bulk}")).await;
    }
}

async fn split_epoch(extra: &str) {
    let my = My::new(SHARED, extra);
    let id = unique("split");
    let log = open(&id);
    let mut want = epoch(&log.wal, 1, 0..20_000);
    want.extend(epoch_of(&log.wal, 2, vec![vec![b'z'; 200 << 10]]));
    let mut sink = MySqlSink::new(my.config());
    assert_eq!(deliver_ready(&log.wal, &mut sink).await.unwrap(), 2);
    assert_eq!(rows(SHARED, &my.table, &id, 0).await, want);
}

/// Waits until the sink's connection (by its id) waits for the table lock the test holds,
/// inside its epoch's transaction, and kills that connection and no other.
async fn kill_own_connection_when_waiting(
    admin: &mut mysql_async::Conn,
    id: &walsink_mysql::ConnectionId,
    table: &str,
) -> u32 {
    for _ in 0..3000 {
        if let Some(cid) = id.get() {
            let waiting: Option<u64> = admin
                .exec_first(
                    "SELECT ID FROM information_schema.PROCESSLIST WHERE ID = ? AND INFO LIKE CONCAT('%INTO%`', ?, '`%')",
                    (cid, table),
                )
                .await
                .unwrap();
            if waiting.is_some() {
                admin
                    .query_drop(format!("KILL CONNECTION {cid}"))
                    .await
                    .unwrap();
                return cid;
            }
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let all: Vec<(u64, Option<String>, Option<String>)> = admin
        .query("SELECT ID, STATE, LEFT(INFO, 120) FROM information_schema.PROCESSLIST")
        .await
        .unwrap();
    panic!(
        "the sink's INSERT was never seen waiting (connection {:?}): {all:?}",
        id.get()
    );
}

/// The sink's own connection is killed (`KILL CONNECTION`, found by its id) while its INSERT
/// waits for a table lock, inside the epoch's transaction with the marker already written:
/// the error is retryable, the committer retries on a new connection, the epoch lands once,
/// and (XA mode) no XA transaction is left.
async fn killed_mid_transaction(extra: &str) {
    let my = My::new(SHARED, extra);
    let id = unique("kill");
    let mut sink = MySqlSink::new(my.config());
    sink.connect().await.expect("connect and create the tables");
    let conn_id = sink.connection_id();
    let mut locker = client(SHARED).await;
    locker
        .query_drop(format!("LOCK TABLES {} WRITE", my.table))
        .await
        .unwrap();
    let log = open(&id);
    let committer = spawn_committer(&log.wal, sink).unwrap();
    let want = epoch(&log.wal, 1, 0..5000);
    let mut admin = client(SHARED).await;
    let killed = kill_own_connection_when_waiting(&mut admin, &conn_id, &my.table).await;
    locker.query_drop("UNLOCK TABLES").await.unwrap();
    assert!(
        wait_committed(&log.wal, 1, 60).await,
        "{:?}",
        log.wal.health()
    );
    let h = log.wal.health();
    assert!(h.errors >= 1, "the kill was an error: {h:?}");
    assert_ne!(conn_id.get(), Some(killed), "a new connection delivered");
    let report = committer.shutdown(Duration::from_secs(30)).await;
    assert!(report.clean);
    assert_eq!(
        rows(SHARED, &my.table, &id, 0).await,
        want,
        "once, in order"
    );
    let left: Vec<Xid> = recover_ours(&mut admin, &id).await;
    assert!(left.is_empty(), "no XA transaction left: {left:?}");
}

async fn recover_ours(c: &mut mysql_async::Conn, sink_id: &str) -> Vec<Xid> {
    let rows: Vec<(i64, i64, i64, Vec<u8>)> = c.query("XA RECOVER").await.unwrap();
    rows.into_iter()
        .filter(|(f, g, _, d)| {
            *f == i64::from(xa::FORMAT_ID)
                && d.starts_with(xa::gtrid_prefix(sink_id, 0).as_bytes())
                && *g > 0
        })
        .map(|(_, _, _, d)| Xid {
            gtrid: String::from_utf8_lossy(&d).into_owned(),
            bqual: String::new(),
            checkpoint: 0,
            fingerprint: 0,
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
#[cfg_attr(
    not(servers),
    ignore = "needs WALSINK_TEST_SERVERS=1 and a local MariaDB"
)]
async fn own_connection_killed_mid_transaction_is_retried_and_lands_once() {
    killed_mid_transaction("").await;
}

#[tokio::test(flavor = "multi_thread")]
#[cfg_attr(
    not(servers),
    ignore = "needs WALSINK_TEST_SERVERS=1 and a local MariaDB"
)]
async fn own_connection_killed_mid_xa_transaction_is_retried_and_lands_once() {
    killed_mid_transaction("&mode=xa").await;
}

/// A crash right after XA PREPARE (simulated: the sink's statements by hand on a connection
/// that then goes away): the next delivery of the same epoch finds the prepared transaction
/// in XA RECOVER and commits it, writing nothing twice; a prepared transaction of another
/// epoch of the sink (voided) is rolled back.
#[tokio::test(flavor = "multi_thread")]
#[cfg_attr(
    not(servers),
    ignore = "needs WALSINK_TEST_SERVERS=1 and a local MariaDB"
)]
async fn an_xa_transaction_left_prepared_is_committed_by_the_next_delivery() {
    let my = My::new(SHARED, "&mode=xa");
    let id = unique("xaprep");
    let log = open(&id);
    let want = epoch(&log.wal, 1, 0..3);
    let mut sink = MySqlSink::new(my.config());
    sink.connect().await.unwrap();
    let mut d = log.wal.deliverer().unwrap();
    let Next::Deliver(p) = d.next_step().unwrap() else {
        panic!("an epoch should be due")
    };
    let e = d.read(&p).unwrap();
    let key = e.key().clone();
    let x = Xid::new(&key, xa::fingerprint(&e));
    let stale = Xid::new(
        &walsink::EpochKey {
            checkpoint: 0,
            ..key.clone()
        },
        7,
    );
    // One connection per transaction: after XA PREPARE a MariaDB connection starts no other
    // transaction until the prepared one is finished or the connection goes.
    for (xid, recs) in [(&x, &want[..]), (&stale, &want[..1])] {
        let mut c = client(SHARED).await;
        {
            c.query_drop(format!("XA START {}", xid.sql()))
                .await
                .unwrap();
            c.exec_drop(
                "INSERT INTO walsink_markers (sink_id, subtask, checkpoint, metadata, records) VALUES (?, 0, ?, '', ?)",
                (&id, xid.checkpoint, recs.len() as u64),
            )
            .await
            .unwrap();
            for (i, r) in recs.iter().enumerate() {
                c.exec_drop(
                    format!("INSERT INTO {} VALUES (?, 0, ?, ?, ?)", my.table),
                    (&id, xid.checkpoint, i as u64, r),
                )
                .await
                .unwrap();
            }
            c.query_drop(format!("XA END {}", xid.sql())).await.unwrap();
            c.query_drop(format!("XA PREPARE {}", xid.sql()))
                .await
                .unwrap();
        }
        c.disconnect().await.unwrap();
    }
    let found = sink.check_prepared(&id, 0).await.unwrap();
    assert_eq!(found.len(), 2, "{found:?}");
    assert!(
        !sink.is_committed(&key).await.unwrap(),
        "prepared, not committed"
    );
    sink.deliver(&e).await.unwrap();
    assert!(sink.is_committed(&key).await.unwrap());
    assert!(sink.check_prepared(&id, 0).await.unwrap().is_empty());
    assert_eq!(rows(SHARED, &my.table, &id, 0).await, want, "once");
}

/// A missing table with create=false: a permanent error carrying 1146; the epoch stays in the
/// log and lands once the table exists.
#[tokio::test(flavor = "multi_thread")]
#[cfg_attr(
    not(servers),
    ignore = "needs WALSINK_TEST_SERVERS=1 and a local MariaDB"
)]
async fn a_missing_table_is_permanent_and_nothing_is_skipped() {
    let my = My::new(SHARED, "&create=false");
    let id = unique("notab");
    let log = open(&id);
    let want = epoch(&log.wal, 1, 0..100);
    let mut sink = MySqlSink::new(my.config());
    let e = sink.connect().await.unwrap_err();
    assert_eq!(e.class(), SinkErrorClass::Permanent, "{e}");
    assert_eq!(server_code(&e), Some(1146), "{e}");
    assert_eq!(
        e.code(),
        Some("1146"),
        "the server's number is the error's code: {e}"
    );
    assert!(e.to_string().contains(&my.table), "{e}");
    let e = deliver_ready(&log.wal, &mut sink).await.unwrap_err();
    assert_eq!(sink_class(&e), SinkErrorClass::Permanent);
    assert_eq!(log.wal.health().committed, None, "nothing skipped");
    let mut admin = client(SHARED).await;
    admin
        .query_drop(
            RawRows
                .create_table(&TableName::parse(&my.table, "table").unwrap())
                .unwrap(),
        )
        .await
        .unwrap();
    assert_eq!(deliver_ready(&log.wal, &mut sink).await.unwrap(), 1);
    assert_eq!(rows(SHARED, &my.table, &id, 0).await, want);
}

/// A table without the payload column: a permanent error carrying 1054 and naming the
/// column; nothing committed.
#[tokio::test(flavor = "multi_thread")]
#[cfg_attr(
    not(servers),
    ignore = "needs WALSINK_TEST_SERVERS=1 and a local MariaDB"
)]
async fn a_missing_column_is_permanent_and_nothing_is_skipped() {
    let my = My::new(SHARED, "");
    let mut admin = client(SHARED).await;
    admin
        .query_drop(format!(
            "CREATE TABLE {} (sink_id text, subtask int, checkpoint bigint, idx bigint)",
            my.table
        ))
        .await
        .unwrap();
    let id = unique("col");
    let log = open(&id);
    epoch(&log.wal, 1, 0..100);
    let mut sink = MySqlSink::new(my.config());
    let e = sink.connect().await.unwrap_err();
    assert_eq!(e.class(), SinkErrorClass::Permanent, "{e}");
    assert_eq!(server_code(&e), Some(1054), "{e}");
    assert_eq!(
        e.code(),
        Some("1054"),
        "the server's number is the error's code: {e}"
    );
    assert!(e.to_string().contains("payload"), "{e}");
    let e = deliver_ready(&log.wal, &mut sink).await.unwrap_err();
    assert_eq!(sink_class(&e), SinkErrorClass::Permanent);
    assert_eq!(log.wal.health().committed, None, "nothing skipped");
}

/// A payload column too small for a record: permanent through INSERT (1406) and LOAD DATA
/// (warning 1265, which LOCAL makes of the error), nothing of the epoch committed (the marker
/// neither).
#[tokio::test(flavor = "multi_thread")]
#[cfg_attr(
    not(servers),
    ignore = "needs WALSINK_TEST_SERVERS=1 and a local MariaDB"
)]
async fn a_value_too_long_for_its_column_is_permanent_and_rolls_back() {
    for bulk in ["load_data", "insert"] {
        too_long(&format!("&bulk={bulk}")).await;
    }
}

async fn too_long(extra: &str) {
    let my = My::new(SHARED, extra);
    let mut admin = client(SHARED).await;
    admin
        .query_drop(format!(
            "CREATE TABLE {} (sink_id varchar(255), subtask int unsigned, checkpoint bigint unsigned, idx bigint unsigned, payload varbinary(8))",
            my.table
        ))
        .await
        .unwrap();
    let id = unique("long");
    let log = open(&id);
    epoch(&log.wal, 1, 0..10);
    let mut sink = MySqlSink::new(my.config());
    let e = deliver_ready(&log.wal, &mut sink).await.unwrap_err();
    assert_eq!(sink_class(&e), SinkErrorClass::Permanent, "{e}");
    // INSERT: 1406 data too long (strict mode); LOAD DATA LOCAL: the server warns 1265
    // (data truncated) instead, which the sink turns into the same permanent error.
    let text = e.to_string();
    assert!(text.contains("1406") || text.contains("1265"), "{text}");
    assert!(sink.committed(&id, 0).await.unwrap().is_empty());
    assert!(rows(SHARED, &my.table, &id, 0).await.is_empty());
}

/// A server that does not answer: a retryable connection error naming the target without
/// its password.
#[tokio::test(flavor = "multi_thread")]
#[cfg_attr(
    not(servers),
    ignore = "needs WALSINK_TEST_SERVERS=1 and a local MariaDB"
)]
async fn an_unreachable_server_is_retryable_and_shows_no_password() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let c = Config::from_url(&format!(
        "mysql://root:s3cret@127.0.0.1:{port}/test?table=t"
    ))
    .unwrap();
    let mut sink = MySqlSink::new(c);
    let e = sink.connect().await.unwrap_err();
    assert_eq!(e.class(), SinkErrorClass::Retryable, "{e}");
    for shown in [e.to_string(), format!("{e:?}"), format!("{sink:?}")] {
        assert!(!shown.contains("s3cret"), "{shown}");
    }
}

/// A server that accepts and never answers: connect gives up after connect_timeout with a
/// retryable error.
#[tokio::test(flavor = "multi_thread")]
#[cfg_attr(
    not(servers),
    ignore = "needs WALSINK_TEST_SERVERS=1 and a local MariaDB"
)]
async fn a_server_that_never_answers_times_out_at_connect() {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    let c = Config::from_url(&format!(
        "mysql://root:s3cret@127.0.0.1:{port}/test?table=t&connect_timeout=300ms"
    ))
    .unwrap();
    let mut sink = MySqlSink::new(c);
    let e = sink.connect().await.unwrap_err();
    assert_eq!(e.class(), SinkErrorClass::Retryable, "{e}");
    assert!(e.to_string().contains("connect_timeout"), "{e}");
    assert!(!format!("{e:?}").contains("s3cret"));
    drop(l);
}

/// A wrong password: permanent (1045), and neither the error nor its Debug shows it.
#[tokio::test(flavor = "multi_thread")]
#[cfg_attr(
    not(servers),
    ignore = "needs WALSINK_TEST_SERVERS=1 and a local MariaDB"
)]
async fn a_wrong_password_is_permanent_and_never_shown() {
    let user = unique("u");
    let mut admin = client(SHARED).await;
    admin
        .query_drop(format!(
            "CREATE USER '{user}'@'%' IDENTIFIED BY 'right-one'"
        ))
        .await
        .unwrap();
    let c = Config::from_url(&format!(
        "mysql://{user}:wr0ng-pw@127.0.0.1:3306/test?table=t"
    ))
    .unwrap();
    let mut sink = MySqlSink::new(c);
    let e = sink.connect().await.unwrap_err();
    admin
        .query_drop(format!("DROP USER '{user}'@'%'"))
        .await
        .unwrap();
    assert_eq!(e.class(), SinkErrorClass::Permanent, "{e}");
    assert_eq!(server_code(&e), Some(1045), "{e}");
    for shown in [e.to_string(), format!("{e:?}"), format!("{sink:?}")] {
        assert!(!shown.contains("wr0ng-pw"), "{shown}");
    }
}

/// A target table that cannot roll back (MyISAM): refused at connect with a permanent error
/// naming the engine, before any row is written (a retry would write its rows twice).
#[tokio::test(flavor = "multi_thread")]
#[cfg_attr(
    not(servers),
    ignore = "needs WALSINK_TEST_SERVERS=1 and a local MariaDB"
)]
async fn a_table_that_cannot_roll_back_is_refused() {
    let my = My::new(SHARED, "");
    let mut admin = client(SHARED).await;
    admin
        .query_drop(format!(
            "CREATE TABLE {} (sink_id varchar(255), subtask int unsigned, checkpoint bigint unsigned, idx bigint unsigned, payload longblob) ENGINE=MyISAM",
            my.table
        ))
        .await
        .unwrap();
    let mut sink = MySqlSink::new(my.config());
    let e = sink.connect().await.unwrap_err();
    assert_eq!(e.class(), SinkErrorClass::Permanent, "{e}");
    assert!(e.to_string().contains("MyISAM"), "{e}");
    assert!(e.to_string().contains(&my.table), "{e}");
}
