//! [`RedisSink`]: delivers epochs to Redis through the chunk script, exactly once.

use crate::config::{Config, ConfigError, Mode};
use crate::error::{classify, classify_server};
use crate::script::{self, Marker};
use redis::aio::MultiplexedConnection;
use redis::{AsyncConnectionConfig, Value};
use walsink::{Epoch, EpochKey, SinkError};
use walsink_tokio::{AsyncChunks, AsyncSink};

/// An epoch the target holds as committed, with the checkpoint metadata kept beside its
/// marker (see [`RedisSink::committed`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Committed {
    /// The newest checkpoint applied whole.
    pub checkpoint: u64,
    /// Its metadata, as given to `checkpoint`.
    pub metadata: Vec<u8>,
}

/// Counters of what a sink did, for tests and operators.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Stats {
    /// Script calls that applied records or moved the marker.
    pub chunks_applied: u64,
    /// Script calls the marker showed were applied already.
    pub chunks_skipped: u64,
    /// Epochs skipped whole because the marker covered them before anything was sent.
    pub epochs_skipped: u64,
    /// Times the script was loaded again after `NOSCRIPT`.
    pub script_reloads: u64,
    /// Connections opened.
    pub connects: u64,
}

/// An [`AsyncSink`] writing each epoch to a Redis key with a server-side script that moves
/// a commit marker in the same atomic step: exactly-once inside Redis.
///
/// An epoch is sent in chunks ([`Config::chunk_records`], [`Config::chunk_bytes`]), a few in
/// flight at once ([`Config::in_flight`]), each applied by one `EVALSHA` of
/// [`script::SOURCE`](crate::script::SOURCE). The marker records how far into the epoch the
/// target is, so a delivery cut anywhere (a crash, a killed connection, a dropped future)
/// resumes at the first record not applied, and an epoch applied whole is skipped.
///
/// Errors keep the server's code (`WRONGTYPE`, `NOSCRIPT`, `OOM`, …): see
/// [`classify`](crate::classify). After a connection error the connection is dropped and
/// the next call opens a new one.
pub struct RedisSink {
    config: Config,
    client: redis::Client,
    conn: Option<MultiplexedConnection>,
    client_id: Option<i64>,
    sha: String,
    stats: Stats,
}

impl std::fmt::Debug for RedisSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisSink")
            .field("config", &self.config)
            .field("connected", &self.conn.is_some())
            .field("stats", &self.stats)
            .finish()
    }
}

/// One chunk's script call, ready to send.
struct Call {
    cmd: redis::Cmd,
    first: u64,
    count: u64,
}

impl RedisSink {
    /// A sink for `config`. Connects on first use (or with [`RedisSink::connect`]).
    pub fn new(config: Config) -> Result<RedisSink, ConfigError> {
        config.check()?;
        let client = redis::Client::open(config.client_url()).map_err(|e| ConfigError {
            parameter: "URL".into(),
            reason: e.to_string(),
        })?;
        Ok(RedisSink {
            sha: redis::Script::new(script::SOURCE).get_hash().to_string(),
            config,
            client,
            conn: None,
            client_id: None,
            stats: Stats::default(),
        })
    }

    /// The configuration.
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// What the sink did so far.
    pub fn stats(&self) -> Stats {
        self.stats
    }

    /// The server's id of the current connection (`CLIENT ID`), `None` when not connected.
    /// The connection is named `walsink` (`CLIENT SETNAME`).
    pub fn client_id(&self) -> Option<i64> {
        self.client_id
    }

    /// Opens the connection now (it is otherwise opened on first use), so a wrong address
    /// or password shows before the first epoch.
    ///
    /// # Cancel safety
    /// Cancel safe: a connection half set up is dropped, and the next call connects anew.
    pub async fn connect(&mut self) -> Result<(), SinkError> {
        self.conn().await.map(|_| ())
    }

