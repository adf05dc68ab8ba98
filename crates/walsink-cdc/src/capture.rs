//! The PostgreSQL logical-decoding source: a snapshot of the tables first (`op: r`), then
//! the changes of a replication slot read with pgoutput through SQL functions, as Debezium
//! events. A resettable source: where it stands ([`SourcePos`]) goes into each checkpoint's
//! metadata, and the slot is advanced only to a position whose epoch the target committed.
//!
//! # No gap, and an overlap made harmless
//! [`Capture::start`] creates the publication, then the slot: `pg_create_logical_replication_slot`
//! returns once the slot is consistent at LSN `C`, and every transaction committing after
//! `C` will be decoded. The snapshot is read after that, page by page in primary-key order,
//! each page in a snapshot of its own, so every transaction that committed before a page was
//! read is in it. So no change is missed: it committed either before `C` (then before every
//! page: in the snapshot) or after (then in the stream). A change that committed after `C`
//! but before a page was read is in both; that overlap is harmless because a snapshot read
//! ranks below every streamed change ([`Event::rank`](crate::Event::rank)): the streamed
//! change is applied over the snapshot row whatever order they arrive in, and a snapshot row
//! never overwrites a row a streamed change wrote. A page resumes after a crash from the last
//! key of the previous page, which is in the checkpoint metadata.
//!
//! # A table added later
//! A `tables=` that adds a table to a checkpoint's ([`Capture::resume`]) puts it in the
//! publication, waits for every transaction running at that commit, and snapshots it as
//! above (appended to [`SourcePos::tables`], its pages before the stream goes on, so the
//! stream pauses meanwhile): its changes logged after it joined are in the stream, those
//! before in the pages, and the overlap is harmless for the same reason.
//!
//! # The slot moves only behind the target
//! Reading peeks (`pg_logical_slot_peek_binary_changes`), which does not move the slot; the
//! reader skips transactions already taken (commit LSN at or below [`SourcePos::commit_lsn`]).
//! [`Capture::advance`] moves the slot to the end of the last transaction of an epoch the
//! target committed (`pg_replication_slot_advance`), so the slot never passes a change the
//! target does not hold, and the server keeps the WAL of every change not yet committed.

pub use crate::config::TableRef;
use crate::config::{ident, PgUrl};
use crate::event::{format_lsn, to_json as event_json, Event, Op, Row};
use crate::pgoutput::{self, Message, Relation};
pub use crate::shape::{AddedColumn, SchemaChange, ShapeColumn, TableShape};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use std::collections::HashMap;
use tokio_postgres::Client;

/// What went wrong with the source.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CaptureError {
    /// A bad `--source` URL or setting; the message names it.
    #[error("{0}")]
    Config(String),
    /// The server refused or the connection failed.
    #[error("{what}: {source}")]
    Server {
        /// What was being done.
        what: String,
        /// The client's error (SQLSTATE and message).
        #[source]
        source: tokio_postgres::Error,
    },
    /// The source is not in a state this capture can continue from.
    #[error("{0}")]
    State(String),
    /// A change could not be decoded.
    #[error("change at LSN {lsn}: {error}")]
    Decode {
        /// The change's LSN.
        lsn: String,
        /// What is wrong.
        error: String,
    },
}

/// `s` as an SQL string literal.
fn literal(s: &str) -> String {
    format!("'{}'", s.replace('\'', "''"))
}

fn server(what: impl Into<String>) -> impl FnOnce(tokio_postgres::Error) -> CaptureError {
    let what = what.into();
    move |source| CaptureError::Server { what, source }
}

/// The source's configuration, from `postgres://USER@HOST:PORT/DB?slot=NAME&tables=a,b`.
///
/// Parameters: `slot` (replication slot, required), `tables` (comma-separated, required;
/// a name that is not all lower-case letters, digits and `_` in double quotes, as in SQL:
/// `tables="MixedCase",sales."order items"`),
/// `publication` (default: the slot's name), `snapshot_rows` (rows per snapshot page, default
/// 5000), `read_changes` (changes per read, default 20000), `drop_slot_on_new` (drop a slot of
/// that name that no checkpoint knows instead of refusing, default false).
#[derive(Debug, Clone)]
pub struct SourceConfig {
    /// The connection (password never shown).
    pub url: PgUrl,
    /// Slot name.
    pub slot: String,
    /// Publication name.
    pub publication: String,
    /// Tables captured, in snapshot order.
    pub tables: Vec<TableRef>,
    /// Rows per snapshot page.
    pub snapshot_rows: i64,
    /// Changes per read.
    pub read_changes: i64,
}

fn name_ok(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && !s.as_bytes()[0].is_ascii_digit()
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
}

/// Splits `s` at each `sep` outside double quotes.
fn split_names(s: &str, sep: char) -> Result<Vec<String>, String> {
    let (mut out, mut cur, mut quoted) = (Vec::new(), String::new(), false);
    for ch in s.chars() {
        if ch == '"' {
            quoted = !quoted;
        }
        if ch == sep && !quoted {
            out.push(std::mem::take(&mut cur));
        } else {
            cur.push(ch);
        }
    }
    if quoted {
        return Err(format!(
            "parameter tables: {s:?} has an unclosed double quote"
        ));
    }
    out.push(cur);
    Ok(out)
}

/// One part of a table name: `"Exact Name"` (with `""` for a quote) as written, or a plain
/// name of lower-case letters, digits and `_` (what PostgreSQL folds an unquoted name to).
fn table_name(p: &str) -> Option<String> {
    let p = p.trim();
    if let Some(inner) = p.strip_prefix('"').and_then(|r| r.strip_suffix('"')) {
        let name = inner.replace("\"\"", "\"");
        let ok = !name.is_empty()
            && name.len() <= 63
            && inner.replace("\"\"", "").chars().all(|c| c != '"');
        return ok.then_some(name);
    }
    name_ok(p).then(|| p.to_string())
}

