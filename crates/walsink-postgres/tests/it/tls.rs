//! TLS and passwords against private clusters (feature `testkit`): a cluster serving TLS
//! with a certificate of the kit's test CA, where the sink's user may only connect over TLS
//! (`hostssl`, `hostnossl … reject`) while `postgres` reads back in plain text.
//!
//! Covered: delivery with verify-full (the conformance suite); a wrong CA, an expired
//! certificate and a wrong host name each refused as a permanent error naming the reason,
//! nothing delivered, then delivered once the setting is fixed; libpq's verify-ca and
//! require-with-a-root-certificate; sslmode=require against a server without TLS; prefer's
//! fallback; a client certificate (`clientcert=verify-full`); a password from the password
//! file with scram-sha-256 and SCRAM channel binding over TLS.

use crate::common::*;
use std::path::{Path, PathBuf};
use walsink::{ErrorKind, SinkErrorClass};
use walsink_kit::testkit::{TestCa, Validity};
use walsink_postgres::testkit::{Cluster, Setup};
use walsink_postgres::{Config, PgSink};
use walsink_tokio::deliver_ready;

/// The sink's role: TLS only.
const USER: &str = "walsink";

struct Tls {
    pg: Cluster,
    ca: TestCa,
    _dir: tempfile::TempDir,
}

impl Tls {
    /// A cluster serving a certificate for `names` (validity as given) from a fresh CA.
    async fn start(names: &[&str], validity: Validity, extra_hba: &[&str]) -> Tls {
        let dir = tempfile::tempdir().unwrap();
        let ca = TestCa::new(dir.path(), "ca").unwrap();
        let server = ca.server("server", names, validity).unwrap();
        let client_ca = ca.ca_file();
        let mut hba: Vec<String> = extra_hba.iter().map(|s| s.to_string()).collect();
        hba.extend([
            format!("hostssl all {USER} 127.0.0.1/32 trust"),
            format!("hostnossl all {USER} 127.0.0.1/32 reject"),
            "host all all 127.0.0.1/32 trust".to_string(),
        ]);
        let pg = Cluster::start_with(
            &[],
            &Setup {
                tls: Some((server.cert, server.key)),
                client_ca: Some(client_ca),
                hba: Some(hba),
                ..Setup::default()
            },
        )
        .expect("start a private TLS cluster");
        client(&pg.url("postgres"))
            .await
            .batch_execute(&format!("CREATE ROLE {USER} LOGIN SUPERUSER"))
            .await
            .unwrap();
        Tls { pg, ca, _dir: dir }
    }

    /// The sink's URL (host 127.0.0.1) without its query.
    fn url(&self) -> String {
        format!("postgres://{USER}@127.0.0.1:{}/postgres", self.pg.port())
    }

    fn ca_file(&self) -> PathBuf {
        self.ca.ca_file()
    }
}

fn config(url: &str, table: &str, query: &str) -> Config {
    Config::from_url(&format!("{url}?table={table}{query}")).unwrap()
}

fn root(p: &Path) -> String {
    format!("&sslrootcert={}", p.display())
}

/// The sink error of a failed delivery.
fn sink_error(e: &walsink::Error) -> &walsink::SinkError {
    match e.kind() {
        ErrorKind::Sink(s) => s,
        other => panic!("not a sink error: {other:?}"),
    }
}

/// A bad setting is refused, permanent and naming `reason`, with nothing delivered; then
/// `fixed` delivers the epoch.
async fn refused_then_delivered(t: &Tls, bad: Config, fixed: Config, reason: &str) {
    let id = unique("tls");
    let log = open(&id);
    let want = epoch(&log.wal, 1, 0..20);
    let mut sink = PgSink::new(bad);
    let e = deliver_ready(&log.wal, &mut sink).await.unwrap_err();
    let s = sink_error(&e);
    assert_eq!(s.class(), SinkErrorClass::Permanent, "{e}");
    assert!(e.to_string().contains(reason), "{reason:?} named in: {e}");
    assert!(e.to_string().contains("TLS"), "{e}");
    assert_eq!(log.wal.health().committed, None, "nothing skipped");
    let table = fixed.table.plain();
    let mut sink = PgSink::new(fixed);
    assert_eq!(deliver_ready(&log.wal, &mut sink).await.unwrap(), 1);
    assert_eq!(rows(&t.pg.url("postgres"), &table, &id, 0).await, want);
}

