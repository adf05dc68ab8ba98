//! Targets named by a URL on `--sink` (`postgres://…`, `redis://…`, `http://…`,
//! `nats://…`), each from its target crate behind a cargo feature of the CLI (all on by
//! default). One seam for `pipe` and `inspect`: how to show the target without secrets, how
//! to make its sink, and what the target itself says is committed.

use crate::CliResult;
use walsink::sinks::CommittedEpoch;
use walsink::Sink;

#[cfg(feature = "http")]
mod http;
#[cfg(feature = "nats")]
mod nats;
#[cfg(feature = "postgres")]
mod postgres;
#[cfg(feature = "redis")]
mod redis;

/// A URL target of `--sink`.
pub(crate) trait Target {
    /// The target for messages: the URL without its password.
    fn shown(&self) -> String;

    /// A sink delivering into the target (connects; errors name the target, not secrets).
    fn open_sink(&self, sink_id: &str, subtask: u32) -> CliResult<Box<dyn Sink>>;

    /// The epochs the target itself holds as committed for `(sink_id, subtask)`, with the
    /// checkpoint metadata kept beside each marker, oldest first; `None` for a target that
    /// keeps no marker (its exactly-once rests on idempotency keys).
    fn committed(&self, sink_id: &str, subtask: u32) -> CliResult<Option<Vec<CommittedEpoch>>>;

    /// Lines about the target's own state for `walsink inspect --sink` (for example
    /// transactions it holds prepared); none by default.
    fn status(&self, sink_id: &str, subtask: u32) -> CliResult<Vec<String>> {
        let _ = (sink_id, subtask);
        Ok(Vec::new())
    }
}

/// The target for a `--sink` URL, or `None` when `spec` is not a URL this build knows.
pub(crate) fn parse(spec: &str) -> Option<CliResult<Box<dyn Target>>> {
    let (scheme, _) = spec.split_once("://")?;
    #[allow(clippy::match_single_binding)]
    match scheme {
        #[cfg(feature = "postgres")]
        "postgres" | "postgresql" => Some(postgres::parse(spec)),
        #[cfg(feature = "http")]
        "http" | "https" => Some(http::parse(spec)),
        #[cfg(feature = "redis")]
        "redis" => Some(redis::parse(spec)),
        #[cfg(feature = "nats")]
        "nats" => Some(nats::parse(spec)),
        _ => None,
    }
}

/// The URL schemes this build accepts on `--sink`, for error messages.
pub(crate) fn schemes() -> Vec<&'static str> {
    let known: &[&'static str] = &[
        #[cfg(feature = "postgres")]
        "postgres",
        #[cfg(feature = "http")]
        "http",
        #[cfg(feature = "http")]
        "https",
        #[cfg(feature = "redis")]
        "redis",
        #[cfg(feature = "nats")]
        "nats",
    ];
    known.to_vec()
}

/// `url` with any secret replaced by `***`, for messages and files: the password of the
/// user information, user information without a password where it is a token rather than a
/// user name (every scheme but PostgreSQL's, e.g. `nats://TOKEN@host`), and query
/// parameters whose names say they hold a secret.
pub(crate) fn redact(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_string();
    };
    let (authority, tail) = match rest.find(['/', '?', '#']) {
        Some(i) => rest.split_at(i),
        None => (rest, ""),
    };
    let authority = match authority.rsplit_once('@') {
        Some((userinfo, host)) => {
            let masked = match userinfo.split_once(':') {
                Some((user, _)) => format!("{user}:***"),
                None if matches!(scheme, "postgres" | "postgresql") => userinfo.to_string(),
                None => "***".to_string(),
            };
            format!("{masked}@{host}")
        }
        None => authority.to_string(),
    };
    let tail = match tail.split_once('?') {
        Some((path, query)) => {
            let (query, fragment) = match query.split_once('#') {
                Some((q, f)) => (q, format!("#{f}")),
                None => (query, String::new()),
            };
            let params: Vec<String> = query
                .split('&')
                .map(|kv| match kv.split_once('=') {
                    Some((k, _)) if secret_param(k) => format!("{k}=***"),
                    _ => kv.to_string(),
                })
                .collect();
            format!("{path}?{}{fragment}", params.join("&"))
        }
        None => tail.to_string(),
    };
    format!("{scheme}://{authority}{tail}")
}

/// Query parameter names that carry secrets.
fn secret_param(name: &str) -> bool {
    let n = name.to_ascii_lowercase();
    [
        "pass",
        "secret",
        "token",
        "apikey",
        "api_key",
        "auth",
        "credential",
    ]
    .iter()
    .any(|s| n.contains(s))
}

#[cfg(test)]
mod tests {
    use super::redact;

    #[test]
    fn passwords_never_show() {
        assert_eq!(
            redact("postgres://alice:s3cret@db:5432/app?table=t"),
            "postgres://alice:***@db:5432/app?table=t"
        );
        assert_eq!(redact("redis://:pw@h:6379/0"), "redis://:***@h:6379/0");
        assert_eq!(redact("nats://h:4222/?stream=s"), "nats://h:4222/?stream=s");
        assert_eq!(redact("http://u:p@x/p@q?a=b@c"), "http://u:***@x/p@q?a=b@c");
        assert_eq!(
            redact("nats://s3cr3t@h:4222/?stream=s"),
            "nats://***@h:4222/?stream=s"
        );
        assert_eq!(redact("postgres://alice@db/app"), "postgres://alice@db/app");
        assert_eq!(
            redact("http://h/p?max_records=5&token=abc&password=x#f"),
            "http://h/p?max_records=5&token=***&password=***#f"
        );
        assert_eq!(redact("redis://h/0?key=orders"), "redis://h/0?key=orders");
    }
}
