//! Connecting to RabbitMQ: one place that bounds the wait, names the connection,
//! sets up TLS (`amqps://`, rustls) and keeps the password out of every error.

use std::time::Duration;

use lapin::uri::{AMQPScheme, AMQPUri};
use lapin::{Connection, ConnectionProperties};
use secrecy::{ExposeSecret, SecretString};
use thiserror::Error;

use super::bounded::{BrokerError, bounded};
use super::tls::{TlsError, TlsFiles, is_untrusted_certificate};
use crate::settings::{redact_url, scrub_url};

/// Connecting to the broker failed. Every variant shows the URL with its
/// password redacted.
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
        /// What is wrong with it, scrubbed of the password.
        reason: String,
    },
    /// The TLS settings cannot be used, or the broker's certificate is not trusted.
    #[error("TLS settings for {url}: {source}")]
    Tls {
        /// The URL, password redacted.
        url: String,
        /// What is wrong.
        source: TlsError,
    },
}

/// Opens a connection named `name` (shown in the management UI) to `url`,
/// bounded by `timeout`; `amqps://` trusts the system roots plus `tls`.
pub(crate) async fn connect(
    url: &SecretString,
    tls: &TlsFiles,
    name: &str,
    timeout: Duration,
) -> Result<Connection, ConnectError> {
    let redacted = || redact_url(url);
    let tls_error = |source| ConnectError::Tls {
        url: redacted(),
        source,
    };
    // Parsed here rather than by lapin, whose parse errors can quote the URL.
    let uri: AMQPUri =
        url.expose_secret()
            .parse()
            .map_err(|reason: String| ConnectError::InvalidUrl {
                url: redacted(),
                reason: scrub_url(&reason, url),
            })?;
    if !tls.is_empty() && uri.scheme != AMQPScheme::AMQPS {
        return Err(tls_error(TlsError::NotAmqps));
    }
    let config = tls.load().map_err(tls_error)?;
    let runtime = lapin::runtime::default_runtime().map_err(|source| ConnectError::Refused {
        url: redacted(),
        source,
    })?;
    let properties = ConnectionProperties::default().with_connection_name(name.into());
    let connecting = Connection::connect_uri_with_config(uri, properties, config, runtime);
    match bounded("connect", timeout, connecting).await {
        Ok(connection) => Ok(connection),
        Err(BrokerError::Failed { source, .. }) if is_untrusted_certificate(&source) => {
            Err(tls_error(TlsError::Untrusted { source }))
        }
        Err(BrokerError::Failed { source, .. }) => Err(ConnectError::Refused {
            url: redacted(),
            source,
        }),
        Err(BrokerError::Timeout { timeout, .. }) => Err(ConnectError::Timeout {
            url: redacted(),
            timeout,
        }),
    }
}
