//! What a log shows to monitoring: the Prometheus text of `pipe --metrics-addr` (served at
//! `/metrics` while the pipe runs) and of `walsink status` (read from a running or stopped
//! log's files).
//!
//! Every figure comes from the library: a running pipe renders [`WalSink::health`] at each
//! scrape, so the endpoint can never disagree with `health()`; `status` renders what
//! `walsink::verify` reads back (the figures `inspect` shows). The names and units are listed
//! in `docs/metrics.md`.

use crate::outcome::CliResult;
use std::collections::VecDeque;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use walsink::{Health, WalSink, COMMIT_DURATION_BOUNDS};

/// The labels every series of one log carries.
#[derive(Clone, Debug)]
pub struct Labels {
    /// The sink id.
    pub sink: String,
    /// The subtask (shard).
    pub shard: u32,
}

impl Labels {
    fn render(&self, extra: Option<(&str, &str)>) -> String {
        let mut s = format!("sink=\"{}\",shard=\"{}\"", escape(&self.sink), self.shard);
        if let Some((k, v)) = extra {
            let _ = write!(s, ",{k}=\"{}\"", escape(v));
        }
        s
    }
}

/// A label value as the text format wants it: backslash, double quote and line feed escaped.
fn escape(v: &str) -> String {
    let mut out = String::with_capacity(v.len());
    for c in v.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
    out
}

/// A number as the text format wants it (`+Inf` for infinity).
fn num(v: f64) -> String {
    if v.is_infinite() {
        if v > 0.0 { "+Inf" } else { "-Inf" }.to_string()
    } else {
        format!("{v}")
    }
}

/// Prometheus text, series by series.
struct Text<'a> {
    out: String,
    labels: &'a Labels,
}

impl Text<'_> {
    fn family(&mut self, name: &str, kind: &str, help: &str) {
        let _ = writeln!(self.out, "# HELP {name} {help}");
        let _ = writeln!(self.out, "# TYPE {name} {kind}");
    }

    fn sample(&mut self, name: &str, extra: Option<(&str, &str)>, v: f64) {
        let _ = writeln!(
            self.out,
            "{name}{{{}}} {}",
            self.labels.render(extra),
            num(v)
        );
    }

    fn one(&mut self, name: &str, kind: &str, help: &str, v: f64) {
        self.family(name, kind, help);
        self.sample(name, None, v);
    }
}

/// The figures of one log at one moment: what both the endpoint and `status` show.
#[derive(Debug, Clone, Default)]
pub struct Gauges {
    /// Sealed epochs not yet committed.
    pub backlog_epochs: u64,
    /// Records in them.
    pub backlog_records: u64,
    /// Payload bytes in them.
    pub backlog_bytes: u64,
    /// Age of the oldest of them.
    pub oldest_pending_age: Option<Duration>,
    /// The highest committed checkpoint id.
    pub committed: Option<u64>,
    /// Segment files.
    pub segments: u64,
    /// Free bytes of the file system holding the log, if it could be asked.
    pub disk_free: Option<u64>,
    /// The backlog budget (`--max-backlog-bytes`), if one is set.
    pub budget: Option<u64>,
    /// Estimated time until the budget or the disk is full at the recent growth rate.
    pub full_in: Option<f64>,
}

impl Gauges {
    fn render(&self, t: &mut Text<'_>) {
        t.one(
            "walsink_backlog_epochs",
            "gauge",
            "Sealed epochs not yet committed.",
            self.backlog_epochs as f64,
        );
        t.one(
            "walsink_backlog_records",
            "gauge",
            "Records in sealed epochs not yet committed.",
            self.backlog_records as f64,
        );
        t.one(
            "walsink_backlog_bytes",
            "gauge",
            "Payload bytes in sealed epochs not yet committed.",
            self.backlog_bytes as f64,
        );
        t.one(
            "walsink_oldest_pending_epoch_age_seconds",
            "gauge",
            "Age of the oldest sealed epoch not yet committed, from its checkpoint; 0 without one.",
            self.oldest_pending_age.map_or(0.0, |d| d.as_secs_f64()),
        );
        if let Some(c) = self.committed {
            t.one(
                "walsink_committed_checkpoint",
                "gauge",
                "The highest committed checkpoint id.",
                c as f64,
            );
        }
        t.one(
            "walsink_segments",
            "gauge",
            "Segment files in the log.",
            self.segments as f64,
        );
        if let Some(free) = self.disk_free {
            t.one(
                "walsink_disk_free_bytes",
                "gauge",
                "Bytes free for unprivileged users on the file system holding the log.",
                free as f64,
            );
        }
        if let Some(b) = self.budget {
            t.one(
                "walsink_backlog_budget_bytes",
                "gauge",
                "The backlog budget (--max-backlog-bytes).",
                b as f64,
            );
        }
        if let Some(s) = self.full_in {
            t.one(
                "walsink_budget_full_in_seconds",
                "gauge",
                "Estimated seconds until the backlog budget or the disk is full, at the growth rate of the last minute; +Inf while the backlog does not grow.",
                s,
            );
        }
    }
}

