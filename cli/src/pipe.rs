//! `walsink pipe`: an input, the log, and a sink.
//!
//! Each checkpoint stores what the run consumed ([`PipeMeta`]: the log's id, the input path,
//! offset, fingerprint and line count) in the barrier's metadata, atomically with the barrier;
//! the directory sink keeps the same metadata with each epoch. On restart the log recovers,
//! every sealed checkpoint is completed (this command is its own checkpoint coordinator), and
//! reading resumes after the newest checkpoint of the log or of the target, whichever is
//! further: records after it were never promised and are read again (file input).

use crate::deliver::{self, Limits, StdoutSink, Stop, Watch, Watched};
use crate::outcome::{CliResult, JsonShown, Refused};
use crate::pipe_args::{absolute, check_log_dir, is_log, parse_sink, PipeArgs, SinkSpec};
use crate::progress::{plural, Reporter, Snapshot};
use crate::resume::{self, PipeMeta};
use crate::source::{InputSpec, Next, Saved, Source, SourceMark};
use crate::stop;
use serde_json::json;
use std::path::Path;
use std::process::ExitCode;
use std::time::{Duration, Instant};
use walsink::{DirSink, ErrorKind, FullPolicy, Options, RecoveryReport, Sink, WalSink};

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

/// A check of one input line; the message says why it is refused.
pub(crate) type LineCheck = fn(&[u8]) -> Result<(), String>;

/// Exit code of `--sink stdout` whose reader left before every record was printed (128 +
/// SIGPIPE, what a shell shows for `cat FILE | head` under `set -o pipefail`).
pub const EXIT_STDOUT_CLOSED: u8 = 141;

/// What a command built on `pipe` (`walsink cdc --input`) changes: its name in messages, its
/// own target instead of `--sink`'s, and a check of every line before it is shipped.
pub(crate) struct Hooks {
    /// The command's name at the start of notices and progress lines.
    pub name: &'static str,
    /// The target, in place of parsing `--sink`.
    pub target: Option<Box<dyn crate::targets::Target>>,
    /// Refuses a line (the message says why) before it goes into the log.
    pub check_line: Option<LineCheck>,
}

impl Default for Hooks {
    fn default() -> Self {
        Hooks {
            name: "pipe",
            target: None,
            check_line: None,
        }
    }
}

/// The state of one run between checkpoints.
struct Run<'a> {
    args: &'a PipeArgs,
    check_line: Option<LineCheck>,
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
    /// With a disk budget: the input as it stood before the line being shipped was read,
    /// while that line waits for room. A checkpoint taken then (the budget cuts the epoch
    /// short, or the run stops) must not count the line: the log does not hold it.
    waiting: Option<SourceMark>,
    progress: Reporter,
}

