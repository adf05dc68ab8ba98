//! `walsink pipe --sink redis://…` against the local Redis: SIGKILL loops that end with
//! every input line in the list exactly once, a Redis key that belongs to another log
//! refused, and a key of the wrong type ending the run with the records kept.

use crate::common::*;

const REDIS: &str = "redis://127.0.0.1:6379/0";

fn redis_cmd<T: redis::FromRedisValue>(cmd: &mut redis::Cmd) -> T {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let mut c = redis::Client::open(REDIS)
            .unwrap()
            .get_multiplexed_async_connection_with_config(
                &redis::AsyncConnectionConfig::new()
                    .set_response_timeout(Some(std::time::Duration::from_secs(60))),
            )
            .await
            .expect("the local Redis at 127.0.0.1:6379 must answer (WALSINK_TEST_SERVERS=1)");
        cmd.query_async(&mut c).await.unwrap()
    })
}

fn list(key: &str) -> Vec<Vec<u8>> {
    redis_cmd(redis::cmd("LRANGE").arg(key).arg(0).arg(-1))
}

#[test]
#[cfg_attr(
    not(servers),
    ignore = "needs WALSINK_TEST_SERVERS=1 and a local Redis"
)]
fn kill_loop_into_a_redis_list_ends_with_every_line_once() {
    let d = tempfile::tempdir().unwrap();
    let (inp, wal) = (d.path().join("in.txt"), d.path().join("wal"));
    // Enough lines that a run takes longer than the longest delay before its kill: the
    // transactions deliver a checkpoint of 700 lines in a millisecond or two.
    let want = lines("r", 0, 600_000);
    write_lines(&inp, &want);
    let key = format!("walsink-test:{}", unique("cli-kill"));
    let sink = format!("{REDIS}?key={key}&chunk_records=200");
    let id = unique("k");
    let extra = ["--checkpoint-every", "700", "--sink-id", &id, "--quiet"];
    let mut kills = 0;
    for round in 0..3 {
        let (_, k) = kill_loop_to(&inp, &wal, &sink, &extra, 6, 40 + round, 30..=600);
        kills += k;
        let held = list(&key);
        assert_in_order_once(&held, &want);
        eprintln!(
            "after round {round}: {} of {} lines in Redis",
            held.len(),
            want.len()
        );
    }
    let args = pipe_args_to(&inp, &wal, &sink, &extra);
    let o = walsink(&args.iter().map(String::as_str).collect::<Vec<_>>());
    assert!(o.status.success(), "{}", stderr(&o));
    let got = list(&key);
    assert!(
        got == want,
        "every line once: {} records of {}",
        got.len(),
        want.len()
    );
    eprintln!("kill loop into redis: {kills} SIGKILLs in 18 runs");
    assert!(kills >= 6, "too few kills landed: {kills}");
    redis_cmd::<()>(
        redis::cmd("DEL")
            .arg(&key)
            .arg(format!("walsink:{{{key}}}:committed")),
    );
}

#[test]
#[cfg_attr(
    not(servers),
    ignore = "needs WALSINK_TEST_SERVERS=1 and a local Redis"
)]
fn a_key_holding_another_logs_commits_is_refused() {
    let d = tempfile::tempdir().unwrap();
    let (inp, wal) = (d.path().join("in.txt"), d.path().join("wal"));
    write_lines(&inp, &lines("a", 0, 1000));
    let key = format!("walsink-test:{}", unique("cli-owner"));
    let sink = format!("{REDIS}?key={key}");
    let id = unique("o");
    let extra = ["--checkpoint-every", "300", "--sink-id", &id, "--quiet"];
    let run = || {
        let args = pipe_args_to(&inp, &wal, &sink, &extra);
        walsink(&args.iter().map(String::as_str).collect::<Vec<_>>())
    };
    let o = run();
    assert!(o.status.success(), "{}", stderr(&o));
    // Deleting the log to start over: the marker in Redis names the old log.
    std::fs::remove_dir_all(&wal).unwrap();
    let o = run();
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    let e = stderr(&o);
    assert!(
        e.contains("already holds checkpoints") && e.contains(&key),
        "{e}"
    );
    assert!(!wal.exists(), "a refused run leaves no log behind");
    assert_eq!(list(&key), lines("a", 0, 1000));
}

