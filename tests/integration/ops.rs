//! Operator commands as an operator runs them, against the real broker and
//! database: `status [--json]`, `parked list|replay|purge`.

use std::collections::HashSet;
use std::time::Duration;

use chrono::{TimeDelta, Utc};
use lapin::types::{AMQPValue, FieldArray};
use order_expiry_testkit::{World, eventually, json as json_properties, message, table};
use serde_json::{Value, json};

async fn status_json(env: &World, margin: &str) -> (Option<i32>, Value) {
    let out = env
        .cli(&["status", "--json", "--margin", margin], &[])
        .await;
    let [stdout, stderr] = [&out.stdout, &out.stderr].map(|o| String::from_utf8_lossy(o));
    let json = serde_json::from_str(&stdout)
        .unwrap_or_else(|e| panic!("status --json prints JSON ({e}): {stdout}\n{stderr}"));
    (out.status.code(), json)
}

/// Asserts every field of `expected` (recursively) has its value in `actual`.
fn assert_fields(actual: &Value, expected: &Value, path: &str) {
    match expected {
        Value::Object(fields) => {
            for (key, value) in fields {
                assert_fields(&actual[key], value, &format!("{path}/{key}"));
            }
        }
        _ => assert_eq!(actual, expected, "{path}"),
    }
}

/// Asserts `text` contains each of `parts`.
fn assert_contains(text: &str, parts: &[&str]) {
    for part in parts {
        assert!(text.contains(part), "no {part:?} in:\n{text}");
    }
}

/// Waits up to 10 s for `queue` to hold `n` ready messages: a quorum queue
/// counts the messages a closed channel returned a moment later.
async fn assert_depth(env: &World, queue: &str, n: u32) {
    let what = format!("{queue} holding {n}");
    eventually(Duration::from_secs(10), &what, async || {
        env.depth(queue).await == n
    })
    .await;
}

/// Orders in the ladder, a parked message, an outbox row and overdue orders
/// all show; no consumer on the due queue, or an order overdue beyond the
/// margin, makes the exit code 2; with a consumer and a wide margin it is 0.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_shows_every_part_and_exits_non_zero_when_unhealthy() {
    let env = World::new().await;
    let now = Utc::now();
    // 5 orders waiting in the ladder (20-40 s), 2 unpaid orders overdue by
    // 2 minutes whose messages never came (the sweeper's kind of order).
    let at = |id: String, s| (id, now + TimeDelta::seconds(s));
    let waiting: Vec<_> = (0..5).map(|i| at(format!("w-{i}"), 20 + i * 5)).collect();
    let overdue: Vec<_> = (0..2).map(|i| at(format!("late-{i}"), -120 - i)).collect();
    env.place(&waiting).await;
    env.create_orders(&overdue).await;
    env.execute(
        "INSERT INTO order_expiry_outbox (order_id, due_at, created_at) \
         VALUES ('o-1', now() + interval '1 hour', now() - interval '5 seconds')",
    )
    .await;

    // No consumer yet: unhealthy. Orders, not messages: the 5 waiting, all due
    // within the minute.
    let (code, s) = status_json(&env, "60s").await;
    assert_eq!(code, Some(2), "{s:#}");
    let prefix = env.settings.topology.prefix.as_str();
    #[rustfmt::skip]
    let expected = json!({
        "v": 1, "prefix": prefix, "ladder_messages": 5, "orders_per_message_max": 100,
        "due": {"consumers": 0, "ready": 0, "unacked": null}, // not visible over AMQP
        "parked": {"messages": 0}, "outbox": {"pending": 1}, "healthy": false,
        "orders": {"overdue_unpaid": 2, "beyond_margin": 2,
                   "upcoming": {"next_minute": 5, "next_day": 5, "all": 5}},
    });
    assert_fields(&s, &expected, &format!("{s:#}\n"));
    assert_eq!(s["levels"].as_array().unwrap().len(), 6);
    let oldest = s["outbox"]["oldest_age_ms"].as_i64().unwrap();
    assert!(oldest >= 5_000, "{s:#}");
    assert!(s["orders"]["most_overdue_ms"].as_i64().unwrap() >= 121_000);
    let problems = s["problems"].to_string();
    assert_contains(&problems, &["no consumer", "2 unpaid orders"]);

    // A consumer, and a malformed message it parks.
    let mut consumer = env.start_consumer();
    env.publish_due(b"{\"v\": 1}", json_properties()).await;
    consumer.next_n(1, Duration::from_secs(20)).await;
    tokio::time::sleep(Duration::from_millis(1100)).await;

    // Overdue by 2 minutes is within a 10-minute margin: healthy.
    let (code, s) = status_json(&env, "10m").await;
    assert_eq!(code, Some(0), "{s:#}");
    #[rustfmt::skip]
    let expected = json!({
        "due": {"consumers": 1}, "parked": {"messages": 1}, "healthy": true,
        "orders": {"overdue_unpaid": 2, "beyond_margin": 0},
    });
    assert_fields(&s, &expected, &format!("{s:#}\n"));
    let oldest = s["parked"]["oldest_age_ms"].as_i64().unwrap();
    assert!(oldest >= 1_000, "{s:#}");
    // Looking at the parked head returned it: it is still there.
    assert_depth(&env, &env.ladder().parked_queue(), 1).await;

    // The text form says the same.
    let out = env.cli(&["status", "--margin", "60s"], &[]).await;
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(2), "{text}");
    assert_contains(
        &text,
        &[
            "6 levels, 5 messages waiting, up to 100 orders each",
            "5 unpaid due ahead: 5 within a minute",
            "1 consumers",
            "1 messages, oldest parked",
            "1 rows pending",
            "2 unpaid past their deadline, 2 of them more than 1m",
            "health   UNHEALTHY",
        ],
    );
    consumer.stop().await;
    env.cleanup().await;
}

