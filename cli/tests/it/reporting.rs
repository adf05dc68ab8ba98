//! What a run tells while it runs and when it fails: one-line progress reports on a stderr
//! that is not a terminal (silenced by `--quiet`), a line while the target fails and is
//! retried (redacted), log events of walsink on stderr as text or JSON under `RUST_LOG`, a
//! JSON error object on stdout for `--json` runs that fail, and `pipe --help` naming every
//! target.

use crate::common::*;
use std::time::Duration;

/// A `--follow` run with stderr on a pipe prints a progress line every
/// `--progress-interval`; with `--quiet` it prints none.
#[test]
fn progress_lines_on_a_non_terminal_stderr_and_quiet_silences_them() {
    for quiet in [false, true] {
        let d = tempfile::tempdir().unwrap();
        let (inp, wal, out) = (
            d.path().join("in.txt"),
            d.path().join("wal"),
            d.path().join("out"),
        );
        write_lines(&inp, &lines("p", 0, 3000));
        let mut extra = vec!["--follow", "--progress-interval", "200ms"];
        if quiet {
            extra.push("--quiet");
        }
        let mut child = spawn_piped(&pipe_args(&inp, &wal, &out, &extra), &[]);
        let err = collect_stderr(&mut child);
        std::thread::sleep(Duration::from_millis(1500));
        signal(&child, "TERM");
        let st = wait_exit(&mut child, Duration::from_secs(30), "follow run");
        std::thread::sleep(Duration::from_millis(50));
        let err = err.lock().unwrap().clone();
        assert_eq!(st.code(), Some(3), "{err:?}");
        let progress: Vec<&String> = err
            .iter()
            .filter(|l| l.starts_with("pipe: read "))
            .collect();
        if quiet {
            assert!(progress.is_empty(), "--quiet printed {progress:?}");
        } else {
            assert!(progress.len() >= 3, "too few progress lines: {err:?}");
            let last = progress.last().unwrap();
            assert!(
                last.contains("read 3000 records") && last.contains("delivered 3000 records"),
                "the report counts what was read and delivered: {last}"
            );
        }
        assert_eq!(records(&out).len(), 3000);
    }
}

/// A target that answers every request 503: a line says delivery is failing (class, attempt,
/// message) while it retries, without the URL's password; the run gives up after
/// `--retry-deadline` with exit 2.
#[test]
fn a_failing_target_shows_a_retry_line_without_its_password() {
    let d = tempfile::tempdir().unwrap();
    let (inp, wal) = (d.path().join("in.txt"), d.path().join("wal"));
    write_lines(&inp, &lines("r", 0, 50));
    let sink = format!(
        "http://walsink:s3cr3tpw@127.0.0.1:{}/in",
        unavailable_http_port()
    );
    let args = pipe_args_to(&inp, &wal, &sink, &["--retry-deadline", "3s"]);
    let o = walsink(&args.iter().map(String::as_str).collect::<Vec<_>>());
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(2), "{err}");
    let line = err
        .lines()
        .find(|l| l.contains("delivery is failing"))
        .unwrap_or_else(|| panic!("no retry line: {err}"));
    assert!(
        line.contains("retryable error 503, attempt"),
        "the class and the receiver's status: {line}"
    );
    assert!(!err.contains("s3cr3tpw"), "password shown: {err}");
}

