//! What RabbitMQ 3.10 and 4.3 do differently (or the same) to the ladder's
//! queues and messages, outside redelivery (`redelivery.rs`). `scripts/test`
//! runs this file on both (it passes on 4.0.5 by hand); each test reads the version the broker announces
//! (`broker_version`) and asserts that version's own behaviour, or the same
//! on both where it says so.

use std::time::Duration;

use lapin::BasicProperties;
use lapin::types::{AMQPValue, FieldArray, FieldTable};
use order_expiry_testkit::{World, broker_version, rabbitmqctl, table, vhost};
use serde_json::Value;

/// A message that enters the ladder carrying a stale `x-death` (one that
/// says it already expired from the level it is about to be dead-lettered
/// into), beside one without: 3.10's cycle detection drops the stale one when
/// level 1 dead-letters it into level 0 (the hazard of celery#9867); 4.3
/// (and 4.0, by hand) ignores the client's `x-death`, delivers both and
/// writes the same, fresh history into each. order-expiry itself never sends one: `parked replay`
/// strips the dead-letter headers (`ops.rs`,
/// `parked_list_and_selective_replay_strip_the_dead_letter_headers`), so a
/// replayed order is delivered on both.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_x_death_is_a_cycle_on_3_10_and_replaced_on_4_x() {
    let env = World::new().await;
    let version = broker_version().await;
    let ladder = env.ladder();
    let route = ladder.route(3).unwrap();
    let text = |s: &str| AMQPValue::LongString(s.into());
    let death = table([
        ("queue", text(&ladder.level_name(0))),
        ("reason", text("expired")),
        ("count", AMQPValue::LongLongInt(1)),
        ("exchange", text(&ladder.level_name(0))),
    ]);
    let history = FieldArray::from(vec![AMQPValue::FieldTable(death)]);
    let stale = table([("x-death", AMQPValue::FieldArray(history))]);
    for (body, headers) in [("stale", stale), ("clean", FieldTable::default())] {
        let properties = BasicProperties::default()
            .with_delivery_mode(2)
            .with_headers(headers);
        let (exchange, key) = (&route.exchange, &route.routing_key);
        env.publish_to(exchange, key, body.as_bytes(), properties)
            .await;
    }

    // Both wait 3 s; the stale one gets 3 s more to show up on a busy machine.
    let mut arrived = Vec::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(12);
    let mut clean_at = None;
    while tokio::time::Instant::now() < deadline && arrived.len() < 2 {
        if let Some(got) = env.get(&ladder.due_queue()).await {
            let body = String::from_utf8_lossy(&got.delivery.data).into_owned();
            if body == "clean" {
                clean_at = Some(tokio::time::Instant::now());
            }
            arrived.push((body, deaths(&got.delivery.properties)));
        }
        if clean_at.is_some_and(|at| at.elapsed() > Duration::from_secs(3)) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let levels = vec![(ladder.level_name(0), 1), (ladder.level_name(1), 1)];
    let clean = arrived.iter().find(|(body, _)| body == "clean");
    assert_eq!(
        clean.map(|(_, d)| d.clone()),
        Some(levels.clone()),
        "RabbitMQ {version}: the clean message is due with one expiry per level: {arrived:?}"
    );
    let stale = arrived.iter().find(|(body, _)| body == "stale");
    if version.at_least(4, 0) {
        assert_eq!(
            stale.map(|(_, d)| d.clone()),
            Some(levels),
            "RabbitMQ {version}: delivered, its x-death replaced: {arrived:?}"
        );
    } else {
        assert!(
            stale.is_none(),
            "RabbitMQ {version}: dropped as a dead-letter cycle: {arrived:?}"
        );
    }
    env.cleanup().await;
}

