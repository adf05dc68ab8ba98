//! `walsink`: ship records exactly once, and inspect, verify and repair a log.
//!
//! Exit codes: 0 success; 1 a check found problems or an operation was refused; 2 usage or
//! I/O errors (a directory that is not a log, a target that keeps failing, a line over
//! `--max-record-bytes`); 3 `pipe` or `cdc` stopped gracefully by SIGINT or SIGTERM; 130 / 143
//! a second signal stopped it at once; 141 `pipe --sink stdout` lost its reader before every
//! record was printed. JSON goes to stdout (with `--json`, a failure is a JSON error object
//! too, see [`error_json`]), logs and progress to stderr.

/// `println!` that returns the write's error instead of panicking: a reader that went away
/// (`walsink verify --json DIR | head`) ends the command quietly (see `is_broken_pipe`).
macro_rules! outln {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        writeln!(std::io::stdout().lock(), $($arg)*)?
    }};
}

/// mimalloc instead of the system allocator: the CDC apply allocates a few small values per
/// row image, and with glibc's malloc that was about a quarter of its CPU per event
/// (docs/benchmarks.md, "CDC: the allocator, parsing in place and a window").
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

mod cdc;
mod deliver;
mod demo;
#[cfg(feature = "cdc")]
mod demo_cdc;
mod dlq;
mod logging;
mod metrics;
#[cfg(feature = "cdc")]
mod outcome;
mod pipe;
mod pipe_args;
mod progress;
mod repair;
mod resume;
mod source;
mod stop;
mod targets;
mod tools;

use clap::{Parser, Subcommand};
use outcome::{JsonShown, Refused};
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Parser)]
#[command(
    name = "walsink",
    version,
    about = "A write-ahead-log sink: exactly-once delivery into targets without transactions"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
    /// How log events (warnings of walsink and its targets) are written to stderr: `text`, one
    /// readable line each, or `json`, one JSON object per line. Which events show is
    /// RUST_LOG's choice (such as `info` or `walsink_nats=debug`); default `warn`.
    #[arg(long, global = true, value_enum, default_value = "text")]
    log_format: logging::LogFormat,
}

#[derive(Subcommand)]
enum Command {
    /// Ship newline-delimited records from a file through a log into a sink, exactly once
    /// across crashes: re-run with the same arguments to resume.
    #[command(
        after_long_help = "Exit codes: 0 done; 1 refused (another log's target, a changed input, a line the command refuses); 2 usage or I/O error, a line over --max-record-bytes, a target given up on; 3 stopped gracefully by SIGINT or SIGTERM; 130 / 143 a second SIGINT / SIGTERM ended it at once; 141 --sink stdout lost its reader before every record was printed."
    )]
    Pipe(pipe_args::PipeArgs),
    /// Show a log's identity, segments, checkpoints and backlog.
    Inspect {
        /// The log directory.
        dir: PathBuf,
        /// Print JSON to stdout.
        #[arg(long)]
        json: bool,
        /// Also show what this target holds as committed for the log's sink id and subtask
        /// (the same value as `pipe --sink`: `dir:PATH` or a URL such as `postgres://…`),
        /// beside the log's own commit mark.
        #[arg(long)]
        sink: Option<String>,
    },
    /// Print a log's figures for monitoring, read from its files (the log may be running):
    /// backlog, oldest pending epoch, committed checkpoint, segments, free disk, as
    /// Prometheus text (for a node exporter's textfile collector) or JSON with the same names.
    /// Exit 1 when the log has problems (`walsink verify` names them).
    Status {
        /// The log directory.
        dir: PathBuf,
        /// Print JSON to stdout.
        #[arg(long)]
        json: bool,
    },
    /// Print the records in a log: one line per record (checkpoint, index, state, text), or
    /// JSON. Exit 1 with a warning when the log is damaged (the valid prefix is printed).
    Dump(tools::DumpArgs),
    /// Check every frame, header and the commit store. Exit 0 when clean, 1 when problems
    /// were found, 2 on usage or I/O errors.
    Verify {
        /// The log directory.
        dir: PathBuf,
        /// Print the report as JSON to stdout.
        #[arg(long)]
        json: bool,
        /// No progress output.
        #[arg(long)]
        quiet: bool,
    },
    /// Cut a torn tail off a log. Refuses corruption of synced data unless --force, which
    /// moves the damaged segments aside (renamed *.damaged, never deleted) and sets a damaged
    /// COMMITTED file aside and rebuilds it.
    Repair {
        /// The log directory.
        dir: PathBuf,
        /// Keep the valid prefix of a corrupted log and move the rest aside.
        #[arg(long)]
        force: bool,
        /// With --force and a damaged COMMITTED file: the checkpoint the target is known to
        /// hold through (default: the highest one the log proves committed, or none).
        #[arg(long, requires = "force")]
        committed: Option<u64>,
        /// Print what was done as JSON to stdout.
        #[arg(long)]
        json: bool,
    },
    /// Apply Debezium change events to PostgreSQL exactly once, from a file of events
    /// (--input) or from a PostgreSQL replication slot (--source); re-run to resume.
    #[cfg(feature = "cdc")]
    Cdc(cdc::CdcArgs),
    /// Read a dead-letter log (`pipe --dead-letter dir:PATH`): the records the target
    /// refused for good, with their positions and the target's answers.
    Dlq(dlq::DlqArgs),
    /// Show the mission end to end: ship records through `pipe`, kill it with SIGKILL at
    /// random moments, restart it, and check that every record arrived exactly once.
    Demo(demo::DemoArgs),
}

