//! [`CdcSink`]: applies an epoch of Debezium events to PostgreSQL in one transaction with the
//! commit marker, under the position guard.
//!
//! The position guard keeps, for each row, the rank of the event that wrote it in a hidden
//! column of the replica table, `_walsink_pos bigint` (added on first use; a row without it,
//! written before walsink, ranks below every event). Beside the replica tables, in the
//! target schema:
//! - `walsink_cdc_tombstones (tbl, k, pos)`: for a key a delete removed, the delete's rank;
//! - `walsink_cdc_tables (tbl, truncated_at)`: each table's truncate watermark;
//! - `walsink_markers`: the commit marker, one row per epoch with its checkpoint metadata.
//!
//! A hidden column rather than a side table of every key: the guarded upsert then costs what a
//! plain upsert costs (one statement: `ON CONFLICT … DO UPDATE … WHERE` the stored rank is
//! older, and an anti-join against the tombstones), where a side table doubled the writes
//! (measured: 2.5× the time of the same upsert). The replica's own columns stay exactly the
//! source's; compare them by column list ([`crate::check::compare`]).

use crate::columns::ColumnKind;
use crate::config::{ident, Config};
use crate::event::{self, BadEvent, Event, Op};
use crate::plan::{Planner, Step, TableMeta};
use serde_json::{json, Value};
use std::collections::HashMap;
use tokio_postgres::{Client, Statement, Transaction};
use walsink::sinks::CommittedEpoch;
use walsink::{Epoch, EpochKey, RecordPosition, SinkError};
use walsink_postgres::{MarkerTable, TableName};
use walsink_tokio::{AsyncChunks, AsyncSink};

fn classify(e: tokio_postgres::Error, what: &str) -> SinkError {
    walsink_postgres::sink_error(what, e)
}

/// Applies Debezium events to PostgreSQL, exactly once: see the crate docs.
pub struct CdcSink {
    config: Config,
    marker: MarkerTable,
    client: Option<Client>,
    /// Table metadata, valid for this connection until a delivery fails or is dropped (an
    /// `ALTER` may have been rolled back).
    tables: HashMap<String, Target>,
    statements: Statements,
    stats: Stats,
    /// A delivery began and did not end: it failed, or its future was dropped.
    unfinished: bool,
}

impl std::fmt::Debug for CdcSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CdcSink")
            .field("target", &self.config.to_string())
            .field("schema", &self.config.schema)
            .finish_non_exhaustive()
    }
}

/// What a sink applied since it was made, and where its time went.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Stats {
    /// Time spent reading, parsing and planning events (wall clock, in the epoch's
    /// transaction).
    pub planning: std::time::Duration,
    /// Time spent in the change statements (wall clock, the server's work and the round
    /// trips).
    pub statements: std::time::Duration,
    /// Time spent in COMMIT.
    pub committing: std::time::Duration,
    /// Epochs committed.
    pub epochs: u64,
    /// Events read (tombstones excluded).
    pub events: u64,
    /// Statements sent for changes.
    pub sent: u64,
}

/// A target table as the statements need it: the planner's view and how each column's values
/// are sent.
#[derive(Debug)]
struct Target {
    meta: TableMeta,
    kinds: HashMap<String, ColumnKind>,
    /// How each key column (in key order) is written canonically in tombstones.
    canon: Vec<Canon>,
}

/// How a key column's value is made canonical before it is compared as text (tombstones)
/// or used to keep one row per key: equal keys must give equal text.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Canon {
    /// The value's text is canonical.
    AsIs,
    /// `numeric`: `1.0` and `1.00` are equal, so trailing zeros go (`trim_scale`).
    TrimScale,
    /// `real`, `double precision`: `-0` and `0` are equal (`+ 0` turns `-0` into `0`).
    PlusZero,
}

impl Canon {
    fn of(base: &str) -> Canon {
        match base {
            "numeric" => Canon::TrimScale,
            "float4" | "float8" => Canon::PlusZero,
            _ => Canon::AsIs,
        }
    }

    fn expr(self, e: &str) -> String {
        match self {
            Canon::AsIs => e.to_string(),
            Canon::TrimScale => format!("trim_scale({e})"),
            Canon::PlusZero => format!("({e} + 0)"),
        }
    }
}

