//! [`PgSink`]: the [`AsyncSink`] that delivers epochs into a PostgreSQL table, exactly-once.

use crate::config::{Config, Mode, SslMode, DEFAULT_CONNECT_TIMEOUT};
use crate::error::{sink_error, Class};
use crate::failpoint;
use crate::mapping::{self, RawRows, RowMapping};
use crate::marker::{is_creation_race, Marker};
use crate::owner::OwnerTable;
use crate::table::quote_literal;
use bytes::{Bytes, BytesMut};
use futures_util::SinkExt;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio_postgres::types::Type;
use walsink::{Claim, Epoch, EpochKey, Owner, SinkError};
use walsink_tokio::{AsyncChunks, AsyncSink};

/// What this sink's prepared transactions look like on the server (two-phase-commit mode),
/// as of the last check. A prepared transaction holds its locks and keeps `VACUUM` from
/// cleaning up behind it until it is committed or rolled back, so an old one needs attention.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PreparedStatus {
    /// Prepared transactions of this sink id and subtask.
    pub count: u64,
    /// Age of the oldest.
    pub oldest_age: Option<Duration>,
    /// True when the oldest is older than the configured limit (`prepared_warn_after`).
    pub over_limit: bool,
}

/// A shared view of the [`PreparedStatus`], readable while the sink is owned by a committer.
#[derive(Debug, Clone, Default)]
pub struct PreparedStatusHandle(Arc<Mutex<PreparedStatus>>);

impl PreparedStatusHandle {
    /// The status as of the sink's last check (every two-phase delivery checks).
    pub fn get(&self) -> PreparedStatus {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    fn set(&self, s: PreparedStatus) {
        *self.0.lock().unwrap_or_else(|p| p.into_inner()) = s;
    }
}

/// One prepared transaction of this sink found on the server.
#[derive(Debug, Clone, PartialEq)]
pub struct PreparedXact {
    /// Its global id (`walsink:{sink_id}:{subtask}:{checkpoint}:{fingerprint}`).
    pub gid: String,
    /// The checkpoint it holds.
    pub checkpoint: u64,
    /// The fingerprint of the epoch it holds (metadata, record count, bytes).
    pub fingerprint: u64,
    /// How long ago it was prepared.
    pub age: Duration,
}

/// The global id prefix of the prepared transactions of `(sink_id, subtask)`.
pub fn gid_prefix(sink_id: &str, subtask: u32) -> String {
    format!("walsink:{sink_id}:{subtask}:")
}

/// The global id of the prepared transaction holding epoch `key` with fingerprint `fp`:
/// deterministic, so a restarted sink finds it again. The fingerprint tells a prepared
/// transaction of this very epoch from one of an earlier epoch that had the same checkpoint
/// id (a log that lost its checkpoints and numbered new ones the same way).
pub fn gid(key: &EpochKey, fp: u64) -> String {
    format!(
        "{}{}:{fp:016x}",
        gid_prefix(&key.sink_id, key.subtask),
        key.checkpoint
    )
}

/// The fingerprint of an epoch: xxh3 of its metadata, record count and byte count.
pub fn fingerprint(epoch: &Epoch) -> u64 {
    let mut h = xxhash_rust::xxh3::Xxh3::new();
    h.update(epoch.metadata());
    h.update(&epoch.len().to_le_bytes());
    h.update(&epoch.bytes().to_le_bytes());
    h.digest()
}

fn parse_gid(prefix: &str, gid: &str) -> Option<(u64, u64)> {
    let (cp, fp) = gid.strip_prefix(prefix)?.split_once(':')?;
    Some((cp.parse().ok()?, u64::from_str_radix(fp, 16).ok()?))
}

struct Conn {
    client: tokio_postgres::Client,
    /// The target's columns and their types as the server reports them.
    columns: Vec<(String, Type)>,
    copy_sql: String,
}

/// Delivers epochs into a PostgreSQL table, exactly-once; see the crate documentation.
///
/// The sink connects on first use (or with [`PgSink::connect`]), creates the tables if asked
/// to, and replaces its connection after any failure (the server rolls back whatever the
/// old one had open). It must run inside a tokio runtime with I/O and timers enabled.
pub struct PgSink {
    config: Config,
    mapping: Arc<dyn RowMapping>,
    conn: Option<Conn>,
    status: PreparedStatusHandle,
    /// The shard this sink claimed ([`PgSink::claim`]); every epoch's transaction checks it.
    claim: Option<Claim>,
}

impl std::fmt::Debug for PgSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgSink")
            .field("config", &self.config)
            .field("connected", &self.conn.is_some())
            .finish()
    }
}

