//! `walsink dlq`: what a dead-letter log holds (`pipe --dead-letter dir:PATH`), read-only
//! beside a running pipe.

use crate::outcome::CliResult;
use clap::{Args, Subcommand};
use serde_json::json;
use std::path::PathBuf;
use std::process::ExitCode;
use walsink::{DeadLetter, DirDeadLetters};

/// `walsink dlq …`.
#[derive(Args, Debug)]
pub struct DlqArgs {
    #[command(subcommand)]
    command: DlqCommand,
}

#[derive(Subcommand, Debug)]
enum DlqCommand {
    /// One line per record: seq, sink, shard, checkpoint, index, attempt, code, time, size
    /// and the start of the target's message.
    List {
        /// The dead-letter directory (PATH of `--dead-letter dir:PATH`).
        dir: PathBuf,
        /// One JSON object per record, one per line (without the record's bytes).
        #[arg(long)]
        json: bool,
    },
    /// Every record whole, as JSON lines: its position, class, code, message, time, attempt
    /// and bytes (`data` as text when it is UTF-8, else `data_hex`).
    Show {
        /// The dead-letter directory.
        dir: PathBuf,
        /// Only the record with this seq (per file: give --sink too when several logs share
        /// the directory).
        #[arg(long)]
        seq: Option<u64>,
        /// Only the records of this sink id.
        #[arg(long)]
        sink: Option<String>,
    },
}

/// Runs `walsink dlq`.
pub fn run(args: DlqArgs) -> CliResult<ExitCode> {
    match args.command {
        DlqCommand::List { dir, json } => {
            let letters = DirDeadLetters::read_all(&dir)?;
            for l in &letters {
                if json {
                    outln!("{}", serde_json::to_string(&summary(l))?);
                } else {
                    outln!(
                        "{}\t{}/{}\tcheckpoint {}\tindex {}\tattempt {}\t{}\t{}\t{} bytes\t{}",
                        l.seq,
                        l.sink_id,
                        l.subtask,
                        l.checkpoint,
                        l.index,
                        l.attempt,
                        l.code.as_deref().unwrap_or("-"),
                        humantime::format_rfc3339_millis(
                            std::time::UNIX_EPOCH + std::time::Duration::from_millis(l.time_ms)
                        ),
                        l.data.len(),
                        first_line(&l.message, 120)
                    );
                }
            }
            if !json {
                eprintln!(
                    "dlq: {} in {}",
                    crate::progress::plural(letters.len() as u64, "record"),
                    dir.display()
                );
            }
            Ok(ExitCode::SUCCESS)
        }
        DlqCommand::Show { dir, seq, sink } => {
            let letters = DirDeadLetters::read_all(&dir)?;
            let mut shown = 0;
            for l in letters
                .iter()
                .filter(|l| seq.is_none_or(|s| l.seq == s))
                .filter(|l| sink.as_deref().is_none_or(|s| l.sink_id == s))
            {
                let mut v = summary(l);
                match std::str::from_utf8(&l.data) {
                    Ok(t) => v["data"] = json!(t),
                    Err(_) => v["data_hex"] = json!(hex(&l.data)),
                }
                v["message"] = json!(l.message);
                outln!("{}", serde_json::to_string(&v)?);
                shown += 1;
            }
            if shown == 0 && (seq.is_some() || sink.is_some()) {
                return Err(format!("no dead letter in {} matches", dir.display()).into());
            }
            Ok(ExitCode::SUCCESS)
        }
    }
}

fn summary(l: &DeadLetter) -> serde_json::Value {
    json!({
        "seq": l.seq,
        "sink": l.sink_id,
        "shard": l.subtask,
        "checkpoint": l.checkpoint,
        "index": l.index,
        "class": l.class.name(),
        "code": l.code,
        "time_ms": l.time_ms,
        "attempt": l.attempt,
        "bytes": l.data.len(),
        "message": first_line(&l.message, 200),
        "origin": l.origin.as_ref().map(|o| json!({
            "sink": o.sink_id, "shard": o.subtask, "checkpoint": o.checkpoint, "index": o.index,
        })),
    })
}

/// The first line of `s`, at most `max` characters.
fn first_line(s: &str, max: usize) -> String {
    let line = s.lines().next().unwrap_or("");
    if line.chars().count() > max {
        format!("{}…", line.chars().take(max).collect::<String>())
    } else {
        line.to_string()
    }
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}
