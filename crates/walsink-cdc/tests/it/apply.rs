//! The apply side against the shared PostgreSQL (127.0.0.1:5432, database `test`): every op
//! and event shape, replays of old ranges and duplicates, key changes, delete then re-insert,
//! truncate then replayed older inserts, missing columns, each with the table's exact
//! contents; and the target conformance suite. Each test works in a schema of its own.

use serde_json::{json, Value};
use std::sync::Arc;
use walsink::{MemoryCommitStore, Options, WalSink};
use walsink_cdc::{CdcSink, Config};
use walsink_tokio::conformance::{self, Harness};

use crate::common::{admin, SHARED};

fn unique(tag: &str) -> String {
    crate::common::unique("cdc", tag)
}

/// A schema of its own with table `t (id int primary key, v text, n int)`.
struct Target {
    schema: String,
    admin: tokio_postgres::Client,
    _dir: tempfile::TempDir,
    wal: Arc<WalSink>,
    next_cp: u64,
    sink: CdcSink,
}

impl Target {
    async fn new(tag: &str, params: &str) -> Target {
        Target::with_options(tag, params, |o| o).await
    }

    async fn with_options(
        tag: &str,
        params: &str,
        options: impl FnOnce(Options) -> Options,
    ) -> Target {
        let schema = unique(tag);
        let admin = admin().await;
        admin
            .batch_execute(&format!(
                "CREATE SCHEMA {schema}; CREATE TABLE {schema}.t (id int PRIMARY KEY, v text, n int);"
            ))
            .await
            .unwrap();
        let cfg = Config::from_url(&format!("{SHARED}?schema={schema}{params}")).unwrap();
        let sink = CdcSink::connect(cfg).await.expect("connect");
        let dir = tempfile::tempdir().unwrap();
        let (wal, _) = WalSink::open_with(
            Arc::new(walsink::storage::FsStorage::new(dir.path()).unwrap()),
            options(Options::new(&schema)),
            Box::new(MemoryCommitStore::new()),
        )
        .unwrap();
        Target {
            schema,
            admin,
            _dir: dir,
            wal: Arc::new(wal),
            next_cp: 1,
            sink,
        }
    }

    /// Seals `events` as one epoch, ready to deliver.
    fn seal(&mut self, events: &[Value]) {
        let recs: Vec<Vec<u8>> = events.iter().map(|e| e.to_string().into_bytes()).collect();
        self.wal
            .append_batch(recs.iter().map(|r| r.as_slice()))
            .unwrap();
        let cp = self.next_cp;
        self.next_cp += 1;
        self.wal.checkpoint(cp, b"meta").unwrap();
        self.wal.checkpoint_complete(cp).unwrap();
    }

    /// Applies `events` as one epoch.
    async fn epoch(&mut self, events: &[Value]) -> Result<(), walsink::Error> {
        self.seal(events);
        walsink_tokio::deliver_ready(&self.wal, &mut self.sink)
            .await
            .map(|_| ())
    }

    async fn rows(&self) -> Vec<(i32, Option<String>, Option<i32>)> {
        self.admin
            .query(
                &format!("SELECT id, v, n FROM {}.t ORDER BY id", self.schema),
                &[],
            )
            .await
            .unwrap()
            .iter()
            .map(|r| (r.get(0), r.get(1), r.get(2)))
            .collect()
    }

    async fn drop_schema(self) {
        let _ = self
            .admin
            .batch_execute(&format!("DROP SCHEMA {} CASCADE", self.schema))
            .await;
    }
}

fn ev(op: &str, lsn: u64, before: Option<(i32, &str)>, after: Option<(i32, &str)>) -> Value {
    let img = |x: Option<(i32, &str)>| {
        x.map_or(
            Value::Null,
            |(id, v)| json!({"id": id, "v": v, "n": id * 10}),
        )
    };
    json!({"before": img(before), "after": img(after),
           "source": {"db": "src", "schema": "public", "table": "t", "lsn": lsn}, "op": op, "ts_ms": 0})
}

fn row(id: i32, v: &str) -> (i32, Option<String>, Option<i32>) {
    (id, Some(v.to_string()), Some(id * 10))
}

#[tokio::test]
#[cfg_attr(
    not(servers),
    ignore = "needs WALSINK_TEST_SERVERS=1 and a local PostgreSQL"
)]
async fn every_op_and_event_shape() {
    let mut t = Target::new("ops", "").await;
    let wrapped = json!({"schema": {"type": "struct", "optional": false}, "payload": ev("c", 12, None, Some((2, "b")))});
    t.epoch(&[
        ev("r", 5, None, Some((1, "a"))),
        wrapped,
        Value::Null,                              // a tombstone
        json!({"schema": null, "payload": null}), // a wrapped tombstone
        ev("c", 13, None, Some((3, "c"))),
        ev("u", 14, None, Some((1, "a2"))),
        ev("d", 15, Some((3, "c")), None),
    ])
    .await
    .unwrap();
    assert_eq!(t.rows().await, vec![row(1, "a2"), row(2, "b")]);
    t.epoch(&[ev("t", 20, None, None), ev("c", 21, None, Some((9, "z")))])
        .await
        .unwrap();
    assert_eq!(t.rows().await, vec![row(9, "z")]);
    t.drop_schema().await;
}

