//! Records of any shape land once or are refused naming their position: hash-mode records
//! without a tab, of a tab only, binary, with CRLF or of 6 MB; huge records (1–10 MB) mixed
//! with empty ones in list and stream mode, cut and resumed.

use crate::common::*;
use std::time::Duration;
use walsink_redis::{Mode, RedisSink};
use walsink_tokio::deliver_ready;

/// Hash mode: an empty record has no tab and must be refused naming its position, with
/// nothing of the epoch written; records of a tab only, binary fields, CRLF, and a 6 MB value.
#[tokio::test(flavor = "multi_thread")]
#[cfg_attr(
    not(servers),
    ignore = "needs WALSINK_TEST_SERVERS=1 and a local Redis"
)]
async fn hash_mode_odd_records() {
    let key = format!("probe:{}", uniq("hash"));
    let sink_id = uniq("s");
    let d = tempfile::tempdir().unwrap();
    let wal = open_log(d.path(), &sink_id);
    let big = vec![b'v'; 6 << 20];
    let mut r_big = b"big\t".to_vec();
    r_big.extend_from_slice(&big);
    let good: Vec<Vec<u8>> = vec![
        b"\t".to_vec(),
        b"a\tb\tc".to_vec(),
        b"cr\r\nlf\tx\r\ny".to_vec(),
        vec![0xff, 0xfe, b'\t', 0x00, 0x80],
        b"dup\tfirst".to_vec(),
        r_big,
        b"dup\tsecond".to_vec(),
    ];
    seal(&wal, 1, &good);
    let bad = vec![
        b"k\tv".to_vec(),
        b"x\ty".to_vec(),
        b"".to_vec(),
        b"z\tw".to_vec(),
    ];
    seal(&wal, 2, &bad);
    let mut s = RedisSink::new(cfg(&key, Mode::Hash, 2, 2)).unwrap();
    let mk = s.config().marker_key(&sink_id, 0);
    let r = deliver_ready(&wal, &mut s).await;
    let got = hash(&key).await;
    del(&[key.clone(), mk]).await;
    let e = r.expect_err("the empty record of checkpoint 2 has no tab");
    assert!(
        e.to_string().contains("record 2 of checkpoint 2") && e.to_string().contains("permanent"),
        "{e}"
    );
    assert_eq!(wal.health().committed, Some(1));
    let mut want = std::collections::BTreeMap::new();
    want.insert(b"".to_vec(), b"".to_vec());
    want.insert(b"a".to_vec(), b"b\tc".to_vec());
    want.insert(b"cr\r\nlf".to_vec(), b"x\r\ny".to_vec());
    want.insert(vec![0xff, 0xfe], vec![0x00, 0x80]);
    want.insert(b"dup".to_vec(), b"second".to_vec());
    want.insert(b"big".to_vec(), big);
    assert!(
        got == want,
        "hash holds {} fields: {:?}",
        got.len(),
        got.keys().collect::<Vec<_>>()
    );
}

/// Huge records (1–10 MB) in list and stream mode, mixed with empty ones, cut and resumed.
#[tokio::test(flavor = "multi_thread")]
#[cfg_attr(
    not(servers),
    ignore = "needs WALSINK_TEST_SERVERS=1 and a local Redis"
)]
async fn huge_records_land_once() {
    for mode in [Mode::List, Mode::Stream] {
        let key = format!("probe:{}:{}", uniq("huge"), mode.name());
        let sink_id = uniq("s");
        let d = tempfile::tempdir().unwrap();
        let wal = open_log(d.path(), &sink_id);
        let recs: Vec<Vec<u8>> = vec![
            vec![1u8; 1 << 20],
            vec![],
            vec![2u8; 10 << 20],
            b"small".to_vec(),
            vec![3u8; 3 << 20],
        ];
        seal(&wal, 1, &recs);
        let mut s = RedisSink::new(cfg(&key, mode, 1000, 2)).unwrap();
        let mk = s.config().marker_key(&sink_id, 0);
        let _ = tokio::time::timeout(Duration::from_millis(5), deliver_ready(&wal, &mut s)).await;
        let mut s2 = RedisSink::new(cfg(&key, mode, 1000, 2)).unwrap();
        deliver_ready(&wal, &mut s2).await.unwrap();
        tokio::time::sleep(Duration::from_millis(200)).await;
        let got = if mode == Mode::List {
            list(&key).await
        } else {
            stream(&key).await
        };
        del(&[key.clone(), mk]).await;
        assert_eq!(got.len(), recs.len(), "{mode:?}");
        assert!(got == recs, "{mode:?}: contents differ");
    }
}
