//! The arguments of `walsink pipe` and their checks: durations, sizes, the sink, the log
//! directory. Every error names the argument and what was expected.

use crate::outcome::CliResult;
use clap::Args;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Arguments of `walsink pipe`.
#[derive(Args, Debug, Clone)]
pub struct PipeArgs {
    /// Newline-delimited input records: a regular file (resumable), or `-` for standard
    /// input. A line is shipped once its newline is read; see --ship-final-line.
    #[arg(long)]
    pub input: PathBuf,
    /// The log directory (created if missing or empty).
    #[arg(long)]
    pub wal: PathBuf,
    /// Where to deliver: `dir:PATH`, `stdout`, or a target URL (all listed in --help).
    #[arg(long, long_help = sink_help())]
    pub sink: String,
    /// Checkpoint after this many records.
    #[arg(long, default_value_t = 10_000)]
    pub checkpoint_every: u64,
    /// Also checkpoint when this much time passed since the last one (500ms, 2s, 1m, 1h).
    #[arg(long, value_parser = parse_duration)]
    pub checkpoint_interval: Option<Duration>,
    /// Stable sink id stored in the log and kept with each commit in the target. Default:
    /// the log's own when --wal holds a log; for a new log, one named after what the target
    /// writes to (`pipe-TABLE` for a PostgreSQL or MySQL table, `pipe-KEY` for a Redis key,
    /// `pipe-STREAM.SUBJECT` for NATS), so two pipes into two tables of one database do not
    /// share one; `pipe` for a directory, standard output or HTTP.
    #[arg(long)]
    pub sink_id: Option<String>,
    /// Take the shard (sink id, subtask 0) over from another log that owns it in the target
    /// (a directory, PostgreSQL, MySQL or Redis target records the owning log and a generation): the
    /// other log is refused at its next commit, writing nothing, and this run resumes the
    /// input from the target's newest checkpoint. Without it a target owned by another log is
    /// refused at start.
    #[arg(long)]
    pub take_over: bool,
    /// Keep reading the input file as it grows and across rotations (rename and create,
    /// copytruncate: see the README), checkpointing whenever it has read all there is; stop it
    /// with SIGINT or SIGTERM (graceful, exit 3, see --stop-timeout; the next run resumes after
    /// the last checkpoint).
    #[arg(long)]
    pub follow: bool,
    /// The input file is complete: ship a last line that has no newline as a record. Without
    /// it such a line is left unshipped (the file may still grow). A later run refuses the file
    /// if that line was continued.
    #[arg(long)]
    pub ship_final_line: bool,
    /// Largest record (line without its newline), in bytes: 512, 64KiB, 16MiB, up to 1GiB.
    #[arg(long, default_value = "16MiB", value_parser = parse_record_bytes)]
    pub max_record_bytes: usize,
    /// Disk budget for records read but not yet delivered, in bytes (e.g. 256MiB); reading
    /// pauses while it is used up. Default: no limit.
    #[arg(long, value_parser = parse_bytes)]
    pub max_backlog_bytes: Option<u64>,
    /// Retry a delivery that failed with a permanent error (permission denied, read-only,
    /// missing directory) at most this many times in a row, then give up: exit 2 naming the
    /// target (0: give up at the first permanent failure).
    #[arg(long, default_value_t = 5)]
    pub max_retries: u32,
    /// Give up when one checkpoint keeps failing, whatever the error, for this long.
    #[arg(long, default_value = "10m", value_parser = parse_duration)]
    pub retry_deadline: Duration,
    /// On SIGINT or SIGTERM: stop reading, checkpoint what was read, and wait this long for
    /// it to be delivered; then print the summary and exit 3 (what is not delivered by then
    /// stays in the log for the next run). A second signal exits at once (130 / 143).
    #[arg(long, default_value = "5s", value_parser = parse_duration)]
    pub stop_timeout: Duration,
    /// When stderr is not a terminal, print a one-line progress report this often (on a
    /// terminal a bar shows instead). A failing delivery is reported when it starts failing
    /// and then once per interval while it lasts.
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    pub progress_interval: Duration,
    /// Print the summary as JSON to stdout (not with --sink stdout); a failed run prints an
    /// error object instead (`{"outcome": "error", "exit_code", "error": {...}}`).
    #[arg(long)]
    pub json: bool,
    /// No progress output and no notices (errors are still printed).
    #[arg(long)]
    pub quiet: bool,
    /// Serve the log's figures as Prometheus text at http://HOST:PORT/metrics while the pipe
    /// runs (backlog, commit durations, deliveries, retries by class, free disk;
    /// docs/metrics.md lists them). A port already taken is an error at start. Port 0 picks a
    /// free one, printed in the start notice.
    #[arg(long, value_name = "HOST:PORT")]
    pub metrics_addr: Option<String>,
    /// Where records the target refuses for good go (a CHECK constraint, a value too long,
    /// an HTTP 422), as `dir:PATH`: each one durably, with its position (sink, shard,
    /// checkpoint, index), the target's code and message and a time, before the rest of its
    /// checkpoint is delivered without it. Read them with `walsink dlq list PATH`. Without
    /// it, such a record stops delivery (--max-retries).
    #[arg(long, value_name = "dir:PATH")]
    pub dead_letter: Option<String>,
    /// Stop (exit 2) rather than put more than this many records into the dead-letter log;
    /// the record past the limit stays in the log.
    #[arg(long, value_name = "N", requires = "dead_letter")]
    pub max_dead_letters: Option<u64>,
}

