//! [`Config`]: where and how to deliver, parsed from the `--sink` URL.

use crate::error::ConfigError;
use crate::marker::MarkerTable;
use crate::table::TableName;
use std::fmt;
use std::time::Duration;
use walsink_kit::{Params, Secret, TlsOptions, Verify};

/// How an epoch is committed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// One InnoDB transaction per epoch: the rows and the commit marker, committed together
    /// (`mode=marker`, the default).
    Marker,
    /// The same transaction as an XA transaction: `XA START`, the rows and the marker,
    /// `XA END` and `XA PREPARE` under a deterministic xid, then `XA COMMIT` (`mode=xa`).
    Xa,
}

/// How the rows of an epoch go in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Bulk {
    /// `LOAD DATA LOCAL INFILE` streamed from memory, in statements of at most `batch_size`
    /// (`bulk=load_data`, the default; the measured faster way). A server with
    /// `local_infile=OFF` gets multi-row INSERTs instead.
    LoadData,
    /// Multi-row `INSERT` statements of at most `batch_size`, capped by `max_allowed_packet`
    /// (`bulk=insert`).
    Insert,
}

/// Whether and how the connection is encrypted: MySQL's `--ssl-mode` (`ssl_mode=`), with
/// MySQL's names and meanings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SslMode {
    /// Plain text (`disabled`).
    Disabled,
    /// TLS when the server offers it, plain text when it does not; the certificate is not
    /// verified (`preferred`, MySQL's default and walsink's when no `ssl_ca` is given).
    Preferred,
    /// TLS or no connection; the certificate is not verified (`required`).
    Required,
    /// TLS, the certificate's chain up to the CA of `ssl_ca`, not the host name (`verify_ca`).
    /// Refused for now: mysql_async 0.37's host-name skipping does not recognise rustls
    /// 0.23's error, so it would verify the host name after all (docs/targets/mysql.md).
    VerifyCa,
    /// TLS, the chain up to the CA of `ssl_ca` (or the public roots) and the host name
    /// (`verify_identity`; walsink's default when `ssl_ca` is given).
    VerifyIdentity,
}

impl SslMode {
    /// MySQL's name of the mode, as `ssl_mode=` takes it.
    pub fn name(self) -> &'static str {
        match self {
            SslMode::Disabled => "disabled",
            SslMode::Preferred => "preferred",
            SslMode::Required => "required",
            SslMode::VerifyCa => "verify_ca",
            SslMode::VerifyIdentity => "verify_identity",
        }
    }
}

/// The default port.
pub const DEFAULT_PORT: u16 = 3306;

/// How long setting up a connection may take at most when the URL gives no
/// `connect_timeout`: the TCP connect, the handshake and the session settings.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// The default longest wait of one statement for a row lock (`innodb_lock_wait_timeout`)
/// or a table's metadata lock (`lock_wait_timeout`): past it the statement fails with 1205,
/// a retryable error, and the delivery is tried again.
pub const DEFAULT_LOCK_TIMEOUT: Duration = Duration::from_secs(5);

/// The default longest time a session of the sink may sit idle inside a transaction before
/// MariaDB ends it (`idle_transaction_timeout`; MySQL has no such setting).
pub const DEFAULT_IDLE_IN_TRANSACTION_TIMEOUT: Duration = Duration::from_secs(60);

/// The default size of one multi-row `INSERT` statement (capped by the server's
/// `max_allowed_packet`).
pub const DEFAULT_BATCH_SIZE: usize = 16 << 20;

/// The query parameters of a `mysql://` URL.
pub const PARAMETERS: &[&str] = &[
    "table",
    "mode",
    "marker_table",
    "create",
    "lock_timeout",
    "idle_in_transaction_timeout",
    "connect_timeout",
    "batch_size",
    "bulk",
    "password_file",
    "password_env",
    "ssl_mode",
    "ssl_ca",
    "ssl_cert",
    "ssl_key",
];