/// `(queue, count)` of each `x-death` entry, sorted by queue.
fn deaths(properties: &BasicProperties) -> Vec<(String, i64)> {
    let headers = properties.headers().clone().unwrap_or_default();
    let Some(AMQPValue::FieldArray(entries)) = headers.inner().get("x-death") else {
        return Vec::new();
    };
    let mut deaths: Vec<(String, i64)> = entries
        .as_slice()
        .iter()
        .map(|entry| {
            let AMQPValue::FieldTable(entry) = entry else {
                panic!("x-death entry: {entry:?}");
            };
            let queue = match entry.inner().get("queue") {
                Some(AMQPValue::LongString(q)) => q.to_string(),
                other => panic!("x-death queue: {other:?}"),
            };
            let count = match entry.inner().get("count") {
                Some(AMQPValue::LongLongInt(n)) => *n,
                Some(AMQPValue::LongInt(n)) => i64::from(*n),
                other => panic!("x-death count: {other:?}"),
            };
            (queue, count)
        })
        .collect();
    deaths.sort();
    deaths
}

/// The same on 3.10 and 4.3: every quorum queue `topology apply` declares
/// keeps `x-queue-leader-locator: balanced` and the group size 3 it was
/// declared with, and on one node each has one member, its leader there. A
/// re-declare with another locator is refused with the very words
/// `topology apply` looks for to keep such a queue and say so
/// (`failover.rs`, `apply_keeps_a_queue_declared_without_placement_and_says_so`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_leader_locator_is_kept_and_a_changed_one_refused_on_both() {
    let env = World::new().await;
    let version = broker_version().await;
    let prefix = format!("{}.", env.ladder().prefix());
    let node = rabbitmqctl(&["-q", "eval", "node()."]).trim().to_owned();
    let vhost = vhost();
    let list = format!("-q list_queues -p {vhost} name arguments leader members --formatter json");
    let listed = rabbitmqctl(&list.split(' ').collect::<Vec<_>>());
    let listed: Value = serde_json::from_str(&listed).unwrap();
    let ours: Vec<&Value> = listed
        .as_array()
        .unwrap()
        .iter()
        .filter(|q| q["name"].as_str().unwrap().starts_with(&prefix))
        .collect();
    // The levels; due, parked and catch-up.
    assert_eq!(
        ours.len(),
        usize::from(env.ladder().levels()) + 3,
        "{ours:?}"
    );
    for queue in &ours {
        // rabbitmqctl lists arguments as [name, type, value] triples.
        let argument = |name: &str| {
            queue["arguments"]
                .as_array()
                .unwrap()
                .iter()
                .find(|a| a[0] == name)
                .map(|a| a[2].clone())
        };
        assert_eq!(
            argument("x-queue-leader-locator"),
            Some("balanced".into()),
            "{version}: {queue}"
        );
        assert_eq!(
            argument("x-quorum-initial-group-size"),
            Some(3.into()),
            "{version}: {queue}"
        );
        assert_eq!(queue["leader"], node.as_str(), "{version}: {queue}");
        assert_eq!(
            queue["members"],
            serde_json::json!([node]),
            "{version}: {queue}"
        );
    }

    // As declared (4.3 compares `x-consumer-disconnected-timeout` too, and
    // may report it first), so that the leader locator is the one difference.
    let (text, number) = (
        |s: &str| AMQPValue::LongString(s.into()),
        AMQPValue::LongLongInt,
    );
    let arguments = table([
        ("x-queue-type", text("quorum")),
        ("x-quorum-initial-group-size", number(3)),
        ("x-consumer-disconnected-timeout", number(1000)),
        ("x-queue-leader-locator", text("client-local")),
    ]);
    // The parked queue: the due queue carries the catch-up arguments too.
    let parked = env.ladder().parked_queue();
    let refused = env
        .declare_queue(&parked, arguments)
        .await
        .expect_err("another leader locator is refused");
    assert!(
        refused
            .to_string()
            .contains("inequivalent arg 'x-queue-leader-locator'"),
        "RabbitMQ {version}: {refused}"
    );
    env.cleanup().await;
}
