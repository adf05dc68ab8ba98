//! Failures against the local Redis: connections killed mid-epoch (`CLIENT KILL`), a script
//! cache flushed under the sink, a key of the wrong type, a hash record without a tab, and an
//! epoch cut half-way that resumes where it stopped. In each, every record ends up in Redis
//! exactly once, or the error is permanent and nothing of the epoch is written. The
//! transaction protocol itself is in `transactions`.

use crate::common::*;
use std::time::Duration;
use walsink::SinkErrorClass;
use walsink_redis::{Mode, RedisSink};
use walsink_tokio::{deliver_ready, AsyncSink};

fn sink(id: &str, mode: Mode, chunk_records: usize) -> RedisSink {
    sink_with(id, mode, chunk_records, 4)
}

#[tokio::test(flavor = "multi_thread")]
#[cfg_attr(
    not(servers),
    ignore = "needs WALSINK_TEST_SERVERS=1 and a local Redis"
)]
async fn connections_killed_mid_epoch_still_give_each_record_once() {
    let id = sink_id("kill");
    let (_d, wal) = log(&id);
    let want = numbered(0, 20_000);
    seal(&wal, 1, &want[..15_000]);
    seal(&wal, 2, &want[15_000..]);
    let mut s = sink_with(&id, Mode::List, 50, 2);
    let mut admin = redis().await;
    let mut rng = fastrand::Rng::with_seed(7);
    let (mut kills, mut failures, mut attempts) = (0u32, 0u32, 0u32);
    loop {
        attempts += 1;
        assert!(attempts < 100, "no progress after {attempts} attempts");
        s.connect().await.expect("connect");
        let cid = s.client_id().unwrap();
        // A dozen attempts with a kill at a random moment, then the connection is left alone.
        let delay = Duration::from_micros(rng.u64(200..20_000));
        let kill = attempts <= 12;
        let killer = tokio::spawn(async move {
            if !kill {
                return 0;
            }
            tokio::time::sleep(delay).await;
            let mut a = redis().await;
            let n: i64 = redis::cmd("CLIENT")
                .arg("KILL")
                .arg("ID")
                .arg(cid)
                .query_async(&mut a)
                .await
                .unwrap();
            n
        });
        let r = deliver_ready(&wal, &mut s).await;
        kills += killer.await.unwrap() as u32;
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
    let _: () = redis::cmd("PING").query_async(&mut admin).await.unwrap();
    assert_eq!(
        contents(s.config(), 0).await,
        want,
        "each record once, in order"
    );
    eprintln!(
        "{kills} connections killed, {failures} failed deliveries, {attempts} attempts, stats {:?}",
        s.stats()
    );
    assert!(failures >= 1, "no kill landed mid-epoch ({kills} kills)");
}

#[tokio::test(flavor = "multi_thread")]
#[cfg_attr(
    not(servers),
    ignore = "needs WALSINK_TEST_SERVERS=1 and a local Redis"
)]
async fn an_epoch_cut_half_way_resumes_where_it_stopped() {
    let id = sink_id("half");
    let (_d, wal) = log(&id);
    let want = numbered(0, 5000);
    seal(&wal, 1, &want);
    let mut first = sink_with(&id, Mode::List, 10, 1);
    let mut watcher = sink(&id, Mode::List, 10);
    // Drop the delivery as soon as the marker shows part of the epoch applied.
    tokio::select! {
        r = deliver_ready(&wal, &mut first) => panic!("the epoch went through before the cut: {r:?}"),
        _ = async {
            loop {
                if let Some(m) = watcher.marker(&id, 0).await.unwrap() {
                    if m.next >= 1000 { break; }
                }
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        } => {}
    }
    drop(first);
    tokio::time::sleep(Duration::from_millis(100)).await; // a call already sent lands
    let m = watcher.marker(&id, 0).await.unwrap().unwrap();
    assert!(m.checkpoint == 1 && !m.done && m.next < 5000, "{m:?}");
    let held = contents(watcher.config(), 0).await;
    assert_eq!(held.len() as u64, m.next, "data and marker moved together");
    assert_eq!(held[..], want[..held.len()]);
    assert!(!watcher.is_committed(&epoch_key(&id, 1)).await.unwrap());
    // The next delivery starts at the marker.
    let mut second = sink(&id, Mode::List, 10);
    deliver_ready(&wal, &mut second).await.unwrap();
    assert_eq!(contents(second.config(), 0).await, want);
    let st = second.stats();
    assert_eq!(
        st.chunks_applied,
        (5000 - m.next).div_ceil(10),
        "only the rest was sent: {st:?} after {m:?}"
    );
    assert_eq!(
        second.committed(&id, 0).await.unwrap().unwrap(),
        walsink_redis::Committed {
            checkpoint: 1,
            metadata: b"meta-1".to_vec()
        }
    );
}

#[tokio::test(flavor = "multi_thread")]
#[cfg_attr(
    not(servers),
    ignore = "needs WALSINK_TEST_SERVERS=1 and a local Redis"
)]
async fn a_key_of_the_wrong_type_is_permanent_and_the_epoch_is_kept() {
    let id = sink_id("wrongtype");
    let (_d, wal) = log(&id);
    let want = numbered(0, 300);
    seal(&wal, 1, &want);
    let mut s = sink(&id, Mode::List, 100);
    let data_key = s.config().key_for(0);
    let mut r = redis().await;
    let _: () = redis::cmd("SET")
        .arg(&data_key)
        .arg("not a list")
        .query_async(&mut r)
        .await
        .unwrap();
    for _ in 0..2 {
        let e = deliver_ready(&wal, &mut s).await.unwrap_err();
        let sink_err = match e.kind() {
            walsink::ErrorKind::Sink(se) => se,
            other => panic!("{other:?}"),
        };
        assert_eq!(sink_err.class(), SinkErrorClass::Permanent, "{sink_err}");
        let msg = sink_err.to_string();
        assert!(
            msg.contains("WRONGTYPE") && msg.contains(&data_key),
            "{msg}"
        );
        assert_eq!(wal.health().backlog_epochs, 1, "the epoch is kept");
    }
    let v: String = redis::cmd("GET")
        .arg(&data_key)
        .query_async(&mut r)
        .await
        .unwrap();
    assert_eq!(v, "not a list", "nothing written");
    assert!(
        s.marker(&id, 0).await.unwrap().is_none(),
        "the marker did not move"
    );
    let _: () = redis::cmd("DEL")
        .arg(&data_key)
        .query_async(&mut r)
        .await
        .unwrap();
    deliver_ready(&wal, &mut s).await.unwrap();
    assert_eq!(contents(s.config(), 0).await, want);
}