/// The counters only a running process has, from its `health()`.
fn render_counters(t: &mut Text<'_>, h: &Health) {
    t.one(
        "walsink_delivered_epochs_total",
        "counter",
        "Epochs delivered by this process.",
        h.delivered_epochs as f64,
    );
    t.one(
        "walsink_delivered_records_total",
        "counter",
        "Records delivered by this process.",
        h.delivered_records as f64,
    );
    t.one(
        "walsink_delivered_bytes_total",
        "counter",
        "Payload bytes delivered by this process.",
        h.delivered_bytes as f64,
    );
    t.family(
        "walsink_retries_total",
        "counter",
        "Failed delivery or commit attempts, each retried, by class.",
    );
    let c = h.error_counts;
    for (class, v) in [
        ("retryable", c.retryable),
        ("permanent", c.permanent),
        ("rejected", c.rejected),
        ("log", c.log),
    ] {
        t.sample("walsink_retries_total", Some(("class", class)), v as f64);
    }
    t.one(
        "walsink_dead_letters_total",
        "counter",
        "Records the target refused for good that went to the dead-letter log.",
        h.dead_letters as f64,
    );
    t.one(
        "walsink_corruptions_total",
        "counter",
        "Damage of durable data met by recovery or by a read of a sealed epoch.",
        h.corruptions as f64,
    );
    t.one(
        "walsink_append_blocked_seconds_total",
        "counter",
        "Wall time appends waited for the backlog budget.",
        h.append_blocked.as_secs_f64(),
    );
    t.one(
        "walsink_poisoned",
        "gauge",
        "1 after a failed sync (the log must be reopened), else 0.",
        f64::from(u8::from(h.poisoned)),
    );
    let name = "walsink_commit_duration_seconds";
    t.family(
        name,
        "histogram",
        "Time from an epoch's checkpoint completing to its commit mark.",
    );
    let hist = &h.commit_durations;
    let cumulative = hist.cumulative();
    for (i, n) in cumulative.iter().enumerate() {
        let le = COMMIT_DURATION_BOUNDS
            .get(i)
            .map_or("+Inf".to_string(), |b| num(b.as_secs_f64()));
        t.sample(&format!("{name}_bucket"), Some(("le", &le)), *n as f64);
    }
    t.sample(&format!("{name}_sum"), None, hist.sum.as_secs_f64());
    t.sample(&format!("{name}_count"), None, hist.count as f64);
}

/// Bytes free on the file system holding `dir`, for an unprivileged user.
pub fn disk_free(dir: &Path) -> Option<u64> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(dir.as_os_str().as_bytes()).ok()?;
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: `c` is a NUL-terminated path and `st` a statvfs the call fills in.
    if unsafe { libc::statvfs(c.as_ptr(), &mut st) } != 0 {
        return None;
    }
    Some((st.f_bavail as u64).saturating_mul(st.f_frsize as u64))
}

/// How fast the space the budget counts grows: samples of the last minute.
#[derive(Default)]
struct Growth {
    samples: VecDeque<(Instant, u64)>,
}

impl Growth {
    const WINDOW: Duration = Duration::from_secs(60);

    fn sample(&mut self, now: Instant, used: u64) {
        if self
            .samples
            .back()
            .is_some_and(|(t, _)| now.duration_since(*t) < Duration::from_secs(1))
        {
            return;
        }
        self.samples.push_back((now, used));
        while self
            .samples
            .front()
            .is_some_and(|(t, _)| now.duration_since(*t) > Self::WINDOW)
        {
            self.samples.pop_front();
        }
    }

    /// Bytes per second over the window, once it spans a second or more.
    fn rate(&self) -> Option<f64> {
        let (t0, u0) = *self.samples.front()?;
        let (t1, u1) = *self.samples.back()?;
        let dt = t1.duration_since(t0).as_secs_f64();
        (dt >= 1.0).then(|| (u1 as f64 - u0 as f64) / dt)
    }

