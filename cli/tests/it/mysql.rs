//! `walsink pipe --sink mysql://…` against the shared MariaDB: SIGKILL loops in marker mode and
//! XA mode, with kills forced at the dangerous points by failpoints (feature `failpoints`), at
//! random moments, and server faults (`KILL CONNECTION` of walsink's own connections, found by
//! the user made for the run, mid-transaction or between epochs), ending with every input line exactly
//! once in the table and no XA transaction of the run left prepared; a table of the wrong
//! shape and `inspect --sink`.

use crate::common::*;
use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Runs `sql` on the shared server with the mariadb client; its tab-separated output.
fn sql(sql: &str) -> String {
    let o = Command::new("mariadb")
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
        .expect("run mariadb");
    assert!(o.status.success(), "mariadb {sql}: {}", stderr(&o));
    stdout(&o)
}

/// The table's payloads for `sink_id`, in checkpoint and index order.
fn table_lines(table: &str, sink_id: &str) -> Vec<Vec<u8>> {
    sql(&format!(
        "SELECT CONVERT(payload USING utf8mb4) FROM {table} WHERE sink_id = '{sink_id}' ORDER BY checkpoint, idx"
    ))
    .lines()
    .map(|l| l.as_bytes().to_vec())
    .collect()
}

/// walsink's prepared XA transactions on the server (`formatID` 0x5753), any sink's.
fn walsink_xa_left(sink_id_hash_prefix: Option<&str>) -> Vec<String> {
    sql("XA RECOVER")
        .lines()
        .filter(|l| l.starts_with("22355\t"))
        .filter(|l| sink_id_hash_prefix.is_none_or(|p| l.contains(p)))
        .map(str::to_string)
        .collect()
}

fn args(input: &Path, wal: &Path, sink: &str, extra: &[&str]) -> Vec<String> {
    let mut v: Vec<String> = ["pipe", "--input", s(input), "--wal", s(wal), "--sink", sink]
        .map(String::from)
        .to_vec();
    v.extend(extra.iter().map(|e| e.to_string()));
    v
}

fn run(a: &[String], env: Option<&str>) -> std::process::Output {
    let mut c = Command::new(env!("CARGO_BIN_EXE_walsink"));
    c.args(a).stdin(Stdio::null());
    if let Some(fp) = env {
        c.env("WALSINK_MYSQL_FAILPOINT", fp);
    }
    c.output().expect("run walsink")
}

/// What one kill loop did.
#[derive(Debug, Default)]
struct Kills {
    runs: u32,
    random: u32,
    at: std::collections::BTreeMap<String, u32>,
    connections_killed: u32,
}

/// Kills, on the server, the connections of `user` (a user made for this run, so only
/// walsink's own connections) every 100 to 400 ms for as long as `on` is set, whatever they
/// are doing (inside an epoch's transaction, between its statements, idle between epochs);
/// counts them in `killed`.
fn connection_killer(
    user: String,
    on: Arc<AtomicBool>,
    killed: Arc<AtomicU32>,
) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        let mut rng = fastrand::Rng::with_seed(7);
        while on.load(Ordering::SeqCst) {
            std::thread::sleep(Duration::from_millis(rng.u64(100..=400)));
            let ids = sql(&format!(
                "SELECT ID FROM information_schema.PROCESSLIST WHERE USER = '{user}'"
            ));
            for id in ids.lines().filter(|l| !l.is_empty()) {
                // The connection may be gone by now (1094, unknown thread): fine.
                let o = Command::new("mariadb")
                    .args(["--no-defaults", "-h127.0.0.1", "-P3306", "-uroot", "-e"])
                    .arg(format!("KILL CONNECTION {id}"))
                    .output()
                    .expect("run mariadb");
                if o.status.success() {
                    killed.fetch_add(1, Ordering::SeqCst);
                }
            }
        }
    })
}

