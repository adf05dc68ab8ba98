//! `walsink cdc`: Debezium change events applied to PostgreSQL exactly once, from a file of
//! events (`--input`, through `pipe`'s resumable reading) or from a PostgreSQL replication
//! slot (`--source`). Re-running the same command resumes after a crash.
//!
//! With `--source`, each checkpoint's metadata holds where the source stands (the slot, its
//! consistent point, the snapshot's progress, the last transaction taken and the events so
//! far), and the target keeps that metadata beside each epoch's commit marker. A run resumes
//! after the further of the log's newest checkpoint and the target's newest marker, and the
//! slot is advanced only to the end of a transaction whose epoch the target committed.

use crate::deliver::{self, Limits, Stop, Watch, Watched};
use crate::outcome::{CliResult, Refused};
use crate::pipe_args::{check_log_dir, parse_duration, PipeArgs};
use crate::progress::plural;
use crate::targets::Target;
use clap::Args;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::future::Future;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;
use walsink::sinks::CommittedEpoch;
use walsink::{Options, Sink, SinkError, WalSink};
use walsink_cdc::capture::{Capture, SourceConfig, SourcePos};
use walsink_cdc::{CdcSink, Config};
use walsink_tokio::{AsyncSink, BlockingSink};

/// Arguments of `walsink cdc`.
#[derive(Args, Debug, Clone)]
pub struct CdcArgs {
    /// A file of Debezium events, one JSON per line (as exported from Kafka). Every line is
    /// checked before it is shipped; `null` lines (tombstones) are kept and skipped.
    #[arg(long, conflicts_with = "source", required_unless_present = "source")]
    pub input: Option<PathBuf>,
    /// A PostgreSQL source: `postgres://USER@HOST:PORT/DB?slot=NAME&tables=a,b` (needs
    /// wal_level=logical; the publication and slot are created if missing).
    #[arg(long)]
    pub source: Option<String>,
    /// The log directory (created if missing or empty).
    #[arg(long)]
    pub wal: PathBuf,
    /// The target: `postgres://USER@HOST:PORT/DB?schema=NAME[&add_missing_columns=true]
    /// [&position=source.lsn]` (events for `source.table` T go to `NAME.T`), or, with
    /// --input, `mysql://USER@HOST:PORT/DB[?add_missing_columns=true]` or `mariadb://…`
    /// (events for T go to `DB.T`).
    #[arg(long)]
    pub sink: String,
    /// Stable sink id, kept with each commit marker.
    #[arg(long, default_value = "cdc")]
    pub sink_id: String,
    /// With --input: take the sink id over from the log that owns it in the target (its
    /// commits are then refused, fenced) and go on from the target's newest checkpoint, as
    /// `pipe --take-over` does.
    #[arg(long, conflicts_with = "source")]
    pub take_over: bool,
    /// With --input: checkpoint after this many events.
    #[arg(long, default_value_t = 5_000)]
    pub checkpoint_every: u64,
    /// Keep reading (a growing --input file, or the slot) until stopped by a signal.
    /// Without it the run ends once the input or the slot has nothing more.
    #[arg(long)]
    pub follow: bool,
    /// Retry a delivery that failed with a permanent error at most this many times in a row,
    /// then give up with exit 2 (0: give up at the first permanent failure).
    #[arg(long, default_value_t = 5)]
    pub max_retries: u32,
    /// Give up when one checkpoint keeps failing, whatever the error, for this long.
    #[arg(long, default_value = "10m", value_parser = parse_duration)]
    pub retry_deadline: Duration,
    /// On SIGINT or SIGTERM: stop reading, checkpoint what was read, and wait this long for
    /// it to be applied; then print the summary and exit 3 (what is not applied by then stays
    /// in the log for the next run). A second signal exits at once (130 / 143).
    #[arg(long, default_value = "5s", value_parser = parse_duration)]
    pub stop_timeout: Duration,
    /// With --input, when stderr is not a terminal: print a one-line progress report this
    /// often, and a line while delivery fails and is retried.
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    pub progress_interval: Duration,
    /// No notices and no progress (errors are still printed).
    #[arg(long)]
    pub quiet: bool,
    /// With --input: serve the log's figures as Prometheus text at http://HOST:PORT/metrics
    /// while it runs, as `pipe --metrics-addr` does.
    #[arg(long, value_name = "HOST:PORT")]
    pub metrics_addr: Option<String>,
}

