//! The apply into MySQL/MariaDB (`walsink_cdc::mysql`) against the shared MariaDB
//! (127.0.0.1:3306, root): every op, an epoch applied twice lands once, the position guard
//! (replays change nothing, a tombstone keeps a deleted row out, a truncate's watermark),
//! random events with rewinds against a one-by-one model, typed values exact, generated
//! columns computed by the replica, names that need quoting, a missing table or column named,
//! `add_missing_columns`, a value too long rolled back whole, and an epoch larger than one
//! statement. Each test works in a database of its own.

use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::sync::Arc;
use walsink::{MemoryCommitStore, Options, WalSink};
use walsink_cdc::{MySqlCdcConfig, MySqlCdcSink};
use walsink_mysql::mysql_async::prelude::Queryable;
use walsink_mysql::mysql_async::{self, Conn};

const SHARED: &str = "mysql://root@127.0.0.1:3306/test";

struct Target {
    db: String,
    admin: Conn,
    _dir: tempfile::TempDir,
    wal: Arc<WalSink>,
    next_cp: u64,
    sink: MySqlCdcSink,
}

async fn admin() -> Conn {
    Conn::new(mysql_async::Opts::from_url(SHARED).unwrap())
        .await
        .expect("the shared MariaDB at 127.0.0.1:3306 answers")
}

impl Target {
    /// A database of its own holding the tables of `ddl` (`;`-separated).
    async fn new(tag: &str, ddl: &str, params: &str) -> Target {
        let db = crate::common::unique("cdcmy", tag);
        let mut admin = admin().await;
        admin
            .query_drop(format!("CREATE DATABASE {db}"))
            .await
            .unwrap();
        for stmt in ddl.split(';').filter(|s| !s.trim().is_empty()) {
            admin
                .query_drop(format!("USE {db}; {stmt}"))
                .await
                .unwrap_or_else(|e| panic!("{stmt}: {e}"));
        }
        let url = format!("mysql://root@127.0.0.1:3306/{db}?ssl_mode=disabled{params}");
        let sink = MySqlCdcSink::connect(MySqlCdcConfig::from_url(&url).unwrap())
            .await
            .expect("connect");
        let dir = tempfile::tempdir().unwrap();
        let (wal, _) = WalSink::open_with(
            Arc::new(walsink::storage::FsStorage::new(dir.path()).unwrap()),
            Options::new("cdc"),
            Box::new(MemoryCommitStore::new()),
        )
        .unwrap();
        Target {
            db,
            admin,
            _dir: dir,
            wal: Arc::new(wal),
            next_cp: 1,
            sink,
        }
    }

    fn seal(&mut self, events: &[Value]) -> u64 {
        let recs: Vec<Vec<u8>> = events.iter().map(|e| e.to_string().into_bytes()).collect();
        self.wal
            .append_batch(recs.iter().map(|r| r.as_slice()))
            .unwrap();
        let cp = self.next_cp;
        self.next_cp += 1;
        self.wal.checkpoint(cp, b"meta").unwrap();
        self.wal.checkpoint_complete(cp).unwrap();
        cp
    }

    async fn epoch(&mut self, events: &[Value]) -> Result<(), walsink::Error> {
        self.seal(events);
        walsink_tokio::deliver_ready(&self.wal, &mut self.sink)
            .await
            .map(|_| ())
    }

    async fn rows(&mut self, sql: &str) -> Vec<Vec<Option<String>>> {
        self.admin
            .query_drop(format!("USE {}", self.db))
            .await
            .unwrap();
        let rows: Vec<mysql_async::Row> = self
            .admin
            .query(sql)
            .await
            .unwrap_or_else(|e| panic!("{sql}: {e}"));
        rows.into_iter()
            .map(|r| {
                (0..r.len())
                    .map(|i| r.get::<Option<String>, _>(i).unwrap())
                    .collect()
            })
            .collect()
    }

    async fn t(&mut self) -> Vec<(i64, String)> {
        self.rows("SELECT id, v FROM t ORDER BY id")
            .await
            .into_iter()
            .map(|r| {
                (
                    r[0].as_deref().unwrap().parse().unwrap(),
                    r[1].clone().unwrap_or_default(),
                )
            })
            .collect()
    }

    async fn drop_db(mut self) {
        let _ = self
            .admin
            .query_drop(format!("DROP DATABASE {}", self.db))
            .await;
    }
}