    async fn conn(&mut self) -> Result<MultiplexedConnection, SinkError> {
        if let Some(c) = &self.conn {
            return Ok(c.clone());
        }
        let t = Some(self.config.timeout);
        let cfg = AsyncConnectionConfig::new()
            .set_connection_timeout(t)
            .set_response_timeout(t);
        let mut c = self
            .client
            .get_multiplexed_async_connection_with_config(&cfg)
            .await
            .map_err(|e| classify(&e, &self.shown("connect")))?;
        let (_, id): ((), i64) = redis::pipe()
            .cmd("CLIENT")
            .arg("SETNAME")
            .arg("walsink")
            .cmd("CLIENT")
            .arg("ID")
            .query_async(&mut c)
            .await
            .map_err(|e| classify(&e, &self.shown("set up the connection")))?;
        self.stats.connects += 1;
        self.client_id = Some(id);
        self.conn = Some(c.clone());
        Ok(c)
    }

    fn shown(&self, what: &str) -> String {
        format!(
            "redis {}:{} key {:?}: {what}",
            self.config.host, self.config.port, self.config.key
        )
    }

    /// Maps a client error, dropping the connection when it is broken or timed out.
    fn fail(&mut self, e: &redis::RedisError, what: &str) -> SinkError {
        if e.is_io_error() || e.is_connection_dropped() || e.is_timeout() {
            self.conn = None;
            self.client_id = None;
        }
        classify(e, &self.shown(what))
    }

    /// The marker of `(sink_id, subtask)`, if the target has one.
    ///
    /// # Cancel safety
    /// Cancel safe: it only reads; call it again.
    pub async fn marker(
        &mut self,
        sink_id: &str,
        subtask: u32,
    ) -> Result<Option<Marker>, SinkError> {
        let mut c = self.conn().await?;
        let key = self.config.marker_key(subtask);
        let field = script::field(sink_id, subtask);
        let v: Option<String> = redis::cmd("HGET")
            .arg(&key)
            .arg(&field)
            .query_async(&mut c)
            .await
            .map_err(|e| self.fail(&e, "read the marker"))?;
        match v {
            None => Ok(None),
            Some(s) => Marker::decode(&s).map(Some).ok_or_else(|| {
                SinkError::permanent(self.shown(&format!(
                    "the marker {key} field {field} holds {s:?}, not a walsink marker; another program writes there"
                )))
            }),
        }
    }

    /// The newest epoch of `(sink_id, subtask)` the target holds whole, with its checkpoint
    /// metadata, or `None` when it holds none.
    ///
    /// # Cancel safety
    /// Cancel safe: it only reads; call it again.
    pub async fn committed(
        &mut self,
        sink_id: &str,
        subtask: u32,
    ) -> Result<Option<Committed>, SinkError> {
        let mut c = self.conn().await?;
        let key = self.config.marker_key(subtask);
        let field = format!("{}:meta", script::field(sink_id, subtask));
        let v: Option<Vec<u8>> = redis::cmd("HGET")
            .arg(&key)
            .arg(&field)
            .query_async(&mut c)
            .await
            .map_err(|e| self.fail(&e, "read the marker"))?;
        let Some(v) = v else { return Ok(None) };
        let nl = v.iter().position(|b| *b == b'\n');
        let parsed = nl.and_then(|i| {
            let cp = std::str::from_utf8(&v[..i]).ok()?.parse().ok()?;
            Some(Committed {
                checkpoint: cp,
                metadata: v[i + 1..].to_vec(),
            })
        });
        parsed.map(Some).ok_or_else(|| {
            SinkError::permanent(self.shown(&format!(
                "{key} field {field} is not walsink's checkpoint metadata; another program writes there"
            )))
        })
    }

    /// Fails with a permanent error naming the first record of `epoch` from `start` that is
    /// not `FIELD<TAB>VALUE` (hash mode), before anything is written.
    async fn check_hash_records(&self, epoch: &Epoch, start: u64) -> Result<(), SinkError> {
        let mut chunks = AsyncChunks::new(epoch);
        while let Some(c) = chunks.next().await {
            for r in c?.records() {
                if r.position.index >= start && !r.data.contains(&b'\t') {
                    let k = epoch.key();
                    return Err(SinkError::permanent(self.shown(&format!(
                        "record {} of checkpoint {} (sink {} subtask {}) has no tab: hash mode needs FIELD<TAB>VALUE; nothing of the epoch was written",
                        r.position.index, k.checkpoint, k.sink_id, k.subtask
                    ))));
                }
            }
        }
        Ok(())
    }

