//! One description of every exchange, queue and binding. `topology apply`
//! declares it over AMQP ([`Topology::apply`]), `topology export` prints it as
//! RabbitMQ definitions and the users' permissions are derived from it, so none
//! of them can disagree. Pure: no I/O.

use std::collections::BTreeMap;
use std::fmt;

use super::ladder::Ladder;
use crate::settings::{QueueType, TopologySettings};

/// A queue or exchange argument: RabbitMQ arguments here are strings or integers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Arg {
    /// A string argument, e.g. `x-queue-type`.
    Str(String),
    /// An integer argument, e.g. `x-message-ttl`.
    Int(i64),
}

/// Kind of exchange, as far as this topology uses them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ExchangeType {
    /// Routes on routing-key patterns: the ladder levels and the due exchange.
    Topic,
    /// Routes everything: the parked exchange.
    Fanout,
}

/// A durable exchange.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Exchange {
    pub(crate) name: String,
    pub(crate) kind: ExchangeType,
}

/// A durable queue and its `x-` arguments.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Queue {
    pub(crate) name: String,
    pub(crate) arguments: BTreeMap<String, Arg>,
    /// The arguments an existing queue may have otherwise (or lack) and still
    /// be kept by [`Topology::apply_on`]: placement on every quorum queue, the
    /// catch-up arguments on the due queue. Never a ladder level's TTL or
    /// dead-letter target, whose difference makes messages early or lost.
    pub(crate) kept_if_other: Vec<&'static str>,
}

/// Where a binding delivers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Destination {
    /// Into a queue.
    Queue,
    /// Into another exchange (exchange-to-exchange binding).
    Exchange,
}

/// A binding from an exchange to a queue or exchange, with its topic pattern
/// (empty for fanout).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Binding {
    pub(crate) source: String,
    pub(crate) destination: String,
    pub(crate) destination_type: Destination,
    pub(crate) routing_key: String,
}

/// Every exchange, queue and binding of one deployment, in the order they must
/// be declared.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Topology {
    pub(crate) exchanges: Vec<Exchange>,
    pub(crate) queues: Vec<Queue>,
    pub(crate) bindings: Vec<Binding>,
}

impl Topology {
    /// The full topology: ladder levels, due exchange and queue, parked exchange and queue.
    pub fn describe(ladder: &Ladder, settings: &TopologySettings) -> Self {
        let mut topology = Self::consumer_part(ladder, settings);
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

    /// What the consumer needs and re-declares after every reconnect: the due,
    /// catch-up and parked exchanges and queues. It does not touch the ladder.
    pub fn consumer_part(ladder: &Ladder, settings: &TopologySettings) -> Self {
        let mut quorum =
            BTreeMap::from([("x-queue-type".to_owned(), Arg::Str("quorum".to_owned()))]);
        quorum.extend(placement(settings.replicas));
        // A queue declared without the argument, or with another value, is
        // kept (it works, only slower to give such messages back) and
        // reported; so is one that has it when the setting is 0. RabbitMQ
        // 4.3 compares it on a re-declare (PRECONDITION_FAILED, measured on
        // 4.3.6), 3.10 does not.
        let mut kept_if_other = PLACEMENT_ARGS.to_vec();
        kept_if_other.push(CONSUMER_DISCONNECTED_TIMEOUT);
        if let Ok(timeout @ 1..) = i64::try_from(settings.consumer_disconnected_timeout.as_millis())
        {
            // Every queue here has consumers: what a consumer on a dead or
            // hung node held goes back to the others this long after its node
            // is seen unreachable, not after the broker's default 60 s.
            quorum.insert(CONSUMER_DISCONNECTED_TIMEOUT.to_owned(), Arg::Int(timeout));
        }
        let exchange = |name, kind| Exchange { name, kind };
        let queue = |name| Queue {
            name,
            arguments: quorum.clone(),
            kept_if_other: kept_if_other.clone(),
        };
        let binding = |source, destination, routing_key: &str| Binding {
            source,
            destination,
            destination_type: Destination::Queue,
            routing_key: routing_key.to_owned(),
        };
        let mut due = queue(ladder.due_queue());
        let mut topology = Self {
            exchanges: vec![
                exchange(ladder.due_exchange(), ExchangeType::Topic),
                exchange(ladder.parked_exchange(), ExchangeType::Fanout),
            ],
            queues: vec![queue(ladder.parked_queue())],
            bindings: vec![
                binding(ladder.due_exchange(), ladder.due_queue(), "#"),
                binding(ladder.parked_exchange(), ladder.parked_queue(), ""),
            ],
        };
        if let Ok(ttl @ 1..) = i64::try_from(settings.catch_up_after.as_millis()) {
            // What no consumer took within the TTL moves on, at least once,
            // to the catch-up queue: after an outage the due queue holds only
            // what is due now.
            // A due queue declared before the catch-up queue existed lacks
            // these: it is kept, and nothing moves to catch-up until it is
            // re-created.
            due.arguments.extend(catch_up_args(ladder, ttl));
            due.kept_if_other.extend(CATCH_UP_ARGS);
            topology
                .exchanges
                .push(exchange(ladder.catch_up_exchange(), ExchangeType::Fanout));
            topology.queues.push(queue(ladder.catch_up_queue()));
            topology.bindings.push(binding(
                ladder.catch_up_exchange(),
                ladder.catch_up_queue(),
                "",
            ));
        }
        topology.queues.insert(0, due);
        topology
    }

    /// The names of every queue, in declaration order.
    pub fn queue_names(&self) -> impl Iterator<Item = &str> {
        self.queues.iter().map(|q| q.name.as_str())
    }

    /// The names of every exchange, in declaration order.
    pub fn exchange_names(&self) -> impl Iterator<Item = &str> {
        self.exchanges.iter().map(|e| e.name.as_str())
    }
}

impl fmt::Display for Topology {
    /// How much there is: `N exchanges, M queues, K bindings`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} exchanges, {} queues, {} bindings",
            self.exchanges.len(),
            self.queues.len(),
            self.bindings.len()
        )
    }
}

