//! `walsink pipe --sink rediss://…` against a private TLS redis-server (started from the
//! installed binary on free ports with certificates made by the kit's testkit, removed at the
//! end): a wrong CA, an expired certificate and a wrong host name each end the run with the
//! reason named and nothing lost, and the same log delivers every line once when the setting
//! is fixed; a server that asks for a client certificate; and a SIGKILL loop over TLS that
//! ends with every line in the list exactly once.

use crate::common::*;
use std::path::Path;
use std::process::Output;
use walsink_kit::testkit::{Issued, TestCa, Validity};
use walsink_redis::testkit::{Server, ServerTls};

/// A test CA and a private server with a current certificate for localhost and 127.0.0.1.
fn tls_server(dir: &Path, auth_clients: bool) -> (TestCa, Server) {
    let ca = TestCa::new(dir, "ca").unwrap();
    let Issued { cert, key } = ca
        .server("server", &["localhost", "127.0.0.1"], Validity::Current)
        .unwrap();
    let tls = ServerTls {
        cert,
        key,
        ca: ca.ca_file(),
        auth_clients,
    };
    let server = Server::start(Some(&tls), &[]).expect("a private redis-server with TLS");
    (ca, server)
}

/// The list at `key` on the private server, read through its plain port.
fn list(server: &Server, key: &str) -> Vec<Vec<u8>> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let mut c = redis::Client::open(server.url())
            .unwrap()
            .get_multiplexed_async_connection_with_config(
                &redis::AsyncConnectionConfig::new()
                    .set_response_timeout(Some(std::time::Duration::from_secs(60))),
            )
            .await
            .unwrap();
        redis::cmd("LRANGE")
            .arg(key)
            .arg(0)
            .arg(-1)
            .query_async(&mut c)
            .await
            .unwrap()
    })
}

/// Points the private server at another certificate (new connections use it).
fn set_certificate(server: &Server, issued: &Issued) {
    let r = server
        .command(&[
            "CONFIG",
            "SET",
            "tls-cert-file",
            issued.cert.to_str().unwrap(),
            "tls-key-file",
            issued.key.to_str().unwrap(),
        ])
        .unwrap();
    assert_eq!(r, "+OK");
}

fn pipe(inp: &Path, wal: &Path, sink: &str, extra: &[&str]) -> Output {
    let args = pipe_args_to(inp, wal, sink, extra);
    walsink(&args.iter().map(String::as_str).collect::<Vec<_>>())
}

/// Runs the pipe with a bad TLS setting (it must fail naming `reason`, deliver nothing and
/// keep the records), then with the fixed one (every line once).
fn fails_then_delivers(
    server: &Server,
    d: &Path,
    tag: &str,
    bad: &str,
    reason: &str,
    fix: &dyn Fn(),
    good: &str,
) {
    let inp = d.join(format!("{tag}.txt"));
    let wal = d.join(format!("{tag}-wal"));
    let want = lines(tag, 0, 3_000);
    write_lines(&inp, &want);
    let key = format!("walsink-test:{}", unique(tag));
    let id = unique(tag);
    let extra = ["--checkpoint-every", "500", "--sink-id", &id, "--quiet"];
    let o = pipe(&inp, &wal, &format!("{bad}&key={key}"), &extra);
    let err = stderr(&o);
    eprintln!("{tag}: exit {:?}: {}", o.status.code(), err.trim());
    assert!(
        !o.status.success(),
        "{tag}: a bad TLS setting must fail: {err}"
    );
    assert!(
        err.contains(reason),
        "{tag}: the reason {reason:?} is named: {err}"
    );
    assert!(!err.contains("panicked"), "{err}");
    assert!(list(server, &key).is_empty(), "{tag}: nothing delivered");
    fix();
    let o = pipe(&inp, &wal, &format!("{good}&key={key}"), &extra);
    assert!(o.status.success(), "{tag}: {}", stderr(&o));
    assert!(list(server, &key) == want, "{tag}: every line once");
}

