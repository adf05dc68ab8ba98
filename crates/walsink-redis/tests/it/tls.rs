//! `rediss://` against a private TLS `redis-server` (the installed binary, started on free
//! ports with certificates made by the kit's testkit; see `walsink_redis::testkit`): records
//! delivered with verify=full against the test CA, each certificate problem named with the
//! parameter that fixes it, verify=ca and verify=none, a client certificate, and passwords
//! from a file or the environment that reach the server unchanged.

use crate::common::{log, numbered, seal, sink_id};
use std::path::Path;
use walsink::SinkErrorClass;
use walsink_kit::testkit::{Issued, TestCa, Validity};
use walsink_redis::testkit::{Server, ServerTls};
use walsink_redis::{Config, RedisSink};
use walsink_tokio::deliver_ready;

/// A CA, a server certificate for `names` and a private server using it.
struct Setup {
    dir: tempfile::TempDir,
    ca: TestCa,
    server: Server,
}

fn setup(names: &[&str], validity: Validity, auth_clients: bool, args: &[&str]) -> Setup {
    let dir = tempfile::tempdir().unwrap();
    let ca = TestCa::new(dir.path(), "ca").unwrap();
    let Issued { cert, key } = ca.server("server", names, validity).unwrap();
    let tls = ServerTls {
        cert,
        key,
        ca: ca.ca_file(),
        auth_clients,
    };
    let server = Server::start(Some(&tls), args).expect("a private redis-server with TLS");
    Setup { dir, ca, server }
}

fn ca_param(p: &Path) -> String {
    format!("&ca_file={}", p.display())
}

/// The list at `key` on the private server (through its plain port).
async fn list(server: &Server, password: Option<&str>, key: &str) -> Vec<Vec<u8>> {
    let mut info = redis::IntoConnectionInfo::into_connection_info(server.url()).unwrap();
    if let Some(p) = password {
        let r = info.redis_settings().clone().set_password(p);
        info = info.set_redis_settings(r);
    }
    let mut c = redis::Client::open(info)
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    redis::cmd("LRANGE")
        .arg(key)
        .arg(0)
        .arg(-1)
        .query_async(&mut c)
        .await
        .unwrap()
}

fn sink(url: &str) -> RedisSink {
    RedisSink::new(Config::from_url(url).unwrap()).unwrap()
}

/// Connects a sink for `url` and returns the error it must give.
async fn connect_error(url: &str) -> walsink::SinkError {
    let mut s = sink(url);
    s.connect()
        .await
        .expect_err("the connection must be refused")
}

#[tokio::test(flavor = "multi_thread")]
#[cfg_attr(not(servers), ignore = "needs WALSINK_TEST_SERVERS=1 and redis-server")]
async fn records_are_delivered_over_tls_with_verify_full() {
    let t = setup(&["localhost", "127.0.0.1"], Validity::Current, false, &[]);
    let id = sink_id("tls-full");
    let (_d, wal) = log(&id);
    let want = numbered(0, 5_000);
    seal(&wal, 1, &want[..3_000]);
    seal(&wal, 2, &want[3_000..]);
    for host in ["localhost", "127.0.0.1"] {
        let key = format!("walsink-test:{id}:{host}");
        let url = format!(
            "{}?key={key}&chunk_records=100{}",
            t.server.tls_url(host),
            ca_param(&t.ca.ca_file())
        );
        let mut s = sink(&url);
        s.connect().await.unwrap();
        assert_eq!(s.stats().connects, 1);
        if host == "localhost" {
            assert_eq!(deliver_ready(&wal, &mut s).await.unwrap(), 2);
            assert_eq!(list(&t.server, None, &key).await, want);
        }
    }
}

