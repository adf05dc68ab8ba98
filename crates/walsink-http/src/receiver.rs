//! A small HTTP receiver for tests and benchmarks (feature `receiver`): it deduplicates
//! requests by `Idempotency-Key` the way a receiver must for effectively-once delivery,
//! and injects faults (error statuses, `Retry-After`, slow answers, connections closed
//! before or in the middle of an answer).
//!
//! It listens on a loopback port, over plain HTTP or TLS, on the tokio runtime it is started
//! from. In [`Mode::Keep`] it keeps the first request of each key, answers 2xx to a repeat
//! with the same body, and 422 to a repeat with another body (recorded as a conflict, which
//! would mean the sender's chunking is not deterministic). In [`Mode::Null`] it reads and
//! drops every body (the benchmark's null server).

use crate::chunking::{split, Newline};
use bytes::Bytes;
use http_body_util::{combinators::BoxBody, BodyExt, Full};
use hyper::body::{Body, Frame, Incoming};
use hyper::{Request, Response, StatusCode};
use parking_lot::Mutex;
use std::collections::{HashMap, VecDeque};
use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::sync::Notify;

/// What the receiver does with bodies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Keep the first request of each key, deduplicate the rest.
    Keep,
    /// Read every body and drop it; answer 200.
    Null,
}

/// A fault injected into one request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Fault {
    /// No fault: a place holder in a script, so a later request gets the next fault.
    Pass,
    /// Answer this status without keeping the request.
    Status(u16),
    /// Answer this status with this `Retry-After` value, without keeping the request.
    RetryAfter(u16, String),
    /// Keep the request, then answer 200 only after this delay (past a client's timeout).
    Slow(Duration),
    /// Close the connection without an answer; keep the request first if `keep`.
    CloseBeforeAnswer {
        /// Whether the request was taken before the connection died.
        keep: bool,
    },
    /// Keep the request, send a 200 status and part of the body, then close the connection.
    CloseMidAnswer,
}

/// One request the receiver kept.
#[derive(Debug, Clone)]
pub struct Kept {
    /// The `Idempotency-Key`.
    pub key: String,
    /// The key's parts.
    pub sink: String,
    /// The key's parts.
    pub subtask: u32,
    /// The key's parts.
    pub checkpoint: u64,
    /// The key's parts.
    pub chunk: u64,
    /// The records of the (decompressed, unescaped) body.
    pub records: Vec<Vec<u8>>,
    /// The decompressed body.
    pub body: Bytes,
}

/// What the receiver saw.
#[derive(Debug, Default)]
pub struct Seen {
    /// Kept requests, in the order they were first received.
    pub kept: Vec<Kept>,
    by_key: HashMap<String, usize>,
    /// Requests received (faulted and duplicates included).
    pub requests: u64,
    /// Repeats of a kept key with the same body.
    pub duplicates: u64,
    /// Keys repeated with another body (should never happen).
    pub conflicts: Vec<String>,
    /// Faults injected.
    pub faults: u64,
    /// Body bytes received (after decompression).
    pub bytes: u64,
}

struct Chaos {
    rng: fastrand::Rng,
    probability: f64,
    slow: Duration,
}

struct State {
    mode: Mode,
    script: Mutex<VecDeque<Fault>>,
    chaos: Mutex<Option<Chaos>>,
    auth: Mutex<Option<String>>,
    seen: Mutex<Seen>,
    connections: AtomicU64,
}

/// A running receiver; stops accepting when dropped.
pub struct Receiver {
    addr: SocketAddr,
    tls: bool,
    state: Arc<State>,
    _stop: tokio::sync::oneshot::Sender<()>,
}

/// A certificate and key (DER) for a TLS receiver.
pub struct Tls {
    /// The certificate chain, leaf first.
    pub certs: Vec<Vec<u8>>,
    /// The private key, PKCS#8.
    pub key: Vec<u8>,
}

impl Tls {
    /// Reads a certificate chain and its PKCS#8 key from PEM files (as the kit's testkit
    /// writes them).
    pub fn from_pem_files(cert: &std::path::Path, key: &std::path::Path) -> std::io::Result<Tls> {
        use rustls::pki_types::pem::PemObject;
        let bad = |e: rustls::pki_types::pem::Error| std::io::Error::other(e.to_string());
        let certs = rustls::pki_types::CertificateDer::pem_file_iter(cert)
            .map_err(bad)?
            .map(|c| c.map(|c| c.to_vec()).map_err(bad))
            .collect::<std::io::Result<Vec<_>>>()?;
        let key = rustls::pki_types::PrivatePkcs8KeyDer::from_pem_file(key)
            .map_err(bad)?
            .secret_pkcs8_der()
            .to_vec();
        Ok(Tls { certs, key })
    }
}

