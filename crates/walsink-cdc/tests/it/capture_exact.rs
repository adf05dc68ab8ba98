//! The replica from a logical slot ends exact, or the run is refused with an error naming the
//! table and column: `json` text kept byte for byte (snapshot and stream), stored generated
//! columns created as generated (and a replica whose column is plain refused), quoted
//! (mixed-case, spaced) names, schema changes followed (ADD COLUMN with the source's type,
//! DROP COLUMN) or refused by name (ALTER COLUMN TYPE, RENAME), a table removed from `tables=`
//! refused on resume (an added one taken), a table without a primary key refused, a server without logical decoding refused
//! before anything is created, and a loop of dropped captures and sinks under random changes.
//! Each test but the last two starts a private cluster (`wal_level=logical`).

use std::sync::Arc;
use walsink::{MemoryCommitStore, Options, WalSink};
use walsink_cdc::capture::{Batch, Capture, CaptureError, SourceConfig, SourcePos};
use walsink_cdc::check::compare;
use walsink_cdc::{CdcSink, Config};
use walsink_postgres::testkit::Cluster;

async fn connect(url: &str) -> tokio_postgres::Client {
    let (c, conn) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(conn);
    c
}

/// The source's tables with odd JSON, a stored generated column and quoted names.
const TABLES: &str = r#"
    CREATE TABLE "MixedCase" ("Id" int PRIMARY KEY, "Val" text, "a b" json, doc json, n numeric(8,2),
      "Gen" numeric GENERATED ALWAYS AS (n * 2 + length(coalesce("Val", ''))) STORED);
    CREATE TABLE plain (id bigint PRIMARY KEY, j json, jb jsonb, total int GENERATED ALWAYS AS (id * 10) STORED);
"#;

/// JSON texts PostgreSQL's `json` keeps as written and `jsonb` would rewrite.
const ODD_JSON: [&str; 5] = [
    r#"{"b":1,  "a":2, "a":3}"#,
    "[1,\n  2 ,\t{\"z\" : null,\"z\":true}]",
    r#"  "padded"  "#,
    r#"{"n": 1.10, "big": 123456789012345678901234567890}"#,
    "null",
];

fn lit(s: &str) -> String {
    format!("'{}'", s.replace('\'', "''"))
}

/// A log, a sink and where the capture stands; delivers each batch and follows schema changes
/// as `walsink cdc --source` does (everything before the change committed first).
struct Pipeline {
    wal: Arc<WalSink>,
    _dir: tempfile::TempDir,
    sink: CdcSink,
    sink_cfg: Config,
    next_cp: u64,
}

impl Pipeline {
    fn new(sink_cfg: Config, sink: CdcSink) -> Pipeline {
        let dir = tempfile::tempdir().unwrap();
        let (wal, _) = WalSink::open_with(
            Arc::new(walsink::storage::FsStorage::new(dir.path()).unwrap()),
            Options::new("t"),
            Box::new(MemoryCommitStore::new()),
        )
        .unwrap();
        Pipeline {
            wal: Arc::new(wal),
            _dir: dir,
            sink,
            sink_cfg,
            next_cp: 1,
        }
    }

    /// Seals `b` as the next checkpoint (after following its schema changes).
    async fn take(&mut self, b: &Batch) {
        if !b.changes.is_empty() {
            walsink_tokio::deliver_ready(&self.wal, &mut self.sink)
                .await
                .unwrap();
            let ddl: Vec<String> = b
                .changes
                .iter()
                .flat_map(|c| c.ddl(&self.sink_cfg.schema))
                .collect();
            let mut other = CdcSink::connect(self.sink_cfg.clone()).await.unwrap();
            other.execute(&ddl).await.unwrap();
        }
        self.wal
            .append_batch(b.events.iter().map(Vec::as_slice))
            .unwrap();
        self.wal
            .checkpoint(self.next_cp, &serde_json::to_vec(&b.pos).unwrap())
            .unwrap();
        self.wal.checkpoint_complete(self.next_cp).unwrap();
        self.next_cp += 1;
    }

