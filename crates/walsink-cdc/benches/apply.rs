//! Apply throughput, same run, interleaved rounds, over the same client (tokio-postgres)
//! against the same server:
//!
//! - **walsink**: the change events sealed in a log (epochs of `--epoch` events, by default
//!   one epoch of all of them: one transaction, as the floor's) and delivered
//!   by [`CdcSink`] (parse, plan, guarded set-based statements, marker, one transaction per
//!   epoch); timed from sealed to committed;
//! - **floor**: one transaction with one multi-row upsert of the same final rows (typed
//!   arrays through `unnest`), plus one multi-row delete of the keys that end deleted;
//! - **naive**: one statement per event (upsert or delete), in transactions of `--epoch`
//!   events: what an at-least-once JDBC-style sink does.
//!
//! Reported: changes per second of each, and walsink's ratio to the floor and to the naive
//! apply (median of the rounds, with min–max). Needs a PostgreSQL: `WALSINK_BENCH_URL`
//! (default the shared server, `postgres://postgres@127.0.0.1:5432/test`).
//!
//! Also reported, to tell the sink's own cost from the machine's noise: the CPU time of the
//! bench process during walsink's rounds (`getrusage`: the sink's parsing, planning and
//! encoding) and of the server process serving the sink and the floor (`/proc/PID/stat`, in
//! clock ticks), per event, when the server runs on this machine.
//!
//! The bench runs with the `walsink` binary's allocator, mimalloc (`RUSTFLAGS="--cfg
//! system_alloc"`: the system's).
//!
//! Each round gets a new table, with the column the sink adds at a table's first epoch
//! already there (the steady state; `--first-epoch` leaves it out, so each walsink round also
//! pays that one-time `ALTER TABLE`).
//!
//! `cargo bench -p walsink-cdc --bench apply` (`-- --events N --rounds R --epoch E`,
//! `--no-naive` to leave the naive apply out, for profiling, and `--inserts-as-updates` to send
//! new keys as `u` events instead of Debezium's `c`, which the sink may insert without a
//! conflict check).

use serde_json::json;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio_postgres::{Client, NoTls};
use walsink::{MemoryCommitStore, Options, WalSink};

/// The `walsink` binary's allocator, so walsink's rounds cost what `walsink cdc` costs;
/// `RUSTFLAGS="--cfg system_alloc"` measures with the system's instead.
#[cfg(not(system_alloc))]
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

use walsink_cdc::{CdcSink, Config};

/// An event: a new key (`c`), a change of a live key (`u`), a delete (`d`).
#[derive(Clone)]
enum Ev {
    Ins { id: i32, v: String, n: i32 },
    Up { id: i32, v: String, n: i32 },
    Del { id: i32 },
}

fn workload(n: usize, seed: u64) -> Vec<Ev> {
    let mut rng = fastrand_like(seed);
    let mut live: Vec<i32> = Vec::new();
    let mut next = 0;
    let mut out = Vec::with_capacity(n);
    while out.len() < n {
        let r = rng() % 100;
        if r < 70 || live.is_empty() {
            next += 1;
            live.push(next);
            out.push(Ev::Ins {
                id: next,
                v: format!("value {next} {}", "x".repeat(20)),
                n: 1,
            });
        } else if r < 90 {
            let id = live[(rng() as usize) % live.len()];
            out.push(Ev::Up {
                id,
                v: format!("updated {}", rng() % 1000),
                n: (rng() % 100) as i32,
            });
        } else {
            let i = (rng() as usize) % live.len();
            let id = live.swap_remove(i);
            out.push(Ev::Del { id });
        }
    }
    out
}

fn fastrand_like(seed: u64) -> impl FnMut() -> u64 {
    let mut x = seed | 1;
    move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    }
}

/// The event's Debezium JSON; `inserts_as` is the op a new key's event carries (`c`, as
/// Debezium writes it; `u` to measure the apply without its plain-insert path).
fn line(e: &Ev, lsn: u64, inserts_as: &str) -> Vec<u8> {
    let (op, before, after) = match e {
        Ev::Ins { id, v, n } => (
            inserts_as,
            serde_json::Value::Null,
            json!({"id": id, "v": v, "n": n}),
        ),
        Ev::Up { id, v, n } => (
            "u",
            serde_json::Value::Null,
            json!({"id": id, "v": v, "n": n}),
        ),
        Ev::Del { id } => ("d", json!({"id": id}), serde_json::Value::Null),
    };
    json!({"before": before, "after": after, "op": op, "ts_ms": 0,
           "source": {"db": "bench", "schema": "public", "table": "t", "lsn": lsn}})
    .to_string()
    .into_bytes()
}

