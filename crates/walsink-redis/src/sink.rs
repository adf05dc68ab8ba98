//! [`RedisSink`]: delivers epochs to Redis in optimistic transactions (`WATCH`, `MULTI`, the
//! records as native commands, the marker move, `EXEC`), exactly once.

use crate::config::{Config, ConfigError, Mode};
use crate::error::{classify, classify_server, coded, refusal, refused, tls_failed, REFUSAL_WAIT};
use crate::script::{self, Marker};
use bytes::Bytes;
use redis::aio::MultiplexedConnection;
use redis::{AsyncConnectionConfig, RedisConnectionInfo, Value};
use std::sync::Arc;
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;
use tokio_rustls::rustls::pki_types::ServerName;
use tokio_rustls::TlsConnector;
use walsink::{decide_claim, Claim, Epoch, EpochKey, Owner, SinkError};
use walsink_tokio::{AsyncChunks, AsyncSink};

/// At most this many values (records, or hash fields and values) per write command.
const MAX_VALUES: usize = 1000;

/// Transactions of one delivery aborted by a change of the marker key in a row before the
/// delivery gives up (retryable): another writer with the same sink id and subtask.
const MAX_ABORTS: u32 = 50;

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
    /// Chunks whose records were applied (or, for an epoch without further records, whose
    /// marker move completed it).
    pub chunks_applied: u64,
    /// Chunks of a transaction dropped because the marker, read again after an aborted
    /// transaction, showed them applied already.
    pub chunks_skipped: u64,
    /// Epochs skipped whole because the marker covered them before anything was sent.
    pub epochs_skipped: u64,
    /// Transactions that `EXEC` applied.
    pub transactions: u64,
    /// Transactions `EXEC` aborted because the marker key changed after `WATCH`; each was
    /// read again and resent without what the marker showed applied.
    pub aborts: u64,
    /// Connections opened.
    pub connects: u64,
}

/// Where a [`TestHook`] is called.
#[doc(hidden)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HookPoint {
    /// The epoch's checkpoint.
    pub checkpoint: u64,
    /// The index of the first record the transaction writes.
    pub first: u64,
    /// How many records it writes.
    pub count: u64,
    /// Which attempt of this transaction (0 first).
    pub attempt: u32,
}

/// A function called after each transaction's `WATCH` and reads and before its
/// `MULTI`…`EXEC` is sent, for fault-injection tests (it may change Redis from another
/// connection). It runs on a tokio worker and may block briefly.
#[doc(hidden)]
pub type TestHook = Arc<dyn Fn(HookPoint) + Send + Sync>;

