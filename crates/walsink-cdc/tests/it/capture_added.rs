//! A table added to a running pipeline's `tables=` (issue 30, item 3): on resume it joins the
//! publication, its replica table is created from the source's definition (a quoted name, a
//! `json` column and a stored generated column here), and it is snapshotted page by page
//! while a writer keeps changing it, ending exact (both ways, every value's text form); also
//! when the capture and the sink are dropped at random points, during the added table's
//! snapshot among them. Each test starts a private cluster (`wal_level=logical`).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use walsink::{MemoryCommitStore, Options, WalSink};
use walsink_cdc::capture::{Capture, SourceConfig, SourcePos};
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

/// Table `a` is captured from the start; `"Added"` (300 rows) joins later.
const TABLES: &str = r#"
    CREATE TABLE a (id int PRIMARY KEY, v text);
    INSERT INTO a SELECT g, 'a' || g FROM generate_series(1, 50) g;
    CREATE TABLE "Added" ("Id" int PRIMARY KEY, "V" text, j json, n numeric(7,2),
      "Twice" int GENERATED ALWAYS AS ("Id" * 2) STORED);
    INSERT INTO "Added" ("Id", "V", j, n)
      SELECT g, 'v' || g, ('{"b":1,  "a":2, "a":' || g || '}')::json, g / 3.0 FROM generate_series(1, 300) g;
"#;

const ONE: &str = "a";
const BOTH: &str = r#"a,"Added""#;

/// One random transaction over both tables (keys 1..400, so inserts, updates and deletes).
fn txn(rng: &mut fastrand::Rng) -> String {
    let mut sql = String::from("BEGIN;");
    for _ in 0..rng.usize(1..6) {
        let id = rng.i32(1..400);
        sql.push_str(&match rng.u8(..8) {
            0 | 1 => format!(
                r#"INSERT INTO "Added" ("Id", "V", j, n) VALUES ({id}, 'i{id}', '[1,  {id} ,{{"z":1,"z":2}}]', {}.25) ON CONFLICT ("Id") DO UPDATE SET "V" = EXCLUDED."V" || 'u', j = EXCLUDED.j;"#,
                rng.u16(..9999)
            ),
            2 | 3 => format!(
                r#"UPDATE "Added" SET "V" = coalesce("V", '') || 'x', n = n + 1 WHERE "Id" = {id};"#
            ),
            4 => format!(r#"DELETE FROM "Added" WHERE "Id" = {id};"#),
            5 => format!(
                r#"UPDATE "Added" SET "Id" = "Id" + 1000 WHERE "Id" = {id} AND NOT EXISTS (SELECT 1 FROM "Added" WHERE "Id" = {id} + 1000);"#
            ),
            6 => format!(
                "INSERT INTO a VALUES ({id}, 'w') ON CONFLICT (id) DO UPDATE SET v = a.v || 'y';"
            ),
            _ => format!("DELETE FROM a WHERE id = {id};"),
        });
    }
    if rng.u8(..5) == 0 {
        // Some transactions stay open a while: across the publication change among them.
        sql.push_str("SELECT pg_sleep(0.03);");
    }
    sql.push_str("COMMIT;");
    sql
}

/// A writer changing both tables until `stop`; counts its transactions.
fn writer(
    url: String,
    seed: u64,
    stop: Arc<AtomicBool>,
    done: Arc<AtomicU64>,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let c = connect(&url).await;
        let mut rng = fastrand::Rng::with_seed(seed);
        while !stop.load(Ordering::Relaxed) {
            c.batch_execute(&txn(&mut rng)).await.unwrap();
            done.fetch_add(1, Ordering::Relaxed);
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    })
}

fn source(url: &str, tables: &str) -> SourceConfig {
    SourceConfig::from_url(&format!(
        "{url}?slot=add_slot&tables={tables}&snapshot_rows=7"
    ))
    .unwrap()
}

fn new_wal(dir: &tempfile::TempDir) -> Arc<WalSink> {
    let (wal, _) = WalSink::open_with(
        Arc::new(walsink::storage::FsStorage::new(dir.path()).unwrap()),
        Options::new("t"),
        Box::new(MemoryCommitStore::new()),
    )
    .unwrap();
    Arc::new(wal)
}

/// Seals `b` as checkpoint `cp` (no schema change happens in these tests).
fn seal(wal: &WalSink, cp: u64, b: &walsink_cdc::capture::Batch) {
    assert!(b.changes.is_empty(), "no schema change in these tests");
    wal.append_batch(b.events.iter().map(Vec::as_slice))
        .unwrap();
    wal.checkpoint(cp, &serde_json::to_vec(&b.pos).unwrap())
        .unwrap();
    wal.checkpoint_complete(cp).unwrap();
}

