//! Timeliness end to end: orders with mixed delays, published long-first, are
//! cancelled no earlier than due and well within a second after; a message held
//! until due survives its consumer stopping or being killed.

use std::time::Duration;

use chrono::TimeDelta;
use order_expiry::{Scheduler, service::Outcome};
use order_expiry_testkit::{World, at_ms, message};
use rand::seq::SliceRandom;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mixed_delays_published_long_first_are_cancelled_on_time() {
    let env = World::new().await;
    let mut consumer = env.start_consumer();
    // 120 orders, delays 1-10 s in ms steps, shuffled then sorted long-first: the
    // order that defeats a single holding queue.
    let mut delays: Vec<i64> = (0..120).map(|i| 1_000 + i * 9_000 / 119).collect();
    delays.shuffle(&mut rand::rng());
    delays.sort_by(|a, b| b.cmp(a));
    let orders: Vec<(String, _)> = delays
        .iter()
        .enumerate()
        .map(|(i, ms)| (format!("mixed-{i}"), at_ms(*ms)))
        .collect();
    env.create_orders(&orders).await;
    let scheduler = Scheduler::from_settings(&env.settings).unwrap();
    for result in scheduler.schedule_many(orders.clone()).await {
        result.expect("every schedule confirmed");
    }

    let handled = consumer.next_n(orders.len(), Duration::from_secs(25)).await;
    assert!(handled.iter().all(|h| h.outcome == Outcome::Cancelled));

    let mut lateness_ms = Vec::new();
    for (id, _) in &orders {
        let (status, due_at, cancelled_at) = env.order(id).await;
        assert_eq!(status, "cancelled", "{id}");
        let cancelled_at = cancelled_at.expect("cancelled_at set");
        let late = cancelled_at - due_at;
        assert!(late >= TimeDelta::zero(), "{id} cancelled {late} early");
        assert!(late < TimeDelta::seconds(1), "{id} cancelled {late} late");
        lateness_ms.push(late.num_milliseconds());
    }
    lateness_ms.sort();
    eprintln!(
        "lateness over {} orders: p50 {} ms, max {} ms",
        lateness_ms.len(),
        lateness_ms[lateness_ms.len() / 2],
        lateness_ms[lateness_ms.len() - 1]
    );
    scheduler.close().await;
    consumer.stop().await;
    env.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_arriving_early_is_held_until_due_at() {
    let env = World::new().await;
    env.create_orders(&[("early-1".into(), at_ms(1_500))]).await;
    let (_, due_at, _) = env.order("early-1").await;
    let mut consumer = env.start_consumer();
    // Straight into the due queue, 1.5 s before it is due.
    env.publish_message(&message("early-1", due_at)).await;
    let handled = consumer.next_n(1, Duration::from_secs(10)).await;
    assert_eq!(handled[0].outcome, Outcome::Cancelled);
    let (status, due_at, cancelled_at) = env.order("early-1").await;
    assert_eq!(status, "cancelled");
    assert!(cancelled_at.unwrap() >= due_at, "cancelled before due_at");
    consumer.stop().await;
    env.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_held_message_survives_the_consumer_stopping() {
    let env = World::new().await;
    env.create_orders(&[("held-1".into(), at_ms(2_000))]).await;
    let (_, due_at, _) = env.order("held-1").await;
    let first = env.start_consumer();
    env.publish_message(&message("held-1", due_at)).await;
    // Let the first consumer take the message and hold it, then stop it.
    tokio::time::sleep(Duration::from_millis(500)).await;
    first.stop().await;
    let (status, _, _) = env.order("held-1").await;
    assert_eq!(status, "unpaid", "not cancelled before due_at");
    let mut second = env.start_consumer();
    let handled = second.next_n(1, Duration::from_secs(10)).await;
    assert_eq!(handled[0].outcome, Outcome::Cancelled);
    let (_, due_at, cancelled_at) = env.order("held-1").await;
    assert!(cancelled_at.unwrap() >= due_at);
    second.stop().await;
    env.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killing_the_consumer_while_it_holds_a_message_loses_nothing() {
    let env = World::new().await;
    env.create_orders(&[("kill-1".into(), at_ms(3_000))]).await;
    let (_, due_at, _) = env.order("kill-1").await;
    let mut served = env.serve(&[]).await;
    env.publish_message(&message("kill-1", due_at)).await;
    // Wait until the child has taken it (no longer ready in the queue), then kill -9.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while env.depth(&env.ladder().due_queue()).await > 0 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "serve never took the message"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    served.signal("-KILL");
    served
        .wait_exit(Duration::from_secs(5))
        .await
        .expect("killed");
    drop(served);
    assert_eq!(
        env.order("kill-1").await.0,
        "unpaid",
        "held, not processed early"
    );

    let mut consumer = env.start_consumer();
    let handled = consumer.next_n(1, Duration::from_secs(10)).await;
    assert_eq!(handled[0].outcome, Outcome::Cancelled);
    let (_, due_at, cancelled_at) = env.order("kill-1").await;
    assert!(
        cancelled_at.expect("cancelled") >= due_at,
        "cancelled before due_at"
    );
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
    let orders = order_expiry_testkit::Endpoint::order_service(env.store.clone()).await;
    env.create_orders(&[
        ("held-back".into(), at_ms(-90_000)),
        ("on-time".into(), at_ms(0)),
    ])
    .await;
    let base_url = orders.base_url();
    let env_vars = [
        ("ORDER_EXPIRY__ACTION__KIND", "http"),
        ("ORDER_EXPIRY__ACTION__HTTP__BASE_URL", base_url.as_str()),
    ];
    let served = env.serve(&env_vars).await;
    served.wait_ready(Duration::from_secs(30)).await;
    for id in ["held-back", "on-time"] {
        let (_, due_at, _) = env.order(id).await;
        env.publish_message(&message(id, due_at)).await;
    }
    orders
        .wait_for("expire", "held-back", 1, Duration::from_secs(10))
        .await;
    orders
        .wait_for("expire", "on-time", 1, Duration::from_secs(10))
        .await;
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