/// CPU time (user + system) of this process so far.
fn process_cpu() -> Duration {
    let mut u: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: getrusage writes one `rusage` into the pointer it is given.
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut u) };
    let tv = |t: libc::timeval| Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1000);
    tv(u.ru_utime) + tv(u.ru_stime)
}

/// CPU time (user + system) of a process on this machine, from `/proc/PID/stat`; `None` when
/// it cannot be read (the server runs elsewhere).
fn pid_cpu(pid: i32) -> Option<Duration> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The fields after the command's closing parenthesis; utime and stime are the 12th and
    // 13th of them.
    let rest = &stat[stat.rfind(')')? + 2..];
    let f: Vec<&str> = rest.split(' ').collect();
    let ticks: u64 = f.get(11)?.parse::<u64>().ok()? + f.get(12)?.parse::<u64>().ok()?;
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as u64;
    Some(Duration::from_nanos(ticks * 1_000_000_000 / hz))
}

/// The backend process of the sink's connection (found by its application name).
async fn sink_backend(c: &Client) -> Option<i32> {
    c.query_opt(
        "SELECT pid FROM pg_stat_activity WHERE application_name = 'walsink-cdc' \
         AND datname = current_database() ORDER BY backend_start DESC LIMIT 1",
        &[],
    )
    .await
    .ok()
    .flatten()
    .map(|r| r.get(0))
}

/// A round's time and the CPU it took: the bench process's and the server process's (when
/// it could be read).
struct Round {
    wall: Duration,
    client: Duration,
    server: Option<Duration>,
}

/// Measures one round from `start` to `stop`: wall time, this process's CPU, and the CPU of
/// the server process `backend`.
struct Meter {
    started: Instant,
    client0: Duration,
    backend: Option<i32>,
    server0: Option<Duration>,
}

impl Meter {
    fn start(backend: Option<i32>) -> Meter {
        Meter {
            server0: backend.and_then(pid_cpu),
            client0: process_cpu(),
            backend,
            started: Instant::now(),
        }
    }

    fn stop(self) -> Round {
        Round {
            wall: self.started.elapsed(),
            client: process_cpu() - self.client0,
            server: self
                .server0
                .and_then(|s0| Some(pid_cpu(self.backend?)? - s0)),
        }
    }
}

async fn connect(url: &str) -> Client {
    let (c, conn) = tokio_postgres::connect(url, NoTls)
        .await
        .unwrap_or_else(|e| panic!("the bench needs PostgreSQL at {url} (WALSINK_BENCH_URL): {e}"));
    tokio::spawn(conn);
    c
}

/// A new table for a round. Unless `first_epoch`, it has the column the sink adds to a
/// table at its first epoch (`_walsink_pos`), as after that epoch: the rounds then measure
/// the steady state, not that one-time `ALTER TABLE` and the first attempt it ends. Every
/// mode gets the same table.
async fn fresh(c: &Client, schema: &str, first_epoch: bool) {
    let guard = if first_epoch {
        ""
    } else {
        ", _walsink_pos bigint"
    };
    c.batch_execute(&format!(
        "DROP SCHEMA IF EXISTS {schema} CASCADE; CREATE SCHEMA {schema}; \
         CREATE TABLE {schema}.t (id int PRIMARY KEY, v text, n int{guard});"
    ))
    .await
    .unwrap();
}

