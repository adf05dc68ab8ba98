//! Against the local NATS server with JetStream, every record lands once: the shared
//! conformance suite (read back by consuming the stream and checking that no message id is
//! stored twice), connections cut mid-epoch by a proxy, and a server that does not answer
//! is retryable.

use crate::common::*;
use std::time::Duration;
use walsink::SinkErrorClass;
use walsink_nats::NatsSink;

#[tokio::test(flavor = "multi_thread")]
#[cfg_attr(
    not(servers),
    ignore = "needs WALSINK_TEST_SERVERS=1 and a local NATS with JetStream"
)]
async fn the_sink_conforms() {
    let h = NatsHarness(TestStream::new("conf", None).await);
    walsink_tokio::conformance::run_all(&h).await;
    h.0.delete().await;
}

#[tokio::test(flavor = "multi_thread")]
#[cfg_attr(
    not(servers),
    ignore = "needs WALSINK_TEST_SERVERS=1 and a local NATS with JetStream"
)]
async fn connections_cut_mid_epoch_still_give_each_record_once() {
    let s = TestStream::new("cut", None).await;
    let proxy = Proxy::start().await;
    let id = walsink_tokio::conformance::unique_id("cut");
    let (_d, wal) = log(&id);
    let want = numbered(0, 30_000);
    seal(&wal, 1, &want[..20_000]);
    seal(&wal, 2, &want[20_000..]);
    let mut cfg = s.config();
    cfg.port = proxy.port;
    cfg.timeout = Duration::from_secs(2);
    cfg.in_flight = 256;
    let mut sink = NatsSink::new(cfg).unwrap();
    let status = sink.status();
    let (mut failures, mut attempts, mut cuts) = (0, 0, 0);
    let mut rng = fastrand_like(11);
    loop {
        attempts += 1;
        assert!(attempts < 30, "no progress after {attempts} attempts");
        // The first attempts are cut three times each, whenever the stream has taken
        // some more of their records.
        let cut = attempts <= 4;
        let cutter = async {
            for _ in 0..3 {
                if !cut {
                    break;
                }
                let extra = 50 + rng() % 2000;
                let before = stored(&s).await;
                while stored(&s).await < before + extra {
                    tokio::time::sleep(Duration::from_millis(2)).await;
                }
                proxy.cut();
                cuts += 1;
            }
            std::future::pending::<()>().await
        };
        let r = tokio::select! {
            r = walsink_tokio::deliver_ready(&wal, &mut sink) => r,
            _ = cutter => unreachable!(),
        };
        match r {
            Ok(_) if wal.health().committed == Some(2) => break,
            Ok(_) => {}
            Err(e) => {
                failures += 1;
                assert!(e.to_string().contains("retryable"), "{e}");
            }
        }
    }
    // Each record once (`records_of` fails on a repeated id). A record lost with a cut
    // connection is stored when the epoch is retried, after records the client resent on
    // its own after reconnecting: the stream's order can differ from the positions, which
    // the message ids give.
    let held = s.read().await;
    let _ = s.records_of(&id, 0).await;
    let moved = held.iter().zip(&want).filter(|((_, g), w)| g != *w).count();
    let mut by_position: Vec<(u64, u64, Vec<u8>)> = held
        .into_iter()
        .map(|(mid, p)| {
            let f: Vec<&str> = mid.rsplitn(3, ':').collect();
            (f[1].parse().unwrap(), f[0].parse().unwrap(), p)
        })
        .collect();
    by_position.sort();
    let got: Vec<Vec<u8>> = by_position.into_iter().map(|(_, _, p)| p).collect();
    assert!(
        got == want,
        "each record once: {} of {}",
        got.len(),
        want.len()
    );
    eprintln!("{cuts} cuts, {moved} records stored away from their position");
    eprintln!(
        "{failures} failed deliveries in {attempts} attempts, {:?}",
        status.get()
    );
    assert!(cuts >= 3, "no cut landed mid-epoch");
    s.delete().await;
}

async fn stored(s: &TestStream) -> u64 {
    let mut st = js().await.get_stream(&s.name).await.unwrap();
    st.info().await.unwrap().state.messages
}

fn fastrand_like(seed: u64) -> impl FnMut() -> u64 {
    let mut x = seed;
    move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    }
}

#[tokio::test(flavor = "multi_thread")]
#[cfg_attr(
    not(servers),
    ignore = "needs WALSINK_TEST_SERVERS=1 and a local NATS with JetStream"
)]
async fn a_server_that_does_not_answer_is_retryable() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let mut cfg = walsink_nats::Config::new("S", "a.b");
    cfg.port = port;
    cfg.timeout = Duration::from_secs(1);
    let e = NatsSink::new(cfg).unwrap().connect().await.unwrap_err();
    assert_eq!(e.class(), SinkErrorClass::Retryable, "{e}");
}
