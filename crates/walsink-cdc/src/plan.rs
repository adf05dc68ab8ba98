//! How an epoch's events become a few set-based statements, with the same result as applying
//! them one by one under the position guard. Pure: no I/O, so property tests reach it.
//!
//! # Why per-key reduction is exact
//! Under the guard an event changes a row only when its rank is above the rank the row holds,
//! and then the row takes the event's rank. Applied one by one, a sequence of events for one
//! key therefore ends in the state of the event with the highest rank (the first of equals),
//! provided that rank is above what the row held; every other event of the key either changed
//! nothing or was overwritten. So the planner keeps, per table and key, only that event, and
//! the steps of one run of a table touch each key once: their order does not matter, and no
//! delete can overtake an insert of the same key. Two things cut a table's run of events: a
//! truncate (rows older than it go, so what came before is flushed first) and an update that
//! carries only some columns (an unchanged TOAST value), which must land on top of the earlier
//! image; the first is a [`Step::Truncate`], the second ends the run with a [`Step::Cut`], and
//! the steps after either may touch a key again (so a caller that leaves out the guard for a
//! run whose ranks are all above what the table holds must compare each run separately, after
//! the steps before it). Flushing early is always allowed: applying a prefix and then the rest
//! is the sequence. So is sending some keys' winners before others ([`Planner::drain_oldest`]): under the guard each
//! key's result depends only on its own events, and a key's later events land in later steps.

use crate::event::{Event, Op, Row};
use foldhash::HashMap;
use hashlink::LinkedHashMap;
use serde_json::Value;
use std::fmt::Debug;
use walsink::RecordPosition;

/// What the planner needs to know of a target table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TableMeta {
    /// The table's name (in the target schema).
    pub name: String,
    /// Its columns, in order.
    pub columns: Vec<String>,
    /// Its primary key's columns, in key order.
    pub key: Vec<String>,
}

impl TableMeta {
    /// The columns of `row` that the table lacks.
    pub fn missing<'a, R: Image>(&self, row: &'a R) -> Vec<&'a str> {
        row.names()
            .filter(|c| !self.columns.iter().any(|t| t == c))
            .collect()
    }
}

/// What the planner needs of a row image: [`Row`] (a parsed JSON object), or the sink's own
/// image that points into the record it was read from.
pub trait Image: Clone + Debug + PartialEq {
    /// The image's column names, sorted, each once.
    fn names(&self) -> impl Iterator<Item = &str>;
    /// Whether the image carries `column` (`null` too).
    fn has(&self, column: &str) -> bool;
    /// Whether the image carries `column` with a value that is not `null`.
    fn has_value(&self, column: &str) -> bool;
    /// The canonical text of one key column's value ([`key_of`]); `None` when the image
    /// lacks it or holds `null`.
    fn key_part(&self, column: &str) -> Option<std::borrow::Cow<'_, str>>;
    /// The image of the key columns of `meta` only (those it carries).
    fn key_only(&self, meta: &TableMeta) -> Self;
    /// Whether the image's column names ([`Image::names`]) are `names`.
    fn same_names(&self, names: &[String]) -> bool {
        self.names().eq(names.iter().map(String::as_str))
    }
}

impl Image for Row {
    fn names(&self) -> impl Iterator<Item = &str> {
        self.keys().map(String::as_str)
    }

    fn has(&self, column: &str) -> bool {
        self.contains_key(column)
    }

    fn has_value(&self, column: &str) -> bool {
        self.get(column).is_some_and(|v| !v.is_null())
    }

    fn key_part(&self, column: &str) -> Option<std::borrow::Cow<'_, str>> {
        Some(match self.get(column)? {
            Value::Null => return None,
            Value::String(s) => std::borrow::Cow::Borrowed(s.as_str()),
            // A number's text as written (`arbitrary_precision`), as `to_string` gives it.
            Value::Number(n) => std::borrow::Cow::Borrowed(n.as_str()),
            other => std::borrow::Cow::Owned(other.to_string()),
        })
    }

    fn key_only(&self, meta: &TableMeta) -> Self {
        meta.key
            .iter()
            .filter_map(|c| self.get(c).map(|v| (c.clone(), v.clone())))
            .collect()
    }
}

