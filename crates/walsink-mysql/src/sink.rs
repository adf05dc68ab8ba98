//! [`MySqlSink`]: the [`AsyncSink`] that delivers epochs into a MySQL or MariaDB table,
//! exactly-once.

use crate::config::{Bulk, Config, Mode};
use crate::error::{code_of, sink_error};
use crate::failpoint;
use crate::mapping::{self, Encoding, RawRows, RowMapping};
use crate::marker::Marker;
use crate::owner::OwnerTable;
use crate::table::TableName;
use crate::xa::{self, Xid};
use mysql_async::prelude::Queryable;
use mysql_async::Conn;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use walsink::{Claim, Epoch, EpochKey, Owner, SinkError};
use walsink_tokio::{AsyncChunks, AsyncSink};

/// Bytes kept free under `max_allowed_packet` for the command byte and rounding.
const PACKET_MARGIN: usize = 1024;

/// The server's id of the connection a [`MySqlSink`] delivers on (`CONNECTION_ID()`), shared
/// so that an operator or a test can tell the sink's session in `SHOW PROCESSLIST`.
#[derive(Debug, Clone, Default)]
pub struct ConnectionId(Arc<AtomicU32>);

impl ConnectionId {
    /// The id of the sink's current connection; `None` while it has none.
    pub fn get(&self) -> Option<u32> {
        match self.0.load(Ordering::SeqCst) {
            0 => None,
            id => Some(id),
        }
    }

    fn set(&self, id: Option<u32>) {
        self.0.store(id.unwrap_or(0), Ordering::SeqCst);
    }
}

/// One connection, set up for delivery.
struct Session {
    conn: Conn,
    /// `INSERT INTO table (columns) VALUES `.
    insert_head: Vec<u8>,
    /// Columns per row.
    columns: usize,
    /// The largest statement to send: `batch_size`, capped by `max_allowed_packet`.
    statement_limit: usize,
    /// The server's `max_allowed_packet`.
    max_allowed_packet: usize,
    /// Rows go in by `LOAD DATA LOCAL INFILE` (`bulk=load_data` and the server allows it).
    load_data: bool,
    /// `LOAD DATA LOCAL INFILE 'walsink' INTO TABLE table … (columns)`.
    load_sql: String,
}

/// Delivers epochs into a MySQL or MariaDB table, exactly-once; see the crate documentation.
///
/// The sink connects on first use (or with [`MySqlSink::connect`]), creates the tables if
/// asked to, and replaces its connection after any failure (the server rolls back whatever
/// the old one had open, except an XA transaction already prepared, which the next delivery
/// resolves). It must run inside a tokio runtime with I/O and timers enabled.
pub struct MySqlSink {
    config: Config,
    mapping: Arc<dyn RowMapping>,
    session: Option<Session>,
    /// Set while a delivery is under way on `session`: a delivery future dropped half-way
    /// leaves it set, and the next call replaces the connection (and with it the open
    /// transaction) instead of going on inside it.
    busy: bool,
    id: ConnectionId,
    /// The shard this sink claimed ([`MySqlSink::claim`]); every epoch's transaction checks it.
    claim: Option<Claim>,
}

impl std::fmt::Debug for MySqlSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the connection: mysql_async's Debug of a connection shows its options,
        // the password among them.
        f.debug_struct("MySqlSink")
            .field("config", &self.config)
            .field("connection_id", &self.id.get())
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

impl MySqlSink {
    /// A sink for `config` with the default [`RawRows`] mapping. Does not connect yet.
    pub fn new(config: Config) -> MySqlSink {
        MySqlSink {
            config,
            mapping: Arc::new(RawRows),
            session: None,
            busy: false,
            id: ConnectionId::default(),
            claim: None,
        }
    }

    /// Uses `mapping` to turn records into rows.
    pub fn with_mapping(mut self, mapping: impl RowMapping) -> MySqlSink {
        self.mapping = Arc::new(mapping);
        self.drop_session();
        self
    }

    /// The configuration.
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// A handle on the server's id of the sink's connection.
    pub fn connection_id(&self) -> ConnectionId {
        self.id.clone()
    }

