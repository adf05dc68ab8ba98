//! Debezium change events applied to MySQL or MariaDB exactly once: [`MySqlCdcSink`]
//! (feature `mysql`).
//!
//! The same guarantee as [`CdcSink`](crate::CdcSink) into PostgreSQL, in MySQL's SQL:
//!
//! - each epoch is **one InnoDB transaction with its commit marker** (the marker table of the
//!   MySQL target, `walsink_markers`, written first, so it is also the epoch's lock);
//! - the **position guard**: every replica row keeps the rank of the event that wrote it in a
//!   hidden column `_walsink_pos BIGINT`, an upsert is `INSERT … ON DUPLICATE KEY UPDATE`
//!   whose every assignment is `IF(` the stored rank is older `, VALUES(col), col)`, a delete
//!   deletes only rows older than it and leaves a **tombstone** in a table of the replica
//!   table's own key columns (`walsink_tomb_T`), so a replayed older insert cannot bring the
//!   row back, and a truncate leaves a per-table **watermark** in `walsink_cdc_tables`;
//! - the planner of [`crate::plan`] reduces an epoch to a few set-based statements with the
//!   same result as applying its events one by one under the guard.
//!
//! MySQL commits a transaction before any DDL, so the columns and tables the guard needs (and
//! the columns `add_missing_columns=true` adds) are made between two attempts at the epoch: the
//! attempt that finds one missing rolls back, the sink makes it, and applies the epoch again.
//! `docs/targets/cdc.md` ("Into MySQL and MariaDB") has the rules.

use crate::event::{self, BadEvent, Event, Op, PositionField, Row};
use crate::plan::{Change, Planner, Step, TableMeta};
use serde_json::Value;
use std::collections::HashMap;
use std::fmt;
use walsink::sinks::CommittedEpoch;
use walsink::{Claim, Epoch, EpochKey, Owner, RecordPosition, SinkError};
use walsink_kit::ConfigError;
use walsink_mysql::mysql_async::prelude::Queryable;
use walsink_mysql::mysql_async::{self, Conn};
use walsink_mysql::table::{quote_ident, quote_literal};
use walsink_mysql::{sink_error, MarkerTable, OwnerTable};

/// The server's error number of `e`, if it is a server error.
fn e_code(e: &mysql_async::Error) -> Option<u16> {
    match e {
        mysql_async::Error::Server(s) => Some(s.code),
        _ => None,
    }
}
use walsink_tokio::{AsyncChunks, AsyncSink};

/// The hidden column that holds each replica row's rank.
pub const POS: &str = "_walsink_pos";

/// The table of per-table watermarks and high-waters, beside the replica tables.
pub const TABLES: &str = "walsink_cdc_tables";

/// The longest MySQL identifier.
const MAX_IDENT: usize = 64;

/// Keys per `DELETE` statement (its `WHERE` is one disjunction per key).
const DELETE_KEYS: usize = 500;

/// Changes sent in one flush of the oldest held keys.
const FLUSH: usize = 2_048;

/// How often one epoch is attempted again after making what an attempt found missing.
const MAX_PREPARES: usize = 64;

/// Parameters of the `--sink` URL besides the connection's.
pub const PARAMETERS: &[&str] = &["add_missing_columns", "position", "max_held"];

/// Where and how events are applied:
/// `mysql://USER@HOST:PORT/DB[?add_missing_columns=true][&position=source.lsn][&max_held=N]`
/// (or `mariadb://`), with the connection parameters of the MySQL target
/// ([`walsink_mysql::config::CONNECTION_PARAMETERS`]: `ssl_mode`, `password_file`,
/// `lock_timeout`, `marker_table`, …). Events for `source.table` T go to `DB.T`.
#[derive(Clone, Debug)]
pub struct MySqlCdcConfig {
    /// The connection (its `table` is unused).
    pub conn: walsink_mysql::Config,
    /// Add a column an event carries and the table lacks, instead of failing.
    pub add_missing_columns: bool,
    /// Where each event's source position is.
    pub position: PositionField,
    /// At most this many changes held in memory before the oldest are sent (inside the
    /// epoch's transaction; default 20 000, at least 2 048 held when the epoch is larger).
    pub max_held: usize,
}

impl MySqlCdcConfig {
    /// Parses the `--sink` URL. Errors name the bad parameter, never the password.
    pub fn from_url(url: &str) -> Result<MySqlCdcConfig, ConfigError> {
        let mut add_missing_columns = false;
        let mut position = PositionField::default();
        let mut max_held = 20_000usize;
        let conn = walsink_mysql::Config::from_url_with(url, PARAMETERS, &mut |p| {
            if let Some(b) = p.bool("add_missing_columns")? {
                add_missing_columns = b;
            }
            if let Some(f) = p.non_empty("position")? {
                position = PositionField::new(&f).map_err(|e| p.error("position", e))?;
            }
            if let Some(n) = p.number::<usize>("max_held")? {
                if n == 0 {
                    return Err(p.error("max_held", "must be a positive count"));
                }
                max_held = n;
            }
            Ok(())
        })?;
        Ok(MySqlCdcConfig {
            conn,
            add_missing_columns,
            position,
            max_held,
        })
    }
}

impl fmt::Display for MySqlCdcConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.conn.fmt(f)
    }
}

/// What a [`MySqlCdcSink`] applied in committed epochs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MySqlCdcStats {
    /// Epochs committed.
    pub epochs: u64,
    /// Events read (tombstone records not counted).
    pub events: u64,
    /// Rows sent as upserts (after reduction).
    pub upserts: u64,
    /// Keys sent as deletes (after reduction).
    pub deletes: u64,
    /// Truncates applied.
    pub truncates: u64,
    /// Upsert statements after which the replica's rows were checked against the tombstones
    /// (the others ranked above everything the table held, so no tombstone could outrank
    /// them).
    pub tombstone_checks: u64,
}

/// A replica table as the sink writes it.
#[derive(Debug, Clone)]
struct Meta {
    /// Name, the columns walsink writes (not generated ones, not the guard's) and the key.
    plan: TableMeta,
    /// The stored and virtual generated columns: the replica computes them, and an event's
    /// values for them are dropped.
    generated: Vec<String>,
    /// The tombstone table, quoted.
    tomb: String,
    /// The columns of a date or time type (`DATE`, `DATETIME`, `TIMESTAMP`, `TIME`): a JSON
    /// number for one is refused, since MySQL reads its digits as a date.
    temporal: Vec<String>,
}

