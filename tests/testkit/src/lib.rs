//! The one test fixture of order-expiry, shared by `tests/integration`,
//! `tests/faults` and the benchmarks (`bench/`): dev-only, never published.
//!
//! - [`broker`]: [`broker_version`]: which RabbitMQ the tests talk to.
//! - [`services`]: where the test broker and database are (environment
//!   overrides such as `ORDER_EXPIRY_TEST_AMQP_PORT`), and small helpers.
//! - [`world`]: [`World`]: an isolated topology prefix and PostgreSQL schema,
//!   the topology declared, settings pointed at them, `serve` with its logs,
//!   cleanup; what fault tests look at in it (row locks, due messages left,
//!   queues) is in `inspect`.
//! - [`consumer`]: [`RunningConsumer`]: the real consumer in-process, observed.
//! - [`child`]: [`Launch`] / [`Child`]: our binaries as child processes.
//! - [`served`]: [`Served`]: `order-expiry serve` as a child, its HTTP endpoint.
//! - [`cluster`]: the local three-node cluster of `scripts/lib/cluster.sh`:
//!   its nodes (kill, pause, stop, start, leaders) and URLs.
//! - [`pg_pair`]: the PostgreSQL primary and standby of
//!   `scripts/lib/pg-pair.sh`: kill, stop, fence, promote, replication paused.
//! - [`procfs`]: memory and CPU of processes, from `/proc`.
//! - [`proxy`]: [`Proxy`]: a TCP proxy that can turn into a black hole.
//! - [`endpoint`]: [`Endpoint`]: a scripted local order service (the HTTP
//!   action's expire endpoint) and payment gateway (the check), recording
//!   every request.
//! - [`otlp`]: [`OtlpReceiver`]: an OTLP/HTTP receiver keeping every span it
//!   is sent, to assert on and to print as a tree.
//! - [`ledger`]: [`Ledger`] / [`Figures`]: what a scenario's order service
//!   placed, audited from the orders table against the invariants.
//! - [`steps`]: what tests repeat: orders placed ([`World::place`]), waited
//!   on until cancelled, `serve` ready, the parked queue read.
//! - [`subscriber`]: [`Subscriber`]: an event-driven order service for the
//!   event action, cancelling on `order.expired`.
//! - [`wait`]: [`eventually`], [`poll`]: poll a condition instead of sleeping.
//!
//! To run a test against another broker, build its world with
//! `World::builder().amqp_port(5673)`, or set `ORDER_EXPIRY_TEST_AMQP_PORT`
//! (and `ORDER_EXPIRY_TEST_RABBITMQ_NODE` for `rabbitmqctl`) for every test.

#![deny(unsafe_code)]
#![warn(missing_debug_implementations, unreachable_pub, missing_docs)]

pub mod broker;
pub mod child;
pub mod cluster;
pub mod consumer;
pub mod endpoint;
mod inspect;
pub mod ledger;
pub mod otlp;
pub mod pg_pair;
pub mod procfs;
pub mod proxy;
pub mod served;
pub mod services;
pub mod steps;
pub mod subscriber;
pub mod tls_front;
pub mod wait;
pub mod world;

pub use self::broker::{BrokerVersion, Imported, announced_version, broker_version};
pub use self::child::{Child, Launch, run_cli, settings_env, succeeded, try_run_cli};
pub use self::consumer::RunningConsumer;
pub use self::endpoint::{Endpoint, Expiry, Reply, Request, expire_order};
pub use self::inspect::RowLock;
pub use self::ledger::{Figures, Lateness, Ledger, Orders, Pace, Placed, order_service, settle};
pub use self::otlp::{ReceivedSpan, Receiver as OtlpReceiver};
pub use self::proxy::Proxy;
pub use self::served::{ReadyWatch, Served, http_get, metric_value, sum_metric};
pub use self::services::{
    MovableClock, amqp_port, amqp_url, amqp_url_on, at_ms, blue_amqp_port, connect_database,
    database, database_url, free_port, rabbitmqctl, skewed_clock, try_rabbitmqctl, vhost,
    with_search_path,
};
pub use self::steps::{
    HasOrderId, Parked, assert_late_within, assert_on_time, count, json, orders, schedule_all,
    schedule_bundled, table, wire_due,
};
pub use self::subscriber::{Received, Subscriber};
pub use self::tls_front::TlsFront;
pub use self::wait::{eventually, poll, try_poll};
pub use self::world::{OrderRow, TEST_LEVELS, World, WorldBuilder, remove_topology};

/// A message for `order_id` due at `due_at`; panics on an invalid id.
pub fn message(
    order_id: &str,
    due_at: chrono::DateTime<chrono::Utc>,
) -> order_expiry::publisher::ExpiryMessage {
    let order_id = order_expiry::OrderId::new(order_id).expect("a valid order id");
    order_expiry::publisher::ExpiryMessage::new(order_id, due_at)
}

/// The v2 body of a bundle of `messages`: each entry its v1 object without
/// `"v"`, as the publisher writes them.
pub fn bundle(messages: &[order_expiry::publisher::ExpiryMessage]) -> Vec<u8> {
    let orders: Vec<serde_json::Value> = messages
        .iter()
        .map(|m| {
            let mut entry: serde_json::Value =
                serde_json::from_slice(&m.encode()).expect("a v1 body is JSON");
            if let Some(fields) = entry.as_object_mut() {
                fields.remove("v");
            }
            entry
        })
        .collect();
    serde_json::json!({"v": 2, "orders": orders})
        .to_string()
        .into_bytes()
}

/// The order ids a due message carries: one for v1, each order of a v2
/// bundle; panics on a body that is neither.
pub fn order_ids(body: &[u8]) -> Vec<String> {
    let decoded =
        order_expiry::publisher::DueMessage::decode(body, None, 1 << 20).expect("a due message");
    decoded.messages().map(|m| m.order_id.to_string()).collect()
}

/// Of `times` (sorted here), the most within any one second.
pub fn busiest_second(times: &mut [chrono::DateTime<chrono::Utc>]) -> usize {
    times.sort();
    let mut most = 0;
    let mut start = 0;
    for end in 0..times.len() {
        while times[end] - times[start] >= chrono::TimeDelta::seconds(1) {
            start += 1;
        }
        most = most.max(end - start + 1);
    }
    most
}

/// The number right after the first `word` in `text` (a command's report),
/// an opening parenthesis skipped; panics when there is none.
pub fn number_after(text: &str, word: &str) -> f64 {
    let at = text
        .find(word)
        .unwrap_or_else(|| panic!("{word:?} in {text}"));
    text[at + word.len()..]
        .split_whitespace()
        .next()
        .and_then(|n| n.trim_start_matches('(').parse().ok())
        .unwrap_or_else(|| panic!("a number after {word:?} in {text}"))
}

/// The number right before the first `word` in `text`, an opening
/// parenthesis skipped; panics when there is none.
pub fn number_before(text: &str, word: &str) -> f64 {
    let at = text
        .find(word)
        .unwrap_or_else(|| panic!("{word:?} in {text}"));
    text[..at]
        .split_whitespace()
        .next_back()
        .and_then(|n| n.trim_start_matches('(').parse().ok())
        .unwrap_or_else(|| panic!("a number before {word:?} in {text}"))
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_busiest_second_counts_the_densest_window() {
        let at = |ms| chrono::DateTime::from_timestamp_millis(ms).expect("a time");
        let mut times = [at(2_500), at(0), at(900), at(1_000), at(300), at(3_600)];
        assert_eq!(super::busiest_second(&mut times), 3);
        assert_eq!(super::busiest_second(&mut []), 0);
    }
}
