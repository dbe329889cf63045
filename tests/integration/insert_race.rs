//! The INSERT race: a message can arrive before the order's INSERT commits.
//! An order not found is looked for again through the ladder after each of
//! `consumer.unknown_rechecks_ms`, never before, and only then acked as
//! `unknown`; an order inserted meanwhile is cancelled.

use std::time::Duration;

use chrono::{DateTime, TimeDelta, Utc};
use order_expiry::Outcome;
use order_expiry_testkit::{World, at_ms, message};

/// 2 s each: every re-check passes level 0 of the ladder (2 s − the 300 ms
/// lead is 1 whole second), the second time with the same routing key: a
/// message re-entering the ladder carries no `x-death` header that could
/// make RabbitMQ drop it as a dead-letter cycle.
const RECHECK: Duration = Duration::from_secs(2);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_order_inserted_after_its_message_is_cancelled_one_never_inserted_is_unknown() {
    let env = World::new().await;
    let mut settings = env.settings.clone();
    settings.consumer.unknown_rechecks = vec![RECHECK, RECHECK];
    let mut consumer = env.start_consumer_with(&settings);
    let due_at = at_ms(-10);
    env.publish_messages(&[message("late-insert", due_at), message("never", due_at)])
        .await;

    // First look: neither exists; both are sent through the ladder again.
    let first = consumer.next_n(2, Duration::from_secs(10)).await;
    assert!(
        first.iter().all(|h| h.outcome == Outcome::UnknownRequeued),
        "{first:?}"
    );
    let first_at = first.iter().map(|h| h.at).max().unwrap();
    // The INSERT commits now, before the re-check.
    env.create_orders(&[("late-insert".into(), due_at)]).await;

    let mut seen: Vec<(String, Outcome, DateTime<Utc>)> = Vec::new();
    let handled = consumer.next_n(3, Duration::from_secs(15)).await;
    for h in handled {
        seen.push((h.order_id.unwrap().to_string(), h.outcome, h.at));
    }
    let of = |id: &str| -> Vec<(Outcome, DateTime<Utc>)> {
        seen.iter()
            .filter(|(i, _, _)| i == id)
            .map(|(_, o, at)| (*o, *at))
            .collect()
    };
    let late = of("late-insert");
    assert_eq!(late.len(), 1, "{seen:?}");
    assert_eq!(late[0].0, Outcome::Cancelled);
    let (status, _, cancelled_at) = env.order("late-insert").await;
    assert_eq!(status, "cancelled");
    let recheck = TimeDelta::from_std(RECHECK).unwrap();
    let gap = cancelled_at.unwrap() - first_at;
    assert!(
        gap >= recheck - TimeDelta::milliseconds(50),
        "re-checked after {gap}"
    );
    assert!(
        gap < recheck + TimeDelta::seconds(1),
        "re-checked after {gap}"
    );

    // Never inserted: looked for again twice, 2 s apart, then unknown.
    let never = of("never");
    assert_eq!(
        never.iter().map(|(o, _)| *o).collect::<Vec<_>>(),
        [Outcome::UnknownRequeued, Outcome::Unknown],
        "{seen:?}"
    );
    let gaps = [never[0].1 - first_at, never[1].1 - never[0].1];
    for gap in gaps {
        assert!(gap >= recheck - TimeDelta::milliseconds(50), "{gaps:?}");
        assert!(gap < recheck + TimeDelta::seconds(1), "{gaps:?}");
    }
    eprintln!(
        "FIGURES insert race: re-checks after {} ms and {} ms (step {} ms); the late insert cancelled {} ms after the first look",
        gaps[0].num_milliseconds(),
        gaps[1].num_milliseconds(),
        RECHECK.as_millis(),
        gap.num_milliseconds()
    );
    consumer.expect_quiet(Duration::from_secs(3)).await;
    consumer.stop().await;
    assert_eq!(env.depth(&env.ladder().due_queue()).await, 0);
    env.cleanup().await;
}
