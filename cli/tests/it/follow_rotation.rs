//! `pipe --follow` across log rotation into a `dir:` target: a file renamed away and created
//! again (logrotate's default), a file copied and truncated in place (`copytruncate`), a
//! restart while the renamed file is still being finished, a log written before rotation was
//! followed (checkpoint metadata without a file identity), and SIGKILLs landing at random
//! moments of writes and rotations. Each test checks that every line written reached the
//! target exactly once and in order: the old file's lines (also those written to it after its
//! rename, through the writer's still-open descriptor), then the new file's from its start.

use crate::common::*;
use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const FOLLOW: &[&str] = &["--follow", "--checkpoint-interval", "50ms", "--quiet"];

/// A `pipe --follow` child whose standard error goes to a file, to show when it fails.
struct Follow {
    child: Child,
    err: PathBuf,
}

impl Follow {
    fn start(input: &Path, wal: &Path, out: &Path, err: PathBuf) -> Follow {
        Follow::start_with(input, wal, out, err, FOLLOW)
    }

    fn start_with(input: &Path, wal: &Path, out: &Path, err: PathBuf, extra: &[&str]) -> Follow {
        let args = pipe_args(input, wal, out, extra);
        let child = Command::new(env!("CARGO_BIN_EXE_walsink"))
            .args(&args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::from(File::create(&err).unwrap()))
            .spawn()
            .expect("spawn walsink");
        Follow { child, err }
    }

    /// Fails unless the child still runs.
    fn alive(&mut self) {
        if let Some(status) = self.child.try_wait().unwrap() {
            panic!(
                "pipe --follow ended on its own ({status}): {}",
                fs::read_to_string(&self.err).unwrap_or_default()
            );
        }
    }

