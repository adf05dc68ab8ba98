//! `pipe --dead-letter dir:PATH` under SIGKILLs: lines a PostgreSQL CHECK constraint refuses
//! go to the dead-letter log exactly once with their position, every other line lands exactly
//! once and in order; `dlq list` and `dlq show` read them back; `--max-dead-letters` stops the
//! run (exit 2) with the record past the limit kept in the log; a bad `--dead-letter` is
//! refused naming it.

use crate::common::*;
use std::path::Path;
use std::process::{Command, Stdio};

const SHARED: &str = "postgres://postgres@127.0.0.1:5432/test";

fn psql(sql: &str) -> String {
    let o = Command::new("psql")
        .args([SHARED, "-AtXq", "-v", "ON_ERROR_STOP=1", "-c", sql])
        .output()
        .expect("run psql");
    assert!(o.status.success(), "psql {sql}: {}", stderr(&o));
    stdout(&o)
}

/// A table of the sink's default shape whose CHECK refuses payloads starting with `bad`.
fn checked_table(table: &str) {
    psql(&format!(
        "CREATE TABLE {table} (sink_id text NOT NULL, subtask integer NOT NULL, checkpoint bigint NOT NULL, idx bigint NOT NULL, payload bytea NOT NULL CONSTRAINT no_bad CHECK (substring(payload from 1 for 3) <> 'bad'::bytea))"
    ));
}

fn walsink(a: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_walsink"))
        .args(a)
        .stdin(Stdio::null())
        .output()
        .expect("run walsink")
}

/// Lines `0..n`, about 1 % of them refused (`bad …`): (all lines, good lines, bad indices).
fn input(n: usize) -> (Vec<Vec<u8>>, Vec<Vec<u8>>, Vec<usize>) {
    let mut all = Vec::new();
    let mut good = Vec::new();
    let mut bad = Vec::new();
    let mut rng = fastrand::Rng::with_seed(7);
    for i in 0..n {
        if rng.u32(0..100) == 0 {
            all.push(format!("bad {i:06}").into_bytes());
            bad.push(i);
        } else {
            let l = format!("line {i:06} {}", "y".repeat(i % 30)).into_bytes();
            all.push(l.clone());
            good.push(l);
        }
    }
    (all, good, bad)
}

fn letters(dir: &Path) -> Vec<serde_json::Value> {
    let o = walsink(&["dlq", "list", s(dir), "--json"]);
    assert!(o.status.success(), "{}", stderr(&o));
    stdout(&o)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

#[test]
#[cfg_attr(
    not(servers),
    ignore = "needs WALSINK_TEST_SERVERS=1 and a local PostgreSQL"
)]
fn kill_loop_with_refused_lines_ends_with_good_lines_once_in_order_and_bad_lines_once_in_the_dead_letter_log(
) {
    let d = tempfile::tempdir().unwrap();
    let (inp, wal, dlq) = (
        d.path().join("in.txt"),
        d.path().join("wal"),
        d.path().join("dlq"),
    );
    let (all, good, bad) = input(60_000);
    write_lines(&inp, &all);
    let table = unique("dlq");
    checked_table(&table);
    let sink = format!("{SHARED}?table={table}");
    let dl = format!("dir:{}", s(&dlq));
    let extra = ["--checkpoint-every", "500", "--dead-letter", &dl];
    let (ended, kills) = kill_loop_to(&inp, &wal, &sink, &extra, 20, 11, 30..=400);
    assert!(
        ended.iter().all(|c| *c == Some(0)),
        "runs that ended on their own: {ended:?}"
    );
    let runs = ended.len() as u32 + kills;
    let a = pipe_args_to(&inp, &wal, &sink, &extra);
    let a: Vec<&str> = a.iter().map(String::as_str).collect();
    let o = walsink(&a);
    assert!(o.status.success(), "{}", stderr(&o));
    eprintln!(
        "{runs} runs, {kills} SIGKILLs; last run: {}",
        stderr(&o).trim()
    );
    assert!(kills >= 15, "only {kills} kills landed in {runs} runs");
    let got: Vec<Vec<u8>> = psql(&format!(
        "SELECT convert_from(payload, 'UTF8') FROM {table} ORDER BY checkpoint, idx"
    ))
    .lines()
    .map(|l| l.as_bytes().to_vec())
    .collect();
    assert_in_order_once(&got, &good);
    assert_eq!(got.len(), good.len(), "every good line exactly once");
    // Every bad line exactly once in the dead-letter log, in order, with its position.
    let ls = letters(&dlq);
    let shown = walsink(&["dlq", "show", s(&dlq)]);
    assert!(shown.status.success(), "{}", stderr(&shown));
    let datas: Vec<String> = stdout(&shown)
        .lines()
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).unwrap();
            v["data"].as_str().unwrap().to_string()
        })
        .collect();
    let want_bad: Vec<String> = bad.iter().map(|i| format!("bad {i:06}")).collect();
    assert_eq!(datas, want_bad);
    assert_eq!(ls.len(), bad.len());
    let mut last = (0, 0);
    for (l, line) in ls.iter().zip(&bad) {
        assert_eq!(l["code"], "23514");
        assert_eq!(l["class"], "rejected");
        assert_eq!(l["shard"], 0);
        let pos = (
            l["checkpoint"].as_u64().unwrap(),
            l["index"].as_u64().unwrap(),
        );
        assert!(pos > last, "positions increase: {pos:?} after {last:?}");
        last = pos;
        // checkpoint-every 500 lines from the start: the index is the line's place in its
        // epoch, which the log's position names whatever the kills did.
        assert!(l["index"].as_u64().unwrap() < 500, "{l}");
        let _ = line;
    }
    // The markers count what landed.
    let landed = psql(&format!(
        "SELECT sum(records) FROM walsink_markers WHERE sink_id = 'pipe-{table}'"
    ));
    assert_eq!(landed.trim(), good.len().to_string());
}