/// Rounds of: one run per failpoint, armed at a random delivery (1 to 3) of that run, which
/// aborts the process there; then one run with its connections killed by the server now and
/// then, SIGKILLed after a random delay. Before each of those runs `grow` appends lines to
/// the input, so the run has work to be killed in however fast the build and the machine
/// are; and the delay shrinks while runs end before it, so the kills land in debug and
/// release, idle and loaded.
fn kill_loop(
    a: &[String],
    user: &str,
    failpoints: &[&str],
    rounds: u32,
    seed: u64,
    grow: &mut dyn FnMut(),
) -> Kills {
    let mut rng = fastrand::Rng::with_seed(seed);
    let mut longest = 1500u64;
    let mut k = Kills::default();
    let killed = Arc::new(AtomicU32::new(0));
    for _ in 0..rounds {
        for fp in failpoints {
            let spec = format!("{fp}@{}", rng.u32(1..=3));
            let o = run(a, Some(&spec));
            k.runs += 1;
            if o.status.signal() == Some(6) {
                assert!(
                    stderr(&o).contains(&format!("failpoint {spec}")),
                    "{}",
                    stderr(&o)
                );
                *k.at.entry(fp.to_string()).or_default() += 1;
            } else {
                assert!(o.status.success(), "{spec}: {}", stderr(&o));
                eprintln!("{spec} did not fire: {}", stderr(&o).trim());
            }
        }
        grow();
        let on = Arc::new(AtomicBool::new(true));
        let killer = connection_killer(user.to_string(), on.clone(), killed.clone());
        let mut child = Command::new(env!("CARGO_BIN_EXE_walsink"))
            .args(a)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        k.runs += 1;
        let delay = Duration::from_millis(rng.u64(longest / 5..=longest));
        let t = Instant::now();
        loop {
            if let Some(st) = child.try_wait().unwrap() {
                assert!(st.success(), "a run ended with {st}");
                // It ended before its kill: the next kill comes sooner.
                longest = (longest / 2).max(50);
                break;
            }
            if t.elapsed() >= delay {
                child.kill().unwrap();
                child.wait().unwrap();
                k.random += 1;
                break;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        on.store(false, Ordering::SeqCst);
        killer.join().unwrap();
    }
    k.connections_killed = killed.load(Ordering::SeqCst);
    k
}

fn kill_loop_into(mode: &str, failpoints: &[&str], seed: u64) {
    let d = tempfile::tempdir().unwrap();
    let (inp, wal) = (d.path().join("in.txt"), d.path().join("wal"));
    let mut want = lines("my", 0, 60_000);
    write_lines(&inp, &want);
    let table = unique("kill");
    let sink_id = unique("k").replace('_', "-");
    // A user of this run's own, so the server-side kills hit walsink's connections only.
    let user = unique("wk");
    sql(&format!(
        "CREATE USER '{user}'@'%'; GRANT ALL ON test.* TO '{user}'@'%'"
    ));
    let _drop_user = DropUser(user.clone());
    let sink = format!("mysql://{user}@127.0.0.1:3306/test?table={table}{mode}");
    let a = args(
        &inp,
        &wal,
        &sink,
        &["--checkpoint-every", "100", "--sink-id", &sink_id],
    );
    let mut grow = || {
        let more = lines("my", want.len(), want.len() + 10_000);
        let mut body = Vec::new();
        for l in &more {
            body.extend_from_slice(l);
            body.push(b'\n');
        }
        std::io::Write::write_all(
            &mut std::fs::OpenOptions::new().append(true).open(&inp).unwrap(),
            &body,
        )
        .unwrap();
        want.extend(more);
    };
    let k = kill_loop(&a, &user, failpoints, 6, seed, &mut grow);
    let o = run(&a, None);
    assert!(o.status.success(), "{}", stderr(&o));
    let got = table_lines(&table, &sink_id);
    assert_in_order_once(&got, &want);
    assert!(
        got == want,
        "every line exactly once: {} of {}",
        got.len(),
        want.len()
    );
    eprintln!(
        "kill loop{mode}: {} runs, {} random SIGKILLs, {} of walsink's connections killed by the server, failpoint aborts {:?}",
        k.runs, k.random, k.connections_killed, k.at
    );
    for fp in failpoints {
        assert!(
            k.at.get(*fp).copied().unwrap_or(0) >= 2,
            "failpoint {fp} fired: {k:?}"
        );
    }
    assert!(k.random >= 2, "too few random kills landed: {k:?}");
    assert!(
        k.connections_killed >= 1,
        "no connection of walsink was killed: {k:?}"
    );
    let markers = sql(&format!(
        "SELECT count(*) FROM walsink_markers WHERE sink_id = '{sink_id}'"
    ));
    assert_eq!(
        markers.trim(),
        (want.len() / 100).to_string(),
        "one marker per epoch of 100 lines"
    );
    let prefix = walsink_mysql::xa::gtrid_prefix(&sink_id, 0);
    let left = walsink_xa_left(Some(&prefix));
    assert!(left.is_empty(), "no XA transaction left: {left:?}");
}

/// Drops the run's user when the test ends, also when it fails.
struct DropUser(String);

impl Drop for DropUser {
    fn drop(&mut self) {
        let _ = Command::new("mariadb")
            .args(["--no-defaults", "-h127.0.0.1", "-P3306", "-uroot", "-e"])
            .arg(format!("DROP USER IF EXISTS '{}'@'%'", self.0))
            .output();
    }
}

#[test]
#[cfg_attr(
    not(all(servers, feature = "failpoints")),
    ignore = "needs WALSINK_TEST_SERVERS=1, a local MariaDB and --features failpoints"
)]
fn kill_loop_in_marker_mode() {
    kill_loop_into("", &["after-insert", "after-commit"], 41);
}

