//! TLS client settings over rustls, shared by every target.
//!
//! [`TlsOptions`] holds what a target URL says about TLS: which CA certificates to trust (a
//! PEM file, or the Mozilla roots of `webpki-roots` when none is given), an optional client
//! certificate and key, and how much of the server's certificate to verify ([`Verify`], with
//! libpq's `sslmode` meanings). [`TlsOptions::client_config`] turns them into a
//! `rustls::ClientConfig` (ring as the crypto provider; no OpenSSL anywhere), and
//! [`TlsOptions::read_pem`] gives the PEM bytes for client libraries that take bytes.
//!
//! When a handshake fails, [`failure`] looks through an error's chain for the rustls error
//! and names the reason ([`TlsFailure`]): a certificate signed by a CA that is not trusted, an
//! expired one, one that does not carry the host name, a client certificate the server
//! refused.

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::WebPkiServerVerifier;
use rustls::crypto::{verify_tls12_signature, verify_tls13_signature, CryptoProvider};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::{CertificateError, DigitallySignedStruct, SignatureScheme};

use crate::ConfigError;

/// How much of the server's certificate is verified.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Verify {
    /// The chain up to a trusted CA and the host name (libpq's `verify-full`). The default,
    /// and the recommended setting.
    #[default]
    Full,
    /// The chain up to a trusted CA, not the host name (libpq's `verify-ca`).
    Ca,
    /// Nothing: the connection is encrypted but the server is not authenticated (libpq's
    /// `require` without a root certificate). Open to a man in the middle.
    None,
}

/// A target's TLS settings.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct TlsOptions {
    /// PEM file of the CA certificates to trust; `None` trusts the Mozilla roots
    /// (`webpki-roots`).
    pub ca_file: Option<PathBuf>,
    /// PEM file of the client certificate chain, for servers that ask for one.
    pub cert_file: Option<PathBuf>,
    /// PEM file of the client certificate's private key (PKCS#8, PKCS#1 or SEC1).
    pub key_file: Option<PathBuf>,
    /// How much of the server's certificate is verified. Default [`Verify::Full`].
    pub verify: Verify,
}

/// The PEM contents of a [`TlsOptions`], for client libraries that take bytes.
#[derive(Clone, Default)]
pub struct PemFiles {
    /// The CA file's bytes, if one is given.
    pub ca: Option<Vec<u8>>,
    /// The client certificate chain's bytes, if given.
    pub cert: Option<Vec<u8>>,
    /// The client key's bytes, if given. Never shown by `Debug`.
    pub key: Option<Vec<u8>>,
}

impl fmt::Debug for PemFiles {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PemFiles")
            .field("ca", &self.ca.as_ref().map(Vec::len))
            .field("cert", &self.cert.as_ref().map(Vec::len))
            .field("key", &self.key.as_ref().map(|_| "***"))
            .finish()
    }
}

/// The crypto provider every target uses (ring).
pub fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

impl TlsOptions {
    /// Checks that a client certificate and its key come together, naming the missing one.
    /// `cert_param` and `key_param` are the target's URL parameter names.
    pub fn check(
        &self,
        target: &'static str,
        cert_param: &str,
        key_param: &str,
    ) -> Result<(), ConfigError> {
        match (&self.cert_file, &self.key_file) {
            (Some(_), None) => Err(ConfigError::new(
                target,
                key_param,
                format!("is missing: {cert_param} needs its private key"),
            )),
            (None, Some(_)) => Err(ConfigError::new(
                target,
                cert_param,
                format!("is missing: {key_param} needs its certificate"),
            )),
            _ => Ok(()),
        }
    }

    /// Reads the PEM files, checking that each holds what it should. Errors name the file.
    pub fn read_pem(&self, target: &'static str) -> Result<PemFiles, ConfigError> {
        self.check(target, "client certificate", "client key")?;
        let read = |p: &Path, what: &str| {
            std::fs::read(p).map_err(|e| {
                ConfigError::new(target, what, format!("cannot read {}: {e}", p.display()))
            })
        };
        let mut out = PemFiles::default();
        if let Some(p) = &self.ca_file {
            let b = read(p, "CA file")?;
            certs_in(target, "CA file", p, &b)?;
            out.ca = Some(b);
        }
        if let Some(p) = &self.cert_file {
            let b = read(p, "client certificate")?;
            certs_in(target, "client certificate", p, &b)?;
            out.cert = Some(b);
        }
        if let Some(p) = &self.key_file {
            let b = read(p, "client key")?;
            key_in(target, p, &b)?;
            out.key = Some(b);
        }
        Ok(out)
    }

