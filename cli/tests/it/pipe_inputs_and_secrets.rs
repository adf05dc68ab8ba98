//! What `walsink pipe` does with awkward inputs and secrets, as the README and the target
//! docs promise: a password holding URL delimiters, or read from a file or the environment,
//! never appears in output or files; a long line is named by its own line number; a smaller
//! record limit on a rerun never loses logged records; CRLF, binary and empty lines arrive
//! byte for byte; a stdin closed early ships what was written; a second input into the same
//! target is refused or kept apart; an input edited before the offset is refused after a
//! kill.

use crate::common::*;
use std::fs;
use std::io::Write;
use std::path::Path;
use std::process::{Command, Stdio};

fn run(args: &[String]) -> std::process::Output {
    let refs: Vec<&str> = args.iter().map(String::as_str).collect();
    walsink(&refs)
}

/// Every byte of every file under `dir`, for a search.
fn all_bytes(dir: &Path) -> Vec<u8> {
    let mut out = Vec::new();
    if let Ok(rd) = fs::read_dir(dir) {
        for e in rd.flatten() {
            let p = e.path();
            if p.is_dir() {
                out.extend(all_bytes(&p));
            } else if let Ok(b) = fs::read(&p) {
                out.extend(b);
            }
        }
    }
    out
}

fn contains(hay: &[u8], needle: &[u8]) -> bool {
    hay.windows(needle.len()).any(|w| w == needle)
}

/// README: "Passwords and tokens in a URL never appear in messages, logs or files." A
/// generated password often holds `#`, `?` or `/`; the user may not percent-encode it.
#[test]
fn a_password_holding_url_delimiters_never_appears() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("in.txt");
    write_lines(&input, &lines("pw", 0, 3));
    let mut leaks = Vec::new();
    let urls = [
        "http://alice:PW#SECRETtail@127.0.0.1:9/in",
        "http://alice:PW?SECRETtail@127.0.0.1:9/in",
        "http://alice:PW/SECRETtail@127.0.0.1:9/in",
        "postgres://alice:PW#SECRETtail@127.0.0.1:9/test?table=t",
        "postgres://alice:PW?SECRETtail@127.0.0.1:9/test?table=t",
        "postgres://alice:PW/SECRETtail@127.0.0.1:9/test?table=t",
        "nats://alice:PW#SECRETtail@127.0.0.1:9/?stream=s&subject=x",
        "nats://alice:PW/SECRETtail@127.0.0.1:9/?stream=s&subject=x",
        "redis://alice:PW#SECRETtail@127.0.0.1:9/0?key=probe2:x",
        "redis://alice:PW/SECRETtail@127.0.0.1:9/0?key=probe2:x",
        "rediss://alice:PW#SECRETtail@127.0.0.1:9/0?key=probe2:x",
        "rediss://alice:PW/SECRETtail@127.0.0.1:9/0?key=probe2:x",
    ];
    // The password kept out of the URL: in a file, or in the environment.
    let pw_file = dir.path().join("redis-password");
    fs::write(&pw_file, "PW#SECRETtail/?&\n").unwrap();
    std::env::set_var("WALSINK_PROBE2_REDIS_PW", "PW#SECRETtail/?&");
    let mut urls: Vec<String> = urls.iter().map(|u| u.to_string()).collect();
    for scheme in ["redis", "rediss"] {
        urls.push(format!(
            "{scheme}://alice@127.0.0.1:9/0?key=probe2:x&password_file={}",
            pw_file.display()
        ));
        urls.push(format!(
            "{scheme}://127.0.0.1:9/0?key=probe2:x&password_env=WALSINK_PROBE2_REDIS_PW"
        ));
    }
    for (i, url) in urls.iter().enumerate() {
        let wal = dir.path().join(format!("wal{i}"));
        for args in [
            pipe_args_to(
                &input,
                &wal,
                url,
                &["--json", "--retry-deadline", "1s", "--max-retries", "1"],
            ),
            vec![
                "inspect".into(),
                s(&wal).into(),
                "--sink".into(),
                url.to_string(),
                "--json".into(),
            ],
        ] {
            let o = run(&args);
            let text = format!("{}{}", stdout(&o), stderr(&o));
            if text.contains("SECRETtail") {
                leaks.push(format!("{} {url}: {text}", args[0]));
            }
        }
        if contains(&all_bytes(&wal), b"SECRETtail") {
            leaks.push(format!("files of {url}"));
        }
    }
    // The other ways in (issue 34): a file or an environment variable named in the URL.
    let secret_file = dir.path().join("secret");
    fs::write(&secret_file, "PW#SECRETtail+/x\n").unwrap();
    let f = secret_file.display();
    let var = "WALSINK_PROBE2_SECRET";
    let ways = [
        format!("nats://alice@127.0.0.1:9/?stream=s&subject=x&password_file={f}"),
        format!("nats://alice@127.0.0.1:9/?stream=s&subject=x&password_env={var}"),
        format!("nats://127.0.0.1:9/?stream=s&subject=x&token_file={f}"),
        format!("tls://127.0.0.1:9/?stream=s&subject=x&token_env={var}"),
        format!("http://127.0.0.1:9/in?bearer_file={f}"),
        format!("http://alice@127.0.0.1:9/in?password_env={var}"),
        format!("https://alice@127.0.0.1:9/in?password_file={f}"),
    ];
    for (i, url) in ways.iter().enumerate() {
        let wal = dir.path().join(format!("wal-way{i}"));
        let args = pipe_args_to(
            &input,
            &wal,
            url,
            &["--json", "--retry-deadline", "1s", "--max-retries", "1"],
        );
        let o = Command::new(env!("CARGO_BIN_EXE_walsink"))
            .args(&args)
            .env(var, "PW#SECRETtail+/x")
            .stdin(Stdio::null())
            .output()
            .unwrap();
        let text = format!("{}{}", stdout(&o), stderr(&o));
        if text.contains("SECRETtail") {
            leaks.push(format!("pipe {url}: {text}"));
        }
        if contains(&all_bytes(&wal), b"SECRETtail") {
            leaks.push(format!("files of {url}"));
        }
    }
    assert!(leaks.is_empty(), "{leaks:#?}");
}

