//! `walsink pipe --sink postgres://…` against real servers: SIGKILL loops in marker mode (the
//! shared server) and two-phase mode (a private cluster with prepared transactions), with
//! kills forced at the dangerous points by failpoints (feature `failpoints`) and at random
//! moments, ending with every input line exactly once in the table; a table of the wrong
//! shape; `inspect --sink`. Over TLS (a private cluster serving a certificate of the kit's
//! test CA, plain connections refused): a kill loop with sslmode=verify-full, and a wrong CA,
//! a wrong host name and an expired certificate each refused naming the reason, then
//! delivered once fixed; passwords from PGPASSFILE, password_file and password_env.

use crate::common::*;
use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const SHARED: &str = "postgres://postgres@127.0.0.1:5432/test";

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

use walsink_kit::testkit::{TestCa, Validity};
use walsink_postgres::testkit::{Cluster, Setup};

/// A private cluster serving TLS with a certificate for `names` from `ca`; TCP connections
/// without TLS are refused, so whatever reaches it went over TLS.
fn tls_cluster(ca: &TestCa, file: &str, names: &[&str], validity: Validity) -> Cluster {
    let server = ca.server(file, names, validity).unwrap();
    Cluster::start_with(
        &[],
        &Setup {
            tls: Some((server.cert, server.key)),
            hba: Some(vec![
                "hostssl all all 127.0.0.1/32 trust".into(),
                "hostnossl all all 127.0.0.1/32 reject".into(),
            ]),
            ..Setup::default()
        },
    )
    .expect("start a private TLS cluster")
}

#[test]
#[cfg_attr(
    not(servers),
    ignore = "needs WALSINK_TEST_SERVERS=1 and the PostgreSQL binaries"
)]
fn kill_loop_over_tls_with_verify_full() {
    let d = tempfile::tempdir().unwrap();
    let ca = TestCa::new(d.path(), "ca").unwrap();
    let pg = tls_cluster(
        &ca,
        "server",
        &["localhost", "127.0.0.1"],
        Validity::Current,
    );
    kill_loop_into(
        &pg.url("postgres"),
        &format!(
            "&sslmode=verify-full&sslrootcert={}",
            ca.ca_file().display()
        ),
        &["after-copy", "after-commit"],
        33,
    );
}

/// `walsink pipe` with a bad TLS setting: it fails with the reason (a permanent error, not
/// an endless silent retry), the records wait in the log, and the fixed command delivers
/// each line once.
fn refused_then_fixed(url: &str, bad: &str, fixed: &str, reason: &str, fix: impl FnOnce()) {
    let d = tempfile::tempdir().unwrap();
    let (inp, wal) = (d.path().join("in.txt"), d.path().join("wal"));
    let want = lines("tls", 0, 300);
    write_lines(&inp, &want);
    let table = unique("tlsfix");
    let sink_id = unique("t").replace('_', "-");
    let extra = [
        "--checkpoint-every",
        "100",
        "--sink-id",
        &sink_id,
        "--max-retries",
        "1",
    ];
    let o = run(
        &args(&inp, &wal, &format!("{bad}table={table}"), &extra),
        None,
    );
    let e = stderr(&o);
    assert_eq!(o.status.code(), Some(2), "{e}");
    assert!(
        e.contains(reason) && e.contains("TLS"),
        "{reason:?} named: {e}"
    );
    assert!(e.contains("permanent"), "{e}");
    let o = walsink(&["inspect", s(&wal), "--json"]);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert!(v["committed"].is_null(), "nothing was committed: {v}");
    fix();
    let o = run(
        &args(&inp, &wal, &format!("{fixed}table={table}"), &extra),
        None,
    );
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(table_lines(url, &table, &sink_id), want, "every line once");
}

