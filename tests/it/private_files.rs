//! A log holds user data: its directory and every file it creates (segments, identity, commit
//! store, lock, recycled segments) are private to the owner by default, `0o700` and `0o600`,
//! whatever the umask, and so are a directory sink's output directory and epoch files. Other
//! modes are set through `Options::dir_mode` / `Options::file_mode`; an existing directory
//! keeps its mode.

use crate::support::{append_values, opts};
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use walsink::{DirSink, ErrorKind, WalSink};

fn mode(p: &Path) -> u32 {
    std::fs::metadata(p).unwrap().permissions().mode() & 0o7777
}

/// Every entry of `dir` with its mode.
fn modes(dir: &Path) -> Vec<(String, u32)> {
    let mut v: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| {
            let e = e.unwrap();
            (
                e.file_name().to_string_lossy().into_owned(),
                mode(&e.path()),
            )
        })
        .collect();
    v.sort();
    v
}

/// A permissive umask, so that only the log's own modes can make its files private.
fn open_umask() {
    // SAFETY: umask only sets the process's file-creation mask.
    unsafe { libc::umask(0) };
}

/// Fills several segments, delivers them into a directory sink (so segments are recycled as
/// free files) and reopens the log; returns every entry of the log directory seen on the way,
/// with its mode.
fn run_log(base: &Path, o: walsink::Options, sink: DirSink) -> Vec<(String, u32)> {
    let log = base.join("log");
    let (wal, _) = WalSink::open(&log, o.clone()).unwrap();
    let mut sink = sink;
    let mut seen = Vec::new();
    for id in 1..=6u64 {
        append_values(&wal, (id as u32) * 1000, (id as u32) * 1000 + 40);
        wal.append(&vec![b'x'; 3000]).unwrap();
        for _ in 0..20 {
            wal.append(&vec![b'y'; 3000]).unwrap();
        }
        wal.checkpoint(id, b"meta").unwrap();
        wal.checkpoint_complete(id).unwrap();
        wal.deliver_ready(&mut sink).unwrap();
        seen.extend(modes(&log));
    }
    drop(wal);
    let (wal, _) = WalSink::open(&log, o).unwrap();
    drop(wal);
    seen.extend(modes(&log));
    seen.sort();
    seen.dedup();
    seen
}

#[test]
fn a_log_and_a_dir_sink_create_only_private_files() {
    open_umask();
    let base = tempfile::tempdir().unwrap();
    let out = base.path().join("out");
    let files = run_log(base.path(), opts("private"), DirSink::new(&out).unwrap());
    let log = base.path().join("log");
    assert_eq!(mode(&log), 0o700, "log directory");
    assert!(files.iter().any(|(n, _)| n.ends_with(".wseg")), "{files:?}");
    assert!(
        files.iter().any(|(n, _)| n.ends_with(".free")),
        "a recycled file: {files:?}"
    );
    assert!(
        files.len() >= 4,
        "identity, lock, commit store, segments: {files:?}"
    );
    for (name, m) in &files {
        assert_eq!(*m, 0o600, "{name} in the log directory: {m:#o}");
    }
    assert_eq!(mode(&out), 0o700, "sink directory");
    let written = modes(&out);
    assert!(written.len() >= 6, "epoch files: {written:?}");
    for (name, m) in &written {
        assert_eq!(*m, 0o600, "{name} in the sink directory: {m:#o}");
    }
}

#[test]
fn other_modes_are_set_exactly_and_an_existing_directory_keeps_its_own() {
    open_umask();
    let base = tempfile::tempdir().unwrap();
    let out = base.path().join("out");
    std::fs::create_dir(&out).unwrap();
    std::fs::set_permissions(&out, std::fs::Permissions::from_mode(0o755)).unwrap();
    let o = opts("shared").dir_mode(0o750).file_mode(0o640);
    let files = run_log(
        base.path(),
        o,
        DirSink::with_modes(&out, 0o700, 0o644).unwrap(),
    );
    let log = base.path().join("log");
    assert_eq!(mode(&log), 0o750);
    for (name, m) in files {
        assert_eq!(m, 0o640, "{name}: {m:#o}");
    }
    assert_eq!(mode(&out), 0o755, "an existing directory keeps its mode");
    for (name, m) in modes(&out) {
        assert_eq!(m, 0o644, "{name}: {m:#o}");
    }
}

#[test]
fn modes_that_lock_the_owner_out_are_refused() {
    let base = tempfile::tempdir().unwrap();
    for o in [
        opts("m").file_mode(0o400),
        opts("m").file_mode(0o4600),
        opts("m").dir_mode(0o600),
    ] {
        let e = WalSink::open(base.path().join("log"), o).unwrap_err();
        assert!(matches!(e.kind(), ErrorKind::InvalidConfig { .. }), "{e}");
        assert!(e.to_string().contains("mode"), "{e}");
    }
    assert!(!base.path().join("log").exists(), "nothing created");
    let e = DirSink::with_modes(base.path().join("out"), 0o700, 0o200).unwrap_err();
    assert_eq!(e.kind(), std::io::ErrorKind::InvalidInput, "{e}");
}
