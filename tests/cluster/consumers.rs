//! Competing consumers: three `serve` processes on the due queue, each on its
//! own node. Every due order is cancelled exactly once and none early; the
//! drain rate of a due queue with one consumer and with three. The sweeper is
//! off here: the orders waiting in the due queue are overdue by the time the
//! consumers start, and every cancel must be a consumer's.

use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use order_expiry_testkit::{Served, at_ms, orders, sum_metric, wire_due};

use crate::support::{ClusterWorld, NO_SWEEPER};

/// Orders due at once in each drain measurement.
const DRAIN_ORDERS: i64 = 20_000;

/// Inserts `n` unpaid orders `prefix-1..n` due at `due_at` in one statement,
/// and schedules them all (confirmed) through a publisher on node 3, one
/// message per order (bundles off): the due queue then holds more messages
/// than one consumer's prefetch, and the consumers that subscribe later get
/// their share. A due queue of 200 bundles would go whole to whichever
/// consumer subscribed first (docs/src/results/cluster.md, Competing consumers).
async fn place(world: &ClusterWorld, prefix: &str, n: i64, due_at: DateTime<Utc>) -> Vec<String> {
    let ids: Vec<String> = (1..=n).map(|i| format!("{prefix}-{i}")).collect();
    let due_at = wire_due(due_at);
    let client = world.store.client().await.expect("database");
    client
        .execute(
            "INSERT INTO orders (id, status, pay_deadline) SELECT unnest($1::text[]), 'unpaid', $2",
            &[&ids, &due_at],
        )
        .await
        .expect("insert orders");
    let scheduler = world
        .scheduler_on(3, Duration::from_secs(10))
        .with_bundle_max_orders(1);
    let results = scheduler
        .schedule_many(ids.iter().map(|id| (id.as_str(), due_at)))
        .await;
    let failed = results.iter().filter(|r| r.is_err()).count();
    assert_eq!(failed, 0, "every order scheduled");
    scheduler.close().await;
    ids
}

/// Waits (at most `limit`) until every order of `ids` is cancelled; returns
/// the rate between the first and the last cancel, in orders per second, and
/// the count cancelled before its due time.
async fn drained(world: &ClusterWorld, ids: &[String], limit: Duration) -> (f64, usize) {
    let deadline = Instant::now() + limit;
    loop {
        let rows = world.rows().await;
        let cancelled: Vec<_> = ids
            .iter()
            .filter_map(|id| {
                rows[id.as_str()]
                    .cancelled_at
                    .map(|at| (at, rows[id.as_str()].pay_deadline))
            })
            .collect();
        if cancelled.len() == ids.len() {
            let first = cancelled.iter().map(|c| c.0).min().expect("some");
            let last = cancelled.iter().map(|c| c.0).max().expect("some");
            let early = cancelled.iter().filter(|(at, due)| at < due).count();
            let seconds = (last - first).num_microseconds().unwrap_or(1) as f64 / 1e6;
            return ((ids.len() - 1) as f64 / seconds.max(1e-6), early);
        }
        assert!(
            Instant::now() < deadline,
            "{} of {} cancelled within {limit:?}",
            cancelled.len(),
            ids.len()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn cancelled_by(serves: &[Served]) -> Vec<f64> {
    let mut counts = Vec::new();
    for served in serves {
        counts.push(served.metric(CANCELLED).await);
    }
    counts
}

const CANCELLED: &str = "order_expiry_messages_total{outcome=\"cancelled\"}";

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn three_consumers_on_three_nodes_cancel_each_order_once_and_drain() {
    let world = ClusterWorld::new("competing consumers", 6).await;
    // The due queue fills first (orders due at once), then the consumers start:
    // the drain is measured from the first cancel to the last.
    let one = place(&world, "one", DRAIN_ORDERS, at_ms(-1000)).await;
    let single = world.serves_on(&[1], &NO_SWEEPER).await;
    let (rate_one, early_one) = drained(&world, &one, Duration::from_secs(120)).await;
    let by_one = cancelled_by(&single).await;
    drop(single);

    let three = place(&world, "three", DRAIN_ORDERS, at_ms(-1000)).await;
    let serves = world.serves_on(&[1, 2, 3], &NO_SWEEPER).await;
    let (rate_three, early_three) = drained(&world, &three, Duration::from_secs(120)).await;
    let nodes = world.due_consumer_nodes().await;
    let by_three = cancelled_by(&serves).await;
    let duplicates = sum_metric(
        &serves,
        "order_expiry_messages_total{outcome=\"not_unpaid\"}",
    )
    .await;

    // Orders due over the next seconds while all three consume: none early.
    let spread = orders("spread", 600, |i| at_ms(1000 + (i as i64 * 13) % 6000));
    let scheduler = world.scheduler_on(1, Duration::from_secs(10));
    world.place_with(scheduler, &spread).await;
    let ids: Vec<String> = spread.into_iter().map(|(id, _)| id).collect();
    let (_, early_spread) = drained(&world, &ids, Duration::from_secs(60)).await;
    let by_spread = cancelled_by(&serves).await;
    let total: f64 = by_spread.iter().sum();

    eprintln!(
        "FIGURES competing consumers: drain of {DRAIN_ORDERS} due orders: 1 consumer {rate_one:.0}/s \
         (cancelled {by_one:?}), 3 consumers {rate_three:.0}/s (cancelled per consumer {by_three:?}, on nodes {nodes:?}); \
         then 600 orders due over 6 s: cancelled per consumer in all {by_spread:?}; \
         early {}, duplicates (not_unpaid) {duplicates}",
        early_one + early_three + early_spread
    );
    let mut distinct = nodes.clone();
    distinct.sort_unstable();
    distinct.dedup();
    assert_eq!(distinct, [1, 2, 3], "one consumer on each node: {nodes:?}");
    assert_eq!(early_one + early_three + early_spread, 0);
    // Exactly once: the three consumers' cancels add up to the orders, each
    // order ended cancelled once in the database (the cancel is one atomic
    // statement on an unpaid order) and no message was handled twice.
    assert_eq!(total as i64, DRAIN_ORDERS + 600, "{by_spread:?}");
    assert_eq!(duplicates, 0.0);
    assert!(
        by_three.iter().all(|&n| n > 0.0),
        "all three consumed: {by_three:?}"
    );
    drop(serves);
    world.cleanup().await;
}
