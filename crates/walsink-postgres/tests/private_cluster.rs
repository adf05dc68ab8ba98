//! The private-cluster helper: starts with the settings asked for, serves, restarts, and is
//! gone after drop.

use walsink_postgres::testkit::{Cluster, StopMode};

#[tokio::test]
#[cfg_attr(
    not(servers),
    ignore = "needs WALSINK_TEST_SERVERS=1 and the PostgreSQL binaries"
)]
async fn a_private_cluster_has_its_settings_and_is_removed() {
    let pg = Cluster::start(&[("max_prepared_transactions", "7")]).expect("start");
    let dir = pg.dir().to_path_buf();
    let show = |url: String| async move {
        let (c, conn) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
            .await
            .expect("connect");
        tokio::spawn(conn);
        let row = c
            .query_one("SHOW max_prepared_transactions", &[])
            .await
            .unwrap();
        row.get::<_, String>(0)
    };
    assert_eq!(show(pg.url("postgres")).await, "7", "{}", pg.server_log());
    pg.restart(StopMode::Fast).expect("restart");
    assert_eq!(show(pg.url("postgres")).await, "7");
    drop(pg);
    assert!(!dir.exists(), "the cluster's directory is removed");
}
