//! Errors: the classification of MySQL and MariaDB failures by the server's error number into
//! retryable and permanent [`SinkError`]s, and the crate's configuration error.
//!
//! The message of every classified error carries the server's error number, its symbol when
//! walsink knows it, the SQLSTATE, the server's own message and what walsink was doing; the
//! number is also kept in the error's source ([`server_code`]). It never carries a password:
//! the server never echoes one, and connection errors are described by the client library
//! without the connection options.

use walsink::SinkError;

/// Whether a failure can go away by itself (retry) or needs an operator (permanent).
///
/// Either way walsink never skips the epoch: a permanent error is retried at the longest
/// backoff until an operator acts (the CLI gives up after `--max-retries` and leaves the
/// records in the log).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Class {
    /// Connection loss, deadlock, lock wait timeout, a killed query or connection, a server
    /// shutting down, too many connections.
    Retryable,
    /// Missing table or column, access denied, bad data, a statement the server refuses.
    Permanent,
}

/// The server error numbers walsink treats as retryable, with their symbols.
const RETRYABLE: &[(u16, &str)] = &[
    (1040, "ER_CON_COUNT_ERROR"),
    (1053, "ER_SERVER_SHUTDOWN"),
    (1077, "ER_NORMAL_SHUTDOWN"),
    (1079, "ER_SHUTDOWN_COMPLETE"),
    (1080, "ER_FORCING_CLOSE"),
    (1081, "ER_IPSOCK_ERROR"),
    (1152, "ER_ABORTING_CONNECTION"),
    (1158, "ER_NET_READ_ERROR"),
    (1159, "ER_NET_READ_INTERRUPTED"),
    (1160, "ER_NET_ERROR_ON_WRITE"),
    (1161, "ER_NET_WRITE_INTERRUPTED"),
    (1180, "ER_ERROR_DURING_COMMIT"),
    (1181, "ER_ERROR_DURING_ROLLBACK"),
    (1184, "ER_NEW_ABORTING_CONNECTION"),
    (1203, "ER_TOO_MANY_USER_CONNECTIONS"),
    (1205, "ER_LOCK_WAIT_TIMEOUT"),
    (1206, "ER_LOCK_TABLE_FULL"),
    (1213, "ER_LOCK_DEADLOCK"),
    (1317, "ER_QUERY_INTERRUPTED"),
    (1613, "ER_XA_RBTIMEOUT"),
    (1614, "ER_XA_RBDEADLOCK"),
    (1927, "ER_CONNECTION_KILLED"),
    (2006, "CR_SERVER_GONE_ERROR"),
    (2013, "CR_SERVER_LOST"),
    (3024, "ER_QUERY_TIMEOUT"),
    (4031, "ER_CLIENT_INTERACTION_TIMEOUT"),
];

/// Symbols of permanent error numbers walsink names in messages.
const PERMANENT: &[(u16, &str)] = &[
    (1044, "ER_DBACCESS_DENIED_ERROR"),
    (1045, "ER_ACCESS_DENIED_ERROR"),
    (1048, "ER_BAD_NULL_ERROR"),
    (1049, "ER_BAD_DB_ERROR"),
    (1054, "ER_BAD_FIELD_ERROR"),
    (1062, "ER_DUP_ENTRY"),
    (1064, "ER_PARSE_ERROR"),
    (1142, "ER_TABLEACCESS_DENIED_ERROR"),
    (1146, "ER_NO_SUCH_TABLE"),
    (1264, "ER_WARN_DATA_OUT_OF_RANGE"),
    (1290, "ER_OPTION_PREVENTS_STATEMENT"),
    (1366, "ER_TRUNCATED_WRONG_VALUE_FOR_FIELD"),
    (1397, "ER_XAER_NOTA"),
    (1398, "ER_XAER_INVAL"),
    (1399, "ER_XAER_RMFAIL"),
    (1400, "ER_XAER_OUTSIDE"),
    (1401, "ER_XAER_RMERR"),
    (1406, "ER_DATA_TOO_LONG"),
    (1440, "ER_XAER_DUPID"),
    (1153, "ER_NET_PACKET_TOO_LARGE"),
    (1227, "ER_SPECIFIC_ACCESS_DENIED_ERROR"),
];

/// Classifies a server error number.
///
/// Retryable: 1213 deadlock, 1205 lock wait timeout, 1317 query interrupted, 1927 connection
/// killed, 1040 and 1203 too many connections, 1053/1077/1079/1080 server shutting down, the
/// network errors 1152–1161 and 1184, 1180/1181 errors during COMMIT or ROLLBACK, 1206 lock
/// table full, 1613/1614 an XA transaction rolled back for a timeout or a deadlock, 3024
/// query timeout, 4031 an idle connection closed by the server, and the client's 2006
/// (server gone) and 2013 (lost connection).
///
/// Permanent: everything else, notably 1146 no such table, 1054 unknown column, 1045 and
/// 1044 access denied, 1142 table access denied, 1049 no such database, 1406 data too long,
/// 1366 incorrect value, 1048 a NULL into a NOT NULL column, 1064 a syntax error, 1290 a
/// read-only server.
pub fn classify_code(code: u16) -> Class {
    if RETRYABLE.iter().any(|(c, _)| *c == code) {
        Class::Retryable
    } else {
        Class::Permanent
    }
}

