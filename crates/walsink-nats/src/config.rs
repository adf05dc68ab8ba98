//! [`Config`]: where a [`NatsSink`](crate::NatsSink) publishes, parsed from the command
//! line's `--sink` URL.

use std::fmt;
use std::time::Duration;

/// A configuration that does not parse, naming the parameter at fault
/// (`stream`, `subject`, `host`, …); its message starts `nats sink URL:`.
pub type ConfigError = walsink_tokio::UrlError;

fn bad(parameter: &str, reason: impl Into<String>) -> ConfigError {
    ConfigError::new("nats", parameter, reason)
}

/// Where and how a [`NatsSink`](crate::NatsSink) publishes.
///
/// [`Config::from_url`] parses
/// `nats://[USER:PASSWORD@|TOKEN@]HOST[:PORT]/?stream=NAME&subject=SUBJECT[&…]`.
/// `Debug` and `Display` never show the password or the token.
#[derive(Clone, PartialEq, Eq)]
pub struct Config {
    /// Host name or address. Default `127.0.0.1`.
    pub host: String,
    /// TCP port. Default 4222.
    pub port: u16,
    /// User name, with [`Config::password`].
    pub user: Option<String>,
    /// Password. Never shown.
    pub password: Option<String>,
    /// Token (`nats://TOKEN@HOST`). Never shown.
    pub token: Option<String>,
    /// The JetStream stream the records must land in (checked on every ack).
    pub stream: String,
    /// The subject every record is published to; the stream must capture it.
    pub subject: String,
    /// Create the stream (capturing [`Config::subject`], file storage, the server's default
    /// duplicate window) when it does not exist. Default false: a missing stream is a
    /// permanent error, since retention, replicas and the duplicate window are an
    /// operator's choice.
    pub create: bool,
    /// Publishes awaiting their ack at once. Default 1024.
    pub in_flight: usize,
    /// Timeout for connecting, for stream requests and for each ack. Default 10 s.
    pub timeout: Duration,
}

impl Config {
    /// A configuration publishing to `subject` of `stream` on `127.0.0.1:4222`.
    pub fn new(stream: impl Into<String>, subject: impl Into<String>) -> Self {
        Config {
            host: "127.0.0.1".into(),
            port: 4222,
            user: None,
            password: None,
            token: None,
            stream: stream.into(),
            subject: subject.into(),
            create: false,
            in_flight: 1024,
            timeout: Duration::from_secs(10),
        }
    }

    /// Parses `nats://[USER:PASSWORD@|TOKEN@]HOST[:PORT]/?stream=NAME&subject=SUBJECT` with
    /// the optional parameters `create=true|false`, `in_flight=N` and `timeout=DURATION`.
    pub fn from_url(url: &str) -> Result<Config, ConfigError> {
        let u = url::Url::parse(url).map_err(|e| bad("URL", e.to_string()))?;
        if u.scheme() != "nats" {
            return Err(bad("scheme", format!("{:?} is not nats", u.scheme())));
        }
        let host = match u.host_str() {
            Some(h) if !h.is_empty() => h.trim_start_matches('[').trim_end_matches(']'),
            _ => return Err(bad("host", "missing")),
        };
        let decode = |s: &str| {
            url::form_urlencoded::parse(format!("x={s}").as_bytes())
                .next()
                .map(|(_, v)| v.into_owned())
                .unwrap_or_default()
        };
        let mut c = Config::new(String::new(), String::new());
        c.host = host.to_string();
        c.port = u.port().unwrap_or(4222);
        match (u.username(), u.password()) {
            ("", None) => {}
            (user, Some(p)) => {
                c.user = Some(decode(user));
                c.password = Some(decode(p));
            }
            (token, None) => c.token = Some(decode(token)),
        }
        if !u.path().trim_matches('/').is_empty() {
            return Err(bad(
                "path",
                "nats URLs take no path: use /?stream=NAME&subject=SUBJECT",
            ));
        }
        let (mut stream, mut subject) = (None, None);
        for (k, v) in u.query_pairs() {
            match &*k {
                "stream" => stream = Some(v.into_owned()),
                "subject" => subject = Some(v.into_owned()),
                "create" => {
                    c.create = match &*v {
                        "true" | "1" | "yes" => true,
                        "false" | "0" | "no" => false,
                        other => {
                            return Err(bad("create", format!("{other:?} is not true or false")))
                        }
                    }
                }
                "in_flight" => {
                    c.in_flight = v.parse().ok().filter(|n| *n > 0).ok_or_else(|| {
                        bad("in_flight", format!("{v:?} is not a positive number"))
                    })?
                }
                "timeout" => {
                    c.timeout = humantime::parse_duration(&v)
                        .ok()
                        .filter(|d| !d.is_zero())
                        .ok_or_else(|| {
                            bad("timeout", format!("{v:?} is not a positive duration (10s)"))
                        })?
                }
                other => {
                    return Err(bad(
                        other,
                        "unknown parameter (known: stream, subject, create, in_flight, timeout)",
                    ))
                }
            }
        }
        c.stream = stream.ok_or_else(|| bad("stream", "missing: add ?stream=NAME"))?;
        c.subject = subject.ok_or_else(|| bad("subject", "missing: add &subject=SUBJECT"))?;
        c.check()?;
        Ok(c)
    }

