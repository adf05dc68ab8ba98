//! `walsink demo`: the whole mission in one command. It generates an input, runs `walsink
//! pipe` into an exactly-once directory sink as a child process, kills it with SIGKILL at
//! random moments, restarts it each time, and finally checks that the target holds every
//! input record exactly once.

use crate::outcome::CliResult;
use crate::pipe_args::PipeArgs;
use crate::progress;
use clap::Args;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitCode, Stdio};
use std::time::{Duration, Instant};
use walsink::DirSink;

/// Arguments of `walsink demo`.
#[derive(Args, Debug, Clone)]
#[command(args_conflicts_with_subcommands = true)]
pub struct DemoArgs {
    /// Another demo instead of the default one.
    #[command(subcommand)]
    pub other: Option<OtherDemo>,
    /// Work in this directory (kept afterwards) instead of a temporary one.
    #[arg(long)]
    pub dir: Option<PathBuf>,
    /// Input records to ship.
    #[arg(long, default_value_t = 3_000_000)]
    pub records: u64,
    /// SIGKILLs to deliver while the pipe runs.
    #[arg(long, default_value_t = 5)]
    pub crashes: u32,
    /// Records per checkpoint.
    #[arg(long, default_value_t = 1_000)]
    pub checkpoint_every: u64,
    /// Shortest time a pipe run lives before it is killed, in milliseconds.
    #[arg(long, default_value_t = 100)]
    pub kill_min_ms: u64,
    /// Longest time a pipe run lives before it is killed, in milliseconds.
    #[arg(long, default_value_t = 1500)]
    pub kill_max_ms: u64,
    /// Seed of the kill timing (default: from the clock).
    #[arg(long)]
    pub seed: Option<u64>,
    /// No progress output.
    #[arg(long)]
    pub quiet: bool,
}

/// The demos besides the default one.
#[derive(clap::Subcommand, Debug, Clone)]
pub enum OtherDemo {
    /// Change data capture end to end: a private PostgreSQL cluster, a random workload on a
    /// source table, `walsink cdc --source` killed with SIGKILL, and the replica compared
    /// with the source.
    #[cfg(feature = "cdc")]
    Cdc(crate::demo_cdc::CdcDemoArgs),
}

/// The text of input record `i`: its number and a deterministic payload.
fn record(i: u64) -> String {
    let mut x = i.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ 0xdead_beef;
    let mut payload = String::with_capacity(40);
    for _ in 0..40 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        payload.push((b'a' + (x % 26) as u8) as char);
    }
    format!("record {i:010} {payload}")
}

fn write_input(path: &Path, n: u64) -> std::io::Result<()> {
    let mut f = std::io::BufWriter::with_capacity(1 << 20, std::fs::File::create(path)?);
    for i in 0..n {
        writeln!(f, "{}", record(i))?;
    }
    f.flush()
}

fn spawn_pipe(args: &PipeArgs) -> std::io::Result<Child> {
    Command::new(std::env::current_exe()?)
        .arg("pipe")
        .arg("--input")
        .arg(&args.input)
        .arg("--wal")
        .arg(&args.wal)
        .arg("--sink")
        .arg(&args.sink)
        .arg("--checkpoint-every")
        .arg(args.checkpoint_every.to_string())
        .arg("--quiet")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .spawn()
}

/// The file that marks a directory as the demo's own, so a later `--dir` run may clear it.
const DEMO_MARK: &str = ".walsink-demo";

