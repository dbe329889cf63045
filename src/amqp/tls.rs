//! TLS material for `amqps://` beyond the system roots: a private CA and a
//! client certificate, read from PEM files at every connect and checked before
//! any network traffic, so a misconfiguration names the setting at fault.

use std::path::{Path, PathBuf};

use lapin::tcp::{OwnedIdentity, OwnedTLSConfig};
use rustls_pki_types::pem::{self, PemObject};
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use thiserror::Error;

use super::AmqpError;
use crate::settings::AmqpSettings;

/// The TLS settings cannot be used. Each names the `amqp.tls_*` setting at fault.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum TlsError {
    /// A file cannot be read.
    #[error("cannot read {setting} {}: {source}", path.display())]
    Read {
        /// The setting that names the file.
        setting: &'static str,
        /// The file.
        path: PathBuf,
        /// What the OS said.
        source: std::io::Error,
    },
    /// A file holds broken PEM.
    #[error("{setting} {}: {source}", path.display())]
    Pem {
        /// The setting that names the file.
        setting: &'static str,
        /// The file.
        path: PathBuf,
        /// What the PEM parser said.
        source: pem::Error,
    },
    /// A certificate file holds no certificate.
    #[error("{setting} {} holds no PEM certificate", path.display())]
    NoCertificate {
        /// The setting that names the file.
        setting: &'static str,
        /// The file.
        path: PathBuf,
    },
    /// The key file holds no key rustls can use.
    #[error("amqp.tls_key_file {} holds no usable PEM private key: {source}", path.display())]
    NoKey {
        /// The file.
        path: PathBuf,
        /// What the PEM parser said.
        source: pem::Error,
    },
    /// A client certificate without its key, or the other way round.
    #[error("amqp.tls_cert_file and amqp.tls_key_file must be set together")]
    Incomplete,
    /// TLS files with a plain `amqp://` URL: almost certainly a mistake.
    #[error("amqp.tls_* files are set but the URL is not amqps://")]
    NotAmqps,
    /// The broker's certificate chain does not lead to a trusted CA.
    #[error(
        "the broker's certificate is not trusted ({source}); set amqp.tls_ca_file to the CA that signed it"
    )]
    Untrusted {
        /// What the handshake said.
        source: AmqpError,
    },
}

/// TLS material for `amqps://` beyond the system roots, as file paths. The files
/// are read at every connect, so rotated certificates take effect at the next
/// reconnect without a restart.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TlsFiles {
    /// PEM CA certificate(s) trusted in addition to the system roots.
    pub ca_file: Option<PathBuf>,
    /// PEM client certificate (chain), sent when the broker asks for one.
    pub cert_file: Option<PathBuf>,
    /// PEM private key of `cert_file`.
    pub key_file: Option<PathBuf>,
}

impl TlsFiles {
    /// The `amqp.tls_*` settings; empty paths count as unset.
    pub fn from_settings(amqp: &AmqpSettings) -> Self {
        let set = |p: &Option<PathBuf>| p.clone().filter(|p| !p.as_os_str().is_empty());
        Self {
            ca_file: set(&amqp.tls_ca_file),
            cert_file: set(&amqp.tls_cert_file),
            key_file: set(&amqp.tls_key_file),
        }
    }

    /// Whether no file is configured (system roots, no client certificate).
    pub fn is_empty(&self) -> bool {
        self.ca_file.is_none() && self.cert_file.is_none() && self.key_file.is_none()
    }

    /// Reads and checks the files. rustls itself would skip a CA it cannot
    /// parse and fail later with a vaguer "unknown issuer".
    pub(crate) fn load(&self) -> Result<OwnedTLSConfig, TlsError> {
        let cert_chain = match &self.ca_file {
            None => None,
            Some(path) => {
                let pem = certificates(path, "amqp.tls_ca_file")?;
                Some(String::from_utf8_lossy(&pem).into_owned())
            }
        };
        let identity = match (&self.cert_file, &self.key_file) {
            (None, None) => None,
            (Some(cert), Some(key)) => {
                let pem = certificates(cert, "amqp.tls_cert_file")?;
                let key_pem = read(key, "amqp.tls_key_file")?;
                PrivateKeyDer::from_pem_slice(&key_pem).map_err(|source| TlsError::NoKey {
                    path: key.clone(),
                    source,
                })?;
                Some(OwnedIdentity::PKCS8 { pem, key: key_pem })
            }
            _ => return Err(TlsError::Incomplete),
        };
        Ok(OwnedTLSConfig {
            identity,
            cert_chain,
        })
    }
}

/// The bytes of a PEM file that holds at least one certificate.
fn certificates(path: &Path, setting: &'static str) -> Result<Vec<u8>, TlsError> {
    let pem = read(path, setting)?;
    let certs = CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|source| TlsError::Pem {
            setting,
            path: path.to_owned(),
            source,
        })?;
    if certs.is_empty() {
        return Err(TlsError::NoCertificate {
            setting,
            path: path.to_owned(),
        });
    }
    Ok(pem)
}

fn read(path: &Path, setting: &'static str) -> Result<Vec<u8>, TlsError> {
    std::fs::read(path).map_err(|source| TlsError::Read {
        setting,
        path: path.to_owned(),
        source,
    })
}

/// Whether a failed connect is rustls refusing the broker's certificate: lapin
/// hands the handshake's `io::Error` through, and rustls puts its own error
/// inside it.
pub(super) fn is_untrusted_certificate(error: &lapin::Error) -> bool {
    let lapin::ErrorKind::IOError(io) = error.kind() else {
        return false;
    };
    io.get_ref()
        .and_then(|inner| inner.downcast_ref::<rustls::Error>())
        .is_some_and(|e| matches!(e, rustls::Error::InvalidCertificate(_)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_rustls_certificate_error_is_recognised_by_its_type() {
        let rustls = rustls::Error::InvalidCertificate(rustls::CertificateError::UnknownIssuer);
        let io = std::io::Error::new(std::io::ErrorKind::InvalidData, rustls);
        assert!(is_untrusted_certificate(&lapin::Error::from(io)));
        let refused = std::io::Error::from(std::io::ErrorKind::ConnectionRefused);
        assert!(!is_untrusted_certificate(&lapin::Error::from(refused)));
    }

    #[test]
    fn misconfigured_files_name_the_setting() {
        let half = TlsFiles {
            cert_file: Some("client.pem".into()),
            ..TlsFiles::default()
        };
        assert!(matches!(half.load(), Err(TlsError::Incomplete)));
        let missing = TlsFiles {
            ca_file: Some("/nonexistent/ca.pem".into()),
            ..TlsFiles::default()
        };
        let error = missing.load().unwrap_err().to_string();
        let named = "amqp.tls_ca_file /nonexistent/ca.pem";
        assert!(error.contains(named), "{error}");
    }
}
