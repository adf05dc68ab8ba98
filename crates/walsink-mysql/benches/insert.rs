//! Delivery into MariaDB/MySQL through walsink against the best bulk insert of the same rows
//! done directly with the same client (mysql_async), in one criterion run:
//!
//! - `floor_insert`: one transaction of multi-row `INSERT`s of the rows (built by hand from
//!   memory, 4 MiB statements, the same escaping), then `COMMIT`;
//! - `floor_load_data`: one transaction, `LOAD DATA LOCAL INFILE` of the rows as
//!   tab-separated text streamed from memory, then `COMMIT`;
//! - `floor_load_data_xa`: the same load as an XA transaction (XA START, the load, XA END,
//!   XA PREPARE, XA COMMIT), the floor of XA mode;
//! - `walsink_marker` and `walsink_xa`: the same rows sealed as one checkpoint in a walsink
//!   log, delivered by `MySqlSink` (read from the log, mapped by `RawRows`, the marker, the
//!   INSERTs, COMMIT; or XA END, XA PREPARE, XA COMMIT).
//!
//! Every variant writes a table of the same layout, emptied (untimed) before each
//! iteration. The ratio to report is floor time / walsink time (1.0 = as fast as the floor).
//!
//! `cargo bench -p walsink-mysql --bench insert` (`WALSINK_BENCH_MYSQL` overrides the
//! server, default mysql://root@127.0.0.1:3306/test; `WALSINK_BENCH_RECORDS` the rows per
//! epoch, default 50000 of 200 bytes). Without a server it prints why and measures nothing.

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use mysql_async::prelude::Queryable;
use std::sync::Arc;
use std::time::{Duration, Instant};
use walsink::{MemoryCommitStore, Next, Options, WalSink};
use walsink_mysql::table::push_binary_literal;
use walsink_mysql::{Config, MySqlSink};
use walsink_tokio::AsyncSink;

const SIZE: usize = 200;

fn record(i: u64) -> Vec<u8> {
    let mut r = vec![0u8; SIZE];
    let mut x = i.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    for b in r.iter_mut() {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        *b = b'a' + (x % 26) as u8;
    }
    r[..8].copy_from_slice(&i.to_be_bytes());
    r
}

fn url() -> String {
    std::env::var("WALSINK_BENCH_MYSQL")
        .unwrap_or_else(|_| "mysql://root@127.0.0.1:3306/test".to_string())
}

async fn client(url: &str) -> Result<mysql_async::Conn, mysql_async::Error> {
    let opts = mysql_async::Opts::from_url(url).expect("a mysql:// URL");
    mysql_async::Conn::new(mysql_async::OptsBuilder::from_opts(opts).prefer_socket(false)).await
}

const DDL: &str = "(sink_id VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL, subtask INT UNSIGNED NOT NULL, checkpoint BIGINT UNSIGNED NOT NULL, idx BIGINT UNSIGNED NOT NULL, payload LONGBLOB NOT NULL, PRIMARY KEY (sink_id, subtask, checkpoint, idx)) ENGINE=InnoDB";

/// One transaction of multi-row INSERTs of at most 4 MiB each.
async fn floor_insert(c: &mut mysql_async::Conn, table: &str, recs: &[Vec<u8>]) {
    let head = format!(
        "INSERT INTO `{table}` (`sink_id`, `subtask`, `checkpoint`, `idx`, `payload`) VALUES "
    );
    let mut stmt = Vec::with_capacity((4 << 20) + 4096);
    stmt.extend_from_slice(head.as_bytes());
    c.query_drop("START TRANSACTION").await.unwrap();
    let mut n = 0;
    for (i, r) in recs.iter().enumerate() {
        if n > 0 {
            if stmt.len() + r.len() * 2 + 64 > 4 << 20 {
                c.query_drop(&stmt[..]).await.unwrap();
                stmt.truncate(head.len());
                n = 0;
            } else {
                stmt.push(b',');
            }
        }
        stmt.extend_from_slice(format!("('bench',0,1,{i},").as_bytes());
        push_binary_literal(&mut stmt, r);
        stmt.push(b')');
        n += 1;
    }
    if n > 0 {
        c.query_drop(&stmt[..]).await.unwrap();
    }
    c.query_drop("COMMIT").await.unwrap();
}

/// Appends `bytes` escaped for LOAD DATA's default `ESCAPED BY '\\'`.
fn push_load_escaped(out: &mut Vec<u8>, bytes: &[u8]) {
    for &b in bytes {
        match b {
            b'\\' => out.extend_from_slice(b"\\\\"),
            b'\t' => out.extend_from_slice(b"\\t"),
            b'\n' => out.extend_from_slice(b"\\n"),
            0 => out.extend_from_slice(b"\\0"),
            _ => out.push(b),
        }
    }
}