/// The query parameters of the connection itself, which [`Config::from_url_with`] reads
/// for other users of a `mysql://` URL than the sink.
pub const CONNECTION_PARAMETERS: &[&str] = &[
    "marker_table",
    "create",
    "lock_timeout",
    "idle_in_transaction_timeout",
    "connect_timeout",
    "password_file",
    "password_env",
    "ssl_mode",
    "ssl_ca",
    "ssl_cert",
    "ssl_key",
];

/// Where and how a [`MySqlSink`](crate::MySqlSink) delivers.
///
/// From a URL ([`Config::from_url`]):
/// `mysql://USER[:PASSWORD]@HOST[:PORT]/DB?table=NAME[&mode=marker|xa][&marker_table=NAME][&create=true|false][&lock_timeout=5s][&idle_in_transaction_timeout=60s][&connect_timeout=10s][&batch_size=16MiB][&bulk=load_data|insert][&password_file=PATH|&password_env=VAR][&ssl_mode=disabled|preferred|required|verify_identity][&ssl_ca=PATH][&ssl_cert=PATH&ssl_key=PATH]`
/// (or `mariadb://`); any other parameter is an error naming it. `Display` and `Debug` never
/// show the password.
#[derive(Clone)]
pub struct Config {
    shown: String,
    /// The server's host name or address.
    pub host: String,
    /// The server's port.
    pub port: u16,
    /// The user.
    pub user: String,
    /// The password, if any (from the URL, `password_file` or `password_env`).
    pub password: Option<Secret>,
    /// The database the tables are in (unless their names say another).
    pub database: String,
    /// The target table.
    pub table: TableName,
    /// The marker table.
    pub marker_table: MarkerTable,
    /// How epochs are committed.
    pub mode: Mode,
    /// Create the target table (when the mapping can) and the marker table if missing.
    pub create: bool,
    /// The longest one statement of the sink waits for a lock (the session's
    /// `innodb_lock_wait_timeout` and `lock_wait_timeout`, whole seconds, at least 1). A
    /// delivery waiting behind another transaction that holds its epoch's marker (an earlier
    /// connection whose COMMIT is still on its way) then fails with a retryable error and
    /// looks again. Default 5 s.
    pub lock_timeout: Duration,
    /// MariaDB only: the longest a session of the sink may sit idle inside a transaction
    /// before the server ends it (`idle_transaction_timeout`; zero: no limit). It bounds how
    /// long a transaction of a connection whose client vanished without the server seeing it
    /// close holds the epoch's marker. Default 60 s.
    pub idle_in_transaction_timeout: Duration,
    /// How long connecting may take (TCP, handshake, session settings). Default 10 s.
    pub connect_timeout: Duration,
    /// Bytes of rows in one statement (LOAD DATA or multi-row INSERT), at most; the
    /// server's `max_allowed_packet` caps it. Default 16 MiB.
    pub batch_size: usize,
    /// How the rows go in. Default [`Bulk::LoadData`].
    pub bulk: Bulk,
    /// Whether and how the connection is encrypted (`ssl_mode`). Default
    /// [`SslMode::Preferred`], or [`SslMode::VerifyIdentity`] when `ssl_ca` is given.
    pub ssl_mode: SslMode,
    /// The TLS files (`ssl_ca`, `ssl_cert`, `ssl_key`), read again on every connection; its
    /// `verify` follows `ssl_mode`.
    pub tls: TlsOptions,
}

fn seconds(d: Duration) -> u64 {
    d.as_secs() + u64::from(d.subsec_nanos() > 0)
}

