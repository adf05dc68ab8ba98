//! [`HttpSink`]: POSTs each epoch in deterministic chunks under `Idempotency-Key` headers.

use crate::chunking::{Body, Chunker};
use crate::classify::{self, Outcome};
use crate::config::Config;
use bytes::Bytes;
use reqwest::header::{HeaderMap, HeaderName, HeaderValue};
use std::collections::BTreeSet;
use std::fmt;
use std::sync::Arc;
use std::time::{Duration, SystemTime};
use tokio::task::JoinSet;
use walsink::{Epoch, EpochKey, SinkError};
use walsink_kit::Verify;
use walsink_tokio::{AsyncChunks, AsyncSink};

/// The `Idempotency-Key` header.
pub const IDEMPOTENCY_KEY: &str = "idempotency-key";
/// The header describing a chunk: `first=F; count=N; last=BOOL; max_records=R;
/// max_bytes=B; newline=reject|escape`.
pub const WALSINK_CHUNK: &str = "walsink-chunk";
/// How much of an error response's body goes into the error message.
const BODY_START: usize = 256;
/// How much of a response body is read at all (the rest is discarded as it arrives).
const BODY_READ: usize = 64 << 10;

/// The idempotency key of chunk `chunk` of epoch `key`: `SINK:SUBTASK:CHECKPOINT:CHUNK`.
/// Sink ids are `A-Z a-z 0-9 . _ -`, so the key is a valid header value and splits
/// unambiguously at its colons.
pub fn idempotency_key(key: &EpochKey, chunk: u64) -> String {
    format!("{}:{}:{}:{chunk}", key.sink_id, key.subtask, key.checkpoint)
}

/// A sink that could not be made.
#[derive(Debug)]
#[non_exhaustive]
pub enum BuildError {
    /// The environment variable named by `bearer_env` is not set or not a valid header.
    BearerEnv {
        /// The variable's name (never its value).
        var: String,
        /// Why it cannot be used.
        reason: &'static str,
    },
    /// The `ca_file` cannot be read or holds no usable certificate.
    CaFile {
        /// The file.
        path: std::path::PathBuf,
        /// What went wrong.
        reason: String,
    },
    /// The HTTP client could not be built (TLS set-up).
    Client(String),
    /// `bearer_file` cannot be read or used (the message names the file, never the token).
    Secret(String),
    /// `cert_file` / `key_file` cannot be read or do not make a client certificate (the
    /// message names the file, never the key).
    ClientCert(String),
}

impl fmt::Display for BuildError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BuildError::BearerEnv { var, reason } => {
                write!(f, "bearer_env={var}: the environment variable {reason}")
            }
            BuildError::CaFile { path, reason } => {
                write!(f, "ca_file={}: {reason}", path.display())
            }
            BuildError::Client(e) => write!(f, "cannot build the HTTP client: {e}"),
            BuildError::Secret(e) => f.write_str(e),
            BuildError::ClientCert(e) => write!(f, "client certificate: {e}"),
        }
    }
}

impl std::error::Error for BuildError {}

/// How long [`HttpSink::connect`] waits for the receiver's answer at most (connecting
/// included).
pub const CONNECT_CHECK_TIMEOUT: Duration = Duration::from_secs(5);

/// Delivers epochs to an HTTP endpoint: each epoch as POSTs of newline-delimited records,
/// cut deterministically ([`crate::chunking`]), each under
/// `Idempotency-Key: SINK:SUBTASK:CHECKPOINT:CHUNK`. An epoch counts as delivered once
/// every chunk was answered 2xx. See the crate docs for the guarantee.
pub struct HttpSink {
    client: reqwest::Client,
    shared: Arc<Shared>,
    /// Chunks of `acked.0` already answered 2xx: a retry of the same epoch after an error
    /// (no crash in between) does not send them again.
    acked: Option<(EpochKey, BTreeSet<u64>)>,
}

struct Shared {
    cfg: Config,
    /// Authorization and the other fixed headers, marked sensitive.
    headers: HeaderMap,
    shown: String,
    /// Body buffers for reuse: one per request in flight, and one being filled.
    bodies: Arc<walsink::BufferPool>,
}

impl fmt::Debug for HttpSink {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HttpSink")
            .field("config", &self.shared.cfg)
            .finish_non_exhaustive()
    }
}