impl SourceConfig {
    /// Parses the `--source` URL; errors name the parameter.
    pub fn from_url(url: &str) -> Result<SourceConfig, CaptureError> {
        let url = PgUrl::parse(url).map_err(CaptureError::Config)?;
        let (mut slot, mut publication, mut tables) = (None, None, Vec::new());
        let (mut snapshot_rows, mut read_changes) = (5000, 20_000);
        let count = |k: &str, v: &str| {
            v.parse::<i64>().ok().filter(|n| *n > 0).ok_or_else(|| {
                CaptureError::Config(format!("parameter {k}={v:?}: expected a positive count"))
            })
        };
        for (k, v) in &url.params {
            match k.as_str() {
                "slot" | "publication" => {
                    if !name_ok(v) {
                        return Err(CaptureError::Config(format!(
                            "parameter {k}={v:?}: expected 1 to 63 lower-case letters, digits or _, not starting with a digit"
                        )));
                    }
                    if k == "slot" {
                        slot = Some(v.clone())
                    } else {
                        publication = Some(v.clone())
                    }
                }
                "tables" => {
                    for t in split_names(v, ',')
                        .map_err(CaptureError::Config)?
                        .iter()
                        .map(|t| t.trim())
                        .filter(|t| !t.is_empty())
                    {
                        let parts = split_names(t, '.').map_err(CaptureError::Config)?;
                        let parsed: Option<Vec<String>> = parts.iter().map(|p| table_name(p)).collect();
                        let (schema, name) = match parsed.as_deref() {
                            Some([name]) => ("public".to_string(), name.clone()),
                            Some([schema, name]) => (schema.clone(), name.clone()),
                            _ => {
                                return Err(CaptureError::Config(format!(
                                    "parameter tables: {t:?} is not `table` or `schema.table`, each name of lower-case letters, digits or _, or in double quotes (\"MixedCase\", \"with space\")"
                                )))
                            }
                        };
                        tables.push(TableRef { schema, name });
                    }
                }
                "snapshot_rows" => snapshot_rows = count(k, v)?,
                "read_changes" => read_changes = count(k, v)?,
                _ => {
                    return Err(CaptureError::Config(format!(
                        "unknown parameter {k:?} (known: slot, tables, publication, snapshot_rows, read_changes)"
                    )))
                }
            }
        }
        let slot = slot.ok_or_else(|| {
            CaptureError::Config(
                "--source needs slot=NAME (a logical replication slot, created if missing)".into(),
            )
        })?;
        if tables.is_empty() {
            return Err(CaptureError::Config(
                "--source needs tables=a,b (the tables to capture)".into(),
            ));
        }
        let mut names: Vec<&str> = tables.iter().map(|t| t.name.as_str()).collect();
        names.sort();
        if names.windows(2).any(|w| w[0] == w[1]) {
            return Err(CaptureError::Config(
                "parameter tables: two tables of the same name (the target schema holds one of each)".into(),
            ));
        }
        Ok(SourceConfig {
            publication: publication.unwrap_or_else(|| slot.clone()),
            slot,
            tables,
            snapshot_rows,
            read_changes,
            url,
        })
    }
}

/// Where a snapshot stands: the table being read and the last key read in it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SnapshotPos {
    /// Index into [`SourcePos::tables`] (into [`SourceConfig::tables`] when that is empty).
    pub table: usize,
    /// The key columns of the last row read (as JSON), `None` before the first page.
    pub after: Option<Row>,
}

/// Where the source stands; kept in each checkpoint's metadata.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SourcePos {
    /// The slot.
    pub slot: String,
    /// The slot's consistent point: the position of snapshot reads.
    pub consistent_point: u64,
    /// The snapshot in progress; `None` once it is done.
    pub snapshot: Option<SnapshotPos>,
    /// The commit LSN of the last transaction taken from the stream (0: none yet).
    pub commit_lsn: u64,
    /// The end LSN of that transaction: where the slot may go once its epoch is committed.
    pub end_lsn: u64,
    /// Events emitted through this position.
    pub events: u64,
    /// The tables this pipeline captures, in snapshot order ([`SnapshotPos::table`] indexes
    /// it): as `tables=` named them when it started, then each table a later `tables=` added
    /// ([`Capture::resume`]). Empty in metadata written before this was kept (then `tables=`
    /// stands for it, and nothing can be added). A run without one of them is refused
    /// ([`Capture::check_resume`]).
    #[serde(default)]
    pub tables: Vec<TableRef>,
    /// Each captured table's columns as the replica holds them after the last transaction
    /// taken: what the stream's relation messages are compared with, to find schema changes
    /// (empty in metadata written before this was kept: then the source's catalog at connect).
    #[serde(default)]
    pub shapes: Vec<TableShape>,
}

/// The shapes of the tables during one transaction taken.
struct TxnShapes {
    /// As the rows now come.
    cur: Vec<TableShape>,
    /// As the replica will hold them after the transaction: columns added, none dropped.
    persisted: Vec<TableShape>,
    /// Relations whose current description was checked.
    synced: std::collections::HashSet<u32>,
    /// Relations with a change in the transaction so far.
    rows_seen: std::collections::HashSet<u32>,
    /// Columns added in the transaction.
    adds: Vec<SchemaChange>,
}

impl TxnShapes {
    fn new(shapes: &[TableShape]) -> TxnShapes {
        TxnShapes {
            cur: shapes.to_vec(),
            persisted: shapes.to_vec(),
            synced: Default::default(),
            rows_seen: Default::default(),
            adds: Vec::new(),
        }
    }
}

/// The outcome of checking a relation's columns.
enum Synced {
    /// Followed (or nothing changed).
    Yes,
    /// Columns dropped before the table's first change in the transaction: dropped from the
    /// replica first, in a batch of its own.
    DropFirst(SchemaChange),
}

/// What [`Capture::gate`] decides for one change.
enum Gate {
    /// Take the change.
    Take,
    /// End the batch before it.
    End,
    /// Return this from the read now.
    Return(Result<Batch, CaptureError>),
}

impl Batch {
    /// The batch that only drops `ch`'s columns, at `pos` (nothing read after it).
    fn drop_first(mut pos: SourcePos, ch: SchemaChange) -> Batch {
        if let Some(s) = pos.shapes.iter_mut().find(|s| s.table == ch.table) {
            *s = ch.shape.clone();
        }
        Batch {
            events: Vec::new(),
            pos,
            changes: vec![ch],
        }
    }
}

/// A batch of events read from the source, and where the source stands after it.
#[derive(Debug)]
pub struct Batch {
    /// Debezium events (JSON), one per record.
    pub events: Vec<Vec<u8>>,
    /// The position after these events.
    pub pos: SourcePos,
    /// Schema changes to apply to the replica before going on (the batch then holds no
    /// events): see [`SchemaChange`].
    pub changes: Vec<SchemaChange>,
}

