//! Huge, empty and limit-sized data, budgets and odd timeouts through the async API: a huge
//! epoch streams whole and in order, empty batches, records and epochs pass in both modes,
//! records at the size limit pass and one byte more fails the whole batch, records larger than
//! a read chunk arrive whole, a full backlog with `Reject` writes nothing and recovers, a
//! checkpoint refused for its metadata seals nothing, `wait_committed` takes odd timeouts, and
//! durable mode refuses the checkpoint calls with typed errors.

use crate::support::*;
use std::sync::atomic::Ordering;
use std::time::Duration;
use walsink::{ErrorKind, FullPolicy, MemorySink, Mode, WalSink};
use walsink_tokio::{AsyncWal, Json, Postcard, TypedWal};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_huge_epoch_streams_through_async_chunks_whole_and_in_order_even_after_a_dropped_read() {
    let dir = tempfile::tempdir().unwrap();
    let (wal, _) = AsyncWal::open(
        dir.path(),
        opts("huge")
            .read_chunk_size(1024)
            .max_record_size(16 * 1024)
            .segment_size(256 * 1024),
    )
    .await
    .unwrap();
    let records: Vec<Vec<u8>> = (0..20_000)
        .map(|i| format!("{i:08}{}", "h".repeat(i % 90)).into_bytes())
        .collect();
    seal(&wal, 1, &records).await;
    wal.checkpoint_complete(1).unwrap();
    let s = Streamer::default();
    let committer = wal.spawn_committer(s.clone()).unwrap();
    assert!(
        guard(
            "commit the huge epoch",
            wal.wait_committed(1, Duration::MAX)
        )
        .await
    );
    committer.shutdown(Duration::from_secs(10)).await;
    assert_eq!(
        *s.loaded.lock(),
        Some(false),
        "an epoch of many chunks is not loaded up front"
    );
    assert!(
        s.chunks.load(Ordering::SeqCst) > 100,
        "read in bounded chunks"
    );
    assert!(s.problems.lock().is_empty(), "{:?}", s.problems.lock());
    assert!(*s.out.lock() == records, "every record, in order");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn empty_batches_empty_records_and_empty_epochs_pass_in_both_modes() {
    let dir = tempfile::tempdir().unwrap();
    let (wal, _) = AsyncWal::open(dir.path(), opts("empty")).await.unwrap();
    let probe = Probe::new();
    let committer = wal.spawn_committer(probe.clone()).unwrap();
    wal.append_batch(&[]).await.unwrap();
    assert_eq!(wal.health().open_records, 0);
    wal.checkpoint(1, b"").await.unwrap();
    wal.append(b"").await.unwrap();
    wal.append_batch(&[b"".as_slice(), b""]).await.unwrap();
    wal.checkpoint(2, b"").await.unwrap();
    wal.checkpoint_complete(2).unwrap();
    assert!(guard("commit 2", wal.wait_committed(2, Duration::MAX)).await);
    committer.shutdown(Duration::from_secs(10)).await;
    // The blocking driver, given the same log shape, is the reference of the contract.
    let dir2 = tempfile::tempdir().unwrap();
    let (w2, _) = WalSink::open(dir2.path(), opts("empty-sync")).unwrap();
    w2.append_batch(Vec::<&[u8]>::new()).unwrap();
    w2.checkpoint(1, b"").unwrap();
    w2.append(b"").unwrap();
    w2.append_batch([b"".as_slice(), b""]).unwrap();
    w2.checkpoint(2, b"").unwrap();
    w2.checkpoint_complete(2).unwrap();
    let mut ms = MemorySink::new();
    w2.deliver_ready(&mut ms).unwrap();
    assert_eq!(
        probe.ok_ids(),
        ms.checkpoints(),
        "the async committer delivers the same epochs as the blocking driver"
    );
    assert!(
        wal.wait_committed(1, Duration::ZERO).await,
        "the empty epoch is committed"
    );
    assert_eq!(
        probe.ok().last(),
        Some(&(2, vec![vec![], vec![], vec![]])),
        "empty records are delivered"
    );

    let dir = tempfile::tempdir().unwrap();
    let (wal, _) = AsyncWal::open(dir.path(), opts("empty-durable").mode(Mode::Durable))
        .await
        .unwrap();
    guard("empty durable batch", wal.append_batch(&[]))
        .await
        .unwrap();
    guard("empty durable record", wal.append(b""))
        .await
        .unwrap();
    let mut p = Probe::new();
    wal.deliver_ready(&mut p).await.unwrap();
    assert_eq!(p.records(), vec![Vec::<u8>::new()]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn records_at_the_size_limit_pass_and_one_byte_more_fails_the_whole_batch() {
    for (limit, buffer) in [(100usize, 256 * 1024usize), (5000, 4096)] {
        for mode in [Mode::Checkpointed, Mode::Durable] {
            let what = format!("limit {limit}, buffer {buffer}, {mode:?}");
            let dir = tempfile::tempdir().unwrap();
            let (wal, _) = AsyncWal::open(
                dir.path(),
                opts("limit")
                    .mode(mode)
                    .max_record_size(limit)
                    .write_buffer_size(buffer),
            )
            .await
            .unwrap();
            let at = vec![1u8; limit];
            let over = vec![2u8; limit + 1];
            wal.append(&at)
                .await
                .unwrap_or_else(|e| panic!("{what}: at the limit: {e:?}"));
            let e = wal.append(&over).await.unwrap_err();
            assert!(
                matches!(e.kind(), ErrorKind::RecordTooLarge { .. }),
                "{what}: {e:?}"
            );
            let e = wal
                .append_batch(&[at.as_slice(), over.as_slice(), at.as_slice()])
                .await
                .unwrap_err();
            assert!(
                matches!(e.kind(), ErrorKind::RecordTooLarge { .. }),
                "{what}: {e:?}"
            );
            let typed = TypedWal::<Vec<u8>, Json>::new(wal.clone(), Json);
            assert!(
                typed.append(&vec![0u8; limit]).await.is_err(),
                "{what}: json is larger"
            );
            if mode == Mode::Checkpointed {
                assert_eq!(wal.health().open_records, 1, "{what}: nothing of the batch");
                wal.checkpoint(1, b"").await.unwrap();
                wal.checkpoint_complete(1).unwrap();
            }
            let mut p = Probe::new();
            wal.deliver_ready(&mut p).await.unwrap();
            assert_eq!(p.records(), vec![at.clone()], "{what}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_backlog_with_reject_fails_typed_writes_nothing_and_recovers_after_delivery() {
    let dir = tempfile::tempdir().unwrap();
    let (wal, _) = AsyncWal::open(
        dir.path(),
        opts("reject").max_backlog_bytes(2000, FullPolicy::Reject),
    )
    .await
    .unwrap();
    let big: Vec<Vec<u8>> = (0..3).map(|i| vec![i as u8; 1000]).collect();
    seal(&wal, 1, &big).await;
    wal.checkpoint_complete(1).unwrap();
    let before = wal.health();
    for r in [
        guard("append", wal.append(b"x")).await,
        guard("batch", wal.append_batch(&[b"y".as_slice(), b"z"])).await,
        guard("big", wal.append(&vec![9u8; 50_000])).await,
        guard(
            "typed",
            TypedWal::<u32, Postcard>::new(wal.clone(), Postcard).append(&5),
        )
        .await,
    ] {
        let e = r.expect_err("the budget is used up: reject");
        assert!(matches!(e.kind(), ErrorKind::BacklogFull { .. }), "{e:?}");
    }
    let after = wal.health();
    assert_eq!(after.open_records, before.open_records, "nothing written");
    assert_eq!(after.open_bytes, before.open_bytes, "nothing written");
    let mut p = Probe::new();
    wal.deliver_ready(&mut p).await.unwrap();
    wal.append(b"after").await.unwrap();
    wal.checkpoint(2, b"").await.unwrap();
    wal.checkpoint_complete(2).unwrap();
    wal.deliver_ready(&mut p).await.unwrap();
    let mut want = big.clone();
    want.push(b"after".to_vec());
    assert_eq!(p.records(), want);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wait_committed_with_odd_timeouts() {
    let dir = tempfile::tempdir().unwrap();
    let (wal, _) = AsyncWal::open(dir.path(), opts("odd-timeouts"))
        .await
        .unwrap();
    assert!(!guard("zero", wal.wait_committed(1, Duration::ZERO)).await);
    assert!(!guard("1 ns", wal.wait_committed(1, Duration::from_nanos(1))).await);
    assert!(!guard("u64::MAX id", wal.wait_committed(u64::MAX, ms(5))).await);
    let w = wal.clone();
    let early =
        tokio::spawn(async move { w.wait_committed(2, Duration::from_secs(u64::MAX)).await });
    let w = wal.clone();
    let max = tokio::spawn(async move { w.wait_committed(2, Duration::MAX).await });
    let probe = Probe::new();
    let committer = wal.spawn_committer(probe.clone()).unwrap();
    seal(&wal, 1, &recs(1, 1)).await;
    seal(&wal, 2, &recs(2, 1)).await;
    wal.checkpoint_complete(2).unwrap();
    assert!(guard("u64::MAX secs", early).await.unwrap());
    assert!(guard("Duration::MAX", max).await.unwrap());
    assert!(
        wal.wait_committed(1, Duration::ZERO).await,
        "already committed: true at once"
    );
    assert!(wal.wait_committed(2, Duration::ZERO).await);
    assert!(!wal.wait_committed(3, ms(10)).await);
    committer.shutdown(Duration::from_secs(10)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn durable_mode_refuses_checkpoint_complete_and_restore_with_typed_errors() {
    let dir = tempfile::tempdir().unwrap();
    let (wal, _) = AsyncWal::open(dir.path(), opts("durable-refuse").mode(Mode::Durable))
        .await
        .unwrap();
    wal.append(b"a").await.unwrap();
    let e = guard("checkpoint", wal.checkpoint(100, b""))
        .await
        .unwrap_err();
    assert!(
        matches!(e.kind(), ErrorKind::InvalidOperation { .. }),
        "{e:?}"
    );
    let e = guard("restore", wal.restore(None)).await.unwrap_err();
    assert!(
        matches!(e.kind(), ErrorKind::InvalidOperation { .. }),
        "{e:?}"
    );
    let e = wal.checkpoint_complete(100).unwrap_err();
    assert!(
        matches!(e.kind(), ErrorKind::InvalidOperation { .. }),
        "{e:?}"
    );
    let mut p = Probe::new();
    wal.deliver_ready(&mut p).await.unwrap();
    assert_eq!(p.records(), vec![b"a".to_vec()]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn records_larger_than_a_read_chunk_arrive_whole_one_per_chunk() {
    let dir = tempfile::tempdir().unwrap();
    let (wal, _) = AsyncWal::open(dir.path(), opts("big-frames").read_chunk_size(1024))
        .await
        .unwrap();
    let records: Vec<Vec<u8>> = [5000usize, 10, 3000, 1, 20000, 0, 1024, 1023]
        .iter()
        .enumerate()
        .map(|(i, &n)| (0..n).map(|j| ((i * 31 + j) % 251) as u8).collect())
        .collect();
    seal(&wal, 1, &records).await;
    wal.checkpoint_complete(1).unwrap();
    let mut p = Probe::new();
    wal.deliver_ready(&mut p).await.unwrap();
    assert_eq!(p.records(), records);
    assert!(p.violations().is_empty(), "{:?}", p.violations());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_checkpoint_refused_for_its_metadata_seals_nothing_and_loses_no_record() {
    let dir = tempfile::tempdir().unwrap();
    let (wal, _) = AsyncWal::open(dir.path(), opts("meta-limit").max_metadata_size(100))
        .await
        .unwrap();
    wal.append_batch(&refs(&recs(1, 7))).await.unwrap();
    assert!(
        wal.checkpoint(1, &[0u8; 101]).await.is_err(),
        "metadata over the limit"
    );
    assert!(wal.pending().is_empty(), "nothing sealed");
    assert_eq!(wal.health().open_records, 7);
    wal.checkpoint(1, &[1u8; 100])
        .await
        .expect("metadata at the limit");
    let p = wal.pending();
    assert_eq!(p.len(), 1);
    assert_eq!(p[0].records, 7);
    assert_eq!(p[0].metadata, vec![1u8; 100]);
}