impl Run<'_> {
    fn meta(&self) -> PipeMeta {
        let file = self.path.is_some();
        let at = self.waiting.clone().unwrap_or_else(|| self.source.mark());
        PipeMeta {
            v: 3,
            log: self.log_id.clone(),
            source: if file { "file" } else { "stdin" }.into(),
            path: self.path.clone(),
            file: at.file,
            offset: at.offset,
            hash: file.then(|| at.hash()),
            size: self.source.size(),
            lines: Some(at.lines),
            unterminated: at.unterminated,
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

    /// Whether the run must stop: the target is given up on, standard output is gone, or a
    /// signal asked for it.
    fn stop(&self) -> Option<Stop> {
        deliver::check(&self.watch, self.limits, &self.target)
            .or_else(|| stop::requested().map(Stop::Signal))
    }

    /// Brings the progress report up to date.
    fn tick(&mut self) {
        let (wal, source, read) = (self.wal, &self.source, self.appended);
        self.progress
            .tick(&self.watch, || snapshot(wal, source, read));
    }

    /// Appends one record; with a disk budget, waits (checkpointing what it has, so it can be
    /// delivered) while the budget is used up.
    fn append(&mut self, record: &[u8], before: Option<&SourceMark>) -> CliResult<Option<Stop>> {
        loop {
            match self.wal.append(record) {
                Ok(()) => {
                    self.waiting = None;
                    self.since += 1;
                    self.appended += 1;
                    return Ok(None);
                }
                Err(e) if matches!(e.kind(), ErrorKind::BacklogFull { .. }) => {
                    if self.waiting.is_none() {
                        self.waiting = before.cloned();
                    }
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
                    self.tick();
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
        let budget = self.args.max_backlog_bytes.is_some();
        loop {
            // Only a disk budget can keep a line read but not shipped (it waits for room).
            let before = budget.then(|| self.source.mark());
            let next = match self.source.next_line(&mut line, max) {
                Ok(next) => next,
                // Standard input saw a stop signal: every line it read was handed out.
                Err(e) if stop::is_stopped(&e) => {
                    return Ok((self.stop(), 0));
                }
                // Standard input has no data for now: what was read is made safe meanwhile.
                Err(e) if stop::is_waiting(&e) => {
                    self.checkpoint()?;
                    if let Some(stop) = self.stop() {
                        return Ok((Some(stop), 0));
                    }
                    self.tick();
                    continue;
                }
                Err(e) => return Err(format!("cannot read --input {input}: {e}").into()),
            };
            match next {
                Next::Line => {}
                Next::TooLong { line, offset } => {
                    return Err(format!(
                        "line {line} of {input} (at byte offset {offset}) is longer than the record limit of {max} bytes; raise it with `walsink pipe --max-record-bytes` (up to 1GiB; `walsink cdc` takes events of at most 16 MiB)"
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
                    self.tick();
                    self.source.check_followed()?;
                    std::thread::sleep(Duration::from_millis(100));
                    continue;
                }
            }
            if let Some(check) = self.check_line {
                check(&line).map_err(|e| {
                    Refused(format!(
                        "line {} of {input} is refused: {e}; nothing after the last checkpoint was shipped",
                        self.source.lines()
                    ))
                })?;
            }
            if let Some(stop) = self.append(&line, before.as_ref())? {
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
            // A signal is checked at every line (one atomic load): a stop reads nothing more.
            if let Some(sig) = stop::requested() {
                return Ok((Some(Stop::Signal(sig)), 0));
            }
            if due || n.is_multiple_of(1024) {
                if let Some(stop) = self.stop() {
                    return Ok((Some(stop), 0));
                }
                self.tick();
            }
        }
    }
}

/// Where the run stands, for the progress report.
fn snapshot(wal: &WalSink, source: &Source, read: u64) -> Snapshot {
    let h = wal.health();
    Snapshot {
        offset: source.offset(),
        size: source.size(),
        read,
        delivered: h.delivered_records,
        committed: h.committed,
        backlog: h.backlog_records + h.open_records,
    }
}

/// Stops the committer after the epoch in progress, waiting at most `limit` for it (`None`:
/// as long as it takes). Returns whether it stopped; one that did not (a target that hangs)
/// is left to end with the process, as a crash would: what it delivered and did not mark yet
/// is delivered again by the next run, which every target absorbs (stdout prints it again).
pub(crate) fn shutdown_within(committer: walsink::Committer, limit: Option<Duration>) -> bool {
    let Some(limit) = limit else {
        committer.shutdown();
        return true;
    };
    let (tx, rx) = std::sync::mpsc::channel();
    let spawned = std::thread::Builder::new()
        .name("walsink-stop".into())
        .spawn(move || {
            committer.shutdown();
            let _ = tx.send(());
        });
    spawned.is_ok() && rx.recv_timeout(limit).is_ok()
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
            let saved = meta.map(|m| Saved {
                file: m.file,
                offset: m.offset,
                hash: m.hash.as_deref(),
                unterminated: m.unterminated,
            });
            let src = Source::resume_file(path, saved.as_ref(), args.follow, &at)?;
            let src = src
                .follow(args.follow)
                .ship_final_line(args.ship_final_line)
                .quiet(args.quiet);
            Ok((src, Some(shown)))
        }
    }
}

/// Runs the pipe to the end of the input and until everything is delivered.
pub fn run(args: PipeArgs) -> CliResult<ExitCode> {
    run_with(args, Hooks::default())
}

/// The sink id of a run, and whether it was derived from the target: `--sink-id` when given; else the log's own when `wal` holds a log
/// (so a log made before the default was derived keeps its id); else, for a new log, one
/// named after what the target writes to ([`Target::object`]): `pipe-OBJECT`, its characters
/// outside `A-Z a-z 0-9 . _ -` made `_`, and a long one cut to fit 64 characters with a hash
/// of the whole; `pipe` for a directory, standard output or a target without an object.
fn resolve_sink_id(
    given: Option<&str>,
    wal: &Path,
    target: Option<&dyn crate::targets::Target>,
) -> CliResult<(String, bool)> {
    if let Some(id) = given {
        return Ok((id.to_string(), false));
    }
    if is_log(wal) {
        let file = wal.join(walsink::format::IDENTITY_FILE);
        let bytes =
            std::fs::read(&file).map_err(|e| format!("cannot read {}: {e}", file.display()))?;
        let id = walsink::format::decode_identity(&bytes).map_err(|e| {
            format!(
                "the identity file {} is damaged ({e:?}), so the log's sink id is unknown: give --sink-id",
                file.display()
            )
        })?;
        return Ok((id.sink_id, false));
    }
    Ok(match target.and_then(|t| t.object()) {
        Some(object) => (derived_sink_id(&object), true),
        None => (LEGACY_SINK_ID.to_string(), false),
    })
}

/// The default sink id of every pipe before it was derived from the target.
const LEGACY_SINK_ID: &str = "pipe";

/// `pipe-OBJECT` as a valid sink id (see [`resolve_sink_id`]).
fn derived_sink_id(object: &str) -> String {
    let clean: String = object
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || "._-".contains(c) {
                c
            } else {
                '_'
            }
        })
        .collect();
    let hash = xxhash_rust::xxh3::xxh3_64(object.as_bytes());
    // A replaced character could make two objects one id (`a b` and `a_b`): then the id
    // ends in a hash of the object as written.
    let id = if clean == object {
        format!("{LEGACY_SINK_ID}-{clean}")
    } else {
        format!("{LEGACY_SINK_ID}-{clean}-{:08x}", hash as u32)
    };
    if id.len() <= 64 {
        return id;
    }
    format!("{}-{hash:016x}", &id[..64 - 17])
}

/// [`run`] with a command's own target and line check.
pub(crate) fn run_with(args: PipeArgs, hooks: Hooks) -> CliResult<ExitCode> {
    if args.checkpoint_every == 0 {
        return Err("--checkpoint-every must be at least 1".into());
    }
    if let Some(id) = &args.sink_id {
        walsink::validate_sink_id(id).map_err(|e| format!("--sink-id: {e}"))?;
    }
    let input = InputSpec::parse(&args.input, args.follow)?;
    if args.follow && input == InputSpec::Stdin {
        return Err("--follow needs an input file; standard input is read to its end".into());
    }
    let sink_spec = match hooks.target {
        Some(t) => SinkSpec::Target(t),
        None => parse_sink(&args.sink)?,
    };
    let target = match &sink_spec {
        SinkSpec::Target(t) => Some(t.as_ref()),
        _ => None,
    };
    let (sink_id, derived) = resolve_sink_id(args.sink_id.as_deref(), &args.wal, target)?;
    let args = PipeArgs {
        sink_id: Some(sink_id.clone()),
        ..args
    };
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
        SinkSpec::Target(t) => t.shown(),
    };
    let target_epochs = |out: &Path| {
        DirSink::committed(out, &sink_id, 0)
            .map_err(|e| format!("cannot read the sink directory {}: {e}", out.display()))
    };
    let target_of = |spec: &SinkSpec| -> CliResult<Option<Vec<walsink::sinks::CommittedEpoch>>> {
        match spec {
            SinkSpec::Dir(out) => Ok(Some(target_epochs(out)?)),
            SinkSpec::Stdout => Ok(None),
            SinkSpec::Target(t) => t.committed(&sink_id, 0),
        }
    };
    // Refuse a target that belongs to another log before a new log is created.
    if !is_log(&args.wal) {
        // A new log whose sink id is derived, into a target holding commits under the old
        // default: those may be this very stream's (its log deleted to start over), which
        // the derived id would not see. The user says which.
        if let (true, SinkSpec::Target(t)) = (derived, &sink_spec) {
            if t.committed(LEGACY_SINK_ID, 0)?
                .is_some_and(|held| !held.is_empty())
            {
                return Err(Refused(format!(
                    "{out_shown} holds commits of sink id {LEGACY_SINK_ID:?}, the default sink id before it was named after the target; this new log would be {sink_id:?}. If they are this stream's, resume them with --sink-id {LEGACY_SINK_ID} (add --take-over when their log is gone); if they belong to another stream, give this one --sink-id {sink_id}"
                ))
                .into());
            }
        }
        if let Some(epochs) = target_of(&sink_spec)? {
            resume::decide(
                &RecoveryReport::default(),
                Some((&out_shown, &epochs)),
                &wal_shown,
                &sink_id,
                args.take_over,
            )
            .map_err(Refused)?;
        }
    }
    let mut opts = Options::new(&sink_id)
        .max_record_size(args.max_record_bytes)
        .segment_size((64u64 << 20).max(args.max_record_bytes as u64 + (1 << 20)));
    if let Some(b) = args.max_backlog_bytes {
        opts = opts.max_backlog_bytes(b, FullPolicy::Reject);
    }
    let metrics = args
        .metrics_addr
        .as_deref()
        .map(crate::metrics::Bound::bind)
        .transpose()?;
    let watch = Watch::default();
    // The dead-letter log is opened (and locked) before the log is opened and the shard
    // claimed: a run refused for it must leave nothing behind, least of all a raised
    // generation that fences the run that holds it.
    let dead_letters = match &args.dead_letter {
        Some(spec) => {
            let dl = std::sync::Arc::new(deliver::DeadLetterLog::open(
                spec,
                &args.wal,
                &sink_id,
                args.max_dead_letters,
                watch.clone(),
            )?);
            Some((dl.len(), dl))
        }
        None => None,
    };
    let (wal, report) = WalSink::open(&args.wal, opts).map_err(|e| explain_open(e, &args.wal))?;
    let wal = std::sync::Arc::new(wal);
    // The sink claims the shard before the target is read for where to resume: a log taken
    // over cannot commit after the claim, so what is read next is final.
    let owner = walsink::Owner::new(wal.log_id()).take_over(args.take_over);
    // Another log owns the shard: a refusal the user acts on (exit 1), like another log's
    // target found by its markers.
    let fenced_refusal = |e: String| -> Box<dyn std::error::Error> {
        if e.contains("(fenced)") {
            Box::new(Refused(e))
        } else {
            e.into()
        }
    };
    let (sink, claim): (Box<dyn Sink>, Option<walsink::Claim>) = match &sink_spec {
        SinkSpec::Dir(out) => {
            let d = DirSink::new(out)?.keep_metadata(true);
            let (sink_id, owner) = (sink_id.clone(), owner.clone());
            let (d, claim) =
                crate::targets::claim_or_defer(d, move |d| d.claim(&sink_id, 0, &owner)).map_err(
                    |e| fenced_refusal(format!("cannot deliver to {}: {e}", out.display())),
                )?;
            (Box::new(Watched::new(d, watch.clone())), claim)
        }
        SinkSpec::Stdout => (
            Box::new(Watched::new(
                StdoutSink {
                    watch: watch.clone(),
                },
                watch.clone(),
            )),
            None,
        ),
        SinkSpec::Target(t) => {
            let (s, claim) = t
                .open_sink(&sink_id, 0, &owner)
                .map_err(|e| fenced_refusal(e.to_string()))?;
            (Box::new(Watched::new(s, watch.clone())), claim)
        }
    };
    // The target's epochs belong to this log when it takes them over now, or when the target
    // already named this log its owner (a run after a take-over that sealed nothing yet).
    let owned = args.take_over
        || claim
            .as_ref()
            .is_some_and(|c| c.previous.as_deref() == Some(wal.log_id()));
    let target = target_of(&sink_spec)?;
    let resume = resume::decide(
        &report,
        target.as_deref().map(|t| (out_shown.as_str(), t)),
        &wal_shown,
        &sink_id,
        owned,
    )
    .map_err(Refused)?;
    let (source, path) = open_source(&input, &resume, &args)?;
    let name = hooks.name;
    let notice = |s: String| {
        if !args.quiet {
            eprintln!("{name}: {s}");
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
        notice(format!("resuming after {resumed}"));
    }
    // This command coordinates its own checkpoints: every sealed one is complete.
    if let Some(&last) = report.pending.last() {
        wal.checkpoint_complete(last)?;
    }
    let _metrics = match metrics {
        Some(bound) => {
            let labels = crate::metrics::Labels {
                sink: sink_id.clone(),
                shard: wal.subtask(),
            };
            let e = bound.serve(wal.clone(), labels, &args.wal, args.max_backlog_bytes)?;
            notice(format!("metrics at http://{}/metrics", e.addr));
            Some(e)
        }
        None => None,
    };
    if let Some((_, dl)) = &dead_letters {
        wal.set_dead_letters(Some(dl.clone()));
    }
    let committer = wal.spawn_committer(sink)?;
    let start_offset = source.offset();
    let progress = Reporter::new(
        name,
        args.quiet,
        args.progress_interval,
        source.size(),
        start_offset,
    );
    let mut run = Run {
        args: &args,
        check_line: hooks.check_line,
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
        waiting: None,
        progress,
    };
    let (mut stop, partial) = run.read_input()?;
    if !matches!(stop, Some(Stop::GaveUp(_))) {
        // What was read is sealed: it is delivered now, or stays in the log for the next run.
        run.checkpoint()?;
    }
    run.progress.set_message("delivering");
    // After a signal, delivery has --stop-timeout; otherwise it goes on until done or given up.
    let mut deadline =
        matches!(stop, Some(Stop::Signal(_))).then(|| Instant::now() + args.stop_timeout);
    let mut timed_out = false;
    let delivering = matches!(stop, None | Some(Stop::Signal(_)));
    if let (true, Some(last)) = (delivering, run.last_sealed) {
        while !wal.wait_committed(last, Duration::from_millis(100)) {
            match deliver::check(&watch, run.limits, &run.target) {
                Some(s) => {
                    stop = Some(s);
                    break;
                }
                None if stop.is_none() => {
                    if let Some(sig) = stop::requested() {
                        stop = Some(Stop::Signal(sig));
                        deadline = Some(Instant::now() + args.stop_timeout);
                    }
                }
                None => {}
            }
            if deadline.is_some_and(|d| Instant::now() >= d) {
                timed_out = true;
                break;
            }
            run.tick();
        }
    }
    let limit = deadline.map(|d| {
        d.saturating_duration_since(Instant::now())
            .max(Duration::from_millis(500))
    });
    let stopped = shutdown_within(committer, limit);
    timed_out |= !stopped;
    run.progress.finish();
    let h = wal.health();
    let committed = h.committed.or(report.committed).max(match resume.from {
        resume::From::Target(t) => Some(t),
        _ => None,
    });
    let committed_text = committed.map_or("none yet".to_string(), |c| c.to_string());
    let (outcome, exit_code) = match &stop {
        None => ("done", 0),
        Some(Stop::Signal(_)) => ("stopped", stop::EXIT_STOPPED),
        Some(Stop::StdoutClosed) => ("stdout_closed", EXIT_STDOUT_CLOSED),
        Some(Stop::GaveUp(_)) => ("gave_up", 2),
    };
    let undelivered = h.backlog_records + h.open_records;
    let gave_up = match &stop {
        Some(Stop::GaveUp(msg)) => Some(format!(
            "{msg}. The records stay in the log {wal_shown} (committed through checkpoint {committed_text}); {}",
            next_step(msg)
        )),
        _ => None,
    };
    if args.json {
        let v = json!({
            "outcome": outcome,
            "exit_code": exit_code,
            "signal": match &stop {
                Some(Stop::Signal(sig)) => json!(sig.name()),
                _ => json!(null),
            },
            "error": match &gave_up {
                Some(msg) => json!({"kind": "gave_up", "message": msg, "causes": []}),
                None => json!(null),
            },
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
            "records_undelivered": undelivered,
            "dead_letters": dead_letters.as_ref().map(|(_, d)| json!({
                "this_run": h.dead_letters,
                "in_log": d.len(),
            })),
            "wal": wal_shown,
            // A URL target as it shows itself: without its password or token.
            "sink": match &sink_spec {
                SinkSpec::Target(t) => t.shown(),
                _ => args.sink.clone(),
            },
        });
        outln!("{}", serde_json::to_string_pretty(&v)?);
    }
    if partial > 0 {
        eprintln!(
            "warning: the last {} of {} have no newline and were not shipped (the file may still grow); end the line with a newline and re-run, or re-run with --ship-final-line if the file is complete",
            plural(partial, "byte"),
            args.input.display()
        );
    }
    match stop {
        Some(Stop::GaveUp(_)) => {
            let msg = gave_up.unwrap_or_default();
            if args.json {
                Err(JsonShown(msg).into())
            } else {
                Err(msg.into())
            }
        }
        Some(Stop::StdoutClosed) => {
            // Not a notice: the exit code says something is left undone, so say what.
            eprintln!(
                "{name}: standard output was closed before every record was printed (exit {EXIT_STDOUT_CLOSED}); committed through checkpoint {committed_text}; the records of the epochs not read whole stay in the log {wal_shown}, and a re-run prints them from the first record of the epoch the reader left in"
            );
            Ok(ExitCode::from(EXIT_STDOUT_CLOSED))
        }
        Some(Stop::Signal(sig)) => {
            let left = if undelivered == 0 {
                "everything read is delivered".to_string()
            } else if timed_out {
                format!(
                    "{} read but not delivered within --stop-timeout {} stay in the log and the next run delivers them",
                    plural(undelivered, "record"),
                    humantime::format_duration(args.stop_timeout)
                )
            } else {
                format!(
                    "{} stay in the log for the next run",
                    plural(undelivered, "record")
                )
            };
            if !args.json {
                eprintln!(
                    "{name}: stopped by {}: read {} in this run (input offset {}); {} delivered in this run; committed through checkpoint {committed_text}; {left}. Re-run the same command to resume",
                    sig.name(),
                    plural(run.appended, "record"),
                    run.source.offset(),
                    plural(h.delivered_epochs, "epoch"),
                );
            }
            Ok(ExitCode::from(stop::EXIT_STOPPED))
        }
        None => {
            if !args.json {
                let dead = match &dead_letters {
                    Some((_, d)) if h.dead_letters > 0 || d.len() > 0 => format!(
                        "; {} went to the dead-letter log in this run ({} there in all)",
                        plural(h.dead_letters, "record"),
                        d.len()
                    ),
                    _ => String::new(),
                };
                notice(format!(
                    "input consumed ({} bytes); committed through checkpoint {committed_text}; {} delivered in this run{dead}",
                    run.source.offset(),
                    plural(h.delivered_epochs, "epoch")
                ));
            }
            Ok(ExitCode::SUCCESS)
        }
    }
}

/// What to do after a run gave up with `msg`: a fenced log has another owner now (re-running
/// it is refused); anything else is fixed at the target.
pub(crate) fn next_step(msg: &str) -> &'static str {
    if msg.contains("fenced") {
        "another log owns the shard now, so re-running this command is refused and this log delivers none of them; take the shard back with --take-over only if that other log is gone"
    } else if msg.contains("--max-dead-letters") {
        "look at the refused records with `walsink dlq list`, then fix the target or the records, or re-run with a higher --max-dead-letters"
    } else {
        "fix the target and re-run the same command"
    }
}

#[cfg(test)]
mod tests {
    use super::derived_sink_id;

    #[test]
    fn derived_sink_ids_are_valid_and_keep_objects_apart() {
        assert_eq!(derived_sink_id("events"), "pipe-events");
        assert_eq!(derived_sink_id("app.events"), "pipe-app.events");
        let (a, b) = (derived_sink_id("a b"), derived_sink_id("a_b"));
        assert_ne!(a, b);
        let long = "x".repeat(100);
        for id in [
            a,
            b,
            derived_sink_id(&long),
            derived_sink_id("é/"),
            derived_sink_id(&format!("{long}y")),
        ] {
            walsink::validate_sink_id(&id).unwrap_or_else(|e| panic!("{id}: {e}"));
        }
        assert_ne!(derived_sink_id(&long), derived_sink_id(&format!("{long}y")));
    }
}