#[test]
#[cfg_attr(not(servers), ignore = "needs WALSINK_TEST_SERVERS=1 and redis-server")]
fn tls_failures_are_named_and_the_records_arrive_once_fixed() {
    let d = tempfile::tempdir().unwrap();
    let (ca, server) = tls_server(d.path(), false);
    let other = TestCa::new(d.path(), "other").unwrap();
    let ca_file = format!("ca_file={}", ca.ca_file().display());
    let on = |host: &str, params: &str| format!("{}?{params}", server.tls_url(host));

    // Verify-full against the test CA, by name and by address.
    let want = lines("ok", 0, 2_000);
    let inp = d.path().join("ok.txt");
    write_lines(&inp, &want);
    for host in ["localhost", "127.0.0.1"] {
        let key = format!("walsink-test:{}", unique("tls-ok"));
        let o = pipe(
            &inp,
            &d.path().join(format!("ok-{host}")),
            &format!("{}&key={key}", on(host, &ca_file)),
            &["--checkpoint-every", "300", "--quiet"],
        );
        assert!(o.status.success(), "{}", stderr(&o));
        assert!(list(&server, &key) == want, "over TLS to {host}");
    }

    fails_then_delivers(
        &server,
        d.path(),
        "wrongca",
        &on(
            "localhost",
            &format!("ca_file={}", other.ca_file().display()),
        ),
        "not signed by a trusted CA",
        &|| {},
        &on("localhost", &ca_file),
    );

    let expired = ca
        .server("expired", &["localhost", "127.0.0.1"], Validity::Expired)
        .unwrap();
    set_certificate(&server, &expired);
    let current = ca
        .server("current", &["localhost", "127.0.0.1"], Validity::Current)
        .unwrap();
    fails_then_delivers(
        &server,
        d.path(),
        "expired",
        &on("localhost", &ca_file),
        "certificate has expired",
        &|| set_certificate(&server, &current),
        &on("localhost", &ca_file),
    );

    let named = ca
        .server("named", &["localhost"], Validity::Current)
        .unwrap();
    set_certificate(&server, &named);
    fails_then_delivers(
        &server,
        d.path(),
        "wronghost",
        &on("127.0.0.1", &ca_file),
        "does not carry the host name",
        &|| {},
        &on("localhost", &ca_file),
    );
}

#[test]
#[cfg_attr(not(servers), ignore = "needs WALSINK_TEST_SERVERS=1 and redis-server")]
fn a_server_that_asks_for_a_client_certificate_gets_one() {
    let d = tempfile::tempdir().unwrap();
    let (ca, server) = tls_server(d.path(), true);
    let client = ca.client("client", "walsink").unwrap();
    let base = format!(
        "{}?ca_file={}",
        server.tls_url("localhost"),
        ca.ca_file().display()
    );
    fails_then_delivers(
        &server,
        d.path(),
        "clientcert",
        &base,
        "cert_file=",
        &|| {},
        &format!(
            "{base}&cert_file={}&key_file={}",
            client.cert.display(),
            client.key.display()
        ),
    );
}

#[test]
#[cfg_attr(not(servers), ignore = "needs WALSINK_TEST_SERVERS=1 and redis-server")]
fn kill_loop_over_tls_ends_with_every_line_once() {
    let d = tempfile::tempdir().unwrap();
    let (ca, server) = tls_server(d.path(), false);
    let (inp, wal) = (d.path().join("in.txt"), d.path().join("wal"));
    let want = lines("t", 0, 300_000);
    write_lines(&inp, &want);
    let key = format!("walsink-test:{}", unique("tls-kill"));
    let sink = format!(
        "{}?key={key}&chunk_records=200&ca_file={}",
        server.tls_url("localhost"),
        ca.ca_file().display()
    );
    let id = unique("tk");
    let extra = ["--checkpoint-every", "700", "--sink-id", &id, "--quiet"];
    let mut kills = 0;
    for round in 0..3 {
        let (_, k) = kill_loop_to(&inp, &wal, &sink, &extra, 6, 70 + round, 30..=600);
        kills += k;
        let held = list(&server, &key);
        assert_in_order_once(&held, &want);
        eprintln!(
            "after round {round}: {} of {} lines in Redis over TLS",
            held.len(),
            want.len()
        );
    }
    let o = pipe(&inp, &wal, &sink, &extra);
    assert!(o.status.success(), "{}", stderr(&o));
    let got = list(&server, &key);
    assert!(
        got == want,
        "every line once: {} records of {}",
        got.len(),
        want.len()
    );
    eprintln!("kill loop into redis over TLS: {kills} SIGKILLs in 18 runs");
    assert!(kills >= 6, "too few kills landed: {kills}");
}