/// Prepared statements by table, kind and column set.
type Statements = HashMap<(String, u8, Vec<String>), Statement>;

const TOMBS: &str = "walsink_cdc_tombstones";
/// The hidden column holding each row's rank.
pub(crate) const POS: &str = "_walsink_pos";
const TABLES: &str = "walsink_cdc_tables";

impl CdcSink {
    /// Connects and creates the bookkeeping tables if they are missing.
    ///
    /// # Cancel safety
    /// Cancel safe: a connection half set up is dropped, and the next call connects anew.
    pub async fn connect(config: Config) -> Result<CdcSink, SinkError> {
        let marker = MarkerTable::new(
            TableName::parse(
                &format!(
                    "{}.{}",
                    config.schema,
                    walsink_postgres::marker::DEFAULT_TABLE
                ),
                "schema",
            )
            .map_err(|e| SinkError::permanent(e.to_string()))?,
        );
        let mut s = CdcSink {
            marker,
            config,
            client: None,
            tables: HashMap::new(),
            statements: HashMap::new(),
            stats: Stats::default(),
            unfinished: false,
        };
        s.client().await?;
        Ok(s)
    }

    /// The configuration.
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// What this sink applied so far.
    pub fn stats(&self) -> Stats {
        self.stats
    }

    async fn client(&mut self) -> Result<&mut Client, SinkError> {
        if self.client.as_ref().is_some_and(Client::is_closed) {
            self.client = None;
        }
        if self.client.is_none() {
            let target = self.config.to_string();
            let (client, conn) = self
                .config
                .url
                .client_config("walsink-cdc")
                .connect(tokio_postgres::NoTls)
                .await
                .map_err(|e| classify(e, &format!("connect to {target}")))?;
            tokio::spawn(async move {
                if let Err(e) = conn.await {
                    tracing::debug!(error = %e, "cdc target connection ended");
                }
            });
            let schema = ident(&self.config.schema);
            let ddl = format!(
                "CREATE SCHEMA IF NOT EXISTS {schema}; \
                 CREATE TABLE IF NOT EXISTS {schema}.{TOMBS} (tbl text COLLATE \"C\" NOT NULL, k text COLLATE \"C\" NOT NULL, pos bigint NOT NULL, \
                   PRIMARY KEY (tbl, k)); \
                 CREATE TABLE IF NOT EXISTS {schema}.{TABLES} (tbl text PRIMARY KEY, truncated_at bigint NOT NULL);"
            );
            // Two sinks creating the tables at once can collide in the catalog; once more
            // settles it.
            for attempt in 0..3 {
                let r = async {
                    client.batch_execute(&ddl).await?;
                    self.marker.create(&client).await
                }
                .await;
                match r {
                    Ok(()) => break,
                    Err(e)
                        if attempt < 2
                            && e.code()
                                .is_some_and(|c| c.code() == "23505" || c.code() == "42P07") => {}
                    Err(e) => {
                        return Err(classify(
                            e,
                            &format!("create the bookkeeping tables in {target}"),
                        ))
                    }
                }
            }
            self.tables.clear();
            self.statements.clear();
            self.client = Some(client);
        }
        Ok(self.client.as_mut().expect("set above"))
    }

    /// Runs `statements` on the target in one transaction (to create the replica tables).
    ///
    /// # Cancel safety
    /// If dropped, the transaction is rolled back (tokio-postgres rolls back a transaction
    /// dropped uncommitted) unless its COMMIT was already sent; check the target before
    /// running the statements again.
    pub async fn execute(&mut self, statements: &[String]) -> Result<(), SinkError> {
        let c = self.client().await?;
        let tx = c.transaction().await.map_err(|e| classify(e, "begin"))?;
        for s in statements {
            tx.batch_execute(s)
                .await
                .map_err(|e| classify(e, &format!("run {s}")))?;
        }
        tx.commit().await.map_err(|e| classify(e, "commit"))?;
        self.tables.clear();
        Ok(())
    }

