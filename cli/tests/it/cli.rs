//! The `walsink` binary end to end: every subcommand with its exit codes, the torn-tail and
//! bit-flip stories of the acceptance criteria, and a SIGKILL loop.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn walsink(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_walsink"))
        .args(args)
        .output()
        .expect("run walsink")
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn input(dir: &Path, n: usize) -> PathBuf {
    let p = dir.join("input.txt");
    let body: String = (0..n)
        .map(|i| format!("line {i:06} {}\n", "x".repeat(i % 50)))
        .collect();
    fs::write(&p, body).unwrap();
    p
}

fn expected(n: usize) -> Vec<Vec<u8>> {
    (0..n)
        .map(|i| format!("line {i:06} {}", "x".repeat(i % 50)).into_bytes())
        .collect()
}

fn pipe(dir: &Path, n: usize, every: &str) -> Output {
    let inp = input(dir, n);
    walsink(&[
        "pipe",
        "--input",
        inp.to_str().unwrap(),
        "--wal",
        dir.join("wal").to_str().unwrap(),
        "--sink",
        &format!("dir:{}", dir.join("out").display()),
        "--checkpoint-every",
        every,
        "--quiet",
    ])
}

/// The directory sink under `dir/out` holds exactly the first `n` input lines, in order.
fn assert_delivered(dir: &Path, n: usize) {
    assert_eq!(
        walsink::DirSink::read_records(dir.join("out")).unwrap(),
        expected(n)
    );
}

fn segments(wal: &Path) -> Vec<PathBuf> {
    let mut v: Vec<_> = fs::read_dir(wal)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "wseg"))
        .collect();
    v.sort();
    v
}

#[test]
fn pipe_delivers_every_line_once_and_is_idempotent() {
    let d = tempfile::tempdir().unwrap();
    let o = pipe(d.path(), 5000, "700");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_delivered(d.path(), 5000);
    // Running it again changes nothing.
    let o = pipe(d.path(), 5000, "700");
    assert!(o.status.success());
    assert_delivered(d.path(), 5000);
}

#[test]
fn pipe_to_stdout_and_usage_errors() {
    let d = tempfile::tempdir().unwrap();
    let inp = input(d.path(), 10);
    let wal = d.path().join("wal");
    let o = walsink(&[
        "pipe",
        "--input",
        inp.to_str().unwrap(),
        "--wal",
        wal.to_str().unwrap(),
        "--sink",
        "stdout",
        "--quiet",
    ]);
    assert!(o.status.success());
    let lines: Vec<Vec<u8>> = o
        .stdout
        .split(|&b| b == b'\n')
        .filter(|l| !l.is_empty())
        .map(|l| l.to_vec())
        .collect();
    assert_eq!(lines, expected(10));
    let o = walsink(&[
        "pipe",
        "--input",
        inp.to_str().unwrap(),
        "--wal",
        wal.to_str().unwrap(),
        "--sink",
        "kafka:x",
    ]);
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("unknown sink"));
    let o = walsink(&["verify"]);
    assert_eq!(o.status.code(), Some(2));
    let o = walsink(&["no-such-command"]);
    assert_eq!(o.status.code(), Some(2));
}

#[test]
fn pipe_refuses_a_directory_that_is_not_a_log() {
    let d = tempfile::tempdir().unwrap();
    let wal = d.path().join("wal");
    fs::create_dir(&wal).unwrap();
    fs::write(wal.join("precious.txt"), b"keep me").unwrap();
    let o = pipe(d.path(), 10, "5");
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("not a walsink log"));
    assert_eq!(fs::read(wal.join("precious.txt")).unwrap(), b"keep me");
    let o = walsink(&["repair", wal.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(2));
}

