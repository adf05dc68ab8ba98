//! Delivery into a JetStream stream on the local NATS through walsink (epochs read from the
//! log, every record published with its `Nats-Msg-Id`, all acks awaited, epochs marked)
//! against the floor of the same publishes done directly with the same client: pipelined
//! JetStream publishes with acks, the same window of publishes in flight, without message
//! ids (the plain floor), with the same ids (the same server work), and with a header of the
//! same length that is not an id (what carrying a header costs, apart from deduplication).
//! Interleaved rounds in one run, the order rotated per round, a new stream per measurement;
//! the result is the ratio of throughputs with its spread.
//!
//! `cargo bench -p walsink-nats --bench nats_delivery [-- RECORDS EPOCHS ROUNDS]`
//! (defaults 200000 records of 64-100 bytes, 8 epochs, 7 rounds). Needs the local NATS.

use async_nats::jetstream::{self, message::PublishMessage};
use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};
use walsink::{Options, WalSink};
use walsink_nats::{Config, NatsSink};

const ADDR: &str = "127.0.0.1:4222";
const IN_FLIGHT: usize = 1024;

fn records(n: usize) -> Vec<Vec<u8>> {
    (0..n)
        .map(|i| format!("record {i:010} {}", "x".repeat(50 + i % 37)).into_bytes())
        .collect()
}

async fn js() -> jetstream::Context {
    jetstream::new(async_nats::connect(ADDR).await.expect("the local NATS"))
}

async fn stream(js: &jetstream::Context, name: &str) -> String {
    let subject = format!("walsink-bench.{name}");
    js.create_stream(jetstream::stream::Config {
        name: name.into(),
        subjects: vec![subject.clone()],
        ..Default::default()
    })
    .await
    .unwrap();
    subject
}

async fn finish(js: &jetstream::Context, name: &str, n: usize) {
    let mut s = js.get_stream(name).await.unwrap();
    assert_eq!(s.info().await.unwrap().state.messages, n as u64);
    js.delete_stream(name).await.unwrap();
}

/// What the raw publishes carry besides the record.
#[derive(Clone, Copy, PartialEq)]
enum Extra {
    /// Nothing: the plain floor.
    Nothing,
    /// A `Nats-Msg-Id` as walsink sends it.
    Ids,
    /// A header of the same length that is not a message id: splits the cost of carrying a
    /// header from the server's deduplication.
    Header,
}

/// The floor: every record published with an ack, `IN_FLIGHT` acks outstanding.
async fn raw(recs: &[Vec<u8>], name: &str, extra: Extra) -> Duration {
    let js = js().await;
    let subject = stream(&js, name).await;
    let t = Instant::now();
    let mut acks = VecDeque::new();
    for (i, r) in recs.iter().enumerate() {
        let mut m = PublishMessage::build().payload(r.clone().into());
        match extra {
            Extra::Nothing => {}
            Extra::Ids => m = m.message_id(format!("bench:0:1:{i}")),
            Extra::Header => m = m.header("Walsink-Pos", format!("bench:0:1:{i}").as_str()),
        }
        acks.push_back(js.send_publish(subject.clone(), m).await.unwrap());
        if acks.len() >= IN_FLIGHT {
            acks.pop_front().unwrap().await.unwrap();
        }
    }
    while let Some(a) = acks.pop_front() {
        a.await.unwrap();
    }
    let d = t.elapsed();
    finish(&js, name, recs.len()).await;
    d
}

/// Through walsink: the records sealed into `epochs` checkpoints (not timed), then
/// delivered and marked (timed).
async fn walsink(recs: &[Vec<u8>], epochs: usize, name: &str) -> Duration {
    let js = js().await;
    let subject = stream(&js, name).await;
    let dir = tempfile::tempdir().unwrap();
    let (wal, _) = WalSink::open(dir.path(), Options::new("bench")).unwrap();
    for (i, e) in recs.chunks(recs.len() / epochs).enumerate() {
        wal.append_batch(e.iter().map(|r| r.as_slice())).unwrap();
        wal.checkpoint(i as u64 + 1, b"").unwrap();
        wal.checkpoint_complete(i as u64 + 1).unwrap();
    }
    let wal = Arc::new(wal);
    let mut cfg = Config::new(name, subject);
    cfg.in_flight = IN_FLIGHT;
    let mut sink = NatsSink::new(cfg).unwrap();
    sink.connect().await.unwrap();
    let t = Instant::now();
    walsink_tokio::deliver_ready(&wal, &mut sink).await.unwrap();
    let d = t.elapsed();
    finish(&js, name, recs.len()).await;
    d
}

fn summary(what: &str, mut v: Vec<f64>) {
    v.sort_by(f64::total_cmp);
    println!(
        "walsink/{what} = {:.2} (min {:.2}, max {:.2})",
        v[v.len() / 2],
        v[0],
        v[v.len() - 1]
    );
}

fn main() {
    let args: Vec<usize> = std::env::args()
        .skip(1)
        .filter_map(|a| a.parse().ok())
        .collect();
    let n = args.first().copied().unwrap_or(200_000);
    let epochs = args.get(1).copied().unwrap_or(8);
    let rounds = args.get(2).copied().unwrap_or(7);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let recs = records(n);
    let tag = format!("WALSINK_BENCH_{}", std::process::id());
    rt.block_on(async {
        raw(&recs, &format!("{tag}_warm_raw"), Extra::Nothing).await;
        walsink(&recs, epochs, &format!("{tag}_warm_ws")).await;
        let (mut plain, mut with_ids, mut with_header) = (Vec::new(), Vec::new(), Vec::new());
        println!(
            "round  raw rec/s  raw+ids rec/s  raw+header rec/s  walsink rec/s  ratio  vs raw+ids  vs raw+header"
        );
        for r in 0..rounds {
            let rate = |d: Duration| n as f64 / d.as_secs_f64();
            // Rotate the order so no measurement always runs first.
            let (mut tr, mut ti, mut th, mut tw) = (0.0, 0.0, 0.0, 0.0);
            for k in 0..4 {
                match (r + k) % 4 {
                    0 => tr = rate(raw(&recs, &format!("{tag}_raw_{r}"), Extra::Nothing).await),
                    1 => ti = rate(raw(&recs, &format!("{tag}_ids_{r}"), Extra::Ids).await),
                    2 => th = rate(raw(&recs, &format!("{tag}_hdr_{r}"), Extra::Header).await),
                    _ => tw = rate(walsink(&recs, epochs, &format!("{tag}_ws_{r}")).await),
                }
            }
            plain.push(tw / tr);
            with_ids.push(tw / ti);
            with_header.push(tw / th);
            println!(
                "{r:>5}  {tr:>9.0}  {ti:>13.0}  {th:>16.0}  {tw:>13.0}  {:.2}   {:.2}        {:.2}",
                tw / tr,
                tw / ti,
                tw / th
            );
        }
        println!(
            "{n} records in {epochs} epochs, {rounds} rounds, {IN_FLIGHT} publishes in flight:"
        );
        summary("raw JetStream publishes with acks", plain);
        summary("raw publishes with the same message ids", with_ids);
        summary("raw publishes with a header of the same length (not an id)", with_header);
    });
}
