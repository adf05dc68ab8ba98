//! How a `pipe` run ends when it is told to: SIGINT and SIGTERM stop it gracefully (reading
//! stops, what was read is checkpointed and delivered within `--stop-timeout`, the summary and
//! the `--json` object are printed, exit 3) and a resumed run delivers every line exactly
//! once; a second signal ends it at once (130 / 143); and a `--sink stdout` reader that
//! leaves mid-epoch fails that epoch (exit 141), so the next run prints it again from its
//! first record.

use crate::common::*;
use std::fs;
use std::io::{Read, Write};
use std::process::{Command, Stdio};
use std::time::Duration;

fn epoch_files(out: &std::path::Path) -> usize {
    fs::read_dir(out).map_or(0, |d| {
        d.filter(|e| {
            e.as_ref()
                .is_ok_and(|e| e.path().extension().is_some_and(|x| x == "txt"))
        })
        .count()
    })
}

fn json_of(o: &[u8]) -> serde_json::Value {
    serde_json::from_slice(o)
        .unwrap_or_else(|e| panic!("not JSON ({e}): {}", String::from_utf8_lossy(o)))
}

/// A `--follow` run signalled while it reads (after 1, 2 and 3 delivered epochs): exit 3, the
/// summary on stderr and in JSON, everything it read delivered, and a resumed run ends with
/// every line in the target exactly once, in order.
#[test]
fn sigint_and_sigterm_stop_a_follow_run_gracefully_and_the_resume_is_exactly_once() {
    for (sig, name) in [("INT", "SIGINT"), ("TERM", "SIGTERM")] {
        for after in 1..=3 {
            let d = tempfile::tempdir().unwrap();
            let (inp, wal, out) = (
                d.path().join("in.txt"),
                d.path().join("wal"),
                d.path().join("out"),
            );
            let all = lines("g", 0, 200_000);
            write_lines(&inp, &all);
            let args = pipe_args(
                &inp,
                &wal,
                &out,
                &["--follow", "--checkpoint-every", "5000", "--json"],
            );
            let mut child = spawn_piped(&args, &[]);
            let err = collect_stderr(&mut child);
            let t = std::time::Instant::now();
            while epoch_files(&out) < after && t.elapsed() < Duration::from_secs(60) {
                std::thread::sleep(Duration::from_millis(5));
            }
            signal(&child, sig);
            let st = wait_exit(&mut child, Duration::from_secs(30), "graceful stop");
            let mut o = Vec::new();
            child.stdout.take().unwrap().read_to_end(&mut o).unwrap();
            std::thread::sleep(Duration::from_millis(50));
            let err = err.lock().unwrap().join("\n");
            assert_eq!(st.code(), Some(3), "{name} after {after} epochs: {err}");
            let v = json_of(&o);
            assert_eq!(v["outcome"], "stopped", "{v}");
            assert_eq!(v["signal"], name, "{v}");
            assert_eq!(v["exit_code"], 3, "{v}");
            assert_eq!(v["records_undelivered"], 0, "{v}");
            let read = v["records_read"].as_u64().unwrap() as usize;
            assert!(read > 0, "{v}");
            assert_eq!(
                records(&out),
                all[..read].to_vec(),
                "{name}: the target holds exactly what was read"
            );
            // Resume without --follow: the rest, once.
            let o = run_pipe(&inp, &wal, &out, &["--checkpoint-every", "5000"]);
            assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
            assert_eq!(records(&out), all, "{name} after {after}: resumed run");
        }
    }
}

/// Standard input: lines written while the run waits for more are checkpointed and
/// delivered; a signal stops it with exit 3 and the summary, and a second run fed the rest of
/// the stream ends with every line once.
#[test]
fn a_signal_stops_a_stdin_run_and_the_next_run_continues_the_stream_once() {
    for (sig, name) in [("INT", "SIGINT"), ("TERM", "SIGTERM")] {
        for round in 0..3 {
            let d = tempfile::tempdir().unwrap();
            let (wal, out) = (d.path().join("wal"), d.path().join("out"));
            let all = lines("s", 0, 1000 + round * 300);
            let cut = 400 + round * 100;
            let args = pipe_args_to(
                std::path::Path::new("-"),
                &wal,
                &format!("dir:{}", out.display()),
                &[],
            );
            let mut child = Command::new(env!("CARGO_BIN_EXE_walsink"))
                .args(&args)
                .stdin(Stdio::piped())
                .stdout(Stdio::null())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap();
            let err = collect_stderr(&mut child);
            let mut stdin = child.stdin.take().unwrap();
            for l in &all[..cut] {
                stdin.write_all(l).unwrap();
                stdin.write_all(b"\n").unwrap();
            }
            stdin.flush().unwrap();
            let t = std::time::Instant::now();
            while records(&out).len() < cut && t.elapsed() < Duration::from_secs(30) {
                std::thread::sleep(Duration::from_millis(10));
            }
            assert_eq!(
                records(&out).len(),
                cut,
                "{name}: lines read from a waiting stdin are delivered"
            );
            signal(&child, sig);
            let st = wait_exit(&mut child, Duration::from_secs(30), "stdin stop");
            drop(stdin);
            std::thread::sleep(Duration::from_millis(50));
            let err = err.lock().unwrap().join("\n");
            assert_eq!(st.code(), Some(3), "{name}: {err}");
            assert!(err.contains(&format!("stopped by {name}")), "{err}");
            assert!(err.contains(&format!("read {cut} records")), "{err}");
            let mut child = Command::new(env!("CARGO_BIN_EXE_walsink"))
                .args(&args)
                .stdin(Stdio::piped())
                .stdout(Stdio::null())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap();
            let mut body = Vec::new();
            for l in &all[cut..] {
                body.extend_from_slice(l);
                body.push(b'\n');
            }
            let mut stdin = child.stdin.take().unwrap();
            stdin.write_all(&body).unwrap();
            drop(stdin);
            let o = child.wait_with_output().unwrap();
            assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
            assert_eq!(records(&out), all, "{name}: both runs, once each");
        }
    }
}

