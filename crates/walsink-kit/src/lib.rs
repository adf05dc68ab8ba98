//! The target kit: what every walsink target shares, so that a target crate holds only its
//! client code and its mapping.
//!
//! - [`params`]: one grammar for the parameters of a `--sink` URL (percent-decoding in which
//!   `+` stays `+`, durations, byte sizes, booleans), with every parameter given twice or not
//!   known refused by name;
//! - [`secret`]: a [`Secret`] that never shows in `Debug` or `Display`, read from the URL, a
//!   file (`password_file=`) or an environment variable (`password_env=`);
//! - [`tls`]: TLS client settings over rustls ([`TlsOptions`]: a CA file, a client
//!   certificate, how much of the server's certificate is verified) and
//!   [`tls::failure`], which names why a handshake failed (an unknown CA, an expired
//!   certificate, a host name the certificate does not carry);
//! - `testkit` (feature `testkit`): certificates made on the fly for the targets' TLS tests.
//!
//! Errors are [`ConfigError`]s naming the target and the parameter at fault; none holds a
//! secret.

#![warn(missing_docs)]

pub mod params;
pub mod secret;
#[cfg(feature = "testkit")]
pub mod testkit;
pub mod tls;

pub use params::Params;
pub use secret::Secret;
pub use tls::{TlsOptions, Verify};

/// A configuration that does not parse, naming the target and the parameter at fault. Its
/// message reads `TARGET sink URL: PARAMETER: REASON`; it never holds a secret.
pub type ConfigError = walsink_tokio::UrlError;
