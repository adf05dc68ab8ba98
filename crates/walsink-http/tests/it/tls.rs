//! HTTPS against the in-process receiver (`walsink_http::receiver`) with certificates from
//! the kit's testkit: records delivered with `ca_file` and verify-full; a wrong CA, an
//! expired certificate and a host name the certificate does not carry each fail naming the
//! reason, nothing reaches the receiver, and the same log delivers every record once with
//! the setting (or the certificate) fixed; `verify=ca` and `verify=none`; a client
//! certificate for a receiver that demands one; the bearer token and the basic password
//! from files, never shown.

use crate::support::*;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivatePkcs8KeyDer};
use std::path::Path;
use walsink_http::receiver::{Mode, Receiver, Tls};
use walsink_kit::testkit::{Issued, TestCa, Validity};
use walsink_tokio::deliver_ready;

const UNKNOWN_CA: &str = "not signed by a trusted CA";
const EXPIRED: &str = "certificate has expired";
const WRONG_HOST: &str = "does not carry the host name";

fn der_certs(path: &Path) -> Vec<Vec<u8>> {
    CertificateDer::pem_file_iter(path)
        .unwrap()
        .map(|c| c.unwrap().to_vec())
        .collect()
}

fn tls(issued: &Issued) -> Tls {
    Tls {
        certs: der_certs(&issued.cert),
        key: PrivatePkcs8KeyDer::from_pem_file(&issued.key)
            .unwrap()
            .secret_pkcs8_der()
            .to_vec(),
    }
}

async fn receiver(issued: &Issued) -> Receiver {
    Receiver::start_with(Mode::Keep, Some(tls(issued)))
        .await
        .unwrap()
}

/// Delivering the log into `url` fails naming `reason`, and the receiver saw no request.
async fn refused(log: &Log, url: &str, reason: &str, r: &Receiver) {
    let mut s = sink(url);
    let e = deliver_ready(&log.wal, &mut s).await.unwrap_err();
    let msg = sink_error(&e).to_string();
    eprintln!("refused as expected: {msg}");
    assert!(msg.contains(reason), "{url}: {msg}");
    let c = s.connect().await.unwrap_err().to_string();
    assert!(c.contains(reason), "connect: {c}");
    assert_eq!(r.seen(|s| s.requests), 0, "nothing reached the receiver");
}