/// Values are sent as typed text arrays, except for tables with array or composite columns,
/// which go through JSON. Either way a column must hold what `jsonb_populate_record` makes of
/// the event's image: the server computes that here as the oracle, column by column.
#[tokio::test]
#[cfg_attr(
    not(servers),
    ignore = "needs WALSINK_TEST_SERVERS=1 and a local PostgreSQL"
)]
async fn column_types_hold_what_jsonb_populate_record_makes_of_the_image() {
    let mut t = Target::new("types", "").await;
    let s = t.schema.clone();
    t.admin
        .batch_execute(&format!(
            "CREATE DOMAIN {s}.doc AS jsonb; CREATE TYPE {s}.mood AS ENUM ('sad', 'ok'); \
             CREATE TABLE {s}.w (k uuid PRIMARY KEY, i bigint, num numeric(12,3), f double precision, \
               b boolean, ts timestamptz, d date, j jsonb, js json, dj {s}.doc, m {s}.mood, \
               vc varchar(8), by bytea, ip inet); \
             CREATE TABLE {s}.a (id int PRIMARY KEY, tags text[], j jsonb);"
        ))
        .await
        .unwrap();
    let w = |lsn: u64, after: Value| {
        json!({"before": null, "after": after, "op": "c", "ts_ms": 0,
               "source": {"db": "src", "schema": "public", "table": "w", "lsn": lsn}})
    };
    let images = [
        json!({"k": "00000000-0000-0000-0000-000000000001", "i": 9007199254740993_i64, "num": "12.5",
               "f": 1.25, "b": true, "ts": "2026-11-29T10:00:00Z", "d": "2026-11-29",
               "j": {"a": [1, "x", null]}, "js": "\"a string\"", "dj": 7, "m": "ok",
               "vc": "short", "by": "\\x0102", "ip": "10.0.0.1"}),
        json!({"k": "00000000-0000-0000-0000-000000000002", "i": null, "num": 3, "f": 2,
               "b": "false", "ts": null, "d": null, "j": "\"text in jsonb\"", "js": {"o": 1},
               "dj": "null", "m": "sad", "vc": "", "by": null, "ip": null}),
    ];
    let events: Vec<Value> = images
        .iter()
        .enumerate()
        .map(|(n, img)| w(100 + n as u64, img.clone()))
        .collect();
    t.epoch(&events).await.unwrap();
    // Every column but the JSON ones holds what jsonb_populate_record makes of the image.
    let cols = "k, i, num, f, b, ts, d, m, vc, by, ip";
    for img in &images {
        let same: bool =
            t.admin
                .query_one(
                    &format!(
                    "SELECT (SELECT ROW({cols}) FROM {s}.w WHERE k = (r).k) IS NOT DISTINCT FROM \
                     (SELECT ROW({}) FROM (SELECT (r).*) x) \
                     FROM (SELECT jsonb_populate_record(NULL::{s}.w, $1::text::jsonb) AS r) q",
                    cols.replace("js::text", "x.js::text")
                        .split(", ")
                        .map(|c| if c.starts_with("x.") { c.to_string() } else { format!("x.{c}") })
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
                    &[&img.to_string()],
                )
                .await
                .unwrap()
                .get(0);
        assert!(
            same,
            "the row for {img} differs from jsonb_populate_record's"
        );
    }
    // A json or jsonb column takes a string as JSON text, as Debezium sends it (so "null" is
    // JSON null, not SQL NULL), and any other value as itself.
    let json_cols = t
        .admin
        .query(
            &format!("SELECT j::text, js::text, dj::text, dj IS NULL FROM {s}.w ORDER BY k"),
            &[],
        )
        .await
        .unwrap();
    let got: Vec<(String, String, String, bool)> = json_cols
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2), r.get(3)))
        .collect();
    assert_eq!(
        got,
        vec![
            (
                "{\"a\": [1, \"x\", null]}".to_string(),
                "\"a string\"".to_string(),
                "7".to_string(),
                false
            ),
            (
                "\"text in jsonb\"".to_string(),
                "{\"o\": 1}".to_string(),
                "null".to_string(),
                false
            ),
        ]
    );
    // A table with an array column goes through JSON, and gets the same.
    let a = json!({"before": null, "after": {"id": 1, "tags": ["x", "y z"], "j": {"k": 1}}, "op": "c",
                   "ts_ms": 0, "source": {"db": "src", "schema": "public", "table": "a", "lsn": 200}});
    t.epoch(&[a]).await.unwrap();
    let r = t
        .admin
        .query_one(
            &format!("SELECT tags, j::text FROM {s}.a WHERE id = 1"),
            &[],
        )
        .await
        .unwrap();
    let (tags, j): (Vec<String>, String) = (r.get(0), r.get(1));
    assert_eq!(
        (tags, j.as_str()),
        (vec!["x".to_string(), "y z".to_string()], "{\"k\": 1}")
    );
    // There too: JSON text in a string, JSON null apart from SQL NULL.
    let more = [
        (2, json!("[1, \"two\"]")),
        (3, json!("null")),
        (4, Value::Null),
    ]
    .into_iter()
    .map(|(id, j)| {
        json!({"before": null, "after": {"id": id, "tags": [], "j": j}, "op": "c", "ts_ms": 0,
                   "source": {"db": "src", "schema": "public", "table": "a", "lsn": 200 + id}})
    })
    .collect::<Vec<_>>();
    t.epoch(&more).await.unwrap();
    let rows = t
        .admin
        .query(
            &format!("SELECT id, j::text FROM {s}.a WHERE id > 1 ORDER BY id"),
            &[],
        )
        .await
        .unwrap();
    let got: Vec<(i32, Option<String>)> = rows.iter().map(|r| (r.get(0), r.get(1))).collect();
    assert_eq!(
        got,
        vec![
            (2, Some("[1, \"two\"]".to_string())),
            (3, Some("null".to_string())),
            (4, None)
        ]
    );
    // Deletes by a uuid key find the rows the typed upserts wrote.
    let del = json!({"before": {"k": "00000000-0000-0000-0000-000000000001"}, "after": null, "op": "d",
                     "ts_ms": 0, "source": {"db": "src", "schema": "public", "table": "w", "lsn": 300}});
    t.epoch(&[del]).await.unwrap();
    let n: i64 = t
        .admin
        .query_one(&format!("SELECT count(*) FROM {s}.w"), &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(n, 1);
    // Text that is not JSON, for a jsonb column: refused (the epoch stays in the log).
    let bad = w(
        400,
        json!({"k": "00000000-0000-0000-0000-000000000003", "j": "not json"}),
    );
    let e = t.epoch(&[bad]).await.unwrap_err();
    assert!(e.to_string().contains("json"), "{e}");
    t.drop_schema().await;
}

