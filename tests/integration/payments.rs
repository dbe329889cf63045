//! Paid orders are never cancelled; cancelled orders cannot be paid; the same
//! message twice changes nothing the second time.

use std::time::Duration;

use order_expiry::{service::Disposition, service::OrderStore, service::Outcome};
use order_expiry_testkit::{World, at_ms, count, message, orders};

const TEN_S: Duration = Duration::from_secs(10);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn paid_orders_stay_paid_and_cancelled_ones_stay_cancelled() {
    let env = World::new().await;
    let orders = orders("pay", 20, |_| at_ms(2_000));
    env.place(&orders).await;
    // Pay the even ones before they are due.
    for (id, _) in orders.iter().step_by(2) {
        assert!(env.store.pay(id).await.unwrap());
    }
    let mut consumer = env.start_consumer();
    let handled = consumer.next_n(20, Duration::from_secs(15)).await;
    assert_eq!(count(&handled, Outcome::Cancelled), 10);
    assert_eq!(count(&handled, Outcome::NotUnpaid), 10);
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
    consumer.stop().await;
    env.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_same_message_twice_changes_nothing_the_second_time() {
    let env = World::new().await;
    let dup_1 = env.create_order("dup-1", -10).await;

    // The unit of work, twice.
    let first = env.store.cancel_unpaid(&[&dup_1]).await.unwrap();
    let cancelled_at = env.order("dup-1").await.2;
    let second = env.store.cancel_unpaid(&[&dup_1]).await.unwrap();
    assert_eq!(first, [Disposition::Cancelled]);
    assert_eq!(second, [Disposition::NotUnpaid]);
    assert_eq!(env.order("dup-1").await.2, cancelled_at);

    // And end to end: the broker delivers it twice (and once more in one batch).
    let dup_2 = env.create_order("dup-2", -10).await;
    let mut consumer = env.start_consumer();
    env.publish_message(&dup_2).await;
    consumer.next_all(1, TEN_S, Outcome::Cancelled).await;
    let cancelled_at = env.order("dup-2").await.2;
    env.publish_messages(&[dup_2.clone(), dup_2]).await;
    consumer.next_all(2, TEN_S, Outcome::NotUnpaid).await;
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
    consumer.next_all(1, TEN_S, Outcome::Unknown).await;
    consumer.expect_quiet(Duration::from_secs(2)).await;
    consumer.stop().await;
    // Acked: nothing came back to the queue.
    assert_eq!(env.depth(&env.ladder().due_queue()).await, 0);
    env.cleanup().await;
}
