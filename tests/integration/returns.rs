//! A publish the broker returns is told to its own caller, and only to it.
//!
//! RabbitMQ confirms several publishes with one multiple-ack when they are
//! settled together, and sends each `basic.return` before the ack that covers
//! its publish. A return matched to the wrong confirm of such an ack tells
//! one caller "scheduled" for a message the broker dropped (an order that is
//! never cancelled) and another "unroutable" for a message that is in the
//! ladder.
//!
//! The ladder here lacks its level 5 queue: an order due in 45 s enters the
//! ladder there and is returned; one due in 10 s enters at level 3 and is
//! kept. They are scheduled mixed, bundles off, with the window full.
//!
//! Before `src/amqp/confirms.rs` (2026-12-02, RabbitMQ 3.10) it failed 6 runs
//! of 9, each with 2 of 1,000 orders told wrong, one returned order told
//! "scheduled" and one kept order told "unroutable": lapin 4 hands the oldest
//! waiting `basic.return` to whichever confirm it resolves next, and resolves
//! a multiple-ack's tags in hash-map order, while RabbitMQ only promises that
//! a return comes before its own ack. Every publisher of the service goes
//! through `Confirms` now (the scheduler, the consumer's parks, re-checks and
//! retries before their ack, the event action, `ladder migrate` and `parked
//! replay`), which matches each return to its publish by what the return
//! carries (`message_id`, exchange, routing key). With the returns handed to
//! the confirms that carried them, as lapin does, 6 runs of 6 failed.
//! It matters only where the topology is broken (a queue or binding gone):
//! a returned message is otherwise never sent.

use std::time::Duration;

use chrono::{DateTime, TimeDelta, Utc};
use order_expiry::ScheduleError;
use order_expiry_testkit::World;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_returned_order_and_only_it_is_refused() {
    let env = World::builder().kind("ret").build().await.expect("a world");
    let level_5 = env.ladder().level_name(5);
    env.channel()
        .await
        .queue_delete(level_5.as_str().into(), Default::default())
        .await
        .expect("level 5 deleted");
    let now = Utc::now();
    let returned = |i: usize| i % 5 == 2;
    let orders: Vec<(String, DateTime<Utc>)> = (0..1_000)
        .map(|i| {
            let secs = if returned(i) { 45 } else { 10 };
            (format!("r-{i:04}"), now + TimeDelta::seconds(secs))
        })
        .collect();
    env.create_orders(&orders).await;
    let scheduler = env.scheduler().with_bundle_max_orders(1);
    let results = scheduler.schedule_many(orders.clone()).await;
    scheduler.close().await;

    let mut wrong = Vec::new();
    for (i, result) in results.iter().enumerate() {
        let ok = match result {
            Ok(_) => !returned(i),
            Err(ScheduleError::Unroutable { order_id, .. }) => {
                returned(i) && *order_id == orders[i].0
            }
            Err(_) => false,
        };
        if !ok {
            wrong.push(format!(
                "{} (returned: {}): {result:?}",
                orders[i].0,
                returned(i)
            ));
        }
    }
    let kept = results.iter().filter(|r| r.is_ok()).count();
    // A passive declare's count can trail the confirm by a moment.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let held = env.ladder_depth(Some(5)).await;
    assert!(
        wrong.is_empty(),
        "{} of {} told wrong, e.g. {:?}",
        wrong.len(),
        orders.len(),
        &wrong[..wrong.len().min(5)]
    );
    assert_eq!(
        held as usize, kept,
        "every order told scheduled is in the ladder"
    );
    env.cleanup().await;
}
