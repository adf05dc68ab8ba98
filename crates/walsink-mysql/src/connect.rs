//! [`Config::connect`]: one connection with the configuration's session settings, shared by
//! the sink and by other users of the same URL (the CDC apply).

use crate::config::Config;
use crate::error::sink_error;
use mysql_async::prelude::Queryable;
use mysql_async::Conn;
use walsink::SinkError;

impl Config {
    /// A connection without any set-up of the tables, with the session settings of the
    /// configuration (`utf8mb4`, strict `sql_mode`, lock timeouts, MariaDB's
    /// `idle_transaction_timeout`), within `connect_timeout`, over TLS as `ssl_mode` asks.
    ///
    /// # Errors
    /// A retryable [`SinkError`] when the server does not answer in time or the connection
    /// fails on the way; a permanent one for a refused login or a TLS failure, naming it.
    ///
    /// # Cancel safety
    /// Cancel safe: a connection half made is dropped.
    pub async fn connect(&self) -> Result<Conn, SinkError> {
        let limit = self.connect_timeout;
        match tokio::time::timeout(limit, self.connect_unbounded()).await {
            Ok(r) => r,
            Err(_) => Err(SinkError::retryable(format!(
                "connect to {}: no answer from the server within {limit:?} (connect_timeout)",
                self
            ))),
        }
    }

    async fn connect_unbounded(&self) -> Result<Conn, SinkError> {
        let shown = self.to_string();
        let mut conn = self.open(&shown).await?;
        let version: Option<String> = conn
            .query_first("SELECT VERSION()")
            .await
            .map_err(|e| sink_error("read the server's version", e))?;
        if version.is_some_and(|v| v.contains("MariaDB")) {
            conn.query_drop(format!(
                "SET SESSION idle_transaction_timeout = {}",
                self.idle_seconds()
            ))
            .await
            .map_err(|e| sink_error("set idle_transaction_timeout", e))?;
        }
        Ok(conn)
    }

    /// A connection as `ssl_mode` asks: `preferred` falls back to plain text when the server
    /// offers no TLS (as MySQL's clients do); a failed handshake is a permanent error naming
    /// the reason (a wrong CA, a host name the certificate lacks), never a retry.
    async fn open(&self, shown: &str) -> Result<Conn, SinkError> {
        use crate::config::SslMode;
        let opts = |tls: bool| {
            self.opts(tls)
                .map_err(|e| SinkError::permanent(format!("connect to {shown}: {e}")))
        };
        let mode = self.ssl_mode;
        let first = Conn::new(opts(mode != SslMode::Disabled)?).await;
        match first {
            Ok(c) => Ok(c),
            Err(mysql_async::Error::Driver(mysql_async::DriverError::NoClientSslFlagFromServer))
                if mode == SslMode::Preferred =>
            {
                Conn::new(opts(false)?)
                    .await
                    .map_err(|e| sink_error(&format!("connect to {shown}"), e))
            }
            Err(mysql_async::Error::Driver(mysql_async::DriverError::NoClientSslFlagFromServer)) => {
                Err(SinkError::permanent(format!(
                    "MySQL connect to {shown}: the server offers no TLS but ssl_mode={} requires it (enable TLS on the server, or use ssl_mode=preferred or disabled)",
                    mode.name()
                )))
            }
            Err(e) => match walsink_kit::tls::failure(&e) {
                Some(f) if mode != SslMode::Disabled => Err(SinkError::permanent(format!(
                    "MySQL connect to {shown}: TLS with ssl_mode={}: {f}",
                    mode.name()
                ))
                .with_source(e)),
                _ => Err(sink_error(&format!("connect to {shown}"), e)),
            },
        }
    }
}
