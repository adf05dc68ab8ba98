//! [`NatsSink`]: publishes epochs to a JetStream stream with a message id per record
//! position, waiting for every ack.

use crate::config::Config;
use crate::error::{classify_connect, classify_publish, classify_stream};
use async_nats::jetstream::{self, context::PublishAckFuture, message::PublishMessage};
use parking_lot::Mutex;
use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, SystemTime};
use walsink::{Epoch, SinkError};
use walsink_tokio::{AsyncChunks, AsyncSink};

/// The `Nats-Msg-Id` of a record: `SINK:SUBTASK:CHECKPOINT:INDEX`, the same on every
/// delivery of the record.
pub fn message_id(sink_id: &str, subtask: u32, checkpoint: u64, index: u64) -> String {
    format!("{sink_id}:{subtask}:{checkpoint}:{index}")
}

/// A delivery that came later than the stream's duplicate window allows for a safe replay.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BeyondWindow {
    /// The epoch's checkpoint id.
    pub checkpoint: u64,
    /// How long ago the checkpoint was taken, when the delivery started.
    pub age: Duration,
    /// The stream's duplicate window.
    pub window: Duration,
}

/// What the sink has done and seen, readable while a committer owns the sink (see
/// [`NatsSink::status`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Status {
    /// The stream's duplicate window, as read from its configuration at the last delivery.
    pub duplicate_window: Option<Duration>,
    /// Records acknowledged by the stream as stored.
    pub published: u64,
    /// Records the stream acknowledged as duplicates (dropped by id: a replay).
    pub duplicates: u64,
    /// The newest delivery of an epoch older than the duplicate window: a replay of it is
    /// no longer deduplicated by the stream for records published more than a window ago.
    /// Cleared by the next delivery within the window.
    pub beyond_window: Option<BeyondWindow>,
    /// Epochs delivered whole (every ack received).
    pub epochs: u64,
}

/// A clonable handle on a sink's [`Status`].
#[derive(Debug, Clone, Default)]
pub struct StatusHandle(Arc<Mutex<Status>>);

impl StatusHandle {
    /// The status now.
    pub fn get(&self) -> Status {
        self.0.lock().clone()
    }
}

/// An [`AsyncSink`] publishing every record of an epoch to a JetStream subject with
/// `Nats-Msg-Id: SINK:SUBTASK:CHECKPOINT:INDEX`, and counting the epoch delivered only when
/// the stream acknowledged every record. A replay after a crash publishes the same ids, and
/// the stream drops those it already holds: effectively-once **within the stream's
/// duplicate window** (2 minutes by default). An epoch delivered when its checkpoint is
/// older than the window is logged (`tracing::warn!`) and shown in [`Status::beyond_window`].
///
/// Publishes are pipelined: up to [`Config::in_flight`] await their ack at once.
pub struct NatsSink {
    config: Config,
    js: Option<jetstream::Context>,
    status: StatusHandle,
}

impl std::fmt::Debug for NatsSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NatsSink")
            .field("config", &self.config)
            .field("connected", &self.js.is_some())
            .finish()
    }
}

impl NatsSink {
    /// A sink for `config`; connects on first use (or with [`NatsSink::connect`]).
    pub fn new(config: Config) -> Result<NatsSink, crate::ConfigError> {
        config.check()?;
        Ok(NatsSink {
            config,
            js: None,
            status: StatusHandle::default(),
        })
    }

    /// The configuration.
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// A handle on the sink's status, to keep before the sink is handed to a committer.
    pub fn status(&self) -> StatusHandle {
        self.status.clone()
    }

    fn shown(&self, what: &str) -> String {
        format!(
            "{} {}:{} stream {:?} subject {:?}: {what}",
            if self.config.tls.is_some() {
                "nats over TLS"
            } else {
                "nats"
            },
            self.config.host,
            self.config.port,
            self.config.stream,
            self.config.subject
        )
    }

    /// Connects now, checks that the stream exists (creating it with [`Config::create`]),
    /// and reads its duplicate window.
    ///
    /// # Cancel safety
    /// Cancel safe: a connection half set up is dropped, and the next call connects anew.
    pub async fn connect(&mut self) -> Result<(), SinkError> {
        self.stream_window().await.map(|_| ())
    }

