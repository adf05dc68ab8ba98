//! [`Config`]: where and how epochs are POSTed, parsed from the `--sink` URL.
//!
//! ```text
//! http[s]://[USER[:PASSWORD]@]HOST[:PORT]/PATH?max_records=N&max_bytes=B&timeout=5s
//!     &concurrency=N&gzip=true&newline=reject|escape&retries=N&retry_after_max=30s
//!     &content_type=TYPE&bearer_env=VAR|bearer_file=PATH&password_file=PATH|password_env=VAR
//!     &ca_file=PATH&cert_file=PATH&key_file=PATH&verify=full|ca|none
//! ```
//!
//! The parameters are walsink's and are taken off the URL; the request goes to
//! `http[s]://HOST[:PORT]/PATH`. An unknown parameter is an error naming it (a typo never
//! passes silently), so the endpoint's URL cannot carry a query string of its own.
//! Credentials never show: the [`Display`](std::fmt::Display) and `Debug` forms mask the
//! password, and a bearer token is read from the environment variable named by
//! `bearer_env` or the file named by `bearer_file`, never from the URL. Parameter values
//! are percent-decoded with `+` kept a plus sign ([`walsink_kit::params`]).

use crate::chunking::Newline;
use std::fmt;
use std::path::PathBuf;
use std::time::Duration;
use walsink_kit::{secret, Params, TlsOptions, Verify};

/// The parameters [`Config::from_url`] takes, for the message about an unknown one.
const KNOWN: &[&str] = &[
    "max_records",
    "max_bytes",
    "timeout",
    "concurrency",
    "gzip",
    "newline",
    "retries",
    "retry_after_max",
    "content_type",
    "bearer_env",
    "bearer_file",
    "password_file",
    "password_env",
    "ca_file",
    "cert_file",
    "key_file",
    "verify",
];

/// Default [`Config::max_records`].
pub const DEFAULT_MAX_RECORDS: usize = 1000;
/// Default [`Config::max_bytes`]: 1 MiB.
pub const DEFAULT_MAX_BYTES: usize = 1 << 20;
/// Default [`Config::timeout`].
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);
/// Default [`Config::retries`].
pub const DEFAULT_RETRIES: u32 = 3;
/// Default [`Config::retry_after_max`].
pub const DEFAULT_RETRY_AFTER_MAX: Duration = Duration::from_secs(30);
/// Default [`Config::content_type`].
pub const DEFAULT_CONTENT_TYPE: &str = "application/x-ndjson";

/// The configuration of an [`HttpSink`](crate::HttpSink).
///
/// The chunking fields (`max_records`, `max_bytes`, `newline`) decide the bodies sent under
/// each `Idempotency-Key`: they must not change between a crash and the replay of the epochs
/// it left undelivered, or a replayed key carries other records (see the crate docs).
#[derive(Clone)]
pub struct Config {
    /// Where chunks are POSTed: the URL without credentials and without walsink's
    /// parameters.
    pub endpoint: url::Url,
    /// HTTP basic credentials from the URL's user info (the password never shows).
    pub basic: Option<(String, Option<String>)>,
    /// Name of an environment variable holding a bearer token, sent as
    /// `Authorization: Bearer TOKEN` (read when the sink is made; never shown).
    pub bearer_env: Option<String>,
    /// A file holding the bearer token (its text without one trailing newline, read when
    /// the sink is made; never shown). At most one of `bearer_env` and `bearer_file`.
    pub bearer_file: Option<PathBuf>,
    /// Most records in one request (default 1000).
    pub max_records: usize,
    /// Most body bytes in one request before compression (default 1 MiB). A single record
    /// larger than this goes alone in a request of its own.
    pub max_bytes: usize,
    /// Time for one request, from connecting to the end of the response (default 30 s).
    pub timeout: Duration,
    /// Chunks of one epoch in flight at once (default 1: chunks arrive in order). Epochs
    /// never overlap: the next starts after every chunk of the last was acknowledged.
    pub concurrency: usize,
    /// Compress each body with gzip (`Content-Encoding: gzip`; default off).
    pub gzip: bool,
    /// What a record holding a newline does (default [`Newline::Reject`]).
    pub newline: Newline,
    /// Retries of one chunk inside one delivery before the delivery fails and the committer
    /// retries the epoch with its own backoff (default 3).
    pub retries: u32,
    /// The longest `Retry-After` honoured; a longer one is cut to this (default 30 s).
    pub retry_after_max: Duration,
    /// The `Content-Type` of each request (default `application/x-ndjson`).
    pub content_type: String,
    /// A PEM file of extra root certificates to trust for `https` (a private CA), in
    /// addition to the Mozilla roots.
    pub ca_file: Option<PathBuf>,
    /// A PEM file of the client certificate chain, for a receiver that asks for one (with
    /// [`Config::key_file`]).
    pub cert_file: Option<PathBuf>,
    /// The client certificate's private key (PEM: PKCS#8, PKCS#1 or SEC1).
    pub key_file: Option<PathBuf>,
    /// How much of the receiver's certificate is checked (default [`Verify::Full`]: the
    /// chain and the host name; the recommended setting).
    pub verify: Verify,
}

