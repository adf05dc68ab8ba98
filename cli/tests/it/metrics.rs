//! What `pipe --metrics-addr` serves and `walsink status` prints: the Prometheus text of the
//! log's figures, which agree with `inspect` (a backlog held by a failing target, counted the
//! same by the endpoint, `status` and `inspect`, while the pipe runs and after it stopped),
//! count what was delivered (records, payload bytes, one commit duration per epoch), count
//! retries by class, and a taken port is an error before anything is created.

use crate::common::*;
use std::io::{Read, Write};
use std::time::{Duration, Instant};

/// GET `path` from `addr` (HOST:PORT): the status code and the body.
fn get(addr: &str, path: &str) -> (u16, String) {
    let mut c = std::net::TcpStream::connect(addr).expect("connect to the metrics endpoint");
    c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    write!(c, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").unwrap();
    let mut resp = String::new();
    c.read_to_string(&mut resp).unwrap();
    let code = resp
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or_else(|| panic!("not an HTTP response: {resp:?}"));
    let body = resp
        .split_once("\r\n\r\n")
        .map_or("", |(_, b)| b)
        .to_string();
    (code, body)
}

/// The value of the series `name` whose labels contain `labels` (e.g. `class="retryable"`).
fn value(text: &str, name: &str, labels: &str) -> Option<f64> {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .find(|l| {
            l.split_once('{')
                .is_some_and(|(n, rest)| n == name && rest.contains(labels))
        })
        .and_then(|l| l.rsplit(' ').next())
        .map(|v| {
            if v == "+Inf" {
                f64::INFINITY
            } else {
                v.parse().unwrap()
            }
        })
}

/// Starts `pipe` with `--metrics-addr 127.0.0.1:0` and returns it with the address it listens on.
fn start(
    args: &[String],
) -> (
    std::process::Child,
    String,
    std::sync::Arc<std::sync::Mutex<Vec<String>>>,
) {
    let mut all = args.to_vec();
    all.extend(["--metrics-addr".into(), "127.0.0.1:0".into()]);
    let mut child = spawn_piped(&all, &[]);
    let err = collect_stderr(&mut child);
    assert!(
        wait_for_line(&err, "metrics at http://", Duration::from_secs(60)),
        "no metrics notice: {:?}",
        err.lock().unwrap()
    );
    let line = err
        .lock()
        .unwrap()
        .iter()
        .find(|l| l.contains("metrics at http://"))
        .cloned()
        .unwrap();
    let addr = line
        .split("http://")
        .nth(1)
        .and_then(|r| r.strip_suffix("/metrics"))
        .unwrap_or_else(|| panic!("notice {line:?}"))
        .to_string();
    (child, addr, err)
}

/// Polls the endpoint until `done` holds for its text; returns that text.
fn scrape_until(addr: &str, what: &str, done: impl Fn(&str) -> bool) -> String {
    let t = Instant::now();
    loop {
        let (code, body) = get(addr, "/metrics");
        assert_eq!(code, 200, "{body}");
        if done(&body) {
            return body;
        }
        assert!(
            t.elapsed() < Duration::from_secs(120),
            "{what}: never seen in\n{body}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn json(o: &std::process::Output) -> serde_json::Value {
    serde_json::from_slice(&o.stdout)
        .unwrap_or_else(|e| panic!("not JSON ({e}): {} {}", stdout(o), stderr(o)))
}

/// A target that answers 503: the epochs stay in the log; the endpoint, `status --json` and
/// `inspect --json` count the same backlog while the pipe runs and after it stopped, and the
/// failed attempts are counted as retryable.
#[cfg(feature = "http")]
#[test]
fn a_held_backlog_is_counted_alike_by_the_endpoint_status_and_inspect() {
    let t = tempfile::tempdir().unwrap();
    let (input, wal) = (t.path().join("in.txt"), t.path().join("wal"));
    write_lines(&input, &lines("held", 0, 3000));
    let port = unavailable_http_port();
    let sink = format!("http://127.0.0.1:{port}/ingest");
    let args = pipe_args_to(
        &input,
        &wal,
        &sink,
        &[
            "--checkpoint-every",
            "1000",
            "--retry-deadline",
            "10m",
            "--max-retries",
            "1000",
        ],
    );
    let (mut child, addr, _err) = start(&args);
    let text = scrape_until(&addr, "3 epochs held and a retry", |b| {
        value(b, "walsink_backlog_epochs", "") == Some(3.0)
            && value(b, "walsink_retries_total", "class=\"retryable\"").is_some_and(|v| v >= 1.0)
    });
    assert_eq!(
        value(&text, "walsink_backlog_records", ""),
        Some(3000.0),
        "{text}"
    );
    assert_eq!(
        value(&text, "walsink_delivered_records_total", ""),
        Some(0.0)
    );
    assert_eq!(
        value(&text, "walsink_retries_total", "class=\"permanent\""),
        Some(0.0)
    );
    assert!(value(&text, "walsink_oldest_pending_epoch_age_seconds", "").unwrap() >= 0.0);
    assert!(value(&text, "walsink_disk_free_bytes", "").unwrap() > 0.0);
    let backlog_bytes = value(&text, "walsink_backlog_bytes", "").unwrap();
    assert!(text.contains("sink=\"pipe\",shard=\"0\""), "{text}");

    let check = |when: &str| {
        let st = json(&walsink(&["status", "--json", s(&wal)]));
        let ins = json(&walsink(&["inspect", "--json", s(&wal)]));
        assert_eq!(st["walsink_backlog_epochs"], 3, "{when}: {st}");
        assert_eq!(st["walsink_backlog_records"], 3000, "{when}: {st}");
        assert_eq!(
            st["walsink_backlog_bytes"].as_f64(),
            Some(backlog_bytes),
            "{when}: {st}"
        );
        assert_eq!(
            ins["backlog"]["records"], st["walsink_backlog_records"],
            "{when}"
        );
        assert_eq!(
            ins["backlog"]["bytes"], st["walsink_backlog_bytes"],
            "{when}"
        );
        assert_eq!(
            ins["backlog"]["epochs"], st["walsink_backlog_epochs"],
            "{when}"
        );
    };
    check("while the pipe runs");
    signal(&child, "TERM");
    let st = wait_exit(&mut child, Duration::from_secs(60), "pipe after SIGTERM");
    assert_eq!(st.code(), Some(3));
    check("after the pipe stopped");
    let text = walsink(&["status", s(&wal)]);
    assert!(
        stdout(&text).contains("walsink_backlog_records{sink=\"pipe\",shard=\"0\"} 3000"),
        "{}",
        stdout(&text)
    );
}

/// Into a directory sink: the records and payload bytes delivered, one commit-duration
/// observation per delivered epoch, nothing left behind; `status` agrees.
#[test]
fn what_was_delivered_is_counted() {
    let t = tempfile::tempdir().unwrap();
    let (input, wal, out) = (
        t.path().join("in.txt"),
        t.path().join("wal"),
        t.path().join("out"),
    );
    let ls = lines("done", 0, 20_000);
    write_lines(&input, &ls);
    let payload: usize = ls.iter().map(Vec::len).sum();
    let args = pipe_args(
        &input,
        &wal,
        &out,
        &["--follow", "--checkpoint-every", "2500"],
    );
    let (mut child, addr, _err) = start(&args);
    let text = scrape_until(&addr, "20,000 records delivered", |b| {
        value(b, "walsink_delivered_records_total", "") == Some(20_000.0)
            && value(b, "walsink_backlog_epochs", "") == Some(0.0)
    });
    assert_eq!(
        value(&text, "walsink_delivered_bytes_total", ""),
        Some(payload as f64),
        "{text}"
    );
    let epochs = value(&text, "walsink_delivered_epochs_total", "").unwrap();
    assert!(epochs >= 8.0, "{text}");
    assert_eq!(
        value(&text, "walsink_commit_duration_seconds_count", ""),
        Some(epochs),
        "{text}"
    );
    assert_eq!(
        value(
            &text,
            "walsink_commit_duration_seconds_bucket",
            "le=\"+Inf\""
        ),
        Some(epochs)
    );
    let st = json(&walsink(&["status", "--json", s(&wal)]));
    assert_eq!(st["walsink_backlog_records"], 0, "{st}");
    assert_eq!(
        st["walsink_committed_checkpoint"].as_f64(),
        value(&text, "walsink_committed_checkpoint", ""),
        "{st}"
    );
    assert_eq!(get(&addr, "/").0, 404);
    signal(&child, "TERM");
    wait_exit(&mut child, Duration::from_secs(60), "pipe after SIGTERM");
    assert_in_order_once(&records(&out), &ls);
}

/// A port already taken: exit 2 naming --metrics-addr, before the log directory is created.
#[test]
fn a_taken_metrics_port_is_an_error_at_start() {
    let t = tempfile::tempdir().unwrap();
    let (input, wal, out) = (
        t.path().join("in.txt"),
        t.path().join("wal"),
        t.path().join("out"),
    );
    write_lines(&input, &lines("port", 0, 10));
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap().to_string();
    let o = run_pipe(&input, &wal, &out, &["--metrics-addr", &addr]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    let err = stderr(&o);
    assert!(
        err.contains(&format!("--metrics-addr {addr}")) && err.contains("in use"),
        "{err}"
    );
    assert!(
        !wal.exists(),
        "the log was created although the command refused to start"
    );
    let o = run_pipe(&input, &wal, &out, &["--metrics-addr", "no-port"]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("--metrics-addr \"no-port\""),
        "{}",
        stderr(&o)
    );
}