/// One change that survived reduction: the image to write (for a delete, the key columns)
/// and where it came from.
#[derive(Debug, Clone, PartialEq)]
pub struct Change<R = Row> {
    /// The event's rank ([`Event::rank`]).
    pub rank: i64,
    /// The row image.
    pub row: R,
    /// The event's place in the log.
    pub at: RecordPosition,
    /// An upsert whose key's first event since the table's run began was a create or a
    /// snapshot read (`c`, `r`): the source says the key had no row then, so a replica that
    /// has applied everything before holds none either, and a plain insert (no conflict
    /// check) would do. A caller that takes this must cope with the key being there after
    /// all (rows written outside the change stream, a snapshot read twice). Always false for
    /// a delete.
    pub created: bool,
    /// The lowest rank that `created` rests on: the rank of the key's first event in the run
    /// (a replayed create can be older than the update that wins over it). A caller that
    /// takes `created` without the guard must know that nothing the table holds can be of a
    /// later event of the key: this rank above everything the table held before the events
    /// were sent, with the events in rank order (see [`Planner::in_order`]), or above
    /// everything it holds now. The change's own rank when the change is that first event.
    pub opened: i64,
}

/// One set-based statement of a plan.
#[derive(Debug, Clone, PartialEq)]
pub enum Step<R = Row> {
    /// Delete these keys (each at most once), leaving tombstones.
    Deletes {
        /// The target table.
        table: String,
        /// The keys, with their ranks.
        rows: Vec<Change<R>>,
    },
    /// Upsert these rows (each key at most once); all rows carry exactly `columns`.
    Upserts {
        /// The target table.
        table: String,
        /// The columns every row carries, sorted.
        columns: Vec<String>,
        /// The rows, with their ranks.
        rows: Vec<Change<R>>,
    },
    /// The table's run ends here: steps after it may touch keys that steps before it (since
    /// the last truncate or cut) touched, so they must be compared with what those steps left
    /// (see [`Planner::cut`]). Writes nothing.
    Cut {
        /// The target table.
        table: String,
    },
    /// Truncate the table at this rank: rows older than it go, and it becomes the table's
    /// watermark.
    Truncate {
        /// The target table.
        table: String,
        /// The truncate's rank.
        rank: i64,
        /// Its place in the log.
        at: RecordPosition,
    },
}

impl<R> Step<R> {
    /// The changes it counts in [`Planner::held`]: its rows, one for a truncate, none for a
    /// cut.
    fn held(&self) -> usize {
        match self {
            Step::Truncate { .. } => 1,
            Step::Cut { .. } => 0,
            Step::Deletes { rows, .. } | Step::Upserts { rows, .. } => rows.len(),
        }
    }
}

/// Why an event cannot be planned.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum PlanError {
    /// The image lacks a key column, or holds null in it.
    #[error("the {image} image has no value for key column {column:?} of table {table}")]
    NoKey {
        /// The table.
        table: String,
        /// `before` or `after`.
        image: &'static str,
        /// The key column.
        column: String,
    },
}

#[derive(Debug, Clone, Copy)]
enum Kind {
    Upsert,
    Delete,
}

#[derive(Debug, Clone)]
struct Winner<R> {
    kind: Kind,
    change: Change<R>,
    /// The key's first event in the current run was a create or a snapshot read (kept
    /// across a delete winner too; an upsert's `change.created` is set from it when flushed).
    created: bool,
    /// The rank `created` rests on (see [`Change::opened`]).
    opened: i64,
}

/// A table's kept winners by key, oldest first: a key moves to the back when a newer event
/// replaces its winner, so the front is the key left alone longest.
type Winners<R> = LinkedHashMap<String, Winner<R>, foldhash::fast::RandomState>;

/// Reduces a stream of events to [`Step`]s; see the module docs.
#[derive(Debug)]
pub struct Planner<R = Row> {
    tables: HashMap<String, Winners<R>>,
    out: Vec<Step<R>>,
    held: usize,
    /// Each table's last rank pushed, and whether no rank pushed for it so far fell.
    order: HashMap<String, (i64, bool)>,
}

/// The canonical text of a key: each key column's value as text (a string as itself, a number
/// or boolean as written), so `"7"` and `7` name the same key, as they do once cast. Each part
/// is written as its length, `:`, and itself, so no two keys share a text.
pub fn key_of<R: Image>(
    row: &R,
    meta: &TableMeta,
    image: &'static str,
) -> Result<String, PlanError> {
    let mut k = String::with_capacity(16);
    let mut len = itoa::Buffer::new();
    for c in &meta.key {
        let Some(part) = row.key_part(c) else {
            return Err(PlanError::NoKey {
                table: meta.name.clone(),
                image,
                column: c.clone(),
            });
        };
        k.push_str(len.format(part.len()));
        k.push(':');
        k.push_str(&part);
    }
    Ok(k)
}

/// Whether `after` carries only some of the table's columns (an unchanged TOAST value left
/// out): such an image must land on top of what the earlier events left.
pub fn partial<R: Image>(after: &R, meta: &TableMeta) -> bool {
    meta.columns.iter().any(|c| !after.has(c))
}