    /// The rustls client configuration these settings describe.
    pub fn client_config(&self, target: &'static str) -> Result<rustls::ClientConfig, ConfigError> {
        let pem = self.read_pem(target)?;
        let provider = provider();
        let mut roots = rustls::RootCertStore::empty();
        match (&pem.ca, &self.ca_file) {
            (Some(b), Some(p)) => {
                for c in certs_in(target, "CA file", p, b)? {
                    roots.add(c).map_err(|e| {
                        ConfigError::new(
                            target,
                            "CA file",
                            format!("{} holds a certificate rustls cannot use: {e}", p.display()),
                        )
                    })?;
                }
            }
            _ => roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned()),
        }
        let webpki = WebPkiServerVerifier::builder_with_provider(Arc::new(roots), provider.clone())
            .build()
            .map_err(|e| ConfigError::new(target, "CA file", e.to_string()))?;
        let verifier: Arc<dyn ServerCertVerifier> = match self.verify {
            Verify::Full => webpki,
            Verify::Ca => Arc::new(ChainOnly(webpki)),
            Verify::None => Arc::new(Unverified(provider.clone())),
        };
        let builder = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| ConfigError::new(target, "TLS", e.to_string()))?
            .dangerous()
            .with_custom_certificate_verifier(verifier);
        match (&pem.cert, &pem.key, &self.cert_file, &self.key_file) {
            (Some(c), Some(k), Some(cp), Some(kp)) => {
                let chain = certs_in(target, "client certificate", cp, c)?;
                let key = key_in(target, kp, k)?;
                builder.with_client_auth_cert(chain, key).map_err(|e| {
                    ConfigError::new(
                        target,
                        "client certificate",
                        format!(
                            "{} and {} do not make a usable pair: {e}",
                            cp.display(),
                            kp.display()
                        ),
                    )
                })
            }
            _ => Ok(builder.with_no_client_auth()),
        }
    }
}

fn certs_in(
    target: &'static str,
    what: &str,
    path: &Path,
    bytes: &[u8],
) -> Result<Vec<CertificateDer<'static>>, ConfigError> {
    let certs: Result<Vec<_>, _> = CertificateDer::pem_slice_iter(bytes).collect();
    match certs {
        Ok(c) if !c.is_empty() => Ok(c),
        Ok(_) => Err(ConfigError::new(
            target,
            what,
            format!("{} holds no PEM certificate", path.display()),
        )),
        Err(e) => Err(ConfigError::new(
            target,
            what,
            format!("{} is not a PEM certificate file: {e}", path.display()),
        )),
    }
}

fn key_in(
    target: &'static str,
    path: &Path,
    bytes: &[u8],
) -> Result<PrivateKeyDer<'static>, ConfigError> {
    // The message never quotes the file: it holds a private key.
    PrivateKeyDer::from_pem_slice(bytes).map_err(|_| {
        ConfigError::new(
            target,
            "client key",
            format!("{} holds no PEM private key", path.display()),
        )
    })
}

/// Verify-ca: the chain must reach a trusted CA; a host name the certificate does not carry
/// is accepted.
#[derive(Debug)]
struct ChainOnly(Arc<WebPkiServerVerifier>);

impl ServerCertVerifier for ChainOnly {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        match self
            .0
            .verify_server_cert(end_entity, intermediates, server_name, ocsp, now)
        {
            Err(rustls::Error::InvalidCertificate(
                CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
            )) => Ok(ServerCertVerified::assertion()),
            other => other,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.supported_verify_schemes()
    }
}

/// No verification of the certificate (the handshake's signatures are still checked, so the
/// session key belongs to whoever holds the certificate's key).
#[derive(Debug)]
struct Unverified(Arc<CryptoProvider>);

