//! [`Config`]: where a [`NatsSink`](crate::NatsSink) publishes, parsed from the command
//! line's `--sink` URL.

use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

use walsink_kit::{params::percent_decode, secret, Params, Secret, TlsOptions, Verify};

/// A configuration that does not parse, naming the parameter at fault
/// (`stream`, `subject`, `host`, …); its message starts `nats sink URL:`.
pub type ConfigError = walsink_tokio::UrlError;

fn bad(parameter: &str, reason: impl Into<String>) -> ConfigError {
    ConfigError::new("nats", parameter, reason)
}

/// The parameters [`Config::from_url`] takes, for the message about an unknown one.
const KNOWN: &[&str] = &[
    "stream",
    "subject",
    "create",
    "in_flight",
    "timeout",
    "tls",
    "ca_file",
    "cert_file",
    "key_file",
    "verify",
    "password_file",
    "password_env",
    "token_file",
    "token_env",
];

/// Where and how a [`NatsSink`](crate::NatsSink) publishes.
///
/// [`Config::from_url`] parses
/// `nats://[USER:PASSWORD@|TOKEN@]HOST[:PORT]/?stream=NAME&subject=SUBJECT[&…]` (and
/// `tls://…` for TLS). `Debug` and `Display` never show the password or the token.
#[derive(Clone, PartialEq, Eq)]
pub struct Config {
    /// Host name or address. Default `127.0.0.1`. Over TLS, the name the server's
    /// certificate must carry (with [`Verify::Full`]).
    pub host: String,
    /// TCP port. Default 4222.
    pub port: u16,
    /// User name, with [`Config::password`].
    pub user: Option<String>,
    /// Password (from the URL, `password_file=` or `password_env=`). Never shown.
    pub password: Option<Secret>,
    /// Token (`nats://TOKEN@HOST`, `token_file=` or `token_env=`). Never shown.
    pub token: Option<Secret>,
    /// TLS settings: `Some` connects over TLS only (a server without TLS is refused), with
    /// the server's certificate verified as [`TlsOptions::verify`] says. `None` connects in
    /// plain text, unless the server demands TLS (then the certificate is verified against
    /// the Mozilla roots, host name included). Default `None`.
    pub tls: Option<TlsOptions>,
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
            tls: None,
            stream: stream.into(),
            subject: subject.into(),
            create: false,
            in_flight: 1024,
            timeout: Duration::from_secs(10),
        }
    }

    /// Parses `nats://[USER:PASSWORD@|TOKEN@]HOST[:PORT]/?stream=NAME&subject=SUBJECT` with
    /// the optional parameters `create=BOOL`, `in_flight=N`, `timeout=DURATION`; TLS with
    /// `tls://HOST…` or `tls=true`, `ca_file=PATH`, `cert_file=PATH` with `key_file=PATH`
    /// and `verify=full|ca|none` (any of them turns TLS on); the password from
    /// `password_file=PATH` or `password_env=VAR` (the user name stays in the URL:
    /// `nats://USER@HOST/?password_file=…`) and the token from `token_file=PATH` or
    /// `token_env=VAR`. Values are percent-decoded, `+` staying a plus sign
    /// ([`walsink_kit::params`]); a parameter given twice or not known is refused by name.
    pub fn from_url(url: &str) -> Result<Config, ConfigError> {
        let u = url::Url::parse(url).map_err(|e| bad("URL", e.to_string()))?;
        let tls_scheme = match u.scheme() {
            "nats" => false,
            "tls" => true,
            other => return Err(bad("scheme", format!("{other:?} is not nats or tls"))),
        };
        let host = match u.host_str() {
            Some(h) if !h.is_empty() => h.trim_start_matches('[').trim_end_matches(']'),
            _ => return Err(bad("host", "missing")),
        };
        let mut c = Config::new(String::new(), String::new());
        c.host = host.to_string();
        c.port = u.port().unwrap_or(4222);
        if !u.path().trim_matches('/').is_empty() {
            return Err(bad(
                "path",
                "nats URLs take no path: use /?stream=NAME&subject=SUBJECT",
            ));
        }
        let mut p = Params::parse("nats", u.query())?;
        // The user info is percent-decoded with `+` kept (the error never shows it).
        let decode = |part: &str, s: &str| percent_decode(s).map_err(|e| bad(part, e)).map(Some);
        let url_user = match u.username() {
            "" => None,
            s => decode("user", s)?,
        };
        let url_password = match u.password() {
            None => None,
            Some(s) => decode("password", s)?,
        };
        c.auth(&mut p, url_user, url_password)?;
        c.stream = p
            .non_empty("stream")?
            .ok_or_else(|| bad("stream", "missing: add ?stream=NAME"))?;
        c.subject = p
            .non_empty("subject")?
            .ok_or_else(|| bad("subject", "missing: add &subject=SUBJECT"))?;
        if let Some(v) = p.bool("create")? {
            c.create = v;
        }
        if let Some(n) = p.positive::<usize>("in_flight")? {
            c.in_flight = n;
        }
        if let Some(t) = p.duration("timeout")? {
            if t.is_zero() {
                return Err(bad("timeout", "must be positive (10s)"));
            }
            c.timeout = t;
        }
        c.tls = tls_options(&mut p, tls_scheme)?;
        p.finish_known(KNOWN)?;
        c.check()?;
        Ok(c)
    }

    /// Takes the credentials: a user with a password (in the URL or from `password_file` /
    /// `password_env`) or a token (`TOKEN@` in the URL or from `token_file` / `token_env`).
    fn auth(
        &mut self,
        p: &mut Params,
        url_user: Option<String>,
        url_password: Option<String>,
    ) -> Result<(), ConfigError> {
        let password_elsewhere = p.contains("password_file") || p.contains("password_env");
        let token_param = ["token_file", "token_env"]
            .into_iter()
            .find(|n| p.contains(n));
        let token_elsewhere = token_param.is_some();
        if let (true, Some(token_param)) = (password_elsewhere, token_param) {
            return Err(bad(
                token_param,
                "give a user and password or a token, not both",
            ));
        }
        if token_elsewhere {
            if url_password.is_some() {
                return Err(bad(
                    "token_file",
                    "a token replaces the user and password: drop USER:PASSWORD@ from the URL",
                ));
            }
            if url_user.is_some() {
                return Err(bad(
                    "token_file",
                    "give the token one way only, not in the URL (TOKEN@HOST) and in a file or variable",
                ));
            }
            self.token = secret::resolve(p, None, "token_file", "token_env")?;
            return Ok(());
        }
        match (url_user, url_password) {
            (None, None) => {}
            (user, Some(pw)) => {
                self.user = Some(user.unwrap_or_default());
                self.password = secret::resolve(p, Some(pw), "password_file", "password_env")?;
            }
            (Some(user), None) if password_elsewhere => {
                self.user = Some(user);
                self.password = secret::resolve(p, None, "password_file", "password_env")?;
            }
            (Some(token), None) => self.token = Some(Secret::new(token)),
        }
        if password_elsewhere && self.user.is_none() {
            return Err(bad(
                "password_file",
                "a password needs its user name: nats://USER@HOST/?password_file=PATH",
            ));
        }
        Ok(())
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

    /// The URL of this configuration with the password and token replaced by `***`
    /// (`tls://` when it connects over TLS).
    pub fn redacted(&self) -> String {
        let auth = match (&self.user, &self.password, &self.token) {
            (Some(u), Some(_), _) => format!("{u}:***@"),
            (_, _, Some(_)) => "***@".to_string(),
            _ => String::new(),
        };
        format!(
            "{}://{auth}{}:{}/?stream={}&subject={}",
            if self.tls.is_some() { "tls" } else { "nats" },
            self.host,
            self.port,
            self.stream,
            self.subject
        )
    }
}