/// A `json` column keeps the exact text it was sent (Debezium's `io.debezium.data.Json` is
/// the text): spacing, key order and duplicate keys, on the typed path and through JSON (a
/// table with an array column), by insert, by update and by a guarded replay of an older
/// event. Until this was mended the text went through `jsonb` and came out normalized.
#[tokio::test]
#[cfg_attr(
    not(servers),
    ignore = "needs WALSINK_TEST_SERVERS=1 and a local PostgreSQL"
)]
async fn json_columns_keep_their_exact_text() {
    let mut t = Target::new("jsontext", "").await;
    let s = t.schema.clone();
    t.admin
        .batch_execute(&format!(
            "CREATE TABLE {s}.j (id int PRIMARY KEY, js json, jb jsonb); \
             CREATE TABLE {s}.ja (id int PRIMARY KEY, tags int[], js json);"
        ))
        .await
        .unwrap();
    let odd = [
        r#"{"b":1,  "a":2, "a":3}"#,
        "[1,\n  2 ,\t{\"z\" : null,\"z\":true}]",
        r#"  "padded"  "#,
        r#"{"n": 1.10, "big": 123456789012345678901234567890}"#,
    ];
    let ev = |table: &str, op: &str, lsn: u64, id: usize, js: &str| {
        let after = if table == "j" {
            json!({"id": id, "js": js, "jb": js})
        } else {
            json!({"id": id, "tags": [id], "js": js})
        };
        json!({"before": null, "after": after, "op": op, "ts_ms": 0,
               "source": {"db": "src", "schema": "public", "table": table, "lsn": lsn}})
    };
    for table in ["j", "ja"] {
        let inserts: Vec<Value> = odd
            .iter()
            .enumerate()
            .map(|(i, js)| ev(table, "c", 100 + i as u64, i, js))
            .collect();
        t.epoch(&inserts).await.unwrap();
        // Updates that reverse the texts, then a replay of the inserts (older: no change).
        let updates: Vec<Value> = odd
            .iter()
            .rev()
            .enumerate()
            .map(|(i, js)| ev(table, "u", 200 + i as u64, i, js))
            .collect();
        t.epoch(&updates).await.unwrap();
        t.epoch(&inserts).await.unwrap();
        let got: Vec<String> = t
            .admin
            .query(
                &format!("SELECT js::text FROM {s}.{table} ORDER BY id"),
                &[],
            )
            .await
            .unwrap()
            .iter()
            .map(|r| r.get(0))
            .collect();
        let want: Vec<String> = odd.iter().rev().map(|x| x.to_string()).collect();
        assert_eq!(got, want, "table {table}");
    }
    // The jsonb column beside it still holds jsonb's form of the same text.
    let jb: String = t
        .admin
        .query_one(&format!("SELECT jb::text FROM {s}.j WHERE id = 3"), &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(jb, r#"{"a": 3, "b": 1}"#);
    // Text that is not JSON is refused for a json column too.
    let e = t
        .epoch(&[ev("j", "c", 500, 9, "{not json")])
        .await
        .unwrap_err();
    assert!(e.to_string().contains("json"), "{e}");
    t.drop_schema().await;
}

#[tokio::test]
#[cfg_attr(
    not(servers),
    ignore = "needs WALSINK_TEST_SERVERS=1 and a local PostgreSQL"
)]
async fn columns_named_like_the_statements_aliases_are_applied() {
    // A `json` column sends the rows through `jsonb_populate_record`, whose statement names
    // its events `e`, its records `r` and its rows `v`, `w` and `t`: columns of those names
    // must not be taken for them (found by cli/tests/cdc_kill_loop.rs, an `e mood[]`).
    let mut t = Target::new("aliases", "").await;
    let s = t.schema.clone();
    t.admin
        .batch_execute(&format!(
            "CREATE TYPE {s}.mood AS ENUM ('sad', 'ok'); \
             CREATE TABLE {s}.a (id int PRIMARY KEY, e {s}.mood[], r text, p int, v text, w text, u text, js json);"
        ))
        .await
        .unwrap();
    let ev = |op: &str, lsn: u64, id: i32, after: bool| {
        let img = json!({"id": id, "e": "{sad,ok}", "r": format!("r{lsn}"), "p": lsn,
                         "v": "v", "w": "w", "u": "u", "js": r#"{"b":1,  "a":2}"#});
        let (before, after) = if after {
            (Value::Null, img)
        } else {
            (json!({"id": id}), Value::Null)
        };
        json!({"before": before, "after": after, "op": op, "ts_ms": 0,
               "source": {"db": "src", "schema": "public", "table": "a", "lsn": lsn}})
    };
    t.epoch(&[
        ev("c", 10, 1, true),
        ev("c", 11, 2, true),
        ev("c", 12, 3, true),
    ])
    .await
    .expect("inserts");
    // Out of order (guarded): an update, a delete and an older replay.
    t.epoch(&[
        ev("u", 20, 1, true),
        ev("d", 21, 2, false),
        ev("c", 5, 3, true),
    ])
    .await
    .expect("update, delete and replay");
    let got: Vec<String> = t
        .admin
        .query(
            &format!("SELECT ROW(id, e, r, p, v, w, u, js)::text FROM {s}.a ORDER BY id"),
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(
        got,
        [
            r#"(1,"{sad,ok}",r20,20,v,w,u,"{""b"":1,  ""a"":2}")"#,
            r#"(3,"{sad,ok}",r12,12,v,w,u,"{""b"":1,  ""a"":2}")"#
        ]
    );
    t.drop_schema().await;
}

#[tokio::test]
#[cfg_attr(
    not(servers),
    ignore = "needs WALSINK_TEST_SERVERS=1 and a local PostgreSQL"
)]
async fn replayed_old_ranges_and_duplicates_change_nothing() {
    let mut t = Target::new("replay", "").await;
    let first = vec![
        ev("c", 10, None, Some((1, "a"))),
        ev("c", 11, None, Some((2, "b"))),
        ev("u", 12, Some((1, "a")), Some((1, "a2"))),
        ev("d", 13, Some((2, "b")), None),
    ];
    t.epoch(&first).await.unwrap();
    let want = vec![row(1, "a2")];
    assert_eq!(t.rows().await, want);
    // The same range again (a Kafka consumer rewound), twice in one epoch, and a prefix.
    let mut again = first.clone();
    again.extend(first.clone());
    t.epoch(&again).await.unwrap();
    t.epoch(&first[..2]).await.unwrap();
    assert_eq!(t.rows().await, want, "a replay changed the replica");
    // Duplicates inside one epoch with newer events in between keep the newest.
    t.epoch(&[
        ev("u", 20, None, Some((1, "x"))),
        ev("u", 12, None, Some((1, "old"))),
        ev("u", 20, None, Some((1, "x"))),
    ])
    .await
    .unwrap();
    assert_eq!(t.rows().await, vec![row(1, "x")]);
    t.drop_schema().await;
}

#[tokio::test]
#[cfg_attr(
    not(servers),
    ignore = "needs WALSINK_TEST_SERVERS=1 and a local PostgreSQL"
)]
async fn key_changes_and_delete_then_reinsert() {
    let mut t = Target::new("keys", "").await;
    t.epoch(&[
        ev("c", 10, None, Some((1, "a"))),
        ev("u", 11, Some((1, "a")), Some((5, "moved"))),
    ])
    .await
    .unwrap();
    assert_eq!(t.rows().await, vec![row(5, "moved")]);
    // A key change as its own epoch, then back.
    t.epoch(&[ev("u", 12, Some((5, "moved")), Some((1, "back")))])
        .await
        .unwrap();
    assert_eq!(t.rows().await, vec![row(1, "back")]);
    // Delete then re-insert in one epoch, and across epochs.
    t.epoch(&[
        ev("d", 13, Some((1, "back")), None),
        ev("c", 14, None, Some((1, "again"))),
    ])
    .await
    .unwrap();
    assert_eq!(t.rows().await, vec![row(1, "again")]);
    t.epoch(&[ev("d", 15, Some((1, "again")), None)])
        .await
        .unwrap();
    assert_eq!(t.rows().await, vec![]);
    // Replayed older inserts and updates cannot bring the deleted row back (tombstone).
    t.epoch(&[
        ev("c", 10, None, Some((1, "a"))),
        ev("u", 12, Some((5, "moved")), Some((1, "back"))),
        ev("c", 14, None, Some((1, "again"))),
        ev("r", 99, None, Some((1, "snapshot"))),
    ])
    .await
    .unwrap();
    assert_eq!(t.rows().await, vec![], "a deleted row was resurrected");
    t.epoch(&[ev("c", 16, None, Some((1, "new")))])
        .await
        .unwrap();
    assert_eq!(t.rows().await, vec![row(1, "new")]);
    t.drop_schema().await;
}

#[tokio::test]
#[cfg_attr(
    not(servers),
    ignore = "needs WALSINK_TEST_SERVERS=1 and a local PostgreSQL"
)]
async fn an_old_delete_loses_to_a_newer_row_and_leaves_nothing_that_matters() {
    let mut t = Target::new("olddel", "").await;
    t.epoch(&[ev("c", 20, None, Some((1, "new")))])
        .await
        .unwrap();
    // A replayed delete older than the row, then a replayed insert between the two.
    t.epoch(&[ev("d", 15, Some((1, "x")), None)]).await.unwrap();
    t.epoch(&[ev("u", 18, None, Some((1, "between")))])
        .await
        .unwrap();
    assert_eq!(t.rows().await, vec![row(1, "new")]);
    t.epoch(&[ev("d", 25, Some((1, "new")), None)])
        .await
        .unwrap();
    t.epoch(&[ev("c", 22, None, Some((1, "older than the delete")))])
        .await
        .unwrap();
    assert_eq!(t.rows().await, vec![]);
    t.epoch(&[ev("c", 30, None, Some((1, "back")))])
        .await
        .unwrap();
    assert_eq!(t.rows().await, vec![row(1, "back")]);
    // A row written before walsink (no rank) loses to any event.
    t.admin
        .batch_execute(&format!(
            "INSERT INTO {}.t VALUES (7, 'manual', 70)",
            t.schema
        ))
        .await
        .unwrap();
    t.epoch(&[ev("r", 1, None, Some((7, "snap")))])
        .await
        .unwrap();
    assert_eq!(t.rows().await, vec![row(1, "back"), row(7, "snap")]);
    t.drop_schema().await;
}

/// Forgets the table's stored high-water, as bookkeeping written before it existed would:
/// `NULL` in its row, or no row at all.
async fn forget_high(t: &Target, drop_row: bool) {
    let sql = if drop_row {
        format!(
            "DELETE FROM {}.walsink_cdc_tables WHERE tbl = 't'",
            t.schema
        )
    } else {
        format!(
            "UPDATE {}.walsink_cdc_tables SET high = NULL WHERE tbl = 't'",
            t.schema
        )
    };
    t.admin.batch_execute(&sql).await.unwrap();
}

