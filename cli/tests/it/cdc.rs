//! `walsink cdc` as a user runs it: SIGKILL loops from both inputs ending with the replica
//! equal to the source both ways (`EXCEPT ALL`): a file of Debezium events with rewound
//! replays, duplicates and tombstones in it (shared PostgreSQL), and a replication slot in a
//! private cluster under a live workload (`walsink demo cdc`). Also the refusals that need
//! no server.

use crate::common::*;
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::io::Write;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};
use walsink_cdc::tokio_postgres::{self, NoTls};

const SHARED: &str = "postgres://postgres@127.0.0.1:5432/test";

#[test]
fn a_bad_sink_url_is_refused_naming_the_parameter() {
    let d = tempfile::tempdir().unwrap();
    let inp = d.path().join("events.jsonl");
    std::fs::write(&inp, "null\n").unwrap();
    let o = walsink(&[
        "cdc",
        "--input",
        s(&inp),
        "--wal",
        s(&d.path().join("wal")),
        "--sink",
        "postgres://u:secret@127.0.0.1:1/db?shema=x",
    ]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("\"shema\""), "{}", stderr(&o));
    assert!(!stderr(&o).contains("secret"));
    let o = walsink(&[
        "cdc",
        "--source",
        "postgres://u@127.0.0.1:1/db?tables=a",
        "--wal",
        s(&d.path().join("wal")),
        "--sink",
        "postgres://u@127.0.0.1:1/db",
    ]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("slot=NAME"), "{}", stderr(&o));
}

/// A random change stream on table `t`: a snapshot, then inserts, updates (some changing the
/// key), deletes and a truncate, with rewound replays of earlier ranges, duplicates and
/// tombstones mixed in. Returns the lines and the final rows (id → (v, n)).
fn stream(seed: u64, n: usize) -> (Vec<String>, BTreeMap<i32, (String, i32)>) {
    let mut rng = fastrand::Rng::with_seed(seed);
    let mut state: BTreeMap<i32, (String, i32)> = BTreeMap::new();
    let mut lines: Vec<String> = Vec::new();
    let mut fresh: Vec<String> = Vec::new();
    let img = |id: i32, v: &str, n: i32| json!({"id": id, "v": v, "n": n});
    let ev = |op: &str, lsn: u64, before: Value, after: Value| {
        json!({"before": before, "after": after, "op": op, "ts_ms": 0,
               "source": {"db": "src", "schema": "public", "table": "t", "lsn": lsn}})
        .to_string()
    };
    for id in 0..200 {
        let v = format!("snap {id}");
        state.insert(id, (v.clone(), id));
        fresh.push(ev("r", 100, Value::Null, img(id, &v, id)));
    }
    let mut lsn = 1000u64;
    let mut next_id = 1000;
    let mut truncated = false;
    while fresh.len() < n {
        lsn += rng.u64(1..20);
        // A live key at random (`nth` walks the map, but collecting every key per event made
        // the stream quadratic to build).
        let pick = |rng: &mut fastrand::Rng, s: &BTreeMap<i32, (String, i32)>| {
            (!s.is_empty()).then(|| *s.keys().nth(rng.usize(..s.len())).expect("in range"))
        };
        let roll = rng.u32(0..100);
        if roll < 35 || state.is_empty() {
            next_id += 1;
            let v = format!("ins {lsn}");
            state.insert(next_id, (v.clone(), 1));
            fresh.push(ev("c", lsn, Value::Null, img(next_id, &v, 1)));
        } else if roll < 65 {
            let id = pick(&mut rng, &state).unwrap();
            let (v0, n0) = state[&id].clone();
            let v = format!("upd {lsn}");
            state.insert(id, (v.clone(), n0 + 1));
            fresh.push(ev("u", lsn, img(id, &v0, n0), img(id, &v, n0 + 1)));
        } else if roll < 75 {
            let id = pick(&mut rng, &state).unwrap();
            let (v0, n0) = state.remove(&id).unwrap();
            next_id += 1;
            state.insert(next_id, (v0.clone(), n0));
            fresh.push(ev("u", lsn, img(id, &v0, n0), img(next_id, &v0, n0)));
        } else if roll < 97 || truncated || fresh.len() < n / 2 {
            let id = pick(&mut rng, &state).unwrap();
            let (v0, n0) = state.remove(&id).unwrap();
            fresh.push(ev("d", lsn, img(id, &v0, n0), Value::Null));
            if rng.bool() {
                fresh.push("null".into()); // Debezium's tombstone after a delete
            }
        } else {
            truncated = true;
            state.clear();
            fresh.push(ev("t", lsn, Value::Null, Value::Null));
        }
    }
    // Interleave rewinds: after some lines, an earlier range again (old positions).
    for (i, l) in fresh.iter().enumerate() {
        lines.push(l.clone());
        if i > 100 && rng.u32(0..400) == 0 {
            let from = rng.usize(0..i);
            let to = (from + rng.usize(1..300)).min(i);
            lines.extend(fresh[from..to].iter().cloned());
        }
        if rng.u32(0..200) == 0 {
            lines.push(l.clone()); // a duplicate
        }
    }
    (lines, state)
}

