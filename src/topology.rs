//! One description of every exchange, queue and binding; `topology apply` declares
//! it over AMQP and `topology export` prints it as RabbitMQ definitions, so the two
//! cannot disagree.

use std::collections::BTreeMap;
use std::time::Duration;

use lapin::options::{
    ExchangeBindOptions, ExchangeDeclareOptions, QueueBindOptions, QueueDeclareOptions,
};
use lapin::types::{AMQPValue, FieldTable};
use lapin::{Channel, ExchangeKind};
use serde_json::{Value, json};
use thiserror::Error;

use crate::ladder::Ladder;
use crate::settings::{QueueType, TopologySettings};

/// The vhost of the exported definitions by default (`topology.vhost` in
/// `config/default.toml`): a vhost of its own, so the users' permissions cover
/// nothing else on a shared broker.
pub const DEFAULT_VHOST: &str = "order-expiry";

/// A queue or exchange argument: RabbitMQ arguments here are strings or integers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Arg {
    /// A string argument, e.g. `x-queue-type`.
    Str(String),
    /// An integer argument, e.g. `x-message-ttl`.
    Int(i64),
}

/// Kind of exchange, as far as this topology uses them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExchangeType {
    /// Routes on routing-key patterns: the ladder levels and the due exchange.
    Topic,
    /// Routes everything: the parked exchange.
    Fanout,
}

/// A durable exchange.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Exchange {
    /// Full name.
    pub name: String,
    /// Its type.
    pub kind: ExchangeType,
}

/// A durable queue and its arguments.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Queue {
    /// Full name.
    pub name: String,
    /// `x-` arguments.
    pub arguments: BTreeMap<String, Arg>,
}

/// Where a binding delivers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Destination {
    /// Into a queue.
    Queue,
    /// Into another exchange (exchange-to-exchange binding).
    Exchange,
}

/// A binding from an exchange to a queue or exchange.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Binding {
    /// Source exchange.
    pub source: String,
    /// Destination name.
    pub destination: String,
    /// Whether the destination is a queue or an exchange.
    pub destination_type: Destination,
    /// Topic pattern (or empty for fanout).
    pub routing_key: String,
}

/// Every object of one deployment, in the order they must be declared.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Topology {
    /// All exchanges.
    pub exchanges: Vec<Exchange>,
    /// All queues.
    pub queues: Vec<Queue>,
    /// All bindings.
    pub bindings: Vec<Binding>,
}

/// Declaring the topology failed.
#[derive(Debug, Error)]
pub enum TopologyError {
    /// The broker refused a declaration (often: an existing queue with other arguments).
    #[error("broker refused to declare {object}: {source}")]
    Declare {
        /// What was being declared.
        object: String,
        /// What the broker said.
        source: lapin::Error,
    },
    /// The broker did not answer in time.
    #[error("broker did not answer declaring {object} within {timeout:?}")]
    Timeout {
        /// What was being declared.
        object: String,
        /// The limit.
        timeout: Duration,
    },
}

impl Topology {
    /// The full topology: ladder levels, due exchange and queue, parked exchange and queue.
    pub fn describe(ladder: &Ladder, settings: &TopologySettings) -> Self {
        let mut topology = Self::consumer_part(ladder);
        for level in (0..ladder.levels()).rev() {
            let name = ladder.level_name(level);
            topology.exchanges.push(Exchange {
                name: name.clone(),
                kind: ExchangeType::Topic,
            });
            topology
                .queues
                .push(holding_queue(ladder, settings, level, name.clone()));
            let (hold, pass) = ladder.binding_patterns(level);
            topology.bindings.push(Binding {
                source: name.clone(),
                destination: name.clone(),
                destination_type: Destination::Queue,
                routing_key: hold,
            });
            topology.bindings.push(Binding {
                source: name,
                destination: ladder.dead_letter_target(level),
                destination_type: Destination::Exchange,
                routing_key: pass,
            });
        }
        topology
    }

    /// What the consumer needs and re-declares after every reconnect: the due and
    /// parked exchanges and queues. It does not touch the ladder.
    pub fn consumer_part(ladder: &Ladder) -> Self {
        let mut quorum = BTreeMap::new();
        quorum.insert("x-queue-type".to_owned(), Arg::Str("quorum".to_owned()));
        Self {
            exchanges: vec![
                Exchange {
                    name: ladder.due_exchange(),
                    kind: ExchangeType::Topic,
                },
                Exchange {
                    name: ladder.parked_exchange(),
                    kind: ExchangeType::Fanout,
                },
            ],
            queues: vec![
                Queue {
                    name: ladder.due_queue(),
                    arguments: quorum.clone(),
                },
                Queue {
                    name: ladder.parked_queue(),
                    arguments: quorum,
                },
            ],
            bindings: vec![
                Binding {
                    source: ladder.due_exchange(),
                    destination: ladder.due_queue(),
                    destination_type: Destination::Queue,
                    routing_key: "#".to_owned(),
                },
                Binding {
                    source: ladder.parked_exchange(),
                    destination: ladder.parked_queue(),
                    destination_type: Destination::Queue,
                    routing_key: String::new(),
                },
            ],
        }
    }

