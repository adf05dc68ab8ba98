//! Certificates made on the fly for TLS tests (feature `testkit`): a private CA, server
//! certificates for chosen host names (valid, expired or not yet valid) and client
//! certificates, written as PEM files into a directory the test owns.
//!
//! ```
//! use walsink_kit::testkit::{TestCa, Validity};
//!
//! let dir = tempfile::tempdir().unwrap();
//! let ca = TestCa::new(dir.path(), "ca").unwrap();
//! let server = ca.server("pg", &["localhost", "127.0.0.1"], Validity::Current).unwrap();
//! assert!(server.cert.exists() && server.key.exists() && ca.ca_file().exists());
//! ```

use std::io;
use std::path::{Path, PathBuf};

/// Whether a certificate is valid today.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Validity {
    /// Valid from yesterday for a year.
    Current,
    /// Valid in 2000 only.
    Expired,
    /// Valid from 2099 on.
    NotYet,
}

/// A certificate and its key, as PEM files.
#[derive(Debug, Clone)]
pub struct Issued {
    /// The certificate's PEM file.
    pub cert: PathBuf,
    /// The private key's PEM file (mode 0600).
    pub key: PathBuf,
}

/// A private certificate authority whose certificate is a PEM file in a directory.
pub struct TestCa {
    dir: PathBuf,
    name: String,
    cert: rcgen::Certificate,
    key: rcgen::KeyPair,
}

fn err(e: rcgen::Error) -> io::Error {
    io::Error::other(e.to_string())
}

fn write(path: &Path, text: &str, private: bool) -> io::Result<()> {
    std::fs::write(path, text)?;
    #[cfg(unix)]
    if private {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))?;
    }
    #[cfg(not(unix))]
    let _ = private;
    Ok(())
}

impl TestCa {
    /// A new CA named `name`, its certificate written to `dir/NAME.crt`.
    pub fn new(dir: &Path, name: &str) -> io::Result<TestCa> {
        let key = rcgen::KeyPair::generate().map_err(err)?;
        let mut p = rcgen::CertificateParams::new(Vec::<String>::new()).map_err(err)?;
        p.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        p.distinguished_name
            .push(rcgen::DnType::CommonName, format!("walsink test CA {name}"));
        p.key_usages = vec![
            rcgen::KeyUsagePurpose::KeyCertSign,
            rcgen::KeyUsagePurpose::CrlSign,
            rcgen::KeyUsagePurpose::DigitalSignature,
        ];
        let cert = p.self_signed(&key).map_err(err)?;
        write(&dir.join(format!("{name}.crt")), &cert.pem(), false)?;
        Ok(TestCa {
            dir: dir.to_path_buf(),
            name: name.to_string(),
            cert,
            key,
        })
    }

    /// The CA certificate's PEM file.
    pub fn ca_file(&self) -> PathBuf {
        self.dir.join(format!("{}.crt", self.name))
    }

    fn issue(
        &self,
        file: &str,
        names: &[&str],
        common_name: &str,
        validity: Validity,
        usage: rcgen::ExtendedKeyUsagePurpose,
    ) -> io::Result<Issued> {
        let key = rcgen::KeyPair::generate().map_err(err)?;
        let mut p =
            rcgen::CertificateParams::new(names.iter().map(|s| s.to_string()).collect::<Vec<_>>())
                .map_err(err)?;
        p.distinguished_name
            .push(rcgen::DnType::CommonName, common_name.to_string());
        p.extended_key_usages = vec![usage];
        match validity {
            Validity::Current => {
                let now = std::time::SystemTime::now();
                let day = std::time::Duration::from_secs(86_400);
                p.not_before = (now - day).into();
                p.not_after = (now + 365 * day).into();
            }
            Validity::Expired => {
                p.not_before = rcgen::date_time_ymd(2000, 1, 1);
                p.not_after = rcgen::date_time_ymd(2000, 12, 31);
            }
            Validity::NotYet => {
                p.not_before = rcgen::date_time_ymd(2099, 1, 1);
                p.not_after = rcgen::date_time_ymd(2100, 1, 1);
            }
        }
        let cert = p.signed_by(&key, &self.cert, &self.key).map_err(err)?;
        let issued = Issued {
            cert: self.dir.join(format!("{file}.crt")),
            key: self.dir.join(format!("{file}.key")),
        };
        write(&issued.cert, &cert.pem(), false)?;
        write(&issued.key, &key.serialize_pem(), true)?;
        Ok(issued)
    }

    /// A server certificate for `names` (DNS names or IP addresses), written to
    /// `dir/FILE.crt` and `dir/FILE.key`.
    pub fn server(&self, file: &str, names: &[&str], validity: Validity) -> io::Result<Issued> {
        let cn = names.first().copied().unwrap_or("server");
        self.issue(
            file,
            names,
            cn,
            validity,
            rcgen::ExtendedKeyUsagePurpose::ServerAuth,
        )
    }

    /// A client certificate with common name `common_name` (PostgreSQL maps it to the user
    /// name), written to `dir/FILE.crt` and `dir/FILE.key`.
    pub fn client(&self, file: &str, common_name: &str) -> io::Result<Issued> {
        self.issue(
            file,
            &[],
            common_name,
            Validity::Current,
            rcgen::ExtendedKeyUsagePurpose::ClientAuth,
        )
    }
}
