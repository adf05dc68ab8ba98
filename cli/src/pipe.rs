//! `walsink pipe`: an input, the log, and a sink.
//!
//! Each checkpoint stores what the run consumed ([`PipeMeta`]: the log's id, the input path,
//! offset, fingerprint and line count) in the barrier's metadata, atomically with the barrier;
//! the directory sink keeps the same metadata with each epoch. On restart the log recovers,
//! every sealed checkpoint is completed (this command is its own checkpoint coordinator), and
//! reading resumes after the newest checkpoint of the log or of the target, whichever is
//! further: records after it were never promised and are read again (file input).

use crate::deliver::{self, Limits, StdoutSink, Stop, Watch, Watched};
use crate::resume::{self, PipeMeta};
use crate::source::{InputSpec, Next, Source};
use crate::{progress, CliResult, Refused};
use clap::Args;
use serde_json::json;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant};
use walsink::{DirSink, ErrorKind, FullPolicy, Options, RecoveryReport, Sink, WalSink};

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
    /// Where to deliver. `dir:PATH`: one file per checkpoint, exactly-once, named
    /// `{checkpoint:020}-{sink-id}-00000.txt` with one record per line, or `.bin` (each record
    /// prefixed by its length, u32 little-endian) for a checkpoint holding a record that is
    /// not UTF-8; a `.meta` file beside each holds its checkpoint metadata. `stdout`: one
    /// line per record, at-least-once.
    #[arg(long)]
    pub sink: String,
    /// Checkpoint after this many records.
    #[arg(long, default_value_t = 10_000)]
    pub checkpoint_every: u64,
    /// Also checkpoint when this much time passed since the last one (500ms, 2s, 1m, 1h).
    #[arg(long, value_parser = parse_duration)]
    pub checkpoint_interval: Option<Duration>,
    /// Stable sink id stored in the log and in the target's file names.
    #[arg(long, default_value = "pipe")]
    pub sink_id: String,
    /// Keep reading the input file as it grows, checkpointing whenever it has read all there
    /// is; stop it with a signal (the next run resumes after the last checkpoint).
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
    /// Give up after this many failed deliveries with a permanent error (permission denied,
    /// read-only, missing directory) in a row; exit 2 naming the target.
    #[arg(long, default_value_t = 5)]
    pub max_retries: u32,
    /// Give up when one checkpoint keeps failing, whatever the error, for this long.
    #[arg(long, default_value = "10m", value_parser = parse_duration)]
    pub retry_deadline: Duration,
    /// Print the summary as JSON to stdout (not with --sink stdout).
    #[arg(long)]
    pub json: bool,
    /// No progress output and no notices (errors are still printed).
    #[arg(long)]
    pub quiet: bool,
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
enum SinkSpec {
    Dir(PathBuf),
    Stdout,
}

