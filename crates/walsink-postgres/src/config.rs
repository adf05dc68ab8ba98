//! [`Config`]: where and how to deliver, parsed from the `--sink` URL.

use crate::error::ConfigError;
use crate::marker::MarkerTable;
use crate::table::TableName;
pub use crate::tls::SslMode;
use std::fmt;
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::time::Duration;

/// How an epoch is committed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// One transaction per epoch: the rows by COPY and the commit marker, committed together
    /// (`mode=marker`, the default).
    Marker,
    /// The same transaction, prepared with `PREPARE TRANSACTION` under a deterministic global
    /// id and then committed with `COMMIT PREPARED` (`mode=2pc`; the server needs
    /// `max_prepared_transactions > 0`).
    TwoPhase,
}

/// The default age of a prepared transaction past which the sink warns.
pub const DEFAULT_PREPARED_WARN_AFTER: Duration = Duration::from_secs(300);

/// How long setting up a connection may take at most when the URL gives no
/// `connect_timeout`: the TCP connect, the start-up handshake and the session settings.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// The default longest wait of one statement for a lock (`lock_timeout`): past it the
/// statement fails with 55P03, a retryable error, and the delivery is tried again.
pub const DEFAULT_LOCK_TIMEOUT: Duration = Duration::from_secs(5);

/// The default longest time a session of the sink may sit idle inside a transaction before
/// the server ends it (`idle_in_transaction_timeout`, PostgreSQL's
/// `idle_in_transaction_session_timeout`).
pub const DEFAULT_IDLE_IN_TRANSACTION_TIMEOUT: Duration = Duration::from_secs(60);

/// The query parameters walsink reads itself (the rest go to the connection library).
pub const WALSINK_PARAMETERS: &[&str] = &[
    "table",
    "mode",
    "marker_table",
    "create",
    "prepared_warn_after",
    "lock_timeout",
    "idle_in_transaction_timeout",
    "sslmode",
    "sslrootcert",
    "sslcert",
    "sslkey",
    "passfile",
    "password_file",
    "password_env",
];

/// The query parameters passed on to the connection library (tokio-postgres); `password`
/// is refused in the query.
pub const CONNECTION_PARAMETERS: &[&str] = &[
    "user",
    "dbname",
    "host",
    "hostaddr",
    "port",
    "options",
    "application_name",
    "connect_timeout",
    "tcp_user_timeout",
    "keepalives",
    "keepalives_idle",
    "keepalives_interval",
    "keepalives_retries",
    "target_session_attrs",
    "load_balance_hosts",
    "sslnegotiation",
    "channel_binding",
];

/// Where and how a [`PgSink`](crate::PgSink) delivers.
///
/// From a URL ([`Config::from_url`]):
/// `postgres://USER[:PASSWORD]@HOST[:PORT]/DB?table=NAME[&mode=marker|2pc][&marker_table=NAME][&create=true|false][&prepared_warn_after=5m][&lock_timeout=5s][&idle_in_transaction_timeout=60s]`
/// plus the connection options tokio-postgres knows ([`CONNECTION_PARAMETERS`]:
/// `connect_timeout=10`, `application_name=…`, `options=…`, `keepalives=…`); any other
/// parameter is an error naming it. `Display` and `Debug` never show the password.
///
/// TLS takes libpq's parameters with libpq's meanings: `sslmode=disable|prefer|require|
/// verify-ca|verify-full` (default `prefer`, as libpq; `verify-full` recommended),
/// `sslrootcert=PATH|system`, `sslcert=PATH`, `sslkey=PATH`. The password, when the URL holds
/// none, comes from `password_file=PATH` or `password_env=NAME`, else from `PGPASSWORD`, else
/// from the password file (`passfile=PATH`, `PGPASSFILE` or `~/.pgpass`, read as libpq does).
#[derive(Clone)]
pub struct Config {
    pub(crate) pg: tokio_postgres::Config,
    shown: String,
    /// Whether TLS is used, and how much of the server's certificate is verified (libpq's
    /// `sslmode`).
    pub sslmode: SslMode,
    /// The TLS settings: the CA file (`sslrootcert`; `None` trusts the public roots of
    /// `webpki-roots`), the client certificate and key (`sslcert`, `sslkey`) and the
    /// verification `sslmode` implies. Read again on every connection.
    pub tls: walsink_kit::TlsOptions,
    /// The target table.
    pub table: TableName,
    /// The marker table.
    pub marker_table: MarkerTable,
    /// How epochs are committed.
    pub mode: Mode,
    /// Create the target table (when the mapping can) and the marker table if missing.
    pub create: bool,
    /// Warn (tracing) when a prepared transaction of this sink is older than this.
    pub prepared_warn_after: Duration,
    /// Bytes of encoded rows sent to the server in one COPY message.
    pub copy_buffer: usize,
    /// The longest one statement of the sink waits for a lock (the session's `lock_timeout`;
    /// zero: no limit). A delivery waiting behind another transaction that holds its epoch's
    /// marker (an earlier connection whose COMMIT or PREPARE is still on its way) then fails
    /// with a retryable error and looks again, instead of waiting for ever behind a
    /// transaction that prepares and is never resolved. Default 5 s.
    pub lock_timeout: Duration,
    /// The longest a session of the sink may sit idle inside a transaction before the server
    /// ends it (the session's `idle_in_transaction_session_timeout`; zero: no limit). It
    /// bounds how long a transaction of a connection whose client vanished without the
    /// server seeing it close (a cut link) holds the epoch's marker. Default 60 s.
    pub idle_in_transaction_timeout: Duration,
}

