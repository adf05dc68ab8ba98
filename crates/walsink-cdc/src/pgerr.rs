//! PostgreSQL errors classified once: retryable or permanent, with the SQLSTATE kept in the
//! message.

use walsink::SinkError;

/// Whether a SQLSTATE names a condition that can pass by itself: connection loss (class 08),
/// serialization failures and deadlocks (40), insufficient resources (53), an operator's
/// intervention or a server shutting down (57), system errors (58), a lock not available
/// (55P03) or a cancelled statement (57014, in class 57).
pub fn retryable_code(code: &str) -> bool {
    matches!(&code[..code.len().min(2)], "08" | "40" | "53" | "57" | "58") || code == "55P03"
}

/// A client error as a [`SinkError`], with `context` (what was being done) and the server's
/// SQLSTATE and message. Errors without a server code (I/O, a closed connection) are
/// retryable.
pub fn classify(e: tokio_postgres::Error, context: &str) -> SinkError {
    match e.as_db_error() {
        Some(db) => {
            let code = db.code().code().to_string();
            let msg = format!("{context}: SQLSTATE {code}: {}", db.message());
            let msg = match db.detail() {
                Some(d) => format!("{msg} ({d})"),
                None => msg,
            };
            if retryable_code(&code) {
                SinkError::retryable(msg).with_source(e)
            } else {
                SinkError::permanent(msg).with_source(e)
            }
        }
        None => SinkError::retryable(format!("{context}: {e}")).with_source(e),
    }
}

#[cfg(test)]
mod tests {
    use super::retryable_code;

    #[test]
    fn codes_are_classified() {
        for c in [
            "08006", "40001", "40P01", "53300", "57P01", "55P03", "57014",
        ] {
            assert!(retryable_code(c), "{c}");
        }
        for c in ["42703", "42P01", "23505", "22P02", "0A000"] {
            assert!(!retryable_code(c), "{c}");
        }
    }
}