#[test]
#[cfg_attr(
    not(servers),
    ignore = "needs WALSINK_TEST_SERVERS=1 and the PostgreSQL binaries"
)]
fn a_wrong_ca_a_wrong_host_and_an_expired_certificate_are_named_then_fixed() {
    let d = tempfile::tempdir().unwrap();
    let ca = TestCa::new(d.path(), "ca").unwrap();
    let other = TestCa::new(d.path(), "other").unwrap();
    let root = |c: &TestCa| format!("sslrootcert={}", c.ca_file().display());
    // A certificate for db.example only: reached at 127.0.0.1 by hostaddr.
    let pg = tls_cluster(&ca, "named", &["db.example"], Validity::Current);
    let port = pg.port();
    let by_name = format!(
        "postgres://postgres@db.example:{port}/postgres?hostaddr=127.0.0.1&sslmode=verify-full"
    );
    refused_then_fixed(
        &pg.url("postgres"),
        &format!("{by_name}&{}&", root(&other)),
        &format!("{by_name}&{}&", root(&ca)),
        "not signed by a trusted CA",
        || {},
    );
    let by_addr = format!("postgres://postgres@127.0.0.1:{port}/postgres?sslmode=verify-full");
    refused_then_fixed(
        &pg.url("postgres"),
        &format!("{by_addr}&{}&", root(&ca)),
        &format!("{by_name}&{}&", root(&ca)),
        "does not carry the host name",
        || {},
    );
    drop(pg);
    let pg = tls_cluster(&ca, "old", &["localhost", "127.0.0.1"], Validity::Expired);
    let url = format!("{}?sslmode=verify-full&{}&", pg.url("postgres"), root(&ca));
    let renewed = ca
        .server("renewed", &["localhost", "127.0.0.1"], Validity::Current)
        .unwrap();
    refused_then_fixed(&pg.url("postgres"), &url, &url, "has expired", || {
        pg.replace_tls(&renewed.cert, &renewed.key).unwrap()
    });
}

/// A password from PGPASSFILE (libpq's format, 0600), from password_file= and from
/// password_env=, against a cluster that asks for scram-sha-256 over TLS; PGPASSFILE open to
/// the group is ignored with libpq's warning. The password shows nowhere.
#[test]
#[cfg_attr(
    not(servers),
    ignore = "needs WALSINK_TEST_SERVERS=1 and the PostgreSQL binaries"
)]
fn passwords_come_from_pgpassfile_password_file_and_password_env() {
    use std::os::unix::fs::PermissionsExt;
    let d = tempfile::tempdir().unwrap();
    let ca = TestCa::new(d.path(), "ca").unwrap();
    let server = ca
        .server("server", &["localhost", "127.0.0.1"], Validity::Current)
        .unwrap();
    let password = format!("Pw:{}", unique("secret"));
    let pg = Cluster::start_with(
        &[("password_encryption", "scram-sha-256")],
        &Setup {
            tls: Some((server.cert, server.key)),
            password: Some(password.clone()),
            hba: Some(vec!["hostssl all all 127.0.0.1/32 scram-sha-256".into()]),
            ..Setup::default()
        },
    )
    .expect("start a private cluster with passwords");
    let port = pg.port();
    let base = format!(
        "postgres://postgres@127.0.0.1:{port}/postgres?sslmode=verify-full&sslrootcert={}",
        ca.ca_file().display()
    );
    let pgpass = d.path().join("pgpass");
    std::fs::write(
        &pgpass,
        format!(
            "127.0.0.1:{port}:postgres:postgres:{}\n",
            password.replace(':', "\\:")
        ),
    )
    .unwrap();
    let pwfile = d.path().join("pw");
    std::fs::write(&pwfile, format!("{password}\n")).unwrap();
    let reader = format!(
        "postgres://postgres@127.0.0.1:{port}/postgres?sslmode=require&passfile={}",
        pgpass.display()
    );
    let deliver = |query: &str, env: &[(&str, &str)]| {
        let dir = tempfile::tempdir().unwrap();
        let (inp, wal) = (dir.path().join("in.txt"), dir.path().join("wal"));
        let want = lines("pw", 0, 50);
        write_lines(&inp, &want);
        let table = unique("pw");
        let sink_id = unique("p").replace('_', "-");
        let a = args(
            &inp,
            &wal,
            &format!("{base}&table={table}{query}"),
            &["--sink-id", &sink_id, "--max-retries", "1"],
        );
        let mut c = Command::new(env!("CARGO_BIN_EXE_walsink"));
        c.args(&a)
            .stdin(Stdio::null())
            .env_remove("PGPASSWORD")
            .env_remove("PGPASSFILE");
        for (k, v) in env {
            c.env(k, v);
        }
        let o = c.output().unwrap();
        let text = format!("{}{}", stdout(&o), stderr(&o));
        assert!(!text.contains(&password), "password shown: {text}");
        (o, table, sink_id, want)
    };
    std::fs::set_permissions(&pgpass, std::fs::Permissions::from_mode(0o600)).unwrap();
    let pgpassfile = s(&pgpass).to_string();
    for (query, env) in [
        (String::new(), vec![("PGPASSFILE", pgpassfile.as_str())]),
        (format!("&password_file={}", pwfile.display()), vec![]),
        (
            "&password_env=WALSINK_TEST_PG_PW".to_string(),
            vec![("WALSINK_TEST_PG_PW", password.as_str())],
        ),
    ] {
        let (o, table, sink_id, want) = deliver(&query, &env);
        assert!(o.status.success(), "{query} {env:?}: {}", stderr(&o));
        assert_eq!(table_lines(&reader, &table, &sink_id), want, "{query}");
    }
    std::fs::set_permissions(&pgpass, std::fs::Permissions::from_mode(0o640)).unwrap();
    let (o, _, _, _) = deliver("", &[("PGPASSFILE", pgpassfile.as_str())]);
    let e = stderr(&o);
    assert_eq!(o.status.code(), Some(2), "{e}");
    assert!(
        e.contains("group or world access") && e.contains("0600"),
        "{e}"
    );
}

