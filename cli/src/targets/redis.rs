//! `--sink redis://HOST:PORT/DB?key=NAME&mode=list|stream|hash` (or `rediss://…` over TLS):
//! exactly-once into Redis through `walsink-redis`, whose marker hash keeps each epoch's
//! checkpoint metadata.

use super::target::{retry_at_start, Target};
use crate::outcome::CliResult;
use walsink::sinks::CommittedEpoch;
use walsink::Sink;
use walsink_redis::{Config, RedisSink};
use walsink_tokio::BlockingSink;

pub(crate) struct RedisTarget {
    config: Config,
}

pub(crate) fn parse(spec: &str) -> CliResult<Box<dyn Target>> {
    let config = Config::from_url(spec).map_err(|e| format!("--sink: {e}"))?;
    Ok(Box::new(RedisTarget { config }))
}

impl RedisTarget {
    fn sink(&self) -> CliResult<BlockingSink<RedisSink>> {
        let sink = RedisSink::new(self.config.clone()).map_err(|e| format!("--sink: {e}"))?;
        Ok(BlockingSink::new(sink)?)
    }
}

impl Target for RedisTarget {
    fn shown(&self) -> String {
        self.config.redacted()
    }

    fn object(&self) -> Option<String> {
        Some(self.config.key.clone())
    }

    fn open_sink(
        &self,
        sink_id: &str,
        subtask: u32,
        owner: &walsink::Owner,
    ) -> CliResult<(Box<dyn Sink>, Option<walsink::Claim>)> {
        let mut sink = self.sink()?;
        retry_at_start(|| sink.block_on(async |s| s.connect().await))
            .map_err(|e| format!("cannot reach {}: {e}", self.shown()))?;
        let (sink_id, owner) = (sink_id.to_string(), owner.clone());
        super::target::claim_or_defer(sink, move |s| {
            s.block_on(async |s| s.claim(&sink_id, subtask, &owner).await)
        })
        .map_err(|e| format!("cannot deliver to {}: {e}", self.shown()).into())
    }

    fn keeps_newest_marker_only(&self) -> bool {
        true
    }

    fn committed(&self, sink_id: &str, subtask: u32) -> CliResult<Option<Vec<CommittedEpoch>>> {
        let mut sink = self.sink()?;
        let newest =
            retry_at_start(|| sink.block_on(async |s| s.committed(sink_id, subtask).await))
                .map_err(|e| format!("cannot read the marker in {}: {e}", self.shown()))?;
        Ok(Some(
            newest
                .map(|c| CommittedEpoch {
                    checkpoint: c.checkpoint,
                    file: format!(
                        "checkpoint {} in {}",
                        c.checkpoint,
                        self.config.marker_key(sink_id, subtask)
                    ),
                    metadata: Some(c.metadata),
                })
                .into_iter()
                .collect(),
        ))
    }
}