    /// The script call applying `recs`, records `first..` of epoch `key` of `total`.
    fn call(
        &self,
        key: &EpochKey,
        field: &str,
        first: u64,
        recs: &[bytes::Bytes],
        total: u64,
        meta: &[u8],
    ) -> Call {
        let count = recs.len() as u64;
        let last = first + count == total;
        let mut cmd = redis::cmd("EVALSHA");
        cmd.arg(&self.sha)
            .arg(2)
            .arg(self.config.key_for(key.subtask))
            .arg(self.config.marker_key(key.subtask))
            .arg(field)
            .arg(script::padded(key.checkpoint))
            .arg(first)
            .arg(if last { "1" } else { "0" })
            .arg(self.config.mode.name())
            .arg(if last { meta } else { &[][..] });
        for r in recs {
            if self.config.mode == Mode::Hash {
                let tab = r.iter().position(|b| *b == b'\t').unwrap_or(r.len());
                cmd.arg(&r[..tab]).arg(r.get(tab + 1..).unwrap_or(&[]));
            } else {
                cmd.arg(&r[..]);
            }
        }
        Call { cmd, first, count }
    }

    /// Sends `calls` on a task of its own, so the next chunks are read and packed while
    /// Redis runs these.
    async fn spawn_send(&mut self, calls: Vec<Call>, cp: u64) -> Result<Pending, SinkError> {
        let c = self.conn().await?;
        let shown = self.shown(&format!("apply checkpoint {cp}"));
        Ok(tokio::spawn(send(c, calls, shown)))
    }

    /// Waits for a send and counts what it did.
    async fn settle(&mut self, pending: Pending) -> Result<(), SinkError> {
        match pending.await {
            Ok(Ok(sent)) => {
                self.stats.chunks_applied += sent.applied;
                self.stats.chunks_skipped += sent.skipped;
                self.stats.script_reloads += sent.reloads;
                Ok(())
            }
            Ok(Err(Failed::Client(e, what))) => Err(self.fail(&e, &what)),
            Ok(Err(Failed::Sink(e))) => Err(e),
            Err(e) => Err(SinkError::retryable(
                self.shown(&format!("the task sending chunks failed: {e}")),
            )),
        }
    }
}

type Pending = tokio::task::JoinHandle<Result<Sent, Failed>>;

/// What one pipeline of chunk calls did.
#[derive(Debug, Default)]
struct Sent {
    applied: u64,
    skipped: u64,
    reloads: u64,
}

enum Failed {
    /// A client error (the connection may be broken), and what was being done.
    Client(redis::RedisError, String),
    /// A classified error reply.
    Sink(SinkError),
}