    /// Waits until the target holds `n` records (60 s at most), while the child runs.
    fn wait_for(&mut self, out: &Path, n: usize) {
        let t = Instant::now();
        loop {
            let got = records(out).len();
            if got >= n {
                return;
            }
            self.alive();
            assert!(
                t.elapsed() < Duration::from_secs(60),
                "the target holds {got} records, not {n}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// SIGKILL.
    fn kill(mut self) {
        self.alive();
        self.child.kill().unwrap();
        self.child.wait().unwrap();
    }
}

fn append(f: &mut File, lines: &[Vec<u8>]) {
    let mut body = Vec::new();
    for l in lines {
        body.extend_from_slice(l);
        body.push(b'\n');
    }
    f.write_all(&body).unwrap();
}

fn appender(path: &Path) -> File {
    OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .unwrap()
}

/// logrotate's `copytruncate`: copy the file aside, then truncate it in place (the writer's
/// `O_APPEND` descriptor writes on at the new end).
fn copytruncate(path: &Path, to: &Path) {
    fs::copy(path, to).unwrap();
    OpenOptions::new()
        .write(true)
        .open(path)
        .unwrap()
        .set_len(0)
        .unwrap();
}

fn cat(parts: &[Vec<Vec<u8>>]) -> Vec<Vec<u8>> {
    parts.concat()
}

#[test]
fn rename_and_create_ships_the_old_file_to_its_end_then_the_new_one() {
    let d = tempfile::tempdir().unwrap();
    let (inp, wal, out) = (
        d.path().join("app.log"),
        d.path().join("wal"),
        d.path().join("out"),
    );
    write_lines(&inp, &lines("a", 0, 100));
    // The writing program's descriptor, kept across the rename as a program keeps it until
    // it is told to reopen its log.
    let mut old = appender(&inp);
    let mut run = Follow::start(&inp, &wal, &out, d.path().join("err"));
    run.wait_for(&out, 100);
    fs::rename(&inp, d.path().join("app.log.1")).unwrap();
    append(&mut old, &lines("a", 100, 150));
    let mut new = appender(&inp);
    append(&mut new, &lines("b", 0, 100));
    run.wait_for(&out, 250);
    // A partial line at the end of the new file waits for its newline.
    new.write_all(b"b half").unwrap();
    std::thread::sleep(Duration::from_millis(400));
    assert_eq!(records(&out).len(), 250);
    new.write_all(b"\n").unwrap();
    run.wait_for(&out, 251);
    run.kill();
    let want = cat(&[
        lines("a", 0, 150),
        lines("b", 0, 100),
        vec![b"b half".to_vec()],
    ]);
    assert_eq!(records(&out), want);
}

#[test]
fn copytruncate_reads_the_file_again_from_its_start() {
    let d = tempfile::tempdir().unwrap();
    let (inp, wal, out) = (
        d.path().join("app.log"),
        d.path().join("wal"),
        d.path().join("out"),
    );
    write_lines(&inp, &lines("c", 0, 100));
    let mut app = appender(&inp);
    let mut run = Follow::start(&inp, &wal, &out, d.path().join("err"));
    run.wait_for(&out, 100);
    // The file is shorter than what was read: a truncation.
    copytruncate(&inp, &d.path().join("app.log.1"));
    append(&mut app, &lines("d", 0, 50));
    run.wait_for(&out, 150);
    // Truncated and written past where the reader stood before it looked again: its first
    // bytes are not the ones read, so it is a truncation too.
    copytruncate(&inp, &d.path().join("app.log.2"));
    append(&mut app, &lines("e", 0, 400));
    run.wait_for(&out, 550);
    std::thread::sleep(Duration::from_millis(300));
    run.kill();
    assert_eq!(
        records(&out),
        cat(&[lines("c", 0, 100), lines("d", 0, 50), lines("e", 0, 400)])
    );
}

#[test]
fn a_restart_after_copytruncate_finishes_the_copy_first() {
    let d = tempfile::tempdir().unwrap();
    let (inp, wal, out) = (
        d.path().join("app.log"),
        d.path().join("wal"),
        d.path().join("out"),
    );
    write_lines(&inp, &lines("c", 0, 100));
    let mut app = appender(&inp);
    let run = {
        let mut r = Follow::start(&inp, &wal, &out, d.path().join("err1"));
        r.wait_for(&out, 100);
        r
    };
    run.kill();
    // While no reader runs: more lines, then copytruncate, then the new content.
    append(&mut app, &lines("c", 100, 150));
    copytruncate(&inp, &d.path().join("app.log.1"));
    append(&mut app, &lines("d", 0, 50));
    let mut run = Follow::start(&inp, &wal, &out, d.path().join("err2"));
    run.wait_for(&out, 200);
    std::thread::sleep(Duration::from_millis(300));
    run.kill();
    assert_eq!(records(&out), cat(&[lines("c", 0, 150), lines("d", 0, 50)]));
}

#[test]
fn a_restart_while_the_renamed_file_is_finished_resumes_in_it() {
    let d = tempfile::tempdir().unwrap();
    let (inp, wal, out) = (
        d.path().join("app.log"),
        d.path().join("wal"),
        d.path().join("out"),
    );
    let rotated = d.path().join("app.log.1");
    write_lines(&inp, &lines("e", 0, 100));
    let mut old = appender(&inp);
    let mut run = Follow::start(&inp, &wal, &out, d.path().join("err1"));
    run.wait_for(&out, 100);
    // Renamed, and the new file not created yet: the reader finishes the old one through its
    // descriptor and cannot go on before the new one exists.
    fs::rename(&inp, &rotated).unwrap();
    append(&mut old, &lines("e", 100, 150));
    run.wait_for(&out, 150);
    std::thread::sleep(Duration::from_millis(200));
    run.kill();
    // The newest checkpoint names the renamed file by its inode.
    let ino = fs::metadata(&rotated).unwrap().ino();
    let newest = newest_meta(&out);
    assert_eq!(newest["file"]["ino"].as_u64(), Some(ino), "{newest}");
    // The program writes on to the old file, then reopens its log.
    append(&mut old, &lines("e", 150, 200));
    let mut new = appender(&inp);
    append(&mut new, &lines("f", 0, 50));
    let mut run = Follow::start(&inp, &wal, &out, d.path().join("err2"));
    run.wait_for(&out, 250);
    std::thread::sleep(Duration::from_millis(300));
    run.kill();
    assert_eq!(records(&out), cat(&[lines("e", 0, 200), lines("f", 0, 50)]));
}

/// The metadata of the target's newest epoch (`dir:` keeps it in a `.meta` file).
fn newest_meta(out: &Path) -> serde_json::Value {
    let mut metas: Vec<PathBuf> = fs::read_dir(out)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "meta"))
        .collect();
    metas.sort();
    let newest = metas.last().expect("the target holds an epoch");
    serde_json::from_slice(&fs::read(newest).unwrap()).unwrap()
}

#[test]
fn a_log_written_before_rotation_was_followed_resumes_across_a_rotation() {
    let d = tempfile::tempdir().unwrap();
    let (inp, wal, out) = (
        d.path().join("app.log"),
        d.path().join("wal"),
        d.path().join("out"),
    );
    write_lines(&inp, &lines("g", 0, 100));
    let body = fs::read(&inp).unwrap();
    // A log as the previous version left it: 100 records and a checkpoint whose metadata
    // (layout 2) names the path, offset and fingerprint but no file identity.
    {
        let (w, _) = walsink::WalSink::open(
            &wal,
            walsink::Options::new("pipe")
                .max_record_size(16 << 20)
                .segment_size(64 << 20),
        )
        .unwrap();
        for l in lines("g", 0, 100) {
            w.append(&l).unwrap();
        }
        let meta = serde_json::json!({
            "v": 2,
            "log": "00112233445566778899aabbccddeeff",
            "source": "file",
            "path": fs::canonicalize(&inp).unwrap().to_str().unwrap(),
            "offset": body.len(),
            "hash": format!("{:016x}", xxhash_rust::xxh3::xxh3_64(&body)),
            "size": body.len(),
            "lines": 100,
            "unterminated": false,
        });
        w.checkpoint(0, &serde_json::to_vec(&meta).unwrap())
            .unwrap();
    }
    // Rotated since: more lines went to the old file, which was renamed; a new file began.
    let mut old = appender(&inp);
    append(&mut old, &lines("g", 100, 120));
    fs::rename(&inp, d.path().join("app.log.1")).unwrap();
    let mut new = appender(&inp);
    append(&mut new, &lines("h", 0, 50));
    let mut run = Follow::start(&inp, &wal, &out, d.path().join("err"));
    run.wait_for(&out, 170);
    std::thread::sleep(Duration::from_millis(300));
    run.kill();
    assert_eq!(records(&out), cat(&[lines("g", 0, 120), lines("h", 0, 50)]));
}

/// Fails unless the records `rG NNNNNN …` go up in (generation, line): none twice, none out of
/// order.
fn assert_increasing(got: &[Vec<u8>], when: &str) {
    let key = |r: &[u8]| {
        let s = String::from_utf8_lossy(r).into_owned();
        let mut parts = s.split(' ');
        let g: usize = parts.next().unwrap_or("")[1..]
            .parse()
            .unwrap_or_else(|_| panic!("{when}: foreign record {s:?}"));
        let i: usize = parts.next().unwrap_or("").parse().unwrap();
        (g, i)
    };
    for w in got.windows(2) {
        assert!(
            key(&w[0]) < key(&w[1]),
            "{when}: {:?} before {:?} (duplicated or out of order)",
            String::from_utf8_lossy(&w[0]),
            String::from_utf8_lossy(&w[1])
        );
    }
}

/// Moves `app.log.N` to `app.log.N+1`, newest last, as logrotate does before a rotation.
fn shift(dir: &Path, name: &str) {
    let mut n = 1;
    while dir.join(format!("{name}.{n}")).exists() {
        n += 1;
    }
    for i in (1..n).rev() {
        fs::rename(
            dir.join(format!("{name}.{i}")),
            dir.join(format!("{name}.{}", i + 1)),
        )
        .unwrap();
    }
}

#[test]
fn every_line_once_in_order_through_kills_and_rotations() {
    let d = tempfile::tempdir().unwrap();
    let (inp, wal, out) = (
        d.path().join("app.log"),
        d.path().join("wal"),
        d.path().join("out"),
    );
    const GENERATIONS: usize = 7;
    // FOLLOW_ROTATION_SEED=N runs other writes and kill delays.
    let seed: u64 = std::env::var("FOLLOW_ROTATION_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0x7a11);
    fs::write(&inp, b"").unwrap();
    let (dir, inp_w, out_w) = (d.path().to_path_buf(), inp.clone(), out.clone());
    // The writer: lines of each generation in bursts, some split across two writes; before
    // each rotation it waits until the target holds a line of the current generation (walsink
    // follows one rotation at a time: two rotations before it reads the newer file would
    // leave the file between them unread). Rotations alternate rename+create and
    // copytruncate; after a rename it writes a few more lines through the old descriptor.
    let writer = std::thread::spawn(move || {
        let mut rng = fastrand::Rng::with_seed(seed);
        let mut f = appender(&inp_w);
        let mut want: Vec<Vec<u8>> = Vec::new();
        for generation in 0..GENERATIONS {
            let tag = format!("r{generation}");
            let first = lines(&tag, 0, 1).remove(0);
            let mut i = 0;
            let bursts = rng.usize(20..40);
            for _ in 0..bursts {
                let n = rng.usize(1..30);
                let mut body = Vec::new();
                for l in lines(&tag, i, i + n) {
                    body.extend_from_slice(&l);
                    body.push(b'\n');
                    want.push(l);
                }
                i += n;
                let cut = rng.usize(0..=body.len());
                f.write_all(&body[..cut]).unwrap();
                std::thread::sleep(Duration::from_millis(rng.u64(0..5)));
                f.write_all(&body[cut..]).unwrap();
                std::thread::sleep(Duration::from_millis(rng.u64(5..40)));
            }
            let t = Instant::now();
            while !records(&out_w).contains(&first) {
                assert!(
                    t.elapsed() < Duration::from_secs(120),
                    "generation {generation} never reached the target"
                );
                std::thread::sleep(Duration::from_millis(20));
            }
            if generation + 1 == GENERATIONS {
                break;
            }
            shift(&dir, "app.log");
            if generation % 2 == 0 {
                fs::rename(&inp_w, dir.join("app.log.1")).unwrap();
                let late = lines(&tag, i, i + 5);
                append(&mut f, &late);
                want.extend(late);
                f = appender(&inp_w);
            } else {
                copytruncate(&inp_w, &dir.join("app.log.1"));
            }
        }
        want
    });
    // The kill loop: each run SIGKILLed after a random delay. A kill lands when the run had
    // opened the log and the input (it said where it resumes); one that came before widens
    // the delays, one that landed narrows them, so kills land in debug and release builds
    // alike. A kill whose newest checkpoint names another file than the one at the path
    // landed while a rotated file was being finished.
    let loud = ["--follow", "--checkpoint-interval", "50ms"];
    let mut rng = fastrand::Rng::with_seed(seed ^ 0x51a7);
    let (mut lo, mut hi) = (50u64, 700u64);
    let (mut kills, mut landed, mut productive, mut finishing) = (0u32, 0u32, 0u32, 0u32);
    while !writer.is_finished() || landed < 15 {
        let before = records(&out).len();
        let err = d.path().join(format!("err{kills}"));
        let mut run = Follow::start_with(&inp, &wal, &out, err.clone(), &loud);
        let delay = Duration::from_millis(rng.u64(lo..=hi));
        let t = Instant::now();
        while t.elapsed() < delay {
            run.alive();
            std::thread::sleep(Duration::from_millis(5));
        }
        run.kill();
        kills += 1;
        let after = records(&out);
        assert_increasing(&after, &format!("after kill {kills}"));
        productive += u32::from(after.len() > before);
        if fs::read_to_string(&err).unwrap().contains("pipe: resuming") {
            landed += 1;
            lo = (lo * 9 / 10).max(50);
            hi = (hi * 9 / 10).max(700);
        } else if before > 0 {
            lo = (lo * 3 / 2).min(3000);
            hi = (hi * 3 / 2).min(6000);
        }
        let at_path = fs::metadata(&inp).ok().map(|m| m.ino());
        if !after.is_empty() && newest_meta(&out)["file"]["ino"].as_u64() != at_path {
            finishing += 1;
        }
    }
    let want = writer.join().unwrap();
    let mut run = Follow::start(&inp, &wal, &out, d.path().join("err-last"));
    run.wait_for(&out, want.len());
    std::thread::sleep(Duration::from_millis(500));
    run.kill();
    let got = records(&out);
    eprintln!(
        "seed {seed}: {} lines in {GENERATIONS} generations, {kills} SIGKILLs ({landed} after the run resumed, {productive} after new records reached the target, {finishing} while a rotated file was being finished), delays {lo}..={hi} ms at the end",
        want.len()
    );
    assert_eq!(got.len(), want.len(), "records missing or duplicated");
    assert_eq!(got, want);
    assert!(landed >= 15, "too few kills landed: {landed} of {kills}");
    assert!(
        productive >= 5,
        "too few kills came after new records: {productive} of {kills}"
    );
    assert!(
        finishing >= 2,
        "too few kills landed while a rotated file was finished: {finishing}"
    );
}