/// The result of a delivery step that may find the epoch already in the target.
enum Outcome {
    Written,
    AlreadyThere,
    /// The marker write waited `lock_timeout` behind another transaction holding the epoch's
    /// marker and gave up; the transaction was rolled back. The error says so (retryable).
    MarkerLocked(SinkError),
}

impl PgSink {
    /// A sink for `config` with the default [`RawRows`] mapping. Does not connect yet.
    pub fn new(config: Config) -> PgSink {
        PgSink {
            config,
            mapping: Arc::new(RawRows),
            conn: None,
            status: PreparedStatusHandle::default(),
            claim: None,
        }
    }

    /// Uses `mapping` to turn records into rows.
    pub fn with_mapping(mut self, mapping: impl RowMapping) -> PgSink {
        self.mapping = Arc::new(mapping);
        self.conn = None;
        self
    }

    /// The configuration.
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// A handle on the status of this sink's prepared transactions (two-phase mode), for
    /// health reporting while a committer owns the sink.
    pub fn prepared_status(&self) -> PreparedStatusHandle {
        self.status.clone()
    }

    /// Connects (if not connected), creates the marker table and the target table if
    /// `create` is set and they are missing, and reads the target's column types.
    ///
    /// # Cancel safety
    /// Cancel safe: a connection half set up is dropped and made again on the next call.
    pub async fn connect(&mut self) -> Result<(), SinkError> {
        if self.conn.as_ref().is_some_and(|c| !c.client.is_closed()) {
            return Ok(());
        }
        self.conn = None;
        let client = self.plain_connect().await?;
        let table = &self.config.table;
        let marker = &self.config.marker_table;
        let exists = |name: String| {
            let client = &client;
            async move {
                let row = client
                    .query_one("SELECT to_regclass($1) IS NOT NULL", &[&name])
                    .await?;
                Ok::<bool, tokio_postgres::Error>(row.get(0))
            }
        };
        if self.config.create {
            // Look before creating: CREATE ... IF NOT EXISTS needs the CREATE privilege on
            // the schema even when the table is there.
            if !exists(marker.name().to_string())
                .await
                .map_err(|e| sink_error("look up the marker table", e))?
            {
                marker.create(&client).await.map_err(|e| {
                    sink_error(
                        &format!("create the marker table {}", marker.name().plain()),
                        e,
                    )
                })?;
            }
            let owners = OwnerTable::beside(marker.name());
            if !exists(owners.name().to_string())
                .await
                .map_err(|e| sink_error("look up the owners table", e))?
            {
                owners.create(&client).await.map_err(|e| {
                    sink_error(
                        &format!("create the owners table {}", owners.name().plain()),
                        e,
                    )
                })?;
            }
            if let Some(ddl) = self.mapping.create_table(table) {
                if !exists(table.to_string())
                    .await
                    .map_err(|e| sink_error("look up the target table", e))?
                {
                    match client.batch_execute(&ddl).await {
                        Ok(()) => {}
                        // Another session created it at the same moment (two sinks starting
                        // together): IF NOT EXISTS does not cover a creation still under way,
                        // so the loser fails on the catalog's unique index. Look again.
                        Err(e)
                            if is_creation_race(&e)
                                && exists(table.to_string()).await.unwrap_or(false) => {}
                        Err(e) => {
                            return Err(sink_error(
                                &format!("create the table {}", table.plain()),
                                e,
                            ))
                        }
                    }
                }
            }
        }
        let names = self.mapping.columns();
        let list = mapping::column_list(&names);
        let stmt = client
            .prepare(&format!("SELECT {list} FROM {table}"))
            .await
            .map_err(|e| sink_error(&format!("read the columns of {}", table.plain()), e))?;
        let columns = names
            .into_iter()
            .zip(stmt.columns().iter().map(|c| c.type_().clone()))
            .collect();
        let copy_sql = format!("COPY {table} ({list}) FROM STDIN (FORMAT binary)");
        self.conn = Some(Conn {
            client,
            columns,
            copy_sql,
        });
        Ok(())
    }

    /// A connection without any set-up of the tables (its task runs on the current
    /// runtime), with the session's `lock_timeout` and `idle_in_transaction_session_timeout`
    /// set from the configuration.
    ///
    /// The whole set-up is bounded by `connect_timeout` (default
    /// [`DEFAULT_CONNECT_TIMEOUT`]): the client library bounds only the TCP connect by it, so
    /// a server that accepts and never answers (stopped, or a proxy in front of a dead one)
    /// would otherwise hold the call for ever.
    async fn plain_connect(&self) -> Result<tokio_postgres::Client, SinkError> {
        let limit = self
            .config
            .pg
            .get_connect_timeout()
            .copied()
            .unwrap_or(DEFAULT_CONNECT_TIMEOUT);
        match tokio::time::timeout(limit, self.plain_connect_unbounded()).await {
            Ok(r) => r,
            Err(_) => Err(SinkError::retryable(format!(
                "connect to {}: no answer from the server within {limit:?} (connect_timeout)",
                self.config
            ))),
        }
    }

