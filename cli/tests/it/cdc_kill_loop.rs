//! The kill loop of issue #30's "Done when": `walsink cdc --source` from a logical slot on a
//! private cluster (`wal_level=logical`), SIGKILLed at random moments at least 15 times while
//! a writer does random inserts, updates (key changes among them) and deletes, and restarted
//! after each kill. The captured tables hold a `json` column whose values have odd spacing
//! and duplicate keys (`{"b":1,  "a":2, "a":3}`), a stored generated column, quoted
//! mixed-case table and column names, and numeric with scale, jsonb (`null` among it),
//! timestamptz (infinity and BC), bytea, arrays, an enum, interval, inet, money, ranges and
//! unicode text. Mid-run, with the writer going on, a column is added to a captured table
//! and another dropped (docs/targets/cdc.md, "Schema changes", says both are followed).
//! After the writer stops and a last run without `--follow` catches up, the test proves that
//! the replica equals the source in every table: the same columns (names and types, the
//! generated column generated), `EXCEPT ALL` empty both ways, and every row's text form
//! (`ROW(col, ...)::text`, each value through its type's output function) the same multiset.
//! It also asserts how many kills landed in a run that was doing work.
//!
//! After the 15th landed kill a third table, `"Added Later"` (a `json` column with duplicate
//! keys, a stored generated column, 2,000 rows), is created and added to the runs' `tables=`
//! ([`add_table_to_tables`]); the writer changes it from then on, so its snapshot is taken on
//! resume while it changes and under the remaining kills, and it is compared as the others.
//!
//! Needs WALSINK_TEST_SERVERS=1 and the PostgreSQL binaries (it says it is skipped
//! otherwise). WALSINK_KILL_SEED=N repeats a run's random choices.

use crate::common::*;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use walsink_cdc::tokio_postgres::{self, NoTls, SimpleQueryMessage};
use walsink_postgres::testkit::Cluster;

fn servers(name: &str) -> bool {
    if std::env::var("WALSINK_TEST_SERVERS").as_deref() == Ok("1") {
        true
    } else {
        eprintln!("{name}: skipped (needs WALSINK_TEST_SERVERS=1 and PostgreSQL)");
        false
    }
}

type Rows = Vec<Vec<Option<String>>>;

/// Runs `sql` (simple protocol) on `url`; every row as text.
fn try_q(url: &str, sql: &str) -> Result<Rows, tokio_postgres::Error> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let (c, conn) = tokio_postgres::connect(url, NoTls).await?;
        let h = tokio::spawn(conn);
        let r = c.simple_query(sql).await;
        drop(c);
        let _ = h.await;
        let mut out = Vec::new();
        for m in r? {
            if let SimpleQueryMessage::Row(row) = m {
                out.push(
                    (0..row.len())
                        .map(|i| row.get(i).map(str::to_string))
                        .collect(),
                );
            }
        }
        Ok(out)
    })
}

fn q(url: &str, sql: &str) -> Rows {
    try_q(url, sql).unwrap_or_else(|e| panic!("{sql}: {e:?}"))
}

fn one(url: &str, sql: &str) -> String {
    q(url, sql)[0][0].clone().unwrap_or_else(|| "NULL".into())
}

// ---------------------------------------------------------------------------------------
// The source tables and the writer.
// ---------------------------------------------------------------------------------------

const SCHEMA: &str = r#"
CREATE TYPE mood AS ENUM ('sad', 'ok', 'happy 🙂');
CREATE SEQUENCE ids START 100000;
CREATE TABLE "Orders" (
    "Id" bigint PRIMARY KEY,
    "Qty" int NOT NULL,
    price numeric(12,3),
    "Total" numeric GENERATED ALWAYS AS ("Qty" * price) STORED,
    doc json,
    meta jsonb,
    "At" timestamptz,
    raw bytea,
    tags text[],
    nums int[],
    m mood,
    iv interval,
    ip inet,
    cash money,
    span int4range,
    during tstzrange,
    "Note" text,
    drop_me text
);
CREATE TABLE "Kv Store" ("K" text PRIMARY KEY, v json, n numeric(20,6), at timestamptz, e mood[]);
"#;