/// `d`, checked to fit a PostgreSQL timeout setting (whole milliseconds, at most `i32::MAX`).
fn pg_timeout(d: Duration, what: &str) -> Result<Duration, ConfigError> {
    if d.as_millis() > i32::MAX as u128 {
        return Err(ConfigError::new(
            "postgres",
            what,
            format!(
                "{} is too long: PostgreSQL takes at most {} ms (about 24 days); use 0s for no limit",
                humantime::format_duration(d),
                i32::MAX
            ),
        ));
    }
    Ok(d)
}

/// `url` with the password (and secret query parameters) replaced by `***`: the rule every
/// walsink crate uses, [`walsink::redact_url`].
pub fn redact(url: &str) -> String {
    walsink::redact_url(url)
}

/// `~/.postgresql/NAME`, libpq's default place of the TLS files.
fn libpq_home_file(name: &str) -> Option<PathBuf> {
    std::env::var_os("HOME")
        .filter(|h| !h.is_empty())
        .map(|h| Path::new(&h).join(".postgresql").join(name))
}

/// The TLS settings of the URL, with libpq's rules: `require` with a root certificate
/// verifies the chain (as `verify-ca`); `verify-ca` and `verify-full` need a root certificate
/// (`sslrootcert=PATH`, `~/.postgresql/root.crt`, or `sslrootcert=system` for the public
/// roots, which needs `verify-full` and makes it the default); the files are read once here so
/// that a missing or bad one is named before any connection.
fn tls_options(
    sslmode: Option<SslMode>,
    sslrootcert: Option<String>,
    sslcert: Option<PathBuf>,
    sslkey: Option<PathBuf>,
) -> Result<(SslMode, walsink_kit::TlsOptions), ConfigError> {
    let system = sslrootcert.as_deref() == Some("system");
    let mode = match (sslmode, system) {
        (None, true) => SslMode::VerifyFull,
        (Some(m), true) if m != SslMode::VerifyFull && m != SslMode::Disable => {
            return Err(ConfigError::new(
                "postgres",
                "sslmode",
                format!(
                    "{} may not be used with sslrootcert=system (the public roots are only worth trusting with the host name checked): use sslmode=verify-full",
                    m.name()
                ),
            ))
        }
        (m, _) => m.unwrap_or(SslMode::Prefer),
    };
    let ca_file = match (&sslrootcert, system) {
        (_, true) => None,
        (Some(p), false) => Some(PathBuf::from(p)),
        (None, false) => libpq_home_file("root.crt").filter(|p| p.exists()),
    };
    let verifies = matches!(mode, SslMode::VerifyCa | SslMode::VerifyFull);
    if verifies && ca_file.is_none() && !system {
        return Err(ConfigError::new(
            "postgres",
            "sslmode",
            format!(
                "{} needs the CA certificate to verify the server's against: give sslrootcert=PATH (a PEM file), put it in ~/.postgresql/root.crt, or use sslrootcert=system for the public roots",
                mode.name()
            ),
        ));
    }
    let verify = match mode {
        SslMode::VerifyFull => walsink_kit::Verify::Full,
        SslMode::VerifyCa => walsink_kit::Verify::Ca,
        // libpq: with a root certificate, require (and prefer) verify the chain.
        _ if ca_file.is_some() => walsink_kit::Verify::Ca,
        _ => walsink_kit::Verify::None,
    };
    let tls = walsink_kit::TlsOptions {
        ca_file,
        cert_file: sslcert,
        key_file: sslkey,
        verify,
    };
    if mode != SslMode::Disable {
        tls.check("postgres", "sslcert", "sslkey")?;
        if let Some(k) = &tls.key_file {
            check_key_mode(k)?;
        }
        tls.client_config("postgres")?;
    }
    Ok((mode, tls))
}