/// Queue arguments that only say where a quorum queue's replicas and leader
/// go. The broker refuses to re-declare a queue with other values for them
/// (PRECONDITION_FAILED) like for any argument, but a queue placed otherwise
/// still works: [`Topology::apply_on`] keeps such a queue and reports it.
pub(crate) const PLACEMENT_ARGS: [&str; 2] =
    ["x-quorum-initial-group-size", "x-queue-leader-locator"];

/// Where a quorum queue's replicas and leader go on a cluster:
/// - `x-quorum-initial-group-size = replicas` (`topology.replicas`). A group
///   larger than the cluster is clamped by the broker (RabbitMQ 3.10 and 4.0:
///   3 on a single node gives one member, 5 on three nodes gives three), so
///   the default 3 suits a single node as well as a cluster of three or more.
/// - `x-queue-leader-locator = balanced`: leaders spread over the nodes
///   (RabbitMQ 3.10+). Without it every queue gets its leader on the node
///   that declared it, so that node alone carries every level's dead-letter
///   work (measured on three 4.0.5 nodes: 24 queues 24/0/0 without, 8/8/8 with).
fn placement(replicas: u16) -> [(String, Arg); 2] {
    [
        (PLACEMENT_ARGS[0].to_owned(), Arg::Int(i64::from(replicas))),
        (
            PLACEMENT_ARGS[1].to_owned(),
            Arg::Str("balanced".to_owned()),
        ),
    ]
}

/// The argument that bounds how long a quorum queue keeps what a consumer on
/// an unreachable node holds (RabbitMQ 4.3; 3.10 has no such timeout, and
/// accepts and stores the argument).
pub(crate) const CONSUMER_DISCONNECTED_TIMEOUT: &str = "x-consumer-disconnected-timeout";

/// The due queue's arguments that move what no consumer took within `ttl_ms`
/// to the catch-up queue, at least once (at-least-once dead-lettering needs
/// reject-publish overflow).
pub(crate) const CATCH_UP_ARGS: [&str; 4] = [
    "x-message-ttl",
    "x-dead-letter-exchange",
    "x-dead-letter-strategy",
    "x-overflow",
];

fn catch_up_args(ladder: &Ladder, ttl_ms: i64) -> [(String, Arg); 4] {
    [
        (CATCH_UP_ARGS[0].to_owned(), Arg::Int(ttl_ms)),
        (
            CATCH_UP_ARGS[1].to_owned(),
            Arg::Str(ladder.catch_up_exchange()),
        ),
        (
            CATCH_UP_ARGS[2].to_owned(),
            Arg::Str("at-least-once".to_owned()),
        ),
        (
            CATCH_UP_ARGS[3].to_owned(),
            Arg::Str("reject-publish".to_owned()),
        ),
    ]
}