#[tokio::test(flavor = "multi_thread")]
#[cfg_attr(
    not(servers),
    ignore = "needs WALSINK_TEST_SERVERS=1 and a local Redis"
)]
async fn a_hash_record_without_a_tab_is_permanent_and_names_its_position() {
    let id = sink_id("notab");
    let (_d, wal) = log(&id);
    let mut recs: Vec<Vec<u8>> = (0..50)
        .map(|i| format!("f{i}\tv{i}").into_bytes())
        .collect();
    recs[37] = b"no tab here".to_vec();
    seal(&wal, 4, &recs);
    let mut s = sink(&id, Mode::Hash, 10);
    let e = deliver_ready(&wal, &mut s).await.unwrap_err();
    let msg = e.to_string();
    assert!(
        msg.contains("record 37 of checkpoint 4") && msg.contains("permanent"),
        "{msg}"
    );
    let n: i64 = redis::cmd("EXISTS")
        .arg(s.config().key_for(0))
        .query_async(&mut redis().await)
        .await
        .unwrap();
    assert_eq!(n, 0, "nothing of the epoch was written");
}

#[tokio::test(flavor = "multi_thread")]
#[cfg_attr(
    not(servers),
    ignore = "needs WALSINK_TEST_SERVERS=1 and a local Redis"
)]
async fn a_flushed_script_cache_does_not_matter() {
    // The marker move is sent whole with EVAL inside each MULTI, never as EVALSHA: a flushed
    // script cache cannot refuse it after the writes queued before it.
    let id = sink_id("noscript");
    let (_d, wal) = log(&id);
    let want = numbered(0, 400);
    seal(&wal, 1, &want[..200]);
    let mut s = sink(&id, Mode::Stream, 64);
    deliver_ready(&wal, &mut s).await.unwrap();
    let _: () = redis::cmd("SCRIPT")
        .arg("FLUSH")
        .query_async(&mut redis().await)
        .await
        .unwrap();
    seal(&wal, 2, &want[200..]);
    deliver_ready(&wal, &mut s).await.unwrap();
    assert_eq!(contents(s.config(), 0).await, want);
    assert_eq!(s.stats().aborts, 0, "{:?}", s.stats());
}

#[tokio::test(flavor = "multi_thread")]
#[cfg_attr(
    not(servers),
    ignore = "needs WALSINK_TEST_SERVERS=1 and a local Redis"
)]
async fn a_server_that_does_not_answer_is_retryable() {
    let mut c = config(&sink_id("refused"), Mode::List);
    c.port = free_port();
    c.timeout = Duration::from_secs(2);
    let mut s = RedisSink::new(c).unwrap();
    let e = s.connect().await.unwrap_err();
    assert_eq!(e.class(), SinkErrorClass::Retryable, "{e}");
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A server that answers the connection with an error line and closes it, as Redis does in
/// protected mode (`-DENIED …`) or past `maxclients` (`-ERR max number of clients reached`).
/// Serves `n` connections, then stops.
fn refusing_server(greeting: &'static str, n: usize) -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    std::thread::spawn(move || {
        use std::io::Write;
        for s in l.incoming().take(n) {
            let Ok(mut s) = s else { continue };
            let _ = s.write_all(greeting.as_bytes());
            let _ = s.flush();
            let _ = s.shutdown(std::net::Shutdown::Both);
        }
    });
    port
}

#[tokio::test(flavor = "multi_thread")]
async fn a_server_that_refuses_the_client_is_shown_in_its_own_words() {
    let port = refusing_server(
        "-DENIED Redis is running in protected mode because protected mode is enabled\r\n",
        16,
    );
    let mut c = config(&sink_id("denied"), Mode::List);
    c.port = port;
    c.timeout = Duration::from_secs(2);
    let mut s = RedisSink::new(c).unwrap();
    let e = s.connect().await.unwrap_err();
    let text = e.to_string();
    assert!(
        text.contains("DENIED Redis is running in protected mode"),
        "the server's words are lost: {text}"
    );
    assert_eq!(e.class(), SinkErrorClass::Permanent, "{e}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_server_at_maxclients_is_retryable_and_says_so() {
    let port = refusing_server("-ERR max number of clients reached\r\n", 16);
    let mut c = config(&sink_id("maxclients"), Mode::List);
    c.port = port;
    c.timeout = Duration::from_secs(2);
    let mut s = RedisSink::new(c).unwrap();
    let e = s.connect().await.unwrap_err();
    assert!(
        e.to_string().contains("max number of clients reached"),
        "the server's words are lost: {e}"
    );
    assert_eq!(e.class(), SinkErrorClass::Retryable, "{e}");
}