async fn client() -> tokio_postgres::Client {
    let (c, conn) = tokio_postgres::connect(SHARED, NoTls)
        .await
        .expect("the shared PostgreSQL at 127.0.0.1:5432 answers");
    tokio::spawn(conn);
    c
}

/// Spawns `walsink cdc` with `args` `runs` times, each SIGKILLed after a random delay unless
/// it ends first; returns how many were killed.
fn kill_loop(args: &[String], runs: u32, seed: u64, min_ms: u64, max_ms: u64) -> u32 {
    let mut rng = fastrand::Rng::with_seed(seed);
    let mut killed = 0;
    for _ in 0..runs {
        let mut child = Command::new(env!("CARGO_BIN_EXE_walsink"))
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let delay = Duration::from_millis(rng.u64(min_ms..=max_ms));
        let t = Instant::now();
        loop {
            if child.try_wait().unwrap().is_some() {
                break;
            }
            if t.elapsed() >= delay {
                child.kill().unwrap();
                child.wait().unwrap();
                killed += 1;
                break;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }
    killed
}

#[test]
#[cfg_attr(
    not(servers),
    ignore = "needs WALSINK_TEST_SERVERS=1 and a local PostgreSQL"
)]
fn kill_loop_from_a_file_of_events_ends_with_the_replica_equal_to_the_source() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let d = tempfile::tempdir().unwrap();
    let schema = format!("cdc_cli_{}_{:x}", std::process::id(), fastrand::u32(..));
    // Large enough, and killed early enough, that most runs die mid-work: the apply got
    // faster (typed arrays), and 30,000 changes with kills after 150-900 ms let most runs
    // finish first.
    let (lines, state) = stream(7, 60_000);
    let inp = d.path().join("events.jsonl");
    let mut f = std::io::BufWriter::new(std::fs::File::create(&inp).unwrap());
    for l in &lines {
        writeln!(f, "{l}").unwrap();
    }
    f.flush().unwrap();
    drop(f);
    rt.block_on(async {
        let c = client().await;
        c.batch_execute(&format!(
            "CREATE SCHEMA {schema};
             CREATE TABLE {schema}.t (id int PRIMARY KEY, v text, n int);
             CREATE TABLE {schema}.expected (id int PRIMARY KEY, v text, n int);"
        ))
        .await
        .unwrap();
        let ids: Vec<i32> = state.keys().copied().collect();
        let vs: Vec<String> = state.values().map(|(v, _)| v.clone()).collect();
        let ns: Vec<i32> = state.values().map(|(_, n)| *n).collect();
        c.execute(
            &format!("INSERT INTO {schema}.expected SELECT * FROM unnest($1::int[], $2::text[], $3::int[])"),
            &[&ids, &vs, &ns],
        )
        .await
        .unwrap();
    });
    let wal = d.path().join("wal");
    let args: Vec<String> = [
        "cdc",
        "--input",
        s(&inp),
        "--wal",
        s(&wal),
        "--sink",
        &format!("{SHARED}?schema={schema}"),
        "--checkpoint-every",
        "700",
        "--quiet",
    ]
    .iter()
    .map(|a| a.to_string())
    .collect();
    let killed = kill_loop(&args, 16, 11, 30, 400);
    let refs: Vec<&str> = args.iter().map(String::as_str).collect();
    let o = walsink(&refs);
    assert!(o.status.success(), "{}", stderr(&o));
    let (cmp, applied) = rt.block_on(async {
        let c = client().await;
        let cmp = walsink_cdc::check::compare(&c, (&schema, "expected"), (&schema, "t"))
            .await
            .unwrap();
        let applied = walsink_cdc::check::applied(&c, &schema, "cdc")
            .await
            .unwrap();
        (cmp, applied)
    });
    eprintln!(
        "file kill loop: {} lines, {killed} kills, {} epochs holding {} events applied, replica {} rows",
        lines.len(),
        applied.0,
        applied.1,
        cmp.replica_rows
    );
    assert!(killed >= 8, "only {killed} runs were killed");
    assert!(cmp.identical(), "{cmp:?}");
    assert_eq!(
        applied.1,
        lines.len() as u64,
        "every line in exactly one committed epoch"
    );
    rt.block_on(async {
        client()
            .await
            .batch_execute(&format!("DROP SCHEMA {schema} CASCADE"))
            .await
            .unwrap()
    });
}

