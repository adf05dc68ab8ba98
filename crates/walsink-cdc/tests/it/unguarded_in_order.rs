//! "Unguarded when in order" and "Created keys are inserted" (docs/targets/cdc.md, "The
//! position guard"): runs that skip the guard never let an older change win.
//!
//! Claimed: a run of a flush's statements for one table goes without the guard when every
//! rank it sends is above the table's high-water; an upsert of a key whose first event in the
//! run is `c`/`r` goes as a plain insert when its create ranks above the high-water the table
//! had when the epoch began and the table's events so far came in rank order (else only when
//! the create ranks above everything sent so far). A wrong guess costs a retry (the epoch
//! applied again with upserts), never a wrong row.
//!
//! Every test works in a schema `p11_…` of its own, compares the replica after every epoch
//! with a one-by-one model of the documented guard (each row keeps the rank of the event that
//! wrote it; an event not above the row's rank, its tombstone or the table's truncate
//! watermark changes nothing; reads rank below streamed changes), checks `Stats`, and drops
//! its schema.

use serde_json::{json, Value};
use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;
use walsink_cdc::{CdcSink, Config, Stats};

use crate::common::{admin, Feed, SHARED};

fn unique(tag: &str) -> String {
    crate::common::unique("p11", tag)
}

// ---------------------------------------------------------------------------------------
// Events.

/// One Debezium event of table `tbl` (id bigint primary key, v text, n bigint).
#[derive(Clone, Debug, PartialEq)]
struct Ev {
    tbl: usize,
    op: char,
    pos: u64,
    /// `before`'s key (deletes, key-changing updates).
    before: Option<i64>,
    /// `after`'s key and value.
    after: Option<(i64, String)>,
    /// `after` lacks column `n` (an unchanged TOAST value): a partial image.
    partial: bool,
}

const TABLES: [&str; 3] = ["ta", "tb", "tc"];

impl Ev {
    fn json(&self) -> String {
        let b = self.before.map_or(Value::Null, |k| json!({"id": k}));
        let a = self.after.as_ref().map_or(Value::Null, |(k, v)| {
            if self.partial {
                json!({"id": k, "v": v})
            } else {
                json!({"id": k, "v": v, "n": k * 3})
            }
        });
        json!({"before": b, "after": a, "op": self.op.to_string(), "ts_ms": 0,
               "source": {"db": "src", "schema": "public", "table": TABLES[self.tbl], "lsn": self.pos}})
        .to_string()
    }
    fn short(&self) -> String {
        let t = TABLES[self.tbl];
        match self.op {
            't' => format!("{t}:t@{}", self.pos),
            'd' => format!("{t}:d({})@{}", self.before.unwrap(), self.pos),
            'u' if self.before.is_some() => format!(
                "{t}:u({}->{},{})@{}",
                self.before.unwrap(),
                self.after.as_ref().unwrap().0,
                self.after.as_ref().unwrap().1,
                self.pos
            ),
            op => {
                let (k, v) = self.after.as_ref().unwrap();
                let p = if self.partial { "~" } else { "" };
                format!("{t}:{op}{p}({k},{v})@{}", self.pos)
            }
        }
    }
}

fn c(tbl: usize, pos: u64, k: i64, v: &str) -> Ev {
    Ev {
        tbl,
        op: 'c',
        pos,
        before: None,
        after: Some((k, v.into())),
        partial: false,
    }
}
fn r(tbl: usize, pos: u64, k: i64, v: &str) -> Ev {
    Ev {
        op: 'r',
        ..c(tbl, pos, k, v)
    }
}
fn u(tbl: usize, pos: u64, k: i64, v: &str) -> Ev {
    Ev {
        op: 'u',
        ..c(tbl, pos, k, v)
    }
}
fn kc(tbl: usize, pos: u64, from: i64, to: i64, v: &str) -> Ev {
    Ev {
        tbl,
        op: 'u',
        pos,
        before: Some(from),
        after: Some((to, v.into())),
        partial: false,
    }
}
fn d(tbl: usize, pos: u64, k: i64) -> Ev {
    Ev {
        tbl,
        op: 'd',
        pos,
        before: Some(k),
        after: None,
        partial: false,
    }
}
fn t(tbl: usize, pos: u64) -> Ev {
    Ev {
        tbl,
        op: 't',
        pos,
        before: None,
        after: None,
        partial: false,
    }
}

// ---------------------------------------------------------------------------------------
// The one-by-one model of the documented guard.

/// Reads rank below every streamed change, ordered among themselves by position.
fn rank(op: char, pos: u64) -> i128 {
    if op == 'r' {
        pos as i128 - (1i128 << 64)
    } else {
        pos as i128
    }
}

/// A row: its value and the rank that wrote it (None: written outside the stream).
type Rows = BTreeMap<i64, (String, Option<i128>)>;

#[derive(Default, Clone, Debug)]
struct MTable {
    rows: Rows,
    tombs: BTreeMap<i64, i128>,
    wm: Option<i128>,
}

impl MTable {
    fn applies(&self, k: i64, rk: i128) -> bool {
        self.wm.is_none_or(|w| rk > w)
            && self.tombs.get(&k).is_none_or(|t| rk > *t)
            && self
                .rows
                .get(&k)
                .is_none_or(|(_, rr)| rr.is_none_or(|rr| rk > rr))
    }
    fn upsert(&mut self, k: i64, v: &str, rk: i128) {
        if self.applies(k, rk) {
            self.rows.insert(k, (v.to_string(), Some(rk)));
        }
    }
    fn delete(&mut self, k: i64, rk: i128) {
        if self.applies(k, rk) {
            self.rows.remove(&k);
            self.tombs.insert(k, rk);
        }
    }
    fn truncate(&mut self, rk: i128) {
        if self.wm.is_some_and(|w| rk <= w) {
            return;
        }
        self.rows.retain(|_, (_, rr)| rr.is_some_and(|rr| rr >= rk));
        self.tombs.retain(|_, t| *t >= rk);
        self.wm = Some(rk);
    }
    fn apply(&mut self, e: &Ev) {
        let rk = rank(e.op, e.pos);
        match e.op {
            'c' | 'r' => {
                let (k, v) = e.after.as_ref().unwrap();
                self.upsert(*k, v, rk)
            }
            'u' => {
                let (k, v) = e.after.as_ref().unwrap();
                if let Some(b) = e.before {
                    if b != *k {
                        self.delete(b, rk);
                    }
                }
                self.upsert(*k, v, rk)
            }
            'd' => self.delete(e.before.unwrap(), rk),
            't' => self.truncate(rk),
            _ => unreachable!(),
        }
    }
}