#[tokio::test]
#[cfg_attr(
    not(servers),
    ignore = "needs WALSINK_TEST_SERVERS=1 and a local PostgreSQL"
)]
async fn in_order_epochs_go_unguarded_and_anything_reaching_back_goes_guarded() {
    let mut t = Target::new("high", "").await;
    let counts = |t: &Target| {
        let s = t.sink.stats();
        (s.sent, s.unguarded)
    };
    // In order: both statements (deletes, upserts) go without the guard.
    t.epoch(&[
        ev("c", 10, None, Some((1, "a"))),
        ev("c", 11, None, Some((2, "b"))),
        ev("u", 12, Some((1, "a")), Some((1, "a2"))),
        ev("d", 13, Some((2, "b")), None),
    ])
    .await
    .unwrap();
    assert_eq!(counts(&t), (2, 2));
    assert_eq!(t.rows().await, vec![row(1, "a2")]);
    // One event at or below the high-water puts the whole run under the guard.
    t.epoch(&[
        ev("c", 14, None, Some((3, "c"))),
        ev("u", 5, None, Some((1, "old"))),
        ev("c", 13, None, Some((2, "zombie"))),
    ])
    .await
    .unwrap();
    assert_eq!(counts(&t), (3, 2), "a run reaching back went unguarded");
    assert_eq!(t.rows().await, vec![row(1, "a2"), row(3, "c")]);
    t.epoch(&[ev("u", 20, None, Some((1, "x")))]).await.unwrap();
    assert_eq!(counts(&t), (4, 3));
    // Without a stored high-water (bookkeeping from before it, or none), it is computed from
    // the rows, the tombstones and the watermark, so older events still change nothing.
    forget_high(&t, false).await;
    t.epoch(&[ev("u", 18, None, Some((1, "older than the row")))])
        .await
        .unwrap();
    forget_high(&t, true).await;
    t.epoch(&[ev("d", 19, Some((1, "x")), None)]).await.unwrap();
    assert_eq!(t.rows().await, vec![row(1, "x"), row(3, "c")]);
    assert_eq!(
        counts(&t),
        (6, 3),
        "an unknown high-water was taken as none"
    );
    t.epoch(&[ev("d", 30, Some((1, "x")), None)]).await.unwrap();
    forget_high(&t, false).await;
    t.epoch(&[ev("c", 25, None, Some((1, "older than the delete")))])
        .await
        .unwrap();
    assert_eq!(t.rows().await, vec![row(3, "c")]);
    t.epoch(&[ev("t", 40, None, None)]).await.unwrap();
    forget_high(&t, true).await;
    t.admin
        .batch_execute(&format!(
            "INSERT INTO {}.walsink_cdc_tables (tbl, truncated_at) VALUES ('t', 40)",
            t.schema
        ))
        .await
        .unwrap();
    t.epoch(&[ev("c", 35, None, Some((5, "older than the truncate")))])
        .await
        .unwrap();
    assert_eq!(t.rows().await, vec![]);
    let (sent, unguarded) = counts(&t);
    t.epoch(&[ev("c", 41, None, Some((6, "f")))]).await.unwrap();
    assert_eq!(counts(&t), (sent + 1, unguarded + 1));
    assert_eq!(t.rows().await, vec![row(6, "f")]);
    t.drop_schema().await;
}

/// An upstream in order whose epoch is sent in several flushes: a key created early and
/// changed late is held until after keys created later have been sent, so its create ranks
/// below what the table holds by then. The statements still go unguarded (every rank sent is
/// above it) and such a key still goes as a plain insert (nothing the table held when the
/// epoch began, and nothing sent of a later event, can be of its key): a few snapshot reads at
/// one position (all in the first flush: reads of one rank sent in two flushes put the second
/// under the guard), then creates, each key changed again about 1,500 events later.
#[tokio::test]
#[cfg_attr(
    not(servers),
    ignore = "needs WALSINK_TEST_SERVERS=1 and a local PostgreSQL"
)]
async fn an_epoch_in_order_sent_in_several_flushes_stays_unguarded_and_inserts_created_keys() {
    let mut t = Target::new("inorder", "").await;
    let mut events = Vec::new();
    let mut want = std::collections::BTreeMap::new();
    for id in 0..400 {
        events.push(ev("r", 500, None, Some((id, "snap"))));
        want.insert(id, "snap".to_string());
    }
    let mut lsn = 1000;
    for id in 400..15_000 {
        lsn += 1;
        events.push(ev("c", lsn, None, Some((id, "new"))));
        want.insert(id, "new".to_string());
        if id % 3 == 0 && id >= 4500 {
            let back = id - 1500;
            lsn += 1;
            let v = format!("changed at {lsn}");
            events.push(ev("u", lsn, None, Some((back, &v))));
            want.insert(back, v);
        }
    }
    t.epoch(&events).await.unwrap();
    let s = t.sink.stats();
    assert!(
        s.sent >= 4,
        "the epoch was not sent in several flushes: {s:?}"
    );
    assert_eq!(
        s.unguarded, s.sent,
        "a run of the epoch went guarded: {s:?}"
    );
    assert_eq!(s.inserts, s.sent, "created keys went as upserts: {s:?}");
    assert_eq!(s.refused_tables, 0);
    let want: Vec<_> = want.iter().map(|(id, v)| row(*id, v)).collect();
    assert_eq!(t.rows().await, want);
    // The same keys created again, in order, above everything the table holds: they are
    // there, so the insert fails, the epoch is applied again with upserts, and nothing of
    // the first attempt stays.
    let again: Vec<Value> = (0..6000)
        .map(|id| ev("c", 100_000 + id as u64, None, Some((id, "again"))))
        .collect();
    t.epoch(&again).await.unwrap();
    assert_eq!(t.sink.stats().refused_tables, 1);
    let rows = t.rows().await;
    assert_eq!(rows.len(), want.len());
    assert!(rows[..6000].iter().all(|r| r.1.as_deref() == Some("again")));
    assert_eq!(rows[6000..], want[6000..]);
    t.drop_schema().await;
}

/// Keys the source created (`c`, `r`) in an unguarded run go as a plain insert. When such a
/// key is in the table after all (a row written outside the change stream), the insert fails,
/// the epoch's transaction rolls back, and the sink applies the epoch again with upserts; the
/// table gets upserts from then on. A key whose run begins with another event is upserted from
/// the start.
#[tokio::test]
#[cfg_attr(
    not(servers),
    ignore = "needs WALSINK_TEST_SERVERS=1 and a local PostgreSQL"
)]
async fn created_keys_are_inserted_and_a_key_already_there_turns_the_table_to_upserts() {
    let mut t = Target::new("created", "").await;
    t.epoch(&[
        ev("c", 10, None, Some((1, "a"))),
        ev("r", 11, None, Some((2, "b"))),
        ev("c", 12, None, Some((3, "c"))),
        ev("u", 13, None, Some((3, "c2"))),
    ])
    .await
    .unwrap();
    assert_eq!(t.sink.stats().inserts, 1);
    assert_eq!(t.rows().await, vec![row(1, "a"), row(2, "b"), row(3, "c2")]);
    // Delete then create of a key that is there: its run begins with the delete.
    t.epoch(&[
        ev("d", 20, Some((1, "a")), None),
        ev("c", 21, None, Some((1, "a2"))),
    ])
    .await
    .unwrap();
    assert_eq!(
        t.sink.stats().inserts,
        1,
        "a key that was there got a plain insert"
    );
    assert_eq!(t.sink.stats().refused_tables, 0);
    // A row written outside the stream, then created by it, in an epoch that also holds a
    // delete: nothing of the failed attempt may stay (the delete's tombstone neither).
    t.admin
        .batch_execute(&format!(
            "INSERT INTO {}.t VALUES (7, 'outside', 0)",
            t.schema
        ))
        .await
        .unwrap();
    let inserts = t.sink.stats().inserts;
    t.epoch(&[
        ev("c", 30, None, Some((6, "f"))),
        ev("c", 31, None, Some((7, "g"))),
        ev("d", 32, Some((2, "b")), None),
    ])
    .await
    .unwrap();
    assert_eq!(t.sink.stats().refused_tables, 1);
    assert_eq!(
        t.sink.stats().inserts,
        inserts,
        "the rolled-back attempt's insert was counted"
    );
    assert_eq!(t.sink.stats().epochs, 3);
    // Every later epoch of the table upserts.
    let inserts = t.sink.stats().inserts;
    t.epoch(&[ev("c", 40, None, Some((8, "h")))]).await.unwrap();
    assert_eq!(t.sink.stats().inserts, inserts);
    assert_eq!(
        t.rows().await,
        vec![
            row(1, "a2"),
            row(3, "c2"),
            row(6, "f"),
            row(7, "g"),
            row(8, "h")
        ]
    );
    t.drop_schema().await;
}

