//! The two least-privilege users of the exported definitions, their permissions
//! derived from the same [`Topology`] description as the queues, so they cannot
//! drift from what the code touches.
//!
//! - [`PUBLISHER_USER`] (the order service, through [`crate::Scheduler`]) may only
//!   write to the ladder's entry exchanges: every level (a delay enters at the
//!   level of its highest set bit) and the due exchange (a due time in the past).
//!   No configure, no read: it cannot declare, delete, purge or consume anything.
//! - [`CONSUMER_USER`] (`order-expiry serve`) may do exactly what the consumer
//!   does: re-declare [`Topology::consumer_part`] after every reconnect
//!   (configure on those exchanges and queues, write on the bound queues, read
//!   on the source exchanges), consume the due queue, publish to the parked
//!   exchange, and send a message through the ladder again (the next payment
//!   check step, an order not found yet): write on the publisher's entry
//!   exchanges. It cannot declare, delete, purge, consume or read the ladder.
//!
//! RabbitMQ matches permissions against resource *names*, whatever their type,
//! and here an exchange and its queue share a name. So the consumer's write
//! permission on the `P.due` *queue* (needed to re-declare its binding) also
//! matches the `P.due` *exchange*; a topic permission on that exchange narrows
//! it: binding with the one pattern the topology uses, and publishing only with
//! the routing key of a zero delay (the all-zero key, what a re-check due in
//! under a second is sent with). Likewise its read permission on the `P.parked`
//! exchange (the parked binding's source) also lets it read the parked queue,
//! and its write permission on the ladder's exchanges also matches the ladder's
//! queues as binding destinations: with the read it has on `P.due` and
//! `P.parked`, it could bind those two exchanges to a ladder queue (never
//! consume, purge or delete one).
//!
//! Users come with an empty `password_hash`: they exist but cannot log in until
//! ops set a password (`rabbitmqctl change_password`) or import a users file
//! with hashes after this one. Importing this file again clears the passwords
//! of existing users, so boot-time imports must load the users file after it.

use serde_json::{Value, json};

use super::describe::{ExchangeType, Topology};
use super::ladder::Ladder;

/// The user the order service publishes with.
pub const PUBLISHER_USER: &str = "order-expiry-publisher";

/// The user `order-expiry serve` consumes with.
pub const CONSUMER_USER: &str = "order-expiry-consumer";

/// A regular expression that matches no string at all. (RabbitMQ reads an empty
/// topic permission as `^$`, which would still allow an empty routing key.)
pub(crate) const MATCH_NOTHING: &str = "(?!)";

/// One user's permissions on the vhost: regular expressions over resource names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Permission {
    /// The user.
    pub(crate) user: String,
    /// Declare and delete exchanges and queues.
    pub(crate) configure: String,
    /// Publish to exchanges; bind queues and exchanges as the destination.
    pub(crate) write: String,
    /// Consume, get and purge queues; bind from exchanges as the source.
    pub(crate) read: String,
}

/// One user's routing-key permissions on one topic exchange.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct TopicPermission {
    /// The user.
    pub(crate) user: String,
    /// The exchange (its exact name).
    pub(crate) exchange: String,
    /// Routing keys the user may publish with.
    pub(crate) write: String,
    /// Binding patterns the user may bind with.
    pub(crate) read: String,
}

/// Who may do what: the permissions of [`PUBLISHER_USER`] and [`CONSUMER_USER`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Access {
    /// Per-user permissions.
    pub(crate) permissions: Vec<Permission>,
    /// Per-user, per-exchange topic permissions.
    pub(crate) topic_permissions: Vec<TopicPermission>,
}

