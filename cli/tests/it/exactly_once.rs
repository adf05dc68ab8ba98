//! The wrong results of issue 9, each as the user met it: a reused sink directory, a resume
//! after `repair --force`, an input changed under the log, a last line without a newline, a
//! demo in a user's directory, a sink that cannot take records, and durations. Two SIGKILL
//! loops: one with the input changed under the log, one with a reused sink directory.

use crate::common::*;
use std::fs;
use std::io::Read;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

#[test]
fn a_sink_directory_holding_another_logs_commits_is_refused() {
    let d = tempfile::tempdir().unwrap();
    let (r1, r2) = (d.path().join("r1.txt"), d.path().join("r2.txt"));
    let out = d.path().join("out");
    write_lines(&r1, &lines("r", 1, 101));
    write_lines(&r2, &lines("r", 501, 701));
    let o = run_pipe(
        &r1,
        &d.path().join("wal_r1"),
        &out,
        &["--checkpoint-every", "50", "--quiet"],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(records(&out), lines("r", 1, 101));
    // A second log into the same directory under the same sink id: refused, nothing created.
    let wal2 = d.path().join("wal_r2");
    let o = run_pipe(&r2, &wal2, &out, &["--checkpoint-every", "50"]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    let e = stderr(&o);
    assert!(
        e.contains("already holds checkpoints") && e.contains(s(&out)),
        "{e}"
    );
    assert!(!wal2.exists(), "a refused run leaves no log behind");
    // Deleting the log to start over is the same story.
    fs::remove_dir_all(d.path().join("wal_r1")).unwrap();
    let o = run_pipe(
        &r1,
        &d.path().join("wal_r1"),
        &out,
        &["--checkpoint-every", "50"],
    );
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains("is new"), "{}", stderr(&o));
    // Its own sink id makes the new log's epochs its own.
    let o = run_pipe(
        &r2,
        &wal2,
        &out,
        &["--checkpoint-every", "50", "--sink-id", "second", "--quiet"],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    // Files sort by checkpoint id, so the two logs' epochs interleave: compare each log's own.
    let (first, second): (Vec<_>, Vec<_>) = records(&out)
        .into_iter()
        .partition(|r| r.as_slice() < b"r 000500".as_slice());
    assert!(
        first == lines("r", 1, 101),
        "the first log's records: {}",
        first.len()
    );
    assert!(
        second == lines("r", 501, 701),
        "the second log's records: {}",
        second.len()
    );
}

#[test]
fn a_resume_after_repair_force_starts_after_what_the_target_holds() {
    let d = tempfile::tempdir().unwrap();
    let (inp, wal, out) = (
        d.path().join("in.txt"),
        d.path().join("wal"),
        d.path().join("out"),
    );
    write_lines(&inp, &lines("rec", 0, 1000));
    let o = run_pipe(&inp, &wal, &out, &["--checkpoint-every", "250", "--quiet"]);
    assert!(o.status.success(), "{}", stderr(&o));
    // Flip one byte in the second epoch's records: repair --force drops the later checkpoints.
    let seg = segments(&wal).remove(0);
    let mut b = fs::read(&seg).unwrap();
    let needle = b"rec 000400";
    let at = b
        .windows(needle.len())
        .position(|w| w == needle)
        .expect("record in the segment");
    b[at + 5] ^= 0x01;
    fs::write(&seg, &b).unwrap();
    assert_eq!(walsink(&["verify", s(&wal)]).status.code(), Some(1));
    let o = walsink(&["repair", s(&wal), "--force", "--json"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert!(
        !v["checkpoints_dropped"].as_array().unwrap().is_empty(),
        "{v}"
    );
    let o = run_pipe(&inp, &wal, &out, &["--checkpoint-every", "250"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stderr(&o).contains("in the target"), "{}", stderr(&o));
    assert_eq!(records(&out), lines("rec", 0, 1000), "no record twice");
    // And the log goes on from there with new input.
    write_lines(&inp, &lines("rec", 0, 1200));
    let o = run_pipe(&inp, &wal, &out, &["--checkpoint-every", "250", "--quiet"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(records(&out), lines("rec", 0, 1200));
}

#[test]
fn an_input_changed_under_the_log_is_refused() {
    let d = tempfile::tempdir().unwrap();
    let (inp, wal, out) = (
        d.path().join("in.txt"),
        d.path().join("wal"),
        d.path().join("out"),
    );
    write_lines(&inp, &lines("a", 0, 100));
    assert!(
        run_pipe(&inp, &wal, &out, &["--checkpoint-every", "30", "--quiet"])
            .status
            .success()
    );
    // Longer, with different content.
    write_lines(&inp, &lines("b", 0, 300));
    let o = run_pipe(&inp, &wal, &out, &["--quiet"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(
        stderr(&o).contains("changed under the log"),
        "{}",
        stderr(&o)
    );
    // Shorter.
    write_lines(&inp, &lines("a", 0, 10));
    let o = run_pipe(&inp, &wal, &out, &[]);
    assert_eq!(o.status.code(), Some(1));
    assert!(
        stderr(&o).contains("not the input the log read"),
        "{}",
        stderr(&o)
    );
    // Another path, even with the same bytes.
    let other = d.path().join("other.txt");
    write_lines(&other, &lines("a", 0, 100));
    let o = run_pipe(&other, &wal, &out, &[]);
    assert_eq!(o.status.code(), Some(1));
    let e = stderr(&o);
    assert!(
        e.contains("another file") && e.contains(s(&inp.canonicalize().unwrap())),
        "{e}"
    );
    assert_eq!(
        records(&out),
        lines("a", 0, 100),
        "the target got nothing wrong"
    );
    // The original input, grown, goes on.
    write_lines(&inp, &lines("a", 0, 150));
    assert!(run_pipe(&inp, &wal, &out, &["--quiet"]).status.success());
    assert_eq!(records(&out), lines("a", 0, 150));
}

#[test]
fn a_last_line_without_a_newline_waits_for_it() {
    let d = tempfile::tempdir().unwrap();
    let (inp, wal, out) = (
        d.path().join("in.txt"),
        d.path().join("wal"),
        d.path().join("out"),
    );
    fs::write(&inp, b"a\nb\nc").unwrap();
    let o = run_pipe(&inp, &wal, &out, &["--quiet"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("no newline"),
        "a warning even with --quiet"
    );
    assert_eq!(records(&out), vec![b"a".to_vec(), b"b".to_vec()]);
    fs::write(&inp, b"a\nb\ncd\ne\n").unwrap();
    assert!(run_pipe(&inp, &wal, &out, &["--quiet"]).status.success());
    assert_eq!(
        records(&out),
        [&b"a"[..], b"b", b"cd", b"e"].map(|r| r.to_vec())
    );
    // --ship-final-line: the file is complete; continuing that line later is refused.
    let (wal2, out2) = (d.path().join("wal2"), d.path().join("out2"));
    fs::write(&inp, b"x\ny").unwrap();
    assert!(
        run_pipe(&inp, &wal2, &out2, &["--ship-final-line", "--quiet"])
            .status
            .success()
    );
    assert_eq!(records(&out2), vec![b"x".to_vec(), b"y".to_vec()]);
    fs::write(&inp, b"x\nyz\n").unwrap();
    let o = run_pipe(&inp, &wal2, &out2, &["--quiet"]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(stderr(&o).contains("continued"), "{}", stderr(&o));
    fs::write(&inp, b"x\ny\nz\n").unwrap();
    assert!(run_pipe(&inp, &wal2, &out2, &["--quiet"]).status.success());
    assert_eq!(records(&out2), [&b"x"[..], b"y", b"z"].map(|r| r.to_vec()));
}

#[test]
fn demo_refuses_a_directory_it_did_not_create() {
    let d = tempfile::tempdir().unwrap();
    fs::create_dir(d.path().join("out")).unwrap();
    fs::write(d.path().join("out/keep.me"), b"mine").unwrap();
    fs::write(d.path().join("input.txt"), b"my input").unwrap();
    let o = walsink(&[
        "demo",
        "--dir",
        s(d.path()),
        "--records",
        "100",
        "--crashes",
        "0",
        "--quiet",
    ]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(stderr(&o).contains("not empty"), "{}", stderr(&o));
    assert_eq!(fs::read(d.path().join("out/keep.me")).unwrap(), b"mine");
    assert_eq!(fs::read(d.path().join("input.txt")).unwrap(), b"my input");
    // A new directory is the demo's, and it may run there again.
    let mine = d.path().join("demo");
    for _ in 0..2 {
        let o = walsink(&[
            "demo",
            "--dir",
            s(&mine),
            "--records",
            "100",
            "--crashes",
            "0",
            "--quiet",
        ]);
        assert!(o.status.success(), "{}", stderr(&o));
    }
}

#[test]
fn a_closed_stdout_ends_the_pipe_and_the_records_stay_in_the_log() {
    let d = tempfile::tempdir().unwrap();
    let (inp, wal) = (d.path().join("in.txt"), d.path().join("wal"));
    write_lines(&inp, &lines("s", 0, 200_000));
    let mut child = Command::new(env!("CARGO_BIN_EXE_walsink"))
        .args([
            "pipe",
            "--input",
            s(&inp),
            "--wal",
            s(&wal),
            "--sink",
            "stdout",
            "--checkpoint-every",
            "1000",
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut first = [0u8; 64];
    child
        .stdout
        .as_mut()
        .unwrap()
        .read_exact(&mut first)
        .unwrap();
    drop(child.stdout.take()); // `| head -c 64`
    let t = Instant::now();
    let status = loop {
        if let Some(st) = child.try_wait().unwrap() {
            break st;
        }
        assert!(
            t.elapsed() < Duration::from_secs(60),
            "the pipe did not end after stdout closed"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    // 141: the reader left before every record was printed (README, exit codes).
    assert_eq!(status.code(), Some(141));
    let mut err = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut err)
        .unwrap();
    assert!(err.contains("standard output was closed"), "{err}");
    let o = walsink(&["inspect", s(&wal), "--json"]);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert!(
        v["backlog"]["records"].as_u64().unwrap() > 0,
        "records stay in the log: {v}"
    );
}

#[test]
fn a_target_that_refuses_writes_ends_the_pipe_naming_it() {
    let d = tempfile::tempdir().unwrap();
    let (inp, wal, out) = (
        d.path().join("in.txt"),
        d.path().join("wal"),
        d.path().join("out"),
    );
    write_lines(&inp, &lines("p", 0, 100));
    fs::create_dir(&out).unwrap();
    let immutable = Command::new("chattr").arg("+i").arg(&out).status();
    if !immutable.is_ok_and(|s| s.success()) {
        eprintln!("skipped: chattr +i is not available here");
        return;
    }
    let o = run_pipe(&inp, &wal, &out, &["--max-retries", "0", "--quiet"]);
    let _ = Command::new("chattr").arg("-i").arg(&out).status();
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    let e = stderr(&o);
    assert!(
        e.contains(s(&out)) && e.contains("not permitted") && e.contains("--max-retries"),
        "{e}"
    );
    // Fixed, the same command delivers everything once.
    let o = run_pipe(&inp, &wal, &out, &["--quiet"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(records(&out), lines("p", 0, 100));
}

#[test]
fn durations_are_parsed_with_units_and_never_panic() {
    let d = tempfile::tempdir().unwrap();
    let (inp, wal, out) = (
        d.path().join("in.txt"),
        d.path().join("wal"),
        d.path().join("out"),
    );
    write_lines(&inp, &lines("t", 0, 10));
    for (bad, says) in [
        ("99999999999999999999s", "not a duration"),
        ("10", "unit"),
        ("0s", "positive"),
    ] {
        let o = run_pipe(&inp, &wal, &out, &["--checkpoint-interval", bad]);
        assert_eq!(o.status.code(), Some(2), "{bad}: {}", stderr(&o));
        assert!(stderr(&o).contains(says), "{bad}: {}", stderr(&o));
        assert!(
            !wal.exists() && !out.exists(),
            "nothing created for a usage error"
        );
    }
    let o = run_pipe(
        &inp,
        &wal,
        &out,
        &["--checkpoint-interval", "1h", "--quiet"],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(records(&out), lines("t", 0, 10));
}

/// SIGKILL the pipe repeatedly, then change the input under the log and keep killing: every
/// run that ends is refused, and the target holds only the original records, each once.
#[test]
fn kill_loop_with_the_input_changed_under_the_log() {
    let d = tempfile::tempdir().unwrap();
    let (inp, wal, out) = (
        d.path().join("in.txt"),
        d.path().join("wal"),
        d.path().join("out"),
    );
    let original = lines("orig", 0, 150_000);
    write_lines(&inp, &original);
    let extra = ["--checkpoint-every", "500", "--quiet"];
    let (_, killed) = kill_loop(&inp, &wal, &out, &extra, 6, 11);
    assert_in_order_once(&records(&out), &original);
    // Same length, other bytes in the middle of what was consumed; then longer and different.
    let mut changed = original.clone();
    changed[records(&out).len() / 2 + 1] = b"CHANGED".to_vec();
    changed.extend(lines("new", 0, 1000));
    write_lines(&inp, &changed);
    let (ended, killed2) = kill_loop(&inp, &wal, &out, &extra, 6, 12);
    assert!(
        ended.iter().all(|c| *c == Some(1)),
        "every finished run refused: {ended:?}"
    );
    let o = run_pipe(&inp, &wal, &out, &extra);
    assert_eq!(o.status.code(), Some(1));
    assert!(
        stderr(&o).contains("changed under the log"),
        "{}",
        stderr(&o)
    );
    let got = records(&out);
    assert_in_order_once(&got, &original);
    assert!(
        !got.iter()
            .any(|r| r == b"CHANGED" || r.starts_with(b"new ")),
        "no wrong data"
    );
    // Put back, the run finishes exactly once.
    write_lines(&inp, &original);
    let o = run_pipe(&inp, &wal, &out, &extra);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(records(&out), original);
    eprintln!("kill loop (changed input): {killed} + {killed2} SIGKILLs");
    assert!(
        killed + killed2 >= 4,
        "too few kills landed: {killed} + {killed2}"
    );
}

/// SIGKILL a pipe into a directory, delete its log half-way to start over and keep killing:
/// every run of the new log is refused. Under its own sink id the new log delivers, also
/// across kills, and the target holds each log's records once.
#[test]
fn kill_loop_with_a_reused_sink_directory() {
    let d = tempfile::tempdir().unwrap();
    let (a, b, out) = (
        d.path().join("a.txt"),
        d.path().join("b.txt"),
        d.path().join("out"),
    );
    let wal = d.path().join("wal");
    let (la, lb) = (lines("a", 0, 150_000), lines("b", 0, 100_000));
    write_lines(&a, &la);
    write_lines(&b, &lb);
    let extra = ["--checkpoint-every", "500", "--quiet"];
    let (_, k1) = kill_loop(&a, &wal, &out, &extra, 5, 21);
    let before = records(&out);
    assert_in_order_once(&before, &la);
    assert!(!before.is_empty(), "the first log delivered something");
    fs::remove_dir_all(&wal).unwrap();
    let (ended, k2) = kill_loop(&b, &wal, &out, &extra, 5, 22);
    assert!(
        ended.iter().all(|c| *c == Some(1)),
        "every finished run refused: {ended:?}"
    );
    let now = records(&out);
    assert!(
        now == before,
        "nothing skipped, nothing added: {} records, {} before",
        now.len(),
        before.len()
    );
    let own = ["--checkpoint-every", "500", "--quiet", "--sink-id", "b"];
    let (_, k3) = kill_loop(&b, &wal, &out, &own, 5, 23);
    let o = run_pipe(&b, &wal, &out, &own);
    assert!(o.status.success(), "{}", stderr(&o));
    let got = records(&out);
    let (got_a, got_b): (Vec<_>, Vec<_>) = got.into_iter().partition(|r| r.starts_with(b"a "));
    assert!(got_a == before, "the first log's records changed");
    assert!(
        got_b == lb,
        "the new log's records, each once: {} of {}",
        got_b.len(),
        lb.len()
    );
    eprintln!("kill loop (reused sink directory): {k1} + {k2} + {k3} SIGKILLs");
    assert!(k1 + k3 >= 4, "too few kills landed: {k1} + {k3}");
}
