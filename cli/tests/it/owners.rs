//! One owner per shard, fenced in the target: a second `walsink pipe` under the same sink id
//! into the same directory, PostgreSQL or MySQL table or Redis key is refused at start while the first
//! runs; with `--take-over` it takes the shard over and resumes from the target's newest
//! checkpoint; the first is then refused at its next commit (it exits naming the fence,
//! writing nothing) and every input line ends in the target exactly once and in order.

use crate::common::*;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

fn args(input: &Path, wal: &Path, sink: &str, sink_id: &str, extra: &[&str]) -> Vec<String> {
    let mut v = pipe_args_to(
        input,
        wal,
        sink,
        &["--sink-id", sink_id, "--checkpoint-every", "50", "--quiet"],
    );
    v.extend(extra.iter().map(|e| e.to_string()));
    v
}

fn run(v: &[String]) -> std::process::Output {
    let refs: Vec<&str> = v.iter().map(String::as_str).collect();
    walsink(&refs)
}

fn wait_until(what: &str, limit: Duration, mut f: impl FnMut() -> bool) {
    let t = Instant::now();
    while !f() {
        assert!(t.elapsed() < limit, "{what}: not within {limit:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The scenario of the module's doc against the target `sink`, read back by `read`.
fn two_logs_one_shard(sink: &str, read: &dyn Fn() -> Vec<Vec<u8>>) {
    let d = tempfile::tempdir().unwrap();
    let input = d.path().join("in.txt");
    let id = unique("own").replace('_', "-");
    let mut want = lines("x", 0, 200);
    write_lines(&input, &want);
    let (wa, wb) = (d.path().join("wal-a"), d.path().join("wal-b"));
    let mut a = spawn_piped(
        &args(
            &input,
            &wa,
            sink,
            &id,
            &["--follow", "--checkpoint-interval", "100ms"],
        ),
        &[],
    );
    let a_err = collect_stderr(&mut a);
    wait_until(
        "the first log delivers its input",
        Duration::from_secs(60),
        || read().len() >= 200,
    );
    // A copied command line with a log of its own: refused while the first owns the shard.
    let o = run(&args(&input, &wb, sink, &id, &[]));
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(stderr(&o).contains("--take-over"), "{}", stderr(&o));
    assert_eq!(read(), want);
    // Taken over: it resumes from the target's newest checkpoint, so nothing is sent again.
    let o = run(&args(&input, &wb, sink, &id, &["--take-over"]));
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert_eq!(read(), want);
    // The first log reads what comes next, and its commit is refused.
    let more = lines("x", 200, 300);
    let mut f = std::fs::OpenOptions::new()
        .append(true)
        .open(&input)
        .unwrap();
    for l in &more {
        std::io::Write::write_all(&mut f, l).unwrap();
        std::io::Write::write_all(&mut f, b"\n").unwrap();
    }
    drop(f);
    let st = wait_exit(&mut a, Duration::from_secs(60), "the fenced first log");
    let err = a_err.lock().unwrap().join("\n");
    assert_eq!(st.code(), Some(2), "gave up: {err}");
    assert!(err.contains("fenced"), "{err}");
    assert!(
        err.contains("re-running this command is refused") && !err.contains("fix the target"),
        "the advice fits a fenced log: {err}"
    );
    assert_eq!(read(), want, "the fenced log wrote nothing");
    // The new owner goes on from there.
    let o = run(&args(&input, &wb, sink, &id, &[]));
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    want.extend(more);
    assert_in_order_once(&read(), &want);
    assert_eq!(read().len(), want.len());
}

#[test]
fn into_a_directory() {
    let d = tempfile::tempdir().unwrap();
    let out = d.path().join("out");
    let shown = out.clone();
    two_logs_one_shard(&format!("dir:{}", out.display()), &move || {
        if shown.exists() {
            records(&shown)
        } else {
            Vec::new()
        }
    });
}

#[test]
#[cfg_attr(
    not(servers),
    ignore = "needs WALSINK_TEST_SERVERS=1 and the local PostgreSQL"
)]
fn into_a_postgres_table() {
    let table = unique("own");
    let psql = |sql: &str| {
        Command::new("psql")
            .args([
                "-h",
                "127.0.0.1",
                "-U",
                "postgres",
                "-d",
                "test",
                "-tAq",
                "-c",
                sql,
            ])
            .output()
            .expect("psql")
    };
    let t = table.clone();
    two_logs_one_shard(
        &format!("postgres://postgres@127.0.0.1:5432/test?table={table}"),
        &move || {
            let o = psql(&format!(
                "SELECT convert_from(payload, 'UTF8') FROM {t} ORDER BY checkpoint, idx"
            ));
            if !o.status.success() {
                return Vec::new();
            }
            String::from_utf8_lossy(&o.stdout)
                .lines()
                .map(|l| l.as_bytes().to_vec())
                .collect()
        },
    );
    psql(&format!("DROP TABLE IF EXISTS {table}"));
}

#[test]
#[cfg_attr(
    not(servers),
    ignore = "needs WALSINK_TEST_SERVERS=1 and a local Redis"
)]
fn into_a_redis_list() {
    let key = unique("own");
    let k = key.clone();
    two_logs_one_shard(&format!("redis://127.0.0.1:6379/0?key={key}"), &move || {
        let o = Command::new("redis-cli")
            .args([
                "-h",
                "127.0.0.1",
                "-p",
                "6379",
                "--raw",
                "LRANGE",
                &k,
                "0",
                "-1",
            ])
            .output()
            .expect("redis-cli");
        String::from_utf8_lossy(&o.stdout)
            .lines()
            .filter(|l| !l.is_empty())
            .map(|l| l.as_bytes().to_vec())
            .collect()
    });
    let _ = Command::new("redis-cli").args(["DEL", &key]).output();
}

#[test]
#[cfg_attr(
    not(servers),
    ignore = "needs WALSINK_TEST_SERVERS=1 and the local MariaDB"
)]
fn into_a_mysql_table() {
    let table = unique("own");
    let mariadb = |sql: &str| {
        Command::new("mariadb")
            .args([
                "--no-defaults",
                "-h127.0.0.1",
                "-P3306",
                "-uroot",
                "-N",
                "-B",
                "test",
                "-e",
                sql,
            ])
            .output()
            .expect("run mariadb")
    };
    let t = table.clone();
    two_logs_one_shard(
        &format!("mysql://root@127.0.0.1:3306/test?table={table}"),
        &move || {
            let o = mariadb(&format!(
                "SELECT CONVERT(payload USING utf8mb4) FROM {t} ORDER BY checkpoint, idx"
            ));
            if !o.status.success() {
                return Vec::new();
            }
            String::from_utf8_lossy(&o.stdout)
                .lines()
                .map(|l| l.as_bytes().to_vec())
                .collect()
        },
    );
    mariadb(&format!("DROP TABLE IF EXISTS {table}"));
}