/// The TLS settings of a URL: `None` for plain text, `Some` when the scheme is `tls`,
/// `tls=true`, or any TLS parameter is given (`tls=false` with one is refused).
fn tls_options(p: &mut Params, tls_scheme: bool) -> Result<Option<TlsOptions>, ConfigError> {
    let flag = p.bool("tls")?;
    let path = |p: &mut Params, name: &str| -> Result<Option<PathBuf>, ConfigError> {
        Ok(p.non_empty(name)?.map(PathBuf::from))
    };
    let verify_given = p.contains("verify");
    let opts = TlsOptions {
        ca_file: path(p, "ca_file")?,
        cert_file: path(p, "cert_file")?,
        key_file: path(p, "key_file")?,
        verify: match p.choice("verify", &["full", "ca", "none"])? {
            None | Some(0) => Verify::Full,
            Some(1) => Verify::Ca,
            Some(_) => Verify::None,
        },
    };
    opts.check("nats", "cert_file", "key_file")?;
    let settings_given = opts != TlsOptions::default() || verify_given;
    match flag {
        Some(false) if tls_scheme => Err(bad("tls", "tls://… is TLS: drop tls=false")),
        Some(false) if settings_given => Err(bad(
            "tls",
            "is false, yet TLS settings (ca_file, cert_file, key_file, verify) are given: drop tls=false",
        )),
        Some(false) => Ok(None),
        Some(true) => Ok(Some(opts)),
        None if tls_scheme || settings_given => Ok(Some(opts)),
        None => Ok(None),
    }
}