    /// Seconds until `room` bytes are used up at the current rate (+Inf when not growing).
    fn full_in(&self, room: u64) -> Option<f64> {
        let r = self.rate()?;
        Some(if r > 0.0 {
            room as f64 / r
        } else {
            f64::INFINITY
        })
    }
}

/// The live figures of a running log.
struct Live {
    wal: Arc<WalSink>,
    labels: Labels,
    dir: PathBuf,
    budget: Option<u64>,
    growth: Growth,
}

impl Live {
    fn render(&mut self) -> String {
        let h = self.wal.health();
        let used = h.backlog_bytes + h.open_bytes;
        self.growth.sample(Instant::now(), used);
        let disk_free = disk_free(&self.dir);
        let room = [self.budget.map(|b| b.saturating_sub(used)), disk_free]
            .into_iter()
            .flatten()
            .min();
        let g = Gauges {
            backlog_epochs: h.backlog_epochs,
            backlog_records: h.backlog_records,
            backlog_bytes: h.backlog_bytes,
            oldest_pending_age: h.oldest_pending_age,
            committed: h.committed,
            segments: h.segments,
            disk_free,
            budget: self.budget,
            full_in: room.and_then(|r| self.growth.full_in(r)),
        };
        let mut t = Text {
            out: String::new(),
            labels: &self.labels,
        };
        g.render(&mut t);
        render_counters(&mut t, &h);
        t.out
    }
}

/// The `/metrics` endpoint of a running pipe; stops when dropped.
pub struct Endpoint {
    stop: Arc<AtomicBool>,
    server: Arc<tiny_http::Server>,
    thread: Option<std::thread::JoinHandle<()>>,
    /// The address it listens on (the port chosen when `:0` was asked for).
    pub addr: String,
}

/// A listening socket for `--metrics-addr`, bound before the log is opened so that a taken
/// port fails the command before it touches anything.
pub struct Bound {
    server: tiny_http::Server,
    addr: String,
}

impl Bound {
    /// Listens on `addr` (HOST:PORT).
    ///
    /// # Errors
    /// A message naming `--metrics-addr` when the address does not parse or cannot be
    /// listened on (the port is taken, the host is not this machine's).
    pub fn bind(addr: &str) -> CliResult<Bound> {
        let sock: std::net::SocketAddr = std::net::ToSocketAddrs::to_socket_addrs(addr)
            .map_err(|e| format!("--metrics-addr {addr:?}: not a HOST:PORT address ({e})"))?
            .next()
            .ok_or_else(|| format!("--metrics-addr {addr:?}: the host has no address"))?;
        let server = tiny_http::Server::http(sock)
            .map_err(|e| format!("--metrics-addr {addr}: cannot listen there: {e}"))?;
        let addr = server
            .server_addr()
            .to_ip()
            .map_or_else(|| addr.to_string(), |a| a.to_string());
        Ok(Bound { server, addr })
    }

    /// Serves the figures of `wal` (labelled by `labels`; `dir` is the log directory, whose
    /// file system's free space is shown; `budget` is `--max-backlog-bytes`) at `/metrics` on a
    /// thread of its own, until the returned endpoint is dropped.
    ///
    /// # Errors
    /// When the thread cannot be started.
    pub fn serve(
        self,
        wal: Arc<WalSink>,
        labels: Labels,
        dir: &Path,
        budget: Option<u64>,
    ) -> CliResult<Endpoint> {
        let server = Arc::new(self.server);
        let stop = Arc::new(AtomicBool::new(false));
        let mut live = Live {
            wal,
            labels,
            dir: dir.to_path_buf(),
            budget,
            growth: Growth::default(),
        };
        let (s, st) = (server.clone(), stop.clone());
        let thread = std::thread::Builder::new()
            .name("walsink-metrics".into())
            .spawn(move || serve(&s, &st, &mut live))
            .map_err(|e| format!("--metrics-addr {}: cannot start its thread: {e}", self.addr))?;
        Ok(Endpoint {
            stop,
            server,
            thread: Some(thread),
            addr: self.addr,
        })
    }
}