impl Config {
    /// A configuration with the defaults: marker mode, the marker table `walsink_markers`,
    /// tables created if missing, a lock timeout of 5 s, an idle-in-transaction timeout of
    /// 60 s, a connect timeout of 10 s and statements of up to 16 MiB.
    pub fn new(host: &str, port: u16, user: &str, database: &str, table: TableName) -> Config {
        Config {
            shown: format!(
                "mysql://{user}@{host}:{port}/{database}?table={}",
                table.plain()
            ),
            host: host.to_string(),
            port,
            user: user.to_string(),
            password: None,
            database: database.to_string(),
            table,
            marker_table: MarkerTable::default(),
            mode: Mode::Marker,
            create: true,
            lock_timeout: DEFAULT_LOCK_TIMEOUT,
            idle_in_transaction_timeout: DEFAULT_IDLE_IN_TRANSACTION_TIMEOUT,
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
            batch_size: DEFAULT_BATCH_SIZE,
            bulk: Bulk::LoadData,
            ssl_mode: SslMode::Preferred,
            tls: TlsOptions {
                verify: Verify::None,
                ..TlsOptions::default()
            },
        }
    }

    /// Parses a `mysql://` (or `mariadb://`) URL; see [`Config`]. Errors name the parameter
    /// and never hold the password.
    pub fn from_url(spec: &str) -> Result<Config, ConfigError> {
        Self::parse_url(spec, None)
    }

    /// Parses a `mysql://` (or `mariadb://`) URL for another user of the connection than
    /// the sink (the CDC apply): the connection's parameters as [`Config::from_url`] reads
    /// them ([`CONNECTION_PARAMETERS`]), no `table`, and the caller's own parameters, named
    /// in `own`, read by `take` from the [`Params`]. Any other parameter (`table`, `mode`,
    /// `bulk`, `batch_size` among them) is an error naming it. [`Config::table`] is then the
    /// marker table's name, unused.
    pub fn from_url_with(
        spec: &str,
        own: &[&str],
        take: &mut dyn FnMut(&mut Params) -> Result<(), ConfigError>,
    ) -> Result<Config, ConfigError> {
        Self::parse_url(spec, Some((own, take)))
    }