/// Makes `dir` the demo's: creates it, or accepts it when it is empty or was made by an
/// earlier demo. A non-empty directory the demo did not create is refused: the demo replaces
/// `input.txt`, `wal/` and `out/` in it.
fn claim_dir(dir: &Path) -> CliResult<()> {
    if dir.exists() {
        if !dir.is_dir() {
            return Err(format!("--dir {} exists and is not a directory", dir.display()).into());
        }
        let empty = std::fs::read_dir(dir)
            .map_err(|e| format!("cannot read --dir {}: {e}", dir.display()))?
            .next()
            .is_none();
        if !empty && !dir.join(DEMO_MARK).exists() {
            return Err(crate::outcome::Refused(format!(
                "--dir {} is not empty and was not created by `walsink demo`; the demo replaces input.txt, wal/ and out/ in it, so give it an empty or new directory",
                dir.display()
            ))
            .into());
        }
    }
    std::fs::create_dir_all(dir)
        .map_err(|e| format!("cannot create --dir {}: {e}", dir.display()))?;
    std::fs::write(
        dir.join(DEMO_MARK),
        b"made by `walsink demo`; a later demo run may replace input.txt, wal/ and out/ here\n",
    )
    .map_err(|e| format!("cannot write in --dir {}: {e}", dir.display()))?;
    Ok(())
}

/// Where a restarted pipe resumes: the newest checkpoint in the log (it is not running), with
/// its input offset.
fn resume_point(wal: &Path) -> String {
    let Ok(st) = walsink::storage::FsStorage::new(wal) else {
        return "the start (no log yet)".into();
    };
    match walsink::verify(&st) {
        Ok(r) => match r.checkpoints.last() {
            Some(c) => {
                let offset = crate::resume::PipeMeta::decode(&c.metadata)
                    .map_or("?".to_string(), |m| m.offset.to_string());
                format!(
                    "checkpoint {} (input offset {offset}; committed through {}; {} unsealed records to read again)",
                    c.id,
                    r.committed.map_or("-".to_string(), |c| c.to_string()),
                    r.unsealed_records
                )
            }
            None => "the start (no checkpoint yet)".into(),
        },
        Err(e) => format!("(cannot read the log: {e})"),
    }
}

/// Counts how often each input record arrived. Returns (lost, duplicated, foreign).
pub fn check_target(out: &Path, n: u64) -> CliResult<(u64, u64, u64)> {
    let mut seen = vec![0u32; n as usize];
    let mut foreign = 0u64;
    for r in DirSink::read_records(out)? {
        let text = String::from_utf8_lossy(&r);
        let idx = text
            .strip_prefix("record ")
            .and_then(|t| t.get(..10))
            .and_then(|d| d.parse::<u64>().ok())
            .filter(|&i| i < n && record(i) == text);
        match idx {
            Some(i) => seen[i as usize] += 1,
            None => foreign += 1,
        }
    }
    let lost = seen.iter().filter(|&&c| c == 0).count() as u64;
    let dup = seen.iter().map(|&c| u64::from(c.saturating_sub(1))).sum();
    Ok((lost, dup, foreign))
}

