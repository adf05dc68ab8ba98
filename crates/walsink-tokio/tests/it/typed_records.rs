//! Typed records (`TypedWal` with the postcard and JSON codecs): records that do not decode
//! are typed errors naming their position (never a panic, whatever the bytes), bytes after a
//! value are not misread, a batch with a value that cannot encode or is over the size limit
//! appends none and names its index, and an undecodable record stops delivery at its epoch
//! without skipping anything after it.

use crate::support::*;
use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;
use walsink::{Epoch, ErrorKind, SinkError, SinkErrorClass};
use walsink_tokio::{
    AsyncChunks, AsyncSink, AsyncWal, Codec, DecodeError, Json, Postcard, TypedWal,
};

#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
enum EvOld {
    V1 { id: u64, name: String },
}

#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
enum EvNew {
    V1 {
        id: u64,
        name: String,
    },
    V2 {
        id: u64,
        name: String,
        tags: Vec<u32>,
    },
}

async fn decode_all<T, C>(
    codec: C,
    records: &[Vec<u8>],
    cp: u64,
) -> Vec<std::thread::Result<Result<T, DecodeError>>>
where
    T: serde::de::DeserializeOwned + Send + 'static,
    C: Codec + Clone,
{
    let dir = tempfile::tempdir().unwrap();
    let (wal, _) = AsyncWal::open(dir.path(), opts("typed")).await.unwrap();
    for c in 1..cp {
        wal.checkpoint(c, b"").await.unwrap();
    }
    seal(&wal, cp, records).await;
    wal.checkpoint_complete(cp).unwrap();
    let out = Arc::new(Mutex::new(Vec::new()));
    let mut sink = Decoding::<T, C> {
        codec,
        out: out.clone(),
    };
    wal.deliver_ready(&mut sink).await.unwrap();
    let v = std::mem::take(&mut *out.lock());
    v
}

fn expect_decode_error<T: std::fmt::Debug>(
    r: &std::thread::Result<Result<T, DecodeError>>,
    cp: u64,
    index: u64,
    codec: &str,
    what: &str,
) {
    match r {
        Err(_) => panic!("{what}: decoding panicked"),
        Ok(Ok(v)) => panic!("{what}: decoded as {v:?} instead of a DecodeError"),
        Ok(Err(e)) => {
            assert_eq!(e.position.checkpoint, cp, "{what}: {e:?}");
            assert_eq!(e.position.index, index, "{what}: {e:?}");
            assert_eq!(e.codec, codec, "{what}");
            let text = e.to_string();
            assert!(
                text.contains(&cp.to_string()) && text.contains(&index.to_string()),
                "{what}: the message names the position: {text}"
            );
            let se: SinkError = e.clone().into();
            assert_eq!(se.class(), SinkErrorClass::Permanent, "{what}");
        }
    }
}

/// A value no codec can encode.
#[derive(Debug, Clone)]
enum Enc {
    Fine(u32),
    Broken,
}

