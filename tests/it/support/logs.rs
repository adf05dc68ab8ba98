//! Helpers shared by the core's integration tests, its failpoint tests and walsink-tokio's
//! Flink scenarios (which include this file by path): test options, logs on the simulated
//! disk, decimal values, root-only tmpfs mounts and a storage that watches reads.

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
        .retry(RetryPolicy::new(
            std::time::Duration::from_millis(1),
            std::time::Duration::from_millis(20),
        ))
}

pub fn open_sim(sim: &SimStorage, o: Options) -> WalSink {
    WalSink::open_with_storage(Arc::new(sim.clone()), o)
        .expect("open")
        .0
}

/// `(segment files, free files)` on a simulated disk.
pub fn seg_and_free_files(sim: &SimStorage) -> (usize, usize) {
    let files = sim.snapshot();
    let count = |ext: &str| files.keys().filter(|n| n.ends_with(ext)).count();
    (count(".wseg"), count(".free"))
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

/// Called before each `read_at` of a [`ReadHooked`] storage's files, with the offset and the
/// length asked for.
pub type ReadHook = Arc<dyn Fn(u64, usize) + Send + Sync>;

/// A storage that forwards every call to `inner` and calls `hook` before each read of a file:
/// for tests that watch the log's reads (how large, on which thread).
#[derive(Clone)]
pub struct ReadHooked {
    pub inner: Arc<dyn walsink::storage::Storage>,
    pub hook: ReadHook,
}

impl std::fmt::Debug for ReadHooked {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReadHooked")
            .field("inner", &self.inner)
            .finish()
    }
}

/// A file of a [`ReadHooked`] storage.
struct HookedFile {
    inner: Arc<dyn walsink::storage::StorageFile>,
    hook: ReadHook,
}

impl std::fmt::Debug for HookedFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.inner.fmt(f)
    }
}

impl walsink::storage::StorageFile for HookedFile {
    fn len(&self) -> std::io::Result<u64> {
        self.inner.len()
    }
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> std::io::Result<usize> {
        (self.hook)(offset, buf.len());
        self.inner.read_at(offset, buf)
    }
    fn write_at(&self, offset: u64, data: &[u8]) -> std::io::Result<()> {
        self.inner.write_at(offset, data)
    }
    fn sync_data(&self) -> std::io::Result<()> {
        self.inner.sync_data()
    }
    fn set_len(&self, len: u64) -> std::io::Result<()> {
        self.inner.set_len(len)
    }
    fn write_durable(&self, offset: u64, data: &[u8]) -> std::io::Result<()> {
        self.inner.write_durable(offset, data)
    }
    fn data_prefix(&self) -> std::io::Result<u64> {
        self.inner.data_prefix()
    }
}

impl walsink::storage::Storage for ReadHooked {
    fn list(&self) -> std::io::Result<Vec<String>> {
        self.inner.list()
    }
    fn open(&self, name: &str) -> std::io::Result<Arc<dyn walsink::storage::StorageFile>> {
        Ok(Arc::new(HookedFile {
            inner: self.inner.open(name)?,
            hook: self.hook.clone(),
        }))
    }
    fn create(&self, name: &str) -> std::io::Result<Arc<dyn walsink::storage::StorageFile>> {
        Ok(Arc::new(HookedFile {
            inner: self.inner.create(name)?,
            hook: self.hook.clone(),
        }))
    }
    fn rename(&self, from: &str, to: &str) -> std::io::Result<()> {
        self.inner.rename(from, to)
    }
    fn remove(&self, name: &str) -> std::io::Result<()> {
        self.inner.remove(name)
    }
    fn sync_dir(&self) -> std::io::Result<()> {
        self.inner.sync_dir()
    }
    fn check_alive(&self) -> std::io::Result<()> {
        self.inner.check_alive()
    }
    fn lock(&self, name: &str) -> std::io::Result<Box<dyn Send + Sync + std::fmt::Debug>> {
        self.inner.lock(name)
    }
    fn describe(&self) -> String {
        format!("read-hooked {}", self.inner.describe())
    }
}

/// The name libtest knows test `test` of module `module` by (`module_path!()` without the
/// crate), for tests that re-run themselves in a child process with `--exact`.
pub fn test_path(module: &str, test: &str) -> String {
    match module.split_once("::") {
        Some((_, path)) => format!("{path}::{test}"),
        None => test.to_string(),
    }
}
