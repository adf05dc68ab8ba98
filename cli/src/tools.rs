//! Operator tools: inspect, dump, verify, repair. The checks themselves live in the library
//! (`walsink::verify`, `walsink::dump`, recovery in `WalSink::open`); this is presentation.
//!
//! Exit codes: a directory that is not a log (no `WALSINK` file, empty or not) is a usage
//! error, 2; a log with problems (corruption, a damaged commit store) is 1 with a warning on
//! stderr. A torn tail alone is what a live writer or a crash leaves: `verify` reports it
//! (exit 1), `inspect` and `dump` note it and exit 0.

use crate::outcome::{CliResult, Refused};
use crate::progress::plural;
use base64::Engine as _;
use clap::Args;
use serde_json::{json, Value};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use walsink::format;
use walsink::storage::FsStorage;
use walsink::{Problem, VerifyReport};

/// Opens `dir` for a read-only tool, refusing what is not a log (exit 2).
pub(crate) fn storage(dir: &Path) -> CliResult<FsStorage> {
    if !dir.exists() {
        return Err(format!("{} does not exist", dir.display()).into());
    }
    if !dir.is_dir() {
        return Err(format!("{} is not a directory", dir.display()).into());
    }
    if !dir.join("WALSINK").exists() {
        return Err(format!(
            "{} is not a walsink log (no WALSINK identity file)",
            dir.display()
        )
        .into());
    }
    Ok(FsStorage::new(dir)?)
}

/// Problems other than a torn tail: damage that needs an operator.
pub(crate) fn serious(r: &VerifyReport) -> Vec<&Problem> {
    r.problems
        .iter()
        .filter(|p| p.kind != "torn_tail")
        .collect()
}

fn warn_problems(dir: &Path, problems: &[&Problem]) {
    eprintln!(
        "warning: {} has {} problem{}:",
        dir.display(),
        problems.len(),
        if problems.len() == 1 { "" } else { "s" }
    );
    for p in problems {
        eprintln!(
            "  {} offset {}: {} ({})",
            p.segment, p.offset, p.kind, p.detail
        );
    }
    eprintln!(
        "  `walsink verify {0}` checks it; `walsink repair --force {0}` keeps the valid part and sets the damage aside",
        dir.display()
    );
}

pub(crate) fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

fn report_json(r: &VerifyReport) -> Value {
    json!({
        "ok": r.ok,
        "identity": r.identity.as_ref().map(|(id, sub)| json!({"sink_id": id, "subtask": sub})),
        "segments": r.segments.iter().map(|(n, len)| json!({"name": n, "bytes": len})).collect::<Vec<_>>(),
        "records": r.records,
        "unsealed_records": r.unsealed_records,
        "committed": r.committed,
        "checkpoints": r.checkpoints.iter().map(|c| json!({
            "id": c.id,
            "state": state_name(c),
            "records": c.records,
            "bytes": c.bytes,
            "timestamp_ms": c.timestamp_ms,
            "metadata": String::from_utf8_lossy(&c.metadata),
        })).collect::<Vec<_>>(),
        "problems": r.problems.iter().map(|p| json!({
            "segment": p.segment, "offset": p.offset, "kind": p.kind.name(), "detail": p.detail,
        })).collect::<Vec<_>>(),
    })
}

fn state_name(c: &walsink::CheckpointSummary) -> &'static str {
    if c.committed {
        "committed"
    } else if c.voided {
        "voided"
    } else {
        "sealed"
    }
}