#[test]
#[cfg_attr(
    not(servers),
    ignore = "needs WALSINK_TEST_SERVERS=1 and the PostgreSQL binaries"
)]
fn kill_loop_from_a_replication_slot_ends_with_the_replica_equal_to_the_source() {
    let o = walsink(&[
        "demo",
        "cdc",
        "--rows",
        "4000",
        "--crashes",
        "8",
        "--kill-min-ms",
        "150",
        "--kill-max-ms",
        "1500",
        "--seed",
        "3",
    ]);
    let out = stdout(&o);
    eprintln!("{}{out}", stderr(&o));
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(
        out.starts_with("verified: replica identical to source (")
            && out.contains("across 8 crashes"),
        "{out}"
    );
}

/// A file of `n` random change events on table `t` in `dir`, and a new schema `TAG_…` on the
/// shared server holding an empty replica table `t`: (schema, lines, file).
fn events_and_replica(
    rt: &tokio::runtime::Runtime,
    dir: &std::path::Path,
    tag: &str,
    n: usize,
) -> (String, Vec<String>, std::path::PathBuf) {
    let schema = format!("{tag}_{}_{:x}", std::process::id(), fastrand::u32(..));
    let (lines, _) = stream(3, n);
    let inp = dir.join("events.jsonl");
    std::fs::write(&inp, lines.join("\n") + "\n").unwrap();
    rt.block_on(async {
        client()
            .await
            .batch_execute(&format!(
                "CREATE SCHEMA {schema}; CREATE TABLE {schema}.t (id int PRIMARY KEY, v text, n int);"
            ))
            .await
            .unwrap()
    });
    (schema, lines, inp)
}

#[test]
#[cfg_attr(
    not(servers),
    ignore = "needs WALSINK_TEST_SERVERS=1 and a local PostgreSQL"
)]
fn inspect_reads_a_cdc_logs_markers_from_its_target() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let d = tempfile::tempdir().unwrap();
    let (schema, lines, inp) = events_and_replica(&rt, d.path(), "cdc_insp", 2_000);
    let wal = d.path().join("wal");
    let sink = format!("{SHARED}?schema={schema}");
    let o = walsink(&[
        "cdc",
        "--input",
        s(&inp),
        "--wal",
        s(&wal),
        "--sink",
        &sink,
        "--checkpoint-every",
        "500",
        "--quiet",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let o = walsink(&["inspect", s(&wal), "--sink", &sink, "--json"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let v: Value = serde_json::from_slice(&o.stdout).unwrap();
    let epochs = lines.len().div_ceil(500);
    assert_eq!(v["target"]["epochs"], epochs, "{v}");
    assert_eq!(v["target"]["committed"], v["committed"], "{v}");
    rt.block_on(async {
        client()
            .await
            .batch_execute(&format!("DROP SCHEMA {schema} CASCADE"))
            .await
            .unwrap()
    });
}

/// `cdc --input` speaks as `cdc` (not `pipe`) in its notices, on a first run, a resume and a
/// graceful stop of a `--follow` run by SIGTERM (exit 3).
#[test]
#[cfg_attr(
    not(servers),
    ignore = "needs WALSINK_TEST_SERVERS=1 and a local PostgreSQL"
)]
fn cdc_input_names_itself_in_its_messages() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let d = tempfile::tempdir().unwrap();
    let (schema, _, inp) = events_and_replica(&rt, d.path(), "cdc_name", 300);
    let sink = format!("{SHARED}?schema={schema}");
    let wal = d.path().join("wal");
    let args = [
        "cdc",
        "--input",
        s(&inp),
        "--wal",
        s(&wal),
        "--sink",
        &sink,
        "--checkpoint-every",
        "100",
    ];
    let first = walsink(&args);
    let second = walsink(&args);
    // With --follow, a signal stops it gracefully, and it says so as cdc.
    let mut follow: Vec<String> = args.iter().map(|a| a.to_string()).collect();
    follow.push("--follow".into());
    let mut child = spawn_piped(&follow, &[]);
    let err = collect_stderr(&mut child);
    assert!(
        wait_for_line(&err, "cdc: resuming after", Duration::from_secs(20)),
        "{:?}",
        err.lock().unwrap()
    );
    signal(&child, "TERM");
    let st = wait_exit(&mut child, Duration::from_secs(30), "cdc --follow stop");
    std::thread::sleep(Duration::from_millis(50));
    let stopped = err.lock().unwrap().join("\n");
    rt.block_on(async {
        let _ = client()
            .await
            .batch_execute(&format!("DROP SCHEMA {schema} CASCADE"))
            .await;
    });
    for (o, says) in [
        (&first, "cdc: input consumed"),
        (&second, "cdc: resuming after"),
    ] {
        let err = stderr(o);
        assert_eq!(o.status.code(), Some(0), "{err}");
        assert!(err.contains(says), "{err}");
        assert!(!err.contains("pipe:"), "cdc speaks as pipe: {err}");
    }
    assert_eq!(st.code(), Some(3), "{stopped}");
    assert!(stopped.contains("cdc: stopped by SIGTERM"), "{stopped}");
    assert!(!stopped.contains("pipe:"), "{stopped}");
}

