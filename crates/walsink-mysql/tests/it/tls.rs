//! TLS and passwords against private MariaDB servers (feature `testkit`): a server serving
//! a certificate of the kit's test CA for `127.0.0.1` only, where the sink's user has a
//! password holding `+`, `@`, `:` and `%` and may only connect over TLS (`REQUIRE SSL`),
//! while `root` reads back in plain text; and a server without TLS.
//!
//! Covered: delivery with `ssl_mode=verify_identity` and the right CA; a wrong CA and a host
//! name the certificate lacks each refused as a permanent error naming the reason, nothing
//! delivered, then delivered once the setting is fixed; `required` against a server without
//! TLS refused, `preferred` falling back to plain text there; the password from a file and
//! from the environment; no password in any error; a client certificate for a user that
//! requires one (`REQUIRE X509`).

use crate::common::*;
use walsink::{ErrorKind, SinkErrorClass};
use walsink_kit::testkit::{TestCa, Validity};
use walsink_mysql::testkit::Server;
use walsink_mysql::{Config, MySqlSink};
use walsink_tokio::deliver_ready;

/// The sink's user: TLS only, with a password that needs escaping in a URL.
const USER: &str = "walsink";
const PASSWORD: &str = "p+w@r:d%41x";

struct Tls {
    db: Server,
    ca: TestCa,
    dir: tempfile::TempDir,
}

impl Tls {
    fn start() -> Tls {
        let dir = tempfile::tempdir().unwrap();
        let ca = TestCa::new(dir.path(), "ca").unwrap();
        let server = ca
            .server("server", &["127.0.0.1"], Validity::Current)
            .unwrap();
        let db = Server::start(&[
            ("ssl-cert", &server.cert.display().to_string()),
            ("ssl-key", &server.key.display().to_string()),
            ("ssl-ca", &ca.ca_file().display().to_string()),
        ])
        .expect("a private MariaDB with TLS");
        db.execute(&format!(
            "CREATE USER '{USER}'@'%' IDENTIFIED BY '{PASSWORD}' REQUIRE SSL; GRANT ALL ON *.* TO '{USER}'@'%'"
        ))
        .unwrap();
        Tls { db, ca, dir }
    }

    fn password_file(&self) -> String {
        let f = self.dir.path().join("pw");
        std::fs::write(&f, format!("{PASSWORD}\n")).unwrap();
        f.display().to_string()
    }

    /// The sink's URL to `host` with the password from the file.
    fn config(&self, host: &str, table: &str, query: &str) -> Config {
        Config::from_url(&format!(
            "mysql://{USER}@{host}:{}/test?table={table}&password_file={}{query}",
            self.db.port(),
            self.password_file()
        ))
        .unwrap()
    }
}

fn sink_error(e: &walsink::Error) -> &walsink::SinkError {
    match e.kind() {
        ErrorKind::Sink(s) => s,
        other => panic!("not a sink error: {other:?}"),
    }
}

/// `bad` is refused, permanent and naming `reason`, nothing delivered; then `fixed` delivers.
async fn refused_then_delivered(t: &Tls, table: &str, bad: Config, fixed: Config, reason: &str) {
    let id = unique("tls");
    let log = open(&id);
    let want = epoch(&log.wal, 1, 0..20);
    let mut sink = MySqlSink::new(bad);
    let e = deliver_ready(&log.wal, &mut sink).await.unwrap_err();
    assert_eq!(sink_error(&e).class(), SinkErrorClass::Permanent, "{e}");
    let text = format!("{e} {e:?}");
    assert!(text.contains(reason), "{reason:?} named in: {e}");
    assert!(text.contains("TLS"), "{e}");
    assert!(!text.contains(PASSWORD), "no password in: {text}");
    assert_eq!(log.wal.health().committed, None, "nothing skipped");
    let mut sink = MySqlSink::new(fixed);
    assert_eq!(deliver_ready(&log.wal, &mut sink).await.unwrap(), 1);
    assert_eq!(rows(&t.db.url(), table, &id, 0).await, want);
}

#[tokio::test(flavor = "multi_thread")]
#[cfg_attr(
    not(servers),
    ignore = "needs WALSINK_TEST_SERVERS=1 and the MariaDB binaries"
)]
async fn verified_tls_refuses_a_wrong_ca_and_a_wrong_host() {
    let t = Tls::start();
    let table = unique("tls");
    let right = format!("&ssl_ca={}", t.ca.ca_file().display());
    let other = TestCa::new(t.dir.path(), "other").unwrap();
    let wrong = format!("&ssl_ca={}", other.ca_file().display());

    // The right CA: verified, delivered (the user may only connect over TLS).
    let id = unique("tls");
    let log = open(&id);
    let want = epoch(&log.wal, 1, 0..50);
    let mut sink = MySqlSink::new(t.config("127.0.0.1", &table, &right));
    assert_eq!(
        t.config("127.0.0.1", &table, &right).ssl_mode.name(),
        "verify_identity"
    );
    assert_eq!(deliver_ready(&log.wal, &mut sink).await.unwrap(), 1);
    assert_eq!(rows(&t.db.url(), &table, &id, 0).await, want);

    refused_then_delivered(
        &t,
        &table,
        t.config("127.0.0.1", &table, &wrong),
        t.config("127.0.0.1", &table, &right),
        "not signed by a trusted CA",
    )
    .await;
    refused_then_delivered(
        &t,
        &table,
        t.config(
            "localhost",
            &table,
            &format!("{right}&ssl_mode=verify_identity"),
        ),
        t.config(
            "127.0.0.1",
            &table,
            &format!("{right}&ssl_mode=verify_identity"),
        ),
        "does not carry the host name",
    )
    .await;
    // required: encrypted, the certificate unverified (a wrong CA does not matter).
    let id = unique("tls");
    let log = open(&id);
    let want = epoch(&log.wal, 1, 0..5);
    let mut sink =
        MySqlSink::new(t.config("localhost", &table, &format!("{wrong}&ssl_mode=required")));
    assert_eq!(deliver_ready(&log.wal, &mut sink).await.unwrap(), 1);
    assert_eq!(rows(&t.db.url(), &table, &id, 0).await, want);
}