/// A bad `--sink` URL: the kit's one error of every target ([`walsink_kit::ConfigError`]):
/// `parameter` names the parameter at fault (`URL` for the URL itself) and the message never
/// holds a credential.
pub use walsink_kit::ConfigError;

fn param(name: &str, reason: impl Into<String>) -> ConfigError {
    ConfigError::new("http", name, reason)
}

impl Config {
    /// A configuration POSTing to `endpoint` (an `http` or `https` URL without query) with
    /// every default.
    pub fn new(endpoint: url::Url) -> Config {
        Config {
            endpoint,
            basic: None,
            bearer_env: None,
            bearer_file: None,
            max_records: DEFAULT_MAX_RECORDS,
            max_bytes: DEFAULT_MAX_BYTES,
            timeout: DEFAULT_TIMEOUT,
            concurrency: 1,
            gzip: false,
            newline: Newline::Reject,
            retries: DEFAULT_RETRIES,
            retry_after_max: DEFAULT_RETRY_AFTER_MAX,
            content_type: DEFAULT_CONTENT_TYPE.to_string(),
            ca_file: None,
            cert_file: None,
            key_file: None,
            verify: Verify::Full,
        }
    }

    /// Parses a `--sink` URL (see the module docs). Errors name the bad parameter and never
    /// hold the password.
    pub fn from_url(text: &str) -> Result<Config, ConfigError> {
        let mut url = url::Url::parse(text)
            .map_err(|e| param("URL", format!("{e} (in {})", walsink::redact_url(text))))?;
        if !matches!(url.scheme(), "http" | "https") {
            return Err(param(
                "URL",
                format!("scheme {:?} is not http or https", url.scheme()),
            ));
        }
        if url.host_str().is_none_or(str::is_empty) {
            return Err(param(
                "URL",
                format!("no host in {}", walsink::redact_url(text)),
            ));
        }
        let url_basic = (!url.username().is_empty() || url.password().is_some()).then(|| {
            let user = percent_decode(url.username());
            (user, url.password().map(percent_decode))
        });
        let _ = url.set_username("");
        let _ = url.set_password(None);
        let query = url.query().map(str::to_owned);
        let mut p = Params::parse("http", query.as_deref())?;
        url.set_query(None);
        url.set_fragment(None);
        for name in ["token", "bearer", "password", "authorization"] {
            if p.contains(name) {
                return Err(param(
                    name,
                    "secrets do not go in the URL (it shows in process lists and shell history): put the token in a file or an environment variable and name it with bearer_file=PATH or bearer_env=VAR",
                ));
            }
        }
        let mut c = Config::new(url);
        if let Some(v) = p.text("max_records")? {
            c.max_records = positive("max_records", &v)?;
        }
        if let Some(v) = p.text("max_bytes")? {
            c.max_bytes = bytes("max_bytes", &v)?;
        }
        if let Some(v) = p.text("timeout")? {
            c.timeout = duration("timeout", &v)?;
        }
        if let Some(v) = p.text("concurrency")? {
            c.concurrency = positive("concurrency", &v)?;
            if c.concurrency > 256 {
                return Err(param("concurrency", "at most 256 chunks in flight"));
            }
        }
        if let Some(v) = p.text("gzip")? {
            c.gzip = boolean("gzip", &v)?;
        }
        if let Some(v) = p.text("newline")? {
            c.newline = match v.as_str() {
                "reject" => Newline::Reject,
                "escape" => Newline::Escape,
                _ => return Err(param("newline", format!("{v:?} is not reject or escape"))),
            }
        }
        if let Some(v) = p.text("retries")? {
            c.retries = v
                .parse()
                .map_err(|_| param("retries", format!("{v:?} is not a count")))?;
        }
        if let Some(v) = p.text("retry_after_max")? {
            c.retry_after_max = duration("retry_after_max", &v)?;
        }
        if let Some(v) = p.text("content_type")? {
            if v.is_empty() || !v.bytes().all(|b| (0x20..0x7f).contains(&b)) {
                return Err(param("content_type", "must be printable ASCII"));
            }
            c.content_type = v;
        }
        c.bearer_env = p.non_empty("bearer_env")?;
        c.bearer_file = p.non_empty("bearer_file")?.map(PathBuf::from);
        if c.bearer_env.is_some() && c.bearer_file.is_some() {
            return Err(param(
                "bearer_file",
                "give the token one way only, not bearer_file and bearer_env",
            ));
        }
        c.ca_file = p.non_empty("ca_file")?.map(PathBuf::from);
        c.cert_file = p.non_empty("cert_file")?.map(PathBuf::from);
        c.key_file = p.non_empty("key_file")?.map(PathBuf::from);
        if let Some(v) = p.choice("verify", &["full", "ca", "none"])? {
            c.verify = [Verify::Full, Verify::Ca, Verify::None][v];
        }
        c.tls().check("http", "cert_file", "key_file")?;
        let password_elsewhere = p.contains("password_file") || p.contains("password_env");
        let (user, inline) = match url_basic {
            Some((u, pw)) => (Some(u), pw),
            None => (None, None),
        };
        if password_elsewhere && user.is_none() {
            return Err(param(
                "password_file",
                "a password needs its user name: https://USER@HOST/…?password_file=PATH",
            ));
        }
        let password = secret::resolve(&mut p, inline, "password_file", "password_env")?;
        c.basic = user.map(|u| (u, password.map(|s| s.expose().to_string())));
        p.finish_known(KNOWN)?;
        Ok(c)
    }