/// A multi-thread runtime shared by the sink's connection and the command.
fn runtime() -> CliResult<Arc<tokio::runtime::Runtime>> {
    Ok(Arc::new(
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()?,
    ))
}

/// A CDC sink as a blocking [`Sink`], with the runtime its connection lives on.
struct RtSink<S: AsyncSink = CdcSink> {
    sink: BlockingSink<S>,
    _rt: Arc<tokio::runtime::Runtime>,
}

impl<S: AsyncSink> Sink for RtSink<S> {
    fn deliver(&mut self, epoch: &walsink::Epoch) -> Result<(), walsink::SinkError> {
        self.sink.deliver(epoch)
    }
    fn stores_marker(&self) -> bool {
        true
    }
    fn is_committed(&mut self, key: &walsink::EpochKey) -> Result<bool, walsink::SinkError> {
        self.sink.is_committed(key)
    }
}

/// What `walsink cdc` needs of an apply sink beside [`AsyncSink`]: the PostgreSQL one
/// ([`CdcSink`]) and the MySQL one share the rest of the command.
trait ApplySink: AsyncSink + Sized + Send + 'static {
    /// Its `--sink` configuration (`Display` without the password).
    type Config: Clone + std::fmt::Display + Send + 'static;
    fn connect(config: Self::Config) -> impl Future<Output = Result<Self, SinkError>>;
    fn claim(
        &mut self,
        sink_id: &str,
        subtask: u32,
        owner: &walsink::Owner,
    ) -> impl Future<Output = Result<walsink::Claim, SinkError>>;
    fn committed(
        &mut self,
        sink_id: &str,
        subtask: u32,
    ) -> impl Future<Output = Result<Vec<CommittedEpoch>, SinkError>>;
}

impl ApplySink for CdcSink {
    type Config = Config;
    fn connect(config: Config) -> impl Future<Output = Result<Self, SinkError>> {
        CdcSink::connect(config)
    }
    fn claim(
        &mut self,
        sink_id: &str,
        subtask: u32,
        owner: &walsink::Owner,
    ) -> impl Future<Output = Result<walsink::Claim, SinkError>> {
        CdcSink::claim(self, sink_id, subtask, owner)
    }
    fn committed(
        &mut self,
        sink_id: &str,
        subtask: u32,
    ) -> impl Future<Output = Result<Vec<CommittedEpoch>, SinkError>> {
        CdcSink::committed(self, sink_id, subtask)
    }
}

#[cfg(feature = "mysql")]
impl ApplySink for walsink_cdc::MySqlCdcSink {
    type Config = walsink_cdc::MySqlCdcConfig;
    fn connect(config: Self::Config) -> impl Future<Output = Result<Self, SinkError>> {
        walsink_cdc::MySqlCdcSink::connect(config)
    }
    fn claim(
        &mut self,
        sink_id: &str,
        subtask: u32,
        owner: &walsink::Owner,
    ) -> impl Future<Output = Result<walsink::Claim, SinkError>> {
        walsink_cdc::MySqlCdcSink::claim(self, sink_id, subtask, owner)
    }
    fn committed(
        &mut self,
        sink_id: &str,
        subtask: u32,
    ) -> impl Future<Output = Result<Vec<CommittedEpoch>, SinkError>> {
        walsink_cdc::MySqlCdcSink::committed(self, sink_id, subtask)
    }
}

/// `--sink` as a [`Target`] for `pipe`'s machinery, over either apply sink.
struct CdcTarget<S: ApplySink = CdcSink> {
    config: S::Config,
    rt: Arc<tokio::runtime::Runtime>,
}

impl<S: ApplySink> CdcTarget<S> {
    fn connect(&self) -> CliResult<S> {
        self.rt
            .block_on(S::connect(self.config.clone()))
            .map_err(|e| format!("cannot use the target {}: {e}", self.config).into())
    }
}

impl<S: ApplySink> Target for CdcTarget<S> {
    fn shown(&self) -> String {
        self.config.to_string()
    }

    fn open_sink(
        &self,
        sink_id: &str,
        subtask: u32,
        owner: &walsink::Owner,
    ) -> CliResult<(Box<dyn Sink>, Option<walsink::Claim>)> {
        let sink = RtSink {
            sink: BlockingSink::with_handle(self.connect()?, self.rt.handle().clone()),
            _rt: self.rt.clone(),
        };
        let (sink_id, owner) = (sink_id.to_string(), owner.clone());
        crate::targets::claim_or_defer(sink, move |s: &mut RtSink<S>| {
            s.sink
                .block_on(async |x| x.claim(&sink_id, subtask, &owner).await)
        })
        .map_err(|e| format!("cannot deliver to {}: {e}", self.shown()).into())
    }