#[tokio::test(flavor = "multi_thread")]
#[cfg_attr(not(servers), ignore = "needs WALSINK_TEST_SERVERS=1 and redis-server")]
async fn each_certificate_problem_is_named_with_the_parameter_that_fixes_it() {
    let t = setup(&["localhost", "127.0.0.1"], Validity::Current, false, &[]);
    let other = TestCa::new(t.dir.path(), "other").unwrap();
    let base = format!(
        "{}?key=walsink-test:{}",
        t.server.tls_url("localhost"),
        sink_id("tls-bad")
    );

    // A CA that did not sign the server's certificate, and no CA file (the public roots).
    for url in [
        format!("{base}{}", ca_param(&other.ca_file())),
        base.clone(),
    ] {
        let e = connect_error(&url).await;
        assert_eq!(e.class(), SinkErrorClass::Permanent, "{e}");
        let m = e.to_string();
        assert!(
            m.contains("not signed by a trusted CA") && m.contains("ca_file="),
            "{m}"
        );
    }
    // verify=none accepts it (encrypted, not authenticated).
    sink(&format!("{base}{}&verify=none", ca_param(&other.ca_file())))
        .connect()
        .await
        .unwrap();

    // A host name the certificate does not carry: verify=ca accepts it.
    let Issued { cert, key } =
        t.ca.server("elsewhere", &["db.example"], Validity::Current)
            .unwrap();
    set_certificate(&t.server, &cert, &key);
    let e = connect_error(&format!("{base}{}", ca_param(&t.ca.ca_file()))).await;
    assert_eq!(e.class(), SinkErrorClass::Permanent, "{e}");
    let m = e.to_string();
    assert!(
        m.contains("does not carry the host name") && m.contains("verify=ca"),
        "{m}"
    );
    sink(&format!("{base}{}&verify=ca", ca_param(&t.ca.ca_file())))
        .connect()
        .await
        .unwrap();

    // An expired certificate: retryable (renewing it on the server fixes it), and verify=ca
    // does not accept it either.
    let Issued { cert, key } =
        t.ca.server("expired", &["localhost", "127.0.0.1"], Validity::Expired)
            .unwrap();
    set_certificate(&t.server, &cert, &key);
    for verify in ["", "&verify=ca"] {
        let e = connect_error(&format!("{base}{}{verify}", ca_param(&t.ca.ca_file()))).await;
        eprintln!("{e}");
        assert_eq!(e.class(), SinkErrorClass::Retryable, "{e}");
        assert!(e.to_string().contains("certificate has expired"), "{e}");
    }
}

/// Points the private server at another certificate (new connections use it).
fn set_certificate(server: &Server, cert: &Path, key: &Path) {
    let r = server
        .command(&[
            "CONFIG",
            "SET",
            "tls-cert-file",
            cert.to_str().unwrap(),
            "tls-key-file",
            key.to_str().unwrap(),
        ])
        .unwrap();
    assert_eq!(r, "+OK");
}

#[tokio::test(flavor = "multi_thread")]
#[cfg_attr(not(servers), ignore = "needs WALSINK_TEST_SERVERS=1 and redis-server")]
async fn a_server_that_asks_for_a_client_certificate_gets_one() {
    let t = setup(&["localhost"], Validity::Current, true, &[]);
    let id = sink_id("tls-client");
    let key = format!("walsink-test:{id}");
    let base = format!(
        "{}?key={key}{}",
        t.server.tls_url("localhost"),
        ca_param(&t.ca.ca_file())
    );
    let e = connect_error(&base).await;
    assert_eq!(e.class(), SinkErrorClass::Permanent, "{e}");
    let m = e.to_string();
    eprintln!("{m}");
    assert!(m.contains("cert_file=") && m.contains("TLS"), "{m}");

    // A certificate of another CA is refused too.
    let other = TestCa::new(t.dir.path(), "other").unwrap();
    let foreign = other.client("foreign", "walsink").unwrap();
    let e = connect_error(&format!(
        "{base}&cert_file={}&key_file={}",
        foreign.cert.display(),
        foreign.key.display()
    ))
    .await;
    eprintln!("{e}");
    assert_eq!(e.class(), SinkErrorClass::Permanent, "{e}");

    let client = t.ca.client("client", "walsink").unwrap();
    let url = format!(
        "{base}&cert_file={}&key_file={}",
        client.cert.display(),
        client.key.display()
    );
    let (_d, wal) = log(&id);
    let want = numbered(0, 1_000);
    seal(&wal, 1, &want);
    let mut s = sink(&url);
    assert_eq!(deliver_ready(&wal, &mut s).await.unwrap(), 1);
    assert_eq!(list(&t.server, None, &key).await, want);
}

