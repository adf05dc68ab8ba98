//! `walsink pipe`: a resettable file source, the log, and a sink.
//!
//! Each checkpoint stores the input byte offset after its last record in the barrier's
//! metadata, atomically with the barrier. On restart the log recovers, every sealed checkpoint
//! is completed (this command is its own checkpoint coordinator), and reading resumes at the
//! newest checkpoint's offset: records after it were never promised and are read again.

use crate::progress;
use crate::CliResult;
use clap::Args;
use std::fs::File;
use std::io::{BufRead, BufReader, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant};
use walsink::{DirSink, Epoch, Options, Sink, SinkError, WalSink};

/// Arguments of `walsink pipe`.
#[derive(Args, Debug, Clone)]
pub struct PipeArgs {
    /// Newline-delimited input records.
    #[arg(long)]
    pub input: PathBuf,
    /// The log directory (created if missing or empty).
    #[arg(long)]
    pub wal: PathBuf,
    /// Where to deliver: `dir:PATH` (one file per checkpoint, exactly-once) or `stdout`
    /// (at-least-once).
    #[arg(long)]
    pub sink: String,
    /// Checkpoint after this many records.
    #[arg(long, default_value_t = 10_000)]
    pub checkpoint_every: u64,
    /// Also checkpoint when this much time passed since the last one (e.g. 500ms, 2s, 1m).
    #[arg(long, value_parser = parse_duration)]
    pub checkpoint_interval: Option<Duration>,
    /// Stable sink id stored in the log.
    #[arg(long, default_value = "pipe")]
    pub sink_id: String,
    /// No progress output.
    #[arg(long)]
    pub quiet: bool,
}

/// Parses `500ms`, `2s`, `1m` or a plain number of seconds.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    let (num, unit) = s
        .find(|c: char| !c.is_ascii_digit() && c != '.')
        .map_or((s, "s"), |i| (&s[..i], &s[i..]));
    let n: f64 = num.parse().map_err(|_| format!("not a duration: {s:?}"))?;
    let secs = match unit {
        "ms" => n / 1000.0,
        "s" => n,
        "m" => n * 60.0,
        _ => return Err(format!("unknown unit in {s:?}: use ms, s or m")),
    };
    if !secs.is_finite() || secs <= 0.0 {
        return Err(format!("duration must be positive: {s:?}"));
    }
    Ok(Duration::from_secs_f64(secs))
}

/// Writes each record as a line to standard output: at-least-once (a crash between the write
/// and the commit mark prints the epoch again).
struct StdoutSink;

impl Sink for StdoutSink {
    fn deliver(&mut self, epoch: &Epoch) -> Result<(), SinkError> {
        let out = std::io::stdout();
        let mut out = std::io::BufWriter::new(out.lock());
        for r in epoch.records() {
            out.write_all(r.data)?;
            out.write_all(b"\n")?;
        }
        out.flush()?;
        Ok(())
    }
}

fn make_sink(spec: &str) -> CliResult<Box<dyn Sink>> {
    match spec.split_once(':') {
        Some(("dir", path)) if !path.is_empty() => Ok(Box::new(DirSink::new(path)?)),
        None if spec == "stdout" => Ok(Box::new(StdoutSink)),
        _ => Err(format!("unknown sink {spec:?}: use dir:PATH or stdout").into()),
    }
}