    /// The epochs the target holds for `(sink_id, subtask)`, oldest first, with their
    /// checkpoint metadata (for resuming).
    ///
    /// # Cancel safety
    /// Cancel safe: it only reads; call it again.
    pub async fn committed(
        &mut self,
        sink_id: &str,
        subtask: u32,
    ) -> Result<Vec<CommittedEpoch>, SinkError> {
        let marker = self.marker.clone();
        let c = self.client().await?;
        let markers = marker
            .committed(&*c, sink_id, subtask)
            .await
            .map_err(|e| classify(e, "read the commit markers"))?;
        Ok(markers
            .into_iter()
            .map(|m| CommittedEpoch {
                checkpoint: m.checkpoint,
                file: format!("{} checkpoint {}", marker.name().plain(), m.checkpoint),
                metadata: Some(m.metadata),
            })
            .collect())
    }

    async fn apply(&mut self, epoch: &Epoch) -> Result<(), SinkError> {
        let schema = self.config.schema.clone();
        let position = self.config.position.clone();
        let add_missing = self.config.add_missing_columns;
        let max_held = self.config.max_held;
        self.client().await?;
        let CdcSink {
            marker,
            client,
            tables,
            statements,
            stats,
            ..
        } = self;
        let client = client.as_mut().expect("connected above");
        let tx = client
            .transaction()
            .await
            .map_err(|e| classify(e, "begin"))?;
        // The marker first: it is the epoch's lock, and finding it means the epoch is in.
        let fresh = marker
            .write(&tx, epoch.key(), epoch.metadata(), epoch.len())
            .await
            .map_err(|e| classify(e, "write the commit marker"))?;
        if !fresh {
            return Ok(());
        }
        let started = std::time::Instant::now();
        let before = stats.statements;
        let mut planner = Planner::new();
        let mut chunks = AsyncChunks::new(epoch);
        while let Some(chunk) = chunks.next().await {
            let chunk = chunk
                .map_err(|e| SinkError::retryable(format!("read the epoch: {e}")).with_source(e))?;
            for rec in chunk.records() {
                let Some(ev) = event::parse(&rec.data, &position).map_err(|error| {
                    SinkError::permanent(
                        BadEvent {
                            checkpoint: rec.position.checkpoint,
                            index: rec.position.index,
                            error,
                        }
                        .to_string(),
                    )
                })?
                else {
                    continue;
                };
                stats.events += 1;
                table_meta(&tx, tables, &schema, &ev, rec.position, add_missing).await?;
                let source_position = ev.position;
                let meta = &tables[&ev.table].meta;
                planner.push(ev, meta, rec.position).map_err(|e| {
                    SinkError::permanent(format!(
                        "event at checkpoint {}, index {} (source position {source_position}): {e}",
                        rec.position.checkpoint, rec.position.index
                    ))
                })?;
                if planner.held() >= max_held {
                    run(&tx, statements, tables, &schema, planner.drain(), stats).await?;
                }
            }
        }
        run(&tx, statements, tables, &schema, planner.drain(), stats).await?;
        stats.planning += started.elapsed().saturating_sub(stats.statements - before);
        let committing = std::time::Instant::now();
        tx.commit().await.map_err(|e| classify(e, "commit"))?;
        stats.committing += committing.elapsed();
        stats.epochs += 1;
        Ok(())
    }
}

impl AsyncSink for CdcSink {
    /// # Cancel safety
    /// Dropping the future drops the epoch's transaction uncommitted, which rolls it back
    /// (unless its `COMMIT` was already sent; the marker then shows the epoch in). The next
    /// delivery forgets the table metadata the dropped one may have changed, as after an error.
    async fn deliver(&mut self, epoch: &Epoch) -> Result<(), SinkError> {
        if std::mem::replace(&mut self.unfinished, true) {
            // The last delivery failed or was dropped, and its transaction rolled back:
            // forget what it may have changed in the catalog.
            self.tables.clear();
            self.statements.clear();
        }
        let r = self.apply(epoch).await;
        self.unfinished = r.is_err();
        r
    }

    fn stores_marker(&self) -> bool {
        true
    }

    async fn is_committed(&mut self, key: &EpochKey) -> Result<bool, SinkError> {
        let marker = self.marker.clone();
        let c = self.client().await?;
        marker
            .is_committed(&*c, key)
            .await
            .map_err(|e| classify(e, "read the commit marker"))
    }
}

fn where_(ev: &Event, at: RecordPosition) -> String {
    format!(
        "event at checkpoint {}, index {} (op {}, source position {})",
        at.checkpoint, at.index, ev.op, ev.position
    )
}

