//! `walsink pipe --sink tls://…` into a private `nats-server` with JetStream and TLS
//! (`walsink_nats::testkit`, certificates from the kit's testkit): a wrong CA, an expired
//! certificate and a wrong host name each end the run naming the reason with the records
//! kept in the log, and the run with the setting fixed delivers every line once; a client
//! certificate and a password from a file; and a SIGKILL loop over TLS ending with every
//! line in the stream exactly once.

use crate::common::*;
use std::path::Path;
use walsink_kit::testkit::{TestCa, Validity};
use walsink_kit::TlsOptions;
use walsink_nats::testkit::{ServerTls, TlsServer};

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

/// The test's own reader: the CA, not the host name (a case serves a certificate for
/// `localhost` only).
fn trusting(ca: &Path) -> TlsOptions {
    TlsOptions {
        ca_file: Some(ca.to_path_buf()),
        verify: walsink_kit::Verify::Ca,
        ..TlsOptions::default()
    }
}

fn read(server: &TlsServer, tls: &TlsOptions, stream: &str) -> Vec<(String, Vec<u8>)> {
    rt().block_on(server.read_stream(tls, stream)).unwrap()
}

fn run(args: &[String]) -> std::process::Output {
    walsink(&args.iter().map(String::as_str).collect::<Vec<_>>())
}

/// A pipe run with a bad TLS setting: exit 2, the reason on stderr.
fn refused(args: &[String], reason: &str) {
    let o = run(args);
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(err.contains(reason), "{reason}: {err}");
    eprintln!(
        "refused as expected: {}",
        err.lines().find(|l| l.contains(reason)).unwrap_or_default()
    );
}

#[test]
#[cfg_attr(
    not(servers),
    ignore = "needs WALSINK_TEST_SERVERS=1 and the installed nats-server"
)]
fn a_wrong_ca_an_expired_certificate_and_a_wrong_host_end_the_run_and_the_fixed_run_delivers_once()
{
    let d = tempfile::tempdir().unwrap();
    let ca = TestCa::new(d.path(), "ca").unwrap();
    let other = TestCa::new(d.path(), "other").unwrap();
    let good = ca
        .server("good", &["localhost", "127.0.0.1"], Validity::Current)
        .unwrap();
    let expired = ca
        .server("expired", &["localhost", "127.0.0.1"], Validity::Expired)
        .unwrap();
    let named = ca
        .server("named", &["localhost"], Validity::Current)
        .unwrap();
    let trust = trusting(&ca.ca_file());
    let u = unique("cli_tls");
    let (stream, subject) = (format!("WALSINK_TLS_{u}"), format!("walsink-tls.{u}"));
    let want = lines("t", 0, 300);
    let mut server = TlsServer::start(d.path(), &ServerTls::new(&good)).unwrap();
    rt().block_on(server.create_stream(&trust, &stream, &subject))
        .unwrap();
    let url = |host: &str, ca_file: &Path| {
        format!(
            "tls://{host}:{}/?stream={stream}&subject={subject}&ca_file={}",
            server.port(),
            ca_file.display()
        )
    };
    let (right, by_name) = (
        url("127.0.0.1", &ca.ca_file()),
        url("localhost", &ca.ca_file()),
    );
    let flags = ["--max-retries", "0", "--quiet"];
    for (case, bad, fixed, cert) in [
        (
            "wrong CA",
            url("127.0.0.1", &other.ca_file()),
            &right,
            &good,
        ),
        ("expired", right.clone(), &right, &expired),
        ("wrong host", right.clone(), &by_name, &named),
    ] {
        let inp = d.path().join(format!("{case}.txt"));
        let wal = d.path().join(format!("{case}.wal"));
        write_lines(&inp, &want);
        server.restart(&ServerTls::new(cert)).unwrap();
        let reason = match case {
            "wrong CA" => "not signed by a trusted CA",
            "expired" => "certificate has expired",
            _ => "does not carry the host name",
        };
        let sink_id = unique("tls").replace('_', "-");
        let mut extra = vec!["--sink-id", &sink_id];
        extra.extend(flags);
        refused(&pipe_args_to(&inp, &wal, &bad, &extra), reason);
        if case == "expired" {
            server.restart(&ServerTls::new(&good)).unwrap();
        }
        assert!(
            read(&server, &trust, &stream).is_empty(),
            "{case}: nothing delivered"
        );
        let o = run(&pipe_args_to(&inp, &wal, fixed, &extra));
        assert!(o.status.success(), "{case}: {}", stderr(&o));
        let held = read(&server, &trust, &stream);
        let mut ids = std::collections::HashSet::new();
        assert!(
            held.iter().all(|(id, _)| ids.insert(id.clone())),
            "an id twice"
        );
        let got: Vec<Vec<u8>> = held.into_iter().map(|(_, p)| p).collect();
        assert_eq!(got, want, "{case}: every line once");
        rt().block_on(async {
            let js = async_nats::jetstream::new(server.client(&trust).await.unwrap());
            js.get_stream(&stream).await.unwrap().purge().await.unwrap();
        });
    }
}