    fn drop_session(&mut self) {
        self.session = None;
        self.busy = false;
        self.id.set(None);
    }

    /// Connects (if not connected), creates the marker table and the target table if
    /// `create` is set and they are missing, checks that the marker table is InnoDB and that
    /// the target has the mapping's columns, and reads the server's `max_allowed_packet`.
    ///
    /// # Cancel safety
    /// Cancel safe: a connection half set up is dropped and made again on the next call.
    pub async fn connect(&mut self) -> Result<(), SinkError> {
        if self.session.is_some() {
            return Ok(());
        }
        self.drop_session();
        let mut conn = self.plain_connect().await?;
        let table = self.config.table.clone();
        let marker = self.config.marker_table.clone();
        if self.config.create {
            marker.create(&mut conn).await.map_err(|e| {
                sink_error(
                    &format!("create the marker table {}", marker.name().plain()),
                    e,
                )
            })?;
            let owners = OwnerTable::beside(marker.name());
            owners.create(&mut conn).await.map_err(|e| {
                sink_error(
                    &format!("create the owners table {}", owners.name().plain()),
                    e,
                )
            })?;
            if let Some(ddl) = self.mapping.create_table(&table) {
                conn.query_drop(ddl)
                    .await
                    .map_err(|e| sink_error(&format!("create the table {}", table.plain()), e))?;
            }
        }
        check_engine(&mut conn, marker.name(), "marker table").await?;
        let names = self.mapping.columns();
        let list = mapping::column_list(&names);
        conn.query_drop(format!("SELECT {list} FROM {table} LIMIT 0"))
            .await
            .map_err(|e| sink_error(&format!("read the columns of {}", table.plain()), e))?;
        check_engine(&mut conn, &table, "table").await?;
        let packet: Option<u64> = conn
            .query_first("SELECT @@max_allowed_packet")
            .await
            .map_err(|e| sink_error("read max_allowed_packet", e))?;
        let max_allowed_packet = packet.unwrap_or(4 << 20) as usize;
        let statement_limit = self
            .config
            .batch_size
            .min(max_allowed_packet.saturating_sub(PACKET_MARGIN))
            .max(1024);
        let insert_head = format!("INSERT INTO {table} ({list}) VALUES ").into_bytes();
        let load_data = self.config.bulk == Bulk::LoadData
            && {
                let on: Option<u64> = conn
                    .query_first("SELECT @@local_infile + 0")
                    .await
                    .map_err(|e| sink_error("read local_infile", e))?;
                if on != Some(1) {
                    tracing::info!("the server refuses LOAD DATA LOCAL INFILE (local_infile=OFF): rows go in by multi-row INSERT");
                }
                on == Some(1)
            };
        let load_sql = format!(
            "LOAD DATA LOCAL INFILE 'walsink' INTO TABLE {table} CHARACTER SET binary \
             FIELDS TERMINATED BY '\\t' ESCAPED BY '\\\\' LINES TERMINATED BY '\\n' ({list})"
        );
        self.id.set(Some(conn.id()));
        self.session = Some(Session {
            conn,
            insert_head,
            columns: names.len(),
            statement_limit,
            max_allowed_packet,
            load_data,
            load_sql,
        });
        Ok(())
    }

    /// A connection without any set-up of the tables ([`Config::connect`]).
    async fn plain_connect(&self) -> Result<Conn, SinkError> {
        self.config.connect().await
    }

    /// Runs a read on the sink's connection, or on a plain one when the sink is not set up
    /// (so reading what the target holds creates nothing).
    async fn read<T>(
        &mut self,
        what: &str,
        f: impl AsyncFnOnce(&mut Conn) -> Result<T, mysql_async::Error>,
    ) -> Result<T, SinkError> {
        let mut owned;
        let conn = match self.session.as_mut().filter(|_| !self.busy) {
            Some(s) => &mut s.conn,
            None => {
                owned = self.plain_connect().await?;
                &mut owned
            }
        };
        match f(conn).await {
            Ok(v) => Ok(v),
            Err(e) => {
                self.drop_session();
                Err(sink_error(what, e))
            }
        }
    }

