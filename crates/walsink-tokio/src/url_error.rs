//! [`UrlError`]: a target URL that does not parse, shared by the target crates whose
//! configuration comes from a `--sink` URL.

use std::fmt;

/// A target's configuration URL that does not parse, naming the parameter at fault. Never
/// holds a password (the target crates build it from the parsed parts or a masked URL).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UrlError {
    /// The target, as it starts the message (`redis`, `nats`).
    pub target: &'static str,
    /// The URL parameter or part at fault (`key`, `stream`, `host`, …).
    pub parameter: String,
    /// What is wrong with it.
    pub reason: String,
}

impl UrlError {
    /// An error of `target`'s URL about `parameter`.
    pub fn new(target: &'static str, parameter: &str, reason: impl Into<String>) -> UrlError {
        UrlError {
            target,
            parameter: parameter.to_string(),
            reason: reason.into(),
        }
    }
}

impl fmt::Display for UrlError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} sink URL: {}: {}",
            self.target, self.parameter, self.reason
        )
    }
}

impl std::error::Error for UrlError {}
