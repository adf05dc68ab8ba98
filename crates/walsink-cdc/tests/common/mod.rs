//! What the CDC test files share: the shared server's URL, a unique schema name, and an
//! admin connection.
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