fn ev(op: &str, lsn: u64, key: i64, v: &str) -> Value {
    let img = json!({"id": key, "v": v});
    let (before, after) = match op {
        "d" => (img, Value::Null),
        _ => (Value::Null, img),
    };
    json!({"before": before, "after": after, "op": op, "ts_ms": 0,
           "source": {"table": "t", "lsn": lsn}})
}

fn truncate(lsn: u64) -> Value {
    json!({"before": null, "after": null, "op": "t", "ts_ms": 0, "source": {"table": "t", "lsn": lsn}})
}

const T: &str = "CREATE TABLE t (id BIGINT PRIMARY KEY, v VARCHAR(40))";

fn pairs(v: &[(i64, &str)]) -> Vec<(i64, String)> {
    v.iter().map(|(k, s)| (*k, s.to_string())).collect()
}

#[tokio::test]
#[cfg_attr(
    not(servers),
    ignore = "needs WALSINK_TEST_SERVERS=1 and a local MariaDB"
)]
async fn every_op_lands_and_an_epoch_applied_twice_lands_once() {
    let mut t = Target::new("ops", T, "").await;
    let first = [
        ev("r", 5, 1, "a"),
        ev("c", 10, 2, "b"),
        Value::Null, // a tombstone record
        ev("c", 11, 3, "c"),
        ev("u", 12, 2, "b2"),
        ev("d", 13, 3, "c"),
    ];
    t.epoch(&first).await.unwrap();
    assert_eq!(t.t().await, pairs(&[(1, "a"), (2, "b2")]));
    // The same epoch again (its marker is there): nothing changes, no second marker.
    let key = walsink::EpochKey {
        sink_id: "cdc".into(),
        subtask: 0,
        checkpoint: 1,
    };
    assert!(walsink_tokio::AsyncSink::is_committed(&mut t.sink, &key)
        .await
        .unwrap());
    // The upstream sends it all again as a new epoch (a rewound consumer): the guard.
    t.epoch(&first).await.unwrap();
    assert_eq!(t.t().await, pairs(&[(1, "a"), (2, "b2")]));
    let markers = t.rows("SELECT COUNT(*) FROM walsink_markers").await;
    assert_eq!(markers[0][0].as_deref(), Some("2"));
    let tomb = t.rows("SELECT id, _walsink_pos FROM walsink_tomb_t").await;
    assert_eq!(tomb, vec![vec![Some("3".into()), Some("13".into())]]);
    let s = t.sink.stats();
    assert_eq!((s.epochs, s.events), (2, 10));
    t.drop_db().await;
}

#[tokio::test]
#[cfg_attr(
    not(servers),
    ignore = "needs WALSINK_TEST_SERVERS=1 and a local MariaDB"
)]
async fn a_tombstone_keeps_a_deleted_row_out_and_a_newer_insert_brings_it_back() {
    let mut t = Target::new("tomb", T, "").await;
    t.epoch(&[ev("c", 10, 1, "a"), ev("c", 11, 2, "b")])
        .await
        .unwrap();
    t.epoch(&[ev("d", 20, 1, "a")]).await.unwrap();
    // A replayed older insert and update of the deleted key: they change nothing.
    t.epoch(&[ev("c", 10, 1, "a"), ev("u", 15, 1, "old")])
        .await
        .unwrap();
    assert_eq!(t.t().await, pairs(&[(2, "b")]));
    assert!(t.sink.stats().tombstone_checks > 0);
    // An older delete of a newer row changes nothing either.
    t.epoch(&[ev("d", 9, 2, "b")]).await.unwrap();
    assert_eq!(t.t().await, pairs(&[(2, "b")]));
    t.epoch(&[ev("c", 30, 1, "again")]).await.unwrap();
    assert_eq!(t.t().await, pairs(&[(1, "again"), (2, "b")]));
    t.drop_db().await;
}