    async fn plain_connect_unbounded(&self) -> Result<tokio_postgres::Client, SinkError> {
        let shown = self.config.to_string();
        // libpq never asks for TLS over a Unix-domain socket (the server would refuse it),
        // whatever sslmode says.
        #[cfg(unix)]
        let local = {
            let hosts = self.config.pg.get_hosts();
            !hosts.is_empty()
                && self.config.pg.get_hostaddrs().is_empty()
                && hosts
                    .iter()
                    .all(|h| matches!(h, tokio_postgres::config::Host::Unix(_)))
        };
        #[cfg(not(unix))]
        let local = false;
        let mode = if local {
            SslMode::Disable
        } else {
            self.config.sslmode
        };
        let tls = match mode {
            SslMode::Disable => None,
            _ => Some(self.tls().map_err(|e| {
                SinkError::permanent(format!("connect to {shown}: {e} (TLS settings; fix the file or the sslrootcert, sslcert, sslkey parameters)"))
            })?),
        };
        let client = match self.open(mode, tls).await {
            Ok(c) => c,
            // libpq: with sslmode=prefer a failed handshake is tried again without TLS.
            Err(e) if mode == SslMode::Prefer && walsink_kit::tls::failure(&e).is_some() => {
                tracing::warn!(
                    "TLS to {shown} failed ({}): connecting without TLS, as sslmode=prefer allows; use sslmode=verify-full to refuse an unverified server",
                    walsink_kit::tls::failure(&e).expect("matched above")
                );
                self.open(SslMode::Disable, None)
                    .await
                    .map_err(|e| sink_error(&format!("connect to {shown}"), e))?
            }
            Err(e) => return Err(sink_error(&format!("connect to {shown}"), e)),
        };
        // Bounds on waiting behind, and on being, a transaction whose client is gone (see
        // docs/targets/postgres.md, "Transactions of a connection that is gone").
        client
            .batch_execute(&format!(
                "SET lock_timeout = {}; SET idle_in_transaction_session_timeout = {}",
                self.config.lock_timeout.as_millis(),
                self.config.idle_in_transaction_timeout.as_millis()
            ))
            .await
            .map_err(|e| {
                sink_error(
                    "set lock_timeout and idle_in_transaction_session_timeout",
                    e,
                )
            })?;
        Ok(client)
    }

    /// A connection with TLS as `mode` says, its task spawned on the current runtime.
    async fn open(
        &self,
        mode: SslMode,
        tls: Option<rustls::ClientConfig>,
    ) -> Result<tokio_postgres::Client, tokio_postgres::Error> {
        fn run<S, T>(connection: tokio_postgres::Connection<S, T>)
        where
            S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
            T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
        {
            tokio::spawn(async move {
                if let Err(e) = connection.await {
                    tracing::debug!(error = %e, "PostgreSQL connection ended");
                }
            });
        }
        let mut pg = self.config.pg.clone();
        pg.ssl_mode(mode.wire());
        match tls {
            Some(tls) if mode != SslMode::Disable => {
                let (client, connection) = pg.connect(crate::tls::RustlsConnect::new(tls)).await?;
                run(connection);
                Ok(client)
            }
            _ => {
                pg.ssl_mode(tokio_postgres::config::SslMode::Disable);
                let (client, connection) = pg.connect(tokio_postgres::NoTls).await?;
                run(connection);
                Ok(client)
            }
        }
    }

    /// The rustls settings of the configuration, read again for each connection (so that a
    /// renewed certificate is taken without a restart).
    fn tls(&self) -> Result<rustls::ClientConfig, walsink_kit::ConfigError> {
        let mut cfg = self.config.tls.client_config("postgres")?;
        // PostgreSQL 17's ALPN name (needed by sslnegotiation=direct, harmless otherwise).
        cfg.alpn_protocols = vec![b"postgresql".to_vec()];
        Ok(cfg)
    }

