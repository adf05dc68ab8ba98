//! A captured table's columns as the replica holds them ([`TableShape`]), and what a relation
//! message of the change stream says changed ([`compare`]). Pure: no I/O.
//!
//! pgoutput sends a relation message before a table's first change in each decoding session
//! and again after its definition changed, with the columns the following rows carry, in
//! order. A change the replica can follow exactly is returned as a [`SchemaChange`]: columns
//! added at the end (created with the source's type) and non-key columns dropped. Anything
//! else (a type changed, a column renamed or moved, a key column dropped, the table renamed)
//! is an error that names the change: the rows after it cannot be put in the right columns.

use crate::config::{ident, TableRef};
use crate::pgoutput::Relation;
use serde::{Deserialize, Serialize};

/// A captured table's columns (without stored generated ones, which the change stream does
/// not carry) as the replica holds them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TableShape {
    /// The source table's OID (a rename keeps it).
    pub oid: u32,
    /// The table.
    pub table: TableRef,
    /// Its columns in order.
    pub columns: Vec<ShapeColumn>,
}

/// One column of a [`TableShape`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShapeColumn {
    /// Column name.
    pub name: String,
    /// Type OID.
    pub type_oid: u32,
    /// Type modifier (-1: none).
    pub typmod: i32,
    /// Part of the primary key.
    pub key: bool,
}

/// A column a [`SchemaChange`] adds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AddedColumn {
    /// Column name.
    pub name: String,
    /// Type OID.
    pub type_oid: u32,
    /// Type modifier (-1: none).
    pub typmod: i32,
    /// The source's type, `format_type(atttypid, atttypmod)` (filled in by the capture).
    pub sql_type: String,
}

/// A schema change found in the stream that the replica follows: columns added (with the
/// source's type) or dropped. Run [`SchemaChange::ddl`] on the target once every event read
/// before it is committed, then go on with the batch's position.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SchemaChange {
    /// The table.
    pub table: TableRef,
    /// Columns added at the end.
    pub added: Vec<AddedColumn>,
    /// Columns dropped.
    pub dropped: Vec<String>,
    /// The table's shape after the change.
    pub shape: TableShape,
}

impl SchemaChange {
    /// The statements that bring the replica table in `target_schema` to the new shape; each
    /// can run again (`IF NOT EXISTS`, `IF EXISTS`).
    pub fn ddl(&self, target_schema: &str) -> Vec<String> {
        let t = format!("{}.{}", ident(target_schema), ident(&self.table.name));
        let mut out: Vec<String> = self
            .dropped
            .iter()
            .map(|c| format!("ALTER TABLE {t} DROP COLUMN IF EXISTS {}", ident(c)))
            .collect();
        out.extend(self.added.iter().map(|c| {
            format!(
                "ALTER TABLE {t} ADD COLUMN IF NOT EXISTS {} {}",
                ident(&c.name),
                c.sql_type
            )
        }));
        out
    }
}

fn qualified(schema: &str, name: &str) -> String {
    format!("{}.{}", ident(schema), ident(name))
}