/// Refuses to turn a non-empty directory that is not a walsink log into one.
pub fn check_log_dir(dir: &Path) -> CliResult<()> {
    if !dir.exists() {
        return Ok(());
    }
    let mut entries = std::fs::read_dir(dir)?
        .filter_map(|e| e.ok())
        .map(|e| e.file_name());
    let mut any = false;
    for name in entries.by_ref() {
        any = true;
        if name == "WALSINK" {
            return Ok(());
        }
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

fn parse_offset(meta: &[u8]) -> Option<u64> {
    std::str::from_utf8(meta)
        .ok()?
        .strip_prefix("input-offset=")?
        .parse()
        .ok()
}

/// Runs the pipe to the end of the input and until everything is delivered.
pub fn run(args: PipeArgs) -> CliResult<ExitCode> {
    if args.checkpoint_every == 0 {
        return Err("--checkpoint-every must be at least 1".into());
    }
    check_log_dir(&args.wal)?;
    let sink = make_sink(&args.sink)?;
    let input_len = std::fs::metadata(&args.input)
        .map_err(|e| format!("cannot read input {}: {e}", args.input.display()))?
        .len();
    let (wal, report) = WalSink::open(&args.wal, Options::new(&args.sink_id))?;
    let mut offset = report
        .last_metadata
        .as_deref()
        .and_then(parse_offset)
        .unwrap_or(0);
    if offset > input_len {
        return Err(format!(
            "the log's last checkpoint is at input offset {offset}, past the end of {} ({input_len} bytes): is it the same input?",
            args.input.display()
        )
        .into());
    }
    if let Some(torn) = report.torn_tail.as_ref().filter(|_| !args.quiet) {
        eprintln!(
            "recovered: cut a torn tail at {} offset {} ({})",
            torn.segment, torn.offset, torn.reason
        );
    }
    // This command coordinates its own checkpoints: every sealed one is complete.
    if let Some(&last) = report.pending.last() {
        wal.checkpoint_complete(last)?;
    }
    let committer = wal.spawn_committer(sink)?;
    let mut file = File::open(&args.input)?;
    file.seek(SeekFrom::Start(offset))?;
    let mut reader = BufReader::with_capacity(1 << 20, file);
    let pb = progress::bar(
        input_len,
        args.quiet,
        "{spinner} pipe [{bar:40}] {bytes}/{total_bytes} {msg}",
    );
    pb.set_position(offset);
    let mut next_id = report.next_checkpoint_id;
    let mut since = 0u64;
    let mut last_cp = Instant::now();
    let mut line = Vec::with_capacity(4096);
    let mut last_sealed = report.pending.last().copied();
    loop {
        line.clear();
        let n = reader.read_until(b'\n', &mut line)?;
        if n == 0 {
            break;
        }
        offset += n as u64;
        let record = line.strip_suffix(b"\n").unwrap_or(&line);
        wal.append(record)?;
        since += 1;
        let due = since >= args.checkpoint_every
            || args
                .checkpoint_interval
                .is_some_and(|i| last_cp.elapsed() >= i);
        if due {
            wal.checkpoint(next_id, format!("input-offset={offset}").as_bytes())?;
            wal.checkpoint_complete(next_id)?;
            last_sealed = Some(next_id);
            next_id += 1;
            since = 0;
            last_cp = Instant::now();
            pb.set_position(offset);
        }
    }
    if since > 0 {
        wal.checkpoint(next_id, format!("input-offset={offset}").as_bytes())?;
        wal.checkpoint_complete(next_id)?;
        last_sealed = Some(next_id);
    }
    pb.set_position(offset);
    pb.set_message("delivering");
    if let Some(last) = last_sealed {
        let mut last_report = Instant::now();
        while !wal.wait_committed(last, Duration::from_millis(500)) {
            let h = wal.health();
            if let Some(err) = &h.last_error {
                if last_report.elapsed() > Duration::from_secs(5) {
                    eprintln!("delivery is retrying (attempt {}): {err}", h.retries);
                    last_report = Instant::now();
                }
            }
        }
    }
    committer.shutdown();
    pb.finish_and_clear();
    let h = wal.health();
    if !args.quiet {
        eprintln!(
            "pipe: input consumed ({offset} bytes); committed through checkpoint {}; {} epochs delivered in this run",
            h.committed.map_or("-".to_string(), |c| c.to_string()),
            h.delivered_epochs
        );
    }
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("2s"), Ok(Duration::from_secs(2)));
        assert_eq!(parse_duration("1m"), Ok(Duration::from_secs(60)));
        assert_eq!(parse_duration("3"), Ok(Duration::from_secs(3)));
        assert!(parse_duration("0s").is_err());
        assert!(parse_duration("5h").is_err());
        assert!(parse_duration("x").is_err());
    }

    #[test]
    fn offsets() {
        assert_eq!(parse_offset(b"input-offset=42"), Some(42));
        assert_eq!(parse_offset(b"garbage"), None);
    }
}