#[test]
#[cfg_attr(
    not(servers),
    ignore = "needs WALSINK_TEST_SERVERS=1 and a local Redis"
)]
fn a_key_of_the_wrong_type_ends_the_run_and_keeps_the_records() {
    let d = tempfile::tempdir().unwrap();
    let (inp, wal) = (d.path().join("in.txt"), d.path().join("wal"));
    write_lines(&inp, &lines("w", 0, 500));
    let key = format!("walsink-test:{}", unique("cli-wrongtype"));
    redis_cmd::<()>(redis::cmd("SET").arg(&key).arg("a string"));
    let sink = format!("{REDIS}?key={key}");
    let id = unique("w");
    let run = |extra: &[&str]| {
        let mut e = vec!["--sink-id", &id, "--quiet"];
        e.extend_from_slice(extra);
        let args = pipe_args_to(&inp, &wal, &sink, &e);
        walsink(&args.iter().map(String::as_str).collect::<Vec<_>>())
    };
    let o = run(&["--max-retries", "0"]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    let e = stderr(&o);
    assert!(e.contains("WRONGTYPE") && e.contains(&key), "{e}");
    redis_cmd::<()>(redis::cmd("DEL").arg(&key));
    let o = run(&[]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(list(&key), lines("w", 0, 500));
}

#[test]
fn a_bad_redis_url_names_the_parameter() {
    let d = tempfile::tempdir().unwrap();
    let (inp, wal) = (d.path().join("in.txt"), d.path().join("wal"));
    write_lines(&inp, &lines("u", 0, 3));
    let args = pipe_args_to(
        &inp,
        &wal,
        "redis://:hunter2@127.0.0.1:1/0?mode=set&key=k",
        &[],
    );
    let o = walsink(&args.iter().map(String::as_str).collect::<Vec<_>>());
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    let e = stderr(&o);
    assert!(e.contains("mode") && !e.contains("hunter2"), "{e}");
    assert!(!wal.exists());
}

#[test]
#[cfg_attr(
    not(servers),
    ignore = "needs WALSINK_TEST_SERVERS=1 and a local Redis"
)]
fn inspect_says_redis_keeps_its_newest_marker_only() {
    let d = tempfile::tempdir().unwrap();
    let (inp, wal) = (d.path().join("in.txt"), d.path().join("wal"));
    write_lines(&inp, &lines("i", 0, 1000));
    let key = format!("walsink-test:{}", unique("cli-inspect"));
    let sink = format!("{REDIS}?key={key}");
    let id = unique("i");
    let args = pipe_args_to(
        &inp,
        &wal,
        &sink,
        &["--checkpoint-every", "100", "--sink-id", &id, "--quiet"],
    );
    let o = walsink(&args.iter().map(String::as_str).collect::<Vec<_>>());
    assert!(o.status.success(), "{}", stderr(&o));
    let o = walsink(&["inspect", s(&wal), "--sink", &sink]);
    assert!(o.status.success(), "{}", stderr(&o));
    let text = stdout(&o);
    assert!(
        text.contains("committed through 9") && text.contains("newest marker only"),
        "{text}"
    );
    assert!(!text.contains("1 epoch held"), "{text}");
    let o = walsink(&["inspect", s(&wal), "--sink", &sink, "--json"]);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["target"]["committed"], 9, "{v}");
    assert!(v["target"]["epochs"].is_null(), "{v}");
    assert_eq!(v["target"]["newest_marker_only"], true, "{v}");
    redis_cmd::<i64>(redis::cmd("DEL").arg(&key));
}
