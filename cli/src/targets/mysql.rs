//! `--sink mysql://USER@HOST:PORT/DB?table=NAME[&mode=xa]` (or `mariadb://`): exactly-once
//! into a MySQL or MariaDB table (crate `walsink-mysql`). Each epoch is one InnoDB
//! transaction holding its rows and its commit marker, with the checkpoint's metadata in the
//! marker, so `pipe` resumes from the table when the log was lost.

use super::target::{retry_at_start, Target};
use crate::outcome::CliResult;
use walsink::sinks::CommittedEpoch;
use walsink::Sink;
use walsink_mysql::{Config, Mode, MySqlSink};
use walsink_tokio::BlockingSink;

pub(crate) struct MySql {
    config: Config,
}

/// Parses the URL (errors name the parameter, never the password).
pub(crate) fn parse(spec: &str) -> CliResult<Box<dyn Target>> {
    let config = Config::from_url(spec).map_err(|e| format!("--sink: {e}"))?;
    Ok(Box::new(MySql { config }))
}

impl MySql {
    /// A sink of this target, not yet connected.
    fn sink(&self) -> CliResult<BlockingSink<MySqlSink>> {
        Ok(BlockingSink::new(MySqlSink::new(self.config.clone()))?)
    }
}

impl Target for MySql {
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
                Mode::Xa => "xa",
            },
            self.config.table.plain(),
            self.config.marker_table.name().plain()
        )];
        let found = self
            .sink()?
            .block_on(async |s| s.check_prepared(sink_id, subtask).await)
            .map_err(|e| {
                format!(
                    "cannot list the prepared XA transactions of {}: {e}",
                    self.shown()
                )
            })?;
        if found.is_empty() {
            lines.push("prepared XA transactions: none".into());
        }
        for x in found {
            lines.push(format!(
                "prepared XA transaction {x} (checkpoint {}): it holds its locks; the next pipe run commits or rolls it back",
                x.checkpoint
            ));
        }
        Ok(lines)
    }
}