/// libpq refuses a client key that its group or others may read (0640 is allowed for a
/// file owned by root, for keys shared through a group).
fn check_key_mode(path: &Path) -> Result<(), ConfigError> {
    #[cfg(unix)]
    {
        use std::os::unix::fs::{MetadataExt, PermissionsExt};
        let Ok(meta) = std::fs::metadata(path) else {
            return Ok(()); // named by the kit's read below
        };
        let mode = meta.permissions().mode() & 0o777;
        let allowed = if meta.uid() == 0 { 0o640 } else { 0o600 };
        if mode & !allowed != 0 {
            return Err(ConfigError::new(
                "postgres",
                "sslkey",
                format!(
                    "{} has group or world access (mode {mode:o}): the private key must have permissions u=rw (0600) or less (chmod 0600 {})",
                    path.display(),
                    path.display()
                ),
            ));
        }
    }
    #[cfg(not(unix))]
    let _ = path;
    Ok(())
}

/// The password when the URL holds none: `password_file=` or `password_env=` (the kit's
/// rules), else `PGPASSWORD`, else the password file as libpq reads it. Two explicit ways at
/// once are refused naming them.
fn resolve_password(
    pg: &mut tokio_postgres::Config,
    password_file: Option<&Path>,
    password_env: Option<&str>,
    passfile: Option<&str>,
) -> Result<(), ConfigError> {
    let given: Vec<&str> = [
        pg.get_password()
            .is_some()
            .then_some("a password in the URL"),
        password_file.is_some().then_some("password_file"),
        password_env.is_some().then_some("password_env"),
    ]
    .into_iter()
    .flatten()
    .collect();
    if given.len() > 1 {
        return Err(ConfigError::new(
            "postgres",
            "password",
            format!("give it one way only, not {}", given.join(" and ")),
        ));
    }
    if let Some(p) = password_file {
        let s = walsink_kit::secret::from_file("postgres", "password_file", p)?;
        pg.password(s.expose());
        return Ok(());
    }
    if let Some(v) = password_env {
        let s = walsink_kit::secret::from_env("postgres", "password_env", v)?;
        pg.password(s.expose());
        return Ok(());
    }
    if pg.get_password().is_some() {
        return Ok(());
    }
    if let Some(p) = std::env::var("PGPASSWORD").ok().filter(|p| !p.is_empty()) {
        pg.password(p);
        return Ok(());
    }
    let Some(file) = crate::pgpass::default_path(passfile) else {
        return Ok(());
    };
    let user = pg
        .get_user()
        .map(str::to_string)
        .or_else(|| std::env::var("USER").ok())
        .or_else(|| std::env::var("LOGNAME").ok())
        .unwrap_or_default();
    let dbname = pg.get_dbname().unwrap_or(&user).to_string();
    let port = pg.get_ports().first().copied().unwrap_or(5432).to_string();
    // tokio-postgres sends one password to every host: the first host with a line wins.
    let hosts: Vec<String> = pg
        .get_hosts()
        .iter()
        .map(|h| match h {
            tokio_postgres::config::Host::Tcp(h) => h.clone(),
            #[cfg(unix)]
            tokio_postgres::config::Host::Unix(p) => {
                // libpq matches a socket in the default directory as "localhost".
                let s = p.display().to_string();
                if ["/tmp", "/var/run/postgresql", "/run/postgresql"].contains(&s.as_str()) {
                    "localhost".to_string()
                } else {
                    s
                }
            }
        })
        .collect();
    for host in &hosts {
        let who = crate::pgpass::Lookup {
            host,
            port: &port,
            database: &dbname,
            user: &user,
        };
        if let Some(p) = crate::pgpass::lookup(&file, &who) {
            pg.password(p);
            return Ok(());
        }
    }
    Ok(())
}