/// A table's columns (name, type OID) and its key columns.
type TableColumns = (Vec<(String, u32)>, Vec<String>);

/// A connection to the source.
pub struct Capture {
    cfg: SourceConfig,
    client: Client,
    relations: HashMap<u32, Relation>,
    /// Per table: columns with types, key columns.
    columns: HashMap<(String, String), TableColumns>,
    /// The tables' shapes from the catalog at connect: for a position that holds none.
    shapes: Vec<TableShape>,
}

impl std::fmt::Debug for Capture {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Capture")
            .field("source", &self.cfg.url.shown())
            .finish_non_exhaustive()
    }
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

impl Capture {
    /// Connects to the source and reads the tables' columns and keys.
    ///
    /// # Cancel safety
    /// Cancel safe: a connection half set up is dropped, and the next call connects anew.
    pub async fn connect(cfg: SourceConfig) -> Result<Capture, CaptureError> {
        let (client, conn) = cfg
            .url
            .client_config("walsink-cdc-source")
            .connect(tokio_postgres::NoTls)
            .await
            .map_err(server(format!("connect to the source {}", cfg.url.shown())))?;
        tokio::spawn(async move {
            if let Err(e) = conn.await {
                tracing::debug!(error = %e, "cdc source connection ended");
            }
        });
        // Before anything is read or created anywhere: without logical decoding nothing
        // here can work, and the caller has created nothing yet.
        let level: String = client
            .query_one("SHOW wal_level", &[])
            .await
            .map_err(server("read wal_level"))?
            .get(0);
        if level != "logical" {
            return Err(CaptureError::State(format!(
                "the source {} runs wal_level={level}; logical decoding needs wal_level=logical (set it and restart the server); nothing was created",
                cfg.url.shown()
            )));
        }
        let mut c = Capture {
            cfg,
            client,
            relations: HashMap::new(),
            columns: HashMap::new(),
            shapes: Vec::new(),
        };
        for t in c.cfg.tables.clone() {
            // Stored generated columns are left out: the change stream does not carry them
            // (PostgreSQL 15), and the replica computes them itself (see `target_ddl`).
            let cols = c
                .client
                .query(
                    "SELECT a.attname::text, a.atttypid::int8, a.atttypmod, c.oid::int8 FROM pg_attribute a \
                     JOIN pg_class c ON c.oid = a.attrelid WHERE a.attrelid = to_regclass($1) \
                     AND a.attnum > 0 AND NOT a.attisdropped AND a.attgenerated = '' ORDER BY a.attnum",
                    &[&t.qualified()],
                )
                .await
                .map_err(server(format!("read the columns of {}", t.qualified())))?;
            if cols.is_empty() {
                return Err(CaptureError::State(format!(
                    "source table {} does not exist (a name that is not all lower case goes in double quotes in tables=)",
                    t.qualified()
                )));
            }
            let key = c
                .client
                .query(
                    "SELECT a.attname::text FROM pg_index i, unnest(i.indkey) WITH ORDINALITY AS k(attnum, n), pg_attribute a \
                     WHERE i.indrelid = to_regclass($1) AND i.indisprimary AND a.attrelid = i.indrelid AND a.attnum = k.attnum ORDER BY k.n",
                    &[&t.qualified()],
                )
                .await
                .map_err(server("read the primary key"))?;
            if key.is_empty() {
                return Err(CaptureError::State(format!(
                    "source table {} has no primary key; changes are captured and applied by primary key \
                     (a table without one, even with REPLICA IDENTITY FULL, is refused: rows that are \
                     equal in every column could not be told apart); add a primary key or leave the table out of tables=",
                    t.qualified()
                )));
            }
            let key: Vec<String> = key.iter().map(|r| r.get(0)).collect();
            c.shapes.push(TableShape {
                oid: cols[0].get::<_, i64>(3) as u32,
                table: t.clone(),
                columns: cols
                    .iter()
                    .map(|r| {
                        let name: String = r.get(0);
                        ShapeColumn {
                            key: key.contains(&name),
                            name,
                            type_oid: r.get::<_, i64>(1) as u32,
                            typmod: r.get(2),
                        }
                    })
                    .collect(),
            });
            c.columns.insert(
                (t.schema.clone(), t.name.clone()),
                (
                    cols.iter()
                        .map(|r| (r.get(0), r.get::<_, i64>(1) as u32))
                        .collect(),
                    key,
                ),
            );
        }
        Ok(c)
    }

    /// Refuses to go on from `pos` when `tables=` leaves out a table the pipeline captures:
    /// the table stays in the publication, so its changes would go on arriving (and be
    /// refused as not captured). Its replica table is left as it is: not dropped, and no
    /// longer updated once a pipeline of other tables takes over. A table added to `tables=`
    /// is not refused here: [`Capture::resume`] adds it to the publication and snapshots it.
    ///
    /// # Errors
    /// [`CaptureError::State`] naming the tables removed, and what to do.
    pub fn check_resume(&self, pos: &SourcePos) -> Result<(), CaptureError> {
        let removed = Self::names(&pos.tables, &self.cfg.tables);
        if removed.is_empty() {
            return Ok(());
        }
        Err(CaptureError::State(format!(
            "tables= removes {removed} of the tables this pipeline (slot {}) captures ({}); a table cannot be removed from a pipeline \
             (it stays in publication {}, so its changes would go on arriving); its replica table is left as it is. \
             Give all of them again (tables may be added), or capture other tables with a pipeline of their own (another slot, --wal and schema or --sink-id)",
            self.cfg.slot,
            pos.tables.iter().map(TableRef::qualified).collect::<Vec<_>>().join(", "),
            ident(&self.cfg.publication)
        )))
    }

    /// The tables of `a` that are not in `b`, qualified and comma-separated.
    fn names(a: &[TableRef], b: &[TableRef]) -> String {
        a.iter()
            .filter(|t| !b.contains(t))
            .map(TableRef::qualified)
            .collect::<Vec<_>>()
            .join(", ")
    }

    /// The tables `pos` captures, in snapshot order (`tables=` for a position that holds none).
    fn tables_of<'a>(&'a self, pos: &'a SourcePos) -> &'a [TableRef] {
        if pos.tables.is_empty() {
            &self.cfg.tables
        } else {
            &pos.tables
        }
    }

