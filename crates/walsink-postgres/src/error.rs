//! Errors: the classification of PostgreSQL failures by SQLSTATE into retryable and
//! permanent [`SinkError`]s, and the crate's configuration error.
//!
//! The message of every classified error carries the SQLSTATE, its condition name when
//! known, the server's own message, its detail and hint, and what walsink was doing; it never
//! carries a password (the server never echoes one, and connection errors are described by
//! tokio-postgres without the connection string).

use walsink::SinkError;

/// Whether a failure can go away by itself (retry) or needs an operator (permanent).
///
/// Either way walsink never skips the epoch: a permanent error is retried at the longest
/// backoff until an operator acts (the CLI gives up after `--max-retries` and leaves the
/// records in the log).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Class {
    /// Connection loss, serialization failure, deadlock, shutdown, lack of resources.
    Retryable,
    /// Missing table or column, permission denied, bad data, constraint violations,
    /// configuration the server refuses.
    Permanent,
}

/// Classifies a SQLSTATE (five characters).
///
/// Retryable: class 08 (connection exception), 40001 (serialization failure), 40P01
/// (deadlock), 40003 (statement completion unknown), 57P01/57P02/57P03 (admin shutdown,
/// crash shutdown, cannot connect now), 57014 (query canceled), class 53 (insufficient
/// resources: disk full, out of memory, too many connections), class 58 (I/O error on the
/// server), 55P03 (lock not available), 55006 (object in use), 25P03 (idle-in-transaction
/// timeout), 25P02 (in failed transaction, a session walsink then replaces), XX000 only when
/// the server says so by shutting down (it is permanent here).
///
/// Permanent: everything else, notably class 42 (42P01 undefined table, 42703 undefined
/// column, 42501 insufficient privilege, 42804 datatype mismatch, syntax errors), class 22
/// (data exceptions), class 23 (constraint violations), class 28 (authentication), 3D000
/// (no such database), 55000 (object not in prerequisite state: prepared transactions
/// disabled), 0A000 (feature not supported), 57P04 (database dropped), XX (internal errors,
/// data corrupted), P0 (an exception raised by a trigger).
pub fn classify_sqlstate(code: &str) -> Class {
    const RETRYABLE: &[&str] = &[
        "40001", "40P01", "40003", "57P01", "57P02", "57P03", "57014", "55P03", "55006", "25P03",
        "25P02",
    ];
    if RETRYABLE.contains(&code) {
        return Class::Retryable;
    }
    match code.get(..2) {
        Some("08") | Some("53") | Some("58") => Class::Retryable,
        _ => Class::Permanent,
    }
}

/// The condition name of a SQLSTATE walsink mentions, for messages.
fn condition_name(code: &str) -> Option<&'static str> {
    Some(match code {
        "40001" => "serialization_failure",
        "40P01" => "deadlock_detected",
        "40003" => "statement_completion_unknown",
        "57P01" => "admin_shutdown",
        "57P02" => "crash_shutdown",
        "57P03" => "cannot_connect_now",
        "57P04" => "database_dropped",
        "57014" => "query_canceled",
        "55P03" => "lock_not_available",
        "55006" => "object_in_use",
        "55000" => "object_not_in_prerequisite_state",
        "25P02" => "in_failed_sql_transaction",
        "25P03" => "idle_in_transaction_session_timeout",
        "42P01" => "undefined_table",
        "42703" => "undefined_column",
        "42501" => "insufficient_privilege",
        "42804" => "datatype_mismatch",
        "42601" => "syntax_error",
        "42704" => "undefined_object",
        "22P02" => "invalid_text_representation",
        "22P03" => "invalid_binary_representation",
        "22021" => "character_not_in_repertoire",
        "22001" => "string_data_right_truncation",
        "22003" => "numeric_value_out_of_range",
        "23505" => "unique_violation",
        "23502" => "not_null_violation",
        "23503" => "foreign_key_violation",
        "23514" => "check_violation",
        "28000" => "invalid_authorization_specification",
        "28P01" => "invalid_password",
        "3D000" => "invalid_catalog_name",
        "53100" => "disk_full",
        "53200" => "out_of_memory",
        "53300" => "too_many_connections",
        "0A000" => "feature_not_supported",
        _ => match code.get(..2)? {
            "08" => "connection_exception",
            "22" => "data_exception",
            "23" => "integrity_constraint_violation",
            "42" => "syntax_error_or_access_rule_violation",
            "53" => "insufficient_resources",
            "58" => "system_error",
            _ => return None,
        },
    })
}

