//! One admin connection for operator commands. A passive declare of a queue
//! that does not exist makes the broker close the channel (404), so each look
//! that may miss runs on a channel that is reopened after it.
//!
//! A command whose node goes away mid-run (killed, stopped, hung) carries on
//! through another node of `amqp.url` (`Resume`): each command's work is
//! safe to do again (a move publishes, is confirmed, and only then acks; a
//! declare is idempotent), so it reconnects and goes on.

use std::time::Duration;

use lapin::options::QueueDeclareOptions;
use lapin::types::FieldTable;
use lapin::{Channel, Connection};
use thiserror::Error;

use crate::Settings;
pub(crate) use crate::amqp::Resume;
use crate::amqp::{self, BrokerError, ConnectError, NodeLost, TlsFiles};
use crate::service::StoreError;
use crate::topology::LadderError;

/// An operator command could not do its work.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum OpsError {
    /// The topology settings are invalid.
    #[error("invalid topology settings: {0}")]
    Settings(#[from] LadderError),
    /// No connection to the broker.
    #[error(transparent)]
    Connect(#[from] ConnectError),
    /// The broker refused an operation or did not answer.
    #[error(transparent)]
    Broker(#[from] BrokerError),
    /// The database failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The broker did not take a message that was being moved; it is still
    /// where it was (unacked there, so the broker keeps it).
    #[error("the broker did not take the message for {what}: {reason}")]
    NotTaken {
        /// The message.
        what: String,
        /// Nack, unroutable or no confirm.
        reason: String,
    },
    /// The command would do harm as asked; the text says why and what to do.
    #[error("{0}")]
    Refused(String),
    /// A queue the command works on does not exist.
    #[error("queue {0} does not exist (order-expiry topology apply creates it)")]
    Missing(String),
    /// The channel did not take the ack of a message already published to
    /// its new place: the broker will deliver the original again (a
    /// duplicate, handled idempotently, never a loss).
    #[error("the ack of a moved message was not taken; the original comes back as a duplicate")]
    AckRefused,
}

impl NodeLost for OpsError {
    fn is_node_lost(&self) -> bool {
        match self {
            Self::Connect(e) => e.is_node_lost(),
            Self::Broker(e) => e.is_node_lost(),
            // The ack went down with the channel: the original comes back.
            Self::AckRefused => true,
            Self::Settings(_)
            | Self::Store(_)
            | Self::NotTaken { .. }
            | Self::Refused(_)
            | Self::Missing(_) => false,
        }
    }
}

/// What a passive declare tells about a queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QueueState {
    /// Ready messages (not the unacked ones: AMQP does not report those).
    pub messages: u32,
    /// Consumers subscribed.
    pub consumers: u32,
}

/// The admin connection and its current plain channel.
pub(crate) struct Admin {
    connection: Connection,
    channel: Channel,
    pub(crate) timeout: Duration,
    settings: Settings,
    name: String,
}

impl Admin {
    /// Connects with `settings` as `name`. A node lost between the connect
    /// and the first channel (one stopping as the command starts accepts the
    /// connection, then resets it) is left for another node of `amqp.url`,
    /// as a node lost later is ([`Resume`]).
    pub(crate) async fn open(settings: &Settings, name: &str) -> Result<Self, OpsError> {
        let timeout = settings.amqp.timeout;
        let tls = TlsFiles::from_settings(&settings.amqp);
        let mut resume = Resume::new("opening a channel").through(&settings.amqp.url);
        loop {
            let connection = amqp::connect(&settings.amqp.url, &tls, name, timeout).await?;
            resume.connected();
            let opening = connection.create_channel();
            match amqp::bounded("channel.open", timeout, opening).await {
                Ok(channel) => {
                    return Ok(Self {
                        connection,
                        channel,
                        timeout,
                        settings: settings.clone(),
                        name: name.to_owned(),
                    });
                }
                Err(error) => {
                    amqp::close_failed(&connection, timeout).await;
                    resume.after(OpsError::from(error)).await?;
                }
            }
        }
    }

    /// A new connection in place of this one (after its node was lost): to
    /// the next broker of `amqp.url` first. The old one is closed without
    /// waiting on a node that may not answer.
    pub(crate) async fn reopen(&mut self) -> Result<(), OpsError> {
        let fresh = Self::open(&self.settings, &self.name).await?;
        let old = std::mem::replace(self, fresh);
        amqp::close_failed(&old.connection, Duration::from_millis(100)).await;
        Ok(())
    }

    /// The plain channel, reopened if the broker closed it.
    pub(crate) async fn channel(&mut self) -> Result<Channel, OpsError> {
        if !self.channel.status().connected() {
            let opening = self.connection.create_channel();
            self.channel = amqp::bounded("channel.open", self.timeout, opening).await?;
        }
        Ok(self.channel.clone())
    }

    /// A new channel of its own: closing it returns what it took unacked.
    pub(crate) async fn own_channel(&self) -> Result<Channel, OpsError> {
        let opening = self.connection.create_channel();
        Ok(amqp::bounded("channel.open", self.timeout, opening).await?)
    }

    /// A new channel in confirm mode.
    pub(crate) async fn confirm_channel(&self) -> Result<amqp::Confirms, OpsError> {
        let channel = self.own_channel().await?;
        Ok(amqp::Confirms::select(channel, self.timeout).await?)
    }

    /// Ready messages and consumers of `queue`; `None` when it does not exist.
    pub(crate) async fn queue(&mut self, queue: &str) -> Result<Option<QueueState>, OpsError> {
        let channel = self.channel().await?;
        let passive = QueueDeclareOptions {
            passive: true,
            ..QueueDeclareOptions::default()
        };
        let declaring = channel.queue_declare(queue.into(), passive, FieldTable::default());
        match amqp::bounded(format!("looking at queue {queue}"), self.timeout, declaring).await {
            Ok(q) => Ok(Some(QueueState {
                messages: q.message_count(),
                consumers: q.consumer_count(),
            })),
            Err(BrokerError::Failed { source, .. }) if amqp::is_not_found(&source) => Ok(None),
            Err(e) => Err(e.into()),
        }
    }

    /// Whether `other` is connected to this broker and vhost: a queue
    /// exclusive to this connection is looked for through `other`, where it
    /// is missing (another broker or vhost), or there and locked.
    pub(crate) async fn reached_by(&self, other: &mut Admin) -> Result<bool, OpsError> {
        let probe = format!("order-expiry.probe.{}", uuid::Uuid::new_v4());
        let channel = self.own_channel().await?;
        let exclusive = QueueDeclareOptions {
            exclusive: true,
            auto_delete: true,
            ..QueueDeclareOptions::default()
        };
        let declaring =
            channel.queue_declare(probe.as_str().into(), exclusive, FieldTable::default());
        amqp::bounded(format!("declaring {probe}"), self.timeout, declaring).await?;
        let seen = other.queue(&probe).await;
        let closing = channel.close(200, "probed".into());
        let _ = amqp::bounded("channel.close", self.timeout, closing).await;
        match seen {
            Ok(None) => Ok(false),
            Ok(Some(_)) => Ok(true),
            // RESOURCE_LOCKED: there, exclusive to this connection.
            Err(OpsError::Broker(BrokerError::Failed { .. })) => Ok(true),
            Err(error) => Err(error),
        }
    }

    /// Closes the connection.
    pub(crate) async fn close(self) {
        let closing = self.connection.close(200, "done".into());
        let _ = amqp::bounded("connection.close", self.timeout, closing).await;
    }
}