/// Runs `sql` on the shared MariaDB with the mariadb client, in database `db`; its
/// tab-separated output.
fn mariadb(db: &str, sql: &str) -> String {
    let o = Command::new("mariadb")
        .args([
            "--no-defaults",
            "-h127.0.0.1",
            "-P3306",
            "-uroot",
            "-N",
            "-B",
            db,
            "-e",
            sql,
        ])
        .output()
        .expect("run mariadb");
    assert!(o.status.success(), "mariadb {sql}: {}", stderr(&o));
    stdout(&o)
}

#[test]
#[cfg_attr(
    not(servers),
    ignore = "needs WALSINK_TEST_SERVERS=1 and a local MariaDB"
)]
fn kill_loop_from_a_file_of_events_into_mariadb_ends_with_the_replica_equal_to_the_source() {
    let d = tempfile::tempdir().unwrap();
    let db = format!("cdc_cli_my_{}_{:x}", std::process::id(), fastrand::u32(..));
    let (lines, state) = stream(13, 40_000);
    let inp = d.path().join("events.jsonl");
    let mut f = std::io::BufWriter::new(std::fs::File::create(&inp).unwrap());
    for l in &lines {
        writeln!(f, "{l}").unwrap();
    }
    f.flush().unwrap();
    drop(f);
    mariadb("test", &format!("CREATE DATABASE {db}"));
    mariadb(&db, "CREATE TABLE t (id INT PRIMARY KEY, v TEXT, n INT)");
    let wal = d.path().join("wal");
    let args: Vec<String> = [
        "cdc",
        "--input",
        s(&inp),
        "--wal",
        s(&wal),
        "--sink",
        &format!("mysql://root@127.0.0.1:3306/{db}"),
        "--checkpoint-every",
        "700",
        "--quiet",
    ]
    .iter()
    .map(|a| a.to_string())
    .collect();
    // Server faults beside the SIGKILLs: the sink's connections (those using the run's
    // database) killed at random moments, mid-transaction or between epochs.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let server_kills = std::sync::Arc::new(std::sync::atomic::AtomicU32::new(0));
    let killer = {
        let (stop, server_kills, db) = (stop.clone(), server_kills.clone(), db.clone());
        std::thread::spawn(move || {
            let mut rng = fastrand::Rng::with_seed(5);
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                std::thread::sleep(Duration::from_millis(rng.u64(150..600)));
                let ids = mariadb(
                    "test",
                    &format!("SELECT ID FROM information_schema.PROCESSLIST WHERE DB = '{db}'"),
                );
                if let Some(id) = ids.lines().next() {
                    let o = Command::new("mariadb")
                        .args(["--no-defaults", "-h127.0.0.1", "-P3306", "-uroot", "-e"])
                        .arg(format!("KILL CONNECTION {id}"))
                        .output()
                        .unwrap();
                    if o.status.success() {
                        server_kills.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    }
                }
            }
        })
    };
    let killed = kill_loop(&args, 16, 17, 30, 600);
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    killer.join().unwrap();
    let refs: Vec<&str> = args.iter().map(String::as_str).collect();
    let o = walsink(&refs);
    assert!(o.status.success(), "{}", stderr(&o));
    let got = mariadb(&db, "SELECT id, v, n FROM t ORDER BY id");
    let want: String = state
        .iter()
        .map(|(id, (v, n))| format!("{id}\t{v}\t{n}\n"))
        .collect();
    let applied = mariadb(&db, "SELECT COUNT(*), SUM(records) FROM walsink_markers");
    eprintln!(
        "mariadb file kill loop: {} lines, {killed} SIGKILLs, {} connections killed, markers/records {applied}, replica {} rows",
        lines.len(),
        server_kills.load(std::sync::atomic::Ordering::Relaxed),
        got.lines().count()
    );
    assert!(killed >= 8, "only {killed} runs were killed");
    assert!(got == want, "the replica differs from the source");
    let records: u64 = applied.split('\t').nth(1).unwrap().trim().parse().unwrap();
    assert_eq!(
        records,
        lines.len() as u64,
        "every line in exactly one committed epoch"
    );
    mariadb("test", &format!("DROP DATABASE {db}"));
}