impl HttpSink {
    /// A sink for `cfg`: reads the bearer token and the CA file, builds the client. Does not
    /// connect.
    pub fn new(cfg: Config) -> Result<HttpSink, BuildError> {
        let mut headers = HeaderMap::new();
        if let Some(var) = &cfg.bearer_env {
            let token = std::env::var(var).map_err(|_| BuildError::BearerEnv {
                var: var.clone(),
                reason: "is not set (or not UTF-8)",
            })?;
            let mut v =
                HeaderValue::from_str(&format!("Bearer {}", token.trim())).map_err(|_| {
                    BuildError::BearerEnv {
                        var: var.clone(),
                        reason: "holds characters a header cannot carry",
                    }
                })?;
            v.set_sensitive(true);
            headers.insert(reqwest::header::AUTHORIZATION, v);
        } else if let Some(path) = &cfg.bearer_file {
            let token = walsink_kit::secret::from_file("http", "bearer_file", path)
                .map_err(|e| BuildError::Secret(e.to_string()))?;
            let mut v = HeaderValue::from_str(&format!("Bearer {}", token.expose().trim()))
                .map_err(|_| {
                    BuildError::Secret(format!(
                        "bearer_file={}: the file holds characters a header cannot carry",
                        path.display()
                    ))
                })?;
            v.set_sensitive(true);
            headers.insert(reqwest::header::AUTHORIZATION, v);
        } else if let Some((user, pw)) = &cfg.basic {
            let mut v = basic_auth(user, pw.as_deref());
            v.set_sensitive(true);
            headers.insert(reqwest::header::AUTHORIZATION, v);
        }
        headers.insert(
            reqwest::header::CONTENT_TYPE,
            HeaderValue::from_str(&cfg.content_type)
                .map_err(|_| BuildError::Client("content_type is not a header value".into()))?,
        );
        if cfg.gzip {
            headers.insert(
                reqwest::header::CONTENT_ENCODING,
                HeaderValue::from_static("gzip"),
            );
        }
        let mut b = reqwest::Client::builder()
            .timeout(cfg.timeout)
            .connect_timeout(cfg.timeout.min(Duration::from_secs(10)))
            // A 301/302 would turn the POST into a GET: a redirect is the operator's to fix.
            .redirect(reqwest::redirect::Policy::none())
            .pool_max_idle_per_host(cfg.concurrency.max(1))
            .user_agent(concat!("walsink-http/", env!("CARGO_PKG_VERSION")));
        if let Some(path) = &cfg.ca_file {
            let ca_err = |reason: String| BuildError::CaFile {
                path: path.clone(),
                reason,
            };
            let pem = std::fs::read(path).map_err(|e| ca_err(e.to_string()))?;
            let certs = reqwest::Certificate::from_pem_bundle(&pem)
                .map_err(|e| ca_err(e.without_url().to_string()))?;
            if certs.is_empty() {
                return Err(ca_err("no PEM certificate in it".into()));
            }
            for c in certs {
                b = b.add_root_certificate(c);
            }
        }
        if cfg.cert_file.is_some() || cfg.key_file.is_some() {
            // The kit checks both files (naming the one at fault, never quoting the key);
            // reqwest takes the chain and the key as one PEM text.
            let pem = cfg
                .tls()
                .read_pem("http")
                .map_err(|e| BuildError::ClientCert(e.to_string()))?;
            let mut both = pem.cert.unwrap_or_default();
            both.push(b'\n');
            both.extend(pem.key.unwrap_or_default());
            let id = reqwest::Identity::from_pem(&both)
                .map_err(|e| BuildError::ClientCert(chain(&e)))?;
            b = b.identity(id);
        }
        b = match cfg.verify {
            Verify::Full => b,
            Verify::Ca => b.danger_accept_invalid_hostnames(true),
            Verify::None => b.danger_accept_invalid_certs(true),
        };
        let client = b.build().map_err(|e| BuildError::Client(chain(&e)))?;
        let shown = cfg.to_string();
        // One body per request in flight and one being filled; none larger than a body of
        // `max_bytes` holding one more record (a body that held one oversized record goes).
        let bodies = Arc::new(walsink::BufferPool::new(
            cfg.concurrency.max(1) + 1,
            cfg.max_bytes.saturating_mul(2),
        ));
        Ok(HttpSink {
            client,
            shared: Arc::new(Shared {
                cfg,
                headers,
                shown,
                bodies,
            }),
            acked: None,
        })
    }

