//! What the CDC test files share: the shared server's URL, a unique schema name, an admin
//! connection, and a log whose epochs are sealed one by one.
#![allow(dead_code)]

/// The shared PostgreSQL of the test machines.
pub const SHARED: &str = "postgres://postgres@127.0.0.1:5432/test";

/// A schema name no other test (or run) uses: `PREFIX_TAG_PID_NANOS`.
pub fn unique(prefix: &str, tag: &str) -> String {
    let n = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    format!("{prefix}_{tag}_{}_{:x}", std::process::id(), n & 0xffffff)
}

/// A connection to the shared server, its driver spawned on the current runtime.
pub async fn admin() -> tokio_postgres::Client {
    let (c, conn) = tokio_postgres::connect(SHARED, tokio_postgres::NoTls)
        .await
        .expect("the shared PostgreSQL at 127.0.0.1:5432 answers");
    tokio::spawn(conn);
    c
}

/// One log (one sink id) whose epochs are sealed one by one, on a fresh directory, with a
/// commit store in memory (the CDC sink keeps its own marker).
pub struct Feed {
    pub wal: std::sync::Arc<walsink::WalSink>,
    _dir: tempfile::TempDir,
    pub next_cp: u64,
    pub id: String,
}

impl Feed {
    /// Delivers what is ready into `sink`, bounded at 180 s (a hang is a failure, not a
    /// stuck run); the error names the log's last error too.
    pub async fn deliver(&self, sink: &mut walsink_cdc::CdcSink) -> Result<usize, String> {
        match tokio::time::timeout(
            std::time::Duration::from_secs(180),
            walsink_tokio::deliver_ready(&self.wal, sink),
        )
        .await
        {
            Err(_) => Err("delivery did not end within 180 s".into()),
            Ok(r) => r.map_err(|e| {
                format!(
                    "{e} (last error: {})",
                    self.wal.health().last_error.unwrap_or_default()
                )
            }),
        }
    }

    /// A new log for sink id `id`, read back in chunks of `chunk` bytes.
    pub fn new(id: &str, chunk: usize) -> Feed {
        let dir = tempfile::tempdir().unwrap();
        let (wal, _) = walsink::WalSink::open_with(
            std::sync::Arc::new(walsink::storage::FsStorage::new(dir.path()).unwrap()),
            walsink::Options::new(id).read_chunk_size(chunk),
            Box::new(walsink::MemoryCommitStore::new()),
        )
        .unwrap();
        Feed {
            wal: std::sync::Arc::new(wal),
            _dir: dir,
            next_cp: 1,
            id: id.to_string(),
        }
    }

    /// Appends `records` and seals them as the next epoch, complete.
    pub fn seal(&mut self, records: &[String]) {
        self.wal
            .append_batch(records.iter().map(|e| e.as_bytes()))
            .unwrap();
        let cp = self.next_cp;
        self.next_cp += 1;
        self.wal.checkpoint(cp, b"m").unwrap();
        self.wal.checkpoint_complete(cp).unwrap();
    }
}