/// Runs the demo.
pub fn run(args: DemoArgs) -> CliResult<ExitCode> {
    #[allow(clippy::match_single_binding)]
    match args.other.clone() {
        #[cfg(feature = "cdc")]
        Some(OtherDemo::Cdc(a)) => return crate::demo_cdc::run(a),
        _ => {}
    }
    let mut tmp = None;
    let base = match &args.dir {
        Some(d) => {
            claim_dir(d)?;
            d.clone()
        }
        None => {
            let t = tempfile::Builder::new().prefix("walsink-demo-").tempdir()?;
            let p = t.path().to_path_buf();
            tmp = Some(t);
            p
        }
    };
    let input = base.join("input.txt");
    let wal = base.join("wal");
    let out = base.join("out");
    for p in [&wal, &out] {
        if p.exists() {
            std::fs::remove_dir_all(p)?;
        }
    }
    let seed = args.seed.unwrap_or_else(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(1, |d| d.as_nanos() as u64)
    });
    if args.kill_min_ms > args.kill_max_ms {
        return Err("--kill-min-ms must not exceed --kill-max-ms".into());
    }
    let mut rng = fastrand::Rng::with_seed(seed);
    let pb = progress::spinner(args.quiet);
    pb.set_message(format!(
        "writing {} input records to {}",
        args.records,
        input.display()
    ));
    write_input(&input, args.records)?;
    let pipe = PipeArgs {
        input: input.clone(),
        wal: wal.clone(),
        sink: format!("dir:{}", out.display()),
        checkpoint_every: args.checkpoint_every,
        checkpoint_interval: None,
        sink_id: Some("demo".into()),
        follow: false,
        ship_final_line: false,
        max_record_bytes: 16 << 20,
        max_backlog_bytes: None,
        max_retries: 5,
        retry_deadline: Duration::from_secs(600),
        take_over: false,
        stop_timeout: Duration::from_secs(5),
        progress_interval: Duration::from_secs(10),
        json: false,
        quiet: true,
        metrics_addr: None,
        dead_letter: None,
        max_dead_letters: None,
    };
    let note = |s: String| {
        if !args.quiet {
            pb.suspend(|| eprintln!("{s}"));
        }
    };
    if !args.quiet {
        eprintln!(
            "demo: shipping {} records from {} through {} into {} (seed {seed})",
            args.records,
            input.display(),
            wal.display(),
            out.display()
        );
    }
    let started = Instant::now();
    let mut crashes = 0u32;
    let mut finished = false;
    while crashes < args.crashes && !finished {
        if crashes > 0 {
            note(format!(
                "demo: restart {crashes} resumes after {}",
                resume_point(&wal)
            ));
        }
        let mut child = spawn_pipe(&pipe)?;
        let delay = Duration::from_millis(rng.u64(args.kill_min_ms..=args.kill_max_ms));
        let t = Instant::now();
        while t.elapsed() < delay {
            if child.try_wait()?.is_some() {
                break;
            }
            std::thread::sleep(Duration::from_millis(10));
            pb.set_message(format!(
                "run {} of the pipe; {crashes} crashes so far; {} checkpoint files delivered",
                crashes + 1,
                std::fs::read_dir(&out).map_or(0, |d| d.count())
            ));
        }
        match child.try_wait()? {
            Some(status) if status.success() => finished = true,
            Some(status) => {
                return Err(format!("pipe exited with {status} before it was killed").into())
            }
            None => {
                child.kill()?; // SIGKILL on Unix
                child.wait()?;
                crashes += 1;
                if !args.quiet {
                    pb.suspend(|| {
                        eprintln!(
                            "demo: killed the pipe with SIGKILL after {delay:?} (crash {crashes})"
                        )
                    });
                }
            }
        }
    }
    if !finished {
        note(format!(
            "demo: final run resumes after {}",
            resume_point(&wal)
        ));
        pb.set_message("final run of the pipe to the end of the input");
        let status = spawn_pipe(&pipe)?.wait()?;
        if !status.success() {
            return Err(format!("the final pipe run failed with {status}").into());
        }
    }
    pb.set_message("checking the target");
    let (lost, dup, foreign) = check_target(&out, args.records)?;
    pb.finish_and_clear();
    if !args.quiet {
        eprintln!(
            "demo: done in {:.1?}; checked by reading every file in {} back (DirSink::read_records) and counting how often each of the {} input records arrived, and whether anything else did",
            started.elapsed(),
            out.display(),
            args.records
        );
    }
    if lost == 0 && dup == 0 && foreign == 0 {
        outln!(
            "verified: {} records delivered exactly once (0 lost, 0 duplicated) across {crashes} crashes",
            args.records
        );
        Ok(ExitCode::SUCCESS)
    } else {
        outln!(
            "FAILED: {} records, {lost} lost, {dup} duplicated, {foreign} unexpected, across {crashes} crashes (seed {seed}, files in {})",
            args.records,
            base.display()
        );
        if let Some(t) = tmp {
            // Keep the evidence.
            eprintln!("kept {}", t.keep().display());
        }
        Ok(ExitCode::from(1))
    }
}