#[test]
#[cfg_attr(
    not(all(servers, feature = "failpoints")),
    ignore = "needs WALSINK_TEST_SERVERS=1, a local MariaDB and --features failpoints"
)]
fn kill_loop_in_xa_mode() {
    kill_loop_into(
        "&mode=xa",
        &["after-insert", "after-prepare", "after-commit"],
        42,
    );
}

/// A table without the payload column: the run gives up with a permanent error that names
/// the column and the server's error number, the records stay in the log, and after the
/// table is fixed the same command delivers them once. inspect --sink shows both sides.
#[test]
#[cfg_attr(
    not(servers),
    ignore = "needs WALSINK_TEST_SERVERS=1 and a local MariaDB"
)]
fn an_incompatible_table_is_a_permanent_error_and_the_records_wait() {
    let d = tempfile::tempdir().unwrap();
    let (inp, wal) = (d.path().join("in.txt"), d.path().join("wal"));
    let want = lines("w", 0, 500);
    write_lines(&inp, &want);
    let table = unique("wrong");
    sql(&format!(
        "CREATE TABLE {table} (sink_id varchar(255) NOT NULL, subtask int unsigned NOT NULL, checkpoint bigint unsigned NOT NULL, idx bigint unsigned NOT NULL)"
    ));
    let sink_id = unique("w").replace('_', "-");
    let sink = format!("mariadb://root@127.0.0.1:3306/test?table={table}");
    let a = args(
        &inp,
        &wal,
        &sink,
        &[
            "--checkpoint-every",
            "100",
            "--sink-id",
            &sink_id,
            "--max-retries",
            "1",
        ],
    );
    let o = run(&a, None);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    let e = stderr(&o);
    assert!(
        e.contains("payload") && e.contains("1054") && e.contains("permanent"),
        "{e}"
    );
    let o = walsink(&["inspect", s(&wal), "--sink", &sink]);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = stdout(&o);
    assert!(out.contains("committed through: -"), "{out}");
    assert!(out.contains("committed through - (0 epochs held)"), "{out}");
    assert!(out.contains("prepared XA transactions: none"), "{out}");
    sql(&format!(
        "ALTER TABLE {table} ADD COLUMN payload LONGBLOB NOT NULL"
    ));
    let o = run(&a, None);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(table_lines(&table, &sink_id), want);
    let o = walsink(&["inspect", s(&wal), "--json", "--sink", &sink]);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["target"]["committed"], 4, "checkpoints 0 to 4: {v}");
    assert_eq!(v["target"]["epochs"], 5, "{v}");
    assert_eq!(v["committed"], 4, "{v}");
}