    /// Goes on from `pos` (a checkpoint's) with this capture's `tables=`: refuses a removed
    /// table ([`Capture::check_resume`]), and takes each table `tables=` adds to those of
    /// `pos`, returning the position to go on from (`pos` itself when nothing was added).
    ///
    /// An added table is added to the publication (`ALTER PUBLICATION … ADD TABLE`, unless
    /// it is in it already), then every transaction that was running when that committed is
    /// waited for (a change logged before the table was in the publication is not decoded,
    /// even when its transaction commits later, so it must be in the snapshot); then the
    /// returned position snapshots the table (appended to [`SourcePos::tables`]) page by page
    /// before the stream goes on, as the first snapshot does. The stream's changes of the
    /// table all come after it joined the publication; a page read after one of them holds it
    /// too, and that overlap is harmless because snapshot reads rank below every streamed
    /// change. Changes before it joined are not in the stream but in the snapshot, which is
    /// read after they committed. Call [`Capture::target_ddl`] to create its replica table.
    ///
    /// # Errors
    /// [`CaptureError::State`] for a removed table; [`CaptureError::Server`] if the
    /// publication cannot be altered.
    ///
    /// # Cancel safety
    /// If dropped, the table may be in the publication already (while the position returned
    /// was never kept); call it again with the same `pos`: a table in the publication is not
    /// added again, and its snapshot starts from its first page.
    pub async fn resume(&mut self, pos: &SourcePos) -> Result<SourcePos, CaptureError> {
        self.check_resume(pos)?;
        let mut published = Vec::new();
        for t in &self.cfg.tables {
            published.push(
                self.client
                    .query_opt(
                        "SELECT 1 FROM pg_publication_tables WHERE pubname = $1 AND schemaname = $2 AND tablename = $3",
                        &[&self.cfg.publication, &t.schema, &t.name],
                    )
                    .await
                    .map_err(server("read the publication's tables"))?
                    .is_some(),
            );
        }
        let mut pos = pos.clone();
        if pos.tables.is_empty() {
            // Metadata written before the table list was kept: the tables it captured are
            // those of `tables=` in the publication (one that is not was never captured).
            if published.iter().all(|p| *p) {
                return Ok(pos);
            }
            if pos.snapshot.is_some() {
                return Err(CaptureError::State(format!(
                    "tables= adds a table to a pipeline whose first snapshot is in progress and whose checkpoint holds no table list \
                     (written by an older walsink); resume with the tables it was started with first (those in publication {}), then add it",
                    ident(&self.cfg.publication)
                )));
            }
            pos.tables = self
                .cfg
                .tables
                .iter()
                .zip(&published)
                .filter(|(_, p)| **p)
                .map(|(t, _)| t.clone())
                .collect();
            pos.shapes.clear();
        }
        let added: Vec<(TableRef, bool)> = self
            .cfg
            .tables
            .iter()
            .zip(&published)
            .filter(|(t, _)| !pos.tables.contains(t))
            .map(|(t, p)| (t.clone(), *p))
            .collect();
        if added.is_empty() {
            return Ok(pos);
        }
        for (t, there) in &added {
            if !there {
                self.client
                    .batch_execute(&format!(
                        "ALTER PUBLICATION {} ADD TABLE {}",
                        ident(&self.cfg.publication),
                        t.qualified()
                    ))
                    .await
                    .map_err(server(format!(
                        "add {} to the publication {}",
                        t.qualified(),
                        ident(&self.cfg.publication)
                    )))?;
            }
        }
        self.wait_running().await?;
        let mut next = pos;
        let first = next.tables.len();
        for (t, _) in &added {
            next.tables.push(t.clone());
            if !next.shapes.is_empty() {
                if let Some(s) = self.shapes.iter().find(|s| &s.table == t) {
                    next.shapes.push(s.clone());
                }
            }
        }
        if next.snapshot.is_none() {
            next.snapshot = Some(SnapshotPos {
                table: first,
                after: None,
            });
        }
        Ok(next)
    }