    async fn session(&mut self) -> Result<&mut Session, SinkError> {
        self.connect().await?;
        Ok(self.session.as_mut().expect("connected above"))
    }

    /// Claims the shard `(sink_id, subtask)` for `owner` in the owners table beside the
    /// marker table ([`crate::owner`]) and keeps the claim: from then on every epoch's
    /// transaction first reads the owner row `LOCK IN SHARE MODE` and writes nothing (a
    /// [`SinkError::fenced`](walsink::SinkError::fenced) error) when another log took the
    /// shard over or this log claimed it again elsewhere. A sink that never claims does not
    /// look at owners.
    ///
    /// In XA mode the shard's prepared XA transactions are rolled back first: they hold the
    /// owner row's lock, and none of them is in the table until committed, so their epochs
    /// are written again by whoever delivers them.
    ///
    /// # Errors
    /// [`SinkError::fenced`](walsink::SinkError::fenced) when another log owns the shard and
    /// `owner` does not take it over; the classified server error otherwise (a missing owners
    /// table with `create=false` is permanent, 1146).
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
        let what = format!(
            "claim shard {sink_id}/{subtask} in {}",
            owners.name().plain()
        );
        let mut attempt = 0u32;
        loop {
            attempt += 1;
            if self.config.mode == Mode::Xa {
                for x in self.check_prepared(sink_id, subtask).await? {
                    tracing::warn!(xid = %x, "rolling back a prepared XA transaction before claiming its shard");
                    self.finish_prepared(&x, false).await?;
                }
            }
            let s = self.session().await?;
            let r = owners
                .claim_once(&mut s.conn, sink_id, subtask, owner)
                .await;
            match r {
                Ok(Ok(Some(claim))) => {
                    tracing::info!(sink_id, subtask, owner = %claim.owner, generation = claim.generation, "claimed the shard");
                    self.claim = Some(claim.clone());
                    return Ok(claim);
                }
                Ok(Err(refused)) => return Err(refused),
                Ok(Ok(None)) if attempt < 10 => {}
                Ok(Ok(None)) => {
                    return Err(SinkError::retryable(format!(
                        "{what}: other claims kept getting in the way"
                    )))
                }
                // A lock held by a transaction of the old owner: claim again.
                Err(e) if attempt < 10 && matches!(code_of(&e), Some(1205 | 1213)) => {
                    self.drop_session();
                }
                Err(e) => {
                    self.drop_session();
                    return Err(sink_error(&what, e));
                }
            }
        }
    }

    /// The claim this sink holds, if it claimed one ([`MySqlSink::claim`]).
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
                Err(e) if code_of(&e) == Some(1146) => Ok(Vec::new()),
                r => r,
            }
        })
        .await
    }

    /// The prepared XA transactions of `(sink_id, subtask)` on the server (`XA RECOVER`),
    /// whatever database they wrote to.
    ///
    /// # Cancel safety
    /// Cancel safe: it only reads; call it again.
    pub async fn check_prepared(
        &mut self,
        sink_id: &str,
        subtask: u32,
    ) -> Result<Vec<Xid>, SinkError> {
        let rows = self
            .read("list prepared XA transactions (XA RECOVER)", async |c| {
                xa::recover(c).await
            })
            .await?;
        Ok(rows
            .into_iter()
            .filter(|x| x.belongs_to(sink_id, subtask))
            .collect())
    }

    /// Rolls back the prepared XA transactions of `(sink_id, subtask)` whose checkpoint
    /// `keep` rejects: those of epochs voided by a restore. Call it after opening the log
    /// (`keep`: the checkpoint is in the recovery report's `pending`); the prepared
    /// transaction of a pending epoch is committed by the epoch's delivery without writing
    /// its rows again. Returns the xids rolled back.
    ///
    /// # Cancel safety
    /// If dropped, some voided transactions may already be rolled back (each rollback is
    /// atomic); call it again to finish.
    pub async fn roll_back_voided(
        &mut self,
        sink_id: &str,
        subtask: u32,
        keep: impl Fn(u64) -> bool,
    ) -> Result<Vec<Xid>, SinkError> {
        let found = self.check_prepared(sink_id, subtask).await?;
        let mut gone = Vec::new();
        for x in found.into_iter().filter(|x| !keep(x.checkpoint)) {
            tracing::warn!(xid = %x, "rolling back the prepared XA transaction of a voided epoch");
            self.finish_prepared(&x, false).await?;
            gone.push(x);
        }
        Ok(gone)
    }

    /// `XA COMMIT` (or `XA ROLLBACK`) of `x`. One the server does not know (1397,
    /// `XAER_NOTA`: finished meanwhile) is reported as `Ok(false)`.
    async fn finish_prepared(&mut self, x: &Xid, commit: bool) -> Result<bool, SinkError> {
        let verb = if commit { "COMMIT" } else { "ROLLBACK" };
        let s = self.session().await?;
        match s.conn.query_drop(format!("XA {verb} {}", x.sql())).await {
            Ok(()) => Ok(true),
            Err(e) if code_of(&e) == Some(1397) => Ok(false),
            Err(e) => {
                self.drop_session();
                Err(sink_error(&format!("XA {verb} {x}"), e))
            }
        }
    }

    /// Before an XA delivery: resolves the prepared XA transactions of this sink. The one
    /// holding this very epoch is committed (`true`: the epoch is in); any other is rolled
    /// back, since the committer has moved on from it (its epoch was voided by a restore, or
    /// was an earlier epoch under the same checkpoint id). Nothing else can be pending: each
    /// delivery commits its prepared transaction before it returns.
    async fn resolve_prepared(&mut self, key: &EpochKey, fp: u64) -> Result<bool, SinkError> {
        let found = self.check_prepared(&key.sink_id, key.subtask).await?;
        let mut committed = false;
        for x in found {
            if x.checkpoint == key.checkpoint && x.fingerprint == fp {
                tracing::info!(xid = %x, "committing the prepared XA transaction of the epoch being delivered");
                if self.finish_prepared(&x, true).await? || self.is_committed(key).await? {
                    committed = true;
                } else {
                    // XA RECOVER lists it, XA COMMIT does not know it: on MySQL, a prepared
                    // transaction still attached to a connection the server has not closed
                    // yet (its client vanished) can be committed only by that connection.
                    return Err(SinkError::retryable(format!(
                        "the prepared XA transaction {x} of checkpoint {} is held by another connection the server has not closed yet; retried",
                        key.checkpoint
                    )));
                }
            } else {
                let why = if x.checkpoint < key.checkpoint {
                    "its epoch was voided (a restore) or superseded"
                } else if x.checkpoint == key.checkpoint {
                    "it holds another epoch under the same checkpoint id"
                } else {
                    "its checkpoint is ahead of the log's (the log was lost or replaced)"
                };
                tracing::warn!(xid = %x, delivering = key.checkpoint, "rolling back a prepared XA transaction: {why}");
                self.finish_prepared(&x, false).await?;
            }
        }
        Ok(committed)
    }

    /// Ends the open transaction without committing it (after finding the marker there or
    /// locked); a failure drops the connection, which rolls it back as well.
    async fn roll_back(&mut self, xid: Option<&Xid>) {
        let Some(s) = self.session.as_mut() else {
            return;
        };
        let r = match xid {
            None => s.conn.query_drop("ROLLBACK").await,
            Some(x) => match s.conn.query_drop(format!("XA END {}", x.sql())).await {
                Ok(()) => s.conn.query_drop(format!("XA ROLLBACK {}", x.sql())).await,
                Err(e) => Err(e),
            },
        };
        if r.is_err() {
            self.drop_session();
        }
    }

    /// Writes the epoch in one transaction: the marker first (it finds an epoch already
    /// committed), the rows by multi-row INSERTs under `max_allowed_packet`, then COMMIT, or
    /// XA END, XA PREPARE and XA COMMIT.
    async fn write_epoch(&mut self, epoch: &Epoch, fp: u64) -> Result<Outcome, SinkError> {
        let key = epoch.key().clone();
        let xid = (self.config.mode == Mode::Xa).then(|| Xid::new(&key, fp));
        let marker = self.config.marker_table.clone();
        let mapping = self.mapping.clone();
        let table = self.config.table.plain();
        let lock_timeout = self.config.lock_timeout;
        let claim = self.claim.clone();
        let s = self.session().await?;
        let begin = match &xid {
            None => "START TRANSACTION".to_string(),
            Some(x) => format!("XA START {}", x.sql()),
        };
        s.conn
            .query_drop(&begin)
            .await
            .map_err(|e| sink_error(&begin, e))?;
        if let Some(claim) = &claim {
            let owners = OwnerTable::beside(marker.name());
            let found = owners.check(&mut s.conn, claim).await.map_err(|e| {
                sink_error(&format!("read the owner in {}", owners.name().plain()), e)
            })?;
            if let Err(fenced) = claim.check(found.as_ref().map(|(o, g)| (o.as_str(), *g))) {
                self.roll_back(xid.as_ref()).await;
                return Err(fenced);
            }
        }
        let fresh = match marker
            .write(&mut s.conn, &key, epoch.metadata(), epoch.len())
            .await
        {
            Ok(fresh) => fresh,
            Err(e) if code_of(&e) == Some(1205) => {
                // Another transaction holds this epoch's marker: an earlier connection of this
                // sink whose COMMIT or XA PREPARE is still on its way, or a second writer.
                let what = format!(
                    "write the marker of checkpoint {} into {} (waited lock_timeout={:?} behind another transaction holding it: an earlier connection of sink {:?} whose COMMIT or XA PREPARE is still on its way, or a second writer under the same sink id; retried)",
                    key.checkpoint,
                    marker.name().plain(),
                    lock_timeout,
                    key.sink_id,
                );
                self.roll_back(xid.as_ref()).await;
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
            self.roll_back(xid.as_ref()).await;
            return Ok(Outcome::AlreadyThere);
        }
        if !epoch.is_empty() {
            let written = insert_rows(s, &*mapping, &key, epoch, &table).await?;
            if written != epoch.len() {
                return Err(SinkError::permanent(format!(
                    "INSERT into {table} took {written} rows of checkpoint {}'s {} records (a trigger on the table?)",
                    key.checkpoint,
                    epoch.len()
                )));
            }
        }
        failpoint::hit("after-insert");
        match &xid {
            None => s
                .conn
                .query_drop("COMMIT")
                .await
                .map_err(|e| sink_error("COMMIT", e))?,
            Some(x) => {
                for verb in ["END", "PREPARE"] {
                    s.conn
                        .query_drop(format!("XA {verb} {}", x.sql()))
                        .await
                        .map_err(|e| sink_error(&format!("XA {verb} {x}"), e))?;
                }
                failpoint::hit("after-prepare");
                self.commit_prepared(&key, x).await?;
            }
        }
        failpoint::hit("after-commit");
        Ok(Outcome::Written)
    }

    /// `XA COMMIT`, made certain: after a lost connection or a transaction no longer
    /// prepared, the marker says whether the epoch is in (success) or not (an error; the
    /// epoch is written again on retry, after the prepared transaction is resolved).
    async fn commit_prepared(&mut self, key: &EpochKey, x: &Xid) -> Result<(), SinkError> {
        let first = self.finish_prepared(x, true).await;
        if let Ok(true) = first {
            return Ok(());
        }
        self.drop_session();
        if self.is_committed(key).await? {
            return Ok(());
        }
        if self.finish_prepared(x, true).await? {
            return Ok(());
        }
        Err(first.err().unwrap_or_else(|| {
            SinkError::retryable(format!(
                "the prepared XA transaction {x} is gone without its epoch in the target (rolled back by someone else); checkpoint {} is written again",
                key.checkpoint
            ))
        }))
    }
}

