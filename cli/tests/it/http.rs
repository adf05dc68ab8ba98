//! `walsink pipe --sink http://…` into the deduplicating receiver of `walsink_http::receiver`,
//! run in this test process (so it outlives every `pipe` it receives from): whole runs,
//! refused URLs, a permanent error that ends the run, and SIGKILL loops with faults injected
//! into a tenth of the requests. After each, the receiver holds every input line exactly
//! once after deduplicating by `Idempotency-Key`, in order.

use crate::common::*;
use std::path::Path;
use std::time::{Duration, Instant};
use walsink_http::receiver::{Fault, Mode, Receiver, Tls};
use walsink_kit::testkit::{TestCa, Validity};

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

fn http_args(input: &Path, wal: &Path, url: &str, extra: &[&str]) -> Vec<String> {
    let mut v: Vec<String> = ["pipe", "--input", s(input), "--wal", s(wal), "--sink", url]
        .iter()
        .map(|a| a.to_string())
        .collect();
    v.extend(extra.iter().map(|e| e.to_string()));
    v
}

fn run(args: &[String]) -> std::process::Output {
    let refs: Vec<&str> = args.iter().map(String::as_str).collect();
    walsink(&refs)
}

/// Runs `pipe` `kills` times, each killed with SIGKILL after a random delay unless it ends
/// first; checks after each that the receiver holds lines in order, each at most once.
/// Returns the number of kills that landed.
fn kill_loop(r: &Receiver, args: &[String], want: &[Vec<u8>], kills: u32, seed: u64) -> u32 {
    let mut rng = fastrand::Rng::with_seed(seed);
    let refs: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut killed = 0;
    for _ in 0..kills {
        let mut child = spawn(&refs);
        let delay = Duration::from_millis(rng.u64(30..=400));
        let t = Instant::now();
        loop {
            if let Some(status) = child.try_wait().unwrap() {
                assert!(status.success(), "a run ended with {status}");
                break;
            }
            if t.elapsed() >= delay {
                child.kill().unwrap(); // SIGKILL
                child.wait().unwrap();
                killed += 1;
                break;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        assert_in_order_once(&r.records("pipe", 0), want);
    }
    killed
}

#[test]
fn pipe_into_http_delivers_every_line_once() {
    let rt = runtime();
    let r = rt.block_on(Receiver::start(Mode::Keep)).unwrap();
    let d = tempfile::tempdir().unwrap();
    let (inp, wal) = (d.path().join("in.txt"), d.path().join("wal"));
    let want = lines("h", 0, 5000);
    write_lines(&inp, &want);
    let url = format!(
        "{}?max_records=300&max_bytes=4KiB&timeout=5s",
        r.url("ingest")
    );
    let o = run(&http_args(
        &inp,
        &wal,
        &url,
        &["--checkpoint-every", "1000"],
    ));
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(r.records("pipe", 0), want);
    // Run again: nothing new is sent.
    let before = r.seen(|s| s.requests);
    let o = run(&http_args(&inp, &wal, &url, &["--quiet"]));
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(r.seen(|s| s.requests), before);
    r.seen(|s| assert!(s.conflicts.is_empty()));
}

#[test]
fn bad_http_urls_are_refused_naming_the_parameter_and_hiding_the_password() {
    let d = tempfile::tempdir().unwrap();
    let (inp, wal) = (d.path().join("in.txt"), d.path().join("wal"));
    write_lines(&inp, &lines("u", 0, 3));
    for (url, says) in [
        ("http://u:s3cret@127.0.0.1:9/x?max_recods=5", "max_recods"),
        ("http://u:s3cret@127.0.0.1:9/x?timeout=5", "timeout"),
        ("https://u:s3cret@127.0.0.1:9/x?token=abc", "bearer_env"),
        (
            "http://u:s3cret@127.0.0.1:9/x?bearer_env=WALSINK_CLI_TEST_NO_SUCH_VAR",
            "WALSINK_CLI_TEST_NO_SUCH_VAR",
        ),
    ] {
        let o = run(&http_args(&inp, &wal, url, &[]));
        assert_eq!(o.status.code(), Some(2), "{url}: {}", stderr(&o));
        let e = stderr(&o);
        assert!(e.contains(says) && !e.contains("s3cret"), "{url}: {e}");
    }
}

#[test]
fn a_permanent_error_ends_the_run_and_a_rerun_delivers_once() {
    let rt = runtime();
    let r = rt.block_on(Receiver::start(Mode::Keep)).unwrap();
    let d = tempfile::tempdir().unwrap();
    let (inp, wal) = (d.path().join("in.txt"), d.path().join("wal"));
    let want = lines("q", 0, 400);
    write_lines(&inp, &want);
    let url = format!("{}?max_records=50", r.url("ingest"));
    r.inject([Fault::Pass, Fault::Pass, Fault::Status(413)]);
    let o = run(&http_args(
        &inp,
        &wal,
        &url,
        &["--max-retries", "0", "--quiet"],
    ));
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    let e = stderr(&o);
    assert!(e.contains("HTTP 413") && e.contains("--max-retries"), "{e}");
    assert_in_order_once(&r.records("pipe", 0), &want);
    let o = run(&http_args(&inp, &wal, &url, &["--quiet"]));
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(r.records("pipe", 0), want);
}

/// A receiver over TLS with a certificate for `localhost` and `127.0.0.1` from a test CA
/// in `dir`; returns it with the CA file.
fn tls_receiver(
    rt: &tokio::runtime::Runtime,
    dir: &Path,
    validity: Validity,
    names: &[&str],
) -> (Receiver, std::path::PathBuf) {
    let ca = TestCa::new(dir, &format!("ca{}", fastrand::u32(..))).unwrap();
    let cert = ca
        .server(&format!("recv{}", fastrand::u32(..)), names, validity)
        .unwrap();
    let tls = Tls::from_pem_files(&cert.cert, &cert.key).unwrap();
    let r = rt
        .block_on(Receiver::start_with(Mode::Keep, Some(tls)))
        .unwrap();
    (r, ca.ca_file())
}

fn kill_loop_case(params: &str, seed: u64) {
    kill_loop_case_over(params, seed, false)
}

fn kill_loop_case_over(params: &str, seed: u64, over_tls: bool) {
    let rt = runtime();
    let certs = tempfile::tempdir().unwrap();
    let (r, params) = if over_tls {
        let (r, ca) = tls_receiver(&rt, certs.path(), Validity::Current, &["localhost"]);
        (r, format!("{params}&ca_file={}", ca.display()))
    } else {
        (
            rt.block_on(Receiver::start(Mode::Keep)).unwrap(),
            params.to_string(),
        )
    };
    let params = params.as_str();
    // 1 in 10 requests: a 5xx, a 429, an answer after the timeout, or a connection closed
    // before or during the answer.
    r.chaos(seed, 0.1, Duration::from_millis(1500));
    let d = tempfile::tempdir().unwrap();
    let (inp, wal) = (d.path().join("in.txt"), d.path().join("wal"));
    let want = lines("k", 0, 100_000);
    write_lines(&inp, &want);
    let url = format!("{}?{params}&timeout=1s&retries=2", r.url("ingest"));
    let args = http_args(&inp, &wal, &url, &["--checkpoint-every", "500", "--quiet"]);
    let killed = kill_loop(&r, &args, &want, 25, seed);
    let o = run(&args);
    assert!(o.status.success(), "{}", stderr(&o));
    let got = r.records("pipe", 0);
    assert!(
        got == want,
        "{} records after dedupe, {} lines",
        got.len(),
        want.len()
    );
    let (faults, dups, requests) = r.seen(|s| {
        assert!(s.conflicts.is_empty(), "{:?}", s.conflicts);
        (s.faults, s.duplicates, s.requests)
    });
    eprintln!(
        "kill loop ({params}): {killed} SIGKILLs of 25 runs, {requests} requests, {faults} faults, {dups} duplicates dropped by key"
    );
    assert!(killed >= 10, "too few kills landed: {killed}");
}

#[test]
fn kill_loop_into_http_with_faults() {
    kill_loop_case("max_records=100&max_bytes=4KiB", 31);
}

#[test]
fn kill_loop_into_http_with_gzip_and_chunks_in_flight_together() {
    kill_loop_case("max_records=60&gzip=true&concurrency=3", 32);
}

#[test]
fn kill_loop_into_https_with_faults() {
    kill_loop_case_over("max_records=100&max_bytes=4KiB", 33, true);
}

/// Over HTTPS: a wrong CA, an expired certificate and a wrong host name each end the run at
/// start naming the reason, with nothing sent and the lines kept in the log; the run with
/// the setting (or the certificate) fixed delivers every line once.
#[test]
fn a_wrong_ca_an_expired_certificate_and_a_wrong_host_end_the_run_and_the_fixed_run_delivers_once()
{
    let rt = runtime();
    let d = tempfile::tempdir().unwrap();
    let want = lines("s", 0, 500);
    let (_, other_ca) = tls_receiver(&rt, d.path(), Validity::Current, &["localhost"]);
    let names = ["localhost", "127.0.0.1"];
    for case in ["wrong CA", "expired", "wrong host"] {
        let (inp, wal) = (
            d.path().join(format!("{case}.txt")),
            d.path().join(format!("{case}.wal")),
        );
        write_lines(&inp, &want);
        let validity = if case == "expired" {
            Validity::Expired
        } else {
            Validity::Current
        };
        let (r, ca) = tls_receiver(
            &rt,
            d.path(),
            validity,
            if case == "wrong host" {
                &names[..1]
            } else {
                &names
            },
        );
        let by_name = format!("{}?max_records=50&ca_file={}", r.url("in"), ca.display());
        let (bad, reason) = match case {
            "wrong CA" => (
                format!("{}?ca_file={}", r.url("in"), other_ca.display()),
                "not signed by a trusted CA",
            ),
            "expired" => (by_name.clone(), "certificate has expired"),
            _ => (
                format!(
                    "https://127.0.0.1:{}/in?ca_file={}",
                    r.addr().port(),
                    ca.display()
                ),
                "does not carry the host name",
            ),
        };
        let o = run(&http_args(&inp, &wal, &bad, &["--quiet"]));
        let err = stderr(&o);
        assert_eq!(o.status.code(), Some(2), "{case}: {err}");
        assert!(
            err.contains("cannot reach") && err.contains(reason),
            "{case}: {err}"
        );
        eprintln!(
            "refused as expected: {}",
            err.lines().find(|l| l.contains(reason)).unwrap_or_default()
        );
        assert_eq!(r.seen(|s| s.requests), 0, "{case}: nothing sent");
        // Fixed: the right CA, a renewed certificate, the name the certificate carries.
        let (r, fixed) = if case == "expired" {
            let (r, ca) = tls_receiver(&rt, d.path(), Validity::Current, &names);
            let url = format!("{}?max_records=50&ca_file={}", r.url("in"), ca.display());
            (r, url)
        } else {
            (r, by_name)
        };
        let o = run(&http_args(&inp, &wal, &fixed, &["--quiet"]));
        assert!(o.status.success(), "{case}: {}", stderr(&o));
        assert_eq!(r.records("pipe", 0), want, "{case}: every line once");
    }
}

#[test]
fn an_unreachable_receiver_ends_the_run_at_start_naming_it() {
    let d = tempfile::tempdir().unwrap();
    let (inp, wal) = (d.path().join("in.txt"), d.path().join("wal"));
    write_lines(&inp, &lines("u", 0, 10));
    // A port nothing listens on.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let url = format!("http://127.0.0.1:{port}/ingest");
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_walsink"))
        .args(http_args(&inp, &wal, &url, &["--quiet"]))
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let started = Instant::now();
    let status = loop {
        if let Some(st) = child.try_wait().unwrap() {
            break st;
        }
        if started.elapsed() > Duration::from_secs(60) {
            child.kill().unwrap();
            child.wait().unwrap();
            panic!("pipe into an unreachable receiver still runs after 60 s");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let mut err = String::new();
    std::io::Read::read_to_string(child.stderr.as_mut().unwrap(), &mut err).unwrap();
    assert_eq!(status.code(), Some(2), "{err}");
    assert!(
        err.contains("cannot reach") && err.contains(&format!("127.0.0.1:{port}")),
        "{err}"
    );
}