/// Sends `calls` in one pipeline and checks each reply; loads the script again and resends
/// once after `NOSCRIPT` (calls that were applied are then skipped by the marker).
async fn send(
    mut c: MultiplexedConnection,
    calls: Vec<Call>,
    shown: String,
) -> Result<Sent, Failed> {
    let mut sent = Sent::default();
    let mut pipe = redis::pipe();
    pipe.ignore_errors();
    let mut ranges = Vec::with_capacity(calls.len());
    for call in calls {
        ranges.push((call.first, call.first + call.count));
        pipe.add_command(call.cmd);
    }
    loop {
        let replies: Vec<Value> = pipe
            .query_async(&mut c)
            .await
            .map_err(|e| Failed::Client(e, shown.clone()))?;
        let mut noscript = false;
        for ((first, end), reply) in ranges.iter().zip(&replies) {
            match reply {
                Value::Array(v) if v.len() == 2 => {
                    if matches!(v[0], Value::Int(1)) {
                        sent.applied += 1;
                    } else {
                        sent.skipped += 1;
                    }
                }
                Value::ServerError(e) if e.code() == "NOSCRIPT" => noscript = true,
                Value::ServerError(e) => {
                    let what = format!("{shown}: records {first}..{end}");
                    return Err(Failed::Sink(classify_server(e, &what)));
                }
                other => {
                    return Err(Failed::Sink(SinkError::permanent(format!(
                        "{shown}: unexpected reply to the chunk script: {other:?}"
                    ))))
                }
            }
        }
        if !noscript {
            return Ok(sent);
        }
        if sent.reloads > 0 {
            return Err(Failed::Sink(SinkError::retryable(format!(
                "{shown}: NOSCRIPT again right after SCRIPT LOAD (is the script cache being flushed?)"
            ))));
        }
        let _: String = redis::cmd("SCRIPT")
            .arg("LOAD")
            .arg(script::SOURCE)
            .query_async(&mut c)
            .await
            .map_err(|e| {
                Failed::Client(e, format!("{shown}: load the chunk script after NOSCRIPT"))
            })?;
        sent.reloads += 1;
        tracing::debug!(target = %shown, "chunk script loaded after NOSCRIPT");
    }
}

impl AsyncSink for RedisSink {
    async fn deliver(&mut self, epoch: &Epoch) -> Result<(), SinkError> {
        let key = epoch.key().clone();
        let cp = key.checkpoint;
        let marker = self.marker(&key.sink_id, key.subtask).await?;
        if marker.is_some_and(|m| m.covers(cp)) {
            self.stats.epochs_skipped += 1;
            return Ok(());
        }
        let start = marker.map_or(0, |m| m.resume_at(cp));
        if self.config.mode == Mode::Hash {
            self.check_hash_records(epoch, start).await?;
        }
        let field = script::field(&key.sink_id, key.subtask);
        let total = epoch.len();
        let (max_records, max_bytes) = (self.config.chunk_records as u64, self.config.chunk_bytes);
        let meta = epoch.metadata();
        // Chunks start at `start`, the first record the target lacks; calls go out
        // `in_flight` at a time in one pipeline.
        let mut group: Vec<Call> = Vec::with_capacity(self.config.in_flight);
        // At most one pipeline in flight (so chunks reach Redis in order) while the next
        // is packed. A delivery that fails or is dropped leaves it to finish on its own:
        // the marker makes whatever it applies count.
        let mut pending: Option<Pending> = None;
        let mut recs: Vec<bytes::Bytes> = Vec::new();
        let (mut first, mut bytes) = (start, 0usize);
        let mut chunks = AsyncChunks::new(epoch);
        while let Some(chunk) = chunks.next().await {
            for r in chunk?.records() {
                if r.position.index < start {
                    continue;
                }
                bytes += r.data.len();
                recs.push(r.data);
                if recs.len() as u64 >= max_records || bytes >= max_bytes {
                    let call = self.call(&key, &field, first, &recs, total, meta);
                    first += recs.len() as u64;
                    recs.clear();
                    bytes = 0;
                    group.push(call);
                    if group.len() >= self.config.in_flight {
                        if let Some(p) = pending.take() {
                            self.settle(p).await?;
                        }
                        pending = Some(self.spawn_send(std::mem::take(&mut group), cp).await?);
                    }
                }
            }
        }
        if !recs.is_empty() || start == total {
            // The rest, or an empty call that marks an epoch without (further) records
            // complete.
            group.push(self.call(&key, &field, first, &recs, total, meta));
        }
        if let Some(p) = pending.take() {
            self.settle(p).await?;
        }
        if !group.is_empty() {
            let p = self.spawn_send(group, cp).await?;
            self.settle(p).await?;
        }
        Ok(())
    }

    fn stores_marker(&self) -> bool {
        true
    }

    async fn is_committed(&mut self, key: &EpochKey) -> Result<bool, SinkError> {
        Ok(self
            .marker(&key.sink_id, key.subtask)
            .await?
            .is_some_and(|m| m.covers(key.checkpoint)))
    }
}
