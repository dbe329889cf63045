//! Connecting to RabbitMQ: one place that bounds the wait, names the connection,
//! sets up TLS (`amqps://`, rustls) and keeps the password out of every error.

use std::path::{Path, PathBuf};
use std::time::Duration;

use lapin::tcp::{OwnedIdentity, OwnedTLSConfig};
use lapin::uri::{AMQPScheme, AMQPUri};
use lapin::{Connection, ConnectionProperties};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use secrecy::{ExposeSecret, SecretString};
use thiserror::Error;

use crate::settings::{AmqpSettings, redact_url, scrub_url};

/// Connecting to the broker failed.
#[derive(Debug, Error)]
pub enum ConnectError {
    /// The broker refused or the network failed.
    #[error("cannot connect to {url}: {source}")]
    Refused {
        /// The URL, password redacted.
        url: String,
        /// What lapin said.
        source: lapin::Error,
    },
    /// No answer in time.
    #[error("no answer from {url} within {timeout:?}")]
    Timeout {
        /// The URL, password redacted.
        url: String,
        /// The limit.
        timeout: Duration,
    },
    /// The URL does not parse (the reason never repeats the password).
    #[error("invalid broker URL {url}: {reason}")]
    InvalidUrl {
        /// The URL, password redacted.
        url: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The TLS settings cannot be used: a file is missing or holds no
    /// certificate or key, or they are set for a plain `amqp://` URL.
    #[error("TLS settings for {url}: {reason}")]
    Tls {
        /// The URL, password redacted.
        url: String,
        /// What is wrong.
        reason: String,
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
    fn load(&self) -> Result<OwnedTLSConfig, String> {
        let cert_chain = match &self.ca_file {
            None => None,
            Some(path) => {
                let pem = read(path, "amqp.tls_ca_file")?;
                let certs = CertificateDer::pem_slice_iter(&pem)
                    .collect::<Result<Vec<_>, _>>()
                    .map_err(|e| format!("amqp.tls_ca_file {}: {e}", path.display()))?;
                if certs.is_empty() {
                    return Err(format!(
                        "amqp.tls_ca_file {} holds no PEM certificate",
                        path.display()
                    ));
                }
                Some(String::from_utf8_lossy(&pem).into_owned())
            }
        };
        let identity = match (&self.cert_file, &self.key_file) {
            (None, None) => None,
            (Some(cert), Some(key)) => {
                let pem = read(cert, "amqp.tls_cert_file")?;
                let certs = CertificateDer::pem_slice_iter(&pem)
                    .collect::<Result<Vec<_>, _>>()
                    .map_err(|e| format!("amqp.tls_cert_file {}: {e}", cert.display()))?;
                if certs.is_empty() {
                    return Err(format!(
                        "amqp.tls_cert_file {} holds no PEM certificate",
                        cert.display()
                    ));
                }
                let key_pem = read(key, "amqp.tls_key_file")?;
                PrivateKeyDer::from_pem_slice(&key_pem).map_err(|e| {
                    format!(
                        "amqp.tls_key_file {} holds no usable PEM private key: {e}",
                        key.display()
                    )
                })?;
                Some(OwnedIdentity::PKCS8 { pem, key: key_pem })
            }
            _ => {
                return Err(
                    "amqp.tls_cert_file and amqp.tls_key_file must be set together".to_owned(),
                );
            }
        };
        Ok(OwnedTLSConfig {
            identity,
            cert_chain,
        })
    }
}

fn read(path: &Path, setting: &str) -> Result<Vec<u8>, String> {
    std::fs::read(path).map_err(|e| format!("cannot read {setting} {}: {e}", path.display()))
}

/// Opens a connection named `name` (shown in the management UI), bounded by
/// `timeout`; `amqps://` trusts the system roots only. See [`connect_tls`].
pub async fn connect(
    url: &SecretString,
    name: &str,
    timeout: Duration,
) -> Result<Connection, ConnectError> {
    connect_tls(url, &TlsFiles::default(), name, timeout).await
}

/// [`connect`] with TLS files: a private CA and an optional client certificate,
/// for `amqps://` URLs.
pub async fn connect_tls(
    url: &SecretString,
    tls: &TlsFiles,
    name: &str,
    timeout: Duration,
) -> Result<Connection, ConnectError> {
    // Parsed here rather than by lapin, whose parse errors can quote the URL.
    let uri: AMQPUri =
        url.expose_secret()
            .parse()
            .map_err(|reason: String| ConnectError::InvalidUrl {
                url: redact_url(url),
                reason: scrub_url(&reason, url),
            })?;
    if !tls.is_empty() && uri.scheme != AMQPScheme::AMQPS {
        return Err(ConnectError::Tls {
            url: redact_url(url),
            reason: "amqp.tls_* files are set but the URL is not amqps://".to_owned(),
        });
    }
    let config = tls.load().map_err(|reason| ConnectError::Tls {
        url: redact_url(url),
        reason,
    })?;
    let runtime = lapin::runtime::default_runtime().map_err(|source| ConnectError::Refused {
        url: redact_url(url),
        source,
    })?;
    let properties = ConnectionProperties::default().with_connection_name(name.into());
    let connecting = Connection::connect_uri_with_config(uri, properties, config, runtime);
    match tokio::time::timeout(timeout, connecting).await {
        Ok(Ok(connection)) => Ok(connection),
        Ok(Err(source)) if source.to_string().contains("invalid peer certificate") => {
            Err(ConnectError::Tls {
                url: redact_url(url),
                reason: format!(
                    "the broker's certificate is not trusted ({source}); set amqp.tls_ca_file \
                     to the CA that signed it"
                ),
            })
        }
        Ok(Err(source)) => Err(ConnectError::Refused {
            url: redact_url(url),
            source,
        }),
        Err(_) => Err(ConnectError::Timeout {
            url: redact_url(url),
            timeout,
        }),
    }
}

/// Exponential backoff with an upper bound, for reconnects and retries.
#[derive(Debug, Clone)]
pub struct Backoff {
    initial: Duration,
    max: Duration,
    next: Duration,
}

impl Backoff {
    /// Starts at `initial`, doubles on each [`Backoff::next_delay`], never above `max`.
    pub fn new(initial: Duration, max: Duration) -> Self {
        Self {
            initial,
            max,
            next: initial,
        }
    }

    /// The delay to wait now; the following one is twice as long.
    pub fn next_delay(&mut self) -> Duration {
        let delay = self.next;
        self.next = (self.next * 2).min(self.max);
        delay
    }

    /// Back to the initial delay after a success.
    pub fn reset(&mut self) {
        self.next = self.initial;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_to_a_ceiling_and_resets() {
        let mut b = Backoff::new(Duration::from_millis(100), Duration::from_millis(350));
        let got: Vec<u128> = (0..4).map(|_| b.next_delay().as_millis()).collect();
        assert_eq!(got, [100, 200, 350, 350]);
        b.reset();
        assert_eq!(b.next_delay(), Duration::from_millis(100));
    }
}