    /// RabbitMQ definitions JSON (the format `rabbitmqctl import_definitions` and
    /// `load_definitions` read), every object in `vhost`.
    pub fn to_definitions(&self, vhost: &str) -> Value {
        let exchanges: Vec<Value> = self
            .exchanges
            .iter()
            .map(|e| {
                json!({
                    "name": e.name,
                    "vhost": vhost,
                    "type": match e.kind { ExchangeType::Topic => "topic", ExchangeType::Fanout => "fanout" },
                    "durable": true,
                    "auto_delete": false,
                    "internal": false,
                    "arguments": {},
                })
            })
            .collect();
        let queues: Vec<Value> = self
            .queues
            .iter()
            .map(|q| {
                let arguments: serde_json::Map<String, Value> = q
                    .arguments
                    .iter()
                    .map(|(k, v)| {
                        let v = match v {
                            Arg::Str(s) => json!(s),
                            Arg::Int(i) => json!(i),
                        };
                        (k.clone(), v)
                    })
                    .collect();
                json!({
                    "name": q.name,
                    "vhost": vhost,
                    "durable": true,
                    "auto_delete": false,
                    "arguments": arguments,
                })
            })
            .collect();
        let bindings: Vec<Value> = self
            .bindings
            .iter()
            .map(|b| {
                json!({
                    "source": b.source,
                    "vhost": vhost,
                    "destination": b.destination,
                    "destination_type": match b.destination_type { Destination::Queue => "queue", Destination::Exchange => "exchange" },
                    "routing_key": b.routing_key,
                    "arguments": {},
                })
            })
            .collect();
        json!({
            "vhosts": [{ "name": vhost }],
            "exchanges": exchanges,
            "queues": queues,
            "bindings": bindings,
        })
    }

    /// Pretty-printed definitions with a trailing newline: the bytes of
    /// `definitions.json` for the default settings.
    pub fn to_definitions_string(&self, vhost: &str) -> String {
        let mut text = serde_json::to_string_pretty(&self.to_definitions(vhost))
            .unwrap_or_else(|_| String::from("{}"));
        text.push('\n');
        text
    }

    /// Declares everything on `channel`. Idempotent: declaring an existing object
    /// with the same arguments is a no-op on the broker.
    pub async fn apply(&self, channel: &Channel, timeout: Duration) -> Result<(), TopologyError> {
        let durable = ExchangeDeclareOptions {
            durable: true,
            ..ExchangeDeclareOptions::default()
        };
        for e in &self.exchanges {
            let kind = match e.kind {
                ExchangeType::Topic => ExchangeKind::Topic,
                ExchangeType::Fanout => ExchangeKind::Fanout,
            };
            let object = format!("exchange {}", e.name);
            bounded(
                &object,
                timeout,
                channel.exchange_declare(
                    e.name.as_str().into(),
                    kind,
                    durable,
                    FieldTable::default(),
                ),
            )
            .await?;
        }
        for q in &self.queues {
            let object = format!("queue {}", q.name);
            bounded(
                &object,
                timeout,
                channel.queue_declare(
                    q.name.as_str().into(),
                    QueueDeclareOptions::durable(),
                    field_table(&q.arguments),
                ),
            )
            .await?;
        }
        for b in &self.bindings {
            let object = format!(
                "binding {} -> {} [{}]",
                b.source, b.destination, b.routing_key
            );
            match b.destination_type {
                Destination::Queue => {
                    bounded(
                        &object,
                        timeout,
                        channel.queue_bind(
                            b.destination.as_str().into(),
                            b.source.as_str().into(),
                            b.routing_key.as_str().into(),
                            QueueBindOptions::default(),
                            FieldTable::default(),
                        ),
                    )
                    .await?
                }
                Destination::Exchange => {
                    bounded(
                        &object,
                        timeout,
                        channel.exchange_bind(
                            b.destination.as_str().into(),
                            b.source.as_str().into(),
                            b.routing_key.as_str().into(),
                            ExchangeBindOptions::default(),
                            FieldTable::default(),
                        ),
                    )
                    .await?
                }
            };
        }
        Ok(())
    }
}

impl Topology {
    /// Deletes every queue (with its messages) and exchange of this topology,
    /// best effort: what is already gone or cannot be deleted is skipped. For
    /// benchmarks and tests that made a throw-away topology; never run by the
    /// service. Returns how many deletions failed.
    pub async fn remove(&self, channel: &Channel, timeout: Duration) -> usize {
        let mut failed = 0;
        for q in &self.queues {
            let deleting = channel.queue_delete(q.name.as_str().into(), Default::default());
            if !matches!(tokio::time::timeout(timeout, deleting).await, Ok(Ok(_))) {
                failed += 1;
            }
        }
        for e in &self.exchanges {
            let deleting = channel.exchange_delete(e.name.as_str().into(), Default::default());
            if !matches!(tokio::time::timeout(timeout, deleting).await, Ok(Ok(()))) {
                failed += 1;
            }
        }
        failed
    }
}

