//! Declaring the [`Topology`] on a broker, every call bounded by
//! `amqp.timeout_ms`.

use std::collections::BTreeMap;
use std::time::Duration;

use lapin::options::{
    ExchangeBindOptions, ExchangeDeclareOptions, QueueBindOptions, QueueDeclareOptions,
};
use lapin::types::{AMQPValue, FieldTable};
use lapin::{Channel, Connection, ExchangeKind};
use thiserror::Error;

use super::describe::{Arg, Binding, Destination, Exchange, ExchangeType, Queue, Topology};
use super::guard;
use super::ladder::{Ladder, LadderError};
use crate::Settings;
use crate::amqp::{self, BrokerError, ConnectError, NodeLost, Resume, TlsFiles};

/// `topology apply` failed.
#[derive(Debug, Error)]
#[non_exhaustive]
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

impl NodeLost for TopologyError {
    fn is_node_lost(&self) -> bool {
        match self {
            Self::Connect(e) => e.is_node_lost(),
            Self::Broker(e) => e.is_node_lost(),
            Self::Settings(_) | Self::LevelsChanged { .. } => false,
        }
    }
}

/// A queue that exists with other placement arguments
/// (`x-quorum-initial-group-size`, `x-queue-leader-locator`) than the settings
/// give: declared before `topology.replicas` existed, or with another value.
/// Queue arguments cannot change, and a queue placed otherwise still works, so
/// it is kept as it is (the other arguments still checked where the broker
/// lets us), and reported.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeptQueue {
    /// The queue.
    pub name: String,
    /// What the broker said about it (its PRECONDITION_FAILED reply).
    pub reason: String,
}

impl KeptQueue {
    /// What to do about a kept queue, for the warning that reports it.
    pub const ADVICE: &'static str = "queue kept with the placement (or x-consumer-disconnected-timeout) it was declared with (queue arguments cannot change); a policy can set consumer-disconnected-timeout; to replicate it on more nodes run `rabbitmq-queues grow <node> all`, to spread leaders `rabbitmq-queues rebalance quorum` (docs/src/operating/cluster.md)";
}

impl Topology {
    /// Connects with `settings` (as `connection_name`), declares the full
    /// topology they describe and disconnects: `topology apply`, the demo, the
    /// benchmarks and the tests all set up a broker this one way. Queues kept
    /// with other placement arguments are logged; [`Self::declare_keeping`]
    /// returns them.
    pub async fn declare(
        settings: &Settings,
        connection_name: &str,
    ) -> Result<Self, TopologyError> {
        let (topology, kept) = Self::declare_keeping(settings, connection_name).await?;
        for k in &kept {
            tracing::warn!(queue = %k.name, broker = %k.reason, "{}", KeptQueue::ADVICE);
        }
        Ok(topology)
    }

    /// [`Self::declare`], returning the queues kept with other placement
    /// arguments ([`KeptQueue`]) instead of logging them. A node that goes
    /// away mid-way is resumed through another one of `amqp.url` (every
    /// declare is idempotent).
    pub async fn declare_keeping(
        settings: &Settings,
        connection_name: &str,
    ) -> Result<(Self, Vec<KeptQueue>), TopologyError> {
        let ladder = settings.ladder()?;
        let topology = Self::describe(&ladder, &settings.topology);
        let mut resume = Resume::new("topology apply").through(&settings.amqp.url);
        loop {
            let declared = topology.declare_once(settings, &ladder, connection_name, &mut resume);
            match declared.await {
                Ok(kept) => return Ok((topology, kept)),
                Err(error) => resume.after(error).await?,
            }
        }
    }

    /// One attempt at [`Self::declare_keeping`], on a connection of its own.
    async fn declare_once(
        &self,
        settings: &Settings,
        ladder: &Ladder,
        connection_name: &str,
        resume: &mut Resume,
    ) -> Result<Vec<KeptQueue>, TopologyError> {
        let timeout = settings.amqp.timeout;
        let tls = TlsFiles::from_settings(&settings.amqp);
        let connection = amqp::connect(&settings.amqp.url, &tls, connection_name, timeout).await?;
        resume.connected();
        let declared = async {
            match guard::levels_on_broker(&connection, ladder, timeout).await? {
                Some(existing) if existing != ladder.levels() => {
                    return Err(TopologyError::LevelsChanged {
                        prefix: ladder.prefix().to_owned(),
                        existing,
                        wanted: ladder.levels(),
                    });
                }
                _ => {}
            }
            Ok(self.apply_on(&connection, timeout).await?)
        }
        .await;
        let _ = amqp::bounded(
            "connection.close",
            timeout,
            connection.close(200, "declared".into()),
        )
        .await;
        declared
    }