/// The `json` texts the writer uses: odd spacing, duplicate keys, key order, scalars.
const JSONS: &[&str] = &[
    r#"'{"b":1,  "a":2, "a":3}'"#,
    r#"'  [1,  2 ,3.50 ]  '"#,
    r#"'{"x" : null,"y":{"z" :[ ]}}'"#,
    "'null'",
    r#"'"str\u00e9 🙂"'"#,
    "'12.500'",
    "NULL",
];
const JSONBS: &[&str] = &[
    "'null'",
    r#"'{"a": 1, "b": [true, null]}'"#,
    "'[]'",
    r#"'"x"'"#,
    "NULL",
];
const TIMES: &[&str] = &[
    "'infinity'",
    "'-infinity'",
    "'0044-03-15 12:00:00+00 BC'",
    "'2024-03-31 02:30:00.123456+02'",
    "now()",
    "NULL",
];
const BYTEAS: &[&str] = &[
    "'\\x00ff10'",
    "''",
    "decode(md5(random()::text), 'hex')",
    "NULL",
];
const TAGS: &[&str] = &[
    "ARRAY['a', NULL, 'b,c', '\"q\"']",
    "'{}'::text[]",
    "ARRAY['ünï', 'x y']",
    "NULL",
];
const NUMS: &[&str] = &[
    "ARRAY[1, 2, NULL]",
    "'{{1,2},{3,4}}'::int[]",
    "'{}'",
    "NULL",
];
const MOODS: &[&str] = &["'sad'", "'ok'", "'happy 🙂'", "NULL"];
const IVS: &[&str] = &[
    "'1 mon 2 days 03:04:05.5'",
    "'-178000000 years'",
    "'0'",
    "NULL",
];
const IPS: &[&str] = &["'10.1.2.3/8'", "'::1'", "'192.168.0.1'", "NULL"];
const CASH: &[&str] = &["12.34", "-0.01", "1000000", "NULL"];
const SPANS: &[&str] = &["'[1,10)'", "'empty'", "'(,5]'", "NULL"];
const DURINGS: &[&str] = &[
    "'[2024-01-01 00:00+00, infinity)'",
    "'empty'",
    "'(,2020-02-29 12:00+05]'",
    "NULL",
];
const NOTES: &[&str] = &[
    "E'line1\\nline2 \"q\" ''s'' \\\\ \\t tab'",
    "'🙂 ünï ℵ'",
    "''",
    "repeat('long ', 3000)",
    "NULL",
];
const PRICES: &[&str] = &["1.5", "0.001", "-99999.999", "7", "NULL"];

/// What the writer's schema changes have reached (the writer runs them itself).
const PHASE_START: u8 = 0;
const PHASE_ADD: u8 = 1;
const PHASE_DROP: u8 = 2;

fn pick(rng: &mut fastrand::Rng, v: &[&str]) -> String {
    v[rng.usize(..v.len())].to_string()
}

/// The `"Orders"` columns the writer sets (not the key, not the generated one), with a value
/// for each, as the table has them in `phase`.
fn order_values(rng: &mut fastrand::Rng, phase: u8) -> Vec<(&'static str, String)> {
    let mut v = vec![
        ("\"Qty\"", rng.i32(-5..1000).to_string()),
        ("price", pick(rng, PRICES)),
        ("doc", pick(rng, JSONS)),
        ("meta", pick(rng, JSONBS)),
        ("\"At\"", pick(rng, TIMES)),
        ("raw", pick(rng, BYTEAS)),
        ("tags", pick(rng, TAGS)),
        ("nums", pick(rng, NUMS)),
        ("m", pick(rng, MOODS)),
        ("iv", pick(rng, IVS)),
        ("ip", pick(rng, IPS)),
        ("cash", pick(rng, CASH)),
        ("span", pick(rng, SPANS)),
        ("during", pick(rng, DURINGS)),
        ("\"Note\"", pick(rng, NOTES)),
    ];
    if phase < PHASE_DROP {
        v.push(("drop_me", pick(rng, &["'keep'", "'to be dropped'", "NULL"])));
    }
    if phase >= PHASE_ADD {
        v.push(("\"Added\"", pick(rng, &["123.45", "-0.5", "0", "NULL"])));
    }
    v
}