    #[allow(clippy::type_complexity)]
    fn parse_url(
        spec: &str,
        tool: Option<(
            &[&str],
            &mut dyn FnMut(&mut Params) -> Result<(), ConfigError>,
        )>,
    ) -> Result<Config, ConfigError> {
        let err = |param: &str, why: String| ConfigError::new("mysql", param, why);
        let url = url::Url::parse(spec).map_err(|e| {
            err(
                "URL",
                format!("not a URL ({e}): use mysql://USER@HOST:PORT/DB?table=NAME"),
            )
        })?;
        let scheme = url.scheme().to_string();
        if scheme != "mysql" && scheme != "mariadb" {
            return Err(err(
                "URL",
                format!("the scheme {scheme:?} is not mysql:// or mariadb://"),
            ));
        }
        let host = match url.host_str() {
            Some(h) if !h.is_empty() => h.trim_start_matches('[').trim_end_matches(']'),
            _ => {
                return Err(err(
                    "host",
                    "is missing: use mysql://USER@HOST:PORT/DB?table=NAME".into(),
                ))
            }
        }
        .to_string();
        let port = url.port().unwrap_or(DEFAULT_PORT);
        let decode =
            |s: &str, what: &str| walsink_kit::params::percent_decode(s).map_err(|e| err(what, e));
        let user = decode(url.username(), "user")?;
        if user.is_empty() {
            return Err(err(
                "user",
                "is missing: put it before the host, as in mysql://USER@HOST:PORT/DB".into(),
            ));
        }
        let inline = match url.password() {
            Some(p) => Some(decode(p, "password")?),
            None => None,
        };
        let database = decode(url.path().trim_start_matches('/'), "database")?;
        if database.is_empty() || database.contains('/') {
            return Err(err(
                "database",
                "give one database as the URL's path, as in mysql://USER@HOST:PORT/DB".into(),
            ));
        }
        let mut p = Params::parse("mysql", url.query())?;
        if p.contains("password") {
            return Err(p.error(
                "password",
                "is not accepted in the query (it would show in process lists and logs): put it in the URL's user part, or use password_file= or password_env=",
            ));
        }
        let password =
            walsink_kit::secret::resolve(&mut p, inline, "password_file", "password_env")?;
        // The sink's own parameters, left in `p` for another user, whose check names them.
        let sink = tool.is_none();
        let table = match sink {
            false => TableName::parse(crate::marker::DEFAULT_TABLE, "table")?,
            true => match p.non_empty("table")? {
                Some(t) => TableName::parse(&t, "table")?,
                None => return Err(p.error("table", "is missing: add ?table=NAME")),
            },
        };
        let mut c = Config::new(&host, port, &user, &database, table);
        c.password = password;
        if let Some(m) = p.non_empty("marker_table")? {
            c.marker_table = MarkerTable::new(TableName::parse(&m, "marker_table")?);
        }
        if let Some(i) = sink
            .then(|| p.choice("mode", &["marker", "xa"]))
            .transpose()?
            .flatten()
        {
            c.mode = [Mode::Marker, Mode::Xa][i];
        }
        if let Some(b) = p.bool("create")? {
            c.create = b;
        }
        if let Some(d) = p.duration("lock_timeout")? {
            if d.is_zero() || seconds(d) > 1_073_741_824 {
                return Err(p.error(
                    "lock_timeout",
                    "must be between 1s and 1073741824s (whole seconds; the server has no \"no limit\")",
                ));
            }
            c.lock_timeout = d;
        }
        if let Some(d) = p.duration("idle_in_transaction_timeout")? {
            if seconds(d) > 31_536_000 {
                return Err(p.error(
                    "idle_in_transaction_timeout",
                    "is longer than a year (31536000 s), MariaDB's limit; use 0s for no limit",
                ));
            }
            c.idle_in_transaction_timeout = d;
        }
        if let Some(d) = p.duration("connect_timeout")? {
            if d.is_zero() {
                return Err(p.error("connect_timeout", "must be longer than zero"));
            }
            c.connect_timeout = d;
        }
        if let Some(n) = sink.then(|| p.size("batch_size")).transpose()?.flatten() {
            if !(4096..=(1 << 30)).contains(&n) {
                return Err(p.error("batch_size", "must be between 4KiB and 1GiB"));
            }
            c.batch_size = n as usize;
        }
        if let Some(i) = sink
            .then(|| p.choice("bulk", &["load_data", "insert"]))
            .transpose()?
            .flatten()
        {
            c.bulk = [Bulk::LoadData, Bulk::Insert][i];
        }
        let modes = [
            "disabled",
            "preferred",
            "required",
            "verify_ca",
            "verify_identity",
        ];
        let mode = p.choice("ssl_mode", &modes)?.map(|i| {
            [
                SslMode::Disabled,
                SslMode::Preferred,
                SslMode::Required,
                SslMode::VerifyCa,
                SslMode::VerifyIdentity,
            ][i]
        });
        let file =
            |p: &mut Params, name: &str| -> Result<Option<std::path::PathBuf>, ConfigError> {
                Ok(p.non_empty(name)?.map(std::path::PathBuf::from))
            };
        c.tls.ca_file = file(&mut p, "ssl_ca")?;
        c.tls.cert_file = file(&mut p, "ssl_cert")?;
        c.tls.key_file = file(&mut p, "ssl_key")?;
        c.ssl_mode = match (mode, &c.tls.ca_file) {
            (Some(m), _) => m,
            (None, Some(_)) => SslMode::VerifyIdentity,
            (None, None) => SslMode::Preferred,
        };
        c.tls.verify = match c.ssl_mode {
            SslMode::VerifyIdentity => Verify::Full,
            SslMode::VerifyCa => Verify::Ca,
            _ => Verify::None,
        };
        if c.ssl_mode == SslMode::VerifyCa {
            return Err(p.error(
                "ssl_mode",
                "verify_ca is not supported yet (mysql_async 0.37 would check the host name anyway): use verify_identity with a host name the certificate carries, or required",
            ));
        }
        if c.ssl_mode == SslMode::Disabled && (c.tls.ca_file.is_some() || c.tls.cert_file.is_some())
        {
            return Err(p.error(
                "ssl_mode",
                "is disabled but ssl_ca or ssl_cert is given: remove them or choose another ssl_mode",
            ));
        }
        c.tls.check("mysql", "ssl_cert", "ssl_key")?;
        if c.ssl_mode != SslMode::Disabled {
            // Checks the files now, so a wrong path is a configuration error at start.
            tls_files(&c.tls)?;
        }
        match tool {
            None => p.finish_known(PARAMETERS)?,
            Some((own, take)) => {
                take(&mut p)?;
                let known: Vec<&str> = own.iter().chain(CONNECTION_PARAMETERS).copied().collect();
                p.finish_known(&known)?;
            }
        }
        c.shown = shown(
            &scheme,
            &user,
            c.password.is_some(),
            &host,
            port,
            &database,
            url.query(),
        );
        Ok(c)
    }

