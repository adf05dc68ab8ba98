//! A [`RowMapping`] of typed columns, in both bulk modes (`LOAD DATA` and multi-row
//! `INSERT`): each value reaches its column exactly (integers at their limits, a `DECIMAL`
//! with its digits, a double, text with tabs, newlines, backslashes, quotes, the words
//! `NULL` and `\N`, and characters beyond the BMP; bytes; SQL `NULL`), the mapping creates
//! its table, and a value that does not fit its column fails the epoch permanently, naming
//! the column, with nothing committed.

use crate::common::*;
use mysql_async::prelude::Queryable;
use walsink::{EpochKey, Record};
use walsink_mysql::{MapError, MySqlSink, RowMapping, RowWriter, TableName};
use walsink_tokio::deliver_ready;

/// Records `id|name|amount|ratio|note` (note `-` for NULL) into typed columns.
struct Orders;

impl RowMapping for Orders {
    fn columns(&self) -> Vec<String> {
        ["id", "small", "name", "amount", "ratio", "note", "raw"]
            .map(String::from)
            .to_vec()
    }

    fn create_table(&self, table: &TableName) -> Option<String> {
        Some(format!(
            "CREATE TABLE IF NOT EXISTS {table} (id BIGINT PRIMARY KEY, small BIGINT UNSIGNED, \
             name VARCHAR(12) CHARACTER SET utf8mb4, amount DECIMAL(20,4), ratio DOUBLE, \
             note TEXT NULL, raw VARBINARY(16)) ENGINE=InnoDB"
        ))
    }

    fn write_row(
        &self,
        _key: &EpochKey,
        record: &Record,
        row: &mut RowWriter<'_>,
    ) -> Result<(), MapError> {
        let text = std::str::from_utf8(&record.data).map_err(|e| MapError(e.to_string()))?;
        let f: Vec<&str> = text.split('|').collect();
        let id: i64 = f[0]
            .parse()
            .map_err(|_| MapError(format!("id {:?}", f[0])))?;
        row.push_i64(id)?;
        row.push_u64(u64::MAX - id.unsigned_abs())?;
        row.push_str(f[1])?;
        row.push_str(f[2])?; // the DECIMAL as its digits
        row.push_f64(
            f[3].parse()
                .map_err(|_| MapError(format!("ratio {:?}", f[3])))?,
        )?;
        if f[4] == "-" {
            row.push_null()?;
        } else {
            row.push_str(f[4])?;
        }
        row.push_bytes(&[0, b'\t', b'\n', b'\\', 0xff, id as u8])
    }
}

const ROWS: &[&str] = &[
    "-9223372036854775808|tab\tnl\nbs\\|-1234567890123456.1234|-1.5e-300|-",
    "9223372036854775807|quote ' \"|0.0001|1e300|NULL",
    "1|😀 ü ß|12.5000|0.1|\\N",
    "2||0|2.5e-5|plain",
];

#[tokio::test(flavor = "multi_thread")]
#[cfg_attr(
    not(servers),
    ignore = "needs WALSINK_TEST_SERVERS=1 and a local MariaDB"
)]
async fn typed_columns_get_each_value_exactly_in_both_bulk_modes() {
    for bulk in ["load_data", "insert"] {
        let my = My::new(SHARED, &format!("&bulk={bulk}"));
        let id = unique("typed");
        let log = open(&id);
        epoch_of(
            &log.wal,
            1,
            ROWS.iter().map(|r| r.as_bytes().to_vec()).collect(),
        );
        let mut sink = MySqlSink::new(my.config()).with_mapping(Orders);
        deliver_ready(&log.wal, &mut sink)
            .await
            .unwrap_or_else(|e| panic!("{bulk}: {e}"));
        let mut c = client(SHARED).await;
        let got: Vec<mysql_async::Row> = c
            .query(format!(
                "SELECT CAST(id AS CHAR), CAST(small AS CHAR), name, CAST(amount AS CHAR), ratio, note, HEX(raw) \
                 FROM {} ORDER BY id",
                my.table
            ))
            .await
            .unwrap();
        let got: Vec<Vec<Option<String>>> = got
            .into_iter()
            .map(|r| (0..r.len()).map(|i| r.get(i).unwrap()).collect())
            .collect();
        let s = |v: &str| Some(v.to_string());
        let want = vec![
            vec![
                s("-9223372036854775808"),
                s("9223372036854775807"),
                s("tab\tnl\nbs\\"),
                s("-1234567890123456.1234"),
                s("-1.5e-300"),
                None,
                s("00090A5CFF00"),
            ],
            vec![
                s("1"),
                s("18446744073709551614"),
                s("😀 ü ß"),
                s("12.5000"),
                s("0.1"),
                s("\\N"),
                s("00090A5CFF01"),
            ],
            vec![
                s("2"),
                s("18446744073709551613"),
                s(""),
                s("0.0000"),
                s("0.000025"),
                s("plain"),
                s("00090A5CFF02"),
            ],
            vec![
                s("9223372036854775807"),
                s("9223372036854775808"),
                s("quote ' \""),
                s("0.0001"),
                s("1e300"),
                s("NULL"),
                s("00090A5CFFFF"),
            ],
        ];
        assert_eq!(got, want, "{bulk}");
        c.query_drop(format!("DROP TABLE {}", my.table)).await.ok();
    }
}

#[tokio::test(flavor = "multi_thread")]
#[cfg_attr(
    not(servers),
    ignore = "needs WALSINK_TEST_SERVERS=1 and a local MariaDB"
)]
async fn a_value_that_does_not_fit_its_typed_column_is_permanent_and_named() {
    for (bulk, row) in [
        ("load_data", "5|thirteen char|1|1|-"),
        ("insert", "5|thirteen char|1|1|-"),
        ("load_data", "6|ok|12345678901234567.1|1|-"),
        ("insert", "6|ok|12345678901234567.1|1|-"),
    ] {
        let my = My::new(SHARED, &format!("&bulk={bulk}"));
        let id = unique("typedbad");
        let log = open(&id);
        epoch_of(
            &log.wal,
            1,
            vec![ROWS[3].as_bytes().to_vec(), row.as_bytes().to_vec()],
        );
        let mut sink = MySqlSink::new(my.config()).with_mapping(Orders);
        let e = deliver_ready(&log.wal, &mut sink)
            .await
            .unwrap_err()
            .to_string();
        let column = if row.starts_with('5') {
            "name"
        } else {
            "amount"
        };
        assert!(e.contains(column), "{bulk} {row}: {e}");
        assert!(sink.committed(&id, 0).await.unwrap().is_empty(), "{e}");
        let mut c = client(SHARED).await;
        let n: Option<u64> = c
            .query_first(format!("SELECT COUNT(*) FROM {}", my.table))
            .await
            .unwrap();
        assert_eq!(n, Some(0), "{bulk}: nothing of the epoch committed");
        c.query_drop(format!("DROP TABLE {}", my.table)).await.ok();
    }
}