/// The long help of `--sink`: every target this build knows, URL schemes included.
fn sink_help() -> String {
    let mut h = String::from(
        "Where to deliver.\n\n\
         dir:PATH: one file per checkpoint, exactly-once, named \
         `{checkpoint:020}-{sink-id}-00000.txt` with one record per line, or `.bin` (each record \
         prefixed by its length, u32 little-endian) for a checkpoint holding a record that is \
         not UTF-8; a `.meta` file beside each holds its checkpoint metadata.\n\n\
         stdout: one line per record, at-least-once; an epoch counts as delivered once a pipe's \
         reader took all of it (a reader that leaves mid-epoch: exit 141, and the next run prints \
         that epoch again from its first record).",
    );
    for scheme in crate::targets::schemes() {
        let form = match scheme {
            "postgres" => "postgres://USER@HOST:PORT/DB?table=NAME[&mode=2pc] (also postgresql://): exactly-once, rows and marker in one transaction",
            "mysql" => "mysql://USER@HOST:PORT/DB?table=NAME[&mode=xa] (also mariadb://): exactly-once, rows and marker in one InnoDB transaction",
            "http" => "http://HOST:PORT/PATH[?max_records=N&max_bytes=B&timeout=5s]: exactly-once for a receiver that deduplicates by Idempotency-Key",
            "https" => "https://HOST:PORT/PATH[?…]: as http://, over TLS",
            "redis" => "redis://HOST:PORT/DB?key=NAME&mode=list|stream|hash[&password_file=PATH]: exactly-once inside Redis",
            "rediss" => "rediss://HOST:PORT/DB?key=NAME[&ca_file=PATH&verify=full|ca|none&cert_file=PATH&key_file=PATH]: as redis://, over TLS",
            "nats" => "nats://HOST:PORT/?stream=NAME&subject=SUBJECT: exactly-once within the stream's duplicate window",
            _ => "",
        };
        h.push_str("\n\n");
        if form.is_empty() {
            h.push_str(&format!("{scheme}://…"));
        } else {
            h.push_str(form);
        }
    }
    h
}

/// Parses a duration with its unit: `500ms`, `2s`, `1m`, `1h`, `1h 30m`.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let d = humantime::parse_duration(s.trim()).map_err(|e| {
        format!("{s:?} is not a duration ({e}); write it with a unit, such as 500ms, 2s, 1m or 1h")
    })?;
    if d.is_zero() {
        return Err(format!("duration must be positive: {s:?}"));
    }
    Ok(d)
}

/// Parses a byte count: `4096`, `64KiB`, `16MiB`, `1GiB` (also `k`, `M`, `G` as powers of 1024).
pub fn parse_bytes(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let n: u64 = num
        .parse()
        .map_err(|_| format!("{s:?} is not a byte count: use a number such as 4096 or 16MiB"))?;
    let mult: u64 = match unit.trim() {
        "" | "B" => 1,
        "k" | "K" | "KiB" | "KB" => 1 << 10,
        "M" | "MiB" | "MB" => 1 << 20,
        "G" | "GiB" | "GB" => 1 << 30,
        u => {
            return Err(format!(
                "unknown unit {u:?} in {s:?}: use B, KiB, MiB or GiB"
            ))
        }
    };
    n.checked_mul(mult)
        .ok_or_else(|| format!("{s:?} is too large"))
}

fn parse_record_bytes(s: &str) -> Result<usize, String> {
    let n = parse_bytes(s)?;
    if n == 0 || n > 1 << 30 {
        return Err(format!(
            "{s:?}: the record limit must be between 1 byte and 1GiB"
        ));
    }
    usize::try_from(n).map_err(|_| format!("{s:?} is too large for this machine"))
}