    /// Declares everything on channels of `connection`, keeping a queue that
    /// exists with other placement arguments ([`KeptQueue`], returned). Any
    /// other difference is an error, as with [`Self::apply`]. The broker
    /// answers a re-declare with other arguments by closing the channel, so a
    /// fresh one is opened after each such answer; the last is closed at the end.
    pub(crate) async fn apply_on(
        &self,
        connection: &Connection,
        timeout: Duration,
    ) -> Result<Vec<KeptQueue>, BrokerError> {
        let open = || amqp::bounded("channel.open", timeout, connection.create_channel());
        let mut channel = open().await?;
        for exchange in &self.exchanges {
            declare_exchange(&channel, exchange, timeout).await?;
        }
        let mut kept = Vec::new();
        for queue in &self.queues {
            let mut arguments = queue.arguments.clone();
            let mut reasons: Vec<String> = Vec::new();
            loop {
                let error =
                    match declare_queue_with(&channel, &queue.name, &arguments, timeout).await {
                        Ok(()) => break,
                        Err(error) => error,
                    };
                let Some(key) = differing_kept_arg(queue, &error) else {
                    return Err(error);
                };
                channel = open().await?;
                reasons.push(error.to_string());
                if arguments.remove(key).is_none() {
                    // The queue has another explicit value than ours, which
                    // AMQP cannot read back: it exists (passive), and is kept.
                    let passive = QueueDeclareOptions {
                        passive: true,
                        ..QueueDeclareOptions::durable()
                    };
                    let name = queue.name.as_str();
                    let declaring =
                        channel.queue_declare(name.into(), passive, FieldTable::default());
                    amqp::bounded(
                        format!("declaring queue {name} (passive)"),
                        timeout,
                        declaring,
                    )
                    .await?;
                    break;
                }
            }
            if !reasons.is_empty() {
                kept.push(KeptQueue {
                    name: queue.name.clone(),
                    reason: reasons.join("; "),
                });
            }
        }
        for binding in &self.bindings {
            bind(&channel, binding, timeout).await?;
        }
        let _ = amqp::bounded(
            "channel.close",
            timeout,
            channel.close(200, "declared".into()),
        )
        .await;
        Ok(kept)
    }

    /// Connects with `settings` (as `connection_name`), declares this topology
    /// and disconnects; returns the queues kept with other placement arguments
    /// ([`KeptQueue`]). Idempotent: declaring an existing object with the same
    /// arguments is a no-op on the broker. [`Self::declare`] describes the
    /// topology of `settings` itself and checks its level count first.
    pub async fn apply(
        &self,
        settings: &Settings,
        connection_name: &str,
    ) -> Result<Vec<KeptQueue>, TopologyError> {
        let timeout = settings.amqp.timeout;
        let tls = TlsFiles::from_settings(&settings.amqp);
        let connection = amqp::connect(&settings.amqp.url, &tls, connection_name, timeout).await?;
        let declared = self.apply_on(&connection, timeout).await;
        let _ = amqp::bounded(
            "connection.close",
            timeout,
            connection.close(200, "declared".into()),
        )
        .await;
        Ok(declared?)
    }

    /// Declares this topology's first binding again on `channel` (a clone
    /// the future owns): `serve`'s probe that its broker node still answers
    /// for the cluster (`amqp.probe_interval_ms`). Idempotent, and one round
    /// trip. A binding, not an exchange or a queue: measured on RabbitMQ
    /// 4.3.6, a node cut off from its cluster's majority answers the
    /// re-declare of an existing exchange or queue from its own copy of the
    /// metadata, but a binding goes through the metadata store's Raft leader
    /// and gets no answer (`tests/cluster/partition.rs`).
    #[cfg(feature = "service")]
    pub(crate) fn probe_on(
        &self,
        channel: Channel,
        timeout: Duration,
    ) -> impl Future<Output = Result<(), BrokerError>> + Send + 'static {
        let binding = self.bindings.first().cloned();
        async move {
            match binding {
                Some(binding) => bind(&channel, &binding, timeout).await,
                None => Ok(()),
            }
        }
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

async fn declare_queue_with(
    channel: &Channel,
    name: &str,
    arguments: &BTreeMap<String, Arg>,
    timeout: Duration,
) -> Result<(), BrokerError> {
    let arguments = field_table(arguments);
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

/// The argument a refused queue declare names, if it is one the queue may have
/// otherwise and that is why it was refused:
/// `PRECONDITION_FAILED - inequivalent arg 'x-queue-leader-locator' ...`.
fn differing_kept_arg(queue: &Queue, error: &BrokerError) -> Option<&'static str> {
    let BrokerError::Failed { source, .. } = error else {
        return None;
    };
    if !amqp::is_precondition_failed(source) {
        return None;
    }
    let text = source.to_string();
    queue
        .kept_if_other
        .iter()
        .copied()
        .find(|key| text.contains(&format!("inequivalent arg '{key}'")))
}

fn field_table(arguments: &BTreeMap<String, Arg>) -> FieldTable {
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
