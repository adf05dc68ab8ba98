//! `walsink`: ship records exactly once, and inspect, verify and repair a log.
//!
//! Exit codes: 0 success; 1 a check found problems or an operation was refused; 2 usage or
//! I/O errors. JSON goes to stdout, logs and progress to stderr.

mod demo;
mod pipe;
mod progress;
mod tools;

use clap::{Parser, Subcommand};
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
}

#[derive(Subcommand)]
enum Command {
    /// Ship newline-delimited records from a file through a log into a sink, exactly once
    /// across crashes: re-run with the same arguments to resume.
    Pipe(pipe::PipeArgs),
    /// Show a log's identity, segments, checkpoints and backlog.
    Inspect {
        /// The log directory.
        dir: PathBuf,
        /// Print JSON to stdout.
        #[arg(long)]
        json: bool,
    },
    /// Print the records in a log.
    Dump {
        /// The log directory.
        dir: PathBuf,
        /// Only this checkpoint's records.
        #[arg(long)]
        checkpoint: Option<u64>,
        /// One JSON object per record (data as text when UTF-8, otherwise base64).
        #[arg(long)]
        json: bool,
    },
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
    /// moves the damaged segments aside (renamed *.damaged, never deleted).
    Repair {
        /// The log directory.
        dir: PathBuf,
        /// Keep the valid prefix of a corrupted log and move the rest aside.
        #[arg(long)]
        force: bool,
    },
    /// Show the mission end to end: ship records through `pipe`, kill it with SIGKILL at
    /// random moments, restart it, and check that every record arrived exactly once.
    Demo(demo::DemoArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Pipe(args) => pipe::run(args),
        Command::Inspect { dir, json } => tools::inspect(&dir, json),
        Command::Dump {
            dir,
            checkpoint,
            json,
        } => tools::dump(&dir, checkpoint, json),
        Command::Verify { dir, json, quiet } => tools::verify(&dir, json, quiet),
        Command::Repair { dir, force } => tools::repair(&dir, force),
        Command::Demo(args) => demo::run(args),
    };
    match result {
        Ok(code) => code,
        // The reader went away (`walsink dump DIR | head`): not an error.
        Err(e) if is_broken_pipe(&*e) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            let mut source = e.source();
            while let Some(s) = source {
                eprintln!("  caused by: {s}");
                source = s.source();
            }
            ExitCode::from(2)
        }
    }
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

/// The error type of the commands.
pub type CliResult<T> = Result<T, Box<dyn std::error::Error>>;