    fn committed(&self, sink_id: &str, subtask: u32) -> CliResult<Option<Vec<CommittedEpoch>>> {
        let mut sink = self.connect()?;
        let c = self
            .rt
            .block_on(sink.committed(sink_id, subtask))
            .map_err(|e| format!("cannot read the commit markers of {}: {e}", self.config))?;
        Ok(Some(c))
    }
}

/// Whether `--sink` names a MySQL or MariaDB server.
fn is_mysql(spec: &str) -> bool {
    spec.starts_with("mysql://") || spec.starts_with("mariadb://")
}

/// `--sink mysql://…` as a [`Target`], with whether its events carry the default position
/// field (lines are then checked fully before they are shipped).
#[cfg(feature = "mysql")]
fn mysql_target(spec: &str) -> CliResult<(Box<dyn Target>, bool)> {
    let config = walsink_cdc::MySqlCdcConfig::from_url(spec).map_err(|e| format!("--sink: {e}"))?;
    let position = config.position == walsink_cdc::PositionField::default();
    Ok((
        Box::new(CdcTarget::<walsink_cdc::MySqlCdcSink> {
            config,
            rt: runtime()?,
        }),
        position,
    ))
}

#[cfg(not(feature = "mysql"))]
fn mysql_target(_spec: &str) -> CliResult<(Box<dyn Target>, bool)> {
    Err(Refused(
        "--sink: this walsink was built without the mysql feature (cargo build --features mysql)"
            .into(),
    )
    .into())
}

/// The `--sink` of a `cdc` log as a [`Target`], for `walsink inspect --sink`.
pub(crate) fn target(spec: &str) -> CliResult<Box<dyn Target>> {
    if is_mysql(spec) {
        return Ok(mysql_target(spec)?.0);
    }
    let config = Config::from_url(spec).map_err(|e| format!("--sink: {e}"))?;
    Ok(Box::new(CdcTarget::<CdcSink> {
        config,
        rt: runtime()?,
    }))
}

fn check_event(line: &[u8]) -> Result<(), String> {
    walsink_cdc::event::parse(line, &walsink_cdc::PositionField::default())
        .map(|_| ())
        .map_err(|e| format!("not a Debezium event: {e}"))
}

/// Runs `walsink cdc`.
pub fn run(args: CdcArgs) -> CliResult<ExitCode> {
    if is_mysql(&args.sink) {
        let Some(input) = &args.input else {
            return Err(Refused(
                "--source reads a PostgreSQL slot into a PostgreSQL replica; with a mysql:// or mariadb:// --sink, give --input FILE (Debezium events, one JSON per line)".into(),
            )
            .into());
        };
        let (target, position) = mysql_target(&args.sink)?;
        return run_input(&args, input, target, position);
    }
    let config = Config::from_url(&args.sink).map_err(|e| format!("--sink: {e}"))?;
    let rt = runtime()?;
    match (&args.input, &args.source) {
        (Some(input), None) => {
            let position = config_position(&config);
            run_input(
                &args,
                input,
                Box::new(CdcTarget::<CdcSink> { config, rt }),
                position,
            )
        }
        (None, Some(source)) => run_source(&args, source, config, rt),
        _ => Err("give --input FILE or --source URL".into()),
    }
}

/// `walsink cdc --input`: `pipe`'s resumable reading of the file into `target`; `position`:
/// the events carry the default position field, so every line is checked before it is
/// shipped.
fn run_input(
    args: &CdcArgs,
    input: &std::path::Path,
    target: Box<dyn Target>,
    position: bool,
) -> CliResult<ExitCode> {
    {
        {
            let pipe = PipeArgs {
                input: input.to_path_buf(),
                wal: args.wal.clone(),
                sink: args.sink.clone(),
                checkpoint_every: args.checkpoint_every,
                checkpoint_interval: args.follow.then_some(Duration::from_secs(2)),
                sink_id: Some(args.sink_id.clone()),
                follow: args.follow,
                ship_final_line: false,
                max_record_bytes: 16 << 20,
                max_backlog_bytes: None,
                max_retries: args.max_retries,
                retry_deadline: args.retry_deadline,
                take_over: args.take_over,
                stop_timeout: args.stop_timeout,
                progress_interval: args.progress_interval,
                json: false,
                quiet: args.quiet,
                metrics_addr: args.metrics_addr.clone(),
                dead_letter: None,
                max_dead_letters: None,
            };
            let hooks = crate::pipe::Hooks {
                name: "cdc",
                target: Some(target),
                check_line: Some(if position { check_event } else { check_any }),
            };
            crate::pipe::run_with(pipe, hooks)
        }
    }
}