/// The same over `rediss://` with the password in a file (`password_file=`) and in the URL:
/// a private TLS redis-server that refuses every write (`maxmemory 1`: `OOM`, retryable)
/// gives a retry line, and the password shows nowhere: not on stderr, stdout or in the log.
#[test]
#[cfg_attr(not(servers), ignore = "needs WALSINK_TEST_SERVERS=1 and redis-server")]
fn a_failing_redis_target_shows_a_retry_line_without_its_password() {
    use walsink_kit::testkit::{TestCa, Validity};
    use walsink_redis::testkit::{Server, ServerTls};
    let d = tempfile::tempdir().unwrap();
    let inp = d.path().join("in.txt");
    write_lines(&inp, &lines("r", 0, 50));
    let ca = TestCa::new(d.path(), "ca").unwrap();
    let cert = ca
        .server("server", &["localhost"], Validity::Current)
        .unwrap();
    let tls = ServerTls {
        cert: cert.cert,
        key: cert.key,
        ca: ca.ca_file(),
        auth_clients: false,
    };
    let pw = "s3cr3t+pw";
    let server = Server::start(
        Some(&tls),
        &[
            "--requirepass",
            pw,
            "--maxmemory",
            "1",
            "--maxmemory-policy",
            "noeviction",
        ],
    )
    .unwrap();
    let pw_file = d.path().join("password");
    std::fs::write(&pw_file, format!("{pw}\n")).unwrap();
    let port = server.tls_port().unwrap();
    let ca_file = ca.ca_file();
    for (i, sink) in [
        format!(
            "rediss://localhost:{port}/0?key=report:a&ca_file={}&password_file={}",
            ca_file.display(),
            pw_file.display()
        ),
        format!(
            "rediss://:s3cr3t%2Bpw@localhost:{port}/0?key=report:b&ca_file={}",
            ca_file.display()
        ),
    ]
    .iter()
    .enumerate()
    {
        let wal = d.path().join(format!("wal{i}"));
        let args = pipe_args_to(&inp, &wal, sink, &["--retry-deadline", "3s"]);
        let o = walsink(&args.iter().map(String::as_str).collect::<Vec<_>>());
        let err = stderr(&o);
        assert_eq!(o.status.code(), Some(2), "{sink}: {err}");
        let line = err
            .lines()
            .find(|l| l.contains("delivery is failing"))
            .unwrap_or_else(|| panic!("no retry line: {err}"));
        assert!(
            line.contains("retryable error OOM, attempt") && line.contains("OOM"),
            "{line}"
        );
        assert!(
            !err.contains("s3cr3t") && !stdout(&o).contains("s3cr3t"),
            "password shown: {err}"
        );
        let mut files = Vec::new();
        for e in std::fs::read_dir(&wal).unwrap().flatten() {
            files.extend(std::fs::read(e.path()).unwrap_or_default());
        }
        assert!(
            !files.windows(6).any(|w| w == b"s3cr3t"),
            "password in the log's files"
        );
    }
}

/// The same with the password or token from a file or the environment (issue 34): the run
/// fails visibly and never shows it.
#[test]
fn a_failing_target_with_a_secret_from_a_file_or_the_environment_never_shows_it() {
    let d = tempfile::tempdir().unwrap();
    let inp = d.path().join("in.txt");
    write_lines(&inp, &lines("r", 0, 50));
    let pw = d.path().join("pw");
    std::fs::write(&pw, "s3cr3tpw").unwrap();
    let port = unavailable_http_port();
    for (i, sink) in [
        format!(
            "nats://walsink@127.0.0.1:{port}/?stream=s&subject=x&password_file={}",
            pw.display()
        ),
        format!("tls://127.0.0.1:{port}/?stream=s&subject=x&token_env=WALSINK_REPORTING_PW"),
        format!("http://127.0.0.1:{port}/in?bearer_file={}", pw.display()),
        format!("http://walsink@127.0.0.1:{port}/in?password_env=WALSINK_REPORTING_PW"),
    ]
    .iter()
    .enumerate()
    {
        let wal = d.path().join(format!("wal{i}"));
        let args = pipe_args_to(&inp, &wal, sink, &["--retry-deadline", "3s"]);
        let o = std::process::Command::new(env!("CARGO_BIN_EXE_walsink"))
            .args(&args)
            .env("WALSINK_REPORTING_PW", "s3cr3tpw")
            .stdin(std::process::Stdio::null())
            .output()
            .unwrap();
        let err = stderr(&o);
        assert_eq!(o.status.code(), Some(2), "{sink}: {err}");
        assert!(!err.is_empty(), "{sink}: the failure shows");
        assert!(!err.contains("s3cr3tpw"), "{sink}: password shown: {err}");
    }
}

