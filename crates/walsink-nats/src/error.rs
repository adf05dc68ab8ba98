//! NATS errors classified once, here, into retryable and permanent.

use async_nats::jetstream::context::{
    GetStreamError, GetStreamErrorKind, PublishError, PublishErrorKind,
};
use async_nats::{ConnectError, ConnectErrorKind};
use walsink::SinkError;
use walsink_kit::tls::TlsFailure;

/// JetStream API error code of a stream that does not exist.
const STREAM_NOT_FOUND: u64 = 10059;

/// Connecting: bad credentials and a malformed address are permanent; timeouts, refused
/// connections and other I/O errors are retryable.
///
/// A failed TLS handshake is named by its reason ([`walsink_kit::tls::TlsFailure`]: an
/// unknown CA, an expired certificate, a host name the certificate does not carry, a
/// refused client certificate, a server that does not speak TLS) and is permanent when the
/// certificates or the server's TLS setting are at fault (a retry meets the same), retryable
/// otherwise.
pub fn classify_connect(e: &ConnectError, what: &str) -> SinkError {
    if let Some(f) = walsink_kit::tls::failure(e) {
        // A server without TLS reads the client's handshake as an unknown protocol
        // operation and answers in plain text, which rustls reports as a corrupt record.
        if matches!(&f, TlsFailure::Other(t) if t.contains("InvalidContentType")) {
            return SinkError::permanent(format!(
                "{what}: TLS: the server does not answer in TLS on this port (is TLS on for it? a server without TLS takes nats://… without TLS settings) ({e})"
            ));
        }
        let msg = format!("{what}: TLS: {f} ({e})");
        return match f {
            TlsFailure::Other(_) => SinkError::retryable(msg),
            _ => SinkError::permanent(msg),
        };
    }
    match e.kind() {
        ConnectErrorKind::Authentication | ConnectErrorKind::AuthorizationViolation => {
            SinkError::permanent(format!(
                "{what}: {e}; check the user, password or token in the sink URL"
            ))
        }
        ConnectErrorKind::ServerParse | ConnectErrorKind::Tls => {
            SinkError::permanent(format!("{what}: {e}"))
        }
        _ => SinkError::retryable(format!("{what}: {e}")),
    }
}

/// Looking the stream up: a stream that does not exist (JetStream error 10059) and other
/// JetStream API errors (permissions among them) are permanent; a request that timed out or
/// found no responders (JetStream not up yet, a leader election) is retryable.
pub fn classify_stream(e: &GetStreamError, what: &str) -> SinkError {
    match e.kind() {
        GetStreamErrorKind::JetStream(js) if js.error_code().0 == STREAM_NOT_FOUND => {
            SinkError::permanent(format!(
                "{what}: {e} (JetStream {}); create the stream (capturing the sink's subject), or add create=true to the sink URL",
                js.error_code().0
            ))
            .with_code(js.error_code().0.to_string())
        }
        GetStreamErrorKind::JetStream(js) => SinkError::permanent(format!(
            "{what}: {e} (JetStream {})",
            js.error_code().0
        ))
        .with_code(js.error_code().0.to_string()),
        GetStreamErrorKind::Request => SinkError::retryable(format!("{what}: {e}")),
        _ => SinkError::permanent(format!("{what}: {e}")),
    }
}

/// Publishing: no responders (reported by the client as `StreamNotFound`, though the stream
/// was found just before: JetStream restarting, a stream leader moving), ack timeouts and a
/// lost connection are retryable; a message over the server's size limit and other
/// JetStream errors are permanent.
pub fn classify_publish(e: &PublishError, what: &str) -> SinkError {
    match e.kind() {
        PublishErrorKind::StreamNotFound => SinkError::retryable(format!(
            "{what}: no responders for the subject (the stream was found before the epoch: JetStream may be restarting)"
        )),
        PublishErrorKind::TimedOut | PublishErrorKind::BrokenPipe | PublishErrorKind::MaxAckPending => {
            SinkError::retryable(format!("{what}: {e}"))
        }
        PublishErrorKind::MaxPayloadExceeded => SinkError::permanent(format!(
            "{what}: {e}; raise the server's max_payload or keep records smaller"
        )),
        _ => SinkError::permanent(format!("{what}: {e}")),
    }
}
