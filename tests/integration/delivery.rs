//! Timeliness end to end: orders with mixed delays, published long-first, are
//! cancelled no earlier than due and well within a second after; a message held
//! until due survives its consumer stopping or being killed.

use std::time::Duration;

use order_expiry::service::Outcome;
use order_expiry_testkit::{Endpoint, World, assert_on_time, at_ms, eventually, orders};
use rand::seq::SliceRandom;

const TEN_S: Duration = Duration::from_secs(10);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mixed_delays_published_long_first_are_cancelled_on_time() {
    let env = World::new().await;
    let mut consumer = env.start_consumer();
    // 120 orders, delays 1-10 s in ms steps, shuffled then sorted long-first: the
    // order that defeats a single holding queue.
    let mut delays: Vec<i64> = (0..120).map(|i| 1_000 + i * 9_000 / 119).collect();
    delays.shuffle(&mut rand::rng());
    delays.sort_by(|a, b| b.cmp(a));
    let orders = orders("mixed", delays.len(), |i| at_ms(delays[i]));
    env.place(&orders).await;

    let (n, timeout) = (orders.len(), Duration::from_secs(25));
    consumer.next_all(n, timeout, Outcome::Cancelled).await;
    let rows = env.orders().await.expect("orders");
    let lateness = assert_on_time(&orders, &rows, Duration::from_secs(1));
    eprintln!("lateness over {} orders: {lateness}", orders.len());
    consumer.stop().await;
    env.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_arriving_early_is_held_until_due_at() {
    let env = World::new().await;
    let early = env.create_order("early-1", 1_500).await;
    let mut consumer = env.start_consumer();
    // Straight into the due queue, 1.5 s before it is due.
    env.publish_message(&early).await;
    consumer.next_all(1, TEN_S, Outcome::Cancelled).await;
    env.assert_cancelled_in_time("early-1").await;
    consumer.stop().await;
    env.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_held_message_survives_the_consumer_stopping() {
    let env = World::new().await;
    let held = env.create_order("held-1", 2_000).await;
    let first = env.start_consumer();
    env.publish_message(&held).await;
    // Let the first consumer take the message and hold it, then stop it.
    tokio::time::sleep(Duration::from_millis(500)).await;
    first.stop().await;
    let (status, _, _) = env.order("held-1").await;
    assert_eq!(status, "unpaid", "not cancelled before due_at");
    let mut second = env.start_consumer();
    second.next_all(1, TEN_S, Outcome::Cancelled).await;
    env.assert_cancelled_in_time("held-1").await;
    second.stop().await;
    env.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killing_the_consumer_while_it_holds_a_message_loses_nothing() {
    let env = World::new().await;
    let kill = env.create_order("kill-1", 3_000).await;
    let mut served = env.serve(&[]).await;
    env.publish_message(&kill).await;
    // Wait until the child has taken it (no longer ready in the queue), then kill -9.
    let due_queue = env.ladder().due_queue();
    eventually(
        Duration::from_secs(10),
        "serve took the message",
        async || env.depth(&due_queue).await == 0,
    )
    .await;
    served.signal("-KILL");
    let exited = served.wait_exit(Duration::from_secs(5)).await;
    exited.expect("killed");
    drop(served);
    assert_eq!(
        env.order("kill-1").await.0,
        "unpaid",
        "held, not processed early"
    );

    let mut consumer = env.start_consumer();
    consumer.next_all(1, TEN_S, Outcome::Cancelled).await;
    env.assert_cancelled_in_time("kill-1").await;
    consumer.stop().await;
    env.cleanup().await;
}

/// A message the broker held back (a ladder level whose dead-letter worker
/// stalled after a restart: 180 s on stock settings) reaches the consumer long
/// after its due time. The consumer counts it as a late arrival whatever the
/// action kind: here the HTTP action, for which no database count of overdue
/// orders exists. The `OrderExpiryLateArrivals` alert
/// (deploy/prometheus/order-expiry-rules.yaml) reads exactly these series.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_held_back_by_the_broker_counts_as_a_late_arrival_for_every_action() {
    let env = World::new().await;
    let orders = Endpoint::order_service(env.store.clone()).await;
    let base_url = orders.base_url();
    let served = env
        .serve_ready(&[
            ("ORDER_EXPIRY__ACTION__KIND", "http"),
            ("ORDER_EXPIRY__ACTION__HTTP__BASE_URL", base_url.as_str()),
        ])
        .await;
    for (id, ms) in [("held-back", -90_000), ("on-time", 0)] {
        env.publish_message(&env.create_order(id, ms).await).await;
    }
    for id in ["held-back", "on-time"] {
        orders
            .wait_for("expire", id, 1, Duration::from_secs(10))
            .await;
    }
    let arrivals = served
        .metric("order_expiry_arrival_lateness_seconds_count")
        .await;
    let within_30_s = served
        .metric("order_expiry_arrival_lateness_seconds_bucket{le=\"30\"}")
        .await;
    assert_eq!(arrivals, 2.0, "both arrivals counted");
    assert_eq!(within_30_s, 1.0, "one of them more than 30 s late");
    assert_eq!(env.order("held-back").await.0, "cancelled");
    drop(served);
    env.cleanup().await;
}