fn holding_queue(ladder: &Ladder, settings: &TopologySettings, level: u8, name: String) -> Queue {
    let mut arguments = BTreeMap::new();
    let ttl = i64::try_from(Ladder::level_ttl_ms(level)).unwrap_or(i64::MAX);
    arguments.insert("x-message-ttl".to_owned(), Arg::Int(ttl));
    arguments.insert(
        "x-dead-letter-exchange".to_owned(),
        Arg::Str(ladder.dead_letter_target(level)),
    );
    match settings.queue_type {
        QueueType::Quorum => {
            arguments.insert("x-queue-type".to_owned(), Arg::Str("quorum".to_owned()));
            // Classic dead-lettering is at-most-once: a crash between expiry and
            // the dead-letter publish loses the message. At-least-once needs
            // reject-publish overflow.
            arguments.insert(
                "x-dead-letter-strategy".to_owned(),
                Arg::Str("at-least-once".to_owned()),
            );
            arguments.insert(
                "x-overflow".to_owned(),
                Arg::Str("reject-publish".to_owned()),
            );
        }
        QueueType::Classic => {
            arguments.insert("x-queue-type".to_owned(), Arg::Str("classic".to_owned()));
            arguments.insert(
                "x-overflow".to_owned(),
                Arg::Str("reject-publish".to_owned()),
            );
        }
    }
    if settings.max_length > 0 {
        let max = i64::try_from(settings.max_length).unwrap_or(i64::MAX);
        arguments.insert("x-max-length".to_owned(), Arg::Int(max));
    }
    Queue { name, arguments }
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

async fn bounded<T>(
    object: &str,
    timeout: Duration,
    declare: impl Future<Output = lapin::Result<T>>,
) -> Result<T, TopologyError> {
    match tokio::time::timeout(timeout, declare).await {
        Ok(Ok(value)) => Ok(value),
        Ok(Err(source)) => Err(TopologyError::Declare {
            object: object.to_owned(),
            source,
        }),
        Err(_) => Err(TopologyError::Timeout {
            object: object.to_owned(),
            timeout,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ladder::topic_matches;

    fn settings(queue_type: QueueType) -> TopologySettings {
        TopologySettings {
            prefix: "orders".to_owned(),
            vhost: DEFAULT_VHOST.to_owned(),
            levels: 4,
            queue_type,
            max_length: 0,
        }
    }

    #[test]
    fn every_level_has_queue_ttl_and_dead_letter_target() {
        let ladder = Ladder::new("orders", 4).unwrap();
        let t = Topology::describe(&ladder, &settings(QueueType::Quorum));
        for level in 0..4u8 {
            let q = t
                .queues
                .iter()
                .find(|q| q.name == ladder.level_name(level))
                .unwrap();
            assert_eq!(
                q.arguments["x-message-ttl"],
                Arg::Int(1000 << level),
                "level {level}"
            );
            assert_eq!(
                q.arguments["x-dead-letter-exchange"],
                Arg::Str(ladder.dead_letter_target(level))
            );
            assert_eq!(
                q.arguments["x-dead-letter-strategy"],
                Arg::Str("at-least-once".into())
            );
            assert_eq!(q.arguments["x-overflow"], Arg::Str("reject-publish".into()));
        }
    }

    #[test]
    fn classic_holding_queues_have_no_at_least_once_strategy() {
        let ladder = Ladder::new("orders", 4).unwrap();
        let t = Topology::describe(&ladder, &settings(QueueType::Classic));
        let q = &t.queues[2];
        assert_eq!(q.arguments["x-queue-type"], Arg::Str("classic".into()));
        assert!(!q.arguments.contains_key("x-dead-letter-strategy"));
    }

    #[test]
    fn each_level_routes_every_key_exactly_once() {
        let ladder = Ladder::new("orders", 4).unwrap();
        let t = Topology::describe(&ladder, &settings(QueueType::Quorum));
        for delay in 0..16 {
            let key = ladder.routing_key(delay);
            for level in 0..4 {
                let name = ladder.level_name(level);
                let matches = t
                    .bindings
                    .iter()
                    .filter(|b| b.source == name && topic_matches(&b.routing_key, &key))
                    .count();
                assert_eq!(matches, 1, "key {key} at level {level}");
            }
        }
    }

    #[test]
    fn definitions_name_every_object_in_the_vhost() {
        let ladder = Ladder::new("orders", 4).unwrap();
        let t = Topology::describe(&ladder, &settings(QueueType::Quorum));
        let defs = t.to_definitions("vh");
        assert_eq!(defs["queues"].as_array().unwrap().len(), 4 + 2);
        assert_eq!(defs["exchanges"].as_array().unwrap().len(), 4 + 2);
        assert_eq!(defs["bindings"].as_array().unwrap().len(), 4 * 2 + 2);
        assert!(
            defs["queues"]
                .as_array()
                .unwrap()
                .iter()
                .all(|q| q["vhost"] == "vh" && q["durable"] == true)
        );
    }
}
