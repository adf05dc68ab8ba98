//! Delivery into the local Redis through walsink (list mode: the chunk script with its
//! marker, epochs read from the log and marked committed) against the floor of the same work
//! done directly with the same client: pipelined `RPUSH` of the same records, 1000 values per
//! command, a whole epoch per pipeline. Interleaved rounds in one run; the result is the
//! ratio of throughputs with its spread. Two more columns split the cost: a null sink (the
//! log's share) and the chunk script called from memory with the same chunks (the script's
//! share, without walsink).
//!
//! `cargo bench -p walsink-redis --bench redis_delivery [-- RECORDS EPOCHS ROUNDS]`
//! (defaults 400000 records of 64-100 bytes, 8 epochs, 7 rounds). Needs the local Redis.

use std::sync::Arc;
use std::time::{Duration, Instant};
use walsink::{Options, WalSink};
use walsink_redis::{Config, RedisSink};

const URL: &str = "redis://127.0.0.1:6379/0";

fn records(n: usize) -> Vec<Vec<u8>> {
    (0..n)
        .map(|i| format!("record {i:010} {}", "x".repeat(50 + i % 37)).into_bytes())
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

/// The floor: every epoch as one pipeline of multi-value RPUSH commands.
async fn raw(recs: &[Vec<u8>], epochs: usize, key: &str) -> Duration {
    let mut c = conn().await;
    let per = recs.len() / epochs;
    let t = Instant::now();
    for e in recs.chunks(per) {
        let mut p = redis::pipe();
        for chunk in e.chunks(1000) {
            p.cmd("RPUSH").arg(key).arg(chunk).ignore();
        }
        let _: () = p.query_async(&mut c).await.unwrap();
    }
    let d = t.elapsed();
    let n: usize = redis::cmd("LLEN")
        .arg(key)
        .query_async(&mut c)
        .await
        .unwrap();
    assert_eq!(n, recs.len());
    del(&mut c, &[key.to_string()]).await;
    d
}

/// The chunk script alone, called from memory with the same chunks (1000 records, 4 calls
/// per pipeline) and no log: the script's share of the walsink column.
async fn raw_script(recs: &[Vec<u8>], epochs: usize, key: &str) -> Duration {
    let mut c = conn().await;
    let sha: String = redis::cmd("SCRIPT")
        .arg("LOAD")
        .arg(walsink_redis::script::SOURCE)
        .query_async(&mut c)
        .await
        .unwrap();
    let marker = format!("walsink:{{{key}}}:committed");
    let per = recs.len() / epochs;
    let t = Instant::now();
    for (cp, e) in recs.chunks(per).enumerate() {
        let calls: Vec<(usize, &[Vec<u8>])> = e.chunks(1000).enumerate().collect();
        for group in calls.chunks(4) {
            let mut p = redis::pipe();
            for (i, chunk) in group {
                let last = (i + 1) * 1000 >= e.len();
                p.cmd("EVALSHA")
                    .arg(&sha)
                    .arg(2)
                    .arg(key)
                    .arg(&marker)
                    .arg("bench/0")
                    .arg(walsink_redis::script::padded(cp as u64 + 1))
                    .arg(i * 1000)
                    .arg(if last { "1" } else { "0" })
                    .arg("list")
                    .arg("")
                    .arg(*chunk)
                    .ignore();
            }
            let _: () = p.query_async(&mut c).await.unwrap();
        }
    }
    let d = t.elapsed();
    let n: usize = redis::cmd("LLEN")
        .arg(key)
        .query_async(&mut c)
        .await
        .unwrap();
    assert_eq!(n, recs.len());
    del(&mut c, &[key.to_string(), marker]).await;
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
/// then delivered and marked (timed).
async fn walsink(recs: &[Vec<u8>], epochs: usize, key: &str, sink_id: &str) -> Duration {
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
    let cfg = Config::from_url(&format!("{URL}?key={key}")).unwrap();
    let marker = cfg.marker_key(0);
    let mut sink = RedisSink::new(cfg).unwrap();
    sink.connect().await.unwrap();
    let t = Instant::now();
    let n = walsink_tokio::deliver_ready(&wal, &mut sink).await.unwrap();
    let d = t.elapsed();
    assert_eq!(n, epochs);
    let mut c = conn().await;
    let len: usize = redis::cmd("LLEN")
        .arg(key)
        .query_async(&mut c)
        .await
        .unwrap();
    assert_eq!(len, recs.len());
    del(&mut c, &[key.to_string(), marker]).await;
    d
}

fn main() {
    let args: Vec<usize> = std::env::args()
        .skip(1)
        .filter_map(|a| a.parse().ok())
        .collect();
    let n = args.first().copied().unwrap_or(400_000);
    let epochs = args.get(1).copied().unwrap_or(8);
    let rounds = args.get(2).copied().unwrap_or(7);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let recs = records(n);
    let bytes: usize = recs.iter().map(Vec::len).sum();
    let tag = format!("walsink-bench:{}", std::process::id());
    rt.block_on(async {
        // Warm-up: connections, the script cache, the page cache.
        raw(&recs, epochs, &format!("{tag}:warm-raw")).await;
        walsink(&recs, epochs, &format!("{tag}:warm-ws"), "warm").await;
        let (mut ratios, mut vs_script) = (Vec::new(), Vec::new());
        println!("round  raw rec/s   walsink rec/s  ratio   null sink rec/s  raw script rec/s");
        for r in 0..rounds {
            let (kr, kw) = (format!("{tag}:raw:{r}"), format!("{tag}:ws:{r}"));
            let sid = format!("bench-{r}");
            // Alternate the order so neither side always runs first.
            let (dr, dw) = if r % 2 == 0 {
                let a = raw(&recs, epochs, &kr).await;
                (a, walsink(&recs, epochs, &kw, &sid).await)
            } else {
                let b = walsink(&recs, epochs, &kw, &sid).await;
                (raw(&recs, epochs, &kr).await, b)
            };
            let (tr, tw) = (n as f64 / dr.as_secs_f64(), n as f64 / dw.as_secs_f64());
            ratios.push(tw / tr);
            let tn = n as f64 / walsink(&recs, epochs, "", &sid).await.as_secs_f64();
            let ts = n as f64
                / raw_script(&recs, epochs, &format!("{tag}:script:{r}"))
                    .await
                    .as_secs_f64();
            vs_script.push(tw / ts);
            println!(
                "{r:>5}  {tr:>10.0}  {tw:>13.0}  {:.2}   {tn:>15.0}  {ts:>16.0}",
                tw / tr
            );
        }
        ratios.sort_by(f64::total_cmp);
        vs_script.sort_by(f64::total_cmp);
        println!(
            "walsink/the same script called from memory = {:.2} (min {:.2}, max {:.2})",
            vs_script[vs_script.len() / 2],
            vs_script[0],
            vs_script[vs_script.len() - 1]
        );
        println!(
            "{n} records ({bytes} bytes) in {epochs} epochs, {rounds} rounds: walsink/raw RPUSH = {:.2} (min {:.2}, max {:.2})",
            ratios[ratios.len() / 2],
            ratios[0],
            ratios[ratios.len() - 1]
        );
    });
}