#[tokio::test]
#[cfg_attr(
    not(servers),
    ignore = "needs WALSINK_TEST_SERVERS=1 and a local MariaDB"
)]
async fn a_truncate_removes_older_rows_and_refuses_older_events() {
    let mut t = Target::new("trunc", T, "").await;
    t.epoch(&[
        ev("c", 10, 1, "a"),
        ev("c", 11, 2, "b"),
        ev("d", 12, 2, "b"),
    ])
    .await
    .unwrap();
    t.epoch(&[truncate(20), ev("c", 21, 3, "c")]).await.unwrap();
    assert_eq!(t.t().await, pairs(&[(3, "c")]));
    assert!(t.rows("SELECT * FROM walsink_tomb_t").await.is_empty());
    // The range before the truncate, replayed: nothing of it applies.
    t.epoch(&[ev("c", 10, 1, "a"), ev("c", 11, 2, "b"), truncate(20)])
        .await
        .unwrap();
    assert_eq!(t.t().await, pairs(&[(3, "c")]));
    let marks = t
        .rows("SELECT truncated_at, high FROM walsink_cdc_tables WHERE tbl = 't'")
        .await;
    assert_eq!(marks, vec![vec![Some("20".into()), Some("21".into())]]);
    t.drop_db().await;
}

/// Applies `events` one by one under the guard: the replica every epoch must equal.
#[derive(Default)]
struct Model {
    rows: BTreeMap<i64, (i64, String)>,
    tombs: BTreeMap<i64, i64>,
    watermark: Option<i64>,
}

impl Model {
    fn rows(&self) -> Vec<(i64, String)> {
        self.rows
            .iter()
            .map(|(k, (_, v))| (*k, v.clone()))
            .collect()
    }

    fn apply(&mut self, op: &str, rank: i64, key: i64, v: &str) {
        if self.watermark.is_some_and(|w| rank <= w) {
            return;
        }
        match op {
            "t" => {
                self.rows.retain(|_, (r, _)| *r > rank);
                self.tombs.retain(|_, r| *r > rank);
                self.watermark = Some(rank);
            }
            "d" => {
                if self.rows.get(&key).is_none_or(|(r, _)| *r < rank) {
                    self.rows.remove(&key);
                }
                let t = self.tombs.entry(key).or_insert(rank);
                *t = (*t).max(rank);
            }
            _ => {
                let newer_row = self.rows.get(&key).is_some_and(|(r, _)| *r >= rank);
                let newer_tomb = self.tombs.get(&key).is_some_and(|r| *r >= rank);
                if !newer_row && !newer_tomb {
                    self.rows.insert(key, (rank, v.to_string()));
                }
            }
        }
    }
}

#[tokio::test]
#[cfg_attr(
    not(servers),
    ignore = "needs WALSINK_TEST_SERVERS=1 and a local MariaDB"
)]
async fn random_events_with_rewinds_end_as_one_by_one_application() {
    for seed in 1..=12u64 {
        let mut rng = fastrand::Rng::with_seed(seed);
        let mut t = Target::new(&format!("rand{seed}"), T, "&max_held=40").await;
        let mut model = Model::default();
        let mut history: Vec<(String, u64, i64, String)> = Vec::new();
        let mut lsn = 100u64;
        for _ in 0..12 {
            let mut epoch = Vec::new();
            let n = rng.usize(1..160);
            for _ in 0..n {
                let replay = !history.is_empty() && rng.u8(..10) < 3;
                let (op, pos, key, v) = if replay {
                    // A rewound upstream: an old event again, as it was.
                    history[rng.usize(..history.len())].clone()
                } else {
                    lsn += rng.u64(1..4);
                    let op = match rng.u8(..100) {
                        0..=1 => "t",
                        2..=30 => "d",
                        31..=60 => "u",
                        _ => "c",
                    };
                    let e = (op.to_string(), lsn, rng.i64(0..25), format!("v{lsn}"));
                    history.push(e.clone());
                    e
                };
                model.apply(&op, pos as i64, key, &v);
                epoch.push(if op == "t" {
                    truncate(pos)
                } else {
                    ev(&op, pos, key, &v)
                });
            }
            t.epoch(&epoch)
                .await
                .unwrap_or_else(|e| panic!("seed {seed}: {e}"));
            assert_eq!(t.t().await, model.rows(), "seed {seed}");
        }
        // At last the upstream rewinds: a stretch of the history again, as it was. Nothing of
        // it is newer than what the replica holds, so nothing may change.
        let rewind: Vec<Value> = history
            .iter()
            .filter(|_| rng.bool())
            .map(|(op, pos, key, v)| {
                model.apply(op, *pos as i64, *key, v);
                if op == "t" {
                    truncate(*pos)
                } else {
                    ev(op, *pos, *key, v)
                }
            })
            .collect();
        t.epoch(&rewind)
            .await
            .unwrap_or_else(|e| panic!("seed {seed}: {e}"));
        assert_eq!(t.t().await, model.rows(), "seed {seed}");
        t.drop_db().await;
    }
}