impl Meta {
    /// The table's spelling of `name` (MySQL's column names are case-insensitive), if it is a
    /// column walsink writes; `Err(true)` for a generated column, `Err(false)` for none.
    fn column(&self, name: &str) -> Result<&str, bool> {
        if let Some(c) = self.plan.columns.iter().find(|c| c.as_str() == name) {
            return Ok(c);
        }
        if let Some(c) = self
            .plan
            .columns
            .iter()
            .find(|c| c.eq_ignore_ascii_case(name))
        {
            return Ok(c);
        }
        Err(self.generated.iter().any(|c| c.eq_ignore_ascii_case(name)))
    }
}

/// The watermark and high-water of a table touched by the epoch, locked in [`TABLES`].
#[derive(Debug, Clone, Copy)]
struct Marks {
    /// Rank of the newest truncate applied; no event at or below it applies.
    truncated_at: Option<i64>,
    /// A rank at or above every rank the table's rows, tombstones and watermark hold.
    high: Option<i64>,
}

/// One column as `information_schema.COLUMNS` describes it: name, `EXTRA`, `COLUMN_TYPE`,
/// character set and collation.
type ColumnRow = (String, String, String, Option<String>, Option<String>);

/// Why one attempt at an epoch ended.
enum Attempt {
    /// Committed, or found committed.
    Done,
    /// Rolled back: these statements must run (outside any transaction) before the epoch
    /// is applied again.
    Prepare(Vec<String>),
}

/// The [`AsyncSink`] that applies Debezium change events to MySQL or MariaDB exactly once;
/// see the module docs.
pub struct MySqlCdcSink {
    config: MySqlCdcConfig,
    marker: MarkerTable,
    conn: Option<Conn>,
    /// Bytes of one statement, at most (`max_allowed_packet` less a margin, up to 4 MiB).
    statement_limit: usize,
    /// The server's `max_allowed_packet` less a margin: the largest statement it takes.
    packet_limit: usize,
    tables: HashMap<String, Meta>,
    stats: MySqlCdcStats,
    /// The shard this sink claimed ([`MySqlCdcSink::claim`]): every epoch checks it first.
    claim: Option<Claim>,
}

impl fmt::Debug for MySqlCdcSink {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MySqlCdcSink")
            .field("config", &self.config.to_string())
            .field("connected", &self.conn.is_some())
            .field("stats", &self.stats)
            .finish()
    }
}

fn ident(s: &str) -> String {
    quote_ident(s)
}

/// The tombstone table of replica table `table`: `walsink_tomb_T`, or, when that is longer
/// than MySQL allows, the name's first letters and a hash of it.
pub fn tomb_table(table: &str) -> String {
    let plain = format!("walsink_tomb_{table}");
    if plain.chars().count() <= MAX_IDENT {
        return plain;
    }
    let head: String = table.chars().take(MAX_IDENT - 13 - 17).collect();
    format!(
        "walsink_tomb_{head}_{:016x}",
        xxhash_rust::xxh3::xxh3_64(table.as_bytes())
    )
}

/// `v` as an SQL literal the server converts to its column's type: `NULL`, a number as
/// written (so `1.10` reaches a `DECIMAL` column with its digits), a boolean as `TRUE` or
/// `FALSE`, a string as a quoted literal, an object or array as its JSON text in one.
fn push_literal(out: &mut String, v: &Value) {
    match v {
        Value::Null => out.push_str("NULL"),
        Value::Bool(true) => out.push_str("TRUE"),
        Value::Bool(false) => out.push_str("FALSE"),
        Value::Number(n) => out.push_str(n.as_str()),
        Value::String(s) => out.push_str(&quote_literal(s)),
        other => out.push_str(&quote_literal(&other.to_string())),
    }
}

/// The column type `add_missing_columns` gives a column first seen holding `v`.
fn column_type(v: &Value) -> &'static str {
    match v {
        Value::Bool(_) => "BOOLEAN",
        Value::Number(n) if n.as_i64().is_some() => "BIGINT",
        Value::Number(n) if !n.as_str().contains(['.', 'e', 'E']) => "DECIMAL(65,0)",
        Value::Number(_) => "DOUBLE",
        Value::Object(_) | Value::Array(_) => "JSON",
        _ => "LONGTEXT",
    }
}

fn where_(ev_op: Op, position: u64, at: RecordPosition) -> String {
    format!(
        "event at checkpoint {}, index {} (op {}, source position {position})",
        at.checkpoint,
        at.index,
        ev_op.letter()
    )
}

/// The condition that the stored row is older than the row being written.
fn older(stored: &str) -> String {
    format!(
        "({stored}.{p} IS NULL OR {stored}.{p} < VALUES({p}))",
        p = ident(POS)
    )
}

impl MySqlCdcSink {
    /// Connects and creates the marker table and [`TABLES`] if they are missing.
    ///
    /// # Cancel safety
    /// Cancel safe: a connection half set up is dropped, and the next call connects anew.
    pub async fn connect(config: MySqlCdcConfig) -> Result<MySqlCdcSink, SinkError> {
        let mut s = MySqlCdcSink {
            marker: config.conn.marker_table.clone(),
            config,
            conn: None,
            statement_limit: 1 << 20,
            packet_limit: 1 << 20,
            tables: HashMap::new(),
            stats: MySqlCdcStats::default(),
            claim: None,
        };
        s.conn().await?;
        Ok(s)
    }

