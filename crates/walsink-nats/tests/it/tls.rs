//! Against a private `nats-server` with JetStream and TLS (`walsink_nats::testkit`, started
//! from the installed binary on a free port, certificates from the kit's testkit): records
//! delivered with verify-full; a wrong CA, an expired certificate and a host name the
//! certificate does not carry each refused naming the reason, nothing delivered, and every
//! record delivered once the setting (or the certificate) is fixed; verify=ca and
//! verify=none; a client certificate for a server that demands one; TLS demanded of a
//! server without it.

use crate::common::{log, numbered, seal};
use std::path::Path;
use walsink::SinkErrorClass;
use walsink_kit::testkit::{TestCa, Validity};
use walsink_kit::TlsOptions;
use walsink_nats::testkit::{ServerTls, TlsServer};
use walsink_nats::{Config, NatsSink};
use walsink_tokio::conformance::{run_all, Harness};

const UNKNOWN_CA: &str = "not signed by a trusted CA";
const EXPIRED: &str = "certificate has expired";
const WRONG_HOST: &str = "does not carry the host name";

fn trusting(ca: &Path) -> TlsOptions {
    TlsOptions {
        ca_file: Some(ca.to_path_buf()),
        ..TlsOptions::default()
    }
}

fn names() -> (String, String) {
    let u = walsink_tokio::conformance::unique_id("tls").replace(['.', '-'], "_");
    (format!("WALSINK_TLS_{u}"), format!("walsink-tls.{u}"))
}

fn sink(url: &str) -> NatsSink {
    NatsSink::new(Config::from_url(url).unwrap()).unwrap()
}

/// The error of connecting with `url`, which must be permanent and name `reason`.
async fn refused(url: &str, reason: &str) -> String {
    let e = sink(url).connect().await.unwrap_err();
    let msg = e.to_string();
    assert!(msg.contains(reason), "{url}: {msg}");
    assert_eq!(e.class(), SinkErrorClass::Permanent, "{msg}");
    eprintln!("refused as expected: {msg}");
    msg
}

#[tokio::test(flavor = "multi_thread")]
#[cfg_attr(
    not(servers),
    ignore = "needs WALSINK_TEST_SERVERS=1 and the installed nats-server"
)]
async fn records_arrive_over_tls_with_verify_full() {
    let dir = tempfile::tempdir().unwrap();
    let ca = TestCa::new(dir.path(), "ca").unwrap();
    let cert = ca
        .server("nats", &["localhost", "127.0.0.1"], Validity::Current)
        .unwrap();
    let server = TlsServer::start(dir.path(), &ServerTls::new(&cert)).unwrap();
    let (stream, subject) = names();
    let (_d, wal) = log("tls-full");
    let want = numbered(0, 300);
    seal(&wal, 1, &want[..100]);
    seal(&wal, 2, &want[100..]);
    // By address and by name: the certificate carries both, and verify-full checks them.
    for host in ["127.0.0.1", "localhost"] {
        let url = format!(
            "tls://{host}:{}/?stream={stream}&subject={subject}&create=true&ca_file={}",
            server.port(),
            ca.ca_file().display()
        );
        let mut s = sink(&url);
        s.connect().await.unwrap();
        assert!(s.config().tls.is_some());
    }
    let url = format!(
        "nats://127.0.0.1:{}/?stream={stream}&subject={subject}&tls=true&verify=full&ca_file={}",
        server.port(),
        ca.ca_file().display()
    );
    let mut s = sink(&url);
    assert_eq!(walsink_tokio::deliver_ready(&wal, &mut s).await.unwrap(), 2);
    let got = server
        .read_stream(&trusting(&ca.ca_file()), &stream)
        .await
        .unwrap();
    let payloads: Vec<Vec<u8>> = got.into_iter().map(|(_, p)| p).collect();
    assert_eq!(payloads, want);
}