/// The same for the PostgreSQL target's other ways in for a password (docs/targets/postgres.md,
/// "Passwords"): `password_file=`, `password_env=`, `PGPASSWORD` and the password file
/// (`PGPASSFILE`, `passfile=`). Nothing listens on the port, so every run fails; the password
/// must show in none of its outputs or files.
#[test]
fn a_postgres_password_from_a_file_or_the_environment_never_appears() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("in.txt");
    write_lines(&input, &lines("pw", 0, 3));
    let secret = "PW#SECRETtail";
    let pwfile = dir.path().join("pw");
    fs::write(&pwfile, format!("{secret}\n")).unwrap();
    let pgpass = dir.path().join("pgpass");
    fs::write(&pgpass, format!("*:*:*:*:{secret}\n")).unwrap();
    fs::set_permissions(&pgpass, fs::Permissions::from_mode(0o600)).unwrap();
    let base = "postgres://alice@127.0.0.1:9/test?table=t";
    let cases: Vec<(String, Vec<(&str, String)>)> = vec![
        (format!("{base}&password_file={}", s(&pwfile)), vec![]),
        (
            format!("{base}&password_env=WALSINK_PROBE_PW"),
            vec![("WALSINK_PROBE_PW", secret.to_string())],
        ),
        (base.to_string(), vec![("PGPASSWORD", secret.to_string())]),
        (
            base.to_string(),
            vec![("PGPASSFILE", s(&pgpass).to_string())],
        ),
        (format!("{base}&passfile={}", s(&pgpass)), vec![]),
    ];
    let mut leaks = Vec::new();
    for (i, (url, env)) in cases.iter().enumerate() {
        let wal = dir.path().join(format!("wal{i}"));
        for args in [
            pipe_args_to(
                &input,
                &wal,
                url,
                &["--json", "--retry-deadline", "1s", "--max-retries", "1"],
            ),
            vec![
                "inspect".into(),
                s(&wal).into(),
                "--sink".into(),
                url.to_string(),
                "--json".into(),
            ],
        ] {
            let mut c = Command::new(env!("CARGO_BIN_EXE_walsink"));
            c.args(&args)
                .stdin(Stdio::null())
                .env_remove("PGPASSWORD")
                .env_remove("PGPASSFILE")
                .env("RUST_LOG", "trace");
            for (k, v) in env {
                c.env(k, v);
            }
            let o = c.output().unwrap();
            assert_ne!(o.status.code(), Some(0), "{url} {env:?}: nothing listens");
            let text = format!("{}{}", stdout(&o), stderr(&o));
            if text.contains("SECRETtail") {
                leaks.push(format!("{} {url} {env:?}: {text}", args[0]));
            }
        }
        if contains(&all_bytes(&wal), b"SECRETtail") {
            leaks.push(format!("files of {url} {env:?}"));
        }
    }
    assert!(leaks.is_empty(), "{leaks:#?}");
}