#[test]
fn inspect_dump_and_verify_a_clean_log() {
    let d = tempfile::tempdir().unwrap();
    assert!(pipe(d.path(), 1000, "300").status.success());
    let wal = d.path().join("wal");
    let w = wal.to_str().unwrap();
    let o = walsink(&["verify", w]);
    assert_eq!(o.status.code(), Some(0), "{}", stdout(&o));
    let o = walsink(&["verify", w, "--json"]);
    assert_eq!(o.status.code(), Some(0));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["ok"], true);
    for key in ["segments", "records", "checkpoints", "problems"] {
        assert!(v.get(key).is_some(), "missing {key}");
    }
    let o = walsink(&["inspect", w]);
    assert!(o.status.success());
    let s = stdout(&o);
    assert!(
        s.contains("sink id: pipe") && s.contains("committed"),
        "{s}"
    );
    let o = walsink(&["inspect", w, "--json"]);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["backlog"]["epochs"], 0);
    // The committed epochs may already be freed; dump shows what the log still holds.
    let o = walsink(&["dump", w, "--json"]);
    assert!(o.status.success());
    for line in stdout(&o).lines() {
        let r: serde_json::Value = serde_json::from_str(line).unwrap();
        assert!(r["data"]["text"].as_str().unwrap().starts_with("line "));
    }
    let o = walsink(&["dump", w, "--checkpoint", "999999"]);
    assert_eq!(o.status.code(), Some(1));
}

#[test]
fn dump_shows_pending_records_of_a_library_log() {
    let d = tempfile::tempdir().unwrap();
    {
        let (wal, _) = walsink::WalSink::open(d.path(), walsink::Options::new("lib")).unwrap();
        wal.append(b"alpha").unwrap();
        wal.append(&[0xff, 0x00]).unwrap();
        wal.checkpoint(7, b"").unwrap();
        wal.append(b"unsealed").unwrap();
        wal.checkpoint(8, b"").unwrap();
    }
    let o = walsink(&[
        "dump",
        d.path().to_str().unwrap(),
        "--checkpoint",
        "7",
        "--json",
    ]);
    assert!(o.status.success());
    let lines: Vec<serde_json::Value> = stdout(&o)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 2);
    assert_eq!(lines[0]["data"]["text"], "alpha");
    assert_eq!(lines[1]["data"]["base64"], "/wA=");
    assert_eq!(lines[0]["state"], "pending");
    let o = walsink(&["dump", d.path().to_str().unwrap()]);
    assert!(stdout(&o).contains("unsealed"));
}

#[test]
fn flipped_byte_is_found_and_repair_needs_force() {
    let d = tempfile::tempdir().unwrap();
    let wal = d.path().join("wal");
    // Keep the epochs pending (no delivery) so several sealed segments stay on disk.
    {
        let (w, _) = walsink::WalSink::open(
            &wal,
            walsink::Options::new("flip")
                .segment_size(16 << 10)
                .max_record_size(4096)
                .max_metadata_size(1024),
        )
        .unwrap();
        for cp in 1..=6u64 {
            for i in 0..200 {
                w.append(format!("cp {cp} record {i} {}", "y".repeat(60)).as_bytes())
                    .unwrap();
            }
            w.checkpoint(cp, b"").unwrap();
        }
    }
    let segs = segments(&wal);
    assert!(segs.len() >= 3);
    let victim = &segs[0];
    let mut b = fs::read(victim).unwrap();
    b[5000] ^= 0x01;
    fs::write(victim, &b).unwrap();
    let w = wal.to_str().unwrap();
    let o = walsink(&["verify", w, "--json"]);
    assert_eq!(o.status.code(), Some(1));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["ok"], false);
    let p = &v["problems"][0];
    assert_eq!(p["segment"], victim.file_name().unwrap().to_str().unwrap());
    assert_eq!(p["kind"], "checksum");
    assert!(p["offset"].as_u64().unwrap() <= 5000);
    let o = walsink(&["repair", w]);
    assert_eq!(o.status.code(), Some(1), "refused without --force");
    assert_eq!(fs::read(victim).unwrap(), b, "nothing changed");
    let o = walsink(&["repair", w, "--force"]);
    assert_eq!(
        o.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(stdout(&o).contains("moved aside"));
    assert!(fs::read_dir(&wal).unwrap().any(|e| e
        .unwrap()
        .file_name()
        .to_string_lossy()
        .ends_with(".damaged")));
    assert_eq!(walsink(&["verify", w]).status.code(), Some(0));
}