/// A certificate that expires while `pipe --follow` runs: the failing delivery shows on the
/// retry line naming the reason (a permanent error, retried, not silent), nothing is skipped,
/// and once the certificate is renewed the same run delivers every line once.
#[test]
#[cfg_attr(
    not(servers),
    ignore = "needs WALSINK_TEST_SERVERS=1 and the PostgreSQL binaries"
)]
fn a_certificate_expiring_mid_run_shows_on_the_retry_line_until_renewed() {
    let d = tempfile::tempdir().unwrap();
    let ca = TestCa::new(d.path(), "ca").unwrap();
    let pg = tls_cluster(
        &ca,
        "server",
        &["localhost", "127.0.0.1"],
        Validity::Current,
    );
    let expired = ca
        .server("expired", &["localhost", "127.0.0.1"], Validity::Expired)
        .unwrap();
    let renewed = ca
        .server("renewed", &["localhost", "127.0.0.1"], Validity::Current)
        .unwrap();
    let (inp, wal) = (d.path().join("in.txt"), d.path().join("wal"));
    let first = lines("mid", 0, 50);
    write_lines(&inp, &first);
    let table = unique("midrun");
    let sink_id = unique("m").replace('_', "-");
    let url = pg.url("postgres");
    let sink = format!(
        "{url}?table={table}&sslmode=verify-full&sslrootcert={}",
        ca.ca_file().display()
    );
    let a = args(
        &inp,
        &wal,
        &sink,
        &[
            "--follow",
            "--checkpoint-interval",
            "200ms",
            "--progress-interval",
            "200ms",
            "--sink-id",
            &sink_id,
            "--max-retries",
            "100000",
            "--retry-deadline",
            "10m",
        ],
    );
    let mut child = spawn_piped(&a, &[]);
    let err = collect_stderr(&mut child);
    // The number of rows so far (0 while the table is not created yet).
    let held = || {
        let o = Command::new("psql")
            .args([
                url.as_str(),
                "-AtXq",
                "-c",
                &format!("SELECT count(*) FROM {table} WHERE sink_id = '{sink_id}'"),
            ])
            .output()
            .expect("run psql");
        stdout(&o).trim().parse::<usize>().unwrap_or(0)
    };
    let until = |want: usize| {
        let t = Instant::now();
        while t.elapsed() < Duration::from_secs(60) {
            if held() >= want {
                return true;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        false
    };
    assert!(
        until(first.len()),
        "first lines delivered: {:?}",
        err.lock()
    );
    pg.replace_tls(&expired.cert, &expired.key).unwrap();
    let more = lines("mid", 50, 100);
    let mut f = std::fs::OpenOptions::new().append(true).open(&inp).unwrap();
    for l in &more {
        use std::io::Write;
        f.write_all(l).unwrap();
        f.write_all(b"\n").unwrap();
    }
    drop(f);
    // The core's warning and the CLI's retry line both carry the reason.
    let t = Instant::now();
    let retry_line = loop {
        let found = err
            .lock()
            .unwrap()
            .iter()
            .find(|l| l.contains("delivery is failing") && l.contains("has expired"))
            .cloned();
        if let Some(l) = found {
            break l;
        }
        assert!(
            t.elapsed() < Duration::from_secs(60),
            "no retry line naming the expired certificate: {:?}",
            err.lock()
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(retry_line.contains("permanent"), "{retry_line}");
    assert_eq!(
        held(),
        first.len(),
        "nothing more delivered through an expired certificate"
    );
    pg.replace_tls(&renewed.cert, &renewed.key).unwrap();
    assert!(until(100), "delivered once renewed: {:?}", err.lock());
    signal(&child, "TERM");
    wait_exit(&mut child, Duration::from_secs(60), "pipe --follow");
    let mut want = first;
    want.extend(more);
    assert_eq!(table_lines(&url, &table, &sink_id), want, "every line once");
}