    /// Claims the shard `(sink_id, subtask)` for `owner` in the owners table beside the
    /// marker table (`walsink_owners`, as the MySQL target keeps it) and keeps the claim:
    /// from then on every epoch's transaction reads the owner row `LOCK IN SHARE MODE` first
    /// and writes nothing (a [`SinkError::fenced`] error) once another log took the shard
    /// over. A sink that never claims does not look at owners.
    ///
    /// # Errors
    /// [`SinkError::fenced`] when another log owns the shard and `owner` does not take it
    /// over; the classified server error otherwise.
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
        let owners = OwnerTable::beside(self.marker.name());
        let what = format!(
            "claim shard {sink_id}/{subtask} in {}",
            owners.name().plain()
        );
        for attempt in 1..=10 {
            let c = self.conn().await?;
            match owners.claim_once(c, sink_id, subtask, owner).await {
                Ok(Ok(Some(claim))) => {
                    self.claim = Some(claim.clone());
                    return Ok(claim);
                }
                Ok(Err(refused)) => return Err(refused),
                // Another claim inserted the first record meanwhile: read it now.
                Ok(Ok(None)) => {}
                // A lock held by an epoch of the old owner: claim again.
                Err(e) if attempt < 10 && matches!(e_code(&e), Some(1205 | 1213)) => {
                    self.conn = None;
                }
                Err(e) => {
                    self.conn = None;
                    return Err(sink_error(&what, e));
                }
            }
        }
        Err(SinkError::retryable(format!(
            "{what}: other claims kept getting in the way"
        )))
    }

    /// The claim this sink holds, if it claimed one.
    pub fn claimed(&self) -> Option<&Claim> {
        self.claim.as_ref()
    }

    /// Whether `table` is one of walsink's own tables in the target database (the marker and
    /// owners tables, [`TABLES`], a tombstone table): events for them are refused.
    fn bookkeeping(&self, table: &str) -> bool {
        let t = table.to_ascii_lowercase();
        let marker = self.marker.name();
        let owners = OwnerTable::beside(marker);
        t == marker.name().to_ascii_lowercase()
            || t == owners.name().name().to_ascii_lowercase()
            || t == TABLES
            || t.starts_with("walsink_tomb_")
    }

    /// The configuration.
    pub fn config(&self) -> &MySqlCdcConfig {
        &self.config
    }

    /// What this sink applied so far, in committed epochs.
    pub fn stats(&self) -> MySqlCdcStats {
        self.stats
    }

    async fn conn(&mut self) -> Result<&mut Conn, SinkError> {
        if self.conn.is_none() {
            let mut c = self.config.conn.connect().await?;
            self.marker
                .create(&mut c)
                .await
                .map_err(|e| sink_error("create the marker table", e))?;
            let owners = OwnerTable::beside(self.marker.name());
            owners
                .create(&mut c)
                .await
                .map_err(|e| sink_error("create the owners table", e))?;
            c.query_drop(format!(
                "CREATE TABLE IF NOT EXISTS {TABLES} (\
                 tbl VARCHAR(64) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL PRIMARY KEY, \
                 truncated_at BIGINT NULL, high BIGINT NULL) ENGINE=InnoDB"
            ))
            .await
            .map_err(|e| sink_error(&format!("create {TABLES}"), e))?;
            let packet: Option<u64> = c
                .query_first("SELECT @@max_allowed_packet")
                .await
                .map_err(|e| sink_error("read max_allowed_packet", e))?;
            self.packet_limit = (packet.unwrap_or(4 << 20) as usize).saturating_sub(4096);
            self.statement_limit = self.packet_limit.clamp(16 << 10, 4 << 20);
            self.conn = Some(c);
        }
        Ok(self.conn.as_mut().expect("connected above"))
    }

    /// Every committed epoch of `(sink_id, subtask)`, oldest first, with its metadata.
    ///
    /// # Cancel safety
    /// Cancel safe: it only reads.
    pub async fn committed(
        &mut self,
        sink_id: &str,
        subtask: u32,
    ) -> Result<Vec<CommittedEpoch>, SinkError> {
        let marker = self.marker.clone();
        let c = self.conn().await?;
        let found = marker
            .committed(c, sink_id, subtask)
            .await
            .map_err(|e| sink_error("read the commit markers", e));
        let found = match found {
            Ok(f) => f,
            Err(e) => {
                self.conn = None;
                return Err(e);
            }
        };
        Ok(found
            .into_iter()
            .map(|m| CommittedEpoch {
                checkpoint: m.checkpoint,
                file: format!(
                    "checkpoint {} in the marker table {}",
                    m.checkpoint,
                    marker.name().plain()
                ),
                metadata: Some(m.metadata),
            })
            .collect())
    }

    /// Reads the replica table `name`'s columns, key and generated columns; `Ok(None)` with
    /// the statements to run first when the guard's column or the tombstone table is missing.
    async fn load_meta(
        c: &mut Conn,
        name: &str,
        at: &str,
    ) -> Result<Result<Meta, Vec<String>>, SinkError> {
        let cols: Vec<ColumnRow> = c
            .exec(
                "SELECT COLUMN_NAME, EXTRA, COLUMN_TYPE, CHARACTER_SET_NAME, COLLATION_NAME \
                 FROM information_schema.COLUMNS WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = ? \
                 ORDER BY ORDINAL_POSITION",
                (name,),
            )
            .await
            .map_err(|e| sink_error(&format!("read the columns of {}", ident(name)), e))?;
        if cols.is_empty() {
            return Err(SinkError::permanent(format!(
                "the replica table {} does not exist in the target database (create it with the source's columns and primary key); {at}",
                ident(name)
            )));
        }
        let engine: Option<Option<String>> = c
            .exec_first(
                "SELECT ENGINE FROM information_schema.TABLES WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = ?",
                (name,),
            )
            .await
            .map_err(|e| sink_error(&format!("read the engine of {}", ident(name)), e))?;
        let engine = engine.flatten().unwrap_or_default();
        if !engine.eq_ignore_ascii_case("InnoDB") {
            return Err(SinkError::permanent(format!(
                "the replica table {} is {engine}, which cannot roll back: an epoch must be one transaction (ALTER TABLE … ENGINE=InnoDB); {at}",
                ident(name)
            )));
        }
        let key: Vec<String> = c
            .exec(
                "SELECT COLUMN_NAME FROM information_schema.KEY_COLUMN_USAGE \
                 WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = ? AND CONSTRAINT_NAME = 'PRIMARY' \
                 ORDER BY ORDINAL_POSITION",
                (name,),
            )
            .await
            .map_err(|e| sink_error(&format!("read the primary key of {}", ident(name)), e))?;
        if key.is_empty() {
            return Err(SinkError::permanent(format!(
                "the replica table {} has no primary key: rows are applied, guarded and tombstoned by key; {at}",
                ident(name)
            )));
        }
        let mut columns = Vec::new();
        let mut generated = Vec::new();
        let mut temporal = Vec::new();
        let mut guard = false;
        let mut key_types = vec![String::new(); key.len()];
        for (col, extra, ty, charset, collation) in cols {
            if col.eq_ignore_ascii_case(POS) {
                guard = true;
                continue;
            }
            if extra.to_ascii_uppercase().contains("GENERATED") {
                generated.push(col);
                continue;
            }
            let lower = ty.to_ascii_lowercase();
            if ["date", "datetime", "timestamp", "time"]
                .iter()
                .any(|t| lower == *t || lower.starts_with(&format!("{t}(")))
            {
                temporal.push(col.clone());
            }
            if let Some(i) = key.iter().position(|k| *k == col) {
                let mut def = ty;
                if let (Some(cs), Some(co)) = (charset, collation) {
                    def.push_str(&format!(" CHARACTER SET {cs} COLLATE {co}"));
                }
                key_types[i] = def;
            }
            columns.push(col);
        }
        if let Some(k) = key.iter().find(|k| generated.contains(k)) {
            return Err(SinkError::permanent(format!(
                "the key column {} of the replica table {} is generated: walsink writes rows by key; {at}",
                ident(k),
                ident(name)
            )));
        }
        let tomb = tomb_table(name);
        let tomb_there: Option<u8> = c
            .exec_first(
                "SELECT 1 FROM information_schema.TABLES WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = ?",
                (&tomb,),
            )
            .await
            .map_err(|e| sink_error(&format!("look for the tombstone table {tomb}"), e))?;
        let mut prepare = Vec::new();
        if !guard {
            prepare.push(format!(
                "ALTER TABLE {} ADD COLUMN {} BIGINT NULL",
                ident(name),
                ident(POS)
            ));
        }
        if tomb_there.is_none() {
            let defs: Vec<String> = key
                .iter()
                .zip(&key_types)
                .map(|(k, t)| format!("{} {t} NOT NULL", ident(k)))
                .collect();
            let list: Vec<String> = key.iter().map(|k| ident(k)).collect();
            prepare.push(format!(
                "CREATE TABLE IF NOT EXISTS {} ({}, {} BIGINT NOT NULL, PRIMARY KEY ({})) ENGINE=InnoDB",
                ident(&tomb),
                defs.join(", "),
                ident(POS),
                list.join(", ")
            ));
        }
        if !prepare.is_empty() {
            return Ok(Err(prepare));
        }
        Ok(Ok(Meta {
            plan: TableMeta {
                name: name.to_string(),
                columns,
                key,
            },
            generated,
            tomb: ident(&tomb),
            temporal,
        }))
    }

    /// One attempt at `epoch`: its transaction, committed or rolled back.
    async fn attempt(&mut self, epoch: &Epoch) -> Result<Attempt, SinkError> {
        let key = epoch.key().clone();
        let marker = self.marker.clone();
        let lock_timeout = self.config.conn.lock_timeout;
        let claim = self.claim.clone();
        let c = self.conn().await?;
        c.query_drop("START TRANSACTION")
            .await
            .map_err(|e| sink_error("START TRANSACTION", e))?;
        if let Some(claim) = &claim {
            let owners = OwnerTable::beside(marker.name());
            let found = owners.check(c, claim).await.map_err(|e| {
                sink_error(&format!("read the owner in {}", owners.name().plain()), e)
            })?;
            if let Err(fenced) = claim.check(found.as_ref().map(|(o, g)| (o.as_str(), *g))) {
                c.query_drop("ROLLBACK")
                    .await
                    .map_err(|e| sink_error("ROLLBACK", e))?;
                return Err(fenced);
            }
        }
        match marker.write(c, &key, epoch.metadata(), epoch.len()).await {
            Ok(true) => {}
            Ok(false) => {
                c.query_drop("ROLLBACK")
                    .await
                    .map_err(|e| sink_error("ROLLBACK", e))?;
                return Ok(Attempt::Done);
            }
            Err(e) if walsink_mysql::error::classify(&e).0 == walsink_mysql::Class::Retryable => {
                return Err(sink_error(
                    &format!(
                        "write the marker of checkpoint {} into {} (another transaction may hold it for up to lock_timeout={lock_timeout:?}: an earlier connection whose COMMIT is on its way, or a second writer under sink id {:?})",
                        key.checkpoint,
                        marker.name().plain(),
                        key.sink_id
                    ),
                    e,
                ))
            }
            Err(e) => return Err(sink_error("write the commit marker", e)),
        }
        let mut run = Run {
            sink: self,
            planner: Planner::new(),
            marks: HashMap::new(),
            counted: MySqlCdcStats::default(),
            window: 0,
        };
        run.window = window(epoch.len(), run.sink.config.max_held);
        let r = run.apply(epoch).await;
        let counted = run.counted;
        match r {
            Ok(None) => {}
            Ok(Some(prepare)) => {
                self.roll_back().await;
                return Ok(Attempt::Prepare(prepare));
            }
            Err(e) => {
                self.roll_back().await;
                return Err(e);
            }
        }
        let c = self.conn().await?;
        c.query_drop("COMMIT")
            .await
            .map_err(|e| sink_error(&format!("COMMIT checkpoint {}", key.checkpoint), e))?;
        let s = &mut self.stats;
        s.epochs += 1;
        s.events += counted.events;
        s.upserts += counted.upserts;
        s.deletes += counted.deletes;
        s.truncates += counted.truncates;
        s.tombstone_checks += counted.tombstone_checks;
        Ok(Attempt::Done)
    }

    async fn roll_back(&mut self) {
        if let Some(c) = self.conn.as_mut() {
            if c.query_drop("ROLLBACK").await.is_err() {
                self.conn = None;
            }
        }
    }
}