/// Checks that `table` is transactional (InnoDB, or MyRocks's ROCKSDB): in a table of another
/// engine (MyISAM, Aria, MEMORY) the rows of a transaction that rolls back stay, so a retry
/// would write them twice.
async fn check_engine(conn: &mut Conn, table: &TableName, what: &str) -> Result<(), SinkError> {
    let engine: Option<Option<String>> = conn
        .exec_first(
            "SELECT ENGINE FROM information_schema.TABLES WHERE TABLE_SCHEMA = COALESCE(?, DATABASE()) AND TABLE_NAME = ?",
            (table.database(), table.name()),
        )
        .await
        .map_err(|e| sink_error(&format!("look up the engine of the {what} {}", table.plain()), e))?;
    match engine.flatten() {
        Some(e) if e.eq_ignore_ascii_case("InnoDB") || e.eq_ignore_ascii_case("ROCKSDB") => Ok(()),
        Some(e) => Err(SinkError::permanent(format!(
            "the {what} {} uses the {e} engine, which does not roll back: it must be InnoDB, so that the marker and the rows commit together (ALTER TABLE {} ENGINE=InnoDB)",
            table.plain(),
            table
        ))),
        None => Err(SinkError::permanent(format!(
            "the {what} {} is not a base table (a view?) or does not exist: walsink writes into an InnoDB table (see docs/targets/mysql.md)",
            table.plain()
        ))),
    }
}

