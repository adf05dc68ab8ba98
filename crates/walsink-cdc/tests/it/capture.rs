//! The capture side in a private cluster (`wal_level=logical`, started and removed by the
//! test): a snapshot then the stream reach the replica with every column type intact; the
//! slot does not move before the target committed; a source rewound to the start (a replay
//! of the snapshot and the whole stream) changes nothing in the replica.

use std::sync::Arc;
use walsink::{MemoryCommitStore, Options, WalSink};
use walsink_cdc::capture::{Capture, SourceConfig, SourcePos};
use walsink_cdc::check::compare;
use walsink_cdc::{CdcSink, Config};
use walsink_postgres::testkit::Cluster;

async fn same(c: &tokio_postgres::Client) -> walsink_cdc::check::Comparison {
    compare(c, ("public", "kinds"), ("replica", "kinds"))
        .await
        .unwrap()
}

async fn connect(url: &str) -> tokio_postgres::Client {
    let (c, conn) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(conn);
    c
}

struct Pipeline {
    wal: Arc<WalSink>,
    _dir: tempfile::TempDir,
    sink: CdcSink,
    next_cp: u64,
}

impl Pipeline {
    /// Reads from `pos` until the source has nothing more, sealing one checkpoint per batch;
    /// delivers only when `deliver`.
    async fn run(&mut self, cap: &mut Capture, mut pos: SourcePos, deliver: bool) -> SourcePos {
        loop {
            let b = cap.next(&pos).await.unwrap();
            if b.pos == pos {
                return pos;
            }
            self.wal
                .append_batch(b.events.iter().map(Vec::as_slice))
                .unwrap();
            self.wal.checkpoint(self.next_cp, b"").unwrap();
            self.wal.checkpoint_complete(self.next_cp).unwrap();
            self.next_cp += 1;
            if deliver {
                walsink_tokio::deliver_ready(&self.wal, &mut self.sink)
                    .await
                    .unwrap();
                cap.advance(b.pos.end_lsn).await.unwrap();
            }
            pos = b.pos;
        }
    }
}

#[tokio::test(flavor = "multi_thread")]
#[cfg_attr(
    not(servers),
    ignore = "needs WALSINK_TEST_SERVERS=1 and the PostgreSQL binaries"
)]
async fn snapshot_then_stream_with_a_gated_slot_and_a_harmless_rewind() {
    let pg = Cluster::start(&[("wal_level", "logical")]).expect("private cluster");
    let url = pg.url("postgres");
    let c = connect(&url).await;
    c.batch_execute(
        "CREATE TABLE kinds (id bigint PRIMARY KEY, amount numeric(30,10), at timestamptz, doc jsonb, \
           flag boolean, label text, tags int[], ratio double precision, day date);
         INSERT INTO kinds SELECT g, g * 1.0000000001, '2024-01-01 00:00:00+00'::timestamptz + g * interval '1 hour',
           jsonb_build_object('g', g, 'nested', jsonb_build_array(g, 'x')), g % 2 = 0, 'it''s \"quoted\" ' || g,
           ARRAY[g, g + 1], g / 3.0, DATE '2024-02-29' + g::int FROM generate_series(1, 2500) g;
         INSERT INTO kinds (id) VALUES (100000);",
    )
    .await
    .unwrap();
    let cfg = SourceConfig::from_url(&format!(
        "{url}?slot=t_slot&tables=kinds&snapshot_rows=1000"
    ))
    .unwrap();
    let mut cap = Capture::connect(cfg).await.unwrap();
    let start = cap.start().await.unwrap();
    let sink_cfg = Config::from_url(&format!("{url}?schema=replica")).unwrap();
    let mut sink = CdcSink::connect(sink_cfg).await.unwrap();
    sink.execute(&cap.target_ddl("replica").await.unwrap())
        .await
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let (wal, _) = WalSink::open_with(
        Arc::new(walsink::storage::FsStorage::new(dir.path()).unwrap()),
        Options::new("t"),
        Box::new(MemoryCommitStore::new()),
    )
    .unwrap();
    let mut p = Pipeline {
        wal: Arc::new(wal),
        _dir: dir,
        sink,
        next_cp: 1,
    };
    // Changes while the snapshot is read: the overlap.
    c.batch_execute("UPDATE kinds SET label = 'changed' WHERE id % 100 = 0; DELETE FROM kinds WHERE id % 250 = 1;")
        .await
        .unwrap();
    let pos = p.run(&mut cap, start.clone(), true).await;
    assert!(pos.snapshot.is_none());
    assert!(same(&c).await.identical(), "{:?}", same(&c).await);
    // The stream: key changes, deletes, a truncate and refills, in several transactions.
    c.batch_execute(
        "UPDATE kinds SET id = id + 500000 WHERE id % 7 = 0;
         DELETE FROM kinds WHERE id % 11 = 0;
         BEGIN; INSERT INTO kinds (id, label) VALUES (900001, 'a'), (900002, 'b'); UPDATE kinds SET tags = '{}' WHERE id = 900001; COMMIT;",
    )
    .await
    .unwrap();
    let before = cap.slot_position().await.unwrap().unwrap();
    // Read and seal without delivering: the slot stays where the target is.
    let pos2 = p.run(&mut cap, pos.clone(), false).await;
    assert!(pos2.commit_lsn > pos.commit_lsn);
    assert_eq!(
        cap.slot_position().await.unwrap(),
        Some(before),
        "the slot moved before the target committed"
    );
    walsink_tokio::deliver_ready(&p.wal, &mut p.sink)
        .await
        .unwrap();
    cap.advance(pos2.end_lsn).await.unwrap();
    assert_eq!(cap.slot_position().await.unwrap(), Some(pos2.end_lsn));
    assert!(same(&c).await.identical(), "{:?}", same(&c).await);
    c.batch_execute("TRUNCATE kinds; INSERT INTO kinds (id, label) VALUES (1, 'after truncate');")
        .await
        .unwrap();
    let pos3 = p.run(&mut cap, pos2.clone(), true).await;
    assert!(same(&c).await.identical(), "{:?}", same(&c).await);
    // A rewind: the snapshot and the stream again, from a new slot's start and from the
    // first position, as an at-least-once upstream would re-send them.
    let mut rewound = start.clone();
    rewound.snapshot = Some(walsink_cdc::capture::SnapshotPos {
        table: 0,
        after: None,
    });
    let _ = p.run(&mut cap, rewound, true).await;
    assert!(
        same(&c).await.identical(),
        "a rewind changed the replica: {:?}",
        same(&c).await
    );
    assert!(pos3.events > 2500);
}