#[test]
#[cfg_attr(
    not(servers),
    ignore = "needs WALSINK_TEST_SERVERS=1 and a local PostgreSQL"
)]
fn past_max_dead_letters_the_run_stops_and_keeps_the_record() {
    let d = tempfile::tempdir().unwrap();
    let (inp, wal, dlq) = (
        d.path().join("in.txt"),
        d.path().join("wal"),
        d.path().join("dlq"),
    );
    let lines: Vec<Vec<u8>> = (0..30)
        .map(|i| {
            if i % 10 == 4 {
                format!("bad {i}")
            } else {
                format!("ok {i}")
            }
            .into_bytes()
        })
        .collect();
    write_lines(&inp, &lines);
    let table = unique("dlqmax");
    checked_table(&table);
    let sink = format!("{SHARED}?table={table}");
    let dl = format!("dir:{}", s(&dlq));
    let o = walsink(&[
        "pipe",
        "--input",
        s(&inp),
        "--wal",
        s(&wal),
        "--sink",
        &sink,
        "--checkpoint-every",
        "10",
        "--dead-letter",
        &dl,
        "--max-dead-letters",
        "2",
    ]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    let err = stderr(&o);
    assert!(err.contains("--max-dead-letters 2"), "{err}");
    assert!(err.contains("record 4 of checkpoint 2"), "{err}");
    assert!(err.contains("walsink dlq list"), "{err}");
    assert_eq!(letters(&dlq).len(), 2);
    let n = psql(&format!("SELECT count(*) FROM {table}"));
    assert_eq!(
        n.trim(),
        "18",
        "checkpoints 0 and 1 without their bad lines"
    );
}

#[test]
fn a_dead_letter_log_that_is_not_a_directory_is_refused_naming_it() {
    let d = tempfile::tempdir().unwrap();
    let inp = d.path().join("in.txt");
    write_lines(&inp, &[b"a".to_vec()]);
    let out = d.path().join("out");
    let o = walsink(&[
        "pipe",
        "--input",
        s(&inp),
        "--wal",
        s(&d.path().join("wal")),
        "--sink",
        &format!("dir:{}", s(&out)),
        "--dead-letter",
        "postgres://x/y",
    ]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("--dead-letter postgres://x/y"),
        "{}",
        stderr(&o)
    );
    assert!(
        !d.path().join("wal").exists(),
        "nothing made before the refusal"
    );
    let wal = d.path().join("wal");
    let same = format!("dir:{}", s(&wal));
    let file = format!("dir:{}", s(&inp));
    for (spec, says) in [
        (same.as_str(), "the --wal directory"),
        (file.as_str(), "not a directory"),
    ] {
        let o = walsink(&[
            "pipe",
            "--input",
            s(&inp),
            "--wal",
            s(&wal),
            "--sink",
            &format!("dir:{}", s(&out)),
            "--dead-letter",
            spec,
        ]);
        assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
        assert!(stderr(&o).contains(says), "{}", stderr(&o));
    }
    let o = walsink(&["dlq", "list", s(&d.path().join("missing"))]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("missing"), "{}", stderr(&o));
}

#[test]
#[cfg_attr(
    not(servers),
    ignore = "needs WALSINK_TEST_SERVERS=1 and a local PostgreSQL"
)]
fn a_take_over_after_checkpoints_refused_whole_resumes_after_them() {
    // Checkpoints whose every line went to the dead-letter log still leave their marker, so a
    // new log taking the shard over resumes after them instead of writing their numbers again
    // over other lines (an outside run lost lines that way).
    let d = tempfile::tempdir().unwrap();
    let (inp, dlq) = (d.path().join("in.txt"), d.path().join("dlq"));
    let mut all: Vec<Vec<u8>> = (0..5).map(|i| format!("ok{i}").into_bytes()).collect();
    all.extend((5..15).map(|i| format!("bad{i}").into_bytes()));
    write_lines(&inp, &all);
    let table = unique("dlqto");
    checked_table(&table);
    let sink = format!("{SHARED}?table={table}");
    let dl = format!("dir:{}", s(&dlq));
    let sink_id = format!("pipe-{table}");
    let run = |wal: &str, every: &str, take_over: bool| {
        let mut a = vec![
            "pipe",
            "--input",
            s(&inp),
            "--wal",
            wal,
            "--sink",
            &sink,
            "--sink-id",
            &sink_id,
            "--checkpoint-every",
            every,
            "--dead-letter",
            &dl,
        ];
        if take_over {
            a.push("--take-over");
        }
        let o = walsink(&a);
        assert!(o.status.success(), "{}", stderr(&o));
    };
    let wal_a = d.path().join("wa");
    run(s(&wal_a), "5", false);
    all.extend((15..30).map(|i| format!("ok{i}").into_bytes()));
    write_lines(&inp, &all);
    let wal_b = d.path().join("wb");
    run(s(&wal_b), "8", true);
    let got: Vec<String> = psql(&format!(
        "SELECT convert_from(payload, 'UTF8') FROM {table} ORDER BY checkpoint, idx"
    ))
    .lines()
    .map(str::to_string)
    .collect();
    let want: Vec<String> = (0..5).chain(15..30).map(|i| format!("ok{i}")).collect();
    assert_eq!(got, want);
    let datas: Vec<String> = letters(&dlq)
        .iter()
        .map(|l| format!("{}:{}", l["checkpoint"], l["index"]))
        .collect();
    assert_eq!(datas.len(), 10, "each refused line once: {datas:?}");
}