/// What `rel` (a relation message) changes in `old`: nothing (`Ok(None)`), a change the
/// replica follows, or an error naming the change that it cannot follow.
pub fn compare(old: &TableShape, rel: &Relation) -> Result<Option<SchemaChange>, String> {
    let was = old.table.qualified();
    let stop = "the replica cannot follow it; nothing after it is applied. Re-create the replica \
                (a new slot, --wal and schema) to go on";
    if rel.schema != old.table.schema || rel.name != old.table.name {
        return Err(format!(
            "source table {was} was renamed to {} (ALTER TABLE … RENAME): {stop}",
            qualified(&rel.schema, &rel.name)
        ));
    }
    let same = |a: &ShapeColumn, b: &crate::pgoutput::Column| {
        a.name == b.name && a.type_oid == b.type_oid && a.typmod == b.typmod
    };
    if old.columns.len() == rel.columns.len()
        && old
            .columns
            .iter()
            .zip(&rel.columns)
            .all(|(a, b)| same(a, b))
    {
        return Ok(None);
    }
    let has_new = |n: &str| rel.columns.iter().any(|c| c.name == n);
    let has_old = |n: &str| old.columns.iter().any(|c| c.name == n);
    // A column renamed: at one position, a name gone and a new one in its place.
    for (a, b) in old.columns.iter().zip(&rel.columns) {
        if a.name != b.name && !has_new(&a.name) && !has_old(&b.name) {
            return Err(format!(
                "column {} of source table {was} was renamed to {} (ALTER TABLE … RENAME COLUMN), or dropped and another added: {stop}",
                ident(&a.name),
                ident(&b.name)
            ));
        }
    }
    for a in &old.columns {
        if let Some(b) = rel.columns.iter().find(|b| b.name == a.name) {
            if a.type_oid != b.type_oid || a.typmod != b.typmod {
                return Err(format!(
                    "column {} of source table {was} changed its type (ALTER COLUMN … TYPE: type OID {} modifier {} became {} modifier {}): {stop}",
                    ident(&a.name),
                    a.type_oid,
                    a.typmod,
                    b.type_oid,
                    b.typmod
                ));
            }
        }
    }
    let dropped: Vec<&ShapeColumn> = old.columns.iter().filter(|a| !has_new(&a.name)).collect();
    if let Some(k) = dropped.iter().find(|c| c.key) {
        return Err(format!(
            "key column {} of source table {was} was dropped: {stop}",
            ident(&k.name)
        ));
    }
    // The columns kept must keep their order, and the added ones come after them.
    let kept: Vec<&str> = old
        .columns
        .iter()
        .filter(|a| has_new(&a.name))
        .map(|a| a.name.as_str())
        .collect();
    let first_added = rel.columns.iter().position(|b| !has_old(&b.name));
    let kept_in_new: Vec<&str> = rel.columns[..first_added.unwrap_or(rel.columns.len())]
        .iter()
        .map(|b| b.name.as_str())
        .collect();
    if kept != kept_in_new
        || rel.columns[first_added.unwrap_or(rel.columns.len())..]
            .iter()
            .any(|b| has_old(&b.name))
    {
        return Err(format!(
            "the columns of source table {was} changed order ({} became {}): {stop}",
            old.columns
                .iter()
                .map(|c| ident(&c.name))
                .collect::<Vec<_>>()
                .join(", "),
            rel.columns
                .iter()
                .map(|c| ident(&c.name))
                .collect::<Vec<_>>()
                .join(", ")
        ));
    }
    let added: Vec<AddedColumn> = rel
        .columns
        .iter()
        .filter(|b| !has_old(&b.name))
        .map(|b| AddedColumn {
            name: b.name.clone(),
            type_oid: b.type_oid,
            typmod: b.typmod,
            sql_type: String::new(),
        })
        .collect();
    let shape = TableShape {
        oid: rel.id,
        table: old.table.clone(),
        columns: rel
            .columns
            .iter()
            .map(|b| ShapeColumn {
                name: b.name.clone(),
                type_oid: b.type_oid,
                typmod: b.typmod,
                key: old.columns.iter().any(|a| a.name == b.name && a.key),
            })
            .collect(),
    };
    Ok(Some(SchemaChange {
        table: old.table.clone(),
        added,
        dropped: dropped.iter().map(|c| c.name.clone()).collect(),
        shape,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pgoutput::Column;

    fn shape(cols: &[(&str, u32, bool)]) -> TableShape {
        TableShape {
            oid: 7,
            table: TableRef {
                schema: "public".into(),
                name: "T".into(),
            },
            columns: cols
                .iter()
                .map(|(n, t, k)| ShapeColumn {
                    name: n.to_string(),
                    type_oid: *t,
                    typmod: -1,
                    key: *k,
                })
                .collect(),
        }
    }

    fn rel(name: &str, cols: &[(&str, u32)]) -> Relation {
        Relation {
            id: 7,
            schema: "public".into(),
            name: name.into(),
            columns: cols
                .iter()
                .map(|(n, t)| Column {
                    key: *n == "id",
                    name: n.to_string(),
                    type_oid: *t,
                    typmod: -1,
                })
                .collect(),
        }
    }

    #[test]
    fn changes_are_followed_or_named() {
        let old = shape(&[("id", 23, true), ("a", 25, false), ("b", 25, false)]);
        assert_eq!(
            compare(&old, &rel("T", &[("id", 23), ("a", 25), ("b", 25)])),
            Ok(None)
        );
        let add = compare(
            &old,
            &rel("T", &[("id", 23), ("a", 25), ("b", 25), ("c", 1700)]),
        )
        .unwrap()
        .unwrap();
        assert_eq!(add.added.len(), 1);
        assert_eq!(add.added[0].name, "c");
        assert!(add.dropped.is_empty());
        let drop = compare(&old, &rel("T", &[("id", 23), ("b", 25)]))
            .unwrap()
            .unwrap();
        assert_eq!(drop.dropped, vec!["a".to_string()]);
        assert_eq!(
            drop.ddl("r"),
            vec![r#"ALTER TABLE "r"."T" DROP COLUMN IF EXISTS "a""#.to_string()]
        );
        let both = compare(&old, &rel("T", &[("id", 23), ("b", 25), ("c", 25)]))
            .unwrap()
            .unwrap();
        assert_eq!((both.dropped.len(), both.added.len()), (1, 1));
        for (r, word) in [
            (
                rel("T", &[("id", 23), ("x", 25), ("b", 25)]),
                "RENAME COLUMN",
            ),
            (rel("T", &[("id", 23), ("a", 20), ("b", 25)]), "TYPE"),
            (rel("T", &[("id", 23), ("b", 25), ("a", 25)]), "order"),
            (rel("T", &[("a", 25), ("b", 25)]), "key column \"id\""),
            (
                rel("U", &[("id", 23), ("a", 25), ("b", 25)]),
                "renamed to \"public\".\"U\"",
            ),
        ] {
            let e = compare(&old, &r).unwrap_err();
            assert!(
                e.contains(word) && e.contains("\"public\".\"T\""),
                "{word}: {e}"
            );
        }
    }
}
