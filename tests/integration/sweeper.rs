//! Scenario 7, the safety net: an unpaid order whose schedule never reached the
//! broker is cancelled by the sweeper once it is `grace_ms` overdue; paid orders,
//! orders within their grace and orders not yet due are left alone; turned off,
//! it does nothing; and on a healthy run, where the ladder delivers every
//! message, it sweeps nothing.

use std::time::{Duration, Instant};

use order_expiry::{service::Service, service::Sweeper};
use order_expiry_testkit::{World, at_ms, eventually, orders, schedule_all};
use tokio_util::sync::CancellationToken;

const GRACE_MS: i64 = 1500;
const INTERVAL_MS: u64 = 200;
/// A sweep statement's own time and this test's polling, on a busy laptop.
const SWEEP_SLACK: Duration = Duration::from_millis(1000);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sweeper_cancels_overdue_unpaid_orders_that_never_got_a_message() {
    let mut env = World::new().await;
    env.settings.sweeper.enabled = true;
    env.settings.sweeper.interval = Duration::from_millis(INTERVAL_MS);
    env.settings.sweeper.grace = Duration::from_millis(GRACE_MS as u64);
    env.settings.sweeper.batch_max = 7; // several statements per sweep

    // No message was ever scheduled for any of these.
    let lost = orders("lost", 20, |i| at_ms(-GRACE_MS - 5000 - i as i64));
    env.create_orders(&lost).await;
    env.create_orders(&[
        ("paid-overdue".into(), at_ms(-GRACE_MS - 5000)),
        ("in-grace".into(), at_ms(-200)),
        ("not-due".into(), at_ms(60_000)),
    ])
    .await;
    assert!(env.store.pay("paid-overdue").await.unwrap());

    let service = Service::build(&env.settings).await.unwrap();
    let stop = CancellationToken::new();
    let started = Instant::now();
    let task = tokio::spawn(service.run(stop.clone()));

    env.wait_cancelled(&lost, Duration::from_secs(10)).await;
    let swept_in = started.elapsed();
    // Overdue by more than the grace at start: the first sweep (at start-up)
    // or the next one takes them.
    assert!(
        swept_in <= Duration::from_millis(INTERVAL_MS) + SWEEP_SLACK,
        "orders long overdue swept only {swept_in:?} after start"
    );
    // The one within its grace period is swept only once the grace has passed.
    env.wait_cancelled(&["in-grace"], Duration::from_secs(10))
        .await;
    let (_, deadline_at, cancelled_at) = env.order("in-grace").await;
    let after = cancelled_at.unwrap() - deadline_at;
    assert!(
        after.num_milliseconds() >= GRACE_MS,
        "swept {after} after its deadline"
    );
    // ... and within one interval of that.
    let latest = Duration::from_millis(GRACE_MS as u64 + INTERVAL_MS) + SWEEP_SLACK;
    assert!(
        after.to_std().unwrap() <= latest,
        "swept {after} after its deadline (at most {latest:?})"
    );
    assert_eq!(env.order("paid-overdue").await.0, "paid");
    assert_eq!(env.order("not-due").await.0, "unpaid");

    stop.cancel();
    tokio::time::timeout(Duration::from_secs(15), task)
        .await
        .expect("the service, sweeper included, stops on shutdown")
        .unwrap();
    eprintln!(
        "FIGURES sweeper: orders {} (20 overdue with no message, 1 paid overdue, 1 in grace, 1 not due), \
         cancelled 21, lost 0, wrongly cancelled 0, early 0; all 20 swept {:.2} s after start \
         (interval {INTERVAL_MS} ms, grace {GRACE_MS} ms, batch 7)",
        lost.len() + 3,
        swept_in.as_secs_f64()
    );
    env.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sweep_uses_the_atomic_statement_and_a_disabled_sweeper_does_nothing() {
    let mut env = World::new().await;
    let old = ["old-1", "old-2", "old-paid"].map(|id| (id.to_owned(), at_ms(-600_000)));
    env.create_orders(&old).await;
    assert!(env.store.pay("old-paid").await.unwrap());

    // Turned off: `serve` runs no sweeper.
    env.settings.sweeper.enabled = false;
    env.settings.sweeper.interval = Duration::from_millis(50);
    env.settings.sweeper.grace = Duration::ZERO;
    let service = Service::build(&env.settings).await.unwrap();
    let stop = CancellationToken::new();
    let task = tokio::spawn(service.run(stop.clone()));
    tokio::time::sleep(Duration::from_millis(500)).await;
    stop.cancel();
    task.await.unwrap();
    assert_eq!(env.order("old-1").await.0, "unpaid");

    // One sweep by hand: exactly the overdue unpaid ones, once.
    let sweeper = Sweeper::new(&env.settings.sweeper, env.store.clone());
    let mut swept = sweeper.sweep_once().await.unwrap();
    swept.sort();
    assert_eq!(swept, ["old-1", "old-2"]);
    assert!(sweeper.sweep_once().await.unwrap().is_empty());
    assert_eq!(env.order("old-paid").await.0, "paid");
    env.cleanup().await;
}

/// The sweeper on with its defaults (every 1 s, 3 s grace) beside a healthy
/// ladder: every unpaid order is cancelled by its message, on time, and
/// `order_expiry_swept_total` stays 0. A sweeper that raced the consumer, or a
/// grace shorter than the ladder's lateness, would show here.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_healthy_run_sweeps_nothing() {
    const ORDERS: usize = 120;
    let mut env = World::new().await;
    env.settings.sweeper = order_expiry::Settings::default().sweeper;
    assert!(env.settings.sweeper.enabled, "the sweeper is on by default");
    let served = env.serve_ready(&[]).await;

    // Due every 25 ms from 1 s to 4 s; every fourth paid.
    let orders = orders("healthy", ORDERS, |i| at_ms(1000 + i as i64 * 25));
    env.create_orders(&orders).await;
    for (id, _) in orders.iter().step_by(4) {
        assert!(env.store.pay(id).await.unwrap());
    }
    schedule_all(env.scheduler(), &orders).await;

    let unpaid = ORDERS - ORDERS.div_ceil(4);
    let series = "order_expiry_messages_total{outcome=\"cancelled\"}";
    eventually(
        Duration::from_secs(20),
        "every unpaid order cancelled",
        async || served.metric(series).await >= unpaid as f64,
    )
    .await;
    // Past the last due time by more than grace + interval: a sweep that was
    // going to take anything has run.
    let default = order_expiry::Settings::default().sweeper;
    tokio::time::sleep(default.grace + default.interval).await;
    assert_eq!(served.metric(series).await, unpaid as f64);
    for (i, (id, due)) in orders.iter().enumerate() {
        let (status, _, cancelled_at) = env.order(id).await;
        if i % 4 == 0 {
            assert_eq!(status, "paid", "{id}");
        } else {
            let cancelled_at = cancelled_at.unwrap_or_else(|| panic!("{id} not cancelled"));
            assert!(cancelled_at >= *due, "{id} cancelled early");
        }
    }
    served.assert_nothing_swept().await;
    drop(served);
    env.cleanup().await;
}