#[tokio::test(flavor = "multi_thread")]
async fn records_arrive_over_https_with_a_ca_file_and_verify_full() {
    let dir = tempfile::tempdir().unwrap();
    let ca = TestCa::new(dir.path(), "ca").unwrap();
    let cert = ca
        .server("recv", &["localhost", "127.0.0.1"], Validity::Current)
        .unwrap();
    let r = receiver(&cert).await;
    let sid = id("https");
    let log = open(&sid);
    let want = records("s", 0, 120);
    epoch(&log, 1, &want[..60]);
    epoch(&log, 2, &want[60..]);
    let url = format!(
        "{}?max_records=25&verify=full&ca_file={}",
        r.url("in"),
        ca.ca_file().display()
    );
    assert!(url.starts_with("https://localhost:"), "{url}");
    let mut s = sink(&url);
    s.connect().await.unwrap();
    assert_eq!(deliver_ready(&log.wal, &mut s).await.unwrap(), 2);
    assert_eq!(r.records(&sid, 0), want);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_wrong_ca_an_expired_certificate_and_a_wrong_host_are_named_and_nothing_is_lost() {
    let dir = tempfile::tempdir().unwrap();
    let ca = TestCa::new(dir.path(), "ca").unwrap();
    let other = TestCa::new(dir.path(), "other").unwrap();
    let trusted = |extra: &str| format!("?retries=0&ca_file={}{extra}", ca.ca_file().display());

    // A CA that did not sign the receiver's certificate; no CA file (the Mozilla roots).
    let good = ca
        .server("good", &["localhost", "127.0.0.1"], Validity::Current)
        .unwrap();
    let r = receiver(&good).await;
    let sid = id("wrongca");
    let log = open(&sid);
    let want = records("w", 0, 30);
    epoch(&log, 1, &want);
    let wrong = format!(
        "{}?retries=0&ca_file={}",
        r.url("in"),
        other.ca_file().display()
    );
    refused(&log, &wrong, UNKNOWN_CA, &r).await;
    refused(&log, &format!("{}?retries=0", r.url("in")), UNKNOWN_CA, &r).await;
    // verify=none trusts any certificate (encrypted, unauthenticated).
    sink(&format!("{wrong}&verify=none"))
        .connect()
        .await
        .unwrap();
    let fixed = format!("{}{}", r.url("in"), trusted(""));
    assert_eq!(deliver_ready(&log.wal, &mut sink(&fixed)).await.unwrap(), 1);
    assert_eq!(r.records(&sid, 0), want);

    // A certificate for `localhost` only, reached at 127.0.0.1.
    let named = ca
        .server("named", &["localhost"], Validity::Current)
        .unwrap();
    let r = receiver(&named).await;
    let sid = id("wronghost");
    let log = open(&sid);
    epoch(&log, 1, &want);
    let by_address = format!("https://127.0.0.1:{}/in{}", r.addr().port(), trusted(""));
    refused(&log, &by_address, WRONG_HOST, &r).await;
    // verify=ca accepts it; by the name it carries, verify-full does.
    sink(&format!("{by_address}&verify=ca"))
        .connect()
        .await
        .unwrap();
    let by_name = format!("{}{}", r.url("in"), trusted(""));
    assert_eq!(
        deliver_ready(&log.wal, &mut sink(&by_name)).await.unwrap(),
        1
    );
    assert_eq!(r.records(&sid, 0), want);

    // An expired certificate: refused; the receiver renewed, the same log delivers once.
    let expired = ca
        .server("expired", &["localhost"], Validity::Expired)
        .unwrap();
    let r = receiver(&expired).await;
    let sid = id("expired");
    let log = open(&sid);
    epoch(&log, 1, &want);
    refused(
        &log,
        &format!("{}{}", r.url("in"), trusted("")),
        EXPIRED,
        &r,
    )
    .await;
    let r = receiver(&good).await;
    let url = format!("{}{}", r.url("in"), trusted(""));
    assert_eq!(deliver_ready(&log.wal, &mut sink(&url)).await.unwrap(), 1);
    assert_eq!(r.records(&sid, 0), want);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_client_certificate_is_sent_to_a_receiver_that_demands_one() {
    let dir = tempfile::tempdir().unwrap();
    let ca = TestCa::new(dir.path(), "ca").unwrap();
    let cert = ca
        .server("recv", &["localhost"], Validity::Current)
        .unwrap();
    let client = ca.client("client", "walsink").unwrap();
    let r = Receiver::start_verifying_clients(Mode::Keep, tls(&cert), der_certs(&ca.ca_file()))
        .await
        .unwrap();
    let sid = id("clientcert");
    let log = open(&sid);
    let want = records("c", 0, 20);
    epoch(&log, 1, &want);
    let base = format!(
        "{}?retries=0&ca_file={}",
        r.url("in"),
        ca.ca_file().display()
    );
    let e = deliver_ready(&log.wal, &mut sink(&base)).await.unwrap_err();
    let msg = sink_error(&e).to_string();
    eprintln!("refused as expected: {msg}");
    assert!(msg.contains("refused the TLS handshake"), "{msg}");
    assert!(r.records(&sid, 0).is_empty());
    let url = format!(
        "{base}&cert_file={}&key_file={}",
        client.cert.display(),
        client.key.display()
    );
    assert_eq!(deliver_ready(&log.wal, &mut sink(&url)).await.unwrap(), 1);
    assert_eq!(r.records(&sid, 0), want);
    // A key file that is not a key is named, and its content never shown.
    let bad = dir.path().join("bad.key");
    std::fs::write(&bad, "KEY-SECRET-TEXT").unwrap();
    let e = walsink_http::HttpSink::new(
        walsink_http::Config::from_url(&format!(
            "{base}&cert_file={}&key_file={}",
            client.cert.display(),
            bad.display()
        ))
        .unwrap(),
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("bad.key") && !e.contains("KEY-SECRET"), "{e}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_bearer_token_and_a_basic_password_from_files_go_out_and_never_show() {
    let dir = tempfile::tempdir().unwrap();
    let r = Receiver::start(Mode::Keep).await.unwrap();
    let tok = dir.path().join("token");
    std::fs::write(&tok, "s3cret+token\n").unwrap();
    r.require_auth("Bearer s3cret+token");
    let sid = id("bearerfile");
    let log = open(&sid);
    let want = records("b", 0, 10);
    epoch(&log, 1, &want);
    let mut s = sink(&format!("{}?bearer_file={}", r.url("in"), tok.display()));
    assert!(!format!("{s:?}").contains("s3cret"));
    assert_eq!(deliver_ready(&log.wal, &mut s).await.unwrap(), 1);
    assert_eq!(r.records(&sid, 0), want);
    // Basic: the user in the URL, the password from a file ("u:p+w" in base64).
    r.require_auth("Basic dTpwK3c=");
    let pw = dir.path().join("pw");
    std::fs::write(&pw, "p+w\n").unwrap();
    let sid = id("basicfile");
    let log = open(&sid);
    epoch(&log, 1, &want);
    let url = r.url("in").replace("http://", "http://u@");
    let mut s = sink(&format!("{url}?password_file={}", pw.display()));
    assert!(!format!("{s:?}").contains("p+w"));
    assert_eq!(deliver_ready(&log.wal, &mut s).await.unwrap(), 1);
    // A missing token file is named when the sink is made.
    let e = walsink_http::HttpSink::new(
        walsink_http::Config::from_url(&format!("{}?bearer_file=/nonexistent/tok", r.url("in")))
            .unwrap(),
    )
    .unwrap_err()
    .to_string();
    assert!(
        e.contains("bearer_file") && e.contains("/nonexistent/tok"),
        "{e}"
    );
}
