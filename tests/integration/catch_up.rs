//! Catching up after an outage: what no consumer took in time moves from the
//! due queue to the catch-up queue (the due queue's message TTL), so the due
//! queue keeps only what is due now. The consumer takes what is due now
//! first, and drains the backlog beside it at `consumer.catch_up_rate`; the
//! HTTP action never sends the order service more than
//! `action.http.max_rps` a second, however large the backlog.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use chrono::{DateTime, TimeDelta, Utc};
use lapin::BasicProperties;
use order_expiry::Scheduler;
use order_expiry::settings::ActionKind;
use order_expiry_testkit::{Endpoint, World, at_ms, bundle, busiest_second, message};

/// What no consumer takes within this moves to the catch-up queue.
const AFTER: Duration = Duration::from_secs(1);

/// Orders due now are cancelled within this of their due time, backlog or not.
const BOUND: TimeDelta = TimeDelta::seconds(1);

/// The most orders any one-second window may see started: the rate, a tenth
/// saved up, and the rest of one bundle past the rate.
fn most_in_a_second(rate: usize, bundle: usize) -> usize {
    rate + rate / 10 + bundle
}

/// Publishes `n` overdue orders straight into the due queue, in bundles of
/// 100, and waits until the due queue's TTL has moved them all to the
/// catch-up queue (nothing consumes yet).
async fn a_backlog(env: &World, prefix: &str, n: usize) -> Vec<(String, DateTime<Utc>)> {
    let overdue: Vec<(String, DateTime<Utc>)> = (0..n)
        .map(|i| (format!("{prefix}-{i}"), at_ms(-60_000)))
        .collect();
    env.create_orders(&overdue).await;
    let json = BasicProperties::default()
        .with_content_type("application/json".into())
        .with_delivery_mode(2);
    for chunk in overdue.chunks(100) {
        let messages: Vec<_> = chunk.iter().map(|(id, at)| message(id, *at)).collect();
        env.publish_due(&bundle(&messages), json.clone()).await;
    }
    let catch_up = env.ladder().catch_up_queue();
    let deadline = Instant::now() + Duration::from_secs(15);
    while env.depth(&catch_up).await < n.div_ceil(100) as u32 {
        assert!(
            Instant::now() < deadline,
            "the backlog never moved to {catch_up}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(env.depth(&env.ladder().due_queue()).await, 0);
    overdue
}

/// Waits until every order of `ids` is cancelled; their cancel times.
async fn cancelled(
    env: &World,
    ids: &[(String, DateTime<Utc>)],
    timeout: Duration,
) -> Vec<DateTime<Utc>> {
    let deadline = Instant::now() + timeout;
    // Reading every row takes its time at a benchmark's size.
    let poll = Duration::from_millis(if ids.len() > 10_000 { 1_000 } else { 100 });
    loop {
        let rows = env.orders().await.expect("orders");
        let times: Vec<_> = ids
            .iter()
            .filter_map(|(id, _)| rows.get(id).and_then(|r| r.cancelled_at))
            .collect();
        if times.len() == ids.len() {
            return times;
        }
        if Instant::now() >= deadline {
            let missing: Vec<_> = ids
                .iter()
                .filter(|(id, _)| rows.get(id).is_none_or(|r| r.cancelled_at.is_none()))
                .take(10)
                .map(|(id, due)| format!("{id} (due {}, {:?})", due.format("%T%.3f"), rows.get(id)))
                .collect();
            panic!(
                "{} of {} cancelled within {timeout:?}; not: {missing:?}",
                times.len(),
                ids.len()
            );
        }
        tokio::time::sleep(poll).await;
    }
}

/// One start-up run's size.
struct Startup {
    /// Orders overdue in the catch-up queue when the consumer starts.
    backlog: usize,
    /// Orders falling due meanwhile, from 1 s after the start, and how far
    /// apart.
    fresh: usize,
    every_ms: i64,
    /// `consumer.catch_up_rate`.
    rate: usize,
}

/// `serve` was down: 2,000 orders are overdue in the catch-up queue when it
/// starts. The orders that fall due meanwhile are cancelled on time, and
/// the backlog drains at its rate, never faster.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn orders_due_now_come_before_the_backlog_which_drains_at_its_rate() {
    startup(Startup {
        backlog: 2_000,
        fresh: 200,
        every_ms: 15,
        rate: 400,
    })
    .await;
}

/// The full size, a benchmark for a quiet machine (run by hand:
/// `cargo test --release -p order-expiry --test integration full_size_ --
/// --ignored --nocapture`): 100,000 overdue at the default rate (2,000 a
/// second), 1,000 orders a second falling due for the minute it takes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "benchmark: 160,000 orders, for a quiet machine (not in scripts/test --long)"]
async fn full_size_100_000_overdue_at_start_up() {
    startup(Startup {
        backlog: 100_000,
        fresh: 60_000,
        every_ms: 1,
        rate: 2_000,
    })
    .await;
}

async fn startup(size: Startup) {
    let Startup {
        backlog,
        fresh,
        every_ms,
        rate,
    } = size;
    let env = World::builder()
        .catch_up_after(AFTER)
        .build()
        .await
        .expect("a world");
    let overdue = a_backlog(&env, "backlog", backlog).await;
    let mut settings = env.settings.clone();
    settings.consumer.catch_up_rate = rate as u32;
    let consumer = env.start_consumer_with(&settings);
    let due_now: Vec<(String, DateTime<Utc>)> = (0..fresh as i64)
        .map(|i| (format!("now-{i}"), at_ms(1_000 + i * every_ms)))
        .collect();
    env.create_orders(&due_now).await;
    let scheduler = Scheduler::from_settings(&env.settings).unwrap();
    for result in scheduler.schedule_many(due_now.clone()).await {
        result.expect("scheduled");
    }
    let last_due = Duration::from_millis((fresh as i64 * every_ms) as u64);
    let fresh_cancelled = cancelled(&env, &due_now, last_due + Duration::from_secs(20)).await;
    let floor = (backlog - most_in_a_second(rate, 100)) as f64 / rate as f64;
    let drain_limit = Duration::from_secs_f64(floor * 2.0 + 30.0);
    let mut drained = cancelled(&env, &overdue, drain_limit).await;

    let rows = env.orders().await.expect("orders");
    let mut late_ms: Vec<i64> = due_now
        .iter()
        .map(|(id, _)| {
            let row = &rows[id];
            (row.cancelled_at.expect("cancelled") - row.pay_deadline).num_milliseconds()
        })
        .collect();
    late_ms.sort();
    let p99 = late_ms[(late_ms.len() * 99).div_ceil(100) - 1];
    let (first, last) = (drained.iter().min().copied(), drained.iter().max().copied());
    let span = (last.unwrap() - first.unwrap()).num_milliseconds() as f64 / 1e3;
    let busiest = busiest_second(&mut drained);
    eprintln!(
        "FIGURES catch-up: {backlog} overdue at start drained in {span:.1} s at {rate}/s \
         (busiest second {busiest}); {fresh} due meanwhile: lateness p50 {} ms, p99 {p99} ms, \
         max {} ms, the last one cancelled {:.1} s before the backlog was done",
        late_ms[late_ms.len() / 2],
        late_ms[late_ms.len() - 1],
        (last.unwrap() - *fresh_cancelled.iter().max().unwrap()).num_milliseconds() as f64 / 1e3
    );
    assert!(late_ms[0] >= 0, "cancelled early: {:?}", &late_ms[..10]);
    assert!(
        late_ms[late_ms.len() - 1] < BOUND.num_milliseconds(),
        "the backlog held up orders due now: p99 {p99} ms, max {} ms",
        late_ms[late_ms.len() - 1]
    );
    assert!(
        busiest <= most_in_a_second(rate, 100),
        "{busiest} backlog orders in one second, at {rate}/s"
    );
    assert!(
        span >= floor,
        "drained in {span:.1} s: faster than {rate}/s"
    );
    consumer.stop().await;
    scheduler.close().await;
    env.cleanup().await;
}

/// One order-service outage's size.
struct Outage {
    /// Orders falling due, from 200 ms on, and how far apart.
    orders: usize,
    every_ms: i64,
    /// How long the order service is down from the start.
    down: Duration,
    /// `action.http.max_rps` and `consumer.catch_up_rate`.
    rps: usize,
    rate: u32,
}

/// The order service is down while 300 orders fall due; when it is back it
/// gets them at `action.http.max_rps`, never faster, each cancelled once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_order_service_back_from_an_outage_gets_at_most_its_rate() {
    order_service_outage(Outage {
        orders: 300,
        every_ms: 5,
        down: Duration::from_secs(4),
        rps: 100,
        rate: 1_000,
    })
    .await;
}