#[derive(Default, Clone, Debug)]
struct Model {
    tables: [MTable; 3],
}

impl Model {
    fn apply(&mut self, events: &[Ev]) {
        for e in events {
            self.tables[e.tbl].apply(e);
        }
    }
}

// ---------------------------------------------------------------------------------------
// The target: a schema, its tables, sinks in turn (each with its own log).

struct Lab {
    schema: String,
    admin: tokio_postgres::Client,
    model: Model,
    sinks: Vec<(Feed, CdcSink)>,
    /// Every epoch delivered so far: (sink, events).
    history: Vec<(usize, Vec<Ev>)>,
}

async fn deliver(feed: &Feed, sink: &mut CdcSink) -> Result<usize, String> {
    match tokio::time::timeout(
        Duration::from_secs(90),
        walsink_tokio::deliver_ready(&feed.wal, sink),
    )
    .await
    {
        Err(_) => Err("delivery did not end within 90 s".into()),
        Ok(r) => r.map_err(|e| {
            format!(
                "{e} (last error: {})",
                feed.wal.health().last_error.unwrap_or_default()
            )
        }),
    }
}

impl Lab {
    async fn new(tag: &str, sinks: usize, params: &str) -> Lab {
        let schema = unique(tag);
        let admin = admin().await;
        let mut sql = format!("CREATE SCHEMA {schema};");
        for tb in TABLES {
            sql +=
                &format!("CREATE TABLE {schema}.{tb} (id bigint PRIMARY KEY, v text, n bigint);");
        }
        admin.batch_execute(&sql).await.unwrap();
        let mut v = Vec::new();
        for i in 0..sinks {
            let cfg = Config::from_url(&format!("{SHARED}?schema={schema}{params}")).unwrap();
            let sink = CdcSink::connect(cfg).await.expect("connect");
            v.push((Feed::new(&format!("{schema}_s{i}"), 1 << 16), sink));
        }
        Lab {
            schema,
            admin,
            model: Model::default(),
            sinks: v,
            history: Vec::new(),
        }
    }

    /// Delivers `events` as one epoch through sink `s`, applies them to the model, and checks
    /// the stats' deltas. Returns the stats' delta.
    async fn epoch(&mut self, s: usize, events: &[Ev]) -> Result<Stats, String> {
        let before = self.sinks[s].1.stats();
        let recs: Vec<String> = events.iter().map(Ev::json).collect();
        let (feed, sink) = &mut self.sinks[s];
        feed.seal(&recs);
        deliver(feed, sink).await?;
        let after = sink.stats();
        self.model.apply(events);
        self.history.push((s, events.to_vec()));
        let dl = Stats {
            epochs: after.epochs - before.epochs,
            events: after.events - before.events,
            sent: after.sent - before.sent,
            unguarded: after.unguarded - before.unguarded,
            inserts: after.inserts - before.inserts,
            refused_tables: after.refused_tables - before.refused_tables,
            ..Stats::default()
        };
        let mut bad = Vec::new();
        if dl.epochs != 1 {
            bad.push(format!("epochs +{} (want +1)", dl.epochs));
        }
        if dl.events != events.len() as u64 {
            bad.push(format!("events +{} (want +{})", dl.events, events.len()));
        }
        if !(dl.inserts <= dl.unguarded && dl.unguarded <= dl.sent) {
            bad.push(format!("not inserts <= unguarded <= sent: {dl:?}"));
        }
        if after.refused_tables < before.refused_tables || after.refused_tables > 3 {
            bad.push(format!(
                "refused_tables {} -> {}",
                before.refused_tables, after.refused_tables
            ));
        }
        if bad.is_empty() {
            Ok(dl)
        } else {
            Err(format!("stats of sink {s}: {}", bad.join("; ")))
        }
    }

    async fn rows(&self, tbl: usize) -> BTreeMap<i64, String> {
        self.admin
            .query(
                &format!(
                    "SELECT id, v FROM {}.{} ORDER BY id",
                    self.schema, TABLES[tbl]
                ),
                &[],
            )
            .await
            .unwrap()
            .iter()
            .map(|r| {
                (
                    r.get::<_, i64>(0),
                    r.get::<_, Option<String>>(1).unwrap_or_default(),
                )
            })
            .collect()
    }

    /// The differences between the model and the replica, empty when equal.
    async fn check(&self) -> Vec<String> {
        let mut out = Vec::new();
        for (tbl, name) in TABLES.iter().enumerate() {
            let got = self.rows(tbl).await;
            let want: BTreeMap<i64, String> = self.model.tables[tbl]
                .rows
                .iter()
                .map(|(k, (v, _))| (*k, v.clone()))
                .collect();
            for (k, v) in &want {
                match got.get(k) {
                    None => out.push(format!("{name}: row {k} missing (want {v})")),
                    Some(g) if g != v => out.push(format!("{name}: row {k} is {g} (want {v})")),
                    _ => {}
                }
            }
            for (k, g) in &got {
                if !want.contains_key(k) {
                    out.push(format!("{name}: row {k} is {g} (want none)"));
                }
            }
        }
        out
    }

    async fn admin_insert(&mut self, tbl: usize, k: i64, v: &str) {
        self.admin
            .execute(
                &format!(
                    "INSERT INTO {}.{} (id, v, n) VALUES ($1::bigint, $2, $1::bigint * 3)",
                    self.schema, TABLES[tbl]
                ),
                &[&k, &v],
            )
            .await
            .unwrap();
        self.model.tables[tbl].rows.insert(k, (v.to_string(), None));
    }

    async fn drop_schema(self) {
        let _ = self
            .admin
            .batch_execute(&format!("DROP SCHEMA {} CASCADE", self.schema))
            .await;
    }
}

