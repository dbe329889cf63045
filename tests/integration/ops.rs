//! Operator commands as an operator runs them, against the real broker and
//! database: `status [--json]`, `parked list|replay|purge`.

use std::time::Duration;

use chrono::{TimeDelta, Utc};
use lapin::BasicProperties;
use order_expiry_testkit::World;
use serde_json::Value;

async fn status_json(env: &World, margin: &str) -> (Option<i32>, Value) {
    let out = env
        .cli(&["status", "--json", "--margin", margin], &[])
        .await;
    let stdout = String::from_utf8_lossy(&out.stdout);
    let json = serde_json::from_str(&stdout).unwrap_or_else(|e| {
        panic!(
            "status --json prints JSON ({e}): {stdout}\n{}",
            String::from_utf8_lossy(&out.stderr)
        )
    });
    (out.status.code(), json)
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
    let waiting: Vec<_> = (0..5)
        .map(|i| (format!("w-{i}"), now + TimeDelta::seconds(20 + i * 5)))
        .collect();
    let overdue: Vec<_> = (0..2)
        .map(|i| (format!("late-{i}"), now - TimeDelta::seconds(120 + i)))
        .collect();
    env.create_orders(&waiting).await;
    env.create_orders(&overdue).await;
    let scheduler = env.scheduler();
    for r in scheduler.schedule_many(waiting.iter().cloned()).await {
        r.expect("scheduled");
    }
    scheduler.close().await;
    let client = env.store.client().await.unwrap();
    client
        .execute(
            "INSERT INTO order_expiry_outbox (order_id, due_at, created_at) \
             VALUES ('o-1', now() + interval '1 hour', now() - interval '5 seconds')",
            &[],
        )
        .await
        .unwrap();

    // No consumer yet: unhealthy.
    let (code, s) = status_json(&env, "60s").await;
    assert_eq!(code, Some(2), "{s:#}");
    assert_eq!(s["v"], 1);
    assert_eq!(s["prefix"], env.settings.topology.prefix.as_str());
    assert_eq!(s["levels"].as_array().unwrap().len(), 6);
    assert_eq!(s["ladder_messages"], 5, "{s:#}");
    assert_eq!(s["due"]["consumers"], 0);
    assert_eq!(s["due"]["ready"], 0);
    assert!(s["due"]["unacked"].is_null(), "not visible over AMQP");
    assert_eq!(s["parked"]["messages"], 0);
    assert_eq!(s["outbox"]["pending"], 1);
    assert!(
        s["outbox"]["oldest_age_ms"].as_i64().unwrap() >= 5_000,
        "{s:#}"
    );
    assert_eq!(s["orders"]["overdue_unpaid"], 2);
    assert_eq!(s["orders"]["beyond_margin"], 2);
    assert!(s["orders"]["most_overdue_ms"].as_i64().unwrap() >= 121_000);
    // Orders, not messages: the 5 waiting, all due within the minute.
    let upcoming = &s["orders"]["upcoming"];
    assert_eq!(upcoming["next_minute"], 5, "{s:#}");
    assert_eq!(upcoming["next_day"], 5, "{s:#}");
    assert_eq!(upcoming["all"], 5, "{s:#}");
    assert_eq!(s["orders_per_message_max"], 100);
    let problems = s["problems"].to_string();
    assert!(problems.contains("no consumer"), "{problems}");
    assert!(problems.contains("2 unpaid orders"), "{problems}");
    assert_eq!(s["healthy"], false);

    // A consumer, and a malformed message it parks.
    let mut consumer = env.start_consumer();
    let props = BasicProperties::default().with_content_type("application/json".into());
    env.publish_due(b"{\"v\": 1}", props).await;
    consumer.next_n(1, Duration::from_secs(20)).await;
    tokio::time::sleep(Duration::from_millis(1100)).await;

    // Overdue by 2 minutes is within a 10-minute margin: healthy.
    let (code, s) = status_json(&env, "10m").await;
    assert_eq!(code, Some(0), "{s:#}");
    assert_eq!(s["due"]["consumers"], 1);
    assert_eq!(s["parked"]["messages"], 1);
    assert!(
        s["parked"]["oldest_age_ms"].as_i64().unwrap() >= 1_000,
        "{s:#}"
    );
    assert_eq!(s["orders"]["overdue_unpaid"], 2);
    assert_eq!(s["orders"]["beyond_margin"], 0);
    assert_eq!(s["healthy"], true);
    // Looking at the parked head returned it: it is still there.
    assert_depth(&env, &env.ladder().parked_queue(), 1).await;

    // The text form says the same.
    let out = env.cli(&["status", "--margin", "60s"], &[]).await;
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(2), "{text}");
    assert!(
        text.contains("6 levels, 5 messages waiting, up to 100 orders each"),
        "{text}"
    );
    assert!(
        text.contains("5 unpaid due ahead: 5 within a minute"),
        "{text}"
    );
    assert!(text.contains("1 consumers"), "{text}");
    assert!(text.contains("1 messages, oldest parked"), "{text}");
    assert!(text.contains("1 rows pending"), "{text}");
    assert!(
        text.contains("2 unpaid past their deadline, 2 of them more than 1m"),
        "{text}"
    );
    assert!(text.contains("health   UNHEALTHY"), "{text}");

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
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(!stderr.contains("secret"), "{stderr}");
    assert!(out.stdout.is_empty());
    env.cleanup().await;
}