/// README: "A line longer than --max-record-bytes stops the run naming its line number."
#[test]
fn a_long_line_is_named_by_its_own_line_number() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("in.txt");
    let mut body = Vec::new();
    for i in 0..5 {
        body.extend_from_slice(format!("short {i}\n").as_bytes());
    }
    body.extend_from_slice(&vec![b'L'; 3000]); // line 6
    body.push(b'\n');
    body.extend_from_slice(b"after\n");
    fs::write(&input, &body).unwrap();
    let (wal, out) = (dir.path().join("wal"), dir.path().join("out"));
    let o = run_pipe(&input, &wal, &out, &["--max-record-bytes", "1KiB"]);
    let err = stderr(&o);
    assert_ne!(o.status.code(), Some(0), "{err}");
    assert!(err.contains("line 6"), "{err}");
    assert!(!err.contains("panicked"), "{err}");
    // Raised, the same command continues and every line arrives once.
    let o = run_pipe(&input, &wal, &out, &["--max-record-bytes", "4KiB"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let want: Vec<Vec<u8>> = body[..body.len() - 1]
        .split(|&b| b == b'\n')
        .map(<[u8]>::to_vec)
        .collect();
    assert_eq!(records(&out), want);
}

/// Records kept in the log by a failed run, then a re-run with a smaller
/// `--max-record-bytes`: every record delivered once, or a refusal; never a silent loss.
#[test]
fn a_smaller_record_limit_on_rerun_never_loses_logged_records() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("in.txt");
    let mut want = lines("s", 0, 20);
    want[7] = vec![b'B'; 5000];
    write_lines(&input, &want);
    let wal = dir.path().join("wal");
    // A receiver that answers every request 503: the run gives up, the records stay in the
    // log.
    let port = unavailable_http_port();
    let o = run(&pipe_args_to(
        &input,
        &wal,
        &format!("http://127.0.0.1:{port}/in?timeout=200ms&retries=0"),
        &["--retry-deadline", "1s", "--checkpoint-every", "5"],
    ));
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    let out = dir.path().join("out");
    let o = run_pipe(
        &input,
        &wal,
        &out,
        &["--max-record-bytes", "1KiB", "--checkpoint-every", "5"],
    );
    let got = records(&out);
    if o.status.code() == Some(0) {
        assert_eq!(got, want, "{}", stderr(&o));
    } else {
        // A refusal: it must say why; nothing may be half-delivered silently.
        let err = stderr(&o);
        assert!(!err.contains("panicked"), "{err}");
        let o2 = run_pipe(&input, &wal, &out, &["--checkpoint-every", "5"]);
        assert_eq!(o2.status.code(), Some(0), "{}", stderr(&o2));
        assert_eq!(records(&out), want, "after {err}");
    }
}