impl Config {
    /// A configuration from a tokio-postgres connection configuration and a table, with the
    /// defaults: its `sslmode` (tokio-postgres's default is `prefer`, without verification of
    /// the certificate; set [`Config::sslmode`] and [`Config::tls`] to verify it), marker mode, the marker table `walsink_markers`, tables created if missing,
    /// warnings for prepared transactions older than 5 minutes, a lock timeout of 5 s and an
    /// idle-in-transaction timeout of 60 s.
    pub fn new(pg: tokio_postgres::Config, table: TableName) -> Config {
        let host = pg
            .get_hosts()
            .first()
            .map(|h| match h {
                tokio_postgres::config::Host::Tcp(h) => h.clone(),
                #[allow(unreachable_patterns)]
                _ => "socket".to_string(),
            })
            .unwrap_or_else(|| "localhost".into());
        let port = pg.get_ports().first().copied().unwrap_or(5432);
        let shown = format!(
            "postgres://{}@{host}:{port}/{}?table={}",
            pg.get_user().unwrap_or(""),
            pg.get_dbname().unwrap_or(""),
            table.plain()
        );
        let sslmode = match pg.get_ssl_mode() {
            tokio_postgres::config::SslMode::Disable => SslMode::Disable,
            tokio_postgres::config::SslMode::Require => SslMode::Require,
            _ => SslMode::Prefer,
        };
        Config {
            pg,
            shown,
            sslmode,
            tls: walsink_kit::TlsOptions {
                verify: walsink_kit::Verify::None,
                ..walsink_kit::TlsOptions::default()
            },
            table,
            marker_table: MarkerTable::default(),
            mode: Mode::Marker,
            create: true,
            prepared_warn_after: DEFAULT_PREPARED_WARN_AFTER,
            copy_buffer: 256 << 10,
            lock_timeout: DEFAULT_LOCK_TIMEOUT,
            idle_in_transaction_timeout: DEFAULT_IDLE_IN_TRANSACTION_TIMEOUT,
        }
    }

    /// Parses a `postgres://` (or `postgresql://`) URL; see [`Config`]. Errors name the
    /// parameter and never hold the password.
    pub fn from_url(url: &str) -> Result<Config, ConfigError> {
        let shown = redact(url);
        let err = |param: &str, why: String| ConfigError::new("postgres", param, why);
        let Some((scheme, _)) = url.split_once("://") else {
            return Err(err(
                "URL",
                format!("{shown:?} is not a URL: use postgres://USER@HOST:PORT/DB?table=NAME"),
            ));
        };
        if scheme != "postgres" && scheme != "postgresql" {
            return Err(err(
                "scheme",
                format!("{shown:?}: the scheme must be postgres:// or postgresql://"),
            ));
        }
        let after_user = url.rfind('@').map_or(scheme.len() + 3, |a| a + 1);
        let (base, query) = match url[after_user..].find('?') {
            Some(q) => (&url[..after_user + q], Some(&url[after_user + q + 1..])),
            None => (url, None),
        };
        // One grammar with every target (walsink_kit::Params): `+` stays `+`, durations such
        // as 500ms or 1h30m, booleans true/false, yes/no, on/off, 1/0; twice or unknown is
        // refused by name.
        let mut p = walsink_kit::Params::parse("postgres", query)?;
        if p.contains("password") {
            return Err(err(
                "password",
                "is not accepted in the query (it would show in process lists and logs): use password_file=PATH, password_env=NAME, PGPASSWORD or ~/.pgpass".into(),
            ));
        }
        let table = p
            .non_empty("table")?
            .map(|v| TableName::parse(&v, "table"))
            .transpose()?;
        let marker_table = p
            .non_empty("marker_table")?
            .map(|v| TableName::parse(&v, "marker_table").map(MarkerTable::new))
            .transpose()?;
        let mode = match p.choice("mode", &["marker", "2pc"])? {
            None | Some(0) => Mode::Marker,
            Some(_) => Mode::TwoPhase,
        };
        let create = p.bool("create")?.unwrap_or(true);
        let warn_after = p
            .duration("prepared_warn_after")?
            .unwrap_or(DEFAULT_PREPARED_WARN_AFTER);
        let lock_timeout = match p.duration("lock_timeout")? {
            Some(d) => pg_timeout(d, "lock_timeout")?,
            None => DEFAULT_LOCK_TIMEOUT,
        };
        let idle_timeout = match p.duration("idle_in_transaction_timeout")? {
            Some(d) => pg_timeout(d, "idle_in_transaction_timeout")?,
            None => DEFAULT_IDLE_IN_TRANSACTION_TIMEOUT,
        };
        let sslmode = p
            .parsed("sslmode", |v| {
                SslMode::parse(v).ok_or_else(|| {
                    format!("{v:?} is not one of disable, prefer (the default), require, verify-ca or verify-full (recommended)")
                })
            })?;
        let sslrootcert = p.non_empty("sslrootcert")?;
        let sslcert = p.non_empty("sslcert")?.map(PathBuf::from);
        let sslkey = p.non_empty("sslkey")?.map(PathBuf::from);
        let passfile = p.non_empty("passfile")?;
        let password_file = p.non_empty("password_file")?.map(PathBuf::from);
        let password_env = p.non_empty("password_env")?;
        // The connection's own options go to tokio-postgres as they were given, re-encoded.
        let mut passed = Vec::new();
        for &k in CONNECTION_PARAMETERS {
            if let Some(v) = p.text(k)? {
                passed.push(format!(
                    "{k}={}",
                    percent_encoding::utf8_percent_encode(&v, percent_encoding::NON_ALPHANUMERIC)
                ));
            }
        }
        let known: Vec<&str> = WALSINK_PARAMETERS
            .iter()
            .chain(CONNECTION_PARAMETERS)
            .copied()
            .collect();
        p.finish_known(&known).map_err(|e| {
            err(
                &e.parameter,
                format!(
                    "is not a parameter: walsink takes {}; the connection takes {} (see docs/targets/postgres.md)",
                    WALSINK_PARAMETERS.join(", "),
                    CONNECTION_PARAMETERS.join(", ")
                ),
            )
        })?;
        let Some(table) = table else {
            return Err(err(
                "table",
                format!("is missing from {shown}: add ?table=NAME"),
            ));
        };
        let mut conn = base.to_string();
        if !passed.is_empty() {
            conn.push('?');
            conn.push_str(&passed.join("&"));
        }
        let mut pg = tokio_postgres::Config::from_str(&conn).map_err(|e| {
            // tokio-postgres says what is wrong (the option, the host) in the error's source.
            let mut why = e.to_string();
            let mut source = std::error::Error::source(&e);
            while let Some(s) = source {
                why.push_str(&format!(": {s}"));
                source = s.source();
            }
            err(
                "URL",
                format!("{}: not a PostgreSQL connection URL: {why}", redact(&conn)),
            )
        })?;
        if pg.get_hosts().is_empty() {
            pg.host("localhost");
        }
        resolve_password(
            &mut pg,
            password_file.as_deref(),
            password_env.as_deref(),
            passfile.as_deref(),
        )?;
        let (sslmode, tls) = tls_options(sslmode, sslrootcert, sslcert, sslkey)?;
        let mut c = Config::new(pg, table);
        c.shown = shown;
        c.sslmode = sslmode;
        c.tls = tls;
        c.mode = mode;
        c.create = create;
        c.prepared_warn_after = warn_after;
        c.lock_timeout = lock_timeout;
        c.idle_in_transaction_timeout = idle_timeout;
        if let Some(m) = marker_table {
            c.marker_table = m;
        }
        Ok(c)
    }

