//! Delivery into PostgreSQL through walsink against the floor of the same work done directly
//! with the same client, in interleaved rounds of one run.
//!
//! - **floor**: one transaction, a binary `COPY` of the rows (encoded by hand from memory,
//!   sent in 256 KiB messages) and one `COMMIT`, over tokio-postgres;
//! - **walsink, marker mode**: the same rows sealed as one checkpoint in a walsink log,
//!   delivered by `PgSink` (read back from the log, mapped by `RawRows`, COPY, marker, COMMIT).
//!
//! Both write the same table layout (a fresh table each, dropped after). The ratio is
//! floor time / walsink time per round (1.0 = as fast as the floor). Then, on a private
//! cluster with prepared transactions, marker mode against two-phase mode: rows/s for the
//! large epoch and the delivery latency of small epochs. Last, on a private cluster serving
//! TLS, marker mode in plain text (`sslmode=disable`) against `sslmode=verify-full`, in
//! interleaved rounds: the ratio TLS rows/s / plain rows/s for the large epoch and the latency
//! of small epochs (connections are reused, so the handshake is not in the rows).
//!
//! Then the ownership check's cost: epochs of 1,000 records delivered by a sink that claimed
//! its shard (every transaction reads the owner row `FOR SHARE` first) against one that did
//! not, interleaved.
//!
//! `cargo bench -p walsink-postgres --features testkit --bench copy -- [RECORDS] [ROUNDS]`
//! (default 1000000 records of 256 B, 5 rounds; `WALSINK_BENCH_PG` overrides the server,
//! default postgres://postgres@127.0.0.1:5432/test).

use bytes::{BufMut, BytesMut};
use futures_util::SinkExt;
use std::sync::Arc;
use std::time::{Duration, Instant};
use walsink::{MemoryCommitStore, Options, WalSink};
use walsink_postgres::testkit::Cluster;
use walsink_postgres::{Config, PgSink};

const SIZE: usize = 256;

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

async fn client(url: &str) -> tokio_postgres::Client {
    let (c, conn) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .expect("connect");
    tokio::spawn(conn);
    c
}

const DDL: &str = "(sink_id text NOT NULL, subtask integer NOT NULL, checkpoint bigint NOT NULL, idx bigint NOT NULL, payload bytea NOT NULL)";

/// The floor: BEGIN, COPY of the rows encoded by hand, COMMIT.
async fn floor(url: &str, table: &str, recs: &[Vec<u8>]) -> Duration {
    let c = client(url).await;
    c.batch_execute(&format!("CREATE TABLE {table} {DDL}"))
        .await
        .unwrap();
    let t = Instant::now();
    c.batch_execute("BEGIN").await.unwrap();
    let sink = c
        .copy_in::<_, bytes::Bytes>(&format!(
            "COPY {table} (sink_id, subtask, checkpoint, idx, payload) FROM STDIN (FORMAT binary)"
        ))
        .await
        .unwrap();
    futures_util::pin_mut!(sink);
    let cap = 256 << 10;
    let mut buf = BytesMut::with_capacity(cap + 4096);
    buf.put_slice(b"PGCOPY\n\xff\r\n\0");
    buf.put_i32(0);
    buf.put_i32(0);
    let sink_id = b"bench";
    for (i, r) in recs.iter().enumerate() {
        buf.put_i16(5);
        buf.put_i32(sink_id.len() as i32);
        buf.put_slice(sink_id);
        buf.put_i32(4);
        buf.put_i32(0);
        buf.put_i32(8);
        buf.put_i64(1);
        buf.put_i32(8);
        buf.put_i64(i as i64);
        buf.put_i32(r.len() as i32);
        buf.put_slice(r);
        if buf.len() >= cap {
            let full = std::mem::replace(&mut buf, BytesMut::with_capacity(cap + 4096));
            sink.send(full.freeze()).await.unwrap();
        }
    }
    buf.put_i16(-1);
    sink.send(buf.freeze()).await.unwrap();
    let n = sink.as_mut().finish().await.unwrap();
    assert_eq!(n, recs.len() as u64);
    c.batch_execute("COMMIT").await.unwrap();
    let d = t.elapsed();
    c.batch_execute(&format!("DROP TABLE {table}"))
        .await
        .unwrap();
    d
}

