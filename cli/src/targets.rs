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

pub(crate) use target::{claim_or_defer, Target};

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

#[cfg(test)]
mod tests {
    //! Every `--sink` target reads its URL through the one grammar of the target kit: the same
    //! spellings of a duration, a size and a boolean pass in each, the same bad ones are
    //! refused naming the parameter, and a parameter given twice, an unknown one and a `%`
    //! that starts no escape are refused by name everywhere.

    use super::parse;

    /// Per target: a URL that parses, and its parameters of each kind (`None`: it has none).
    struct Case {
        base: &'static str,
        duration: Option<&'static str>,
        size: Option<&'static str>,
        boolean: Option<&'static str>,
    }

    fn cases() -> Vec<Case> {
        vec![
            #[cfg(feature = "postgres")]
            Case {
                base: "postgres://u@127.0.0.1:1/d?table=t",
                duration: Some("lock_timeout"),
                size: None,
                boolean: Some("create"),
            },
            #[cfg(feature = "mysql")]
            Case {
                base: "mysql://u@127.0.0.1:1/d?table=t",
                duration: Some("lock_timeout"),
                size: Some("batch_size"),
                boolean: Some("create"),
            },
            #[cfg(feature = "redis")]
            Case {
                base: "redis://127.0.0.1:1/?key=k",
                duration: Some("timeout"),
                size: Some("chunk_bytes"),
                boolean: None,
            },
            #[cfg(feature = "nats")]
            Case {
                base: "nats://127.0.0.1:1/?stream=S&subject=s",
                duration: Some("timeout"),
                size: None,
                boolean: Some("create"),
            },
            #[cfg(feature = "http")]
            Case {
                base: "http://127.0.0.1:1/in",
                duration: Some("timeout"),
                size: Some("max_bytes"),
                boolean: Some("gzip"),
            },
        ]
    }

    fn parsed(url: &str) -> Result<(), String> {
        match parse(url) {
            None => Err(format!("{url}: no target for this scheme")),
            Some(r) => r.map(|_| ()).map_err(|e| e.to_string()),
        }
    }

    /// The case's URL with `extra` parameters added.
    fn with(c: &Case, extra: &str) -> String {
        let sep = if c.base.contains('?') { '&' } else { '?' };
        format!("{}{sep}{extra}", c.base)
    }

    #[test]
    fn every_target_takes_the_same_spellings() {
        for c in cases() {
            parsed(c.base).unwrap_or_else(|e| panic!("{}: {e}", c.base));
            if let Some(d) = c.duration {
                for v in ["1h30m", "90s", "500ms", "2m%205s"] {
                    let url = with(&c, &format!("{d}={v}"));
                    parsed(&url).unwrap_or_else(|e| panic!("{url}: {e}"));
                }
            }
            if let Some(s) = c.size {
                for v in ["64KiB", "1MB", "65536"] {
                    let url = with(&c, &format!("{s}={v}"));
                    parsed(&url).unwrap_or_else(|e| panic!("{url}: {e}"));
                }
            }
            if let Some(b) = c.boolean {
                for v in ["on", "off", "yes", "no", "TRUE", "0"] {
                    let url = with(&c, &format!("{b}={v}"));
                    parsed(&url).unwrap_or_else(|e| panic!("{url}: {e}"));
                }
            }
        }
    }

    #[test]
    fn every_target_refuses_the_same_bad_spellings_naming_the_parameter() {
        for c in cases() {
            let mut bad: Vec<(String, &str)> = Vec::new();
            if let Some(d) = c.duration {
                for v in ["5", "soon", "1x"] {
                    bad.push((format!("{d}={v}"), d));
                }
                bad.push((format!("{d}=1s&{d}=2s"), d));
            }
            if let Some(s) = c.size {
                for v in ["64XB", "lots", "-1"] {
                    bad.push((format!("{s}={v}"), s));
                }
            }
            if let Some(b) = c.boolean {
                for v in ["maybe", "2", "y"] {
                    bad.push((format!("{b}={v}"), b));
                }
            }
            bad.push(("no_such_parameter=1".into(), "no_such_parameter"));
            bad.push(("no_such_parameter=50%".into(), "no_such_parameter"));
            for (extra, param) in bad {
                let url = with(&c, &extra);
                let e = parsed(&url).expect_err(&url);
                assert!(e.contains(&format!(": {param}: ")), "{url}: {e}");
            }
        }
    }
}