/// A broker that cannot be reached: exit 1 and one line, not a status.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_without_a_broker_says_so_on_one_line() {
    let env = World::new().await;
    let port = order_expiry_testkit::free_port();
    let url = format!("amqp://guest:secret@127.0.0.1:{port}/%2f");
    let out = env
        .cli(&["status"], &[("ORDER_EXPIRY__AMQP__URL", &url)])
        .await;
    let stderr = crate::cli::refused(&out);
    assert!(!stderr.contains("secret"), "{stderr}");
    assert!(out.stdout.is_empty());
    env.cleanup().await;
}

/// Publishes `body` to the parked exchange with the headers the consumer
/// writes when it parks a message that came out of the ladder (`x-death`
/// included).
async fn park(env: &World, body: &[u8], reason: &str) {
    let text = |s: &str| AMQPValue::LongString(s.into());
    let death = table([
        ("queue", text(&env.ladder().level_name(0))),
        ("reason", text("expired")),
        ("count", AMQPValue::LongLongInt(1)),
    ]);
    let deaths = FieldArray::from(vec![AMQPValue::FieldTable(death)]);
    let parked_at = (Utc::now() - TimeDelta::minutes(3)).to_rfc3339();
    let properties = json_properties().with_headers(table([
        ("x-death", AMQPValue::FieldArray(deaths)),
        ("x-first-death-reason", text("expired")),
        ("x-parked-reason", text(reason)),
        ("x-parked-at", text(&parked_at)),
        ("x-original-routing-key", text("0.0.0.0.0.1")),
    ]));
    let exchange = env.ladder().parked_exchange();
    env.publish_to(&exchange, "", body, properties).await;
}

/// Three parked messages: one overdue order, one due in 10 s (listed and
/// replayed before it is due, also on a loaded machine), one malformed. The
/// overdue one's body.
async fn three_parked(env: &World) -> String {
    let now = Utc::now();
    let (past, future) = (now - TimeDelta::seconds(60), now + TimeDelta::seconds(10));
    env.create_orders(&[("p-past".into(), past), ("p-future".into(), future)])
        .await;
    let past_body = message("p-past", past).encode();
    for (body, reason) in [
        (past_body.clone(), "SQLSTATE 23514: check constraint"),
        (
            message("p-future", future).encode(),
            "payment check still pending after the last step",
        ),
        (
            b"{\"v\": 1, \"due_at\": 5}".to_vec(),
            "missing field \"order_id\"",
        ),
    ] {
        park(env, &body, reason).await;
    }
    String::from_utf8(past_body).unwrap()
}

