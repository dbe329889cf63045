//! Operator commands as an operator runs them, against the real broker and
//! database: `status [--json]`.

use std::process::Output;
use std::time::Duration;

use chrono::{TimeDelta, Utc};
use lapin::BasicProperties;
use order_expiry_testkit::{World, settings_env};
use serde_json::Value;
use tokio::process::Command;

/// Runs `order-expiry ARGS` with the world's settings (`extra` added).
pub(crate) async fn cli(env: &World, args: &[&str], extra: &[(&str, &str)]) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_order-expiry"));
    cmd.args(args).envs(settings_env(&env.settings));
    for (k, v) in extra {
        cmd.env(k, v);
    }
    tokio::time::timeout(Duration::from_secs(120), cmd.output())
        .await
        .expect("the command ends")
        .expect("the binary runs")
}

async fn status_json(env: &World, margin: &str) -> (Option<i32>, Value) {
    let out = cli(env, &["status", "--json", "--margin", margin], &[]).await;
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
    assert_eq!(env.depth(&env.ladder().parked_queue()).await, 1);

    // The text form says the same.
    let out = cli(&env, &["status", "--margin", "60s"], &[]).await;
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(2), "{text}");
    assert!(text.contains("6 levels, 5 messages waiting"), "{text}");
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
    let out = cli(&env, &["status"], &[("ORDER_EXPIRY__AMQP__URL", &url)]).await;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(!stderr.contains("secret"), "{stderr}");
    assert!(out.stdout.is_empty());
    env.cleanup().await;
}