#[tokio::test]
#[cfg_attr(
    not(servers),
    ignore = "needs WALSINK_TEST_SERVERS=1 and a local MariaDB"
)]
async fn typed_values_arrive_exact() {
    let mut t = Target::new(
        "types",
        "CREATE TABLE t (id BIGINT UNSIGNED PRIMARY KEY, d DECIMAL(30,10), f DOUBLE, b BOOLEAN, \
         s VARCHAR(100) CHARACTER SET utf8mb4, j JSON, ts DATETIME(6), n INT NULL, txt LONGTEXT)",
        "",
    )
    .await;
    let odd = "quote ' backslash \\ nl \n tab \t nul-free 😀 ü";
    let json_text = r#"{"b":1,  "a":2, "a":3}"#;
    let after = json!({"id": 18446744073709551615u64, "d": serde_json::from_str::<Value>("12345678901234567890.1230000000").unwrap(),
        "f": 1.5e300, "b": true, "s": odd, "j": json_text, "ts": "2024-02-29 23:59:59.123456", "n": null,
        "txt": "x".repeat(100_000)});
    t.epoch(&[
        json!({"before": null, "after": after, "op": "c", "source": {"table": "t", "lsn": 5}}),
    ])
    .await
    .unwrap();
    let got = t
        .rows("SELECT CAST(id AS CHAR), CAST(d AS CHAR), f, b, s, j, CAST(ts AS CHAR), n, LENGTH(txt) FROM t")
        .await;
    assert_eq!(
        got,
        vec![vec![
            Some("18446744073709551615".into()),
            Some("12345678901234567890.1230000000".into()),
            Some("1.5e300".into()),
            Some("1".into()),
            Some(odd.into()),
            Some(json_text.into()),
            Some("2024-02-29 23:59:59.123456".into()),
            None,
            Some("100000".into()),
        ]]
    );
    t.drop_db().await;
}

#[tokio::test]
#[cfg_attr(
    not(servers),
    ignore = "needs WALSINK_TEST_SERVERS=1 and a local MariaDB"
)]
async fn generated_columns_are_computed_by_the_replica_and_quoted_names_work() {
    let mut t = Target::new(
        "gen",
        "CREATE TABLE `Odd Name` (`Key` INT PRIMARY KEY, `a b` INT, `c``d` INT, \
         total INT AS (`a b` + `c``d`) STORED, half INT AS (`a b` DIV 2) VIRTUAL)",
        "",
    )
    .await;
    let src = |lsn: u64, k: i64, a: i64, c: i64, total: i64| {
        json!({"before": null, "after": {"key": k, "a b": a, "c`d": c, "total": total, "half": 0},
               "op": "u", "source": {"table": "Odd Name", "lsn": lsn}})
    };
    t.epoch(&[src(1, 1, 10, 1, 999), src(2, 2, 4, 4, 0)])
        .await
        .unwrap();
    t.epoch(&[src(3, 1, 20, 2, -1)]).await.unwrap();
    let got = t
        .rows("SELECT `Key`, `a b`, `c``d`, total, half FROM `Odd Name` ORDER BY `Key`")
        .await;
    let s = |v: &[i64]| v.iter().map(|x| Some(x.to_string())).collect::<Vec<_>>();
    assert_eq!(got, vec![s(&[1, 20, 2, 22, 10]), s(&[2, 4, 4, 8, 2])]);
    t.drop_db().await;
}

#[tokio::test]
#[cfg_attr(
    not(servers),
    ignore = "needs WALSINK_TEST_SERVERS=1 and a local MariaDB"
)]
async fn a_missing_table_or_column_is_permanent_and_named_and_nothing_commits() {
    let mut t = Target::new("missing", T, "").await;
    let e = t
        .epoch(&[ev("c", 1, 1, "a"), json!({"before": null, "after": {"id": 2}, "op": "c", "source": {"table": "nope", "lsn": 2}})])
        .await
        .unwrap_err()
        .to_string();
    assert!(e.contains("`nope`") && e.contains("index 1"), "{e}");
    assert!(t.t().await.is_empty(), "the epoch rolled back whole");
    assert!(t.rows("SELECT * FROM walsink_markers").await.is_empty());
    t.drop_db().await;

    let mut t = Target::new("missingcol", T, "").await;
    let e = t
        .epoch(&[json!({"before": null, "after": {"id": 1, "v": "a", "extra": 5}, "op": "c", "source": {"table": "t", "lsn": 2}})])
        .await
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("`extra`") && e.contains("add_missing_columns"),
        "{e}"
    );
    t.drop_db().await;
}