impl<R> Default for Planner<R> {
    fn default() -> Self {
        Planner {
            tables: HashMap::default(),
            out: Vec::new(),
            held: 0,
            order: HashMap::default(),
        }
    }
}

impl<R: Image> Planner<R> {
    /// Ends the table's current run: what comes after lands in later steps than everything
    /// held for it now. Always allowed (see the module docs); a caller that knows two
    /// spellings of one key may be held apart uses it before a partial image.
    pub fn cut(&mut self, table: &str) {
        self.cut_run(table);
    }

    /// Flushes the table's held events and ends its run with a [`Step::Cut`], if anything was
    /// held: the steps before the cut and those after it may touch one key each.
    fn cut_run(&mut self, table: &str) {
        if self.tables.get(table).is_some_and(|keys| !keys.is_empty()) {
            self.flush_table(table);
            self.out.push(Step::Cut {
                table: table.to_string(),
            });
        }
    }

    /// An empty planner.
    pub fn new() -> Self {
        Self::default()
    }

    /// Changes held (kept winners plus planned steps' rows): flush when it grows too large.
    pub fn held(&self) -> usize {
        self.held
    }

    /// Whether every event pushed for `table` so far ranked at or above the one before it
    /// (true for a table with no event yet): an upstream in order, where a key held with a
    /// create as its first event cannot have been written by anything sent of a later event.
    /// Equal ranks are allowed (snapshot reads share one); a duplicate at an equal rank can
    /// only make a plain insert meet its row, which costs a retry.
    pub fn in_order(&self, table: &str) -> bool {
        self.order.get(table).is_none_or(|&(_, rising)| rising)
    }

    /// Adds one event for table `meta`, found at `at` (its images are moved, not copied).
    pub fn push(
        &mut self,
        e: Event<R>,
        meta: &TableMeta,
        at: RecordPosition,
    ) -> Result<(), PlanError> {
        let rank = e.rank();
        match self.order.get_mut(&meta.name) {
            Some((last, rising)) => {
                *rising &= rank >= *last;
                *last = rank;
            }
            None => {
                self.order.insert(meta.name.clone(), (rank, true));
            }
        }
        match e.op {
            Op::Truncate => {
                self.flush_table(&meta.name);
                self.out.push(Step::Truncate {
                    table: meta.name.clone(),
                    rank,
                    at,
                });
                self.held += 1;
            }
            Op::Delete => {
                let before = e.before.as_ref().expect("the parser checked before");
                let k = key_of(before, meta, "before")?;
                let row = before.key_only(meta);
                let change = Change {
                    rank,
                    row,
                    at,
                    created: false,
                    opened: rank,
                };
                self.offer(meta, k, Kind::Delete, change, false, false);
            }
            Op::Create | Op::Read | Op::Update => {
                let after = e.after.expect("the parser checked after");
                let k = key_of(&after, meta, "after")?;
                if let (Op::Update, Some(before)) = (e.op, &e.before) {
                    // A key change: delete the old key first (a different key, so the order
                    // within the flush does not matter).
                    if meta.key.iter().all(|c| before.has_value(c)) {
                        let old = key_of(before, meta, "before")?;
                        if old != k {
                            let row = before.key_only(meta);
                            let change = Change {
                                rank,
                                row,
                                at,
                                created: false,
                                opened: rank,
                            };
                            self.offer(meta, old, Kind::Delete, change, false, false);
                        }
                    }
                }
                let partial = partial(&after, meta);
                let created = matches!(e.op, Op::Create | Op::Read);
                let change = Change {
                    rank,
                    row: after,
                    at,
                    created: false,
                    opened: rank,
                };
                self.offer(meta, k, Kind::Upsert, change, partial, created);
            }
        }
        Ok(())
    }

    /// Keeps `change` as the key's winner if it is the newest. `created`: the event is a
    /// create or a snapshot read; what counts for the winner is whether the key's first event
    /// in the run was one (the row the run starts from).
    fn offer(
        &mut self,
        meta: &TableMeta,
        k: String,
        kind: Kind,
        change: Change<R>,
        partial: bool,
        created: bool,
    ) {
        if !self.tables.contains_key(&meta.name) {
            // Sized for a flush, so a large one does not grow it step by step.
            self.tables.insert(
                meta.name.clone(),
                Winners::with_capacity_and_hasher(1024, Default::default()),
            );
        }
        let keys = self.tables.get_mut(&meta.name).expect("inserted above");
        let (flush_first, new_key, created, opened) = match keys.get(&k) {
            // Changes nothing, whatever the row holds.
            Some(w) if change.rank <= w.change.rank => return,
            // A partial image must land on what the earlier event left (the earlier image, or
            // no row after a delete): flush, then keep it. The new run starts from that row,
            // which the earlier event's kind tells (so the flag rests on its rank too).
            Some(w) if partial => (
                true,
                false,
                matches!(w.kind, Kind::Delete) && created,
                w.change.rank,
            ),
            Some(w) => (false, false, w.created, w.opened),
            None => (false, true, created, change.rank),
        };
        if flush_first {
            self.cut_run(&meta.name);
        }
        let keys = match self.tables.get_mut(&meta.name) {
            Some(keys) => keys,
            None => self.tables.entry(meta.name.clone()).or_default(),
        };
        // At the back: the key's winner is now the newest.
        keys.insert(
            k,
            Winner {
                kind,
                change,
                created,
                opened,
            },
        );
        if new_key || flush_first {
            self.held += 1;
        }
    }