impl Access {
    /// The least privileges the publisher and the consumer of `ladder` need;
    /// with the event action (`action.kind = amqp`), the consumer also writes
    /// to `event_exchange`, which it neither declares nor reads.
    pub(crate) fn describe(ladder: &Ladder, event_exchange: Option<&str>) -> Self {
        let levels: Vec<String> = (0..ladder.levels())
            .rev()
            .map(|level| ladder.level_name(level))
            .collect();
        let mut entries = levels.clone();
        entries.push(ladder.due_exchange());
        let publisher = Permission {
            user: PUBLISHER_USER.to_owned(),
            configure: String::new(),
            write: exactly(&entries),
            read: String::new(),
        };

        // Only the names are read: the placement settings do not matter here.
        let part = Topology::consumer_part(ladder, &crate::Settings::default().topology);
        let declared: Vec<String> = part
            .exchanges
            .iter()
            .map(|e| e.name.clone())
            .chain(part.queues.iter().map(|q| q.name.clone()))
            .collect();
        let written: Vec<String> = part
            .bindings
            .iter()
            .map(|b| b.destination.clone())
            .chain([ladder.parked_exchange()])
            .chain(levels)
            .chain(event_exchange.map(str::to_owned))
            .collect();
        let read: Vec<String> = part
            .bindings
            .iter()
            .map(|b| b.source.clone())
            .chain([ladder.due_queue()])
            .collect();
        let consumer = Permission {
            user: CONSUMER_USER.to_owned(),
            configure: exactly(&declared),
            write: exactly(&written),
            read: exactly(&read),
        };
        let topic_permissions = part
            .exchanges
            .iter()
            .filter(|e| e.kind == ExchangeType::Topic)
            .map(|e| {
                let patterns: Vec<String> = part
                    .bindings
                    .iter()
                    .filter(|b| b.source == e.name)
                    .map(|b| b.routing_key.clone())
                    .collect();
                // Only the due exchange is a ladder entry: a zero delay.
                let write = match e.name == ladder.due_exchange() {
                    true => exactly(&[ladder.routing_key(0)]),
                    false => MATCH_NOTHING.to_owned(),
                };
                TopicPermission {
                    user: CONSUMER_USER.to_owned(),
                    exchange: e.name.clone(),
                    write,
                    read: exactly(&patterns),
                }
            })
            .collect();
        Self {
            permissions: vec![publisher, consumer],
            topic_permissions,
        }
    }

    /// The users, permissions and topic permissions sections, in `vhost`.
    pub(crate) fn add_to(&self, definitions: &mut Value, vhost: &str) {
        definitions["users"] = json!(
            [PUBLISHER_USER, CONSUMER_USER]
                .iter()
                .map(|name| json!({
                    "name": name,
                    "password_hash": "",
                    "hashing_algorithm": "rabbit_password_hashing_sha256",
                    "tags": [],
                    "limits": {},
                }))
                .collect::<Vec<_>>()
        );
        definitions["permissions"] = json!(
            self.permissions
                .iter()
                .map(|p| json!({
                    "user": p.user,
                    "vhost": vhost,
                    "configure": p.configure,
                    "write": p.write,
                    "read": p.read,
                }))
                .collect::<Vec<_>>()
        );
        definitions["topic_permissions"] = json!(
            self.topic_permissions
                .iter()
                .map(|t| json!({
                    "user": t.user,
                    "vhost": vhost,
                    "exchange": t.exchange,
                    "write": t.write,
                    "read": t.read,
                }))
                .collect::<Vec<_>>()
        );
    }
}

/// `^name$`, or `^(a|b|…)$` for several, each name matched literally; duplicates
/// are dropped, the first occurrence keeps its place.
pub(crate) fn exactly(names: &[String]) -> String {
    let mut unique: Vec<String> = Vec::with_capacity(names.len());
    for name in names {
        let escaped = regex_escape(name);
        if !unique.contains(&escaped) {
            unique.push(escaped);
        }
    }
    match unique.as_slice() {
        [one] => format!("^{one}$"),
        many => format!("^({})$", many.join("|")),
    }
}