/// Applies epochs through the given sinks, checking after each; returns the first problem
/// with the history that led to it.
async fn run_epochs(lab: &mut Lab, eps: &[(usize, Vec<Ev>)]) -> Result<(), String> {
    for (n, (s, evs)) in eps.iter().enumerate() {
        lab.epoch(*s, evs)
            .await
            .map_err(|e| format!("epoch {n} (sink {s}, {} events): {e}", evs.len()))?;
        let diff = lab.check().await;
        if !diff.is_empty() {
            return Err(format!(
                "after epoch {n} (sink {s}, {} events): {} differences, first: {:?}",
                evs.len(),
                diff.len(),
                &diff[..diff.len().min(8)]
            ));
        }
    }
    Ok(())
}

fn show(evs: &[Ev]) -> String {
    evs.iter().map(Ev::short).collect::<Vec<_>>().join(", ")
}

// ---------------------------------------------------------------------------------------
// Hand cases.

/// Filler creates of keys `from..from + n` of table `tbl`, positions from `pos0` up.
fn filler(tbl: usize, from: i64, n: i64, pos0: u64) -> Vec<Ev> {
    (0..n)
        .map(|i| {
            c(
                tbl,
                pos0 + i as u64,
                from + i,
                &format!("f{}", pos0 + i as u64),
            )
        })
        .collect()
}

/// The documented case: an epoch in order sent in several flushes (default window), keys
/// created early and changed late; then duplicates far apart in one epoch, equal positions
/// across flushes, delete then re-create across flushes, a key change to a deleted key, a
/// truncate between. Each epoch compared with the model; the stream is in order and consistent,
/// so the docs promise no refused table.
#[tokio::test]
#[cfg_attr(
    not(servers),
    ignore = "needs WALSINK_TEST_SERVERS=1 and a local PostgreSQL"
)]
async fn hand_in_order_epochs_in_several_flushes() {
    let mut lab = Lab::new("hand", 1, "&max_held=40").await;
    let mut eps = Vec::new();
    // Epoch 0: keys 0..10 created at 10.., then fillers (flushed every 40), then updates of
    // 0..10, then delete of 0..5, re-create of 0..3, key change 5->1000, 1000 deleted,
    // 1000 created again.
    let mut e = Vec::new();
    for k in 0..10 {
        e.push(c(0, 10 + k as u64, k, &format!("c{k}")));
    }
    e.extend(filler(0, 100, 200, 100));
    for k in 0..10 {
        e.push(u(0, 400 + k as u64, k, &format!("u{k}")));
    }
    e.extend(filler(0, 300, 100, 500));
    for k in 0..5 {
        e.push(d(0, 700 + k as u64, k));
    }
    e.extend(filler(0, 400, 100, 800));
    for k in 0..3 {
        e.push(c(0, 1000 + k as u64, k, &format!("again{k}")));
    }
    e.push(kc(0, 1010, 5, 1000, "moved5"));
    e.extend(filler(0, 500, 50, 1100));
    e.push(d(0, 1200, 1000));
    e.extend(filler(0, 600, 50, 1300));
    e.push(c(0, 1400, 1000, "re1000"));
    e.push(c(0, 1401, 5, "re5"));
    eps.push((0, e));
    // Epoch 1: a truncate between, then creates of keys that were there before it.
    let mut e = vec![u(0, 1500, 7, "u7b"), t(0, 1510)];
    for k in 0..20 {
        e.push(c(0, 1520 + k as u64, k, &format!("after-t{k}")));
    }
    e.extend(filler(0, 100, 100, 1600));
    eps.push((0, e));
    let res = run_epochs(&mut lab, &eps).await;
    let st = lab.sinks[0].1.stats();
    lab.drop_schema().await;
    res.unwrap();
    assert_eq!(
        st.refused_tables, 0,
        "an in-order stream was refused: {st:?}"
    );
    println!("{st:?}");
    assert!(st.inserts > 0, "{st:?}");
}

/// A row of the table is outside the stream (NULL rank) and the stream creates its key late
/// in a large in-order epoch: the insert fails, the epoch is applied again with upserts, and
/// the rows equal the model; the table gets upserts from then on (inserts stop), the other
/// table keeps its plain inserts.
#[tokio::test]
#[cfg_attr(
    not(servers),
    ignore = "needs WALSINK_TEST_SERVERS=1 and a local PostgreSQL"
)]
async fn a_created_key_written_outside_is_a_retry_for_its_table_only() {
    let mut lab = Lab::new("outside", 1, "&max_held=30").await;
    // The sink meets the tables first.
    let e0: Vec<Ev> = vec![c(0, 1, 1, "a"), c(1, 1, 1, "a")];
    run_epochs(&mut lab, &[(0, e0)]).await.unwrap();
    lab.admin_insert(0, 5555, "outside").await;
    let mut e = Vec::new();
    let mut pos = 10;
    for k in 100..700 {
        pos += 1;
        e.push(c(0, pos, k, &format!("x{pos}")));
        pos += 1;
        e.push(c(1, pos, k, &format!("y{pos}")));
    }
    e.push(c(0, pos + 1, 5555, "created"));
    e.push(c(1, pos + 2, 5555, "created"));
    let res = run_epochs(&mut lab, &[(0, e)]).await;
    let st1 = lab.sinks[0].1.stats();
    // Another in-order epoch: table tb still gets plain inserts, ta does not.
    let e2: Vec<Ev> = (0..200)
        .map(|k| c(0, 5000 + k, 2000 + k as i64, "z"))
        .collect();
    let res2 = run_epochs(&mut lab, &[(0, e2)]).await;
    let st2 = lab.sinks[0].1.stats();
    let e3: Vec<Ev> = (0..200)
        .map(|k| c(1, 6000 + k, 2000 + k as i64, "z"))
        .collect();
    let res3 = run_epochs(&mut lab, &[(0, e3)]).await;
    let st3 = lab.sinks[0].1.stats();
    lab.drop_schema().await;
    res.unwrap();
    res2.unwrap();
    res3.unwrap();
    assert_eq!(st1.refused_tables, 1, "{st1:?}");
    assert_eq!(
        st2.inserts, st1.inserts,
        "ta still got plain inserts: {st2:?}"
    );
    assert!(
        st3.inserts > st2.inserts,
        "tb lost its plain inserts: {st3:?}"
    );
    assert_eq!(st3.refused_tables, 1);
}

