//! `walsink pipe --sink postgres://…` against real servers: SIGKILL loops in marker mode (the
//! shared server) and two-phase mode (a private cluster with prepared transactions), with
//! kills forced at the dangerous points by failpoints (feature `failpoints`) and at random
//! moments, ending with every input line exactly once in the table; a table of the wrong
//! shape; `inspect --sink`.

mod common;

use common::*;
use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const SHARED: &str = "postgres://postgres@127.0.0.1:5432/test";

fn unique(tag: &str) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    format!("{tag}_{}_{:x}", std::process::id(), nanos & 0xffff_ffff)
}

fn psql(url: &str, sql: &str) -> String {
    let o = Command::new("psql")
        .args([url, "-AtXq", "-v", "ON_ERROR_STOP=1", "-c", sql])
        .output()
        .expect("run psql");
    assert!(o.status.success(), "psql {sql}: {}", stderr(&o));
    stdout(&o)
}

/// The table's payloads for `sink_id`, in checkpoint and index order.
fn table_lines(url: &str, table: &str, sink_id: &str) -> Vec<Vec<u8>> {
    psql(
        url,
        &format!(
            "SELECT convert_from(payload, 'UTF8') FROM {table} WHERE sink_id = '{sink_id}' ORDER BY checkpoint, idx"
        ),
    )
    .lines()
    .map(|l| l.as_bytes().to_vec())
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
        c.env("WALSINK_PG_FAILPOINT", fp);
    }
    c.output().expect("run walsink")
}

/// What one kill loop did.
#[derive(Debug, Default)]
struct Kills {
    runs: u32,
    random: u32,
    at: std::collections::BTreeMap<String, u32>,
}

/// Rounds of: one run per failpoint, armed at a random delivery (1 to 3) of that run, which
/// aborts the process there; then one run killed with SIGKILL after a random delay.
fn kill_loop(a: &[String], failpoints: &[&str], rounds: u32, seed: u64) -> Kills {
    let mut rng = fastrand::Rng::with_seed(seed);
    let mut k = Kills::default();
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
        let mut child = Command::new(env!("CARGO_BIN_EXE_walsink"))
            .args(a)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        k.runs += 1;
        let delay = Duration::from_millis(rng.u64(20..=200));
        let t = Instant::now();
        loop {
            if let Some(st) = child.try_wait().unwrap() {
                assert!(st.success(), "a run ended with {st}");
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
    }
    k
}

fn kill_loop_into(url: &str, mode: &str, failpoints: &[&str], seed: u64) {
    let d = tempfile::tempdir().unwrap();
    let (inp, wal) = (d.path().join("in.txt"), d.path().join("wal"));
    let want = lines("pg", 0, 120_000);
    write_lines(&inp, &want);
    let table = unique("kill");
    let sink_id = unique("k").replace('_', "-");
    let sink = format!("{url}?table={table}{mode}");
    let a = args(
        &inp,
        &wal,
        &sink,
        &["--checkpoint-every", "100", "--sink-id", &sink_id],
    );
    let k = kill_loop(&a, failpoints, 6, seed);
    let o = run(&a, None);
    assert!(o.status.success(), "{}", stderr(&o));
    let got = table_lines(url, &table, &sink_id);
    assert_in_order_once(&got, &want);
    assert!(
        got == want,
        "every line exactly once: {} of {}",
        got.len(),
        want.len()
    );
    eprintln!(
        "kill loop{mode}: {} runs, {} random SIGKILLs, failpoint aborts {:?}",
        k.runs, k.random, k.at
    );
    for fp in failpoints {
        assert!(
            k.at.get(*fp).copied().unwrap_or(0) >= 2,
            "failpoint {fp} fired: {k:?}"
        );
    }
    assert!(k.random >= 2, "too few random kills landed: {k:?}");
    let markers = psql(
        url,
        &format!("SELECT count(*) FROM walsink_markers WHERE sink_id = '{sink_id}'"),
    );
    assert_eq!(markers.trim(), "1200", "one marker per epoch");
    let left = psql(url, "SELECT count(*) FROM pg_prepared_xacts");
    assert_eq!(left.trim(), "0", "no prepared transaction left");
}

#[test]
#[cfg_attr(
    not(servers),
    ignore = "needs WALSINK_TEST_SERVERS=1 and a local PostgreSQL"
)]
fn kill_loop_in_marker_mode() {
    kill_loop_into(SHARED, "", &["after-copy", "after-commit"], 31);
}

