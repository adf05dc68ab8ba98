//! [`Config`]: where and how a [`RedisSink`](crate::RedisSink) writes, parsed from the
//! command line's `--sink` URL.

use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

use percent_encoding::{utf8_percent_encode, AsciiSet, NON_ALPHANUMERIC};
use walsink_kit::params::percent_decode;
use walsink_kit::{secret, Params, TlsOptions, Verify};

/// The URL parameters of a Redis target, for the message that refuses an unknown one.
const KNOWN: &[&str] = &[
    "key",
    "mode",
    "chunk_records",
    "chunk_bytes",
    "in_flight",
    "timeout",
    "password_file",
    "password_env",
    "ca_file",
    "cert_file",
    "key_file",
    "verify",
];

/// What is percent-encoded in the user and password of the client library's URL: all but
/// the unreserved characters of RFC 3986.
const USERINFO: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'.')
    .remove(b'_')
    .remove(b'~');

/// The parameters that only a `rediss://` URL takes.
const TLS_PARAMS: &[&str] = &["ca_file", "cert_file", "key_file", "verify"];

/// How records are written to the data key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// `RPUSH` each record to a list (the default).
    List,
    /// `XADD key * record <bytes>`: one stream entry per record, in a field named `record`.
    Stream,
    /// Each record is `FIELD<TAB>VALUE`, written with `HSET key FIELD VALUE` (an upsert: a
    /// later record with the same field wins). A record without a tab is a permanent error.
    Hash,
}

impl Mode {
    /// The mode's name in URLs (`list`, `stream`, `hash`).
    pub fn name(self) -> &'static str {
        match self {
            Mode::List => "list",
            Mode::Stream => "stream",
            Mode::Hash => "hash",
        }
    }
}

/// A configuration that does not parse, naming the parameter at fault
/// (`key`, `mode`, `host`, …); its message starts `redis sink URL:`.
pub type ConfigError = walsink_tokio::UrlError;

fn bad(parameter: &str, reason: impl Into<String>) -> ConfigError {
    ConfigError::new("redis", parameter, reason)
}

/// Where and how a [`RedisSink`](crate::RedisSink) writes.
///
/// Every field has a public default through [`Config::new`]; [`Config::from_url`] parses
/// the `--sink` URL `redis://[USER[:PASSWORD]@]HOST[:PORT][/DB]?key=NAME[&mode=…]…`.
///
/// `Debug` and `Display` never show the password.
#[derive(Clone, PartialEq, Eq)]
pub struct Config {
    /// Host name or address. Default `127.0.0.1`.
    pub host: String,
    /// TCP port. Default 6379.
    pub port: u16,
    /// Database number (`SELECT`). Default 0.
    pub db: i64,
    /// User name for `AUTH`, if any.
    pub username: Option<String>,
    /// Password for `AUTH`, if any. Never shown.
    pub password: Option<String>,
    /// The data key. The text `$subtask` in it is replaced by the subtask number, so
    /// parallel subtasks can write to keys of their own. The commit marker lives in the same
    /// hash slot (see [`Config::marker_key`]).
    pub key: String,
    /// How records are written. Default [`Mode::List`].
    pub mode: Mode,
    /// At most this many records per chunk. Default 1000.
    pub chunk_records: usize,
    /// At most this many record bytes per chunk (a larger single record goes alone).
    /// Default 1 MiB.
    pub chunk_bytes: usize,
    /// Chunks per transaction (`MULTI`/`EXEC`). Default 4. Redis runs a transaction alone,
    /// so it blocks other clients for as long as it takes to apply `in_flight` chunks; one
    /// transaction is in flight while the next is read from the log and packed.
    pub in_flight: usize,
    /// Timeout for connecting (the TLS handshake included) and for each reply. Default 10 s.
    pub timeout: Duration,
    /// TLS settings (`rediss://`); `None` for a plain connection. The certificate files are
    /// read when the sink is made ([`RedisSink::new`](crate::RedisSink::new)).
    pub tls: Option<TlsOptions>,
}