/// Makes sure `tables` holds the target table's metadata for `ev`, loading it (and adding
/// missing columns when allowed).
async fn table_meta(
    tx: &Transaction<'_>,
    tables: &mut HashMap<String, Target>,
    schema: &str,
    ev: &Event,
    at: RecordPosition,
    add_missing: bool,
) -> Result<(), SinkError> {
    let qualified = format!("{}.{}", ident(schema), ident(&ev.table));
    if !tables.contains_key(&ev.table) {
        let meta = load_meta(tx, schema, &ev.table).await?.ok_or_else(|| {
            SinkError::permanent(format!(
                "table {qualified} does not exist in the target ({}); create it with the source's columns and primary key",
                where_(ev, at)
            ))
        })?;
        if meta.meta.key.is_empty() {
            return Err(SinkError::permanent(format!(
                "table {qualified} has no primary key ({}); changes are applied by primary key",
                where_(ev, at)
            )));
        }
        tables.insert(ev.table.clone(), meta);
    }
    let meta = &tables[&ev.table].meta;
    let image = match ev.op {
        Op::Delete => ev.before.as_ref(),
        Op::Truncate => None,
        _ => ev.after.as_ref(),
    };
    if image.is_some_and(|r| r.contains_key(POS)) {
        return Err(SinkError::permanent(format!(
            "the event carries column {POS:?}, which is walsink's own in {qualified} ({})",
            where_(ev, at)
        )));
    }
    let missing: Vec<String> = image
        .map(|r| meta.missing(r).into_iter().map(str::to_string).collect())
        .unwrap_or_default();
    if missing.is_empty() {
        return Ok(());
    }
    if !add_missing {
        return Err(SinkError::permanent(format!(
            "table {qualified} has no column {:?} ({}); add the column, or set add_missing_columns=true on the sink",
            missing[0],
            where_(ev, at)
        )));
    }
    let row = image.expect("missing columns come from an image");
    for c in &missing {
        let ty = sql_type(&row[c.as_str()]);
        tx.batch_execute(&format!(
            "ALTER TABLE {qualified} ADD COLUMN IF NOT EXISTS {} {ty}",
            ident(c)
        ))
        .await
        .map_err(|e| classify(e, &format!("add column {c:?} to {qualified}")))?;
    }
    let meta = load_meta(tx, schema, &ev.table)
        .await?
        .expect("the table was there a moment ago in this transaction");
    tables.insert(ev.table.clone(), meta);
    Ok(())
}

/// The column type for a value of a column an event adds.
fn sql_type(v: &Value) -> &'static str {
    match v {
        Value::Bool(_) => "boolean",
        Value::Number(n) if n.is_i64() => "bigint",
        // Above bigint's range: a bigint column could never take the value.
        Value::Number(n) if n.is_u64() => "numeric",
        Value::Number(_) => "double precision",
        Value::Array(_) | Value::Object(_) => "jsonb",
        Value::String(_) | Value::Null => "text",
    }
}