/// Publishes `body` to the parked exchange with the headers the consumer
/// writes when it parks a message that came out of the ladder (`x-death`
/// included), and waits for the confirm.
async fn park(env: &World, body: &[u8], reason: &str) {
    use lapin::options::{BasicPublishOptions, ConfirmSelectOptions};
    use lapin::types::{AMQPValue, FieldArray, FieldTable};
    let channel = env.open_channel().await;
    channel
        .confirm_select(ConfirmSelectOptions::default())
        .await
        .unwrap();
    let text = |s: &str| AMQPValue::LongString(s.into());
    let mut death = FieldTable::default();
    death.insert("queue".into(), text(&env.ladder().level_name(0)));
    death.insert("reason".into(), text("expired"));
    death.insert("count".into(), AMQPValue::LongLongInt(1));
    let mut headers = FieldTable::default();
    headers.insert(
        "x-death".into(),
        AMQPValue::FieldArray(FieldArray::from(vec![AMQPValue::FieldTable(death)])),
    );
    headers.insert("x-first-death-reason".into(), text("expired"));
    headers.insert("x-parked-reason".into(), text(reason));
    headers.insert(
        "x-parked-at".into(),
        text(&(Utc::now() - TimeDelta::minutes(3)).to_rfc3339()),
    );
    headers.insert("x-original-routing-key".into(), text("0.0.0.0.0.1"));
    let properties = BasicProperties::default()
        .with_content_type("application/json".into())
        .with_delivery_mode(2)
        .with_headers(headers);
    let confirm = channel
        .basic_publish(
            env.ladder().parked_exchange().as_str().into(),
            "".into(),
            BasicPublishOptions::default(),
            body,
            properties,
        )
        .await
        .unwrap()
        .await
        .unwrap();
    assert_eq!(confirm, lapin::Confirmation::Ack(None));
    let _ = channel.close(200, "parked".into()).await;
}

