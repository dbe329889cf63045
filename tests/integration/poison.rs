//! Messages that can never be processed end in the parked queue with a reason;
//! good messages around them are handled as usual.

use std::time::Duration;

use lapin::BasicProperties;
use lapin::types::AMQPValue;
use order_expiry::service::Outcome;
use order_expiry_testkit::{World, at_ms, message};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_messages_are_parked_with_a_reason_and_good_ones_still_handled() {
    let env = World::new().await;
    env.create_orders(&[("good-1".into(), at_ms(-10))]).await;
    let due = env.order("good-1").await.1;
    let good = message("good-1", due).encode();
    let long_id = format!(
        r#"{{"v":1,"order_id":"{}","due_at":"2026-01-01T00:00:00Z"}}"#,
        "x".repeat(129)
    );
    let cases: Vec<(Vec<u8>, &str)> = vec![
        (b"{this is not json".to_vec(), "not valid JSON"),
        (
            br#"{"v":1,"due_at":"2026-01-01T00:00:00Z"}"#.to_vec(),
            "missing field \"order_id\"",
        ),
        (
            br#"{"v":9,"order_id":"a","due_at":"2026-01-01T00:00:00Z"}"#.to_vec(),
            "unknown version 9",
        ),
        (long_id.into_bytes(), "129 characters is more than 128"),
        (b"\xc3\x28\xa0\xa1".to_vec(), "not valid UTF-8"),
    ];
    let mut consumer = env.start_consumer();
    for (body, _) in &cases {
        env.publish_due(
            body,
            BasicProperties::default().with_content_type("application/json".into()),
        )
        .await;
    }
    env.publish_due(&good, BasicProperties::default()).await;

    let handled = consumer
        .next_n(cases.len() + 1, Duration::from_secs(10))
        .await;
    let parked = handled
        .iter()
        .filter(|h| h.outcome == Outcome::Parked)
        .count();
    assert_eq!(parked, cases.len());
    assert!(
        handled
            .iter()
            .any(|h| h.outcome == Outcome::Cancelled && h.order_id.as_deref() == Some("good-1"))
    );
    assert_eq!(env.order("good-1").await.0, "cancelled");

    // Every bad body is in the parked queue, intact, with its reason.
    let parked_queue = env.ladder().parked_queue();
    let mut found = Vec::new();
    while let Some(message) = env.get(&parked_queue).await {
        let headers = message
            .delivery
            .properties
            .headers()
            .clone()
            .unwrap_or_default();
        let reason = match headers.inner().get("x-parked-reason") {
            Some(AMQPValue::LongString(s)) => s.to_string(),
            other => panic!("no x-parked-reason: {other:?}"),
        };
        found.push((message.delivery.data.clone(), reason));
    }
    assert_eq!(found.len(), cases.len());
    for (body, expected) in &cases {
        let (_, reason) = found
            .iter()
            .find(|(b, _)| b == body)
            .unwrap_or_else(|| panic!("body for {expected:?} not parked intact"));
        assert!(
            reason.contains(expected),
            "{reason:?} should say {expected:?}"
        );
    }
    consumer.expect_quiet(Duration::from_millis(500)).await;
    consumer.stop().await;
    assert_eq!(env.depth(&env.ladder().due_queue()).await, 0);
    env.cleanup().await;
}