impl ServerCertVerifier for Unverified {
    fn verify_server_cert(
        &self,
        _: &CertificateDer<'_>,
        _: &[CertificateDer<'_>],
        _: &ServerName<'_>,
        _: &[u8],
        _: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

/// Why a TLS handshake failed, as [`failure`] finds it in an error.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum TlsFailure {
    /// The server's certificate is not signed by a trusted CA (a wrong or missing CA file).
    UnknownCa,
    /// The server's certificate has expired.
    Expired,
    /// The server's certificate is not valid yet.
    NotYetValid,
    /// The server's certificate does not carry the host name connected to.
    WrongHost,
    /// The server's certificate was revoked.
    Revoked,
    /// Another problem with the server's certificate (rustls's description).
    BadCertificate(String),
    /// The server refused the handshake with an alert (often a missing or refused client
    /// certificate), named by rustls.
    Refused(String),
    /// Another TLS error (rustls's description).
    Other(String),
}

impl fmt::Display for TlsFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TlsFailure::UnknownCa => f.write_str(
                "the server's certificate is not signed by a trusted CA (check the CA file)",
            ),
            TlsFailure::Expired => f.write_str("the server's certificate has expired"),
            TlsFailure::NotYetValid => f.write_str("the server's certificate is not valid yet"),
            TlsFailure::WrongHost => f.write_str(
                "the server's certificate does not carry the host name connected to \
                 (connect by a name the certificate lists, or verify the CA only)",
            ),
            TlsFailure::Revoked => f.write_str("the server's certificate was revoked"),
            TlsFailure::BadCertificate(s) => write!(f, "the server's certificate is refused: {s}"),
            TlsFailure::Refused(s) => write!(
                f,
                "the server refused the TLS handshake ({s}; does it need a client certificate?)"
            ),
            TlsFailure::Other(s) => write!(f, "TLS failed: {s}"),
        }
    }
}

impl TlsFailure {
    /// The failure a rustls error describes.
    pub fn from_rustls(e: &rustls::Error) -> TlsFailure {
        match e {
            rustls::Error::InvalidCertificate(c) => match c {
                CertificateError::UnknownIssuer | CertificateError::BadSignature => {
                    TlsFailure::UnknownCa
                }
                CertificateError::Expired | CertificateError::ExpiredContext { .. } => {
                    TlsFailure::Expired
                }
                CertificateError::NotValidYet | CertificateError::NotValidYetContext { .. } => {
                    TlsFailure::NotYetValid
                }
                CertificateError::NotValidForName
                | CertificateError::NotValidForNameContext { .. } => TlsFailure::WrongHost,
                CertificateError::Revoked => TlsFailure::Revoked,
                other => TlsFailure::BadCertificate(format!("{other:?}")),
            },
            rustls::Error::AlertReceived(a) => TlsFailure::Refused(format!("alert {a:?}")),
            other => TlsFailure::Other(other.to_string()),
        }
    }
}