    /// Runs a read on the sink's connection, or on a plain one when the sink is not set up
    /// (so reading what the target holds creates nothing).
    async fn read<T>(
        &mut self,
        what: &str,
        f: impl AsyncFnOnce(&tokio_postgres::Client) -> Result<T, tokio_postgres::Error>,
    ) -> Result<T, SinkError> {
        let owned;
        let client = match self.conn.as_ref().filter(|c| !c.client.is_closed()) {
            Some(c) => &c.client,
            None => {
                owned = self.plain_connect().await?;
                &owned
            }
        };
        match f(client).await {
            Ok(v) => Ok(v),
            Err(e) => {
                self.conn = None;
                Err(sink_error(what, e))
            }
        }
    }

    async fn client(&mut self) -> Result<&mut Conn, SinkError> {
        self.connect().await?;
        Ok(self.conn.as_mut().expect("connected above"))
    }

    /// Claims the shard `(sink_id, subtask)` for `owner` in the owners table beside the
    /// marker table ([`crate::owner`]) and keeps the claim: from then on every epoch's
    /// transaction first checks that the table still holds it, and writes nothing (a
    /// [`SinkError::fenced`](walsink::SinkError::fenced) error) when another log took the
    /// shard over or this log claimed it again elsewhere. A sink that never claims does not
    /// look at owners.
    ///
    /// In two-phase mode the shard's prepared transactions are rolled back first: a prepared
    /// transaction holds the owner row's lock, and none of them is in the target yet (the
    /// marker inside counts only once committed), so their epochs are written again by
    /// whoever delivers them.
    ///
    /// # Errors
    /// [`SinkError::fenced`](walsink::SinkError::fenced) when another log owns the shard and
    /// `owner` does not take it over; the classified server error otherwise (a missing owners
    /// table with `create=false` is permanent, 42P01).
    ///
    /// # Cancel safety
    /// If dropped, the claim may or may not be committed; claim again (a claim of the same
    /// owner is always granted, one generation higher).
    pub async fn claim(
        &mut self,
        sink_id: &str,
        subtask: u32,
        owner: &Owner,
    ) -> Result<Claim, SinkError> {
        self.claim = None;
        let owners = OwnerTable::beside(self.config.marker_table.name());
        let mut attempt = 0u32;
        loop {
            attempt += 1;
            if self.config.mode == Mode::TwoPhase {
                let found = self.check_prepared(sink_id, subtask).await?;
                for p in &found {
                    tracing::warn!(gid = %p.gid, "rolling back a prepared transaction before claiming its shard");
                    self.finish_prepared(&p.gid, false).await?;
                }
            }
            let c = self.client().await?;
            let r = owners.claim_once(&c.client, sink_id, subtask, owner).await;
            match r {
                Ok(Ok(Some(claim))) => {
                    tracing::info!(sink_id, subtask, owner = %claim.owner, generation = claim.generation, "claimed the shard");
                    self.claim = Some(claim.clone());
                    return Ok(claim);
                }
                Ok(Err(refused)) => return Err(refused),
                // Another claim inserted the first record meanwhile: read it now.
                Ok(Ok(None)) if attempt < 10 => {}
                // A lock held by a transaction of the old owner (an epoch being written, or
                // one prepared since we looked): claim again.
                Err(e)
                    if attempt < 10
                        && e.code().is_some_and(|s| {
                            matches!(s.code(), "55P03" | "40001" | "40P01" | "23505")
                        }) =>
                {
                    self.conn = None;
                }
                Ok(Ok(None)) => {
                    return Err(SinkError::retryable(format!(
                    "claim shard {sink_id}/{subtask} in {}: other claims kept getting in the way",
                    owners.name().plain()
                )))
                }
                Err(e) => {
                    self.conn = None;
                    return Err(sink_error(
                        &format!(
                            "claim shard {sink_id}/{subtask} in {}",
                            owners.name().plain()
                        ),
                        e,
                    ));
                }
            }
        }
    }

    /// The claim this sink holds, if it claimed one ([`PgSink::claim`]).
    pub fn claimed(&self) -> Option<&Claim> {
        self.claim.as_ref()
    }

    /// The epochs the target holds for `(sink_id, subtask)`, oldest first, with their
    /// checkpoint metadata (from the marker table; empty when it does not exist yet).
    ///
    /// # Cancel safety
    /// Cancel safe: it only reads; call it again.
    pub async fn committed(
        &mut self,
        sink_id: &str,
        subtask: u32,
    ) -> Result<Vec<Marker>, SinkError> {
        let marker = self.config.marker_table.clone();
        self.read("read the marker table", async |c| {
            match marker.committed(c, sink_id, subtask).await {
                Err(e) if e.code().is_some_and(|s| s.code() == "42P01") => Ok(Vec::new()),
                r => r,
            }
        })
        .await
    }

