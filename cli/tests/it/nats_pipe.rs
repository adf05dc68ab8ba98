//! `walsink pipe --sink nats://…` against the local NATS with JetStream: SIGKILL loops that
//! end with every input line in the stream exactly once (all within the stream's duplicate
//! window), and a missing stream ending the run with the records kept.

use crate::common::*;
use async_nats::jetstream::{self, consumer};
use futures_util::StreamExt;
use std::time::Duration;

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

async fn js() -> jetstream::Context {
    let c = async_nats::connect("127.0.0.1:4222")
        .await
        .expect("the local NATS at 127.0.0.1:4222 must answer (WALSINK_TEST_SERVERS=1)");
    jetstream::new(c)
}

fn create_stream(name: &str, subject: &str) {
    rt().block_on(async {
        js().await
            .create_stream(jetstream::stream::Config {
                name: name.into(),
                subjects: vec![subject.into()],
                ..Default::default()
            })
            .await
            .expect("create the stream");
    })
}

fn delete_stream(name: &str) {
    rt().block_on(async {
        let _ = js().await.delete_stream(name).await;
    })
}

/// The stream's messages in order: `Nats-Msg-Id` and payload.
fn read_stream(name: &str) -> Vec<(String, Vec<u8>)> {
    rt().block_on(async {
        let js = js().await;
        let mut stream = js.get_stream(name).await.unwrap();
        let total = stream.info().await.unwrap().state.messages;
        let mut out = Vec::new();
        if total == 0 {
            return out;
        }
        let c = stream
            .create_consumer(consumer::pull::OrderedConfig::default())
            .await
            .unwrap();
        let mut msgs = c.messages().await.unwrap();
        while (out.len() as u64) < total {
            let m = tokio::time::timeout(Duration::from_secs(30), msgs.next())
                .await
                .expect("messages within 30 s")
                .unwrap()
                .unwrap();
            let id = m
                .headers
                .as_ref()
                .and_then(|h| h.get("Nats-Msg-Id"))
                .map(|v| v.as_str().to_string())
                .unwrap_or_default();
            out.push((id, m.payload.to_vec()));
        }
        out
    })
}

#[test]
#[cfg_attr(
    not(servers),
    ignore = "needs WALSINK_TEST_SERVERS=1 and a local NATS with JetStream"
)]
fn kill_loop_into_a_jetstream_stream_ends_with_every_line_once() {
    let d = tempfile::tempdir().unwrap();
    let (inp, wal) = (d.path().join("in.txt"), d.path().join("wal"));
    // Large enough, and killed early enough, that runs die mid-work on a quiet machine too
    // (60,000 lines with kills after 50-1500 ms were all in the stream after the first
    // round there, and only 5 kills landed).
    let want = lines("n", 0, 150_000);
    write_lines(&inp, &want);
    let u = unique("cli_kill");
    let (stream, subject) = (format!("WALSINK_TEST_{u}"), format!("walsink-test.{u}"));
    create_stream(&stream, &subject);
    let sink = format!("nats://127.0.0.1:4222/?stream={stream}&subject={subject}");
    let id = unique("k").replace('_', "-");
    let extra = ["--checkpoint-every", "700", "--sink-id", &id, "--quiet"];
    let mut kills = 0;
    for round in 0..3 {
        let (_, k) = kill_loop_to(&inp, &wal, &sink, &extra, 6, 60 + round, 40..=900);
        kills += k;
        let held: Vec<Vec<u8>> = read_stream(&stream).into_iter().map(|(_, p)| p).collect();
        assert_in_order_once(&held, &want);
        eprintln!(
            "after round {round}: {} of {} lines in the stream",
            held.len(),
            want.len()
        );
    }
    let args = pipe_args_to(&inp, &wal, &sink, &extra);
    let o = walsink(&args.iter().map(String::as_str).collect::<Vec<_>>());
    assert!(o.status.success(), "{}", stderr(&o));
    let held = read_stream(&stream);
    let mut ids = std::collections::HashSet::new();
    for (mid, _) in &held {
        assert!(mid.starts_with(&format!("{id}:0:")), "{mid}");
        assert!(ids.insert(mid.clone()), "{mid} twice");
    }
    let got: Vec<Vec<u8>> = held.into_iter().map(|(_, p)| p).collect();
    assert!(
        got == want,
        "every line once: {} records of {}",
        got.len(),
        want.len()
    );
    eprintln!("kill loop into nats: {kills} SIGKILLs in 18 runs");
    assert!(kills >= 6, "too few kills landed: {kills}");
    delete_stream(&stream);
}