/// A log holding `recs` as checkpoints of `per` records, complete.
fn log(sink_id: &str, recs: &[Vec<u8>], per: usize) -> (tempfile::TempDir, Arc<WalSink>) {
    let dir = tempfile::tempdir().unwrap();
    let (wal, _) = WalSink::open_with(
        Arc::new(walsink::storage::FsStorage::new(dir.path()).unwrap()),
        Options::new(sink_id).segment_size(256 << 20),
        Box::new(MemoryCommitStore::new()),
    )
    .unwrap();
    for (i, part) in recs.chunks(per).enumerate() {
        wal.append_batch(part.iter().map(|r| r.as_slice())).unwrap();
        let cp = i as u64 + 1;
        wal.checkpoint(cp, b"bench").unwrap();
        wal.checkpoint_complete(cp).unwrap();
    }
    (dir, Arc::new(wal))
}

/// walsink: the same rows delivered from the log by PgSink; returns the total time and the
/// time of each epoch's delivery.
async fn through_walsink(
    url: &str,
    table: &str,
    mode: &str,
    recs: &[Vec<u8>],
    per: usize,
) -> (Duration, Vec<Duration>) {
    through_walsink_owned(url, table, mode, recs, per, false).await
}

/// [`through_walsink`], the shard claimed first when `claimed` (every epoch's transaction
/// then checks the owner row).
async fn through_walsink_owned(
    url: &str,
    table: &str,
    mode: &str,
    recs: &[Vec<u8>],
    per: usize,
    claimed: bool,
) -> (Duration, Vec<Duration>) {
    let sink_id = table.replace('_', "-");
    let (_dir, wal) = log(&sink_id, recs, per);
    // Plain text unless asked: the floor's client is plain too (and TLS has its own section).
    let tls = if mode.contains("sslmode=") {
        ""
    } else {
        "&sslmode=disable"
    };
    let mut sink =
        PgSink::new(Config::from_url(&format!("{url}?table={table}{mode}{tls}")).unwrap());
    sink.connect().await.unwrap();
    if claimed {
        sink.claim(&sink_id, 0, &walsink::Owner::new(wal.log_id()))
            .await
            .unwrap();
    }
    let mut each = Vec::new();
    let t = Instant::now();
    while wal.health().backlog_epochs > 0 {
        // One epoch at a time, to time each delivery: the wrapper refuses the second.
        let e = Instant::now();
        let mut one = OneEpoch(&mut sink, false);
        let _ = walsink_tokio::deliver_ready(&wal, &mut one).await;
        assert!(one.1, "an epoch was delivered");
        each.push(e.elapsed());
    }
    let d = t.elapsed();
    assert_eq!(wal.health().delivered_records, recs.len() as u64);
    let c = client(url).await;
    c.batch_execute(&format!("DROP TABLE {table}"))
        .await
        .unwrap();
    (d, each)
}

/// Delivers one epoch, then fails retryably so deliver_ready returns (for per-epoch times).
struct OneEpoch<'a>(&'a mut PgSink, bool);

impl walsink_tokio::AsyncSink for OneEpoch<'_> {
    async fn deliver(&mut self, epoch: &walsink::Epoch) -> Result<(), walsink::SinkError> {
        if self.1 {
            return Err(walsink::SinkError::retryable("one at a time"));
        }
        self.1 = true;
        self.0.deliver(epoch).await
    }
    fn stores_marker(&self) -> bool {
        true
    }
    async fn is_committed(&mut self, key: &walsink::EpochKey) -> Result<bool, walsink::SinkError> {
        if self.1 {
            return Err(walsink::SinkError::retryable("one at a time"));
        }
        self.0.is_committed(key).await
    }
}

fn stats(v: &mut [f64]) -> (f64, f64, f64) {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    (v[v.len() / 2], v[0], v[v.len() - 1])
}