fn parse_sink(spec: &str) -> CliResult<SinkSpec> {
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
        _ => Err(format!("unknown sink {spec:?}: use dir:PATH or stdout").into()),
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
    for entry in
        std::fs::read_dir(dir).map_err(|e| format!("cannot read --wal {}: {e}", dir.display()))?
    {
        any = true;
        if entry.map(|e| e.file_name() == "WALSINK").unwrap_or(false) {
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

/// An absolute, normalised form of a path that may not exist yet.
fn absolute(p: &Path) -> PathBuf {
    if let Ok(c) = std::fs::canonicalize(p) {
        return c;
    }
    match (p.parent(), p.file_name()) {
        (Some(parent), Some(name)) if !parent.as_os_str().is_empty() => absolute(parent).join(name),
        (_, Some(name)) => std::env::current_dir().unwrap_or_default().join(name),
        _ => std::path::absolute(p).unwrap_or_else(|_| p.to_path_buf()),
    }
}

fn is_log(dir: &Path) -> bool {
    dir.join("WALSINK").exists()
}

/// The CLI's words for an error from opening the log.
fn explain_open(e: walsink::Error, wal: &Path) -> Box<dyn std::error::Error> {
    match e.kind() {
        ErrorKind::Corruption(walsink::Damage {
            segment,
            offset,
            reason,
        }) => format!(
            "the log {} is corrupted: {segment} at offset {offset}: {reason}. `walsink verify {0}` lists the damage; `walsink repair --force {0}` keeps the valid prefix and sets the damaged part aside (its checkpoints are dropped)",
            wal.display()
        )
        .into(),
        _ => format!("cannot open the log {}: {e}", wal.display()).into(),
    }
}

fn plural(n: u64, word: &str) -> String {
    if n == 1 {
        format!("1 {word}")
    } else {
        format!("{n} {word}s")
    }
}

/// The state of one run between checkpoints.
struct Run<'a> {
    args: &'a PipeArgs,
    wal: &'a WalSink,
    source: Source,
    log_id: String,
    path: Option<String>,
    next_id: u64,
    since: u64,
    last_cp: Instant,
    last_sealed: Option<u64>,
    appended: u64,
    watch: Watch,
    limits: Limits,
    target: String,
}

impl Run<'_> {
    fn meta(&self) -> PipeMeta {
        let file = self.path.is_some();
        PipeMeta {
            v: 2,
            log: self.log_id.clone(),
            source: if file { "file" } else { "stdin" }.into(),
            path: self.path.clone(),
            offset: self.source.offset(),
            hash: file.then(|| self.source.hash()),
            size: self.source.size(),
            lines: Some(self.source.lines()),
            unterminated: self.source.unterminated(),
        }
    }

    fn checkpoint(&mut self) -> CliResult<()> {
        if self.since == 0 {
            return Ok(());
        }
        let id = self.next_id;
        self.wal.checkpoint(id, &self.meta().encode())?;
        self.wal.checkpoint_complete(id)?;
        self.last_sealed = Some(id);
        self.next_id += 1;
        self.since = 0;
        self.last_cp = Instant::now();
        Ok(())
    }

    fn stop(&self) -> Option<Stop> {
        deliver::check(&self.watch, self.limits, &self.target)
    }

    /// Appends one record; with a disk budget, waits (checkpointing what it has, so it can be
    /// delivered) while the budget is used up.
    fn append(&mut self, record: &[u8]) -> CliResult<Option<Stop>> {
        loop {
            match self.wal.append(record) {
                Ok(()) => {
                    self.since += 1;
                    self.appended += 1;
                    return Ok(None);
                }
                Err(e) if matches!(e.kind(), ErrorKind::BacklogFull { .. }) => {
                    if self.since > 0 {
                        self.checkpoint()?;
                    } else if self.wal.health().backlog_bytes == 0 {
                        return Err(format!(
                            "line {} ({} bytes) is larger than --max-backlog-bytes; raise the budget",
                            self.source.lines(),
                            record.len()
                        )
                        .into());
                    }
                    if let Some(stop) = self.stop() {
                        return Ok(Some(stop));
                    }
                    std::thread::sleep(Duration::from_millis(20));
                }
                Err(e) => return Err(e.into()),
            }
        }
    }

    /// Reads the input to its end (or until delivery must stop).
    fn read_input(&mut self) -> CliResult<(Option<Stop>, u64)> {
        let mut line = Vec::with_capacity(4096);
        let mut n = 0u64;
        let max = self.args.max_record_bytes;
        let input = self.args.input.display().to_string();
        loop {
            let next = self
                .source
                .next_line(&mut line, max)
                .map_err(|e| format!("cannot read --input {input}: {e}"))?;
            match next {
                Next::Line => {}
                Next::TooLong { line, offset } => {
                    return Err(format!(
                        "line {line} of {input} (at byte offset {offset}) is longer than the record limit of {max} bytes; raise it with --max-record-bytes (up to 1GiB)"
                    )
                    .into())
                }
                Next::Continued { offset } => {
                    return Err(Refused(format!(
                        "{input} changed under the log: its last line, shipped without a newline (--ship-final-line) and ending at offset {offset}, has been continued since. The target holds that line as it was; start a new --wal and sink directory for the new content"
                    ))
                    .into())
                }
                Next::End { partial } => return Ok((None, partial)),
                Next::Idle => {
                    self.checkpoint()?;
                    if let Some(stop) = self.stop() {
                        return Ok((Some(stop), 0));
                    }
                    self.source.check_followed()?;
                    std::thread::sleep(Duration::from_millis(100));
                    continue;
                }
            }
            if let Some(stop) = self.append(&line)? {
                return Ok((Some(stop), 0));
            }
            n += 1;
            let due = self.since >= self.args.checkpoint_every
                || self
                    .args
                    .checkpoint_interval
                    .is_some_and(|i| self.last_cp.elapsed() >= i);
            if due {
                self.checkpoint()?;
            }
            if (due || n.is_multiple_of(1024)) && self.stop().is_some() {
                return Ok((self.stop(), 0));
            }
        }
    }
}

/// Opens the input at the resume point, after checking that it is the input the log consumed.
fn open_source(
    input: &InputSpec,
    resume: &resume::Resume,
    args: &PipeArgs,
) -> CliResult<(Source, Option<String>)> {
    let wal = args.wal.display();
    let at = match resume.from {
        resume::From::Start => "the start".to_string(),
        resume::From::Log(c) => format!("checkpoint {c} of the log"),
        resume::From::Target(c) => format!("checkpoint {c} in the target"),
    };
    let meta = resume.meta.as_ref();
    match input {
        InputSpec::Stdin => {
            if let Some(m) = meta.filter(|m| m.source != "stdin") {
                return Err(Refused(format!(
                    "the log {wal} was fed from the file {} ({at}); it cannot continue from standard input. Use --input {0}, or a new --wal and sink directory for the stream",
                    m.path.as_deref().unwrap_or("(unknown)")
                ))
                .into());
            }
            let (offset, lines) = meta.map_or((0, 0), |m| (m.offset, m.lines.unwrap_or(0)));
            Ok((Source::stdin(offset, lines), None))
        }
        InputSpec::File(path) => {
            let shown = path.to_string_lossy().into_owned();
            if let Some(m) = meta {
                if m.source == "stdin" {
                    return Err(Refused(format!(
                        "the log {wal} was fed from standard input; it cannot continue with the file {shown}. Use a new --wal and sink directory for the file"
                    ))
                    .into());
                }
                if let Some(p) = m.path.as_deref().filter(|p| *p != shown) {
                    return Err(Refused(format!(
                        "the log {wal} was fed from {p} up to offset {} ({at}); --input {shown} is another file. Resume with --input {p}, or use a new --wal and sink directory for the new input",
                        m.offset
                    ))
                    .into());
                }
            }
            let offset = meta.map_or(0, |m| m.offset);
            let len = std::fs::metadata(path)
                .map_err(|e| format!("cannot read --input {shown}: {e}"))?
                .len();
            if offset > len {
                return Err(Refused(format!(
                    "--input {shown} has {len} bytes, but {at} consumed {offset}: it is not the input the log read (or it was truncated). Restore it, or use a new --wal and sink directory"
                ))
                .into());
            }
            let (src, prefix) = Source::open_file(path, offset)?;
            if let Some(h) = meta.and_then(|m| m.hash.as_deref()) {
                if h != prefix.hash {
                    return Err(Refused(format!(
                        "--input {shown} changed under the log: its first {offset} bytes are not the bytes that {at} consumed (fingerprint {} instead of {h}). The target holds records of the earlier content; restore that file, or use a new --wal and sink directory for the new one",
                        prefix.hash
                    ))
                    .into());
                }
            }
            let after = meta.is_some_and(|m| m.unterminated);
            let src = src
                .follow(args.follow)
                .ship_final_line(args.ship_final_line)
                .after_unterminated(after);
            Ok((src, Some(shown)))
        }
    }
}

/// Runs the pipe to the end of the input and until everything is delivered.
pub fn run(args: PipeArgs) -> CliResult<ExitCode> {
    if args.checkpoint_every == 0 {
        return Err("--checkpoint-every must be at least 1".into());
    }
    walsink::validate_sink_id(&args.sink_id).map_err(|e| format!("--sink-id: {e}"))?;
    let input = InputSpec::parse(&args.input)?;
    if args.follow && input == InputSpec::Stdin {
        return Err("--follow needs an input file; standard input is read to its end".into());
    }
    let sink_spec = parse_sink(&args.sink)?;
    if args.json && matches!(sink_spec, SinkSpec::Stdout) {
        return Err("--json with --sink stdout would mix the summary into the records".into());
    }
    check_log_dir(&args.wal)?;
    let wal_shown = args.wal.display().to_string();
    let out_shown = match &sink_spec {
        SinkSpec::Dir(out) => {
            let (a, b) = (absolute(&args.wal), absolute(out));
            if a.starts_with(&b) || b.starts_with(&a) {
                return Err(format!(
                    "--wal {} and --sink dir:{} must be separate directories, neither inside the other",
                    args.wal.display(),
                    out.display()
                )
                .into());
            }
            out.display().to_string()
        }
        SinkSpec::Stdout => "standard output".to_string(),
    };
    let target_epochs = |out: &Path| {
        DirSink::committed(out, &args.sink_id, 0)
            .map_err(|e| format!("cannot read the sink directory {}: {e}", out.display()))
    };
    // Refuse a target that belongs to another log before a new log is created.
    if let SinkSpec::Dir(out) = &sink_spec {
        if !is_log(&args.wal) {
            let epochs = target_epochs(out)?;
            resume::decide(
                &RecoveryReport::default(),
                Some((&out_shown, &epochs)),
                &wal_shown,
                &args.sink_id,
            )
            .map_err(Refused)?;
        }
    }
    let mut opts = Options::new(&args.sink_id)
        .max_record_size(args.max_record_bytes)
        .segment_size((64u64 << 20).max(args.max_record_bytes as u64 + (1 << 20)));
    if let Some(b) = args.max_backlog_bytes {
        opts = opts.max_backlog_bytes(b, FullPolicy::Reject);
    }
    let (wal, report) = WalSink::open(&args.wal, opts).map_err(|e| explain_open(e, &args.wal))?;
    let target = match &sink_spec {
        SinkSpec::Dir(out) => Some(target_epochs(out)?),
        SinkSpec::Stdout => None,
    };
    let resume = resume::decide(
        &report,
        target.as_deref().map(|t| (out_shown.as_str(), t)),
        &wal_shown,
        &args.sink_id,
    )
    .map_err(Refused)?;
    let (source, path) = open_source(&input, &resume, &args)?;
    let notice = |s: String| {
        if !args.quiet {
            eprintln!("{s}");
        }
    };
    if let Some(torn) = &report.torn_tail {
        notice(format!(
            "recovered: cut a torn tail at {} offset {} ({})",
            torn.segment, torn.offset, torn.reason
        ));
    }
    let resumed = match (&resume.from, &resume.meta) {
        (resume::From::Start, _) => "the start of the input".to_string(),
        (from, Some(m)) => format!(
            "{} at input offset {}{}",
            match from {
                resume::From::Log(c) => format!("checkpoint {c} of the log"),
                resume::From::Target(c) =>
                    format!("checkpoint {c} in the target (ahead of the log)"),
                resume::From::Start => unreachable!("matched above"),
            },
            m.offset,
            m.lines
                .map_or(String::new(), |l| format!(" (line {})", l + 1))
        ),
        (_, None) => "the start of the input".to_string(),
    };
    if !matches!(resume.from, resume::From::Start) {
        notice(format!("pipe: resuming after {resumed}"));
    }
    // This command coordinates its own checkpoints: every sealed one is complete.
    if let Some(&last) = report.pending.last() {
        wal.checkpoint_complete(last)?;
    }
    let watch = Watch::default();
    let sink: Box<dyn Sink> = match &sink_spec {
        SinkSpec::Dir(out) => Box::new(Watched::new(
            DirSink::new(out)?.keep_metadata(true),
            watch.clone(),
        )),
        SinkSpec::Stdout => Box::new(Watched::new(
            StdoutSink {
                watch: watch.clone(),
            },
            watch.clone(),
        )),
    };
    let committer = wal.spawn_committer(sink)?;
    let start_offset = source.offset();
    let pb = progress::bar(
        source.size().unwrap_or(0),
        args.quiet,
        "{spinner} pipe [{bar:40}] {bytes}/{total_bytes} {msg}",
    );
    pb.set_position(start_offset);
    let mut run = Run {
        args: &args,
        wal: &wal,
        source,
        log_id: resume.log_id.clone(),
        path,
        next_id: resume.next_id,
        since: 0,
        last_cp: Instant::now(),
        last_sealed: report.pending.last().copied(),
        appended: 0,
        watch: watch.clone(),
        limits: Limits {
            max_retries: args.max_retries,
            deadline: Some(args.retry_deadline),
        },
        target: out_shown.clone(),
    };
    let (mut stop, partial) = run.read_input()?;
    if stop.is_none() || stop == Some(Stop::StdoutClosed) {
        // What was read is sealed: it stays in the log for the next run.
        run.checkpoint()?;
    }
    pb.set_position(run.source.offset());
    pb.set_message("delivering");
    let mut last_report = Instant::now();
    if let (None, Some(last)) = (&stop, run.last_sealed) {
        while !wal.wait_committed(last, Duration::from_millis(200)) {
            if let Some(s) = run.stop() {
                stop = Some(s);
                break;
            }
            let w = watch.lock().unwrap_or_else(|p| p.into_inner());
            if let Some(err) = &w.last_error {
                if last_report.elapsed() > Duration::from_secs(5) {
                    eprintln!("delivery is retrying (attempt {}): {err}", w.attempts);
                    last_report = Instant::now();
                }
            }
        }
    }
    committer.shutdown();
    pb.finish_and_clear();
    let h = wal.health();
    let committed = h.committed.or(report.committed).max(match resume.from {
        resume::From::Target(t) => Some(t),
        _ => None,
    });
    let committed_text = committed.map_or("none yet".to_string(), |c| c.to_string());
    let outcome = match &stop {
        None => "done",
        Some(Stop::StdoutClosed) => "stdout_closed",
        Some(Stop::GaveUp(_)) => "gave_up",
    };
    if args.json {
        let v = json!({
            "outcome": outcome,
            "input": args.input.display().to_string(),
            "resumed_from": match resume.from {
                resume::From::Start => json!({"from": "start", "offset": 0}),
                resume::From::Log(c) => json!({"from": "log", "checkpoint": c, "offset": start_offset}),
                resume::From::Target(c) => json!({"from": "target", "checkpoint": c, "offset": start_offset}),
            },
            "input_offset": run.source.offset(),
            "records_read": run.appended,
            "unshipped_final_line_bytes": partial,
            "committed": committed,
            "epochs_delivered": h.delivered_epochs,
            "records_delivered": h.delivered_records,
            "wal": wal_shown,
            "sink": args.sink,
        });
        println!("{}", serde_json::to_string_pretty(&v)?);
    }
    if partial > 0 {
        eprintln!(
            "warning: the last {} of {} have no newline and were not shipped (the file may still grow); end the line with a newline and re-run, or re-run with --ship-final-line if the file is complete",
            plural(partial, "byte"),
            args.input.display()
        );
    }
    match stop {
        Some(Stop::GaveUp(msg)) => Err(format!(
            "{msg}. The records stay in the log {wal_shown} (committed through checkpoint {committed_text}); fix the target and re-run the same command"
        )
        .into()),
        Some(Stop::StdoutClosed) => {
            notice(format!(
                "pipe: standard output was closed; committed through checkpoint {committed_text}; the records not yet printed stay in the log {wal_shown} and a re-run prints them"
            ));
            Ok(ExitCode::SUCCESS)
        }
        None => {
            if !args.json {
                notice(format!(
                    "pipe: input consumed ({} bytes); committed through checkpoint {committed_text}; {} delivered in this run",
                    run.source.offset(),
                    plural(h.delivered_epochs, "epoch")
                ));
            }
            Ok(ExitCode::SUCCESS)
        }
    }
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