/// Hostile inputs through `dir:`: CR before newlines, NUL and invalid UTF-8, empty lines,
/// a file of only newlines; each line once, bytes as they were.
#[test]
fn crlf_binary_and_empty_lines_arrive_byte_for_byte() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("in.bin");
    let want: Vec<Vec<u8>> = vec![
        b"crlf\r".to_vec(),
        b"".to_vec(),
        vec![0, 1, 2, 0xff, 0xfe],
        b"\r".to_vec(),
        "ünïcödé".as_bytes().to_vec(),
        b"".to_vec(),
        b"tab\there".to_vec(),
        b"\\.".to_vec(),
    ];
    write_lines(&input, &want);
    let (wal, out) = (dir.path().join("wal"), dir.path().join("out"));
    let o = run_pipe(&input, &wal, &out, &["--checkpoint-every", "3"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert_eq!(records(&out), want);
    // An empty input: nothing, exit 0, and it stays so on a re-run.
    let empty = dir.path().join("empty.txt");
    fs::write(&empty, b"").unwrap();
    let (wal2, out2) = (dir.path().join("wal2"), dir.path().join("out2"));
    for _ in 0..2 {
        let o = run_pipe(&empty, &wal2, &out2, &[]);
        assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
        assert!(records(&out2).is_empty());
    }
}

/// README: "At the end of the stream the last line is a record even without a newline."
/// A writer that dies in the middle of its output.
#[test]
fn stdin_closed_early_ships_what_was_written() {
    let dir = tempfile::tempdir().unwrap();
    let (wal, out) = (dir.path().join("wal"), dir.path().join("out"));
    let mut child = Command::new(env!("CARGO_BIN_EXE_walsink"))
        .args([
            "pipe",
            "--input",
            "-",
            "--wal",
            s(&wal),
            "--sink",
            &format!("dir:{}", out.display()),
            "--checkpoint-every",
            "7",
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut w = child.stdin.take().unwrap();
    let mut want = lines("in", 0, 50);
    for l in &want {
        w.write_all(l).unwrap();
        w.write_all(b"\n").unwrap();
    }
    w.write_all(b"half a li").unwrap();
    drop(w);
    let o = child.wait_with_output().unwrap();
    assert_eq!(
        o.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    want.push(b"half a li".to_vec());
    assert_eq!(records(&out), want);
}

/// The same sink directory and sink id, a second input file with a log of its own: refused
/// (README: "a sink directory that holds another log's commits under the same sink id …
/// is refused"); with its own sink id both arrive, each once.
#[test]
fn a_second_input_into_the_same_target_is_refused_or_kept_apart() {
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = (dir.path().join("a.txt"), dir.path().join("b.txt"));
    let (la, lb) = (lines("a", 0, 30), lines("b", 0, 30));
    write_lines(&a, &la);
    write_lines(&b, &lb);
    let out = dir.path().join("out");
    let o = run_pipe(
        &a,
        &dir.path().join("wa"),
        &out,
        &["--checkpoint-every", "10"],
    );
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let o = run_pipe(
        &b,
        &dir.path().join("wb"),
        &out,
        &["--checkpoint-every", "10"],
    );
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert_eq!(records(&out), la);
    // The same log with the other file: refused naming both.
    let o = run_pipe(
        &b,
        &dir.path().join("wa"),
        &out,
        &["--checkpoint-every", "10"],
    );
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    let err = stderr(&o);
    assert!(err.contains("a.txt") && err.contains("b.txt"), "{err}");
    assert_eq!(records(&out), la);
}

/// Lines inserted before the consumed offset, or the file cut below it, between runs:
/// refused; the target keeps what it had, once.
#[test]
fn an_input_edited_before_the_offset_is_refused_after_a_kill() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("in.txt");
    let all = lines("e", 0, 200_000);
    write_lines(&input, &all);
    let (wal, out) = (dir.path().join("wal"), dir.path().join("out"));
    // Killed somewhere in the middle.
    let (ended, _) = kill_loop(&input, &wal, &out, &["--checkpoint-every", "5000"], 1, 7);
    let _ = ended;
    let got = records(&out);
    assert_in_order_once(&got, &all);
    if got.is_empty() || got.len() == all.len() {
        return; // nothing to edit before: the kill landed at an end
    }
    // Insert a line at the start.
    let mut edited = vec![b"intruder".to_vec()];
    edited.extend(all.iter().cloned());
    write_lines(&input, &edited);
    let o = run_pipe(&input, &wal, &out, &["--checkpoint-every", "5000"]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(!records(&out).iter().any(|r| r == b"intruder"));
    // Cut the file to its first line.
    write_lines(&input, &all[..1]);
    let o = run_pipe(&input, &wal, &out, &["--checkpoint-every", "5000"]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    // Put it back: the run completes with every line once.
    write_lines(&input, &all);
    let o = run_pipe(&input, &wal, &out, &["--checkpoint-every", "5000"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert_eq!(records(&out), all);
}