/// An [`AsyncSink`] writing each epoch to a Redis key in optimistic transactions that move a
/// commit marker with the records: exactly-once inside Redis.
///
/// An epoch is cut into chunks ([`Config::chunk_records`], [`Config::chunk_bytes`]) and
/// [`Config::in_flight`] chunks make one transaction:
///
/// 1. `WATCH` the marker key ([`Config::marker_key`], written by this sink id and subtask
///    only), read the marker and `TYPE` of the data key (one round trip, sent behind the
///    previous transaction's `EXEC`);
/// 2. decide from the marker what to skip: an epoch complete (or older than the marker) is
///    skipped, records the marker shows applied are dropped, a transaction that starts after
///    the marker's next record is a gap (permanent); a data key of another type is a
///    permanent error, and nothing is sent;
/// 3. `MULTI`, the records as native `RPUSH` / `XADD` / `HSET` commands, `EVAL` of
///    [`script::MOVE`](crate::script::MOVE) (which moves the marker only if the writes
///    landed), `EXEC`. A nil `EXEC` (the marker changed after `WATCH`: another writer) goes
///    back to 1; an error reply is classified.
///
/// The marker records how far into the epoch the target is, so a delivery cut anywhere (a
/// crash, a killed connection, a dropped future) resumes at the first record not applied,
/// and an epoch applied whole is skipped.
///
/// The sink owns its connection: one task at a time uses it, and a connection a dropped
/// delivery may have left in the middle of a transaction is dropped and opened anew.
/// Errors keep the server's code (`WRONGTYPE`, `OOM`, …): see [`classify`](crate::classify).
/// After a connection error the connection is dropped and the next call opens a new one.
pub struct RedisSink {
    config: Config,
    client: redis::Client,
    /// For `rediss://`: the sink opens the TCP connection and the TLS session itself (with
    /// the kit's rustls settings) and hands the stream to the client library.
    tls: Option<Tls>,
    conn: Option<MultiplexedConnection>,
    client_id: Option<i64>,
    /// The connection may be in the middle of a transaction (set while one runs; a delivery
    /// that failed or was dropped leaves it set).
    dirty: bool,
    /// A state Redis cannot be left in silently: records written without their marker, or
    /// a marker moved past records a write refused. Every later delivery fails with it.
    poisoned: Option<String>,
    hook: Option<TestHook>,
    stats: Stats,
    /// The shard this sink claimed ([`RedisSink::claim`]).
    claim: Option<Claim>,
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

/// How a `rediss://` sink opens its connections.
struct Tls {
    connector: TlsConnector,
    name: ServerName<'static>,
    /// The user, password and database, as the client library sends them after connecting.
    info: RedisConnectionInfo,
}

/// Why a TLS connection could not be opened.
enum Opening {
    /// The TCP connection (refused, unreachable).
    Tcp(std::io::Error),
    /// The TLS handshake.
    Handshake(std::io::Error),
    /// Neither finished within the timeout.
    Timeout,
}

/// What one delivery's transactions share.
struct Ctx {
    mode: Mode,
    data_key: String,
    marker_key: String,
    old_key: String,
    old_field: String,
    checkpoint: u64,
    /// `CHECKPOINT\nMETADATA`, stored with the epoch's last marker move.
    meta: Vec<u8>,
    /// The epoch's record count.
    total: u64,
    shown: String,
    hook: Option<TestHook>,
    /// The shard's claim ([`RedisSink::claim`]): every transaction checks the owner fields it
    /// read under `WATCH` against it before it sends anything.
    claim: Option<Claim>,
}

/// What a `WATCH` and the reads after it showed.
#[derive(Debug, Clone)]
struct Seen {
    marker: Option<Marker>,
    kind: String,
    /// The marker key's `owner` and `generation` fields, when both are set.
    owner: Option<(String, u64)>,
}

/// One transaction: records `first..first + records.len()` of the epoch.
struct Tx {
    first: u64,
    records: Vec<Bytes>,
    /// The end (index into `records`) of each chunk.
    chunk_ends: Vec<usize>,
    /// Whether `WATCH` and the reads for the next transaction follow its `EXEC`.
    trailing: bool,
}

impl Tx {
    fn end(&self) -> u64 {
        self.first + self.records.len() as u64
    }
}

/// What a transaction did.
#[derive(Debug, Default)]
struct Done {
    /// The state after it, still watched, for the next transaction (`None` without
    /// trailing reads).
    seen: Option<Seen>,
    /// The marker covers the epoch: send nothing more.
    covered: bool,
    applied: u64,
    skipped: u64,
    transactions: u64,
    aborts: u64,
}

enum Failed {
    /// A client error (the connection may be broken), and what was being done.
    Client(redis::RedisError, String),
    /// A classified error.
    Sink(SinkError),
    /// Redis holds records without their marker, or a marker past records not written.
    Poison(String),
}

type Pending = tokio::task::JoinHandle<Result<Done, Failed>>;

impl RedisSink {
    /// A sink for `config`. Connects on first use (or with [`RedisSink::connect`]).
    pub fn new(config: Config) -> Result<RedisSink, ConfigError> {
        config.check()?;
        let client = redis::Client::open(config.client_url())
            .map_err(|e| ConfigError::new("redis", "URL", e.to_string()))?;
        let tls = match &config.tls {
            None => None,
            Some(o) => {
                let rustls = o.client_config("redis")?;
                let name = ServerName::try_from(config.host.clone()).map_err(|e| {
                    ConfigError::new(
                        "redis",
                        "host",
                        format!("{:?} is not a host name TLS can verify: {e}", config.host),
                    )
                })?;
                Some(Tls {
                    connector: TlsConnector::from(Arc::new(rustls)),
                    name,
                    info: client.get_connection_info().redis_settings().clone(),
                })
            }
        };
        Ok(RedisSink {
            config,
            client,
            tls,
            conn: None,
            client_id: None,
            dirty: false,
            poisoned: None,
            hook: None,
            stats: Stats::default(),
            claim: None,
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

    /// Sets a function called before each transaction is sent (fault-injection tests only).
    #[doc(hidden)]
    pub fn set_test_hook(&mut self, hook: Option<TestHook>) {
        self.hook = hook;
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
        if self.dirty {
            // A delivery failed or was dropped in the middle of a transaction: its task may
            // still use this connection, and `WATCH`/`MULTI` state is per connection.
            self.conn = None;
            self.client_id = None;
            self.dirty = false;
        }
        if let Some(c) = &self.conn {
            return Ok(c.clone());
        }
        let t = Some(self.config.timeout);
        let cfg = AsyncConnectionConfig::new()
            .set_connection_timeout(t)
            .set_response_timeout(t);
        let mut c = match &self.tls {
            None => match self
                .client
                .get_multiplexed_async_connection_with_config(&cfg)
                .await
            {
                Ok(c) => c,
                Err(e) => return Err(self.connect_failed(&e, "connect").await),
            },
            Some(tls) => {
                let stream = match self.open_tls().await {
                    Ok(s) => s,
                    Err(e) => return Err(self.opening_failed(e)),
                };
                let info = tls.info.clone();
                let setup = tokio::time::timeout(
                    self.config.timeout,
                    MultiplexedConnection::new_with_config(&info, stream, cfg),
                )
                .await;
                match setup {
                    Ok(Ok((c, driver))) => {
                        // Ends when the last clone of the connection is dropped.
                        tokio::spawn(driver);
                        c
                    }
                    Ok(Err(e)) => return Err(self.connect_failed(&e, "connect").await),
                    Err(_) => return Err(self.opening_failed(Opening::Timeout)),
                }
            }
        };
        let setup = redis::pipe()
            .cmd("CLIENT")
            .arg("SETNAME")
            .arg("walsink")
            .cmd("CLIENT")
            .arg("ID")
            .query_async(&mut c)
            .await;
        let (_, id): ((), i64) = match setup {
            Ok(v) => v,
            Err(e) => return Err(self.connect_failed(&e, "set up the connection").await),
        };
        self.stats.connects += 1;
        self.client_id = Some(id);
        self.conn = Some(c.clone());
        Ok(c)
    }

    /// Classifies a failed connection set-up. A server that refuses a client writes one
    /// error line and closes the connection (`-DENIED` in protected mode, `-ERR max number
    /// of clients reached`); the client library then reports only the broken pipe, so after
    /// an I/O error the sink connects once more, briefly, to read the server's own words.
    ///
    /// Over TLS, a server that refuses the client's certificate may say so only after the
    /// handshake (TLS 1.3 checks the client's certificate after the client finished), so the
    /// first reply's error is searched for a TLS failure first.
    async fn connect_failed(&self, e: &redis::RedisError, what: &str) -> SinkError {
        if self.tls.is_some() {
            if let Some(f) = walsink_kit::tls::failure(e) {
                return tls_failed(&f, &self.shown(what)).with_source(e.clone());
            }
        }
        if e.is_io_error() || e.is_connection_dropped() {
            let wait = self.config.timeout.min(REFUSAL_WAIT);
            let line = match &self.tls {
                None => {
                    let host = (self.config.host.as_str(), self.config.port);
                    refusal(TcpStream::connect(host), wait).await
                }
                Some(_) => refusal(self.open_tls(), wait).await,
            };
            if let Some(line) = line {
                return refused(&line, &self.shown(what)).with_source(e.clone());
            }
        }
        classify(e, &self.shown(what))
    }

    /// Opens the TCP connection and the TLS session of a `rediss://` sink, within the
    /// timeout.
    async fn open_tls(&self) -> Result<TlsStream<TcpStream>, Opening> {
        let Some(tls) = &self.tls else {
            return Err(Opening::Handshake(std::io::Error::other("not a TLS sink")));
        };
        let open = async {
            let tcp = TcpStream::connect((self.config.host.as_str(), self.config.port))
                .await
                .map_err(Opening::Tcp)?;
            let _ = tcp.set_nodelay(true);
            tls.connector
                .connect(tls.name.clone(), tcp)
                .await
                .map_err(Opening::Handshake)
        };
        tokio::time::timeout(self.config.timeout, open)
            .await
            .unwrap_or(Err(Opening::Timeout))
    }

    /// Classifies a TLS connection that could not be opened: a certificate the sink does not
    /// accept, or a handshake the server refused, is named ([`walsink_kit::tls::failure`]);
    /// a refused TCP connection, one cut in the handshake and a timeout are retryable.
    fn opening_failed(&self, e: Opening) -> SinkError {
        let what = self.shown("connect");
        match e {
            Opening::Tcp(e) => SinkError::retryable(format!("{what}: {e}")).with_source(e),
            Opening::Timeout => SinkError::retryable(format!(
                "{what}: no connection within {} (timeout=)",
                humantime::format_duration(self.config.timeout)
            )),
            Opening::Handshake(e) => match walsink_kit::tls::failure(&e) {
                Some(f) => tls_failed(&f, &what).with_source(e),
                None => SinkError::retryable(format!("{what}: TLS handshake: {e}")).with_source(e),
            },
        }
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

    /// Claims the shard `(sink_id, subtask)` of this sink's key for `owner`: the fields
    /// `owner` and `generation` of the shard's marker key, read under `WATCH` and written by
    /// `MULTI`/`EXEC` with the generation [`decide_claim`] gives (a marker still in the old
    /// shared hash moves to the per-sink key in the same `EXEC`). From then on every
    /// transaction reads the owner fields under the `WATCH` it already takes on the marker
    /// key and sends nothing unless they still hold this claim
    /// ([`SinkError::fenced`](walsink::SinkError::fenced)); a claim that lands meanwhile
    /// changes the watched key, so the old owner's `EXEC` aborts and its retry is fenced. A
    /// sink that never claims does not look at owners.
    ///
    /// # Errors
    /// [`SinkError::fenced`](walsink::SinkError::fenced) when another log owns the shard and
    /// `owner` does not take it over; the classified server or client error otherwise.
    ///
    /// # Cancel safety
    /// If dropped, the claim may or may not have landed; claim again (a claim of the same
    /// owner is always granted, one generation higher).
    pub async fn claim(
        &mut self,
        sink_id: &str,
        subtask: u32,
        owner: &Owner,
    ) -> Result<Claim, SinkError> {
        self.claim = None;
        let key = self.config.marker_key(sink_id, subtask);
        let old = self.config.old_marker_key(subtask);
        let field = script::field(sink_id, subtask);
        let meta_field = format!("{field}:meta");
        let what = self.shown(&format!("claim shard {sink_id}/{subtask}"));
        let mut c = self.conn().await?;
        for _ in 0..MAX_ABORTS {
            let mut p = redis::pipe();
            p.ignore_errors();
            p.cmd("WATCH").arg(&key);
            p.cmd("HMGET").arg(&key).arg("owner").arg("generation");
            p.cmd("EXISTS").arg(&key);
            p.cmd("HGET").arg(&old).arg(&field);
            p.cmd("HGET").arg(&old).arg(&meta_field);
            let v: Vec<Value> = p
                .query_async(&mut c)
                .await
                .map_err(|e| self.fail(&e, "claim"))?;
            if let Some(Value::ServerError(e)) =
                v.iter().find(|r| matches!(r, Value::ServerError(_)))
            {
                unwatch(&mut c).await;
                return Err(classify_server(e, &what));
            }
            let found = match v.get(1) {
                Some(r) => parse_owner(r, &key, &what).map_err(|f| self.failed(f))?,
                None => return Err(SinkError::permanent(format!("{what}: {} replies", v.len()))),
            };
            let exists = matches!(v.get(2), Some(Value::Int(1)));
            let claim = match decide_claim(
                sink_id,
                subtask,
                found.as_ref().map(|(o, g)| (o.as_str(), *g)),
                owner,
            ) {
                Ok(c) => c,
                Err(e) => {
                    unwatch(&mut c).await;
                    return Err(e);
                }
            };
            let bulk = |v: Option<&Value>| match v {
                Some(Value::BulkString(b)) => Some(b.clone()),
                _ => None,
            };
            let mut t = redis::pipe();
            t.ignore_errors();
            t.cmd("MULTI");
            let mut queued = 1;
            if !exists {
                // Move a marker of the old shared hash first, as the marker move does: the
                // owner fields make the per-sink key exist, and then the old one is not read.
                if let Some(m) = bulk(v.get(3)) {
                    t.cmd("HSET").arg(&key).arg("marker").arg(m);
                    queued += 1;
                }
                if let Some(m) = bulk(v.get(4)) {
                    t.cmd("HSET").arg(&key).arg("meta").arg(m);
                    queued += 1;
                }
                t.cmd("HDEL").arg(&old).arg(&field).arg(&meta_field);
                queued += 1;
            }
            t.cmd("HSET")
                .arg(&key)
                .arg("owner")
                .arg(&*claim.owner)
                .arg("generation")
                .arg(claim.generation);
            queued += 1;
            t.cmd("EXEC");
            let r: Vec<Value> = t
                .query_async(&mut c)
                .await
                .map_err(|e| self.fail(&e, "claim"))?;
            // A command refused when queued (OOM, NOPERM, …): nothing ran; its refusal says why.
            if let Some(Value::ServerError(e)) = r
                .iter()
                .take(queued)
                .find(|x| matches!(x, Value::ServerError(_)))
            {
                unwatch(&mut c).await;
                return Err(classify_server(e, &what));
            }
            match r.get(queued) {
                Some(Value::Array(results)) => {
                    if let Some(Value::ServerError(e)) =
                        results.iter().find(|x| matches!(x, Value::ServerError(_)))
                    {
                        return Err(classify_server(e, &what));
                    }
                    tracing::info!(sink_id, subtask, owner = %claim.owner, generation = claim.generation, "claimed the shard");
                    self.claim = Some(claim.clone());
                    return Ok(claim);
                }
                Some(Value::Nil) => {}
                Some(Value::ServerError(e)) => return Err(classify_server(e, &what)),
                other => {
                    return Err(SinkError::permanent(format!(
                        "{what}: unexpected reply to EXEC: {other:?}"
                    )))
                }
            }
            // The key changed after WATCH (a delivery of the old owner, another claim): again.
        }
        Err(SinkError::retryable(format!(
            "{what}: {MAX_ABORTS} attempts in a row aborted by changes of {key}"
        )))
    }

    /// The claim this sink holds, if it claimed one ([`RedisSink::claim`]).
    pub fn claimed(&self) -> Option<&Claim> {
        self.claim.as_ref()
    }

    /// The owner record of `(sink_id, subtask)`: `(owner log id, generation)`, `None` when no
    /// log claimed the shard.
    ///
    /// # Errors
    /// The classified server or client error; a permanent one for owner fields that do not
    /// read.
    ///
    /// # Cancel safety
    /// Cancel safe: it only reads.
    pub async fn owner(
        &mut self,
        sink_id: &str,
        subtask: u32,
    ) -> Result<Option<(String, u64)>, SinkError> {
        let key = self.config.marker_key(sink_id, subtask);
        let what = self.shown(&format!("read the owner of {sink_id}/{subtask}"));
        let mut c = self.conn().await?;
        let v: Value = redis::cmd("HMGET")
            .arg(&key)
            .arg("owner")
            .arg("generation")
            .query_async(&mut c)
            .await
            .map_err(|e| self.fail(&e, "read the owner"))?;
        parse_owner(&v, &key, &what).map_err(|f| self.failed(f))
    }

    /// The marker of `(sink_id, subtask)`, if the target has one: the per-sink key, or the
    /// old shared hash's field when that key does not exist.
    ///
    /// # Cancel safety
    /// Cancel safe: it only reads; call it again.
    pub async fn marker(
        &mut self,
        sink_id: &str,
        subtask: u32,
    ) -> Result<Option<Marker>, SinkError> {
        let mut c = self.conn().await?;
        let key = self.config.marker_key(sink_id, subtask);
        let old = self.config.old_marker_key(subtask);
        let field = script::field(sink_id, subtask);
        let (new, prev): (Option<String>, Option<String>) = redis::pipe()
            .cmd("HGET")
            .arg(&key)
            .arg("marker")
            .cmd("HGET")
            .arg(&old)
            .arg(&field)
            .query_async(&mut c)
            .await
            .map_err(|e| self.fail(&e, "read the marker"))?;
        let (s, at) = match (new, prev) {
            (Some(s), _) => (s, format!("{key} field marker")),
            (None, Some(s)) => (s, format!("{old} field {field}")),
            (None, None) => return Ok(None),
        };
        Marker::decode(&s).map(Some).ok_or_else(|| {
            SinkError::permanent(self.shown(&format!(
                "the marker {at} holds {s:?}, not a walsink marker; another program writes there"
            )))
        })
    }

    /// The newest epoch of `(sink_id, subtask)` the target holds whole, with its checkpoint
    /// metadata, or `None` when it holds none. Read from the per-sink marker key, or from the
    /// old shared hash when that key does not exist.
    ///
    /// # Cancel safety
    /// Cancel safe: it only reads; call it again.
    pub async fn committed(
        &mut self,
        sink_id: &str,
        subtask: u32,
    ) -> Result<Option<Committed>, SinkError> {
        let mut c = self.conn().await?;
        let key = self.config.marker_key(sink_id, subtask);
        let old = self.config.old_marker_key(subtask);
        let field = format!("{}:meta", script::field(sink_id, subtask));
        let (exists, new, prev): (bool, Option<Vec<u8>>, Option<Vec<u8>>) = redis::pipe()
            .cmd("EXISTS")
            .arg(&key)
            .cmd("HGET")
            .arg(&key)
            .arg("meta")
            .cmd("HGET")
            .arg(&old)
            .arg(&field)
            .query_async(&mut c)
            .await
            .map_err(|e| self.fail(&e, "read the marker"))?;
        let (v, at) = if exists {
            (new, format!("{key} field meta"))
        } else {
            (prev, format!("{old} field {field}"))
        };
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
                "{at} is not walsink's checkpoint metadata; another program writes there"
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

    /// Maps a failed transaction task.
    fn failed(&mut self, f: Failed) -> SinkError {
        match f {
            Failed::Client(e, what) => self.fail(&e, &what),
            Failed::Sink(e) => e,
            Failed::Poison(msg) => {
                tracing::error!(target = %self.config.redacted(), "{msg}");
                self.poisoned = Some(msg.clone());
                SinkError::permanent(msg)
            }
        }
    }

    /// Waits for a transaction task and counts what it did.
    async fn settle(&mut self, pending: Pending) -> Result<Done, SinkError> {
        match pending.await {
            Ok(Ok(done)) => {
                self.stats.chunks_applied += done.applied;
                self.stats.chunks_skipped += done.skipped;
                self.stats.transactions += done.transactions;
                self.stats.aborts += done.aborts;
                Ok(done)
            }
            Ok(Err(f)) => Err(self.failed(f)),
            Err(e) => Err(SinkError::retryable(
                self.shown(&format!("the task sending a transaction failed: {e}")),
            )),
        }
    }

    async fn deliver_epoch(&mut self, epoch: &Epoch) -> Result<(), SinkError> {
        if let Some(p) = &self.poisoned {
            return Err(SinkError::permanent(format!(
                "{p} (the sink stopped at this; fix the target, then restart)"
            )));
        }
        let key = epoch.key().clone();
        let cp = key.checkpoint;
        let mut meta = format!("{cp}\n").into_bytes();
        meta.extend_from_slice(epoch.metadata());
        let ctx = Arc::new(Ctx {
            mode: self.config.mode,
            data_key: self.config.key_for(key.subtask),
            marker_key: self.config.marker_key(&key.sink_id, key.subtask),
            old_key: self.config.old_marker_key(key.subtask),
            old_field: script::field(&key.sink_id, key.subtask),
            checkpoint: cp,
            meta,
            total: epoch.len(),
            shown: self.shown(&format!(
                "apply checkpoint {cp} (sink {} subtask {})",
                key.sink_id, key.subtask
            )),
            hook: self.hook.clone(),
            claim: self.claim.clone(),
        });
        if let Some(claim) = &self.claim {
            claim.check_key(&key)?;
        }
        let mut c = self.conn().await?;
        self.dirty = true;
        let mut seen = match watch_and_read(&mut c, &ctx).await {
            Ok(s) => s,
            Err(f) => return Err(self.failed(f)),
        };
        if seen.marker.is_some_and(|m| m.covers(cp)) {
            self.stats.epochs_skipped += 1;
            unwatch(&mut c).await;
            self.dirty = false;
            return Ok(());
        }
        let start = seen.marker.map_or(0, |m| m.resume_at(cp));
        let total = ctx.total;
        if start < total && !kind_fits(&seen.kind, ctx.mode) {
            unwatch(&mut c).await;
            self.dirty = false;
            return Err(wrong_type(&ctx, &seen.kind));
        }
        if self.config.mode == Mode::Hash {
            self.check_hash_records(epoch, start).await?;
        }
        let (max_records, max_bytes) = (self.config.chunk_records, self.config.chunk_bytes);
        let per_tx = self.config.in_flight;
        // One transaction in flight, on a task of its own, while the next is read from the
        // log and packed here; each takes the state its predecessor read after its `EXEC`.
        let mut pending: Option<Pending> = None;
        let mut tx = Tx {
            first: start,
            records: Vec::new(),
            chunk_ends: Vec::new(),
            trailing: true,
        };
        let mut bytes = 0usize;
        let mut chunk_len = 0usize;
        let mut sent_any = false;
        let mut chunks = AsyncChunks::new(epoch);
        while let Some(chunk) = chunks.next().await {
            for r in chunk?.records() {
                if r.position.index < start {
                    continue;
                }
                bytes += r.data.len();
                tx.records.push(r.data);
                chunk_len += 1;
                if chunk_len >= max_records || bytes >= max_bytes {
                    tx.chunk_ends.push(tx.records.len());
                    chunk_len = 0;
                    bytes = 0;
                    if tx.chunk_ends.len() >= per_tx {
                        tx.trailing = tx.end() != total;
                        sent_any = true;
                        let next = Tx {
                            first: tx.end(),
                            records: Vec::with_capacity(tx.records.len()),
                            chunk_ends: Vec::new(),
                            trailing: true,
                        };
                        let full = std::mem::replace(&mut tx, next);
                        match self.send(&mut c, &ctx, full, &mut pending, seen).await? {
                            Some(s) => seen = s,
                            None => {
                                self.dirty = false;
                                return Ok(());
                            }
                        }
                    }
                }
            }
        }
        if chunk_len > 0 {
            tx.chunk_ends.push(tx.records.len());
        }
        if !tx.records.is_empty() || !sent_any {
            // The rest, or a transaction without records that marks an epoch without
            // (further) records complete.
            if tx.records.is_empty() {
                tx.chunk_ends.push(0);
            }
            tx.trailing = false;
            if self
                .send(&mut c, &ctx, tx, &mut pending, seen)
                .await?
                .is_none()
            {
                self.dirty = false;
                return Ok(());
            }
        }
        if let Some(p) = pending.take() {
            self.settle(p).await?;
        }
        self.dirty = false;
        Ok(())
    }

    /// Packs `tx`, waits for the transaction in flight, then sends `tx` on a task of its
    /// own. Returns the state `tx` is to start from (`seen`, or what the one in flight read
    /// after its `EXEC`), `None` when the marker showed the epoch complete.
    async fn send(
        &mut self,
        c: &mut MultiplexedConnection,
        ctx: &Arc<Ctx>,
        tx: Tx,
        pending: &mut Option<Pending>,
        seen: Seen,
    ) -> Result<Option<Seen>, SinkError> {
        let built = build(ctx, &tx, 0);
        let mut seen = seen;
        if let Some(p) = pending.take() {
            let done = self.settle(p).await?;
            if done.covered {
                return Ok(None);
            }
            if let Some(s) = done.seen {
                seen = s;
            }
        }
        *pending = Some(tokio::spawn(run(
            c.clone(),
            ctx.clone(),
            tx,
            built,
            seen.clone(),
        )));
        Ok(Some(seen))
    }
}

fn kind_fits(kind: &str, mode: Mode) -> bool {
    kind == "none" || kind == mode.name()
}

fn wrong_type(ctx: &Ctx, kind: &str) -> SinkError {
    coded(
        "WRONGTYPE",
        &format!(
            "key {} holds a {kind}, the sink writes a {}; nothing written",
            ctx.data_key,
            ctx.mode.name()
        ),
        &ctx.shown,
    )
}

/// Best effort: a `WATCH` left on the connection would only make its next transaction
/// stricter.
async fn unwatch(c: &mut MultiplexedConnection) {
    let _: Result<(), _> = redis::cmd("UNWATCH").query_async(c).await;
}

/// `WATCH` on the marker key and the reads after it, appended to `p`.
fn add_reads(p: &mut redis::Pipeline, ctx: &Ctx) {
    p.cmd("WATCH").arg(&ctx.marker_key);
    p.cmd("HGET").arg(&ctx.marker_key).arg("marker");
    p.cmd("HGET").arg(&ctx.old_key).arg(&ctx.old_field);
    p.cmd("TYPE").arg(&ctx.data_key);
    p.cmd("HMGET")
        .arg(&ctx.marker_key)
        .arg("owner")
        .arg("generation");
}

/// How many replies [`add_reads`] makes.
const READS: usize = 5;

/// Decodes the reply to `HMGET KEY owner generation`.
fn parse_owner(v: &Value, key: &str, what: &str) -> Result<Option<(String, u64)>, Failed> {
    let field = |v: &Value| match v {
        Value::Nil => None,
        Value::BulkString(b) => Some(String::from_utf8_lossy(b).into_owned()),
        Value::SimpleString(s) => Some(s.clone()),
        _ => None,
    };
    let bad = |why: &str| {
        Failed::Sink(coded(
            "WALSINK_OWNER",
            &format!("the owner fields of {key} {why}"),
            what,
        ))
    };
    match v {
        Value::Array(f) if f.len() == 2 => match (field(&f[0]), field(&f[1])) {
            (None, None) => Ok(None),
            (Some(o), Some(g)) => g
                .parse::<u64>()
                .map(|g| Some((o, g)))
                .map_err(|_| bad(&format!("hold generation {g:?}, not a number"))),
            _ => Err(bad(
                "are half set (owner without generation, or the reverse)",
            )),
        },
        other => Err(Failed::Sink(SinkError::permanent(format!(
            "{what}: unexpected reply {other:?} to HMGET"
        )))),
    }
}

/// Decodes the replies of [`add_reads`].
fn parse_reads(ctx: &Ctx, v: &[Value]) -> Result<Seen, Failed> {
    let what = format!("{}: watch and read the marker", ctx.shown);
    for r in v {
        if let Value::ServerError(e) = r {
            return Err(Failed::Sink(classify_server(e, &what)));
        }
    }
    let text = |v: &Value| -> Result<Option<String>, Failed> {
        match v {
            Value::Nil => Ok(None),
            Value::BulkString(b) => Ok(Some(String::from_utf8_lossy(b).into_owned())),
            Value::SimpleString(s) => Ok(Some(s.clone())),
            Value::Okay => Ok(Some("OK".into())),
            other => Err(Failed::Sink(SinkError::permanent(format!(
                "{what}: unexpected reply {other:?}"
            )))),
        }
    };
    let [_, new, old, kind, owner] = v else {
        return Err(Failed::Sink(SinkError::permanent(format!(
            "{what}: {} replies, not {READS}",
            v.len()
        ))));
    };
    let owner = parse_owner(owner, &ctx.marker_key, &what)?;
    let (s, at) = match (text(new)?, text(old)?) {
        (Some(s), _) => (Some(s), format!("{} field marker", ctx.marker_key)),
        (None, Some(s)) => (Some(s), format!("{} field {}", ctx.old_key, ctx.old_field)),
        (None, None) => (None, String::new()),
    };
    let marker = match s {
        None => None,
        Some(s) => Some(Marker::decode(&s).ok_or_else(|| {
            Failed::Sink(coded(
                "WALSINK_MARKER",
                &format!("the marker {at} holds {s:?}, not a walsink marker"),
                &what,
            ))
        })?),
    };
    // A marker on this epoch never points past its end, and says it complete only at its
    // end: anything else was written by someone else, and trusting it would skip records.
    if let Some(m) = marker.filter(|m| m.checkpoint == ctx.checkpoint) {
        if m.next > ctx.total || (m.done && m.next != ctx.total) {
            return Err(Failed::Sink(coded(
                "WALSINK_MARKER",
                &format!(
                    "the marker {at} says checkpoint {} is {} at record {}, but the epoch has {} records: it was changed by someone else",
                    m.checkpoint,
                    if m.done { "complete" } else { "applied up to" },
                    m.next,
                    ctx.total
                ),
                &what,
            )));
        }
    }
    Ok(Seen {
        marker,
        kind: text(kind)?.unwrap_or_default(),
        owner,
    })
}

async fn watch_and_read(c: &mut MultiplexedConnection, ctx: &Ctx) -> Result<Seen, Failed> {
    let mut p = redis::pipe();
    p.ignore_errors();
    add_reads(&mut p, ctx);
    let v: Vec<Value> = p
        .query_async(c)
        .await
        .map_err(|e| Failed::Client(e, format!("{}: watch and read the marker", ctx.shown)))?;
    parse_reads(ctx, &v)
}

/// The pipeline of `tx` without its first `skip` records: `MULTI`, the writes, the marker
/// move, `EXEC`, and the reads for the next transaction when `tx.trailing`.
fn build(ctx: &Ctx, tx: &Tx, skip: usize) -> redis::Pipeline {
    let recs = &tx.records[skip..];
    let mut p = redis::pipe();
    p.ignore_errors();
    p.cmd("MULTI");
    match ctx.mode {
        Mode::List => {
            for part in recs.chunks(MAX_VALUES) {
                let cmd = p.cmd("RPUSH").arg(&ctx.data_key);
                for r in part {
                    cmd.arg(&r[..]);
                }
            }
        }
        Mode::Stream => {
            for r in recs {
                p.cmd("XADD")
                    .arg(&ctx.data_key)
                    .arg("*")
                    .arg("record")
                    .arg(&r[..]);
            }
        }
        Mode::Hash => {
            for part in recs.chunks(MAX_VALUES / 2) {
                let cmd = p.cmd("HSET").arg(&ctx.data_key);
                for r in part {
                    let (f, v) = split_hash(r);
                    cmd.arg(f).arg(v);
                }
            }
        }
    }
    let end = tx.end();
    let marker = Marker {
        checkpoint: ctx.checkpoint,
        next: end,
        done: end == ctx.total,
    };
    let eval = p
        .cmd("EVAL")
        .arg(script::MOVE)
        .arg(3)
        .arg(&ctx.data_key)
        .arg(&ctx.marker_key)
        .arg(&ctx.old_key)
        .arg(&ctx.old_field)
        .arg(marker.encode())
        .arg(if marker.done { &ctx.meta[..] } else { &[][..] })
        .arg(ctx.mode.name())
        .arg(recs.len());
    match recs.last() {
        None => {
            eval.arg("").arg("");
        }
        Some(r) if ctx.mode == Mode::Hash => {
            let (f, v) = split_hash(r);
            eval.arg(f).arg(v);
        }
        Some(r) => {
            eval.arg(&r[..]).arg("");
        }
    }
    p.cmd("EXEC");
    if tx.trailing {
        add_reads(&mut p, ctx);
    }
    p
}

fn split_hash(r: &[u8]) -> (&[u8], &[u8]) {
    let tab = r.iter().position(|b| *b == b'\t').unwrap_or(r.len());
    (&r[..tab], r.get(tab + 1..).unwrap_or(&[]))
}

/// How many write commands [`build`] queues for `n` records.
fn writes(mode: Mode, n: usize) -> usize {
    match mode {
        Mode::List => n.div_ceil(MAX_VALUES),
        Mode::Stream => n,
        Mode::Hash => n.div_ceil(MAX_VALUES / 2),
    }
}

/// What the marker says about `tx`.
enum Decision {
    /// The epoch is complete in the target.
    Covered,
    /// The marker is past `tx`: nothing of it to send.
    Ahead,
    /// Send `tx` without its first `n` records.
    Skip(usize),
}

fn decide(ctx: &Ctx, tx: &Tx, seen: &Seen) -> Result<Decision, Failed> {
    let cp = ctx.checkpoint;
    let gap = |why: String| {
        Failed::Sink(coded(
            "WALSINK_GAP",
            &format!(
                "checkpoint {cp}: transaction from record {} but {why}",
                tx.first
            ),
            &ctx.shown,
        ))
    };
    let skip = match seen.marker {
        Some(m) if m.covers(cp) => return Ok(Decision::Covered),
        Some(m) if m.checkpoint == cp => {
            if tx.first > m.next {
                return Err(gap(format!("the marker is at record {}", m.next)));
            }
            m.next - tx.first
        }
        Some(_) if tx.first > 0 => return Err(gap("the epoch was never started".into())),
        None if tx.first > 0 => return Err(gap("there is no marker".into())),
        _ => 0,
    };
    let n = tx.records.len() as u64;
    let ends_epoch = tx.end() == ctx.total;
    if skip > n || (skip == n && !ends_epoch) {
        return Ok(Decision::Ahead);
    }
    Ok(Decision::Skip(skip as usize))
}

/// Runs one transaction until `EXEC` applies it (or the marker shows it applied), going
/// back to `WATCH` after each abort.
async fn run(
    mut c: MultiplexedConnection,
    ctx: Arc<Ctx>,
    tx: Tx,
    built: redis::Pipeline,
    mut seen: Seen,
) -> Result<Done, Failed> {
    let mut done = Done::default();
    let mut built = Some(built);
    let mut attempt = 0u32;
    loop {
        let skip = match decide(&ctx, &tx, &seen) {
            Ok(Decision::Covered) => {
                unwatch(&mut c).await;
                done.covered = true;
                return Ok(done);
            }
            Ok(Decision::Ahead) => {
                done.skipped += tx.chunk_ends.len() as u64;
                // Still watched and still true: the next transaction starts from it.
                done.seen = tx.trailing.then_some(seen);
                return Ok(done);
            }
            Ok(Decision::Skip(s)) => s,
            Err(e) => {
                unwatch(&mut c).await;
                return Err(e);
            }
        };
        if let Some(claim) = &ctx.claim {
            // Read under the same WATCH as the marker: a claim that changes the owner after
            // this check aborts the EXEC below.
            if let Err(fenced) = claim.check(seen.owner.as_ref().map(|(o, g)| (o.as_str(), *g))) {
                unwatch(&mut c).await;
                return Err(Failed::Sink(fenced));
            }
        }
        let n = tx.records.len() - skip;
        if n > 0 && !kind_fits(&seen.kind, ctx.mode) {
            unwatch(&mut c).await;
            return Err(Failed::Sink(wrong_type(&ctx, &seen.kind)));
        }
        let p = match built.take() {
            Some(p) if skip == 0 => p,
            _ => build(&ctx, &tx, skip),
        };
        if let Some(h) = &ctx.hook {
            h(HookPoint {
                checkpoint: ctx.checkpoint,
                first: tx.first + skip as u64,
                count: n as u64,
                attempt,
            });
        }
        let shown = || {
            format!(
                "{}: records {}..{}",
                ctx.shown,
                tx.first + skip as u64,
                tx.end()
            )
        };
        let v: Vec<Value> = p
            .query_async(&mut c)
            .await
            .map_err(|e| Failed::Client(e, shown()))?;
        let w = writes(ctx.mode, n);
        // MULTI, w writes, EVAL, EXEC, then the reads.
        if v.len() != w + 3 + if tx.trailing { READS } else { 0 } {
            return Err(Failed::Sink(SinkError::permanent(format!(
                "{}: {} replies to a transaction of {w} writes",
                shown(),
                v.len()
            ))));
        }
        let after = if tx.trailing {
            Some(parse_reads(&ctx, &v[w + 3..]))
        } else {
            None
        };
        match &v[w + 2] {
            Value::Nil => {
                // The marker key changed after WATCH: read again (the trailing reads did,
                // under a new WATCH) and resend what the marker does not show applied.
                done.aborts += 1;
                attempt += 1;
                if attempt > MAX_ABORTS {
                    unwatch(&mut c).await;
                    return Err(Failed::Sink(SinkError::retryable(format!(
                        "{}: {attempt} transactions in a row aborted by changes of {}: is another walsink writing with the same sink id and subtask?",
                        shown(),
                        ctx.marker_key
                    ))));
                }
                seen = match after {
                    Some(r) => r?,
                    None => watch_and_read(&mut c, &ctx).await?,
                };
                continue;
            }
            Value::Array(results) if results.len() == w + 1 => {
                let write_err = results[..w].iter().find_map(|r| match r {
                    Value::ServerError(e) => Some(e),
                    _ => None,
                });
                match (&results[w], write_err) {
                    (Value::Int(1), None) => {}
                    (Value::Int(1), Some(e)) => {
                        return Err(Failed::Poison(format!(
                            "{}: the marker moved to record {} but a write failed ({} {}): records may be missing from {}",
                            shown(),
                            tx.end(),
                            e.code(),
                            e.details().unwrap_or(""),
                            ctx.data_key
                        )))
                    }
                    (Value::ServerError(e), Some(_)) => {
                        unwatch(&mut c).await;
                        return Err(Failed::Sink(classify_server(e, &shown())));
                    }
                    (Value::ServerError(e), None) if n > 0 => {
                        return Err(Failed::Poison(format!(
                            "{}: the records were written to {} but the marker did not move ({} {}): a retry would write them again",
                            shown(),
                            ctx.data_key,
                            e.code(),
                            e.details().unwrap_or("")
                        )))
                    }
                    (Value::ServerError(e), None) => {
                        unwatch(&mut c).await;
                        return Err(Failed::Sink(classify_server(e, &shown())));
                    }
                    (other, _) => {
                        return Err(Failed::Sink(SinkError::permanent(format!(
                            "{}: unexpected reply to the marker move: {other:?}",
                            shown()
                        ))))
                    }
                }
                // Chunks the marker showed applied before this attempt (none of a
                // transaction without records, which only completes the epoch).
                let skipped = if tx.records.is_empty() {
                    0
                } else {
                    tx.chunk_ends.iter().filter(|e| **e <= skip).count() as u64
                };
                done.skipped += skipped;
                done.applied += tx.chunk_ends.len() as u64 - skipped;
                done.transactions += 1;
                done.seen = after.transpose()?;
                return Ok(done);
            }
            Value::ServerError(e) => {
                // EXECABORT: a command was refused when queued (OOM, NOPERM, …) and nothing
                // ran; the refusal says why.
                let first = v[..w + 2].iter().find_map(|r| match r {
                    Value::ServerError(e) => Some(e),
                    _ => None,
                });
                unwatch(&mut c).await;
                return Err(Failed::Sink(classify_server(first.unwrap_or(e), &shown())));
            }
            other => {
                return Err(Failed::Sink(SinkError::permanent(format!(
                    "{}: unexpected reply to EXEC: {other:?}",
                    shown()
                ))))
            }
        }
    }
}

impl AsyncSink for RedisSink {
    /// # Cancel safety
    /// Dropping the future leaves at most one transaction in flight on its own task; the
    /// connection it may still use is dropped before the next call, and the marker says
    /// where the next delivery of the epoch resumes (nothing is applied twice).
    async fn deliver(&mut self, epoch: &Epoch) -> Result<(), SinkError> {
        self.deliver_epoch(epoch).await
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
