//! The INSERT race: a message can arrive before the order's INSERT commits.
//! An order not found is looked for again through the ladder after each of
//! `consumer.unknown_rechecks_ms`, never before, and only then acked as
//! `unknown`; an order inserted meanwhile is cancelled.

use std::time::Duration;

use chrono::{DateTime, TimeDelta, Utc};
use order_expiry::{service::Handled, service::Outcome};
use order_expiry_testkit::{World, assert_late_within, at_ms, message};

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

    // First look: neither exists; both are sent through the ladder again,
    // each due again RECHECK after that look.
    let ten_s = Duration::from_secs(10);
    let first = consumer.next_all(2, ten_s, Outcome::UnknownRequeued).await;
    let recheck = TimeDelta::from_std(RECHECK).unwrap();
    let again_at = |id: &str| -> DateTime<Utc> {
        first
            .iter()
            .find(|h| h.order_id.as_deref() == Some(id))
            .and_then(|h| h.not_before)
            .expect("due again at")
    };
    for h in &first {
        let not_before = h.not_before.expect("due again at");
        // Decided before the publish and the ack that `at` is taken after.
        assert!(not_before <= h.at + recheck, "{h:?}");
        assert!(not_before > h.at + recheck - TimeDelta::seconds(1), "{h:?}");
    }
    // The INSERT commits now, before the re-check.
    env.create_orders(&[("late-insert".into(), due_at)]).await;

    let seen: Vec<Handled> = consumer.next_n(3, Duration::from_secs(15)).await;
    let of = |id: &str| -> Vec<&Handled> {
        seen.iter()
            .filter(|h| h.order_id.as_deref() == Some(id))
            .collect()
    };
    // Inserted after the first look: cancelled at the re-check, not before.
    let outcomes = |h: &[&Handled]| h.iter().map(|h| h.outcome).collect::<Vec<_>>();
    assert_eq!(
        outcomes(&of("late-insert")),
        [Outcome::Cancelled],
        "{seen:?}"
    );
    let (status, _, cancelled_at) = env.order("late-insert").await;
    assert_eq!(status, "cancelled");
    let late_by = cancelled_at.unwrap() - again_at("late-insert");
    assert_late_within(late_by, TimeDelta::seconds(1), "re-checked");

    // Never inserted: looked for again twice, each not before its time, then unknown.
    let never = of("never");
    let expected = [Outcome::UnknownRequeued, Outcome::Unknown];
    assert_eq!(outcomes(&never), expected, "{seen:?}");
    let second_at = never[0].not_before.expect("due again at");
    let looks = [(never[0].at, again_at("never")), (never[1].at, second_at)];
    for (handled_at, not_before) in looks {
        let what = format!("{seen:?}: looked again");
        assert_late_within(handled_at - not_before, TimeDelta::seconds(1), &what);
    }
    assert!(second_at - again_at("never") >= recheck, "{seen:?}");
    eprintln!(
        "FIGURES insert race: step {} ms; looks again {} ms and {} ms after their times; \
         the late insert cancelled {} ms after its re-check time",
        RECHECK.as_millis(),
        (looks[0].0 - looks[0].1).num_milliseconds(),
        (looks[1].0 - looks[1].1).num_milliseconds(),
        late_by.num_milliseconds()
    );
    consumer.expect_quiet(Duration::from_secs(3)).await;
    consumer.stop().await;
    assert_eq!(env.depth(&env.ladder().due_queue()).await, 0);
    env.cleanup().await;
}