impl Config {
    /// A configuration writing to `key` on `127.0.0.1:6379`, database 0, list mode.
    pub fn new(key: impl Into<String>) -> Self {
        Config {
            host: "127.0.0.1".into(),
            port: 6379,
            db: 0,
            username: None,
            password: None,
            key: key.into(),
            mode: Mode::List,
            chunk_records: 1000,
            chunk_bytes: 1 << 20,
            in_flight: 4,
            timeout: Duration::from_secs(10),
            tls: None,
        }
    }

    /// Sets the mode.
    pub fn mode(mut self, mode: Mode) -> Self {
        self.mode = mode;
        self
    }

    /// Parses `redis://[USER[:PASSWORD]@]HOST[:PORT][/DB]?key=NAME` (or `rediss://…` for
    /// TLS) with the optional parameters `mode=list|stream|hash`, `chunk_records=N`,
    /// `chunk_bytes=B` (`65536`, `1MiB`), `in_flight=N`, `timeout=DURATION` (`500ms`,
    /// `10s`), `password_file=PATH` or `password_env=NAME` (instead of a password in the
    /// URL), and for `rediss://` `ca_file=PATH`, `cert_file=PATH` with `key_file=PATH` (a
    /// client certificate) and `verify=full|ca|none` (default `full`).
    ///
    /// Values are percent-decoded with `+` kept a plus sign (the kit's
    /// [`Params`](walsink_kit::Params) grammar); a parameter given twice or not known is
    /// refused by name.
    pub fn from_url(url: &str) -> Result<Config, ConfigError> {
        let u = url::Url::parse(url).map_err(|e| bad("URL", e.to_string()))?;
        let tls = match u.scheme() {
            "redis" => false,
            "rediss" => true,
            other => return Err(bad("scheme", format!("{other:?} is not redis or rediss"))),
        };
        let host = match u.host_str() {
            Some(h) if !h.is_empty() => h.trim_start_matches('[').trim_end_matches(']'),
            _ => return Err(bad("host", "missing")),
        };
        let mut c = Config::new(String::new());
        c.host = host.to_string();
        c.port = u.port().unwrap_or(6379);
        let decode = |what: &str, s: &str| percent_decode(s).map_err(|e| bad(what, e));
        if !u.username().is_empty() {
            c.username = Some(decode("user", u.username())?);
        }
        let inline = u.password().map(|p| decode("password", p)).transpose()?;
        let path = u.path().trim_matches('/');
        if !path.is_empty() {
            c.db = path
                .parse()
                .ok()
                .filter(|d| *d >= 0)
                .ok_or_else(|| bad("DB", format!("{path:?} is not a database number")))?;
        }
        let mut p = Params::parse("redis", u.query())?;
        let key = p.text("key")?;
        if let Some(m) = p.choice("mode", &["list", "stream", "hash"])? {
            c.mode = [Mode::List, Mode::Stream, Mode::Hash][m];
        }
        if let Some(n) = p.positive("chunk_records")? {
            c.chunk_records = n;
        }
        if let Some(n) = p.size("chunk_bytes")? {
            c.chunk_bytes = usize::try_from(n)
                .ok()
                .filter(|n| *n > 0)
                .ok_or_else(|| bad("chunk_bytes", format!("{n} is not a positive size")))?;
        }
        if let Some(n) = p.positive("in_flight")? {
            c.in_flight = n;
        }
        if let Some(t) = p.duration("timeout")? {
            if t.is_zero() {
                return Err(bad("timeout", "must be a positive duration (10s)"));
            }
            c.timeout = t;
        }
        c.password = secret::resolve(&mut p, inline, "password_file", "password_env")?
            .map(|s| s.expose().to_string());
        if tls {
            let o = TlsOptions {
                ca_file: p.non_empty("ca_file")?.map(PathBuf::from),
                cert_file: p.non_empty("cert_file")?.map(PathBuf::from),
                key_file: p.non_empty("key_file")?.map(PathBuf::from),
                verify: match p.choice("verify", &["full", "ca", "none"])? {
                    None | Some(0) => Verify::Full,
                    Some(1) => Verify::Ca,
                    Some(_) => Verify::None,
                },
            };
            o.check("redis", "cert_file", "key_file")?;
            c.tls = Some(o);
        } else if let Some(name) = TLS_PARAMS.iter().find(|n| p.contains(n)) {
            return Err(bad(
                name,
                "is a TLS setting: use a rediss:// URL to connect over TLS",
            ));
        }
        p.finish_known(KNOWN)?;
        c.key = key.ok_or_else(|| bad("key", "missing: add ?key=NAME"))?;
        c.check()?;
        Ok(c)
    }

