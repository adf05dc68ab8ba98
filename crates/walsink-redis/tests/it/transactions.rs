//! The transaction protocol against the local Redis, with another connection acting between
//! a transaction's `WATCH` and its `EXEC` (the sink's test hook): a change of the watched
//! marker aborts the transaction and it is resent without what the marker shows applied; a
//! data key whose type changes writes nothing and leaves the marker; a connection killed
//! before `EXEC` loses nothing; the old marker layout (one shared hash per data key) is read
//! and moved; sinks sharing a data key do not abort each other.

use crate::common::*;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use walsink::SinkErrorClass;
use walsink_redis::script::{padded, Marker};
use walsink_redis::{HookPoint, Mode, RedisSink};
use walsink_tokio::{deliver_ready, AsyncSink};

/// A blocking connection for the hook, which runs between `WATCH` and `EXEC`.
fn other() -> redis::Connection {
    redis::Client::open(URL).unwrap().get_connection().unwrap()
}

fn hmarker(c: &mut redis::Connection, key: &str) -> Option<String> {
    redis::cmd("HGET").arg(key).arg("marker").query(c).unwrap()
}

#[tokio::test(flavor = "multi_thread")]
#[cfg_attr(
    not(servers),
    ignore = "needs WALSINK_TEST_SERVERS=1 and a local Redis"
)]
async fn a_transaction_aborted_by_the_watched_marker_is_resent_and_lands_once() {
    for mode in [Mode::List, Mode::Stream, Mode::Hash] {
        let id = sink_id("abort");
        let (_d, wal) = log(&id);
        let rec = |i: u64| match mode {
            Mode::Hash => format!("{i:010}\tvalue-{i}").into_bytes(),
            _ => format!("rec-{i}").into_bytes(),
        };
        let want: Vec<Vec<u8>> = (0..500).map(rec).collect();
        seal(&wal, 1, &want);
        // Transactions of 100 records in chunks of 50.
        let mut s = sink_with(&id, mode, 50, 2);
        let cfg = s.config().clone();
        let (data, mk) = (cfg.key_for(0), cfg.marker_key(&id, 0));
        let hits = Arc::new(AtomicU32::new(0));
        let h = hits.clone();
        let w = want.clone();
        s.set_test_hook(Some(Arc::new(move |p: HookPoint| {
            let mut c = other();
            if p.first == 100 && p.attempt == 0 {
                // Another writer with the same sink id and subtask (a zombie) touches the
                // marker without moving it: the transaction aborts and goes out again whole.
                let m = hmarker(&mut c, &mk).unwrap();
                let _: () = redis::cmd("HSET")
                    .arg(&mk)
                    .arg("marker")
                    .arg(m)
                    .query(&mut c)
                    .unwrap();
                h.fetch_add(1, Ordering::SeqCst);
            }
            if p.first == 300 && p.attempt == 0 {
                // The zombie applies the transaction's first chunk and moves the marker: the
                // transaction aborts and is resent without that chunk.
                let mut pipe = redis::pipe();
                pipe.atomic();
                let part = &w[300..350];
                match mode {
                    Mode::List => {
                        pipe.cmd("RPUSH").arg(&data).arg(part);
                    }
                    Mode::Hash => {
                        let cmd = pipe.cmd("HSET").arg(&data);
                        for r in part {
                            let tab = r.iter().position(|b| *b == b'\t').unwrap();
                            cmd.arg(&r[..tab]).arg(&r[tab + 1..]);
                        }
                    }
                    Mode::Stream => {
                        for r in part {
                            pipe.cmd("XADD").arg(&data).arg("*").arg("record").arg(r);
                        }
                    }
                }
                pipe.cmd("HSET").arg(&mk).arg("marker").arg(
                    Marker {
                        checkpoint: 1,
                        next: 350,
                        done: false,
                    }
                    .encode(),
                );
                let _: redis::Value = pipe.query(&mut c).unwrap();
                h.fetch_add(1, Ordering::SeqCst);
            }
        })));
        deliver_ready(&wal, &mut s).await.unwrap();
        assert_eq!(hits.load(Ordering::SeqCst), 2, "{mode:?}");
        assert_eq!(contents(&cfg, 0).await, want, "{mode:?}: each record once");
        let st = s.stats();
        assert_eq!(st.aborts, 2, "{mode:?}: {st:?}");
        assert_eq!(st.chunks_skipped, 1, "{mode:?}: the zombie's chunk: {st:?}");
        assert_eq!(st.chunks_applied, 9, "{mode:?}: {st:?}");
        assert!(s.is_committed(&epoch_key(&id, 1)).await.unwrap());
    }
}