/// Whether the sink reads positions from the default field (lines are then checked fully).
fn config_position(c: &Config) -> bool {
    c.position == walsink_cdc::PositionField::default()
}

fn check_any(line: &[u8]) -> Result<(), String> {
    // A custom position field: the shape is checked at apply time with the sink's settings.
    serde_json::from_slice::<serde_json::Value>(line)
        .map(|_| ())
        .or_else(|e| {
            if line.iter().all(u8::is_ascii_whitespace) {
                Ok(())
            } else {
                Err(format!("not JSON: {e}"))
            }
        })
}

/// The metadata of a `cdc --source` checkpoint.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct CdcMeta {
    v: u32,
    /// Random id of the log.
    log: String,
    /// Where the source stands.
    pos: SourcePos,
}

impl CdcMeta {
    fn decode(b: &[u8]) -> Option<CdcMeta> {
        serde_json::from_slice(b).ok()
    }
}

fn new_log_id() -> String {
    format!("{:016x}{:016x}", fastrand::u64(..), fastrand::u64(..))
}

fn run_source(
    args: &CdcArgs,
    source: &str,
    config: Config,
    rt: Arc<tokio::runtime::Runtime>,
) -> CliResult<ExitCode> {
    let scfg = SourceConfig::from_url(source).map_err(|e| format!("--source: {e}"))?;
    walsink::validate_sink_id(&args.sink_id).map_err(|e| format!("--sink-id: {e}"))?;
    check_log_dir(&args.wal)?;
    let notice = |s: String| {
        if !args.quiet {
            eprintln!("{s}");
        }
    };
    let target_shown = config.to_string();
    let mut capture = rt
        .block_on(Capture::connect(scfg.clone()))
        .map_err(|e| format!("--source: {e}"))?;
    let mut sink = rt
        .block_on(CdcSink::connect(config.clone()))
        .map_err(|e| format!("cannot use the target {target_shown}: {e}"))?;
    let held = rt
        .block_on(sink.committed(&args.sink_id, 0))
        .map_err(|e| format!("cannot read the commit markers of {target_shown}: {e}"))?;
    let (wal, report) = WalSink::open(&args.wal, Options::new(&args.sink_id))
        .map_err(|e| format!("cannot open the log {}: {e}", args.wal.display()))?;
    let log_meta = match &report.last_metadata {
        Some(m) => Some(CdcMeta::decode(m).ok_or_else(|| {
            Refused(format!(
                "the log {} holds checkpoints that `walsink cdc --source` did not write; use a log directory of its own",
                args.wal.display()
            ))
        })?),
        None => None,
    };
    let target_meta = held
        .last()
        .map(|e| {
            e.metadata
                .as_deref()
                .and_then(CdcMeta::decode)
                .map(|m| (e.checkpoint, m))
                .ok_or_else(|| {
                    Refused(format!(
                        "{target_shown} holds commits of sink id {:?} that `walsink cdc --source` did not write; use another --sink-id or schema",
                        args.sink_id
                    ))
                })
        })
        .transpose()?;
    if let Some((cp, tm)) = &target_meta {
        match &log_meta {
            Some(lm) if lm.log != tm.log => {
                return Err(Refused(format!(
                    "{target_shown} already holds checkpoints up to {cp} of sink id {:?} from another log (log id {}); this log {} is log id {}. Use another --sink-id or schema for this log",
                    args.sink_id, tm.log, args.wal.display(), lm.log
                ))
                .into())
            }
            None if report.next_checkpoint_id <= *cp && report.committed.is_none() => {
                return Err(Refused(format!(
                    "{target_shown} already holds checkpoints up to {cp} of sink id {:?} (log id {}), and the log {} is new (was it deleted to start over?); use another --sink-id or schema",
                    args.sink_id, tm.log, args.wal.display()
                ))
                .into())
            }
            _ => {}
        }
        if tm.pos.slot != scfg.slot {
            return Err(Refused(format!(
                "{target_shown} holds changes read from slot {:?}, not {:?}; use the same slot, or another --sink-id or schema",
                tm.pos.slot, scfg.slot
            ))
            .into());
        }
    }
    // The shard is this log's from here on: a copy of it still running elsewhere (same log,
    // older claim) or another log is fenced in the target at its next commit.
    rt.block_on(sink.claim(&args.sink_id, 0, &walsink::Owner::new(wal.log_id())))
        .map_err(|e| {
            let text = format!(
                "cannot claim sink id {:?} in {target_shown}: {e}",
                args.sink_id
            );
            let refused: Box<dyn std::error::Error> =
                if e.class() == walsink::SinkErrorClass::Fenced {
                    Box::new(Refused(text))
                } else {
                    text.into()
                };
            refused
        })?;
    let log_cp = report.last_checkpoint.unwrap_or(0);
    let (log_id, mut pos, from) = match (&target_meta, &log_meta) {
        (Some((t, tm)), _) if *t > log_cp => (
            tm.log.clone(),
            Some(tm.pos.clone()),
            format!("checkpoint {t} in the target (ahead of the log)"),
        ),
        (_, Some(lm)) => (
            lm.log.clone(),
            Some(lm.pos.clone()),
            format!("checkpoint {log_cp} of the log"),
        ),
        (_, None) => (new_log_id(), None, "the start".to_string()),
    };
    let pos = match pos.take() {
        Some(p) => {
            if rt.block_on(capture.slot_position())?.is_none() {
                return Err(Refused(format!(
                    "replication slot {:?} is gone from the source, so the changes after {from} cannot be read; start over with a new --wal and an empty target schema",
                    scfg.slot
                ))
                .into());
            }
            notice(format!("cdc: resuming after {from}"));
            let had = p.tables.len();
            let p = rt
                .block_on(capture.resume(&p))
                .map_err(|e| format!("--source: {e}"))?;
            if p.tables.len() > had {
                notice(format!(
                    "cdc: {} added to tables= and to publication {}; snapshot of it before the stream goes on",
                    p.tables[had..]
                        .iter()
                        .map(|t| t.qualified())
                        .collect::<Vec<_>>()
                        .join(", "),
                    scfg.publication
                ));
            }
            p
        }
        None => {
            let p = rt
                .block_on(capture.start())
                .map_err(|e| format!("--source: {e}"))?;
            notice(format!(
                "cdc: slot {} consistent at {}; snapshot of {} first",
                scfg.slot,
                walsink_cdc::event::format_lsn(p.consistent_point),
                plural(scfg.tables.len() as u64, "table")
            ));
            p
        }
    };
    let ddl = rt.block_on(capture.target_ddl(&config.schema))?;
    rt.block_on(sink.execute(&ddl))
        .map_err(|e| format!("cannot create the replica tables in {target_shown}: {e}"))?;
    // The target's newest commit lets the slot move up to it.
    if let Some((_, tm)) = &target_meta {
        if tm.pos.end_lsn > 0 {
            rt.block_on(capture.advance(tm.pos.end_lsn))?;
        }
    }
    if let Some(&last) = report.pending.last() {
        wal.checkpoint_complete(last)?;
    }
    let mut next_id = report
        .next_checkpoint_id
        .max(report.committed.map_or(0, |c| c + 1))
        .max(target_meta.as_ref().map_or(0, |(c, _)| c + 1))
        .max(1);
    let watch = Watch::default();
    let committer = wal.spawn_committer(Watched::new(
        RtSink {
            sink: BlockingSink::with_handle(sink, rt.handle().clone()),
            _rt: rt.clone(),
        },
        watch.clone(),
    ))?;
    let limits = Limits {
        max_retries: args.max_retries,
        deadline: Some(args.retry_deadline),
    };
    // The end LSN each sealed checkpoint reaches, to advance the slot once it is committed.
    let mut ends: BTreeMap<u64, u64> = BTreeMap::new();
    let mut last_sealed = report.pending.last().copied();
    let mut pos = pos;
    let mut events = 0u64;
    let mut stop = None;
    let advance = |capture: &mut Capture,
                   ends: &mut BTreeMap<u64, u64>,
                   committed: Option<u64>|
     -> CliResult<()> {
        let Some(c) = committed else { return Ok(()) };
        let upto: Vec<u64> = ends.range(..=c).map(|(k, _)| *k).collect();
        let end = upto
            .iter()
            .filter_map(|k| ends.remove(k))
            .max()
            .unwrap_or(0);
        if end > 0 {
            rt.block_on(capture.advance(end))?;
        }
        Ok(())
    };
    loop {
        let batch = rt
            .block_on(capture.next(&pos))
            .map_err(|e| format!("--source: {e}"))?;
        if !batch.changes.is_empty() {
            // A schema change the replica follows: once everything read before it is
            // committed (a dropped column may be in those events), before anything after it.
            if let Some(last) = last_sealed {
                while !wal.wait_committed(last, Duration::from_millis(200)) {
                    if let Some(s) = deliver::check(&watch, limits, &target_shown) {
                        stop = Some(s);
                        break;
                    }
                }
            }
            if stop.is_some() {
                break;
            }
            let ddl: Vec<String> = batch
                .changes
                .iter()
                .flat_map(|c| c.ddl(&config.schema))
                .collect();
            let mut ddl_sink = rt
                .block_on(CdcSink::connect(config.clone()))
                .map_err(|e| format!("cannot use the target {target_shown}: {e}"))?;
            rt.block_on(ddl_sink.execute(&ddl)).map_err(|e| {
                format!("cannot follow the source's schema change in {target_shown}: {e}")
            })?;
            notice(format!("cdc: followed a schema change: {}", ddl.join("; ")));
        }
        let progressed = batch.pos != pos;
        if progressed {
            events += batch.events.len() as u64;
            wal.append_batch(batch.events.iter().map(Vec::as_slice))?;
            let meta = CdcMeta {
                v: 1,
                log: log_id.clone(),
                pos: batch.pos.clone(),
            };
            let id = next_id;
            next_id += 1;
            wal.checkpoint(id, &serde_json::to_vec(&meta)?)?;
            wal.checkpoint_complete(id)?;
            ends.insert(id, batch.pos.end_lsn);
            last_sealed = Some(id);
            pos = batch.pos;
        }
        advance(&mut capture, &mut ends, wal.health().committed)?;
        if let Some(s) = deliver::check(&watch, limits, &target_shown)
            .or_else(|| crate::stop::requested().map(Stop::Signal))
        {
            stop = Some(s);
            break;
        }
        if !progressed {
            if !args.follow {
                break;
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }
    // After a signal, delivery has --stop-timeout; otherwise it goes on until done or given up.
    let mut deadline = matches!(stop, Some(Stop::Signal(_)))
        .then(|| std::time::Instant::now() + args.stop_timeout);
    if let (None | Some(Stop::Signal(_)), Some(last)) = (&stop, last_sealed) {
        while !wal.wait_committed(last, Duration::from_millis(100)) {
            if let Some(s) = deliver::check(&watch, limits, &target_shown) {
                stop = Some(s);
                break;
            }
            if stop.is_none() {
                if let Some(sig) = crate::stop::requested() {
                    stop = Some(Stop::Signal(sig));
                    deadline = Some(std::time::Instant::now() + args.stop_timeout);
                }
            }
            if deadline.is_some_and(|d| std::time::Instant::now() >= d) {
                break;
            }
        }
    }
    advance(&mut capture, &mut ends, wal.health().committed)?;
    let limit = deadline.map(|d| {
        d.saturating_duration_since(std::time::Instant::now())
            .max(Duration::from_millis(500))
    });
    crate::pipe::shutdown_within(committer, limit);
    let committed = wal.health().committed.or(report.committed);
    let committed_text = committed.map_or("none yet".to_string(), |c| c.to_string());
    match stop {
        Some(Stop::GaveUp(msg)) => Err(format!(
            "{msg}. The changes stay in the log {} (committed through checkpoint {committed_text}); {}",
            args.wal.display(),
            crate::pipe::next_step(&msg)
        )
        .into()),
        Some(Stop::Signal(sig)) => {
            let h = wal.health();
            eprintln!(
                "cdc: stopped by {}: {} read in this run; committed through checkpoint {committed_text}; {} not applied yet stay in the log for the next run. Re-run the same command to resume",
                sig.name(),
                plural(events, "event"),
                plural(h.backlog_records + h.open_records, "event"),
            );
            Ok(ExitCode::from(crate::stop::EXIT_STOPPED))
        }
        _ => {
            notice(format!(
                "cdc: caught up with slot {} (transaction {} taken; {} read in this run, {} in all); committed through checkpoint {committed_text}",
                scfg.slot,
                walsink_cdc::event::format_lsn(pos.commit_lsn),
                plural(events, "event"),
                pos.events
            ));
            Ok(ExitCode::SUCCESS)
        }
    }
}