struct TlsHarness {
    server: TlsServer,
    ca: std::path::PathBuf,
    stream: String,
    subject: String,
}

impl Harness for TlsHarness {
    type Sink = NatsSink;

    async fn sink(&self, _sink_id: &str) -> NatsSink {
        let mut s = sink(&format!(
            "tls://127.0.0.1:{}/?stream={}&subject={}&ca_file={}",
            self.server.port(),
            self.stream,
            self.subject,
            self.ca.display()
        ));
        s.connect().await.expect("connect over TLS");
        s
    }

    async fn read_back(&self, sink_id: &str, subtask: u32) -> Vec<Vec<u8>> {
        let prefix = format!("{sink_id}:{subtask}:");
        let mut seen = std::collections::HashSet::new();
        self.server
            .read_stream(&trusting(&self.ca), &self.stream)
            .await
            .unwrap()
            .into_iter()
            .filter(|(id, _)| id.starts_with(&prefix))
            .map(|(id, p)| {
                assert!(seen.insert(id.clone()), "message id {id} stored twice");
                p
            })
            .collect()
    }
}

#[tokio::test(flavor = "multi_thread")]
#[cfg_attr(
    not(servers),
    ignore = "needs WALSINK_TEST_SERVERS=1 and the installed nats-server"
)]
async fn the_sink_conforms_over_tls() {
    let dir = tempfile::tempdir().unwrap();
    let ca = TestCa::new(dir.path(), "ca").unwrap();
    let cert = ca
        .server("nats", &["127.0.0.1"], Validity::Current)
        .unwrap();
    let server = TlsServer::start(dir.path(), &ServerTls::new(&cert)).unwrap();
    let (stream, subject) = names();
    server
        .create_stream(&trusting(&ca.ca_file()), &stream, &subject)
        .await
        .unwrap();
    let h = TlsHarness {
        server,
        ca: ca.ca_file(),
        stream,
        subject,
    };
    run_all(&h).await;
}