impl Drop for Endpoint {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        self.server.unblock();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn serve(server: &tiny_http::Server, stop: &AtomicBool, live: &mut Live) {
    while !stop.load(Ordering::Acquire) {
        // The timeout doubles as the growth estimate's clock between scrapes.
        let req = match server.recv_timeout(Duration::from_secs(1)) {
            Ok(Some(r)) => r,
            Ok(None) => {
                let h = live.wal.health();
                live.growth
                    .sample(Instant::now(), h.backlog_bytes + h.open_bytes);
                continue;
            }
            Err(_) => break,
        };
        let path = req.url().split('?').next().unwrap_or("");
        let resp = match (req.method(), path) {
            (tiny_http::Method::Get, "/metrics") => {
                let body = live.render();
                tiny_http::Response::from_string(body).with_header(
                    tiny_http::Header::from_bytes(
                        "Content-Type",
                        "text/plain; version=0.0.4; charset=utf-8",
                    )
                    .expect("a valid header"),
                )
            }
            (tiny_http::Method::Get, _) => {
                tiny_http::Response::from_string("not found: the figures are at /metrics\n")
                    .with_status_code(404)
            }
            _ => tiny_http::Response::from_string("only GET is served\n").with_status_code(405),
        };
        let _ = req.respond(resp);
    }
}

/// The figures of a log read from its files (a running log too): `walsink status`.
pub fn status(dir: &Path, json: bool) -> CliResult<std::process::ExitCode> {
    let r = walsink::verify(&crate::tools::storage(dir)?)?;
    let Some((sink, shard)) = r.identity.clone() else {
        return Err(format!(
            "{}: the identity file is missing or damaged; `walsink verify {}` says more",
            dir.display(),
            dir.display()
        )
        .into());
    };
    let now = crate::tools::now_ms();
    let backlog: Vec<_> = r
        .checkpoints
        .iter()
        .filter(|c| !c.committed && !c.voided)
        .collect();
    let g = Gauges {
        backlog_epochs: backlog.len() as u64,
        backlog_records: backlog.iter().map(|c| c.records).sum(),
        backlog_bytes: backlog.iter().map(|c| c.bytes).sum(),
        oldest_pending_age: backlog
            .first()
            .map(|c| Duration::from_millis(now.saturating_sub(c.timestamp_ms))),
        committed: r.committed,
        segments: r.segments.len() as u64,
        disk_free: disk_free(dir),
        budget: None,
        full_in: None,
    };
    let labels = Labels { sink, shard };
    if json {
        let v = serde_json::json!({
            "sink": labels.sink,
            "shard": labels.shard,
            "walsink_backlog_epochs": g.backlog_epochs,
            "walsink_backlog_records": g.backlog_records,
            "walsink_backlog_bytes": g.backlog_bytes,
            "walsink_oldest_pending_epoch_age_seconds":
                g.oldest_pending_age.map_or(0.0, |d| d.as_secs_f64()),
            "walsink_committed_checkpoint": g.committed,
            "walsink_segments": g.segments,
            "walsink_disk_free_bytes": g.disk_free,
            "problems": r.problems.len(),
        });
        outln!("{}", serde_json::to_string_pretty(&v)?);
    } else {
        let mut t = Text {
            out: String::new(),
            labels: &labels,
        };
        g.render(&mut t);
        outln!("{}", t.out.trim_end());
    }
    Ok(if r.problems.is_empty() {
        std::process::ExitCode::SUCCESS
    } else {
        std::process::ExitCode::from(1)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn label_values_are_escaped() {
        let l = Labels {
            sink: "a\"b\\c\nd".into(),
            shard: 3,
        };
        assert_eq!(l.render(None), r#"sink="a\"b\\c\nd",shard="3""#);
    }

    #[test]
    fn growth_estimates_time_to_full_and_infinity_when_flat() {
        let mut g = Growth::default();
        let t0 = Instant::now();
        assert_eq!(g.full_in(1000), None, "no estimate without samples");
        g.sample(t0, 100);
        g.sample(t0 + Duration::from_millis(500), 150);
        assert_eq!(
            g.samples.len(),
            1,
            "samples closer than a second are skipped"
        );
        g.sample(t0 + Duration::from_secs(2), 300);
        assert_eq!(g.full_in(1000), Some(10.0));
        g.sample(t0 + Duration::from_secs(4), 100);
        assert_eq!(g.full_in(1000), Some(f64::INFINITY));
        g.sample(t0 + Duration::from_secs(100), 100);
        assert_eq!(
            g.samples.len(),
            1,
            "samples older than the window are dropped"
        );
    }
}