/// A URL with a password the server refuses: the error names the target without the
/// password, anywhere in the output.
#[test]
#[cfg_attr(
    not(servers),
    ignore = "needs WALSINK_TEST_SERVERS=1 and a local MariaDB"
)]
fn a_refused_password_is_never_printed() {
    let d = tempfile::tempdir().unwrap();
    let (inp, wal) = (d.path().join("in.txt"), d.path().join("wal"));
    write_lines(&inp, &lines("p", 0, 10));
    let sink = format!(
        "mysql://nobody_{}:hunter2@127.0.0.1:3306/test?table=t",
        std::process::id()
    );
    let a = args(&inp, &wal, &sink, &["--max-retries", "1"]);
    let o = run(&a, None);
    assert!(!o.status.success());
    let all = format!("{}{}", stdout(&o), stderr(&o));
    assert!(
        all.contains("1045") || all.contains("Access denied"),
        "{all}"
    );
    assert!(!all.contains("hunter2"), "{all}");
}

/// Two pipes of two inputs into two tables of one database, neither with `--sink-id`: each
/// new log's sink id is named after its table, so both run and each table holds its own lines
/// once; an existing log keeps its sink id; a new log into a database holding commits under
/// the old default `pipe` is refused, naming both choices.
#[test]
#[cfg_attr(
    not(servers),
    ignore = "needs WALSINK_TEST_SERVERS=1 and a local MariaDB"
)]
fn two_pipes_into_two_tables_of_one_database_get_sink_ids_of_their_own() {
    let d = tempfile::tempdir().unwrap();
    let db = unique("sinkids");
    sql(&format!("CREATE DATABASE {db}"));
    let sink = |t: &str| format!("mysql://root@127.0.0.1:3306/{db}?table={t}");
    let (in1, in2) = (d.path().join("one.txt"), d.path().join("two.txt"));
    write_lines(&in1, &lines("one", 0, 300));
    write_lines(&in2, &lines("two", 0, 200));
    for (input, wal, t) in [(&in1, "w1", "t1"), (&in2, "w2", "t2")] {
        let o = run(&args(input, &d.path().join(wal), &sink(t), &[]), None);
        assert!(o.status.success(), "{t}: {}", stderr(&o));
    }
    let lines_of = |t: &str, id: &str| table_lines(&format!("{db}.{t}"), id);
    assert_eq!(lines_of("t1", "pipe-t1"), lines("one", 0, 300));
    assert_eq!(lines_of("t2", "pipe-t2"), lines("two", 0, 200));
    // The logs keep their ids: more input resumes each from where it was.
    write_lines(&in1, &lines("one", 0, 350));
    let o = run(&args(&in1, &d.path().join("w1"), &sink("t1"), &[]), None);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(lines_of("t1", "pipe-t1"), lines("one", 0, 350));
    // Commits under the old default in the database: a new log with a derived id is refused.
    let in3 = d.path().join("three.txt");
    write_lines(&in3, &lines("three", 0, 10));
    let o = run(
        &args(
            &in3,
            &d.path().join("w3"),
            &sink("t3"),
            &["--sink-id", "pipe"],
        ),
        None,
    );
    assert!(o.status.success(), "{}", stderr(&o));
    let o = run(&args(&in3, &d.path().join("w4"), &sink("t4"), &[]), None);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    let e = stderr(&o);
    assert!(e.contains("--sink-id pipe") && e.contains("pipe-t4"), "{e}");
    assert_eq!(sql(&format!("SHOW TABLES FROM {db} LIKE 't4'")).trim(), "");
    sql(&format!("DROP DATABASE {db}"));
}