    /// The prepared transactions of `(sink_id, subtask)` on the server, oldest first, and
    /// the status they make (also stored for [`PgSink::prepared_status`]; a warning is
    /// logged when the oldest is past `prepared_warn_after`).
    ///
    /// # Cancel safety
    /// Cancel safe: it only reads; call it again.
    pub async fn check_prepared(
        &mut self,
        sink_id: &str,
        subtask: u32,
    ) -> Result<Vec<PreparedXact>, SinkError> {
        let prefix = gid_prefix(sink_id, subtask);
        let limit = self.config.prepared_warn_after;
        let rows = self
            .read("list prepared transactions", async |c| {
                c.query(
                    "SELECT gid, extract(epoch FROM now() - prepared)::float8 FROM pg_prepared_xacts \
                     WHERE database = current_database() AND left(gid, length($1)) = $1 ORDER BY prepared",
                    &[&prefix],
                )
                .await
            })
            .await?;
        let found: Vec<PreparedXact> = rows
            .iter()
            .filter_map(|r| {
                let gid: String = r.get(0);
                let age = Duration::from_secs_f64(r.get::<_, f64>(1).max(0.0));
                let (checkpoint, fingerprint) = parse_gid(&prefix, &gid)?;
                Some(PreparedXact {
                    gid,
                    checkpoint,
                    fingerprint,
                    age,
                })
            })
            .collect();
        let oldest = found.iter().map(|p| p.age).max();
        let over = oldest.is_some_and(|a| a > limit);
        if over {
            let p = found.iter().max_by_key(|p| p.age).expect("an oldest one");
            tracing::warn!(
                gid = %p.gid,
                age_s = p.age.as_secs(),
                limit_s = limit.as_secs(),
                "a prepared transaction of this sink is older than prepared_warn_after: it holds locks and holds back VACUUM until walsink delivers again (or an operator commits or rolls it back)"
            );
        }
        self.status.set(PreparedStatus {
            count: found.len() as u64,
            oldest_age: oldest,
            over_limit: over,
        });
        Ok(found)
    }

    /// Rolls back the prepared transactions of `(sink_id, subtask)` whose checkpoint
    /// `keep` rejects: those of epochs voided by a restore. Call it after opening the log
    /// (`keep`: the checkpoint is in the recovery report's `pending`) and after
    /// `WalSink::restore`; the prepared transaction of a pending epoch is committed by the
    /// epoch's delivery without writing its rows again. Returns the global ids rolled back.
    ///
    /// # Cancel safety
    /// If dropped, some voided prepared transactions may already be rolled back (each rollback
    /// is atomic); call it again to finish.
    pub async fn roll_back_voided(
        &mut self,
        sink_id: &str,
        subtask: u32,
        keep: impl Fn(u64) -> bool,
    ) -> Result<Vec<String>, SinkError> {
        let found = self.check_prepared(sink_id, subtask).await?;
        let mut gone = Vec::new();
        for p in found.into_iter().filter(|p| !keep(p.checkpoint)) {
            tracing::warn!(gid = %p.gid, "rolling back the prepared transaction of a voided epoch");
            self.finish_prepared(&p.gid, false).await?;
            gone.push(p.gid);
        }
        self.check_prepared(sink_id, subtask).await?;
        Ok(gone)
    }

    /// `COMMIT PREPARED` (or `ROLLBACK PREPARED`) `gid`. A transaction that is no longer
    /// prepared is reported as `Ok(false)`.
    async fn finish_prepared(&mut self, gid: &str, commit: bool) -> Result<bool, SinkError> {
        let verb = if commit { "COMMIT" } else { "ROLLBACK" };
        let c = self.client().await?;
        match c
            .client
            .batch_execute(&format!("{verb} PREPARED {}", quote_literal(gid)))
            .await
        {
            Ok(()) => Ok(true),
            Err(e) if e.code().is_some_and(|s| s.code() == "42704") => Ok(false),
            Err(e) => {
                self.conn = None;
                Err(sink_error(&format!("{verb} PREPARED '{gid}'"), e))
            }
        }
    }