/// Sinks in turn on one schema with one upstream: sink 0 applies up to position 100, sink 1
/// applies newer changes (up to 300), then sink 0's upstream is rewound to a range sink 1
/// already applied (positions 150..200, above everything sink 0 itself ever sent). The
/// high-water that decides a run's guard must be the table's, not what sink 0 remembers.
#[tokio::test]
#[cfg_attr(
    not(servers),
    ignore = "needs WALSINK_TEST_SERVERS=1 and a local PostgreSQL"
)]
async fn sinks_in_turn_share_the_tables_high_water() {
    let mut lab = Lab::new("turns", 2, "&max_held=8").await;
    let mut e0 = Vec::new();
    for k in 0..20 {
        e0.push(c(0, 10 + k as u64, k, &format!("c{k}")));
    }
    let mut e1 = Vec::new();
    for k in 0..20 {
        e1.push(u(0, 150 + k as u64, k, &format!("u150_{k}")));
    }
    for k in 0..10 {
        e1.push(d(0, 250 + k as u64, k));
    }
    for k in 10..20 {
        e1.push(u(0, 260 + k as u64, k, &format!("u260_{k}")));
    }
    e1.push(c(0, 300, 1000, "c1000"));
    // Sink 0 again: the rewound range 150..200 (sink 1 applied it), and a create of a key
    // sink 1 created, then new changes.
    let mut e2: Vec<Ev> = e1[..20].to_vec();
    e2.push(c(0, 300, 1000, "c1000"));
    e2.push(c(0, 400, 2000, "c2000"));
    let eps = vec![(0, e0), (1, e1), (0, e2)];
    let res = run_epochs(&mut lab, &eps).await;
    lab.drop_schema().await;
    res.unwrap();
}

/// Equal positions: for different keys across flushes, and for the same key (a delete and a
/// create at one position; one-by-one the create at the delete's rank changes nothing), with
/// later changes folding into the run.
#[tokio::test]
#[cfg_attr(
    not(servers),
    ignore = "needs WALSINK_TEST_SERVERS=1 and a local PostgreSQL"
)]
async fn equal_positions_same_and_different_keys() {
    let mut lab = Lab::new("equal", 1, "&max_held=4").await;
    let mut eps = Vec::new();
    eps.push((0, (0..30).map(|k| c(0, 10, k, &format!("c{k}"))).collect()));
    let mut e = Vec::new();
    for k in 0..10 {
        e.push(d(0, 20, k));
        e.extend(filler(0, 100 + 10 * k, 5, 20));
        e.push(c(0, 20, k, &format!("same-pos{k}")));
    }
    for k in 10..20 {
        e.push(u(0, 30, k, &format!("u30_{k}")));
        e.push(u(0, 30, k, &format!("u30b_{k}")));
        e.push(d(0, 30, k));
    }
    e.push(c(0, 31, 0, "later0"));
    eps.push((0, e));
    // The same event twice, in order (equal), the first already flushed.
    let mut e = Vec::new();
    for k in 300..310 {
        let ev = c(0, 40 + k as u64, k, &format!("c{k}"));
        e.push(ev.clone());
        e.extend(filler(0, 1000 + 10 * k, 4, 40 + k as u64));
        e.push(ev);
    }
    eps.push((0, e));
    let res = run_epochs(&mut lab, &eps).await;
    let st = lab.sinks[0].1.stats();
    lab.drop_schema().await;
    res.unwrap();
    println!("{st:?}");
}

/// Snapshot reads: reads at one position (the slot's consistent point), streamed changes with
/// positions below and above it, the snapshot read again at a new position (a read of a key
/// a streamed change wrote changes nothing; of a key only a read wrote, it wins).
#[tokio::test]
#[cfg_attr(
    not(servers),
    ignore = "needs WALSINK_TEST_SERVERS=1 and a local PostgreSQL"
)]
async fn snapshot_reads_then_stream_then_reread() {
    let mut lab = Lab::new("reads", 1, "&max_held=16").await;
    let mut eps = Vec::new();
    let mut e: Vec<Ev> = (0..100).map(|k| r(0, 1000, k, &format!("r{k}"))).collect();
    // Streamed changes logged before the consistent point.
    for k in 0..20 {
        e.push(u(0, 900 + k as u64, k, &format!("s{k}")));
    }
    for k in 200..260 {
        e.push(c(0, 950 + k as u64, k, &format!("s{k}")));
    }
    eps.push((0, e));
    // The snapshot read again with a new position: keys 0..20 keep their streamed rows.
    let mut e: Vec<Ev> = (0..120).map(|k| r(0, 5000, k, &format!("rr{k}"))).collect();
    e.push(c(0, 6000, 999, "new"));
    eps.push((0, e));
    // Reads of keys created by streamed changes, then streamed.
    let mut e: Vec<Ev> = (200..260)
        .map(|k| r(0, 7000, k, &format!("r3{k}")))
        .collect();
    for k in 200..210 {
        e.push(u(0, 7000 + k as u64, k, &format!("s3{k}")));
    }
    eps.push((0, e));
    let res = run_epochs(&mut lab, &eps).await;
    lab.drop_schema().await;
    res.unwrap();
}

/// Two spellings of one integer key in one in-order run: a create as `7` and a delete as
/// `"7"` (held apart by the planner). One by one the row is created and then deleted.
#[tokio::test]
#[cfg_attr(
    not(servers),
    ignore = "needs WALSINK_TEST_SERVERS=1 and a local PostgreSQL"
)]
async fn two_spellings_in_one_unguarded_run() {
    let mut lab = Lab::new("spell", 1, "").await;
    run_epochs(&mut lab, &[(0, vec![c(0, 1, 1, "a")])])
        .await
        .unwrap();
    let ev = |op: &str, pos: u64, before: Value, after: Value| {
        json!({"before": before, "after": after, "op": op, "ts_ms": 0,
               "source": {"table": "ta", "lsn": pos}})
        .to_string()
    };
    let cases: Vec<(Vec<String>, Option<&str>)> = vec![
        (
            vec![
                ev("c", 10, Value::Null, json!({"id": 7, "v": "c7", "n": 0})),
                ev("d", 20, json!({"id": "7"}), Value::Null),
            ],
            None,
        ),
        (
            vec![
                ev("c", 30, Value::Null, json!({"id": 8, "v": "c8", "n": 0})),
                ev("u", 40, Value::Null, json!({"id": "08", "v": "u8", "n": 0})),
            ],
            Some("u8"),
        ),
        (
            vec![
                ev("u", 50, Value::Null, json!({"id": "9", "v": "u9", "n": 0})),
                ev("c", 60, Value::Null, json!({"id": 9, "v": "c9", "n": 0})),
                ev("d", 70, json!({"id": "09"}), Value::Null),
            ],
            None,
        ),
    ];
    let mut problems = Vec::new();
    for (recs, want) in cases {
        let key: i64 = match &serde_json::from_str::<Value>(&recs[0]).unwrap()["after"]["id"] {
            Value::Number(n) => n.as_i64().unwrap(),
            Value::String(s) => s.parse().unwrap(),
            _ => unreachable!(),
        };
        let (feed, sink) = &mut lab.sinks[0];
        feed.seal(&recs);
        deliver(feed, sink).await.unwrap();
        let got = lab.rows(0).await.get(&key).cloned();
        if got.as_deref() != want {
            problems.push(format!("{recs:?}: row {key} is {got:?}, want {want:?}"));
        }
    }
    lab.drop_schema().await;
    assert!(problems.is_empty(), "{problems:#?}");
}