fn main() {
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with("--"))
        .collect();
    let n: usize = args
        .first()
        .and_then(|a| a.parse().ok())
        .unwrap_or(1_000_000);
    let rounds: usize = args.get(1).and_then(|a| a.parse().ok()).unwrap_or(5);
    let url = std::env::var("WALSINK_BENCH_PG")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into());
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let recs: Vec<Vec<u8>> = (0..n as u64).map(record).collect();
    let tag = format!("bench_{}", std::process::id());
    println!("{n} records of {SIZE} B, {rounds} rounds, interleaved, server {url}");
    let mut ratios = Vec::new();
    let (mut floor_rps, mut ws_rps) = (Vec::new(), Vec::new());
    rt.block_on(async {
        for round in 0..rounds {
            let (f, w) = if round % 2 == 0 {
                let f = floor(&url, &format!("{tag}_f{round}"), &recs).await;
                let (w, _) =
                    through_walsink(&url, &format!("{tag}_w{round}"), "", &recs, n).await;
                (f, w)
            } else {
                let (w, _) =
                    through_walsink(&url, &format!("{tag}_w{round}"), "", &recs, n).await;
                let f = floor(&url, &format!("{tag}_f{round}"), &recs).await;
                (f, w)
            };
            let r = f.as_secs_f64() / w.as_secs_f64();
            println!(
                "round {round}: floor {:.3}s ({:.0} rows/s), walsink {:.3}s ({:.0} rows/s), ratio {r:.3}",
                f.as_secs_f64(),
                n as f64 / f.as_secs_f64(),
                w.as_secs_f64(),
                n as f64 / w.as_secs_f64()
            );
            ratios.push(r);
            floor_rps.push(n as f64 / f.as_secs_f64());
            ws_rps.push(n as f64 / w.as_secs_f64());
        }
    });
    let (m, lo, hi) = stats(&mut ratios);
    let (fm, _, _) = stats(&mut floor_rps);
    let (wm, _, _) = stats(&mut ws_rps);
    println!(
        "marker mode vs raw COPY+COMMIT: ratio median {m:.3} (min {lo:.3}, max {hi:.3}); floor {fm:.0} rows/s, walsink {wm:.0} rows/s"
    );

    // The ownership check: a claimed sink reads its owner row FOR SHARE first in every epoch's
    // transaction. Epochs of 1,000 records (the check is per transaction), claimed against
    // unclaimed, interleaved; the ratio is claimed rows/s over unclaimed rows/s.
    rt.block_on(async {
        let per = 1000.min(n);
        let (mut ratio, mut un, mut cl) = (Vec::new(), Vec::new(), Vec::new());
        for round in 0..rounds {
            let mut t = [0.0f64; 2];
            let order = if round % 2 == 0 { [false, true] } else { [true, false] };
            for claimed in order {
                let (d, _) = through_walsink_owned(
                    &url,
                    &format!("{tag}_o{round}{}", claimed as u8),
                    "",
                    &recs,
                    per,
                    claimed,
                )
                .await;
                t[claimed as usize] = n as f64 / d.as_secs_f64();
            }
            println!(
                "round {round}: epochs of {per}: unclaimed {:.0} rows/s, claimed {:.0} rows/s, ratio {:.3}",
                t[0],
                t[1],
                t[1] / t[0]
            );
            ratio.push(t[1] / t[0]);
            un.push(t[0]);
            cl.push(t[1]);
        }
        let (m, lo, hi) = stats(&mut ratio);
        let (u, _, _) = stats(&mut un);
        let (c, _, _) = stats(&mut cl);
        println!(
            "ownership check, epochs of {per}: claimed/unclaimed median {m:.3} (min {lo:.3}, max {hi:.3}); unclaimed {u:.0} rows/s, claimed {c:.0} rows/s"
        );
    });

    // Two-phase against marker mode on a private cluster (the shared server has no prepared
    // transactions): the large epoch, and the latency of small epochs.
    let pg = Cluster::start(&[
        ("max_prepared_transactions", "10"),
        ("shared_buffers", "256MB"),
    ])
    .expect("private cluster");
    let purl = pg.url("postgres");
    let small: Vec<Vec<u8>> = recs.iter().take(200 * 100).cloned().collect();
    rt.block_on(async {
        let (mut big_m, mut big_2) = (Vec::new(), Vec::new());
        let (mut lat_m, mut lat_2) = (Vec::new(), Vec::new());
        for round in 0..rounds.min(3) {
            for mode in ["", "&mode=2pc"] {
                let (d, _) =
                    through_walsink(&purl, &format!("{tag}_b{round}{}", mode.len()), mode, &recs, n)
                        .await;
                let (_, each) = through_walsink(
                    &purl,
                    &format!("{tag}_s{round}{}", mode.len()),
                    mode,
                    &small,
                    100,
                )
                .await;
                let rps = n as f64 / d.as_secs_f64();
                let lat: Vec<f64> = each.iter().map(|d| d.as_secs_f64() * 1e3).collect();
                if mode.is_empty() {
                    big_m.push(rps);
                    lat_m.extend(lat);
                } else {
                    big_2.push(rps);
                    lat_2.extend(lat);
                }
            }
        }
        let (a, a0, a1) = stats(&mut big_m);
        let (b, b0, b1) = stats(&mut big_2);
        let (la, _, _) = stats(&mut lat_m);
        let (lb, _, _) = stats(&mut lat_2);
        let p90 = |v: &Vec<f64>| v[v.len() * 9 / 10];
        println!(
            "private cluster, one epoch of {n}: marker {a:.0} rows/s ({a0:.0}..{a1:.0}), 2pc {b:.0} rows/s ({b0:.0}..{b1:.0})"
        );
        println!(
            "private cluster, epochs of 100 records: delivery latency p50 marker {la:.2} ms, 2pc {lb:.2} ms; p90 marker {:.2} ms, 2pc {:.2} ms",
            p90(&lat_m),
            p90(&lat_2)
        );
    });
    drop(pg);

    // TLS (verify-full, the kit's rustls settings) against plain text, same private cluster.
    let certs = tempfile::tempdir().unwrap();
    let ca = walsink_kit::testkit::TestCa::new(certs.path(), "ca").unwrap();
    let server = ca
        .server(
            "server",
            &["localhost", "127.0.0.1"],
            walsink_kit::testkit::Validity::Current,
        )
        .unwrap();
    let pg = Cluster::start_with(
        &[("shared_buffers", "256MB")],
        &walsink_postgres::testkit::Setup {
            tls: Some((server.cert, server.key)),
            ..Default::default()
        },
    )
    .expect("private TLS cluster");
    let turl = pg.url("postgres");
    let verify = format!(
        "&sslmode=verify-full&sslrootcert={}",
        ca.ca_file().display()
    );
    rt.block_on(async {
        let (mut ratio, mut lat_p, mut lat_t) = (Vec::new(), Vec::new(), Vec::new());
        let (mut rps_p, mut rps_t) = (Vec::new(), Vec::new());
        for round in 0..rounds {
            let order: [&str; 2] = if round % 2 == 0 {
                ["&sslmode=disable", verify.as_str()]
            } else {
                [verify.as_str(), "&sslmode=disable"]
            };
            let (mut plain, mut tls) = (0.0, 0.0);
            for (k, mode) in order.iter().enumerate() {
                let (d, _) =
                    through_walsink(&turl, &format!("{tag}_t{round}{k}"), mode, &recs, n).await;
                let (_, each) =
                    through_walsink(&turl, &format!("{tag}_u{round}{k}"), mode, &small, 100).await;
                let rps = n as f64 / d.as_secs_f64();
                let lat = each.iter().map(|d| d.as_secs_f64() * 1e3);
                if mode.contains("verify-full") {
                    tls = rps;
                    lat_t.extend(lat);
                } else {
                    plain = rps;
                    lat_p.extend(lat);
                }
            }
            println!("TLS round {round}: plain {plain:.0} rows/s, verify-full {tls:.0} rows/s, ratio {:.3}", tls / plain);
            ratio.push(tls / plain);
            rps_p.push(plain);
            rps_t.push(tls);
        }
        let (m, lo, hi) = stats(&mut ratio);
        let (p, _, _) = stats(&mut rps_p);
        let (t, _, _) = stats(&mut rps_t);
        let (lp, _, _) = stats(&mut lat_p);
        let (lt, _, _) = stats(&mut lat_t);
        println!(
            "TLS verify-full vs plain, one epoch of {n}: ratio median {m:.3} (min {lo:.3}, max {hi:.3}); plain {p:.0} rows/s, TLS {t:.0} rows/s; epochs of 100 records p50 plain {lp:.2} ms, TLS {lt:.2} ms"
        );
    });
}