    /// Before a two-phase delivery: resolves the prepared transactions of this sink. The one
    /// holding this very epoch is committed (`true`: the epoch is in); any other is rolled
    /// back, since the committer has moved on from it (its epoch was voided by a restore, or
    /// was an earlier epoch under the same checkpoint id). Nothing else can be pending: each
    /// delivery commits its prepared transaction before it returns.
    async fn resolve_prepared(&mut self, key: &EpochKey, fp: u64) -> Result<bool, SinkError> {
        let found = self.check_prepared(&key.sink_id, key.subtask).await?;
        let mut committed = false;
        for p in found {
            if p.checkpoint == key.checkpoint && p.fingerprint == fp {
                tracing::info!(gid = %p.gid, "committing the prepared transaction of the epoch being delivered");
                committed = self.finish_prepared(&p.gid, true).await? || committed;
            } else {
                let why = if p.checkpoint < key.checkpoint {
                    "its epoch was voided (a restore) or superseded"
                } else if p.checkpoint == key.checkpoint {
                    "it holds another epoch under the same checkpoint id"
                } else {
                    "its checkpoint is ahead of the log's (the log was lost or replaced)"
                };
                tracing::warn!(gid = %p.gid, delivering = key.checkpoint, "rolling back a prepared transaction: {why}");
                self.finish_prepared(&p.gid, false).await?;
            }
        }
        if committed {
            self.status.set(PreparedStatus::default());
        }
        Ok(committed)
    }

    /// Writes the epoch in one transaction: the marker first (it finds an epoch already
    /// committed), the rows by COPY, then COMMIT, or PREPARE TRANSACTION and COMMIT PREPARED.
    async fn write_epoch(&mut self, epoch: &Epoch, fp: u64) -> Result<Outcome, SinkError> {
        let key = epoch.key().clone();
        let mode = self.config.mode;
        let marker = self.config.marker_table.clone();
        let mapping = self.mapping.clone();
        let cap = self.config.copy_buffer.max(4096);
        let table = self.config.table.plain();
        let lock_timeout = self.config.lock_timeout;
        let claim = self.claim.clone();
        let c = self.client().await?;
        let client = &c.client;
        client
            .batch_execute("BEGIN")
            .await
            .map_err(|e| sink_error("BEGIN", e))?;
        if let Some(claim) = &claim {
            let owners = OwnerTable::beside(marker.name());
            let found = owners.check(client, claim).await.map_err(|e| {
                sink_error(&format!("read the owner in {}", owners.name().plain()), e)
            })?;
            if let Err(fenced) = claim.check(found.as_ref().map(|(o, g)| (o.as_str(), *g))) {
                client
                    .batch_execute("ROLLBACK")
                    .await
                    .map_err(|e| sink_error("ROLLBACK", e))?;
                return Err(fenced);
            }
        }
        let fresh = match marker
            .write(client, &key, epoch.metadata(), epoch.len())
            .await
        {
            Ok(fresh) => fresh,
            Err(e) if e.code().is_some_and(|s| s.code() == "55P03") => {
                // Another transaction holds this epoch's marker: an earlier connection of this
                // sink whose COMMIT or PREPARE TRANSACTION is still on its way (or that
                // prepared since we looked), or a second writer. Waiting on could be for ever
                // (a prepared transaction is never resolved but by us), so give up here.
                let what = format!(
                    "write the marker of checkpoint {} into {} (waited lock_timeout={:?} behind another transaction holding it: an earlier connection of sink {:?} whose COMMIT or PREPARE TRANSACTION is still on its way, or a second writer under the same sink id; retried)",
                    key.checkpoint,
                    marker.name().plain(),
                    lock_timeout,
                    key.sink_id,
                );
                client
                    .batch_execute("ROLLBACK")
                    .await
                    .map_err(|e| sink_error("ROLLBACK", e))?;
                return Ok(Outcome::MarkerLocked(sink_error(&what, e)));
            }
            Err(e) => {
                return Err(sink_error(
                    &format!("write the marker into {}", marker.name().plain()),
                    e,
                ))
            }
        };
        if !fresh {
            client
                .batch_execute("ROLLBACK")
                .await
                .map_err(|e| sink_error("ROLLBACK", e))?;
            return Ok(Outcome::AlreadyThere);
        }
        if !epoch.is_empty() {
            let copy = client
                .copy_in::<_, Bytes>(&c.copy_sql)
                .await
                .map_err(|e| copy_error(&table, e, epoch, &c.columns))?;
            futures_util::pin_mut!(copy);
            let mut buf = BytesMut::with_capacity(cap + (64 << 10));
            mapping::copy_header(&mut buf);
            let mut chunks = AsyncChunks::new(epoch);
            while let Some(chunk) = chunks.next().await {
                let chunk = chunk.map_err(|e| {
                    SinkError::retryable(format!(
                        "read checkpoint {} from the log: {e}",
                        key.checkpoint
                    ))
                })?;
                for r in chunk.records() {
                    mapping::encode_row(&*mapping, &c.columns, &key, &r, &mut buf).map_err(
                        |e| {
                            // Permanent, not a rejection of the record: a mapping error
                            // is as often the table's (a column of a type the mapping
                            // cannot fill, which every record would meet) as the record's.
                            SinkError::permanent(format!(
                                "map record {} of checkpoint {} to a row of {table}: {e}",
                                r.position.index, key.checkpoint
                            ))
                        },
                    )?;
                    if buf.len() >= cap {
                        let full =
                            std::mem::replace(&mut buf, BytesMut::with_capacity(cap + (64 << 10)));
                        copy.send(full.freeze())
                            .await
                            .map_err(|e| copy_error(&table, e, epoch, &c.columns))?;
                    }
                }
            }
            mapping::copy_trailer(&mut buf);
            copy.send(buf.freeze())
                .await
                .map_err(|e| copy_error(&table, e, epoch, &c.columns))?;
            let n = copy
                .as_mut()
                .finish()
                .await
                .map_err(|e| copy_error(&table, e, epoch, &c.columns))?;
            if n != epoch.len() {
                return Err(SinkError::permanent(format!(
                    "COPY into {table} took {n} rows of checkpoint {}'s {} records (a rule or trigger on the table?)",
                    key.checkpoint,
                    epoch.len()
                )));
            }
        }
        failpoint::hit("after-copy");
        match mode {
            Mode::Marker => {
                client
                    .batch_execute("COMMIT")
                    .await
                    .map_err(|e| sink_error("COMMIT", e))?;
            }
            Mode::TwoPhase => {
                let g = gid(&key, fp);
                client
                    .batch_execute(&format!("PREPARE TRANSACTION {}", quote_literal(&g)))
                    .await
                    .map_err(|e| sink_error(&format!("PREPARE TRANSACTION '{g}'"), e))?;
                failpoint::hit("after-prepare");
                self.commit_prepared(&key, &g).await?;
            }
        }
        failpoint::hit("after-commit");
        Ok(Outcome::Written)
    }

