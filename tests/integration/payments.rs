//! Paid orders are never cancelled; cancelled orders cannot be paid; the same
//! message twice changes nothing the second time.

use std::time::Duration;

use order_expiry::{Scheduler, service::Disposition, service::OrderStore, service::Outcome};
use order_expiry_testkit::{World, at_ms, message};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn paid_orders_stay_paid_and_cancelled_ones_stay_cancelled() {
    let env = World::new().await;
    let orders: Vec<(String, _)> = (0..20)
        .map(|i| (format!("pay-{i}"), at_ms(2_000)))
        .collect();
    env.create_orders(&orders).await;
    let scheduler = Scheduler::from_settings(&env.settings).unwrap();
    for r in scheduler.schedule_many(orders.clone()).await {
        r.unwrap();
    }
    // Pay the even ones before they are due.
    for (id, _) in orders.iter().step_by(2) {
        assert!(env.store.pay(id).await.unwrap());
    }
    let mut consumer = env.start_consumer();
    let handled = consumer.next_n(20, Duration::from_secs(15)).await;
    let cancelled = handled
        .iter()
        .filter(|h| h.outcome == Outcome::Cancelled)
        .count();
    let not_unpaid = handled
        .iter()
        .filter(|h| h.outcome == Outcome::NotUnpaid)
        .count();
    assert_eq!((cancelled, not_unpaid), (10, 10));
    for (i, (id, _)) in orders.iter().enumerate() {
        let (status, _, cancelled_at) = env.order(id).await;
        if i % 2 == 0 {
            assert_eq!(status, "paid", "{id}");
            assert!(cancelled_at.is_none());
        } else {
            assert_eq!(status, "cancelled", "{id}");
            // A payment arriving after the cancel does not resurrect the order.
            assert!(!env.store.pay(id).await.unwrap());
            assert_eq!(env.order(id).await.0, "cancelled");
        }
    }
    scheduler.close().await;
    consumer.stop().await;
    env.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_same_message_twice_changes_nothing_the_second_time() {
    let env = World::new().await;
    env.create_orders(&[("dup-1".into(), at_ms(-10))]).await;
    let (_, due_at, _) = env.order("dup-1").await;
    let dup_1 = message("dup-1", due_at);

    // The unit of work, twice.
    let first = env.store.cancel_unpaid(&[&dup_1]).await.unwrap();
    let cancelled_at = env.order("dup-1").await.2;
    let second = env.store.cancel_unpaid(&[&dup_1]).await.unwrap();
    assert_eq!(first, [Disposition::Cancelled]);
    assert_eq!(second, [Disposition::NotUnpaid]);
    assert_eq!(env.order("dup-1").await.2, cancelled_at);

    // And end to end: the broker delivers it twice (and once more in one batch).
    env.create_orders(&[("dup-2".into(), at_ms(-10))]).await;
    let dup_2 = message("dup-2", env.order("dup-2").await.1);
    let mut consumer = env.start_consumer();
    env.publish_message(&dup_2).await;
    let handled = consumer.next_n(1, Duration::from_secs(10)).await;
    assert_eq!(handled[0].outcome, Outcome::Cancelled);
    let cancelled_at = env.order("dup-2").await.2;
    env.publish_message(&dup_2).await;
    env.publish_message(&dup_2).await;
    let handled = consumer.next_n(2, Duration::from_secs(10)).await;
    assert!(handled.iter().all(|h| h.outcome == Outcome::NotUnpaid));
    assert_eq!(env.order("dup-2").await.2, cancelled_at);
    consumer.stop().await;
    env.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unknown_order_is_acked_and_counted_not_retried() {
    let env = World::new().await;
    // Without re-checks (tests/integration/insert_race.rs has those).
    let mut settings = env.settings.clone();
    settings.consumer.unknown_rechecks = Vec::new();
    let mut consumer = env.start_consumer_with(&settings);
    env.publish_message(&message("no-such-order", at_ms(-5)))
        .await;
    let handled = consumer.next_n(1, Duration::from_secs(10)).await;
    assert_eq!(handled[0].outcome, Outcome::Unknown);
    consumer.expect_quiet(Duration::from_secs(2)).await;
    consumer.stop().await;
    // Acked: nothing came back to the queue.
    assert_eq!(env.depth(&env.ladder().due_queue()).await, 0);
    env.cleanup().await;
}
