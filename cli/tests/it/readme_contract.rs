//! What README.md and `--help` promise a user, checked from them alone: exit codes on what
//! is not a log or is damaged, odd arguments that never panic, SIGKILL loops that deliver
//! exactly once, an unterminated last line shipped and continued, stdin, follow mode, a
//! changed input refused, a reused sink directory, `repair --force` then resume (also with a
//! damaged `COMMITTED`), a torn tail repaired, and a stdout reader that goes away.

use std::collections::BTreeMap;
use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_walsink");

struct Run {
    code: Option<i32>,
    out: String,
    err: String,
    timed_out: bool,
}

fn run_with(args: &[&str], stdin: Option<&[u8]>, timeout: Duration) -> Run {
    let mut c = Command::new(BIN)
        .args(args)
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    if let Some(data) = stdin {
        let mut si = c.stdin.take().unwrap();
        let data = data.to_vec();
        std::thread::spawn(move || {
            let _ = si.write_all(&data);
        });
    }
    use std::io::Read;
    let mut so = c.stdout.take().unwrap();
    let mut se = c.stderr.take().unwrap();
    let to = std::thread::spawn(move || {
        let mut v = vec![];
        let _ = so.read_to_end(&mut v);
        v
    });
    let te = std::thread::spawn(move || {
        let mut v = vec![];
        let _ = se.read_to_end(&mut v);
        v
    });
    let start = Instant::now();
    let mut timed_out = false;
    let status = loop {
        if let Some(st) = c.try_wait().unwrap() {
            break st;
        }
        if start.elapsed() > timeout {
            let _ = c.kill();
            timed_out = true;
            break c.wait().unwrap();
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    let o = Output {
        status,
        stdout: to.join().unwrap(),
        stderr: te.join().unwrap(),
    };
    Run {
        code: o.status.code(),
        out: String::from_utf8_lossy(&o.stdout).into(),
        err: String::from_utf8_lossy(&o.stderr).into(),
        timed_out,
    }
}

fn run(args: &[&str]) -> Run {
    run_with(args, None, Duration::from_secs(180))
}

fn s(p: &Path) -> String {
    p.to_str().unwrap().to_string()
}

fn write_lines(path: &Path, from: usize, to: usize) -> Vec<Vec<u8>> {
    let mut body = Vec::new();
    let mut v = vec![];
    for i in from..to {
        let l = format!("line {i:07} {}", "y".repeat(i % 23)).into_bytes();
        body.extend_from_slice(&l);
        body.push(b'\n');
        v.push(l);
    }
    fs::write(path, body).unwrap();
    v
}

fn append_lines(path: &Path, from: usize, to: usize) -> Vec<Vec<u8>> {
    let mut f = fs::OpenOptions::new().append(true).open(path).unwrap();
    let mut v = vec![];
    for i in from..to {
        let l = format!("line {i:07} {}", "y".repeat(i % 23)).into_bytes();
        f.write_all(&l).unwrap();
        f.write_all(b"\n").unwrap();
        v.push(l);
    }
    v
}

fn records(out: &Path) -> Vec<Vec<u8>> {
    if !out.exists() {
        return vec![];
    }
    walsink::DirSink::read_records(out).unwrap()
}

/// Each expected record exactly once, nothing else.
fn exactly_once(out: &Path, expect: &[Vec<u8>]) -> Result<(), String> {
    let got = records(out);
    let mut counts: BTreeMap<&[u8], i64> = BTreeMap::new();
    for r in &got {
        *counts.entry(r.as_slice()).or_default() += 1;
    }
    let mut missing = 0;
    let mut dup = 0;
    let mut first_missing = None;
    let mut first_dup = None;
    for e in expect {
        match counts.get(e.as_slice()).copied().unwrap_or(0) {
            0 => {
                missing += 1;
                first_missing.get_or_insert(String::from_utf8_lossy(e).to_string());
            }
            1 => {}
            n => {
                dup += n - 1;
                first_dup.get_or_insert(String::from_utf8_lossy(e).to_string());
            }
        }
    }
    let extra = got.len() as i64 - expect.len() as i64 + missing - dup;
    if missing == 0 && dup == 0 && extra == 0 {
        Ok(())
    } else {
        Err(format!(
            "target holds {} records for {} expected: {missing} missing (first {first_missing:?}), {dup} duplicated (first {first_dup:?}), {extra} unexpected",
            got.len(),
            expect.len()
        ))
    }
}

fn pipe(input: &str, wal: &Path, out: &Path, extra: &[&str]) -> Vec<String> {
    let mut v = vec![
        "pipe".to_string(),
        "--input".into(),
        input.to_string(),
        "--wal".into(),
        s(wal),
        "--sink".into(),
        format!("dir:{}", s(out)),
        "--quiet".into(),
    ];
    v.extend(extra.iter().map(|x| x.to_string()));
    v
}

fn refs(v: &[String]) -> Vec<&str> {
    v.iter().map(String::as_str).collect()
}

fn no_panic(r: &Run, what: &str) -> Result<(), String> {
    if r.code == Some(101) || r.err.contains("panicked") {
        return Err(format!(
            "{what}: PANIC exit {:?}: {}",
            r.code,
            r.err.lines().take(4).collect::<Vec<_>>().join(" | ")
        ));
    }
    if r.timed_out {
        return Err(format!("{what}: did not finish within the timeout"));
    }
    Ok(())
}

fn spawn(args: &[String]) -> Child {
    Command::new(BIN)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap()
}

fn flip_byte(path: &Path, at: usize) {
    let mut b = fs::read(path).unwrap();
    b[at] ^= 0xff;
    fs::write(path, b).unwrap();
}

fn segs(dir: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().map(|e| e == "wseg").unwrap_or(false))
        .collect();
    v.sort();
    v
}

// ------------------------------------------------------------------ exit codes

/// inspect/dump/verify/repair on paths that are not logs: exit 2, the path named, no panic,
/// nothing created (read-only commands on a non-log).
#[test]
fn cli_exit_codes_on_non_log_directories() {
    let t = tempfile::tempdir().unwrap();
    let missing = t.path().join("missing");
    let empty = t.path().join("empty");
    fs::create_dir(&empty).unwrap();
    let junk = t.path().join("junk");
    fs::create_dir(&junk).unwrap();
    fs::write(junk.join("notes.txt"), b"hello").unwrap();
    let file = t.path().join("plainfile");
    fs::write(&file, b"not a dir").unwrap();
    let mut failures = vec![];
    for cmd in ["inspect", "dump", "verify", "repair"] {
        for (name, p) in [
            ("missing", &missing),
            ("empty", &empty),
            ("junk", &junk),
            ("file", &file),
        ] {
            let r = run(&[cmd, &s(p)]);
            let what = format!("{cmd} {name}");
            if let Err(e) = no_panic(&r, &what) {
                failures.push(e);
                continue;
            }
            if r.code != Some(2) {
                failures.push(format!(
                    "{what}: exit {:?}, expected 2 (stderr: {})",
                    r.code,
                    r.err.trim()
                ));
            }
            if !r.err.contains(&s(p)) {
                failures.push(format!(
                    "{what}: stderr does not name the path: {}",
                    r.err.trim()
                ));
            }
        }
    }
    if missing.exists() {
        failures.push("a read-only command created the missing directory".into());
    }
    let left: Vec<_> = fs::read_dir(&empty)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    if !left.is_empty() {
        failures.push(format!(
            "read-only commands wrote into the empty directory: {left:?}"
        ));
    }
    let left: Vec<_> = fs::read_dir(&junk)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    if left.len() != 1 {
        failures.push(format!(
            "read-only commands wrote into the junk directory: {left:?}"
        ));
    }
    assert!(failures.is_empty(), "{failures:#?}");
}

/// A log corrupted in synced data: verify/inspect/dump exit 1, repair without --force does
/// not modify it and exits non-zero, repair --force exits 0, leaves *.damaged, verify then 0.
#[test]
fn cli_exit_codes_on_corrupted_log_and_repair() {
    let t = tempfile::tempdir().unwrap();
    let input = t.path().join("in.txt");
    let wal = t.path().join("wal");
    let out = t.path().join("out");
    write_lines(&input, 0, 3000);
    let r = run(&refs(&pipe(
        &s(&input),
        &wal,
        &out,
        &["--checkpoint-every", "100"],
    )));
    assert_eq!(r.code, Some(0), "{}", r.err);
    let sg = segs(&wal);
    // a data frame early in the first segment that holds data
    let target = sg.iter().find(|p| {
        fs::metadata(p).unwrap().len() > 0 && fs::read(p).unwrap()[40..200].iter().any(|&b| b != 0)
    });
    let Some(target) = target else {
        panic!("no segment with data left; segments {sg:?}");
    };
    flip_byte(target, 40 + 20);
    let mut failures = vec![];
    for cmd in ["verify", "inspect", "dump"] {
        let r = run(&[cmd, &s(&wal)]);
        if let Err(e) = no_panic(&r, cmd) {
            failures.push(e);
        } else if r.code != Some(1) {
            failures.push(format!(
                "{cmd} on corrupted log: exit {:?} expected 1; stderr {}",
                r.code,
                r.err.trim()
            ));
        }
    }
    let before: Vec<_> = segs(&wal)
        .iter()
        .map(|p| (p.clone(), fs::read(p).unwrap()))
        .collect();
    let r = run(&["repair", &s(&wal)]);
    if let Err(e) = no_panic(&r, "repair") {
        failures.push(e);
    }
    if r.code == Some(0) {
        failures.push(format!(
            "repair without --force on corruption exited 0: {}",
            r.out
        ));
    }
    let after: Vec<_> = segs(&wal)
        .iter()
        .map(|p| (p.clone(), fs::read(p).unwrap()))
        .collect();
    if before != after {
        failures.push("repair without --force changed segments".into());
    }
    let r = run(&["repair", &s(&wal), "--force"]);
    if r.code != Some(0) {
        failures.push(format!(
            "repair --force exit {:?}: {}",
            r.code,
            r.err.trim()
        ));
    }
    let damaged = fs::read_dir(&wal)
        .unwrap()
        .filter(|e| {
            e.as_ref()
                .unwrap()
                .file_name()
                .to_string_lossy()
                .ends_with(".damaged")
        })
        .count();
    if damaged == 0 {
        failures.push("repair --force left no *.damaged file".into());
    }
    let r = run(&["verify", &s(&wal)]);
    if r.code != Some(0) {
        failures.push(format!(
            "verify after repair --force: exit {:?} {} {}",
            r.code,
            r.out.trim(),
            r.err.trim()
        ));
    }
    assert!(failures.is_empty(), "{failures:#?}");
}

// ------------------------------------------------------------------ odd arguments

/// Odd argument values never panic (exit 101) and never hang.
#[test]
fn cli_odd_arguments_never_panic() {
    let t = tempfile::tempdir().unwrap();
    let input = t.path().join("in.txt");
    write_lines(&input, 0, 50);
    let mut failures = vec![];
    let long_id = "x".repeat(65);
    let pipe_extras: Vec<Vec<&str>> = vec![
        vec!["--checkpoint-every", "0"],
        vec!["--checkpoint-every", "18446744073709551615"],
        vec!["--checkpoint-every", "99999999999999999999999"],
        vec!["--checkpoint-every", "-1"],
        vec!["--checkpoint-every", ""],
        vec!["--checkpoint-interval", "0s"],
        vec!["--checkpoint-interval", "0"],
        vec!["--checkpoint-interval", ""],
        vec!["--checkpoint-interval", "1ns"],
        vec!["--checkpoint-interval", "18446744073709551615s"],
        vec!["--checkpoint-interval", "584942417355y"],
        vec!["--checkpoint-interval", "-1s"],
        vec!["--max-record-bytes", "0"],
        vec!["--max-record-bytes", "1"],
        vec!["--max-record-bytes", ""],
        vec!["--max-record-bytes", "2GiB"],
        vec!["--max-record-bytes", "18446744073709551615"],
        vec!["--max-record-bytes", "16EiB"],
        vec!["--max-record-bytes", "99999999999999999999TiB"],
        vec!["--max-backlog-bytes", "0"],
        vec!["--max-backlog-bytes", "1"],
        vec!["--max-backlog-bytes", "18446744073709551615"],
        vec!["--max-backlog-bytes", "17EiB"],
        vec!["--max-retries", "0"],
        vec!["--max-retries", "4294967296"],
        vec!["--retry-deadline", "0s"],
        vec!["--retry-deadline", "18446744073709551615s"],
        vec!["--retry-deadline", ""],
        vec!["--sink-id", ""],
        vec!["--sink-id", "a/b"],
        vec!["--sink-id", ".hidden"],
        vec!["--sink-id", &long_id],
        vec!["--sink-id", "ünïcode"],
        vec!["--json"],
    ];
    for (i, extra) in pipe_extras.iter().enumerate() {
        let wal = t.path().join(format!("wal{i}"));
        let out = t.path().join(format!("out{i}"));
        let args = pipe(&s(&input), &wal, &out, extra);
        let r = run_with(&refs(&args), None, Duration::from_secs(20));
        if let Err(e) = no_panic(&r, &format!("pipe {extra:?}")) {
            failures.push(e);
        }
    }
    let wal = t.path().join("walx");
    let outx = t.path().join("outx");
    let odd: Vec<Vec<String>> = vec![
        vec![
            "pipe".into(),
            "--input".into(),
            "".into(),
            "--wal".into(),
            s(&wal),
            "--sink".into(),
            format!("dir:{}", s(&outx)),
        ],
        vec![
            "pipe".into(),
            "--input".into(),
            s(&input),
            "--wal".into(),
            "".into(),
            "--sink".into(),
            format!("dir:{}", s(&outx)),
        ],
        vec![
            "pipe".into(),
            "--input".into(),
            s(&input),
            "--wal".into(),
            s(&wal),
            "--sink".into(),
            "".into(),
        ],
        vec![
            "pipe".into(),
            "--input".into(),
            s(&input),
            "--wal".into(),
            s(&wal),
            "--sink".into(),
            "dir:".into(),
        ],
        vec![
            "pipe".into(),
            "--input".into(),
            s(&input),
            "--wal".into(),
            s(&wal),
            "--sink".into(),
            "nope:x".into(),
        ],
        vec![
            "pipe".into(),
            "--input".into(),
            s(t.path()),
            "--wal".into(),
            t.path().join("w2").to_string_lossy().into(),
            "--sink".into(),
            "stdout".into(),
        ],
        vec![
            "pipe".into(),
            "--input".into(),
            "/dev/null".into(),
            "--wal".into(),
            t.path().join("w3").to_string_lossy().into(),
            "--sink".into(),
            "stdout".into(),
        ],
        vec![
            "pipe".into(),
            "--input".into(),
            s(&input),
            "--wal".into(),
            s(&input),
            "--sink".into(),
            "stdout".into(),
        ],
        vec![
            "pipe".into(),
            "--input".into(),
            s(&input),
            "--wal".into(),
            t.path().join("w4").to_string_lossy().into(),
            "--sink".into(),
            format!("dir:{}", s(&input)),
        ],
        vec![
            "pipe".into(),
            "--input".into(),
            s(&input),
            "--wal".into(),
            t.path().join("w5").to_string_lossy().into(),
            "--sink".into(),
            "stdout".into(),
            "--json".into(),
        ],
    ];
    for a in &odd {
        let r = run_with(&refs(a), None, Duration::from_secs(20));
        if let Err(e) = no_panic(&r, &format!("{a:?}")) {
            failures.push(e);
        }
    }
    // a valid log for dump/inspect args
    let lw = t.path().join("logw");
    let lo = t.path().join("logo");
    let r = run(&refs(&pipe(
        &s(&input),
        &lw,
        &lo,
        &["--checkpoint-every", "10"],
    )));
    assert_eq!(r.code, Some(0), "{}", r.err);
    let l = s(&lw);
    let others: Vec<Vec<&str>> = vec![
        vec!["dump", &l, "-n", "0"],
        vec!["dump", &l, "-n", "18446744073709551615"],
        vec!["dump", &l, "--checkpoint", "18446744073709551615"],
        vec!["dump", &l, "--checkpoint", "0"],
        vec!["dump", &l, "--from", "5", "--to", "2"],
        vec!["dump", &l, "--from", "18446744073709551615"],
        vec!["dump", &l, "--segment", ""],
        vec!["dump", &l, "--segment", "../../etc/passwd"],
        vec!["dump", &l, "--segment", "99999999999999999999"],
        vec!["dump", &l, "--segment", "18446744073709551615"],
        vec!["dump", &l, "--segment", "0"],
        vec!["dump", &l, "--segment", "LOCK"],
        vec!["dump", &l, "--segment", "WALSINK"],
        vec!["dump", &l, "--checkpoint", "3", "--from", "1"],
        vec!["dump", &l, "--json", "--segment", "1"],
        vec!["inspect", ""],
        vec!["verify", ""],
        vec!["dump", ""],
        vec!["repair", ""],
        vec!["repair", &l, "--committed", "5"],
        vec![
            "repair",
            &l,
            "--force",
            "--committed",
            "18446744073709551615",
        ],
        vec!["demo", "--records", "0", "--crashes", "0"],
        vec![
            "demo",
            "--records",
            "10",
            "--crashes",
            "0",
            "--checkpoint-every",
            "0",
        ],
        vec![
            "demo",
            "--records",
            "10",
            "--crashes",
            "1",
            "--kill-min-ms",
            "50",
            "--kill-max-ms",
            "10",
        ],
        vec![
            "demo",
            "--records",
            "10",
            "--crashes",
            "1",
            "--kill-min-ms",
            "0",
            "--kill-max-ms",
            "0",
        ],
        vec![
            "demo",
            "--records",
            "10",
            "--crashes",
            "1",
            "--kill-min-ms",
            "18446744073709551615",
            "--kill-max-ms",
            "18446744073709551615",
        ],
    ];
    for a in &others {
        let r = run_with(a, None, Duration::from_secs(30));
        if let Err(e) = no_panic(&r, &format!("{a:?}")) {
            failures.push(e);
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
}

// ------------------------------------------------------------------ pipe semantics

/// SIGKILL loop with small checkpoints and a time interval: every line exactly once.
#[test]
fn cli_pipe_sigkill_loop_exactly_once() {
    let t = tempfile::tempdir().unwrap();
    let input = t.path().join("in.txt");
    let wal = t.path().join("wal");
    let out = t.path().join("out");
    let expect = write_lines(&input, 0, 60_000);
    let args = pipe(
        &s(&input),
        &wal,
        &out,
        &["--checkpoint-every", "97", "--checkpoint-interval", "20ms"],
    );
    let mut rng = fastrand::Rng::with_seed(42);
    for _ in 0..10 {
        let mut c = spawn(&args);
        std::thread::sleep(Duration::from_millis(rng.u64(5..150)));
        let _ = c.kill();
        let _ = c.wait();
    }
    let r = run_with(&refs(&args), None, Duration::from_secs(60));
    assert_eq!(r.code, Some(0), "final run: {}", r.err);
    exactly_once(&out, &expect).unwrap();
    // re-running on a consumed input delivers nothing new
    let r = run(&refs(&args));
    assert_eq!(r.code, Some(0), "{}", r.err);
    exactly_once(&out, &expect).unwrap();
}

/// Unterminated last line: not shipped; once the file is continued the completed line is
/// shipped exactly once.
#[test]
fn cli_pipe_unterminated_last_line_then_continued() {
    let t = tempfile::tempdir().unwrap();
    let input = t.path().join("in.txt");
    let wal = t.path().join("wal");
    let out = t.path().join("out");
    fs::write(&input, b"a\nb\nc").unwrap();
    let args = pipe(&s(&input), &wal, &out, &[]);
    let r = run(&refs(&args));
    assert_eq!(r.code, Some(0), "{}", r.err);
    assert_eq!(records(&out), vec![b"a".to_vec(), b"b".to_vec()]);
    fs::write(&input, b"a\nb\ncd\ne\n").unwrap();
    let r = run(&refs(&args));
    assert_eq!(r.code, Some(0), "{}", r.err);
    assert_eq!(
        records(&out),
        vec![b"a".to_vec(), b"b".to_vec(), b"cd".to_vec(), b"e".to_vec()]
    );
}

/// --ship-final-line ships the unterminated line once; rerunning the same complete file does
/// not ship it again; a continued line is refused (exit 1).
#[test]
fn cli_pipe_ship_final_line_rerun_and_continued() {
    let t = tempfile::tempdir().unwrap();
    let input = t.path().join("in.txt");
    let wal = t.path().join("wal");
    let out = t.path().join("out");
    fs::write(&input, b"a\nb\nc").unwrap();
    let args = pipe(&s(&input), &wal, &out, &["--ship-final-line"]);
    let r = run(&refs(&args));
    assert_eq!(r.code, Some(0), "{}", r.err);
    assert_eq!(
        records(&out),
        vec![b"a".to_vec(), b"b".to_vec(), b"c".to_vec()]
    );
    let r = run(&refs(&args));
    assert_eq!(r.code, Some(0), "rerun: {}", r.err);
    assert_eq!(
        records(&out),
        vec![b"a".to_vec(), b"b".to_vec(), b"c".to_vec()],
        "rerun shipped again"
    );
    // without the flag, same file: nothing new either
    let r = run(&refs(&pipe(&s(&input), &wal, &out, &[])));
    assert!(
        r.code == Some(0),
        "rerun without flag: {:?} {}",
        r.code,
        r.err
    );
    assert_eq!(records(&out).len(), 3);
    fs::write(&input, b"a\nb\ncd\n").unwrap();
    let r = run(&refs(&args));
    assert_eq!(
        r.code,
        Some(1),
        "continued final line must be refused: {:?} {}",
        r.code,
        r.err
    );
    assert_eq!(records(&out).len(), 3);
}

/// Standard input: the last line counts without a newline; a log fed from stdin refuses a
/// file afterwards (exit 1).
#[test]
fn cli_pipe_stdin_then_file_refused() {
    let t = tempfile::tempdir().unwrap();
    let wal = t.path().join("wal");
    let out = t.path().join("out");
    let r = run_with(
        &refs(&pipe("-", &wal, &out, &["--checkpoint-every", "2"])),
        Some(b"x\ny\nz"),
        Duration::from_secs(20),
    );
    assert_eq!(r.code, Some(0), "{}", r.err);
    assert_eq!(
        records(&out),
        vec![b"x".to_vec(), b"y".to_vec(), b"z".to_vec()]
    );
    // second stdin run: new records appended exactly once
    let r = run_with(
        &refs(&pipe("-", &wal, &out, &[])),
        Some(b"p\nq\n"),
        Duration::from_secs(20),
    );
    assert_eq!(r.code, Some(0), "{}", r.err);
    assert_eq!(records(&out).len(), 5);
    let input = t.path().join("in.txt");
    write_lines(&input, 0, 10);
    let r = run(&refs(&pipe(&s(&input), &wal, &out, &[])));
    assert_eq!(r.code, Some(1), "file after stdin: {:?} {}", r.code, r.err);
    assert_eq!(records(&out).len(), 5);
    // empty stdin
    let r = run_with(
        &refs(&pipe("-", &wal, &out, &[])),
        Some(b""),
        Duration::from_secs(20),
    );
    assert_eq!(r.code, Some(0), "{}", r.err);
    assert_eq!(records(&out).len(), 5);
}

/// --follow: lines appended while it runs are delivered; after SIGTERM a rerun without
/// --follow completes with every line exactly once.
#[test]
// The child is waited for with try_wait in a bounded loop, and killed if it hangs.
#[allow(clippy::zombie_processes)]
fn cli_pipe_follow_then_resume() {
    let t = tempfile::tempdir().unwrap();
    let input = t.path().join("in.txt");
    let wal = t.path().join("wal");
    let out = t.path().join("out");
    let mut expect = write_lines(&input, 0, 100);
    let args = pipe(
        &s(&input),
        &wal,
        &out,
        &["--follow", "--checkpoint-interval", "50ms"],
    );
    let mut c = spawn(&args);
    let start = Instant::now();
    while records(&out).len() < 100 && start.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(
        records(&out).len(),
        100,
        "follow did not deliver the initial lines"
    );
    expect.extend(append_lines(&input, 100, 250));
    let start = Instant::now();
    while records(&out).len() < 250 && start.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(
        records(&out).len(),
        250,
        "follow did not deliver appended lines"
    );
    let _ = Command::new("kill")
        .args(["-TERM", &c.id().to_string()])
        .status();
    let start = Instant::now();
    let mut status = None;
    while start.elapsed() < Duration::from_secs(10) {
        if let Some(st) = c.try_wait().unwrap() {
            status = Some(st);
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    if status.is_none() {
        let _ = c.kill();
        let _ = c.wait();
        panic!("--follow did not stop on SIGTERM within 10 s");
    }
    expect.extend(append_lines(&input, 250, 400));
    let r = run(&refs(&pipe(&s(&input), &wal, &out, &[])));
    assert_eq!(r.code, Some(0), "{}", r.err);
    exactly_once(&out, &expect).unwrap();
}

/// A changed input (shorter / other bytes) is refused with exit 1 naming both sides.
#[test]
fn cli_pipe_changed_input_refused() {
    let t = tempfile::tempdir().unwrap();
    let input = t.path().join("in.txt");
    let wal = t.path().join("wal");
    let out = t.path().join("out");
    write_lines(&input, 0, 500);
    let args = pipe(&s(&input), &wal, &out, &["--checkpoint-every", "50"]);
    assert_eq!(run(&refs(&args)).code, Some(0));
    write_lines(&input, 0, 100);
    let r = run(&refs(&args));
    assert_eq!(r.code, Some(1), "shorter input: {:?} {}", r.code, r.err);
    assert!(
        r.err.contains(&s(&input)),
        "error does not name the input: {}",
        r.err
    );
    // same length, other bytes early on
    write_lines(&input, 0, 600);
    flip_byte(&input, 3);
    let r = run(&refs(&args));
    assert_eq!(r.code, Some(1), "changed bytes: {:?} {}", r.code, r.err);
    assert_eq!(records(&out).len(), 500);
}

/// A sink directory reused by a new log under the same sink id is refused; another sink id
/// delivers each line once.
#[test]
fn cli_pipe_reused_sink_directory() {
    let t = tempfile::tempdir().unwrap();
    let input = t.path().join("in.txt");
    let wal = t.path().join("wal");
    let out = t.path().join("out");
    let expect = write_lines(&input, 0, 300);
    assert_eq!(
        run(&refs(&pipe(
            &s(&input),
            &wal,
            &out,
            &["--checkpoint-every", "40"]
        )))
        .code,
        Some(0)
    );
    fs::remove_dir_all(&wal).unwrap();
    let r = run(&refs(&pipe(
        &s(&input),
        &wal,
        &out,
        &["--checkpoint-every", "40"],
    )));
    assert_eq!(r.code, Some(1), "reused target: {:?} {}", r.code, r.err);
    exactly_once(&out, &expect).unwrap();
    let wal2 = t.path().join("wal2");
    let r = run(&refs(&pipe(
        &s(&input),
        &wal2,
        &out,
        &["--sink-id", "other"],
    )));
    assert_eq!(r.code, Some(0), "{}", r.err);
    let got = records(&out);
    assert_eq!(got.len(), 600);
}

/// Corrupt the log after a complete run, repair --force, continue with more input: the
/// target holds every line exactly once.
#[test]
fn cli_repair_force_then_resume_exactly_once() {
    let t = tempfile::tempdir().unwrap();
    let input = t.path().join("in.txt");
    let wal = t.path().join("wal");
    let out = t.path().join("out");
    let mut expect = write_lines(&input, 0, 2000);
    let args = pipe(&s(&input), &wal, &out, &["--checkpoint-every", "100"]);
    assert_eq!(run(&refs(&args)).code, Some(0));
    let sg = segs(&wal);
    let target = sg
        .iter()
        .find(|p| fs::read(p).unwrap()[40..200].iter().any(|&b| b != 0))
        .cloned();
    let target = target.expect("a segment with frames");
    flip_byte(&target, 40 + 20);
    expect.extend(append_lines(&input, 2000, 2500));
    let r = run(&refs(&args));
    assert_ne!(
        r.code,
        Some(0),
        "pipe on a corrupted log went on: {}",
        r.err
    );
    assert_ne!(r.code, Some(101));
    let r = run(&["repair", &s(&wal), "--force"]);
    assert_eq!(r.code, Some(0), "{}", r.err);
    let r = run(&refs(&args));
    assert_eq!(r.code, Some(0), "{}", r.err);
    exactly_once(&out, &expect).unwrap();
}

/// As above, but COMMITTED is damaged too: repair --force rebuilds it from what the log
/// proves; the resumed pipe must still not lose or duplicate lines (README: resumes after
/// whichever is further on, the log or the target).
#[test]
fn cli_repair_force_with_damaged_committed_then_resume_exactly_once() {
    let t = tempfile::tempdir().unwrap();
    let input = t.path().join("in.txt");
    let wal = t.path().join("wal");
    let out = t.path().join("out");
    let mut expect = write_lines(&input, 0, 2000);
    let args = pipe(&s(&input), &wal, &out, &["--checkpoint-every", "100"]);
    assert_eq!(run(&refs(&args)).code, Some(0));
    let sg = segs(&wal);
    let target = sg
        .iter()
        .find(|p| fs::read(p).unwrap()[40..200].iter().any(|&b| b != 0))
        .cloned();
    flip_byte(&target.expect("a segment with frames"), 40 + 20);
    flip_byte(&wal.join("COMMITTED"), 10);
    expect.extend(append_lines(&input, 2000, 2500));
    let r = run(&["repair", &s(&wal), "--force"]);
    assert_eq!(r.code, Some(0), "{}", r.err);
    let r = run(&refs(&args));
    assert_eq!(r.code, Some(0), "{}", r.err);
    exactly_once(&out, &expect).unwrap();
}

/// SIGKILL loop where between runs the log is damaged at its tail (newest segment truncated
/// at a random offset): every run either resumes or refuses; after repair --force the
/// target holds each line exactly once.
#[test]
fn cli_pipe_kill_truncate_tail_repair_resume_exactly_once() {
    let t = tempfile::tempdir().unwrap();
    let input = t.path().join("in.txt");
    let wal = t.path().join("wal");
    let out = t.path().join("out");
    let expect = write_lines(&input, 0, 40_000);
    let args = pipe(&s(&input), &wal, &out, &["--checkpoint-every", "250"]);
    let mut rng = fastrand::Rng::with_seed(7);
    for _ in 0..5 {
        let mut c = spawn(&args);
        std::thread::sleep(Duration::from_millis(rng.u64(30..200)));
        let _ = c.kill();
        let _ = c.wait();
        if let Some(newest) = segs(&wal).last() {
            let b = fs::read(newest).unwrap();
            let end = b.iter().rposition(|&x| x != 0).map(|p| p + 1).unwrap_or(0);
            if end > 48 {
                let cut = rng.usize(40..end);
                fs::write(newest, &b[..cut]).unwrap();
            }
        }
        let r = run(&["repair", &s(&wal), "--force"]);
        assert!(r.code == Some(0), "repair --force: {:?} {}", r.code, r.err);
    }
    let r = run_with(&refs(&args), None, Duration::from_secs(60));
    assert_eq!(r.code, Some(0), "{}", r.err);
    exactly_once(&out, &expect).unwrap();
}

/// `--sink stdout` whose reader goes away (`| head`): exit 141, and the next run prints the
/// records not yet printed (nothing lost beyond what was already written into the pipe).
#[test]
fn cli_pipe_stdout_reader_goes_away_then_rerun_loses_nothing() {
    use std::io::{BufRead, BufReader};
    let t = tempfile::tempdir().unwrap();
    let input = t.path().join("in.txt");
    let wal = t.path().join("wal");
    let expect = write_lines(&input, 0, 200_000);
    let args = [
        "pipe",
        "--input",
        &s(&input),
        "--wal",
        &s(&wal),
        "--sink",
        "stdout",
        "--quiet",
        "--checkpoint-every",
        "1000",
    ];
    let mut c = Command::new(BIN)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut first = vec![];
    {
        let mut r = BufReader::new(c.stdout.take().unwrap());
        for _ in 0..5 {
            let mut l = String::new();
            r.read_line(&mut l).unwrap();
            first.push(l);
        }
        // everything the reader already received counts as printed
        let buf = String::from_utf8_lossy(r.buffer()).to_string();
        let mut parts: Vec<&str> = buf.split('\n').collect();
        parts.pop(); // partial last line
        for p in parts {
            first.push(format!("{p}\n"));
        }
    } // reader closed
    let start = Instant::now();
    let st = loop {
        if let Some(st) = c.try_wait().unwrap() {
            break Some(st);
        }
        if start.elapsed() > Duration::from_secs(20) {
            let _ = c.kill();
            break None;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let st = st.expect("pipe did not end after its stdout reader went away");
    assert_eq!(st.code(), Some(141), "exit after reader went away");
    let r = run_with(&args, None, Duration::from_secs(60));
    assert_eq!(r.code, Some(0), "{}", r.err);
    let mut seen: std::collections::BTreeSet<String> = first
        .iter()
        .map(|l| l.strip_suffix("\n").unwrap_or(l).to_string())
        .collect();
    for l in r.out.lines() {
        seen.insert(l.to_string());
    }
    let missing_all: Vec<_> = expect
        .iter()
        .map(|e| String::from_utf8_lossy(e).to_string())
        .filter(|e| !seen.contains(e))
        .collect();
    eprintln!(
        "missing {} records: first {:?} last {:?}",
        missing_all.len(),
        missing_all.first(),
        missing_all.last()
    );
    // Lines already written into the kernel pipe buffer when the reader went away count as
    // printed (no writer can tell); anything beyond one pipe buffer (64 KiB) is a real loss.
    let missing_bytes: usize = missing_all.iter().map(|l| l.len() + 1).sum();
    assert!(
        missing_bytes <= 65536,
        "{} records ({missing_bytes} bytes) lost after the stdout reader went away, more than a pipe buffer: first {:?}",
        missing_all.len(), missing_all.first()
    );
}