#[tokio::test(flavor = "multi_thread")]
#[cfg_attr(
    not(servers),
    ignore = "needs WALSINK_TEST_SERVERS=1 and the installed nats-server"
)]
async fn a_wrong_ca_an_expired_certificate_and_a_wrong_host_are_named_and_nothing_is_lost() {
    let dir = tempfile::tempdir().unwrap();
    let ca = TestCa::new(dir.path(), "ca").unwrap();
    let other = TestCa::new(dir.path(), "other").unwrap();
    let good = ca
        .server("good", &["localhost", "127.0.0.1"], Validity::Current)
        .unwrap();
    let mut server = TlsServer::start(dir.path(), &ServerTls::new(&good)).unwrap();
    let (stream, subject) = names();
    let trust = trusting(&ca.ca_file());
    server
        .create_stream(&trust, &stream, &subject)
        .await
        .unwrap();
    let port = server.port();
    let url = |host: &str, ca_file: &Path, extra: &str| {
        format!(
            "tls://{host}:{port}/?stream={stream}&subject={subject}&ca_file={}{extra}",
            ca_file.display()
        )
    };
    let (_d, wal) = log("tls-bad");
    let want = numbered(0, 50);
    seal(&wal, 1, &want[..20]);

    // A CA that did not sign the server's certificate: refused, nothing delivered.
    let wrong_ca = url("127.0.0.1", &other.ca_file(), "");
    refused(&wrong_ca, UNKNOWN_CA).await;
    let e = walsink_tokio::deliver_ready(&wal, &mut sink(&wrong_ca))
        .await
        .unwrap_err();
    assert!(e.to_string().contains(UNKNOWN_CA), "{e}");
    // No CA file: only the Mozilla roots are trusted, which did not sign it either; and a
    // plain nats:// URL to a server that demands TLS is held to the same verification.
    refused(
        &format!(
            "tls://127.0.0.1:{}/?stream={stream}&subject={subject}",
            server.port()
        ),
        UNKNOWN_CA,
    )
    .await;
    refused(
        &format!(
            "nats://127.0.0.1:{}/?stream={stream}&subject={subject}",
            server.port()
        ),
        UNKNOWN_CA,
    )
    .await;
    assert!(server
        .read_stream(&trust, &stream)
        .await
        .unwrap()
        .is_empty());
    // verify=none trusts anything (encrypted, unauthenticated).
    sink(&url("127.0.0.1", &other.ca_file(), "&verify=none"))
        .connect()
        .await
        .unwrap();
    // Fixed: the right CA delivers the epoch.
    let right = url("127.0.0.1", &ca.ca_file(), "");
    assert_eq!(
        walsink_tokio::deliver_ready(&wal, &mut sink(&right))
            .await
            .unwrap(),
        1
    );

    // A certificate for another name than the one connected to.
    let elsewhere = ca
        .server("elsewhere", &["localhost"], Validity::Current)
        .unwrap();
    server.restart(&ServerTls::new(&elsewhere)).unwrap();
    seal(&wal, 2, &want[20..35]);
    let by_address = url("127.0.0.1", &ca.ca_file(), "");
    refused(&by_address, WRONG_HOST).await;
    assert!(walsink_tokio::deliver_ready(&wal, &mut sink(&by_address))
        .await
        .is_err());
    // verify=ca accepts it (the chain is right); connecting by the name it carries too.
    sink(&url("127.0.0.1", &ca.ca_file(), "&verify=ca"))
        .connect()
        .await
        .unwrap();
    let by_name = url("localhost", &ca.ca_file(), "");
    assert_eq!(
        walsink_tokio::deliver_ready(&wal, &mut sink(&by_name))
            .await
            .unwrap(),
        1
    );

    // An expired certificate: refused until the server has a current one.
    let expired = ca
        .server("expired", &["localhost", "127.0.0.1"], Validity::Expired)
        .unwrap();
    server.restart(&ServerTls::new(&expired)).unwrap();
    seal(&wal, 3, &want[35..]);
    refused(&right, EXPIRED).await;
    assert!(walsink_tokio::deliver_ready(&wal, &mut sink(&right))
        .await
        .is_err());
    server.restart(&ServerTls::new(&good)).unwrap();
    assert_eq!(
        walsink_tokio::deliver_ready(&wal, &mut sink(&right))
            .await
            .unwrap(),
        1
    );

    let got = server.read_stream(&trust, &stream).await.unwrap();
    let mut ids = std::collections::HashSet::new();
    assert!(
        got.iter().all(|(id, _)| ids.insert(id.clone())),
        "an id twice"
    );
    let payloads: Vec<Vec<u8>> = got.into_iter().map(|(_, p)| p).collect();
    assert_eq!(payloads, want, "every record once, in order");
}

#[tokio::test(flavor = "multi_thread")]
#[cfg_attr(
    not(servers),
    ignore = "needs WALSINK_TEST_SERVERS=1 and the installed nats-server"
)]
async fn a_client_certificate_is_sent_to_a_server_that_demands_one() {
    let dir = tempfile::tempdir().unwrap();
    let ca = TestCa::new(dir.path(), "ca").unwrap();
    let cert = ca
        .server("nats", &["127.0.0.1"], Validity::Current)
        .unwrap();
    let client = ca.client("client", "walsink").unwrap();
    let tls = ServerTls::new(&cert).verify_clients(&ca.ca_file());
    let server = TlsServer::start(dir.path(), &tls).unwrap();
    let (stream, subject) = names();
    let with_cert = TlsOptions {
        ca_file: Some(ca.ca_file()),
        cert_file: Some(client.cert.clone()),
        key_file: Some(client.key.clone()),
        ..TlsOptions::default()
    };
    let base = format!(
        "tls://127.0.0.1:{}/?stream={stream}&subject={subject}&create=true&ca_file={}",
        server.port(),
        ca.ca_file().display()
    );
    // Without a certificate the server ends the handshake.
    let e = sink(&base).connect().await.unwrap_err();
    eprintln!("refused as expected: {e}");
    assert!(e.to_string().contains("refused the TLS handshake"), "{e}");
    assert_eq!(e.class(), SinkErrorClass::Permanent, "{e}");
    let url = format!(
        "{base}&cert_file={}&key_file={}",
        client.cert.display(),
        client.key.display()
    );
    let (_d, wal) = log("tls-client");
    seal(&wal, 1, &numbered(0, 25));
    assert_eq!(
        walsink_tokio::deliver_ready(&wal, &mut sink(&url))
            .await
            .unwrap(),
        1
    );
    let got = server.read_stream(&with_cert, &stream).await.unwrap();
    assert_eq!(got.len(), 25);
}