    /// Reads from `pos` until the source has nothing more, delivering every batch.
    async fn run(
        &mut self,
        cap: &mut Capture,
        mut pos: SourcePos,
    ) -> Result<SourcePos, CaptureError> {
        loop {
            let b = cap.next(&pos).await?;
            if b.pos == pos {
                return Ok(pos);
            }
            self.take(&b).await;
            walsink_tokio::deliver_ready(&self.wal, &mut self.sink)
                .await
                .unwrap();
            cap.advance(b.pos.end_lsn).await?;
            pos = b.pos;
        }
    }
}

/// A private cluster with the tables, a capture started on them and a pipeline into schema
/// `replica` (created from the source's definitions).
async fn setup(
    tables_sql: &str,
    tables: &str,
) -> (
    Cluster,
    tokio_postgres::Client,
    Capture,
    SourcePos,
    Pipeline,
) {
    let pg = Cluster::start(&[("wal_level", "logical")]).expect("private cluster");
    let url = pg.url("postgres");
    let c = connect(&url).await;
    c.batch_execute(tables_sql).await.unwrap();
    let cfg = SourceConfig::from_url(&format!(
        "{url}?slot=t_slot&tables={tables}&snapshot_rows=7"
    ))
    .unwrap();
    let mut cap = Capture::connect(cfg).await.unwrap();
    let start = cap.start().await.unwrap();
    let sink_cfg = Config::from_url(&format!("{url}?schema=replica")).unwrap();
    let mut sink = CdcSink::connect(sink_cfg.clone()).await.unwrap();
    sink.execute(&cap.target_ddl("replica").await.unwrap())
        .await
        .unwrap();
    (pg, c, cap, start, Pipeline::new(sink_cfg, sink))
}

async fn same(c: &tokio_postgres::Client, table: &str) {
    let cmp = compare(c, ("public", table), ("replica", table))
        .await
        .unwrap();
    assert!(cmp.identical(), "{table}: {cmp:?}");
}