impl fmt::Debug for Config {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Config")
            .field("url", &self.redacted())
            .field("tls", &self.tls)
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
    fn a_token_beside_a_password_names_the_token_parameter_given() {
        let e =
            Config::from_url("nats://u@h:4222/?stream=s&subject=x&password_file=/p&token_env=T")
                .unwrap_err();
        assert_eq!(e.parameter, "token_env", "{e}");
    }

    #[test]
    fn a_full_url_parses() {
        let c = Config::from_url(
            "nats://bob:p%40ss@localhost:4223/?stream=ORDERS&subject=orders.in&create=true&in_flight=8&timeout=2s",
        )
        .unwrap();
        assert_eq!((c.host.as_str(), c.port), ("localhost", 4223));
        assert_eq!(c.user.as_deref(), Some("bob"));
        assert_eq!(c.password.as_ref().map(Secret::expose), Some("p@ss"));
        assert_eq!(
            (c.stream.as_str(), c.subject.as_str()),
            ("ORDERS", "orders.in")
        );
        assert!(c.create);
        assert_eq!((c.in_flight, c.timeout), (8, Duration::from_secs(2)));
        let t = Config::from_url("nats://s3cret@h/?stream=S&subject=a").unwrap();
        assert_eq!(t.token.as_ref().map(Secret::expose), Some("s3cret"));
        assert_eq!(t.port, 4222);
    }

    /// `+` in a password is a plus sign: URL user info and query strings are not HTML forms
    /// (form decoding turned it into a space, so the server refused the password).
    #[test]
    fn a_plus_in_the_password_or_a_parameter_stays_a_plus() {
        let c = Config::from_url("nats://bob:a+b%2Bc@h/?stream=S&subject=a").unwrap();
        assert_eq!(c.password.as_ref().map(Secret::expose), Some("a+b+c"));
        let t = Config::from_url("nats://to+ken@h/?stream=S&subject=a").unwrap();
        assert_eq!(t.token.as_ref().map(Secret::expose), Some("to+ken"));
    }

    #[test]
    fn tls_is_the_scheme_a_flag_or_implied_by_its_settings() {
        let plain = Config::from_url("nats://h/?stream=S&subject=a").unwrap();
        assert_eq!(plain.tls, None);
        let t = Config::from_url("tls://h:4443/?stream=S&subject=a").unwrap();
        assert_eq!(t.tls, Some(TlsOptions::default()));
        assert_eq!(
            t.tls.as_ref().unwrap().verify,
            Verify::Full,
            "verify-full by default"
        );
        assert!(t.to_string().starts_with("tls://h:4443/"), "{t}");
        let f = Config::from_url("nats://h/?stream=S&subject=a&tls=true").unwrap();
        assert_eq!(f.tls, Some(TlsOptions::default()));
        let c = Config::from_url(
            "nats://h/?stream=S&subject=a&ca_file=/ca%20dir/ca.pem&cert_file=/c.pem&key_file=/k.pem&verify=CA",
        )
        .unwrap();
        let o = c.tls.unwrap();
        assert_eq!(
            o.ca_file.as_deref(),
            Some(std::path::Path::new("/ca dir/ca.pem"))
        );
        assert_eq!(o.cert_file.as_deref(), Some(std::path::Path::new("/c.pem")));
        assert_eq!(o.key_file.as_deref(), Some(std::path::Path::new("/k.pem")));
        assert_eq!(o.verify, Verify::Ca);
        let n = Config::from_url("nats://h/?stream=S&subject=a&verify=none").unwrap();
        assert_eq!(n.tls.unwrap().verify, Verify::None);
        for (url, param) in [
            ("nats://h/?stream=S&subject=a&verify=strict", "verify"),
            ("nats://h/?stream=S&subject=a&cert_file=/c.pem", "key_file"),
            ("nats://h/?stream=S&subject=a&key_file=/k.pem", "cert_file"),
            (
                "nats://h/?stream=S&subject=a&tls=false&ca_file=/ca.pem",
                "tls",
            ),
            ("tls://h/?stream=S&subject=a&tls=false", "tls"),
            ("nats://h/?stream=S&subject=a&tls=sometimes", "tls"),
            ("nats://h/?stream=S&subject=a&ca_file=", "ca_file"),
        ] {
            let e = Config::from_url(url).unwrap_err();
            assert_eq!(e.parameter, param, "{url}: {e}");
        }
    }