    /// `COMMIT PREPARED gid`, made certain: after a lost connection or a transaction no
    /// longer prepared, the marker says whether the epoch is in (success) or not (an error;
    /// the epoch is written again on retry).
    async fn commit_prepared(&mut self, key: &EpochKey, g: &str) -> Result<(), SinkError> {
        let first = self.finish_prepared(g, true).await;
        if let Ok(true) = first {
            self.status.set(PreparedStatus::default());
            return Ok(());
        }
        // Not prepared any more, or the outcome is unknown: ask the target on a sound
        // connection.
        self.conn = None;
        let marker = self.config.marker_table.clone();
        let c = self.client().await?;
        let there = marker
            .is_committed(&c.client, key)
            .await
            .map_err(|e| sink_error("read the marker after COMMIT PREPARED", e))?;
        if there {
            return Ok(());
        }
        if self.finish_prepared(g, true).await? {
            self.status.set(PreparedStatus::default());
            return Ok(());
        }
        Err(first.err().unwrap_or_else(|| {
            SinkError::retryable(format!(
                "the prepared transaction '{g}' is gone without its epoch in the target (rolled back by someone else); checkpoint {} is written again",
                key.checkpoint
            ))
        }))
    }
}

impl AsyncSink for PgSink {
    /// Delivers one epoch in one transaction (see [`PgSink`]).
    ///
    /// No statement waits longer than `lock_timeout` for a lock. When the epoch's marker is
    /// held by another transaction that long (an earlier connection of this sink whose COMMIT
    /// or PREPARE TRANSACTION is still on its way, or a second writer), the delivery rolls
    /// back; in two-phase mode it then looks at the prepared transactions again and commits
    /// the one holding this very epoch (success, nothing written again).
    ///
    /// # Errors
    /// A retryable [`SinkError`] when the marker stayed locked (the next attempt looks
    /// again), and the classified server error of any statement that failed (see
    /// [`classify_sqlstate`](crate::classify_sqlstate)).
    ///
    /// # Cancel safety
    /// Dropped half-way, the transaction is left open on a connection that the next call
    /// replaces, so the server rolls it back; a prepared transaction left behind is
    /// committed by the next delivery of the same epoch.
    async fn deliver(&mut self, epoch: &Epoch) -> Result<(), SinkError> {
        // A connection that was in the middle of something (a cancelled call) is replaced.
        self.conn = self.conn.take().filter(|c| !c.client.is_closed());
        if let Some(claim) = &self.claim {
            claim.check_key(epoch.key())?;
        }
        let fp = fingerprint(epoch);
        let two_phase = self.config.mode == Mode::TwoPhase;
        let r = async {
            if two_phase && self.resolve_prepared(epoch.key(), fp).await? {
                return Ok(Outcome::AlreadyThere);
            }
            match self.write_epoch(epoch, fp).await? {
                // The transaction in the way may have prepared meanwhile (a late PREPARE of an
                // earlier connection): look again, and commit it if it holds this epoch.
                Outcome::MarkerLocked(e) => {
                    if two_phase && self.resolve_prepared(epoch.key(), fp).await? {
                        return Ok(Outcome::AlreadyThere);
                    }
                    Err(e)
                }
                o => Ok(o),
            }
        }
        .await;
        match r {
            Ok(Outcome::Written) => Ok(()),
            Ok(Outcome::MarkerLocked(e)) => Err(e),
            Ok(Outcome::AlreadyThere) => {
                tracing::info!(
                    checkpoint = epoch.checkpoint(),
                    "the epoch is already in the target (its marker is committed); nothing written"
                );
                Ok(())
            }
            Err(e) => {
                // Whatever the connection had open is rolled back by the server when it goes.
                self.conn = None;
                Err(e)
            }
        }
    }