/// The JSON text as the replica holds it, by key.
async fn json_texts(
    c: &tokio_postgres::Client,
    schema: &str,
) -> Vec<(i32, Option<String>, Option<String>)> {
    c.query(
        &format!(r#"SELECT "Id", "a b"::text, doc::text FROM {schema}."MixedCase" ORDER BY "Id""#),
        &[],
    )
    .await
    .unwrap()
    .iter()
    .map(|r| (r.get(0), r.get(1), r.get(2)))
    .collect()
}

#[tokio::test(flavor = "multi_thread")]
#[cfg_attr(
    not(servers),
    ignore = "needs WALSINK_TEST_SERVERS=1 and the PostgreSQL binaries"
)]
async fn json_text_generated_columns_and_quoted_names_arrive_exact() {
    let (_pg, c, mut cap, start, mut p) = setup(TABLES, r#""MixedCase",plain"#).await;
    // Before the snapshot was read: rows the snapshot carries.
    let mut sql = String::new();
    for (i, j) in ODD_JSON.iter().enumerate() {
        sql.push_str(&format!(
            r#"INSERT INTO "MixedCase" ("Id", "Val", "a b", doc, n) VALUES ({i}, 'v{i}', {}, {}, {i}.25);
               INSERT INTO plain (id, j, jb) VALUES ({i}, {}, {});"#,
            lit(j),
            lit(ODD_JSON[(i + 1) % ODD_JSON.len()]),
            lit(j),
            lit(j)
        ));
    }
    c.batch_execute(&sql).await.unwrap();
    let pos = p.run(&mut cap, start).await.unwrap();
    assert!(pos.snapshot.is_none());
    assert_eq!(
        json_texts(&c, "replica").await,
        json_texts(&c, "public").await
    );
    same(&c, "MixedCase").await;
    same(&c, "plain").await;
    // The replica's column is generated, from the source's expression.
    let g: String = c
        .query_one(
            "SELECT attgenerated::text FROM pg_attribute WHERE attrelid = 'replica.\"MixedCase\"'::regclass AND attname = 'Gen'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(g, "s");
    // The stream: updates that change the generated column's inputs, key changes, deletes.
    let mut sql = String::new();
    for (i, j) in ODD_JSON.iter().enumerate() {
        sql.push_str(&format!(
            r#"UPDATE "MixedCase" SET "a b" = {}, n = n + 1, "Val" = "Val" || ' x' WHERE "Id" = {i};
               UPDATE plain SET j = {} WHERE id = {i};"#,
            lit(ODD_JSON[(i + 2) % ODD_JSON.len()]),
            lit(&format!("{{ \"k\":{i},  \"k\" : {j} }}"))
        ));
    }
    sql.push_str(r#"UPDATE "MixedCase" SET "Id" = 100 WHERE "Id" = 1; DELETE FROM plain WHERE id = 2;
                    INSERT INTO "MixedCase" ("Id", "Val", "a b") VALUES (50, NULL, '{"dup":1,"dup":2}');"#);
    c.batch_execute(&sql).await.unwrap();
    p.run(&mut cap, pos).await.unwrap();
    assert_eq!(
        json_texts(&c, "replica").await,
        json_texts(&c, "public").await
    );
    same(&c, "MixedCase").await;
    same(&c, "plain").await;
}

#[tokio::test(flavor = "multi_thread")]
#[cfg_attr(
    not(servers),
    ignore = "needs WALSINK_TEST_SERVERS=1 and the PostgreSQL binaries"
)]
async fn a_replica_column_plain_where_the_source_is_generated_is_refused() {
    let pg = Cluster::start(&[("wal_level", "logical")]).expect("private cluster");
    let url = pg.url("postgres");
    let c = connect(&url).await;
    c.batch_execute(&format!(
        "{TABLES} CREATE SCHEMA replica; CREATE TABLE replica.plain (id bigint PRIMARY KEY, j json, jb jsonb, total int);"
    ))
    .await
    .unwrap();
    let cfg = SourceConfig::from_url(&format!("{url}?slot=t_slot&tables=plain")).unwrap();
    let cap = Capture::connect(cfg).await.unwrap();
    let sink_cfg = Config::from_url(&format!("{url}?schema=replica")).unwrap();
    let mut sink = CdcSink::connect(sink_cfg).await.unwrap();
    let e = sink
        .execute(&cap.target_ddl("replica").await.unwrap())
        .await
        .unwrap_err()
        .to_string();
    assert!(
        e.contains(r#""replica"."plain""#) && e.contains(r#""total""#) && e.contains("GENERATED"),
        "{e}"
    );
}

#[tokio::test(flavor = "multi_thread")]
#[cfg_attr(
    not(servers),
    ignore = "needs WALSINK_TEST_SERVERS=1 and the PostgreSQL binaries"
)]
async fn schema_changes_are_followed_with_source_types_or_refused_by_name() {
    let (_pg, c, mut cap, start, mut p) = setup(
        r#"CREATE TABLE "T x" (id int PRIMARY KEY, keep text, gone text, later int);
           INSERT INTO "T x" SELECT g, 'k' || g, 'g' || g, g FROM generate_series(1, 20) g;"#,
        r#""T x""#,
    )
    .await;
    let pos = p.run(&mut cap, start).await.unwrap();
    same(&c, "T x").await;
    // ADD COLUMN (two types text would lose) and DROP COLUMN, with rows on both sides.
    c.batch_execute(
        r#"INSERT INTO "T x" (id, keep) VALUES (21, 'before');
           ALTER TABLE "T x" ADD COLUMN "Amount" numeric(5,2), ADD COLUMN doc jsonb;
           UPDATE "T x" SET "Amount" = id / 3.0, doc = jsonb_build_object('id', id) WHERE id % 2 = 0;
           ALTER TABLE "T x" DROP COLUMN gone;
           INSERT INTO "T x" (id, keep, "Amount") VALUES (22, 'after', 1.5);"#,
    )
    .await
    .unwrap();
    let pos = p.run(&mut cap, pos).await.unwrap();
    same(&c, "T x").await;
    // The column dropped within that transaction goes before the table's next change.
    c.batch_execute(r#"UPDATE "T x" SET keep = 'next' WHERE id = 2"#)
        .await
        .unwrap();
    let pos = p.run(&mut cap, pos).await.unwrap();
    same(&c, "T x").await;
    // A column dropped in a transaction of its own, then rows.
    c.batch_execute(r#"ALTER TABLE "T x" ADD COLUMN extra int"#)
        .await
        .unwrap();
    c.batch_execute(r#"UPDATE "T x" SET extra = id WHERE id < 5"#)
        .await
        .unwrap();
    c.batch_execute(r#"ALTER TABLE "T x" DROP COLUMN extra"#)
        .await
        .unwrap();
    c.batch_execute(r#"INSERT INTO "T x" (id, keep) VALUES (23, 'after drop')"#)
        .await
        .unwrap();
    let pos = p.run(&mut cap, pos).await.unwrap();
    same(&c, "T x").await;
    let types: Vec<(String, String)> = c
        .query(
            "SELECT attname::text, format_type(atttypid, atttypmod) FROM pg_attribute \
             WHERE attrelid = 'replica.\"T x\"'::regclass AND attnum > 0 AND NOT attisdropped AND attname <> '_walsink_pos' ORDER BY attnum",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    let want: Vec<(String, String)> = [
        ("id", "integer"),
        ("keep", "text"),
        ("later", "integer"),
        ("Amount", "numeric(5,2)"),
        ("doc", "jsonb"),
    ]
    .iter()
    .map(|(a, b)| (a.to_string(), b.to_string()))
    .collect();
    assert_eq!(types, want);
    // A type change: refused, naming table and column; nothing after it is applied.
    for sql in [
        r#"UPDATE "T x" SET keep = 'last before' WHERE id = 1"#,
        r#"ALTER TABLE "T x" ALTER COLUMN later TYPE bigint"#,
        r#"UPDATE "T x" SET later = 5000000000 WHERE id = 3"#,
    ] {
        c.batch_execute(sql).await.unwrap();
    }
    let e = p.run(&mut cap, pos.clone()).await.unwrap_err().to_string();
    assert!(
        e.contains(r#"column "later" of source table "public"."T x""#) && e.contains("TYPE"),
        "{e}"
    );
    let kept: String = c
        .query_one(r#"SELECT keep FROM replica."T x" WHERE id = 1"#, &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(
        kept, "last before",
        "the transaction before the change is applied"
    );
    let later: i32 = c
        .query_one(r#"SELECT later FROM replica."T x" WHERE id = 3"#, &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(later, 3);
}

#[tokio::test(flavor = "multi_thread")]
#[cfg_attr(
    not(servers),
    ignore = "needs WALSINK_TEST_SERVERS=1 and the PostgreSQL binaries"
)]
async fn renames_and_added_defaults_are_refused_by_name() {
    for (alter, word) in [
        (
            r#"ALTER TABLE r RENAME COLUMN v TO "New v""#,
            r#"column "v" of source table "public"."r" was renamed to "New v""#,
        ),
        (
            "ALTER TABLE r RENAME TO r2",
            r#""public"."r" was renamed to "public"."r2""#,
        ),
        (
            "ALTER TABLE r ADD COLUMN d int DEFAULT 7",
            r#"column "d" was added to source table "public"."r" with a default"#,
        ),
    ] {
        let (_pg, c, mut cap, start, mut p) = setup(
            "CREATE TABLE r (id int PRIMARY KEY, v text); INSERT INTO r VALUES (1, 'a'), (2, 'b');",
            "r",
        )
        .await;
        let pos = p.run(&mut cap, start).await.unwrap();
        c.batch_execute(alter).await.unwrap();
        let t = if alter.contains("RENAME TO") {
            "r2"
        } else {
            "r"
        };
        c.batch_execute(&format!("UPDATE {t} SET id = 3 WHERE id = 1"))
            .await
            .unwrap();
        let e = p.run(&mut cap, pos).await.unwrap_err().to_string();
        assert!(e.contains(word), "{alter}: {e}");
    }
}

#[tokio::test(flavor = "multi_thread")]
#[cfg_attr(
    not(servers),
    ignore = "needs WALSINK_TEST_SERVERS=1 and the PostgreSQL binaries"
)]
async fn an_added_table_is_taken_by_resume_and_a_removed_one_and_a_table_without_a_key_are_refused()
{
    let (pg, c, mut cap, start, mut p) = setup(
        "CREATE TABLE a (id int PRIMARY KEY); CREATE TABLE b (id int PRIMARY KEY); \
         CREATE TABLE nokey (x int, y text); ALTER TABLE nokey REPLICA IDENTITY FULL;",
        "a",
    )
    .await;
    let pos = p.run(&mut cap, start).await.unwrap();
    let url = pg.url("postgres");
    // An added table is taken by `resume` (see tests/capture_added.rs), not read unawares.
    let mut other =
        Capture::connect(SourceConfig::from_url(&format!("{url}?slot=t_slot&tables=a,b")).unwrap())
            .await
            .unwrap();
    other.check_resume(&pos).unwrap();
    let e = other.next(&pos).await.unwrap_err().to_string();
    assert!(
        e.contains(r#"adds "public"."b""#) && e.contains("resume"),
        "{e}"
    );
    // A checkpoint of an older walsink holds no table list: the tables in the publication
    // are taken as the pipeline's, and b (not in it) is added.
    let mut old_meta = pos.clone();
    old_meta.tables.clear();
    old_meta.shapes.clear();
    let from_old = other.resume(&old_meta).await.unwrap();
    assert_eq!(from_old.tables, other.config().tables);
    assert_eq!(
        from_old.snapshot.map(|s| (s.table, s.after)),
        Some((1, None))
    );
    let with_b = other.resume(&pos).await.unwrap();
    assert_eq!(with_b.tables.len(), 2);
    assert_eq!(with_b.snapshot.as_ref().map(|s| s.table), Some(1));
    // A removed table is refused by name, and says its replica is left as it is.
    let fewer =
        Capture::connect(SourceConfig::from_url(&format!("{url}?slot=t_slot&tables=b")).unwrap())
            .await
            .unwrap();
    let e = fewer.check_resume(&with_b).unwrap_err().to_string();
    assert!(
        e.contains(r#"removes "public"."a""#) && e.contains("replica table is left as it is"),
        "{e}"
    );
    cap.check_resume(&pos).unwrap();
    let e = Capture::connect(
        SourceConfig::from_url(&format!("{url}?slot=t_slot&tables=nokey")).unwrap(),
    )
    .await
    .unwrap_err()
    .to_string();
    assert!(e.contains(r#""public"."nokey" has no primary key"#), "{e}");
    drop(c);
}

#[tokio::test(flavor = "multi_thread")]
#[cfg_attr(
    not(servers),
    ignore = "needs WALSINK_TEST_SERVERS=1 and a local PostgreSQL"
)]
async fn a_server_without_logical_decoding_is_refused_at_connect() {
    let url = "postgres://postgres@127.0.0.1:5432/test";
    let c = connect(url).await;
    let level: String = c.query_one("SHOW wal_level", &[]).await.unwrap().get(0);
    assert_ne!(
        level, "logical",
        "the shared server is expected without logical decoding"
    );
    // No such table either: the level is checked first, before anything else is read.
    let e = Capture::connect(
        SourceConfig::from_url(&format!("{url}?slot=never&tables=cdc_no_such_table")).unwrap(),
    )
    .await
    .unwrap_err()
    .to_string();
    assert!(e.contains("wal_level=logical"), "{e}");
}

/// Random changes of the odd-JSON, generated-column and quoted-name tables while the capture
/// and the sink are dropped at random points, as a killed `walsink cdc --source` leaves them:
/// batches sealed but not delivered, delivered but the slot not advanced, and resumes from
/// the target's older position (a rewind). The replica ends equal to the source both ways on
/// text forms, and every `json` text byte for byte.
#[tokio::test(flavor = "multi_thread")]
#[cfg_attr(
    not(servers),
    ignore = "needs WALSINK_TEST_SERVERS=1 and the PostgreSQL binaries"
)]
async fn dropped_captures_and_sinks_under_random_changes_end_exact() {
    let seed = std::env::var("CDC_LOOP_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| fastrand::u64(..));
    eprintln!("seed {seed} (CDC_LOOP_SEED)");
    let mut rng = fastrand::Rng::with_seed(seed);
    let rounds: usize = std::env::var("CDC_LOOP_ROUNDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(40);
    let pg = Cluster::start(&[("wal_level", "logical")]).expect("private cluster");
    let url = pg.url("postgres");
    let c = connect(&url).await;
    c.batch_execute(TABLES).await.unwrap();
    let source_url =
        format!(r#"{url}?slot=t_slot&tables="MixedCase",plain&snapshot_rows=9&read_changes=40"#);
    let sink_cfg = Config::from_url(&format!("{url}?schema=replica")).unwrap();
    let dml = |rng: &mut fastrand::Rng| {
        let mut sql = String::new();
        let txns = rng.usize(1..4);
        for _ in 0..txns {
            sql.push_str("BEGIN;");
            for _ in 0..rng.usize(1..8) {
                let id = rng.i32(0..40);
                let j = lit(ODD_JSON[rng.usize(..ODD_JSON.len())]);
                let k = lit(&format!("{{\"d\":{id},  \"d\" :{}}}", rng.u8(..)));
                sql.push_str(&match rng.u8(..9) {
                    0 | 1 => format!(
                        r#"INSERT INTO "MixedCase" ("Id", "Val", "a b", doc, n) VALUES ({id}, 'v{id}', {j}, {k}, {}.5) ON CONFLICT ("Id") DO UPDATE SET "a b" = EXCLUDED.doc, n = EXCLUDED.n;"#,
                        rng.u16(..999)
                    ),
                    2 => format!(r#"UPDATE "MixedCase" SET "Val" = "Val" || 'x', "a b" = {k} WHERE "Id" = {id};"#),
                    3 => format!(r#"DELETE FROM "MixedCase" WHERE "Id" = {id};"#),
                    4 => format!(
                        r#"UPDATE "MixedCase" SET "Id" = "Id" + 1000 WHERE "Id" = {id} AND NOT EXISTS (SELECT 1 FROM "MixedCase" WHERE "Id" = {id} + 1000);"#
                    ),
                    5 | 6 => format!(
                        "INSERT INTO plain (id, j, jb) VALUES ({id}, {j}, {k}) ON CONFLICT (id) DO UPDATE SET j = EXCLUDED.jb::json, jb = EXCLUDED.j::jsonb;"
                    ),
                    7 => format!("DELETE FROM plain WHERE id = {id};"),
                    _ => {
                        if rng.u8(..6) == 0 {
                            "TRUNCATE plain;".to_string()
                        } else {
                            format!("UPDATE plain SET j = {k} WHERE id % 3 = {};", id % 3)
                        }
                    }
                });
            }
            sql.push_str("COMMIT;");
        }
        sql
    };
    // Rows before the slot exists: the snapshot's.
    for _ in 0..6 {
        let sql = dml(&mut rng);
        c.batch_execute(&sql).await.unwrap();
    }
    let dir = tempfile::tempdir().unwrap();
    let (wal, _) = WalSink::open_with(
        Arc::new(walsink::storage::FsStorage::new(dir.path()).unwrap()),
        Options::new("t"),
        Box::new(MemoryCommitStore::new()),
    )
    .unwrap();
    let wal = Arc::new(wal);
    let mut next_cp = 1;
    // What the log's newest checkpoint and the target's newest commit say.
    let mut sealed: Option<SourcePos> = None;
    let mut committed: Option<SourcePos> = None;
    let mut metas: Vec<(u64, SourcePos)> = Vec::new();
    let (mut rewinds, mut undelivered) = (0, 0);
    for round in 0..rounds {
        let mut cap = Capture::connect(SourceConfig::from_url(&source_url).unwrap())
            .await
            .unwrap();
        let mut sink = CdcSink::connect(sink_cfg.clone()).await.unwrap();
        let mut pos = match (&sealed, &committed) {
            (None, _) => cap.start().await.unwrap(),
            // A rewind: the target's older position, as after a lost log tail.
            (Some(_), Some(t)) if rng.u8(..4) == 0 => {
                rewinds += 1;
                t.clone()
            }
            (Some(s), _) => s.clone(),
        };
        cap.check_resume(&pos).unwrap();
        if round == 0 {
            sink.execute(&cap.target_ddl("replica").await.unwrap())
                .await
                .unwrap();
        }
        for _ in 0..rng.usize(1..5) {
            if rng.bool() {
                let sql = dml(&mut rng);
                c.batch_execute(&sql).await.unwrap();
            }
            let b = cap.next(&pos).await.unwrap();
            if b.pos == pos {
                continue;
            }
            assert!(b.changes.is_empty(), "no schema change in this loop");
            wal.append_batch(b.events.iter().map(Vec::as_slice))
                .unwrap();
            wal.checkpoint(next_cp, b"").unwrap();
            wal.checkpoint_complete(next_cp).unwrap();
            metas.push((next_cp, b.pos.clone()));
            next_cp += 1;
            sealed = Some(b.pos.clone());
            pos = b.pos;
            // Dropped before delivering, or delivered and dropped before the slot moved.
            match rng.u8(..4) {
                0 => undelivered += 1,
                _ => {
                    walsink_tokio::deliver_ready(&wal, &mut sink).await.unwrap();
                    let upto = wal.health().committed.unwrap_or(0);
                    committed = metas
                        .iter()
                        .rev()
                        .find(|(cp, _)| *cp <= upto)
                        .map(|(_, p)| p.clone());
                    if rng.bool() {
                        if let Some(t) = &committed {
                            cap.advance(t.end_lsn).await.unwrap();
                        }
                    }
                }
            }
        }
        drop(cap);
        drop(sink);
    }
    // The last run: to the end, everything delivered.
    let mut cap = Capture::connect(SourceConfig::from_url(&source_url).unwrap())
        .await
        .unwrap();
    let mut sink = CdcSink::connect(sink_cfg.clone()).await.unwrap();
    let mut pos = sealed.expect("something was read");
    loop {
        let b = cap.next(&pos).await.unwrap();
        if b.pos == pos {
            break;
        }
        wal.append_batch(b.events.iter().map(Vec::as_slice))
            .unwrap();
        wal.checkpoint(next_cp, b"").unwrap();
        wal.checkpoint_complete(next_cp).unwrap();
        next_cp += 1;
        pos = b.pos;
    }
    walsink_tokio::deliver_ready(&wal, &mut sink).await.unwrap();
    eprintln!("{rounds} rounds, {rewinds} rewinds, {undelivered} batches left undelivered at a drop, {} checkpoints", next_cp - 1);
    assert!(pos.snapshot.is_none());
    assert_eq!(
        json_texts(&c, "replica").await,
        json_texts(&c, "public").await
    );
    same(&c, "MixedCase").await;
    same(&c, "plain").await;
    let n: i64 = c
        .query_one(r#"SELECT count(*) FROM "MixedCase""#, &[])
        .await
        .unwrap()
        .get(0);
    assert!(n > 0, "the loop left rows to compare");
}