#[tokio::test]
#[cfg_attr(
    not(servers),
    ignore = "needs WALSINK_TEST_SERVERS=1 and a local PostgreSQL"
)]
async fn a_replayed_create_that_a_newer_update_wins_over_gets_no_plain_insert() {
    // A rewound upstream sends a key's create again, and then the key's next change: the
    // winner (the update) is newer than anything the table holds, but the row is there, so
    // the run must not take the replayed create's word that it is not.
    let mut t = Target::new("recreate", "").await;
    t.epoch(&[ev("c", 10, None, Some((1, "a")))]).await.unwrap();
    t.epoch(&[
        ev("c", 10, None, Some((1, "a"))),
        ev("u", 20, None, Some((1, "b"))),
        ev("c", 21, None, Some((2, "c"))),
    ])
    .await
    .unwrap();
    assert_eq!(t.rows().await, vec![row(1, "b"), row(2, "c")]);
    assert_eq!(t.sink.stats().refused_tables, 0, "{:?}", t.sink.stats());
    t.drop_schema().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(servers),
    ignore = "needs WALSINK_TEST_SERVERS=1 and a local PostgreSQL"
)]
async fn an_epoch_waits_for_another_writer_of_the_table_and_then_sees_its_high_water() {
    let mut t = Target::new("highlock", "").await;
    t.epoch(&[ev("c", 10, None, Some((1, "a")))]).await.unwrap();
    // Another writer of the table (a second sink) holds its bookkeeping row while it writes a
    // newer row, and commits later.
    let other = admin().await;
    other
        .batch_execute(&format!(
            "BEGIN; SELECT high FROM {s}.walsink_cdc_tables WHERE tbl = 't' FOR UPDATE; \
             UPDATE {s}.t SET v = 'newer', _walsink_pos = 100 WHERE id = 1; \
             UPDATE {s}.walsink_cdc_tables SET high = 100 WHERE tbl = 't';",
            s = t.schema
        ))
        .await
        .unwrap();
    let committed = std::sync::Mutex::new(None);
    let (applied, _) = tokio::join!(
        async {
            t.epoch(&[ev("u", 50, None, Some((1, "older")))])
                .await
                .unwrap();
            std::time::Instant::now()
        },
        async {
            tokio::time::sleep(std::time::Duration::from_millis(400)).await;
            *committed.lock().unwrap() = Some(std::time::Instant::now());
            other.batch_execute("COMMIT").await.unwrap();
        }
    );
    assert!(
        applied >= committed.lock().unwrap().expect("committed"),
        "the epoch did not wait for the other writer's lock"
    );
    let rows = t.rows().await;
    assert_eq!(
        rows,
        vec![(1, Some("newer".to_string()), Some(10))],
        "an epoch read the high-water before the other writer committed and overwrote a newer row"
    );
    assert_eq!(t.sink.stats().unguarded, 1, "{:?}", t.sink.stats());
    t.drop_schema().await;
}

/// The guard's column is added to a new table in a transaction of its own: an `ALTER` in the
/// epoch's transaction would hold the table's strongest lock until the epoch commits, and
/// every reader of the replica would wait for it. Here the first epoch of a table is held up
/// (another writer holds the table's bookkeeping row), and a reader still gets its answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(servers),
    ignore = "needs WALSINK_TEST_SERVERS=1 and a local PostgreSQL"
)]
async fn readers_are_not_locked_out_by_a_tables_first_epoch() {
    let mut t = Target::new("firstlock", "").await;
    let holder = admin().await;
    holder
        .batch_execute(&format!(
            "BEGIN; INSERT INTO {}.walsink_cdc_tables (tbl) VALUES ('t');",
            t.schema
        ))
        .await
        .unwrap();
    let reader = admin().await;
    let schema = t.schema.clone();
    let (applied, read) = tokio::join!(
        async { t.epoch(&[ev("c", 10, None, Some((1, "a")))]).await },
        async {
            // Once the epoch waits for the bookkeeping row, a reader of the table answers.
            tokio::time::sleep(std::time::Duration::from_millis(500)).await;
            let read = reader
                .batch_execute(&format!(
                    "SET statement_timeout = 2000; SELECT count(*) FROM {schema}.t"
                ))
                .await;
            holder.batch_execute("ROLLBACK").await.unwrap();
            read
        }
    );
    applied.unwrap();
    read.expect("a reader waited for the first epoch of the table");
    assert_eq!(t.rows().await, vec![row(1, "a")]);
    t.drop_schema().await;
}

#[tokio::test]
#[cfg_attr(
    not(servers),
    ignore = "needs WALSINK_TEST_SERVERS=1 and a local PostgreSQL"
)]
async fn truncate_then_replayed_older_inserts() {
    let mut t = Target::new("trunc", "").await;
    t.epoch(&[
        ev("r", 1, None, Some((1, "s1"))),
        ev("c", 10, None, Some((2, "b"))),
        ev("c", 11, None, Some((3, "c"))),
    ])
    .await
    .unwrap();
    t.epoch(&[ev("t", 20, None, None), ev("c", 21, None, Some((4, "d")))])
        .await
        .unwrap();
    assert_eq!(t.rows().await, vec![row(4, "d")]);
    // Everything again, from the snapshot on: only the truncate's successors survive.
    t.epoch(&[
        ev("r", 1, None, Some((1, "s1"))),
        ev("c", 10, None, Some((2, "b"))),
        ev("c", 11, None, Some((3, "c"))),
        ev("t", 20, None, None),
        ev("c", 21, None, Some((4, "d"))),
        ev("t", 19, None, None), // an older truncate changes nothing either
    ])
    .await
    .unwrap();
    assert_eq!(t.rows().await, vec![row(4, "d")]);
    t.drop_schema().await;
}

#[tokio::test]
#[cfg_attr(
    not(servers),
    ignore = "needs WALSINK_TEST_SERVERS=1 and a local PostgreSQL"
)]
async fn a_missing_column_fails_closed_naming_table_column_and_position() {
    let mut t = Target::new("cols", "").await;
    t.epoch(&[ev("c", 10, None, Some((1, "a")))]).await.unwrap();
    let bad = json!({"after": {"id": 2, "v": "b", "n": 20, "extra": true},
        "source": {"table": "t", "lsn": 11}, "op": "c"});
    let e = t
        .epoch(&[ev("c", 12, None, Some((3, "c"))), bad.clone()])
        .await;
    let msg = t.wal.health().last_error.unwrap_or_default();
    assert!(e.is_err());
    for part in [
        &format!("\"{}\".\"t\"", t.schema),
        "\"extra\"",
        "checkpoint 2, index 1",
        "source position 11",
    ] {
        assert!(msg.contains(part), "{part} not in: {msg}");
    }
    assert_eq!(
        t.rows().await,
        vec![row(1, "a")],
        "nothing of the failed epoch is applied"
    );
    t.drop_schema().await;

    let mut t = Target::new("addcols", "&add_missing_columns=true").await;
    t.epoch(&[bad]).await.unwrap();
    let v: bool = t
        .admin
        .query_one(
            &format!("SELECT extra FROM {}.t WHERE id = 2", t.schema),
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert!(v);
    t.drop_schema().await;
}

/// A delivery dropped at any point (here after a growing timeout) of an epoch that adds a
/// column inside its transaction: the next delivery succeeds at once and applies the epoch
/// whole, the added column included.
#[tokio::test]
#[cfg_attr(
    not(servers),
    ignore = "needs WALSINK_TEST_SERVERS=1 and a local PostgreSQL"
)]
async fn a_dropped_delivery_is_applied_whole_by_the_next_one() {
    let mut dropped = 0;
    for k in 0..30u64 {
        let mut t = Target::new("dropped", "&add_missing_columns=true").await;
        let wide = json!({"after": {"id": 2, "v": "b", "n": 20, "extra": true},
            "source": {"table": "t", "lsn": 11}, "op": "c"});
        let mut events = vec![wide];
        events.extend((100..400).map(|i| ev("c", 12 + i as u64, None, Some((i, "x")))));
        t.seal(&events);
        let cut = std::time::Duration::from_micros(200 * k);
        let first =
            tokio::time::timeout(cut, walsink_tokio::deliver_ready(&t.wal, &mut t.sink)).await;
        if first.is_err() {
            dropped += 1;
        }
        walsink_tokio::deliver_ready(&t.wal, &mut t.sink)
            .await
            .unwrap_or_else(|e| panic!("after a delivery dropped at {cut:?}: {e}"));
        let n: i64 = t
            .admin
            .query_one(
                &format!(
                    "SELECT count(*) FROM {}.t WHERE extra IS NOT NULL OR id >= 100",
                    t.schema
                ),
                &[],
            )
            .await
            .unwrap()
            .get(0);
        assert_eq!(n, 301, "after a delivery dropped at {cut:?}");
        t.drop_schema().await;
    }
    assert!(dropped >= 5, "only {dropped} deliveries were dropped");
}