#[tokio::test(flavor = "multi_thread")]
#[cfg_attr(
    not(servers),
    ignore = "needs WALSINK_TEST_SERVERS=1 and a local NATS with JetStream"
)]
async fn tls_demanded_of_a_server_without_it_is_refused() {
    let (stream, subject) = names();
    let e = sink(&format!(
        "tls://{}/?stream={stream}&subject={subject}&timeout=3s",
        crate::common::ADDR
    ))
    .connect()
    .await
    .unwrap_err();
    let msg = e.to_string();
    eprintln!("refused as expected: {msg}");
    assert!(msg.contains("does not answer in TLS"), "{msg}");
    assert_eq!(e.class(), SinkErrorClass::Permanent, "{msg}");
}

/// The password reaches the server from the URL (with a `+` in it, which form decoding
/// turned into a space), from `password_file` and from `password_env`; a wrong one is
/// refused without showing it.
#[tokio::test(flavor = "multi_thread")]
#[cfg_attr(
    not(servers),
    ignore = "needs WALSINK_TEST_SERVERS=1 and the installed nats-server"
)]
async fn a_password_from_the_url_a_file_or_the_environment_logs_in() {
    let dir = tempfile::tempdir().unwrap();
    let ca = TestCa::new(dir.path(), "ca").unwrap();
    let cert = ca
        .server("nats", &["127.0.0.1"], Validity::Current)
        .unwrap();
    let password = "s3cr+t pw";
    let server =
        TlsServer::start(dir.path(), &ServerTls::new(&cert).user("bob", password)).unwrap();
    let (stream, subject) = names();
    let base = |auth: &str, extra: &str| {
        format!(
            "tls://{auth}127.0.0.1:{}/?stream={stream}&subject={subject}&create=true&ca_file={}{extra}",
            server.port(),
            ca.ca_file().display()
        )
    };
    let file = dir.path().join("pw");
    std::fs::write(&file, format!("{password}\n")).unwrap();
    let var = format!("WALSINK_NATS_TLS_TEST_PW_{}", std::process::id());
    std::env::set_var(&var, password);
    for url in [
        base("bob:s3cr+t%20pw@", ""),
        base("bob@", &format!("&password_file={}", file.display())),
        base("bob@", &format!("&password_env={var}")),
    ] {
        sink(&url)
            .connect()
            .await
            .unwrap_or_else(|e| panic!("{url}: {e}"));
    }
    let wrong = dir.path().join("wrong");
    std::fs::write(&wrong, "not-the-password").unwrap();
    let e = sink(&base(
        "bob@",
        &format!("&password_file={}", wrong.display()),
    ))
    .connect()
    .await
    .unwrap_err();
    let msg = e.to_string();
    assert_eq!(e.class(), SinkErrorClass::Permanent, "{msg}");
    assert!(msg.contains("check the user, password"), "{msg}");
    assert!(
        !msg.contains("not-the-password") && !msg.contains(password),
        "{msg}"
    );
    std::env::remove_var(&var);
}