impl Command {
    /// Whether the command was asked for JSON on stdout.
    fn json(&self) -> bool {
        match self {
            Command::Pipe(a) => a.json,
            Command::Inspect { json, .. }
            | Command::Verify { json, .. }
            | Command::Status { json, .. }
            | Command::Repair { json, .. } => *json,
            Command::Dump(a) => a.json,
            #[cfg(feature = "cdc")]
            Command::Cdc(_) => false,
            Command::Demo(_) | Command::Dlq(_) => false,
        }
    }

    /// Whether SIGINT and SIGTERM stop the command gracefully (see `stop`).
    fn stops_gracefully(&self) -> bool {
        match self {
            Command::Pipe(_) => true,
            #[cfg(feature = "cdc")]
            Command::Cdc(_) => true,
            _ => false,
        }
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    logging::init(cli.log_format);
    if cli.command.stops_gracefully() {
        if let Err(e) = stop::install() {
            eprintln!("error: cannot handle SIGINT and SIGTERM: {e}");
            return ExitCode::from(2);
        }
    }
    let json = cli.command.json();
    let result = match cli.command {
        Command::Pipe(args) => pipe::run(args),
        Command::Inspect { dir, json, sink } => tools::inspect(&dir, json, sink.as_deref()),
        Command::Dump(args) => tools::dump(&args),
        Command::Status { dir, json } => metrics::status(&dir, json),
        Command::Verify { dir, json, quiet } => tools::verify(&dir, json, quiet),
        Command::Repair {
            dir,
            force,
            committed,
            json,
        } => repair::repair(&dir, force, committed, json),
        #[cfg(feature = "cdc")]
        Command::Cdc(args) => cdc::run(args),
        Command::Demo(args) => demo::run(args),
        Command::Dlq(args) => dlq::run(args),
    };
    match result {
        Ok(code) => code,
        // The reader went away (`walsink dump DIR | head`): not an error.
        Err(e) if is_broken_pipe(&*e) => ExitCode::SUCCESS,
        Err(e) => {
            let refused = e.downcast_ref::<Refused>().is_some();
            let (code, kind) = if refused {
                (1, "refused")
            } else {
                (2, "error")
            };
            let message = explain(&*e);
            let mut causes = Vec::new();
            let mut source = e.source();
            while let Some(s) = source {
                causes.push(s.to_string());
                source = s.source();
            }
            eprintln!("{kind}: {message}");
            for c in &causes {
                eprintln!("  caused by: {c}");
            }
            if json && e.downcast_ref::<JsonShown>().is_none() {
                let v = error_json(code, kind, &message, &causes);
                use std::io::Write as _;
                let _ = writeln!(std::io::stdout().lock(), "{v}");
            }
            ExitCode::from(code)
        }
    }
}

/// What a command given `--json` prints on stdout when it fails, one JSON object of a stable
/// shape: `{"outcome": "error", "exit_code": 1|2, "error": {"kind": "refused"|"error",
/// "message": TEXT, "causes": [TEXT, ...]}}` (the same text as on stderr).
fn error_json(code: u8, kind: &str, message: &str, causes: &[String]) -> serde_json::Value {
    serde_json::json!({
        "outcome": "error",
        "exit_code": code,
        "error": {"kind": kind, "message": message, "causes": causes},
    })
}

/// An error's message in the CLI's words: corruption advice names the command that fixes it.
fn explain(e: &(dyn std::error::Error + 'static)) -> String {
    if let Some(w) = e.downcast_ref::<walsink::Error>() {
        if let walsink::ErrorKind::Corruption(walsink::Damage {
            segment,
            offset,
            reason,
        }) = w.kind()
        {
            return format!(
                "corruption in {segment} at offset {offset}: {reason}. `walsink verify DIR` lists the damage; `walsink repair --force DIR` keeps the valid prefix and sets the damaged part aside"
            );
        }
    }
    e.to_string()
}

fn is_broken_pipe(e: &(dyn std::error::Error + 'static)) -> bool {
    let mut cur: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(err) = cur {
        if let Some(io) = err.downcast_ref::<std::io::Error>() {
            if io.kind() == std::io::ErrorKind::BrokenPipe {
                return true;
            }
        }
        cur = err.source();
    }
    false
}