/// Reads from `pos` until the source has nothing more, delivering every batch.
async fn drain(
    cap: &mut Capture,
    wal: &Arc<WalSink>,
    sink: &mut CdcSink,
    cp: &mut u64,
    mut pos: SourcePos,
) -> SourcePos {
    loop {
        let b = cap.next(&pos).await.unwrap();
        if b.pos == pos {
            walsink_tokio::deliver_ready(wal, sink).await.unwrap();
            return pos;
        }
        seal(wal, *cp, &b);
        *cp += 1;
        walsink_tokio::deliver_ready(wal, sink).await.unwrap();
        cap.advance(b.pos.end_lsn).await.unwrap();
        pos = b.pos;
    }
}

async fn assert_same(c: &tokio_postgres::Client, table: &str) {
    let cmp = compare(c, ("public", table), ("replica", table))
        .await
        .unwrap();
    eprintln!("{table}: {cmp:?}");
    assert!(cmp.identical(), "{table}: {cmp:?}");
    // The generated column is computed in the replica too, and json kept as written.
    if table == "Added" {
        let text = |s: &str| {
            format!(
                r#"SELECT string_agg("Id" || '|' || "Twice" || '|' || coalesce(j::text, '-'), ';' ORDER BY "Id") FROM {s}."Added""#
            )
        };
        let src: Option<String> = c.query_one(&text("public"), &[]).await.unwrap().get(0);
        let rep: Option<String> = c.query_one(&text("replica"), &[]).await.unwrap().get(0);
        assert_eq!(rep, src);
    }
}

#[tokio::test(flavor = "multi_thread")]
#[cfg_attr(
    not(servers),
    ignore = "needs WALSINK_TEST_SERVERS=1 and the PostgreSQL binaries"
)]
async fn a_table_added_to_tables_is_snapshotted_under_writes_and_ends_exact() {
    let pg = Cluster::start(&[("wal_level", "logical")]).expect("private cluster");
    let url = pg.url("postgres");
    let c = connect(&url).await;
    c.batch_execute(TABLES).await.unwrap();
    let sink_cfg = Config::from_url(&format!("{url}?schema=replica")).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let wal = new_wal(&dir);
    let mut cp = 1;
    let mut cap = Capture::connect(source(&url, ONE)).await.unwrap();
    let start = cap.start().await.unwrap();
    let mut sink = CdcSink::connect(sink_cfg.clone()).await.unwrap();
    sink.execute(&cap.target_ddl("replica").await.unwrap())
        .await
        .unwrap();
    let pos = drain(&mut cap, &wal, &mut sink, &mut cp, start).await;
    drop(cap);
    let (stop, done) = (
        Arc::new(AtomicBool::new(false)),
        Arc::new(AtomicU64::new(0)),
    );
    let w = writer(url.clone(), 7, stop.clone(), done.clone());
    // A transaction that changed the table before it joined the publication and commits
    // after: whether the stream decodes its change depends on when the server's decoding
    // read the publication, so resume waits for it, and the snapshot holds it.
    let held = connect(&url).await;
    held.batch_execute(
        r#"BEGIN; INSERT INTO "Added" ("Id", "V", j) VALUES (0, 'held', '{"h" :1}')"#,
    )
    .await
    .unwrap();
    let commit = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(1500)).await;
        held.batch_execute("COMMIT").await.unwrap();
        held
    });
    let mut cap = Capture::connect(source(&url, BOTH)).await.unwrap();
    let t0 = Instant::now();
    let mut pos = cap.resume(&pos).await.unwrap();
    let waited = t0.elapsed();
    assert_eq!(pos.tables.len(), 2);
    assert_eq!(pos.snapshot.as_ref().map(|s| s.table), Some(1));
    sink.execute(&cap.target_ddl("replica").await.unwrap())
        .await
        .unwrap();
    let in_pub = "SELECT count(*) FROM pg_publication_tables WHERE pubname = 'add_slot' AND tablename = 'Added'";
    assert_eq!(c.query_one(in_pub, &[]).await.unwrap().get::<_, i64>(0), 1);
    // The added table's snapshot, page by page, while the writer goes on.
    let (w0, mut pages) = (done.load(Ordering::Relaxed), 0);
    while pos.snapshot.is_some() {
        let b = cap.next(&pos).await.unwrap();
        seal(&wal, cp, &b);
        cp += 1;
        walsink_tokio::deliver_ready(&wal, &mut sink).await.unwrap();
        pos = b.pos;
        pages += 1;
    }
    let during = done.load(Ordering::Relaxed) - w0;
    // Then the stream, still under writes.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    pos = drain(&mut cap, &wal, &mut sink, &mut cp, pos).await;
    stop.store(true, Ordering::Relaxed);
    w.await.unwrap();
    drop(commit.await.unwrap());
    let total = done.load(Ordering::Relaxed);
    pos = drain(&mut cap, &wal, &mut sink, &mut cp, pos).await;
    eprintln!(
        "resume waited {waited:?} for the held transaction; {pages} snapshot pages, {during} writer transactions during them, {total} in all; {} events",
        pos.events
    );
    assert!(
        waited >= Duration::from_millis(1000),
        "resume did not wait for the held transaction: {waited:?}"
    );
    assert!(during > 0, "the writer did not run during the snapshot");
    assert_same(&c, "a").await;
    assert_same(&c, "Added").await;
    let held: Option<String> = c
        .query_opt(r#"SELECT "V" FROM replica."Added" WHERE "Id" = 0"#, &[])
        .await
        .unwrap()
        .map(|r| r.get(0));
    assert_eq!(held.as_deref(), Some("held"));
}