/// The full size, a benchmark for a quiet machine (run by hand, as
/// above): the order service down 2 minutes while 1,000 orders a second fall
/// due, then 30 s more. Its `max_rps` must exceed the rate orders fall due
/// at, or the backlog never drains: 2,000 here, the backlog at 1,000.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "benchmark: 150,000 orders, for a quiet machine (not in scripts/test --long)"]
async fn full_size_order_service_down_2_min_at_1000_a_second() {
    order_service_outage(Outage {
        orders: 150_000,
        every_ms: 1,
        down: Duration::from_secs(120),
        rps: 2_000,
        rate: 1_000,
    })
    .await;
}

async fn order_service_outage(size: Outage) {
    let Outage {
        orders: count,
        every_ms,
        down,
        rps,
        rate,
    } = size;
    let env = World::builder()
        .catch_up_after(AFTER)
        .build()
        .await
        .expect("a world");
    let port = order_expiry_testkit::free_port();
    let mut settings = env.settings.clone();
    settings.action.kind = ActionKind::Http;
    settings.action.http.base_url = format!("http://127.0.0.1:{port}");
    settings.action.http.timeout = Duration::from_millis(500);
    settings.action.http.max_rps = rps as u32;
    settings.consumer.catch_up_rate = rate;
    let consumer = env.start_consumer_with(&settings);
    let orders: Vec<(String, DateTime<Utc>)> = (0..count as i64)
        .map(|i| (format!("down-{i}"), at_ms(200 + i * every_ms)))
        .collect();
    env.create_orders(&orders).await;
    let scheduler = Scheduler::from_settings(&env.settings).unwrap();
    for result in scheduler.schedule_many(orders.clone()).await {
        result.expect("scheduled");
    }
    tokio::time::sleep(down).await;
    let service = Endpoint::order_service_on(env.store.clone(), port).await;
    let back = Utc::now();
    let span = Duration::from_millis((count as i64 * every_ms) as u64);
    let drain = Duration::from_secs_f64(count as f64 / rps as f64 * 2.0);
    cancelled(&env, &orders, span + drain + Duration::from_secs(30)).await;

    let requests = service.requests();
    let mut times: Vec<DateTime<Utc>> = requests.iter().map(|r| r.at).collect();
    let busiest = busiest_second(&mut times);
    let mut per_order: HashMap<&str, usize> = HashMap::new();
    for r in requests.iter().filter(|r| r.status == Some(200)) {
        *per_order.entry(r.order_id.as_str()).or_default() += 1;
    }
    let sent = (times.last().copied().unwrap() - back).num_milliseconds() as f64 / 1e3;
    eprintln!(
        "FIGURES catch-up http: {count} orders, the service down {:.0} s, sent in {sent:.1} s \
         after it came back, busiest second {busiest} requests at max_rps {rps}; {} \
         requests in all",
        down.as_secs_f64(),
        requests.len()
    );
    // Two more for the jitter of the service's own stamps.
    assert!(
        busiest <= most_in_a_second(rps, 2),
        "{busiest} requests in one second"
    );
    assert_eq!(
        per_order.len(),
        count,
        "every order cancelled by the service"
    );
    assert!(
        per_order.values().all(|n| *n == 1),
        "cancelled once each: {:?}",
        per_order
            .iter()
            .filter(|(_, n)| **n != 1)
            .take(10)
            .collect::<Vec<_>>()
    );
    consumer.stop().await;
    scheduler.close().await;
    env.cleanup().await;
}
