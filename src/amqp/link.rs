//! One lazily opened connection with a confirm-mode channel ([`Confirms`]),
//! re-opened on the next use after it failed: the publisher's
//! [`crate::Scheduler`] and the consumer's `order.expired` events both publish
//! through one.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use lapin::Connection;
use secrecy::SecretString;
use thiserror::Error;
use tokio::sync::Mutex;

use super::{BrokerError, Confirms, ConnectError, TlsFiles, bounded, close_failed, connect};

/// Opening the link failed.
#[derive(Debug, Error)]
pub(crate) enum LinkError {
    #[error(transparent)]
    Connect(#[from] ConnectError),
    #[error(transparent)]
    Broker(#[from] BrokerError),
}

/// One connection and its confirm-mode channel.
struct ConfirmChannel {
    connection: Connection,
    confirms: Confirms,
    /// Tells links apart: channel ids repeat across connections.
    id: u64,
}

/// Source of [`ConfirmChannel::id`]s.
static LINKS: AtomicU64 = AtomicU64::new(0);

/// A confirm-mode channel on a connection of its own, opened on first use.
pub(crate) struct ConfirmLink {
    url: SecretString,
    tls: TlsFiles,
    name: &'static str,
    pub(crate) timeout: Duration,
    link: Mutex<Option<ConfirmChannel>>,
}

impl ConfirmLink {
    /// A link to `url` named `name` (shown by the broker), every broker await
    /// bounded by `timeout`. Connects on first use.
    pub(crate) fn new(
        url: SecretString,
        tls: TlsFiles,
        name: &'static str,
        timeout: Duration,
    ) -> Self {
        Self {
            url,
            tls,
            name,
            timeout,
            link: Mutex::new(None),
        }
    }

    /// The broker URL.
    pub(crate) fn url(&self) -> &SecretString {
        &self.url
    }

    /// Replaces the TLS files used by the next connect.
    pub(crate) fn set_tls(&mut self, tls: TlsFiles) {
        self.tls = tls;
    }

    /// The current channel and its link id, (re)connecting if there is none or
    /// it has failed.
    pub(crate) async fn channel(&self) -> Result<(Confirms, u64), LinkError> {
        let mut link = self.link.lock().await;
        if let Some(l) = link.as_ref()
            && l.confirms.channel().status().connected()
            && l.connection.status().connected()
        {
            return Ok((l.confirms.clone(), l.id));
        }
        *link = None;
        let connection = connect(&self.url, &self.tls, self.name, self.timeout).await?;
        let opened = async {
            let channel =
                bounded("channel.open", self.timeout, connection.create_channel()).await?;
            Confirms::select(channel, self.timeout).await
        }
        .await;
        let confirms = match opened {
            Ok(confirms) => confirms,
            Err(error) => {
                close_failed(&connection, self.timeout).await;
                return Err(error.into());
            }
        };
        let id = LINKS.fetch_add(1, Ordering::Relaxed);
        *link = Some(ConfirmChannel {
            connection,
            confirms: confirms.clone(),
            id,
        });
        Ok((confirms, id))
    }

    /// Drops the link `link_id` if it is still the current one and its channel
    /// closed (or `always`), so the next use reconnects. Publishes still in
    /// flight on it keep it open until they finish; lapin then closes it.
    pub(crate) async fn forget(&self, failed: &Confirms, link_id: u64, always: bool) {
        let mut link = self.link.lock().await;
        let same = link.as_ref().is_some_and(|l| l.id == link_id);
        if same && (always || !failed.channel().status().connected()) {
            *link = None;
        }
    }

    /// Closes the connection cleanly.
    pub(crate) async fn close(&self) {
        if let Some(link) = self.link.lock().await.take() {
            let _ = link.confirms.channel().close(200, "closing".into()).await;
            let _ = link.connection.close(200, "closing".into()).await;
        }
    }
}