#[test]
#[cfg_attr(
    not(servers),
    ignore = "needs WALSINK_TEST_SERVERS=1 and the installed nats-server"
)]
fn a_client_certificate_and_a_password_file_reach_the_server_and_never_show() {
    let d = tempfile::tempdir().unwrap();
    let ca = TestCa::new(d.path(), "ca").unwrap();
    let cert = ca
        .server("nats", &["127.0.0.1"], Validity::Current)
        .unwrap();
    let client = ca.client("client", "walsink").unwrap();
    let password = "Pw+SECRETtail/x";
    let server = TlsServer::start(
        d.path(),
        &ServerTls::new(&cert)
            .verify_clients(&ca.ca_file())
            .user("bob", password),
    )
    .unwrap();
    let u = unique("cli_tls_client");
    let (stream, subject) = (format!("WALSINK_TLS_{u}"), format!("walsink-tls.{u}"));
    let pw = d.path().join("pw");
    std::fs::write(&pw, password).unwrap();
    let (inp, wal) = (d.path().join("in.txt"), d.path().join("wal"));
    let want = lines("c", 0, 200);
    write_lines(&inp, &want);
    let base = format!(
        "tls://bob@127.0.0.1:{}/?stream={stream}&subject={subject}&create=true&ca_file={}&password_file={}",
        server.port(),
        ca.ca_file().display(),
        pw.display()
    );
    // Without the client certificate the server ends the handshake: the run says so.
    let o = run(&pipe_args_to(&inp, &wal, &base, &["--max-retries", "0"]));
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(err.contains("refused the TLS handshake"), "{err}");
    assert!(!err.contains("SECRETtail"), "{err}");
    let url = format!(
        "{base}&cert_file={}&key_file={}",
        client.cert.display(),
        client.key.display()
    );
    let o = run(&pipe_args_to(&inp, &wal, &url, &["--json"]));
    assert!(o.status.success(), "{}", stderr(&o));
    let text = format!("{}{}", stdout(&o), stderr(&o));
    assert!(!text.contains("SECRETtail"), "{text}");
    let with_cert = TlsOptions {
        ca_file: Some(ca.ca_file()),
        cert_file: Some(client.cert.clone()),
        key_file: Some(client.key.clone()),
        ..TlsOptions::default()
    };
    let got: Vec<Vec<u8>> = read(&server, &with_cert, &stream)
        .into_iter()
        .map(|(_, p)| p)
        .collect();
    assert_eq!(got, want);
    // Nothing the run wrote holds the password.
    let mut stack = vec![wal.clone()];
    while let Some(p) = stack.pop() {
        if p.is_dir() {
            stack.extend(std::fs::read_dir(&p).unwrap().map(|e| e.unwrap().path()));
        } else {
            let bytes = std::fs::read(&p).unwrap();
            assert!(
                !bytes.windows(10).any(|w| w == b"SECRETtail"),
                "{} holds the password",
                p.display()
            );
        }
    }
}

#[test]
#[cfg_attr(
    not(servers),
    ignore = "needs WALSINK_TEST_SERVERS=1 and the installed nats-server"
)]
fn kill_loop_over_tls_ends_with_every_line_once() {
    let d = tempfile::tempdir().unwrap();
    let ca = TestCa::new(d.path(), "ca").unwrap();
    let cert = ca
        .server("nats", &["localhost", "127.0.0.1"], Validity::Current)
        .unwrap();
    let server = TlsServer::start(d.path(), &ServerTls::new(&cert)).unwrap();
    let trust = trusting(&ca.ca_file());
    let (inp, wal) = (d.path().join("in.txt"), d.path().join("wal"));
    let want = lines("n", 0, 150_000);
    write_lines(&inp, &want);
    let u = unique("cli_tls_kill");
    let (stream, subject) = (format!("WALSINK_TLS_{u}"), format!("walsink-tls.{u}"));
    rt().block_on(server.create_stream(&trust, &stream, &subject))
        .unwrap();
    let sink = format!(
        "tls://127.0.0.1:{}/?stream={stream}&subject={subject}&ca_file={}",
        server.port(),
        ca.ca_file().display()
    );
    let id = unique("k").replace('_', "-");
    let extra = ["--checkpoint-every", "700", "--sink-id", &id, "--quiet"];
    let mut kills = 0;
    for round in 0..3 {
        let (_, k) = kill_loop_to(&inp, &wal, &sink, &extra, 6, 160 + round, 40..=900);
        kills += k;
        let held: Vec<Vec<u8>> = read(&server, &trust, &stream)
            .into_iter()
            .map(|(_, p)| p)
            .collect();
        assert_in_order_once(&held, &want);
        eprintln!(
            "after round {round}: {} of {} lines in the stream",
            held.len(),
            want.len()
        );
    }
    let o = run(&pipe_args_to(&inp, &wal, &sink, &extra));
    assert!(o.status.success(), "{}", stderr(&o));
    let held = read(&server, &trust, &stream);
    let mut ids = std::collections::HashSet::new();
    for (mid, _) in &held {
        assert!(mid.starts_with(&format!("{id}:0:")), "{mid}");
        assert!(ids.insert(mid.clone()), "{mid} twice");
    }
    let got: Vec<Vec<u8>> = held.into_iter().map(|(_, p)| p).collect();
    assert!(
        got == want,
        "every line once: {} records of {}",
        got.len(),
        want.len()
    );
    eprintln!("kill loop into nats over TLS: {kills} SIGKILLs in 18 runs");
    assert!(kills >= 6, "too few kills landed: {kills}");
}
