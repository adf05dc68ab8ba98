//! `--sink nats://HOST:PORT/?stream=NAME&subject=SUBJECT`: effectively-once into a JetStream
//! stream through `walsink-nats` (message ids from record positions, deduplicated by the
//! stream within its duplicate window). The stream keeps no marker, so a run resumes from
//! its log alone.

use super::target::{retry_at_start, Target};
use crate::outcome::CliResult;
use walsink::sinks::CommittedEpoch;
use walsink::Sink;
use walsink_nats::{Config, NatsSink};
use walsink_tokio::BlockingSink;

pub(crate) struct NatsTarget {
    config: Config,
}

pub(crate) fn parse(spec: &str) -> CliResult<Box<dyn Target>> {
    let config = Config::from_url(spec).map_err(|e| format!("--sink: {e}"))?;
    Ok(Box::new(NatsTarget { config }))
}

impl Target for NatsTarget {
    fn shown(&self) -> String {
        self.config.redacted()
    }

    fn object(&self) -> Option<String> {
        Some(format!("{}.{}", self.config.stream, self.config.subject))
    }

    fn open_sink(
        &self,
        _sink_id: &str,
        _subtask: u32,
        _owner: &walsink::Owner,
    ) -> CliResult<(Box<dyn Sink>, Option<walsink::Claim>)> {
        let sink = NatsSink::new(self.config.clone()).map_err(|e| format!("--sink: {e}"))?;
        let mut sink = BlockingSink::new(sink)?;
        retry_at_start(|| sink.block_on(async |s| s.connect().await))
            .map_err(|e| format!("cannot use {}: {e}", self.shown()))?;
        Ok((Box::new(sink), None))
    }

    fn committed(&self, _sink_id: &str, _subtask: u32) -> CliResult<Option<Vec<CommittedEpoch>>> {
        Ok(None)
    }
}