/// What a tokio-postgres error says, classified: the SQLSTATE and server message when the
/// server sent one, connection loss (retryable) otherwise, or a client-side conversion
/// failure (permanent: a record the mapping cannot turn into the table's column types).
pub fn classify(e: &tokio_postgres::Error) -> (Class, String) {
    if let Some(db) = e.as_db_error() {
        let code = db.code().code();
        let mut msg = format!("SQLSTATE {code}");
        if let Some(name) = condition_name(code) {
            msg.push_str(&format!(" ({name})"));
        }
        msg.push_str(&format!(": {}", db.message()));
        if let Some(d) = db.detail() {
            msg.push_str(&format!("; detail: {d}"));
        }
        if let Some(h) = db.hint() {
            msg.push_str(&format!("; hint: {h}"));
        }
        return (classify_sqlstate(code), msg);
    }
    // TLS: a certificate the settings refuse, or a server without TLS under sslmode=require
    // and stricter. Configuration, not weather: permanent, with the reason named.
    if let Some(f) = walsink_kit::tls::failure(e) {
        return (
            Class::Permanent,
            format!(
                "TLS handshake failed: {f}; fix sslrootcert/sslmode or the server's certificate"
            ),
        );
    }
    if chain_mentions(e, "server does not support TLS") {
        return (
            Class::Permanent,
            "the server does not accept TLS connections, which sslmode=require (and verify-ca, verify-full) insists on: turn ssl on in the server or, to accept an unencrypted connection, use sslmode=prefer".into(),
        );
    }
    // No SQLSTATE: the connection (closed, I/O, a protocol error after a server crash) or the
    // client (a value that does not convert to the column's type).
    let text = e.to_string();
    let io = std::error::Error::source(e).is_some_and(|s| s.is::<std::io::Error>());
    // tokio-postgres's own text names only the kind ("error performing TLS handshake"); the
    // reason is in its source chain.
    let mut shown = text.clone();
    let mut cause = std::error::Error::source(e);
    while let Some(c) = cause {
        shown.push_str(&format!(": {c}"));
        cause = c.source();
    }
    if e.is_closed() || io || text.contains("connection") || text.contains("unexpected message") {
        (Class::Retryable, format!("connection lost: {shown}"))
    } else {
        (Class::Permanent, shown)
    }
}

/// Whether the text of `e` or of an error in its chain holds `needle`.
fn chain_mentions(e: &(dyn std::error::Error + 'static), needle: &str) -> bool {
    let mut cur = Some(e);
    while let Some(e) = cur {
        if e.to_string().contains(needle) {
            return true;
        }
        cur = e.source();
    }
    false
}

/// A [`SinkError`] for `e`, raised while doing `what` (for example `COPY into "events"`).
pub fn sink_error(what: &str, e: tokio_postgres::Error) -> SinkError {
    let (class, msg) = classify(&e);
    let message = format!("PostgreSQL {what}: {msg}");
    let mut err = match class {
        Class::Retryable => SinkError::retryable(message),
        Class::Permanent => SinkError::permanent(message),
    };
    if let Some(db) = e.as_db_error() {
        err = err.with_code(db.code().code());
    }
    err.with_source(e)
}

/// A bad `--sink` URL or configuration: the kit's one error of every target
/// ([`walsink_kit::ConfigError`]), naming the parameter and never holding a password.
pub use walsink_kit::ConfigError;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sqlstates_are_classified() {
        for code in [
            "08000", "08003", "08006", "08001", "08P01", "40001", "40P01", "57P01", "57P02",
            "57P03", "53100", "53200", "53300", "58030", "55P03", "57014", "25P03",
        ] {
            assert_eq!(classify_sqlstate(code), Class::Retryable, "{code}");
        }
        for code in [
            "42P01", "42703", "42501", "42804", "42601", "22001", "22P02", "22P03", "22021",
            "23505", "23502", "23503", "23514", "28P01", "28000", "3D000", "55000", "0A000",
            "57P04", "XX000", "XX001", "P0001",
        ] {
            assert_eq!(classify_sqlstate(code), Class::Permanent, "{code}");
        }
    }

    #[test]
    fn condition_names_cover_the_classes_walsink_reports() {
        assert_eq!(condition_name("42P01"), Some("undefined_table"));
        assert_eq!(condition_name("08006"), Some("connection_exception"));
        assert_eq!(condition_name("22012"), Some("data_exception"));
        assert_eq!(condition_name("HV000"), None);
    }
}
