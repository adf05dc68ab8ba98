//! Helpers shared by the CLI's test modules: running the binary and reading the target.
#![allow(dead_code)] // each test file uses a different subset

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

pub fn walsink(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_walsink"))
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("run walsink")
}

pub fn spawn(args: &[&str]) -> Child {
    Command::new(env!("CARGO_BIN_EXE_walsink"))
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn walsink")
}

pub fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

pub fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// Lines `from..to`, each `tag NNNNNN` plus some padding.
pub fn lines(tag: &str, from: usize, to: usize) -> Vec<Vec<u8>> {
    (from..to)
        .map(|i| format!("{tag} {i:06} {}", "x".repeat(i % 40)).into_bytes())
        .collect()
}

pub fn write_lines(path: &Path, lines: &[Vec<u8>]) {
    let mut body = Vec::new();
    for l in lines {
        body.extend_from_slice(l);
        body.push(b'\n');
    }
    fs::write(path, body).unwrap();
}

pub fn records(out: &Path) -> Vec<Vec<u8>> {
    if !out.exists() {
        return Vec::new();
    }
    walsink::DirSink::read_records(out).unwrap()
}

/// A name unique to this run, `{tag}_{pid}_{nanos}`: a valid sink id, SQL table name,
/// NATS stream name or Redis key part.
pub fn unique(tag: &str) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    format!("{tag}_{}_{:x}", std::process::id(), nanos & 0xffff_ffff)
}

pub fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// `pipe --input IN --wal WAL --sink dir:OUT` plus `extra`.
pub fn pipe_args(input: &Path, wal: &Path, out: &Path, extra: &[&str]) -> Vec<String> {
    pipe_args_to(input, wal, &format!("dir:{}", out.display()), extra)
}

/// `pipe --input IN --wal WAL --sink SINK` plus `extra`.
pub fn pipe_args_to(input: &Path, wal: &Path, sink: &str, extra: &[&str]) -> Vec<String> {
    let mut v: Vec<String> = vec![
        "pipe".into(),
        "--input".into(),
        s(input).into(),
        "--wal".into(),
        s(wal).into(),
        "--sink".into(),
        sink.into(),
    ];
    v.extend(extra.iter().map(|e| e.to_string()));
    v
}

pub fn run_pipe(input: &Path, wal: &Path, out: &Path, extra: &[&str]) -> Output {
    let args = pipe_args(input, wal, out, extra);
    let refs: Vec<&str> = args.iter().map(String::as_str).collect();
    walsink(&refs)
}

/// Runs the pipe `kills` times, each killed with SIGKILL after a random delay unless it ends
/// first; returns the exit statuses of the runs that ended on their own and the kill count.
pub fn kill_loop(
    input: &Path,
    wal: &Path,
    out: &Path,
    extra: &[&str],
    kills: u32,
    seed: u64,
) -> (Vec<Option<i32>>, u32) {
    kill_loop_to(
        input,
        wal,
        &format!("dir:{}", out.display()),
        extra,
        kills,
        seed,
        10..=150,
    )
}

/// [`kill_loop`] into any `--sink`, each kill after a random delay in `delays_ms`.
pub fn kill_loop_to(
    input: &Path,
    wal: &Path,
    sink: &str,
    extra: &[&str],
    kills: u32,
    seed: u64,
    delays_ms: std::ops::RangeInclusive<u64>,
) -> (Vec<Option<i32>>, u32) {
    let mut rng = fastrand::Rng::with_seed(seed);
    let args = pipe_args_to(input, wal, sink, extra);
    let refs: Vec<&str> = args.iter().map(String::as_str).collect();
    let (mut ended, mut killed) = (Vec::new(), 0);
    for _ in 0..kills {
        let mut child = spawn(&refs);
        let delay = Duration::from_millis(rng.u64(delays_ms.clone()));
        let t = Instant::now();
        loop {
            if let Some(status) = child.try_wait().unwrap() {
                ended.push(status.code());
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
    }
    (ended, killed)
}

/// Fails unless every record in `got` is one of `want`, each at most once, in order.
pub fn assert_in_order_once(got: &[Vec<u8>], want: &[Vec<u8>]) {
    let mut at = 0;
    for r in got {
        match want[at..].iter().position(|w| w == r) {
            Some(i) => at += i + 1,
            None => panic!(
                "record {:?} is foreign, duplicated or out of order",
                String::from_utf8_lossy(r)
            ),
        }
    }
}

pub fn segments(wal: &Path) -> Vec<PathBuf> {
    let mut v: Vec<_> = fs::read_dir(wal)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "wseg"))
        .collect();
    v.sort();
    v
}

/// Sends `sig` (`INT`, `TERM`) to a running child with kill(1).
pub fn signal(child: &Child, sig: &str) {
    let st = Command::new("kill")
        .args([&format!("-{sig}"), &child.id().to_string()])
        .status()
        .expect("run kill");
    assert!(st.success(), "kill -{sig} failed");
}

/// Waits up to `limit` for the child to end; kills it (and fails) when it does not.
pub fn wait_exit(child: &mut Child, limit: Duration, what: &str) -> std::process::ExitStatus {
    let t = Instant::now();
    loop {
        if let Some(st) = child.try_wait().unwrap() {
            return st;
        }
        if t.elapsed() >= limit {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{what}: still running after {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Collects a child's stderr on a thread, line by line, for [`wait_for_line`] and the end.
pub fn collect_stderr(child: &mut Child) -> std::sync::Arc<std::sync::Mutex<Vec<String>>> {
    use std::io::BufRead;
    let err = child.stderr.take().expect("stderr piped");
    let lines = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let l2 = lines.clone();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(err).lines() {
            match line {
                Ok(l) => l2.lock().unwrap().push(l),
                Err(_) => break,
            }
        }
    });
    lines
}

/// Waits up to `limit` for a collected stderr line containing `needle`.
pub fn wait_for_line(lines: &std::sync::Mutex<Vec<String>>, needle: &str, limit: Duration) -> bool {
    let t = Instant::now();
    while t.elapsed() < limit {
        if lines.lock().unwrap().iter().any(|l| l.contains(needle)) {
            return true;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    false
}

/// A loopback HTTP server that answers every request, the start-up check's `HEAD` included,
/// `503 Service Unavailable`: a target that is there but keeps failing (retryable). It runs
/// until the test process ends; returns its port.
pub fn unavailable_http_port() -> u16 {
    use std::io::{Read, Write};
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for c in l.incoming() {
            let Ok(mut c) = c else { continue };
            let _ = c.set_read_timeout(Some(Duration::from_millis(200)));
            let mut buf = [0u8; 65536];
            let _ = c.read(&mut buf);
            let _ = c.write_all(
                b"HTTP/1.1 503 Service Unavailable\r\ncontent-length: 0\r\nconnection: close\r\n\r\n",
            );
        }
    });
    port
}

/// Spawns the binary with stdin null, stdout and stderr piped, and `env` set.
pub fn spawn_piped(args: &[String], env: &[(&str, &str)]) -> Child {
    Command::new(env!("CARGO_BIN_EXE_walsink"))
        .args(args)
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn walsink")
}