#[tokio::test(flavor = "multi_thread")]
#[cfg_attr(
    not(servers),
    ignore = "needs WALSINK_TEST_SERVERS=1 and the PostgreSQL binaries"
)]
async fn drops_during_an_added_tables_snapshot_end_exact() {
    let seed = std::env::var("SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(30);
    let mut rng = fastrand::Rng::with_seed(seed);
    let pg = Cluster::start(&[("wal_level", "logical")]).expect("private cluster");
    let url = pg.url("postgres");
    let c = connect(&url).await;
    c.batch_execute(TABLES).await.unwrap();
    let sink_cfg = Config::from_url(&format!("{url}?schema=replica")).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let wal = new_wal(&dir);
    let mut cp = 1;
    let mut cap = Capture::connect(source(&url, ONE)).await.unwrap();
    let start = cap.start().await.unwrap();
    let mut sink = CdcSink::connect(sink_cfg.clone()).await.unwrap();
    sink.execute(&cap.target_ddl("replica").await.unwrap())
        .await
        .unwrap();
    let first = drain(&mut cap, &wal, &mut sink, &mut cp, start).await;
    drop((cap, sink));
    let (stop, done) = (
        Arc::new(AtomicBool::new(false)),
        Arc::new(AtomicU64::new(0)),
    );
    let w = writer(url.clone(), seed, stop.clone(), done.clone());
    // What the log's newest checkpoint and the target's newest commit say.
    let mut sealed = first.clone();
    let mut metas: Vec<(u64, SourcePos)> = Vec::new();
    let mut committed = first;
    let (mut rounds, mut in_snapshot, mut before_first, mut rewinds) = (0, 0, 0, 0);
    // Drop rounds until some fell inside the added table's snapshot and the stream after it
    // was reached.
    while rounds < 40 && (in_snapshot < 4 || before_first < 2 || sealed.snapshot.is_some()) {
        rounds += 1;
        let mut cap = Capture::connect(source(&url, BOTH)).await.unwrap();
        let mut sink = CdcSink::connect(sink_cfg.clone()).await.unwrap();
        let from = if rng.u8(..5) == 0 {
            // A rewind: the target's older position, as after a lost log tail.
            rewinds += 1;
            committed.clone()
        } else {
            sealed.clone()
        };
        let mut pos = cap.resume(&from).await.unwrap();
        sink.execute(&cap.target_ddl("replica").await.unwrap())
            .await
            .unwrap();
        let reads = if rounds <= 2 { 0 } else { rng.usize(0..6) };
        if reads == 0 && from.tables.len() == 1 {
            // Dropped after the table joined the publication, before anything was kept.
            before_first += 1;
        }
        for _ in 0..reads {
            let b = cap.next(&pos).await.unwrap();
            if b.pos == pos {
                break;
            }
            seal(&wal, cp, &b);
            metas.push((cp, b.pos.clone()));
            cp += 1;
            sealed = b.pos.clone();
            pos = b.pos;
            if rng.u8(..3) > 0 {
                walsink_tokio::deliver_ready(&wal, &mut sink).await.unwrap();
                let upto = wal.health().committed.unwrap_or(0);
                if let Some((_, p)) = metas.iter().rev().find(|(c, _)| *c <= upto) {
                    committed = p.clone();
                    if rng.bool() {
                        cap.advance(p.end_lsn).await.unwrap();
                    }
                }
            }
        }
        if pos.tables.len() == 2
            && pos
                .snapshot
                .as_ref()
                .is_some_and(|s| s.table == 1 && s.after.is_some())
        {
            in_snapshot += 1;
        }
        drop((cap, sink));
    }
    stop.store(true, Ordering::Relaxed);
    w.await.unwrap();
    let mut cap = Capture::connect(source(&url, BOTH)).await.unwrap();
    let mut sink = CdcSink::connect(sink_cfg.clone()).await.unwrap();
    let pos = cap.resume(&sealed).await.unwrap();
    let pos = drain(&mut cap, &wal, &mut sink, &mut cp, pos).await;
    eprintln!(
        "seed {seed}: {rounds} dropped rounds, {in_snapshot} inside the added table's snapshot, {before_first} between joining the publication and the first checkpoint, {rewinds} rewinds; {} writer transactions; {} checkpoints, {} events",
        done.load(Ordering::Relaxed),
        cp - 1,
        pos.events
    );
    assert!(
        in_snapshot >= 4 && before_first >= 2,
        "too few drops where they matter"
    );
    assert_eq!(pos.tables.len(), 2);
    assert!(pos.snapshot.is_none());
    assert_same(&c, "a").await;
    assert_same(&c, "Added").await;
}