/// `list` shows each message and leaves it parked; `replay --order-id` and
/// `--reason` move only what they select, without the `x-death` and parking
/// headers; an overdue one goes straight to the due queue.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn parked_list_and_selective_replay_strip_the_dead_letter_headers() {
    let env = World::new().await;
    let past_body = three_parked(&env).await;
    let (parked_queue, due_queue) = (env.ladder().parked_queue(), env.ladder().due_queue());

    let listed = env.cli_ok(&["parked", "list"]).await;
    assert!(listed.starts_with("3 parked messages\n"), "{listed}");
    assert_contains(
        &listed,
        &[
            "order p-past  reason: SQLSTATE 23514",
            "order p-future  reason: payment check",
            "order -  reason: missing field",
            "body: {\\\"v\\\": 1",
        ],
    );
    assert_depth(&env, &parked_queue, 3).await;

    let out = env
        .cli_ok(&["parked", "replay", "--order-id", "p-past"])
        .await;
    assert!(
        out.starts_with("replayed 1: 1 to the due exchange"),
        "{out}"
    );
    assert!(out.contains("2 not selected"), "{out}");
    let due = env.get(&due_queue).await.expect("replayed to due");
    assert_eq!(String::from_utf8_lossy(&due.delivery.data), past_body);
    let properties = &due.delivery.properties;
    let headers = properties.headers().clone().unwrap_or_default();
    let names: Vec<String> = headers.inner().keys().map(|k| k.to_string()).collect();
    // (x-delivery-count, if any, is the due queue's own.)
    let stale = [
        "x-death",
        "x-first-death",
        "x-last-death",
        "x-parked",
        "x-original",
    ];
    let is_stale = |n: &String| stale.iter().any(|s| n.starts_with(s));
    assert!(
        !names.iter().any(is_stale),
        "no x-death or parking headers: {names:?}"
    );

    let out = env
        .cli_ok(&["parked", "replay", "--reason", "still pending"])
        .await;
    let routes = "0 to the due exchange (due time passed), 1 through the ladder";
    assert!(out.contains(routes), "{out}");
    assert_depth(&env, &parked_queue, 1).await;
    let in_levels = env.ladder_depth(None).await - env.depth(&due_queue).await;
    assert_eq!(in_levels, 1, "p-future waits in the ladder");
    env.cleanup().await;
}

/// More parked messages than one consumer of the sweep may hold (its window,
/// 256): `replay --order-id` finds the one it selects behind 600 it leaves
/// parked, and `list` shows them all, each once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn parked_replay_and_list_reach_past_a_window_of_held_messages() {
    let env = World::new().await;
    let due = Utc::now() + TimeDelta::seconds(50);
    let parked_queue = env.ladder().parked_queue();
    for i in 0..600 {
        let body = message(&format!("p-{i}"), due).encode();
        park(&env, &body, "still pending").await;
    }
    park(&env, &message("p-last", due).encode(), "still pending").await;
    let out = env
        .cli_ok(&["parked", "replay", "--order-id", "p-last"])
        .await;
    let moved = "replayed 1: 0 to the due exchange (due time passed), 1 through the ladder";
    assert!(out.starts_with(moved), "{out}");
    assert!(out.contains("600 not selected"), "{out}");
    assert_depth(&env, &parked_queue, 600).await;
    let listed = env.cli_ok(&["parked", "list", "--limit", "1000"]).await;
    assert!(listed.starts_with("600 parked messages\n"), "{listed}");
    let shown: HashSet<&str> = listed
        .lines()
        .filter_map(|line| line.split("order ").nth(1)?.split_whitespace().next())
        .collect();
    assert_eq!(shown.len(), 600, "each parked order once: {listed}");
    assert!(!shown.contains("p-last"), "{listed}");
    env.cleanup().await;
}

/// `replay --all` with the consumer running: the overdue order is cancelled at
/// once, the other not before its deadline, and the malformed message stays
/// parked with its reason however often it is replayed (no loop).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn parked_replay_all_cancels_on_time_and_leaves_the_malformed_parked() {
    let env = World::new().await;
    three_parked(&env).await;
    let mut consumer = env.start_consumer();
    let out = env.cli_ok(&["parked", "replay", "--all"]).await;
    assert!(out.starts_with("replayed 2: 1 to the due exchange (due time passed), 1 through the ladder; 1 still malformed"), "{out}");
    assert!(out.contains("left parked: {\\\"v\\\": 1"), "{out}");
    consumer.next_n(2, Duration::from_secs(30)).await;
    env.assert_cancelled_in_time("p-past").await;
    env.assert_cancelled_in_time("p-future").await;
    for _ in 0..2 {
        let out = env.cli_ok(&["parked", "replay", "--all"]).await;
        assert!(out.starts_with("replayed 0:"), "{out}");
        assert!(out.contains("1 still malformed"), "{out}");
    }
    consumer.expect_quiet(Duration::from_secs(1)).await;
    assert_depth(&env, &env.ladder().parked_queue(), 1).await;
    let listed = env.cli_ok(&["parked", "list"]).await;
    assert_contains(&listed, &["reason: missing field \"order_id\""]);
    consumer.stop().await;
    env.cleanup().await;
}

/// `purge` deletes nothing without `--yes`, everything with it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn parked_purge_needs_yes() {
    let env = World::new().await;
    three_parked(&env).await;
    let parked_queue = env.ladder().parked_queue();
    let out = env.cli(&["parked", "purge"], &[]).await;
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    let refusal = "purge deletes 3 parked messages for good; add --yes";
    assert!(stderr.contains(refusal), "{stderr}");
    assert_depth(&env, &parked_queue, 3).await;
    let out = env.cli_ok(&["parked", "purge", "--yes"]).await;
    assert_eq!(out.trim(), "purged 3 parked messages");
    assert_depth(&env, &parked_queue, 0).await;
    env.cleanup().await;
}
