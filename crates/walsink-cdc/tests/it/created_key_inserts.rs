//! Keys created in a run go in as plain INSERTs (docs/targets/cdc.md): a key already in the
//! table turns the table back to upserts, never losing or doubling a row.
//!
//! 1. "Created keys are inserted": in an unguarded run, upserts of keys whose first event in
//!    the run is `c` or `r` go as a plain INSERT; should such a key be in the table, the
//!    epoch's transaction rolls back and the same epoch is applied again at once with upserts
//!    for that table (no error), and that table gets upserts for the sink's life.
//!    `Stats::inserts` / `Stats::refused_tables` count these.
//! 2. "Parsing ahead": records parsed in batches of 1 024 on the blocking pool, at most two
//!    batches ahead, consumed in log order; a bad event stops the epoch at its own position,
//!    nothing of the epoch committed.
//!
//! Each server test works in a schema `p8_…` of its own, compares the replica with a
//! one-by-one model of the documented guard, and drops its schema.

#![allow(clippy::type_complexity)]

use serde_json::{json, Map, Value};
use std::collections::BTreeMap;
use std::time::Duration;
use walsink_cdc::{CdcSink, Config, Stats};

use crate::common::{admin, Feed, SHARED};

fn unique(tag: &str) -> String {
    crate::common::unique("p8", tag)
}

// ---------------------------------------------------------------------------------------
// Logs.

// ---------------------------------------------------------------------------------------
// Events. A key is a JSON object of the key columns.

fn ev(tbl: &str, op: &str, pos: u64, before: Value, after: Value) -> String {
    json!({"before": before, "after": after, "op": op, "ts_ms": 0,
           "source": {"db": "src", "schema": "public", "table": tbl, "lsn": pos}})
    .to_string()
}

fn with(key: &Value, v: &str, n: i64) -> Value {
    let mut m = key.as_object().unwrap().clone();
    m.insert("v".into(), json!(v));
    m.insert("n".into(), json!(n));
    Value::Object(m)
}

fn id(i: i64) -> Value {
    json!({ "id": i })
}

fn c(tbl: &str, pos: u64, k: &Value, v: &str, n: i64) -> String {
    ev(tbl, "c", pos, Value::Null, with(k, v, n))
}
fn r(tbl: &str, pos: u64, k: &Value, v: &str, n: i64) -> String {
    ev(tbl, "r", pos, Value::Null, with(k, v, n))
}
fn u(tbl: &str, pos: u64, k: &Value, v: &str, n: i64) -> String {
    ev(tbl, "u", pos, k.clone(), with(k, v, n))
}
fn kc(tbl: &str, pos: u64, from: &Value, to: &Value, v: &str, n: i64) -> String {
    ev(tbl, "u", pos, from.clone(), with(to, v, n))
}
fn d(tbl: &str, pos: u64, k: &Value) -> String {
    ev(tbl, "d", pos, k.clone(), Value::Null)
}
fn t(tbl: &str, pos: u64) -> String {
    ev(tbl, "t", pos, Value::Null, Value::Null)
}

fn text_of(v: &Value) -> Option<String> {
    match v {
        Value::Null => None,
        Value::String(s) => Some(s.clone()),
        other => Some(other.to_string()),
    }
}

// ---------------------------------------------------------------------------------------
// The one-by-one model of the documented guard.

type Content = BTreeMap<String, (Option<String>, Option<String>)>;

#[derive(Default, Clone, Debug)]
struct MTable {
    rows: BTreeMap<String, (Option<String>, Option<String>, i128)>,
    tombs: BTreeMap<String, i128>,
    wm: Option<i128>,
}

#[derive(Clone, Debug)]
struct Spec {
    name: String,
    keys: Vec<String>,
    lower: bool,
}

#[derive(Default, Clone, Debug)]
struct Model {
    specs: BTreeMap<String, Spec>,
    tables: BTreeMap<String, MTable>,
}

fn rank_of(op: &str, pos: u64) -> i128 {
    if op == "r" {
        pos as i128 - (1i128 << 64)
    } else {
        pos as i128
    }
}

impl Model {
    fn canon(&self, tbl: &str, img: &Map<String, Value>) -> String {
        let s = &self.specs[tbl];
        let k = s
            .keys
            .iter()
            .map(|c| text_of(&img[c]).unwrap())
            .collect::<Vec<_>>()
            .join("|");
        if s.lower {
            k.to_lowercase()
        } else {
            k
        }
    }

    /// A row written by hand (no rank): below every event.
    fn manual(&mut self, tbl: &str, key: &str, v: &str, n: i64) {
        self.tables
            .entry(tbl.into())
            .or_default()
            .rows
            .insert(key.into(), (Some(v.into()), Some(n.to_string()), i128::MIN));
    }

    fn apply(&mut self, raw: &str) {
        let v: Value = match serde_json::from_str(raw) {
            Ok(v) => v,
            Err(_) => return,
        };
        let v = if v.get("payload").is_some() {
            v["payload"].clone()
        } else {
            v
        };
        if v.is_null() {
            return;
        }
        let tbl = v["source"]["table"].as_str().unwrap().to_string();
        let op = v["op"].as_str().unwrap().to_string();
        let rank = rank_of(&op, v["source"]["lsn"].as_u64().unwrap());
        let bk = v["before"].as_object().map(|b| self.canon(&tbl, b));
        let ak = v["after"].as_object().map(|a| self.canon(&tbl, a));
        let tb = self.tables.entry(tbl).or_default();
        let above_wm = tb.wm.is_none_or(|w| rank > w);
        let delete = |tb: &mut MTable, k: String| {
            if !above_wm {
                return;
            }
            if tb.rows.get(&k).is_some_and(|r| r.2 < rank) {
                tb.rows.remove(&k);
            }
            let e = tb.tombs.entry(k).or_insert(rank);
            *e = (*e).max(rank);
        };
        match op.as_str() {
            "t" => {
                if above_wm {
                    tb.rows.retain(|_, r| r.2 >= rank);
                    tb.tombs.retain(|_, p| *p >= rank);
                    tb.wm = Some(rank);
                }
            }
            "d" => delete(tb, bk.unwrap()),
            _ => {
                let k = ak.unwrap();
                if let Some(b) = bk {
                    if b != k {
                        delete(tb, b);
                    }
                }
                if !above_wm
                    || tb.rows.get(&k).is_some_and(|r| r.2 >= rank)
                    || tb.tombs.get(&k).is_some_and(|p| *p >= rank)
                {
                    return;
                }
                let a = &v["after"];
                tb.rows
                    .insert(k, (text_of(&a["v"]), text_of(&a["n"]), rank));
            }
        }
    }

    fn content(&self, tbl: &str) -> Content {
        self.tables
            .get(tbl)
            .map(|tb| {
                tb.rows
                    .iter()
                    .map(|(k, (v, n, _))| (k.clone(), (v.clone(), n.clone())))
                    .collect()
            })
            .unwrap_or_default()
    }
}

fn diff(want: &Content, got: &Content) -> String {
    let mut out = Vec::new();
    for (k, w) in want {
        match got.get(k) {
            None => out.push(format!("missing {k}={w:?}")),
            Some(g) if g != w => out.push(format!("{k}: want {w:?} got {g:?}")),
            _ => {}
        }
    }
    for (k, g) in got {
        if !want.contains_key(k) {
            out.push(format!("extra {k}={g:?}"));
        }
    }
    let n = out.len();
    out.truncate(8);
    format!("{n} differences: {}", out.join("; "))
}

/// A schema of its own; tables are created by `ddl` (use `{s}` for the schema) and each has
/// columns `v text`, `n int` besides its key columns.
struct Lab {
    schema: String,
    admin: tokio_postgres::Client,
    specs: Vec<Spec>,
}

impl Lab {
    async fn new(tag: &str, tables: &[(&str, &str)]) -> Lab {
        Self::custom(tag, "", tables).await
    }

    /// `tables`: (name, "int" | "text" | "uuid" | "comp"), created as
    /// `(id TYPE PRIMARY KEY, v text, n int)` (comp: `(a int, b text, PRIMARY KEY (a, b))`).
    async fn custom(tag: &str, extra_ddl: &str, tables: &[(&str, &str)]) -> Lab {
        let schema = unique(tag);
        let admin = admin().await;
        let mut ddl = format!("CREATE SCHEMA {schema};");
        let mut specs = Vec::new();
        for (tbl, kind) in tables {
            let (cols, keys, lower) = match *kind {
                "comp" => (
                    "a int, b text, v text, n int, PRIMARY KEY (a, b)".to_string(),
                    vec!["a".to_string(), "b".to_string()],
                    false,
                ),
                "custom" => (String::new(), vec!["id".to_string()], false),
                ty => (
                    format!("id {ty} PRIMARY KEY, v text, n int"),
                    vec!["id".to_string()],
                    ty == "uuid",
                ),
            };
            if !cols.is_empty() {
                ddl += &format!("CREATE TABLE {schema}.{tbl} ({cols});");
            }
            specs.push(Spec {
                name: tbl.to_string(),
                keys,
                lower,
            });
        }
        ddl += &extra_ddl.replace("{s}", &schema);
        admin.batch_execute(&ddl).await.unwrap();
        Lab {
            schema,
            admin,
            specs,
        }
    }