#[tokio::test(flavor = "multi_thread")]
#[cfg_attr(not(servers), ignore = "needs WALSINK_TEST_SERVERS=1 and redis-server")]
async fn passwords_with_plus_and_space_reach_the_server_unchanged() {
    let pw = "p+ss w@rd:%";
    let t = setup(
        &["localhost"],
        Validity::Current,
        false,
        &["--requirepass", pw],
    );
    let file = t.dir.path().join("password");
    std::fs::write(&file, format!("{pw}\n")).unwrap();
    std::env::set_var("WALSINK_REDIS_TLS_TEST_PW", pw);
    let id = sink_id("tls-pw");
    let base = format!("{}{}", t.server.tls_url("localhost"), "");
    let ca = ca_param(&t.ca.ca_file());
    let inline = format!(
        "rediss://:{}@localhost:{}/0",
        "p+ss%20w%40rd%3A%25",
        t.server.tls_port().unwrap()
    );
    for (n, url) in [
        format!("{inline}?key=walsink-test:{id}:0{ca}"),
        format!(
            "{base}?key=walsink-test:{id}:1{ca}&password_file={}",
            file.display()
        ),
        format!("{base}?key=walsink-test:{id}:2{ca}&password_env=WALSINK_REDIS_TLS_TEST_PW"),
        // The plain port takes the same password the same way.
        format!(
            "redis://:p+ss%20w%40rd%3A%25@127.0.0.1:{}/0?key=walsink-test:{id}:3",
            t.server.port()
        ),
    ]
    .iter()
    .enumerate()
    {
        let (_d, wal) = log(&id);
        let want = numbered(0, 10);
        seal(&wal, 1, &want);
        let mut s = sink(url);
        assert_eq!(deliver_ready(&wal, &mut s).await.unwrap(), 1, "{url}");
        assert_eq!(
            list(&t.server, Some(pw), &format!("walsink-test:{id}:{n}")).await,
            want
        );
    }
    // A wrong password is permanent, and the error shows neither.
    std::env::set_var("WALSINK_REDIS_TLS_TEST_WRONG", "not-the+password");
    let e = connect_error(&format!(
        "{base}?key=k{ca}&password_env=WALSINK_REDIS_TLS_TEST_WRONG"
    ))
    .await;
    assert_eq!(e.class(), SinkErrorClass::Permanent, "{e}");
    let m = format!("{e} {e:?}");
    assert!(!m.contains("not-the") && !m.contains("w@rd"), "{m}");
}

#[tokio::test(flavor = "multi_thread")]
#[cfg_attr(not(servers), ignore = "needs WALSINK_TEST_SERVERS=1 and redis-server")]
async fn tls_connections_killed_mid_epoch_still_give_each_record_once() {
    let t = setup(&["localhost"], Validity::Current, false, &[]);
    let id = sink_id("tls-kill");
    let key = format!("walsink-test:{id}");
    let (_d, wal) = log(&id);
    let want = numbered(0, 20_000);
    seal(&wal, 1, &want[..15_000]);
    seal(&wal, 2, &want[15_000..]);
    let mut c = Config::from_url(&format!(
        "{}?key={key}{}",
        t.server.tls_url("localhost"),
        ca_param(&t.ca.ca_file())
    ))
    .unwrap();
    c.chunk_records = 50;
    c.in_flight = 2;
    let mut s = RedisSink::new(c).unwrap();
    let server = std::sync::Arc::new(t.server);
    let mut rng = fastrand::Rng::with_seed(11);
    let (mut kills, mut failures, mut attempts) = (0u32, 0u32, 0u32);
    loop {
        attempts += 1;
        assert!(attempts < 100, "no progress after {attempts} attempts");
        s.connect().await.expect("connect");
        let cid = s.client_id().unwrap().to_string();
        let delay = std::time::Duration::from_micros(rng.u64(200..20_000));
        let kill = attempts <= 12;
        let srv = server.clone();
        let killer = tokio::spawn(async move {
            if !kill {
                return 0;
            }
            tokio::time::sleep(delay).await;
            tokio::task::spawn_blocking(move || srv.command(&["CLIENT", "KILL", "ID", &cid]))
                .await
                .unwrap()
                .map(|r| u32::from(r == ":1"))
                .unwrap()
        });
        let r = deliver_ready(&wal, &mut s).await;
        kills += killer.await.unwrap();
        match r {
            Ok(_) if wal.health().committed == Some(2) => break,
            Ok(_) => {}
            Err(e) => {
                failures += 1;
                let msg = e.to_string();
                assert!(
                    msg.contains("retryable"),
                    "a lost connection is retryable: {msg}"
                );
            }
        }
    }
    assert_eq!(
        list(&server, None, &key).await,
        want,
        "each record once, in order"
    );
    eprintln!(
        "over TLS: {kills} connections killed, {failures} failed deliveries, {attempts} attempts, stats {:?}",
        s.stats()
    );
    assert!(kills >= 3, "too few kills landed: {kills}");
}