// ---------------------------------------------------------------------------------------
// Random histories.

struct GenCfg {
    tables: usize,
    keys: i64,
    events: usize,
    /// Snapshot reads per table at the start (all at one position).
    snapshot: i64,
    /// Per mille of events: key change, delete, truncate, read again, create of a live key.
    keychange: u32,
    delete: u32,
    truncate: u32,
    reread: u32,
    stray_create: u32,
    /// Per mille of events that reuse the previous position.
    equal: u32,
    /// Whether a key may have two events at one position (one by one the second of them then
    /// changes nothing, so the source's idea of which keys are live drifts from the replica).
    equal_same_key: bool,
    /// Per mille of updates that carry a partial image.
    partial: u32,
}

/// A source history: consistent (each key's changes in order) unless the stray events are on.
fn history(cfg: &GenCfg, rng: &mut fastrand::Rng) -> Vec<Ev> {
    let mut out = Vec::new();
    let mut alive: Vec<BTreeSet<i64>> = vec![BTreeSet::new(); cfg.tables];
    let mut serial = 0u64;
    let mut val = |p: &str| {
        serial += 1;
        format!("{p}{serial}")
    };
    let snap_pos = 1_000_000u64;
    for (tbl, live) in alive.iter_mut().enumerate() {
        for k in 0..cfg.snapshot {
            out.push(r(tbl, snap_pos, k, &val("r")));
            live.insert(k);
        }
    }
    let mut pos = snap_pos - 500;
    let mut last_trunc = false;
    let mut at_pos: BTreeSet<(usize, i64)> = BTreeSet::new();
    while out.len() < cfg.events {
        let tbl = rng.usize(..cfg.tables);
        let k = rng.i64(0..cfg.keys);
        if last_trunc
            || rng.u32(..1000) >= cfg.equal
            || (!cfg.equal_same_key && at_pos.contains(&(tbl, k)))
        {
            pos += 1 + rng.u64(..3);
            at_pos.clear();
        }
        // A key change also touches its new key: kept apart by taking the next position.
        at_pos.insert((tbl, k));
        last_trunc = false;
        let roll = rng.u32(..1000);
        let live = &mut alive[tbl];
        let mut th = cfg.truncate;
        if roll < th {
            pos += 1;
            out.push(t(tbl, pos));
            live.clear();
            last_trunc = true;
            continue;
        }
        th += cfg.reread;
        if roll < th {
            if !live.is_empty() {
                let k = *live.iter().nth(rng.usize(..live.len())).unwrap();
                out.push(r(tbl, snap_pos + 100_000 + rng.u64(..10), k, &val("rr")));
            }
            continue;
        }
        th += cfg.stray_create;
        if roll < th {
            out.push(c(tbl, pos, k, &val("sc")));
            live.insert(k);
            continue;
        }
        if !live.contains(&k) {
            out.push(c(tbl, pos, k, &val("c")));
            live.insert(k);
            continue;
        }
        th += cfg.delete;
        if roll < th {
            out.push(d(tbl, pos, k));
            live.remove(&k);
            continue;
        }
        th += cfg.keychange;
        if roll < th {
            let j = rng.i64(0..cfg.keys);
            if !live.contains(&j) && (cfg.equal_same_key || at_pos.insert((tbl, j))) {
                out.push(kc(tbl, pos, k, j, &val("kc")));
                live.remove(&k);
                live.insert(j);
                continue;
            }
        }
        let mut e = u(tbl, pos, k, &val("u"));
        e.partial = rng.u32(..1000) < cfg.partial;
        out.push(e);
    }
    out
}

struct Delivery {
    /// Epoch sizes between these.
    min: usize,
    max: usize,
    /// Per mille of epochs that begin earlier than where the last one ended.
    rewind: u32,
    /// How far back a rewind reaches (events).
    rewind_max: usize,
    /// Per mille of events sent again later in the same epoch.
    dup: u32,
    /// Per mille of epochs after which the next sink takes over.
    switch: u32,
    sinks: usize,
}

fn deliveries(hist: &[Ev], dcfg: &Delivery, rng: &mut fastrand::Rng) -> Vec<(usize, Vec<Ev>)> {
    let mut out = Vec::new();
    let mut i = 0;
    let mut sink = 0;
    while i < hist.len() {
        let mut start = i;
        if i > 0 && rng.u32(..1000) < dcfg.rewind {
            start = i.saturating_sub(1 + rng.usize(..dcfg.rewind_max));
        }
        let end = (i + rng.usize(dcfg.min..=dcfg.max)).min(hist.len());
        let mut e: Vec<Ev> = hist[start..end].to_vec();
        if dcfg.dup > 0 {
            let mut j = 0;
            while j < e.len() {
                if rng.u32(..1000) < dcfg.dup {
                    let at = rng.usize(j + 1..=e.len());
                    let ev = e[j].clone();
                    e.insert(at, ev);
                }
                j += 1;
            }
        }
        out.push((sink, e));
        if rng.u32(..1000) < dcfg.switch {
            sink = (sink + 1) % dcfg.sinks;
        }
        i = end;
    }
    out
}

/// Dropped deliveries: [not committed before the drop, committed before it].
static DROPS: [std::sync::atomic::AtomicUsize; 2] = [
    std::sync::atomic::AtomicUsize::new(0),
    std::sync::atomic::AtomicUsize::new(0),
];