    /// The connection options for mysql_async (the session settings included), over TLS
    /// when `tls` is true (the TLS files read now).
    pub(crate) fn opts(&self, tls: bool) -> Result<mysql_async::Opts, ConfigError> {
        let setup = vec![
            "SET NAMES utf8mb4".to_string(),
            // Strict: a value that does not fit its column is an error (1406), never a silent
            // truncation; without NO_BACKSLASH_ESCAPES, which the literal escaping needs.
            "SET SESSION sql_mode = 'STRICT_ALL_TABLES,NO_ENGINE_SUBSTITUTION'".to_string(),
            format!(
                "SET SESSION innodb_lock_wait_timeout = {0}, lock_wait_timeout = {0}",
                seconds(self.lock_timeout)
            ),
        ];
        // MariaDB's bound on a transaction left idle by a vanished client fails on MySQL (no
        // such variable), so the sink sets it after connecting, once the server is known.
        let mut b = mysql_async::OptsBuilder::default()
            .ip_or_hostname(self.host.clone())
            .tcp_port(self.port)
            .user(Some(self.user.clone()))
            .db_name(Some(self.database.clone()))
            .prefer_socket(false)
            .stmt_cache_size(16)
            .setup(setup);
        if let Some(p) = &self.password {
            b = b.pass(Some(p.expose().to_string()));
        }
        if tls {
            b = b.ssl_opts(Some(tls_files(&self.tls)?));
        }
        Ok(b.into())
    }

    /// The session's `idle_transaction_timeout` in seconds (MariaDB).
    pub(crate) fn idle_seconds(&self) -> u64 {
        seconds(self.idle_in_transaction_timeout)
    }
}

/// mysql_async's TLS settings for `tls`: it takes PEM bytes, not a rustls `ClientConfig`, so
/// the kit reads and checks the files and the verification maps onto mysql_async's switches.
fn tls_files(tls: &TlsOptions) -> Result<mysql_async::SslOpts, ConfigError> {
    use mysql_async::{ClientIdentity, SslOpts};
    let pem = tls.read_pem("mysql").map_err(|mut e| {
        e.parameter = match e.parameter.as_str() {
            "CA file" => "ssl_ca",
            "client certificate" => "ssl_cert",
            "client key" => "ssl_key",
            other => other,
        }
        .to_string();
        e
    })?;
    let mut o = SslOpts::default();
    if let Some(ca) = pem.ca {
        o = o
            .with_root_certs(vec![ca.into()])
            .with_disable_built_in_roots(true);
    }
    if let (Some(c), Some(k)) = (pem.cert, pem.key) {
        o = o.with_client_identity(Some(ClientIdentity::new(c.into(), k.into())));
    }
    Ok(match tls.verify {
        Verify::Full => o,
        Verify::Ca => o.with_danger_skip_domain_validation(true),
        Verify::None => o.with_danger_accept_invalid_certs(true),
    })
}