    /// The configuration.
    pub fn config(&self) -> &Config {
        &self.shared.cfg
    }

    /// Checks that the receiver answers, so that a wrong address, a closed port or a TLS
    /// certificate the sink does not trust shows before the first epoch: one `HEAD` request
    /// to the endpoint with the sink's headers. Any HTTP answer, whatever its status, counts
    /// as reachable (a receiver may take only `POST`); nothing is delivered. The check waits
    /// at most [`CONNECT_CHECK_TIMEOUT`] (or `timeout`, if shorter) for the answer.
    ///
    /// # Errors
    /// A retryable [`SinkError`] when the receiver cannot be reached or does not answer
    /// within the timeout, naming the endpoint (without its password) and the reason.
    ///
    /// # Cancel safety
    /// Cancel safe: it only asks.
    pub async fn connect(&self) -> Result<(), SinkError> {
        let shared = &self.shared;
        let limit = shared.cfg.timeout.min(CONNECT_CHECK_TIMEOUT);
        let sent = self
            .client
            .head(shared.cfg.endpoint.clone())
            .headers(shared.headers.clone())
            .timeout(limit)
            .send()
            .await;
        match sent {
            Ok(_) => Ok(()),
            Err(e) => Err(SinkError::retryable(format!(
                "HEAD {}: {}",
                shared.shown,
                request_error(&e, limit)
            ))),
        }
    }

    /// Sends every chunk of `epoch` not yet acknowledged, at most `concurrency` at a time.
    async fn send_epoch(&mut self, epoch: &Epoch) -> Result<(), SinkError> {
        let key = epoch.key().clone();
        if self.acked.as_ref().is_none_or(|(k, _)| *k != key) {
            self.acked = Some((key.clone(), BTreeSet::new()));
        }
        let cfg = &self.shared.cfg;
        let mut chunker = Chunker::with_pool(cfg.chunking(), self.shared.bodies.clone());
        let mut flight = Flight {
            set: JoinSet::new(),
            limit: cfg.concurrency.max(1),
        };
        // A body closed by `push` is never the last: the record that closed it follows. The
        // body `finish` returns is.
        let mut chunks = AsyncChunks::new(epoch);
        while let Some(c) = chunks.next().await {
            let c = c?;
            for r in c.records() {
                let closed = chunker.push(&r.data).map_err(|e| {
                    SinkError::permanent(format!(
                        "record {} of checkpoint {} (sink {} subtask {}) holds a newline at byte {}: bodies to {} are newline-delimited, so it would arrive as two records. Remove newlines from records, or add newline=escape to the sink URL (records are then escaped: \\ as \\\\, newline as \\n)",
                        r.position.index,
                        key.checkpoint,
                        key.sink_id,
                        key.subtask,
                        e.offset,
                        self.shared.shown
                    ))
                })?;
                if let Some(body) = closed {
                    self.dispatch(&mut flight, &key, body, false).await?;
                }
            }
        }
        if let Some(body) = chunker.finish() {
            self.dispatch(&mut flight, &key, body, true).await?;
        }
        while let Some(done) = flight.set.join_next().await {
            self.settle(done)?;
        }
        Ok(())
    }

    async fn dispatch(
        &mut self,
        flight: &mut Flight,
        key: &EpochKey,
        body: Body,
        last: bool,
    ) -> Result<(), SinkError> {
        if self
            .acked
            .as_ref()
            .is_some_and(|(_, set)| set.contains(&body.chunk))
        {
            return Ok(());
        }
        while flight.set.len() >= flight.limit {
            let done = flight.set.join_next().await.expect("a task is in flight");
            self.settle(done)?;
        }
        let client = self.client.clone();
        let shared = self.shared.clone();
        let key = key.clone();
        flight
            .set
            .spawn(async move { send_chunk(&client, &shared, &key, body, last).await });
        Ok(())
    }

    fn settle(
        &mut self,
        done: Result<Result<u64, SinkError>, tokio::task::JoinError>,
    ) -> Result<(), SinkError> {
        let chunk =
            done.map_err(|e| SinkError::retryable(format!("a request task failed: {e}")))??;
        if let Some((_, set)) = &mut self.acked {
            set.insert(chunk);
        }
        Ok(())
    }
}

struct Flight {
    set: JoinSet<Result<u64, SinkError>>,
    limit: usize,
}