/// One random source transaction (SQL text).
fn writer_txn(rng: &mut fastrand::Rng, phase: u8) -> String {
    let mut body = Vec::new();
    for _ in 0..rng.usize(1..=3) {
        let r = rng.i64(0..200_000);
        let opick =
            format!(r#"(SELECT "Id" FROM "Orders" WHERE "Id" >= {r} ORDER BY "Id" LIMIT 1)"#);
        let kpick = format!(
            r#"(SELECT "K" FROM "Kv Store" WHERE "K" >= 'k{}' ORDER BY "K" LIMIT 1)"#,
            r % 3000
        );
        let roll = rng.u32(0..100);
        let sql = if roll < 30 {
            let vals = order_values(rng, phase);
            let cols: Vec<&str> = vals.iter().map(|(c, _)| *c).collect();
            let vs: Vec<String> = vals.into_iter().map(|(_, v)| v).collect();
            format!(
                r#"INSERT INTO "Orders" ("Id", {}) VALUES (nextval('ids'), {})"#,
                cols.join(", "),
                vs.join(", ")
            )
        } else if roll < 55 {
            let mut vals = order_values(rng, phase);
            rng.shuffle(&mut vals);
            vals.truncate(rng.usize(1..=4));
            let set: Vec<String> = vals.iter().map(|(c, v)| format!("{c} = {v}")).collect();
            format!(
                r#"UPDATE "Orders" SET {} WHERE "Id" = {opick}"#,
                set.join(", ")
            )
        } else if roll < 60 {
            // a primary-key change
            format!(
                r#"UPDATE "Orders" SET "Id" = nextval('ids'), "Qty" = "Qty" + 1 WHERE "Id" = {opick}"#
            )
        } else if roll < 70 {
            format!(r#"DELETE FROM "Orders" WHERE "Id" = {opick}"#)
        } else if roll < 82 {
            format!(
                r#"INSERT INTO "Kv Store" VALUES ('k{}' || {}, {}, {}, {}, ARRAY[{}]::mood[])
                   ON CONFLICT ("K") DO UPDATE SET v = EXCLUDED.v, n = EXCLUDED.n"#,
                r % 3000,
                pick(rng, &["''", "'-x'", "' ü'"]),
                pick(rng, JSONS),
                pick(rng, &["1.500000", "0.000001", "-123456.1", "NULL"]),
                pick(rng, TIMES),
                pick(rng, MOODS),
            )
        } else if roll < 92 {
            format!(
                r#"UPDATE "Kv Store" SET v = {}, at = {} WHERE "K" = {kpick}"#,
                pick(rng, JSONS),
                pick(rng, TIMES)
            )
        } else {
            format!(r#"DELETE FROM "Kv Store" WHERE "K" = {kpick}"#)
        };
        body.push(sql);
    }
    format!("BEGIN; {}; COMMIT;", body.join("; "))
}

/// The mid-run schema changes, run by the writer between its transactions.
fn schema_change(phase: u8) -> &'static str {
    match phase {
        PHASE_ADD => r#"ALTER TABLE "Orders" ADD COLUMN "Added" numeric(5,2)"#,
        PHASE_DROP => r#"ALTER TABLE "Orders" DROP COLUMN drop_me"#,
        _ => unreachable!("no schema change for phase {phase}"),
    }
}

/// The table added to `tables=` of the running pipeline: created and filled on the source,
/// then put in the next runs' `tables=` (docs/targets/cdc.md, "Changing `tables=`": it is
/// added to the publication and snapshotted on resume).
const ADDED: &str = r#"
CREATE TABLE "Added Later" (
    "Key" int PRIMARY KEY,
    doc json,
    "N" numeric(8,3),
    "Twice" numeric GENERATED ALWAYS AS ("N" * 2) STORED,
    note text
);
INSERT INTO "Added Later" ("Key", doc, "N", note)
    SELECT g, ('{"z":' || g || ',  "a": 1, "a": 2}')::json, g / 3.0, 'before ' || g
    FROM generate_series(1, 2000) g;
"#;

fn add_table_to_tables(source: &str, mut tables: Vec<String>) -> Vec<String> {
    q(source, ADDED);
    tables.push("\"Added Later\"".into());
    tables
}

/// One change of the added table: an insert or re-insert, an update, or a delete.
fn added_change(rng: &mut fastrand::Rng) -> String {
    let k = rng.i32(1..3000);
    match rng.u8(0..3) {
        0 => format!(
            r#"INSERT INTO "Added Later" ("Key", doc, "N", note) VALUES ({k}, '{{"k": {k},   "k": {}}}'::json, {}.125, 'new')
               ON CONFLICT ("Key") DO UPDATE SET note = 'again', "N" = EXCLUDED."N""#,
            rng.u32(..100),
            rng.u32(..10_000)
        ),
        1 => format!(
            r#"UPDATE "Added Later" SET "N" = "N" + 1, doc = '{{"u":  {k}}}'::json WHERE "Key" = {k}"#
        ),
        _ => format!(r#"DELETE FROM "Added Later" WHERE "Key" = {k}"#),
    }
}

// ---------------------------------------------------------------------------------------
// The comparison.
// ---------------------------------------------------------------------------------------

/// Each column of `schema.table` as `name type [generated expression]`, in column order.
fn columns(url: &str, schema: &str, table: &str) -> Vec<String> {
    q(
        url,
        &format!(
            "SELECT a.attname || ' ' || format_type(a.atttypid, a.atttypmod) || \
                    CASE a.attgenerated WHEN 's' THEN ' generated ' || pg_get_expr(d.adbin, d.adrelid) ELSE '' END \
             FROM pg_attribute a LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum \
             WHERE a.attrelid = format('%I.%I', '{schema}', '{table}')::regclass AND a.attnum > 0 AND NOT a.attisdropped \
             ORDER BY a.attnum"
        ),
    )
    .into_iter()
    .map(|r| r[0].clone().unwrap())
    .collect()
}

/// Compares `public.table` with `replica.table`; returns what differs (empty when equal) and
/// the source's row count.
fn compare(url: &str, table: &str) -> (Vec<String>, usize) {
    let mut bad = Vec::new();
    let src_cols = columns(url, "public", table);
    // The replica's own guard column (`_walsink_pos`, docs/targets/cdc.md) aside.
    let rep_cols: Vec<String> = columns(url, "replica", table)
        .into_iter()
        .filter(|c| c != "_walsink_pos bigint")
        .collect();
    if src_cols != rep_cols {
        bad.push(format!(
            "{table}: columns differ: source {src_cols:?}, replica {rep_cols:?}"
        ));
    }
    let names: Vec<(String, String)> = q(
        url,
        &format!(
            "SELECT quote_ident(attname), format_type(atttypid, NULL) FROM pg_attribute \
             WHERE attrelid = format('%I.%I', 'public', '{table}')::regclass AND attnum > 0 AND NOT attisdropped \
             ORDER BY attnum"
        ),
    )
    .into_iter()
    .map(|r| (r[0].clone().unwrap(), r[1].clone().unwrap()))
    .collect();
    // EXCEPT ALL on the values themselves (json has no equality: compared as its text).
    let typed: Vec<String> = names
        .iter()
        .map(|(n, t)| {
            if t == "json" {
                format!("{n}::text")
            } else {
                n.clone()
            }
        })
        .collect();
    let typed = typed.join(", ");
    let (s, r) = (
        format!("public.{}", quote(table)),
        format!("replica.{}", quote(table)),
    );
    for (a, b) in [(&s, &r), (&r, &s)] {
        let rows = q(
            url,
            &format!(
                "SELECT left(x::text, 400) FROM (SELECT {typed} FROM {a} EXCEPT ALL SELECT {typed} FROM {b}) x"
            ),
        );
        if !rows.is_empty() {
            bad.push(format!(
                "{table}: {} rows of {a} not in {b} (EXCEPT ALL), first {:?}",
                rows.len(),
                &rows[..rows.len().min(3)]
            ));
        }
    }
    // Every row's text form, each value through its type's output function.
    let row = names
        .iter()
        .map(|(n, _)| n.as_str())
        .collect::<Vec<_>>()
        .join(", ");
    let text = |t: &str| -> Vec<String> {
        let mut v: Vec<String> = q(url, &format!("SELECT ROW({row})::text FROM {t}"))
            .into_iter()
            .map(|r| r[0].clone().unwrap())
            .collect();
        v.sort();
        v
    };
    let (st, rt) = (text(&s), text(&r));
    if st != rt {
        let only_s: Vec<&String> = st.iter().filter(|x| !rt.contains(x)).take(3).collect();
        let only_r: Vec<&String> = rt.iter().filter(|x| !st.contains(x)).take(3).collect();
        bad.push(format!(
            "{table}: text forms differ ({} source rows, {} replica rows); only in source {:?}, only in replica {:?}",
            st.len(),
            rt.len(),
            only_s.iter().map(|x| x.chars().take(400).collect::<String>()).collect::<Vec<_>>(),
            only_r.iter().map(|x| x.chars().take(400).collect::<String>()).collect::<Vec<_>>()
        ));
    }
    (bad, st.len())
}

fn quote(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

// ---------------------------------------------------------------------------------------
// The loop.
// ---------------------------------------------------------------------------------------

/// What the replica's checkpoint markers say now (None before the first commit): a run that
/// committed anything changes it.
fn progress(url: &str) -> Option<String> {
    try_q(
        url,
        "SELECT md5(string_agg(metadata::text, ',' ORDER BY metadata::text)) FROM replica.walsink_markers",
    )
    .ok()
    .and_then(|r| r.first().and_then(|r| r[0].clone()))
}

const KILLS: u32 = 20;

#[test]
fn source_kill_loop_with_random_dml_and_schema_changes_ends_exact() {
    if !servers("source_kill_loop_with_random_dml_and_schema_changes_ends_exact") {
        return;
    }
    let seed: u64 = std::env::var("WALSINK_KILL_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| fastrand::u64(..));
    eprintln!("kill loop seed {seed} (WALSINK_KILL_SEED={seed} repeats it)");
    let started = Instant::now();
    let pg = Cluster::start(&[("wal_level", "logical")]).expect("private cluster");
    let url = pg.url("postgres");
    q(&url, SCHEMA);
    // The snapshot: rows before the slot exists.
    {
        let mut rng = fastrand::Rng::with_seed(seed ^ 0x5eed);
        let mut init = String::new();
        for _ in 0..400 {
            let vals = order_values(&mut rng, PHASE_START);
            let cols: Vec<&str> = vals.iter().map(|(c, _)| *c).collect();
            let vs: Vec<String> = vals.into_iter().map(|(_, v)| v).collect();
            init.push_str(&format!(
                "INSERT INTO \"Orders\" (\"Id\", {}) SELECT nextval('ids'), {} FROM generate_series(1, 5);\n",
                cols.join(", "),
                vs.join(", ")
            ));
        }
        init.push_str(
            r#"INSERT INTO "Kv Store" SELECT 'k' || g, ('{"g":' || g || ',  "g": 0}')::json, g / 7.0, now(), ARRAY['ok']::mood[]
               FROM generate_series(1, 1500) g;"#,
        );
        q(&url, &init);
    }
    let d = tempfile::tempdir().unwrap();
    let wal = d.path().join("wal");
    let tables = vec!["\"Orders\"".to_string(), "\"Kv Store\"".to_string()];
    let args = |tables: &[String], follow: bool| -> Vec<String> {
        let source = format!(
            "{url}?slot=kl&tables={}&snapshot_rows=250&read_changes=2000",
            tables.join(",")
        );
        let mut v: Vec<String> = [
            "cdc",
            "--source",
            &source,
            "--wal",
            s(&wal),
            "--sink",
            &format!("{url}?schema=replica"),
            "--quiet",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        if follow {
            v.push("--follow".into());
        }
        v
    };

    // The writer: random transactions, the schema changes when `phase` asks for them.
    let phase = Arc::new(AtomicU8::new(PHASE_START));
    let stop = Arc::new(AtomicU8::new(0));
    let txns = Arc::new(AtomicU64::new(0));
    let failed = Arc::new(AtomicU64::new(0));
    // Set once the added table exists: the writer changes it too from then on.
    let added_on = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let writer = {
        let (url, phase, stop, txns, failed, added_on) = (
            url.clone(),
            phase.clone(),
            stop.clone(),
            txns.clone(),
            failed.clone(),
            added_on.clone(),
        );
        std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async move {
                let (c, conn) = tokio_postgres::connect(&url, NoTls).await.unwrap();
                tokio::spawn(conn);
                let mut rng = fastrand::Rng::with_seed(seed);
                let mut done = PHASE_START;
                while stop.load(Ordering::Relaxed) == 0 {
                    let want = phase.load(Ordering::Relaxed);
                    while done < want {
                        done += 1;
                        c.batch_execute(schema_change(done))
                            .await
                            .unwrap_or_else(|e| panic!("{}: {e}", schema_change(done)));
                    }
                    let mut sql = writer_txn(&mut rng, done);
                    if added_on.load(Ordering::Relaxed) && rng.u8(0..3) == 0 {
                        sql.push_str(&format!("\nBEGIN; {}; COMMIT;", added_change(&mut rng)));
                    }
                    if let Err(e) = c.batch_execute(&sql).await {
                        let _ = c.batch_execute("ROLLBACK").await;
                        failed.fetch_add(1, Ordering::Relaxed);
                        eprintln!("writer transaction failed (skipped): {e}");
                    }
                    txns.fetch_add(1, Ordering::Relaxed);
                    tokio::time::sleep(Duration::from_millis(rng.u64(0..4))).await;
                }
            })
        })
    };

    // The kills: each run with --follow is SIGKILLed after a random delay around `base`;
    // `base` grows when a run was killed before it committed anything (start-up is slower
    // in debug builds) and shrinks when it did, so the kills land mid-run in either build.
    let mut rng = fastrand::Rng::with_seed(seed.rotate_left(17));
    let mut base = 1000u64;
    let (mut kills, mut landed, mut ended) = (0u32, 0u32, Vec::new());
    let (mut tables, mut table_added) = (tables, false);
    let mut delays = Vec::new();
    while landed < KILLS && kills < 80 {
        let before = progress(&url);
        let mut child = Command::new(env!("CARGO_BIN_EXE_walsink"))
            .args(args(&tables, true))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let delay = rng.u64(base / 2..=base * 2);
        let t = Instant::now();
        loop {
            if let Some(st) = child.try_wait().unwrap() {
                let mut e = String::new();
                std::io::Read::read_to_string(child.stderr.as_mut().unwrap(), &mut e).unwrap();
                ended.push(format!("{st:?}: {e}"));
                break;
            }
            if t.elapsed() >= Duration::from_millis(delay) {
                child.kill().unwrap(); // SIGKILL
                child.wait().unwrap();
                kills += 1;
                break;
            }
            std::thread::sleep(Duration::from_millis(3));
        }
        assert!(ended.is_empty(), "a run with --follow ended: {ended:?}");
        delays.push(delay);
        if progress(&url) != before {
            landed += 1;
            base = (base * 9 / 10).max(800);
        } else {
            base = (base * 3 / 2).min(20_000);
        }
        match landed {
            6 => phase.store(PHASE_ADD, Ordering::Relaxed),
            11 => phase.store(PHASE_DROP, Ordering::Relaxed),
            _ => {}
        }
        if landed >= 15 && !table_added {
            tables = add_table_to_tables(&url, tables);
            added_on.store(true, Ordering::Relaxed);
            table_added = true;
        }
    }
    assert!(
        phase.load(Ordering::Relaxed) == PHASE_DROP,
        "the schema changes did not happen"
    );
    stop.store(1, Ordering::Relaxed);
    writer.join().expect("writer");
    let loop_secs = started.elapsed().as_secs_f64();

    // Catch up: the same command without --follow reads to the end and stops.
    let t = Instant::now();
    let out = Command::new(env!("CARGO_BIN_EXE_walsink"))
        .args(args(&tables, false))
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let catch_up = t.elapsed().as_secs_f64();
    assert!(
        out.status.success(),
        "the last run failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );

    let events = one(
        &url,
        r#"SELECT sum(n_tup_ins + n_tup_upd + n_tup_del)::text FROM pg_stat_user_tables
           WHERE schemaname = 'public'"#,
    );
    let mut bad = Vec::new();
    let mut counts = Vec::new();
    assert!(table_added, "the table was not added mid-run");
    let added_rows = one(&url, r#"SELECT count(*)::text FROM replica."Added Later""#);
    for table in ["Orders", "Kv Store", "Added Later"] {
        let (b, n) = compare(&url, table);
        bad.extend(b);
        counts.push(format!("{table} {n}"));
    }
    let json_odd = one(
        &url,
        r#"SELECT count(*) FROM replica."Orders" WHERE doc::text = '{"b":1,  "a":2, "a":3}'"#,
    );
    eprintln!(
        "kill loop (seed {seed}): {kills} SIGKILLs, {landed} after the run had committed, \
         delays {}..{} ms (last base {base}); {} writer transactions ({} failed), {events} row \
         changes on the source (snapshot included); rows {}; duplicate-key json rows in the \
         replica {json_odd}; rows of the added table in the replica {added_rows}; loop {loop_secs:.1} s, catch-up {catch_up:.1} s",
        delays.iter().min().unwrap(),
        delays.iter().max().unwrap(),
        txns.load(Ordering::Relaxed),
        failed.load(Ordering::Relaxed),
        counts.join(", ")
    );
    assert!(kills >= KILLS, "only {kills} kills");
    assert!(
        landed >= KILLS,
        "only {landed} of {kills} kills landed in a run that had committed"
    );
    assert!(bad.is_empty(), "the replica differs:\n{}", bad.join("\n"));
    assert_ne!(
        json_odd, "0",
        "no json with duplicate keys reached the replica"
    );
}
