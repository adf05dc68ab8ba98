//! `walsink repair`: cuts a torn tail; with `--force`, keeps the valid prefix of a corrupted
//! log and sets the damaged part aside, and sets a damaged commit store aside and rebuilds it.

use crate::outcome::CliResult;
use crate::progress::plural;
use crate::tools::storage;
use serde_json::{json, Value};
use std::path::Path;
use std::process::ExitCode;
use std::sync::Arc;
use walsink::storage::{FsStorage, Storage};
use walsink::{
    CommitStore, ErrorKind, LocalCommitStore, Options, RecoveryMode, VerifyReport, WalSink,
};

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
    let aside =
        walsink::format::set_aside_name(walsink::format::COMMIT_FILE, |n| dir.join(n).exists());
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

/// The options a repair reopens the log with: the log's own segment size (each segment is
/// preallocated to the size it was written with, so the largest one's length), so that the
/// segment a repair starts matches the others; the record and metadata limits shrink to fit
/// a small segment (they bound appends only, never what is read back).
fn reopen_options(sink_id: &str, subtask: u32, r: &VerifyReport) -> Options {
    use walsink::format::{
        frame_size, BARRIER_FIXED_LEN, FRAME_ALIGN, FRAME_HEADER_LEN, SEGMENT_END_RESERVE,
        SEGMENT_HEADER_LEN,
    };
    let opts = Options::new(sink_id).subtask(subtask).create(false);
    let Some(size) = r.segments.iter().map(|(_, len)| *len).max() else {
        return opts;
    };
    let room = usize::try_from(size)
        .unwrap_or(usize::MAX)
        .saturating_sub(SEGMENT_HEADER_LEN + SEGMENT_END_RESERVE);
    let payload = (room / FRAME_ALIGN * FRAME_ALIGN).saturating_sub(FRAME_HEADER_LEN);
    debug_assert!(payload == 0 || frame_size(payload) <= room);
    let fitted = opts
        .clone()
        .segment_size(size)
        .max_record_size(opts.max_record_size.min(payload))
        .max_metadata_size(
            opts.max_metadata_size
                .min(payload.saturating_sub(BARRIER_FIXED_LEN)),
        );
    // A length no log of this format can have (a segment cut short by hand): the default.
    if fitted.sanitize().is_ok() {
        fitted
    } else {
        opts
    }
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
    let say = |doc: &mut Value, text: String, key: &str, value: Value| -> std::io::Result<()> {
        if !json {
            outln!("{text}");
        }
        doc[key] = value;
        Ok(())
    };
    if r.ok {
        say(
            &mut doc,
            format!("{}: nothing to repair", dir.display()),
            "nothing_to_repair",
            json!(true),
        )?;
        if json {
            outln!("{}", serde_json::to_string_pretty(&doc)?);
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
        )?;
        doc["changed"] = json!(true);
    }
    let opts = reopen_options(&sink_id, subtask, &r);
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
    let found = [
        ("torn_tail", "cut a torn tail at", "", &report.torn_tail),
        (
            "corruption",
            "corruption at",
            ": kept the valid prefix",
            &report.corruption,
        ),
    ];
    for (key, what, then, damage) in found {
        if let Some(d) = damage {
            say(
                &mut doc,
                format!(
                    "{what} {} offset {} ({}){then}",
                    d.segment, d.offset, d.reason
                ),
                key,
                json!({"segment": d.segment, "offset": d.offset, "reason": d.reason.to_string()}),
            )?;
        }
    }
    for m in &report.moved_aside {
        if !json {
            outln!("moved aside: {m}");
        }
    }
    doc["moved_aside"] = json!(report.moved_aside);
    if !report.checkpoints_dropped.is_empty() && !json {
        outln!("checkpoints dropped: {:?}", report.checkpoints_dropped);
    }
    doc["checkpoints_dropped"] = json!(report.checkpoints_dropped);
    say(
        &mut doc,
        format!(
            "dropped {} bytes after the cut ({} unsealed records); {} pending",
            report.bytes_after_cut,
            report.unsealed_records_dropped,
            plural(report.pending.len() as u64, "checkpoint")
        ),
        "bytes_after_cut",
        json!(report.bytes_after_cut),
    )?;
    doc["unsealed_records_dropped"] = json!(report.unsealed_records_dropped);
    doc["pending"] = json!(report.pending);
    if json {
        outln!("{}", serde_json::to_string_pretty(&doc)?);
    }
    Ok(ExitCode::SUCCESS)
}