    /// The TLS settings for `https`: [`Config::ca_file`], the client certificate and
    /// [`Config::verify`], in the kit's form.
    pub fn tls(&self) -> TlsOptions {
        TlsOptions {
            ca_file: self.ca_file.clone(),
            cert_file: self.cert_file.clone(),
            key_file: self.key_file.clone(),
            verify: self.verify,
        }
    }

    /// The chunking settings, as sent in the `Walsink-Chunk` header so a receiver can see
    /// that they changed.
    pub fn chunking(&self) -> crate::chunking::Chunking {
        crate::chunking::Chunking {
            max_records: self.max_records,
            max_bytes: self.max_bytes,
            newline: self.newline,
        }
    }
}

/// The endpoint with the user name and a masked password, for messages.
impl fmt::Display for Config {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut u = self.endpoint.clone();
        if let Some((user, pw)) = &self.basic {
            let _ = u.set_username(user);
            if pw.is_some() {
                let _ = u.set_password(Some("***"));
            }
        }
        write!(f, "{u}")
    }
}

impl fmt::Debug for Config {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Config")
            .field("endpoint", &self.to_string())
            .field("bearer_env", &self.bearer_env)
            .field("max_records", &self.max_records)
            .field("max_bytes", &self.max_bytes)
            .field("timeout", &self.timeout)
            .field("concurrency", &self.concurrency)
            .field("gzip", &self.gzip)
            .field("newline", &self.newline)
            .field("retries", &self.retries)
            .field("retry_after_max", &self.retry_after_max)
            .field("content_type", &self.content_type)
            .field("bearer_file", &self.bearer_file)
            .field("ca_file", &self.ca_file)
            .field("cert_file", &self.cert_file)
            .field("key_file", &self.key_file)
            .field("verify", &self.verify)
            .finish()
    }
}

