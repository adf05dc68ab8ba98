//! TLS for the connection: libpq's `sslmode` ([`SslMode`]) and a tokio-postgres
//! `MakeTlsConnect` over tokio-rustls ([`RustlsConnect`]) that uses the kit's rustls
//! settings ([`walsink_kit::TlsOptions`], ring, no OpenSSL) and gives the server
//! SCRAM channel binding (`tls-server-end-point`).

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use rustls::pki_types::ServerName;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio_postgres::tls::{ChannelBinding, MakeTlsConnect, TlsConnect, TlsStream};

/// libpq's `sslmode`: whether TLS is used and how much of the server's certificate is
/// verified.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SslMode {
    /// No TLS (`disable`).
    Disable,
    /// TLS when the server offers it, plain otherwise (`prefer`, libpq's default). The
    /// certificate is not verified unless `sslrootcert` is given (then its chain is), and a
    /// failed handshake falls back to a plain connection, as libpq does.
    Prefer,
    /// TLS or no connection (`require`); the certificate is not verified, unless `sslrootcert`
    /// is given: then, as in libpq, the chain is verified as with `verify-ca`.
    Require,
    /// TLS, the chain verified up to a trusted CA, any host name (`verify-ca`).
    VerifyCa,
    /// TLS, the chain and the host name verified (`verify-full`, the recommended setting).
    VerifyFull,
}

impl SslMode {
    /// The mode named `s` as libpq names it.
    pub fn parse(s: &str) -> Option<SslMode> {
        Some(match s {
            "disable" => SslMode::Disable,
            "prefer" => SslMode::Prefer,
            "require" => SslMode::Require,
            "verify-ca" => SslMode::VerifyCa,
            "verify-full" => SslMode::VerifyFull,
            _ => return None,
        })
    }

    /// libpq's name of the mode.
    pub fn name(self) -> &'static str {
        match self {
            SslMode::Disable => "disable",
            SslMode::Prefer => "prefer",
            SslMode::Require => "require",
            SslMode::VerifyCa => "verify-ca",
            SslMode::VerifyFull => "verify-full",
        }
    }

    /// What tokio-postgres does with the server's answer to the TLS request.
    pub(crate) fn wire(self) -> tokio_postgres::config::SslMode {
        match self {
            SslMode::Disable => tokio_postgres::config::SslMode::Disable,
            SslMode::Prefer => tokio_postgres::config::SslMode::Prefer,
            _ => tokio_postgres::config::SslMode::Require,
        }
    }
}

/// A tokio-postgres `MakeTlsConnect` over tokio-rustls with a given rustls configuration.
#[derive(Clone)]
pub struct RustlsConnect(Arc<rustls::ClientConfig>);

impl RustlsConnect {
    /// A connector with `config` (for example from [`walsink_kit::TlsOptions::client_config`]).
    pub fn new(config: rustls::ClientConfig) -> RustlsConnect {
        RustlsConnect(Arc::new(config))
    }
}

impl<S> MakeTlsConnect<S> for RustlsConnect
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    type Stream = RustlsStream<S>;
    type TlsConnect = RustlsHandshake;
    type Error = io::Error;

    fn make_tls_connect(&mut self, domain: &str) -> Result<RustlsHandshake, io::Error> {
        let name = ServerName::try_from(domain.to_string()).map_err(|_| {
            io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("{domain:?} is not a host name TLS can verify"),
            )
        })?;
        Ok(RustlsHandshake {
            config: self.0.clone(),
            name,
        })
    }
}

/// One handshake of [`RustlsConnect`] (tokio-postgres's `TlsConnect`).
pub struct RustlsHandshake {
    config: Arc<rustls::ClientConfig>,
    name: ServerName<'static>,
}

impl<S> TlsConnect<S> for RustlsHandshake
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    type Stream = RustlsStream<S>;
    type Error = io::Error;
    type Future = Pin<Box<dyn Future<Output = io::Result<RustlsStream<S>>> + Send>>;

    fn connect(self, stream: S) -> Self::Future {
        Box::pin(async move {
            // A failed verification comes back as an io::Error holding the rustls error, which
            // walsink_kit::tls::failure names.
            let s = tokio_rustls::TlsConnector::from(self.config)
                .connect(self.name, stream)
                .await?;
            Ok(RustlsStream(s))
        })
    }
}

/// A TLS session to the server.
pub struct RustlsStream<S>(tokio_rustls::client::TlsStream<S>);

impl<S: AsyncRead + AsyncWrite + Unpin> AsyncRead for RustlsStream<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_read(cx, buf)
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> AsyncWrite for RustlsStream<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.0).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.0).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.0.is_write_vectored()
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> TlsStream for RustlsStream<S> {
    fn channel_binding(&self) -> ChannelBinding {
        let (_, session) = self.0.get_ref();
        session
            .peer_certificates()
            .and_then(|c| c.first())
            .and_then(|c| server_end_point(c.as_ref()))
            .map_or_else(ChannelBinding::none, ChannelBinding::tls_server_end_point)
    }
}

