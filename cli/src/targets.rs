//! Targets named by a URL on `--sink` (`postgres://…`, `redis://…`, `http://…`,
//! `nats://…`), each from its target crate behind a cargo feature of the CLI (all on by
//! default). One seam for `pipe` and `inspect`: how to show the target without secrets, how
//! to make its sink, and what the target itself says is committed.

use crate::CliResult;
use walsink::sinks::CommittedEpoch;
use walsink::Sink;

#[cfg(feature = "postgres")]
mod postgres;

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
        _ => None,
    }
}

/// The URL schemes this build accepts on `--sink`, for error messages.
pub(crate) fn schemes() -> Vec<&'static str> {
    vec![
        #[cfg(feature = "postgres")]
        "postgres",
    ]
}

/// `url` with any password replaced by `***`, for messages and files.
pub(crate) fn redact(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_string();
    };
    let (authority, path) = match rest.find(['/', '?', '#']) {
        Some(i) => rest.split_at(i),
        None => (rest, ""),
    };
    match authority.rsplit_once('@') {
        Some((userinfo, host)) => {
            let user = userinfo.split_once(':').map_or(userinfo, |(u, _)| u);
            let masked = if userinfo.contains(':') {
                format!("{user}:***")
            } else {
                user.to_string()
            };
            format!("{scheme}://{masked}@{host}{path}")
        }
        None => url.to_string(),
    }
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
    }
}