/// `walsink verify`.
pub fn verify(dir: &Path, json: bool, quiet: bool) -> CliResult<ExitCode> {
    let st = storage(dir)?;
    let pb = crate::progress::spinner(quiet || json);
    pb.set_message(format!("verifying {}", dir.display()));
    let r = walsink::verify(&st)?;
    pb.finish_and_clear();
    if json {
        outln!("{}", serde_json::to_string_pretty(&report_json(&r))?);
    } else {
        let segs: u64 = r.segments.iter().map(|s| s.1).sum();
        outln!(
            "{}: {} ({} bytes), {} records, {}, committed through {}",
            dir.display(),
            plural(r.segments.len() as u64, "segment"),
            segs,
            r.records,
            plural(r.checkpoints.len() as u64, "checkpoint"),
            r.committed.map_or("-".into(), |c| c.to_string())
        );
        for p in &r.problems {
            outln!(
                "problem: {} offset {}: {} ({})",
                p.segment,
                p.offset,
                p.kind,
                p.detail
            );
        }
        outln!("{}", if r.ok { "ok" } else { "problems found" });
    }
    Ok(if r.ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

/// What a target holds for the log's sink id: its shown name, its newest committed
/// checkpoint, how many epochs it holds, and lines about its own state.
struct TargetView {
    shown: String,
    committed: Option<u64>,
    /// How many epochs the target holds markers for; `None` for a target that keeps only
    /// its newest marker (a count would say 1 however many it holds).
    epochs: Option<usize>,
    status: Vec<String>,
}

fn target_view(spec: &str, identity: Option<&(String, u32)>) -> CliResult<TargetView> {
    use crate::pipe_args::{parse_sink, SinkSpec};
    let Some((sink_id, subtask)) = identity else {
        return Err("--sink: the log's identity file is damaged, so its sink id is unknown".into());
    };
    let parsed = match parse_sink(spec) {
        Ok(parsed) => parsed,
        // A `walsink cdc` log's target: a PostgreSQL URL without `table=`.
        Err(e) => match cdc_target(spec) {
            Some(t) => SinkSpec::Target(t),
            None => return Err(e),
        },
    };
    let mut newest_only = false;
    let (shown, held, status) = match parsed {
        SinkSpec::Dir(out) => {
            let held = walsink::DirSink::committed(&out, sink_id, *subtask).map_err(|e| {
                format!("cannot read the sink directory {}: {e}", out.display())
            })?;
            (out.display().to_string(), held, Vec::new())
        }
        SinkSpec::Stdout => {
            return Err("--sink stdout keeps no record of what it printed; inspect shows a target that holds commit markers (dir:PATH, postgres://…, mysql://…)".into())
        }
        SinkSpec::Target(t) => {
            let Some(held) = t.committed(sink_id, *subtask)? else {
                return Err(format!(
                    "--sink {} keeps no commit marker (its exactly-once rests on idempotency keys), so it cannot say what it holds",
                    t.shown()
                )
                .into());
            };
            newest_only = t.keeps_newest_marker_only();
            (t.shown(), held, t.status(sink_id, *subtask)?)
        }
    };
    Ok(TargetView {
        shown,
        committed: held.iter().map(|e| e.checkpoint).max(),
        epochs: (!newest_only).then_some(held.len()),
        status,
    })
}

/// `spec` as the target of a `walsink cdc` log, when it is one this build can apply to.
#[cfg(feature = "cdc")]
fn cdc_target(spec: &str) -> Option<Box<dyn crate::targets::Target>> {
    crate::cdc::target(spec).ok()
}

#[cfg(not(feature = "cdc"))]
fn cdc_target(_spec: &str) -> Option<Box<dyn crate::targets::Target>> {
    None
}

/// `walsink inspect`.
pub fn inspect(dir: &Path, json: bool, sink: Option<&str>) -> CliResult<ExitCode> {
    let st = storage(dir)?;
    let r = walsink::verify(&st)?;
    let target = match sink {
        Some(spec) => Some(target_view(spec, r.identity.as_ref())?),
        None => None,
    };
    let now = now_ms();
    let backlog: Vec<_> = r
        .checkpoints
        .iter()
        .filter(|c| !c.committed && !c.voided)
        .collect();
    let backlog_bytes: u64 = backlog.iter().map(|c| c.bytes).sum();
    let backlog_records: u64 = backlog.iter().map(|c| c.records).sum();
    let oldest_age_ms = backlog.first().map(|c| now.saturating_sub(c.timestamp_ms));
    let code = if serious(&r).is_empty() {
        ExitCode::SUCCESS
    } else {
        warn_problems(dir, &serious(&r));
        ExitCode::from(1)
    };
    if json {
        let mut v = report_json(&r);
        v["backlog"] = json!({
            "epochs": backlog.len(), "records": backlog_records, "bytes": backlog_bytes,
            "oldest_age_ms": oldest_age_ms,
        });
        if let Some(t) = &target {
            v["target"] = json!({
                "sink": t.shown, "committed": t.committed, "epochs": t.epochs,
                "newest_marker_only": t.epochs.is_none(), "status": t.status,
            });
        }
        outln!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(code);
    }
    let mut out = std::io::stdout().lock();
    match &r.identity {
        Some((id, sub)) => writeln!(out, "sink id: {id}  subtask: {sub}")?,
        None => writeln!(out, "sink id: (identity file damaged)")?,
    }
    writeln!(
        out,
        "committed through: {}",
        r.committed.map_or("-".into(), |c| c.to_string())
    )?;
    if let Some(t) = &target {
        writeln!(
            out,
            "target {}: committed through {} ({}){}",
            t.shown,
            t.committed.map_or("-".into(), |c| c.to_string()),
            match t.epochs {
                Some(n) => format!("{} held", plural(n as u64, "epoch")),
                None => "it keeps the newest marker only".to_string(),
            },
            match (t.committed, r.committed) {
                (Some(a), Some(b)) if a > b =>
                    " — ahead of the log's mark, which catches up on the next delivery",
                (Some(_), None) =>
                    " — ahead of the log's mark, which catches up on the next delivery",
                _ => "",
            }
        )?;
        for line in &t.status {
            writeln!(out, "  {line}")?;
        }
    }
    writeln!(out, "segments (preallocated to their full size):")?;
    for (name, len) in &r.segments {
        writeln!(out, "  {name}  {len} bytes")?;
    }
    writeln!(out, "checkpoints:")?;
    writeln!(
        out,
        "  {:>20}  {:>10}  {:>10}  {:>12}  {:>10}  metadata",
        "id", "state", "records", "bytes", "age"
    )?;
    for c in &r.checkpoints {
        let age = format!("{:.1}s", now.saturating_sub(c.timestamp_ms) as f64 / 1000.0);
        writeln!(
            out,
            "  {:>20}  {:>10}  {:>10}  {:>12}  {:>10}  {}",
            c.id,
            state_name(c),
            c.records,
            c.bytes,
            age,
            String::from_utf8_lossy(&c.metadata)
        )?;
    }
    if r.unsealed_records > 0 {
        writeln!(
            out,
            "  {:>20}  {:>10}  {:>10}",
            "(open)", "unsealed", r.unsealed_records
        )?;
    }
    writeln!(
        out,
        "backlog: {}, {backlog_records} records, {backlog_bytes} bytes; oldest pending {}",
        plural(backlog.len() as u64, "epoch"),
        oldest_age_ms.map_or("-".into(), |a| format!("{:.1}s old", a as f64 / 1000.0))
    )?;
    for p in &r.problems {
        writeln!(
            out,
            "problem: {} offset {}: {} ({})",
            p.segment, p.offset, p.kind, p.detail
        )?;
    }
    Ok(code)
}

/// Arguments of `walsink dump`.
#[derive(Args, Debug, Clone)]
pub struct DumpArgs {
    /// The log directory.
    pub dir: PathBuf,
    /// Only this checkpoint's records.
    #[arg(long, conflicts_with_all = ["from", "to"])]
    pub checkpoint: Option<u64>,
    /// Only checkpoints with this id or above (the unsealed tail counts as above all).
    #[arg(long)]
    pub from: Option<u64>,
    /// Only checkpoints with this id or below (leaves out the unsealed tail).
    #[arg(long)]
    pub to: Option<u64>,
    /// Print at most this many records.
    #[arg(short = 'n', long = "max-records")]
    pub max_records: Option<u64>,
    /// Only the frames stored in this one segment file (its name, such as
    /// 00000000000000000002.wseg, or its number); records of an epoch that began in an
    /// earlier segment show their index within the epoch, those after the segment's last
    /// barrier show checkpoint `-`.
    #[arg(long)]
    pub segment: Option<String>,
    /// One JSON object per record (data as text when UTF-8, otherwise base64).
    #[arg(long)]
    pub json: bool,
}

/// One line of `dump`'s output.
fn dump_line(
    out: &mut dyn Write,
    json: bool,
    checkpoint: Option<u64>,
    index: Option<u64>,
    state: &str,
    data: &[u8],
) -> std::io::Result<()> {
    if json {
        let data = match std::str::from_utf8(data) {
            Ok(s) => json!({"text": s}),
            Err(_) => json!({"base64": base64::engine::general_purpose::STANDARD.encode(data)}),
        };
        let line = json!({"checkpoint": checkpoint, "state": state, "index": index, "data": data});
        writeln!(out, "{line}")
    } else {
        let text = String::from_utf8_lossy(data).escape_debug().to_string();
        let cp = checkpoint.map_or(
            if state == "unsealed" { "open" } else { "-" }.to_string(),
            |c| c.to_string(),
        );
        let idx = index.map_or("-".to_string(), |i| i.to_string());
        writeln!(out, "{cp}\t{idx}\t{state}\t{text}")
    }
}

/// `walsink dump`.
pub fn dump(args: &DumpArgs) -> CliResult<ExitCode> {
    let dir = &args.dir;
    let st = storage(dir)?;
    let report = walsink::verify(&st)?;
    if let Some(seg) = &args.segment {
        return dump_segment(dir, seg, args);
    }
    let out = std::io::stdout();
    let mut out = std::io::BufWriter::new(out.lock());
    let only = args.checkpoint;
    let mut found = only.is_none();
    let mut left = args.max_records.unwrap_or(u64::MAX);
    let dumped = walsink::dump(std::sync::Arc::new(st), |id, state, epoch| {
        let in_range = match id {
            Some(c) => {
                only.is_none_or(|o| o == c)
                    && args.from.is_none_or(|f| c >= f)
                    && args.to.is_none_or(|t| c <= t)
            }
            None => only.is_none() && args.to.is_none(),
        };
        if !in_range {
            return Ok(());
        }
        found = true;
        for r in epoch.records() {
            if left == 0 {
                break;
            }
            let r = r.map_err(std::io::Error::other)?;
            left -= 1;
            dump_line(
                &mut out,
                args.json,
                id,
                Some(r.position.index),
                state.name(),
                &r.data,
            )?;
        }
        Ok(())
    });
    out.flush()?;
    // Damage ends the readable part: it is reported below from verify's findings.
    let damage = match dumped {
        Err(e) if matches!(e.kind(), walsink::ErrorKind::Corruption(_)) => Some(e),
        other => {
            other?;
            None
        }
    };
    let problems = serious(&report);
    if !problems.is_empty() || damage.is_some() {
        if problems.is_empty() {
            eprintln!(
                "warning: {}",
                damage.map(|e| e.to_string()).unwrap_or_default()
            );
        }
        warn_problems(dir, &problems);
        eprintln!("  (the dump above holds only the records before the damage)");
        return Ok(ExitCode::from(1));
    }
    if !found {
        eprintln!(
            "no checkpoint {} in {}",
            only.unwrap_or_default(),
            dir.display()
        );
        return Ok(ExitCode::from(1));
    }
    Ok(ExitCode::SUCCESS)
}

/// `walsink dump --segment`: the records of one segment file, as the library reads them
/// ([`walsink::dump_segment`]: the format's own decoder, no recovery, nothing changed).
fn dump_segment(dir: &Path, seg: &str, args: &DumpArgs) -> CliResult<ExitCode> {
    let seq = seg
        .parse::<u64>()
        .ok()
        .or_else(|| format::parse_numbered(seg, "wseg"))
        .ok_or_else(|| {
            format!("--segment {seg:?}: give a segment file name (NNNN….wseg) or its number")
        })?;
    let path = dir.join(format::segment_name(seq));
    let st = storage(dir)?;
    let dumped = walsink::dump_segment(&st, seq).map_err(|e| match e.kind() {
        walsink::ErrorKind::Corruption(_) | walsink::ErrorKind::UnsupportedVersion { .. } => {
            Box::new(Refused(format!(
                "{}: the segment header does not verify ({e})",
                path.display()
            ))) as Box<dyn std::error::Error>
        }
        _ => format!("cannot read {}: {e}", path.display()).into(),
    })?;
    let rows = dumped
        .records
        .iter()
        .map(|r| (r.checkpoint, r.index, r.state.name(), &r.data[..]));
    let out = std::io::stdout();
    let mut out = std::io::BufWriter::new(out.lock());
    let mut left = args.max_records.unwrap_or(u64::MAX);
    for (cp, idx, state, data) in rows {
        let in_range = match cp {
            Some(c) => {
                args.checkpoint.is_none_or(|o| o == c)
                    && args.from.is_none_or(|f| c >= f)
                    && args.to.is_none_or(|t| c <= t)
            }
            None => args.checkpoint.is_none() && args.to.is_none(),
        };
        if !in_range {
            continue;
        }
        if left == 0 {
            break;
        }
        left -= 1;
        dump_line(&mut out, args.json, cp, idx, state, data)?;
    }
    out.flush()?;
    if let Some(d) = dumped.damage {
        let d = format!("offset {}: {}", d.offset, d.reason);
        eprintln!(
            "warning: {} stops verifying at {d}; frames after it are not shown (a torn tail if this is the newest segment of a live or crashed log)",
            path.display()
        );
        return Ok(ExitCode::from(1));
    }
    Ok(ExitCode::SUCCESS)
}