    fn model(&self) -> Model {
        Model {
            specs: self
                .specs
                .iter()
                .map(|s| (s.name.clone(), s.clone()))
                .collect(),
            tables: Default::default(),
        }
    }

    async fn sink(&self, params: &str) -> CdcSink {
        CdcSink::connect(
            Config::from_url(&format!("{SHARED}?schema={}{params}", self.schema)).unwrap(),
        )
        .await
        .expect("connect")
    }

    async fn exec(&self, sql: &str) {
        self.admin
            .batch_execute(&sql.replace("{s}", &self.schema))
            .await
            .unwrap();
    }

    async fn content(&self, spec: &Spec) -> Content {
        let k = spec
            .keys
            .iter()
            .map(|c| format!("{c}::text"))
            .collect::<Vec<_>>()
            .join(", ");
        self.admin
            .query(
                &format!(
                    "SELECT concat_ws('|', {k}), v::text, n::text FROM {}.{}",
                    self.schema, spec.name
                ),
                &[],
            )
            .await
            .unwrap()
            .iter()
            .map(|r| (r.get(0), (r.get(1), r.get(2))))
            .collect()
    }

    async fn check(&self, model: &Model, label: &str) -> Vec<String> {
        let mut out = Vec::new();
        for s in &self.specs {
            let got = self.content(s).await;
            let want = model.content(&s.name);
            if got != want {
                out.push(format!("{label}: table {}: {}", s.name, diff(&want, &got)));
            }
        }
        out
    }

    /// Every row of every table of the schema, as text (to show that nothing changed).
    async fn state(&self) -> String {
        let tables: Vec<String> = self
            .admin
            .query(
                "SELECT c.relname::text FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace \
                 WHERE n.nspname = $1 AND c.relkind IN ('r', 'p') ORDER BY 1",
                &[&self.schema],
            )
            .await
            .unwrap()
            .iter()
            .map(|r| r.get(0))
            .collect();
        let mut out = String::new();
        for t in tables {
            let s: String = self
                .admin
                .query_one(
                    &format!(
                        // The guard's column is not data: the sink adds it to a table in a
                        // transaction of its own before the table's first epoch.
                        "SELECT coalesce(string_agg(r::text, ',' ORDER BY r::text), '') \
                         FROM (SELECT to_jsonb(x) - '_walsink_pos' AS r FROM {}.{} x) y",
                        self.schema, t
                    ),
                    &[],
                )
                .await
                .unwrap()
                .get(0);
            out += &format!("{t}: {s}\n");
        }
        out
    }

    async fn drop(self) {
        let _ = self
            .admin
            .batch_execute(&format!("DROP SCHEMA {} CASCADE", self.schema))
            .await;
    }
}

fn delta(a: &Stats, b: &Stats) -> (u64, u64, u64, u64, u64) {
    (
        b.epochs - a.epochs,
        b.sent - a.sent,
        b.unguarded - a.unguarded,
        b.inserts - a.inserts,
        b.refused_tables - a.refused_tables,
    )
}

// ---------------------------------------------------------------------------------------
// 1. Created keys that are there after all.