impl Receiver {
    /// Starts a plain HTTP receiver on `127.0.0.1` (a free port) on the current runtime.
    ///
    /// # Cancel safety
    /// If dropped, the listener is closed and nothing is left running.
    pub async fn start(mode: Mode) -> std::io::Result<Receiver> {
        Self::start_with(mode, None).await
    }

    /// Starts a receiver, over TLS when `tls` is given.
    ///
    /// # Cancel safety
    /// If dropped, the listener is closed and nothing is left running.
    pub async fn start_with(mode: Mode, tls: Option<Tls>) -> std::io::Result<Receiver> {
        Self::start_inner(mode, tls, None).await
    }

    /// Starts a receiver over TLS that demands a client certificate signed by one of
    /// `client_cas` (DER) and ends the handshake of a client without one.
    ///
    /// # Cancel safety
    /// If dropped, the listener is closed and nothing is left running.
    pub async fn start_verifying_clients(
        mode: Mode,
        tls: Tls,
        client_cas: Vec<Vec<u8>>,
    ) -> std::io::Result<Receiver> {
        Self::start_inner(mode, Some(tls), Some(client_cas)).await
    }

    async fn start_inner(
        mode: Mode,
        tls: Option<Tls>,
        client_cas: Option<Vec<Vec<u8>>>,
    ) -> std::io::Result<Receiver> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let acceptor = match tls {
            None => None,
            Some(t) => {
                let provider = Arc::new(rustls::crypto::ring::default_provider());
                let certs = t.certs.into_iter().map(Into::into).collect();
                let key = rustls::pki_types::PrivatePkcs8KeyDer::from(t.key).into();
                let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
                    .with_safe_default_protocol_versions()
                    .map_err(std::io::Error::other)?;
                let builder = match client_cas {
                    None => builder.with_no_client_auth(),
                    Some(cas) => {
                        let mut roots = rustls::RootCertStore::empty();
                        for c in cas {
                            roots.add(c.into()).map_err(std::io::Error::other)?;
                        }
                        let v = rustls::server::WebPkiClientVerifier::builder_with_provider(
                            Arc::new(roots),
                            provider,
                        )
                        .build()
                        .map_err(std::io::Error::other)?;
                        builder.with_client_cert_verifier(v)
                    }
                };
                let cfg = builder
                    .with_single_cert(certs, key)
                    .map_err(std::io::Error::other)?;
                Some(tokio_rustls::TlsAcceptor::from(Arc::new(cfg)))
            }
        };
        let state = Arc::new(State {
            mode,
            script: Mutex::new(VecDeque::new()),
            chaos: Mutex::new(None),
            auth: Mutex::new(None),
            seen: Mutex::new(Seen::default()),
            connections: AtomicU64::new(0),
        });
        let (stop, mut stopped) = tokio::sync::oneshot::channel::<()>();
        let st = state.clone();
        let tls = acceptor.is_some();
        tokio::spawn(async move {
            loop {
                let (tcp, _) = tokio::select! {
                    r = listener.accept() => match r {
                        Ok(c) => c,
                        Err(_) => continue,
                    },
                    _ = &mut stopped => return,
                };
                let _ = tcp.set_nodelay(true);
                st.connections.fetch_add(1, Ordering::Relaxed);
                let st = st.clone();
                let acceptor = acceptor.clone();
                tokio::spawn(async move {
                    match acceptor {
                        None => serve(tcp, st).await,
                        Some(a) => {
                            if let Ok(s) = a.accept(tcp).await {
                                serve(s, st).await
                            }
                        }
                    }
                });
            }
        });
        Ok(Receiver {
            addr,
            tls,
            state,
            _stop: stop,
        })
    }

    /// The address it listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://127.0.0.1:PORT/PATH` (or `https://localhost:PORT/PATH` over TLS).
    pub fn url(&self, path: &str) -> String {
        let path = path.trim_start_matches('/');
        if self.tls {
            format!("https://localhost:{}/{path}", self.addr.port())
        } else {
            format!("http://{}/{path}", self.addr)
        }
    }

    /// Injects `faults` into the next requests, one each, in order.
    pub fn inject(&self, faults: impl IntoIterator<Item = Fault>) {
        self.state.script.lock().extend(faults);
    }

    /// From now on, injects a random fault (any kind; slow answers take `slow`) into each
    /// request with `probability`, from a seeded generator.
    pub fn chaos(&self, seed: u64, probability: f64, slow: Duration) {
        *self.state.chaos.lock() = Some(Chaos {
            rng: fastrand::Rng::with_seed(seed),
            probability,
            slow,
        });
    }

    /// Stops injecting random faults.
    pub fn calm(&self) {
        *self.state.chaos.lock() = None;
    }

    /// Requires this exact `Authorization` header (401 otherwise).
    pub fn require_auth(&self, value: &str) {
        *self.state.auth.lock() = Some(value.to_string());
    }

    /// Runs `f` on what the receiver saw.
    pub fn seen<T>(&self, f: impl FnOnce(&Seen) -> T) -> T {
        f(&self.state.seen.lock())
    }

    /// Connections accepted so far.
    pub fn connections(&self) -> u64 {
        self.state.connections.load(Ordering::Relaxed)
    }

    /// The records kept for `sink` and `subtask`, deduplicated by key, in key order
    /// (checkpoint, then chunk).
    pub fn records(&self, sink: &str, subtask: u32) -> Vec<Vec<u8>> {
        let seen = self.state.seen.lock();
        let mut mine: Vec<&Kept> = seen
            .kept
            .iter()
            .filter(|k| k.sink == sink && k.subtask == subtask)
            .collect();
        mine.sort_by_key(|k| (k.checkpoint, k.chunk));
        mine.into_iter().flat_map(|k| k.records.clone()).collect()
    }

    /// The keys kept for `sink` and `subtask` as `(checkpoint, chunk)`, in the order they
    /// were first received.
    pub fn arrival(&self, sink: &str, subtask: u32) -> Vec<(u64, u64)> {
        self.state
            .seen
            .lock()
            .kept
            .iter()
            .filter(|k| k.sink == sink && k.subtask == subtask)
            .map(|k| (k.checkpoint, k.chunk))
            .collect()
    }
}