#[tokio::test(flavor = "multi_thread")]
#[cfg_attr(
    not(servers),
    ignore = "needs WALSINK_TEST_SERVERS=1 and a local Redis"
)]
async fn a_type_change_before_exec_writes_nothing_and_keeps_the_marker() {
    for mode in [Mode::List, Mode::Stream, Mode::Hash] {
        let id = sink_id("retype");
        let (_d, wal) = log(&id);
        let want: Vec<Vec<u8>> = (0..300)
            .map(|i| format!("{i:010}\tv{i}").into_bytes())
            .collect();
        seal(&wal, 1, &want);
        let mut s = sink_with(&id, mode, 100, 1);
        let data = s.config().key_for(0);
        let aside = format!("{data}:aside");
        let (d2, a2) = (data.clone(), aside.clone());
        s.set_test_hook(Some(Arc::new(move |p: HookPoint| {
            if p.first == 100 && p.attempt == 0 {
                // After the sink saw the right type and before EXEC: the key becomes a string.
                let mut c = other();
                let _: () = redis::pipe()
                    .cmd("RENAME")
                    .arg(&d2)
                    .arg(&a2)
                    .cmd("SET")
                    .arg(&d2)
                    .arg("a string now")
                    .query(&mut c)
                    .unwrap();
            }
        })));
        let e = deliver_ready(&wal, &mut s).await.unwrap_err();
        let msg = e.to_string();
        assert!(
            msg.contains("WRONGTYPE")
                && msg.contains(&data)
                && msg.contains("string")
                && msg.contains("the marker did not move"),
            "{mode:?}: refused inside EXEC by the marker move: {msg}"
        );
        match e.kind() {
            walsink::ErrorKind::Sink(se) => {
                assert_eq!(se.class(), SinkErrorClass::Permanent, "{se}")
            }
            other => panic!("{other:?}"),
        }
        let mut c = redis().await;
        let v: String = redis::cmd("GET")
            .arg(&data)
            .query_async(&mut c)
            .await
            .unwrap();
        assert_eq!(v, "a string now", "{mode:?}: nothing written");
        let m = s.marker(&id, 0).await.unwrap().unwrap();
        assert_eq!(
            (m.checkpoint, m.next, m.done),
            (1, 100, false),
            "{mode:?}: the marker did not move"
        );
        // Put the data back: the next delivery resumes at the marker.
        let _: () = redis::pipe()
            .cmd("DEL")
            .arg(&data)
            .cmd("RENAME")
            .arg(&aside)
            .arg(&data)
            .query_async(&mut c)
            .await
            .unwrap();
        s.set_test_hook(None);
        deliver_ready(&wal, &mut s).await.unwrap();
        assert_eq!(
            contents(s.config(), 0).await,
            want,
            "{mode:?}: each record once"
        );
    }
}

#[tokio::test(flavor = "multi_thread")]
#[cfg_attr(
    not(servers),
    ignore = "needs WALSINK_TEST_SERVERS=1 and a local Redis"
)]
async fn a_connection_killed_before_exec_loses_nothing() {
    let id = sink_id("killtx");
    let (_d, wal) = log(&id);
    let want = numbered(0, 1000);
    seal(&wal, 1, &want);
    let mut s = sink_with(&id, Mode::List, 100, 2);
    s.connect().await.unwrap();
    let cid = s.client_id().unwrap();
    let once = std::sync::atomic::AtomicBool::new(false);
    s.set_test_hook(Some(Arc::new(move |p: HookPoint| {
        if p.first == 400 && !once.swap(true, Ordering::SeqCst) {
            let n: i64 = redis::cmd("CLIENT")
                .arg("KILL")
                .arg("ID")
                .arg(cid)
                .query(&mut other())
                .unwrap();
            assert_eq!(n, 1, "the sink's connection {cid} was killed");
        }
    })));
    let e = deliver_ready(&wal, &mut s).await.unwrap_err();
    assert!(e.to_string().contains("retryable"), "{e}");
    let m = s.marker(&id, 0).await.unwrap().unwrap();
    assert_eq!((m.next, m.done), (400, false));
    assert_eq!(contents(s.config(), 0).await, want[..400]);
    deliver_ready(&wal, &mut s).await.unwrap();
    assert_eq!(contents(s.config(), 0).await, want);
    assert!(s.stats().connects >= 2, "{:?}", s.stats());
}