/// How many changes an epoch of `len` events holds before it sends the oldest: a quarter of
/// the epoch, at least [`FLUSH`], at most 12 000 (or `max_held`, if lower).
fn window(len: u64, max_held: usize) -> usize {
    let quarter = usize::try_from(len / 4).unwrap_or(usize::MAX);
    let w = quarter.clamp(FLUSH, 12_000);
    if max_held > 0 {
        w.min(max_held)
    } else {
        w
    }
}

/// One epoch's transaction in progress.
struct Run<'a> {
    sink: &'a mut MySqlCdcSink,
    planner: Planner<Row>,
    /// The tables touched, locked in [`TABLES`] until the commit.
    marks: HashMap<String, Marks>,
    counted: MySqlCdcStats,
    window: usize,
}

impl Run<'_> {
    /// Plans and sends the epoch's events; `Ok(Some(ddl))` when a table needs `ddl` first.
    async fn apply(&mut self, epoch: &Epoch) -> Result<Option<Vec<String>>, SinkError> {
        let mut chunks = AsyncChunks::new(epoch);
        let position = self.sink.config.position.clone();
        while let Some(chunk) = chunks.next().await {
            let chunk = chunk
                .map_err(|e| SinkError::retryable(format!("read the epoch: {e}")).with_source(e))?;
            for rec in chunk.records() {
                let at = rec.position;
                let ev = match event::parse(&rec.data, &position) {
                    Ok(Some(ev)) => ev,
                    Ok(None) => continue,
                    Err(error) => {
                        return Err(SinkError::permanent(
                            BadEvent {
                                checkpoint: at.checkpoint,
                                index: at.index,
                                error,
                            }
                            .to_string(),
                        ))
                    }
                };
                self.counted.events += 1;
                if let Some(prepare) = self.push(ev, at).await? {
                    return Ok(Some(prepare));
                }
                if self.planner.held() >= self.window {
                    let steps = self.planner.drain_oldest(FLUSH);
                    self.send(steps).await?;
                }
            }
        }
        let steps = self.planner.drain();
        self.send(steps).await?;
        self.store_marks().await?;
        Ok(None)
    }

    /// The table's metadata, loaded (and its marks locked) the first time the epoch meets it.
    async fn meta(
        &mut self,
        table: &str,
        at: &str,
    ) -> Result<Result<Meta, Vec<String>>, SinkError> {
        if let Some(m) = self.sink.tables.get(table) {
            let m = m.clone();
            self.lock_marks(&m).await?;
            return Ok(Ok(m));
        }
        let c = self.sink.conn().await?;
        let m = match MySqlCdcSink::load_meta(c, table, at).await? {
            Ok(m) => m,
            Err(prepare) => return Ok(Err(prepare)),
        };
        self.sink.tables.insert(table.to_string(), m.clone());
        self.lock_marks(&m).await?;
        Ok(Ok(m))
    }

    async fn lock_marks(&mut self, m: &Meta) -> Result<(), SinkError> {
        let name = &m.plan.name;
        if self.marks.contains_key(name) {
            return Ok(());
        }
        let c = self.sink.conn().await?;
        let what = format!("lock the row of {} in {TABLES}", ident(name));
        c.exec_drop(
            format!("INSERT IGNORE INTO {TABLES} (tbl) VALUES (?)"),
            (name,),
        )
        .await
        .map_err(|e| sink_error(&what, e))?;
        let row: Option<(Option<i64>, Option<i64>)> = c
            .exec_first(
                format!("SELECT truncated_at, high FROM {TABLES} WHERE tbl = ? FOR UPDATE"),
                (name,),
            )
            .await
            .map_err(|e| sink_error(&what, e))?;
        let (truncated_at, mut high) = row.unwrap_or((None, None));
        if high.is_none() {
            // Bookkeeping of a table met for the first time: its high-water from what it holds.
            let q = format!(
                "SELECT (SELECT MAX({p}) FROM {t}), (SELECT MAX({p}) FROM {tomb})",
                p = ident(POS),
                t = ident(name),
                tomb = m.tomb
            );
            let found: Option<(Option<i64>, Option<i64>)> = c
                .query_first(q)
                .await
                .map_err(|e| sink_error(&format!("read the ranks {} holds", ident(name)), e))?;
            let (rows, tombs) = found.unwrap_or((None, None));
            high = [rows, tombs, truncated_at].into_iter().flatten().max();
        }
        self.marks
            .insert(name.clone(), Marks { truncated_at, high });
        Ok(())
    }

    /// Adds one event to the plan; `Ok(Some(ddl))` when its table needs `ddl` first.
    async fn push(
        &mut self,
        mut ev: Event<Row>,
        at: RecordPosition,
    ) -> Result<Option<Vec<String>>, SinkError> {
        let here = where_(ev.op, ev.position, at);
        if self.sink.bookkeeping(&ev.table) {
            return Err(SinkError::permanent(format!(
                "the event is for {}, a table walsink keeps its own bookkeeping in (markers, owners, watermarks, tombstones): replaying it would forge or drop commits; leave walsink's tables out of the capture; {here}",
                ident(&ev.table)
            )));
        }
        let meta = match self.meta(&ev.table, &here).await? {
            Ok(m) => m,
            Err(prepare) => return Ok(Some(prepare)),
        };
        // Images in the table's spelling of each column, without generated columns.
        let mut missing = Vec::new();
        for image in [ev.before.as_mut(), ev.after.as_mut()]
            .into_iter()
            .flatten()
        {
            let mut fixed = Row::new();
            for (name, v) in std::mem::take(image) {
                match meta.column(&name) {
                    Ok(c) => {
                        if v.is_number() && meta.temporal.iter().any(|t| t == c) {
                            return Err(SinkError::permanent(format!(
                                "column {} of table {} is a date or time, and the event holds the number {v} for it (a Debezium epoch encoding such as io.debezium.time.Timestamp); MySQL would read the digits as a date and store another value. Send it as text ('2024-01-31 10:00:00.123'), or make the column a number; {here}",
                                ident(c),
                                ident(&ev.table)
                            )));
                        }
                        if fixed.insert(c.to_string(), v).is_some() {
                            return Err(SinkError::permanent(format!(
                                "the image names column {} of table {} twice (MySQL's column names do not tell case apart); {here}",
                                ident(c),
                                ident(&ev.table)
                            )));
                        }
                    }
                    Err(true) => {}
                    Err(false) if name.eq_ignore_ascii_case(POS) => {
                        return Err(SinkError::permanent(format!(
                            "the event carries a column named {POS}, the column walsink keeps each row's rank in, in table {}; {here}",
                            ident(&ev.table)
                        )))
                    }
                    Err(false) => {
                        missing.push((name.clone(), v.clone()));
                        fixed.insert(name, v);
                    }
                }
            }
            *image = fixed;
        }
        if !missing.is_empty() {
            if !self.sink.config.add_missing_columns {
                let names: Vec<String> = missing.iter().map(|(n, _)| ident(n)).collect();
                return Err(SinkError::permanent(format!(
                    "the replica table {} has no column {} (add it, or set add_missing_columns=true); {here}",
                    ident(&ev.table),
                    names.join(", ")
                )));
            }
            let mut seen = Vec::new();
            let ddl = missing
                .iter()
                .filter(|(n, _)| {
                    let new = !seen.contains(n);
                    seen.push(n.clone());
                    new
                })
                .map(|(n, v)| {
                    format!(
                        "ALTER TABLE {} ADD COLUMN {} {} NULL",
                        ident(&ev.table),
                        ident(n),
                        column_type(v)
                    )
                })
                .collect();
            self.sink.tables.remove(&ev.table);
            return Ok(Some(ddl));
        }
        // An image without some of the table's columns lands on top of what the events
        // before it left, and the events after it on top of it. The planner holds events apart
        // by the key as written, so two spellings of one key (`y` and `Y` under a
        // case-insensitive collation, `7` and `"07"`) could go in statements of their own
        // column sets in either order: the run is cut before and after such an image.
        let partial = ev
            .after
            .as_ref()
            .is_some_and(|a| crate::plan::partial(a, &meta.plan));
        // A key-changing update without all columns would need the old row's values for the
        // columns it lacks (and the server may hold the two spellings as one key): not done
        // here, so refused rather than written with those columns NULL.
        if partial && ev.op == Op::Update {
            if let (Some(b), Some(a)) = (ev.before.as_ref(), ev.after.as_ref()) {
                let before = crate::plan::key_of(b, &meta.plan, "before");
                let after = crate::plan::key_of(a, &meta.plan, "after");
                if let (Ok(before), Ok(after)) = (before, after) {
                    if before != after {
                        return Err(SinkError::permanent(format!(
                            "an update of table {} changes the key's spelling or value while its after image lacks some columns: the replica cannot take the missing values from the old row, so it is refused rather than written with them NULL; send full after images for key changes; {here}",
                            ident(&ev.table)
                        )));
                    }
                }
            }
        }
        if partial {
            self.planner.cut(&ev.table);
        }
        let table = ev.table.clone();
        self.planner
            .push(ev, &meta.plan, at)
            .map_err(|e| SinkError::permanent(format!("{e}; {here}")))?;
        if partial {
            self.planner.cut(&table);
        }
        Ok(None)
    }

    /// Sends planned steps, each as few statements as fit under the statement limit.
    async fn send(&mut self, steps: Vec<Step<Row>>) -> Result<(), SinkError> {
        for step in steps {
            match step {
                Step::Cut { .. } => {}
                Step::Truncate { table, rank, at } => self.truncate(&table, rank, at).await?,
                Step::Upserts {
                    table,
                    columns,
                    rows,
                } => self.upserts(&table, &columns, rows).await?,
                Step::Deletes { table, rows } => self.deletes(&table, rows).await?,
            }
        }
        Ok(())
    }

    fn marks(&mut self, table: &str) -> &mut Marks {
        self.marks
            .get_mut(table)
            .expect("a table's marks are locked before its first event is planned")
    }

    fn meta_of(&self, table: &str) -> Meta {
        self.sink.tables[table].clone()
    }

    /// Drops the changes at or below the table's watermark: no event there applies.
    fn live(&mut self, table: &str, rows: Vec<Change<Row>>) -> Vec<Change<Row>> {
        match self.marks(table).truncated_at {
            Some(w) => rows.into_iter().filter(|r| r.rank > w).collect(),
            None => rows,
        }
    }

    async fn exec(&mut self, sql: String, what: &str) -> Result<(), SinkError> {
        let c = self.sink.conn().await?;
        c.query_drop(sql).await.map_err(|e| sink_error(what, e))
    }

    async fn upserts(
        &mut self,
        table: &str,
        columns: &[String],
        rows: Vec<Change<Row>>,
    ) -> Result<(), SinkError> {
        let rows = self.live(table, rows);
        if rows.is_empty() {
            return Ok(());
        }
        let meta = self.meta_of(table);
        let t = ident(table);
        let mut list: Vec<String> = columns.iter().map(|c| ident(c)).collect();
        list.push(ident(POS));
        let head = format!("INSERT INTO {t} ({}) VALUES ", list.join(", "));
        // Every column takes the new value only when the stored row is older; the rank last,
        // so the conditions before it still see the stored rank.
        let cond = older(&t);
        let mut tail = String::from(" ON DUPLICATE KEY UPDATE ");
        for (i, c) in columns.iter().enumerate() {
            let c = ident(c);
            if i > 0 {
                tail.push_str(", ");
            }
            tail.push_str(&format!("{c} = IF({cond}, VALUES({c}), {c})"));
        }
        if !columns.is_empty() {
            tail.push_str(", ");
        }
        let p = ident(POS);
        tail.push_str(&format!("{p} = IF({cond}, VALUES({p}), {p})"));
        let high = self.marks(table).high;
        let lowest = rows.iter().map(|r| r.rank).min().expect("not empty");
        let highest = rows.iter().map(|r| r.rank).max().expect("not empty");
        // A tombstone can outrank a row written here only when some row ranks at or below
        // what the table held before.
        let check = high.is_some_and(|h| lowest <= h);
        let what = format!("upsert {} rows into {t}", rows.len());
        let mut sql = head.clone();
        let mut in_sql = 0usize;
        let mut batch_keys: Vec<&Row> = Vec::new();
        let mut i = 0;
        while i < rows.len() {
            let r = &rows[i];
            let start = sql.len();
            if in_sql > 0 {
                sql.push_str(", ");
            }
            sql.push('(');
            for (j, c) in columns.iter().enumerate() {
                if j > 0 {
                    sql.push_str(", ");
                }
                push_literal(&mut sql, r.row.get(c).unwrap_or(&Value::Null));
            }
            sql.push_str(&format!(", {})", r.rank));
            if in_sql == 0 && sql.len() + tail.len() > self.sink.packet_limit {
                return Err(SinkError::permanent(format!(
                    "the row of the event at checkpoint {}, index {} makes a statement of {} bytes into {t}, more than the server's max_allowed_packet allows ({} bytes with walsink's margin): raise max_allowed_packet on the server",
                    r.at.checkpoint,
                    r.at.index,
                    sql.len() + tail.len(),
                    self.sink.packet_limit
                )));
            }
            if in_sql > 0 && sql.len() + tail.len() > self.sink.statement_limit {
                sql.truncate(start);
                sql.push_str(&tail);
                self.exec(std::mem::replace(&mut sql, head.clone()), &what)
                    .await?;
                if check {
                    self.tomb_check(&meta, &batch_keys).await?;
                }
                batch_keys.clear();
                in_sql = 0;
                continue;
            }
            in_sql += 1;
            batch_keys.push(&r.row);
            i += 1;
        }
        sql.push_str(&tail);
        self.exec(sql, &what).await?;
        if check {
            self.tomb_check(&meta, &batch_keys).await?;
        }
        let m = self.marks(table);
        m.high = Some(m.high.map_or(highest, |h| h.max(highest)));
        self.counted.upserts += rows.len() as u64;
        Ok(())
    }

    /// Deletes the rows just written for `keys` that a tombstone outranks (a replayed insert
    /// of a key deleted later): written and removed in one transaction, they never show.
    async fn tomb_check(&mut self, meta: &Meta, keys: &[&Row]) -> Result<(), SinkError> {
        let t = ident(&meta.plan.name);
        let on: Vec<String> = meta
            .plan
            .key
            .iter()
            .map(|k| format!("{t}.{k} = {tomb}.{k}", k = ident(k), tomb = meta.tomb))
            .collect();
        for part in keys.chunks(DELETE_KEYS) {
            let mut sql = format!(
                "DELETE {t} FROM {t} JOIN {tomb} ON {on} WHERE {tomb}.{p} > {t}.{p} AND (",
                tomb = meta.tomb,
                on = on.join(" AND "),
                p = ident(POS)
            );
            for (i, row) in part.iter().enumerate() {
                if i > 0 {
                    sql.push_str(" OR ");
                }
                push_key(&mut sql, &t, meta, row);
            }
            sql.push(')');
            self.exec(
                sql,
                &format!("check the rows of {t} against its tombstones"),
            )
            .await?;
            self.counted.tombstone_checks += 1;
        }
        Ok(())
    }

    async fn deletes(&mut self, table: &str, rows: Vec<Change<Row>>) -> Result<(), SinkError> {
        let rows = self.live(table, rows);
        if rows.is_empty() {
            return Ok(());
        }
        let meta = self.meta_of(table);
        let t = ident(table);
        let p = ident(POS);
        for part in rows.chunks(DELETE_KEYS) {
            let mut sql = format!("DELETE FROM {t} WHERE ");
            for (i, r) in part.iter().enumerate() {
                if i > 0 {
                    sql.push_str(" OR ");
                }
                sql.push('(');
                push_key(&mut sql, &t, &meta, &r.row);
                sql.push_str(&format!(" AND ({t}.{p} IS NULL OR {t}.{p} < {}))", r.rank));
            }
            self.exec(sql, &format!("delete {} rows from {t}", part.len()))
                .await?;
        }
        // The tombstones: the newest rank per key.
        let keys: Vec<String> = meta.plan.key.iter().map(|k| ident(k)).collect();
        let head = format!(
            "INSERT INTO {} ({}, {p}) VALUES ",
            meta.tomb,
            keys.join(", ")
        );
        let tail = format!(" ON DUPLICATE KEY UPDATE {p} = GREATEST({p}, VALUES({p}))");
        let mut sql = head.clone();
        let mut n = 0usize;
        for r in &rows {
            if n > 0 {
                sql.push_str(", ");
            }
            sql.push('(');
            for (j, k) in meta.plan.key.iter().enumerate() {
                if j > 0 {
                    sql.push_str(", ");
                }
                push_literal(&mut sql, r.row.get(k).unwrap_or(&Value::Null));
            }
            sql.push_str(&format!(", {})", r.rank));
            n += 1;
            if sql.len() + tail.len() > self.sink.statement_limit / 2 {
                sql.push_str(&tail);
                self.exec(
                    std::mem::replace(&mut sql, head.clone()),
                    "write tombstones",
                )
                .await?;
                n = 0;
            }
        }
        if n > 0 {
            sql.push_str(&tail);
            self.exec(sql, "write tombstones").await?;
        }
        let highest = rows.iter().map(|r| r.rank).max().expect("not empty");
        let m = self.marks(table);
        m.high = Some(m.high.map_or(highest, |h| h.max(highest)));
        self.counted.deletes += rows.len() as u64;
        Ok(())
    }

    async fn truncate(
        &mut self,
        table: &str,
        rank: i64,
        at: RecordPosition,
    ) -> Result<(), SinkError> {
        if self.marks(table).truncated_at.is_some_and(|w| w >= rank) {
            return Ok(());
        }
        let meta = self.meta_of(table);
        let t = ident(table);
        let p = ident(POS);
        let what = format!(
            "truncate {t} (event at checkpoint {}, index {})",
            at.checkpoint, at.index
        );
        // TRUNCATE would commit the epoch's transaction: rows and tombstones at or below the
        // truncate's rank go by DELETE.
        self.exec(
            format!("DELETE FROM {t} WHERE {p} IS NULL OR {p} <= {rank}"),
            &what,
        )
        .await?;
        self.exec(
            format!("DELETE FROM {} WHERE {p} <= {rank}", meta.tomb),
            &what,
        )
        .await?;
        let m = self.marks(table);
        m.truncated_at = Some(rank);
        m.high = Some(m.high.map_or(rank, |h| h.max(rank)));
        self.counted.truncates += 1;
        Ok(())
    }

    async fn store_marks(&mut self) -> Result<(), SinkError> {
        let marks: Vec<(String, Marks)> = self.marks.iter().map(|(k, v)| (k.clone(), *v)).collect();
        for (table, m) in marks {
            let c = self.sink.conn().await?;
            c.exec_drop(
                format!("UPDATE {TABLES} SET truncated_at = ?, high = ? WHERE tbl = ?"),
                (m.truncated_at, m.high, &table),
            )
            .await
            .map_err(|e| sink_error(&format!("store the marks of {}", ident(&table)), e))?;
        }
        Ok(())
    }
}