    #[test]
    fn passwords_and_tokens_come_from_files_and_the_environment() {
        let dir = tempfile::tempdir().unwrap();
        let pw = dir.path().join("pw");
        std::fs::write(&pw, "p+w from file\n").unwrap();
        let c = Config::from_url(&format!(
            "nats://bob@h/?stream=S&subject=a&password_file={}",
            pw.display()
        ))
        .unwrap();
        assert_eq!(c.user.as_deref(), Some("bob"));
        assert_eq!(
            c.password.as_ref().map(Secret::expose),
            Some("p+w from file")
        );
        assert_eq!(c.token, None);
        let t = Config::from_url(&format!(
            "nats://h/?stream=S&subject=a&token_file={}",
            pw.display()
        ))
        .unwrap();
        assert_eq!(t.token.as_ref().map(Secret::expose), Some("p+w from file"));
        assert_eq!((t.user, t.password), (None, None));
        // A variable name unique to this test (tests run in threads of one process).
        let var = format!("WALSINK_NATS_CONFIG_TEST_{}", std::process::id());
        std::env::set_var(&var, "from-env");
        let e = Config::from_url(&format!(
            "nats://bob@h/?stream=S&subject=a&password_env={var}"
        ))
        .unwrap();
        assert_eq!(e.password.as_ref().map(Secret::expose), Some("from-env"));
        let t = Config::from_url(&format!("nats://h/?stream=S&subject=a&token_env={var}")).unwrap();
        assert_eq!(t.token.as_ref().map(Secret::expose), Some("from-env"));
        for shown in [
            c.to_string(),
            format!("{c:?}"),
            t.to_string(),
            format!("{t:?}"),
        ] {
            assert!(!shown.contains("from") && shown.contains("***"), "{shown}");
        }
        for (url, param) in [
            (
                format!("nats://h/?stream=S&subject=a&password_env={var}"),
                "password_file",
            ),
            (
                format!("nats://bob:inline@h/?stream=S&subject=a&password_env={var}"),
                "password_env",
            ),
            (
                format!("nats://tok@h/?stream=S&subject=a&token_env={var}"),
                "token_file",
            ),
            (
                format!("nats://u:p@h/?stream=S&subject=a&token_env={var}"),
                "token_file",
            ),
            (
                format!("nats://u@h/?stream=S&subject=a&token_env={var}&password_env={var}"),
                "token_env",
            ),
            (
                "nats://u@h/?stream=S&subject=a&password_env=WALSINK_NATS_SURELY_UNSET".into(),
                "password_env",
            ),
            (
                "nats://u@h/?stream=S&subject=a&password_file=/nonexistent/pw".into(),
                "password_file",
            ),
        ] {
            let e = Config::from_url(&url).unwrap_err();
            assert_eq!(e.parameter, param, "{url}: {e}");
            assert!(
                !e.to_string().contains("inline") && !e.to_string().contains("from-env"),
                "{e}"
            );
        }
        std::env::remove_var(&var);
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
            ("nats://h/?stream=S&subject=a&in_flight=0", "in_flight"),
            ("nats://h/?stream=S&subject=a&timeout=0s", "timeout"),
            ("nats://h/?stream=S&stream=T&subject=a", "stream"),
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