/// Sends the epoch's rows, in statements of at most `statement_limit` bytes each: `LOAD DATA
/// LOCAL INFILE` streams from memory where the session can, multi-row INSERTs otherwise.
/// Returns how many rows the server took.
async fn insert_rows(
    s: &mut Session,
    mapping: &dyn RowMapping,
    key: &EpochKey,
    epoch: &Epoch,
    table: &str,
) -> Result<u64, SinkError> {
    let encoding = if s.load_data {
        Encoding::Tsv
    } else {
        Encoding::Sql
    };
    let head = match encoding {
        Encoding::Sql => s.insert_head.len(),
        Encoding::Tsv => 0,
    };
    let mut stmt = Vec::with_capacity(s.statement_limit.min(64 << 20) + 64);
    if encoding == Encoding::Sql {
        stmt.extend_from_slice(&s.insert_head);
    }
    let mut row = Vec::new();
    let mut in_stmt = 0u64;
    let mut written = 0u64;
    let mut chunks = AsyncChunks::new(epoch);
    while let Some(chunk) = chunks.next().await {
        let chunk = chunk.map_err(|e| {
            SinkError::retryable(format!(
                "read checkpoint {} from the log: {e}",
                key.checkpoint
            ))
        })?;
        for r in chunk.records() {
            row.clear();
            mapping::encode_row(mapping, s.columns, key, &r, &mut row, encoding).map_err(|e| {
                SinkError::permanent(format!(
                    "map record {} of checkpoint {} to a row of {table}: {e}",
                    r.position.index, key.checkpoint
                ))
            })?;
            // A value larger than max_allowed_packet is refused by the server however it
            // arrives (LOAD DATA would only warn and cut it).
            if s.insert_head.len() + row.len() + PACKET_MARGIN > s.max_allowed_packet {
                return Err(SinkError::permanent(format!(
                    "record {} of checkpoint {} makes a row of {} bytes, more than the server's max_allowed_packet of {} bytes allows in one statement or value: raise max_allowed_packet on the server",
                    r.position.index,
                    key.checkpoint,
                    row.len(),
                    s.max_allowed_packet
                )));
            }
            if in_stmt > 0 && stmt.len() + 1 + row.len() > s.statement_limit {
                written += send(s, &mut stmt, head, in_stmt, encoding, table).await?;
                in_stmt = 0;
            }
            if in_stmt > 0 && encoding == Encoding::Sql {
                stmt.push(b',');
            }
            stmt.extend_from_slice(&row);
            in_stmt += 1;
        }
    }
    if in_stmt > 0 {
        written += send(s, &mut stmt, head, in_stmt, encoding, table).await?;
    }
    Ok(written)
}

