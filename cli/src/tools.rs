//! Operator tools: inspect, dump, verify, repair. The checks themselves live in the library
//! (`walsink::verify`, `walsink::dump`, recovery in `WalSink::open`); this is presentation.
//!
//! Exit codes: a directory that is not a log (no `WALSINK` file, empty or not) is a usage
//! error, 2; a log with problems (corruption, a damaged commit store) is 1 with a warning on
//! stderr. A torn tail alone is what a live writer or a crash leaves: `verify` reports it
//! (exit 1), `inspect` and `dump` note it and exit 0.

use crate::{CliResult, Refused};
use base64::Engine as _;
use clap::Args;
use serde_json::{json, Value};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use walsink::format::{self, FrameError, FrameKind};
use walsink::storage::{FsStorage, Storage};
use walsink::{
    CommitStore, ErrorKind, LocalCommitStore, Options, Problem, RecoveryMode, VerifyReport, WalSink,
};

/// Opens `dir` for a read-only tool, refusing what is not a log (exit 2).
fn storage(dir: &Path) -> CliResult<FsStorage> {
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
fn serious(r: &VerifyReport) -> Vec<&Problem> {
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

fn now_ms() -> u64 {
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

fn plural(n: usize, word: &str) -> String {
    if n == 1 {
        format!("1 {word}")
    } else {
        format!("{n} {word}s")
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
        println!("{}", serde_json::to_string_pretty(&report_json(&r))?);
    } else {
        let segs: u64 = r.segments.iter().map(|s| s.1).sum();
        println!(
            "{}: {} ({} bytes), {} records, {}, committed through {}",
            dir.display(),
            plural(r.segments.len(), "segment"),
            segs,
            r.records,
            plural(r.checkpoints.len(), "checkpoint"),
            r.committed.map_or("-".into(), |c| c.to_string())
        );
        for p in &r.problems {
            println!(
                "problem: {} offset {}: {} ({})",
                p.segment, p.offset, p.kind, p.detail
            );
        }
        println!("{}", if r.ok { "ok" } else { "problems found" });
    }
    Ok(if r.ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

/// `walsink inspect`.
pub fn inspect(dir: &Path, json: bool) -> CliResult<ExitCode> {
    let st = storage(dir)?;
    let r = walsink::verify(&st)?;
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
        println!("{}", serde_json::to_string_pretty(&v)?);
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
        plural(backlog.len(), "epoch"),
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
        return dump_segment(dir, seg, args, report.committed);
    }
    let out = std::io::stdout();
    let mut out = std::io::BufWriter::new(out.lock());
    let only = args.checkpoint;
    let mut found = only.is_none();
    let mut left = args.max_records.unwrap_or(u64::MAX);
    walsink::dump(std::sync::Arc::new(st), |id, state, epoch| {
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
    })?;
    out.flush()?;
    let problems = serious(&report);
    if !problems.is_empty() {
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

/// One record of a segment dump: checkpoint, index in its epoch, state, data.
type Row<'a> = (Option<u64>, Option<u64>, &'a str, &'a [u8]);

/// `walsink dump --segment`: the frames of one segment file, read with the format's own
/// decoder (no recovery, nothing changed).
fn dump_segment(
    dir: &Path,
    seg: &str,
    args: &DumpArgs,
    committed: Option<u64>,
) -> CliResult<ExitCode> {
    let seq = seg
        .parse::<u64>()
        .ok()
        .or_else(|| format::parse_numbered(seg, "wseg"))
        .ok_or_else(|| {
            format!("--segment {seg:?}: give a segment file name (NNNN….wseg) or its number")
        })?;
    let name = format::segment_name(seq);
    let path = dir.join(&name);
    let bytes = std::fs::read(&path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    let seed = format::decode_segment_header(&bytes, seq).map_err(|e| {
        Refused(format!(
            "{}: the segment header does not verify ({e:?})",
            path.display()
        ))
    })?;
    // Walk the frames: data frames wait for the barrier that names their checkpoint.
    let mut pending: Vec<&[u8]> = Vec::new();
    let mut rows: Vec<Row<'_>> = Vec::new();
    let mut at = format::SEGMENT_HEADER_LEN;
    let mut damage = None;
    let mut seen_control = false;
    loop {
        match format::decode_frame(&bytes, seed, at) {
            Ok(f) => {
                match f.kind {
                    FrameKind::Data => pending.push(f.payload),
                    FrameKind::Barrier => {
                        let b = format::Barrier::decode(f.payload)
                            .ok_or_else(|| format!("{name} offset {at}: barrier too short"))?;
                        let state = if committed.is_some_and(|c| b.checkpoint <= c) {
                            "committed"
                        } else {
                            "sealed"
                        };
                        // Records of an epoch that began in an earlier segment are its last ones.
                        let first = if seen_control {
                            0
                        } else {
                            b.records.saturating_sub(pending.len() as u64)
                        };
                        for (i, d) in pending.drain(..).enumerate() {
                            rows.push((Some(b.checkpoint), Some(first + i as u64), state, d));
                        }
                        seen_control = true;
                    }
                    FrameKind::Restore => {
                        for d in pending.drain(..) {
                            rows.push((None, None, "voided", d));
                        }
                        seen_control = true;
                    }
                    FrameKind::SegmentEnd => break,
                }
                at += f.size;
            }
            Err(FrameError::Zero) => break,
            Err(FrameError::ShortHeader) => {
                damage = Some(format!("offset {at}: torn frame header"));
                break;
            }
            Err(FrameError::Bad(reason)) => {
                damage = Some(format!("offset {at}: {reason}"));
                break;
            }
        }
    }
    let trailing_state = if seen_control { "continues" } else { "unknown" };
    for (i, d) in pending.drain(..).enumerate() {
        rows.push((None, seen_control.then_some(i as u64), trailing_state, d));
    }
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
    if let Some(d) = damage {
        eprintln!(
            "warning: {} stops verifying at {d}; frames after it are not shown (a torn tail if this is the newest segment of a live or crashed log)",
            path.display()
        );
        return Ok(ExitCode::from(1));
    }
    Ok(ExitCode::SUCCESS)
}

/// A free name for setting `name` aside: `name.damaged`, or `name.damaged.N`.
fn aside_name(dir: &Path, name: &str) -> String {
    let base = format!("{name}.damaged");
    if !dir.join(&base).exists() {
        return base;
    }
    (1..)
        .map(|n| format!("{base}.{n}"))
        .find(|c| !dir.join(c).exists())
        .expect("some suffix is free")
}

/// Sets a damaged `COMMITTED` file aside and writes a new one with the highest mark the log
/// proves, or the one given. Returns the file's new name and the mark.
fn rebuild_commit_store(
    dir: &Path,
    sink_id: &str,
    subtask: u32,
    given: Option<u64>,
) -> CliResult<(String, Option<u64>)> {
    let st: Arc<dyn Storage> = Arc::new(FsStorage::new(dir)?);
    let _lock = st.lock(walsink::format::LOCK_FILE).map_err(|e| {
        format!(
            "{} is in use by another walsink process ({e}); stop it first",
            dir.display()
        )
    })?;
    let aside = aside_name(dir, "COMMITTED");
    st.rename("COMMITTED", &aside)?;
    st.sync_dir()?;
    // Segments are freed only once every epoch in them is committed, so an epoch whose start
    // was freed is committed: the log proves at least that mark.
    let r = walsink::verify(&*st)?;
    let proven = if r.problems.iter().any(|p| p.kind == "incomplete_epoch") {
        r.checkpoints.first().map(|c| c.id)
    } else {
        None
    };
    let mark = given.or(proven);
    if let Some(m) = mark {
        LocalCommitStore::new(st.clone(), sink_id, subtask).mark_committed(sink_id, subtask, m)?;
    }
    Ok((aside, mark))
}

/// `walsink repair`.
pub fn repair(dir: &Path, force: bool, committed: Option<u64>, json: bool) -> CliResult<ExitCode> {
    let st = storage(dir)?;
    let r = walsink::verify(&st)?;
    let Some((sink_id, subtask)) = r.identity.clone() else {
        return Err(format!(
            "{} is not a walsink log (its identity file does not verify); refusing to change it",
            dir.display()
        )
        .into());
    };
    let mut doc = json!({"dir": dir.display().to_string(), "changed": false});
    let say = |doc: &mut Value, text: String, key: &str, value: Value| {
        if !json {
            println!("{text}");
        }
        doc[key] = value;
    };
    if r.ok {
        say(
            &mut doc,
            format!("{}: nothing to repair", dir.display()),
            "nothing_to_repair",
            json!(true),
        );
        if json {
            println!("{}", serde_json::to_string_pretty(&doc)?);
        }
        return Ok(ExitCode::SUCCESS);
    }
    if r.problems.iter().any(|p| p.kind == "bad_commit_store") {
        if !force {
            eprintln!(
                "the commit store {}/COMMITTED is damaged; re-run with --force to set it aside and rebuild it (add --committed N if you know the target holds every checkpoint up to N)",
                dir.display()
            );
            return Ok(ExitCode::from(1));
        }
        let (aside, mark) = rebuild_commit_store(dir, &sink_id, subtask, committed)?;
        say(
            &mut doc,
            format!(
                "set the damaged COMMITTED aside as {aside}; rebuilt it: committed through {} (checkpoints above may be delivered again; a directory sink skips those it holds)",
                mark.map_or("none".to_string(), |m| m.to_string())
            ),
            "commit_store",
            json!({"set_aside": aside, "committed": mark}),
        );
        doc["changed"] = json!(true);
    }
    let opts = Options::new(&sink_id).subtask(subtask).create(false);
    let report = match WalSink::open(dir, opts.clone()) {
        Ok((_, report)) => report,
        Err(e) if matches!(e.kind(), ErrorKind::Corruption(_)) && !force => {
            if let ErrorKind::Corruption(walsink::Damage {
                segment,
                offset,
                reason,
            }) = e.kind()
            {
                eprintln!("corruption in {segment} at offset {offset}: {reason}");
            }
            eprintln!("refusing to cut synced data; re-run with --force to keep the valid prefix and move the damaged segments aside (their checkpoints are dropped)");
            return Ok(ExitCode::from(1));
        }
        Err(e) if matches!(e.kind(), ErrorKind::Corruption(_)) => {
            let (_, report) =
                WalSink::open(dir, opts.recovery_mode(RecoveryMode::TruncateAtCorruption))?;
            report
        }
        Err(e) => return Err(e.into()),
    };
    doc["changed"] = json!(true);
    if let Some(t) = &report.torn_tail {
        say(
            &mut doc,
            format!(
                "cut a torn tail at {} offset {} ({})",
                t.segment, t.offset, t.reason
            ),
            "torn_tail",
            json!({"segment": t.segment, "offset": t.offset, "reason": t.reason.to_string()}),
        );
    }
    if let Some(c) = &report.corruption {
        say(
            &mut doc,
            format!(
                "corruption at {} offset {} ({}): kept the valid prefix",
                c.segment, c.offset, c.reason
            ),
            "corruption",
            json!({"segment": c.segment, "offset": c.offset, "reason": c.reason.to_string()}),
        );
    }
    for m in &report.moved_aside {
        if !json {
            println!("moved aside: {m}");
        }
    }
    doc["moved_aside"] = json!(report.moved_aside);
    if !report.checkpoints_dropped.is_empty() && !json {
        println!("checkpoints dropped: {:?}", report.checkpoints_dropped);
    }
    doc["checkpoints_dropped"] = json!(report.checkpoints_dropped);
    say(
        &mut doc,
        format!(
            "dropped {} bytes after the cut ({} unsealed records); {} pending",
            report.bytes_after_cut,
            report.unsealed_records_dropped,
            plural(report.pending.len(), "checkpoint")
        ),
        "bytes_after_cut",
        json!(report.bytes_after_cut),
    );
    doc["unsealed_records_dropped"] = json!(report.unsealed_records_dropped);
    doc["pending"] = json!(report.pending);
    if json {
        println!("{}", serde_json::to_string_pretty(&doc)?);
    }
    Ok(ExitCode::SUCCESS)
}
