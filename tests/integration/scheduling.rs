//! The publisher surfaces failures: unroutable, missing exchange, delay too long,
//! invalid order id. `Ok` means the broker holds the message.

use std::time::Duration;

use order_expiry::{ScheduleError, Scheduler, topology::Ladder};
use order_expiry_testkit::{World, amqp_url, at_ms};
use secrecy::SecretString;

fn scheduler_for(prefix: &str, levels: u8) -> Scheduler {
    let ladder = Ladder::new(prefix, levels).unwrap();
    Scheduler::new(SecretString::from(amqp_url()), ladder)
        .with_timeout(Duration::from_secs(5))
        .with_max_in_flight(100)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn schedule_to_an_exchange_that_does_not_route_is_an_error() {
    let env = World::new().await;
    let prefix = format!("{}-unbound", env.settings.topology.prefix);
    let ladder = Ladder::new(&prefix, 3).unwrap();
    // The due exchange exists but nothing is bound to it.
    env.declare_exchange(&ladder.due_exchange()).await;
    let scheduler = scheduler_for(&prefix, 3);
    match scheduler.schedule("o-1", at_ms(-1)).await {
        Err(ScheduleError::Unroutable { reply_code, .. }) => assert_eq!(reply_code, 312),
        other => panic!("expected Unroutable, got {other:?}"),
    }
    // An exchange that does not exist at all is an error naming it, and the
    // scheduler recovers for the next call.
    match scheduler.schedule("o-2", at_ms(2_000)).await {
        Err(ScheduleError::TopologyMissing { exchange }) => {
            assert_eq!(exchange, ladder.level_name(0))
        }
        other => panic!("expected TopologyMissing, got {other:?}"),
    }
    env.delete_exchange(&ladder.due_exchange()).await;
    let working = env.scheduler();
    working.schedule("o-3", at_ms(1_000)).await.unwrap();
    scheduler.close().await;
    working.close().await;
    env.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn schedule_rejects_bad_input_before_publishing() {
    let env = World::new().await;
    let scheduler = env.scheduler();
    let max = env.ladder().max_delay_secs() as i64;
    assert!(matches!(
        scheduler.schedule("o", at_ms((max + 2) * 1000)).await,
        Err(ScheduleError::DelayTooLong(_))
    ));
    assert!(matches!(
        scheduler.schedule("", at_ms(1000)).await,
        Err(ScheduleError::InvalidOrderId(_))
    ));
    assert!(matches!(
        scheduler.schedule(&"x".repeat(129), at_ms(1000)).await,
        Err(ScheduleError::InvalidOrderId(_))
    ));
    // Nothing reached the broker.
    assert_eq!(env.depth(&env.ladder().due_queue()).await, 0);
    scheduler.close().await;
    env.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_due_time_in_the_past_is_delivered_at_once() {
    let env = World::new().await;
    let scheduler = env.scheduler();
    let scheduled = scheduler.schedule("past-1", at_ms(-60_000)).await.unwrap();
    assert_eq!(scheduled.route.exchange, env.ladder().due_exchange());
    assert_eq!(env.depth(&env.ladder().due_queue()).await, 1);
    let message = env.get(&env.ladder().due_queue()).await.unwrap();
    let props = &message.delivery.properties;
    assert_eq!(props.delivery_mode(), &Some(2), "persistent");
    assert_eq!(
        props.content_type().as_ref().map(|c| c.as_str()),
        Some("application/json")
    );
    assert_eq!(
        props.message_id().as_ref().map(|m| m.to_string()),
        Some(scheduled.message_id)
    );
    assert!(props.timestamp().is_some());
    scheduler.close().await;
    env.cleanup().await;
}