/// Sends one statement's rows and empties `stmt` down to `head`.
async fn send(
    s: &mut Session,
    stmt: &mut Vec<u8>,
    head: usize,
    rows: u64,
    encoding: Encoding,
    table: &str,
) -> Result<u64, SinkError> {
    let r = match encoding {
        Encoding::Sql => s
            .conn
            .query_drop(&stmt[..])
            .await
            .map_err(|e| sink_error(&format!("INSERT into {table}"), e)),
        Encoding::Tsv => {
            let data = bytes::Bytes::copy_from_slice(stmt);
            let step = 64 << 10;
            let parts: Vec<std::io::Result<bytes::Bytes>> = (0..data.len())
                .step_by(step)
                .map(|i| Ok(data.slice(i..(i + step).min(data.len()))))
                .collect();
            s.conn.set_infile_handler(async move {
                Ok(Box::pin(futures_util::stream::iter(parts)) as mysql_async::InfileData)
            });
            s.conn
                .query_drop(&s.load_sql)
                .await
                .map_err(|e| sink_error(&format!("LOAD DATA LOCAL INFILE into {table}"), e))
        }
    };
    stmt.truncate(head);
    r?;
    let took = s.conn.affected_rows();
    if encoding == Encoding::Tsv && (s.conn.get_warnings() > 0 || took != rows) {
        // LOCAL makes the server take data errors as warnings (it cannot stop the client
        // sending): a value cut short or a row skipped must fail the epoch, as INSERT does.
        let warnings: Vec<(String, u16, String)> = s
            .conn
            .query("SHOW WARNINGS LIMIT 3")
            .await
            .map_err(|e| sink_error("SHOW WARNINGS after LOAD DATA", e))?;
        let shown: Vec<String> = warnings
            .iter()
            .map(|(level, code, msg)| format!("{level} {code}: {msg}"))
            .collect();
        return Err(SinkError::permanent(format!(
            "LOAD DATA LOCAL INFILE into {table} took {took} of {rows} rows with warnings ({}); nothing of the epoch is committed",
            shown.join("; ")
        )));
    }
    Ok(took)
}

