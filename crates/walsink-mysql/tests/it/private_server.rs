//! Against a private MariaDB with a small `max_allowed_packet` (1 MiB; the shared server's
//! is 16 MiB and must not be reconfigured): an epoch of many MiB goes in as statements under
//! the server's limit although `batch_size` asks for 4 MiB, and a record whose row alone does
//! not fit is a permanent error naming max_allowed_packet, with nothing committed.

use crate::common::*;
use walsink::SinkErrorClass;
use walsink_mysql::testkit::Server;
use walsink_mysql::MySqlSink;
use walsink_tokio::deliver_ready;

#[tokio::test(flavor = "multi_thread")]
#[cfg_attr(
    not(servers),
    ignore = "needs WALSINK_TEST_SERVERS=1 and the MariaDB binaries"
)]
async fn statements_stay_under_max_allowed_packet() {
    let db = Server::start(&[("max_allowed_packet", "1M")]).expect("a private MariaDB");
    let url = db.url();
    let my = My::new(&url, "&batch_size=4MiB");
    let id = unique("packet");
    let log = open(&id);
    // 6 MiB in one epoch: six statements at least, each under 1 MiB.
    let want = epoch_of(
        &log.wal,
        1,
        (0..6 * 1024u64)
            .map(|i| format!("{i:08} {}", "p".repeat(1014)).into_bytes())
            .collect(),
    );
    let mut sink = MySqlSink::new(my.config());
    assert_eq!(deliver_ready(&log.wal, &mut sink).await.unwrap(), 1);
    assert_eq!(rows(&url, &my.table, &id, 0).await, want);

    // A row larger than the server takes in one statement.
    epoch_of(&log.wal, 2, vec![vec![b'q'; 1 << 20]]);
    let e = deliver_ready(&log.wal, &mut sink).await.unwrap_err();
    let text = e.to_string();
    assert!(text.contains("max_allowed_packet"), "{text}");
    match e.kind() {
        walsink::ErrorKind::Sink(s) => assert_eq!(s.class(), SinkErrorClass::Permanent),
        other => panic!("not a sink error: {other:?}"),
    }
    assert_eq!(
        log.wal.health().committed,
        Some(1),
        "epoch 2 is not committed"
    );
    let markers = sink.committed(&id, 0).await.unwrap();
    assert_eq!(markers.len(), 1, "no marker for epoch 2: {markers:?}");
}