/// The TLS failure behind `err`, if its chain holds a rustls error (directly, or inside an
/// `io::Error` as tokio-rustls reports it). Client libraries that keep only the text of the
/// error are matched on rustls's wording as a last resort.
pub fn failure(err: &(dyn std::error::Error + 'static)) -> Option<TlsFailure> {
    let mut cur: Option<&(dyn std::error::Error + 'static)> = Some(err);
    while let Some(e) = cur {
        if let Some(r) = e.downcast_ref::<rustls::Error>() {
            return Some(TlsFailure::from_rustls(r));
        }
        if let Some(io) = e.downcast_ref::<std::io::Error>() {
            if let Some(inner) = io.get_ref() {
                if let Some(f) = failure(inner) {
                    return Some(f);
                }
            }
        }
        cur = e.source();
    }
    failure_in_text(&err.to_string())
}

/// The TLS failure a message names in rustls's wording (for clients that keep only text).
pub fn failure_in_text(text: &str) -> Option<TlsFailure> {
    let has = |s: &str| text.contains(s);
    if let Some((_, rest)) = text.split_once("received fatal alert: ") {
        // rustls's wording of `Error::AlertReceived`, which a server sends when it refuses
        // the handshake; over TLS 1.3 a refused client certificate shows only at the first
        // read after the handshake, where client libraries keep the text.
        let alert: String = rest
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric())
            .collect();
        Some(TlsFailure::Refused(format!("alert {alert}")))
    } else if has("UnknownIssuer") || has("unknown issuer") || has("BadSignature") {
        Some(TlsFailure::UnknownCa)
    } else if has("Expired") || has("certificate expired") {
        Some(TlsFailure::Expired)
    } else if has("NotValidYet") || has("not valid yet") {
        Some(TlsFailure::NotYetValid)
    } else if has("NotValidForName") || has("not valid for name") {
        Some(TlsFailure::WrongHost)
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};

    struct Pki {
        dir: tempfile::TempDir,
        ca_pem: String,
        ca_cert: rcgen::Certificate,
        ca_key: rcgen::KeyPair,
    }

    impl Pki {
        fn new() -> Pki {
            let ca_key = rcgen::KeyPair::generate().unwrap();
            let mut p = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
            p.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
            p.distinguished_name
                .push(rcgen::DnType::CommonName, "walsink test CA");
            let ca_cert = p.self_signed(&ca_key).unwrap();
            Pki {
                dir: tempfile::tempdir().unwrap(),
                ca_pem: ca_cert.pem(),
                ca_cert,
                ca_key,
            }
        }

        fn server(&self, names: &[&str], expired: bool) -> (Vec<u8>, Vec<u8>) {
            let key = rcgen::KeyPair::generate().unwrap();
            let mut p = rcgen::CertificateParams::new(
                names.iter().map(|s| s.to_string()).collect::<Vec<_>>(),
            )
            .unwrap();
            if expired {
                p.not_before = rcgen::date_time_ymd(2000, 1, 1);
                p.not_after = rcgen::date_time_ymd(2001, 1, 1);
            }
            let c = p.signed_by(&key, &self.ca_cert, &self.ca_key).unwrap();
            (c.pem().into_bytes(), key.serialize_pem().into_bytes())
        }

        fn file(&self, name: &str, text: &str) -> PathBuf {
            let p = self.dir.path().join(name);
            std::fs::write(&p, text).unwrap();
            p
        }
    }

    /// A handshake in memory: `Ok` or the client's error.
    fn handshake(
        client: rustls::ClientConfig,
        host: &str,
        cert: &[u8],
        key: &[u8],
    ) -> Result<(), rustls::Error> {
        let chain: Vec<_> = CertificateDer::pem_slice_iter(cert)
            .collect::<Result<_, _>>()
            .unwrap();
        let key = PrivateKeyDer::from_pem_slice(key).unwrap();
        let server_cfg = rustls::ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(chain, key)
            .unwrap();
        let mut s = rustls::ServerConnection::new(Arc::new(server_cfg)).unwrap();
        let name = ServerName::try_from(host.to_string()).unwrap();
        let mut c = rustls::ClientConnection::new(Arc::new(client), name).unwrap();
        for _ in 0..20 {
            let mut buf = Vec::new();
            c.write_tls(&mut buf).unwrap();
            if !buf.is_empty() {
                s.read_tls(&mut &buf[..]).unwrap();
                if let Err(e) = s.process_new_packets() {
                    // The server's alert reaches the client below.
                    let mut out = Vec::new();
                    let _ = s.write_tls(&mut out);
                    let _ = c.read_tls(&mut &out[..]);
                    c.process_new_packets()?;
                    panic!("server failed without the client noticing: {e}");
                }
            }
            let mut buf = Vec::new();
            s.write_tls(&mut buf).unwrap();
            if !buf.is_empty() {
                c.read_tls(&mut &buf[..]).unwrap();
                c.process_new_packets()?;
            }
            if !c.is_handshaking() && !s.is_handshaking() {
                c.writer().write_all(b"ping").unwrap();
                let mut buf = Vec::new();
                c.write_tls(&mut buf).unwrap();
                s.read_tls(&mut &buf[..]).unwrap();
                s.process_new_packets().unwrap();
                let mut got = [0u8; 4];
                s.reader().read_exact(&mut got).unwrap();
                assert_eq!(&got, b"ping");
                return Ok(());
            }
        }
        panic!("handshake did not finish");
    }

    fn options(ca: Option<PathBuf>, verify: Verify) -> TlsOptions {
        TlsOptions {
            ca_file: ca,
            verify,
            ..TlsOptions::default()
        }
    }

    #[test]
    fn verify_full_accepts_the_right_ca_and_host() {
        let pki = Pki::new();
        let (cert, key) = pki.server(&["localhost"], false);
        let ca = pki.file("ca.pem", &pki.ca_pem);
        let cfg = options(Some(ca), Verify::Full).client_config("t").unwrap();
        handshake(cfg, "localhost", &cert, &key).unwrap();
    }

    #[test]
    fn a_wrong_ca_is_named_unknown_ca() {
        let pki = Pki::new();
        let other = Pki::new();
        let (cert, key) = pki.server(&["localhost"], false);
        let ca = pki.file("other.pem", &other.ca_pem);
        for verify in [Verify::Full, Verify::Ca] {
            let cfg = options(Some(ca.clone()), verify)
                .client_config("t")
                .unwrap();
            let e = handshake(cfg, "localhost", &cert, &key).unwrap_err();
            assert_eq!(TlsFailure::from_rustls(&e), TlsFailure::UnknownCa, "{e}");
        }
        // Without a CA file only the public roots are trusted, which did not sign it either.
        let cfg = options(None, Verify::Full).client_config("t").unwrap();
        let e = handshake(cfg, "localhost", &cert, &key).unwrap_err();
        assert_eq!(TlsFailure::from_rustls(&e), TlsFailure::UnknownCa);
    }

    #[test]
    fn an_expired_certificate_is_named_expired() {
        let pki = Pki::new();
        let (cert, key) = pki.server(&["localhost"], true);
        let ca = pki.file("ca.pem", &pki.ca_pem);
        let cfg = options(Some(ca), Verify::Full).client_config("t").unwrap();
        let e = handshake(cfg, "localhost", &cert, &key).unwrap_err();
        assert_eq!(TlsFailure::from_rustls(&e), TlsFailure::Expired, "{e}");
        assert!(TlsFailure::from_rustls(&e).to_string().contains("expired"));
    }

    #[test]
    fn a_wrong_host_fails_verify_full_and_passes_verify_ca() {
        let pki = Pki::new();
        let (cert, key) = pki.server(&["db.example"], false);
        let ca = pki.file("ca.pem", &pki.ca_pem);
        let full = options(Some(ca.clone()), Verify::Full)
            .client_config("t")
            .unwrap();
        let e = handshake(full, "localhost", &cert, &key).unwrap_err();
        assert_eq!(TlsFailure::from_rustls(&e), TlsFailure::WrongHost, "{e}");
        let ca_only = options(Some(ca), Verify::Ca).client_config("t").unwrap();
        handshake(ca_only, "localhost", &cert, &key).unwrap();
    }

    #[test]
    fn verify_none_accepts_any_certificate() {
        let pki = Pki::new();
        let (cert, key) = pki.server(&["elsewhere"], true);
        let cfg = options(None, Verify::None).client_config("t").unwrap();
        handshake(cfg, "localhost", &cert, &key).unwrap();
    }

    #[test]
    fn failure_finds_the_rustls_error_inside_an_io_error() {
        let io = std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            rustls::Error::InvalidCertificate(CertificateError::UnknownIssuer),
        );
        #[derive(Debug)]
        struct Wrap(std::io::Error);
        impl fmt::Display for Wrap {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("connect failed")
            }
        }
        impl std::error::Error for Wrap {
            fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
                Some(&self.0)
            }
        }
        assert_eq!(failure(&Wrap(io)), Some(TlsFailure::UnknownCa));
        // A client library that kept only the text of an alert the server sent.
        let alert = rustls::Error::AlertReceived(rustls::AlertDescription::CertificateRequired);
        assert_eq!(
            failure_in_text(&format!("connect: {alert}")),
            Some(TlsFailure::from_rustls(&alert))
        );
        // An alert about the client's own certificate is not a fault of the server's.
        let expired = rustls::Error::AlertReceived(rustls::AlertDescription::CertificateExpired);
        assert_eq!(
            failure_in_text(&expired.to_string()),
            Some(TlsFailure::from_rustls(&expired))
        );
        let plain = std::io::Error::other("connection refused");
        assert_eq!(failure(&plain), None);
    }

    #[test]
    fn bad_files_are_named_and_a_key_is_never_quoted() {
        let pki = Pki::new();
        let garbage = pki.file("garbage.pem", "not a certificate");
        let e = options(Some(garbage.clone()), Verify::Full)
            .client_config("redis")
            .unwrap_err()
            .to_string();
        assert!(e.contains("garbage.pem") && e.contains("CA file"), "{e}");
        let missing = pki.dir.path().join("absent.pem");
        let e = options(Some(missing), Verify::Full)
            .client_config("redis")
            .unwrap_err()
            .to_string();
        assert!(e.contains("absent.pem"), "{e}");
        let (cert, _) = pki.server(&["x"], false);
        let certp = pki.file("c.pem", std::str::from_utf8(&cert).unwrap());
        let keyp = pki.file("k.pem", "PRIVATE-KEY-SECRET-TEXT");
        let only_cert = TlsOptions {
            cert_file: Some(certp.clone()),
            ..TlsOptions::default()
        };
        let e = only_cert.client_config("redis").unwrap_err().to_string();
        assert!(e.contains("private key"), "{e}");
        let bad_key = TlsOptions {
            cert_file: Some(certp),
            key_file: Some(keyp),
            ..TlsOptions::default()
        };
        let e = bad_key.client_config("redis").unwrap_err().to_string();
        assert!(e.contains("k.pem") && !e.contains("SECRET"), "{e}");
        let dbg = format!(
            "{:?}",
            PemFiles {
                key: Some(b"SECRET".to_vec()),
                ..PemFiles::default()
            }
        );
        assert!(!dbg.contains("SECRET"), "{dbg}");
    }
}