async fn load_meta(
    tx: &Transaction<'_>,
    schema: &str,
    table: &str,
) -> Result<Option<Target>, SinkError> {
    let q = format!("{}.{}", ident(schema), ident(table));
    // Each column with its type's qualified name (without its modifier: a cast to
    // `varchar(3)` or `bit(3)` would cut a longer value, where the input function
    // `jsonb_populate_record` uses refuses it; the column applies its modifier on assignment
    // instead, with the input function's errors), and the category and name of the type a
    // domain rests on (the type itself otherwise): what `ColumnKind` needs.
    let read = || async {
        tx.query(
            "SELECT a.attname::text, quote_ident(tn.nspname) || '.' || quote_ident(t.typname), \
               b.typcategory::text, b.typname::text \
             FROM pg_attribute a JOIN pg_type t ON t.oid = a.atttypid \
             JOIN pg_namespace tn ON tn.oid = t.typnamespace \
             JOIN pg_type b ON b.oid = CASE WHEN t.typtype = 'd' THEN t.typbasetype ELSE t.oid END \
             WHERE a.attrelid = to_regclass($1) AND a.attnum > 0 AND NOT a.attisdropped ORDER BY a.attnum",
            &[&q],
        )
        .await
        .map_err(|e| classify(e, &format!("read the columns of {q}")))
    };
    let mut rows = read().await?;
    if rows.is_empty() {
        return Ok(None);
    }
    if !rows.iter().any(|r| r.get::<_, String>(0) == POS) {
        // The guard's hidden column, added in the epoch's transaction.
        tx.batch_execute(&format!(
            "ALTER TABLE {q} ADD COLUMN IF NOT EXISTS {POS} bigint"
        ))
        .await
        .map_err(|e| classify(e, &format!("add the column {POS} to {q}")))?;
        rows = read().await?;
    }
    let mut cols = Vec::with_capacity(rows.len());
    let mut kinds = HashMap::with_capacity(rows.len());
    let mut bases: HashMap<String, String> = HashMap::with_capacity(rows.len());
    for r in rows {
        let name: String = r.get(0);
        if name == POS {
            continue;
        }
        let category: String = r.get(2);
        let base: String = r.get(3);
        kinds.insert(
            name.clone(),
            ColumnKind::from_catalog(r.get(1), &category, &base),
        );
        bases.insert(name.clone(), base);
        cols.push(name);
    }
    let key = tx
        .query(
            "SELECT a.attname::text FROM pg_index i, unnest(i.indkey) WITH ORDINALITY AS k(attnum, n), pg_attribute a \
             WHERE i.indrelid = to_regclass($1) AND i.indisprimary AND a.attrelid = i.indrelid AND a.attnum = k.attnum \
             ORDER BY k.n",
            &[&q],
        )
        .await
        .map_err(|e| classify(e, &format!("read the primary key of {q}")))?;
    let key: Vec<String> = key.iter().map(|r| r.get(0)).collect();
    let canon = key
        .iter()
        .map(|k| Canon::of(bases.get(k).map_or("", String::as_str)))
        .collect();
    Ok(Some(Target {
        meta: TableMeta {
            name: table.to_string(),
            columns: cols,
            key,
        },
        kinds,
        canon,
    }))
}

const UPSERT: u8 = 0;
const DELETE: u8 = 1;

/// The rows of a statement that reads them from JSON: `[{"p": rank, "r": image}, …]`, the
/// value of a `json` or `jsonb` column as its JSON text (a string), which the statement reads
/// with `->>` and casts: so JSON `null` stays `null`, where `jsonb_populate_record` would make
/// it SQL `NULL`.
fn payload(target: &Target, rows: Vec<crate::plan::Change>) -> Value {
    Value::Array(
        rows.into_iter()
            .map(|c| {
                let mut row = c.row;
                for (col, v) in row.iter_mut() {
                    if target.kinds.get(col).is_some_and(ColumnKind::is_json) {
                        *v = crate::columns::json_text(v).map_or(Value::Null, Value::String);
                    }
                }
                json!({"p": c.rank, "r": Value::Object(row)})
            })
            .collect(),
    )
}

/// `s` as an SQL string literal.
fn literal(s: &str) -> String {
    format!("'{}'", s.replace('\'', "''"))
}

/// Whether every column of `columns` can be sent as a typed array (see [`ColumnKind`]).
fn typed(target: &Target, columns: &[String]) -> bool {
    columns
        .iter()
        .all(|c| target.kinds.get(c).is_some_and(ColumnKind::typed))
}

/// The columns a step of `kind` sends.
fn step_columns<'a>(target: &'a Target, kind: u8, columns: &'a [String]) -> &'a [String] {
    if kind == DELETE {
        &target.meta.key
    } else {
        columns
    }
}