    /// Waits until every transaction running now has ended.
    async fn wait_running(&self) -> Result<(), CaptureError> {
        let snap: String = self
            .client
            .query_one("SELECT pg_current_snapshot()::text", &[])
            .await
            .map_err(server("read the running transactions"))?
            .get(0);
        let started = std::time::Instant::now();
        let mut told = false;
        loop {
            let done: bool = self
                .client
                .query_one(
                    "SELECT pg_snapshot_xmin(pg_current_snapshot()) >= pg_snapshot_xmax($1::text::pg_snapshot)",
                    &[&snap],
                )
                .await
                .map_err(server("read the running transactions"))?
                .get(0);
            if done {
                return Ok(());
            }
            if !told && started.elapsed() > std::time::Duration::from_secs(10) {
                told = true;
                tracing::warn!(
                    "cdc source: waiting for transactions that were running when a table was added to the publication (snapshot {snap})"
                );
            }
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
    }

    /// The configuration.
    pub fn config(&self) -> &SourceConfig {
        &self.cfg
    }

    /// `CREATE TABLE IF NOT EXISTS` statements for the target schema, from the source
    /// tables' columns, types, `NOT NULL`s, stored generated columns (`GENERATED ALWAYS AS
    /// (expression) STORED`, the expression from `pg_get_expr`) and primary keys; and for
    /// each generated column a check that refuses (SQLSTATE 42P16, naming the table and the
    /// column) a replica table that was there already with the column plain or missing: the
    /// change stream does not carry a generated column's values, so it would go stale.
    ///
    /// # Cancel safety
    /// Cancel safe: it only reads; call it again.
    pub async fn target_ddl(&self, target_schema: &str) -> Result<Vec<String>, CaptureError> {
        let mut out = Vec::new();
        for t in &self.cfg.tables {
            let rows = self
                .client
                .query(
                    "SELECT a.attname::text, format_type(a.atttypid, a.atttypmod), a.attnotnull, \
                       CASE WHEN a.attgenerated = 's' THEN pg_get_expr(d.adbin, d.adrelid) END \
                     FROM pg_attribute a LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum \
                     WHERE a.attrelid = to_regclass($1) AND a.attnum > 0 AND NOT a.attisdropped ORDER BY a.attnum",
                    &[&t.qualified()],
                )
                .await
                .map_err(server("read the source's table definitions"))?;
            let mut cols: Vec<String> = rows
                .iter()
                .map(|r| {
                    let nn = if r.get::<_, bool>(2) { " NOT NULL" } else { "" };
                    let generated = r.get::<_, Option<String>>(3).map_or(String::new(), |e| {
                        format!(" GENERATED ALWAYS AS ({e}) STORED")
                    });
                    format!(
                        "{} {}{generated}{nn}",
                        ident(r.get(0)),
                        r.get::<_, String>(1)
                    )
                })
                .collect();
            let key = &self.columns[&(t.schema.clone(), t.name.clone())].1;
            cols.push(format!(
                "PRIMARY KEY ({})",
                key.iter().map(|k| ident(k)).collect::<Vec<_>>().join(", ")
            ));
            let replica = format!("{}.{}", ident(target_schema), ident(&t.name));
            out.push(format!(
                "CREATE TABLE IF NOT EXISTS {replica} ({})",
                cols.join(", ")
            ));
            // A replica table that was there already must compute the source's stored
            // generated columns too: the stream does not carry their values, so a plain
            // column would stay NULL or stale.
            for r in rows
                .iter()
                .filter(|r| r.get::<_, Option<String>>(3).is_some())
            {
                let c: String = r.get(0);
                let msg = format!(
                    "replica table {replica} has no stored generated column {} while the source's {}.{} is GENERATED ALWAYS AS ({}) STORED: \
                     the change stream does not carry its values, so the replica would go stale; \
                     make the replica's column generated the same way (or drop the replica table to let walsink create it)",
                    ident(&c),
                    t.qualified(),
                    ident(&c),
                    r.get::<_, String>(3)
                );
                out.push(format!(
                    "DO $walsink$ BEGIN IF NOT EXISTS (SELECT 1 FROM pg_attribute WHERE attrelid = to_regclass({}) \
                     AND attname = {} AND NOT attisdropped AND attgenerated = 's') THEN \
                     RAISE EXCEPTION USING MESSAGE = {}, ERRCODE = '42P16'; END IF; END $walsink$",
                    literal(&replica),
                    literal(&c),
                    literal(&msg.replace("$walsink$", "$ walsink $"))
                ));
            }
        }
        Ok(out)
    }

    /// The slot's state: its confirmed position, or `None` when there is no such slot.
    ///
    /// # Cancel safety
    /// Cancel safe: it only reads; call it again.
    pub async fn slot_position(&self) -> Result<Option<u64>, CaptureError> {
        let row = self
            .client
            .query_opt(
                "SELECT confirmed_flush_lsn::text, plugin::text, database::text FROM pg_replication_slots WHERE slot_name = $1",
                &[&self.cfg.slot],
            )
            .await
            .map_err(server("read the replication slot"))?;
        let Some(row) = row else { return Ok(None) };
        let plugin: Option<String> = row.get(1);
        if plugin.as_deref() != Some("pgoutput") {
            return Err(CaptureError::State(format!(
                "replication slot {} uses plugin {plugin:?}, not pgoutput; use another slot name",
                self.cfg.slot
            )));
        }
        let lsn: Option<String> = row.get(0);
        Ok(Some(
            lsn.as_deref()
                .and_then(crate::event::parse_lsn)
                .unwrap_or(0),
        ))
    }

    /// Starts a capture from nothing: creates the publication (if missing), then the slot
    /// (if missing), and returns the position before the snapshot's first page. See the
    /// module docs for why this order leaves no gap.
    ///
    /// # Cancel safety
    /// If dropped, the publication or the slot may already exist; both are created only when
    /// missing, so call it again.
    pub async fn start(&mut self) -> Result<SourcePos, CaptureError> {
        let exists = self
            .client
            .query_opt(
                "SELECT 1 FROM pg_publication WHERE pubname = $1",
                &[&self.cfg.publication],
            )
            .await
            .map_err(server("read the publications"))?
            .is_some();
        if !exists {
            let list = self
                .cfg
                .tables
                .iter()
                .map(TableRef::qualified)
                .collect::<Vec<_>>()
                .join(", ");
            self.client
                .batch_execute(&format!(
                    "CREATE PUBLICATION {} FOR TABLE {list}",
                    ident(&self.cfg.publication)
                ))
                .await
                .map_err(server("create the publication"))?;
        }
        let c = match self.slot_position().await? {
            Some(c) => c,
            None => {
                let row = self
                    .client
                    .query_one(
                        "SELECT lsn::text FROM pg_create_logical_replication_slot($1, 'pgoutput')",
                        &[&self.cfg.slot],
                    )
                    .await
                    .map_err(server("create the replication slot"))?;
                let lsn: String = row.get(0);
                crate::event::parse_lsn(&lsn).unwrap_or(0)
            }
        };
        Ok(SourcePos {
            slot: self.cfg.slot.clone(),
            consistent_point: c,
            snapshot: Some(SnapshotPos {
                table: 0,
                after: None,
            }),
            commit_lsn: 0,
            end_lsn: 0,
            events: 0,
            tables: self.cfg.tables.clone(),
            shapes: self.shapes.clone(),
        })
    }

    /// Reads the next snapshot page (`op: r` events) after `pos`, or the stream's next
    /// transactions once the snapshot is done. A batch with [`Batch::changes`] holds a
    /// schema change the replica follows: run each change's [`SchemaChange::ddl`] on the
    /// target once everything read before is committed, then seal the batch (its events, if
    /// any, need the change first).
    ///
    /// # Errors
    /// [`CaptureError::Decode`] naming the table and the column or change when a table's
    /// columns changed in a way the replica cannot follow (a type, a rename, an order, a
    /// dropped key column, a renamed table, a table not in `tables=`); the transactions
    /// before it were returned by the calls before. [`CaptureError::State`] for a column
    /// added with a default, a table removed from `tables=` ([`Capture::check_resume`]), or
    /// one added that [`Capture::resume`] did not take.
    ///
    /// # Cancel safety
    /// Cancel safe: it reads (the slot is peeked, never consumed, and a snapshot page is a
    /// query); call it again with the same position.
    pub async fn next(&mut self, pos: &SourcePos) -> Result<Batch, CaptureError> {
        self.check_resume(pos)?;
        let added = Self::names(&self.cfg.tables, self.tables_of(pos));
        if !added.is_empty() {
            return Err(CaptureError::State(format!(
                "tables= adds {added} to the tables of this position: take them with Capture::resume first"
            )));
        }
        match &pos.snapshot {
            Some(s) => self.snapshot_page(pos, s.clone()).await,
            None => self.changes(pos).await,
        }
    }

    async fn snapshot_page(
        &mut self,
        pos: &SourcePos,
        s: SnapshotPos,
    ) -> Result<Batch, CaptureError> {
        let mut next = pos.clone();
        let tables = self.tables_of(pos).to_vec();
        let Some(t) = tables.get(s.table).cloned() else {
            next.snapshot = None;
            return Ok(Batch {
                events: Vec::new(),
                pos: next,
                changes: Vec::new(),
            });
        };
        let (cols, key) = self.columns[&(t.schema.clone(), t.name.clone())].clone();
        let q = t.qualified();
        let texts = cols
            .iter()
            .map(|(c, _)| format!("t.{}::text", ident(c)))
            .collect::<Vec<_>>()
            .join(", ");
        let keys = key
            .iter()
            .map(|k| format!("t.{}", ident(k)))
            .collect::<Vec<_>>()
            .join(", ");
        let lim = self.cfg.snapshot_rows;
        let rows = match &s.after {
            None => {
                self.client
                    .query(
                        &format!("SELECT ARRAY[{texts}] FROM {q} t ORDER BY {keys} LIMIT {lim}"),
                        &[],
                    )
                    .await
            }
            Some(after) => {
                let kk = key.iter().map(|k| format!("k.{}", ident(k))).collect::<Vec<_>>().join(", ");
                self.client
                    .query(
                        &format!(
                            "SELECT ARRAY[{texts}] FROM {q} t WHERE ({keys}) > (SELECT {kk} FROM jsonb_populate_record(NULL::{q}, $1::jsonb) k) \
                             ORDER BY {keys} LIMIT {lim}"
                        ),
                        &[&Value::Object(after.clone())],
                    )
                    .await
            }
        }
        .map_err(server(format!("read the snapshot of {q}")))?;
        let mut events = Vec::with_capacity(rows.len());
        let mut last = None;
        let ts = now_ms();
        for r in &rows {
            let vals: Vec<Option<String>> = r.get(0);
            let mut after = Row::new();
            for ((c, oid), v) in cols.iter().zip(vals) {
                after.insert(
                    c.clone(),
                    v.map_or(Value::Null, |v| pgoutput::to_json(*oid, &v)),
                );
            }
            last = Some(
                key.iter()
                    .map(|k| (k.clone(), after[k].clone()))
                    .collect::<Row>(),
            );
            let e = Event {
                op: Op::Read,
                db: Some(self.cfg.url.dbname.clone()),
                schema: Some(t.schema.clone()),
                table: t.name.clone(),
                position: pos.consistent_point,
                before: None,
                after: Some(after),
            };
            events.push(
                event_json(&e, &[("snapshot", json!("true"))], ts)
                    .to_string()
                    .into_bytes(),
            );
        }
        next.events += events.len() as u64;
        next.snapshot = if (rows.len() as i64) < lim {
            // This table is done: the next one, or the stream.
            (s.table + 1 < tables.len()).then_some(SnapshotPos {
                table: s.table + 1,
                after: None,
            })
        } else {
            Some(SnapshotPos {
                table: s.table,
                after: last,
            })
        };
        Ok(Batch {
            events,
            pos: next,
            changes: Vec::new(),
        })
    }

    /// The stream's transactions after `pos`, whole, up to about `read_changes` changes.
    async fn changes(&mut self, pos: &SourcePos) -> Result<Batch, CaptureError> {
        let mut limit = self.cfg.read_changes;
        loop {
            let n32 = limit.min(i32::MAX as i64) as i32;
            let params: [&(dyn tokio_postgres::types::ToSql + Sync); 3] =
                [&self.cfg.slot, &n32, &self.cfg.publication];
            let rows = while_busy(|| {
                self.client.query(
                    "SELECT lsn::text, data FROM pg_logical_slot_peek_binary_changes($1, NULL, $2::int4, \
                     'proto_version', '1', 'publication_names', $3)",
                    &params,
                )
            })
            .await
            .map_err(server(format!("read the replication slot {}", self.cfg.slot)))?;
            let n = rows.len() as i64;
            let mut batch = self.decode(pos, &rows)?;
            for change in &mut batch.changes {
                for c in &mut change.added {
                    c.sql_type = self
                        .client
                        .query_one(
                            "SELECT format_type($1::int8::oid, $2)",
                            &[&(c.type_oid as i64), &c.typmod],
                        )
                        .await
                        .map_err(server("read the type of an added column"))?
                        .get(0);
                }
                self.check_added(change).await?;
            }
            // Only transactions taken already, and the read was cut by the limit: the target
            // lags behind the reader, so read further.
            if batch.changes.is_empty() && batch.pos.commit_lsn == pos.commit_lsn && n >= limit {
                limit = limit.saturating_mul(2);
                continue;
            }
            return Ok(batch);
        }
    }

    fn decode(
        &mut self,
        pos: &SourcePos,
        rows: &[tokio_postgres::Row],
    ) -> Result<Batch, CaptureError> {
        let mut next = pos.clone();
        if next.shapes.is_empty() {
            next.shapes = self.shapes.clone();
        }
        if next.tables.is_empty() {
            next.tables = self.cfg.tables.clone();
        }
        let mut events = Vec::new();
        let mut txn: Option<(u64, u32, Vec<Vec<u8>>)> = None; // (commit lsn, xid, events)
        let mut shapes: Option<TxnShapes> = None; // of the transaction taken
        let ts = now_ms();
        'rows: for r in rows {
            let lsn_text: String = r.get(0);
            let lsn = crate::event::parse_lsn(&lsn_text).unwrap_or(0);
            let data: Vec<u8> = r.get(1);
            let msg = pgoutput::decode(&data).map_err(|e| CaptureError::Decode {
                lsn: lsn_text.clone(),
                error: e.to_string(),
            })?;
            let change = |rel: u32, relations: &HashMap<u32, Relation>| {
                relations
                    .get(&rel)
                    .cloned()
                    .ok_or_else(|| CaptureError::Decode {
                        lsn: lsn_text.clone(),
                        error: format!("change for relation {rel} before its description"),
                    })
            };
            let push =
                |txn: &mut Option<(u64, u32, Vec<Vec<u8>>)>, rel: &Relation, op, before, after| {
                    if let Some((_, xid, evs)) = txn.as_mut() {
                        let e = Event {
                            op,
                            db: Some(self.cfg.url.dbname.clone()),
                            schema: Some(rel.schema.clone()),
                            table: rel.name.clone(),
                            position: lsn,
                            before,
                            after,
                        };
                        evs.push(
                            event_json(&e, &[("txId", json!(*xid))], ts)
                                .to_string()
                                .into_bytes(),
                        );
                    }
                };
            match msg {
                Message::Begin { final_lsn, xid } => {
                    // Transactions taken already are skipped whole.
                    txn = (final_lsn > pos.commit_lsn).then_some((final_lsn, xid, Vec::new()));
                    shapes = txn.is_some().then(|| TxnShapes::new(&next.shapes));
                }
                Message::Commit {
                    commit_lsn,
                    end_lsn,
                } => {
                    if let Some((_, _, evs)) = txn.take() {
                        let st = shapes.take().expect("set at Begin");
                        if !st.adds.is_empty() && !events.is_empty() {
                            // Columns added in this transaction: it goes in a batch of its
                            // own, after the columns are added.
                            break;
                        }
                        events.extend(evs);
                        next.commit_lsn = commit_lsn;
                        next.end_lsn = end_lsn;
                        if !st.adds.is_empty() {
                            next.shapes = st.persisted;
                            next.events += events.len() as u64;
                            return Ok(Batch {
                                events,
                                pos: next,
                                changes: st.adds,
                            });
                        }
                    }
                }
                Message::Relation(rel) => {
                    if let Some(st) = shapes.as_mut() {
                        st.synced.remove(&rel.id);
                    }
                    self.relations.insert(rel.id, rel);
                }
                Message::Insert { rel, new } => {
                    let rel = change(rel, &self.relations)?;
                    match self.gate(shapes.as_mut(), &rel, !events.is_empty(), &next, &lsn_text) {
                        Gate::Take => {}
                        Gate::End => break 'rows,
                        Gate::Return(r) => return r,
                    }
                    let after = pgoutput::row(&rel, &new, false);
                    push(&mut txn, &rel, Op::Create, None, Some(after));
                }
                Message::Update { rel, old, new } => {
                    let rel = change(rel, &self.relations)?;
                    match self.gate(shapes.as_mut(), &rel, !events.is_empty(), &next, &lsn_text) {
                        Gate::Take => {}
                        Gate::End => break 'rows,
                        Gate::Return(r) => return r,
                    }
                    let before = old.map(|(key_only, t)| pgoutput::row(&rel, &t, key_only));
                    let after = pgoutput::row(&rel, &new, false);
                    push(&mut txn, &rel, Op::Update, before, Some(after));
                }
                Message::Delete { rel, key_only, old } => {
                    let rel = change(rel, &self.relations)?;
                    match self.gate(shapes.as_mut(), &rel, !events.is_empty(), &next, &lsn_text) {
                        Gate::Take => {}
                        Gate::End => break 'rows,
                        Gate::Return(r) => return r,
                    }
                    let before = pgoutput::row(&rel, &old, key_only);
                    push(&mut txn, &rel, Op::Delete, Some(before), None);
                }
                Message::Truncate { rels } => {
                    for id in rels {
                        let rel = change(id, &self.relations)?;
                        match self.gate(shapes.as_mut(), &rel, !events.is_empty(), &next, &lsn_text)
                        {
                            Gate::Take => {}
                            Gate::End => break 'rows,
                            Gate::Return(r) => return r,
                        }
                        push(&mut txn, &rel, Op::Truncate, None, None);
                    }
                }
                Message::Other(_) => {}
            }
        }
        next.events += events.len() as u64;
        Ok(Batch {
            events,
            pos: next,
            changes: Vec::new(),
        })
    }

