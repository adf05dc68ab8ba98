//! The shared target conformance suite against a real HTTP server in this process (the
//! deduplicating receiver of `walsink_http::receiver`): plain, with gzip and chunks in
//! flight together, with random faults on a fifth of the requests (the suite delivers some
//! epochs once and expects success, so there the sink retries a chunk up to 12 times), and
//! over TLS. The read-back is what the receiver kept after deduplicating by
//! `Idempotency-Key`, in key order. No external server is needed, so these always run.

use std::time::Duration;
use walsink_http::receiver::{Mode, Receiver, Tls};
use walsink_http::HttpSink;
use walsink_tokio::conformance::{run_all, Harness};

struct Http {
    receiver: Receiver,
    /// Parameters added to the receiver's URL.
    params: String,
    ca_file: Option<std::path::PathBuf>,
}

impl Harness for Http {
    type Sink = HttpSink;

    async fn sink(&self, _sink_id: &str) -> HttpSink {
        let mut url = format!("{}?{}", self.receiver.url("ingest"), self.params);
        if let Some(ca) = &self.ca_file {
            url.push_str(&format!("&ca_file={}", ca.display()));
        }
        crate::support::sink(&url)
    }

    async fn read_back(&self, sink_id: &str, subtask: u32) -> Vec<Vec<u8>> {
        self.receiver.records(sink_id, subtask)
    }
}

fn check_clean(r: &Receiver) {
    r.seen(|s| {
        assert!(
            s.conflicts.is_empty(),
            "a key came back with another body: {:?}",
            s.conflicts
        )
    });
}

#[tokio::test(flavor = "multi_thread")]
async fn conforms_plain() {
    let h = Http {
        receiver: Receiver::start(Mode::Keep).await.unwrap(),
        params: "max_records=7&max_bytes=200".into(),
        ca_file: None,
    };
    run_all(&h).await;
    check_clean(&h.receiver);
    // The replay check sent its first epoch twice: the receiver saw repeats and kept one.
    assert!(h.receiver.seen(|s| s.duplicates) > 0);
}

#[tokio::test(flavor = "multi_thread")]
async fn conforms_with_gzip_and_chunks_in_flight_together() {
    let h = Http {
        receiver: Receiver::start(Mode::Keep).await.unwrap(),
        params: "max_records=5&max_bytes=1KiB&gzip=true&concurrency=4".into(),
        ca_file: None,
    };
    run_all(&h).await;
    check_clean(&h.receiver);
}

#[tokio::test(flavor = "multi_thread")]
async fn conforms_with_random_faults() {
    let receiver = Receiver::start(Mode::Keep).await.unwrap();
    receiver.chaos(7, 0.2, Duration::from_millis(400));
    let h = Http {
        receiver,
        params: "max_records=9&max_bytes=300&timeout=200ms&retries=12".into(),
        ca_file: None,
    };
    run_all(&h).await;
    check_clean(&h.receiver);
    let faults = h.receiver.seen(|s| s.faults);
    assert!(faults > 10, "only {faults} faults were injected");
}

#[tokio::test(flavor = "multi_thread")]
async fn conforms_over_tls() {
    let cert = rcgen::generate_simple_self_signed(vec!["localhost".to_string()]).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let ca = dir.path().join("ca.pem");
    std::fs::write(&ca, cert.cert.pem()).unwrap();
    let tls = Tls {
        certs: vec![cert.cert.der().to_vec()],
        key: cert.key_pair.serialize_der(),
    };
    let h = Http {
        receiver: Receiver::start_with(Mode::Keep, Some(tls)).await.unwrap(),
        params: "max_records=50".into(),
        ca_file: Some(ca),
    };
    assert!(h.receiver.url("x").starts_with("https://"));
    run_all(&h).await;
    check_clean(&h.receiver);
}