/// The problems and totals of a sweep of random runs.
#[derive(Default)]
struct Tally {
    problems: Vec<String>,
    events: usize,
    epochs: usize,
}

impl Tally {
    /// Counts a run of `events` events in `epochs` epochs; its failure is a problem. Whether
    /// it succeeded.
    fn ran(&mut self, res: Result<(), String>, events: usize, epochs: usize) -> bool {
        self.events += events;
        self.epochs += epochs;
        match res {
            Ok(()) => true,
            Err(e) => {
                self.problems.push(e);
                false
            }
        }
    }

    /// Prints the totals and fails with every problem.
    fn end(self, label: &str) {
        println!("{label}: {} events in {} epochs", self.events, self.epochs);
        assert!(self.problems.is_empty(), "{:#?}", self.problems);
    }
}

/// Runs one random history; returns the problem (with a reproduction's description) if any.
async fn random_run(
    tag: &str,
    params: &str,
    seed: u64,
    g: &GenCfg,
    dl: &Delivery,
    admin_rows: usize,
    drops: bool,
) -> (Result<(), String>, Stats, usize, usize) {
    let mut rng = fastrand::Rng::with_seed(seed);
    let hist = history(g, &mut rng);
    let eps = deliveries(&hist, dl, &mut rng);
    let n_events: usize = eps.iter().map(|(_, e)| e.len()).sum();
    let n_eps = eps.len();
    let mut lab = Lab::new(tag, dl.sinks, params).await;
    let mut res = Ok(());
    // The sinks meet the tables first (the hidden column is added), so rows can be written
    // outside the stream.
    if admin_rows > 0 {
        for s in 0..dl.sinks {
            let e: Vec<Ev> = (0..g.tables).map(|tb| d(tb, 1 + s as u64, -1)).collect();
            if let Err(e) = run_epochs(&mut lab, &[(s, e)]).await {
                res = Err(e);
            }
        }
    }
    let mut admin_done = BTreeSet::new();
    for (n, (s, evs)) in eps.iter().enumerate() {
        if res.is_err() {
            break;
        }
        // Rows written outside the stream: keys the replica never saw, about to be created.
        if admin_rows > 0 && n % 3 == 1 {
            let mut added = 0;
            for e in evs.iter() {
                if added >= admin_rows {
                    break;
                }
                if let (Some((k, _)), 'c') = (&e.after, e.op) {
                    let m = &lab.model.tables[e.tbl];
                    if !m.rows.contains_key(k)
                        && !m.tombs.contains_key(k)
                        && admin_done.insert((e.tbl, *k))
                        && rng.bool()
                    {
                        lab.admin_insert(e.tbl, *k, &format!("outside{k}")).await;
                        added += 1;
                    }
                }
            }
        }
        if drops && rng.bool() {
            // A delivery dropped part way (the future dropped after a few ms): the next one
            // delivers the epoch whole.
            let recs: Vec<String> = evs.iter().map(Ev::json).collect();
            let (feed, sink) = &mut lab.sinks[*s];
            feed.seal(&recs);
            let cut = Duration::from_micros(500 + rng.u64(..20_000));
            let before = sink.stats();
            let _ = tokio::time::timeout(cut, walsink_tokio::deliver_ready(&feed.wal, sink)).await;
            let mid = sink.stats();
            let done = mid.epochs > before.epochs;
            DROPS[usize::from(done)].fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            if let Err(e) = deliver(feed, sink).await {
                res = Err(format!(
                    "seed {seed}: epoch {n} after a dropped delivery: {e}"
                ));
                break;
            }
            let after = sink.stats();
            let (ep, evn) = (after.epochs - before.epochs, after.events - before.events);
            if ep != 1 || evn != evs.len() as u64 {
                res = Err(format!(
                    "seed {seed}: epoch {n} after a dropped delivery (committed before the \
                     drop: {done}): epochs +{ep}, events +{evn} (want +1, +{})",
                    evs.len()
                ));
                break;
            }
            lab.model.apply(evs);
            lab.history.push((*s, evs.clone()));
            let diff = lab.check().await;
            if !diff.is_empty() {
                res = Err(format!(
                    "seed {seed}: epoch {n} after a dropped delivery: {} differences, first: {:?}",
                    diff.len(),
                    &diff[..diff.len().min(8)]
                ));
            }
            continue;
        }
        if let Err(e) = run_epochs(&mut lab, &[(*s, evs.clone())]).await {
            let prev = if n > 0 { eps[n - 1].1.len() } else { 0 };
            res = Err(format!(
                "seed {seed}: epoch {n} of {n_eps} (previous epoch {prev} events): {e}"
            ));
        }
    }
    let mut st = Stats::default();
    for (_, s) in &lab.sinks {
        let x = s.stats();
        st.sent += x.sent;
        st.unguarded += x.unguarded;
        st.inserts += x.inserts;
        st.refused_tables += x.refused_tables;
        st.epochs += x.epochs;
        st.events += x.events;
    }
    if res.is_err() {
        // Keep the failing epoch's neighbourhood for a reproduction.
        if let Some((s, e)) = lab.history.last() {
            eprintln!(
                "last epoch applied (sink {s}): {}",
                show(&e[..e.len().min(60)])
            );
        }
    }
    lab.drop_schema().await;
    (res, st, n_events, n_eps)
}

/// `n` seeds, times `P11_SCALE` (default 1) for longer sweeps.
fn seeds(n: u64) -> u64 {
    n * std::env::var("P11_SCALE")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1)
}

fn small_gen(tables: usize, keys: i64, events: usize) -> GenCfg {
    GenCfg {
        tables,
        keys,
        events,
        snapshot: keys / 4,
        keychange: 60,
        delete: 150,
        truncate: 2,
        reread: 0,
        stray_create: 0,
        equal: 100,
        equal_same_key: true,
        partial: 0,
    }
}