/// Rows inserted by hand, then `c` events for them mixed with fresh keys in two tables (only
/// one of which conflicts). The epoch must succeed without an error, the replica must equal
/// the model (hand rows rank below every event), the conflicting table is refused once and
/// gets upserts afterwards, the other keeps plain inserts; replays after the refusal change
/// nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(servers),
    ignore = "needs WALSINK_TEST_SERVERS=1 and a local PostgreSQL"
)]
async fn hand_rows_then_created_keys_in_two_tables() {
    let lab = Lab::new("hand", &[("ta", "int"), ("tb", "int")]).await;
    lab.exec("INSERT INTO {s}.ta VALUES (3, 'hand', 33), (1000, 'hand2', 1)")
        .await;
    let mut model = lab.model();
    model.manual("ta", "3", "hand", 33);
    model.manual("ta", "1000", "hand2", 1);
    let mut sink = lab.sink("").await;
    let mut feed = Feed::new("hand", 64 << 10);
    let mut problems = Vec::new();

    let mut e1 = Vec::new();
    for i in 1..=6 {
        e1.push(c("ta", 10 + i as u64, &id(i), &format!("a{i}"), i));
        e1.push(c("tb", 20 + i as u64, &id(i), &format!("b{i}"), i));
    }
    e1.push(u("ta", 40, &id(2), "a2u", 22));
    e1.push(d("tb", 41, &id(5)));
    let s0 = sink.stats();
    feed.seal(&e1);
    let res = feed.deliver(&mut sink).await;
    if let Err(e) = &res {
        problems.push(format!("epoch 1 failed: {e}"));
    }
    for e in &e1 {
        model.apply(e);
    }
    problems.extend(lab.check(&model, "epoch 1").await);
    let s1 = sink.stats();
    eprintln!(
        "epoch 1: {:?}, health {:?}",
        delta(&s0, &s1),
        feed.wal.health().last_error
    );
    if s1.refused_tables != 1 {
        problems.push(format!(
            "refused_tables after epoch 1: {} (want 1)",
            s1.refused_tables
        ));
    }
    if s1.epochs != 1 {
        problems.push(format!("epochs after epoch 1: {} (want 1)", s1.epochs));
    }

    // Epoch 2: fresh keys in both tables: ta is refused (upserts), tb still inserts.
    let e2: Vec<String> = (7..=9)
        .flat_map(|i| {
            [
                c("ta", 100 + i as u64, &id(i), "x", i),
                c("tb", 200 + i as u64, &id(i), "y", i),
            ]
        })
        .collect();
    feed.seal(&e2);
    if let Err(e) = feed.deliver(&mut sink).await {
        problems.push(format!("epoch 2 failed: {e}"));
    }
    for e in &e2 {
        model.apply(e);
    }
    problems.extend(lab.check(&model, "epoch 2").await);
    let s2 = sink.stats();
    let dd = delta(&s1, &s2);
    eprintln!("epoch 2: {dd:?}");
    if dd.3 != 1 {
        problems.push(format!(
            "epoch 2: inserts went up by {} (want 1: tb's insert only, ta is refused)",
            dd.3
        ));
    }
    if dd.4 != 0 {
        problems.push(format!("epoch 2: refused_tables went up by {}", dd.4));
    }

    // Epoch 3: a replay of epoch 1 and 2 (old positions) changes nothing.
    let before = lab.state().await;
    let mut e3 = e1.clone();
    e3.extend(e2.iter().cloned());
    feed.seal(&e3);
    if let Err(e) = feed.deliver(&mut sink).await {
        problems.push(format!("epoch 3 (replay) failed: {e}"));
    }
    let after = lab.state().await;
    // Only the markers may change.
    let strip = |s: &str| {
        s.lines()
            .filter(|l| !l.starts_with("walsink_markers"))
            .collect::<Vec<_>>()
            .join("\n")
    };
    if strip(&before) != strip(&after) {
        problems.push(format!("replay changed something:\n{before}\n---\n{after}"));
    }
    // A new sink: ta may go back to inserts (the refusal is per sink life); a `c` of a hand
    // row in ta again must still end right.
    lab.exec("INSERT INTO {s}.ta VALUES (50, 'hand50', 5)")
        .await;
    model.manual("ta", "50", "hand50", 5);
    let mut sink2 = lab.sink("").await;
    let e4 = vec![
        c("ta", 500, &id(50), "c50", 50),
        c("ta", 501, &id(51), "c51", 51),
    ];
    feed.seal(&e4);
    if let Err(e) = feed.deliver(&mut sink2).await {
        problems.push(format!("epoch 4 (new sink) failed: {e}"));
    }
    for e in &e4 {
        model.apply(e);
    }
    problems.extend(lab.check(&model, "epoch 4").await);
    eprintln!("sink2: {:?}", sink2.stats());
    let (epochs, records) = walsink_cdc::check::applied(&lab.admin, &lab.schema, &feed.id)
        .await
        .unwrap();
    let want = (e1.len() + e2.len() + e3.len() + e4.len()) as u64;
    if (epochs, records) != (4, want) {
        problems.push(format!(
            "markers: {epochs} epochs, {records} records; want 4, {want}"
        ));
    }
    lab.drop().await;
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

/// A snapshot read again with new positions (a second snapshot after a slot was recreated),
/// and a `c` re-sent for a key applied in an earlier epoch, and a `c` for a key that was
/// deleted earlier (its tombstone must not matter: the create is newer).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(servers),
    ignore = "needs WALSINK_TEST_SERVERS=1 and a local PostgreSQL"
)]
#[allow(clippy::vec_init_then_push)] // one epoch after another, each with its comment
async fn snapshot_reread_and_recreated_keys() {
    let lab = Lab::new("reread", &[("ta", "int"), ("tb", "int")]).await;
    let mut model = lab.model();
    let mut sink = lab.sink("").await;
    let mut feed = Feed::new("reread", 8 << 10);
    let mut problems = Vec::new();
    let mut epochs: Vec<Vec<String>> = Vec::new();
    // Snapshot 1 of both tables (position 100), then streamed changes.
    epochs.push(
        (1..=3000)
            .flat_map(|i| [r("ta", 100, &id(i), "s1", i), r("tb", 100, &id(i), "s1", i)])
            .collect(),
    );
    // Snapshot of ta read again at once with a new position (200), before any streamed
    // change: ranks above the first read, so it goes unguarded and meets every key.
    epochs.push((1..=3000).map(|i| r("ta", 200, &id(i), "s1b", i)).collect());
    epochs.push(
        (1..=50)
            .map(|i| u("ta", 1000 + i as u64, &id(i), "u", i))
            .chain((51..=60).map(|i| d("ta", 1100 + i as u64, &id(i))))
            .chain((3001..=3010).map(|i| c("tb", 1200 + i as u64, &id(i), "c", i)))
            .collect(),
    );
    // Snapshot 2 of ta only (new consistent point 5000): every key is there already.
    epochs.push(
        (1..=3000)
            .filter(|i| !(51..=60).contains(i))
            .map(|i| r("ta", 5000, &id(i), "s2", i))
            .collect(),
    );
    // Then streamed changes: `c` of deleted keys 51..60 (tombstones below), `c` re-sent for
    // key 3001 of tb (already there).
    epochs.push(
        (51..=60)
            .map(|i| c("ta", 6000 + i as u64, &id(i), "re", i))
            .chain([
                c("tb", 6100, &id(3001), "again", 1),
                c("tb", 6101, &id(4000), "new", 4),
            ])
            .collect(),
    );
    for (n, e) in epochs.iter().enumerate() {
        let s0 = sink.stats();
        feed.seal(e);
        if let Err(err) = feed.deliver(&mut sink).await {
            problems.push(format!("epoch {n} failed: {err}"));
        }
        for x in e {
            model.apply(x);
        }
        problems.extend(lab.check(&model, &format!("epoch {n}")).await);
        eprintln!("epoch {n}: {:?}", delta(&s0, &sink.stats()));
    }
    let st = sink.stats();
    if st.refused_tables != 2 {
        problems.push(format!(
            "refused_tables {} (want 2: ta at the re-read, tb at the re-sent c)",
            st.refused_tables
        ));
    }
    if st.epochs != epochs.len() as u64 {
        problems.push(format!("epochs {} want {}", st.epochs, epochs.len()));
    }
    lab.drop().await;
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

/// A source-like in-order stream (each `c` only for a key the source does not hold at that
/// moment; updates, deletes, key changes, re-creates, truncates): the fast path must never be
/// refused (the replica holds exactly what the source held), the replica must equal the
/// model, and plain inserts must be used.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(servers),
    ignore = "needs WALSINK_TEST_SERVERS=1 and a local PostgreSQL"
)]
async fn an_in_order_source_stream_is_never_refused() {
    let mut problems = Vec::new();
    for (round, (params, chunk, epoch_len)) in [
        ("", 64 << 10, 3000usize),
        ("&max_held=5", 4 << 10, 700),
        ("", 4 << 10, 9000),
        ("&max_held=600", 1 << 20, 2500),
    ]
    .iter()
    .enumerate()
    {
        let lab = Lab::new(&format!("src{round}"), &[("ta", "int"), ("tb", "text")]).await;
        let mut model = lab.model();
        let mut sink = lab.sink(params).await;
        let mut feed = Feed::new(&format!("src{round}"), *chunk);
        let mut rng = fastrand::Rng::with_seed(800 + round as u64);
        // The source: which keys exist per table.
        let mut live: [Vec<i64>; 2] = [Vec::new(), Vec::new()];
        let mut next: [i64; 2] = [1, 1];
        let mut pos = 10u64;
        let key = |tb: usize, i: i64| -> Value {
            if tb == 0 {
                id(i)
            } else {
                json!({"id": format!("k{i}")})
            }
        };
        let names = ["ta", "tb"];
        for ep in 0..6 {
            let mut events = Vec::new();
            while events.len() < *epoch_len {
                pos += 1 + rng.u64(0..3);
                let tb = rng.usize(0..2);
                let name = names[tb];
                let x = rng.u32(0..100);
                if x < 45 || live[tb].len() < 5 {
                    // create: a new key, or re-create a deleted one (low numbers)
                    let i = if rng.bool() || next[tb] < 20 {
                        next[tb] += 1;
                        next[tb]
                    } else {
                        let cand = rng.i64(1..next[tb]);
                        if live[tb].contains(&cand) {
                            next[tb] += 1;
                            next[tb]
                        } else {
                            cand
                        }
                    };
                    live[tb].push(i);
                    events.push(c(name, pos, &key(tb, i), &format!("c{pos}"), pos as i64));
                } else if x < 75 {
                    let i = live[tb][rng.usize(0..live[tb].len())];
                    events.push(u(name, pos, &key(tb, i), &format!("u{pos}"), pos as i64));
                } else if x < 90 {
                    let j = rng.usize(0..live[tb].len());
                    let i = live[tb].swap_remove(j);
                    events.push(d(name, pos, &key(tb, i)));
                } else if x < 99 {
                    // key change to a fresh key
                    let j = rng.usize(0..live[tb].len());
                    let from = live[tb][j];
                    next[tb] += 1;
                    live[tb][j] = next[tb];
                    events.push(kc(
                        name,
                        pos,
                        &key(tb, from),
                        &key(tb, next[tb]),
                        "kc",
                        pos as i64,
                    ));
                } else if ep % 2 == 1 {
                    live[tb].clear();
                    events.push(t(name, pos));
                }
                if rng.u32(0..50) == 0 {
                    events.push("null".into());
                }
            }
            let s0 = sink.stats();
            feed.seal(&events);
            if let Err(e) = feed.deliver(&mut sink).await {
                problems.push(format!("round {round} epoch {ep}: {e}"));
                break;
            }
            for e in &events {
                model.apply(e);
            }
            problems.extend(
                lab.check(&model, &format!("round {round} epoch {ep}"))
                    .await,
            );
            let dd = delta(&s0, &sink.stats());
            eprintln!("round {round} epoch {ep}: {dd:?}");
        }
        let st = sink.stats();
        if st.refused_tables != 0 {
            problems.push(format!(
                "round {round}: refused_tables {} in an in-order stream",
                st.refused_tables
            ));
        }
        if st.inserts == 0 {
            problems.push(format!("round {round}: no plain inserts at all"));
        }
        lab.drop().await;
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

/// Conflicting creates in a big epoch over several tables and many read chunks; one table's
/// conflicting key is the last record of the epoch, another's the first. Every table must end
/// as one by one; tombstones (null records) in between; the events count exact.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(servers),
    ignore = "needs WALSINK_TEST_SERVERS=1 and a local PostgreSQL"
)]
async fn big_mixed_epoch_with_conflicts_at_the_ends() {
    let tables = [
        ("t1", "int"),
        ("t2", "int"),
        ("t3", "text"),
        ("t4", "uuid"),
        ("t5", "comp"),
    ];
    let lab = Lab::new("big", &tables).await;
    lab.exec(
        "INSERT INTO {s}.t2 VALUES (7000, 'hand', 1); \
         INSERT INTO {s}.t4 VALUES ('00000000-0000-0000-0000-000000000005', 'hand', 1); \
         INSERT INTO {s}.t5 VALUES (3, 'x3', 'hand', 1);",
    )
    .await;
    let mut model = lab.model();
    model.manual("t2", "7000", "hand", 1);
    model.manual("t4", "00000000-0000-0000-0000-000000000005", "hand", 1);
    model.manual("t5", "3|x3", "hand", 1);
    let mut problems = Vec::new();
    for (round, chunk) in [4usize << 10, 1 << 20].iter().enumerate() {
        let mut sink = lab.sink("").await;
        let mut feed = Feed::new(&format!("big{round}"), *chunk);
        let base = 100_000 * (round as u64 + 1);
        let mut events = Vec::new();
        // first record: t5's conflicting key (round 0 only; round 1: all fresh but t2's last).
        if round == 0 {
            events.push(c("t5", base, &json!({"a": 3, "b": "x3"}), "first", 0));
        }
        let mut tombs = 0;
        for i in 0..6000i64 {
            let p = base + 1 + i as u64;
            let k = i + 1 + 10_000 * round as i64;
            let e = match i % 5 {
                0 => c("t1", p, &id(k), "a", i),
                1 => c("t2", p, &id(k), "b", i),
                2 => c("t3", p, &json!({"id": format!("s{k}")}), "c", i),
                3 => c(
                    "t4",
                    p,
                    &json!({"id": format!("00000000-0000-0000-0001-{:012x}", k)}),
                    "d",
                    i,
                ),
                _ => c("t5", p, &json!({"a": k, "b": "z"}), "e", i),
            };
            events.push(e);
            if i % 1000 == 999 {
                events.push("null".into());
                events.push(String::new());
                tombs += 2;
            }
            if i % 7 == 0 && i > 10 {
                // an update of an earlier created key of t1
                let kk = (i / 5) * 5 + 1 + 10_000 * round as i64 - 5;
                if (kk - 1) % 5 == 0 && kk > 10_000 * round as i64 {
                    events.push(u("t1", p * 10, &id(kk), "upd", 9));
                }
            }
        }
        // Positions must grow per key: the update's p*10 exceeds every later create only of
        // other keys, which is fine (positions of different keys may interleave).
        if round == 0 {
            events.push(c(
                "t4",
                base + 99_000,
                &json!({"id": "00000000-0000-0000-0000-000000000005"}),
                "last",
                1,
            ));
        } else {
            events.push(c("t2", base + 99_000, &id(7000), "last", 1));
        }
        let s0 = sink.stats();
        feed.seal(&events);
        if let Err(e) = feed.deliver(&mut sink).await {
            problems.push(format!("round {round}: {e}"));
        }
        for e in &events {
            model.apply(e);
        }
        problems.extend(lab.check(&model, &format!("round {round}")).await);
        let s1 = sink.stats();
        let dd = delta(&s0, &s1);
        eprintln!("round {round}: {dd:?} events {}", s1.events - s0.events);
        let want_refused = if round == 0 { 2 } else { 1 };
        if dd.4 != want_refused {
            problems.push(format!(
                "round {round}: refused_tables +{} want +{want_refused}",
                dd.4
            ));
        }
        if s1.events - s0.events != (events.len() - tombs) as u64 {
            // Reported by `stats_events_of_a_refused_epoch` instead.
            eprintln!(
                "round {round}: Stats::events +{} want {} (records {} minus {tombs} tombstones)",
                s1.events - s0.events,
                events.len() - tombs,
                events.len()
            );
        }
    }
    lab.drop().await;
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

/// A unique index on a non-key column: a `c` whose value collides fails both ways (as an
/// insert and as an upsert): the result must be a clear permanent error naming the table,
/// nothing of the epoch applied (other table included), and the delivery must end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(servers),
    ignore = "needs WALSINK_TEST_SERVERS=1 and a local PostgreSQL"
)]
async fn unique_index_on_a_non_key_column() {
    let lab = Lab::custom(
        "uniq",
        "CREATE UNIQUE INDEX ON {s}.ta (v);",
        &[("ta", "int"), ("tb", "int")],
    )
    .await;
    let mut sink = lab.sink("").await;
    let mut feed = Feed::new("uniq", 64 << 10);
    let mut problems = Vec::new();
    feed.seal(&[c("ta", 10, &id(1), "same", 1), c("tb", 11, &id(1), "b", 1)]);
    feed.deliver(&mut sink).await.unwrap();
    let before = lab.state().await;
    let s0 = sink.stats();
    // A fresh key with the same v, plus tb changes.
    feed.seal(&[
        c("tb", 20, &id(2), "b2", 2),
        c("ta", 21, &id(2), "same", 2),
        c("tb", 22, &id(3), "b3", 3),
    ]);
    let t0 = std::time::Instant::now();
    let res = feed.deliver(&mut sink).await;
    let took = t0.elapsed();
    let s1 = sink.stats();
    eprintln!(
        "took {took:?}, result {res:?}, stats delta {:?}",
        delta(&s0, &s1)
    );
    match &res {
        Ok(_) => problems.push("the colliding epoch was delivered".into()),
        Err(e) => {
            if !e.contains("ta") {
                problems.push(format!("error does not name the table ta: {e}"));
            }
            if e.contains("aborted") && !e.contains("unique") {
                problems.push(format!("error is an echo, not the cause: {e}"));
            }
        }
    }
    let after = lab.state().await;
    if before != after {
        problems.push(format!("something was applied:\n{before}---\n{after}"));
    }
    if s1.refused_tables != s0.refused_tables {
        problems.push(format!(
            "refused_tables went up by {} though no created key was in the table (a non-key unique index collided)",
            s1.refused_tables - s0.refused_tables
        ));
    }
    // Is it classified permanent? (walsink's health shows the error kind)
    let h = feed.wal.health();
    eprintln!("health: {:?}", h);
    lab.drop().await;
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

// ---------------------------------------------------------------------------------------
// 2. Parsing ahead: bad events at batch boundaries.

/// What kind of bad record.
fn bad(kind: usize, pos: u64) -> String {
    match kind {
        // not JSON
        0 => "{\"op\": \"c\", broken".to_string(),
        // no key column
        1 => ev("ta", "c", pos, Value::Null, json!({"v": "nokey", "n": 1})),
        // a column the table lacks (found while planning, with the table's metadata)
        2 => ev(
            "ta",
            "c",
            pos,
            Value::Null,
            json!({"id": 999_999, "v": "x", "zzz": 1}),
        ),
        // an unknown op
        _ => ev(
            "ta",
            "q",
            pos,
            Value::Null,
            json!({"id": 999_998, "v": "x"}),
        ),
    }
}

/// One good epoch first, then epochs of `len` records with one bad record at index `at`:
/// the delivery must fail, name checkpoint 2 and index `at`, and leave the tables, the
/// bookkeeping and the markers as they were.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(servers),
    ignore = "needs WALSINK_TEST_SERVERS=1 and a local PostgreSQL"
)]
async fn a_bad_record_at_batch_boundaries_stops_the_epoch_at_its_index() {
    let lab = Lab::new("badat", &[("ta", "int"), ("tb", "int")]).await;
    let mut problems = Vec::new();
    let mut cases = 0;
    let good: Vec<String> = (1..=20)
        .map(|i| c("ta", i as u64, &id(i), "g", i))
        .collect();
    {
        let mut sink = lab.sink("").await;
        let mut f = Feed::new("badat_good", 64 << 10);
        f.seal(&good);
        f.deliver(&mut sink).await.unwrap();
    }
    let before = lab.state().await;
    let len = 3100usize;
    for at in [
        0usize,
        1,
        511,
        512,
        1023,
        1024,
        1025,
        2047,
        2048,
        2049,
        3071,
        3072,
        len - 1,
    ] {
        for kind in 0..4 {
            for chunk in [4usize << 10, 1 << 20] {
                if chunk == 4 << 10 && ![0, 1023, 1024, 2048, len - 1].contains(&at) {
                    continue;
                }
                cases += 1;
                let mut sink = lab.sink("").await;
                let mut f = Feed::new(&format!("badat{at}_{kind}_{chunk}"), chunk);
                f.seal(&[c("tb", 1, &id(1), "first", 1)]);
                f.deliver(&mut sink).await.unwrap();
                let mut recs: Vec<String> = (0..len)
                    .map(|i| {
                        let p = 1000 + i as u64;
                        if i % 3 == 0 {
                            c("ta", p, &id(10_000 + i as i64), "x", i as i64)
                        } else if i % 3 == 1 {
                            c("tb", p, &id(10_000 + i as i64), "x", i as i64)
                        } else {
                            u("ta", p, &id(1 + (i % 20) as i64), "uu", i as i64)
                        }
                    })
                    .collect();
                recs[at] = bad(kind, 1000 + at as u64);
                let st_before = lab.state().await;
                f.seal(&recs);
                let res = f.deliver(&mut sink).await;
                let label = format!("bad kind {kind} at {at}, chunk {chunk}");
                match res {
                    Ok(_) => problems.push(format!("{label}: delivered")),
                    Err(e) => {
                        let want = format!("checkpoint 2, index {at}");
                        if !e.contains(&format!("{want})"))
                            && !e.contains(&format!("{want},"))
                            && !e.contains(&format!("{want}:"))
                            && !e.contains(&format!("{want} "))
                            && !e.ends_with(&want)
                        {
                            problems.push(format!("{label}: error does not name {want}: {e}"));
                        }
                    }
                }
                let st_after = lab.state().await;
                if st_before != st_after {
                    problems.push(format!("{label}: the failed epoch left something"));
                }
                let (epochs, _) = walsink_cdc::check::applied(&lab.admin, &lab.schema, &f.id)
                    .await
                    .unwrap();
                if epochs != 1 {
                    problems.push(format!("{label}: markers hold {epochs} epochs, want 1"));
                }
                // Again (the next call retries the same epoch): same error, nothing applied.
                let res2 = f.deliver(&mut sink).await;
                if res2.is_ok() {
                    problems.push(format!("{label}: delivered on the second try"));
                }
            }
        }
    }
    // The good epoch's rows are untouched by all of it (tb got key 1 from each case's first
    // epoch, the same row each time).
    let now = lab.state().await;
    let strip = |s: &str| {
        s.lines()
            .filter(|l| l.starts_with("ta:"))
            .collect::<Vec<_>>()
            .join("\n")
    };
    if strip(&before) != strip(&now) {
        problems.push("table ta changed".into());
    }
    eprintln!("{cases} cases");
    lab.drop().await;
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

/// Two bad records in one epoch, the later one found by the parser (not JSON), the earlier
/// one only by the planning (a column the table lacks; a missing table): the error must be the
/// earlier one's, whatever the parser ahead met first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(servers),
    ignore = "needs WALSINK_TEST_SERVERS=1 and a local PostgreSQL"
)]
async fn the_first_bad_record_in_log_order_is_reported() {
    let lab = Lab::new("first", &[("ta", "int")]).await;
    let mut problems = Vec::new();
    for (early, late) in [
        (5usize, 1030usize),
        (1000, 1030),
        (1023, 1024),
        (100, 3000),
        (2047, 2048),
        (1500, 5000),
    ] {
        for early_kind in ["column", "table", "server"] {
            let mut sink = lab.sink("").await;
            let mut f = Feed::new(&format!("first{early}_{late}_{early_kind}"), 1 << 20);
            let mut recs: Vec<String> = (0..6000)
                .map(|i| {
                    c(
                        "ta",
                        10 + i as u64,
                        &id(i as i64 + 1_000_000 * early as i64),
                        "x",
                        1,
                    )
                })
                .collect();
            recs[early] = match early_kind {
                "column" => ev(
                    "ta",
                    "c",
                    10 + early as u64,
                    Value::Null,
                    json!({"id": 5, "zzz": 1}),
                ),
                "table" => ev(
                    "nope",
                    "c",
                    10 + early as u64,
                    Value::Null,
                    json!({"id": 5}),
                ),
                // a value the server refuses (n is int)
                _ => ev(
                    "ta",
                    "c",
                    10 + early as u64,
                    Value::Null,
                    json!({"id": 5, "n": "notanumber"}),
                ),
            };
            recs[late] = "not json at all".into();
            let before = lab.state().await;
            f.seal(&recs);
            let res = f.deliver(&mut sink).await;
            let label = format!("{early_kind} at {early}, not JSON at {late}");
            match res {
                Ok(_) => problems.push(format!("{label}: delivered")),
                Err(e) => {
                    let want_early = early_kind != "server";
                    let names_early = e.contains(&format!("index {early}"))
                        || (early_kind == "server"
                            && (e.contains("notanumber") || e.contains("invalid input")));
                    let names_late = e.contains(&format!("index {late}"));
                    if want_early && !names_early {
                        problems.push(format!("{label}: error is not the earlier record's: {e}"));
                    }
                    if early_kind == "server" {
                        eprintln!("{label}: reported: {e}");
                    }
                    let _ = names_late;
                }
            }
            if lab.state().await != before {
                problems.push(format!("{label}: something applied"));
            }
        }
    }
    lab.drop().await;
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

// ---------------------------------------------------------------------------------------
// 3. Cancelled deliveries around a refusal.

/// Epochs with a conflicting created key, deliveries cut by timeouts at various moments,
/// then delivered again: exact, and the markers hold each epoch once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(servers),
    ignore = "needs WALSINK_TEST_SERVERS=1 and a local PostgreSQL"
)]
async fn dropped_deliveries_around_a_refusal() {
    let mut problems = Vec::new();
    let mut dropped = 0;
    let cuts = [1u64, 3, 8, 15, 30, 60, 120, 250];
    for (round, cut) in cuts.iter().enumerate() {
        let lab = Lab::new(&format!("cut{round}"), &[("ta", "int"), ("tb", "int")]).await;
        lab.exec("INSERT INTO {s}.ta VALUES (4998, 'hand', 0)")
            .await;
        let mut model = lab.model();
        model.manual("ta", "4998", "hand", 0);
        let mut sink = lab.sink("").await;
        let mut feed = Feed::new(&format!("cut{round}"), 16 << 10);
        let mut total = 0;
        for ep in 0..2u64 {
            let base = 10 + ep * 100_000;
            let recs: Vec<String> = (0..6000i64)
                .map(|i| {
                    let k = i + ep as i64 * 6000;
                    if i % 2 == 0 {
                        c("ta", base + i as u64, &id(k), "a", i)
                    } else {
                        c("tb", base + i as u64, &id(k), "b", i)
                    }
                })
                .collect();
            total += recs.len();
            feed.seal(&recs);
            let first = tokio::time::timeout(
                Duration::from_millis(*cut),
                walsink_tokio::deliver_ready(&feed.wal, &mut sink),
            )
            .await;
            let label = format!("cut {cut} ms epoch {ep}");
            match first {
                Err(_) => {
                    dropped += 1;
                    tokio::time::sleep(Duration::from_millis(200)).await;
                    problems.extend(lab.check(&model, &format!("{label}, after the cut")).await);
                }
                Ok(Err(e)) => problems.push(format!("{label}: first delivery failed: {e}")),
                Ok(Ok(_)) => {}
            }
            let mut ok = false;
            for _ in 0..30 {
                match feed.deliver(&mut sink).await {
                    Ok(_) => {
                        ok = true;
                        break;
                    }
                    Err(e) => {
                        eprintln!("{label}: retry after {e}");
                        tokio::time::sleep(Duration::from_millis(200)).await;
                    }
                }
            }
            if !ok {
                problems.push(format!("{label}: never delivered"));
                break;
            }
            for e in &recs {
                model.apply(e);
            }
            problems.extend(lab.check(&model, &label).await);
        }
        let (epochs, records) = walsink_cdc::check::applied(&lab.admin, &lab.schema, &feed.id)
            .await
            .unwrap();
        if (epochs, records) != (2, total as u64) {
            problems.push(format!(
                "cut {cut}: markers {epochs}/{records} want 2/{total}"
            ));
        }
        eprintln!("cut {cut}: {:?}", sink.stats());
        if sink.stats().refused_tables != 1 {
            problems.push(format!(
                "cut {cut}: refused_tables {} want 1",
                sink.stats().refused_tables
            ));
        }
        lab.drop().await;
    }
    eprintln!("{dropped} deliveries cut");
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

// ---------------------------------------------------------------------------------------
// 4. Two sinks on one table.

/// Two sinks (two logs) create the same keys at different positions concurrently; each log's
/// own positions grow. The replica must end at the newest event per key, without errors
/// other than retryable ones.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(servers),
    ignore = "needs WALSINK_TEST_SERVERS=1 and a local PostgreSQL"
)]
async fn two_sinks_create_the_same_keys() {
    let mut problems = Vec::new();
    let mut errors = Vec::new();
    for round in 0..3u64 {
        let lab = Lab::new(&format!("two{round}"), &[("ta", "int")]).await;
        let mut model = lab.model();
        let mut sa = lab.sink("").await;
        let mut sb = lab.sink("").await;
        let mut fa = Feed::new(&format!("two{round}a"), 64 << 10);
        let mut fb = Feed::new(&format!("two{round}b"), 64 << 10);
        // Sink a: keys 0..3000 at positions 10+i; sink b: the same keys at 5000+i (newer),
        // in epochs of 500.
        let ea: Vec<Vec<String>> = (0..6)
            .map(|e| {
                (e * 500..(e + 1) * 500)
                    .map(|i| c("ta", 10 + i as u64, &id(i), "a", 1))
                    .collect()
            })
            .collect();
        let eb: Vec<Vec<String>> = (0..6)
            .map(|e| {
                let e = if round == 1 { 5 - e } else { e };
                (e * 500..(e + 1) * 500)
                    .map(|i| c("ta", 5000 + i as u64, &id(i), "b", 2))
                    .collect()
            })
            .collect();
        for e in ea.iter().chain(eb.iter()) {
            for x in e {
                model.apply(x);
            }
        }
        let go = |f: &mut Feed, s: &mut CdcSink, eps: Vec<Vec<String>>| {
            let f: *mut Feed = f;
            let s: *mut CdcSink = s;
            async move {
                let (f, s) = unsafe { (&mut *f, &mut *s) };
                let mut errs = Vec::new();
                for e in &eps {
                    f.seal(e);
                    let mut done = false;
                    for _ in 0..30 {
                        match f.deliver(s).await {
                            Ok(_) => {
                                done = true;
                                break;
                            }
                            Err(x) => {
                                errs.push(x);
                                tokio::time::sleep(Duration::from_millis(50)).await;
                            }
                        }
                    }
                    if !done {
                        errs.push("gave up".into());
                        break;
                    }
                }
                errs
            }
        };
        let (xa, xb) = tokio::join!(go(&mut fa, &mut sa, ea), go(&mut fb, &mut sb, eb));
        errors.extend(xa.into_iter().map(|e| format!("round {round} a: {e}")));
        errors.extend(xb.into_iter().map(|e| format!("round {round} b: {e}")));
        problems.extend(lab.check(&model, &format!("round {round}")).await);
        eprintln!("round {round}: a {:?}\n b {:?}", sa.stats(), sb.stats());
        lab.drop().await;
    }
    for e in &errors {
        eprintln!("error on the way: {e}");
    }
    let bad: Vec<&String> = errors
        .iter()
        .filter(|e| !(e.contains("deadlock") || e.contains("serializ")))
        .collect();
    assert!(problems.is_empty(), "{}", problems.join("\n"));
    assert!(bad.is_empty(), "{bad:?}");
}

