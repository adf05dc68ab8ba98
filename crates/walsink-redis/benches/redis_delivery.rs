//! Delivery into the local Redis through walsink (the sink's transactions with their marker,
//! epochs read from the log and marked committed) against the floor of the same work done
//! directly with the same client, per mode:
//!
//! - list: pipelined multi-value `RPUSH` of the same records, 1000 values per command;
//! - hash: pipelined multi-pair `HSET` of the same `FIELD<TAB>VALUE` records, 500 pairs
//!   (1000 values) per command;
//! - stream: pipelined `XADD key * record <bytes>`, one per record;
//!
//! a whole epoch per pipeline. Interleaved rounds in one run; the result is the ratio of
//! throughputs with its spread. A null sink (the log read alone) shows the log's share.
//!
//! `cargo bench -p walsink-redis --bench redis_delivery [-- RECORDS EPOCHS ROUNDS [MODE…]
//! [PARAM=VALUE…]]` (defaults 400000 records of 64-100 bytes, 8 epochs, 7 rounds, modes list
//! hash stream; `PARAM=VALUE` are added to the sink URL, e.g. `in_flight=8`).
//! Needs the local Redis.

use std::sync::Arc;
use std::time::{Duration, Instant};
use walsink::{Options, WalSink};
use walsink_redis::{Config, Mode, RedisSink};

const URL: &str = "redis://127.0.0.1:6379/0";

fn records(n: usize, mode: Mode) -> Vec<Vec<u8>> {
    (0..n)
        .map(|i| match mode {
            Mode::Hash => format!("field{i:010}\t{}", "x".repeat(44 + i % 37)).into_bytes(),
            _ => format!("record {i:010} {}", "x".repeat(50 + i % 37)).into_bytes(),
        })
        .collect()
}

async fn conn() -> redis::aio::MultiplexedConnection {
    redis::Client::open(URL)
        .unwrap()
        .get_multiplexed_async_connection_with_config(
            &redis::AsyncConnectionConfig::new()
                .set_response_timeout(Some(Duration::from_secs(60))),
        )
        .await
        .expect("the local Redis at 127.0.0.1:6379")
}

async fn del(c: &mut redis::aio::MultiplexedConnection, keys: &[String]) {
    let _: () = redis::cmd("DEL").arg(keys).query_async(c).await.unwrap();
}

/// How many records (list, stream) or fields (hash) `key` holds.
async fn count(c: &mut redis::aio::MultiplexedConnection, mode: Mode, key: &str) -> usize {
    let cmd = match mode {
        Mode::List => "LLEN",
        Mode::Hash => "HLEN",
        Mode::Stream => "XLEN",
    };
    redis::cmd(cmd).arg(key).query_async(c).await.unwrap()
}

/// The floor: every epoch as one pipeline of the mode's native commands.
async fn raw(recs: &[Vec<u8>], epochs: usize, key: &str, mode: Mode) -> Duration {
    let mut c = conn().await;
    let per = recs.len() / epochs;
    let t = Instant::now();
    for e in recs.chunks(per) {
        let mut p = redis::pipe();
        match mode {
            Mode::List => {
                for chunk in e.chunks(1000) {
                    p.cmd("RPUSH").arg(key).arg(chunk).ignore();
                }
            }
            Mode::Hash => {
                for chunk in e.chunks(500) {
                    let cmd = p.cmd("HSET").arg(key);
                    for r in chunk {
                        let tab = r.iter().position(|b| *b == b'\t').unwrap();
                        cmd.arg(&r[..tab]).arg(&r[tab + 1..]);
                    }
                    cmd.ignore();
                }
            }
            Mode::Stream => {
                for r in e {
                    p.cmd("XADD")
                        .arg(key)
                        .arg("*")
                        .arg("record")
                        .arg(r)
                        .ignore();
                }
            }
        }
        let _: () = p.query_async(&mut c).await.unwrap();
    }
    let d = t.elapsed();
    assert_eq!(count(&mut c, mode, key).await, recs.len());
    del(&mut c, &[key.to_string()]).await;
    d
}

/// A sink that only reads the records: the log's share of the walsink column.
struct Null;

impl walsink_tokio::AsyncSink for Null {
    async fn deliver(&mut self, epoch: &walsink::Epoch) -> Result<(), walsink::SinkError> {
        let mut chunks = walsink_tokio::AsyncChunks::new(epoch);
        let mut n = 0;
        while let Some(c) = chunks.next().await {
            n += c?.records().map(|r| r.data.len()).sum::<usize>();
        }
        std::hint::black_box(n);
        Ok(())
    }
}

