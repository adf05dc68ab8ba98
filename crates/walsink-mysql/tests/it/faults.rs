//! Connections cut at random moments: a TCP proxy in the test, between the sink and the
//! shared MariaDB, drops each connection it carries (both directions at once) after a random
//! lifetime, so cuts land in the handshake, inside an epoch's transaction (between rows,
//! after the marker, after `XA END` or `XA PREPARE`) and during `COMMIT`/`XA COMMIT`. In
//! marker and XA mode, every line lands exactly once, in order, and no XA transaction of the
//! sink is left in `XA RECOVER`.

use crate::common::*;
use mysql_async::prelude::Queryable;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use walsink_mysql::{xa, Config, MySqlSink};
use walsink_tokio::spawn_committer;

/// Counts of what the proxy did.
#[derive(Default)]
struct Counts {
    connections: AtomicU64,
    cuts: AtomicU64,
}

/// Cuts per run: after them the proxy carries connections to the end, so the run finishes.
const CUTS: u64 = 25;

/// A proxy on a free port to `upstream`. Each of the first [`CUTS`] connections is cut after
/// a random number of bytes from the sink (0 to 400 KB, an epoch being about 200 KB), so
/// the cuts land while the sink is talking: in the handshake, between the rows, after the
/// marker or `XA PREPARE`, in `COMMIT`. The bytes before the cut are passed on whole.
async fn proxy(upstream: &'static str, counts: Arc<Counts>) -> u16 {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = l.local_addr().unwrap().port();
    tokio::spawn(async move {
        let mut cutting = 0u64;
        loop {
            let Ok((down, _)) = l.accept().await else {
                return;
            };
            counts.connections.fetch_add(1, Ordering::Relaxed);
            let budget = (cutting < CUTS).then(|| fastrand::usize(0..400_000));
            cutting += 1;
            let counts = counts.clone();
            tokio::spawn(async move {
                let Ok(up) = TcpStream::connect(upstream).await else {
                    return;
                };
                let (mut dr, mut dw) = down.into_split();
                let (mut ur, mut uw) = up.into_split();
                let to_sink = tokio::io::copy(&mut ur, &mut dw);
                let to_server = async {
                    let mut buf = vec![0u8; 16 << 10];
                    let mut sent = 0usize;
                    loop {
                        let n = match dr.read(&mut buf).await {
                            Ok(0) | Err(_) => return false,
                            Ok(n) => n,
                        };
                        let n = match budget {
                            Some(b) if sent + n >= b => {
                                let _ = uw.write_all(&buf[..b - sent]).await;
                                return true;
                            }
                            _ => n,
                        };
                        if uw.write_all(&buf[..n]).await.is_err() {
                            return false;
                        }
                        sent += n;
                    }
                };
                let cut = tokio::select! {
                    _ = to_sink => false,
                    cut = to_server => cut,
                };
                if cut {
                    counts.cuts.fetch_add(1, Ordering::Relaxed);
                }
                // Returning drops all four halves: the sink sees a lost connection, the
                // server an ended session (which rolls back what was not prepared).
            });
        }
    });
    port
}

/// Runs of each mode, each a fresh proxy, table and log.
const RUNS: u32 = 3;

async fn cut_at_random(mode: &str) {
    for run in 1..=RUNS {
        cut_once(mode, run).await;
    }
}

async fn cut_once(mode: &str, run: u32) {
    const EPOCHS: u64 = 60;
    const PER_EPOCH: u64 = 3000;
    let counts = Arc::new(Counts::default());
    let port = proxy("127.0.0.1:3306", counts.clone()).await;
    let table = unique("cut");
    let id = unique("cut");
    let config = Config::from_url(&format!(
        "mysql://root@127.0.0.1:{port}/test?table={table}&connect_timeout=2s&lock_timeout=2s{mode}"
    ))
    .unwrap();
    let log = open(&id);
    let committer = spawn_committer(&log.wal, MySqlSink::new(config)).unwrap();
    let mut want = Vec::new();
    for cp in 1..=EPOCHS {
        want.extend(epoch(&log.wal, cp, cp * PER_EPOCH..(cp + 1) * PER_EPOCH));
        tokio::time::sleep(Duration::from_millis(fastrand::u64(10..60))).await;
    }
    assert!(
        wait_committed(&log.wal, EPOCHS, 240).await,
        "all epochs committed through the cuts: {:?}",
        log.wal.health()
    );
    let h = log.wal.health();
    let report = committer.shutdown(Duration::from_secs(30)).await;
    assert!(report.clean, "{report:?}");
    let got = rows(SHARED, &table, &id, 0).await;
    assert_eq!(got.len(), want.len(), "every line, none twice");
    assert!(got == want, "every line exactly once, in order");
    let mut admin = client(SHARED).await;
    let prefix = xa::gtrid_prefix(&id, 0);
    let left: Vec<(i64, i64, i64, Vec<u8>)> = admin.query("XA RECOVER").await.unwrap();
    let ours: Vec<_> = left
        .iter()
        .filter(|(_, _, _, d)| d.starts_with(prefix.as_bytes()))
        .collect();
    assert!(ours.is_empty(), "no XA transaction left: {ours:?}");
    let cuts = counts.cuts.load(Ordering::Relaxed);
    let conns = counts.connections.load(Ordering::Relaxed);
    eprintln!(
        "cut_at_random{mode} run {run}: {EPOCHS} epochs, {} lines, {conns} connections, {cuts} cuts, {} delivery errors",
        got.len(),
        h.errors
    );
    // About half the connections are preferred's TLS probes against this server without TLS,
    // closed by the sink before their budget.
    assert!(cuts >= CUTS / 4, "the proxy cut connections: {cuts}");
    assert!(h.errors >= 3, "cuts hit deliveries: {h:?}");
}

#[tokio::test(flavor = "multi_thread")]
#[cfg_attr(
    not(servers),
    ignore = "needs WALSINK_TEST_SERVERS=1 and a local MariaDB"
)]
async fn connections_cut_at_random_in_marker_mode_land_every_line_once() {
    cut_at_random("").await;
}

#[tokio::test(flavor = "multi_thread")]
#[cfg_attr(
    not(servers),
    ignore = "needs WALSINK_TEST_SERVERS=1 and a local MariaDB"
)]
async fn connections_cut_at_random_in_xa_mode_land_every_line_once_and_leave_no_xa() {
    cut_at_random("&mode=xa").await;
}