/// `Stats::events` ("events read, tombstones excluded", in "what a sink applied since it was
/// made") after one epoch of 10 creates, one of which is a key already in the table: the
/// epoch is applied once (after a refusal that nobody sees as an error).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(servers),
    ignore = "needs WALSINK_TEST_SERVERS=1 and a local PostgreSQL"
)]
async fn stats_events_of_a_refused_epoch() {
    let lab = Lab::new("evcount", &[("ta", "int")]).await;
    lab.exec("INSERT INTO {s}.ta VALUES (10, 'hand', 0)").await;
    let mut sink = lab.sink("").await;
    let mut feed = Feed::new("evcount", 64 << 10);
    let recs: Vec<String> = (1..=10)
        .map(|i| c("ta", i as u64, &id(i), "x", i))
        .collect();
    feed.seal(&recs);
    feed.deliver(&mut sink).await.unwrap();
    let st = sink.stats();
    eprintln!("{st:?}");
    lab.drop().await;
    assert_eq!(st.epochs, 1);
    assert_eq!(st.refused_tables, 1);
    assert_eq!(
        st.events, 10,
        "Stats::events after one epoch of 10 events: {st:?}"
    );
}

// ---------------------------------------------------------------------------------------
// 5. Table shapes.

/// Tables of several shapes, each with a row written by hand, then one epoch creating that
/// key again (plus fresh keys), then an epoch of updates, deletes and creates. Contents as
/// one by one; the generated column, the BEFORE trigger's column and the audit trigger's rows
/// (one per row applied, nothing of a rolled-back attempt) checked too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(servers),
    ignore = "needs WALSINK_TEST_SERVERS=1 and a local PostgreSQL"
)]
async fn table_shapes_with_a_created_key_already_there() {
    let ddl = "
        CREATE TABLE {s}.gen (id int PRIMARY KEY, v text, n int, g int GENERATED ALWAYS AS (n * 2) STORED);
        CREATE TABLE {s}.dfl (id int PRIMARY KEY, v text, n int, dd text DEFAULT 'dflt', ts timestamptz DEFAULT now());
        CREATE TABLE {s}.audit (tbl text, op text, id text);
        CREATE FUNCTION {s}.up() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN NEW.tv := upper(NEW.v); RETURN NEW; END $$;
        CREATE FUNCTION {s}.aud() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN INSERT INTO {s}.audit VALUES (TG_TABLE_NAME, TG_OP, NEW.id::text); RETURN NULL; END $$;
        CREATE TABLE {s}.trg (id int PRIMARY KEY, v text, n int, tv text);
        CREATE TRIGGER b BEFORE INSERT OR UPDATE ON {s}.trg FOR EACH ROW EXECUTE FUNCTION {s}.up();
        CREATE TRIGGER a AFTER INSERT OR UPDATE ON {s}.trg FOR EACH ROW EXECUTE FUNCTION {s}.aud();
        CREATE DOMAIN {s}.pid AS int CHECK (VALUE > 0);
        CREATE TABLE {s}.dom (id {s}.pid PRIMARY KEY, v text, n int);
        CREATE TABLE {s}.part (id int, v text, n int, PRIMARY KEY (id)) PARTITION BY RANGE (id);
        CREATE TABLE {s}.part_lo PARTITION OF {s}.part FOR VALUES FROM (MINVALUE) TO (1000);
        CREATE TABLE {s}.part_hi PARTITION OF {s}.part FOR VALUES FROM (1000) TO (MAXVALUE);
        CREATE TABLE {s}.big (id bigint PRIMARY KEY, v text, n int);
        CREATE TABLE {s}.vc (id varchar(40) PRIMARY KEY, v text, n int);
        INSERT INTO {s}.gen (id, v, n) VALUES (5, 'hand', 1);
        INSERT INTO {s}.dfl (id, v, n, dd) VALUES (5, 'hand', 1, 'handdd');
        INSERT INTO {s}.trg (id, v, n) VALUES (5, 'hand', 1);
        INSERT INTO {s}.dom VALUES (5, 'hand', 1);
        INSERT INTO {s}.part VALUES (5, 'hand', 1), (1005, 'hand', 1);
        INSERT INTO {s}.big VALUES (9007199254740993, 'hand', 1);
        INSERT INTO {s}.vc VALUES ('k5', 'hand', 1);
        DELETE FROM {s}.audit;";
    let names = ["gen", "dfl", "trg", "dom", "part", "big", "vc"];
    let lab = Lab::custom(
        "shapes",
        ddl,
        &names.iter().map(|n| (*n, "custom")).collect::<Vec<_>>(),
    )
    .await;
    let mut model = lab.model();
    let hand_key = |n: &str| -> (Value, String) {
        match n {
            "big" => (
                json!({"id": 9007199254740993_i64}),
                "9007199254740993".into(),
            ),
            "vc" => (json!({"id": "k5"}), "k5".into()),
            _ => (id(5), "5".into()),
        }
    };
    let fresh = |n: &str, i: i64| -> Value {
        match n {
            "big" => json!({"id": 9007199254740993_i64 + i}),
            "vc" => json!({"id": format!("k{}", 100 + i)}),
            _ => id(100 + i),
        }
    };
    for n in names {
        model.manual(n, &hand_key(n).1, "hand", 1);
        if n == "part" {
            model.manual(n, "1005", "hand", 1);
        }
    }
    let mut sink = lab.sink("").await;
    let mut feed = Feed::new("shapes", 64 << 10);
    let mut problems = Vec::new();
    let mut pos = 10u64;
    let mut e1 = Vec::new();
    for n in names {
        for i in 0..3 {
            pos += 1;
            e1.push(c(n, pos, &fresh(n, i), &format!("f{i}"), i));
        }
        pos += 1;
        e1.push(c(n, pos, &hand_key(n).0, "created", 55));
        if n == "part" {
            pos += 1;
            e1.push(c(n, pos, &id(1005), "created", 56));
        }
    }
    let mut e2 = Vec::new();
    for n in names {
        pos += 1;
        e2.push(u(n, pos, &fresh(n, 0), "upd", 7));
        pos += 1;
        e2.push(d(n, pos, &fresh(n, 1)));
        pos += 1;
        e2.push(c(n, pos, &fresh(n, 1), "recreated", 8));
        pos += 1;
        e2.push(c(n, pos, &fresh(n, 10), "new", 9));
    }
    for (i, e) in [e1, e2].iter().enumerate() {
        let s0 = sink.stats();
        feed.seal(e);
        if let Err(err) = feed.deliver(&mut sink).await {
            problems.push(format!("epoch {i}: {err}"));
        }
        for x in e {
            model.apply(x);
        }
        problems.extend(lab.check(&model, &format!("epoch {i}")).await);
        eprintln!("epoch {i}: {:?}", delta(&s0, &sink.stats()));
    }
    if sink.stats().refused_tables != names.len() as u64 {
        problems.push(format!(
            "refused_tables {} want {}",
            sink.stats().refused_tables,
            names.len()
        ));
    }
    let q1 = |sql: &str| sql.replace("{s}", &lab.schema);
    let bad_gen: i64 = lab
        .admin
        .query_one(
            &q1("SELECT count(*) FROM {s}.gen WHERE g IS DISTINCT FROM n * 2"),
            &[],
        )
        .await
        .unwrap()
        .get(0);
    if bad_gen != 0 {
        problems.push(format!("{bad_gen} rows of gen with g != n*2"));
    }
    let bad_tv: i64 = lab
        .admin
        .query_one(
            &q1("SELECT count(*) FROM {s}.trg WHERE tv IS DISTINCT FROM upper(v)"),
            &[],
        )
        .await
        .unwrap()
        .get(0);
    if bad_tv != 0 {
        problems.push(format!("{bad_tv} rows of trg with tv != upper(v)"));
    }
    let audit: Vec<(String, String)> = lab
        .admin
        .query(&q1("SELECT op, id FROM {s}.audit ORDER BY id, op"), &[])
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    eprintln!("audit: {audit:?}");
    // One by one: epoch 1 inserts 100,101,102 and updates 5 (the hand row);
    // epoch 2 updates 100, deletes 101 and inserts it again, inserts 110.
    let mut want: Vec<(String, String)> = [
        ("INSERT", "100"),
        ("INSERT", "101"),
        ("INSERT", "102"),
        ("UPDATE", "5"),
        ("UPDATE", "100"),
        ("INSERT", "101"),
        ("INSERT", "110"),
    ]
    .iter()
    .map(|(a, b)| (a.to_string(), b.to_string()))
    .collect();
    want.sort_by(|a, b| (&a.1, &a.0).cmp(&(&b.1, &b.0)));
    if audit != want {
        problems.push(format!("audit rows {audit:?}, one by one gives {want:?}"));
    }
    let dfl: Vec<(i32, Option<String>)> = lab
        .admin
        .query(&q1("SELECT id, dd FROM {s}.dfl ORDER BY id"), &[])
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    eprintln!("dfl: {dfl:?}");
    lab.drop().await;
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

/// A text key with a nondeterministic (case-insensitive) collation: 'A' and 'a' are one key.
/// The source (same collation) creates 'A', deletes it, creates 'a'; and later creates 'B'
/// while 'b' exists in the replica by hand. Docs: such keys always go guarded.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(servers),
    ignore = "needs WALSINK_TEST_SERVERS=1 and a local PostgreSQL"
)]
async fn nondeterministic_collation_key() {
    let lab = Lab::custom(
        "ci",
        "CREATE COLLATION {s}.ci (provider = icu, locale = 'und-u-ks-level2', deterministic = false);
         CREATE TABLE {s}.ta (id text COLLATE {s}.ci PRIMARY KEY, v text, n int);
         INSERT INTO {s}.ta VALUES ('b', 'hand', 1);",
        &[("ta", "custom")],
    )
    .await;
    let mut model = lab.model();
    model.specs.get_mut("ta").unwrap().lower = true;
    model.manual("ta", "b", "hand", 1);
    let mut sink = lab.sink("").await;
    let mut feed = Feed::new("ci", 64 << 10);
    let mut problems = Vec::new();
    let e1 = vec![
        c("ta", 10, &json!({"id": "A"}), "A", 1),
        d("ta", 11, &json!({"id": "A"})),
        c("ta", 12, &json!({"id": "a"}), "a", 2),
        c("ta", 13, &json!({"id": "B"}), "B", 3),
    ];
    feed.seal(&e1);
    if let Err(e) = feed.deliver(&mut sink).await {
        problems.push(format!("epoch 1: {e}"));
    }
    for x in &e1 {
        model.apply(x);
    }
    // The model keys are lower case; the table's key is as written: compare lower-cased.
    let got: Content = lab
        .admin
        .query(
            &format!("SELECT lower(id), v, n::text FROM {}.ta", lab.schema),
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), (r.get(1), r.get(2))))
        .collect();
    let want = model.content("ta");
    if got != want {
        problems.push(format!("contents: {}", diff(&want, &got)));
    }
    eprintln!("{:?}", sink.stats());
    lab.drop().await;
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