#[tokio::test(flavor = "multi_thread")]
#[cfg_attr(
    not(servers),
    ignore = "needs WALSINK_TEST_SERVERS=1 and the PostgreSQL binaries"
)]
async fn verify_full_passes_the_conformance_suite_over_tls() {
    let t = Tls::start(&["localhost", "127.0.0.1"], Validity::Current, &[]).await;
    let extra = format!("&sslmode=verify-full{}", root(&t.ca_file()));
    // Read back as postgres in plain text; the sink's user cannot connect without TLS.
    walsink_tokio::conformance::run_all(&TlsHarness {
        inner: Pg::new(&t.url(), &extra),
        read: t.pg.url("postgres"),
    })
    .await;
    // Without TLS the sink's user is refused: the deliveries above went over TLS.
    let mut plain = PgSink::new(config(&t.url(), "t", "&sslmode=disable"));
    let e = plain.connect().await.unwrap_err().to_string();
    assert!(e.contains("28000") || e.contains("pg_hba.conf"), "{e}");
}

struct TlsHarness {
    inner: Pg,
    read: String,
}

impl walsink_tokio::conformance::Harness for TlsHarness {
    type Sink = PgSink;

    async fn sink(&self, _sink_id: &str) -> PgSink {
        PgSink::new(self.inner.config())
    }

    async fn read_back(&self, sink_id: &str, subtask: u32) -> Vec<Vec<u8>> {
        rows(&self.read, &self.inner.table, sink_id, subtask).await
    }
}

#[tokio::test(flavor = "multi_thread")]
#[cfg_attr(
    not(servers),
    ignore = "needs WALSINK_TEST_SERVERS=1 and the PostgreSQL binaries"
)]
async fn a_wrong_ca_is_refused_naming_it_then_delivered_with_the_right_one() {
    let t = Tls::start(&["localhost", "127.0.0.1"], Validity::Current, &[]).await;
    let dir = tempfile::tempdir().unwrap();
    let other = TestCa::new(dir.path(), "other").unwrap();
    let table = unique("wrongca");
    for mode in ["verify-full", "verify-ca", "require"] {
        let bad = config(
            &t.url(),
            &table,
            &format!("&sslmode={mode}{}", root(&other.ca_file())),
        );
        let fixed = config(
            &t.url(),
            &table,
            &format!("&sslmode={mode}{}", root(&t.ca_file())),
        );
        refused_then_delivered(&t, bad, fixed, "not signed by a trusted CA").await;
    }
}

#[tokio::test(flavor = "multi_thread")]
#[cfg_attr(
    not(servers),
    ignore = "needs WALSINK_TEST_SERVERS=1 and the PostgreSQL binaries"
)]
async fn an_expired_certificate_is_refused_then_delivered_once_renewed() {
    let t = Tls::start(&["localhost", "127.0.0.1"], Validity::Expired, &[]).await;
    let table = unique("expired");
    let c = || {
        config(
            &t.url(),
            &table,
            &format!("&sslmode=verify-full{}", root(&t.ca_file())),
        )
    };
    let id = unique("tls");
    let log = open(&id);
    let want = epoch(&log.wal, 1, 0..20);
    let mut sink = PgSink::new(c());
    let e = deliver_ready(&log.wal, &mut sink).await.unwrap_err();
    assert_eq!(sink_error(&e).class(), SinkErrorClass::Permanent, "{e}");
    assert!(e.to_string().contains("has expired"), "{e}");
    assert_eq!(log.wal.health().committed, None, "nothing skipped");
    // The operator renews the certificate; the same sink delivers on its next attempt.
    let renewed =
        t.ca.server("renewed", &["localhost", "127.0.0.1"], Validity::Current)
            .unwrap();
    t.pg.replace_tls(&renewed.cert, &renewed.key).unwrap();
    assert_eq!(deliver_ready(&log.wal, &mut sink).await.unwrap(), 1);
    assert_eq!(rows(&t.pg.url("postgres"), &table, &id, 0).await, want);
}

