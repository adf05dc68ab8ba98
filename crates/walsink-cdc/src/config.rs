//! The apply side's configuration, from the CLI's `--sink` URL, and the connection URL
//! parser shared with the capture side's `--source`.

use crate::event::PositionField;
use serde::{Deserialize, Serialize};
use std::fmt;
use std::time::Duration;

/// A parsed `postgres://USER[:PASSWORD]@HOST[:PORT]/DB?k=v&…` URL. The password is kept out
/// of `Debug` and `Display`.
#[derive(Clone)]
pub struct PgUrl {
    /// User name.
    pub user: String,
    password: Option<String>,
    /// Host name or address.
    pub host: String,
    /// Port (default 5432).
    pub port: u16,
    /// Database name (default: the user name).
    pub dbname: String,
    /// The query parameters in order, percent-decoded.
    pub params: Vec<(String, String)>,
}

fn decode(s: &str, what: &str) -> Result<String, String> {
    // The kit's one rule for every target URL: strict escapes, `+` kept a plus sign.
    walsink_kit::params::percent_decode(s).map_err(|e| format!("the {what} {e}"))
}

impl PgUrl {
    /// Parses the URL; errors name the part that is wrong (never the password).
    pub fn parse(url: &str) -> Result<PgUrl, String> {
        let rest = url
            .strip_prefix("postgres://")
            .or_else(|| url.strip_prefix("postgresql://"))
            .ok_or("the URL must start with postgres:// or postgresql://")?;
        let (main, query) = rest.split_once('?').unwrap_or((rest, ""));
        let (authority, path) = main.split_once('/').unwrap_or((main, ""));
        let (userinfo, hostport) = match authority.rsplit_once('@') {
            Some((u, h)) => (Some(u), h),
            None => (None, authority),
        };
        let (user, password) = match userinfo {
            Some(u) => match u.split_once(':') {
                Some((u, p)) => (decode(u, "user")?, Some(decode(p, "password")?)),
                None => (decode(u, "user")?, None),
            },
            None => ("postgres".to_string(), None),
        };
        let (host, port) = match hostport.rsplit_once(':') {
            Some((h, p)) => (
                h.to_string(),
                p.parse::<u16>()
                    .map_err(|_| format!("port {p:?} is not a number from 1 to 65535"))?,
            ),
            None => (hostport.to_string(), 5432),
        };
        if host.is_empty() {
            return Err("the URL names no host (postgres://USER@HOST:PORT/DB)".into());
        }
        let dbname = if path.is_empty() {
            user.clone()
        } else {
            decode(path, "database name")?
        };
        let mut params = Vec::new();
        for kv in query.split('&').filter(|s| !s.is_empty()) {
            let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
            params.push((decode(k, "parameter name")?, decode(v, "parameter value")?));
        }
        Ok(PgUrl {
            user,
            password,
            host,
            port,
            dbname,
            params,
        })
    }

    /// The client configuration (connect timeout 10 s).
    pub fn client_config(&self, application: &str) -> tokio_postgres::Config {
        let mut c = tokio_postgres::Config::new();
        c.user(&self.user)
            .host(&self.host)
            .port(self.port)
            .dbname(&self.dbname)
            .application_name(application)
            .connect_timeout(Duration::from_secs(10));
        if let Some(p) = &self.password {
            c.password(p.as_str());
        }
        c
    }

    /// The same URL with a password that is not shown.
    pub fn shown(&self) -> String {
        let pw = if self.password.is_some() { ":***" } else { "" };
        let q: Vec<String> = self
            .params
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect();
        let q = if q.is_empty() {
            String::new()
        } else {
            format!("?{}", q.join("&"))
        };
        format!(
            "postgres://{}{pw}@{}:{}/{}{q}",
            self.user, self.host, self.port, self.dbname
        )
    }
}

impl fmt::Debug for PgUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.shown())
    }
}

impl fmt::Display for PgUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.shown())
    }
}

/// Parses a boolean parameter.
pub(crate) fn flag(k: &str, v: &str) -> Result<bool, String> {
    match v {
        "true" | "1" | "on" | "yes" => Ok(true),
        "false" | "0" | "off" | "no" => Ok(false),
        _ => Err(format!("parameter {k}={v:?}: expected true or false")),
    }
}

