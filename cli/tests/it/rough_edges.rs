//! The confusing corners of issue 9 and the features users expect: errors that name their
//! path, no leftovers from refused runs, exit codes of the tools, a damaged commit store,
//! the record limit, stdin, follow mode, a disk budget, dump ranges and JSON summaries.

use crate::common::*;
use std::fs;
use std::io::Write;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

#[test]
fn errors_name_their_path_and_refused_runs_leave_nothing() {
    let d = tempfile::tempdir().unwrap();
    let (inp, wal, out) = (
        d.path().join("in.txt"),
        d.path().join("wal"),
        d.path().join("out"),
    );
    write_lines(&inp, &lines("e", 0, 10));
    let afile = d.path().join("afile");
    fs::write(&afile, b"x").unwrap();
    let cases: Vec<(Vec<String>, String)> = vec![
        (pipe_args(&inp, &wal, &afile, &[]), s(&afile).into()),
        (pipe_args(d.path(), &wal, &out, &[]), s(d.path()).into()),
        (pipe_args(&inp, &afile, &out, &[]), s(&afile).into()),
        (
            pipe_args(&d.path().join("missing.txt"), &wal, &out, &[]),
            "missing.txt".into(),
        ),
        (
            pipe_args(&inp, &wal, &wal, &[]),
            "separate directories".into(),
        ),
    ];
    for (args, says) in cases {
        let refs: Vec<&str> = args.iter().map(String::as_str).collect();
        let o = walsink(&refs);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {}", stderr(&o));
        assert!(stderr(&o).contains(&says), "{args:?}: {}", stderr(&o));
        assert!(
            !wal.exists() && !out.exists(),
            "{args:?} left a directory behind"
        );
    }
    let fifo = d.path().join("fifo");
    if Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .is_ok_and(|s| s.success())
    {
        let o = run_pipe(&fifo, &wal, &out, &[]);
        assert_eq!(o.status.code(), Some(2));
        let e = stderr(&o);
        assert!(e.contains(s(&fifo)) && e.contains("--input -"), "{e}");
    }
}

#[test]
fn tools_exit_2_on_what_is_not_a_log_and_1_on_damage() {
    let d = tempfile::tempdir().unwrap();
    let empty = d.path().join("empty");
    let other = d.path().join("other");
    fs::create_dir(&empty).unwrap();
    fs::create_dir(&other).unwrap();
    fs::write(other.join("notes.txt"), b"hi").unwrap();
    for dir in [&empty, &other] {
        for cmd in ["inspect", "dump", "verify", "repair"] {
            let o = walsink(&[cmd, s(dir)]);
            assert_eq!(o.status.code(), Some(2), "{cmd} {}", dir.display());
            assert!(
                stderr(&o).contains("not a walsink log"),
                "{cmd}: {}",
                stderr(&o)
            );
        }
    }
    // A damaged log: inspect and dump warn and exit 1; dump still prints the valid prefix.
    let wal = d.path().join("wal");
    {
        let (w, _) = walsink::WalSink::open(&wal, walsink::Options::new("dmg")).unwrap();
        for cp in 1..=3u64 {
            for i in 0..50 {
                w.append(format!("cp{cp} rec{i:03}").as_bytes()).unwrap();
            }
            w.checkpoint(cp, b"").unwrap();
        }
    }
    let seg = segments(&wal).remove(0);
    let mut b = fs::read(&seg).unwrap();
    let at = b.windows(9).position(|w| w == b"cp2 rec01").unwrap();
    b[at] ^= 0x20;
    fs::write(&seg, &b).unwrap();
    let o = walsink(&["inspect", s(&wal)]);
    assert_eq!(o.status.code(), Some(1));
    assert!(
        stderr(&o).contains("warning") && stderr(&o).contains("repair --force"),
        "{}",
        stderr(&o)
    );
    let o = walsink(&["dump", s(&wal)]);
    assert_eq!(o.status.code(), Some(1));
    assert!(
        stdout(&o).contains("cp1 rec049") && !stdout(&o).contains("cp3"),
        "{}",
        stdout(&o)
    );
    assert!(stderr(&o).contains("warning"), "{}", stderr(&o));
    assert_eq!(walsink(&["verify", s(&wal)]).status.code(), Some(1));
    // The pipe's advice is the CLI's, not the library's.
    let inp = d.path().join("in.txt");
    write_lines(&inp, &lines("x", 0, 5));
    let o = walsink(&[
        "pipe",
        "--input",
        s(&inp),
        "--wal",
        s(&wal),
        "--sink",
        "stdout",
        "--sink-id",
        "dmg",
    ]);
    assert_eq!(o.status.code(), Some(2));
    let e = stderr(&o);
    assert!(
        e.contains("walsink repair --force") && !e.contains("RecoveryMode"),
        "{e}"
    );
}