/// One transaction: LOAD DATA LOCAL INFILE of the rows as tab-separated text from memory;
/// with `xa`, an XA transaction under that xid (XA START, the load, XA END, XA PREPARE,
/// XA COMMIT), the floor of XA mode.
async fn floor_load_data(
    c: &mut mysql_async::Conn,
    table: &str,
    recs: &[Vec<u8>],
    xa: Option<&str>,
) {
    let mut body = Vec::with_capacity(recs.len() * (SIZE + 32));
    for (i, r) in recs.iter().enumerate() {
        body.extend_from_slice(format!("bench\t0\t1\t{i}\t").as_bytes());
        push_load_escaped(&mut body, r);
        body.push(b'\n');
    }
    let chunks: Vec<std::io::Result<bytes::Bytes>> = body
        .chunks(1 << 20)
        .map(|c| Ok(bytes::Bytes::copy_from_slice(c)))
        .collect();
    match xa {
        None => c.query_drop("START TRANSACTION").await.unwrap(),
        Some(x) => c.query_drop(format!("XA START '{x}'")).await.unwrap(),
    }
    c.set_infile_handler(async move {
        Ok(Box::pin(futures_util::stream::iter(chunks)) as mysql_async::InfileData)
    });
    c.query_drop(format!(
        "LOAD DATA LOCAL INFILE 'memory' INTO TABLE `{table}` CHARACTER SET binary (sink_id, subtask, checkpoint, idx, payload)"
    ))
    .await
    .unwrap();
    assert_eq!(c.affected_rows(), recs.len() as u64);
    match xa {
        None => c.query_drop("COMMIT").await.unwrap(),
        Some(x) => {
            c.query_drop(format!("XA END '{x}'")).await.unwrap();
            c.query_drop(format!("XA PREPARE '{x}'")).await.unwrap();
            c.query_drop(format!("XA COMMIT '{x}'")).await.unwrap();
        }
    }
}

/// A log holding `recs` as checkpoint 1, and that epoch read out for delivery.
fn epoch(sink_id: &str, recs: &[Vec<u8>]) -> (tempfile::TempDir, walsink::Epoch) {
    let dir = tempfile::tempdir().unwrap();
    let (wal, _) = WalSink::open_with(
        Arc::new(walsink::storage::FsStorage::new(dir.path()).unwrap()),
        Options::new(sink_id).segment_size(256 << 20),
        Box::new(MemoryCommitStore::new()),
    )
    .unwrap();
    wal.append_batch(recs.iter().map(|r| r.as_slice())).unwrap();
    wal.checkpoint(1, b"bench").unwrap();
    wal.checkpoint_complete(1).unwrap();
    let mut d = wal.deliverer().unwrap();
    let Next::Deliver(p) = d.next_step().unwrap() else {
        panic!("an epoch should be due")
    };
    let e = d.read(&p).unwrap();
    (dir, e)
}

fn bench(c: &mut Criterion) {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let url = url();
    let Ok(mut admin) = rt.block_on(client(&url)) else {
        eprintln!("no MySQL/MariaDB server at {url}: nothing measured (set WALSINK_BENCH_MYSQL)");
        return;
    };
    let n: usize = std::env::var("WALSINK_BENCH_RECORDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(50_000);
    let recs: Vec<Vec<u8>> = (0..n as u64).map(record).collect();
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    let tag = format!("{}_{:x}", std::process::id(), nanos & 0xffff_ffff);
    let tables: Vec<String> = ["ins", "load", "marker", "xa", "loadxa"]
        .iter()
        .map(|t| format!("bench_{t}_{tag}"))
        .collect();
    for t in &tables {
        rt.block_on(admin.query_drop(format!("CREATE TABLE `{t}` {DDL}")))
            .unwrap();
    }
    let mut g = c.benchmark_group("mysql_bulk");
    g.throughput(Throughput::Elements(n as u64))
        .sample_size(10)
        .measurement_time(Duration::from_secs(10))
        .warm_up_time(Duration::from_secs(2));
    let empty = |rt: &tokio::runtime::Runtime, admin: &mut mysql_async::Conn, t: &str| {
        rt.block_on(admin.query_drop(format!("TRUNCATE TABLE `{t}`")))
            .unwrap();
    };
    g.bench_function("floor_insert", |b| {
        b.iter_custom(|iters| {
            let mut total = Duration::ZERO;
            for _ in 0..iters {
                empty(&rt, &mut admin, &tables[0]);
                let mut c = rt.block_on(client(&url)).unwrap();
                let t = Instant::now();
                rt.block_on(floor_insert(&mut c, &tables[0], &recs));
                total += t.elapsed();
            }
            total
        })
    });
    for (name, table, xa) in [
        ("floor_load_data", &tables[1], None),
        (
            "floor_load_data_xa",
            &tables[4],
            Some(format!("bench-{tag}")),
        ),
    ] {
        g.bench_function(name, |b| {
            b.iter_custom(|iters| {
                let mut total = Duration::ZERO;
                for _ in 0..iters {
                    empty(&rt, &mut admin, table);
                    let mut c = rt.block_on(client(&url)).unwrap();
                    let t = Instant::now();
                    rt.block_on(floor_load_data(&mut c, table, &recs, xa.as_deref()));
                    total += t.elapsed();
                }
                total
            })
        });
    }
    for (name, table, mode) in [
        ("walsink_marker", &tables[2], ""),
        ("walsink_xa", &tables[3], "&mode=xa"),
    ] {
        let sink_id = table.replace('_', "-");
        let (_dir, e) = epoch(&sink_id, &recs);
        g.bench_function(name, |b| {
            b.iter_custom(|iters| {
                let mut total = Duration::ZERO;
                for _ in 0..iters {
                    empty(&rt, &mut admin, table);
                    rt.block_on(
                        admin.exec_drop(
                            "DELETE FROM walsink_markers WHERE sink_id = ?",
                            (&sink_id,),
                        ),
                    )
                    .unwrap();
                    let mut sink = MySqlSink::new(
                        Config::from_url(&format!("{url}?table={table}{mode}")).unwrap(),
                    );
                    rt.block_on(sink.connect()).unwrap();
                    let t = Instant::now();
                    rt.block_on(sink.deliver(&e)).unwrap();
                    total += t.elapsed();
                }
                total
            })
        });
    }
    g.finish();
    for t in &tables {
        rt.block_on(admin.query_drop(format!("DROP TABLE `{t}`")))
            .unwrap();
    }
}

criterion_group!(benches, bench);
criterion_main!(benches);