/// Waits up to 10 s for `queue` to hold `n` ready messages: a quorum queue
/// counts the messages a closed channel returned a moment later.
async fn assert_depth(env: &World, queue: &str, n: u32) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let depth = env.depth(queue).await;
        if depth == n {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{queue} holds {depth}, not {n}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Three parked messages: one overdue order, one due in 10 s, one malformed.
/// 10 s: the tests list and replay before the future one is due, which took
/// over 4 s in a parallel run on a loaded 2-core machine (RabbitMQ 4.3.6).
async fn three_parked(env: &World) -> (String, String) {
    let now = Utc::now();
    let past = testkit_message("p-past", now - TimeDelta::seconds(60));
    let future_due = now + TimeDelta::seconds(10);
    let future = testkit_message("p-future", future_due);
    env.create_orders(&[
        ("p-past".into(), now - TimeDelta::seconds(60)),
        ("p-future".into(), future_due),
    ])
    .await;
    park(env, &past, "SQLSTATE 23514: check constraint").await;
    park(
        env,
        &future,
        "payment check still pending after the last step",
    )
    .await;
    park(
        env,
        b"{\"v\": 1, \"due_at\": 5}",
        "missing field \"order_id\"",
    )
    .await;
    (
        String::from_utf8(past).unwrap(),
        String::from_utf8(future).unwrap(),
    )
}

fn testkit_message(id: &str, due_at: chrono::DateTime<Utc>) -> Vec<u8> {
    order_expiry_testkit::message(id, due_at).encode()
}

/// `list` shows each message and leaves it parked; `replay --order-id` and
/// `--reason` move only what they select, without the `x-death` and parking
/// headers; an overdue one goes straight to the due queue.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn parked_list_and_selective_replay_strip_the_dead_letter_headers() {
    let env = World::new().await;
    let (past_body, _) = three_parked(&env).await;
    let parked_queue = env.ladder().parked_queue();

    let listed = env.cli_ok(&["parked", "list"]).await;
    assert!(listed.starts_with("3 parked messages\n"), "{listed}");
    assert!(
        listed.contains("order p-past  reason: SQLSTATE 23514"),
        "{listed}"
    );
    assert!(
        listed.contains("order p-future  reason: payment check"),
        "{listed}"
    );
    assert!(
        listed.contains("order -  reason: missing field"),
        "{listed}"
    );
    assert!(listed.contains("body: {\\\"v\\\": 1"), "{listed}");
    assert_depth(&env, &parked_queue, 3).await;

    let out = env
        .cli_ok(&["parked", "replay", "--order-id", "p-past"])
        .await;
    assert!(
        out.starts_with("replayed 1: 1 to the due exchange"),
        "{out}"
    );
    assert!(out.contains("2 not selected"), "{out}");
    let due = env
        .get(&env.ladder().due_queue())
        .await
        .expect("replayed to due");
    assert_eq!(String::from_utf8_lossy(&due.delivery.data), past_body);
    let headers = due
        .delivery
        .properties
        .headers()
        .clone()
        .unwrap_or_default();
    let names: Vec<String> = headers.inner().keys().map(|k| k.to_string()).collect();
    // (x-delivery-count, if any, is the due queue's own.)
    let stale = [
        "x-death",
        "x-first-death",
        "x-last-death",
        "x-parked",
        "x-original",
    ];
    assert!(
        names
            .iter()
            .all(|n| !stale.iter().any(|s| n.starts_with(s))),
        "no x-death or parking headers: {names:?}"
    );

    let replay = ["parked", "replay", "--reason", "still pending"];
    let out = env.cli_ok(&replay).await;
    assert!(
        out.contains("0 to the due exchange (due time passed), 1 through the ladder"),
        "{out}"
    );
    assert_depth(&env, &parked_queue, 1).await;
    let ladder_total: u32 = {
        let mut n = 0;
        for level in 0..env.ladder().levels() {
            n += env.depth(&env.ladder().level_name(level)).await;
        }
        n
    };
    assert_eq!(ladder_total, 1, "p-future waits in the ladder");
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
    for id in ["p-past", "p-future"] {
        let (status, deadline, cancelled_at) = env.order(id).await;
        assert_eq!(status, "cancelled", "{id}");
        assert!(cancelled_at.unwrap() >= deadline, "{id} not early");
    }
    for _ in 0..2 {
        let out = env.cli_ok(&["parked", "replay", "--all"]).await;
        assert!(out.starts_with("replayed 0:"), "{out}");
        assert!(out.contains("1 still malformed"), "{out}");
    }
    consumer.expect_quiet(Duration::from_secs(1)).await;
    let parked_queue = env.ladder().parked_queue();
    assert_depth(&env, &parked_queue, 1).await;
    let listed = env.cli_ok(&["parked", "list"]).await;
    assert!(
        listed.contains("reason: missing field \"order_id\""),
        "{listed}"
    );
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
    assert!(
        stderr.contains("purge deletes 3 parked messages for good; add --yes"),
        "{stderr}"
    );
    assert_depth(&env, &parked_queue, 3).await;
    let out = env.cli_ok(&["parked", "purge", "--yes"]).await;
    assert_eq!(out.trim(), "purged 3 parked messages");
    assert_depth(&env, &parked_queue, 0).await;
    env.cleanup().await;
}
