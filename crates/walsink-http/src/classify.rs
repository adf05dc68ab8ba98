//! How an answer (or the lack of one) is classified: done, retry (and when), or give up.
//! Pure, so every rule is tested without a server.

use std::time::{Duration, SystemTime};

/// What one request's outcome means for its chunk.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// 2xx: the receiver has the chunk.
    Done,
    /// 408, 409, 425, 429, 5xx, a connection error or a timeout: send the same chunk again,
    /// after `after` if the server said when (`Retry-After`).
    Retry {
        /// The server's `Retry-After`, if it sent a usable one (not capped here).
        after: Option<Duration>,
    },
    /// Any other status (other 4xx, 3xx, 1xx): retrying the same request cannot help.
    Permanent,
}

/// Classifies an HTTP status. `retry_after` is the raw `Retry-After` header, if any.
pub fn status(code: u16, retry_after: Option<&str>, now: SystemTime) -> Outcome {
    match code {
        200..=299 => Outcome::Done,
        408 | 409 | 425 | 429 | 500..=599 => Outcome::Retry {
            after: retry_after.and_then(|v| parse_retry_after(v, now)),
        },
        _ => Outcome::Permanent,
    }
}

/// A `Retry-After` value: delay seconds (`120`) or an HTTP date (`Wed, 21 Oct 2015 07:28:00
/// GMT`, the time left until then, zero if past). `None` when it is neither.
pub fn parse_retry_after(v: &str, now: SystemTime) -> Option<Duration> {
    let v = v.trim();
    if let Ok(secs) = v.parse::<u64>() {
        return Some(Duration::from_secs(secs));
    }
    let at = httpdate::parse_http_date(v).ok()?;
    Some(at.duration_since(now).unwrap_or(Duration::ZERO))
}

/// The start of a response body for an error message: at most `max` bytes, as text with
/// control characters escaped.
pub fn body_start(body: &[u8], max: usize) -> String {
    let cut = &body[..body.len().min(max)];
    let text = String::from_utf8_lossy(cut);
    let mut out: String = text
        .chars()
        .flat_map(|c| {
            if c.is_control() {
                c.escape_default().collect::<Vec<_>>()
            } else {
                vec![c]
            }
        })
        .collect();
    if body.len() > max {
        out.push('…');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_are_classified() {
        let now = SystemTime::now();
        for ok in [200, 201, 202, 204, 299] {
            assert_eq!(status(ok, None, now), Outcome::Done, "{ok}");
        }
        for retry in [408, 409, 425, 429, 500, 502, 503, 504, 599] {
            assert_eq!(
                status(retry, None, now),
                Outcome::Retry { after: None },
                "{retry}"
            );
        }
        for perm in [
            100, 301, 302, 304, 400, 401, 403, 404, 405, 410, 413, 415, 422, 451,
        ] {
            assert_eq!(status(perm, None, now), Outcome::Permanent, "{perm}");
        }
    }

    #[test]
    fn retry_after_takes_seconds_and_dates() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_445_412_400);
        assert_eq!(parse_retry_after(" 7 ", now), Some(Duration::from_secs(7)));
        assert_eq!(
            parse_retry_after("Wed, 21 Oct 2015 07:28:00 GMT", now),
            Some(Duration::from_secs(80))
        );
        assert_eq!(
            parse_retry_after("Wed, 21 Oct 2015 07:00:00 GMT", now),
            Some(Duration::ZERO),
            "a date in the past means now"
        );
        assert_eq!(parse_retry_after("soon", now), None);
        assert_eq!(parse_retry_after("-3", now), None);
        assert_eq!(
            status(503, Some("2"), now),
            Outcome::Retry {
                after: Some(Duration::from_secs(2))
            }
        );
    }

    #[test]
    fn body_starts_are_short_and_printable() {
        assert_eq!(body_start(b"bad\nrequest", 100), "bad\\nrequest");
        assert_eq!(body_start(b"abcdef", 3), "abc…");
        assert_eq!(body_start(&[0xff, b'a'], 10), "\u{fffd}a");
    }
}