    fn stores_marker(&self) -> bool {
        true
    }

    /// # Cancel safety
    /// Cancel safe (a read).
    async fn is_committed(&mut self, key: &EpochKey) -> Result<bool, SinkError> {
        let marker = self.config.marker_table.clone();
        let c = self.client().await?;
        match marker.is_committed(&c.client, key).await {
            Ok(b) => Ok(b),
            Err(e) => {
                self.conn = None;
                Err(sink_error("read the marker", e))
            }
        }
    }
}

/// The class of a [`SinkError`] in this crate's terms.
pub fn class_of(e: &SinkError) -> Class {
    match e.class() {
        walsink::SinkErrorClass::Permanent | walsink::SinkErrorClass::Fenced => Class::Permanent,
        _ => Class::Retryable,
    }
}

/// A COPY failure as a [`SinkError`]; a data exception or integrity violation (SQLSTATE
/// class 22 or 23) that the server places on a row of the COPY (`COPY t, line N`) is a
/// rejection of that row's record ([`SinkError::at_record`]), so that with a dead-letter log
/// the record goes there and the rest of the epoch is delivered again. The transaction is
/// rolled back either way.
///
/// A NOT NULL violation (23502) of a column the COPY does not write is the table's fault
/// (every row would meet it), not the record's: it stays permanent.
fn copy_error(
    table: &str,
    e: tokio_postgres::Error,
    epoch: &Epoch,
    written: &[(String, Type)],
) -> SinkError {
    let line = e.as_db_error().and_then(|db| {
        let code = db.code().code();
        if !(code.starts_with("22") || code.starts_with("23")) {
            return None;
        }
        if code == "23502"
            && db
                .column()
                .is_some_and(|col| !written.iter().any(|(w, _)| w == col))
        {
            return None;
        }
        copy_line(db.where_()?)
    });
    let err = sink_error(&format!("COPY into {table}"), e);
    let Some(line) = line else {
        return err;
    };
    // Row N of the COPY is the N-th record handed over (records left out do not count).
    let index = line
        .checked_sub(1)
        .and_then(|n| epoch.records().nth(n as usize))
        .and_then(|r| r.ok())
        .map(|r| r.position.index);
    match index {
        Some(i) => {
            let mut r = SinkError::rejected(format!("{} (record {i})", err.message())).at_record(i);
            if let Some(code) = err.code() {
                r = r.with_code(code);
            }
            r
        }
        None => err,
    }
}

/// The row number in a COPY's error context: `COPY t, line 5` or `COPY t, line 5, column c`.
fn copy_line(context: &str) -> Option<u64> {
    let first = context.lines().next()?;
    let rest = first.strip_prefix("COPY ")?;
    let at = rest.rfind(", line ")?;
    let digits: String = rest[at + 7..]
        .chars()
        .take_while(|c| c.is_ascii_digit())
        .collect();
    digits.parse().ok()
}

#[cfg(test)]
mod copy_line_tests {
    use super::copy_line;

    #[test]
    fn the_row_of_a_copy_error_is_read_from_its_context() {
        assert_eq!(copy_line("COPY t, line 5"), Some(5));
        assert_eq!(
            copy_line("COPY \"Odd, line 9\", line 12, column v"),
            Some(12)
        );
        assert_eq!(copy_line("COPY t, line 3, column v: \"abc\""), Some(3));
        assert_eq!(copy_line("SQL statement \"SELECT 1\""), None);
        assert_eq!(copy_line("COPY t"), None);
    }
}