    /// Refuses an added column whose existing rows got a value the stream does not carry:
    /// one added with a default (the source fills its existing rows with it, and no change of
    /// theirs is logged), as the source's catalog says now.
    async fn check_added(&self, change: &SchemaChange) -> Result<(), CaptureError> {
        let q = change.table.qualified();
        for c in &change.added {
            let row = self
                .client
                .query_opt(
                    "SELECT a.atthasmissing OR d.adbin IS NOT NULL FROM pg_attribute a \
                     LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum \
                     WHERE a.attrelid = to_regclass($1) AND a.attname = $2 AND NOT a.attisdropped",
                    &[&q, &c.name],
                )
                .await
                .map_err(server(format!("read the column {} of {q}", ident(&c.name))))?;
            // A column gone from the catalog again was dropped since: the replica drops it too.
            if row.is_some_and(|r| r.get::<_, bool>(0)) {
                return Err(CaptureError::State(format!(
                    "column {} was added to source table {q} with a default: the rows it \
                     already had got that value, which the change stream does not carry, so the replica cannot \
                     follow it; nothing after it is applied. Re-create the replica (a new slot, --wal and schema) to go on",
                    ident(&c.name)
                )));
            }
        }
        Ok(())
    }

    /// Checks the columns a change of `rel` in the transaction taken comes with against the
    /// shapes of `st` (see [`crate::shape::compare`]): the same, columns added (the replica
    /// gets them before the transaction), columns dropped before the table's first change in
    /// the transaction (the replica drops them on its own before it), or dropped later in it
    /// (the replica keeps them until the next transaction that changes the table).
    /// Follows `rel`'s shape before one of its changes is taken (when shapes are followed):
    /// take the change, end the batch before it (`have_events`: a shape change waits for a
    /// batch of its own), or return now (columns to drop first, or a change refused).
    fn gate(
        &self,
        shapes: Option<&mut TxnShapes>,
        rel: &Relation,
        have_events: bool,
        next: &SourcePos,
        lsn: &str,
    ) -> Gate {
        let Some(st) = shapes else {
            return Gate::Take;
        };
        match self.sync(st, rel) {
            Ok(Synced::Yes) => Gate::Take,
            _ if have_events => Gate::End,
            Ok(Synced::DropFirst(ch)) => Gate::Return(Ok(Batch::drop_first(next.clone(), ch))),
            Err(error) => Gate::Return(Err(CaptureError::Decode {
                lsn: lsn.to_string(),
                error,
            })),
        }
    }