async fn serve<S>(io: S, st: Arc<State>)
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let kill = Arc::new(Notify::new());
    let k = kill.clone();
    let svc = hyper::service::service_fn(move |req| handle(req, st.clone(), k.clone()));
    let conn = hyper::server::conn::http1::Builder::new()
        .serve_connection(hyper_util::rt::TokioIo::new(io), svc);
    tokio::select! {
        _ = conn => {}
        // Dropping the connection closes the socket, whatever was (not) answered.
        _ = kill.notified() => {}
    }
}

type Out = Response<BoxBody<Bytes, Infallible>>;

fn answer(status: u16, text: &str) -> Out {
    let mut r = Response::new(Full::new(Bytes::from(text.to_string())).boxed());
    *r.status_mut() = StatusCode::from_u16(status).expect("a valid status");
    r
}

async fn handle(
    req: Request<Incoming>,
    st: Arc<State>,
    kill: Arc<Notify>,
) -> Result<Out, Infallible> {
    // The sink's start-up check (`HttpSink::connect`): answered, not counted, no fault.
    if req.method() == hyper::Method::HEAD {
        return Ok(answer(200, ""));
    }
    let header = |name: &str| {
        req.headers()
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
    };
    let (key, gz, chunk_hdr, auth) = (
        header("idempotency-key"),
        header("content-encoding").is_some_and(|v| v == "gzip"),
        header("walsink-chunk").unwrap_or_default(),
        header("authorization"),
    );
    let raw = match req.into_body().collect().await {
        Ok(b) => b.to_bytes(),
        Err(_) => return Ok(answer(400, "body broke off")),
    };
    let body = if gz {
        let mut out = Vec::new();
        let mut d = flate2::read::GzDecoder::new(&raw[..]);
        if std::io::Read::read_to_end(&mut d, &mut out).is_err() {
            return Ok(answer(400, "bad gzip"));
        }
        Bytes::from(out)
    } else {
        raw
    };
    {
        let mut seen = st.seen.lock();
        seen.requests += 1;
        seen.bytes += body.len() as u64;
    }
    if st.mode == Mode::Null {
        return Ok(answer(200, ""));
    }
    if let Some(want) = st.auth.lock().clone() {
        if auth.as_deref() != Some(want.as_str()) {
            return Ok(answer(401, "missing or wrong credentials"));
        }
    }
    let Some(key) = key else {
        return Ok(answer(400, "no Idempotency-Key header"));
    };
    let Some(kept) = parse_key(&key, &chunk_hdr, body) else {
        return Ok(answer(
            400,
            "an Idempotency-Key is SINK:SUBTASK:CHECKPOINT:CHUNK",
        ));
    };
    let fault = next_fault(&st);
    match &fault {
        Some(Fault::Status(s)) => return Ok(answer(*s, "injected failure")),
        Some(Fault::RetryAfter(s, after)) => {
            let mut r = answer(*s, "slow down");
            r.headers_mut()
                .insert("retry-after", after.parse().expect("a header value"));
            return Ok(r);
        }
        Some(Fault::CloseBeforeAnswer { keep: false }) => return Ok(die(&kill).await),
        _ => {}
    }
    {
        let mut seen = st.seen.lock();
        match seen.by_key.get(&kept.key).copied() {
            Some(i) if seen.kept[i].body == kept.body => seen.duplicates += 1,
            Some(_) => {
                seen.conflicts.push(kept.key.clone());
                return Ok(answer(
                    422,
                    "this Idempotency-Key was used before with another body",
                ));
            }
            None => {
                let i = seen.kept.len();
                seen.by_key.insert(kept.key.clone(), i);
                seen.kept.push(kept);
            }
        }
    }
    Ok(match fault {
        Some(Fault::Slow(d)) => {
            tokio::time::sleep(d).await;
            answer(200, "ok (late)")
        }
        Some(Fault::CloseBeforeAnswer { keep: true }) => die(&kill).await,
        Some(Fault::CloseMidAnswer) => Response::new(
            Cut {
                first: Some(Bytes::from_static(b"{\"status\":\"acc")),
                sleep: Box::pin(tokio::time::sleep(Duration::from_millis(20))),
                kill,
            }
            .boxed(),
        ),
        _ => answer(200, "ok"),
    })
}

