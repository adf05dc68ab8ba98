//! Helpers shared by the integration tests.
#![allow(dead_code)]

use std::sync::Arc;
use walsink::storage::SimStorage;
use walsink::{Options, RetryPolicy, WalSink};

/// Options for tests: small segments so rolls happen, fast retries.
pub fn opts(sink: &str) -> Options {
    Options::new(sink)
        .segment_size(64 << 10)
        .max_record_size(4 << 10)
        .max_metadata_size(1 << 10)
        .retry(RetryPolicy {
            initial: std::time::Duration::from_millis(1),
            max: std::time::Duration::from_millis(20),
        })
}

pub fn open_sim(sim: &SimStorage, o: Options) -> WalSink {
    WalSink::open_with_storage(Arc::new(sim.clone()), o)
        .expect("open")
        .0
}

/// Values `a..=b` as decimal records.
pub fn values(a: u32, b: u32) -> Vec<Vec<u8>> {
    (a..=b).map(|v| v.to_string().into_bytes()).collect()
}

pub fn append_values(wal: &WalSink, a: u32, b: u32) {
    for v in values(a, b) {
        wal.append(&v).expect("append");
    }
}

/// Completes checkpoint `id`, delivers everything deliverable to a new sink, returns its records.
pub fn complete_and_deliver(wal: &WalSink, id: u64) -> Vec<Vec<u8>> {
    wal.checkpoint_complete(id).expect("complete");
    let mut sink = walsink::MemorySink::new();
    wal.deliver_ready(&mut sink).expect("deliver");
    sink.records()
}

/// The segment files of the log in `dir`, in order.
pub fn segments(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut v: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "wseg"))
        .collect();
    v.sort();
    v
}

fn is_root() -> bool {
    std::process::Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| o.stdout.starts_with(b"0\n"))
}

/// Whether `test` can run: it needs root (mount, chattr). Skips (saying why) when not root,
/// except in CI, where such tests must run.
pub fn need_root(test: &str) -> bool {
    if is_root() {
        return true;
    }
    assert!(std::env::var("CI").is_err(), "{test} needs root in CI");
    eprintln!("skipping {test}: needs root (mount, chattr)");
    false
}

/// A tmpfs of `size` mounted on a fresh temporary directory (as root), unmounted on drop: a
/// disk that fills up for real.
pub struct Tmpfs(
    pub std::path::PathBuf,
    #[allow(dead_code)] tempfile::TempDir,
);

impl Tmpfs {
    /// Mounts one (`size` as `mount -o size=` takes it, for example `2m`).
    pub fn mount(size: &str) -> Tmpfs {
        let dir = tempfile::tempdir().unwrap();
        let st = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(dir.path())
            .status()
            .unwrap();
        assert!(st.success(), "mount tmpfs failed");
        Tmpfs(dir.path().to_path_buf(), dir)
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount")
            .arg("-l")
            .arg(&self.0)
            .status();
    }
}