    fn flush_table(&mut self, table: &str) {
        let Some(keys) = self.tables.remove(table) else {
            return;
        };
        let winners: Vec<Winner<R>> = keys.into_iter().map(|(_, w)| w).collect();
        self.plan(table, winners);
    }

    /// Steps for `winners` of `table` (given oldest first, as a table's map keeps them): its
    /// deletes, then its upserts by column set. Their rows stay counted in `held` until
    /// drained.
    fn plan(&mut self, table: &str, winners: Vec<Winner<R>>) {
        let mut deletes = Vec::new();
        // Grouped by column set (a row's columns come sorted, see [`Image::names`]); most
        // tables have one or two sets, so a short list beats a map keyed by a copy of them.
        let mut upserts: Vec<(Vec<String>, Vec<Change<R>>)> = Vec::new();
        let held = winners.len();
        // In log order: a winner moves to the back of its map when it is replaced, and events
        // come in log order (a key change gives a delete and an upsert of one position, which
        // go to different steps, so the order between equals does not matter).
        debug_assert!(winners.is_sorted_by_key(|w| w.change.at));
        for w in winners {
            match w.kind {
                Kind::Delete => deletes.push(w.change),
                Kind::Upsert => {
                    let change = Change {
                        created: w.created,
                        opened: w.opened,
                        ..w.change
                    };
                    let row = &change.row;
                    match upserts.iter_mut().find(|(cols, _)| row.same_names(cols)) {
                        Some((_, rows)) => rows.push(change),
                        None => {
                            // The first column set usually takes (nearly) every row.
                            let mut rows =
                                Vec::with_capacity(if upserts.is_empty() { held } else { 0 });
                            let columns = row.names().map(str::to_string).collect();
                            rows.push(change);
                            upserts.push((columns, rows));
                        }
                    }
                }
            }
        }
        upserts.sort_by(|a, b| a.0.cmp(&b.0));
        if !deletes.is_empty() {
            self.out.push(Step::Deletes {
                table: table.to_string(),
                rows: deletes,
            });
        }
        for (columns, rows) in upserts {
            self.out.push(Step::Upserts {
                table: table.to_string(),
                columns,
                rows,
            });
        }
    }

    /// Everything planned so far, in an order that gives the one-by-one result; the planner
    /// is empty afterwards.
    pub fn drain(&mut self) -> Vec<Step<R>> {
        self.drain_oldest(usize::MAX)
    }

    /// The steps planned so far (those a truncate or a partial image cut off) and the winners
    /// of the `n` keys left alone longest (of all tables, by the place in the log of each
    /// key's newest event; more than `n` when the last one's event also wrote another key, a
    /// key change, whose two keys go together), in an order that gives the one-by-one result together with what
    /// is drained later. The other keys stay held, so their later events still fold into
    /// them: keeping a window of recent keys and sending the oldest writes each key once while
    /// it is busy.
    pub fn drain_oldest(&mut self, n: usize) -> Vec<Step<R>> {
        let names: Vec<String> = self.tables.keys().cloned().collect();
        let mut taken: Vec<Vec<Winner<R>>> = names.iter().map(|_| Vec::new()).collect();
        // The tables by their oldest winner's place in the log.
        let mut fronts: std::collections::BinaryHeap<std::cmp::Reverse<(RecordPosition, usize)>> =
            names
                .iter()
                .enumerate()
                .filter_map(|(i, name)| {
                    let (_, w) = self.tables[name].front()?;
                    Some(std::cmp::Reverse((w.change.at, i)))
                })
                .collect();
        // `n` winners, and then the rest of the last one's event: a key change's delete and
        // upsert share its rank, and split over two flushes the second would go to the
        // server at the rank the first raised the high-water to, under the guard.
        let mut count = 0;
        let mut last = None;
        while let Some(&std::cmp::Reverse((at, i))) = fronts.peek() {
            if count >= n && last != Some(at) {
                break;
            }
            fronts.pop();
            count += 1;
            last = Some(at);
            let keys = self.tables.get_mut(&names[i]).expect("a table of the heap");
            if let Some((_, w)) = keys.pop_front() {
                taken[i].push(w);
            }
            if let Some((_, w)) = keys.front() {
                fronts.push(std::cmp::Reverse((w.change.at, i)));
            }
        }
        // Each table's share as one run, the table whose oldest was oldest first.
        let mut order: Vec<usize> = (0..names.len()).filter(|&i| !taken[i].is_empty()).collect();
        order.sort_unstable_by_key(|&i| taken[i][0].change.at);
        for i in order {
            let winners = std::mem::take(&mut taken[i]);
            if self
                .tables
                .get(&names[i])
                .is_some_and(|keys| keys.is_empty())
            {
                self.tables.remove(&names[i]);
            }
            self.plan(&names[i], winners);
        }
        let out = std::mem::take(&mut self.out);
        let sent: usize = out.iter().map(Step::held).sum();
        debug_assert!(sent <= self.held, "{sent} rows sent of {} held", self.held);
        self.held = self.held.saturating_sub(sent);
        out
    }
}