/// The core's promised warning on a failed delivery ("delivery failed; retrying") shows on
/// stderr by default as a readable line, as one JSON object per line with `--log-format
/// json`, and not with `RUST_LOG=error`.
#[test]
fn warnings_show_as_text_or_json_and_rust_log_filters_them() {
    let d = tempfile::tempdir().unwrap();
    let (inp, wal) = (d.path().join("in.txt"), d.path().join("wal"));
    write_lines(&inp, &lines("w", 0, 10));
    let sink = format!("http://127.0.0.1:{}/in", unavailable_http_port());
    let run = |fmt: &str, rust_log: Option<&str>| {
        let mut args = pipe_args_to(&inp, &wal, &sink, &["--retry-deadline", "1s", "--quiet"]);
        args.extend(["--log-format".to_string(), fmt.to_string()]);
        let mut c = std::process::Command::new(env!("CARGO_BIN_EXE_walsink"));
        c.args(&args).env_remove("RUST_LOG");
        if let Some(v) = rust_log {
            c.env("RUST_LOG", v);
        }
        let o = c.output().unwrap();
        assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
        stderr(&o)
    };
    let text = run("text", None);
    let line = text
        .lines()
        .find(|l| l.contains("delivery failed; retrying"))
        .unwrap_or_else(|| panic!("no warning by default: {text}"));
    assert!(line.contains("WARN"), "{line}");
    let text = run("text", Some("warn"));
    assert!(text.contains("delivery failed; retrying"), "{text}");
    let json = run("json", None);
    let event = json
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .find(|v| v["fields"]["message"] == "delivery failed; retrying")
        .unwrap_or_else(|| panic!("no JSON warning: {json}"));
    assert_eq!(event["level"], "WARN", "{event}");
    assert!(event["fields"]["error"].is_string(), "{event}");
    let quiet = run("text", Some("error"));
    assert!(!quiet.contains("delivery failed"), "{quiet}");
}

/// `--json` runs that fail print one error object of a stable shape on stdout: a usage
/// error (exit 2), a refusal (exit 1), a target given up on (exit 2, in the summary), and a
/// tool's error (`verify --json` of what is not a log).
#[test]
fn failed_json_runs_print_an_error_object() {
    let d = tempfile::tempdir().unwrap();
    let (inp, wal, out) = (
        d.path().join("in.txt"),
        d.path().join("wal"),
        d.path().join("out"),
    );
    let one = |o: &std::process::Output| -> serde_json::Value {
        let v: serde_json::Value = serde_json::from_slice(&o.stdout)
            .unwrap_or_else(|e| panic!("stdout is not one JSON object ({e}): {:?}", stdout(o)));
        assert_eq!(
            Some(v["exit_code"].as_i64().unwrap() as i32),
            o.status.code(),
            "{v}"
        );
        assert!(
            v["error"]["message"]
                .as_str()
                .is_some_and(|m| !m.is_empty()),
            "{v}"
        );
        assert!(v["error"]["causes"].is_array(), "{v}");
        v
    };
    // Usage: the input is missing.
    let o = run_pipe(&inp, &wal, &out, &["--json"]);
    assert_eq!(o.status.code(), Some(2));
    let v = one(&o);
    assert_eq!(v["outcome"], "error", "{v}");
    assert_eq!(v["error"]["kind"], "error", "{v}");
    assert!(
        v["error"]["message"].as_str().unwrap().contains("in.txt"),
        "{v}"
    );
    // Refused: the input changed under the log.
    write_lines(&inp, &lines("j", 0, 20));
    assert!(run_pipe(&inp, &wal, &out, &[]).status.success());
    write_lines(&inp, &lines("k", 0, 20));
    let o = run_pipe(&inp, &wal, &out, &["--json"]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    let v = one(&o);
    assert_eq!(v["error"]["kind"], "refused", "{v}");
    // Given up: the summary is the one object, with its error.
    let wal2 = d.path().join("wal2");
    let sink = format!("http://127.0.0.1:{}/in", unavailable_http_port());
    let args = pipe_args_to(&inp, &wal2, &sink, &["--json", "--retry-deadline", "1s"]);
    let o = walsink(&args.iter().map(String::as_str).collect::<Vec<_>>());
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    let v = one(&o);
    assert_eq!(v["outcome"], "gave_up", "{v}");
    assert_eq!(v["error"]["kind"], "gave_up", "{v}");
    // A tool.
    let o = walsink(&["verify", s(d.path()), "--json"]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert_eq!(one(&o)["outcome"], "error");
}

/// `pipe --help` names every target this build has, URL schemes included.
#[test]
fn pipe_help_lists_every_target() {
    let o = walsink(&["pipe", "--help"]);
    assert!(o.status.success());
    let h = stdout(&o);
    for t in [
        "dir:PATH",
        "stdout",
        "postgres://",
        "http://",
        "https://",
        "redis://",
        "nats://",
        "--stop-timeout",
        "--progress-interval",
        "--log-format",
    ] {
        assert!(h.contains(t), "--help does not name {t}:\n{h}");
    }
}