#[tokio::test(flavor = "multi_thread")]
#[cfg_attr(
    not(servers),
    ignore = "needs WALSINK_TEST_SERVERS=1 and the MariaDB binaries"
)]
async fn the_password_comes_from_the_environment_and_never_shows() {
    let t = Tls::start();
    let table = unique("tls");
    let var = format!("WALSINK_TEST_MYSQL_PW_{}", std::process::id());
    std::env::set_var(&var, PASSWORD);
    let url = |pw_env: &str| {
        format!(
            "mysql://{USER}@127.0.0.1:{}/test?table={table}&password_env={pw_env}&ssl_mode=required",
            t.db.port()
        )
    };
    let id = unique("env");
    let log = open(&id);
    let want = epoch(&log.wal, 1, 0..10);
    let c = Config::from_url(&url(&var)).unwrap();
    assert!(!format!("{c} {c:?}").contains(PASSWORD));
    let mut sink = MySqlSink::new(c);
    assert_eq!(deliver_ready(&log.wal, &mut sink).await.unwrap(), 1);
    assert_eq!(rows(&t.db.url(), &table, &id, 0).await, want);

    // A wrong password: refused by the server (1045), permanent, no password shown.
    let wrong = format!("{var}_WRONG");
    std::env::set_var(&wrong, format!("{PASSWORD}-not"));
    let log = open(&unique("env"));
    epoch(&log.wal, 1, 0..1);
    let mut sink = MySqlSink::new(Config::from_url(&url(&wrong)).unwrap());
    let e = deliver_ready(&log.wal, &mut sink).await.unwrap_err();
    let text = format!("{e} {e:?}");
    assert!(text.contains("1045"), "{text}");
    assert_eq!(sink_error(&e).class(), SinkErrorClass::Permanent, "{e}");
    assert!(!text.contains(PASSWORD), "{text}");
}

#[tokio::test(flavor = "multi_thread")]
#[cfg_attr(
    not(servers),
    ignore = "needs WALSINK_TEST_SERVERS=1 and the MariaDB binaries"
)]
async fn required_tls_is_refused_by_a_server_without_it() {
    let db = Server::start(&[]).expect("a private MariaDB without TLS");
    let table = unique("notls");
    let url = |mode: &str| {
        Config::from_url(&format!("{}?table={table}&ssl_mode={mode}", db.url())).unwrap()
    };
    let id = unique("notls");
    let log = open(&id);
    let want = epoch(&log.wal, 1, 0..10);
    for mode in ["required", "verify_identity"] {
        let mut sink = MySqlSink::new(url(mode));
        let e = deliver_ready(&log.wal, &mut sink).await.unwrap_err();
        assert_eq!(sink_error(&e).class(), SinkErrorClass::Permanent, "{e}");
        assert!(e.to_string().contains("offers no TLS"), "{e}");
        assert!(e.to_string().contains(mode), "{e}");
        assert_eq!(log.wal.health().committed, None);
    }
    let mut sink = MySqlSink::new(url("preferred"));
    assert_eq!(deliver_ready(&log.wal, &mut sink).await.unwrap(), 1);
    assert_eq!(rows(&db.url(), &table, &id, 0).await, want);
}

#[tokio::test(flavor = "multi_thread")]
#[cfg_attr(
    not(servers),
    ignore = "needs WALSINK_TEST_SERVERS=1 and the MariaDB binaries"
)]
async fn a_client_certificate_is_presented_when_the_user_requires_one() {
    let t = Tls::start();
    t.db.execute("CREATE USER 'x509'@'%' REQUIRE X509; GRANT ALL ON *.* TO 'x509'@'%'")
        .unwrap();
    let client = t.ca.client("client", "x509").unwrap();
    let table = unique("x509");
    let url = |query: &str| {
        Config::from_url(&format!(
            "mysql://x509@127.0.0.1:{}/test?table={table}&ssl_ca={}{query}",
            t.db.port(),
            t.ca.ca_file().display()
        ))
        .unwrap()
    };
    let id = unique("x509");
    let log = open(&id);
    let want = epoch(&log.wal, 1, 0..10);
    // Without the certificate the server refuses the user (1045), permanent.
    let mut sink = MySqlSink::new(url(""));
    let e = deliver_ready(&log.wal, &mut sink).await.unwrap_err();
    assert_eq!(sink_error(&e).class(), SinkErrorClass::Permanent, "{e}");
    assert!(e.to_string().contains("1045"), "{e}");
    assert_eq!(log.wal.health().committed, None);
    let with = format!(
        "&ssl_cert={}&ssl_key={}",
        client.cert.display(),
        client.key.display()
    );
    let mut sink = MySqlSink::new(url(&with));
    assert_eq!(deliver_ready(&log.wal, &mut sink).await.unwrap(), 1);
    assert_eq!(rows(&t.db.url(), &table, &id, 0).await, want);
}