async fn walsink_round(
    url: &str,
    c: &Client,
    schema: &str,
    lines: &[Vec<u8>],
    epoch: usize,
    first_epoch: bool,
) -> Round {
    fresh(c, schema, first_epoch).await;
    let dir = tempfile::tempdir().unwrap();
    let (wal, _) = WalSink::open_with(
        Arc::new(walsink::storage::FsStorage::new(dir.path()).unwrap()),
        Options::new("bench"),
        Box::new(MemoryCommitStore::new()),
    )
    .unwrap();
    let wal = Arc::new(wal);
    for (i, chunk) in lines.chunks(epoch).enumerate() {
        wal.append_batch(chunk.iter().map(Vec::as_slice)).unwrap();
        wal.checkpoint(i as u64 + 1, b"").unwrap();
        wal.checkpoint_complete(i as u64 + 1).unwrap();
    }
    let mut sink = CdcSink::connect(Config::from_url(&format!("{url}?schema={schema}")).unwrap())
        .await
        .unwrap();
    // Connected: the sink's backend is there to be found.
    let meter = Meter::start(sink_backend(c).await);
    let n = walsink_tokio::deliver_ready(&wal, &mut sink).await.unwrap();
    let round = meter.stop();
    let st = sink.stats();
    eprintln!(
        "  (walsink round: {:.2?} = planning {:.2?} + statements {:.2?} ({} sent, {} unguarded, {} plain inserts) + commits {:.2?} + the rest)",
        round.wall, st.planning, st.statements, st.sent, st.unguarded, st.inserts, st.committing
    );
    assert_eq!(n, lines.len().div_ceil(epoch));
    round
}

fn final_state(evs: &[Ev]) -> (Vec<(i32, String, i32)>, Vec<i32>) {
    let mut m = std::collections::BTreeMap::new();
    for e in evs {
        match e {
            Ev::Ins { id, v, n } | Ev::Up { id, v, n } => {
                m.insert(*id, Some((v.clone(), *n)));
            }
            Ev::Del { id } => {
                m.insert(*id, None);
            }
        }
    }
    let mut up = Vec::new();
    let mut del = Vec::new();
    for (id, r) in m {
        match r {
            Some((v, n)) => up.push((id, v, n)),
            None => del.push(id),
        }
    }
    (up, del)
}

async fn floor_round(
    c: &mut Client,
    schema: &str,
    state: &(Vec<(i32, String, i32)>, Vec<i32>),
    first_epoch: bool,
) -> Round {
    fresh(c, schema, first_epoch).await;
    let backend: Option<i32> = c
        .query_one("SELECT pg_backend_pid()", &[])
        .await
        .ok()
        .map(|r| r.get(0));
    let meter = Meter::start(backend);
    let ids: Vec<i32> = state.0.iter().map(|r| r.0).collect();
    let vs: Vec<&str> = state.0.iter().map(|r| r.1.as_str()).collect();
    let ns: Vec<i32> = state.0.iter().map(|r| r.2).collect();
    let tx = c.transaction().await.unwrap();
    tx.execute(
        &format!(
            "INSERT INTO {schema}.t SELECT * FROM unnest($1::int[], $2::text[], $3::int[]) \
             ON CONFLICT (id) DO UPDATE SET v = EXCLUDED.v, n = EXCLUDED.n"
        ),
        &[&ids, &vs, &ns],
    )
    .await
    .unwrap();
    tx.execute(
        &format!("DELETE FROM {schema}.t WHERE id = ANY($1)"),
        &[&state.1],
    )
    .await
    .unwrap();
    tx.commit().await.unwrap();
    meter.stop()
}

