//! Declaring the [`Topology`] on a broker (and removing a throw-away one), every
//! call bounded by `amqp.timeout_ms`.

use std::time::Duration;

use lapin::options::{
    ExchangeBindOptions, ExchangeDeclareOptions, QueueBindOptions, QueueDeclareOptions,
};
use lapin::types::{AMQPValue, FieldTable};
use lapin::{Channel, ExchangeKind};
use thiserror::Error;

use super::describe::{Arg, Binding, Destination, Exchange, ExchangeType, Queue, Topology};
use super::guard;
use super::ladder::LadderError;
use crate::Settings;
use crate::amqp::{self, BrokerError, ConnectError, TlsFiles};

/// `topology apply` failed.
#[derive(Debug, Error)]
pub enum TopologyError {
    /// The topology settings are invalid.
    #[error("invalid topology settings: {0}")]
    Settings(#[from] LadderError),
    /// No connection to the broker.
    #[error(transparent)]
    Connect(#[from] ConnectError),
    /// The broker refused a declaration (often: an existing queue with other
    /// arguments) or did not answer.
    #[error(transparent)]
    Broker(#[from] BrokerError),
    /// The prefix already has a ladder with another number of levels; applying
    /// this one in place would make copies of messages, some early.
    #[error(
        "the broker already has a ladder under prefix {prefix} with {existing} levels, not {wanted}; \
         changing topology.levels in place makes copies of messages, some of them early: apply \
         the new level count under a new prefix, then move what is in flight with \
         `order-expiry ladder migrate --from-prefix {prefix} --from-levels {existing}`"
    )]
    LevelsChanged {
        /// The prefix both share.
        prefix: String,
        /// The level count on the broker.
        existing: u8,
        /// `topology.levels`.
        wanted: u8,
    },
}

impl Topology {
    /// Connects with `settings` (as `connection_name`), declares the full
    /// topology they describe and disconnects: `topology apply`, the demo, the
    /// benchmarks and the tests all set up a broker this one way.
    pub async fn declare(
        settings: &Settings,
        connection_name: &str,
    ) -> Result<Self, TopologyError> {
        let ladder = settings.ladder()?;
        let topology = Self::describe(&ladder, &settings.topology);
        let timeout = settings.amqp.timeout;
        let tls = TlsFiles::from_settings(&settings.amqp);
        let connection = amqp::connect(&settings.amqp.url, &tls, connection_name, timeout).await?;
        let declared = async {
            match guard::levels_on_broker(&connection, &ladder, timeout).await? {
                Some(existing) if existing != ladder.levels() => {
                    return Err(TopologyError::LevelsChanged {
                        prefix: ladder.prefix().to_owned(),
                        existing,
                        wanted: ladder.levels(),
                    });
                }
                _ => {}
            }
            let channel =
                amqp::bounded("channel.open", timeout, connection.create_channel()).await?;
            topology.apply(&channel, timeout).await?;
            Ok(())
        }
        .await;
        let _ = amqp::bounded(
            "connection.close",
            timeout,
            connection.close(200, "declared".into()),
        )
        .await;
        declared?;
        Ok(topology)
    }

    /// Declares everything on `channel`. Idempotent: declaring an existing object
    /// with the same arguments is a no-op on the broker.
    pub async fn apply(&self, channel: &Channel, timeout: Duration) -> Result<(), BrokerError> {
        for exchange in &self.exchanges {
            declare_exchange(channel, exchange, timeout).await?;
        }
        for queue in &self.queues {
            declare_queue(channel, queue, timeout).await?;
        }
        for binding in &self.bindings {
            bind(channel, binding, timeout).await?;
        }
        Ok(())
    }

    /// Deletes every queue (with its messages) and exchange of this topology,
    /// best effort: what is already gone or cannot be deleted is skipped. For
    /// benchmarks and tests that made a throw-away topology; never run by the
    /// service. Returns how many deletions failed.
    pub async fn remove(&self, channel: &Channel, timeout: Duration) -> usize {
        let mut failed = 0;
        for q in &self.queues {
            let deleting = channel.queue_delete(q.name.as_str().into(), Default::default());
            failed += usize::from(
                amqp::bounded("queue.delete", timeout, deleting)
                    .await
                    .is_err(),
            );
        }
        for e in &self.exchanges {
            let deleting = channel.exchange_delete(e.name.as_str().into(), Default::default());
            failed += usize::from(
                amqp::bounded("exchange.delete", timeout, deleting)
                    .await
                    .is_err(),
            );
        }
        failed
    }
}

async fn declare_exchange(
    channel: &Channel,
    exchange: &Exchange,
    timeout: Duration,
) -> Result<(), BrokerError> {
    let kind = match exchange.kind {
        ExchangeType::Topic => ExchangeKind::Topic,
        ExchangeType::Fanout => ExchangeKind::Fanout,
    };
    let options = ExchangeDeclareOptions {
        durable: true,
        ..ExchangeDeclareOptions::default()
    };
    let name = exchange.name.as_str();
    let declaring = channel.exchange_declare(name.into(), kind, options, FieldTable::default());
    amqp::bounded(format!("declaring exchange {name}"), timeout, declaring).await
}

async fn declare_queue(
    channel: &Channel,
    queue: &Queue,
    timeout: Duration,
) -> Result<(), BrokerError> {
    let name = queue.name.as_str();
    let arguments = field_table(&queue.arguments);
    let declaring = channel.queue_declare(name.into(), QueueDeclareOptions::durable(), arguments);
    amqp::bounded(format!("declaring queue {name}"), timeout, declaring)
        .await
        .map(drop)
}

async fn bind(channel: &Channel, b: &Binding, timeout: Duration) -> Result<(), BrokerError> {
    let what = format!(
        "binding {} -> {} [{}]",
        b.source, b.destination, b.routing_key
    );
    let (destination, source, key) = (
        b.destination.as_str().into(),
        b.source.as_str().into(),
        b.routing_key.as_str().into(),
    );
    match b.destination_type {
        Destination::Queue => {
            let options = QueueBindOptions::default();
            let binding =
                channel.queue_bind(destination, source, key, options, FieldTable::default());
            amqp::bounded(what, timeout, binding).await
        }
        Destination::Exchange => {
            let options = ExchangeBindOptions::default();
            let binding =
                channel.exchange_bind(destination, source, key, options, FieldTable::default());
            amqp::bounded(what, timeout, binding).await
        }
    }
}

fn field_table(arguments: &std::collections::BTreeMap<String, Arg>) -> FieldTable {
    let mut table = FieldTable::default();
    for (key, value) in arguments {
        let value = match value {
            Arg::Str(s) => AMQPValue::LongString(s.as_str().into()),
            Arg::Int(i) => AMQPValue::LongLongInt(*i),
        };
        table.insert(key.as_str().into(), value);
    }
    table
}