/// In-order, consistent streams (no replays, no duplicates, no strays, one sink), small
/// windows: every history equals the model, and the docs' claims for an in-order upstream
/// hold: no table is refused, and with no equal positions and no truncates every statement is
/// unguarded.
#[tokio::test]
#[cfg_attr(
    not(servers),
    ignore = "needs WALSINK_TEST_SERVERS=1 and a local PostgreSQL"
)]
async fn random_in_order_streams_are_never_refused() {
    let mut tally = Tally::default();
    for seed in 0..seeds(10) {
        let strict = seed % 2 == 0;
        let mut g = small_gen(1 + (seed as usize % 3), 30 + 20 * seed as i64, 1500);
        g.snapshot = if strict { 0 } else { 10 };
        g.equal_same_key = false;
        g.partial = 30;
        if strict {
            // Equal positions and truncates put runs under the guard by the rule; key
            // changes do not (a flush takes both keys of one).
            g.equal = 0;
            g.truncate = 0;
        }
        let dl = Delivery {
            min: 50,
            max: 400,
            rewind: 0,
            rewind_max: 1,
            dup: 0,
            switch: 0,
            sinks: 1,
        };
        let params = format!("&max_held={}", 3 + seed * 7);
        let (res, st, ne, np) = random_run("ino", &params, 1100 + seed, &g, &dl, 0, false).await;
        if !tally.ran(res, ne, np) {
            continue;
        }
        if st.refused_tables != 0 {
            tally.problems.push(format!(
                "seed {}: in-order stream refused: {st:?}",
                1100 + seed
            ));
        }
        if strict && st.unguarded != st.sent {
            tally.problems.push(format!(
                "seed {}: strict in-order stream went guarded: {st:?}",
                1100 + seed
            ));
        }
        if st.inserts == 0 {
            tally
                .problems
                .push(format!("seed {}: no plain inserts: {st:?}", 1100 + seed));
        }
    }
    tally.end("in-order");
}

/// Messy deliveries of small epochs in tiny windows: rewinds across epochs, duplicates in an
/// epoch (far apart), equal positions, reads again with new positions, creates of live keys,
/// key changes, truncates, several tables, and two or three sinks in turn on the schema.
#[tokio::test]
#[cfg_attr(
    not(servers),
    ignore = "needs WALSINK_TEST_SERVERS=1 and a local PostgreSQL"
)]
async fn random_messy_small_windows() {
    let mut tally = Tally::default();
    for seed in 0..seeds(20) {
        let mut g = small_gen(1 + (seed as usize % 3), 20 + 15 * (seed as i64 % 5), 1200);
        g.reread = 10;
        g.partial = 40;
        g.stray_create = 5 * (seed as u32 % 3);
        g.truncate = if seed % 4 == 3 { 0 } else { 4 };
        let dl = Delivery {
            min: 20,
            max: 250,
            rewind: 300,
            rewind_max: 200,
            dup: 15,
            switch: if seed % 2 == 0 { 250 } else { 0 },
            sinks: 1 + (seed as usize % 3),
        };
        let params = format!("&max_held={}", 2 + seed * 5);
        let admin = if g.truncate == 0 { 2 } else { 0 };
        let (res, _st, ne, np) =
            random_run("messy", &params, 2200 + seed, &g, &dl, admin, false).await;
        tally.ran(res, ne, np);
    }
    tally.end("messy");
}

/// Large epochs (above 8 192 events, so the window is over 2 048 and only the keys left alone
/// longest are sent): in-order with rewinds and duplicates far apart, several tables, and a
/// window of `max_held` just above 2 048 so most flushes leave keys held.
#[tokio::test]
#[cfg_attr(
    not(servers),
    ignore = "needs WALSINK_TEST_SERVERS=1 and a local PostgreSQL"
)]
async fn random_large_epochs_partial_flushes() {
    let mut tally = Tally::default();
    for seed in 0..seeds(4) {
        let mut g = small_gen(1 + (seed as usize % 2), 4000, 30_000);
        g.snapshot = 300;
        g.keychange = 20;
        g.delete = 80;
        g.truncate = if seed == 1 { 1 } else { 0 };
        g.equal = if seed % 2 == 0 { 0 } else { 50 };
        g.reread = if seed == 2 { 2 } else { 0 };
        g.partial = if seed == 1 { 10 } else { 0 };
        let dl = Delivery {
            min: 9000,
            max: 14000,
            rewind: if seed == 0 { 0 } else { 500 },
            rewind_max: 6000,
            dup: if seed == 0 { 0 } else { 2 },
            switch: if seed == 3 { 500 } else { 0 },
            sinks: if seed == 3 { 2 } else { 1 },
        };
        let params = if seed % 2 == 0 { "&max_held=2100" } else { "" };
        let (res, st, ne, np) = random_run("large", params, 3300 + seed, &g, &dl, 0, false).await;
        println!("seed {}: {st:?}", 3300 + seed);
        if !tally.ran(res, ne, np) {
            continue;
        }
        if seed == 0 && (st.refused_tables != 0 || st.unguarded != st.sent) {
            tally
                .problems
                .push(format!("seed 3300 (in order, no equal positions): {st:?}"));
        }
    }
    tally.end("large");
}

/// An in-order key change at a flush's end: its two keys (one rank) go in one flush, so the
/// next flush's run sends ranks above the high-water and goes unguarded (it went guarded when
/// the two keys were split over two flushes). Rows as one by one.
#[tokio::test]
#[cfg_attr(
    not(servers),
    ignore = "needs WALSINK_TEST_SERVERS=1 and a local PostgreSQL"
)]
async fn an_in_order_key_change_at_a_flush_end() {
    let mut out = Vec::new();
    for mh in [2, 3, 4] {
        let mut lab = Lab::new("kcx", 1, &format!("&max_held={mh}")).await;
        let e0: Vec<Ev> = (1..=5).map(|k| c(0, k as u64, k, "c")).collect();
        let e1 = vec![
            c(0, 20, 10, "c10"),
            kc(0, 21, 1, 11, "kc"),
            c(0, 22, 12, "c12"),
        ];
        let res = run_epochs(&mut lab, &[(0, e0), (0, e1)]).await;
        let st = lab.sinks[0].1.stats();
        out.push(format!("max_held {mh}: {st:?}"));
        lab.drop_schema().await;
        res.unwrap();
        // A key change's delete and upsert go in one flush: a flush ending between them put
        // the next one at the rank the first raised the high-water to, under the guard.
        assert_eq!(st.unguarded, st.sent, "max_held {mh}: {st:?}");
    }
    println!("{out:#?}");
}