    async fn context(&mut self) -> Result<jetstream::Context, SinkError> {
        if let Some(js) = &self.js {
            return Ok(js.clone());
        }
        let c = &self.config;
        let mut opts = async_nats::ConnectOptions::new()
            .connection_timeout(c.timeout)
            .request_timeout(Some(c.timeout));
        if let (Some(u), Some(p)) = (&c.user, &c.password) {
            opts = opts.user_and_password(u.clone(), p.expose().to_string());
        }
        if let Some(t) = &c.token {
            opts = opts.token(t.expose().to_string());
        }
        // Always our rustls configuration: without TLS settings it is verify-full against
        // the Mozilla roots, used if the server demands TLS anyway.
        let tls = c.tls.clone().unwrap_or_default();
        let tls_config = tls
            .client_config("nats")
            .map_err(|e| SinkError::permanent(self.shown(&format!("TLS settings: {e}"))))?;
        opts = opts
            .tls_client_config(tls_config)
            .require_tls(c.tls.is_some());
        let client = opts
            .connect(format!("{}:{}", c.host, c.port))
            .await
            .map_err(|e| classify_connect(&e, &self.shown("connect")))?;
        let mut js = jetstream::new(client);
        js.set_timeout(c.timeout);
        self.js = Some(js.clone());
        Ok(js)
    }

    /// The stream's duplicate window, from its configuration.
    async fn stream_window(&mut self) -> Result<Duration, SinkError> {
        let js = self.context().await?;
        let stream = if self.config.create {
            js.get_or_create_stream(jetstream::stream::Config {
                name: self.config.stream.clone(),
                subjects: vec![self.config.subject.clone()],
                storage: jetstream::stream::StorageType::File,
                ..Default::default()
            })
            .await
            .map_err(|e| {
                let msg = self.shown(&format!("create the stream: {e}"));
                if matches!(
                    e.kind(),
                    jetstream::context::CreateStreamErrorKind::TimedOut
                ) {
                    SinkError::retryable(msg)
                } else {
                    SinkError::permanent(msg)
                }
            })?
        } else {
            js.get_stream(&self.config.stream)
                .await
                .map_err(|e| classify_stream(&e, &self.shown("look up the stream")))?
        };
        let cfg = &stream.cached_info().config;
        // A stream that does not capture the subject answers no publish: the client reports
        // "no responders", which otherwise reads (and is retried) as JetStream restarting.
        let subjects = if cfg.subjects.is_empty() {
            vec![cfg.name.clone()]
        } else {
            cfg.subjects.clone()
        };
        if !subjects.iter().any(|p| captures(p, &self.config.subject)) {
            return Err(SinkError::permanent(self.shown(&format!(
                "the stream does not capture subject {:?} (its subjects: {}); publish to a subject it captures, or add this one to the stream's subjects",
                self.config.subject,
                subjects.join(", ")
            ))));
        }
        let window = cfg.duplicate_window;
        self.status.0.lock().duplicate_window = Some(window);
        Ok(window)
    }

    /// Notes how old epoch `cp` is against the window, and warns when it is older.
    fn check_age(&self, epoch: &Epoch, window: Duration) {
        let taken = SystemTime::UNIX_EPOCH + Duration::from_millis(epoch.timestamp_ms());
        let age = SystemTime::now().duration_since(taken).unwrap_or_default();
        let mut st = self.status.0.lock();
        if age > window {
            let k = epoch.key();
            tracing::warn!(
                sink_id = %k.sink_id,
                subtask = k.subtask,
                checkpoint = k.checkpoint,
                age_ms = age.as_millis() as u64,
                window_ms = window.as_millis() as u64,
                stream = %self.config.stream,
                "delivering an epoch older than the stream's duplicate window: records of it published by an earlier attempt more than a window ago are not deduplicated"
            );
            st.beyond_window = Some(BeyondWindow {
                checkpoint: k.checkpoint,
                age,
                window,
            });
        } else {
            st.beyond_window = None;
        }
    }

