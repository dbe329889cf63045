//! Connecting to RabbitMQ: one place that bounds the wait, names the connection,
//! sets up TLS (`amqps://`, rustls) and keeps the password out of every error.
//!
//! `amqp.url` may list several brokers (the nodes of a cluster), comma-separated.
//! Each connect tries them in turn until one answers, and starts one further
//! along the list than the connect before it in this process: a client whose
//! node died reconnects to the next node first instead of waiting on the dead
//! one's timeout again, and the connections of one process (publisher, consumer,
//! event link) spread over the nodes. Clustering and replication are the
//! broker's: a node holds no state the others lack (quorum queues).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use lapin::uri::{AMQPScheme, AMQPUri};
use lapin::{Connection, ConnectionProperties};
use secrecy::{ExposeSecret, SecretString};
use thiserror::Error;

use super::AmqpError;
use super::bounded::{BrokerError, bounded};
use super::tls::{TlsError, TlsFiles, is_untrusted_certificate};
use crate::settings::{redact_url, scrub_url, url_list};

/// Connecting to the broker failed. Every variant shows the URL with its
/// password redacted.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum ConnectError {
    /// The broker refused or the network failed.
    #[error("cannot connect to {url}: {source}")]
    Refused {
        /// The URL, password redacted.
        url: String,
        /// What the broker or the client said.
        source: AmqpError,
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
    /// `amqp.url` lists several brokers and none could be connected to.
    #[error("none of the {} brokers of amqp.url answered: {}", .failures.len(), join(.failures))]
    NoBroker {
        /// Why each failed, in the order tried (each URL redacted).
        failures: Vec<ConnectError>,
    },
    /// `amqp.url` is empty (or only commas).
    #[error("amqp.url names no broker")]
    NoUrl,
}

fn join(failures: &[ConnectError]) -> String {
    let texts: Vec<String> = failures.iter().map(ToString::to_string).collect();
    texts.join("; ")
}

/// Where the next connect starts in the list of brokers; see the module docs.
static NEXT_BROKER: AtomicUsize = AtomicUsize::new(0);

/// Opens a connection named `name` (shown in the management UI) to the first
/// broker of `urls` (one URL or a comma-separated list) that answers, starting
/// one further along the list than the previous connect of this process; each
/// attempt is bounded by `timeout`, so all of them by `timeout` times the
/// number of brokers. One URL fails with its own error; a list fails with
/// [`ConnectError::NoBroker`], naming every attempt.
pub(crate) async fn connect(
    urls: &SecretString,
    tls: &TlsFiles,
    name: &str,
    timeout: Duration,
) -> Result<Connection, ConnectError> {
    Ok(connect_node(urls, tls, name, timeout).await?.0)
}

/// The broker node a connection reached, as its URL names it: what a span
/// of the consumer reports as `server.address` and `server.port`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct BrokerNode {
    pub(crate) host: String,
    pub(crate) port: u16,
}

/// [`connect`], and which node of the list answered.
pub(crate) async fn connect_node(
    urls: &SecretString,
    tls: &TlsFiles,
    name: &str,
    timeout: Duration,
) -> Result<(Connection, BrokerNode), ConnectError> {
    let raw = urls.expose_secret();
    if !raw.contains(',') {
        return connect_one(urls, tls, name, timeout).await;
    }
    let list: Vec<SecretString> = url_list(raw).map(SecretString::from).collect();
    if list.is_empty() {
        return Err(ConnectError::NoUrl);
    }
    let start = NEXT_BROKER.fetch_add(1, Ordering::Relaxed);
    let mut failures = Vec::new();
    for i in 0..list.len() {
        let url = &list[(start + i) % list.len()];
        match connect_one(url, tls, name, timeout).await {
            Ok(connected) => {
                tracing::debug!(url = %redact_url(url), name, "connected");
                return Ok(connected);
            }
            Err(error) => failures.push(error),
        }
    }
    Err(ConnectError::NoBroker { failures })
}

/// Opens a connection named `name` to the one broker at `url`, bounded by
/// `timeout`; `amqps://` trusts the system roots plus `tls`.
async fn connect_one(
    url: &SecretString,
    tls: &TlsFiles,
    name: &str,
    timeout: Duration,
) -> Result<(Connection, BrokerNode), ConnectError> {
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
        source: AmqpError::new(source),
    })?;
    let node = BrokerNode {
        host: uri.authority.host.clone(),
        port: uri.authority.port,
    };
    let properties = ConnectionProperties::default().with_connection_name(name.into());
    let connecting = Connection::connect_uri_with_config(uri, properties, config, runtime);
    match bounded("connect", timeout, connecting).await {
        Ok(connection) => Ok((connection, node)),
        Err(BrokerError::Failed { source, .. }) if is_untrusted_certificate(source.lapin()) => {
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

/// Closes `connection` after what was to be set up on it failed, bounded by
/// `timeout`, ignoring errors. A dropped lapin connection stays open: a consumer
/// whose `basic.consume` the broker registered after the client gave up on it
/// would stay subscribed, holding its prefetched messages, for as long as the
/// process lives (seen on a cluster that had lost its majority: 329 orders held).
pub(crate) async fn close_failed(connection: &Connection, timeout: Duration) {
    let closing = connection.close(320, "set-up failed".into());
    let _ = tokio::time::timeout(timeout, closing).await;
}