fn holding_queue(ladder: &Ladder, settings: &TopologySettings, level: u8, name: String) -> Queue {
    let ttl = i64::try_from(Ladder::level_ttl_ms(level)).unwrap_or(i64::MAX);
    let mut arguments = BTreeMap::from([
        ("x-message-ttl".to_owned(), Arg::Int(ttl)),
        (
            "x-dead-letter-exchange".to_owned(),
            Arg::Str(ladder.dead_letter_target(level)),
        ),
        (
            "x-queue-type".to_owned(),
            Arg::Str(settings.queue_type.as_str().to_owned()),
        ),
        // A full queue refuses the publish (schedule() fails with a nack) rather
        // than dropping its oldest message.
        (
            "x-overflow".to_owned(),
            Arg::Str("reject-publish".to_owned()),
        ),
    ]);
    if settings.queue_type == QueueType::Quorum {
        // Classic dead-lettering is at-most-once: a crash between expiry and
        // the dead-letter publish loses the message. At-least-once needs
        // reject-publish overflow.
        arguments.insert(
            "x-dead-letter-strategy".to_owned(),
            Arg::Str("at-least-once".to_owned()),
        );
    }
    if settings.queue_type == QueueType::Quorum {
        arguments.extend(placement(settings.replicas));
    }
    if settings.max_length > 0 {
        let max = i64::try_from(settings.max_length).unwrap_or(i64::MAX);
        arguments.insert("x-max-length".to_owned(), Arg::Int(max));
    }
    let kept_if_other = if settings.queue_type == QueueType::Quorum {
        PLACEMENT_ARGS.to_vec()
    } else {
        Vec::new()
    };
    Queue {
        name,
        arguments,
        kept_if_other,
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::topology::ladder::topic_matches;

    fn settings(queue_type: QueueType) -> TopologySettings {
        TopologySettings {
            queue_type,
            levels: 4,
            ..crate::Settings::default().topology
        }
    }

    /// The four-level ladder `orders` and its topology under `settings`.
    fn describe(settings: &TopologySettings) -> (Ladder, Topology) {
        let ladder = Ladder::new("orders", 4).unwrap();
        let topology = Topology::describe(&ladder, settings);
        (ladder, topology)
    }

    fn quorum() -> (Ladder, Topology) {
        describe(&settings(QueueType::Quorum))
    }

    fn text(value: &str) -> Arg {
        Arg::Str(value.into())
    }

    #[test]
    fn every_level_has_queue_ttl_and_dead_letter_target() {
        let (ladder, t) = quorum();
        for level in 0..4u8 {
            let name = ladder.level_name(level);
            let q = t.queues.iter().find(|q| q.name == name).unwrap();
            let args = &q.arguments;
            assert_eq!(args["x-message-ttl"], Arg::Int(1000 << level), "{level}");
            let target = text(&ladder.dead_letter_target(level));
            assert_eq!(args["x-dead-letter-exchange"], target);
            assert_eq!(args["x-dead-letter-strategy"], text("at-least-once"));
            assert_eq!(args["x-overflow"], text("reject-publish"));
        }
    }

    #[test]
    fn only_the_due_queue_may_be_kept_without_its_catch_up_arguments() {
        let (ladder, t) = quorum();
        for q in &t.queues {
            let catch_up = q.kept_if_other.contains(&"x-message-ttl");
            assert_eq!(catch_up, q.name == ladder.due_queue(), "{}", q.name);
            assert!(!q.kept_if_other.contains(&"x-max-length"), "{}", q.name);
            assert!(q.kept_if_other.contains(&"x-queue-leader-locator"));
        }
    }

    #[test]
    fn the_consumed_queues_give_back_a_lost_consumers_messages_within_a_second() {
        let (ladder, t) = quorum();
        let consumed = [
            ladder.due_queue(),
            ladder.parked_queue(),
            ladder.catch_up_queue(),
        ];
        for q in &t.queues {
            let has = q.arguments.get(CONSUMER_DISCONNECTED_TIMEOUT);
            if consumed.contains(&q.name) {
                assert_eq!(has, Some(&Arg::Int(1000)), "{}", q.name);
                assert!(q.kept_if_other.contains(&CONSUMER_DISCONNECTED_TIMEOUT));
            } else {
                assert_eq!(has, None, "a ladder level has no consumer: {}", q.name);
            }
        }
        let (_, t) = describe(&TopologySettings {
            consumer_disconnected_timeout: Duration::ZERO,
            ..settings(QueueType::Quorum)
        });
        for q in &t.queues {
            assert!(!q.arguments.contains_key(CONSUMER_DISCONNECTED_TIMEOUT));
            // A queue that has it anyway is kept, not an error.
            let kept = q.kept_if_other.contains(&CONSUMER_DISCONNECTED_TIMEOUT);
            assert_eq!(kept, consumed.contains(&q.name), "{}", q.name);
        }
    }

    #[test]
    fn every_quorum_queue_gets_the_replicas_and_a_balanced_leader() {
        let (_, t) = describe(&TopologySettings {
            replicas: 5,
            ..settings(QueueType::Quorum)
        });
        assert_eq!(t.queues.len(), 7, "levels, due, parked and catch-up");
        for q in &t.queues {
            assert_eq!(q.arguments["x-queue-type"], text("quorum"));
            assert_eq!(q.arguments["x-quorum-initial-group-size"], Arg::Int(5));
            let leader = &q.arguments["x-queue-leader-locator"];
            assert_eq!(leader, &text("balanced"), "{}", q.name);
        }
        let (_, default) = quorum();
        let group = &default.queues[0].arguments["x-quorum-initial-group-size"];
        assert_eq!(group, &Arg::Int(3));
        // The summary counts every object.
        assert_eq!(default.to_string(), "7 exchanges, 7 queues, 11 bindings");
        assert_eq!(default.queue_names().next(), Some("orders.due"));
    }

    #[test]
    fn classic_holding_queues_have_no_at_least_once_strategy() {
        let (_, t) = describe(&settings(QueueType::Classic));
        let args = &t.queues[3].arguments;
        assert_eq!(args["x-queue-type"], text("classic"));
        assert_eq!(args["x-overflow"], text("reject-publish"));
        assert!(!args.contains_key("x-dead-letter-strategy"));
        assert!(!args.contains_key("x-quorum-initial-group-size"));
    }

    #[test]
    fn each_level_routes_every_key_exactly_once() {
        let (ladder, t) = quorum();
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
}
