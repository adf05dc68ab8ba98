//! `--sink http://HOST:PORT/PATH?…` (and `https://`): the HTTP target of `walsink-http`.
//! Epochs are POSTed in deterministic chunks under `Idempotency-Key` headers; the target
//! keeps no marker, so `pipe` resumes from its log alone, and a receiver that deduplicates by
//! key holds every line once.

use super::target::{retry_at_start, Target};
use crate::outcome::CliResult;
use walsink::sinks::CommittedEpoch;
use walsink::Sink;
use walsink_http::{Config, HttpSink};
use walsink_tokio::BlockingSink;

/// An HTTP endpoint named on `--sink`.
pub(crate) struct Http {
    cfg: Config,
}

/// Parses the URL; errors name the bad parameter and never the password.
pub(crate) fn parse(spec: &str) -> CliResult<Box<dyn Target>> {
    let cfg = Config::from_url(spec).map_err(|e| format!("--sink: {e}"))?;
    Ok(Box::new(Http { cfg }))
}

impl Target for Http {
    fn shown(&self) -> String {
        self.cfg.to_string()
    }

    fn open_sink(
        &self,
        _sink_id: &str,
        _subtask: u32,
        _owner: &walsink::Owner,
    ) -> CliResult<(Box<dyn Sink>, Option<walsink::Claim>)> {
        let sink =
            HttpSink::new(self.cfg.clone()).map_err(|e| format!("--sink {}: {e}", self.shown()))?;
        let mut sink = BlockingSink::new(sink)?;
        retry_at_start(|| sink.block_on(async |s| s.connect().await))
            .map_err(|e| format!("cannot reach {}: {e}", self.shown()))?;
        Ok((Box::new(sink), None))
    }

    fn committed(&self, _sink_id: &str, _subtask: u32) -> CliResult<Option<Vec<CommittedEpoch>>> {
        // No marker in an HTTP receiver: exactly-once after dedupe rests on the keys.
        Ok(None)
    }
}