/// Escapes the characters that are special in the (PCRE) regular expressions
/// RabbitMQ permissions use.
fn regex_escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + 4);
    for c in text.chars() {
        if "\\^$.|?*+()[]{}".contains(c) {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ladder() -> Ladder {
        Ladder::new("orders", 3).unwrap()
    }

    fn matches(pattern: &str, name: &str) -> bool {
        // The patterns are anchored alternations of literal names: test them as such.
        let inner = pattern
            .strip_prefix('^')
            .and_then(|p| p.strip_suffix('$'))
            .unwrap();
        let inner = inner
            .strip_prefix('(')
            .and_then(|p| p.strip_suffix(')'))
            .unwrap_or(inner);
        !pattern.is_empty() && inner.split('|').any(|alt| alt.replace('\\', "") == name)
    }

    /// Every exchange a delay of the ladder enters at.
    fn writes_every_entry(write: &str) {
        for delay in 0..8 {
            let route = ladder().route(delay).unwrap();
            assert!(matches(write, &route.exchange), "{route}");
        }
    }

    #[test]
    fn the_publisher_writes_every_entry_exchange_and_nothing_else() {
        let access = Access::describe(&ladder(), None);
        let publisher = &access.permissions[0];
        assert_eq!(publisher.user, PUBLISHER_USER);
        assert_eq!(
            publisher.write,
            r"^(orders\.ladder\.02|orders\.ladder\.01|orders\.ladder\.00|orders\.due)$"
        );
        assert_eq!(publisher.configure, "");
        assert_eq!(publisher.read, "");
        writes_every_entry(&publisher.write);
        assert!(!matches(&publisher.write, "orders.parked"));
    }

    #[test]
    fn the_consumer_gets_what_it_redeclares_consumes_parks_to_and_requeues_into() {
        let access = Access::describe(&ladder(), None);
        let consumer = &access.permissions[1];
        let own = r"^(orders\.due|orders\.parked|orders\.catch-up)$";
        assert_eq!(consumer.user, CONSUMER_USER);
        assert_eq!(consumer.configure, own);
        assert_eq!(
            consumer.write,
            r"^(orders\.due|orders\.parked|orders\.catch-up|orders\.ladder\.02|orders\.ladder\.01|orders\.ladder\.00)$"
        );
        // The catch-up queue: consumed. Its exchange (the same name): the
        // due queue's dead-letter target, which its declare must write to.
        assert_eq!(consumer.read, own);
        writes_every_entry(&consumer.write);
        assert!(!matches(&consumer.read, "orders.ladder.00"));
        assert!(!matches(&consumer.configure, "orders.ladder.00"));
        assert_eq!(
            access.topic_permissions,
            [TopicPermission {
                user: CONSUMER_USER.to_owned(),
                exchange: "orders.due".to_owned(),
                write: r"^0\.0\.0$".to_owned(),
                read: "^#$".to_owned(),
            }]
        );
        assert_eq!(ladder().route(0).unwrap().routing_key, "0.0.0");
    }

    #[test]
    fn with_the_event_action_the_consumer_also_writes_the_event_exchange_only() {
        let plain = Access::describe(&ladder(), None);
        let access = Access::describe(&ladder(), Some("shop.events"));
        let consumer = &access.permissions[1];
        assert!(matches(&consumer.write, "shop.events"));
        assert!(!matches(&consumer.configure, "shop.events"));
        assert!(!matches(&consumer.read, "shop.events"));
        assert_eq!(access.permissions[0], plain.permissions[0], "publisher");
        assert_eq!(access.topic_permissions, plain.topic_permissions);
    }

    #[test]
    fn prefixes_are_matched_literally() {
        assert_eq!(
            exactly(&["a.b".into(), "a.b".into(), "c+d".into()]),
            r"^(a\.b|c\+d)$"
        );
        assert_eq!(exactly(&["x-y_z".into()]), "^x-y_z$");
    }
}