/// Appends `` `t`.`k1` = v1 AND `t`.`k2` = v2 `` for the key of `row`.
fn push_key(sql: &mut String, t: &str, meta: &Meta, row: &Row) {
    for (j, k) in meta.plan.key.iter().enumerate() {
        if j > 0 {
            sql.push_str(" AND ");
        }
        sql.push_str(&format!("{t}.{} = ", ident(k)));
        push_literal(sql, row.get(k).unwrap_or(&Value::Null));
    }
}

impl AsyncSink for MySqlCdcSink {
    /// # Cancel safety
    /// Dropping the future drops the epoch's transaction uncommitted, which rolls it back
    /// (unless its `COMMIT` was already sent; the marker then shows the epoch in): the
    /// connection is dropped and made again by the next call. A column or table being made
    /// between two attempts is there or not, and the next delivery makes it if not.
    async fn deliver(&mut self, epoch: &Epoch) -> Result<(), SinkError> {
        // A dropped delivery may have left a transaction open on the connection.
        let guard = DropGuard { sink: self };
        for _ in 0..MAX_PREPARES {
            let r = guard.sink.attempt(epoch).await;
            match r {
                Ok(Attempt::Done) => {
                    std::mem::forget(guard);
                    return Ok(());
                }
                Ok(Attempt::Prepare(ddl)) => {
                    for sql in ddl {
                        let c = guard.sink.conn().await?;
                        match c.query_drop(&sql).await {
                            Ok(()) => {}
                            // The column is there after all (made by another sink meanwhile).
                            Err(mysql_async::Error::Server(e)) if e.code == 1060 => {}
                            Err(e) => {
                                guard.sink.tables.clear();
                                return Err(sink_error(&sql, e));
                            }
                        }
                        tracing::info!(statement = %sql, "walsink cdc: prepared the replica");
                    }
                    guard.sink.tables.clear();
                }
                // The guard drops the connection: nothing of the failed attempt stays open on
                // it, whatever step failed.
                Err(e) => return Err(e),
            }
        }
        Err(SinkError::permanent(format!(
            "checkpoint {}: the replica still lacked a column or table after {MAX_PREPARES} attempts to make them",
            epoch.key().checkpoint
        )))
    }

