//! A delaying TCP proxy on loopback, in front of a PostgreSQL server: a slow link that
//! holds one statement on its way to the server, with the client killed meanwhile.
//!
//! Every connection is forwarded both ways unchanged until the first client-to-server bytes
//! that contain `pattern` (for example `PREPARE TRANSACTION`). Those bytes are held, and the
//! client's side of that connection is closed at once, as the kernel closes the socket of a
//! killed process: the client sees its connection end, the server sees nothing yet. Then,
//! with [`Hold::For`], the held bytes reach the server after the delay, followed by the end
//! of the stream (the backend runs the statement, then sees its client gone); with
//! [`Hold::Forever`], nothing more reaches the server and its side stays open while the
//! proxy lives (a link cut without either end seeing it). Only the first match is held;
//! later connections are plain. Dropping the proxy closes every connection it holds.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{oneshot, watch};
use tokio::task::JoinSet;

/// What happens to the held bytes.
#[derive(Debug, Clone, Copy)]
pub enum Hold {
    /// They reach the server after this long, then the stream ends.
    For(Duration),
    /// They never do; the server's side stays open until the proxy is dropped.
    Forever,
}

/// A running proxy; see the module documentation.
pub struct Proxy {
    port: u16,
    held: watch::Receiver<bool>,
    accept: tokio::task::JoinHandle<()>,
}

struct Rule {
    upstream: u16,
    pattern: &'static [u8],
    hold: Hold,
    armed: AtomicBool,
    held: watch::Sender<bool>,
}

impl Proxy {
    /// Starts a proxy on 127.0.0.1 (a free port) in front of 127.0.0.1:`upstream`.
    pub async fn start(upstream: u16, pattern: &'static [u8], hold: Hold) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind a proxy");
        let port = listener.local_addr().unwrap().port();
        let (tx, held) = watch::channel(false);
        let rule = Arc::new(Rule {
            upstream,
            pattern,
            hold,
            armed: AtomicBool::new(true),
            held: tx,
        });
        let accept = tokio::spawn(async move {
            let mut conns = JoinSet::new();
            while let Ok((client, _)) = listener.accept().await {
                let rule = rule.clone();
                conns.spawn(async move {
                    if let Ok(server) = TcpStream::connect(("127.0.0.1", rule.upstream)).await {
                        forward(client, server, rule).await;
                    }
                });
            }
        });
        Proxy { port, held, accept }
    }

    /// The port clients connect to.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Waits (at most `within`) until the pattern was seen and its bytes are held; returns
    /// whether they were.
    pub async fn wait_held(&self, within: Duration) -> bool {
        let mut h = self.held.clone();
        tokio::time::timeout(within, h.wait_for(|&b| b))
            .await
            .is_ok_and(|r| r.is_ok())
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        // Aborting the accept task drops its JoinSet, which aborts every connection's task.
        self.accept.abort();
    }
}

async fn forward(client: TcpStream, server: TcpStream, rule: Arc<Rule>) {
    let (mut cr, mut cw) = client.into_split();
    let (mut sr, mut sw) = server.into_split();
    let (stop, mut stopped) = oneshot::channel::<()>();
    // Server to client, until either end closes or the client is cut; gives the server's
    // read half back so that side stays open.
    let back = tokio::spawn(async move {
        let mut buf = vec![0u8; 16 << 10];
        tokio::select! {
            _ = async {
                while let Ok(n) = sr.read(&mut buf).await {
                    if n == 0 || cw.write_all(&buf[..n]).await.is_err() {
                        break;
                    }
                }
            } => {}
            _ = &mut stopped => {}
        }
        drop(cw);
        sr
    });
    let mut buf = vec![0u8; 64 << 10];
    let mut tail: Vec<u8> = Vec::new();
    loop {
        let n = match cr.read(&mut buf).await {
            Ok(0) | Err(_) => {
                let _ = sw.shutdown().await;
                return;
            }
            Ok(n) => n,
        };
        // The pattern may straddle two reads: look in the end of the last one too.
        let mut look = std::mem::take(&mut tail);
        look.extend_from_slice(&buf[..n]);
        let found = look.windows(rule.pattern.len()).any(|w| w == rule.pattern);
        if found && rule.armed.swap(false, Ordering::SeqCst) {
            let held = buf[..n].to_vec();
            // The client is killed: its socket closes now, the server's stays open.
            let _ = stop.send(());
            let mut sr = back.await.expect("the back half");
            drop(cr);
            let _ = rule.held.send(true);
            match rule.hold {
                Hold::For(d) => {
                    tokio::time::sleep(d).await;
                    let _ = sw.write_all(&held).await;
                    let _ = sw.shutdown().await;
                    // Read what the server answers (nobody listens) until it closes.
                    let mut sink = vec![0u8; 16 << 10];
                    let _ = tokio::time::timeout(Duration::from_secs(60), async {
                        while let Ok(n) = sr.read(&mut sink).await {
                            if n == 0 {
                                break;
                            }
                        }
                    })
                    .await;
                }
                Hold::Forever => {
                    // Both halves of the server's side stay here until the proxy is dropped.
                    let _keep = (sr, sw);
                    std::future::pending::<()>().await;
                }
            }
            return;
        }
        if sw.write_all(&buf[..n]).await.is_err() {
            return;
        }
        let keep = rule.pattern.len().saturating_sub(1).min(look.len());
        tail = look[look.len() - keep..].to_vec();
    }
}