#[tokio::test]
#[cfg_attr(
    not(servers),
    ignore = "needs WALSINK_TEST_SERVERS=1 and a local MariaDB"
)]
async fn add_missing_columns_adds_them_typed_from_the_value() {
    let mut t = Target::new("addcol", T, "&add_missing_columns=true").await;
    t.epoch(&[
        ev("c", 1, 1, "a"),
        json!({"before": null, "after": {"id": 2, "v": "b", "qty": 7, "price": 1.25, "tags": ["x"]},
               "op": "c", "source": {"table": "t", "lsn": 2}}),
    ])
    .await
    .unwrap();
    let cols = t
        .rows(
            "SELECT COLUMN_NAME, DATA_TYPE FROM information_schema.COLUMNS \
             WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = 't' AND COLUMN_NAME IN ('qty','price','tags') \
             ORDER BY COLUMN_NAME",
        )
        .await;
    let types: Vec<String> = cols.iter().map(|r| r[1].clone().unwrap()).collect();
    assert_eq!(types[0], "double", "{cols:?}");
    assert_eq!(types[1], "bigint", "{cols:?}");
    assert!(
        ["json", "longtext"].contains(&types[2].as_str()),
        "{cols:?}"
    );
    let got = t.rows("SELECT id, qty FROM t ORDER BY id").await;
    assert_eq!(
        got,
        vec![
            vec![Some("1".into()), None],
            vec![Some("2".into()), Some("7".into())]
        ]
    );
    t.drop_db().await;
}

#[tokio::test]
#[cfg_attr(
    not(servers),
    ignore = "needs WALSINK_TEST_SERVERS=1 and a local MariaDB"
)]
async fn a_value_too_long_is_permanent_and_the_epoch_rolls_back_whole() {
    let mut t = Target::new("toolong", T, "").await;
    let e = t
        .epoch(&[ev("c", 1, 1, "fits"), ev("c", 2, 2, &"x".repeat(41))])
        .await
        .unwrap_err()
        .to_string();
    assert!(e.contains("1406") || e.contains("too long"), "{e}");
    assert!(t.t().await.is_empty());
    assert!(t.rows("SELECT * FROM walsink_markers").await.is_empty());
    t.drop_db().await;
}

#[tokio::test]
#[cfg_attr(
    not(servers),
    ignore = "needs WALSINK_TEST_SERVERS=1 and a local MariaDB"
)]
async fn an_epoch_larger_than_a_statement_lands_once() {
    let mut t = Target::new("large", T, "").await;
    let mut events = Vec::new();
    for i in 0..30_000i64 {
        events.push(ev("c", 10 + i as u64, i, &format!("{i:040}")[..40]));
    }
    for i in 0..5_000i64 {
        events.push(ev("d", 100_000 + i as u64, i * 3, ""));
    }
    t.epoch(&events).await.unwrap();
    let n = t.rows("SELECT COUNT(*), SUM(id) FROM t").await;
    let want: i64 = (0..30_000i64)
        .filter(|i| !(i % 3 == 0 && i / 3 < 5_000))
        .sum();
    assert_eq!(n[0][0].as_deref(), Some("25000"));
    assert_eq!(n[0][1].as_deref(), Some(want.to_string().as_str()));
    t.drop_db().await;
}