    /// Checks the fields that [`Config::from_url`] checks, for a configuration built in code.
    pub fn check(&self) -> Result<(), ConfigError> {
        if self.key.is_empty() {
            return Err(bad("key", "empty"));
        }
        let k = self.key_for(0);
        if hash_tag(&k).contains(['{', '}']) {
            return Err(bad(
                "key",
                format!("{:?} has braces that do not form a hash tag ({{TAG}}): the marker could not share its slot", self.key),
            ));
        }
        if self.chunk_records == 0 || self.chunk_bytes == 0 || self.in_flight == 0 {
            return Err(bad(
                "chunk_records/chunk_bytes/in_flight",
                "must be positive",
            ));
        }
        Ok(())
    }

    /// The data key of `subtask`.
    pub fn key_for(&self, subtask: u32) -> String {
        self.key.replace("$subtask", &subtask.to_string())
    }

    /// The commit-marker key of `(sink_id, subtask)` writing to the data key `KEY` of
    /// `subtask`: the hash `walsink:{TAG}:committed:LEN:KEY:SINK/SUBTASK`, where `TAG` is the
    /// hash tag of `KEY` (or the whole key when it has none), so marker and data share one
    /// hash slot and one transaction can touch both on a cluster, and `LEN` is the length of
    /// `KEY` in bytes, so that no two data keys (`a:b` and `a`, or two keys sharing a tag)
    /// share a marker. Only that sink id and subtask write it, for that key only (see
    /// [`script`](crate::script) for its fields).
    pub fn marker_key(&self, sink_id: &str, subtask: u32) -> String {
        let key = self.key_for(subtask);
        format!(
            "{}:{}:{key}:{}",
            self.old_marker_key(subtask),
            key.len(),
            crate::script::field(sink_id, subtask)
        )
    }

    /// The hash `walsink:{TAG}:committed` in which earlier versions kept the markers of every
    /// sink id and subtask writing to the data key of `subtask`, one field each. It is read
    /// when [`Config::marker_key`] does not exist yet.
    pub fn old_marker_key(&self, subtask: u32) -> String {
        format!("walsink:{{{}}}:committed", hash_tag(&self.key_for(subtask)))
    }

    /// The URL of this configuration with the password replaced by `***`.
    pub fn redacted(&self) -> String {
        let user = match (&self.username, &self.password) {
            (Some(u), Some(_)) => format!("{u}:***@"),
            (None, Some(_)) => ":***@".to_string(),
            (Some(u), None) => format!("{u}@"),
            (None, None) => String::new(),
        };
        let (scheme, verify) = match &self.tls {
            None => ("redis", ""),
            Some(t) => (
                "rediss",
                match t.verify {
                    Verify::Full => "",
                    Verify::Ca => "&verify=ca",
                    Verify::None => "&verify=none",
                },
            ),
        };
        format!(
            "{scheme}://{user}{}:{}/{}?key={}&mode={}{verify}",
            self.host,
            self.port,
            self.db,
            self.key,
            self.mode.name()
        )
    }