/// A target that cannot take the epoch: a signal waits `--stop-timeout` for it and then exits
/// 3 naming what stays in the log; while a long timeout runs, a second signal exits at once
/// with its own code.
#[test]
fn the_stop_waits_stop_timeout_and_a_second_signal_ends_it_at_once() {
    let d = tempfile::tempdir().unwrap();
    let (inp, wal) = (d.path().join("in.txt"), d.path().join("wal"));
    write_lines(&inp, &lines("t", 0, 100));
    let sink = format!("http://127.0.0.1:{}/in", unavailable_http_port());
    for (second, code) in [(None, 3), (Some("INT"), 130), (Some("TERM"), 143)] {
        let timeout = if second.is_some() { "60s" } else { "1s" };
        let args = pipe_args_to(&inp, &wal, &sink, &["--stop-timeout", timeout]);
        let mut child = spawn_piped(&args, &[]);
        let err = collect_stderr(&mut child);
        assert!(
            wait_for_line(&err, "delivery is failing", Duration::from_secs(30)),
            "no retry line: {:?}",
            err.lock().unwrap()
        );
        signal(&child, "TERM");
        if let Some(sig) = second {
            // Still stopping gracefully (the target cannot take the epoch).
            std::thread::sleep(Duration::from_millis(500));
            assert!(
                child.try_wait().unwrap().is_none(),
                "ended before its timeout"
            );
            signal(&child, sig);
        }
        let st = wait_exit(&mut child, Duration::from_secs(15), "stop");
        std::thread::sleep(Duration::from_millis(50));
        let err = err.lock().unwrap().join("\n");
        assert_eq!(st.code(), Some(code), "second {second:?}: {err}");
        if second.is_none() {
            assert!(err.contains("not delivered within --stop-timeout"), "{err}");
        }
        let o = walsink(&["inspect", s(&wal), "--json"]);
        let v = json_of(&o.stdout);
        assert_eq!(v["backlog"]["records"], 100, "records stay in the log: {v}");
    }
}

/// `--sink stdout` whose reader takes exactly N lines and closes the pipe: the epoch it left
/// in is not committed, the run exits 141 saying so, and the next run prints from that
/// epoch's first record (at-least-once: the lines of that epoch already read are printed
/// again, never a line skipped).
#[test]
fn a_stdout_reader_that_leaves_mid_epoch_gets_that_epoch_again() {
    for n in [50usize, 250, 777, 1999] {
        let d = tempfile::tempdir().unwrap();
        let (inp, wal) = (d.path().join("in.txt"), d.path().join("wal"));
        let all = lines("o", 0, 5000);
        write_lines(&inp, &all);
        let args = pipe_args_to(
            &inp,
            &wal,
            "stdout",
            &["--checkpoint-every", "100", "--quiet"],
        );
        let mut child = spawn_piped(&args, &[]);
        let mut out = child.stdout.take().unwrap();
        // One byte at a time, so the reader takes exactly N lines out of the pipe.
        let (mut got, mut byte) = (0, [0u8; 1]);
        while got < n {
            out.read_exact(&mut byte).unwrap();
            if byte[0] == b'\n' {
                got += 1;
            }
        }
        drop(out);
        let st = wait_exit(&mut child, Duration::from_secs(30), "stdout closed");
        let mut err = String::new();
        child
            .stderr
            .take()
            .unwrap()
            .read_to_string(&mut err)
            .unwrap();
        assert_eq!(st.code(), Some(141), "{err}");
        assert!(err.contains("standard output was closed"), "{err}");
        let o = walsink(&args.iter().map(String::as_str).collect::<Vec<_>>());
        assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
        let first = n / 100 * 100;
        let printed: Vec<Vec<u8>> = o
            .stdout
            .split(|&b| b == b'\n')
            .map(<[u8]>::to_vec)
            .collect();
        let printed = &printed[..printed.len() - 1];
        assert_eq!(
            printed,
            &all[first..],
            "after a reader that took {n} lines, the next run starts at record {first}"
        );
    }
}