/// The guarded statement for one kind of step, written once per table, kind and column set.
///
/// The rows come as one array per column (`$1` the ranks, `$3…` the columns' text, cast on
/// the server) or, when a column needs it, as one JSON array (`$1`); `$2` is the table's name
/// in the bookkeeping tables.
fn statement_sql(schema: &str, target: &Target, kind: u8, columns: &[String]) -> String {
    let meta = &target.meta;
    let s = ident(schema);
    let t = format!("{s}.{}", ident(&meta.name));
    let list = |prefix: &str, cols: &[String]| {
        cols.iter()
            .map(|c| format!("{prefix}{}", ident(c)))
            .collect::<Vec<_>>()
            .join(", ")
    };
    // The key, canonical (see `Canon`), over the columns of `prefix`.
    let canon_key = |prefix: &str| {
        meta.key
            .iter()
            .zip(&target.canon)
            .map(|(c, k)| k.expr(&format!("{prefix}{}", ident(c))))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let key_row = canon_key("v.");
    let above = format!(
        "> coalesce((SELECT truncated_at FROM {s}.{TABLES} WHERE tbl = $2), -9223372036854775808)"
    );
    let sent = step_columns(target, kind, columns);
    // The rows above the table's watermark, with their ranks.
    let rows = if typed(target, sent) {
        let arrays: String = (0..sent.len())
            .map(|i| format!(", ${}::text[]", i + 3))
            .collect();
        let names: String = (0..sent.len()).map(|i| format!(", c{i}")).collect();
        let casts: String = sent
            .iter()
            .enumerate()
            .map(|(i, c)| {
                let ty = target.kinds[c].cast().expect("typed() checked");
                format!(", u.c{i}::{ty} AS {}", ident(c))
            })
            .collect();
        format!(
            "SELECT u._ws_rank{casts} FROM unnest($1::bigint[]{arrays}) AS u(_ws_rank{names}) \
             WHERE u._ws_rank {above}"
        )
    } else {
        // `json` and `jsonb` columns from their JSON text (see `payload`), the rest as
        // `jsonb_populate_record` makes them.
        let picks: String = sent
            .iter()
            .map(|c| match &target.kinds.get(c) {
                Some(ColumnKind::Json(ty)) => {
                    format!("(e->'r'->>{})::jsonb::{ty} AS {}, ", literal(c), ident(c))
                }
                _ => format!("r.{}, ", ident(c)),
            })
            .collect();
        format!(
            "SELECT {picks}(e->>'p')::bigint AS _ws_rank \
             FROM jsonb_array_elements($1::jsonb) e, LATERAL jsonb_populate_record(NULL::{t}, e->'r') r \
             WHERE (e->>'p')::bigint {above}"
        )
    };
    // One row per key, the newest: the planner keeps one event per key as the client spells
    // it, and two spellings of one key (`1.0` and `1.00`, a uuid in capitals and in lower
    // case) would otherwise reach one row twice in one statement.
    let w_key = canon_key("w.");
    let v = format!(
        "v AS (SELECT DISTINCT ON ({w_key}) * FROM ({rows}) w ORDER BY {w_key}, w._ws_rank DESC)"
    );
    let older = format!("(t.{POS} IS NULL OR t.{POS} < v._ws_rank)");
    if kind == DELETE {
        let on = meta
            .key
            .iter()
            .map(|c| format!("t.{0} = v.{0}", ident(c)))
            .collect::<Vec<_>>()
            .join(" AND ");
        // The row goes if it is older; the tombstone keeps the newest delete's rank (one that
        // lost to a newer row is below that row's rank, so it never decides anything).
        return format!(
            "WITH {v}, d AS (DELETE FROM {t} t USING v WHERE {on} AND {older}) \
             INSERT INTO {s}.{TOMBS} AS x (tbl, k, pos) SELECT $2, ROW({key_row})::text, v._ws_rank FROM v \
             ON CONFLICT (tbl, k) DO UPDATE SET pos = EXCLUDED.pos WHERE x.pos < EXCLUDED.pos"
        );
    }
    let mut sets: Vec<String> = columns
        .iter()
        .filter(|c| !meta.key.contains(c))
        .map(|c| format!("{0} = EXCLUDED.{0}", ident(c)))
        .collect();
    sets.push(format!("{POS} = EXCLUDED.{POS}"));
    format!(
        "WITH {v} INSERT INTO {t} AS t ({}, {POS}) SELECT {}, v._ws_rank FROM v \
         WHERE NOT EXISTS (SELECT 1 FROM {s}.{TOMBS} x WHERE x.tbl = $2 AND x.k = ROW({key_row})::text AND x.pos >= v._ws_rank) \
         ON CONFLICT ({}) DO UPDATE SET {} WHERE t.{POS} IS NULL OR t.{POS} < EXCLUDED.{POS}",
        list("", columns),
        list("v.", columns),
        list("", &meta.key),
        sets.join(", ")
    )
}

/// Runs a flush's steps in order, timed into `stats.statements`.
async fn run(
    tx: &Transaction<'_>,
    statements: &mut Statements,
    tables: &HashMap<String, Target>,
    schema: &str,
    steps: Vec<Step>,
    stats: &mut Stats,
) -> Result<(), SinkError> {
    let started = std::time::Instant::now();
    let r = async {
        for step in steps {
            stats.sent += 1;
            match step {
                Step::Truncate { table, rank, at } => {
                    truncate(tx, schema, &tables[&table].meta, rank, at).await?
                }
                Step::Deletes { table, rows } | Step::Upserts { table, rows, .. }
                    if rows.is_empty() =>
                {
                    let _ = table;
                }
                Step::Deletes { table, rows } => {
                    let target = &tables[&table];
                    send(tx, statements, schema, target, DELETE, &[], rows).await?;
                }
                Step::Upserts {
                    table,
                    columns,
                    rows,
                } => {
                    let target = &tables[&table];
                    send(tx, statements, schema, target, UPSERT, &columns, rows).await?;
                }
            }
        }
        Ok::<(), SinkError>(())
    }
    .await;
    stats.statements += started.elapsed();
    r
}

/// Runs one step's statement with its rows.
async fn send(
    tx: &Transaction<'_>,
    statements: &mut Statements,
    schema: &str,
    target: &Target,
    kind: u8,
    columns: &[String],
    rows: Vec<crate::plan::Change>,
) -> Result<(), SinkError> {
    let what = if kind == DELETE {
        "delete from"
    } else {
        "upsert into"
    };
    let table = &target.meta.name;
    let ctx = failed(what, schema, table, &rows);
    let st = prepare(tx, statements, schema, target, kind, columns).await?;
    let sent = step_columns(target, kind, columns);
    let r = if typed(target, sent) {
        let ranks: Vec<i64> = rows.iter().map(|c| c.rank).collect();
        let arrays: Vec<Vec<Option<String>>> = sent
            .iter()
            .map(|c| {
                let k = &target.kinds[c];
                rows.iter().map(|r| k.text(r.row.get(c))).collect()
            })
            .collect();
        let mut params: Vec<&(dyn tokio_postgres::types::ToSql + Sync)> =
            Vec::with_capacity(arrays.len() + 2);
        params.push(&ranks);
        params.push(table);
        params.extend(
            arrays
                .iter()
                .map(|a| a as &(dyn tokio_postgres::types::ToSql + Sync)),
        );
        tx.execute(&st, &params).await
    } else {
        tx.execute(&st, &[&payload(target, rows), table]).await
    };
    r.map_err(|e| classify(e, &ctx))?;
    Ok(())
}

fn failed(what: &str, schema: &str, table: &str, rows: &[crate::plan::Change]) -> String {
    let first = rows.iter().map(|c| c.at).min().expect("not empty");
    let last = rows.iter().map(|c| c.at).max().expect("not empty");
    format!(
        "{what} {schema}.{table} ({} rows of events from checkpoint {} index {} to checkpoint {} index {})",
        rows.len(),
        first.checkpoint,
        first.index,
        last.checkpoint,
        last.index
    )
}

async fn prepare(
    tx: &Transaction<'_>,
    statements: &mut Statements,
    schema: &str,
    target: &Target,
    kind: u8,
    columns: &[String],
) -> Result<Statement, SinkError> {
    let meta = &target.meta;
    let key = (meta.name.clone(), kind, columns.to_vec());
    if let Some(s) = statements.get(&key) {
        return Ok(s.clone());
    }
    let sql = statement_sql(schema, target, kind, columns);
    let st = tx.prepare(&sql).await.map_err(|e| {
        classify(
            e,
            &format!("prepare the statement for {schema}.{}", meta.name),
        )
    })?;
    statements.insert(key, st.clone());
    Ok(st)
}

/// A guarded truncate: rows written before it go, tombstones older than it are dropped, and
/// its rank becomes the table's watermark. An older truncate (a replay) changes nothing.
async fn truncate(
    tx: &Transaction<'_>,
    schema: &str,
    meta: &TableMeta,
    rank: i64,
    at: RecordPosition,
) -> Result<(), SinkError> {
    let s = ident(schema);
    let t = format!("{s}.{}", ident(&meta.name));
    let ctx = format!(
        "truncate {t} (event at checkpoint {}, index {})",
        at.checkpoint, at.index
    );
    let err = |e| classify(e, &ctx);
    let row = tx
        .query_one(
            &format!(
                "SELECT coalesce((SELECT truncated_at FROM {s}.{TABLES} WHERE tbl = $1), -9223372036854775808), \
                 coalesce((SELECT max({POS}) FROM {t}), -9223372036854775808)"
            ),
            &[&meta.name],
        )
        .await
        .map_err(err)?;
    let (watermark, newest): (i64, i64) = (row.get(0), row.get(1));
    if rank <= watermark {
        return Ok(());
    }
    if newest < rank {
        tx.batch_execute(&format!("TRUNCATE {t}"))
            .await
            .map_err(err)?;
    } else {
        // Some rows are newer than the truncate (events out of source order): keep those.
        tx.execute(
            &format!("DELETE FROM {t} WHERE {POS} IS NULL OR {POS} < $1"),
            &[&rank],
        )
        .await
        .map_err(err)?;
    }
    tx.execute(
        &format!("DELETE FROM {s}.{TOMBS} WHERE tbl = $1 AND pos < $2"),
        &[&meta.name, &rank],
    )
    .await
    .map_err(err)?;
    tx.execute(
        &format!(
            "INSERT INTO {s}.{TABLES} (tbl, truncated_at) VALUES ($1, $2) \
             ON CONFLICT (tbl) DO UPDATE SET truncated_at = EXCLUDED.truncated_at"
        ),
        &[&meta.name, &rank],
    )
    .await
    .map_err(err)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statements_read_as_intended() {
        let meta = TableMeta {
            name: "items".into(),
            columns: vec!["id".into(), "name".into()],
            key: vec!["id".into()],
        };
        let kinds = [
            ("id", "pg_catalog.int4", "N", "int4"),
            ("name", "pg_catalog.text", "S", "text"),
        ]
        .iter()
        .map(|(c, t, cat, base)| {
            (
                c.to_string(),
                ColumnKind::from_catalog(t.to_string(), cat, base),
            )
        })
        .collect();
        let mut target = Target {
            meta,
            kinds,
            canon: vec![Canon::AsIs],
        };
        let up = statement_sql("r", &target, UPSERT, &["id".into(), "name".into()]);
        assert!(
            up.contains("ON CONFLICT (\"id\") DO UPDATE SET \"name\" = EXCLUDED.\"name\""),
            "{up}"
        );
        assert!(up.contains("x.pos >= v._ws_rank"), "{up}");
        assert!(
            up.contains("u.c0::pg_catalog.int4 AS \"id\", u.c1::pg_catalog.text AS \"name\"")
                && up.contains("unnest($1::bigint[], $3::text[], $4::text[])"),
            "{up}"
        );
        let only_key = statement_sql("r", &target, UPSERT, &["id".into()]);
        assert!(
            only_key.contains("DO UPDATE SET _walsink_pos = EXCLUDED._walsink_pos WHERE"),
            "{only_key}"
        );
        assert!(
            up.contains("SELECT DISTINCT ON (w.\"id\") * FROM (")
                && up.contains("ORDER BY w.\"id\", w._ws_rank DESC"),
            "{up}"
        );
        let del = statement_sql("r", &target, DELETE, &[]);
        assert!(del.contains("DELETE FROM \"r\".\"items\" t"), "{del}");
        // A numeric key is compared and kept canonical.
        target.canon = vec![Canon::TrimScale];
        let del = statement_sql("r", &target, DELETE, &[]);
        assert!(
            del.contains("ROW(trim_scale(v.\"id\"))::text")
                && del.contains("DISTINCT ON (trim_scale(w.\"id\"))"),
            "{del}"
        );
        target.canon = vec![Canon::AsIs];
        assert!(del.contains("unnest($1::bigint[], $3::text[])"), "{del}");
        // An array column sends the rows that touch it through JSON.
        target.kinds.insert(
            "name".into(),
            ColumnKind::from_catalog("text[]".into(), "A", "_text"),
        );
        let up = statement_sql("r", &target, UPSERT, &["id".into(), "name".into()]);
        assert!(up.contains("jsonb_populate_record"), "{up}");
        let del = statement_sql("r", &target, DELETE, &[]);
        assert!(del.contains("unnest($1::bigint[], $3::text[])"), "{del}");
        assert_eq!(sql_type(&json!(1)), "bigint");
        assert_eq!(sql_type(&json!(u64::MAX)), "numeric");
        assert_eq!(sql_type(&json!("x")), "text");
    }
}
