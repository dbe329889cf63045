//! Messages that can never be processed end in the parked queue with a reason;
//! good messages around them are handled as usual.

use std::time::Duration;

use lapin::BasicProperties;
use order_expiry::service::Outcome;
use order_expiry_testkit::{World, at_ms, count, json, message};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_messages_are_parked_with_a_reason_and_good_ones_still_handled() {
    let env = World::new().await;
    env.create_orders(&[("good-1".into(), at_ms(-10))]).await;
    let due = env.order("good-1").await.1;
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
        env.publish_due(body, json()).await;
    }
    let good = message("good-1", due).encode();
    env.publish_due(&good, BasicProperties::default()).await;

    let handled = consumer
        .next_n(cases.len() + 1, Duration::from_secs(10))
        .await;
    assert_eq!(count(&handled, Outcome::Parked), cases.len());
    assert!(
        handled
            .iter()
            .any(|h| h.outcome == Outcome::Cancelled && h.order_id.as_deref() == Some("good-1"))
    );
    assert_eq!(env.order("good-1").await.0, "cancelled");

    // Every bad body is in the parked queue, intact, with its reason.
    let parked = env.parked().await;
    assert_eq!(parked.len(), cases.len());
    for (body, expected) in &cases {
        let found = parked.iter().find(|p| &p.body == body);
        let found = found.unwrap_or_else(|| panic!("body for {expected:?} not parked intact"));
        let reason = &found.reason;
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