    /// The connection URL for the client library (with the password, never shown), always
    /// `redis://`: the sink makes TLS connections itself. User and password are
    /// percent-encoded as the client library decodes them (`+` and spaces reach the server
    /// unchanged).
    pub(crate) fn client_url(&self) -> String {
        let enc = |s: &str| utf8_percent_encode(s, USERINFO).to_string();
        let user = match (&self.username, &self.password) {
            (u, Some(p)) => format!("{}:{}@", enc(u.as_deref().unwrap_or("")), enc(p)),
            (Some(u), None) => format!("{}@", enc(u)),
            (None, None) => String::new(),
        };
        let host = if self.host.contains(':') {
            format!("[{}]", self.host)
        } else {
            self.host.clone()
        };
        format!("redis://{user}{host}:{}/{}", self.port, self.db)
    }
}

/// The part of `key` Redis hashes to pick a cluster slot: the text between the first `{`
/// and the next `}` when that is not empty, else the whole key.
pub fn hash_tag(key: &str) -> &str {
    if let Some(open) = key.find('{') {
        if let Some(len) = key[open + 1..].find('}') {
            if len > 0 {
                return &key[open + 1..open + 1 + len];
            }
        }
    }
    key
}

impl fmt::Debug for Config {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Config")
            .field("url", &self.redacted())
            .field("chunk_records", &self.chunk_records)
            .field("chunk_bytes", &self.chunk_bytes)
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
            "redis://bob:p%40ss@localhost:6380/3?key=orders&mode=hash&chunk_records=10&timeout=2s",
        )
        .unwrap();
        assert_eq!(c.host, "localhost");
        assert_eq!(c.port, 6380);
        assert_eq!(c.db, 3);
        assert_eq!(c.username.as_deref(), Some("bob"));
        assert_eq!(c.password.as_deref(), Some("p@ss"));
        assert_eq!(c.key, "orders");
        assert_eq!(c.mode, Mode::Hash);
        assert_eq!(c.chunk_records, 10);
        assert_eq!(c.timeout, Duration::from_secs(2));
        assert_eq!(c.client_url(), "redis://bob:p%40ss@localhost:6380/3");
    }

    #[test]
    fn defaults_and_errors_name_the_parameter() {
        let c = Config::from_url("redis://127.0.0.1/?key=k").unwrap();
        assert_eq!((c.port, c.db, c.mode), (6379, 0, Mode::List));
        for (url, param) in [
            ("redis://h/", "key"),
            ("redis://h/x?key=k", "DB"),
            ("redis://h/?key=k&mode=set", "mode"),
            ("redis://h/?key=k&chunk_records=0", "chunk_records"),
            ("redis://h/?key=k&timeout=soon", "timeout"),
            ("redis://h/?key=k&colour=red", "colour"),
            ("redis://h/?key=a}b", "key"),
            ("http://h/?key=k", "scheme"),
        ] {
            let e = Config::from_url(url).unwrap_err();
            assert_eq!(e.parameter, param, "{url}: {e}");
        }
    }

    #[test]
    fn passwords_never_show() {
        let c = Config::from_url("redis://:s3cret@h:1/0?key=k").unwrap();
        for shown in [c.to_string(), format!("{c:?}"), c.redacted()] {
            assert!(!shown.contains("s3cret"), "{shown}");
        }
        assert!(c.to_string().contains(":***@"));
    }

    #[test]
    fn the_marker_shares_the_data_keys_slot() {
        assert_eq!(
            Config::new("orders").marker_key("s", 0),
            "walsink:{orders}:committed:6:orders:s/0"
        );
        assert_eq!(
            Config::new("app:{users}:log").marker_key("a{b}", 2),
            "walsink:{users}:committed:15:app:{users}:log:a{b}/2"
        );
        assert_eq!(
            Config::new("out:$subtask").marker_key("s", 3),
            "walsink:{out:3}:committed:5:out:3:s/3"
        );
        // Two keys sharing a tag, under one sink id, have markers of their own.
        assert_ne!(
            Config::new("x:{T}:orders").marker_key("pipe", 0),
            Config::new("x:{T}:payments").marker_key("pipe", 0)
        );
        assert_eq!(
            Config::new("out:$subtask").old_marker_key(3),
            "walsink:{out:3}:committed"
        );
        assert_eq!(hash_tag("a{}b"), "a{}b");
    }
}