#[cfg(test)]
pub(crate) mod model {
    //! The reference: events applied one by one under the guard, and plans applied step by
    //! step, to the same in-memory table.
    use super::*;
    use std::collections::BTreeMap;

    /// One table: key → (rank, row or tombstone), and the truncate watermark.
    #[derive(Debug, Clone, Default, PartialEq)]
    pub struct Table {
        pub rows: BTreeMap<String, (i64, Option<Row>)>,
        pub watermark: Option<i64>,
    }

    impl Table {
        fn newer(&self, k: &str, rank: i64) -> bool {
            self.watermark.is_none_or(|w| rank > w)
                && self.rows.get(k).is_none_or(|(r, _)| rank > *r)
        }

        pub fn upsert(&mut self, k: String, rank: i64, row: &Row) {
            if self.newer(&k, rank) {
                let mut merged = self
                    .rows
                    .get(&k)
                    .and_then(|(_, r)| r.clone())
                    .unwrap_or_default();
                for (c, v) in row {
                    merged.insert(c.clone(), v.clone());
                }
                self.rows.insert(k, (rank, Some(merged)));
            }
        }

        pub fn delete(&mut self, k: String, rank: i64) {
            if self.newer(&k, rank) {
                self.rows.insert(k, (rank, None));
            }
        }

        pub fn truncate(&mut self, rank: i64) {
            if self.watermark.is_none_or(|w| rank > w) {
                self.rows.retain(|_, (r, _)| *r >= rank);
                self.watermark = Some(rank);
            }
        }

        /// The live rows.
        pub fn live(&self) -> BTreeMap<String, Row> {
            self.rows
                .iter()
                .filter_map(|(k, (_, r))| r.clone().map(|r| (k.clone(), r)))
                .collect()
        }
    }

    pub fn apply_event(t: &mut Table, e: &Event, meta: &TableMeta) {
        let rank = e.rank();
        match e.op {
            Op::Truncate => t.truncate(rank),
            Op::Delete => {
                let k = key_of(e.before.as_ref().unwrap(), meta, "before").unwrap();
                t.delete(k, rank)
            }
            _ => {
                let after = e.after.as_ref().unwrap();
                let k = key_of(after, meta, "after").unwrap();
                if let (Op::Update, Some(b)) = (e.op, &e.before) {
                    if let Ok(old) = key_of(b, meta, "before") {
                        if old != k {
                            t.delete(old, rank);
                        }
                    }
                }
                t.upsert(k, rank, after)
            }
        }
    }