#[tokio::test(flavor = "multi_thread")]
#[cfg_attr(
    not(servers),
    ignore = "needs WALSINK_TEST_SERVERS=1 and a local Redis"
)]
async fn the_old_marker_layout_is_read_and_moved() {
    let id = sink_id("oldlayout");
    let (_d, wal) = log(&id);
    let want = numbered(0, 600);
    seal(&wal, 1, &want[..200]);
    seal(&wal, 2, &want[200..]);
    let mut s = sink_with(&id, Mode::List, 50, 2);
    let cfg = s.config().clone();
    let (data, old, mk) = (
        cfg.key_for(0),
        cfg.old_marker_key(0),
        cfg.marker_key(&id, 0),
    );
    let field = format!("{id}/0");
    // What an earlier version left: epoch 1 whole, epoch 2 up to record 320 (120 of its
    // 400), in the shared hash, beside another sink's field.
    let mut c = redis().await;
    let _: () = redis::pipe()
        .cmd("RPUSH")
        .arg(&data)
        .arg(&want[..320])
        .cmd("HSET")
        .arg(&old)
        .arg(&field)
        .arg(format!("{}:120:0", padded(2)))
        .arg(format!("{field}:meta"))
        .arg("1\nmeta-1")
        .arg("someone-else/0")
        .arg(format!("{}:5:1", padded(9)))
        .query_async(&mut c)
        .await
        .unwrap();
    assert_eq!(
        s.marker(&id, 0).await.unwrap(),
        Some(Marker {
            checkpoint: 2,
            next: 120,
            done: false
        })
    );
    assert_eq!(
        s.committed(&id, 0).await.unwrap().unwrap().metadata,
        b"meta-1"
    );
    assert!(s.is_committed(&epoch_key(&id, 1)).await.unwrap());
    // In the first transaction the metadata has moved with the marker.
    let seen = Arc::new(Mutex::new(Vec::new()));
    let (seen2, mk2, old2, f2) = (seen.clone(), mk.clone(), old.clone(), field.clone());
    s.set_test_hook(Some(Arc::new(move |p: HookPoint| {
        if p.first == 220 {
            let mut c = other();
            let (m, meta, gone): (Option<String>, Option<String>, bool) = redis::pipe()
                .cmd("HGET")
                .arg(&mk2)
                .arg("marker")
                .cmd("HGET")
                .arg(&mk2)
                .arg("meta")
                .cmd("HEXISTS")
                .arg(&old2)
                .arg(&f2)
                .query(&mut c)
                .unwrap();
            seen2.lock().unwrap().push((m, meta, !gone));
        }
    })));
    let n = deliver_ready(&wal, &mut s).await.unwrap();
    assert_eq!(n, 2);
    assert_eq!(
        s.stats().epochs_skipped,
        0,
        "the committer asked is_committed"
    );
    assert_eq!(contents(&cfg, 0).await, want, "each record once");
    assert_eq!(
        seen.lock().unwrap()[..],
        [(
            Some(format!("{}:220:0", padded(2))),
            Some("1\nmeta-1".to_string()),
            true
        )]
    );
    let st = s.stats();
    assert_eq!(st.chunks_applied, (400 - 120) / 50 + 1, "{st:?}");
    let fields: Vec<String> = redis::cmd("HKEYS")
        .arg(&old)
        .query_async(&mut c)
        .await
        .unwrap();
    assert_eq!(fields, ["someone-else/0"], "only this sink's fields moved");
    assert_eq!(
        s.committed(&id, 0).await.unwrap().unwrap(),
        walsink_redis::Committed {
            checkpoint: 2,
            metadata: b"meta-2".to_vec()
        }
    );
    assert_eq!(
        hmarker(&mut other(), &mk),
        Some(format!("{}:400:1", padded(2)))
    );
}

#[tokio::test(flavor = "multi_thread")]
#[cfg_attr(
    not(servers),
    ignore = "needs WALSINK_TEST_SERVERS=1 and a local Redis"
)]
async fn sinks_sharing_a_data_key_do_not_abort_each_other() {
    let ids = [sink_id("share-a"), sink_id("share-b")];
    let shared = format!("walsink-test:{}:shared", ids[0]);
    let mut logs = Vec::new();
    let mut sinks = Vec::new();
    for (i, id) in ids.iter().enumerate() {
        let (d, wal) = log(id);
        for cp in 1..=4u64 {
            let recs: Vec<Vec<u8>> = (0..2000)
                .map(|j| format!("{i}-{cp}-{j}").into_bytes())
                .collect();
            seal(&wal, cp, &recs);
        }
        let mut c = config(id, Mode::List);
        c.key = shared.clone();
        c.chunk_records = 20;
        c.in_flight = 1;
        let s = RedisSink::new(c).unwrap();
        logs.push((d, wal));
        sinks.push(s);
    }
    let (mut a, mut b) = (sinks.remove(0), sinks.remove(0));
    let (ra, rb) = tokio::join!(
        deliver_ready(&logs[0].1, &mut a),
        deliver_ready(&logs[1].1, &mut b)
    );
    assert_eq!((ra.unwrap(), rb.unwrap()), (4, 4));
    assert_eq!(
        (a.stats().aborts, b.stats().aborts),
        (0, 0),
        "{:?} {:?}",
        a.stats(),
        b.stats()
    );
    let held = contents(a.config(), 0).await;
    assert_eq!(held.len(), 16_000);
    for i in 0..2 {
        let mine: Vec<&Vec<u8>> = held
            .iter()
            .filter(|r| r.starts_with(format!("{i}-").as_bytes()))
            .collect();
        let want: Vec<Vec<u8>> = (1..=4u64)
            .flat_map(|cp| (0..2000).map(move |j| format!("{i}-{cp}-{j}").into_bytes()))
            .collect();
        assert!(
            mine.iter().copied().eq(want.iter()),
            "sink {i}: each record once, in order"
        );
    }
}