#[tokio::test]
#[cfg_attr(
    not(servers),
    ignore = "needs WALSINK_TEST_SERVERS=1 and a local PostgreSQL"
)]
async fn bad_events_and_missing_tables_are_permanent_errors_naming_them() {
    let mut t = Target::new("bad", "").await;
    let e = t
        .epoch(&[
            ev("c", 1, None, Some((1, "a"))),
            json!({"op": "c", "source": {"table": "t"}}),
        ])
        .await;
    assert!(e.is_err());
    let msg = t.wal.health().last_error.unwrap_or_default();
    assert!(
        msg.contains("checkpoint 1, index 1") && msg.contains("source.lsn"),
        "{msg}"
    );
    let mut t2 = Target::new("notable", "").await;
    let e = t2
        .epoch(&[json!({"op": "c", "after": {"id": 1}, "source": {"table": "nope", "lsn": 3}})])
        .await;
    assert!(e.is_err());
    let msg = t2.wal.health().last_error.unwrap_or_default();
    assert!(
        msg.contains("\"nope\" does not exist") && msg.contains("index 0"),
        "{msg}"
    );
    t.drop_schema().await;
    t2.drop_schema().await;
}

/// An epoch much larger than the parser's batches and the read chunk, with a bad event early
/// and a bad one late: the first is named, nothing of the epoch is applied, and the delivery
/// returns (the parser and the log reader stop with the planning).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(servers),
    ignore = "needs WALSINK_TEST_SERVERS=1 and a local PostgreSQL"
)]
async fn a_bad_event_in_a_large_epoch_stops_it_whole_and_promptly() {
    let mut t = Target::new("badlarge", "").await;
    let mut events: Vec<Value> = (0..60_000)
        .map(|i| ev("c", 10 + i as u64, None, Some((i, &"x".repeat(200)))))
        .collect();
    events[1_000] = json!({"op": "c", "after": {"id": 1}, "source": {"table": "t"}});
    events[50_000] = json!("not an event");
    let e = tokio::time::timeout(std::time::Duration::from_secs(60), t.epoch(&events))
        .await
        .expect("the delivery returns");
    assert!(e.is_err());
    let msg = t.wal.health().last_error.unwrap_or_default();
    assert!(msg.contains("checkpoint 1, index 1000"), "{msg}");
    assert_eq!(t.rows().await, vec![]);
    t.drop_schema().await;
}

/// Events are parsed ahead in batches, chunk by chunk: with read chunks of 4 KiB, an epoch of
/// thousands of events spans hundreds of chunks and batches, applied in order to the exact
/// source state, and a bad event deep in it is named by its own position.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(servers),
    ignore = "needs WALSINK_TEST_SERVERS=1 and a local PostgreSQL"
)]
async fn an_epoch_of_many_chunks_is_parsed_ahead_in_order() {
    let mut t = Target::with_options("chunks", "", |o| o.read_chunk_size(4096)).await;
    let mut want = std::collections::BTreeMap::new();
    let mut events = Vec::new();
    for i in 0..6_000u64 {
        let id = (i % 1_500) as i32;
        let v = format!("v{i}");
        let e = if i % 7 == 3 {
            want.remove(&id);
            ev("d", 10 + i, Some((id, "")), None)
        } else {
            want.insert(id, v.clone());
            ev("u", 10 + i, None, Some((id, &v)))
        };
        events.push(e);
    }
    t.epoch(&events).await.unwrap();
    let got = t.rows().await;
    let want: Vec<_> = want.iter().map(|(id, v)| row(*id, v)).collect();
    assert_eq!(got, want);
    let mut bad = events.clone();
    bad[4_321] = json!({"op": "c", "source": {"table": "t"}});
    assert!(t.epoch(&bad).await.is_err());
    let msg = t.wal.health().last_error.unwrap_or_default();
    assert!(msg.contains("checkpoint 2, index 4321"), "{msg}");
    assert_eq!(t.rows().await, want, "part of the failed epoch stayed");
    t.drop_schema().await;
}

/// The conformance suite: each sink id gets a schema of its own with table `ev`, records are
/// Debezium creates of id `i` at position `i + 1`, and the replica read back in key order.
struct Conf;

fn conf_schema(sink_id: &str) -> String {
    format!("cdc_{}", sink_id.replace('-', "_"))
}

impl Harness for Conf {
    type Sink = CdcSink;

    async fn sink(&self, sink_id: &str) -> CdcSink {
        let schema = conf_schema(sink_id);
        admin()
            .await
            .batch_execute(&format!(
                "CREATE SCHEMA IF NOT EXISTS {schema}; CREATE TABLE IF NOT EXISTS {schema}.ev (id bigint PRIMARY KEY)"
            ))
            .await
            .unwrap();
        CdcSink::connect(Config::from_url(&format!("{SHARED}?schema={schema}")).unwrap())
            .await
            .unwrap()
    }

    async fn read_back(&self, sink_id: &str, _subtask: u32) -> Vec<Vec<u8>> {
        let rows = admin()
            .await
            .query(
                &format!("SELECT id FROM {}.ev ORDER BY id", conf_schema(sink_id)),
                &[],
            )
            .await
            .unwrap();
        rows.iter()
            .map(|r| self.record(r.get::<_, i64>(0) as u64))
            .collect()
    }

    fn record(&self, i: u64) -> Vec<u8> {
        json!({"op": "c", "after": {"id": i}, "source": {"table": "ev", "lsn": i + 1}})
            .to_string()
            .into_bytes()
    }

    fn empty_records(&self) -> bool {
        false
    }
}

#[tokio::test(flavor = "multi_thread")]
#[cfg_attr(
    not(servers),
    ignore = "needs WALSINK_TEST_SERVERS=1 and a local PostgreSQL"
)]
async fn the_cdc_sink_conforms() {
    // Rows are keyed by the source's primary key, not by the writer, so the suite's
    // `subtasks_stay_apart` (which reads back per subtask) does not apply: two subtasks of a
    // CDC sink apply disjoint key ranges into one table.
    conformance::in_order_through_the_async_committer(&Conf).await;
    conformance::in_order_through_the_committer_thread(&Conf).await;
    conformance::a_replay_after_a_crash_is_not_applied_twice(&Conf).await;
    conformance::large_and_empty_epochs(&Conf).await;
    // The suite's sink ids carry this process's id: drop their schemas.
    let a = admin().await;
    let pat = format!("cdc_conf_%_{}_%", std::process::id());
    for r in a
        .query(
            "SELECT nspname::text FROM pg_namespace WHERE nspname LIKE $1",
            &[&pat],
        )
        .await
        .unwrap()
    {
        let _ = a
            .batch_execute(&format!("DROP SCHEMA {} CASCADE", r.get::<_, String>(0)))
            .await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(servers),
    ignore = "needs WALSINK_TEST_SERVERS=1 and a local PostgreSQL"
)]
async fn large_epochs_in_several_flushes_with_rewinds_end_at_the_source_state() {
    // Epochs of thousands of changes over thousands of keys: each is sent in several flushes
    // while the rest is parsed, some runs in order (unguarded), some reaching back (guarded).
    flushes_with_rewinds("flushes", 7, 16_000, 6000, 2000..9000).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(servers),
    ignore = "needs WALSINK_TEST_SERVERS=1 and a local PostgreSQL"
)]
async fn epochs_larger_than_the_window_send_the_oldest_keys_and_end_at_the_source_state() {
    // Epochs of 10,000 to 40,000 changes over 3,000 busy keys: the planner holds a window of
    // a quarter of the epoch and sends the keys left alone longest, 2,048 at a time, while
    // later events of the held keys fold into them; with rewinds and a truncate among them.
    for seed in [11, 12] {
        flushes_with_rewinds(&format!("window{seed}"), seed, 60_000, 3000, 10_000..40_000).await;
    }
}