    /// Checks the fields that [`Config::from_url`] checks, for a configuration built in code.
    pub fn check(&self) -> Result<(), ConfigError> {
        let name_ok = !self.stream.is_empty()
            && !self
                .stream
                .contains(|c: char| c.is_whitespace() || ".*>/\\".contains(c));
        if !name_ok {
            return Err(bad(
                "stream",
                format!(
                    "{:?} is not a stream name (no spaces, dots, *, >, slashes)",
                    self.stream
                ),
            ));
        }
        let subject_ok = !self.subject.is_empty()
            && !self.subject.contains(char::is_whitespace)
            && self
                .subject
                .split('.')
                .all(|t| !t.is_empty() && t != "*" && t != ">");
        if !subject_ok {
            return Err(bad(
                "subject",
                format!(
                    "{:?} is not a subject to publish to (tokens separated by dots, no wildcards)",
                    self.subject
                ),
            ));
        }
        if self.in_flight == 0 {
            return Err(bad("in_flight", "must be positive"));
        }
        Ok(())
    }

    /// The URL of this configuration with the password and token replaced by `***`.
    pub fn redacted(&self) -> String {
        let auth = match (&self.user, &self.password, &self.token) {
            (Some(u), Some(_), _) => format!("{u}:***@"),
            (_, _, Some(_)) => "***@".to_string(),
            _ => String::new(),
        };
        format!(
            "nats://{auth}{}:{}/?stream={}&subject={}",
            self.host, self.port, self.stream, self.subject
        )
    }
}

impl fmt::Debug for Config {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Config")
            .field("url", &self.redacted())
            .field("create", &self.create)
            .field("in_flight", &self.in_flight)
            .field("timeout", &self.timeout)
            .finish()
    }
}

impl fmt::Display for Config {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.redacted())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_full_url_parses() {
        let c = Config::from_url(
            "nats://bob:p%40ss@localhost:4223/?stream=ORDERS&subject=orders.in&create=true&in_flight=8&timeout=2s",
        )
        .unwrap();
        assert_eq!((c.host.as_str(), c.port), ("localhost", 4223));
        assert_eq!(c.user.as_deref(), Some("bob"));
        assert_eq!(c.password.as_deref(), Some("p@ss"));
        assert_eq!(
            (c.stream.as_str(), c.subject.as_str()),
            ("ORDERS", "orders.in")
        );
        assert!(c.create);
        assert_eq!((c.in_flight, c.timeout), (8, Duration::from_secs(2)));
        let t = Config::from_url("nats://s3cret@h/?stream=S&subject=a").unwrap();
        assert_eq!(t.token.as_deref(), Some("s3cret"));
        assert_eq!(t.port, 4222);
    }

    #[test]
    fn errors_name_the_parameter() {
        for (url, param) in [
            ("nats://h/?subject=a", "stream"),
            ("nats://h/?stream=S", "subject"),
            ("nats://h/?stream=S&subject=a.*", "subject"),
            ("nats://h/?stream=S.x&subject=a", "stream"),
            ("nats://h/?stream=S&subject=a&create=maybe", "create"),
            ("nats://h/?stream=S&subject=a&timeout=x", "timeout"),
            ("nats://h/?stream=S&subject=a&colour=red", "colour"),
            ("nats://h/path?stream=S&subject=a", "path"),
            ("redis://h/?stream=S&subject=a", "scheme"),
        ] {
            let e = Config::from_url(url).unwrap_err();
            assert_eq!(e.parameter, param, "{url}: {e}");
        }
    }

    #[test]
    fn secrets_never_show() {
        for url in [
            "nats://u:s3cret@h/?stream=S&subject=a",
            "nats://s3cret@h/?stream=S&subject=a",
        ] {
            let c = Config::from_url(url).unwrap();
            for shown in [c.to_string(), format!("{c:?}")] {
                assert!(
                    !shown.contains("s3cret") && shown.contains("***"),
                    "{shown}"
                );
            }
        }
    }
}