#[test]
#[cfg_attr(
    not(servers),
    ignore = "needs WALSINK_TEST_SERVERS=1 and a local NATS with JetStream"
)]
fn a_missing_stream_ends_the_run_and_keeps_the_records() {
    let d = tempfile::tempdir().unwrap();
    let (inp, wal) = (d.path().join("in.txt"), d.path().join("wal"));
    write_lines(&inp, &lines("m", 0, 200));
    let u = unique("cli_missing");
    let (stream, subject) = (format!("WALSINK_TEST_{u}"), format!("walsink-test.{u}"));
    let sink = format!("nats://127.0.0.1:4222/?stream={stream}&subject={subject}");
    let args = pipe_args_to(&inp, &wal, &sink, &["--quiet", "--max-retries", "0"]);
    let o = walsink(&args.iter().map(String::as_str).collect::<Vec<_>>());
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains(&stream), "{}", stderr(&o));
    // With create=true the same log delivers everything once.
    let sink = format!("{sink}&create=true");
    let args = pipe_args_to(&inp, &wal, &sink, &["--quiet"]);
    let o = walsink(&args.iter().map(String::as_str).collect::<Vec<_>>());
    assert!(o.status.success(), "{}", stderr(&o));
    let got: Vec<Vec<u8>> = read_stream(&stream).into_iter().map(|(_, p)| p).collect();
    assert_eq!(got, lines("m", 0, 200));
    delete_stream(&stream);
}

/// The warning docs/targets/nats.md promises for an epoch older than the stream's duplicate
/// window shows on stderr, as text by default and as a JSON object with `--log-format json`.
#[test]
#[cfg_attr(
    not(servers),
    ignore = "needs WALSINK_TEST_SERVERS=1 and a local NATS with JetStream"
)]
fn an_epoch_older_than_the_duplicate_window_is_warned_about_in_text_and_json() {
    for fmt in ["text", "json"] {
        let d = tempfile::tempdir().unwrap();
        let (inp, wal) = (d.path().join("in.txt"), d.path().join("wal"));
        write_lines(&inp, &lines("w", 0, 20));
        let u = unique("cli_window");
        let (stream, subject) = (format!("WALSINK_TEST_{u}"), format!("walsink-test.{u}"));
        let sink = format!("nats://127.0.0.1:4222/?stream={stream}&subject={subject}");
        // A following run delivers the first lines; then the stream is deleted and more
        // lines come: their epoch fails, the run gives up, and the epoch stays in the log.
        create_stream(&stream, &subject);
        let args = pipe_args_to(
            &inp,
            &wal,
            &sink,
            &[
                "--quiet",
                "--max-retries",
                "0",
                "--follow",
                "--checkpoint-interval",
                "50ms",
            ],
        );
        let mut child = spawn_piped(&args, &[]);
        let t = std::time::Instant::now();
        while read_stream(&stream).len() < 20 && t.elapsed() < Duration::from_secs(20) {
            std::thread::sleep(Duration::from_millis(50));
        }
        assert_eq!(read_stream(&stream).len(), 20, "the first lines arrive");
        delete_stream(&stream);
        let mut f = std::fs::OpenOptions::new().append(true).open(&inp).unwrap();
        std::io::Write::write_all(&mut f, b"late 1\nlate 2\n").unwrap();
        let st = wait_exit(
            &mut child,
            Duration::from_secs(30),
            "run into a deleted stream",
        );
        assert_eq!(st.code(), Some(2));
        std::thread::sleep(Duration::from_millis(1500));
        rt().block_on(async {
            js().await
                .create_stream(jetstream::stream::Config {
                    name: stream.clone(),
                    subjects: vec![subject.clone()],
                    duplicate_window: Duration::from_secs(1),
                    ..Default::default()
                })
                .await
                .expect("create the stream");
        });
        let mut args = pipe_args_to(&inp, &wal, &sink, &["--quiet"]);
        args.extend(["--log-format".into(), fmt.into()]);
        let o = std::process::Command::new(env!("CARGO_BIN_EXE_walsink"))
            .args(&args)
            .env_remove("RUST_LOG")
            .output()
            .unwrap();
        delete_stream(&stream);
        let err = stderr(&o);
        assert!(o.status.success(), "{err}");
        let needle = "older than the stream's duplicate window";
        if fmt == "text" {
            let line = err.lines().find(|l| l.contains(needle));
            let line = line.unwrap_or_else(|| panic!("no warning: {err}"));
            assert!(line.contains("WARN") && line.contains(&stream), "{line}");
        } else {
            let v = err
                .lines()
                .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
                .find(|v| {
                    v["fields"]["message"]
                        .as_str()
                        .is_some_and(|m| m.contains(needle))
                })
                .unwrap_or_else(|| panic!("no JSON warning: {err}"));
            assert_eq!(v["level"], "WARN", "{v}");
            assert_eq!(v["fields"]["stream"], stream.as_str(), "{v}");
        }
    }
}