#[test]
fn torn_tail_is_reported_repaired_and_pipe_still_delivers_exactly_once() {
    let d = tempfile::tempdir().unwrap();
    let inp = input(d.path(), 3000);
    let wal = d.path().join("wal");
    // Seal part of the input with the library so the log holds pending epochs and a tail.
    {
        let (w, _) = walsink::WalSink::open(&wal, walsink::Options::new("pipe")).unwrap();
        let text = fs::read(&inp).unwrap();
        let mut offset = 0;
        for (i, line) in text.split_inclusive(|&b| b == b'\n').take(1500).enumerate() {
            offset += line.len();
            w.append(&line[..line.len() - 1]).unwrap();
            if (i + 1) % 500 == 0 {
                w.checkpoint(i as u64, format!("input-offset={offset}").as_bytes())
                    .unwrap();
            }
        }
    }
    // Cut 7 bytes into the last frame (segments are preallocated: find the end of the data).
    let newest = segments(&wal).pop().unwrap();
    let bytes = fs::read(&newest).unwrap();
    let end = bytes.iter().rposition(|&b| b != 0).unwrap() as u64 + 1;
    fs::OpenOptions::new()
        .write(true)
        .open(&newest)
        .unwrap()
        .set_len(end - 7)
        .unwrap();
    let w = wal.to_str().unwrap();
    let o = walsink(&["verify", w, "--json"]);
    assert_eq!(o.status.code(), Some(1));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["problems"][0]["kind"], "torn_tail", "{v}");
    let o = walsink(&["repair", w]);
    assert_eq!(o.status.code(), Some(0));
    assert!(stdout(&o).contains("torn tail"), "{}", stdout(&o));
    assert_eq!(walsink(&["verify", w]).status.code(), Some(0));
    let o = pipe(d.path(), 3000, "400");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_delivered(d.path(), 3000);
}

#[test]
fn kill_loop_delivers_every_record_exactly_once() {
    // At least 20 SIGKILLs at random moments; the demo counts every record.
    let d = tempfile::tempdir().unwrap();
    let o = walsink(&[
        "demo",
        "--dir",
        d.path().to_str().unwrap(),
        "--records",
        "400000",
        "--checkpoint-every",
        "250",
        "--crashes",
        "25",
        "--kill-min-ms",
        "15",
        "--kill-max-ms",
        "120",
        "--seed",
        "7",
        "--quiet",
    ]);
    let s = stdout(&o);
    assert!(
        o.status.success(),
        "{s}{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let crashes: u32 = s
        .split("across ")
        .nth(1)
        .and_then(|t| t.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .expect("crash count");
    assert!(
        s.starts_with("verified: 400000 records delivered exactly once (0 lost, 0 duplicated)"),
        "{s}"
    );
    assert!(crashes >= 20, "only {crashes} kills landed: {s}");
}

#[test]
fn demo_prints_one_verified_line() {
    let o = walsink(&[
        "demo",
        "--records",
        "20000",
        "--checkpoint-every",
        "500",
        "--crashes",
        "2",
        "--kill-min-ms",
        "5",
        "--kill-max-ms",
        "30",
        "--quiet",
    ]);
    assert!(o.status.success());
    let s = stdout(&o);
    assert_eq!(s.lines().count(), 1, "{s}");
    assert!(s.starts_with(
        "verified: 20000 records delivered exactly once (0 lost, 0 duplicated) across "
    ));
}