    fn sync(&self, st: &mut TxnShapes, rel: &Relation) -> Result<Synced, String> {
        if st.synced.contains(&rel.id) {
            return Ok(Synced::Yes);
        }
        let find = |shapes: &[TableShape]| {
            shapes.iter().position(|s| s.oid == rel.id).or_else(|| {
                shapes
                    .iter()
                    .position(|s| s.table.schema == rel.schema && s.table.name == rel.name)
            })
        };
        let Some(i) = find(&st.cur) else {
            return Err(self.not_captured(rel));
        };
        let first = st.rows_seen.insert(rel.id);
        st.synced.insert(rel.id);
        let Some(mut ch) = crate::shape::compare(&st.cur[i], rel)? else {
            return Ok(Synced::Yes);
        };
        if first && ch.added.is_empty() {
            return Ok(Synced::DropFirst(ch));
        }
        let kept = &mut st.persisted[i];
        for c in &ch.added {
            if kept.columns.iter().any(|k| k.name == c.name) {
                return Err(format!(
                    "column {} of source table {} was dropped and added again before the replica dropped it: \
                     the replica cannot follow it; nothing after it is applied. Re-create the replica (a new slot, --wal and schema) to go on",
                    ident(&c.name),
                    ch.table.qualified()
                ));
            }
            kept.columns.push(ShapeColumn {
                name: c.name.clone(),
                type_oid: c.type_oid,
                typmod: c.typmod,
                key: false,
            });
        }
        st.cur[i] = ch.shape.clone();
        if !ch.added.is_empty() {
            ch.dropped.clear();
            ch.shape = kept.clone();
            st.adds.push(ch);
        }
        Ok(Synced::Yes)
    }