    /// The connection configuration (tokio-postgres).
    pub fn pg(&self) -> &tokio_postgres::Config {
        &self.pg
    }
}

/// The URL without the password.
impl fmt::Display for Config {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.shown)
    }
}

impl fmt::Debug for Config {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Config")
            .field("url", &self.shown)
            .field("sslmode", &self.sslmode)
            .field("tls", &self.tls)
            .field("table", &self.table.plain())
            .field("marker_table", &self.marker_table.name().plain())
            .field("mode", &self.mode)
            .field("create", &self.create)
            .field("prepared_warn_after", &self.prepared_warn_after)
            .field("lock_timeout", &self.lock_timeout)
            .field(
                "idle_in_transaction_timeout",
                &self.idle_in_transaction_timeout,
            )
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_url_parses_with_its_parameters() {
        let c = Config::from_url(
            "postgres://alice:s3cret@db.local:6543/app?table=events&mode=2pc&marker_table=ops.marks&create=false&prepared_warn_after=90s&lock_timeout=250ms&idle_in_transaction_timeout=0s&connect_timeout=5",
        )
        .unwrap();
        assert_eq!(c.table.plain(), "events");
        assert_eq!(c.mode, Mode::TwoPhase);
        assert_eq!(c.marker_table.name().plain(), "ops.marks");
        assert!(!c.create);
        assert_eq!(c.prepared_warn_after, Duration::from_secs(90));
        assert_eq!(c.lock_timeout, Duration::from_millis(250));
        assert_eq!(c.idle_in_transaction_timeout, Duration::ZERO);
        assert_eq!(c.pg.get_user(), Some("alice"));
        assert_eq!(c.pg.get_password(), Some(&b"s3cret"[..]));
        assert_eq!(c.pg.get_ports(), &[6543]);
        assert_eq!(c.pg.get_dbname(), Some("app"));
        assert_eq!(c.pg.get_connect_timeout(), Some(&Duration::from_secs(5)));
        let m = Config::from_url("postgresql://u@h/d?table=t").unwrap();
        assert_eq!(m.mode, Mode::Marker);
        assert_eq!(m.marker_table.name().plain(), "walsink_markers");
        assert_eq!(m.lock_timeout, DEFAULT_LOCK_TIMEOUT);
        assert_eq!(
            m.idle_in_transaction_timeout,
            DEFAULT_IDLE_IN_TRANSACTION_TIMEOUT
        );
    }