/// `text` with a URL password replaced by `***` (for errors about text that did not parse).
/// Percent-decodes a user name or password as `url` leaves them (lenient: a stray `%` stays).
fn percent_decode(s: &str) -> String {
    percent_encoding::percent_decode_str(s)
        .decode_utf8_lossy()
        .into_owned()
}

fn positive(name: &str, v: &str) -> Result<usize, ConfigError> {
    match v.parse::<usize>() {
        Ok(n) if n > 0 => Ok(n),
        _ => Err(param(name, format!("{v:?} is not a positive number"))),
    }
}

fn boolean(name: &str, v: &str) -> Result<bool, ConfigError> {
    walsink_kit::params::parse_bool(v).map_err(|e| param(name, e))
}

/// A positive duration of at most a day, in the kit's grammar (`5s`, `500ms`, `1h30m`).
fn duration(name: &str, v: &str) -> Result<Duration, ConfigError> {
    let d = walsink_kit::params::parse_duration(v).map_err(|e| param(name, e))?;
    if d.is_zero() {
        return Err(param(name, "must be positive"));
    }
    if d > Duration::from_secs(24 * 3600) {
        return Err(param(name, format!("{v:?} is longer than a day")));
    }
    Ok(d)
}

/// A positive byte count of at most 1 GiB, in the kit's grammar (`1000`, `64KiB`, `1MB`).
fn bytes(name: &str, v: &str) -> Result<usize, ConfigError> {
    match walsink_kit::params::parse_size(v).map_err(|e| param(name, e))? {
        0 => Err(param(name, "must be positive")),
        b if b <= 1 << 30 => Ok(b as usize),
        _ => Err(param(name, format!("{v:?} is more than 1GiB"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parameters_parse_and_leave_the_endpoint_bare() {
        let c = Config::from_url(
            "https://u:p%40ss@example.test:8443/in/gest?max_records=10&max_bytes=64KiB&timeout=500ms&concurrency=4&gzip=true&newline=escape&retries=0&retry_after_max=2s&bearer_env=TOK",
        )
        .unwrap();
        assert_eq!(c.endpoint.as_str(), "https://example.test:8443/in/gest");
        assert_eq!(c.basic, Some(("u".into(), Some("p@ss".into()))));
        assert_eq!((c.max_records, c.max_bytes), (10, 64 << 10));
        assert_eq!(c.timeout, Duration::from_millis(500));
        assert_eq!(
            (c.concurrency, c.gzip, c.newline),
            (4, true, Newline::Escape)
        );
        assert_eq!((c.retries, c.retry_after_max), (0, Duration::from_secs(2)));
        assert_eq!(c.bearer_env.as_deref(), Some("TOK"));
        let d = Config::from_url("http://h/").unwrap();
        assert_eq!(
            (d.max_records, d.max_bytes, d.timeout),
            (1000, 1 << 20, DEFAULT_TIMEOUT)
        );
        assert_eq!(
            (d.concurrency, d.gzip, d.newline),
            (1, false, Newline::Reject)
        );
    }

    /// `+` in a parameter is a plus sign (query strings are not HTML forms): form decoding
    /// sent `application/vnd.api json` and looked for a CA file that does not exist.
    #[test]
    fn a_plus_in_a_parameter_stays_a_plus() {
        let c = Config::from_url(
            "https://h/?content_type=application/vnd.api+json&ca_file=/etc/a+b.pem",
        )
        .unwrap();
        assert_eq!(c.content_type, "application/vnd.api+json");
        assert_eq!(c.ca_file, Some(PathBuf::from("/etc/a+b.pem")));
    }

    #[test]
    fn tls_and_secret_parameters_parse() {
        let c = Config::from_url(
            "https://h/?ca_file=/ca.pem&cert_file=/c.pem&key_file=/k.pem&verify=ca&bearer_file=/tok",
        )
        .unwrap();
        let t = c.tls();
        assert_eq!(t.ca_file, Some(PathBuf::from("/ca.pem")));
        assert_eq!(t.cert_file, Some(PathBuf::from("/c.pem")));
        assert_eq!(t.key_file, Some(PathBuf::from("/k.pem")));
        assert_eq!(t.verify, Verify::Ca);
        assert_eq!(c.bearer_file, Some(PathBuf::from("/tok")));
        assert_eq!(Config::from_url("https://h/").unwrap().verify, Verify::Full);
        let dir = tempfile::tempdir().unwrap();
        let pw = dir.path().join("pw");
        std::fs::write(&pw, "p+w\n").unwrap();
        let c =
            Config::from_url(&format!("https://alice@h/?password_file={}", pw.display())).unwrap();
        assert_eq!(c.basic, Some(("alice".into(), Some("p+w".into()))));
        assert!(!format!("{c:?}{c}").contains("p+w"));
        for (url, name) in [
            ("https://h/?cert_file=/c.pem", "key_file"),
            ("https://h/?key_file=/k.pem", "cert_file"),
            ("https://h/?verify=maybe", "verify"),
            ("https://h/?bearer_env=T&bearer_file=/t", "bearer_file"),
            ("https://h/?password_env=T", "password_file"),
            ("https://a:b@h/?password_env=T", "password_env"),
            (
                "https://a@h/?password_file=/nonexistent/pw",
                "password_file",
            ),
            ("https://h/?ca_file=", "ca_file"),
        ] {
            match Config::from_url(url) {
                Err(e) => assert_eq!(e.parameter, name, "{url}: {e}"),
                other => panic!("{url}: {other:?}"),
            }
        }
    }

    #[test]
    fn bad_parameters_are_named() {
        for (url, name) in [
            ("http://h/?max_record=1", "max_record"),
            ("http://h/?max_records=0", "max_records"),
            ("http://h/?max_bytes=2GiB", "max_bytes"),
            ("http://h/?timeout=5", "timeout"),
            ("http://h/?timeout=5x", "timeout"),
            ("http://h/?gzip=maybe", "gzip"),
            ("http://h/?newline=drop", "newline"),
            ("http://h/?concurrency=1000", "concurrency"),
            ("http://h/?timeout=1s&timeout=2s", "timeout"),
            ("http://h/?token=abc", "token"),
        ] {
            match Config::from_url(url) {
                Err(e) => assert_eq!(e.parameter, name, "{url}: {e}"),
                other => panic!("{url}: {other:?}"),
            }
        }
        assert!(matches!(
            Config::from_url("ftp://h/"),
            Err(e) if e.parameter == "URL"
        ));
    }

    #[test]
    fn passwords_never_show() {
        let c = Config::from_url("http://alice:s3cret@h:1/p?bearer_env=T").unwrap();
        assert_eq!(c.to_string(), "http://alice:***@h:1/p");
        assert!(!format!("{c:?}").contains("s3cret"));
        let e = Config::from_url("http://alice:s3cret@h:99999/p").unwrap_err();
        assert!(!e.to_string().contains("s3cret"), "{e}");
        let e = Config::from_url("http://alice:s3cret@h/p?nope=1").unwrap_err();
        assert!(!e.to_string().contains("s3cret"), "{e}");
    }
}