/// A primary key DEFERRABLE INITIALLY DEFERRED: observe what the insert path and the upsert
/// path do (the docs say nothing of it; before the insert path every epoch failed at ON
/// CONFLICT). Prints; asserts only that a created key already there is never duplicated and
/// that a failed epoch left nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(servers),
    ignore = "needs WALSINK_TEST_SERVERS=1 and a local PostgreSQL"
)]
async fn deferred_primary_key_observation() {
    let lab = Lab::custom(
        "defer",
        "CREATE TABLE {s}.ta (id int PRIMARY KEY DEFERRABLE INITIALLY DEFERRED, v text, n int);
         INSERT INTO {s}.ta VALUES (5, 'hand', 1);",
        &[("ta", "custom")],
    )
    .await;
    let mut sink = lab.sink("").await;
    let mut feed = Feed::new("defer", 64 << 10);
    let mut problems = Vec::new();
    for (i, e) in [
        vec![c("ta", 10, &id(1), "a", 1), c("ta", 11, &id(2), "b", 2)],
        vec![c("ta", 20, &id(5), "created", 5)],
    ]
    .iter()
    .enumerate()
    {
        let before = lab.state().await;
        feed.seal(e);
        let res = feed.deliver(&mut sink).await;
        eprintln!("epoch {i}: {res:?}\n  stats {:?}", sink.stats());
        if res.is_err() && lab.state().await != before {
            problems.push(format!("epoch {i} failed and left something"));
        }
        if res.is_err() {
            break;
        }
    }
    let dups: i64 = lab
        .admin
        .query_one(
            &format!(
                "SELECT count(*) - count(DISTINCT id) FROM {}.ta",
                lab.schema
            ),
            &[],
        )
        .await
        .unwrap()
        .get(0);
    if dups != 0 {
        problems.push(format!("{dups} duplicate keys in the table"));
    }
    eprintln!("{}", lab.state().await);
    lab.drop().await;
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

// ---------------------------------------------------------------------------------------
// 6. Errors: which is reported, and no password in them.

/// Every record valid Debezium JSON: record 100 carries a value the server refuses (`n` is
/// int), record 3000 a column the table lacks. One by one, the epoch stops at record 100.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(servers),
    ignore = "needs WALSINK_TEST_SERVERS=1 and a local PostgreSQL"
)]
async fn a_refused_value_before_an_unknown_column_is_the_error_reported() {
    let lab = Lab::new("order", &[("ta", "int")]).await;
    let mut problems = Vec::new();
    for (early, late) in [(100usize, 3000usize), (5, 1030), (600, 5000)] {
        let mut sink = lab.sink("").await;
        let mut f = Feed::new(&format!("order{early}"), 1 << 20);
        let mut recs: Vec<String> = (0..6000)
            .map(|i| {
                c(
                    "ta",
                    10 + i as u64,
                    &id(i as i64 + 100_000 * early as i64),
                    "x",
                    1,
                )
            })
            .collect();
        recs[early] = ev(
            "ta",
            "c",
            10 + early as u64,
            Value::Null,
            json!({"id": 5, "v": "x", "n": "notanumber"}),
        );
        recs[late] = ev(
            "ta",
            "c",
            10 + late as u64,
            Value::Null,
            json!({"id": 6, "v": "x", "zzz": 1}),
        );
        f.seal(&recs);
        let res = f.deliver(&mut sink).await;
        match res {
            Ok(_) => problems.push(format!("{early}/{late}: delivered")),
            Err(e) => {
                let first = e.split(" (last error").next().unwrap().to_string();
                if !(first.contains("22P02") || first.contains("invalid input syntax")) {
                    problems.push(format!(
                        "refused value at index {early}, unknown column at index {late}: reported {first}"
                    ));
                }
            }
        }
    }
    lab.drop().await;
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

/// A password in the sink URL must not appear in Debug / Display of the config or the sink,
/// nor in any error (connect failure, missing table, refused value, non-key unique index).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(servers),
    ignore = "needs WALSINK_TEST_SERVERS=1 and a local PostgreSQL"
)]
async fn no_password_in_debug_or_errors() {
    let lab = Lab::custom(
        "pw",
        "CREATE UNIQUE INDEX ON {s}.ta (v); INSERT INTO {s}.ta VALUES (1, 'same', 1);",
        &[("ta", "int")],
    )
    .await;
    let secrets = ["Pw@Sekr3tZ", "Pw%40Sekr3tZ", "Sekr3tZ"];
    let url = format!(
        "postgres://postgres:Pw%40Sekr3tZ@127.0.0.1:5432/test?schema={}",
        lab.schema
    );
    let mut texts = Vec::new();
    let cfg = Config::from_url(&url).unwrap();
    texts.push(format!("{cfg:?}"));
    texts.push(format!("{}", cfg.url));
    texts.push(format!("{:?}", cfg.url));
    texts.push(cfg.url.shown());
    // A wrong port: the connect error.
    let bad = Config::from_url(&url.replace(":5432", ":1")).unwrap();
    match CdcSink::connect(bad).await {
        Ok(_) => texts.push("connected to port 1?".into()),
        Err(e) => {
            texts.push(format!("{e}"));
            texts.push(format!("{e:?}"));
        }
    }
    // Bad URL parameter error
    if let Err(e) = Config::from_url(&format!("{url}&max_held=x")) {
        texts.push(e);
    }
    let mut sink = CdcSink::connect(cfg)
        .await
        .expect("connect with a password (trust)");
    texts.push(format!("{sink:?}"));
    let mut feed = Feed::new("pw", 64 << 10);
    for recs in [
        vec![c("nope", 1, &id(1), "x", 1)],
        vec![ev("ta", "c", 2, Value::Null, json!({"id": 2, "n": "nan?"}))],
        vec![c("ta", 3, &id(3), "same", 1)],
        vec![c("ta", 4, &id(1), "x", 1), c("ta", 5, &id(2), "same", 1)],
    ] {
        let mut f = Feed::new(&format!("pw{}", texts.len()), 64 << 10);
        f.seal(&recs);
        match f.deliver(&mut sink).await {
            Ok(_) => texts.push("ok".into()),
            Err(e) => texts.push(e),
        }
        texts.push(format!("{:?}", f.wal.health()));
    }
    feed.seal(&[c("ta", 100, &id(9), "v9", 9)]);
    let _ = feed.deliver(&mut sink).await;
    let mut leaks = Vec::new();
    for t in &texts {
        for s in secrets {
            if t.contains(s) {
                leaks.push(format!("{s} in: {t}"));
            }
        }
    }
    for t in &texts {
        eprintln!("-- {t}");
    }
    lab.drop().await;
    assert!(leaks.is_empty(), "{}", leaks.join("\n"));
}