#[test]
fn a_damaged_commit_store_is_set_aside_and_rebuilt_by_repair_force() {
    let d = tempfile::tempdir().unwrap();
    let (inp, wal, out) = (
        d.path().join("in.txt"),
        d.path().join("wal"),
        d.path().join("out"),
    );
    write_lines(&inp, &lines("c", 0, 500));
    assert!(
        run_pipe(&inp, &wal, &out, &["--checkpoint-every", "100", "--quiet"])
            .status
            .success()
    );
    let committed = wal.join("COMMITTED");
    let mut b = fs::read(&committed).unwrap();
    let last = b.len() - 1;
    b[last] ^= 0xff;
    fs::write(&committed, &b).unwrap();
    let o = walsink(&["verify", s(&wal), "--json"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(stdout(&o).contains("bad_commit_store"));
    let o = walsink(&["repair", s(&wal)]);
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains("--force"), "{}", stderr(&o));
    let o = walsink(&["repair", s(&wal), "--force", "--json"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["commit_store"]["set_aside"], "COMMITTED.damaged", "{v}");
    assert!(wal.join("COMMITTED.damaged").exists(), "kept, not deleted");
    assert_eq!(walsink(&["verify", s(&wal)]).status.code(), Some(0));
    // The pipe goes on; the directory sink skips what it holds.
    write_lines(&inp, &lines("c", 0, 700));
    assert!(
        run_pipe(&inp, &wal, &out, &["--checkpoint-every", "100", "--quiet"])
            .status
            .success()
    );
    assert_eq!(records(&out), lines("c", 0, 700));
}

#[test]
fn a_record_over_the_limit_is_named_and_the_limit_can_be_raised() {
    let d = tempfile::tempdir().unwrap();
    let (inp, wal, out) = (
        d.path().join("in.txt"),
        d.path().join("wal"),
        d.path().join("out"),
    );
    let mut l = lines("r", 0, 10);
    l[6] = vec![b'z'; 300];
    write_lines(&inp, &l);
    let o = run_pipe(
        &inp,
        &wal,
        &out,
        &["--max-record-bytes", "200", "--checkpoint-every", "2"],
    );
    assert_eq!(o.status.code(), Some(2));
    let e = stderr(&o);
    assert!(
        e.contains("line 7") && e.contains("--max-record-bytes") && e.contains(s(&inp)),
        "{e}"
    );
    let o = run_pipe(&inp, &wal, &out, &["--max-record-bytes", "1KiB", "--quiet"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(records(&out), l);
}

#[test]
fn the_summary_names_the_commit_and_speaks_json() {
    let d = tempfile::tempdir().unwrap();
    let (inp, wal, out) = (
        d.path().join("in.txt"),
        d.path().join("wal"),
        d.path().join("out"),
    );
    write_lines(&inp, &lines("j", 0, 10));
    let o = run_pipe(&inp, &wal, &out, &[]);
    let e = stderr(&o);
    assert!(
        e.contains("committed through checkpoint ") && !e.contains("checkpoint -"),
        "{e}"
    );
    assert!(e.contains("1 epoch delivered"), "{e}");
    write_lines(&inp, &lines("j", 0, 20));
    let o = run_pipe(&inp, &wal, &out, &["--json", "--checkpoint-every", "5"]);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["outcome"], "done");
    assert_eq!(v["resumed_from"]["from"], "log");
    assert_eq!(v["records_read"], 10);
    assert_eq!(v["epochs_delivered"], 2);
    assert_eq!(records(&out), lines("j", 0, 20));
}

#[test]
fn stdin_is_read_to_its_end_and_each_run_appends() {
    let d = tempfile::tempdir().unwrap();
    let (wal, out) = (d.path().join("wal"), d.path().join("out"));
    let feed = |body: &[u8]| {
        let mut c = Command::new(env!("CARGO_BIN_EXE_walsink"))
            .args([
                "pipe",
                "--input",
                "-",
                "--wal",
                s(&wal),
                "--sink",
                &format!("dir:{}", out.display()),
                "--quiet",
            ])
            .stdin(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        c.stdin.take().unwrap().write_all(body).unwrap();
        let o = c.wait_with_output().unwrap();
        assert!(o.status.success(), "{}", stderr(&o));
    };
    feed(b"one\ntwo\nthree");
    feed(b"four\n");
    assert_eq!(
        records(&out),
        [&b"one"[..], b"two", b"three", b"four"].map(|r| r.to_vec())
    );
    // A log fed from standard input does not continue with a file.
    let inp = d.path().join("in.txt");
    write_lines(&inp, &lines("f", 0, 3));
    assert_eq!(run_pipe(&inp, &wal, &out, &[]).status.code(), Some(1));
}

#[test]
fn follow_ships_lines_as_the_file_grows() {
    let d = tempfile::tempdir().unwrap();
    let (inp, wal, out) = (
        d.path().join("in.txt"),
        d.path().join("wal"),
        d.path().join("out"),
    );
    write_lines(&inp, &lines("g", 0, 100));
    let args = pipe_args(&inp, &wal, &out, &["--follow", "--quiet"]);
    let refs: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut child = spawn(&refs);
    let wait_for = |n: usize| {
        let t = Instant::now();
        while records(&out).len() < n {
            assert!(
                t.elapsed() < Duration::from_secs(30),
                "only {} records",
                records(&out).len()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    };
    wait_for(100);
    let mut f = fs::OpenOptions::new().append(true).open(&inp).unwrap();
    f.write_all(b"g 000100 half").unwrap(); // no newline yet: not shipped
    std::thread::sleep(Duration::from_millis(400));
    assert_eq!(records(&out).len(), 100);
    f.write_all(b"\nlast\n").unwrap();
    wait_for(102);
    child.kill().unwrap();
    child.wait().unwrap();
    let mut want = lines("g", 0, 100);
    want.push(b"g 000100 half".to_vec());
    want.push(b"last".to_vec());
    assert_eq!(records(&out), want);
}

#[test]
fn a_disk_budget_pauses_reading_and_loses_nothing() {
    let d = tempfile::tempdir().unwrap();
    let (inp, wal, out) = (
        d.path().join("in.txt"),
        d.path().join("wal"),
        d.path().join("out"),
    );
    write_lines(&inp, &lines("b", 0, 20_000));
    let o = run_pipe(
        &inp,
        &wal,
        &out,
        &["--max-backlog-bytes", "64KiB", "--quiet"],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(records(&out), lines("b", 0, 20_000));
}

#[test]
fn dump_takes_ranges_a_count_and_one_segment() {
    let d = tempfile::tempdir().unwrap();
    let wal = d.path().join("wal");
    {
        let (w, _) = walsink::WalSink::open(
            &wal,
            walsink::Options::new("rng")
                .segment_size(16 << 10)
                .max_record_size(1024)
                .max_metadata_size(512),
        )
        .unwrap();
        for cp in 1..=6u64 {
            for i in 0..100 {
                w.append(format!("cp{cp} rec{i:03} {}", "y".repeat(40)).as_bytes())
                    .unwrap();
            }
            w.checkpoint(cp, b"").unwrap();
        }
    }
    let cps = |o: &std::process::Output| -> Vec<String> {
        stdout(o)
            .lines()
            .map(|l| l.split('\t').next().unwrap().to_string())
            .collect()
    };
    let o = walsink(&["dump", s(&wal), "--from", "2", "--to", "3"]);
    assert!(o.status.success());
    let got = cps(&o);
    assert_eq!(got.len(), 200);
    assert!(got.iter().all(|c| c == "2" || c == "3"));
    let o = walsink(&["dump", s(&wal), "-n", "5"]);
    assert_eq!(stdout(&o).lines().count(), 5);
    let segs = segments(&wal);
    assert!(segs.len() >= 3);
    let name = segs[1].file_name().unwrap().to_str().unwrap().to_string();
    let o = walsink(&["dump", s(&wal), "--segment", &name, "--json"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let rows: Vec<serde_json::Value> = stdout(&o)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert!(!rows.is_empty());
    // Every record shown is one of the log's, with its index in its epoch.
    for r in &rows {
        let text = r["data"]["text"].as_str().unwrap();
        if let (Some(cp), Some(i)) = (r["checkpoint"].as_u64(), r["index"].as_u64()) {
            assert!(text.starts_with(&format!("cp{cp} rec{i:03}")), "{r}");
        }
    }
    let o = walsink(&["dump", s(&wal), "--segment", "nonsense"]);
    assert_eq!(o.status.code(), Some(2));
}

/// A pipe killed while it created its log leaves the lock and the identity file before its
/// rename; the next run creates the log there instead of refusing the directory.
#[test]
fn a_log_whose_creation_was_killed_is_created_by_the_next_run() {
    let d = tempfile::tempdir().unwrap();
    let (inp, wal, out) = (
        d.path().join("in.txt"),
        d.path().join("wal"),
        d.path().join("out"),
    );
    write_lines(&inp, &lines("c", 0, 100));
    std::fs::create_dir(&wal).unwrap();
    std::fs::write(wal.join("LOCK"), b"").unwrap();
    std::fs::write(wal.join("WALSINK.tmp"), b"WSNKID\0\0 cut short").unwrap();
    let o = run_pipe(&inp, &wal, &out, &["--quiet"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(records(&out), lines("c", 0, 100));
    // Anything else in the directory is still refused.
    let other = d.path().join("other");
    std::fs::create_dir(&other).unwrap();
    std::fs::write(other.join("LOCK"), b"").unwrap();
    std::fs::write(other.join("notes.txt"), b"mine").unwrap();
    let o = run_pipe(&inp, &other, &d.path().join("out2"), &["--quiet"]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("not a walsink log"), "{}", stderr(&o));
}

/// A reader that went away (`walsink verify --json DIR | head`) ends a tool quietly: exit 0,
/// no panic, whatever the tool had left to print.
#[test]
fn tools_end_quietly_when_their_reader_goes_away() {
    let d = tempfile::tempdir().unwrap();
    let (inp, wal, out) = (
        d.path().join("in.txt"),
        d.path().join("wal"),
        d.path().join("out"),
    );
    write_lines(&inp, &lines("p", 0, 300));
    let o = run_pipe(&inp, &wal, &out, &["--checkpoint-every", "7"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let w = s(&wal);
    for args in [
        vec!["verify", "--json", w],
        vec!["verify", w],
        vec!["inspect", "--json", w],
        vec!["inspect", w],
        vec!["dump", w],
        vec!["repair", w],
        vec!["repair", "--json", w],
    ] {
        // The read end is closed before the tool starts: its first write fails with EPIPE.
        let (reader, writer) = std::io::pipe().unwrap();
        drop(reader);
        let o = Command::new(env!("CARGO_BIN_EXE_walsink"))
            .args(&args)
            .stdin(Stdio::null())
            .stdout(writer)
            .output()
            .unwrap();
        assert!(
            o.status.success() && !stderr(&o).contains("panicked"),
            "walsink {args:?} into a closed pipe: {:?}\n{}",
            o.status,
            stderr(&o)
        );
    }
}

#[test]
fn tools_say_when_a_path_does_not_exist() {
    let d = tempfile::tempdir().unwrap();
    let missing = d.path().join("no-such-log");
    for cmd in ["inspect", "dump", "verify", "repair"] {
        let o = walsink(&[cmd, s(&missing)]);
        assert_eq!(o.status.code(), Some(2), "{cmd}");
        let e = stderr(&o);
        assert!(
            e.contains("does not exist") && !e.contains("not a directory"),
            "{cmd}: {e}"
        );
    }
}

#[test]
fn repair_force_starts_its_segment_at_the_log_s_own_segment_size() {
    let d = tempfile::tempdir().unwrap();
    let wal = d.path().join("wal");
    {
        let opts = walsink::Options::new("small")
            .segment_size(4096)
            .max_record_size(512)
            .max_metadata_size(256);
        let (w, _) = walsink::WalSink::open(&wal, opts).unwrap();
        for cp in 1..=6u64 {
            for i in 0..20 {
                w.append(format!("cp{cp} rec{i:03} {}", "x".repeat(60)).as_bytes())
                    .unwrap();
            }
            w.checkpoint(cp, b"").unwrap();
        }
    }
    let before = segments(&wal);
    assert!(before.len() >= 3, "the log spans several segments");
    // Damage in the middle of the log: only `repair --force` cuts it.
    let seg = &before[1];
    let mut b = fs::read(seg).unwrap();
    let at = b.windows(3).position(|w| w == b"rec").unwrap();
    b[at] ^= 0x20;
    fs::write(seg, &b).unwrap();
    let o = walsink(&["repair", s(&wal), "--force"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let after = segments(&wal);
    assert!(!after.is_empty());
    for p in &after {
        let len = fs::metadata(p).unwrap().len();
        assert!(
            len <= 4096,
            "{} is {len} bytes in a log of 4 KiB segments",
            p.display()
        );
    }
    assert_eq!(walsink(&["verify", s(&wal)]).status.code(), Some(0));
}