    fn stores_marker(&self) -> bool {
        true
    }

    /// # Cancel safety
    /// Cancel safe: it only reads (a connection half made is dropped and made again).
    async fn is_committed(&mut self, key: &EpochKey) -> Result<bool, SinkError> {
        let marker = self.marker.clone();
        let c = self.conn().await?;
        match marker.is_committed(c, key).await {
            Ok(b) => Ok(b),
            Err(e) => {
                self.conn = None;
                Err(sink_error("read the commit marker", e))
            }
        }
    }
}

/// Drops the connection when a delivery's future is dropped midway, so no transaction of it
/// stays open on a connection the next delivery would use.
struct DropGuard<'a> {
    sink: &'a mut MySqlCdcSink,
}

impl Drop for DropGuard<'_> {
    fn drop(&mut self) {
        self.sink.conn = None;
        self.sink.tables.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tombstone_tables_fit_mysql_names() {
        assert_eq!(tomb_table("orders"), "walsink_tomb_orders");
        let long = "x".repeat(64);
        let t = tomb_table(&long);
        assert!(t.chars().count() <= MAX_IDENT, "{t}");
        assert_ne!(t, tomb_table(&"x".repeat(63)));
    }

    #[test]
    fn literals_keep_what_the_event_wrote() {
        let mut s = String::new();
        for v in [
            serde_json::json!(null),
            serde_json::from_str("1.10").unwrap(),
            serde_json::from_str("123456789012345678901234567890").unwrap(),
            serde_json::json!("it's"),
            serde_json::json!({"a": 1}),
            serde_json::json!(true),
        ] {
            push_literal(&mut s, &v);
            s.push('|');
        }
        assert_eq!(
            s,
            "NULL|1.10|123456789012345678901234567890|'it\\'s'|'{\"a\":1}'|TRUE|"
        );
    }

    #[test]
    fn urls_take_the_connection_and_the_apply_parameters() {
        let c = MySqlCdcConfig::from_url(
            "mysql://root:pw@127.0.0.1:3306/test?add_missing_columns=true&position=source.pos&max_held=100",
        )
        .unwrap();
        assert!(c.add_missing_columns);
        assert_eq!(c.position.path(), "source.pos");
        assert_eq!(c.max_held, 100);
        assert!(!c.to_string().contains("pw"), "{c}");
        for bad in ["table=x", "mode=xa", "schema=x", "max_held=0"] {
            let e = MySqlCdcConfig::from_url(&format!("mysql://root@h/test?{bad}"))
                .unwrap_err()
                .to_string();
            let name = bad.split('=').next().unwrap();
            assert!(e.contains(name), "{bad}: {e}");
        }
    }

    #[test]
    fn added_columns_take_a_type_from_the_value() {
        assert_eq!(column_type(&serde_json::json!(7)), "BIGINT");
        assert_eq!(
            column_type(&serde_json::from_str("123456789012345678901234567890").unwrap()),
            "DECIMAL(65,0)"
        );
        assert_eq!(column_type(&serde_json::json!(1.5)), "DOUBLE");
        assert_eq!(column_type(&serde_json::json!("x")), "LONGTEXT");
        assert_eq!(column_type(&serde_json::json!([1])), "JSON");
        assert_eq!(column_type(&serde_json::json!(false)), "BOOLEAN");
    }
}