/// A refused value at record `early` (sent in an early flush) and, later in the epoch, a
/// record the parser ahead refuses (valid JSON but not a Debezium event, or not JSON): which
/// error is reported? One by one the epoch stops at `early`; the docs: "the error reported is
/// always the first failure in the order sent", "a bad event still stops the epoch at its own
/// position".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(servers),
    ignore = "needs WALSINK_TEST_SERVERS=1 and a local PostgreSQL"
)]
async fn a_refused_value_before_a_record_the_parser_refuses() {
    let lab = Lab::new("order2", &[("ta", "int")]).await;
    let mut problems = Vec::new();
    let mut seen = 0;
    for late_kind in ["not json", "unknown op", "no key", "missing table"] {
        for (early, late) in [(100usize, 3000usize), (5, 1030)] {
            seen += 1;
            let mut sink = lab.sink("").await;
            let mut f = Feed::new(&format!("order2{early}{}", late_kind.len()), 1 << 20);
            let mut recs: Vec<String> = (0..6000)
                .map(|i| {
                    c(
                        "ta",
                        10 + i as u64,
                        &id(i as i64 + 100_000 * early as i64),
                        "x",
                        1,
                    )
                })
                .collect();
            recs[early] = ev(
                "ta",
                "c",
                10 + early as u64,
                Value::Null,
                json!({"id": 5, "v": "x", "n": "notanumber"}),
            );
            recs[late] = match late_kind {
                "not json" => "not json at all".to_string(),
                "unknown op" => ev("ta", "q", 10 + late as u64, Value::Null, json!({"id": 6})),
                "no key" => ev(
                    "ta",
                    "c",
                    10 + late as u64,
                    Value::Null,
                    json!({"v": "nokey"}),
                ),
                _ => ev("nope", "c", 10 + late as u64, Value::Null, json!({"id": 6})),
            };
            let before = lab.state().await;
            f.seal(&recs);
            match f.deliver(&mut sink).await {
                Ok(_) => problems.push(format!("{late_kind}: delivered")),
                Err(e) => {
                    let first = e.split(" (last error").next().unwrap().to_string();
                    if !(first.contains("22P02") || first.contains("invalid input syntax")) {
                        problems.push(format!(
                            "refused value at index {early}, {late_kind} at index {late}: reported: {first}"
                        ));
                    }
                }
            }
            if lab.state().await != before {
                problems.push(format!("{late_kind} {early}/{late}: something applied"));
            }
        }
    }
    eprintln!("{seen} cases");
    lab.drop().await;
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

/// Conflicts together with other things the first attempt does in its transaction and the
/// retry must do again: a column added by `add_missing_columns=true`, the hidden column and
/// the bookkeeping rows of a table met for the first time, a truncate before the create (an
/// old truncate that keeps a newer row), a bad record after the conflict; and `max_held=1`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(servers),
    ignore = "needs WALSINK_TEST_SERVERS=1 and a local PostgreSQL"
)]
async fn conflicts_with_added_columns_truncates_and_bad_records() {
    let mut problems = Vec::new();
    for params in [
        "&add_missing_columns=true",
        "&add_missing_columns=true&max_held=1",
    ] {
        let lab = Lab::new("mix", &[("ta", "int"), ("tb", "int")]).await;
        lab.exec("INSERT INTO {s}.ta VALUES (1, 'hand', 1)").await;
        let mut model = lab.model();
        model.manual("ta", "1", "hand", 1);
        let mut sink = lab.sink(params).await;
        let mut feed = Feed::new("mix", 64 << 10);
        // Epoch 1: first touch of both tables; a new column `extra` in ta (and tb); conflict in ta.
        let e1 = vec![
            ev(
                "tb",
                "c",
                10,
                Value::Null,
                json!({"id": 1, "v": "b1", "n": 1, "extra": 5}),
            ),
            ev(
                "ta",
                "c",
                11,
                Value::Null,
                json!({"id": 2, "v": "a2", "n": 2, "extra": 7}),
            ),
            ev(
                "ta",
                "c",
                12,
                Value::Null,
                json!({"id": 1, "v": "created", "n": 3, "extra": 8}),
            ),
            ev(
                "tb",
                "c",
                13,
                Value::Null,
                json!({"id": 2, "v": "b2", "n": 2, "extra2": "s"}),
            ),
        ];
        // Epoch 2: an old truncate of tb (position 5, below its rows at 10 and 13: keeps
        // them), then a create of tb's key 1 again at a newer position (a conflict in tb).
        let e2 = vec![
            t("tb", 5),
            c("tb", 20, &id(1), "recreated", 9),
            c("tb", 21, &id(3), "b3", 3),
        ];
        // Epoch 3: tb truncated (new), then creates of keys that were there: no conflict.
        let e3 = vec![
            t("tb", 30),
            c("tb", 31, &id(1), "after t", 1),
            c("tb", 32, &id(2), "after t", 2),
        ];
        let mut all = Vec::new();
        for (i, e) in [e1, e2, e3].iter().enumerate() {
            let s0 = sink.stats();
            feed.seal(e);
            if let Err(err) = feed.deliver(&mut sink).await {
                problems.push(format!("{params} epoch {i}: {err}"));
                break;
            }
            for x in e {
                model.apply(x);
            }
            all.extend(e.iter().cloned());
            problems.extend(lab.check(&model, &format!("{params} epoch {i}")).await);
            eprintln!("{params} epoch {i}: {:?}", delta(&s0, &sink.stats()));
        }
        let extras: Vec<(i32, Option<String>)> = lab
            .admin
            .query(
                &format!("SELECT id, extra::text FROM {}.ta ORDER BY id", lab.schema),
                &[],
            )
            .await
            .map(|rows| rows.iter().map(|r| (r.get(0), r.get(1))).collect())
            .unwrap_or_default();
        if extras != vec![(1, Some("8".to_string())), (2, Some("7".to_string()))] {
            problems.push(format!("{params}: ta.extra {extras:?}"));
        }
        let st = sink.stats();
        if st.refused_tables != 2 {
            problems.push(format!(
                "{params}: refused_tables {} want 2",
                st.refused_tables
            ));
        }
        // Epoch 4 (new sink, so ta inserts again): a conflict at index 1, a bad record at
        // index 700 (after the first flush): the error must be the bad record's, nothing
        // applied.
        let mut sink2 = lab.sink(params).await;
        let before = lab.state().await;
        let mut e4: Vec<String> = (0..1500)
            .map(|i| c("ta", 1000 + i as u64, &id(100 + i), "z", 1))
            .collect();
        e4[1] = c("ta", 999, &id(2), "conflict", 1);
        e4[700] = ev("ta", "c", 1700, Value::Null, json!({"v": "no key"}));
        feed.seal(&e4);
        match feed.deliver(&mut sink2).await {
            Ok(_) => problems.push(format!("{params}: epoch 4 delivered")),
            Err(e) => {
                if !e.contains("index 700") {
                    problems.push(format!(
                        "{params}: epoch 4 error does not name index 700: {e}"
                    ));
                }
            }
        }
        if lab.state().await != before {
            problems.push(format!("{params}: epoch 4 left something"));
        }
        lab.drop().await;
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

/// Small read chunks (fewer records than a batch each, "parsed in place") mixed with chunks
/// bigger than a batch; bad records and tombstones at the boundaries.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(servers),
    ignore = "needs WALSINK_TEST_SERVERS=1 and a local PostgreSQL"
)]
async fn small_read_chunks_bad_records_and_tombstones() {
    let lab = Lab::new("chunks", &[("ta", "int")]).await;
    let mut problems = Vec::new();
    for chunk in [1024usize, 2 << 10, 150 << 10] {
        // Good epoch with tombstones at 1023/1024/2047/2048, record sizes varying.
        let mut model = lab.model();
        lab.exec("TRUNCATE {s}.ta").await;
        let mut sink = lab.sink("").await;
        let mut f = Feed::new(&format!("chunks{chunk}"), chunk);
        let mut recs: Vec<String> = (0..3000)
            .map(|i| {
                let pad = "p".repeat(i % 97);
                c("ta", 10 + i as u64, &id(i as i64), &pad, i as i64)
            })
            .collect();
        for at in [0usize, 1023, 1024, 2047, 2048, 2999] {
            recs[at] =
                ["null", "", "   ", "{\"schema\":null,\"payload\":null}"][at % 4].to_string();
        }
        let s0 = sink.stats();
        f.seal(&recs);
        if let Err(e) = f.deliver(&mut sink).await {
            problems.push(format!("chunk {chunk}: {e}"));
        }
        for r in &recs {
            model.apply(r);
        }
        problems.extend(lab.check(&model, &format!("chunk {chunk}")).await);
        let ev_count = sink.stats().events - s0.events;
        if ev_count != 2994 {
            problems.push(format!("chunk {chunk}: Stats::events {ev_count} want 2994"));
        }
        // Bad record epochs.
        for at in [0usize, 1, 1023, 1024, 2048, 2999] {
            let mut recs2: Vec<String> = (0..3000)
                .map(|i| u("ta", 100_000 + i as u64, &id((i % 2990) as i64 + 1), "u", 1))
                .collect();
            recs2[at] = "[1,2".into();
            let before = lab.state().await;
            f.seal(&recs2);
            match f.deliver(&mut sink).await {
                Ok(_) => problems.push(format!("chunk {chunk} bad at {at}: delivered")),
                Err(e) => {
                    if !e.contains(&format!("index {at}:")) && !e.contains(&format!("index {at} "))
                    {
                        problems.push(format!("chunk {chunk} bad at {at}: {e}"));
                    }
                }
            }
            if lab.state().await != before {
                problems.push(format!("chunk {chunk} bad at {at}: left something"));
            }
            // a new log for the next case (this one is stuck on its bad epoch)
            f = Feed::new(&format!("chunks{chunk}_{at}"), chunk);
        }
    }
    lab.drop().await;
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}
