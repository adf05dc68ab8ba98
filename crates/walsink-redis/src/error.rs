//! Redis errors classified once, here, into retryable and permanent, keeping the server's
//! error code in the message.

use std::time::Duration;
use tokio::io::AsyncReadExt;
use walsink::SinkError;
use walsink_kit::tls::TlsFailure;

/// Server error codes that pass without an operator: the server is loading, busy with a
/// script, failing over or short of memory for a moment.
const TRANSIENT: &[&str] = &[
    "LOADING",
    "BUSY",
    "TRYAGAIN",
    "CLUSTERDOWN",
    "MASTERDOWN",
    "READONLY",
    "OOM",
    "MISCONF",
    "NOREPLICAS",
    "NOSCRIPT",
];

/// What an operator can do about a permanent server error, by its code.
fn advice(code: &str) -> &'static str {
    match code {
        "WRONGTYPE" => "; the key holds another type: delete or rename it, or point the sink at another key",
        "NOAUTH" | "WRONGPASS" => "; check the user and password in the sink URL",
        "NOPERM" => "; grant the user WATCH, UNWATCH, MULTI, EXEC, EVAL, HGET, HSET, HDEL, EXISTS, TYPE and the mode's write and read commands (RPUSH and LINDEX, XADD and XREVRANGE, or HSET) on the keys",
        "DENIED" => "; the server refuses clients from this address (protected mode): set a password on the server and in the sink URL, or change its bind and protected-mode settings",
        "MOVED" | "ASK" | "CROSSSLOT" => "; this is a cluster node that does not own the key's slot: connect to the node that does",
        "WALSINK_GAP" | "WALSINK_MARKER" => "; the marker was changed by another program or another log under this sink id",
        "WALSINK_NOT_WRITTEN" => "; a write of the transaction did not land (were the user's permissions changed?)",
        _ => "",
    }
}

/// Classifies an error of the client library: lost connections, timeouts and the transient
/// server codes are retryable; every other server code (`WRONGTYPE`, `NOPERM`, script
/// errors, `WALSINK_GAP`) and bad credentials are permanent. `what` says what was being
/// done; the server's code and message follow it.
pub fn classify(e: &redis::RedisError, what: &str) -> SinkError {
    let code = e.code().unwrap_or("");
    let retryable = e.is_io_error()
        || e.is_connection_dropped()
        || e.is_timeout()
        || e.is_connection_refusal()
        || TRANSIENT.contains(&code);
    let msg = format!("{what}: {e}{}", advice(code));
    let mut err = if retryable {
        SinkError::retryable(msg)
    } else {
        SinkError::permanent(msg)
    };
    if !code.is_empty() {
        err = err.with_code(code);
    }
    err.with_source(e.clone())
}

/// A permanent error with a server-style code (`WRONGTYPE`, `WALSINK_GAP`, …) that the sink
/// found itself, worded as [`classify_server`] words the server's.
pub(crate) fn coded(code: &str, details: &str, what: &str) -> SinkError {
    SinkError::permanent(format!("{what}: {code} {details}{}", advice(code))).with_code(code)
}

/// Classifies an error reply of one command in a pipeline, as [`classify`] does.
pub(crate) fn classify_server(e: &redis::ServerError, what: &str) -> SinkError {
    let code = e.code();
    let msg = format!(
        "{what}: {code} {}{}",
        e.details().unwrap_or(""),
        advice(code)
    );
    let err = if TRANSIENT.contains(&code) {
        SinkError::retryable(msg)
    } else {
        SinkError::permanent(msg)
    };
    err.with_code(code)
}

/// How long [`refusal`] waits for a server's first words at most.
pub(crate) const REFUSAL_WAIT: Duration = Duration::from_millis(500);

/// The error line a server writes unasked when it refuses a client and closes the connection
/// (`DENIED Redis is running in protected mode …`, `ERR max number of clients reached`),
/// without its leading `-`; `None` when it says nothing within `wait` (a server that accepts
/// the client waits for a command) or cannot be reached.
/// `open` opens the connection (TCP, or TLS for `rediss://`).
pub(crate) async fn refusal<S, E>(
    open: impl std::future::Future<Output = Result<S, E>>,
    wait: Duration,
) -> Option<String>
where
    S: tokio::io::AsyncRead + Unpin,
{
    let probe = async {
        let mut s = open.await.ok()?;
        let mut buf = [0u8; 512];
        let n = s.read(&mut buf).await.ok()?;
        let line = buf[..n].strip_prefix(b"-")?;
        let end = line
            .iter()
            .position(|&b| b == b'\r' || b == b'\n')
            .unwrap_or(line.len());
        let line = String::from_utf8_lossy(&line[..end]).trim().to_string();
        (!line.is_empty()).then_some(line)
    };
    tokio::time::timeout(wait, probe).await.ok().flatten()
}

/// Classifies a server's refusal line (see [`refusal`]): a full server (`maxclients`) and the
/// transient codes are retryable, every other refusal (`DENIED`) is permanent.
pub(crate) fn refused(line: &str, what: &str) -> SinkError {
    let code = line.split_whitespace().next().unwrap_or("");
    let msg = format!(
        "{what}: the server refused the client: {line}{}",
        advice(code)
    );
    if TRANSIENT.contains(&code) || line.contains("max number of clients") {
        SinkError::retryable(msg)
    } else {
        SinkError::permanent(msg)
    }
}

/// Classifies a TLS failure at connect ([`walsink_kit::tls::failure`] names it), with the URL
/// parameter that fixes it. A certificate that is out of its validity period is retryable
/// (the server's certificate is renewed, or a clock set right, without touching the sink);
/// a CA the sink does not trust, a host name the certificate does not carry and a handshake
/// the server refused are permanent: the sink's settings must change.
pub(crate) fn tls_failed(f: &TlsFailure, what: &str) -> SinkError {
    let (advice, retryable) = match f {
        TlsFailure::UnknownCa => ("; set ca_file= to the CA that signed it", false),
        TlsFailure::WrongHost => (
            "; the URL's host must be one it lists, or set verify=ca",
            false,
        ),
        TlsFailure::Expired | TlsFailure::NotYetValid => (
            "; the server needs a certificate valid now, or this machine's clock is wrong",
            true,
        ),
        TlsFailure::Refused(_) => ("; give one with cert_file= and key_file=", false),
        _ => ("", false),
    };
    let msg = format!("{what}: TLS: {f}{advice}");
    if retryable {
        SinkError::retryable(msg)
    } else {
        SinkError::permanent(msg)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_code_the_sink_found_is_kept_as_the_errors_code() {
        let e = coded("WALSINK_GAP", "marker at 3, epoch 5", "deliver");
        assert_eq!(e.code(), Some("WALSINK_GAP"));
        assert_eq!(e.class(), walsink::SinkErrorClass::Permanent);
        assert!(e.message().contains("WALSINK_GAP marker at 3"), "{e}");
    }
}