/// Where `--sink` delivers.
pub(crate) enum SinkSpec {
    Dir(PathBuf),
    Stdout,
    /// A target named by URL (see `targets`).
    Target(Box<dyn crate::targets::Target>),
}

pub(crate) fn parse_sink(spec: &str) -> CliResult<SinkSpec> {
    match spec.split_once(':') {
        Some(("dir", path)) if !path.is_empty() => {
            let p = PathBuf::from(path);
            if p.exists() && !p.is_dir() {
                return Err(
                    format!("--sink dir:{path}: {path} exists and is not a directory").into(),
                );
            }
            Ok(SinkSpec::Dir(p))
        }
        None if spec == "stdout" => Ok(SinkSpec::Stdout),
        _ => match crate::targets::parse(spec) {
            Some(t) => Ok(SinkSpec::Target(t?)),
            None => {
                let mut known = vec!["dir:PATH".to_string(), "stdout".to_string()];
                known.extend(crate::targets::schemes().iter().map(|s| format!("{s}://…")));
                Err(format!(
                    "unknown sink {:?}: use {}",
                    walsink::redact_url(spec),
                    known.join(", ")
                )
                .into())
            }
        },
    }
}

/// Refuses to turn a non-empty directory that is not a walsink log into one.
pub fn check_log_dir(dir: &Path) -> CliResult<()> {
    if !dir.exists() {
        return Ok(());
    }
    if !dir.is_dir() {
        return Err(format!("--wal {} exists and is not a directory", dir.display()).into());
    }
    let mut any = false;
    // What a log's first open leaves when it is killed before its identity file is in place:
    // the lock file and the identity's temporary file. Such a directory is still new.
    let unborn = [
        walsink::format::LOCK_FILE.to_string(),
        format!("{}.tmp", walsink::format::IDENTITY_FILE),
    ];
    for entry in
        std::fs::read_dir(dir).map_err(|e| format!("cannot read --wal {}: {e}", dir.display()))?
    {
        let name = entry.map(|e| e.file_name()).unwrap_or_default();
        if name == walsink::format::IDENTITY_FILE {
            return Ok(());
        }
        any |= !unborn.iter().any(|u| name == u.as_str());
    }
    if any {
        return Err(format!(
            "{} is not empty and not a walsink log; refusing to write into it",
            dir.display()
        )
        .into());
    }
    Ok(())
}

/// An absolute, normalised form of a path that may not exist yet.
pub(crate) fn absolute(p: &Path) -> PathBuf {
    if let Ok(c) = std::fs::canonicalize(p) {
        return c;
    }
    match (p.parent(), p.file_name()) {
        (Some(parent), Some(name)) if !parent.as_os_str().is_empty() => absolute(parent).join(name),
        (_, Some(name)) => std::env::current_dir().unwrap_or_default().join(name),
        _ => std::path::absolute(p).unwrap_or_else(|_| p.to_path_buf()),
    }
}

pub(crate) fn is_log(dir: &Path) -> bool {
    dir.join(walsink::format::IDENTITY_FILE).exists()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_need_a_unit_and_fit() {
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("2s"), Ok(Duration::from_secs(2)));
        assert_eq!(parse_duration("1m"), Ok(Duration::from_secs(60)));
        assert_eq!(parse_duration("1h"), Ok(Duration::from_secs(3600)));
        let e = parse_duration("10").unwrap_err();
        assert!(e.contains("unit"), "{e}");
        assert!(parse_duration("0s").is_err());
        assert!(parse_duration("99999999999999999999s").is_err());
        assert!(parse_duration("x").is_err());
    }

    #[test]
    fn a_log_killed_in_its_first_open_is_still_new() {
        let d = tempfile::tempdir().unwrap();
        std::fs::write(d.path().join("LOCK"), b"").unwrap();
        std::fs::write(d.path().join("WALSINK.tmp"), b"half").unwrap();
        assert!(check_log_dir(d.path()).is_ok());
        std::fs::write(d.path().join("notes.txt"), b"mine").unwrap();
        assert!(check_log_dir(d.path()).is_err());
    }

    #[test]
    fn byte_counts() {
        assert_eq!(parse_bytes("4096"), Ok(4096));
        assert_eq!(parse_bytes("16MiB"), Ok(16 << 20));
        assert_eq!(parse_bytes("1GiB"), Ok(1 << 30));
        assert!(parse_bytes("1PiB").is_err());
        assert!(parse_bytes("99999999999999999999").is_err());
        assert!(parse_record_bytes("2GiB").is_err());
        assert!(parse_record_bytes("0").is_err());
    }
}