#[tokio::test]
#[cfg_attr(
    not(servers),
    ignore = "needs WALSINK_TEST_SERVERS=1 and a local MariaDB"
)]
async fn a_claimed_shard_taken_over_by_another_log_fences_the_old_one() {
    let mut t = Target::new("owners", T, "").await;
    let old = walsink::Owner::new("a".repeat(32));
    let claim = t.sink.claim("cdc", 0, &old).await.unwrap();
    assert_eq!(claim.generation, 1);
    t.epoch(&[ev("c", 1, 1, "a")]).await.unwrap();
    // A second log under the same sink id is refused, then takes the shard over.
    let url = format!("mysql://root@127.0.0.1:3306/{}?ssl_mode=disabled", t.db);
    let mut other = MySqlCdcSink::connect(MySqlCdcConfig::from_url(&url).unwrap())
        .await
        .unwrap();
    let new = walsink::Owner::new("b".repeat(32));
    let e = other.claim("cdc", 0, &new).await.unwrap_err();
    assert_eq!(e.class(), walsink::SinkErrorClass::Fenced, "{e}");
    let taken = other.claim("cdc", 0, &new.take_over(true)).await.unwrap();
    assert_eq!(taken.generation, 2);
    // The old log's next epoch writes nothing and says why.
    let e = t
        .epoch(&[ev("c", 2, 2, "b")])
        .await
        .unwrap_err()
        .to_string();
    assert!(e.contains("fenced") || e.contains("owner"), "{e}");
    assert_eq!(t.t().await, pairs(&[(1, "a")]));
    let markers = t.rows("SELECT checkpoint FROM walsink_markers").await;
    assert_eq!(markers, vec![vec![Some("1".into())]]);
    t.drop_db().await;
}

fn kv(op: &str, lsn: u64, table: &str, before: Value, after: Value) -> Value {
    json!({"before": before, "after": after, "op": op, "source": {"table": table, "lsn": lsn}})
}

#[tokio::test]
#[cfg_attr(
    not(servers),
    ignore = "needs WALSINK_TEST_SERVERS=1 and a local MariaDB"
)]
async fn an_update_whose_images_spell_one_key_two_ways_updates_it() {
    let mut t = Target::new(
        "spell",
        "CREATE TABLE s (k VARCHAR(10) COLLATE utf8mb4_general_ci PRIMARY KEY, v TEXT); \
         CREATE TABLE n (k BIGINT PRIMARY KEY, v TEXT)",
        "",
    )
    .await;
    for per_epoch in [false, true] {
        let events = [
            kv("c", 10, "s", Value::Null, json!({"k": "x", "v": "first"})),
            kv(
                "u",
                20,
                "s",
                json!({"k": "x"}),
                json!({"k": "X", "v": "second"}),
            ),
            kv("c", 10, "n", Value::Null, json!({"k": 7, "v": "first"})),
            kv(
                "u",
                20,
                "n",
                json!({"k": 7}),
                json!({"k": "07", "v": "second"}),
            ),
        ];
        if per_epoch {
            for e in &events {
                t.epoch(std::slice::from_ref(e)).await.unwrap();
            }
        } else {
            t.epoch(&events).await.unwrap();
        }
        let s = t.rows("SELECT k, v FROM s").await;
        assert_eq!(
            s,
            vec![vec![Some("X".into()), Some("second".into())]],
            "{per_epoch}"
        );
        let n = t.rows("SELECT k, v FROM n").await;
        assert_eq!(
            n,
            vec![vec![Some("7".into()), Some("second".into())]],
            "{per_epoch}"
        );
        t.rows("DELETE FROM s").await;
        t.rows("DELETE FROM n").await;
        t.rows("DELETE FROM walsink_tomb_s").await;
        t.rows("DELETE FROM walsink_tomb_n").await;
        t.rows("DELETE FROM walsink_cdc_tables").await;
    }
    t.drop_db().await;
}

#[tokio::test]
#[cfg_attr(
    not(servers),
    ignore = "needs WALSINK_TEST_SERVERS=1 and a local MariaDB"
)]
async fn two_spellings_of_one_key_with_other_columns_apply_in_log_order() {
    let mut t = Target::new(
        "spell2",
        "CREATE TABLE t (k VARCHAR(10) COLLATE utf8mb4_general_ci PRIMARY KEY, v TEXT, a TEXT)",
        "",
    )
    .await;
    // A partial image of the key in another spelling lands on top of the full one.
    t.epoch(&[
        kv(
            "c",
            20,
            "t",
            Value::Null,
            json!({"k": "y", "v": "full", "a": "x"}),
        ),
        kv("u", 30, "t", json!({"k": "Y"}), json!({"k": "Y"})),
    ])
    .await
    .unwrap();
    let got = t.rows("SELECT k, v, a, _walsink_pos FROM t").await;
    let s = |v: &str| Some(v.to_string());
    assert_eq!(got, vec![vec![s("Y"), s("full"), s("x"), s("30")]]);
    // A replayed older full image after a newer partial one changes nothing.
    t.epoch(&[
        kv(
            "u",
            40,
            "t",
            json!({"k": "Z"}),
            json!({"k": "Z", "v": "new"}),
        ),
        kv(
            "c",
            35,
            "t",
            Value::Null,
            json!({"k": "z", "v": "old", "a": "LEAK"}),
        ),
    ])
    .await
    .unwrap();
    let got = t.rows("SELECT k, v, a FROM t WHERE k = 'z'").await;
    assert_eq!(got, vec![vec![s("Z"), s("new"), None]]);
    t.drop_db().await;
}