fn shown(
    scheme: &str,
    user: &str,
    password: bool,
    host: &str,
    port: u16,
    database: &str,
    query: Option<&str>,
) -> String {
    let host = if host.contains(':') {
        format!("[{host}]")
    } else {
        host.to_string()
    };
    let pw = if password { ":***" } else { "" };
    let mut s = format!("{scheme}://{user}{pw}@{host}:{port}/{database}");
    if let Some(q) = query {
        // Masks the values of parameters whose name says secret.
        let masked = walsink::redact_url(&format!("x://h/?{q}"));
        s.push_str(masked.strip_prefix("x://h/").unwrap_or("?"));
    }
    s
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
            .field("table", &self.table.plain())
            .field("marker_table", &self.marker_table.name().plain())
            .field("mode", &self.mode)
            .field("create", &self.create)
            .field("lock_timeout", &self.lock_timeout)
            .field(
                "idle_in_transaction_timeout",
                &self.idle_in_transaction_timeout,
            )
            .field("batch_size", &self.batch_size)
            .field("bulk", &self.bulk)
            .field("ssl_mode", &self.ssl_mode)
            .field("tls", &self.tls)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_url_parses_with_its_parameters() {
        let c = Config::from_url(
            "mysql://alice:s3cret@db.local:3307/app?table=events&mode=xa&marker_table=ops.marks&create=false&lock_timeout=2s&idle_in_transaction_timeout=0s&connect_timeout=3s&batch_size=1MiB&bulk=insert",
        )
        .unwrap();
        assert_eq!(c.table.plain(), "events");
        assert_eq!(c.mode, Mode::Xa);
        assert_eq!(c.marker_table.name().plain(), "ops.marks");
        assert!(!c.create);
        assert_eq!(c.lock_timeout, Duration::from_secs(2));
        assert_eq!(c.idle_in_transaction_timeout, Duration::ZERO);
        assert_eq!(c.connect_timeout, Duration::from_secs(3));
        assert_eq!(c.batch_size, 1 << 20);
        assert_eq!(c.bulk, Bulk::Insert);
        assert_eq!((c.host.as_str(), c.port), ("db.local", 3307));
        assert_eq!((c.user.as_str(), c.database.as_str()), ("alice", "app"));
        assert_eq!(c.password.as_ref().map(|p| p.expose()), Some("s3cret"));
        let m = Config::from_url("mariadb://root@127.0.0.1/test?table=t").unwrap();
        assert_eq!(m.mode, Mode::Marker);
        assert_eq!(m.port, 3306);
        assert_eq!(m.bulk, Bulk::LoadData);
        assert!(m.password.is_none());
        assert_eq!(m.marker_table.name().plain(), "walsink_markers");
        assert_eq!(m.to_string(), "mariadb://root@127.0.0.1:3306/test?table=t");
    }

    #[test]
    fn a_password_comes_from_a_file_or_the_environment() {
        let d = tempfile::tempdir().unwrap();
        let f = d.path().join("pw");
        std::fs::write(&f, "fr0m-file\n").unwrap();
        let c = Config::from_url(&format!(
            "mysql://u@h/d?table=t&password_file={}",
            f.display()
        ))
        .unwrap();
        assert_eq!(c.password.as_ref().map(|p| p.expose()), Some("fr0m-file"));
        let e = Config::from_url(&format!(
            "mysql://u:s3cret@h/d?table=t&password_file={}",
            f.display()
        ))
        .unwrap_err()
        .to_string();
        assert!(e.contains("one way only"), "{e}");
        assert!(!e.contains("s3cret"), "{e}");
    }

    #[test]
    fn passwords_never_show() {
        let url = "mysql://alice:s3cret@db:3306/app?table=t";
        let c = Config::from_url(url).unwrap();
        for shown in [c.to_string(), format!("{c:?}"), format!("{:?}", c.password)] {
            assert!(!shown.contains("s3cret"), "{shown}");
        }
        assert_eq!(c.to_string(), "mysql://alice:***@db:3306/app?table=t");
        for bad in [
            "mysql://alice:s3cret@db/app",
            "mysql://alice:s3cret@db/app?table=1x",
            "mysql://alice:s3cret@db/app?table=t&mode=2pc",
            "mysql://alice:s3cret@db/app?table=t&create=maybe",
            "mysql://alice:s3cret@db/app?table=t&lock_timeout=5",
            "mysql://alice:s3cret@db:notaport/app?table=t",
            "mysql://alice:s3cret@db/app?table=t&bogus=1",
            "mysql://alice@db/app?table=t&password=s3cret",
            "mysql://alice:s3cret@db/?table=t",
            "postgres://alice:s3cret@db/app?table=t",
        ] {
            let e = Config::from_url(bad).unwrap_err().to_string();
            assert!(!e.contains("s3cret"), "{bad}: {e}");
        }
    }

    #[test]
    fn tls_takes_mysqls_ssl_mode_and_files() {
        let c = Config::from_url("mysql://u@h/d?table=t").unwrap();
        assert_eq!(
            (c.ssl_mode, c.tls.verify),
            (SslMode::Preferred, Verify::None)
        );
        let c = Config::from_url("mysql://u@h/d?table=t&ssl_mode=disabled").unwrap();
        assert_eq!(c.ssl_mode, SslMode::Disabled);
        let d = tempfile::tempdir().unwrap();
        let ca = walsink_kit::testkit::TestCa::new(d.path(), "ca").unwrap();
        let client = ca.client("client", "walsink").unwrap();
        let c = Config::from_url(&format!(
            "mysql://u@h/d?table=t&ssl_ca={}&ssl_cert={}&ssl_key={}",
            ca.ca_file().display(),
            client.cert.display(),
            client.key.display()
        ))
        .unwrap();
        assert_eq!(c.ssl_mode, SslMode::VerifyIdentity, "ssl_ca alone verifies");
        assert_eq!(c.tls.verify, Verify::Full);
        assert!(c.opts(true).unwrap().ssl_opts().is_some());
        assert!(c.opts(false).unwrap().ssl_opts().is_none());
        let p = |u: String| Config::from_url(&u).unwrap_err().parameter;
        let missing = d.path().join("missing.pem");
        assert_eq!(
            p(format!(
                "mysql://u@h/d?table=t&ssl_ca={}",
                missing.display()
            )),
            "ssl_ca"
        );
        assert_eq!(
            p(format!(
                "mysql://u@h/d?table=t&ssl_cert={}",
                client.cert.display()
            )),
            "ssl_key"
        );
        assert_eq!(
            p(format!(
                "mysql://u@h/d?table=t&ssl_ca={}",
                client.key.display()
            )),
            "ssl_ca",
            "a key is no CA certificate"
        );
        assert_eq!(
            p("mysql://u@h/d?table=t&ssl_mode=VERIFY".into()),
            "ssl_mode"
        );
        assert_eq!(
            p("mysql://u@h/d?table=t&ssl_mode=verify_ca".into()),
            "ssl_mode"
        );
        assert_eq!(
            p(format!(
                "mysql://u@h/d?table=t&ssl_mode=disabled&ssl_ca={}",
                ca.ca_file().display()
            )),
            "ssl_mode"
        );
    }

    #[test]
    fn errors_name_the_parameter() {
        let p = |u: &str| Config::from_url(u).unwrap_err().parameter;
        assert_eq!(p("mysql://u@h/d"), "table");
        assert_eq!(p("mysql://u@h/d?table=t&mode=x"), "mode");
        assert_eq!(p("mysql://u@h/d?table=t&create=x"), "create");
        assert_eq!(p("mysql://u@h/d?table=t&lock_timeout=0s"), "lock_timeout");
        assert_eq!(p("mysql://u@h/d?table=t&batch_size=1"), "batch_size");
        assert_eq!(p("mysql://u@h/d?table=t&marker_table=-"), "marker_table");
        assert_eq!(p("mysql://u@h/d?table=t&table=u"), "table");
        assert_eq!(p("mysql://h/d?table=t"), "user");
        assert_eq!(p("mysql://u@h?table=t"), "database");
        let e = Config::from_url("mysql://u@h/d?table=t&lock_timeot=5s")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("lock_timeot") && e.contains("lock_timeout"),
            "{e}"
        );
    }
}
