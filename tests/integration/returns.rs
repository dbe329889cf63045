//! A publish the broker returns is told to its own caller, and only to it.
//!
//! RabbitMQ confirms several publishes with one multiple-ack when they are
//! settled together, and sends each `basic.return` before the ack that covers
//! its publish. A return matched to the wrong confirm of such an ack tells
//! one caller "scheduled" for a message the broker dropped (an order that is
//! never cancelled) and another "unroutable" for a message that is in the
//! ladder. Every publisher of the service goes through `Confirms`
//! (`src/amqp/confirms.rs`), which matches each return to its publish by what
//! the return carries (`message_id`, exchange, routing key), not by the
//! order lapin resolves a multiple-ack's tags in.
//!
//! The ladder here lacks its level 5 queue: an order due in 45 s enters the
//! ladder there and is returned; one due in 10 s enters at level 3 and is
//! kept. They are scheduled mixed, bundles off, with the window full.

use std::time::Duration;

use order_expiry::ScheduleError;
use order_expiry_testkit::{World, at_ms, orders};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_returned_order_and_only_it_is_refused() {
    let env = World::builder().kind("ret").build().await.expect("a world");
    env.delete_queue(&env.ladder().level_name(5)).await;
    let returned = |i: usize| i % 5 == 2;
    let orders = orders("r", 1_000, |i| {
        at_ms(if returned(i) { 45_000 } else { 10_000 })
    });
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
            let id = &orders[i].0;
            wrong.push(format!("{id} (returned: {}): {result:?}", returned(i)));
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