#[tokio::test]
#[cfg_attr(
    not(servers),
    ignore = "needs WALSINK_TEST_SERVERS=1 and a local MariaDB"
)]
async fn events_for_walsinks_own_tables_and_dates_as_numbers_are_refused() {
    let mut t = Target::new(
        "reserved",
        "CREATE TABLE d (id INT PRIMARY KEY, at DATETIME(6))",
        "",
    )
    .await;
    for table in [
        "walsink_markers",
        "walsink_owners",
        "walsink_cdc_tables",
        "walsink_tomb_d",
    ] {
        let e = t
            .epoch(&[kv(
                "c",
                1,
                table,
                Value::Null,
                json!({"sink_id": "cdc", "checkpoint": 3}),
            )])
            .await
            .unwrap_err()
            .to_string();
        assert!(e.contains("bookkeeping"), "{table}: {e}");
        // The refused epoch stays: a new sink on a fresh log for the next case.
        let next = Target::new(
            &format!("reserved{}", table.len()),
            "CREATE TABLE d (id INT PRIMARY KEY, at DATETIME(6))",
            "",
        )
        .await;
        std::mem::replace(&mut t, next).drop_db().await;
    }
    let e = t
        .epoch(&[kv(
            "c",
            1,
            "d",
            Value::Null,
            json!({"id": 1, "at": 1700000000123u64}),
        )])
        .await
        .unwrap_err()
        .to_string();
    assert!(e.contains("`at`") && e.contains("date"), "{e}");
    assert!(t.rows("SELECT * FROM d").await.is_empty());
    t.drop_db().await;
}

#[tokio::test]
#[cfg_attr(
    not(servers),
    ignore = "needs WALSINK_TEST_SERVERS=1 and a local MariaDB"
)]
async fn a_row_larger_than_max_allowed_packet_is_permanent_and_named() {
    let mut t = Target::new(
        "packet",
        "CREATE TABLE t (id BIGINT PRIMARY KEY, v LONGTEXT)",
        "",
    )
    .await;
    let packet: Option<u64> = t
        .admin
        .query_first("SELECT @@max_allowed_packet")
        .await
        .unwrap();
    // Quotes double when escaped: the literal is twice the value.
    let v = "'".repeat(packet.unwrap() as usize / 2 + 1024);
    let e = t
        .epoch(&[kv("c", 1, "t", Value::Null, json!({"id": 1, "v": v}))])
        .await
        .unwrap_err();
    let walsink::ErrorKind::Sink(s) = e.kind() else {
        panic!("{e}")
    };
    assert_eq!(s.class(), walsink::SinkErrorClass::Permanent, "{e}");
    assert!(e.to_string().contains("max_allowed_packet"), "{e}");
    t.drop_db().await;
}

#[tokio::test]
#[cfg_attr(
    not(servers),
    ignore = "needs WALSINK_TEST_SERVERS=1 and a local MariaDB"
)]
async fn a_partial_update_that_respells_its_key_is_refused_not_nulled() {
    let mut t = Target::new(
        "respell",
        "CREATE TABLE p (k VARCHAR(20) COLLATE utf8mb4_general_ci PRIMARY KEY, v INT, w TEXT)",
        "",
    )
    .await;
    t.epoch(&[kv(
        "c",
        7,
        "p",
        Value::Null,
        json!({"k": "abc", "v": 4, "w": "x"}),
    )])
    .await
    .unwrap();
    let e = t
        .epoch(&[kv(
            "u",
            16,
            "p",
            json!({"k": "abc"}),
            json!({"k": "ABC", "w": "y"}),
        )])
        .await
        .unwrap_err()
        .to_string();
    assert!(e.contains("`p`") && e.contains("lacks some columns"), "{e}");
    let s = |v: &str| Some(v.to_string());
    assert_eq!(
        t.rows("SELECT k, v, w FROM p").await,
        vec![vec![s("abc"), s("4"), s("x")]]
    );
    t.drop_db().await;
}