    #[test]
    fn passwords_never_show() {
        let url = "postgres://alice:s3cret@db:5432/app?table=t";
        let c = Config::from_url(url).unwrap();
        for shown in [c.to_string(), format!("{c:?}")] {
            assert!(!shown.contains("s3cret"), "{shown}");
        }
        assert_eq!(c.to_string(), "postgres://alice:***@db:5432/app?table=t");
        for bad in [
            "postgres://alice:s3cret@db/app",
            "postgres://alice:s3cret@db/app?table=1x",
            "postgres://alice:s3cret@db/app?table=t&mode=3pc",
            "postgres://alice:s3cret@db/app?table=t&create=maybe",
            "postgres://alice:s3cret@db/app?table=t&prepared_warn_after=5",
            "postgres://alice:s3cret@db:notaport/app?table=t",
            "postgres://alice:s3cret@db/app?table=t&bogus=1",
            "postgres://alice@db/app?table=t&password=s3cret",
            "mysql://alice:s3cret@db/app?table=t",
        ] {
            let e = Config::from_url(bad).unwrap_err().to_string();
            assert!(!e.contains("s3cret"), "{bad}: {e}");
        }
    }

    #[test]
    fn errors_name_the_parameter() {
        let e = |u: &str| Config::from_url(u).unwrap_err().to_string();
        assert!(e("postgres://u@h/d").contains("table: is missing"));
        for (url, param) in [
            ("postgres://u@h/d?table=t&mode=x", "mode"),
            ("postgres://u@h/d?table=t&create=x", "create"),
            (
                "postgres://u@h/d?table=t&prepared_warn_after=x",
                "prepared_warn_after",
            ),
            ("postgres://u@h/d?table=a.b.c", "table"),
            ("postgres://u@h/d?table=t&marker_table=-", "marker_table"),
            ("postgres://u@h/d?table=t&lock_timeout=5", "lock_timeout"),
            ("postgres://u@h/d?table=t&lock_timeout=30d", "lock_timeout"),
            ("postgres://u@h/d?table=t&table=u", "table"),
            ("postgres://u@h/d?table=t&sslcert=", "sslcert"),
            ("postgres://u@h/d?table=t%zz", "table"),
        ] {
            let got = e(url);
            assert!(
                got.starts_with(&format!("postgres sink URL: {param}: ")),
                "{url}: {got}"
            );
        }
        let long = e("postgres://u@h/d?table=t&idle_in_transaction_timeout=1000h");
        assert!(
            long.starts_with("postgres sink URL: idle_in_transaction_timeout: ")
                && long.contains("is too long"),
            "{long}"
        );
    }

    #[test]
    fn the_kits_grammar_holds_for_every_parameter() {
        // The spellings every target takes: booleans on/off, yes/no; durations with mixed units.
        let c = Config::from_url(
            "postgres://u@h/d?table=t&create=off&lock_timeout=1m30s&prepared_warn_after=1h30m",
        )
        .unwrap();
        assert!(!c.create);
        assert_eq!(c.lock_timeout, Duration::from_secs(90));
        assert_eq!(c.prepared_warn_after, Duration::from_secs(5400));
        assert!(
            Config::from_url("postgres://u@h/d?table=t&create=YES")
                .unwrap()
                .create
        );
        // A connection option reaches tokio-postgres decoded once, whatever it holds.
        let c = Config::from_url("postgres://u@h/d?table=t&application_name=a%20b%2Bc+d").unwrap();
        assert_eq!(c.pg.get_application_name(), Some("a b+c+d"));
    }

    #[test]
    fn a_plus_in_a_query_value_stays_a_plus_as_libpq_reads_it() {
        let e = Config::from_url("postgres://u@h/d?table=t&password_env=WALSINK_PG_SURELY+UNSET")
            .unwrap_err()
            .to_string();
        assert!(e.contains("WALSINK_PG_SURELY+UNSET"), "{e}");
    }