/// The high-water covers tombstones of keys that had no row, truncate watermarks of an empty
/// table, and reads: a later epoch's older create (a rewind) must stay refused.
#[tokio::test]
#[cfg_attr(
    not(servers),
    ignore = "needs WALSINK_TEST_SERVERS=1 and a local PostgreSQL"
)]
async fn high_water_covers_tombstones_watermarks_and_reads() {
    let mut lab = Lab::new("hw", 1, "&max_held=3").await;
    let eps = vec![
        // Deletes of keys the replica never held, a truncate of an empty table, reads.
        (
            0,
            vec![d(0, 100, 1), d(0, 101, 2), t(1, 100), r(2, 100, 1, "r1")],
        ),
        // Older creates (a rewind), in order among themselves, and above nothing sent.
        (
            0,
            vec![
                c(0, 50, 1, "old1"),
                c(0, 51, 2, "old2"),
                c(0, 52, 3, "new3"),
                c(1, 50, 1, "old1"),
                c(1, 99, 2, "old2"),
                r(2, 99, 2, "r2"),
                r(2, 99, 1, "r1-older"),
            ],
        ),
        (
            0,
            vec![
                c(0, 60, 1, "old1b"),
                u(0, 70, 1, "old1c"),
                c(1, 100, 3, "eq"),
            ],
        ),
        // Above them: applies.
        (0, vec![c(0, 102, 1, "new1"), c(1, 101, 2, "new2")]),
    ];
    let res = run_epochs(&mut lab, &eps).await;
    lab.drop_schema().await;
    res.unwrap();
}

/// Rows written before walsink met the table (the guard's column is added by the sink, and
/// the epoch applied again), then the stream creates some of their keys in order: the plain
/// inserts meet them, the epoch is applied again with upserts; the other table, whose keys are
/// new, keeps its plain inserts.
#[tokio::test]
#[cfg_attr(
    not(servers),
    ignore = "needs WALSINK_TEST_SERVERS=1 and a local PostgreSQL"
)]
async fn rows_from_before_walsink_met_by_created_keys() {
    let mut lab = Lab::new("pre", 1, "&max_held=5").await;
    lab.admin
        .batch_execute(&format!(
            "INSERT INTO {s}.ta SELECT g, 'pre' || g, g * 3 FROM generate_series(1, 40) g;",
            s = lab.schema
        ))
        .await
        .unwrap();
    for k in 1..=40 {
        lab.model.tables[0]
            .rows
            .insert(k, (format!("pre{k}"), None));
    }
    let mut e = Vec::new();
    for k in 30..60 {
        e.push(c(0, 10 + 2 * k as u64, k, &format!("c{k}")));
        e.push(c(1, 11 + 2 * k as u64, k, &format!("c{k}")));
    }
    let res = run_epochs(&mut lab, &[(0, e)]).await;
    let st = lab.sinks[0].1.stats();
    lab.drop_schema().await;
    res.unwrap();
    assert_eq!(st.refused_tables, 1, "{st:?}");
    assert!(st.inserts > 0, "tb lost its plain inserts: {st:?}");
}

/// Messy deliveries with the default window (first flush at 512 held, then 2 048 at a time):
/// epochs of 300 to 3 000 events, rewinds, duplicates, equal positions, reads again, creates
/// of live keys, partial images, truncates or rows written outside, sinks in turn, and
/// deliveries dropped part way and delivered again.
#[tokio::test]
#[cfg_attr(
    not(servers),
    ignore = "needs WALSINK_TEST_SERVERS=1 and a local PostgreSQL"
)]
async fn random_messy_default_window_and_dropped_deliveries() {
    let mut tally = Tally::default();
    for seed in 0..seeds(8) {
        let mut g = small_gen(1 + (seed as usize % 3), 300 + 400 * (seed as i64 % 4), 9000);
        g.snapshot = 200;
        g.reread = 3;
        g.partial = 20;
        g.stray_create = 2 * (seed as u32 % 2);
        g.truncate = if seed % 2 == 1 { 0 } else { 1 };
        g.equal = 50 * (seed as u32 % 3);
        let dl = Delivery {
            min: 300,
            max: 3000,
            rewind: 400,
            rewind_max: 1500,
            dup: 3,
            switch: if seed % 4 < 2 { 300 } else { 0 },
            sinks: 1 + (seed as usize % 2),
        };
        let admin = if g.truncate == 0 { 3 } else { 0 };
        let (res, st, ne, np) = random_run("mdw", "", 4400 + seed, &g, &dl, admin, seed >= 2).await;
        println!("seed {}: {st:?}", 4400 + seed);
        tally.ran(res, ne, np);
    }
    tally.end(&format!(
        "default window (dropped deliveries, not committed and committed: {DROPS:?})"
    ));
}

/// Extreme positions: a read at 2^63 - 1 ranks below a streamed change at 0; the high-water
/// after reads only, then streamed creates and updates at the lowest positions, then the reads
/// again (they change nothing), then a truncate at 1 and creates above it.
#[tokio::test]
#[cfg_attr(
    not(servers),
    ignore = "needs WALSINK_TEST_SERVERS=1 and a local PostgreSQL"
)]
async fn extreme_positions() {
    let top = (1u64 << 63) - 1;
    let mut lab = Lab::new("ext", 1, "&max_held=2").await;
    let eps = vec![
        (
            0,
            vec![
                r(0, top, 1, "r1"),
                r(0, top, 2, "r2"),
                r(0, top - 1, 3, "r3"),
            ],
        ),
        (
            0,
            vec![
                c(0, 0, 4, "c4"),
                u(0, 0, 1, "u1"),
                r(0, top, 5, "r5"),
                c(0, 0, 6, "c6"),
            ],
        ),
        (
            0,
            vec![
                r(0, top, 1, "r1again"),
                r(0, top, 2, "r2again"),
                r(0, top, 3, "r3again"),
            ],
        ),
        (
            0,
            vec![
                t(0, 1),
                c(0, 1, 7, "c7-at-truncate"),
                c(0, 2, 8, "c8"),
                c(0, top, 9, "c9"),
            ],
        ),
        (
            0,
            vec![c(0, top - 1, 10, "c10-below-high"), r(0, top, 11, "r11")],
        ),
    ];
    let res = run_epochs(&mut lab, &eps).await;
    lab.drop_schema().await;
    res.unwrap();
}