/// RFC 5929 `tls-server-end-point`: the hash of the server's certificate with the hash of
/// its signature algorithm (SHA-256 for MD5 and SHA-1), as the PostgreSQL server computes it.
/// `None` for an algorithm without one hash (Ed25519, RSA-PSS): SCRAM then runs without
/// channel binding, as with a server that cannot offer it.
fn server_end_point(der: &[u8]) -> Option<Vec<u8>> {
    let alg = match signature_oid(der)? {
        // md5WithRSA, sha1WithRSA, sha256WithRSA, ecdsa-with-SHA1, ecdsa-with-SHA256
        [42, 134, 72, 134, 247, 13, 1, 1, 4]
        | [42, 134, 72, 134, 247, 13, 1, 1, 5]
        | [42, 134, 72, 134, 247, 13, 1, 1, 11]
        | [42, 134, 72, 206, 61, 4, 1]
        | [42, 134, 72, 206, 61, 4, 3, 2] => &ring::digest::SHA256,
        // sha384WithRSA, ecdsa-with-SHA384
        [42, 134, 72, 134, 247, 13, 1, 1, 12] | [42, 134, 72, 206, 61, 4, 3, 3] => {
            &ring::digest::SHA384
        }
        // sha512WithRSA, ecdsa-with-SHA512
        [42, 134, 72, 134, 247, 13, 1, 1, 13] | [42, 134, 72, 206, 61, 4, 3, 4] => {
            &ring::digest::SHA512
        }
        _ => return None,
    };
    Some(ring::digest::digest(alg, der).as_ref().to_vec())
}

/// The content bytes of the OID in a certificate's `signatureAlgorithm`
/// (`Certificate ::= SEQUENCE { tbsCertificate, signatureAlgorithm, signature }`).
fn signature_oid(der: &[u8]) -> Option<&[u8]> {
    let (tag, cert, _) = der_element(der)?;
    if tag != 0x30 {
        return None;
    }
    let (_, _, after_tbs) = der_element(cert)?;
    let (tag, alg, _) = der_element(after_tbs)?;
    if tag != 0x30 {
        return None;
    }
    let (tag, oid, _) = der_element(alg)?;
    (tag == 0x06).then_some(oid)
}

/// One DER element at the start of `b`: its tag, its content and what follows it.
fn der_element(b: &[u8]) -> Option<(u8, &[u8], &[u8])> {
    let tag = *b.first()?;
    let first = *b.get(1)? as usize;
    let (len, head) = if first < 0x80 {
        (first, 2)
    } else {
        let n = first & 0x7f;
        if n == 0 || n > 4 {
            return None;
        }
        let mut len = 0usize;
        for i in 0..n {
            len = (len << 8) | *b.get(2 + i)? as usize;
        }
        (len, 2 + n)
    };
    let end = head.checked_add(len)?;
    Some((tag, b.get(head..end)?, b.get(end..)?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_libpq_sslmode_is_known_by_name() {
        for m in [
            SslMode::Disable,
            SslMode::Prefer,
            SslMode::Require,
            SslMode::VerifyCa,
            SslMode::VerifyFull,
        ] {
            assert_eq!(SslMode::parse(m.name()), Some(m));
        }
        assert_eq!(SslMode::parse("allow"), None);
        assert_eq!(SslMode::parse("VERIFY-FULL"), None);
    }

    #[test]
    fn channel_binding_hashes_the_certificate_by_its_signature_algorithm() {
        let dir = tempfile::tempdir().unwrap();
        let ca = walsink_kit::testkit::TestCa::new(dir.path(), "ca").unwrap();
        let s = ca
            .server("s", &["localhost"], walsink_kit::testkit::Validity::Current)
            .unwrap();
        let pem = std::fs::read(&s.cert).unwrap();
        use rustls::pki_types::pem::PemObject;
        let der = rustls::pki_types::CertificateDer::from_pem_slice(&pem).unwrap();
        // rcgen signs with ECDSA P-256 and SHA-256 by default.
        assert_eq!(
            signature_oid(der.as_ref()),
            Some(&[42u8, 134, 72, 206, 61, 4, 3, 2][..])
        );
        let h = server_end_point(der.as_ref()).unwrap();
        assert_eq!(
            h,
            ring::digest::digest(&ring::digest::SHA256, der.as_ref()).as_ref()
        );
        assert_eq!(server_end_point(b"\x30\x03\x02\x01\x00"), None);
        assert_eq!(server_end_point(b""), None);
    }
}
