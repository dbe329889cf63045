//! Connecting to RabbitMQ: one place that bounds the wait, names the connection
//! and keeps the password out of every error.

use std::time::Duration;

use lapin::{Connection, ConnectionProperties};
use secrecy::{ExposeSecret, SecretString};
use thiserror::Error;

use crate::settings::redact_url;

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
}

/// Opens a connection named `name` (shown in the management UI), bounded by `timeout`.
pub async fn connect(
    url: &SecretString,
    name: &str,
    timeout: Duration,
) -> Result<Connection, ConnectError> {
    let properties = ConnectionProperties::default().with_connection_name(name.into());
    let connecting = Connection::connect(url.expose_secret(), properties);
    match tokio::time::timeout(timeout, connecting).await {
        Ok(Ok(connection)) => Ok(connection),
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