/// Through walsink: a log with the records sealed into `epochs` checkpoints (not timed),
/// then delivered and marked (timed). An empty `key` delivers to the null sink.
async fn walsink(
    recs: &[Vec<u8>],
    epochs: usize,
    key: &str,
    sink_id: &str,
    mode: Mode,
) -> Duration {
    let dir = tempfile::tempdir().unwrap();
    let (wal, _) = WalSink::open(dir.path(), Options::new(sink_id)).unwrap();
    let per = recs.len() / epochs;
    for (i, e) in recs.chunks(per).enumerate() {
        wal.append_batch(e.iter().map(|r| r.as_slice())).unwrap();
        wal.checkpoint(i as u64 + 1, b"").unwrap();
        wal.checkpoint_complete(i as u64 + 1).unwrap();
    }
    let wal = Arc::new(wal);
    if key.is_empty() {
        let t = Instant::now();
        walsink_tokio::deliver_ready(&wal, &mut Null).await.unwrap();
        return t.elapsed();
    }
    let extra = std::env::args()
        .skip(1)
        .filter(|a| a.contains('='))
        .fold(String::new(), |s, a| s + "&" + &a);
    let cfg = Config::from_url(&format!("{URL}?key={key}&mode={}{extra}", mode.name())).unwrap();
    let marker = cfg.marker_key(sink_id, 0);
    let mut sink = RedisSink::new(cfg).unwrap();
    sink.connect().await.unwrap();
    let t = Instant::now();
    let n = walsink_tokio::deliver_ready(&wal, &mut sink).await.unwrap();
    let d = t.elapsed();
    assert_eq!(n, epochs);
    let mut c = conn().await;
    assert_eq!(count(&mut c, mode, key).await, recs.len());
    del(&mut c, &[key.to_string(), marker]).await;
    d
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let nums: Vec<usize> = args.iter().filter_map(|a| a.parse().ok()).collect();
    let mut modes: Vec<Mode> = args
        .iter()
        .filter_map(|a| match a.as_str() {
            "list" => Some(Mode::List),
            "hash" => Some(Mode::Hash),
            "stream" => Some(Mode::Stream),
            _ => None,
        })
        .collect();
    if modes.is_empty() {
        modes = vec![Mode::List, Mode::Hash, Mode::Stream];
    }
    let n = nums.first().copied().unwrap_or(400_000);
    let epochs = nums.get(1).copied().unwrap_or(8);
    let rounds = nums.get(2).copied().unwrap_or(7);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let tag = format!("walsink-bench:{}", std::process::id());
    rt.block_on(async {
        let mut summary = Vec::new();
        for mode in modes {
            let m = mode.name();
            let recs = records(n, mode);
            let bytes: usize = recs.iter().map(Vec::len).sum();
            // Warm-up: connections, the script cache, the page cache.
            raw(&recs, epochs, &format!("{tag}:warm-raw"), mode).await;
            walsink(&recs, epochs, &format!("{tag}:warm-ws"), "warm", mode).await;
            let mut ratios = Vec::new();
            println!("{m}: round  raw rec/s   walsink rec/s  ratio   null sink rec/s");
            for r in 0..rounds {
                let (kr, kw) = (format!("{tag}:{m}:raw:{r}"), format!("{tag}:{m}:ws:{r}"));
                let sid = format!("bench-{m}-{r}");
                // Alternate the order so neither side always runs first.
                let (dr, dw) = if r % 2 == 0 {
                    let a = raw(&recs, epochs, &kr, mode).await;
                    (a, walsink(&recs, epochs, &kw, &sid, mode).await)
                } else {
                    let b = walsink(&recs, epochs, &kw, &sid, mode).await;
                    (raw(&recs, epochs, &kr, mode).await, b)
                };
                let (tr, tw) = (n as f64 / dr.as_secs_f64(), n as f64 / dw.as_secs_f64());
                ratios.push(tw / tr);
                let tn = n as f64 / walsink(&recs, epochs, "", &sid, mode).await.as_secs_f64();
                println!(
                    "{m}: {r:>5}  {tr:>10.0}  {tw:>13.0}  {:.2}   {tn:>15.0}",
                    tw / tr
                );
            }
            ratios.sort_by(f64::total_cmp);
            summary.push(format!(
                "{m}: {n} records ({bytes} bytes) in {epochs} epochs, {rounds} rounds: walsink/raw = {:.2} (min {:.2}, max {:.2})",
                ratios[ratios.len() / 2],
                ratios[0],
                ratios[ratios.len() - 1]
            ));
        }
        for s in summary {
            println!("{s}");
        }
    });
}
