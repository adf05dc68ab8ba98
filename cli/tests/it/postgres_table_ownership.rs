//! A PostgreSQL table belongs to the log that fills it: a second log into the same table
//! under the same sink id is refused (docs/targets/postgres.md).

use crate::common::*;
use std::process::Command;

fn psql(sql: &str) -> String {
    let o = Command::new("psql")
        .args([
            "-h",
            "127.0.0.1",
            "-U",
            "postgres",
            "-d",
            "test",
            "-tAq",
            "-v",
            "ON_ERROR_STOP=1",
            "-c",
            sql,
        ])
        .output()
        .expect("psql");
    assert!(
        o.status.success(),
        "{sql}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8_lossy(&o.stdout).trim().to_string()
}

struct Schema(String);
impl Drop for Schema {
    fn drop(&mut self) {
        let _ = Command::new("psql")
            .args([
                "-h",
                "127.0.0.1",
                "-U",
                "postgres",
                "-d",
                "test",
                "-c",
                &format!("DROP SCHEMA IF EXISTS {} CASCADE", self.0),
            ])
            .output();
    }
}

fn run(args: &[String]) -> std::process::Output {
    let refs: Vec<&str> = args.iter().map(String::as_str).collect();
    walsink(&refs)
}

/// "`walsink pipe` refuses a table whose markers under its sink id came from another
/// log", and a truncated table with its markers kept is not filled twice or silently.
#[test]
#[cfg_attr(
    not(servers),
    ignore = "needs WALSINK_TEST_SERVERS=1 and the local PostgreSQL"
)]
fn a_second_log_into_the_same_table_and_sink_id_is_refused() {
    let schema = Schema(format!(
        "probe2_{}_{}",
        std::process::id(),
        fastrand::u32(..)
    ));
    psql(&format!("CREATE SCHEMA {}", schema.0));
    let url = format!(
        "postgres://postgres@127.0.0.1:5432/test?table={0}.ev&marker_table={0}.markers",
        schema.0
    );
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = (dir.path().join("a.txt"), dir.path().join("b.txt"));
    let (la, lb) = (lines("a", 0, 25), lines("b", 0, 25));
    write_lines(&a, &la);
    write_lines(&b, &lb);
    let o = run(&pipe_args_to(
        &a,
        &dir.path().join("wa"),
        &url,
        &["--checkpoint-every", "10"],
    ));
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let count = |s: &str| {
        psql(&format!(
            "SELECT count(*) FROM {}.ev WHERE convert_from(payload,'UTF8') LIKE '{s}%'",
            schema.0
        ))
    };
    assert_eq!(count("a "), "25");
    let o = run(&pipe_args_to(
        &b,
        &dir.path().join("wb"),
        &url,
        &["--checkpoint-every", "10"],
    ));
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert_eq!(count("b "), "0");
    // Rows in payload order, each once.
    let got = psql(&format!(
        "SELECT string_agg(convert_from(payload,'UTF8'), '|' ORDER BY checkpoint, idx) FROM {}.ev",
        schema.0
    ));
    let want: Vec<String> = la
        .iter()
        .map(|l| String::from_utf8(l.clone()).unwrap())
        .collect();
    assert_eq!(got, want.join("|"));
    // The same log re-run after it completed: nothing more.
    let o = run(&pipe_args_to(
        &a,
        &dir.path().join("wa"),
        &url,
        &["--checkpoint-every", "10"],
    ));
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert_eq!(count("a "), "25");
    // A table name that is not letters, digits and _ is refused, naming `table`.
    let bad = format!(
        "postgres://postgres@127.0.0.1:5432/test?table={}.ev;drop",
        schema.0
    );
    let o = run(&pipe_args_to(&a, &dir.path().join("wc"), &bad, &[]));
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("table"), "{}", stderr(&o));
}