    pub fn apply_step(t: &mut Table, s: &Step, meta: &TableMeta) {
        match s {
            Step::Truncate { rank, .. } => t.truncate(*rank),
            Step::Cut { .. } => {}
            Step::Deletes { rows, .. } => {
                for c in rows {
                    t.delete(key_of(&c.row, meta, "before").unwrap(), c.rank)
                }
            }
            Step::Upserts { rows, .. } => {
                for c in rows {
                    t.upsert(key_of(&c.row, meta, "after").unwrap(), c.rank, &c.row)
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::model::*;
    use super::*;
    use crate::event::{from_value, PositionField};
    use proptest::prelude::*;
    use serde_json::json;

    fn meta() -> TableMeta {
        TableMeta {
            name: "t".into(),
            columns: vec!["id".into(), "v".into(), "w".into()],
            key: vec!["id".into()],
        }
    }

    fn ev(op: &str, lsn: u64, before: Option<(i64, i64)>, after: Option<(i64, i64)>) -> Event {
        let img = |x: Option<(i64, i64)>| {
            x.map_or(Value::Null, |(id, v)| json!({"id": id, "v": v, "w": v}))
        };
        from_value(
            json!({"op": op, "before": img(before), "after": img(after), "source": {"table": "t", "lsn": lsn}}),
            &PositionField::default(),
        )
        .unwrap()
        .unwrap()
    }

    fn at(i: u64) -> RecordPosition {
        RecordPosition {
            checkpoint: 1,
            index: i,
        }
    }

    #[test]
    fn key_text_is_each_parts_length_and_text() {
        let m = TableMeta {
            name: "t".into(),
            columns: vec!["a".into(), "b".into()],
            key: vec!["a".into(), "b".into()],
        };
        let key = |a: &str, b: &str| {
            let row: Row = serde_json::from_str(&format!(r#"{{"a": {a}, "b": {b}}}"#)).unwrap();
            key_of(&row, &m, "after").unwrap()
        };
        assert_eq!(key("7", r#""x""#), "1:71:x");
        // A number as its JSON text reads back (`1e3` is kept as `1e+3`).
        for (a, b) in [("-1.50", "1e3"), ("0", "-0"), ("1E-2", "2.50e10")] {
            let text = |n: &str| serde_json::from_str::<Value>(n).unwrap().to_string();
            let (ta, tb) = (text(a), text(b));
            assert_eq!(key(a, b), format!("{}:{ta}{}:{tb}", ta.len(), tb.len()));
        }
        assert_eq!(key("-1.50", "1e3"), "5:-1.504:1e+3");
        assert_eq!(key(r#""7""#, "true"), "1:74:true");
        assert_eq!(key(r#""a:1""#, r#""""#), "3:a:10:");
        assert_eq!(
            key("12345678901234567890123", "[1]"),
            "23:123456789012345678901233:[1]"
        );
        assert_ne!(key(r#""1:2""#, r#""3""#), key(r#""1""#, r#""2:3""#));
        let row: Row = serde_json::from_str(r#"{"a": 1, "b": null}"#).unwrap();
        assert!(matches!(
            key_of(&row, &m, "before"),
            Err(PlanError::NoKey {
                image: "before",
                ..
            })
        ));
    }

    #[test]
    fn a_delete_never_overtakes_an_insert_of_the_same_key() {
        let mut p = Planner::new();
        let m = meta();
        for (i, e) in [
            ev("c", 10, None, Some((1, 1))),
            ev("d", 11, Some((1, 1)), None),
            ev("c", 12, None, Some((1, 2))),
        ]
        .iter()
        .enumerate()
        {
            p.push(e.clone(), &m, at(i as u64)).unwrap();
        }
        let steps = p.drain();
        assert_eq!(steps.len(), 1, "{steps:?}");
        let Step::Upserts { rows, .. } = &steps[0] else {
            panic!("{steps:?}")
        };
        assert_eq!(rows[0].row["v"], 2);
    }

    /// A key's upsert is marked created when the key's first event in the run is a create or
    /// a snapshot read, whatever came after it; any other first event (an update, a delete)
    /// means the row may be there.
    #[test]
    fn created_follows_the_first_event_of_each_key_in_the_run() {
        let m = meta();
        let created = |events: &[Event]| -> Vec<(i64, bool)> {
            let mut p = Planner::new();
            for (i, e) in events.iter().enumerate() {
                p.push(e.clone(), &m, at(i as u64)).unwrap();
            }
            let mut out: Vec<(i64, bool)> = p
                .drain()
                .iter()
                .filter_map(|s| match s {
                    Step::Upserts { rows, .. } => Some(
                        rows.iter()
                            .map(|r| (r.row["id"].as_i64().unwrap(), r.created))
                            .collect::<Vec<_>>(),
                    ),
                    _ => None,
                })
                .flatten()
                .collect();
            out.sort();
            out
        };
        assert_eq!(
            created(&[
                ev("c", 10, None, Some((1, 1))),
                ev("r", 11, None, Some((2, 1))),
                ev("u", 12, None, Some((3, 1))),
                ev("c", 13, None, Some((4, 1))),
                ev("u", 14, None, Some((4, 2))),
                ev("d", 15, Some((4, 2)), None),
                ev("c", 16, None, Some((4, 3))),
            ]),
            vec![(1, true), (2, true), (3, false), (4, true)]
        );
        // A delete first: the row was there when the run began, so the create that follows
        // must not be a plain insert.
        assert_eq!(
            created(&[
                ev("d", 10, Some((1, 1)), None),
                ev("c", 11, None, Some((1, 2))),
            ]),
            vec![(1, false)]
        );
        // A key change's new key comes from an update: not created.
        assert_eq!(
            created(&[ev("u", 10, Some((1, 1)), Some((2, 1)))]),
            vec![(2, false)]
        );
        // An older event changes nothing, also not the flag.
        assert_eq!(
            created(&[
                ev("u", 10, None, Some((1, 1))),
                ev("c", 5, None, Some((1, 0))),
            ]),
            vec![(1, false)]
        );
        // A replayed, older create that a newer update wins over: the flag rests on the
        // create's rank, which the caller compares with what the table holds.
        let mut p = Planner::new();
        p.push(ev("c", 10, None, Some((1, 1))), &m, at(0)).unwrap();
        p.push(ev("u", 20, None, Some((1, 2))), &m, at(1)).unwrap();
        assert!(
            matches!(&p.drain()[0], Step::Upserts { rows, .. } if rows[0].created && rows[0].rank == 20 && rows[0].opened == 10)
        );
        // Each drain starts new runs: a key created in an earlier flush is there now.
        let mut p = Planner::new();
        p.push(ev("c", 10, None, Some((1, 1))), &m, at(0)).unwrap();
        assert!(matches!(&p.drain()[0], Step::Upserts { rows, .. } if rows[0].created));
        p.push(ev("u", 11, None, Some((1, 2))), &m, at(1)).unwrap();
        assert!(matches!(&p.drain()[0], Step::Upserts { rows, .. } if !rows[0].created));
    }

    #[test]
    fn a_partial_image_ends_the_run_with_a_cut_before_the_key_comes_again() {
        // The shape an outside probe found applied wrongly: a replayed older event of key 1
        // after a partial image of key 2 cut the run. The steps after the cut touch key 1
        // again, so they must not share the guard decision of the steps before it.
        let m = meta();
        let mut p = Planner::new();
        p.push(ev("c", 10, None, Some((1, 1))), &m, at(0)).unwrap();
        p.push(ev("c", 11, None, Some((2, 1))), &m, at(1)).unwrap();
        p.push(ev("u", 30, None, Some((1, 3))), &m, at(2)).unwrap();
        let mut partial = ev("u", 40, None, Some((2, 4)));
        partial.after.as_mut().unwrap().remove("w");
        p.push(partial, &m, at(3)).unwrap();
        p.push(ev("u", 20, None, Some((1, 2))), &m, at(4)).unwrap();
        let steps = p.drain();
        let shape: Vec<String> = steps
            .iter()
            .map(|s| match s {
                Step::Cut { .. } => "cut".to_string(),
                Step::Upserts { rows, .. } => rows
                    .iter()
                    .map(|c| format!("{}@{}", c.row["id"], c.rank))
                    .collect::<Vec<_>>()
                    .join(","),
                other => panic!("{other:?}"),
            })
            .collect();
        assert_eq!(shape, ["2@11,1@30", "cut", "2@40", "1@20"]);
        // And applied under the guard the replay changes nothing.
        let mut t = Table::default();
        for s in &steps {
            apply_step(&mut t, s, &m);
        }
        let live = t.live();
        let one = live.values().find(|r| r["id"] == 1).unwrap();
        assert_eq!(one["v"], 3, "{live:?}");
    }

    #[test]
    fn drain_oldest_sends_the_keys_left_alone_longest() {
        let m = meta();
        let mut p = Planner::new();
        for (i, k) in [1, 2, 3].into_iter().enumerate() {
            p.push(ev("c", 10 + i as u64, None, Some((k, 0))), &m, at(i as u64))
                .unwrap();
        }
        // Key 1 changes again: now the newest. An older event of key 2 changes nothing, so
        // key 2 stays the oldest.
        p.push(ev("u", 20, None, Some((1, 5))), &m, at(3)).unwrap();
        p.push(ev("u", 5, None, Some((2, 9))), &m, at(4)).unwrap();
        assert_eq!(p.held(), 3);
        let ids = |steps: Vec<Step>| -> Vec<(i64, bool)> {
            steps
                .iter()
                .flat_map(|s| match s {
                    Step::Upserts { rows, .. } => rows
                        .iter()
                        .map(|c| (c.row["id"].as_i64().unwrap(), c.created))
                        .collect::<Vec<_>>(),
                    _ => panic!("only upserts here: {s:?}"),
                })
                .collect()
        };
        assert_eq!(ids(p.drain_oldest(2)), vec![(2, true), (3, true)]);
        assert_eq!(p.held(), 1);
        // Key 1 kept its winner and its flag (created: its first event was a create).
        p.push(ev("u", 21, None, Some((1, 6))), &m, at(5)).unwrap();
        let steps = p.drain_oldest(5);
        assert!(
            matches!(&steps[..], [Step::Upserts { rows, .. }] if rows.len() == 1 && rows[0].row["w"] == 6 && rows[0].created && rows[0].rank == 21)
        );
        assert_eq!(p.held(), 0);
        assert!(p.drain_oldest(5).is_empty());
    }

    #[test]
    fn drain_oldest_keeps_one_events_changes_together() {
        let m = meta();
        let mut p = Planner::new();
        p.push(ev("c", 10, None, Some((1, 0))), &m, at(0)).unwrap();
        p.push(ev("c", 11, None, Some((2, 0))), &m, at(1)).unwrap();
        // Key 1 becomes key 3: a delete of 1 and an upsert of 3, both of this event.
        p.push(ev("u", 12, Some((1, 0)), Some((3, 0))), &m, at(2))
            .unwrap();
        let steps = p.drain_oldest(2);
        let ranks: Vec<i64> = steps
            .iter()
            .flat_map(|s| match s {
                Step::Deletes { rows, .. } | Step::Upserts { rows, .. } => {
                    rows.iter().map(|c| c.rank).collect()
                }
                _ => Vec::new(),
            })
            .collect();
        assert_eq!(ranks.len(), 3, "the key change was split: {steps:?}");
        assert_eq!(p.held(), 0);
    }

    #[test]
    fn a_key_change_deletes_the_old_key() {
        let mut p = Planner::new();
        let m = meta();
        p.push(ev("u", 5, Some((1, 0)), Some((2, 9))), &m, at(0))
            .unwrap();
        let steps = p.drain();
        assert!(
            matches!(&steps[0], Step::Deletes { rows, .. } if rows[0].row == *json!({"id": 1}).as_object().unwrap())
        );
        assert!(matches!(&steps[1], Step::Upserts { rows, .. } if rows[0].row["id"] == 2));
    }

    #[test]
    fn a_missing_key_is_named() {
        let m = meta();
        let e = from_value(
            json!({"op": "c", "after": {"v": 1}, "source": {"table": "t", "lsn": 1}}),
            &PositionField::default(),
        )
        .unwrap()
        .unwrap();
        let err = Planner::new().push(e, &m, at(0)).unwrap_err();
        assert_eq!(
            err,
            PlanError::NoKey {
                table: "t".into(),
                image: "after",
                column: "id".into()
            }
        );
    }

    fn arb_event() -> impl Strategy<Value = Event> {
        (0..6u8, 1..40u64, 0..4i64, 0..4i64, 0..100i64, any::<bool>()).prop_map(
            |(op, lsn, k1, k2, v, partial)| {
                let mut e = match op {
                    0 => ev("c", lsn, None, Some((k1, v))),
                    1 => ev("r", lsn, None, Some((k1, v))),
                    2 => ev("u", lsn, None, Some((k1, v))),
                    3 => ev("u", lsn, Some((k1, 0)), Some((k2, v))),
                    4 => ev("d", lsn, Some((k1, v)), None),
                    _ => ev("t", lsn, None, None),
                };
                if partial {
                    if let Some(a) = e.after.as_mut() {
                        a.remove("w");
                    }
                }
                e
            },
        )
    }

    proptest! {
        /// The plan, applied step by step, leaves exactly what the events applied one by one
        /// leave, from any starting table, with flushes at any points, whole or of the oldest
        /// `oldest` keys (0: whole).
        #[test]
        fn plans_equal_one_by_one_application(
            start in proptest::collection::vec(arb_event(), 0..10),
            events in proptest::collection::vec(arb_event(), 0..60),
            flush_every in 1usize..70,
            oldest in 0usize..6,
        ) {
            let m = meta();
            let mut base = Table::default();
            for e in &start { apply_event(&mut base, e, &m); }
            let mut want = base.clone();
            for e in &events { apply_event(&mut want, e, &m); }
            let mut got = base;
            let mut p = Planner::new();
            for (i, e) in events.iter().enumerate() {
                p.push(e.clone(), &m, at(i as u64)).unwrap();
                if (i + 1) % flush_every == 0 {
                    let before = p.held();
                    let steps = if oldest == 0 { p.drain() } else { p.drain_oldest(oldest) };
                    let sent: usize = steps.iter().map(Step::held).sum();
                    prop_assert_eq!(p.held(), before - sent, "held counts what is left");
                    for s in steps { apply_step(&mut got, &s, &m); }
                }
            }
            let steps = p.drain();
            for s in &steps {
                if let Step::Upserts { rows, .. } | Step::Deletes { rows, .. } = s {
                    let mut keys: Vec<_> = rows.iter().map(|c| key_of(&c.row, &m, "x").unwrap()).collect();
                    let n = keys.len();
                    keys.sort(); keys.dedup();
                    prop_assert_eq!(keys.len(), n, "a key twice in one statement");
                }
                apply_step(&mut got, s, &m);
            }
            prop_assert_eq!(got.live(), want.live());
            prop_assert_eq!(got.watermark, want.watermark);
        }
    }
}