impl AsyncSink for HttpSink {
    /// # Cancel safety
    /// Dropping the future aborts the requests in flight; chunks already answered 2xx are
    /// remembered, and the receiver deduplicates any that arrive twice by their key.
    async fn deliver(&mut self, epoch: &Epoch) -> Result<(), SinkError> {
        let r = self.send_epoch(epoch).await;
        if r.is_ok() {
            self.acked = None;
        }
        r
    }
}

/// Sends one chunk, retrying up to `retries` times; returns the chunk's number once a 2xx
/// came back.
async fn send_chunk(
    client: &reqwest::Client,
    shared: &Shared,
    key: &EpochKey,
    body: Body,
    last: bool,
) -> Result<u64, SinkError> {
    let cfg = &shared.cfg;
    let ikey = idempotency_key(key, body.chunk);
    let chunk_header = format!(
        "first={}; count={}; last={last}; max_records={}; max_bytes={}; newline={}",
        body.first, body.records, cfg.max_records, cfg.max_bytes, cfg.newline
    );
    let payload = if cfg.gzip {
        gzip(&body.bytes)
    } else {
        body.bytes.clone()
    };
    let mut attempt = 0u32;
    loop {
        let req = client
            .post(cfg.endpoint.clone())
            .headers(shared.headers.clone())
            .header(HeaderName::from_static(IDEMPOTENCY_KEY), &ikey)
            .header(HeaderName::from_static(WALSINK_CHUNK), &chunk_header)
            .body(payload.clone());
        // The receiver's status, kept as the error's code.
        let mut code: Option<u16> = None;
        let (outcome, what) = match req.send().await {
            Err(e) => (
                Outcome::Retry { after: None },
                request_error(&e, cfg.timeout),
            ),
            Ok(resp) => {
                let status = resp.status();
                code = Some(status.as_u16());
                let retry_after = resp
                    .headers()
                    .get(reqwest::header::RETRY_AFTER)
                    .and_then(|v| v.to_str().ok())
                    .map(str::to_owned);
                match read_start(resp).await {
                    Err(e) => (
                        Outcome::Retry { after: None },
                        format!(
                            "HTTP {status}, then the response broke off: {}",
                            request_error(&e, cfg.timeout)
                        ),
                    ),
                    Ok(start) => (
                        classify::status(
                            status.as_u16(),
                            retry_after.as_deref(),
                            SystemTime::now(),
                        ),
                        format!(
                            "HTTP {status}{}{}",
                            retry_after.map_or(String::new(), |r| format!(" (Retry-After: {r})")),
                            if start.is_empty() {
                                String::new()
                            } else {
                                format!(": {start}")
                            }
                        ),
                    ),
                }
            }
        };
        let context = || {
            format!(
                "POST {} (Idempotency-Key {ikey}, records {}..{} of checkpoint {})",
                shared.shown,
                body.first,
                body.first + body.records,
                key.checkpoint
            )
        };
        let coded = |e: SinkError| match code {
            Some(c) => e.with_code(c.to_string()),
            None => e,
        };
        match outcome {
            Outcome::Done => {
                drop(payload);
                shared.bodies.give_back(body.bytes);
                return Ok(body.chunk);
            }
            Outcome::Permanent => {
                return Err(coded(SinkError::permanent(format!(
                    "{} was refused: {what}; a retry cannot change that: fix the receiver or the sink URL",
                    context()
                ))))
            }
            Outcome::Retry { after } => {
                if attempt >= cfg.retries {
                    return Err(coded(SinkError::retryable(format!(
                        "{} failed {} time{}: {what}",
                        context(),
                        attempt + 1,
                        if attempt == 0 { "" } else { "s" }
                    ))));
                }
                let wait = match after {
                    Some(a) => a.min(cfg.retry_after_max),
                    None => backoff(attempt),
                };
                tracing::debug!(key = %ikey, attempt, ?wait, error = %what, "retrying a chunk");
                tokio::time::sleep(wait).await;
                attempt += 1;
            }
        }
    }
}

/// 100 ms doubling per attempt, at most 5 s, with full jitter.
fn backoff(attempt: u32) -> Duration {
    let cap = Duration::from_millis(100)
        .saturating_mul(1 << attempt.min(16))
        .min(Duration::from_secs(5));
    cap.mul_f64(0.5 + fastrand::f64() * 0.5)
}

