//! Operator tools: inspect, dump, verify, repair. The checks themselves live in the library
//! (`walsink::verify`, `walsink::dump`, recovery in `WalSink::open`); this is presentation.

use crate::CliResult;
use base64::Engine as _;
use serde_json::{json, Value};
use std::io::Write;
use std::path::Path;
use std::process::ExitCode;
use walsink::storage::FsStorage;
use walsink::{ErrorKind, Options, RecoveryMode, VerifyReport, WalSink};

fn storage(dir: &Path) -> CliResult<FsStorage> {
    if !dir.is_dir() {
        return Err(format!("{} is not a directory", dir.display()).into());
    }
    Ok(FsStorage::new(dir)?)
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
            "segment": p.segment, "offset": p.offset, "kind": p.kind, "detail": p.detail,
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
        println!("{}", serde_json::to_string_pretty(&report_json(&r))?);
    } else {
        let segs: u64 = r.segments.iter().map(|s| s.1).sum();
        println!(
            "{}: {} segments ({} bytes), {} records, {} checkpoints, committed through {}",
            dir.display(),
            r.segments.len(),
            segs,
            r.records,
            r.checkpoints.len(),
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
    if json {
        let mut v = report_json(&r);
        v["backlog"] = json!({
            "epochs": backlog.len(), "records": backlog_records, "bytes": backlog_bytes,
            "oldest_age_ms": oldest_age_ms,
        });
        println!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(ExitCode::SUCCESS);
    }
    let mut out = std::io::stdout().lock();
    match &r.identity {
        Some((id, sub)) => writeln!(out, "sink id: {id}  subtask: {sub}")?,
        None => writeln!(out, "sink id: (no identity file: not a walsink log)")?,
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
        "backlog: {} epochs, {backlog_records} records, {backlog_bytes} bytes; oldest pending {}",
        backlog.len(),
        oldest_age_ms.map_or("-".into(), |a| format!("{:.1}s old", a as f64 / 1000.0))
    )?;
    for p in &r.problems {
        writeln!(
            out,
            "problem: {} offset {}: {} ({})",
            p.segment, p.offset, p.kind, p.detail
        )?;
    }
    Ok(ExitCode::SUCCESS)
}

/// `walsink dump`.
pub fn dump(dir: &Path, only: Option<u64>, json: bool) -> CliResult<ExitCode> {
    let st = storage(dir)?;
    let out = std::io::stdout();
    let mut out = std::io::BufWriter::new(out.lock());
    let mut found = only.is_none();
    let pb = crate::progress::spinner(false);
    let mut epochs = 0u64;
    walsink::dump(&st, |id, state, epoch| {
        epochs += 1;
        pb.set_message(format!("{epochs} epochs read"));
        if only.is_some() && id != only {
            return Ok(());
        }
        found = true;
        let write = |out: &mut std::io::BufWriter<std::io::StdoutLock<'_>>| -> std::io::Result<()> {
            for r in epoch.records() {
                let checkpoint = id.map_or("open".to_string(), |c| c.to_string());
                if json {
                    let data = match std::str::from_utf8(r.data) {
                        Ok(s) => json!({"text": s}),
                        Err(_) => {
                            json!({"base64": base64::engine::general_purpose::STANDARD.encode(r.data)})
                        }
                    };
                    let line = json!({
                        "checkpoint": id, "state": state.name(), "index": r.position.index, "data": data,
                    });
                    writeln!(out, "{line}")?;
                } else {
                    let text = String::from_utf8_lossy(r.data).escape_debug().to_string();
                    writeln!(
                        out,
                        "{checkpoint}\t{}\t{}\t{text}",
                        r.position.index,
                        state.name()
                    )?;
                }
            }
            Ok(())
        };
        write(&mut out)
    })?;
    pb.finish_and_clear();
    out.flush()?;
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

/// `walsink repair`.
pub fn repair(dir: &Path, force: bool) -> CliResult<ExitCode> {
    let st = storage(dir)?;
    let r = walsink::verify(&st)?;
    let Some((sink_id, subtask)) = r.identity.clone() else {
        return Err(format!(
            "{} is not a walsink log (no readable identity file); refusing to change it",
            dir.display()
        )
        .into());
    };
    if r.ok {
        println!("{}: nothing to repair", dir.display());
        return Ok(ExitCode::SUCCESS);
    }
    let opts = Options::new(&sink_id).subtask(subtask).create(false);
    let report = match WalSink::open(dir, opts.clone()) {
        Ok((_, report)) => report,
        Err(e) if matches!(e.kind(), ErrorKind::Corruption { .. }) && !force => {
            eprintln!("{e}");
            eprintln!("refusing to cut synced data; re-run with --force to keep the valid prefix and move the damaged segments aside");
            return Ok(ExitCode::from(1));
        }
        Err(e) if matches!(e.kind(), ErrorKind::Corruption { .. }) => {
            let (_, report) =
                WalSink::open(dir, opts.recovery_mode(RecoveryMode::TruncateAtCorruption))?;
            report
        }
        Err(e) => return Err(e.into()),
    };
    if let Some(t) = &report.torn_tail {
        println!(
            "cut a torn tail at {} offset {} ({})",
            t.segment, t.offset, t.reason
        );
    }
    if let Some(c) = &report.corruption {
        println!(
            "corruption at {} offset {} ({}): kept the valid prefix",
            c.segment, c.offset, c.reason
        );
    }
    for m in &report.moved_aside {
        println!("moved aside: {m}");
    }
    if !report.checkpoints_dropped.is_empty() {
        println!("checkpoints dropped: {:?}", report.checkpoints_dropped);
    }
    println!(
        "dropped {} bytes after the cut ({} unsealed records); {} checkpoints pending",
        report.bytes_after_cut,
        report.unsealed_records_dropped,
        report.pending.len()
    );
    Ok(ExitCode::SUCCESS)
}