/// Where and how events are applied: `postgres://USER@HOST:PORT/DB?schema=NAME`.
///
/// Parameters: `schema` (target schema, default `public`), `add_missing_columns` (schema
/// evolution: add a column an event carries and the table lacks, default false: such an event
/// is a permanent error), `position` (the dotted field holding the source position, default
/// `source.lsn`).
#[derive(Clone, Debug)]
pub struct Config {
    /// The connection.
    pub url: PgUrl,
    /// Target schema: events for `source.table` T go to `SCHEMA.T`.
    pub schema: String,
    /// Add missing columns instead of failing.
    pub add_missing_columns: bool,
    /// Where each event's source position is.
    pub position: PositionField,
    /// At most this many changes are held in memory before they are sent (inside the
    /// epoch's transaction; default 20 000). The sink holds fewer anyway: a quarter of the
    /// epoch, between 2 048 and 12 000, and sends the oldest 2 048 when it holds that many,
    /// so a value below 12 000 changes how much it holds, and one below 2 048 how often it
    /// flushes.
    pub max_held: usize,
}

impl Config {
    /// Parses the `--sink` URL. Errors name the bad parameter.
    pub fn from_url(url: &str) -> Result<Config, String> {
        let url = PgUrl::parse(url)?;
        let mut c = Config {
            schema: "public".into(),
            add_missing_columns: false,
            position: PositionField::default(),
            max_held: 20_000,
            url: url.clone(),
        };
        for (k, v) in &url.params {
            match k.as_str() {
                "schema" => {
                    let ok = !v.is_empty()
                        && v.len() <= 63
                        && !v.as_bytes()[0].is_ascii_digit()
                        && v.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_');
                    if !ok {
                        return Err(format!(
                            "parameter schema={v:?}: expected 1 to 63 letters, digits or _, not starting with a digit"
                        ));
                    }
                    c.schema = v.clone()
                }
                "add_missing_columns" => c.add_missing_columns = flag(k, v)?,
                "position" => c.position = PositionField::new(v)?,
                "max_held" => {
                    c.max_held = v
                        .parse()
                        .ok()
                        .filter(|n| *n > 0)
                        .ok_or_else(|| format!("parameter max_held={v:?}: expected a positive count"))?
                }
                _ => {
                    return Err(format!(
                        "unknown parameter {k:?} (known: schema, add_missing_columns, position, max_held)"
                    ))
                }
            }
        }
        Ok(c)
    }
}

impl fmt::Display for Config {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.url.shown())
    }
}

/// Quotes an SQL identifier.
pub fn ident(s: &str) -> String {
    format!("\"{}\"", s.replace('"', "\"\""))
}

/// A source table, `table` (schema `public`) or `schema.table`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TableRef {
    /// Schema.
    pub schema: String,
    /// Table name.
    pub name: String,
}

impl TableRef {
    /// `"schema"."name"`, quoted.
    pub fn qualified(&self) -> String {
        format!("{}.{}", ident(&self.schema), ident(&self.name))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_parse_and_passwords_never_show() {
        let c = Config::from_url(
            "postgres://alice:s%3Acret@db.local:6543/app?schema=replica&add_missing_columns=true",
        )
        .unwrap();
        assert_eq!(c.url.user, "alice");
        assert_eq!(c.url.password.as_deref(), Some("s:cret"));
        assert_eq!((c.url.host.as_str(), c.url.port), ("db.local", 6543));
        assert_eq!(c.schema, "replica");
        assert!(c.add_missing_columns);
        for shown in [format!("{c}"), format!("{c:?}"), c.url.shown()] {
            assert!(!shown.contains("cret"), "{shown}");
        }
        assert!(c.to_string().contains("alice:***@db.local:6543/app"));
    }

    #[test]
    fn bad_parameters_are_named() {
        let e = Config::from_url("postgres://u@h/db?sheme=x").unwrap_err();
        assert!(e.contains("sheme"), "{e}");
        let e = Config::from_url("postgres://u@h:99999/db").unwrap_err();
        assert!(e.contains("99999"), "{e}");
        let e = Config::from_url("postgres://u@h/db?add_missing_columns=maybe").unwrap_err();
        assert!(e.contains("add_missing_columns"), "{e}");
        assert!(Config::from_url("mysql://u@h/db").is_err());
        assert_eq!(ident("a\"b"), "\"a\"\"b\"");
    }
}