/// Closes the connection and never answers.
async fn die(kill: &Notify) -> Out {
    kill.notify_one();
    std::future::pending().await
}

fn next_fault(st: &State) -> Option<Fault> {
    if let Some(f) = st.script.lock().pop_front() {
        if f == Fault::Pass {
            return None;
        }
        st.seen.lock().faults += 1;
        return Some(f);
    }
    let mut chaos = st.chaos.lock();
    let c = chaos.as_mut()?;
    if c.rng.f64() >= c.probability {
        return None;
    }
    let f = match c.rng.u32(0..7) {
        0 => Fault::Status(503),
        1 => Fault::Status(500),
        2 => Fault::RetryAfter(429, "0".into()),
        3 => Fault::Slow(c.slow),
        4 => Fault::CloseBeforeAnswer { keep: false },
        5 => Fault::CloseBeforeAnswer { keep: true },
        _ => Fault::CloseMidAnswer,
    };
    st.seen.lock().faults += 1;
    Some(f)
}

fn parse_key(key: &str, chunk_hdr: &str, body: Bytes) -> Option<Kept> {
    let mut parts = key.rsplitn(4, ':');
    let chunk = parts.next()?.parse().ok()?;
    let checkpoint = parts.next()?.parse().ok()?;
    let subtask = parts.next()?.parse().ok()?;
    let sink = parts.next()?.to_string();
    let newline = if chunk_hdr.split(';').any(|p| p.trim() == "newline=escape") {
        Newline::Escape
    } else {
        Newline::Reject
    };
    Some(Kept {
        key: key.to_string(),
        sink,
        subtask,
        checkpoint,
        chunk,
        records: split(&body, newline),
        body,
    })
}

/// A response body that sends its first bytes, then closes the connection.
struct Cut {
    first: Option<Bytes>,
    sleep: Pin<Box<tokio::time::Sleep>>,
    kill: Arc<Notify>,
}

impl Body for Cut {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        if let Some(b) = self.first.take() {
            return Poll::Ready(Some(Ok(Frame::data(b))));
        }
        if self.sleep.as_mut().poll(cx).is_ready() {
            self.kill.notify_one();
        }
        Poll::Pending
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        hyper::body::SizeHint::with_exact(1000)
    }
}
