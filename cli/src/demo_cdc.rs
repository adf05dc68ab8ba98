//! `walsink demo cdc`: change data capture end to end. It starts a private PostgreSQL
//! cluster with `wal_level=logical` (the shared server is never reconfigured), fills a source
//! table, runs a random workload on it (inserts, updates, some changing the key, deletes and
//! one truncate) while `walsink cdc --source … --follow` runs as a child process and is
//! killed with SIGKILL at random moments, then lets a last run catch up and checks that the
//! replica equals the source both ways (`EXCEPT ALL`), and that the commit markers account
//! for every captured event exactly once.

use crate::outcome::CliResult;
use clap::Args;
use std::path::PathBuf;
use std::process::{Command, ExitCode, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use walsink_cdc::tokio_postgres::{self, Client, NoTls};

/// Arguments of `walsink demo cdc`.
#[derive(Args, Debug, Clone)]
pub struct CdcDemoArgs {
    /// Rows in the source table before the pipeline starts (its snapshot).
    #[arg(long, default_value_t = 20_000)]
    pub rows: u64,
    /// SIGKILLs to deliver while the workload runs.
    #[arg(long, default_value_t = 5)]
    pub crashes: u32,
    /// Shortest time a run lives before it is killed, in milliseconds.
    #[arg(long, default_value_t = 300)]
    pub kill_min_ms: u64,
    /// Longest time a run lives before it is killed, in milliseconds.
    #[arg(long, default_value_t = 2000)]
    pub kill_max_ms: u64,
    /// Seed of the workload and the kill timing (default: from the clock).
    #[arg(long)]
    pub seed: Option<u64>,
    /// Keep the log here instead of in a temporary directory.
    #[arg(long)]
    pub dir: Option<PathBuf>,
    /// No progress notices.
    #[arg(long)]
    pub quiet: bool,
}

async fn connect(url: &str) -> Result<Client, tokio_postgres::Error> {
    let (c, conn) = tokio_postgres::connect(url, NoTls).await?;
    tokio::spawn(async move {
        let _ = conn.await;
    });
    Ok(c)
}

/// The workload: one change per transaction, mostly; counts the row changes it commits.
async fn workload(
    url: String,
    seed: u64,
    stop: Arc<AtomicBool>,
    changes: Arc<AtomicU64>,
    first_id: i64,
) -> Result<(), tokio_postgres::Error> {
    let c = connect(&url).await?;
    let mut rng = fastrand::Rng::with_seed(seed);
    let mut next_id = first_id;
    let mut truncated = false;
    let started = Instant::now();
    while !stop.load(Ordering::Relaxed) {
        let roll = rng.u32(0..100);
        let pick = "(SELECT id FROM accounts ORDER BY random() LIMIT 1)";
        let n = if roll < 35 {
            next_id += 1;
            c.execute(
                "INSERT INTO accounts VALUES ($1, $2, $3, NULL)",
                &[
                    &(next_id as i32),
                    &format!("acct {next_id}"),
                    &(rng.i64(0..1_000_000)),
                ],
            )
            .await?
        } else if roll < 65 {
            c.execute(
                &format!("UPDATE accounts SET balance = balance + $1, note = $2 WHERE id = {pick}"),
                &[&rng.i64(-500..500), &format!("note {}", rng.u32(..))],
            )
            .await?
        } else if roll < 75 {
            next_id += 1;
            c.execute(
                &format!("UPDATE accounts SET id = $1 WHERE id = {pick}"),
                &[&(next_id as i32)],
            )
            .await?
        } else if roll < 95 {
            c.execute(&format!("DELETE FROM accounts WHERE id = {pick}"), &[])
                .await?
        } else if roll < 99 {
            // A few changes in one transaction.
            let tx_rows = async {
                c.batch_execute("BEGIN").await?;
                let mut k = 0;
                for _ in 0..5 {
                    next_id += 1;
                    k += c
                        .execute(
                            "INSERT INTO accounts VALUES ($1, 'batch', 0, 'in a transaction')",
                            &[&(next_id as i32)],
                        )
                        .await?;
                }
                k += c
                    .execute(&format!("DELETE FROM accounts WHERE id = {pick}"), &[])
                    .await?;
                c.batch_execute("COMMIT").await?;
                Ok::<u64, tokio_postgres::Error>(k)
            };
            tx_rows.await?
        } else if !truncated && started.elapsed() > Duration::from_millis(1500) {
            truncated = true;
            c.batch_execute("TRUNCATE accounts").await?;
            // Refill a little so the table is not empty.
            let base = next_id;
            next_id += 200;
            c.execute(
                "INSERT INTO accounts SELECT g, 'refill ' || g, g * 3, NULL FROM generate_series($1::int, $2::int) g",
                &[&(base as i32 + 1), &(next_id as i32)],
            )
            .await?
                + 1
        } else {
            0
        };
        changes.fetch_add(n, Ordering::Relaxed);
        tokio::time::sleep(Duration::from_millis(rng.u64(0..3))).await;
    }
    Ok(())
}

/// Runs the demo.
pub fn run(args: CdcDemoArgs) -> CliResult<ExitCode> {
    if args.kill_min_ms > args.kill_max_ms {
        return Err("--kill-min-ms must not exceed --kill-max-ms".into());
    }
    let seed = args.seed.unwrap_or_else(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(1, |d| d.as_nanos() as u64)
    });
    let note = |s: String| {
        if !args.quiet {
            eprintln!("{s}");
        }
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    note("demo cdc: starting a private PostgreSQL cluster with wal_level=logical".into());
    let pg = walsink_postgres::private_cluster::Cluster::start(&[
        ("wal_level", "logical"),
        ("max_replication_slots", "4"),
        ("max_wal_senders", "4"),
    ])
    .map_err(|e| format!("cannot start a private PostgreSQL cluster: {e}"))?;
    let url = pg.url("postgres");
    let rows = args.rows as i64;
    rt.block_on(async {
        let c = connect(&url).await?;
        c.batch_execute(&format!(
            "CREATE TABLE accounts (id int PRIMARY KEY, name text NOT NULL, balance bigint NOT NULL, note text);
             INSERT INTO accounts SELECT g, 'acct ' || g, g * 7 % 1000, CASE WHEN g % 3 = 0 THEN 'initial' END
             FROM generate_series(1, {rows}) g;"
        ))
        .await?;
        Ok::<(), Box<dyn std::error::Error>>(())
    })?;
    let tmp = tempfile::Builder::new()
        .prefix("walsink-demo-cdc-")
        .tempdir()?;
    let base = args.dir.clone().unwrap_or_else(|| tmp.path().to_path_buf());
    let wal = base.join("wal");
    if wal.exists() {
        std::fs::remove_dir_all(&wal)?;
    }
    let source = format!("{url}?slot=walsink_demo&tables=accounts&snapshot_rows=2000");
    let sink = format!("{url}?schema=replica");
    let exe = std::env::current_exe()?;
    let cdc = |follow: bool| {
        let mut c = Command::new(&exe);
        c.arg("cdc")
            .arg("--source")
            .arg(&source)
            .arg("--wal")
            .arg(&wal)
            .arg("--sink")
            .arg(&sink)
            .arg("--quiet")
            .stdin(Stdio::null())
            .stdout(Stdio::null());
        if follow {
            c.arg("--follow");
        }
        c
    };
    note(format!(
        "demo cdc: {rows} rows in the source; a workload of inserts, updates (some changing the key), deletes and one truncate runs while `walsink cdc --source` is killed {} times (seed {seed})",
        args.crashes
    ));
    let stop = Arc::new(AtomicBool::new(false));
    let changes = Arc::new(AtomicU64::new(0));
    let work = rt.spawn(workload(
        url.clone(),
        seed,
        stop.clone(),
        changes.clone(),
        rows + 1_000_000,
    ));
    let mut rng = fastrand::Rng::with_seed(seed ^ 0x5eed);
    let mut crashes = 0;
    let started = Instant::now();
    while crashes < args.crashes {
        let mut child = cdc(true).spawn()?;
        let delay = Duration::from_millis(rng.u64(args.kill_min_ms..=args.kill_max_ms));
        std::thread::sleep(delay);
        if let Some(status) = child.try_wait()? {
            return Err(format!(
                "`walsink cdc --follow` exited with {status} before it was killed"
            )
            .into());
        }
        child.kill()?; // SIGKILL
        child.wait()?;
        crashes += 1;
        note(format!(
            "demo cdc: killed `walsink cdc` with SIGKILL after {delay:?} (crash {crashes}); {} changes so far",
            changes.load(Ordering::Relaxed)
        ));
    }
    stop.store(true, Ordering::Relaxed);
    rt.block_on(work)
        .map_err(|e| format!("the workload task failed: {e}"))?
        .map_err(|e| format!("the workload failed: {e}"))?;
    note("demo cdc: workload stopped; a last run catches up".into());
    let status = cdc(false).stderr(Stdio::inherit()).status()?;
    if !status.success() {
        return Err(format!("the final `walsink cdc` run failed with {status}").into());
    }
    let (cmp, (epochs, applied), last_events) = rt.block_on(async {
        let c = connect(&url).await?;
        let cmp = walsink_cdc::check::compare(&c, ("public", "accounts"), ("replica", "accounts")).await?;
        let applied = walsink_cdc::check::applied(&c, "replica", "cdc").await?;
        let meta: Vec<u8> = c
            .query_one(
                "SELECT metadata FROM replica.walsink_markers WHERE sink_id = 'cdc' ORDER BY checkpoint DESC LIMIT 1",
                &[],
            )
            .await?
            .get(0);
        let v: serde_json::Value = serde_json::from_slice(&meta)?;
        Ok::<_, Box<dyn std::error::Error>>((cmp, applied, v["pos"]["events"].as_u64().unwrap_or(0)))
    })?;
    let made = changes.load(Ordering::Relaxed) + args.rows;
    note(format!(
        "demo cdc: done in {:.1?}; {} row changes made on the source ({} rows + {} by the workload); {applied} events captured and applied in {epochs} epochs (the snapshot reads each page as it is when read, so earlier changes are folded into it; a change that committed after the slot was made and before its page was read is captured twice and applied once)",
        started.elapsed(),
        made,
        args.rows,
        made - args.rows
    ));
    if cmp.identical() && applied == last_events {
        outln!(
            "verified: replica identical to source ({} rows, {applied} changes applied exactly once) across {crashes} crashes",
            cmp.source_rows
        );
        Ok(ExitCode::SUCCESS)
    } else {
        outln!(
            "FAILED: source {} rows, replica {} rows, {} missing from the replica, {} extra; markers account for {applied} events of {last_events} captured ({made} changes made); {crashes} crashes (seed {seed})",
            cmp.source_rows, cmp.replica_rows, cmp.missing, cmp.extra
        );
        Ok(ExitCode::from(1))
    }
}
