//! `--sink postgres://USER@HOST:PORT/DB?table=NAME[&mode=2pc]`: exactly-once into a
//! PostgreSQL table (crate `walsink-postgres`). Each epoch is one transaction holding its rows
//! and its commit marker, with the checkpoint's metadata in the marker, so `pipe` resumes from
//! the table when the log was lost.

use super::target::{retry_at_start, Target};
use crate::outcome::CliResult;
use walsink::sinks::CommittedEpoch;
use walsink::Sink;
use walsink_postgres::{Config, Mode, PgSink};
use walsink_tokio::BlockingSink;

pub(crate) struct Postgres {
    config: Config,
}

/// Parses the URL (errors name the parameter, never the password).
pub(crate) fn parse(spec: &str) -> CliResult<Box<dyn Target>> {
    let config = Config::from_url(spec).map_err(|e| format!("--sink: {e}"))?;
    Ok(Box::new(Postgres { config }))
}

impl Postgres {
    /// A sink of this target, not yet connected.
    fn sink(&self) -> CliResult<BlockingSink<PgSink>> {
        Ok(BlockingSink::new(PgSink::new(self.config.clone()))?)
    }

    fn run<T>(&self, f: impl AsyncFnOnce(&mut PgSink) -> T) -> CliResult<T> {
        Ok(self.sink()?.block_on(f))
    }
}

impl Target for Postgres {
    fn shown(&self) -> String {
        self.config.to_string()
    }

    fn object(&self) -> Option<String> {
        Some(self.config.table.plain())
    }

    fn open_sink(
        &self,
        sink_id: &str,
        subtask: u32,
        owner: &walsink::Owner,
    ) -> CliResult<(Box<dyn Sink>, Option<walsink::Claim>)> {
        let mut sink = self.sink()?;
        retry_at_start(|| sink.block_on(async |s| s.connect().await))
            .map_err(|e| format!("cannot deliver to {}: {e}", self.shown()))?;
        let (sink_id, owner) = (sink_id.to_string(), owner.clone());
        super::target::claim_or_defer(sink, move |s| {
            s.block_on(async |s| s.claim(&sink_id, subtask, &owner).await)
        })
        .map_err(|e| format!("cannot deliver to {}: {e}", self.shown()).into())
    }

    fn committed(&self, sink_id: &str, subtask: u32) -> CliResult<Option<Vec<CommittedEpoch>>> {
        let marker = self.config.marker_table.name().plain();
        let mut sink = self.sink()?;
        let markers =
            retry_at_start(|| sink.block_on(async |s| s.committed(sink_id, subtask).await))
                .map_err(|e| format!("cannot read what {} holds: {e}", self.shown()))?;
        Ok(Some(
            markers
                .into_iter()
                .map(|m| CommittedEpoch {
                    checkpoint: m.checkpoint,
                    file: format!("checkpoint {} in the marker table {marker}", m.checkpoint),
                    metadata: Some(m.metadata),
                })
                .collect(),
        ))
    }

    fn status(&self, sink_id: &str, subtask: u32) -> CliResult<Vec<String>> {
        let mut lines = vec![format!(
            "mode: {}, table {}, markers in {}",
            match self.config.mode {
                Mode::Marker => "marker",
                Mode::TwoPhase => "2pc",
            },
            self.config.table.plain(),
            self.config.marker_table.name().plain()
        )];
        let found = self
            .run(async |s| s.check_prepared(sink_id, subtask).await)?
            .map_err(|e| {
                format!(
                    "cannot list the prepared transactions of {}: {e}",
                    self.shown()
                )
            })?;
        if found.is_empty() {
            lines.push("prepared transactions: none".into());
        }
        for p in found {
            lines.push(format!(
                "prepared transaction {} (checkpoint {}), {:.1}s old{}",
                p.gid,
                p.checkpoint,
                p.age.as_secs_f64(),
                if p.age > self.config.prepared_warn_after {
                    " (older than prepared_warn_after: it holds locks; the next pipe run commits or rolls it back)"
                } else {
                    ""
                }
            ));
        }
        Ok(lines)
    }
}