#[test]
#[cfg_attr(
    not(servers),
    ignore = "needs WALSINK_TEST_SERVERS=1 and the PostgreSQL binaries"
)]
fn kill_loop_in_two_phase_mode() {
    let pg = walsink_postgres::testkit::Cluster::start(&[("max_prepared_transactions", "10")])
        .expect("private cluster");
    kill_loop_into(
        &pg.url("postgres"),
        "&mode=2pc",
        &["after-copy", "after-prepare", "after-commit"],
        32,
    );
}

/// A table whose payload column is an integer: the run gives up with a permanent error that
/// names the column, the records stay in the log, and after the table is fixed the same
/// command delivers them once. inspect --sink shows both sides; no password anywhere.
#[test]
#[cfg_attr(
    not(servers),
    ignore = "needs WALSINK_TEST_SERVERS=1 and a local PostgreSQL"
)]
fn an_incompatible_table_is_a_permanent_error_and_the_records_wait() {
    let d = tempfile::tempdir().unwrap();
    let (inp, wal) = (d.path().join("in.txt"), d.path().join("wal"));
    let want = lines("w", 0, 500);
    write_lines(&inp, &want);
    let table = unique("wrong");
    psql(
        SHARED,
        &format!("CREATE TABLE {table} (sink_id text, subtask int, checkpoint bigint, idx bigint, payload integer)"),
    );
    let sink_id = unique("w").replace('_', "-");
    let sink = format!("postgres://postgres:hunter2@127.0.0.1:5432/test?table={table}");
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
        e.contains("payload") && e.contains("int4") && e.contains("permanent"),
        "{e}"
    );
    assert!(!e.contains("hunter2"), "{e}");
    let o = walsink(&["inspect", s(&wal), "--sink", &sink]);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = stdout(&o);
    assert!(out.contains("committed through: -"), "{out}");
    assert!(out.contains("committed through - (0 epochs held)"), "{out}");
    assert!(!out.contains("hunter2"), "{out}");
    let o = walsink(&["inspect", s(&wal), "--json"]);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    // The pipe stops reading once the target fails permanently, so how much of the input
    // it read first depends on timing; what it read must all wait in the log, undelivered.
    assert!(v["committed"].is_null(), "nothing was committed: {v}");
    assert!(
        v["backlog"]["records"].as_u64().unwrap_or(0) > 0,
        "the records wait in the log: {v}"
    );
    assert_eq!(
        v["backlog"]["records"], v["records"],
        "every record read waits in the log: {v}"
    );
    psql(
        SHARED,
        &format!("ALTER TABLE {table} ALTER COLUMN payload TYPE bytea USING NULL"),
    );
    let o = run(&a, None);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(table_lines(SHARED, &table, &sink_id), want);
    let o = walsink(&["inspect", s(&wal), "--json", "--sink", &sink]);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["target"]["committed"], 4, "checkpoints 0 to 4: {v}");
    assert_eq!(v["target"]["epochs"], 5, "{v}");
    assert_eq!(v["committed"], 4, "{v}");
    assert!(!String::from_utf8_lossy(&o.stdout).contains("hunter2"));
}

/// The log is lost after `repair --force` dropped checkpoints the table holds: the run
/// resumes after the table's newest marker (its metadata says where), nothing twice.
#[test]
#[cfg_attr(
    not(servers),
    ignore = "needs WALSINK_TEST_SERVERS=1 and a local PostgreSQL"
)]
fn a_resume_after_repair_force_starts_after_what_the_table_holds() {
    let d = tempfile::tempdir().unwrap();
    let (inp, wal) = (d.path().join("in.txt"), d.path().join("wal"));
    let want = lines("rec", 0, 1000);
    write_lines(&inp, &want);
    let table = unique("repair");
    let sink_id = unique("r").replace('_', "-");
    let sink = format!("{SHARED}?table={table}");
    let a = args(
        &inp,
        &wal,
        &sink,
        &[
            "--checkpoint-every",
            "250",
            "--sink-id",
            &sink_id,
            "--quiet",
        ],
    );
    let o = run(&a, None);
    assert!(o.status.success(), "{}", stderr(&o));
    let seg = segments(&wal).remove(0);
    let mut b = std::fs::read(&seg).unwrap();
    let needle = b"rec 000400";
    let at = b.windows(needle.len()).position(|w| w == needle).unwrap();
    b[at + 5] ^= 0x01;
    std::fs::write(&seg, &b).unwrap();
    let o = walsink(&["repair", s(&wal), "--force"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let a2 = args(
        &inp,
        &wal,
        &sink,
        &["--checkpoint-every", "250", "--sink-id", &sink_id],
    );
    let o = run(&a2, None);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stderr(&o).contains("in the target"), "{}", stderr(&o));
    assert_eq!(table_lines(SHARED, &table, &sink_id), want, "no line twice");
}