impl Serialize for Enc {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            Enc::Fine(v) => s.serialize_u32(*v),
            Enc::Broken => Err(serde::ser::Error::custom("this value cannot be encoded")),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postcard_records_that_do_not_decode_are_typed_errors_naming_their_position() {
    let mut good = Vec::new();
    Postcard
        .encode(
            &EvOld::V1 {
                id: 7,
                name: "seven".into(),
            },
            &mut good,
        )
        .unwrap();
    let mut newer = Vec::new();
    Postcard
        .encode(
            &EvNew::V2 {
                id: 8,
                name: "eight".into(),
                tags: vec![1, 2],
            },
            &mut newer,
        )
        .unwrap();
    let records = vec![
        good.clone(),                             // 0 ok
        vec![0xff; 9],                            // 1 garbage
        good[..good.len() - 1].to_vec(),          // 2 truncated
        newer,                                    // 3 a newer version
        vec![],                                   // 4 empty
        vec![0x00, 0xff, 0xff, 0xff, 0xff, 0x0f], // 5 a huge string length
    ];
    let got = decode_all::<EvOld, Postcard>(Postcard, &records, 37).await;
    assert_eq!(got.len(), records.len());
    match &got[0] {
        Ok(Ok(v)) => assert_eq!(
            v,
            &EvOld::V1 {
                id: 7,
                name: "seven".into()
            }
        ),
        other => panic!(
            "a good record: {:?}",
            other
                .as_ref()
                .map(|r| r.as_ref().map_err(|e| e.to_string()))
        ),
    }
    for (i, what) in [
        (1, "garbage"),
        (2, "truncated"),
        (3, "newer version"),
        (4, "empty"),
        (5, "huge length"),
    ] {
        expect_decode_error(&got[i], 37, i as u64, Postcard::NAME, what);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_postcard_record_with_bytes_after_the_value_is_not_misread() {
    let mut longer = Vec::new();
    Postcard
        .encode(
            &EvOld::V1 {
                id: 7,
                name: "seven".into(),
            },
            &mut longer,
        )
        .unwrap();
    longer.extend_from_slice(&[1, 2, 3]);
    let got = decode_all::<EvOld, Postcard>(Postcard, &[longer], 2).await;
    expect_decode_error(&got[0], 2, 0, Postcard::NAME, "trailing bytes");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_records_that_do_not_decode_are_typed_errors_naming_their_position() {
    let mut good = Vec::new();
    Json.encode(
        &EvOld::V1 {
            id: 1,
            name: "one".into(),
        },
        &mut good,
    )
    .unwrap();
    let mut other = Vec::new();
    Json.encode(
        &Other {
            ratio: 0.5,
            flag: true,
        },
        &mut other,
    )
    .unwrap();
    let mut newer = Vec::new();
    Json.encode(
        &EvNew::V2 {
            id: 2,
            name: "two".into(),
            tags: vec![],
        },
        &mut newer,
    )
    .unwrap();
    let mut trailing = good.clone();
    trailing.extend_from_slice(b" {}");
    let records = vec![
        good.clone(),
        b"\xff\xfe not json".to_vec(),
        good[..good.len() / 2].to_vec(),
        other,
        newer,
        vec![],
        trailing,
    ];
    let got = decode_all::<EvOld, Json>(Json, &records, 3).await;
    assert!(matches!(&got[0], Ok(Ok(EvOld::V1 { id: 1, .. }))));
    for (i, what) in [
        (1, "garbage"),
        (2, "truncated"),
        (3, "another type"),
        (4, "newer version"),
        (5, "empty"),
        (6, "trailing"),
    ] {
        expect_decode_error(&got[i], 3, i as u64, Json::NAME, what);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn random_garbage_never_panics_either_codec() {
    let mut rng = fastrand::Rng::with_seed(11);
    let mut records: Vec<Vec<u8>> = (0..600)
        .map(|_| {
            let n = rng.usize(0..48);
            (0..n).map(|_| rng.u8(..)).collect()
        })
        .collect();
    records.push(vec![0xff, 0xff, 0xff, 0xff, 0x0f]);
    records.push(vec![0x01, 0x00, 0xff, 0xff, 0xff, 0xff, 0x0f]);
    let a = decode_all::<EvNew, Postcard>(Postcard, &records, 1).await;
    let b = decode_all::<Vec<String>, Postcard>(Postcard, &records, 1).await;
    let c = decode_all::<(u64, String, Option<Vec<u8>>), Json>(Json, &records, 1).await;
    let d = decode_all::<BTreeMap<String, Other>, Json>(Json, &records, 1).await;
    for (name, panics) in [
        ("postcard EvNew", a.iter().filter(|r| r.is_err()).count()),
        (
            "postcard Vec<String>",
            b.iter().filter(|r| r.is_err()).count(),
        ),
        ("json tuple", c.iter().filter(|r| r.is_err()).count()),
        ("json map", d.iter().filter(|r| r.is_err()).count()),
    ] {
        assert_eq!(panics, 0, "{name}: decoding garbage panicked");
    }
    for (i, r) in a.iter().enumerate() {
        if let Ok(Err(e)) = r {
            assert_eq!(e.position.index, i as u64);
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_typed_batch_with_a_value_that_cannot_encode_appends_none_and_names_its_index() {
    let dir = tempfile::tempdir().unwrap();
    let (wal, _) = AsyncWal::open(dir.path(), opts("typed-enc")).await.unwrap();
    let pc = TypedWal::<Enc, Postcard>::new(wal.clone(), Postcard);
    let js = TypedWal::<Enc, Json>::new(wal.clone(), Json);
    let batch = [
        Enc::Fine(1),
        Enc::Fine(2),
        Enc::Fine(3),
        Enc::Broken,
        Enc::Fine(5),
    ];
    for (name, r) in [
        ("postcard", pc.append_batch(&batch).await),
        ("json", js.append_batch(&batch).await),
    ] {
        let e = r.expect_err("a value that cannot be encoded fails the batch");
        assert!(
            matches!(e.kind(), ErrorKind::InvalidOperation { .. }),
            "{name}: {e:?}"
        );
        assert!(e.to_string().contains('3'), "{name}: names index 3: {e}");
    }
    assert!(pc.append(&Enc::Broken).await.is_err());
    assert_eq!(wal.health().open_records, 0, "all or none");
    pc.append_batch(&[]).await.unwrap();
    pc.append_batch(&[Enc::Fine(9)]).await.unwrap();
    assert_eq!(wal.health().open_records, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_undecodable_record_stops_delivery_at_its_epoch_and_nothing_after_it_is_skipped() {
    #[derive(Clone)]
    struct Typed(Arc<Mutex<Vec<u64>>>);
    impl AsyncSink for Typed {
        async fn deliver(&mut self, epoch: &Epoch) -> Result<(), SinkError> {
            let mut chunks = AsyncChunks::new(epoch);
            while let Some(c) = chunks.next().await {
                for r in c
                    .map_err(|e| SinkError::retryable(e.to_string()))?
                    .records()
                {
                    let _: EvOld = Postcard.decode_record(&r)?;
                }
            }
            self.0.lock().push(epoch.checkpoint());
            Ok(())
        }
    }
    let dir = tempfile::tempdir().unwrap();
    let (wal, _) = AsyncWal::open(dir.path(), opts("typed-stop"))
        .await
        .unwrap();
    let typed = TypedWal::new(wal.clone(), Postcard);
    typed
        .append(&EvOld::V1 {
            id: 1,
            name: "a".into(),
        })
        .await
        .unwrap();
    wal.checkpoint(1, b"").await.unwrap();
    typed
        .append(&EvOld::V1 {
            id: 2,
            name: "b".into(),
        })
        .await
        .unwrap();
    wal.append(&[0xff, 0xff, 0xff]).await.unwrap();
    wal.checkpoint(2, b"").await.unwrap();
    typed
        .append(&EvOld::V1 {
            id: 3,
            name: "c".into(),
        })
        .await
        .unwrap();
    wal.checkpoint(3, b"").await.unwrap();
    wal.checkpoint_complete(3).unwrap();
    let s = Typed(Arc::default());
    let committer = wal.spawn_committer(s.clone()).unwrap();
    assert!(guard("commit 1", wal.wait_committed(1, Duration::MAX)).await);
    wait_until("repeated failures of epoch 2", || wal.health().errors >= 3).await;
    let h = wal.health();
    assert_eq!(
        *s.0.lock(),
        vec![1],
        "epoch 3 is never delivered past epoch 2"
    );
    assert_eq!(h.committed, Some(1));
    let last = h.last_error.expect("the decode error shows in health");
    assert!(
        last.contains('2') && last.contains('1'),
        "names checkpoint 2, index 1: {last}"
    );
    let report = guard("shutdown", committer.shutdown(ms(500))).await;
    assert_eq!(report.pending, vec![2, 3]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_typed_batch_with_one_value_over_the_size_limit_appends_none() {
    let dir = tempfile::tempdir().unwrap();
    let (wal, _) = AsyncWal::open(dir.path(), opts("typed-limit").max_record_size(64))
        .await
        .unwrap();
    let typed = TypedWal::<String, Postcard>::new(wal.clone(), Postcard);
    let e = typed
        .append_batch(&["a".to_string(), "x".repeat(100), "b".to_string()])
        .await
        .unwrap_err();
    assert!(
        matches!(e.kind(), ErrorKind::RecordTooLarge { .. }),
        "{e:?}"
    );
    assert_eq!(wal.health().open_records, 0, "all or none");
}