/// A random history of `n` changes over `keys` keys (creates and updates, deletes, key changes,
/// one truncate), sent with random rewinds in epochs of `epoch` events; the replica must end
/// at the history's final state.
async fn flushes_with_rewinds(
    tag: &str,
    seed: u64,
    n: usize,
    keys: i32,
    epoch: std::ops::Range<usize>,
) {
    let mut t = Target::new(tag, "").await;
    let mut rng = fastrand::Rng::with_seed(seed);
    let mut live: std::collections::BTreeMap<i32, String> = Default::default();
    let mut history: Vec<Value> = Vec::new();
    let mut lsn = 1000u64;
    for i in 0..n {
        lsn += 1;
        let id = rng.i32(0..keys);
        let v = format!("v{lsn}");
        let e = if i == n * 9 / 16 {
            live.clear();
            ev("t", lsn, None, None)
        } else if live.contains_key(&id) && rng.u8(0..10) == 0 {
            live.remove(&id);
            ev("d", lsn, Some((id, "")), None)
        } else if live.contains_key(&id) && rng.u8(0..10) == 0 {
            let to = keys + rng.i32(0..keys);
            if live.contains_key(&to) {
                continue;
            }
            live.remove(&id);
            live.insert(to, v.clone());
            ev("u", lsn, Some((id, "")), Some((to, &v)))
        } else {
            live.insert(id, v.clone());
            ev(
                if rng.bool() { "c" } else { "u" },
                lsn,
                None,
                Some((id, &v)),
            )
        };
        history.push(e);
    }
    let mut stream: Vec<Value> = Vec::new();
    let mut i = 0;
    while i < history.len() {
        let n = rng.usize(1000..4000).min(history.len() - i);
        stream.extend_from_slice(&history[i..i + n]);
        i += n;
        if rng.u8(0..3) == 0 {
            let from = rng.usize(0..i);
            let to = (from + rng.usize(1..3000)).min(i);
            stream.extend_from_slice(&history[from..to]);
        }
    }
    let mut epochs = 0;
    let mut j = 0;
    while j < stream.len() {
        let n = rng.usize(epoch.clone()).min(stream.len() - j);
        t.epoch(&stream[j..j + n]).await.unwrap();
        epochs += 1;
        j += n;
    }
    let want: Vec<_> = live
        .iter()
        .map(|(id, v)| (*id, Some(v.clone()), Some(id * 10)))
        .collect();
    assert_eq!(t.rows().await, want);
    let s = t.sink.stats();
    assert!(s.unguarded > 0 && s.unguarded < s.sent, "{s:?}");
    assert!(
        s.sent > 2 * epochs + 2,
        "epochs were not sent in several flushes: {s:?}"
    );
    t.drop_schema().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(servers),
    ignore = "needs WALSINK_TEST_SERVERS=1 and a local PostgreSQL"
)]
async fn a_flush_in_flight_that_fails_is_the_error_reported_not_its_echo() {
    // The first flush of the epoch carries a value the column refuses; while it is in flight
    // the sink parses on and meets a table it has not loaded, whose catalog query can only
    // fail with "current transaction is aborted". The error must be the refusal (permanent),
    // and nothing of the epoch may be visible.
    let mut t = Target::new("echo", "").await;
    t.admin
        .batch_execute(&format!(
            "CREATE TABLE {}.u (id int PRIMARY KEY, v text, n int)",
            t.schema
        ))
        .await
        .unwrap();
    let mut events: Vec<Value> = (0..3000)
        .map(|i| ev("c", 10 + i as u64, None, Some((i, "x"))))
        .collect();
    events[5]["after"]["n"] = json!("not a number");
    let mut other = ev("c", 5000, None, Some((1, "u")));
    other["source"]["table"] = json!("u");
    events.push(other);
    let e = t.epoch(&events).await;
    assert!(e.is_err());
    let msg = t.wal.health().last_error.unwrap_or_default();
    assert!(
        msg.contains("not a number") || msg.contains("invalid input syntax"),
        "{msg}"
    );
    assert!(!msg.contains("aborted"), "{msg}");
    assert_eq!(t.rows().await, vec![]);
    t.drop_schema().await;
}

#[tokio::test]
#[cfg_attr(
    not(servers),
    ignore = "needs WALSINK_TEST_SERVERS=1 and a local PostgreSQL"
)]
async fn an_integer_key_spelled_two_ways_in_one_flush_applies_as_the_newest() {
    // Plain integer literals skip keeping one row per key on the server; every other
    // spelling of an integer (a string, `-0`, an exponent) must still reach its row once.
    let mut t = Target::new("spell", "").await;
    let up = |lsn: u64, id: Value, v: &str| {
        json!({"before": null, "after": {"id": id, "v": v, "n": 0},
               "source": {"table": "t", "lsn": lsn}, "op": "c"})
    };
    t.epoch(&[
        up(10, json!(7), "a"),
        up(11, json!("7"), "b"),
        up(12, json!(0), "c"),
        up(13, serde_json::from_str("-0").unwrap(), "d"),
        up(14, serde_json::from_str("1E1").unwrap(), "e"),
        up(15, json!(10), "f"),
        up(16, json!(20), "g"),
    ])
    .await
    .unwrap();
    let want = |rows: &[(i32, &str)]| -> Vec<(i32, Option<String>, Option<i32>)> {
        rows.iter()
            .map(|(id, v)| (*id, Some(v.to_string()), Some(0)))
            .collect()
    };
    assert_eq!(
        t.rows().await,
        want(&[(0, "d"), (7, "b"), (10, "f"), (20, "g")])
    );
    // The same again, older: nothing changes; newer, in plain literals: all change.
    t.epoch(&[up(5, json!(7), "old"), up(6, json!("20"), "old")])
        .await
        .unwrap();
    // `c` of keys that are there: the plain insert fails, and the epoch is applied again
    // with upserts.
    t.epoch(&[up(30, json!(7), "h"), up(31, json!(20), "i")])
        .await
        .unwrap();
    assert_eq!(t.sink.stats().refused_tables, 1);
    assert_eq!(
        t.rows().await,
        want(&[(0, "d"), (7, "h"), (10, "f"), (20, "i")])
    );
    t.drop_schema().await;
}

#[tokio::test]
#[cfg_attr(
    not(servers),
    ignore = "needs WALSINK_TEST_SERVERS=1 and a local PostgreSQL"
)]
async fn a_snapshot_read_at_position_0_is_applied() {
    // The lowest rank there is (a read at position 0) is above "no watermark".
    let mut t = Target::new("read0", "").await;
    t.admin
        .batch_execute(&format!(
            "INSERT INTO {}.t VALUES (3, 'by hand', 30)",
            t.schema
        ))
        .await
        .unwrap();
    t.epoch(&[
        ev("r", 0, None, Some((1, "zero"))),
        ev("r", 5, None, Some((2, "five"))),
        ev("r", 0, None, Some((3, "over the hand-written row"))),
    ])
    .await
    .unwrap();
    t.epoch(&[ev("r", 0, None, Some((4, "later epoch")))])
        .await
        .unwrap();
    assert_eq!(
        t.rows().await,
        vec![
            row(1, "zero"),
            row(2, "five"),
            row(3, "over the hand-written row"),
            row(4, "later epoch")
        ]
    );
    // Bookkeeping of an earlier version (a watermark that may not be NULL) is brought up to
    // date by the next sink to connect.
    t.admin
        .batch_execute(&format!(
            "UPDATE {s}.walsink_cdc_tables SET truncated_at = -9223372036854775808 WHERE truncated_at IS NULL; \
             ALTER TABLE {s}.walsink_cdc_tables ALTER COLUMN truncated_at SET NOT NULL; \
             DELETE FROM {s}.walsink_cdc_tables",
            s = t.schema
        ))
        .await
        .unwrap();
    t.sink = CdcSink::connect(Config::from_url(&format!("{SHARED}?schema={}", t.schema)).unwrap())
        .await
        .unwrap();
    t.epoch(&[ev("r", 0, None, Some((5, "after the upgrade")))])
        .await
        .unwrap();
    assert_eq!(t.rows().await.len(), 5);
    t.drop_schema().await;
}