#[tokio::test(flavor = "multi_thread")]
#[cfg_attr(
    not(servers),
    ignore = "needs WALSINK_TEST_SERVERS=1 and the PostgreSQL binaries"
)]
async fn a_wrong_host_name_is_refused_by_verify_full_only() {
    // The certificate names db.example only; the sink connects to 127.0.0.1.
    let t = Tls::start(&["db.example"], Validity::Current, &[]).await;
    let table = unique("host");
    let ca = root(&t.ca_file());
    let bad = config(&t.url(), &table, &format!("&sslmode=verify-full{ca}"));
    // Fixed as libpq would: the certificate's name as host, the address as hostaddr.
    let named = format!("postgres://{USER}@db.example:{}/postgres", t.pg.port());
    let fixed = config(
        &named,
        &table,
        &format!("&hostaddr=127.0.0.1&sslmode=verify-full{ca}"),
    );
    refused_then_delivered(&t, bad, fixed, "does not carry the host name").await;
    // verify-ca and require with a root certificate check the chain, not the name.
    for mode in ["verify-ca", "require"] {
        let mut s = PgSink::new(config(&t.url(), &table, &format!("&sslmode={mode}{ca}")));
        s.connect().await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread")]
#[cfg_attr(
    not(servers),
    ignore = "needs WALSINK_TEST_SERVERS=1 and the PostgreSQL binaries"
)]
async fn require_against_a_server_without_tls_is_refused_and_prefer_falls_back() {
    let pg = Cluster::start(&[]).expect("start a private cluster");
    let table = unique("notls");
    let mut s = PgSink::new(config(&pg.url("postgres"), &table, "&sslmode=require"));
    let e = s.connect().await.unwrap_err();
    assert_eq!(e.class(), SinkErrorClass::Permanent, "{e}");
    assert!(
        e.to_string().contains("does not accept TLS") && e.to_string().contains("sslmode"),
        "{e}"
    );
    for q in ["", "&sslmode=prefer", "&sslmode=disable"] {
        let mut s = PgSink::new(config(&pg.url("postgres"), &table, q));
        s.connect().await.unwrap();
    }
    // As libpq: no TLS is asked for over a Unix-domain socket, whatever sslmode says.
    let socket = format!(
        "postgres://postgres@{}:{}/postgres",
        enc(pg.dir().to_str().unwrap()),
        pg.port()
    );
    let mut s = PgSink::new(config(&socket, &table, "&sslmode=require"));
    s.connect().await.unwrap();
    // libpq's prefer: a certificate that fails verification falls back to plain text too.
    let t = Tls::start(&["localhost", "127.0.0.1"], Validity::Current, &[]).await;
    let dir = tempfile::tempdir().unwrap();
    let other = TestCa::new(dir.path(), "other").unwrap();
    let q = format!("&sslmode=prefer{}", root(&other.ca_file()));
    let mut s = PgSink::new(config(&t.pg.url("postgres"), &table, &q));
    s.connect().await.unwrap();
    // ... which the TLS-only user cannot use.
    let mut s = PgSink::new(config(&t.url(), &table, &q));
    assert!(s.connect().await.is_err());
}

#[tokio::test(flavor = "multi_thread")]
#[cfg_attr(
    not(servers),
    ignore = "needs WALSINK_TEST_SERVERS=1 and the PostgreSQL binaries"
)]
async fn a_client_certificate_is_sent_when_the_server_asks_for_one() {
    let t = Tls::start(
        &["localhost", "127.0.0.1"],
        Validity::Current,
        &["hostssl all certuser 127.0.0.1/32 trust clientcert=verify-full"],
    )
    .await;
    client(&t.pg.url("postgres"))
        .await
        .batch_execute("CREATE ROLE certuser LOGIN SUPERUSER")
        .await
        .unwrap();
    let cert = t.ca.client("certuser", "certuser").unwrap();
    let url = format!("postgres://certuser@127.0.0.1:{}/postgres", t.pg.port());
    let ca = root(&t.ca_file());
    let table = unique("clientcert");
    let mut without = PgSink::new(config(&url, &table, &format!("&sslmode=verify-full{ca}")));
    let e = without.connect().await.unwrap_err();
    assert_eq!(e.class(), SinkErrorClass::Permanent, "{e}");
    let with = config(
        &url,
        &table,
        &format!(
            "&sslmode=verify-full{ca}&sslcert={}&sslkey={}",
            cert.cert.display(),
            cert.key.display()
        ),
    );
    let id = unique("tls");
    let log = open(&id);
    let want = epoch(&log.wal, 1, 0..10);
    let mut sink = PgSink::new(with);
    assert_eq!(deliver_ready(&log.wal, &mut sink).await.unwrap(), 1);
    assert_eq!(rows(&t.pg.url("postgres"), &table, &id, 0).await, want);
}