    async fn publish_all(&mut self, epoch: &Epoch) -> Result<(), SinkError> {
        let js = self.context().await?;
        let k = epoch.key().clone();
        let subject = self.config.subject.clone();
        let mut acks: VecDeque<(u64, PublishAckFuture)> = VecDeque::new();
        let (mut published, mut duplicates) = (0u64, 0u64);
        let mut chunks = AsyncChunks::new(epoch);
        let result: Result<(), SinkError> = async {
            while let Some(chunk) = chunks.next().await {
                for r in chunk?.records() {
                    let id = message_id(&k.sink_id, k.subtask, k.checkpoint, r.position.index);
                    let msg = PublishMessage::build().payload(r.data).message_id(id);
                    let ack = js
                        .send_publish(subject.clone(), msg)
                        .await
                        .map_err(|e| classify_publish(&e, &self.pos(&k, r.position.index)))?;
                    acks.push_back((r.position.index, ack));
                    if acks.len() >= self.config.in_flight {
                        let (i, a) = acks.pop_front().expect("not empty");
                        self.settle(i, a, &k, &mut published, &mut duplicates)
                            .await?;
                    }
                }
            }
            while let Some((i, a)) = acks.pop_front() {
                self.settle(i, a, &k, &mut published, &mut duplicates)
                    .await?;
            }
            Ok(())
        }
        .await;
        let mut st = self.status.0.lock();
        st.published += published;
        st.duplicates += duplicates;
        if result.is_ok() {
            st.epochs += 1;
        }
        result
    }

    fn pos(&self, k: &walsink::EpochKey, index: u64) -> String {
        self.shown(&format!(
            "publish record {index} of checkpoint {} (sink {} subtask {})",
            k.checkpoint, k.sink_id, k.subtask
        ))
    }

    async fn settle(
        &self,
        index: u64,
        ack: PublishAckFuture,
        k: &walsink::EpochKey,
        published: &mut u64,
        duplicates: &mut u64,
    ) -> Result<(), SinkError> {
        let ack = ack
            .await
            .map_err(|e| classify_publish(&e, &self.pos(k, index)))?;
        if ack.stream != self.config.stream {
            return Err(SinkError::permanent(self.shown(&format!(
                "the subject is captured by stream {:?}, not {:?}: its duplicate window is not the one checked; fix the stream's subjects or the sink URL",
                ack.stream, self.config.stream
            ))));
        }
        if ack.duplicate {
            *duplicates += 1;
        } else {
            *published += 1;
        }
        Ok(())
    }
}

impl AsyncSink for NatsSink {
    /// # Cancel safety
    /// Dropping the future stops the publishing; messages already sent may be stored. The
    /// next delivery of the epoch publishes every record again under the same message ids,
    /// and the stream drops those it holds as duplicates (within its duplicate window).
    async fn deliver(&mut self, epoch: &Epoch) -> Result<(), SinkError> {
        let window = self.stream_window().await;
        let window = match window {
            Ok(w) => w,
            Err(e) => {
                self.drop_connection_if_retryable(&e);
                return Err(e);
            }
        };
        self.check_age(epoch, window);
        let r = self.publish_all(epoch).await;
        if let Err(e) = &r {
            self.drop_connection_if_retryable(e);
        }
        r
    }
}

impl NatsSink {
    /// After a retryable failure the next attempt starts on a new connection: the client
    /// reconnects by itself, but a fresh one does not wait behind a backlog of stale
    /// publishes.
    fn drop_connection_if_retryable(&mut self, e: &SinkError) {
        if e.class() == walsink::SinkErrorClass::Retryable {
            self.js = None;
        }
    }
}

/// Whether the stream subject `pattern` (with NATS wildcards: `*` one token, `>` one or more
/// at the end) captures `subject`.
pub(crate) fn captures(pattern: &str, subject: &str) -> bool {
    let mut subject = subject.split('.');
    for p in pattern.split('.') {
        match (p, subject.next()) {
            (">", Some(_)) => return true,
            (_, None) => return false,
            ("*", Some(_)) => {}
            (p, Some(t)) if p == t => {}
            _ => return false,
        }
    }
    subject.next().is_none()
}

#[cfg(test)]
mod subject_tests {
    use super::captures;

    #[test]
    fn wildcards_capture_as_nats_does() {
        for (p, s, want) in [
            ("orders", "orders", true),
            ("orders", "orders.eu", false),
            ("orders.*", "orders.eu", true),
            ("orders.*", "orders", false),
            ("orders.*", "orders.eu.x", false),
            ("orders.>", "orders.eu.x", true),
            ("orders.>", "orders", false),
            (">", "a.b", true),
            ("*.eu", "orders.eu", true),
            ("X", "X.elsewhere", false),
        ] {
            assert_eq!(captures(p, s), want, "{p} {s}");
        }
    }
}