#[cfg(test)]
mod url_decoding {
    use super::*;

    /// A URL is not an HTML form: `+` in the password is a plus sign, and `%20` a space.
    #[test]
    fn a_plus_in_the_password_stays_a_plus() {
        let c = Config::from_url("redis://bob:a+b%20c@h/?key=k+1").unwrap();
        assert_eq!(c.password.as_deref(), Some("a+b c"));
        assert_eq!(c.key, "k+1");
        // The client library's URL encodes them so that it decodes them unchanged.
        assert_eq!(c.client_url(), "redis://bob:a%2Bb%20c@h:6379/0");
    }

    #[test]
    fn rediss_takes_the_tls_parameters() {
        let c = Config::from_url(
            "rediss://h:6390/?key=k&ca_file=/ca.pem&cert_file=/c.pem&key_file=/k.pem&verify=ca",
        )
        .unwrap();
        let t = c.tls.clone().unwrap();
        assert_eq!(t.ca_file.as_deref(), Some(std::path::Path::new("/ca.pem")));
        assert_eq!(t.cert_file.as_deref(), Some(std::path::Path::new("/c.pem")));
        assert_eq!(t.key_file.as_deref(), Some(std::path::Path::new("/k.pem")));
        assert_eq!(t.verify, Verify::Ca);
        assert!(c.to_string().starts_with("rediss://h:6390/"), "{c}");
        assert!(c.to_string().ends_with("&verify=ca"), "{c}");
        // The default is verify=full against the public roots.
        let c = Config::from_url("rediss://h/?key=k").unwrap();
        assert_eq!(c.tls, Some(TlsOptions::default()));
        assert_eq!(Config::from_url("redis://h/?key=k").unwrap().tls, None);
    }

    #[test]
    fn tls_parameters_need_rediss_and_a_certificate_needs_its_key() {
        for (url, param) in [
            ("redis://h/?key=k&ca_file=/ca.pem", "ca_file"),
            ("redis://h/?key=k&verify=none", "verify"),
            ("rediss://h/?key=k&verify=maybe", "verify"),
            ("rediss://h/?key=k&cert_file=/c.pem", "key_file"),
            ("rediss://h/?key=k&key_file=/k.pem", "cert_file"),
            ("rediss://h/?key=k&ca_file=", "ca_file"),
            ("redis://h/?key=k&key=j", "key"),
        ] {
            let e = Config::from_url(url).unwrap_err();
            assert_eq!(e.parameter, param, "{url}: {e}");
        }
        let e = Config::from_url("redis://h/?key=k&ca_file=/x").unwrap_err();
        assert!(e.to_string().contains("rediss://"), "{e}");
    }

    #[test]
    fn the_password_comes_from_a_file_or_the_environment_and_never_shows() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("pw");
        std::fs::write(&f, "fi+le pw\n").unwrap();
        let c =
            Config::from_url(&format!("redis://h/?key=k&password_file={}", f.display())).unwrap();
        assert_eq!(c.password.as_deref(), Some("fi+le pw"));
        for shown in [c.to_string(), format!("{c:?}")] {
            assert!(
                !shown.contains("fi+le") && shown.contains(":***@"),
                "{shown}"
            );
        }
        std::env::set_var("WALSINK_REDIS_TEST_PW", "e+nv");
        let c = Config::from_url("redis://u@h/?key=k&password_env=WALSINK_REDIS_TEST_PW").unwrap();
        assert_eq!(c.username.as_deref(), Some("u"));
        assert_eq!(c.password.as_deref(), Some("e+nv"));
        let e =
            Config::from_url("redis://:x@h/?key=k&password_env=WALSINK_REDIS_TEST_PW").unwrap_err();
        assert!(e.to_string().contains("one way only"), "{e}");
        let e = Config::from_url("redis://h/?key=k&password_file=/surely/absent").unwrap_err();
        assert_eq!(e.parameter, "password_file");
        assert!(e.to_string().contains("/surely/absent"), "{e}");
    }
}
