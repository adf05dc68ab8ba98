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
use crate::image::{Img, TextArray, View};
use crate::plan::{Image, Planner, Step, TableMeta};
use foldhash::{HashMap, HashMapExt};
use serde_json::{json, Value};
use std::future::Future;
use std::task::Poll;
use tokio_postgres::{Client, Statement, Transaction};
use walsink::sinks::CommittedEpoch;
use walsink::{Claim, Epoch, EpochKey, Owner, RecordPosition, SinkError};
use walsink_postgres::{MarkerTable, OwnerTable, TableName};
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
    /// Tables where a created key was found already there: they get upserts for the rest of
    /// the sink's life (see [`INSERT`]).
    refused: TableSet,
    /// The stats before the delivery that began last (to take back a dropped one's counts).
    counted: Stats,
    /// Tables (qualified) found without the guard's column: it is added in a transaction of
    /// its own before the epoch is applied again.
    columns_due: std::collections::HashSet<String>,
    /// The shard this sink claimed ([`CdcSink::claim`]): every epoch checks it first.
    claim: Option<Claim>,
}

/// The tables that no longer get plain inserts (see [`INSERT`]); shared with the flushes in
/// flight, which add to it.
type TableSet = std::sync::Arc<std::sync::Mutex<std::collections::HashSet<String>>>;

impl std::fmt::Debug for CdcSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CdcSink")
            .field("target", &self.config.to_string())
            .field("schema", &self.config.schema)
            .finish_non_exhaustive()
    }
}

/// What a sink applied since it was made, and where its time went. The counts are of
/// committed epochs: an attempt that failed or was rolled back (also the one the sink applies
/// again itself after a refused insert) is not counted; the times include every attempt.
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
    /// Of those, statements sent without the position guard, because every rank in them was
    /// above the table's high-water (an upstream in order).
    pub unguarded: u64,
    /// Of those, plain inserts of rows whose keys the source created (no conflict check).
    pub inserts: u64,
    /// Tables where a plain insert met a key that was already there (its epoch was rolled
    /// back and applied again at once with upserts); they get upserts from then on.
    pub refused_tables: u64,
}

impl Stats {
    /// Takes back the counts of an attempt that did not commit: they return to `before`.
    fn uncount(&mut self, before: &Stats) {
        self.events = before.events;
        self.sent = before.sent;
        self.unguarded = before.unguarded;
        self.inserts = before.inserts;
    }
}

/// A target table as the statements need it: the planner's view and how each column's values
/// are sent.
#[derive(Debug)]
struct Target {
    meta: TableMeta,
    /// The names of the primary key's index and of its partitions' indexes, when it is
    /// checked at once (not deferred): plain inserts go only into such a table, and a unique
    /// violation naming one of them is a key that was there (see [`INSERT`]).
    key_index: Option<Vec<String>>,
    kinds: HashMap<String, ColumnKind>,
    /// How each key column (in key order) is written canonically in tombstones.
    canon: Vec<Canon>,
    /// Which values of each key column (in key order) have one spelling.
    spellings: Vec<Spelling>,
}

/// Which JSON values of a key column are the only way to write the key they name, so two rows
/// the planner holds apart (it compares spellings) are two keys for PostgreSQL too.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Spelling {
    /// `smallint`, `integer`, `bigint`: a plain integer literal (`7`, `-7`, `0`; not `"7"`,
    /// `7.0`, `7e0` or `-0`).
    Int,
    /// `text` or `varchar` with a deterministic collation: a JSON string (equal text is an
    /// equal key; a number could be written two ways).
    Text,
    /// `uuid`: the lower-case hyphenated form PostgreSQL prints.
    Uuid,
    /// Any other type: no value is taken as the only spelling.
    Other,
}

impl Spelling {
    fn of(base: &str, deterministic: bool) -> Spelling {
        match base {
            "int2" | "int4" | "int8" => Spelling::Int,
            "text" | "varchar" if deterministic => Spelling::Text,
            "uuid" => Spelling::Uuid,
            _ => Spelling::Other,
        }
    }

    /// Whether `v` is this column's one spelling of its key.
    fn holds(self, v: Option<View<'_>>) -> bool {
        match (self, v) {
            // A plain integer: the spelling checked below, already checked when it was read.
            (Spelling::Int, Some(View::Int(_))) => true,
            (Spelling::Int, Some(View::Json(Value::Number(n)))) => {
                let t = n.as_str();
                let digits = t.strip_prefix('-').unwrap_or(t);
                t == "0"
                    || (!digits.is_empty()
                        && !digits.starts_with('0')
                        && digits.bytes().all(|b| b.is_ascii_digit()))
            }
            (Spelling::Text, Some(View::Str(_))) => true,
            (Spelling::Uuid, Some(View::Str(u))) => {
                u.len() == 36
                    && u.bytes().enumerate().all(|(i, b)| match i {
                        8 | 13 | 18 | 23 => b == b'-',
                        _ => b.is_ascii_digit() || (b'a'..=b'f').contains(&b),
                    })
            }
            _ => false,
        }
    }
}

/// Whether the key of `row` (an image holding the key columns) is written in its one spelling.
fn spelled_once(target: &Target, row: &Img) -> bool {
    target
        .meta
        .key
        .iter()
        .zip(&target.spellings)
        .all(|(k, s)| s.holds(row.get(k)))
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

/// Prepared statements by table, shape and column set.
type Statements = HashMap<(String, Shape, Vec<String>), Statement>;

/// What a statement does and how: see [`statement_sql`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct Shape {
    /// [`UPSERT`], [`DELETE`] or [`INSERT`].
    kind: u8,
    /// Under the position guard.
    guarded: bool,
    /// Every key is spelled one way only in the rows (see [`one_spelling`]), so the statement
    /// need not keep one row per key itself.
    one_spelling: bool,
}

/// A table's high-water rank in an epoch's transaction: at or above every rank its rows,
/// its tombstones and its truncate watermark hold (see [`lock_high`]).
#[derive(Debug, Clone, Copy)]
struct High {
    /// What `walsink_cdc_tables.high` held (`None`: nothing, and it was computed).
    stored: Option<i64>,
    /// The high-water now, raised by every step this transaction sent.
    now: i64,
    /// The high-water when the epoch first touched the table (what earlier epochs left).
    start: i64,
}