#[tokio::test]
#[cfg_attr(
    not(servers),
    ignore = "needs WALSINK_TEST_SERVERS=1 and a local PostgreSQL"
)]
async fn two_spellings_of_one_key_across_steps_apply_in_rank_order() {
    // In order, so the runs would go unguarded, were it not for the second spelling: the
    // delete or the partial image of one key spelled another way must still win.
    let mut t = Target::new("spell2", "").await;
    t.admin
        .batch_execute(&format!(
            "CREATE TABLE {}.u (id uuid PRIMARY KEY, v text, n int)",
            t.schema
        ))
        .await
        .unwrap();
    let e = |table: &str, op: &str, lsn: u64, before: Value, after: Value| {
        json!({"before": before, "after": after, "op": op,
               "source": {"table": table, "lsn": lsn}})
    };
    let n = Value::Null;
    t.epoch(&[
        e("t", "c", 10, n.clone(), json!({"id": 7, "v": "a", "n": 10})),
        e("t", "d", 11, json!({"id": "07"}), n.clone()),
        e(
            "t",
            "c",
            12,
            n.clone(),
            json!({"id": 8, "v": "full", "n": 10}),
        ),
        e("t", "u", 13, n.clone(), json!({"id": "08", "n": 13})),
        e(
            "t",
            "c",
            14,
            n.clone(),
            json!({"id": "09", "v": "full", "n": 10}),
        ),
        e("t", "u", 15, n.clone(), json!({"id": 9, "n": 15})),
    ])
    .await
    .unwrap();
    assert_eq!(
        t.rows().await,
        vec![
            (8, Some("full".to_string()), Some(13)),
            (9, Some("full".to_string()), Some(15))
        ]
    );
    let lower = "0a1b2c3d-4e5f-6789-abcd-ef0123456789";
    t.epoch(&[
        e(
            "u",
            "c",
            20,
            n.clone(),
            json!({"id": lower.to_uppercase(), "v": "x", "n": 1}),
        ),
        e("u", "d", 21, json!({"id": lower}), n.clone()),
    ])
    .await
    .unwrap();
    let left: i64 = t
        .admin
        .query_one(&format!("SELECT count(*) FROM {}.u", t.schema), &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(
        left, 0,
        "a uuid deleted in lower case came back from its capitals"
    );
    t.drop_schema().await;
}

/// A delivery cut while the server runs its COMMIT (a deferred trigger on the marker table
/// holds the COMMIT for 1.5 s; the delivery is dropped at 0.5 s): the epoch commits without
/// its caller hearing so, and the next delivery finds the marker and applies nothing twice;
/// the epoch after it, with a replayed older event, is applied as usual.
#[tokio::test]
#[cfg_attr(
    not(servers),
    ignore = "needs WALSINK_TEST_SERVERS=1 and a local PostgreSQL"
)]
async fn a_delivery_cut_during_its_commit_is_found_committed_by_the_next() {
    let mut t = Target::new("incommit", "").await;
    t.epoch(&[
        ev("c", 10, None, Some((1, "a"))),
        ev("c", 11, None, Some((2, "b"))),
    ])
    .await
    .unwrap();
    let s = t.schema.clone();
    t.admin
        .batch_execute(&format!(
            "CREATE FUNCTION {s}.slow() RETURNS trigger LANGUAGE plpgsql AS \
             $$ BEGIN PERFORM pg_sleep(1.5); RETURN NULL; END $$; \
             CREATE CONSTRAINT TRIGGER slow AFTER INSERT OR UPDATE ON {s}.walsink_markers \
             DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION {s}.slow();"
        ))
        .await
        .unwrap();
    t.seal(&[
        ev("u", 20, Some((1, "a")), Some((1, "a2"))),
        ev("d", 21, Some((2, "b")), None),
        ev("c", 22, None, Some((3, "c"))),
    ]);
    let cut = tokio::time::timeout(
        std::time::Duration::from_millis(500),
        walsink_tokio::deliver_ready(&t.wal, &mut t.sink),
    )
    .await;
    assert!(cut.is_err(), "the delivery was not cut: {cut:?}");
    tokio::time::sleep(std::time::Duration::from_millis(2000)).await;
    // The server committed the epoch although its caller never heard.
    assert_eq!(
        walsink_cdc::check::applied(&t.admin, &s, &s).await.unwrap(),
        (2, 5)
    );
    assert_eq!(t.rows().await, vec![row(1, "a2"), row(3, "c")]);
    t.admin
        .batch_execute(&format!("DROP TRIGGER slow ON {s}.walsink_markers"))
        .await
        .unwrap();
    // The retry finds the marker: nothing applied twice, and the log moves on.
    walsink_tokio::deliver_ready(&t.wal, &mut t.sink)
        .await
        .unwrap();
    assert_eq!(
        walsink_cdc::check::applied(&t.admin, &s, &s).await.unwrap(),
        (2, 5)
    );
    assert_eq!(t.rows().await, vec![row(1, "a2"), row(3, "c")]);
    // The next epoch: a replay of the older create of key 2 changes nothing (its tombstone
    // is newer), an update of key 3 and a new key apply.
    t.epoch(&[
        ev("c", 11, None, Some((2, "b"))),
        ev("u", 30, Some((3, "c")), Some((3, "c2"))),
        ev("c", 31, None, Some((4, "d"))),
    ])
    .await
    .unwrap();
    assert_eq!(
        t.rows().await,
        vec![row(1, "a2"), row(3, "c2"), row(4, "d")]
    );
    assert_eq!(
        walsink_cdc::check::applied(&t.admin, &s, &s).await.unwrap(),
        (3, 8)
    );
    t.drop_schema().await;
}

#[tokio::test]
#[cfg_attr(
    not(servers),
    ignore = "needs WALSINK_TEST_SERVERS=1 and a local PostgreSQL"
)]
async fn a_claimed_shard_taken_over_by_another_log_fences_the_old_one() {
    let mut t = Target::new("owners", "").await;
    let id = t.schema.clone();
    let old = walsink::Owner::new("a".repeat(32));
    assert_eq!(t.sink.claim(&id, 0, &old).await.unwrap().generation, 1);
    t.epoch(&[ev("c", 1, None, Some((1, "a")))]).await.unwrap();
    let cfg = Config::from_url(&format!("{SHARED}?schema={}", t.schema)).unwrap();
    let mut other = CdcSink::connect(cfg).await.unwrap();
    let new = walsink::Owner::new("b".repeat(32));
    let e = other.claim(&id, 0, &new).await.unwrap_err();
    assert_eq!(e.class(), walsink::SinkErrorClass::Fenced, "{e}");
    assert_eq!(
        other
            .claim(&id, 0, &new.take_over(true))
            .await
            .unwrap()
            .generation,
        2
    );
    let e = t
        .epoch(&[ev("c", 2, None, Some((2, "b")))])
        .await
        .unwrap_err()
        .to_string();
    assert!(e.contains("fenced") || e.contains("owner"), "{e}");
    assert_eq!(t.rows().await, vec![row(1, "a")]);
    let markers = t
        .admin
        .query_one(
            &format!("SELECT count(*) FROM {}.walsink_markers", t.schema),
            &[],
        )
        .await
        .unwrap()
        .get::<_, i64>(0);
    assert_eq!(markers, 1);
    t.drop_schema().await;
}

#[tokio::test]
#[cfg_attr(
    not(servers),
    ignore = "needs WALSINK_TEST_SERVERS=1 and a local PostgreSQL"
)]
async fn events_for_walsinks_own_tables_are_refused() {
    for table in [
        "walsink_markers",
        "walsink_owners",
        "walsink_cdc_tables",
        "walsink_cdc_tombstones",
    ] {
        let mut t = Target::new("own", "").await;
        let ev = json!({"before": null, "after": {"sink_id": "x", "subtask": 0, "checkpoint": 9},
                        "op": "c", "source": {"table": table, "lsn": 1}});
        let e = t.epoch(&[ev]).await.unwrap_err().to_string();
        assert!(
            e.contains("bookkeeping") && e.contains(table),
            "{table}: {e}"
        );
        t.drop_schema().await;
    }
}
