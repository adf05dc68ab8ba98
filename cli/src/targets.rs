//! Targets named by a URL on `--sink` (`postgres://…`, `mysql://…`, `redis://…`, `http://…`,
//! `nats://…`), each from its target crate behind a cargo feature of the CLI (all on by
//! default). One seam for `pipe` and `inspect`: how to show the target without secrets, how
//! to make its sink, and what the target itself says is committed.

use crate::outcome::CliResult;

#[cfg(feature = "http")]
mod http;
#[cfg(feature = "mysql")]
mod mysql;
#[cfg(feature = "nats")]
mod nats;
#[cfg(feature = "postgres")]
mod postgres;
#[cfg(feature = "redis")]
mod redis;
mod target;

pub(crate) use target::Target;

/// The target for a `--sink` URL, or `None` when `spec` is not a URL this build knows.
pub(crate) fn parse(spec: &str) -> Option<CliResult<Box<dyn Target>>> {
    let (scheme, _) = spec.split_once("://")?;
    #[allow(clippy::match_single_binding)]
    match scheme {
        #[cfg(feature = "postgres")]
        "postgres" | "postgresql" => Some(postgres::parse(spec)),
        #[cfg(feature = "mysql")]
        "mysql" | "mariadb" => Some(mysql::parse(spec)),
        #[cfg(feature = "http")]
        "http" | "https" => Some(http::parse(spec)),
        #[cfg(feature = "redis")]
        "redis" | "rediss" => Some(redis::parse(spec)),
        #[cfg(feature = "nats")]
        "nats" | "tls" => Some(nats::parse(spec)),
        _ => None,
    }
}

/// The URL schemes this build accepts on `--sink`, for error messages.
pub(crate) fn schemes() -> Vec<&'static str> {
    let known: &[&'static str] = &[
        #[cfg(feature = "postgres")]
        "postgres",
        #[cfg(feature = "mysql")]
        "mysql",
        #[cfg(feature = "http")]
        "http",
        #[cfg(feature = "http")]
        "https",
        #[cfg(feature = "redis")]
        "redis",
        #[cfg(feature = "redis")]
        "rediss",
        #[cfg(feature = "nats")]
        "nats",
    ];
    known.to_vec()
}