async fn naive_round(
    c: &mut Client,
    schema: &str,
    evs: &[Ev],
    epoch: usize,
    first_epoch: bool,
) -> Duration {
    fresh(c, schema, first_epoch).await;
    let t = Instant::now();
    let up = c
        .prepare(&format!(
            "INSERT INTO {schema}.t VALUES ($1, $2, $3) ON CONFLICT (id) DO UPDATE SET v = EXCLUDED.v, n = EXCLUDED.n"
        ))
        .await
        .unwrap();
    let del = c
        .prepare(&format!("DELETE FROM {schema}.t WHERE id = $1"))
        .await
        .unwrap();
    for chunk in evs.chunks(epoch) {
        let tx = c.transaction().await.unwrap();
        for e in chunk {
            match e {
                Ev::Ins { id, v, n } | Ev::Up { id, v, n } => {
                    tx.execute(&up, &[id, v, n]).await.unwrap()
                }
                Ev::Del { id } => tx.execute(&del, &[id]).await.unwrap(),
            };
        }
        tx.commit().await.unwrap();
    }
    t.elapsed()
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[v.len() / 2]
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let arg = |name: &str, default: usize| {
        args.iter()
            .position(|a| a == name)
            .and_then(|i| args.get(i + 1))
            .and_then(|v| v.parse().ok())
            .unwrap_or(default)
    };
    if args.iter().any(|a| a == "--list") {
        return; // `cargo test --benches` lists benches; nothing to list here
    }
    let events = arg("--events", 50_000);
    let rounds = arg("--rounds", 5);
    // One epoch by default: one transaction, as the floor's; `--epoch 5000` for epochs of
    // 5,000 (each its own transaction, updating rows earlier epochs wrote).
    let epoch = arg("--epoch", events).max(1);
    // `--no-naive`: leave the slow naive apply out (to profile the other two).
    let skip_naive = args.iter().any(|a| a == "--no-naive");
    // `--first-epoch`: tables without the sink's column, so each walsink round pays the
    // one-time work of a table's first epoch.
    let first_epoch = args.iter().any(|a| a == "--first-epoch");
    // `--inserts-as-updates`: new keys come as `u` events (no plain inserts).
    let inserts_as = if args.iter().any(|a| a == "--inserts-as-updates") {
        "u"
    } else {
        "c"
    };
    let url = std::env::var("WALSINK_BENCH_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into());
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let mut c = connect(&url).await;
        let evs = workload(events, 42);
        let lines: Vec<Vec<u8>> = evs.iter().enumerate().map(|(i, e)| line(e, 1000 + i as u64, inserts_as)).collect();
        let state = final_state(&evs);
        let schema = format!("cdc_bench_{}", std::process::id());
        let (mut w, mut f, mut nv) = (Vec::new(), Vec::new(), Vec::new());
        // CPU per event of walsink's rounds and of the floor's (this process, the server).
        let (mut wc, mut ws, mut fc, mut fs) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        let per_event = |d: Duration| d.as_secs_f64() * 1e6 / events as f64;
        for r in 0..rounds {
            // Rotate the order so no mode always runs first.
            for k in 0..3 {
                if skip_naive && (r + k) % 3 == 2 {
                    nv.push(f64::NAN);
                    continue;
                }
                match (r + k) % 3 {
                    0 => {
                        let r = walsink_round(&url, &c, &schema, &lines, epoch, first_epoch).await;
                        w.push(r.wall.as_secs_f64());
                        wc.push(per_event(r.client));
                        ws.extend(r.server.map(per_event));
                    }
                    1 => {
                        let r = floor_round(&mut c, &schema, &state, first_epoch).await;
                        f.push(r.wall.as_secs_f64());
                        fc.push(per_event(r.client));
                        fs.extend(r.server.map(per_event));
                    }
                    _ => nv.push(
                        naive_round(&mut c, &schema, &evs, epoch, first_epoch)
                            .await
                            .as_secs_f64(),
                    ),
                }
            }
        }
        c.batch_execute(&format!("DROP SCHEMA IF EXISTS {schema} CASCADE")).await.unwrap();
        let rate = |t: f64| events as f64 / t;
        let ratios = |a: &[f64], b: &[f64]| -> Vec<f64> { a.iter().zip(b).map(|(x, y)| y / x).collect() };
        let vs_floor = ratios(&w, &f);
        let vs_naive = ratios(&w, &nv);
        let mm = |v: &[f64]| (v.iter().cloned().fold(f64::MAX, f64::min), v.iter().cloned().fold(0.0, f64::max));
        println!(
            "apply of {events} change events ({} final rows, {} deletes), {rounds} interleaved rounds, epochs (and naive transactions) of {epoch} events",
            state.0.len(),
            state.1.len()
        );
        println!("  walsink cdc: {:>9.0} changes/s (median)", rate(median(w.clone())));
        println!("  floor      : {:>9.0} changes/s (one multi-row upsert of the final rows)", rate(median(f.clone())));
        if !skip_naive {
            println!("  naive      : {:>9.0} changes/s (one statement per event)", rate(median(nv.clone())));
        }
        let (lo, hi) = mm(&vs_floor);
        println!("  walsink / floor: {:.2}x (min {lo:.2}, max {hi:.2})", median(vs_floor.clone()));
        let cpu = |what: &str, v: &[f64]| {
            let (lo, hi) = mm(v);
            println!("  CPU per event, {what}: {:.2} us (min {lo:.2}, max {hi:.2})", median(v.to_vec()));
        };
        cpu("walsink's process", &wc);
        cpu("the floor's process", &fc);
        if ws.len() == w.len() && fs.len() == f.len() {
            cpu("server for walsink", &ws);
            cpu("server for the floor", &fs);
        }
        if !skip_naive {
            let (lo, hi) = mm(&vs_naive);
            println!("  walsink / naive: {:.2}x (min {lo:.2}, max {hi:.2})", median(vs_naive.clone()));
        }
    });
}