#[test]
fn cdc_source_into_mysql_is_refused_before_anything_is_made() {
    let d = tempfile::tempdir().unwrap();
    let wal = d.path().join("wal");
    let o = walsink(&[
        "cdc",
        "--source",
        "postgres://u@127.0.0.1:1/db?slot=s&tables=a",
        "--wal",
        s(&wal),
        "--sink",
        "mysql://root:secret@127.0.0.1:1/db",
    ]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(stderr(&o).contains("--input"), "{}", stderr(&o));
    assert!(!stderr(&o).contains("secret"));
    assert!(!wal.exists());
    let inp = d.path().join("events.jsonl");
    std::fs::write(&inp, "null\n").unwrap();
    let o = walsink(&[
        "cdc",
        "--input",
        s(&inp),
        "--wal",
        s(&wal),
        "--sink",
        "mysql://root:secret@127.0.0.1:1/db?table=x",
    ]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("table"), "{}", stderr(&o));
    assert!(!stderr(&o).contains("secret"));
}

#[test]
#[cfg_attr(
    not(servers),
    ignore = "needs WALSINK_TEST_SERVERS=1 and a local MariaDB"
)]
fn a_second_cdc_log_under_one_sink_id_is_refused_and_takes_over_only_when_asked() {
    let d = tempfile::tempdir().unwrap();
    let db = format!("cdc_cli_own_{}_{:x}", std::process::id(), fastrand::u32(..));
    mariadb("test", &format!("CREATE DATABASE {db}"));
    mariadb(&db, "CREATE TABLE t (id INT PRIMARY KEY, v TEXT, n INT)");
    let sink = format!("mysql://root@127.0.0.1:3306/{db}");
    let line = |id: i32, lsn: u64| {
        json!({"before": null, "after": {"id": id, "v": "x", "n": 1}, "op": "c",
               "source": {"table": "t", "lsn": lsn}})
        .to_string()
    };
    let input = d.path().join("events.jsonl");
    let write = |ids: &[i32]| {
        let text: String = ids.iter().map(|&i| line(i, i as u64) + "\n").collect();
        std::fs::write(&input, text).unwrap();
    };
    let run = |wal: &str, extra: &[&str]| {
        let wal = d.path().join(wal);
        let mut a = vec![
            "cdc",
            "--input",
            s(&input),
            "--wal",
            s(&wal),
            "--sink",
            &sink,
        ];
        a.extend_from_slice(extra);
        walsink(&a)
    };
    write(&[1, 2]);
    let o = run("wal-a", &[]);
    assert!(o.status.success(), "{}", stderr(&o));
    // Another log (the same input, restarted elsewhere), the same sink id: refused before
    // anything is applied.
    write(&[1, 2, 3]);
    let o = run("wal-b", &[]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(stderr(&o).contains("--take-over"), "{}", stderr(&o));
    assert_eq!(mariadb(&db, "SELECT COUNT(*) FROM t").trim(), "2");
    // Taken over: it goes on from the target's newest checkpoint; the old log is fenced at
    // its next commit and applies nothing.
    let o = run("wal-b", &["--take-over"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(mariadb(&db, "SELECT COUNT(*) FROM t").trim(), "3");
    write(&[1, 2, 3, 4]);
    let o = run("wal-a", &[]);
    assert_ne!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(stderr(&o).contains("fenced"), "{}", stderr(&o));
    assert_eq!(
        mariadb(&db, "SELECT COUNT(*) FROM t WHERE id = 4").trim(),
        "0"
    );
    let o = run("wal-b", &[]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(mariadb(&db, "SELECT COUNT(*) FROM t").trim(), "4");
    mariadb("test", &format!("DROP DATABASE {db}"));
}