/// The high-water of each table this epoch touched, locked until the epoch commits.
type Highs = HashMap<String, High>;

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
            refused: TableSet::default(),
            counted: Stats::default(),
            columns_due: Default::default(),
            claim: None,
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
        Stats {
            refused_tables: self.refused.lock().expect("not poisoned").len() as u64,
            ..self.stats
        }
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
                 CREATE TABLE IF NOT EXISTS {schema}.{TABLES} (tbl text PRIMARY KEY, truncated_at bigint, high bigint);"
            );
            // Two sinks creating the tables at once can collide in the catalog; once more
            // settles it.
            for attempt in 0..3 {
                let r = async {
                    client.batch_execute(&ddl).await?;
                    // Bookkeeping made by an earlier version gains the high-water column and
                    // a watermark that may be NULL (none: every rank is above it, the lowest
                    // too). The catalog is checked first: an ALTER would wait for every open
                    // epoch on the table.
                    let tables = format!("{schema}.{TABLES}");
                    let cols = client
                        .query(
                            "SELECT attname::text, attnotnull FROM pg_attribute \
                             WHERE attrelid = to_regclass($1) AND NOT attisdropped \
                             AND attname IN ('high', 'truncated_at')",
                            &[&tables],
                        )
                        .await?;
                    let col = |name: &str| {
                        cols.iter()
                            .find(|r| r.get::<_, String>(0) == name)
                            .map(|r| r.get::<_, bool>(1))
                    };
                    if col("high").is_none() {
                        client
                            .batch_execute(&format!(
                                "ALTER TABLE {tables} ADD COLUMN IF NOT EXISTS high bigint"
                            ))
                            .await?;
                    }
                    if col("truncated_at") == Some(true) {
                        client
                            .batch_execute(&format!(
                                "ALTER TABLE {tables} ALTER COLUMN truncated_at DROP NOT NULL"
                            ))
                            .await?;
                    }
                    self.marker.create(&client).await?;
                    OwnerTable::beside(self.marker.name()).create(&client).await
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

    /// Claims the shard `(sink_id, subtask)` for `owner` in the owners table beside the
    /// marker table (`SCHEMA.walsink_owners`, as the PostgreSQL target keeps it) and keeps
    /// the claim: from then on every epoch's transaction reads the owner row `FOR SHARE`
    /// first and writes nothing (a [`SinkError::fenced`] error) once another log took the
    /// shard over. A sink that never claims does not look at owners.
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
            let c = self.client().await?;
            match owners.claim_once(c, sink_id, subtask, owner).await {
                Ok(Ok(Some(claim))) => {
                    self.claim = Some(claim.clone());
                    return Ok(claim);
                }
                Ok(Err(refused)) => return Err(refused),
                Ok(Ok(None)) => {}
                // A lock held by an epoch of the old owner, or a first record inserted at
                // the same moment: claim again on a new connection.
                Err(e)
                    if attempt < 10
                        && e.code().is_some_and(|s| {
                            matches!(s.code(), "55P03" | "40001" | "40P01" | "23505")
                        }) =>
                {
                    self.client = None;
                }
                Err(e) => {
                    self.client = None;
                    return Err(classify(e, &what));
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
            refused,
            columns_due,
            claim,
            ..
        } = self;
        let client = client.as_mut().expect("connected above");
        let tx = client
            .transaction()
            .await
            .map_err(|e| classify(e, "begin"))?;
        if let Some(claim) = claim.as_ref() {
            let owners = OwnerTable::beside(marker.name());
            let found = owners.check(&tx, claim).await.map_err(|e| {
                classify(e, &format!("read the owner in {}", owners.name().plain()))
            })?;
            // A fenced answer drops the transaction uncommitted: it rolls back.
            claim.check(found.as_ref().map(|(o, g)| (o.as_str(), *g)))?;
        }
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
        let mut highs = Highs::new();
        let mut planner = Planner::<Img>::new();
        // Changes held to fold later events of their keys into (see `window`); the oldest
        // are sent a flush at a time, the first sooner, so the server starts early.
        let window = window(epoch.len(), max_held);
        let chunk = window.min(PIPELINE_HELD);
        let first = window.min(PIPELINE_FIRST);
        // Tables whose held events include a key not in its one spelling.
        let mut mixed: foldhash::HashSet<String> = Default::default();
        let mut inflight = InFlights::default();
        let mut parsing = Parsing::new(epoch, &position);
        // A record that cannot be applied (not an event, no key, a missing column, the epoch
        // unreadable) stops the epoch; but what is held and in flight from before it is sent
        // and waited for first: a change before it may be refused by the server, and that
        // failure, the earliest in log order, is the one to report.
        let mut failed: Option<SinkError> = None;
        macro_rules! or_stop {
            ($records:lifetime, $r:expr) => {
                match $r {
                    Ok(v) => v,
                    Err(e) => {
                        failed = Some(e);
                        break $records;
                    }
                }
            };
        }
        'records: while let Some(batch) = parsing.next().await {
            let batch = or_stop!('records, batch);
            for (at, parsed) in batch {
                let parsed = parsed.map_err(|error| {
                    SinkError::permanent(
                        BadEvent {
                            checkpoint: at.checkpoint,
                            index: at.index,
                            error,
                        }
                        .to_string(),
                    )
                });
                let Some(mut ev) = or_stop!('records, parsed) else {
                    continue;
                };
                stats.events += 1;
                or_stop!(
                    'records,
                    table_meta(&tx, tables, &schema, &ev, at, add_missing, columns_due).await
                );
                let same = same_key_update(&tx, &tables[&ev.table], &schema, &mut ev, at).await;
                or_stop!('records, same);
                // A partial image must land on top of the earlier events of its key. The
                // planner sees to that for one spelling of the key; when some key of the
                // table came in another spelling, the table's run is cut first.
                let target = &tables[&ev.table];
                let spelled = event_spelled_once(target, &ev);
                let partial = matches!(ev.op, Op::Create | Op::Read | Op::Update)
                    && ev
                        .after
                        .as_ref()
                        .is_some_and(|a| crate::plan::partial(a, &target.meta));
                if partial && (!spelled || mixed.contains(&ev.table)) {
                    planner.cut(&ev.table);
                    mixed.remove(&ev.table);
                }
                if !spelled && !mixed.contains(&ev.table) {
                    mixed.insert(ev.table.clone());
                }
                let source_position = ev.position;
                let meta = &target.meta;
                let pushed = planner.push(ev, meta, at).map_err(|e| {
                    SinkError::permanent(format!(
                        "event at checkpoint {}, index {} (source position {source_position}): {e}",
                        at.checkpoint, at.index
                    ))
                });
                or_stop!('records, pushed);
                let due = if inflight.sent == 0 { first } else { window };
                if planner.held() >= due {
                    // At most MAX_IN_FLIGHT flushes wait for their answers.
                    inflight.make_room(stats).await?;
                    let steps = planner.drain_oldest(chunk);
                    if planner.held() == 0 {
                        mixed.clear();
                    }
                    let at = Tables {
                        tables,
                        schema: &schema,
                        refused,
                    };
                    let ready =
                        statements_for(&tx, statements, &at, &mut highs, steps, &planner, stats)
                            .await;
                    inflight.send(&tx, ready, stats).await?;
                }
            }
        }
        // The rest (also after a failed record), a flush at a time, so the server starts on
        // the first while the next is built.
        let at = Tables {
            tables,
            schema: &schema,
            refused,
        };
        loop {
            let steps = planner.drain_oldest(chunk);
            if steps.is_empty() {
                break;
            }
            inflight.make_room(stats).await?;
            let ready =
                statements_for(&tx, statements, &at, &mut highs, steps, &planner, stats).await;
            inflight.send(&tx, ready, stats).await?;
        }
        inflight.wait_all(stats).await?;
        if let Some(e) = failed {
            return Err(e);
        }
        drop(inflight);
        store_highs(&tx, &schema, &highs).await?;
        stats.planning += started.elapsed().saturating_sub(stats.statements - before);
        let committing = std::time::Instant::now();
        tx.commit().await.map_err(|e| classify(e, "commit"))?;
        stats.committing += committing.elapsed();
        stats.epochs += 1;
        Ok(())
    }
}

impl CdcSink {
    /// Adds the guard's column to each of `tables` (qualified), each in a transaction of its
    /// own: it takes the table's strongest lock, held only for the moment the `ALTER` takes.
    async fn add_guard_columns(&mut self, tables: Vec<String>) -> Result<(), SinkError> {
        for q in tables {
            let c = self.client().await?;
            c.batch_execute(&format!(
                "ALTER TABLE {q} ADD COLUMN IF NOT EXISTS {POS} bigint"
            ))
            .await
            .map_err(|e| classify(e, &format!("add the column {POS} to {q}")))?;
        }
        Ok(())
    }
}

impl AsyncSink for CdcSink {
    /// # Cancel safety
    /// Dropping the future drops the epoch's transaction uncommitted, which rolls it back
    /// (unless its `COMMIT` was already sent; the marker then shows the epoch in). The next
    /// delivery forgets the table metadata the dropped one may have changed, as after an error,
    /// and takes back the counts it had added to [`Stats`]. A guard column being added in its
    /// own transaction when the future is dropped is there or not, and the next delivery adds
    /// it if not (`ADD COLUMN IF NOT EXISTS`). A chunk being read on the blocking pool is read
    /// to its end and dropped.
    async fn deliver(&mut self, epoch: &Epoch) -> Result<(), SinkError> {
        if std::mem::replace(&mut self.unfinished, true) {
            // The last delivery failed or was dropped, and its transaction rolled back:
            // forget what it may have changed in the catalog.
            self.tables.clear();
            self.statements.clear();
            // A dropped delivery counted what it read: take that back.
            let counted = self.counted;
            self.stats.uncount(&counted);
        }
        let mut before = self.refused.lock().expect("not poisoned").len();
        let counted = self.stats;
        self.counted = counted;
        let mut r = self.apply(epoch).await;
        // The epoch's transaction rolled back, and the sink can do something about why: a
        // plain insert met a key that was there after all (the table gets upserts now), or a
        // table lacked the guard's column (added now, in a transaction of its own). Apply the
        // epoch again; each time one more table is refused or gets its column.
        loop {
            let now = self.refused.lock().expect("not poisoned").len();
            let due: Vec<String> = self.columns_due.drain().collect();
            if r.is_ok() || (now == before && due.is_empty()) {
                break;
            }
            before = now;
            if let Err(e) = self.add_guard_columns(due).await {
                self.stats.uncount(&counted);
                return Err(e);
            }
            self.tables.clear();
            self.statements.clear();
            self.stats.uncount(&counted);
            r = self.apply(epoch).await;
        }
        if r.is_err() {
            self.stats.uncount(&counted);
        }
        self.unfinished = r.is_err();
        r
    }

    fn stores_marker(&self) -> bool {
        true
    }

    /// # Cancel safety
    /// Cancel safe: it only reads.
    async fn is_committed(&mut self, key: &EpochKey) -> Result<bool, SinkError> {
        let marker = self.marker.clone();
        let c = self.client().await?;
        marker
            .is_committed(&*c, key)
            .await
            .map_err(|e| classify(e, "read the commit marker"))
    }
}

fn where_<R>(ev: &Event<R>, at: RecordPosition) -> String {
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
    ev: &Event<Img>,
    at: RecordPosition,
    add_missing: bool,
    due: &mut std::collections::HashSet<String>,
) -> Result<(), SinkError> {
    let qualified = || format!("{}.{}", ident(schema), ident(&ev.table));
    if !tables.contains_key(&ev.table) {
        // walsink's own tables beside the replica: an event for one would forge or drop
        // commits, or bring deleted rows back.
        let own = [
            walsink_postgres::marker::DEFAULT_TABLE,
            walsink_postgres::owner::DEFAULT_TABLE,
            TOMBS,
            TABLES,
        ];
        if own.contains(&ev.table.as_str()) {
            return Err(SinkError::permanent(format!(
                "the event is for {}, a table walsink keeps its own bookkeeping in (markers, owners, watermarks, tombstones): replaying it would forge or drop commits; leave walsink's tables out of the capture ({})",
                qualified(),
                where_(ev, at)
            )));
        }
        let meta = load_meta(tx, schema, &ev.table, due).await?.ok_or_else(|| {
            SinkError::permanent(format!(
                "table {} does not exist in the target ({}); create it with the source's columns and primary key",
                qualified(),
                where_(ev, at)
            ))
        })?;
        if meta.meta.key.is_empty() {
            return Err(SinkError::permanent(format!(
                "table {} has no primary key ({}); changes are applied by primary key",
                qualified(),
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
    if image.is_some_and(|r| r.has(POS)) {
        return Err(SinkError::permanent(format!(
            "the event carries column {POS:?}, which is walsink's own in {} ({})",
            qualified(),
            where_(ev, at)
        )));
    }
    // Most events carry the table's columns: checked without allocating.
    if image.is_none_or(|r| r.names().all(|c| meta.columns.iter().any(|t| t == c))) {
        return Ok(());
    }
    let qualified = qualified();
    // The table may have gained the column since its metadata was read (`walsink cdc
    // --source` adds a column the source added, on a connection of its own): read it again.
    if let Some(fresh) = load_meta(tx, schema, &ev.table, due).await? {
        tables.insert(ev.table.clone(), fresh);
    }
    let meta = &tables[&ev.table].meta;
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
        let ty = sql_type(&row.get(c).map_or(Value::Null, View::to_value));
        tx.batch_execute(&format!(
            "ALTER TABLE {qualified} ADD COLUMN IF NOT EXISTS {} {ty}",
            ident(c)
        ))
        .await
        .map_err(|e| classify(e, &format!("add column {c:?} to {qualified}")))?;
    }
    let meta = load_meta(tx, schema, &ev.table, due)
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
    due: &mut std::collections::HashSet<String>,
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
               b.typcategory::text, b.typname::text, coalesce(co.collisdeterministic, true) \
             FROM pg_attribute a JOIN pg_type t ON t.oid = a.atttypid \
             JOIN pg_namespace tn ON tn.oid = t.typnamespace \
             JOIN pg_type b ON b.oid = CASE WHEN t.typtype = 'd' THEN t.typbasetype ELSE t.oid END \
             LEFT JOIN pg_collation co ON co.oid = a.attcollation \
             WHERE a.attrelid = to_regclass($1) AND a.attnum > 0 AND NOT a.attisdropped ORDER BY a.attnum",
            &[&q],
        )
        .await
        .map_err(|e| classify(e, &format!("read the columns of {q}")))
    };
    let rows = read().await?;
    if rows.is_empty() {
        return Ok(None);
    }
    if !rows.iter().any(|r| r.get::<_, String>(0) == POS) {
        // The guard's hidden column is added in a transaction of its own, and the epoch
        // applied again: an ALTER in the epoch's transaction would lock the table against
        // every reader until the epoch commits (see `CdcSink::deliver`).
        due.insert(q.clone());
        return Err(SinkError::retryable(format!(
            "{q} has no column {POS} yet: it is added in a transaction of its own first"
        )));
    }
    let mut cols = Vec::with_capacity(rows.len());
    let mut kinds = HashMap::with_capacity(rows.len());
    let mut bases: HashMap<String, String> = HashMap::with_capacity(rows.len());
    let mut deterministic: HashMap<String, bool> = HashMap::with_capacity(rows.len());
    for r in rows {
        let name: String = r.get(0);
        if name == POS {
            continue;
        }
        let category: String = r.get(2);
        let base: String = r.get(3);
        deterministic.insert(name.clone(), r.get::<_, bool>(4));
        kinds.insert(
            name.clone(),
            ColumnKind::from_catalog(r.get(1), &category, &base),
        );
        bases.insert(name.clone(), base);
        cols.push(name);
    }
    let key = tx
        .query(
            "SELECT a.attname::text, i.indimmediate, \
               ARRAY(SELECT c.relname::text FROM pg_class c WHERE c.oid = i.indexrelid \
                 OR c.oid IN (SELECT relid FROM pg_partition_tree(i.indexrelid))) \
             FROM pg_index i, unnest(i.indkey) WITH ORDINALITY AS k(attnum, n), pg_attribute a \
             WHERE i.indrelid = to_regclass($1) AND i.indisprimary AND a.attrelid = i.indrelid AND a.attnum = k.attnum \
             ORDER BY k.n",
            &[&q],
        )
        .await
        .map_err(|e| classify(e, &format!("read the primary key of {q}")))?;
    // The key's index (and its partitions' indexes), named in the unique violation of a
    // plain insert that met a key; an index checked at commit (a deferrable key) would fail
    // the commit instead.
    let key_index = key
        .first()
        .filter(|r| r.get::<_, bool>(1))
        .map(|r| r.get::<_, Vec<String>>(2));
    let key: Vec<String> = key.iter().map(|r| r.get(0)).collect();
    let canon = key
        .iter()
        .map(|k| Canon::of(bases.get(k).map_or("", String::as_str)))
        .collect();
    let spellings = key
        .iter()
        .map(|k| {
            Spelling::of(
                bases.get(k).map_or("", String::as_str),
                deterministic.get(k).copied().unwrap_or(false),
            )
        })
        .collect();
    Ok(Some(Target {
        key_index,
        meta: TableMeta {
            name: table.to_string(),
            columns: cols,
            key,
        },
        kinds,
        canon,
        spellings,
    }))
}

const UPSERT: u8 = 0;
const DELETE: u8 = 1;
/// A plain insert (no conflict check) of rows whose keys the source created in the run
/// ([`Step::Upserts`]'s `created`); only unguarded. About 1.5x as fast for the server as the
/// upsert of the same rows. Should a key be there after all, the insert fails, the epoch's
/// transaction rolls back, and the table gets upserts from then on (see `CdcSink::refused`).
const INSERT: u8 = 2;

/// The rows of a statement that reads them from JSON: `[{"p": rank, "r": image}, …]`, the
/// value of a `json` or `jsonb` column as its JSON text (a string), which the statement reads
/// with `->>` and casts: so JSON `null` stays `null`, where `jsonb_populate_record` would make
/// it SQL `NULL`.
fn payload(target: &Target, rows: Vec<crate::plan::Change<Img>>) -> Value {
    Value::Array(
        rows.into_iter()
            .map(|c| {
                let mut row = c.row.to_row();
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

/// Whether a statement of `kind` takes the table's name (`$2`): every guarded statement,
/// and a delete (its tombstones); an unguarded upsert does not.
fn takes_table(shape: Shape) -> bool {
    shape.guarded || shape.kind == DELETE
}

/// An update whose `before` and `after` spell their keys differently changes the key only
/// if PostgreSQL holds the two keys different: `"07"` and `7` in an `integer` key are one key,
/// and the update must not become a delete of it and an insert at the same rank (which the
/// delete's tombstone would refuse). When the spellings leave it open, the server compares
/// the keys as it casts them, and for one key the update loses its `before`.
async fn same_key_update(
    tx: &Transaction<'_>,
    target: &Target,
    schema: &str,
    ev: &mut Event<Img>,
    at: RecordPosition,
) -> Result<(), SinkError> {
    let (Op::Update, Some(before), Some(after)) = (ev.op, &ev.before, &ev.after) else {
        return Ok(());
    };
    let meta = &target.meta;
    let (Ok(old), Ok(new)) = (
        crate::plan::key_of(before, meta, "before"),
        crate::plan::key_of(after, meta, "after"),
    ) else {
        return Ok(());
    };
    if old == new || (spelled_once(target, before) && spelled_once(target, after)) {
        return Ok(());
    }
    let n = meta.key.len();
    let mut casts = Vec::with_capacity(n);
    for c in &meta.key {
        match target.kinds.get(c).and_then(ColumnKind::cast) {
            Some(ty) => casts.push(ty),
            // A key column sent through JSON (an array or composite key): left to the
            // statements, as before.
            None => return Ok(()),
        }
    }
    let row = |from: usize| {
        casts
            .iter()
            .zip(&target.canon)
            .enumerate()
            .map(|(i, (ty, canon))| canon.expr(&format!("(${}::text)::{ty}", from + i)))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let sql = format!("SELECT ROW({})::text = ROW({})::text", row(1), row(1 + n));
    let values: Vec<Option<String>> = [before, after]
        .iter()
        .flat_map(|img| {
            meta.key
                .iter()
                .map(|c| {
                    img.get(c)
                        .and_then(|v| v.text(&target.kinds[c]))
                        .map(std::borrow::Cow::into_owned)
                })
                .collect::<Vec<_>>()
        })
        .collect();
    let params: Vec<&(dyn tokio_postgres::types::ToSql + Sync)> = values
        .iter()
        .map(|v| v as &(dyn tokio_postgres::types::ToSql + Sync))
        .collect();
    let same: Option<bool> = tx
        .query_one(&sql, &params)
        .await
        .map_err(|e| {
            classify(
                e,
                &format!(
                    "compare the old and new keys of {}.{} ({})",
                    ident(schema),
                    ident(&meta.name),
                    where_(ev, at)
                ),
            )
        })?
        .get(0);
    if same == Some(true) {
        ev.before = None;
    }
    Ok(())
}

/// Whether every key `ev` names (the old one too, when an update changes it) is in its one
/// spelling.
fn event_spelled_once(target: &Target, ev: &Event<Img>) -> bool {
    let key_in = |row: &Option<Img>| {
        row.as_ref().is_none_or(|r| {
            target.meta.key.iter().all(|k| !r.has_value(k)) || spelled_once(target, r)
        })
    };
    match ev.op {
        Op::Truncate => true,
        Op::Delete => key_in(&ev.before),
        _ => key_in(&ev.after) && key_in(&ev.before),
    }
}

/// Whether no two rows of `rows` can name one key in two spellings: every key is written in
/// its one spelling ([`Spelling`]). The planner keeps one row per spelling, so such rows hold
/// each key once, and a statement of them can skip keeping the newest per key (a sort of the
/// rows).
fn one_spelling(target: &Target, rows: &[crate::plan::Change<Img>]) -> bool {
    rows.iter().all(|r| spelled_once(target, &r.row))
}

/// The statement for one kind of step, written once per table, kind, guard and column set.
///
/// The rows come as one array per column (`$1` the ranks, then the columns' text, cast on
/// the server) or, when a column needs it, as one JSON array (`$1`); when the statement
/// [`takes_table`], `$2` is the table's name in the bookkeeping tables and the columns
/// follow from `$3`, otherwise from `$2`.
///
/// `guarded`: each row applies only if its rank is above the row's, its tombstone's and the
/// table's watermark. Unguarded: every row applies, which gives the same result when every
/// rank sent is above the table's high-water (see [`run`]); the delete still leaves its
/// tombstones.
fn statement_sql(schema: &str, target: &Target, shape: Shape, columns: &[String]) -> String {
    let Shape {
        kind,
        guarded,
        one_spelling,
    } = shape;
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
    let above = |rank: &str| {
        if guarded {
            format!(
                " WHERE coalesce({rank} > (SELECT truncated_at FROM {s}.{TABLES} WHERE tbl = $2), true)"
            )
        } else {
            String::new()
        }
    };
    let first = if takes_table(shape) { 3 } else { 2 };
    let sent = step_columns(target, kind, columns);
    // The rows (above the table's watermark when guarded), with their ranks.
    let rows = if typed(target, sent) {
        let arrays: String = (0..sent.len())
            .map(|i| format!(", ${}::text[]", i + first))
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
            "SELECT u._ws_rank{casts} FROM unnest($1::bigint[]{arrays}) AS u(_ws_rank{names}){}",
            above("u._ws_rank")
        )
    } else {
        // `json` and `jsonb` columns from their JSON text (see `payload`), the rest as
        // `jsonb_populate_record` makes them. Every name is qualified (`e._ws_ev`, not `e`):
        // a bare `e` would be the record's column of that name where the table has one.
        let picks: String = sent
            .iter()
            .map(|c| match &target.kinds.get(c) {
                Some(ColumnKind::Json(ty)) => {
                    format!("(e._ws_ev->'r'->>{})::{ty} AS {}, ", literal(c), ident(c))
                }
                _ => format!("r.{}, ", ident(c)),
            })
            .collect();
        format!(
            "SELECT {picks}(e._ws_ev->>'p')::bigint AS _ws_rank \
             FROM jsonb_array_elements($1::jsonb) AS e(_ws_ev), \
             LATERAL jsonb_populate_record(NULL::{t}, e._ws_ev->'r') r{}",
            above("(e._ws_ev->>'p')::bigint")
        )
    };
    // One row per key, the newest: the planner keeps one event per key as the client spells
    // it, and two spellings of one key (`1.0` and `1.00`, a uuid in capitals and in lower
    // case) would otherwise reach one row twice in one statement.
    let w_key = canon_key("w.");
    let v = if one_spelling {
        format!("v AS ({rows})")
    } else {
        format!(
            "v AS (SELECT DISTINCT ON ({w_key}) * FROM ({rows}) w ORDER BY {w_key}, w._ws_rank DESC)"
        )
    };
    let older = |t: &str, rank: &str| {
        if guarded {
            format!(" AND ({t}.{POS} IS NULL OR {t}.{POS} < {rank})")
        } else {
            String::new()
        }
    };
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
            "WITH {v}, d AS (DELETE FROM {t} t USING v WHERE {on}{}) \
             INSERT INTO {s}.{TOMBS} AS x (tbl, k, pos) SELECT $2, ROW({key_row})::text, v._ws_rank FROM v \
             ON CONFLICT (tbl, k) DO UPDATE SET pos = EXCLUDED.pos WHERE x.pos < EXCLUDED.pos",
            older("t", "v._ws_rank")
        );
    }
    let mut sets: Vec<String> = columns
        .iter()
        .filter(|c| !meta.key.contains(c))
        .map(|c| format!("{0} = EXCLUDED.{0}", ident(c)))
        .collect();
    sets.push(format!("{POS} = EXCLUDED.{POS}"));
    let (not_dead, newer) = if guarded {
        (
            format!(" WHERE NOT EXISTS (SELECT 1 FROM {s}.{TOMBS} x WHERE x.tbl = $2 AND x.k = ROW({key_row})::text AND x.pos >= v._ws_rank)"),
            format!(" WHERE t.{POS} IS NULL OR t.{POS} < EXCLUDED.{POS}"),
        )
    } else {
        (String::new(), String::new())
    };
    let insert = format!(
        "WITH {v} INSERT INTO {t} AS t ({}, {POS}) SELECT {}, v._ws_rank FROM v{not_dead}",
        list("", columns),
        list("v.", columns),
    );
    if kind == INSERT {
        debug_assert!(!guarded, "a plain insert is never guarded");
        return insert;
    }
    format!(
        "{insert} ON CONFLICT ({}) DO UPDATE SET {}{newer}",
        list("", &meta.key),
        sets.join(", ")
    )
}

/// The lowest rank of each run of a table's steps that no truncate or [`Step::Cut`] of the
/// table ends (so each key is in at most one of the run's steps), by the index of the run's
/// first step; `i64::MIN` (so the run goes guarded) when a step of the run holds a key not in
/// its one spelling (`spelled[i]` false): two spellings of one key in two steps would
/// otherwise meet unguarded, in the steps' order instead of their ranks'.
fn run_floors<R>(steps: &[Step<R>], spelled: &[bool]) -> HashMap<usize, i64> {
    let mut open: HashMap<&str, usize> = HashMap::new();
    let mut floors: HashMap<usize, i64> = HashMap::new();
    for (i, step) in steps.iter().enumerate() {
        match step {
            Step::Truncate { table, .. } | Step::Cut { table } => {
                open.remove(table.as_str());
            }
            Step::Deletes { table, rows } | Step::Upserts { table, rows, .. } => {
                let first = *open.entry(table.as_str()).or_insert(i);
                let low = if spelled[i] {
                    rows.iter().map(|c| c.rank).min().unwrap_or(i64::MAX)
                } else {
                    i64::MIN
                };
                let floor = floors.entry(first).or_insert(i64::MAX);
                *floor = (*floor).min(low);
            }
        }
    }
    floors
}

/// Whether an upsert row of an unguarded run (every rank above the table's high-water) may go
/// as a plain insert: its key's first event in the run created it ([`Change::created`]), and
/// nothing the table holds can be of that key. That is so when that first event
/// ([`Change::opened`]) ranks above everything the table held when the epoch began (`start`)
/// and no event of the table in the epoch ranked below the one before it (`in_order`): the key's
/// earlier events, sent before, left it without a row, as the source had it before the
/// create, and none of its later events was sent before it. Otherwise only when the create
/// ranks above everything sent so far (`now`, the high-water at the run's start). A guess
/// that is wrong costs a retry, never a row: the insert meets the key's row, the epoch rolls
/// back and the table gets upserts (see [`INSERT`]).
///
/// [`Change::created`]: crate::plan::Change::created
/// [`Change::opened`]: crate::plan::Change::opened
fn plain_insert<R>(c: &crate::plan::Change<R>, start: i64, now: i64, in_order: bool) -> bool {
    let first = c.opened.min(c.rank);
    c.created && first > if in_order { start } else { now }
}

/// Changes an epoch's planner holds at most (unless `max_held` is lower): see [`window`].
const WINDOW_MAX: usize = 12_000;

/// How many changes the planner holds before it sends the oldest [`PIPELINE_HELD`]: a quarter
/// of the epoch, at least [`PIPELINE_HELD`] and at most [`WINDOW_MAX`] or `max_held`. A later
/// event of a held key folds into it, so a row inserted and then updated or deleted while it
/// is held is written once, or never; a larger window folds more, but the server waits longer
/// for the first flush and the sink for the last (measured in docs/benchmarks.md).
fn window(epoch_len: u64, max_held: usize) -> usize {
    let quarter = usize::try_from(epoch_len / 4).unwrap_or(usize::MAX);
    quarter.clamp(PIPELINE_HELD, WINDOW_MAX).min(max_held)
}

/// Changes sent in one flush (the oldest held), while the rest of the epoch is read: the
/// server runs one flush's statements while the sink parses and plans the next.
const PIPELINE_HELD: usize = 2048;

/// Changes held before an epoch's first flush is sent: smaller, so the server starts soon.
const PIPELINE_FIRST: usize = 512;

/// Flushes sent and not yet answered, at most: the server works through one while the next
/// waits queued behind it, and the sink parses on.
const MAX_IN_FLIGHT: usize = 2;

/// Records parsed in one go, between two chances for the connection's task to run.
const PARSE_BATCH: usize = 256;

/// Reads one record: the sink's own way ([`crate::image`]) when it can, the general way
/// otherwise (the same event where both answer).
fn read(
    record: &bytes::Bytes,
    position: &event::PositionField,
) -> Result<Option<Event<Img>>, event::EventError> {
    if !record
        .iter()
        .all(|b| matches!(b, b' ' | b'\t' | b'\n' | b'\r'))
    {
        if let Some(e) = crate::read::parse(record, position) {
            return Ok(e);
        }
    }
    Ok(event::parse(record, position)?.map(|e| Event {
        op: e.op,
        db: e.db,
        schema: e.schema,
        table: e.table,
        position: e.position,
        before: e.before.map(Img::Row),
        after: e.after.map(Img::Row),
    }))
}

/// One record parsed: where it is in the log, and its event (`None`: a tombstone).
type Parsed = (
    RecordPosition,
    Result<Option<Event<Img>>, event::EventError>,
);

/// An epoch's records, read chunk by chunk and parsed in batches of [`PARSE_BATCH`] on the
/// sink's own task. Parsing on the blocking pool instead, ahead of the planning, cost more
/// CPU than it saved on 2 cores shared with the server: the rows held in the planner were
/// made on one thread and freed on another (docs/benchmarks.md). After each batch the task
/// yields, so the connection's task puts the flushes sent on the wire and reads the answers.
struct Parsing {
    chunks: AsyncChunks,
    /// The records of the current chunk not yet parsed.
    records: std::vec::IntoIter<walsink::Record>,
    position: event::PositionField,
    /// The chunks have ended (or failed).
    done: bool,
}

impl Parsing {
    fn new(epoch: &Epoch, position: &event::PositionField) -> Parsing {
        Parsing {
            chunks: AsyncChunks::new(epoch),
            records: Vec::new().into_iter(),
            position: position.clone(),
            done: false,
        }
    }

    /// The next batch of parsed records, in the epoch's order; `None` after the last.
    async fn next(&mut self) -> Option<Result<Vec<Parsed>, SinkError>> {
        if self.records.len() == 0 {
            if self.done {
                return None;
            }
            match self.chunks.next().await {
                Some(Ok(chunk)) => self.records = chunk.records().collect::<Vec<_>>().into_iter(),
                Some(Err(e)) => {
                    self.done = true;
                    return Some(Err(
                        SinkError::retryable(format!("read the epoch: {e}")).with_source(e)
                    ));
                }
                None => {
                    self.done = true;
                    return None;
                }
            }
        } else {
            tokio::task::yield_now().await;
        }
        let batch = self.records.by_ref().take(PARSE_BATCH);
        Some(Ok(batch
            .map(|rec| (rec.position, read(&rec.data, &self.position)))
            .collect()))
    }
}

/// The flushes of an epoch that are sent and not yet answered, oldest first.
#[derive(Default)]
struct InFlights<'a> {
    queue: std::collections::VecDeque<InFlight<'a>>,
    /// Flushes sent in this epoch so far.
    sent: usize,
}

impl<'a> InFlights<'a> {
    /// Sends a flush's statements and keeps what is to be answered. A flush that could not be
    /// made ready (a catalog query, a prepare or a truncate failed) may have met an earlier
    /// flush's failure: see [`InFlights::earlier_failure_first`].
    async fn send(
        &mut self,
        tx: &'a Transaction<'_>,
        ready: Result<Vec<Ready>, SinkError>,
        stats: &mut Stats,
    ) -> Result<(), SinkError> {
        let ready = self.earlier_failure_first(ready, stats).await?;
        // The connection runs on its own task and may answer while the flush is being
        // started: a failure met then may be the echo of an earlier flush's.
        let f = start(tx, ready).await;
        let f = self.earlier_failure_first(f, stats).await?;
        self.sent += 1;
        self.queue.extend(f);
        Ok(())
    }

    /// `r`, unless it failed while flushes were in flight and one of them failed first: a
    /// failed flush aborts the transaction, and a query made after it fails only as its echo
    /// ("current transaction is aborted", which would be taken as retryable), so the flush's
    /// own error is the one that says why.
    async fn earlier_failure_first<T>(
        &mut self,
        r: Result<T, SinkError>,
        stats: &mut Stats,
    ) -> Result<T, SinkError> {
        if r.is_err() {
            self.wait_all(stats).await?;
        }
        r
    }

    /// Waits for the oldest flushes until fewer than [`MAX_IN_FLIGHT`] are left.
    async fn make_room(&mut self, stats: &mut Stats) -> Result<(), SinkError> {
        while self.queue.len() >= MAX_IN_FLIGHT {
            wait(self.queue.pop_front(), stats).await?;
        }
        Ok(())
    }

    /// Waits for every flush, oldest first: the first error is the one that aborted the
    /// transaction (the later ones are its echo).
    async fn wait_all(&mut self, stats: &mut Stats) -> Result<(), SinkError> {
        while let Some(f) = self.queue.pop_front() {
            wait(Some(f), stats).await?;
        }
        Ok(())
    }
}

/// A flush's statements, sent and not yet answered.
type InFlight<'a> = std::pin::Pin<Box<dyn Future<Output = Result<(), SinkError>> + Send + 'a>>;

/// One statement of a flush, ready to send: everything it needs is owned.
struct Ready {
    statement: Statement,
    params: Params,
    /// What it does, for its error.
    context: String,
    /// A plain insert: the table to refuse plain inserts from now on if a key is there, and
    /// the indexes of its key (a unique violation naming another index is no such key).
    refuse: Option<(TableSet, String, Vec<String>)>,
}

/// A statement's parameters (see [`statement_sql`]).
enum Params {
    /// The ranks, the table's name if the statement takes it, and one text array per column.
    Typed {
        ranks: Vec<i64>,
        table: Option<String>,
        arrays: Vec<TextArray>,
    },
    /// The rows as one JSON array, and the table's name if the statement takes it.
    Json { rows: Value, table: Option<String> },
}

impl Params {
    fn refs(&self) -> Vec<&(dyn tokio_postgres::types::ToSql + Sync)> {
        let mut out: Vec<&(dyn tokio_postgres::types::ToSql + Sync)> = Vec::new();
        match self {
            Params::Typed {
                ranks,
                table,
                arrays,
            } => {
                out.push(ranks);
                if let Some(t) = table {
                    out.push(t);
                }
                out.extend(
                    arrays
                        .iter()
                        .map(|a| a as &(dyn tokio_postgres::types::ToSql + Sync)),
                );
            }
            Params::Json { rows, table } => {
                out.push(rows);
                if let Some(t) = table {
                    out.push(t);
                }
            }
        }
        out
    }
}

/// Turns a flush's steps into statements ready to send, in order (each run of a table's steps
/// goes unguarded when every rank in it is above the table's high-water, see below). What
/// must happen first happens here: the table's bookkeeping row is locked, a statement not yet
/// prepared is prepared, and a truncate runs (after the statements before it).
///
/// Why a run above the high-water needs no guard: the guard could refuse nothing, because the
/// steps of one run touch each key at most once (a truncate or a [`Step::Cut`] ends a run, see
/// [`crate::plan`]), so what each row is compared with is what the table held before the run,
/// and the high-water a run is compared with includes every step sent before it. That is every
/// flush of an upstream that sends its changes in order; a replay, or a run that reaches back,
/// goes guarded.
async fn statements_for(
    tx: &Transaction<'_>,
    statements: &mut Statements,
    at: &Tables<'_>,
    highs: &mut Highs,
    steps: Vec<Step<Img>>,
    planner: &Planner<Img>,
    stats: &mut Stats,
) -> Result<Vec<Ready>, SinkError> {
    let Tables {
        tables,
        schema,
        refused,
    } = *at;
    let started = std::time::Instant::now();
    // Whether each step's keys are each in their one spelling.
    let spelled: Vec<bool> = steps
        .iter()
        .map(|step| match step {
            Step::Truncate { .. } | Step::Cut { .. } => true,
            Step::Deletes { table, rows } | Step::Upserts { table, rows, .. } => {
                one_spelling(&tables[table], rows)
            }
        })
        .collect();
    let floors = run_floors(&steps, &spelled);
    let r = async {
        let mut ready = Vec::new();
        // The guard of each table's current run, and the high-water at its start.
        let mut guarded: HashMap<String, (bool, i64)> = HashMap::new();
        for (i, step) in steps.into_iter().enumerate() {
            let table = match &step {
                // Ends the run (see `run_floors`): the next step's run is compared with
                // everything sent before it.
                Step::Cut { .. } => continue,
                Step::Truncate { table, .. }
                | Step::Deletes { table, .. }
                | Step::Upserts { table, .. } => table.clone(),
            };
            if !highs.contains_key(&table) {
                let h = lock_high(tx, schema, &tables[&table].meta).await?;
                highs.insert(table.clone(), h);
            }
            let high = highs.get_mut(&table).expect("inserted above");
            if let Some(floor) = floors.get(&i) {
                guarded.insert(table.clone(), (*floor <= high.now, high.now));
            }
            let (kind, columns, rows) = match step {
                Step::Truncate { table, rank, at } => {
                    stats.sent += 1;
                    send_all(tx, std::mem::take(&mut ready)).await?;
                    truncate(tx, schema, &tables[&table].meta, rank, at).await?;
                    high.now = high.now.max(rank);
                    continue;
                }
                Step::Cut { .. } => continue,
                Step::Deletes { rows, .. } | Step::Upserts { rows, .. } if rows.is_empty() => {
                    continue
                }
                Step::Deletes { rows, .. } => (DELETE, Vec::new(), rows),
                Step::Upserts { columns, rows, .. } => (UPSERT, columns, rows),
            };
            high.now = high
                .now
                .max(rows.iter().map(|c| c.rank).max().unwrap_or(i64::MIN));
            let (run_guarded, run_high) = guarded[&table];
            let shape = Shape {
                kind,
                guarded: run_guarded,
                one_spelling: spelled[i],
            };
            // Created keys of an unguarded run (every rank above anything the table holds, so
            // no tombstone or newer row can refuse them) go as a plain insert when nothing
            // the table holds can be of their keys (see `plain_insert`), unless the table had
            // a created key there before.
            let (created, rows): (Vec<_>, Vec<_>) = if kind == UPSERT
                && !shape.guarded
                && shape.one_spelling
                && tables[&table].key_index.is_some()
                && !refused.lock().expect("not poisoned").contains(&table)
            {
                let (start, in_order) = (high.start, planner.in_order(&table));
                rows.into_iter()
                    .partition(|c| plain_insert(c, start, run_high, in_order))
            } else {
                (Vec::new(), rows)
            };
            let insert = Shape {
                kind: INSERT,
                ..shape
            };
            for (shape, rows) in [(insert, created), (shape, rows)] {
                if rows.is_empty() {
                    continue;
                }
                let p = Pending {
                    table: table.clone(),
                    shape,
                    columns: columns.clone(),
                    rows,
                };
                ready.push(p.ready(tx, statements, at, stats).await?);
            }
        }
        Ok::<_, SinkError>(ready)
    }
    .await;
    stats.statements += started.elapsed();
    r
}

/// Where a flush's statements go: the target tables, their schema, and the tables that get
/// no plain inserts.
#[derive(Clone, Copy)]
struct Tables<'a> {
    tables: &'a HashMap<String, Target>,
    schema: &'a str,
    refused: &'a TableSet,
}

/// One statement of a flush, before it is prepared and its parameters built.
struct Pending {
    table: String,
    shape: Shape,
    columns: Vec<String>,
    rows: Vec<crate::plan::Change<Img>>,
}

impl Pending {
    /// The statement, prepared if it was not, with its parameters; counted in `stats`.
    async fn ready(
        self,
        tx: &Transaction<'_>,
        statements: &mut Statements,
        at: &Tables<'_>,
        stats: &mut Stats,
    ) -> Result<Ready, SinkError> {
        let Tables {
            tables,
            schema,
            refused,
        } = *at;
        let Pending {
            table,
            shape,
            columns,
            rows,
        } = self;
        stats.sent += 1;
        stats.unguarded += u64::from(!shape.guarded);
        stats.inserts += u64::from(shape.kind == INSERT);
        let target = &tables[&table];
        let statement = prepare(tx, statements, schema, target, shape, &columns).await?;
        let mut r = build(target, shape, &columns, rows, statement, schema);
        if shape.kind == INSERT {
            let indexes = target.key_index.clone().unwrap_or_default();
            r.refuse = Some((refused.clone(), table, indexes));
        }
        Ok(r)
    }
}

/// One step's statement with its parameters.
fn build(
    target: &Target,
    shape: Shape,
    columns: &[String],
    rows: Vec<crate::plan::Change<Img>>,
    statement: Statement,
    schema: &str,
) -> Ready {
    let what = match shape.kind {
        DELETE => "delete from",
        INSERT => "insert into",
        _ => "upsert into",
    };
    let table = &target.meta.name;
    let context = failed(what, schema, table, &rows);
    let sent = step_columns(target, shape.kind, columns);
    let table = takes_table(shape).then(|| table.clone());
    let params = if typed(target, sent) {
        let ranks: Vec<i64> = rows.iter().map(|c| c.rank).collect();
        let kinds: Vec<&ColumnKind> = sent.iter().map(|c| &target.kinds[c]).collect();
        let mut arrays: Vec<TextArray> = sent
            .iter()
            .map(|_| TextArray::with_capacity(rows.len()))
            .collect();
        // An upsert's rows carry exactly its columns, and `sent` lists them in the rows'
        // order (by name), so each row is taken apart in one pass; a delete's key columns
        // are in key order.
        let in_row_order = sent.iter().map(String::as_str).is_sorted();
        for change in &rows {
            let row = &change.row;
            if in_row_order && row.len() == sent.len() {
                for (((c, v), kind), array) in row.columns().zip(&kinds).zip(&mut arrays) {
                    debug_assert!(
                        sent.iter().any(|s| s == c),
                        "{c} is not a column of the step"
                    );
                    array.push(v.text(kind).as_deref());
                }
                continue;
            }
            for ((c, kind), array) in sent.iter().zip(&kinds).zip(&mut arrays) {
                array.push(row.get(c).and_then(|v| v.text(kind)).as_deref());
            }
        }
        Params::Typed {
            ranks,
            table,
            arrays,
        }
    } else {
        Params::Json {
            rows: payload(target, rows),
            table,
        }
    };
    Ready {
        statement,
        params,
        context,
        refuse: None,
    }
}

/// Sends `ready` in one go (the connection pipelines them) and waits for every answer.
async fn send_all(tx: &Transaction<'_>, ready: Vec<Ready>) -> Result<(), SinkError> {
    let sends = ready.iter().map(|r| async move {
        let params = r.params.refs();
        tx.execute(&r.statement, &params)
            .await
            .map_err(|e| match &r.refuse {
                Some((refused, table, indexes))
                    if e.code() == Some(&tokio_postgres::error::SqlState::UNIQUE_VIOLATION)
                        && e.as_db_error()
                            .and_then(|d| d.constraint())
                            .is_some_and(|c| indexes.iter().any(|i| i == c)) =>
                {
                    refused.lock().expect("not poisoned").insert(table.clone());
                    SinkError::retryable(format!(
                        "{}: a key the change stream created is already in the table (a row \
                         written outside the stream, or a snapshot read again); the epoch is \
                         applied again with upserts for this table",
                        r.context
                    ))
                    .with_source(e)
                }
                _ => classify(e, &r.context),
            })
    });
    // Every answer, then the first failure in the order sent: the connection runs on its
    // own task, so a later statement's echo ("current transaction is aborted") may be in
    // before the failure that caused it is looked at.
    futures_util::future::join_all(sends)
        .await
        .into_iter()
        .collect::<Result<Vec<u64>, SinkError>>()?;
    Ok(())
}

/// Sends `ready` now and returns what is still to be answered: the first poll hands the
/// requests to the connection, and a yield lets the connection put them on the wire before
/// the sink goes back to parsing.
async fn start<'a>(
    tx: &'a Transaction<'_>,
    ready: Vec<Ready>,
) -> Result<Option<InFlight<'a>>, SinkError> {
    if ready.is_empty() {
        return Ok(None);
    }
    let mut f: InFlight<'a> = Box::pin(send_all(tx, ready));
    let first = std::future::poll_fn(|cx| Poll::Ready(f.as_mut().poll(cx))).await;
    if let Poll::Ready(r) = first {
        r?;
        return Ok(None);
    }
    tokio::task::yield_now().await;
    Ok(Some(f))
}

/// Waits for a flush in flight, timed into `stats.statements`.
async fn wait(f: Option<InFlight<'_>>, stats: &mut Stats) -> Result<(), SinkError> {
    let Some(f) = f else { return Ok(()) };
    let started = std::time::Instant::now();
    let r = f.await;
    stats.statements += started.elapsed();
    r
}

/// Locks the table's row in `walsink_cdc_tables` until the epoch commits, and reads its
/// high-water; when none is stored (a table the sink met before the high-water existed, or
/// its first epoch), computes it from the rows, tombstones and watermark.
///
/// The lock keeps the high-water true when two sinks write one table: the second waits until
/// the first commits, and then reads what the first stored.
async fn lock_high(
    tx: &Transaction<'_>,
    schema: &str,
    meta: &TableMeta,
) -> Result<High, SinkError> {
    let s = ident(schema);
    let t = format!("{s}.{}", ident(&meta.name));
    let err = |e| classify(e, &format!("lock the bookkeeping of {t}"));
    let row = tx
        .query_one(
            &format!(
                "INSERT INTO {s}.{TABLES} AS x (tbl) VALUES ($1) \
                 ON CONFLICT (tbl) DO UPDATE SET tbl = x.tbl RETURNING x.high"
            ),
            &[&meta.name],
        )
        .await
        .map_err(err)?;
    let stored: Option<i64> = row.get(0);
    if let Some(high) = stored {
        return Ok(High {
            stored,
            now: high,
            start: high,
        });
    }
    let row = tx
        .query_one(
            &format!(
                "SELECT greatest((SELECT max({POS}) FROM {t}), \
                   (SELECT max(pos) FROM {s}.{TOMBS} WHERE tbl = $1), \
                   (SELECT truncated_at FROM {s}.{TABLES} WHERE tbl = $1))"
            ),
            &[&meta.name],
        )
        .await
        .map_err(err)?;
    let computed = row.get::<_, Option<i64>>(0).unwrap_or(i64::MIN);
    Ok(High {
        stored: None,
        now: computed,
        start: computed,
    })
}

/// Stores the high-water of every table the epoch raised, in its transaction.
async fn store_highs(tx: &Transaction<'_>, schema: &str, highs: &Highs) -> Result<(), SinkError> {
    let s = ident(schema);
    for (table, high) in highs {
        if high.stored == Some(high.now) {
            continue;
        }
        tx.execute(
            &format!("UPDATE {s}.{TABLES} SET high = $2 WHERE tbl = $1"),
            &[table, &high.now],
        )
        .await
        .map_err(|e| classify(e, &format!("store the high-water of {s}.{}", ident(table))))?;
    }
    Ok(())
}

fn failed(what: &str, schema: &str, table: &str, rows: &[crate::plan::Change<Img>]) -> String {
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
    shape: Shape,
    columns: &[String],
) -> Result<Statement, SinkError> {
    let meta = &target.meta;
    let key = (meta.name.clone(), shape, columns.to_vec());
    if let Some(s) = statements.get(&key) {
        return Ok(s.clone());
    }
    let sql = statement_sql(schema, target, shape, columns);
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
                "SELECT (SELECT truncated_at FROM {s}.{TABLES} WHERE tbl = $1), \
                 coalesce((SELECT max({POS}) FROM {t}), -9223372036854775808)"
            ),
            &[&meta.name],
        )
        .await
        .map_err(err)?;
    let (watermark, newest): (Option<i64>, i64) = (row.get(0), row.get(1));
    if watermark.is_some_and(|w| rank <= w) {
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

    /// A guarded statement that keeps one row per key.
    fn shape(kind: u8) -> Shape {
        Shape {
            kind,
            guarded: true,
            one_spelling: false,
        }
    }

    #[test]
    fn a_cut_or_a_truncate_starts_a_run_of_its_own() {
        let change = |id: i64, rank: i64| crate::plan::Change {
            rank,
            row: serde_json::json!({"id": id}).as_object().unwrap().clone(),
            at: RecordPosition {
                checkpoint: 1,
                index: rank as u64,
            },
            created: false,
            opened: rank,
        };
        let up = |table: &str, rows: Vec<crate::plan::Change>| Step::Upserts {
            table: table.into(),
            columns: vec!["id".into()],
            rows,
        };
        let steps = vec![
            up("a", vec![change(2, 11), change(1, 30)]),
            up("b", vec![change(1, 5)]),
            Step::Cut { table: "a".into() },
            up("a", vec![change(2, 40)]),
            up("a", vec![change(1, 20)]),
            Step::Truncate {
                table: "a".into(),
                rank: 50,
                at: RecordPosition {
                    checkpoint: 1,
                    index: 50,
                },
            },
            up("a", vec![change(3, 60)]),
        ];
        let spelled = vec![true; steps.len()];
        let floors = run_floors(&steps, &spelled);
        // Table a: the run before the cut, the one after it (which holds key 1 again, at a
        // lower rank than the first run sent: it is compared with what that run left), and
        // the one after the truncate; table b: one run.
        let want: HashMap<usize, i64> = [(0, 11), (1, 5), (3, 20), (6, 60)].into_iter().collect();
        assert_eq!(floors, want);
        // A created row rests on its run's first event too: a create replayed at rank 10 that
        // a newer update at 20 won over must not make the run look newer than 10.
        let mut created = change(4, 20);
        created.created = true;
        created.opened = 10;
        let floors = run_floors(&[up("c", vec![created.clone()])], &[true]);
        assert_eq!(
            floors.get(&0),
            Some(&20),
            "the guard rests on the ranks sent"
        );
        // ... but that create does not make the row a plain insert unless the table held
        // nothing of rank 10 or above when the epoch began, and the table's events came in
        // order (else only if nothing sent so far in the epoch ranks 10 or above).
        assert!(plain_insert(&created, 9, 15, true));
        assert!(!plain_insert(&created, 10, 10, true));
        assert!(!plain_insert(&created, 9, 15, false));
        assert!(plain_insert(&created, 5, 9, false));
        assert!(!plain_insert(&change(4, 20), 0, 0, true), "not created");
    }

    #[test]
    fn unguarded_statements_and_one_spelling() {
        let target = Target {
            key_index: None,
            meta: TableMeta {
                name: "items".into(),
                columns: vec!["id".into(), "name".into()],
                key: vec!["id".into()],
            },
            kinds: [
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
            .collect(),
            canon: vec![Canon::AsIs],
            spellings: vec![Spelling::Int],
        };
        let plain = Shape {
            kind: UPSERT,
            guarded: false,
            one_spelling: true,
        };
        let up = statement_sql("r", &target, plain, &["id".into(), "name".into()]);
        assert!(
            !up.contains("_walsink_cdc_tombstones")
                && !up.contains("truncated_at")
                && !up.contains("DISTINCT ON")
                && !up.contains("tbl =")
                && !up.contains("WHERE"),
            "{up}"
        );
        assert!(
            up.contains("unnest($1::bigint[], $2::text[], $3::text[])"),
            "{up}"
        );
        let del = statement_sql(
            "r",
            &target,
            Shape {
                kind: DELETE,
                ..plain
            },
            &[],
        );
        assert!(
            del.contains("walsink_cdc_tombstones") && !del.contains("_walsink_pos <"),
            "{del}"
        );
        let change = |id: Value| crate::plan::Change {
            created: false,
            opened: 1,
            rank: 1,
            row: Img::Row([("id".to_string(), id)].into_iter().collect()),
            at: RecordPosition {
                checkpoint: 1,
                index: 0,
            },
        };
        let number = |t: &str| serde_json::from_str::<Value>(t).unwrap();
        for ok in ["0", "7", "-7", "123456789012"] {
            assert!(one_spelling(&target, &[change(number(ok))]), "{ok}");
        }
        for two in ["-0", "07", "7.0", "7e0", "1E2"] {
            if let Ok(v) = serde_json::from_str::<Value>(two) {
                assert!(!one_spelling(&target, &[change(v)]), "{two}");
            }
        }
        assert!(!one_spelling(&target, &[change(json!("7"))]));
        let other = Target {
            key_index: None,
            spellings: vec![Spelling::Other],
            ..target
        };
        assert!(!one_spelling(&other, &[change(number("7"))]));
        let text = Target {
            key_index: None,
            spellings: vec![Spelling::Text],
            ..other
        };
        assert!(one_spelling(&text, &[change(json!("7"))]));
        assert!(!one_spelling(&text, &[change(number("7"))]));
        let uuid = Target {
            key_index: None,
            spellings: vec![Spelling::Uuid],
            ..text
        };
        let u = "0a1b2c3d-4e5f-6789-abcd-ef0123456789";
        assert!(one_spelling(&uuid, &[change(json!(u))]));
        for two in [
            u.to_uppercase(),
            u.replace('-', ""),
            format!("{{{u}}}"),
            u[..35].to_string(),
        ] {
            assert!(!one_spelling(&uuid, &[change(json!(two))]), "{two}");
        }
    }

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
            key_index: None,
            meta,
            kinds,
            canon: vec![Canon::AsIs],
            spellings: vec![Spelling::Int],
        };
        let up = statement_sql("r", &target, shape(UPSERT), &["id".into(), "name".into()]);
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
        let only_key = statement_sql("r", &target, shape(UPSERT), &["id".into()]);
        assert!(
            only_key.contains("DO UPDATE SET _walsink_pos = EXCLUDED._walsink_pos WHERE"),
            "{only_key}"
        );
        assert!(
            up.contains("SELECT DISTINCT ON (w.\"id\") * FROM (")
                && up.contains("ORDER BY w.\"id\", w._ws_rank DESC"),
            "{up}"
        );
        let del = statement_sql("r", &target, shape(DELETE), &[]);
        assert!(del.contains("DELETE FROM \"r\".\"items\" t"), "{del}");
        // A numeric key is compared and kept canonical.
        target.canon = vec![Canon::TrimScale];
        let del = statement_sql("r", &target, shape(DELETE), &[]);
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
        let up = statement_sql("r", &target, shape(UPSERT), &["id".into(), "name".into()]);
        assert!(up.contains("jsonb_populate_record"), "{up}");
        let del = statement_sql("r", &target, shape(DELETE), &[]);
        assert!(del.contains("unnest($1::bigint[], $3::text[])"), "{del}");
        assert_eq!(sql_type(&json!(1)), "bigint");
        assert_eq!(sql_type(&json!(u64::MAX)), "numeric");
        assert_eq!(sql_type(&json!("x")), "text");
    }
}