/// The symbol of a server error number walsink knows (`ER_LOCK_DEADLOCK` for 1213).
pub fn symbol(code: u16) -> Option<&'static str> {
    RETRYABLE
        .iter()
        .chain(PERMANENT)
        .find(|(c, _)| *c == code)
        .map(|(_, s)| *s)
}

/// What a mysql_async error says, classified: the server's error number and message when the
/// server sent one, connection loss (retryable) for I/O and closed connections, and the
/// client's own refusals (permanent) otherwise.
pub fn classify(e: &mysql_async::Error) -> (Class, String) {
    use mysql_async::{DriverError, Error};
    match e {
        Error::Server(s) => {
            let mut msg = format!("error {}", s.code);
            if let Some(sym) = symbol(s.code) {
                msg.push_str(&format!(" ({sym})"));
            }
            msg.push_str(&format!(", SQLSTATE {}: {}", s.state, s.message));
            (classify_code(s.code), msg)
        }
        Error::Io(io) => (Class::Retryable, format!("connection lost: {io}")),
        Error::Driver(DriverError::ConnectionClosed) => (
            Class::Retryable,
            "connection lost: the server closed it".to_string(),
        ),
        Error::Driver(
            d @ (DriverError::PacketOutOfOrder
            | DriverError::UnexpectedPacket { .. }
            | DriverError::BadCompressedPacketHeader),
        ) => (
            Class::Retryable,
            format!("connection lost: a broken exchange with the server ({d})"),
        ),
        Error::Driver(d) => (Class::Permanent, d.to_string()),
        Error::Url(u) => (Class::Permanent, u.to_string()),
        Error::Other(o) => (Class::Permanent, o.to_string()),
    }
}

/// A [`SinkError`] for `e`, raised while doing `what` (for example `INSERT into events`).
pub fn sink_error(what: &str, e: mysql_async::Error) -> SinkError {
    let (class, msg) = classify(&e);
    let message = format!("MySQL {what}: {msg}");
    let mut err = match class {
        Class::Retryable => SinkError::retryable(message),
        Class::Permanent => SinkError::permanent(message),
    };
    if let mysql_async::Error::Server(se) = &e {
        err = err.with_code(se.code.to_string());
    }
    err.with_source(e)
}

/// The server's error number behind a [`SinkError`] of this crate, if the server sent one.
pub fn server_code(e: &SinkError) -> Option<u16> {
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        if let Some(mysql_async::Error::Server(se)) = s.downcast_ref::<mysql_async::Error>() {
            return Some(se.code);
        }
        source = s.source();
    }
    None
}

/// The server's error number of a mysql_async error, if the server sent one.
pub(crate) fn code_of(e: &mysql_async::Error) -> Option<u16> {
    match e {
        mysql_async::Error::Server(s) => Some(s.code),
        _ => None,
    }
}

/// A bad `--sink` URL: names the parameter at fault, never holds a password (the kit's
/// [`walsink_kit::ConfigError`]).
pub use walsink_kit::ConfigError;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_numbers_are_classified() {
        for code in [1213, 1205, 1317, 1927, 1040, 1053, 2006, 2013, 1614, 1613] {
            assert_eq!(classify_code(code), Class::Retryable, "{code}");
        }
        for code in [
            1146, 1054, 1045, 1044, 1142, 1049, 1406, 1366, 1048, 1064, 1062,
        ] {
            assert_eq!(classify_code(code), Class::Permanent, "{code}");
        }
    }

    #[test]
    fn a_server_error_keeps_its_number_and_class() {
        let e = mysql_async::Error::Server(mysql_async::ServerError {
            code: 1213,
            message: "Deadlock found when trying to get lock".into(),
            state: "40001".into(),
        });
        let s = sink_error("INSERT into t", e);
        assert_eq!(s.class(), walsink::SinkErrorClass::Retryable);
        assert_eq!(server_code(&s), Some(1213));
        let text = s.to_string();
        assert!(
            text.contains("1213") && text.contains("ER_LOCK_DEADLOCK"),
            "{text}"
        );
        let e = mysql_async::Error::Server(mysql_async::ServerError {
            code: 1146,
            message: "Table 'test.nope' doesn't exist".into(),
            state: "42S02".into(),
        });
        let s = sink_error("INSERT into nope", e);
        assert_eq!(s.class(), walsink::SinkErrorClass::Permanent);
        assert_eq!(server_code(&s), Some(1146));
        let closed = sink_error(
            "COMMIT",
            mysql_async::Error::Driver(mysql_async::DriverError::ConnectionClosed),
        );
        assert_eq!(closed.class(), walsink::SinkErrorClass::Retryable);
        assert_eq!(server_code(&closed), None);
    }
}