#[tokio::test(flavor = "multi_thread")]
#[cfg_attr(
    not(servers),
    ignore = "needs WALSINK_TEST_SERVERS=1 and the PostgreSQL binaries"
)]
async fn the_password_file_authenticates_with_scram_and_channel_binding_over_tls() {
    let password = format!("pw:{}\\x", unique("p"));
    let dir = tempfile::tempdir().unwrap();
    let ca = TestCa::new(dir.path(), "ca").unwrap();
    let server = ca
        .server("server", &["localhost", "127.0.0.1"], Validity::Current)
        .unwrap();
    let pg = Cluster::start_with(
        &[("password_encryption", "scram-sha-256")],
        &Setup {
            tls: Some((server.cert, server.key)),
            password: Some(password.clone()),
            hba: Some(vec!["host all all 127.0.0.1/32 scram-sha-256".into()]),
            ..Setup::default()
        },
    )
    .expect("start a private cluster with passwords");
    let table = unique("pgpass");
    let url = format!("postgres://postgres@127.0.0.1:{}/postgres", pg.port());
    let pgpass = dir.path().join("pgpass");
    let escaped = password.replace('\\', "\\\\").replace(':', "\\:");
    let write = |line: &str, mode: u32| {
        use std::os::unix::fs::PermissionsExt;
        std::fs::write(&pgpass, line).unwrap();
        std::fs::set_permissions(&pgpass, std::fs::Permissions::from_mode(mode)).unwrap();
    };
    let q = |extra: &str| {
        format!(
            "&passfile={}&sslmode=verify-full{}{extra}",
            pgpass.display(),
            root(&ca.ca_file())
        )
    };
    // No line for this port: no password, authentication fails (28P01 or no password given).
    write("127.0.0.1:1:*:postgres:nope\n", 0o600);
    let mut s = PgSink::new(config(&url, &table, &q("")));
    let e = s.connect().await.unwrap_err().to_string();
    assert!(!e.contains(&password), "{e}");
    // A matching line, with its colon and backslash escaped; channel binding required.
    let line = format!(
        "# walsink\n127.0.0.1:{}:postgres:postgres:{escaped}\n",
        pg.port()
    );
    write(&line, 0o600);
    let id = unique("tls");
    let log = open(&id);
    let want = epoch(&log.wal, 1, 0..10);
    let mut sink = PgSink::new(config(&url, &table, &q("&channel_binding=require")));
    assert!(!format!("{:?}", sink.config()).contains(&password));
    assert_eq!(deliver_ready(&log.wal, &mut sink).await.unwrap(), 1);
    let read = format!(
        "postgres://postgres:{}@127.0.0.1:{}/postgres",
        enc(&password),
        pg.port()
    );
    let (c, conn) = tokio_postgres::connect(&read, tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(conn);
    let n: i64 = c
        .query_one(
            &format!("SELECT count(*) FROM {table} WHERE sink_id = $1"),
            &[&id],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(n, want.len() as i64);
    // The same file open to the group is ignored, as libpq does: no password.
    write(&line, 0o640);
    let mut s = PgSink::new(config(&url, &table, &q("")));
    assert!(s.connect().await.is_err());
}

/// Percent-encodes every byte that is not alphanumeric.
fn enc(s: &str) -> String {
    s.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

/// A server that accepts TLS (answers `S` to the SSL request) and then never sends its half
/// of the handshake: `connect_timeout` bounds the handshake too, and the error says so
/// (retryable: such a server may come back).
#[tokio::test]
async fn connect_timeout_bounds_the_tls_handshake() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let server = tokio::spawn(async move {
        let (mut s, _) = listener.accept().await.unwrap();
        let mut request = [0u8; 8];
        s.read_exact(&mut request).await.unwrap();
        assert_eq!(&request[4..], &[0x04, 0xd2, 0x16, 0x2f], "an SSLRequest");
        s.write_all(b"S").await.unwrap();
        // Hold the connection without a ServerHello.
        let mut rest = Vec::new();
        let _ = s.read_to_end(&mut rest).await;
    });
    let url = format!("postgres://u@127.0.0.1:{port}/d");
    let mut sink = PgSink::new(config(&url, "t", "&sslmode=require&connect_timeout=1"));
    let e = sink.connect().await.unwrap_err();
    assert_eq!(e.class(), SinkErrorClass::Retryable, "{e}");
    assert!(e.to_string().contains("(connect_timeout)"), "{e}");
    drop(sink);
    server.abort();
}