    #[test]
    fn a_parameter_given_twice_is_refused_naming_it() {
        let e = Config::from_url("postgres://u:s3cret@h/d?table=t&lock_timeout=1s&lock_timeout=2s")
            .unwrap_err()
            .to_string();
        assert!(e.contains("lock_timeout: is given more than once"), "{e}");
        assert!(!e.contains("s3cret"), "{e}");
    }

    #[test]
    fn an_unknown_parameter_is_named_with_the_accepted_ones() {
        let e = Config::from_url("postgres://u:s3cret@h/d?table=t&lock_timeot=5s")
            .unwrap_err()
            .to_string();
        assert!(e.contains("lock_timeot: is not a parameter"), "{e}");
        for accepted in [
            "table",
            "mode",
            "marker_table",
            "lock_timeout",
            "connect_timeout",
        ] {
            assert!(e.contains(accepted), "{accepted} is listed: {e}");
        }
        assert!(!e.contains("s3cret"), "{e}");
        // A value the connection library refuses: its option is named.
        let e = Config::from_url("postgres://u@h/d?table=t&sslnegotiation=sometimes")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("invalid value for option `sslnegotiation`"),
            "{e}"
        );
        let e = Config::from_url("postgres://u@h/d?table=t&sslmode=sometimes")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("sslmode: \"sometimes\" is not one of") && e.contains("verify-full"),
            "{e}"
        );
    }

    #[test]
    fn redaction_handles_odd_urls() {
        assert_eq!(redact("postgres://u:p@h/d"), "postgres://u:***@h/d");
        assert_eq!(redact("postgres://u@h/d"), "postgres://u@h/d");
        assert_eq!(
            redact("postgres://h/d?table=a@b"),
            "postgres://h/d?table=a@b"
        );
        assert_eq!(redact("postgres://u:p%2Fq@h/d"), "postgres://u:***@h/d");
    }

    use walsink_kit::testkit::TestCa;
    use walsink_kit::Verify;

    fn no_home_root_crt() -> bool {
        libpq_home_file("root.crt").is_none_or(|p| !p.exists())
    }

    #[test]
    fn sslmode_maps_onto_the_kits_verification_as_libpq_does() {
        let dir = tempfile::tempdir().unwrap();
        let ca = TestCa::new(dir.path(), "ca").unwrap();
        let root = ca.ca_file().display().to_string();
        let cfg = |q: &str| Config::from_url(&format!("postgres://u@h/d?table=t{q}"));
        let c = cfg("").unwrap();
        assert_eq!(c.sslmode, SslMode::Prefer, "libpq's default");
        if no_home_root_crt() {
            assert_eq!(c.tls.verify, Verify::None);
            let c = cfg("&sslmode=require").unwrap();
            assert_eq!((c.sslmode, c.tls.verify), (SslMode::Require, Verify::None));
            for m in ["verify-ca", "verify-full"] {
                let e = cfg(&format!("&sslmode={m}")).unwrap_err().to_string();
                assert!(e.contains("sslrootcert") && e.contains(m), "{e}");
            }
        }
        let c = cfg(&format!("&sslmode=require&sslrootcert={root}")).unwrap();
        assert_eq!(
            c.tls.verify,
            Verify::Ca,
            "require with a root certificate is verify-ca"
        );
        assert_eq!(c.tls.ca_file.as_deref(), Some(ca.ca_file().as_path()));
        let c = cfg(&format!("&sslmode=verify-ca&sslrootcert={root}")).unwrap();
        assert_eq!((c.sslmode, c.tls.verify), (SslMode::VerifyCa, Verify::Ca));
        let c = cfg(&format!("&sslmode=verify-full&sslrootcert={root}")).unwrap();
        assert_eq!(
            (c.sslmode, c.tls.verify),
            (SslMode::VerifyFull, Verify::Full)
        );
        let c = cfg("&sslmode=disable").unwrap();
        assert_eq!(c.sslmode, SslMode::Disable);
        // sslrootcert=system: the public roots, verify-full its default and only mode.
        let c = cfg("&sslrootcert=system").unwrap();
        assert_eq!(
            (c.sslmode, c.tls.verify),
            (SslMode::VerifyFull, Verify::Full)
        );
        assert_eq!(c.tls.ca_file, None);
        let e = cfg("&sslrootcert=system&sslmode=require")
            .unwrap_err()
            .to_string();
        assert!(e.contains("verify-full"), "{e}");
    }

    #[test]
    fn tls_files_are_checked_when_parsed_and_named() {
        let dir = tempfile::tempdir().unwrap();
        let ca = TestCa::new(dir.path(), "ca").unwrap();
        let client = ca.client("client", "walsink").unwrap();
        let root = ca.ca_file().display().to_string();
        let cfg = |q: &str| {
            Config::from_url(&format!(
                "postgres://u:s3cret@h/d?table=t&sslmode=verify-full&sslrootcert={root}{q}"
            ))
        };
        let e = cfg("&sslrootcert=/nonexistent/ca.pem")
            .unwrap_err()
            .to_string();
        assert!(e.contains("sslrootcert: is given more than once"), "{e}");
        let e = Config::from_url(
            "postgres://u@h/d?table=t&sslmode=verify-full&sslrootcert=/nonexistent/ca.pem",
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("/nonexistent/ca.pem"), "{e}");
        let e = cfg(&format!("&sslcert={}", client.cert.display()))
            .unwrap_err()
            .to_string();
        assert!(e.contains("sslkey"), "{e}");
        let c = cfg(&format!(
            "&sslcert={}&sslkey={}",
            client.cert.display(),
            client.key.display()
        ))
        .unwrap();
        assert_eq!(c.tls.key_file.as_deref(), Some(client.key.as_path()));
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&client.key, std::fs::Permissions::from_mode(0o644)).unwrap();
            let e = cfg(&format!(
                "&sslcert={}&sslkey={}",
                client.cert.display(),
                client.key.display()
            ))
            .unwrap_err()
            .to_string();
            assert!(e.contains("sslkey") && e.contains("0600"), "{e}");
        }
        let shown = format!("{:?}", cfg("").unwrap());
        assert!(!shown.contains("s3cret"), "{shown}");
    }

    #[test]
    fn password_file_and_password_env_come_through_the_kit() {
        let dir = tempfile::tempdir().unwrap();
        let pw = dir.path().join("pw");
        std::fs::write(&pw, "fr0m-file\n").unwrap();
        let c = Config::from_url(&format!(
            "postgres://u@h/d?table=t&password_file={}",
            pw.display()
        ))
        .unwrap();
        assert_eq!(c.pg.get_password(), Some(&b"fr0m-file"[..]));
        assert!(!format!("{c:?}{c}").contains("fr0m-file"));
        let e = Config::from_url(&format!(
            "postgres://u:inline@h/d?table=t&password_file={}",
            pw.display()
        ))
        .unwrap_err()
        .to_string();
        assert!(e.contains("one way only") && !e.contains("inline"), "{e}");
        let e =
            Config::from_url("postgres://u@h/d?table=t&password_env=WALSINK_PG_TEST_SURELY_UNSET")
                .unwrap_err()
                .to_string();
        assert!(e.contains("WALSINK_PG_TEST_SURELY_UNSET is not set"), "{e}");
        let e = Config::from_url("postgres://u@h/d?table=t&password_file=/nonexistent/pw")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("password_file") && e.contains("does not exist"),
            "{e}"
        );
    }

    #[test]
    fn passfile_gives_the_password_of_the_matching_line() {
        if std::env::var_os("PGPASSWORD").is_some() {
            return; // PGPASSWORD comes first, as in libpq
        }
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("pgpass");
        std::fs::write(
            &file,
            "other:5432:*:alice:wrong\ndb.example:6543:app:alice:r\\:ight\n*:*:*:*:fallback\n",
        )
        .unwrap();
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)).unwrap();
        }
        let url = |rest: &str| format!("postgres://{rest}&passfile={}", file.display());
        let c = Config::from_url(&url("alice@db.example:6543/app?table=t")).unwrap();
        assert_eq!(c.pg.get_password(), Some(&b"r:ight"[..]));
        let c = Config::from_url(&url("bob@db.example:6543/app?table=t")).unwrap();
        assert_eq!(c.pg.get_password(), Some(&b"fallback"[..]));
        // A password in the URL is never replaced.
        let c = Config::from_url(&url("alice:mine@db.example:6543/app?table=t")).unwrap();
        assert_eq!(c.pg.get_password(), Some(&b"mine"[..]));
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o640)).unwrap();
            let c = Config::from_url(&url("alice@db.example:6543/app?table=t")).unwrap();
            assert_eq!(
                c.pg.get_password(),
                None,
                "a file others may read is ignored"
            );
        }
    }
}