    /// The error for a change of a relation that is none of the captured tables.
    fn not_captured(&self, rel: &Relation) -> String {
        format!(
            "the stream holds changes of {}.{}, which is not in tables= (added to publication {}, or a captured table renamed?); \
             remove it from the publication, or capture it with a pipeline of its own",
            ident(&rel.schema),
            ident(&rel.name),
            ident(&self.cfg.publication)
        )
    }

    /// Moves the slot to `end_lsn` (the end of a transaction whose epoch the target
    /// committed), if it is not there already. The server may then recycle the WAL before it.
    ///
    /// # Cancel safety
    /// If dropped, the slot may or may not have moved; moving it is idempotent (it never moves
    /// back), so call it again.
    pub async fn advance(&mut self, end_lsn: u64) -> Result<(), CaptureError> {
        let Some(at) = self.slot_position().await? else {
            return Err(CaptureError::State(format!(
                "replication slot {} is gone",
                self.cfg.slot
            )));
        };
        if end_lsn > at {
            let to = format_lsn(end_lsn);
            let params: [&(dyn tokio_postgres::types::ToSql + Sync); 2] = [&self.cfg.slot, &to];
            while_busy(|| {
                self.client.query(
                    "SELECT pg_replication_slot_advance($1, $2::text::pg_lsn)",
                    &params,
                )
            })
            .await
            .map_err(server(format!(
                "advance the replication slot {}",
                self.cfg.slot
            )))?;
        }
        Ok(())
    }

    /// The source's current WAL position (for waiting until the stream caught up).
    ///
    /// # Cancel safety
    /// Cancel safe: it only reads; call it again.
    pub async fn current_lsn(&self) -> Result<u64, CaptureError> {
        let s: String = self
            .client
            .query_one("SELECT pg_current_wal_lsn()::text", &[])
            .await
            .map_err(server("read the current WAL position"))?
            .get(0);
        Ok(crate::event::parse_lsn(&s).unwrap_or(0))
    }
}

/// Runs `f` again while the slot is in use by another session (SQLSTATE 55006), for up to a
/// minute: after a reader is killed, its server session keeps the slot until it notices, at
/// the end of the statement it was running.
async fn while_busy<T, F, Fut>(mut f: F) -> Result<T, tokio_postgres::Error>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, tokio_postgres::Error>>,
{
    let started = std::time::Instant::now();
    loop {
        match f().await {
            Err(e)
                if e.code().is_some_and(|c| c.code() == "55006")
                    && started.elapsed() < std::time::Duration::from_secs(60) =>
            {
                tracing::debug!(error = %e, "replication slot busy; waiting");
                tokio::time::sleep(std::time::Duration::from_millis(200)).await;
            }
            r => return r,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn source_urls_parse_and_name_their_faults() {
        let c = SourceConfig::from_url("postgres://u:pw@h:5/db?slot=s1&tables=a,sales.b").unwrap();
        assert_eq!(c.slot, "s1");
        assert_eq!(c.publication, "s1");
        assert_eq!(
            c.tables[1],
            TableRef {
                schema: "sales".into(),
                name: "b".into()
            }
        );
        assert!(!format!("{c:?}").contains("pw"));
        // Quoted names are taken as written, as in SQL.
        let q = SourceConfig::from_url(
            r#"postgres://u@h/db?slot=s&tables="MixedCase","My Schema"."a ""b"", c",plain"#,
        )
        .unwrap();
        let names: Vec<(&str, &str)> = q
            .tables
            .iter()
            .map(|t| (t.schema.as_str(), t.name.as_str()))
            .collect();
        assert_eq!(
            names,
            vec![
                ("public", "MixedCase"),
                ("My Schema", "a \"b\", c"),
                ("public", "plain")
            ]
        );
        for (url, word) in [
            ("postgres://u@h/db?tables=a", "slot"),
            ("postgres://u@h/db?slot=s", "tables"),
            ("postgres://u@h/db?slot=S-1&tables=a", "slot"),
            ("postgres://u@h/db?slot=s&tables=a&x=1", "\"x\""),
            ("postgres://u@h/db?slot=s&tables=a,x.a", "same name"),
            ("postgres://u@h/db?slot=s&tables=Mixed", "double quotes"),
            ("postgres://u@h/db?slot=s&tables=\"open", "unclosed"),
        ] {
            let e = SourceConfig::from_url(url).unwrap_err().to_string();
            assert!(e.contains(word), "{url}: {e}");
        }
    }
}