impl AsyncSink for MySqlSink {
    /// Delivers one epoch in one transaction (see [`MySqlSink`]).
    ///
    /// No statement waits longer than `lock_timeout` for a lock. When the epoch's marker is
    /// held by another transaction that long (an earlier connection of this sink whose
    /// COMMIT or XA PREPARE is still on its way, or a second writer), the delivery rolls
    /// back; in XA mode it then looks at the prepared transactions again and commits the one
    /// holding this very epoch (success, nothing written again).
    ///
    /// # Errors
    /// A retryable [`SinkError`] when the marker stayed locked (the next attempt looks
    /// again), and the classified server error of any statement that failed (see
    /// [`classify_code`](crate::classify_code)).
    ///
    /// # Cancel safety
    /// Dropped half-way, the transaction is left open on a connection that the next call
    /// replaces, so the server rolls it back; an XA transaction left prepared is committed by
    /// the next delivery of the same epoch.
    async fn deliver(&mut self, epoch: &Epoch) -> Result<(), SinkError> {
        if self.busy {
            self.drop_session();
        }
        if let Some(claim) = &self.claim {
            claim.check_key(epoch.key())?;
        }
        let fp = xa::fingerprint(epoch);
        let is_xa = self.config.mode == Mode::Xa;
        let r = async {
            if is_xa && self.resolve_prepared(epoch.key(), fp).await? {
                return Ok(Outcome::AlreadyThere);
            }
            self.connect().await?;
            self.busy = true;
            match self.write_epoch(epoch, fp).await? {
                Outcome::MarkerLocked(e) => {
                    self.busy = false;
                    if is_xa && self.resolve_prepared(epoch.key(), fp).await? {
                        return Ok(Outcome::AlreadyThere);
                    }
                    Err(e)
                }
                o => Ok(o),
            }
        }
        .await;
        self.busy = false;
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
                // Whatever the connection had open (not prepared) is rolled back by the
                // server when it goes.
                self.drop_session();
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
        if self.busy {
            // A delivery dropped half-way: its transaction is open on this connection, and
            // a read there would see its uncommitted marker.
            self.drop_session();
        }
        let marker = self.config.marker_table.clone();
        let s = self.session().await?;
        match marker.is_committed(&mut s.conn, key).await {
            Ok(b) => Ok(b),
            Err(e) => {
                self.drop_session();
                Err(sink_error("read the marker", e))
            }
        }
    }
}