/// Reads at most [`BODY_READ`] bytes of the response (the rest is drained and dropped) and
/// returns the start of it as text. A response that breaks off is an error: the request may
/// not have been taken, so it counts as failed (the key makes a second sending harmless).
async fn read_start(mut resp: reqwest::Response) -> Result<String, reqwest::Error> {
    let mut kept = Vec::new();
    while let Some(piece) = resp.chunk().await? {
        if kept.len() < BODY_READ {
            let room = BODY_READ - kept.len();
            kept.extend_from_slice(&piece[..piece.len().min(room)]);
        }
    }
    Ok(if kept.is_empty() {
        String::new()
    } else {
        classify::body_start(&kept, BODY_START)
    })
}

/// A request error in words, without the URL (it is named by the caller without secrets).
fn request_error(e: &reqwest::Error, timeout: Duration) -> String {
    if e.is_timeout() && e.is_connect() {
        return format!("cannot connect: no connection within {timeout:?} at most");
    }
    if e.is_timeout() {
        return format!("no complete answer within the timeout of {timeout:?}");
    }
    if let Some(f) = walsink_kit::tls::failure(e) {
        return format!("cannot connect: TLS: {f} ({})", chain(e));
    }
    let kind = if e.is_connect() {
        "cannot connect"
    } else if e.is_body() || e.is_decode() {
        "the body broke off"
    } else {
        "request failed"
    };
    format!("{kind}: {}", chain(e))
}

/// An error and its sources, `: `-separated, without URLs.
fn chain(e: &reqwest::Error) -> String {
    let mut out = String::new();
    let mut src: Option<&(dyn std::error::Error + 'static)> = std::error::Error::source(e);
    while let Some(s) = src {
        let t = s.to_string();
        if !out.contains(&t) {
            if !out.is_empty() {
                out.push_str(": ");
            }
            out.push_str(&t);
        }
        src = s.source();
    }
    if out.is_empty() {
        out = e.to_string();
    }
    out
}

fn gzip(body: &[u8]) -> Bytes {
    use std::io::Write;
    // flate2's encoder writes mtime 0 and no name, so the same body always compresses to
    // the same bytes with the same build.
    let mut enc = flate2::write::GzEncoder::new(
        Vec::with_capacity(body.len() / 3),
        flate2::Compression::fast(),
    );
    enc.write_all(body).expect("writes to a Vec do not fail");
    Bytes::from(enc.finish().expect("writes to a Vec do not fail"))
}

fn basic_auth(user: &str, pw: Option<&str>) -> HeaderValue {
    let raw = format!("{user}:{}", pw.unwrap_or(""));
    let v = format!("Basic {}", base64(raw.as_bytes()));
    HeaderValue::from_str(&v).expect("base64 is a valid header value")
}

fn base64(b: &[u8]) -> String {
    const A: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(b.len().div_ceil(3) * 4);
    for c in b.chunks(3) {
        let n = (u32::from(c[0]) << 16)
            | (u32::from(*c.get(1).unwrap_or(&0)) << 8)
            | u32::from(*c.get(2).unwrap_or(&0));
        for i in 0..4 {
            if i <= c.len() {
                out.push(A[(n >> (18 - 6 * i) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_and_basic_auth() {
        let k = EpochKey {
            sink_id: "orders".into(),
            subtask: 3,
            checkpoint: 42,
        };
        assert_eq!(idempotency_key(&k, 7), "orders:3:42:7");
        assert_eq!(
            base64(b"Aladdin:open sesame"),
            "QWxhZGRpbjpvcGVuIHNlc2FtZQ=="
        );
        assert_eq!(base64(b"ab"), "YWI=");
        assert_eq!(base64(b""), "");
    }

    #[test]
    fn gzip_is_deterministic() {
        let body = b"a\nb\nccc\n".repeat(100);
        assert_eq!(gzip(&body), gzip(&body));
        let z = gzip(&body);
        let mut d = flate2::read::GzDecoder::new(&z[..]);
        let mut out = Vec::new();
        std::io::Read::read_to_end(&mut d, &mut out).unwrap();
        assert_eq!(out, body);
    }

    #[test]
    fn backoff_grows_and_is_capped() {
        assert!(backoff(0) <= Duration::from_millis(100));
        assert!(backoff(0) >= Duration::from_millis(50));
        assert!(backoff(30) <= Duration::from_secs(5));
    }
}
