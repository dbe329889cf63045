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
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// `serve` was down: 2,000 orders are overdue in the catch-up queue when it
/// starts. The orders that fall due meanwhile are cancelled on time, and
/// the backlog drains at its rate, never faster.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn orders_due_now_come_before_the_backlog_which_drains_at_its_rate() {
    const RATE: usize = 400;
    let env = World::builder()
        .catch_up_after(AFTER)
        .build()
        .await
        .expect("a world");
    let backlog = a_backlog(&env, "backlog", 2_000).await;
    let mut settings = env.settings.clone();
    settings.consumer.catch_up_rate = RATE as u32;
    let consumer = env.start_consumer_with(&settings);
    let fresh: Vec<(String, DateTime<Utc>)> = (0..200)
        .map(|i| (format!("now-{i}"), at_ms(1_000 + i * 15)))
        .collect();
    env.create_orders(&fresh).await;
    let scheduler = Scheduler::from_settings(&env.settings).unwrap();
    for result in scheduler.schedule_many(fresh.clone()).await {
        result.expect("scheduled");
    }
    let fresh_cancelled = cancelled(&env, &fresh, Duration::from_secs(20)).await;
    let mut drained = cancelled(&env, &backlog, Duration::from_secs(30)).await;

    let rows = env.orders().await.expect("orders");
    let mut late_ms: Vec<i64> = fresh
        .iter()
        .map(|(id, _)| {
            let row = &rows[id];
            (row.cancelled_at.expect("cancelled") - row.pay_deadline).num_milliseconds()
        })
        .collect();
    late_ms.sort();
    let (first, last) = (drained.iter().min().copied(), drained.iter().max().copied());
    let span = (last.unwrap() - first.unwrap()).num_milliseconds() as f64 / 1e3;
    let busiest = busiest_second(&mut drained);
    eprintln!(
        "FIGURES catch-up: 2000 overdue at start drained in {span:.1} s at {RATE}/s (busiest \
         second {busiest}); 200 due meanwhile: lateness p50 {} ms, max {} ms, the last one \
         cancelled {:.1} s before the backlog was done",
        late_ms[late_ms.len() / 2],
        late_ms[late_ms.len() - 1],
        (last.unwrap() - *fresh_cancelled.iter().max().unwrap()).num_milliseconds() as f64 / 1e3
    );
    assert!(late_ms[0] >= 0, "cancelled early: {late_ms:?}");
    assert!(
        late_ms[late_ms.len() - 1] < BOUND.num_milliseconds(),
        "the backlog held up orders due now: {late_ms:?}"
    );
    assert!(
        busiest <= most_in_a_second(RATE, 100),
        "{busiest} backlog orders in one second, at {RATE}/s"
    );
    let floor = (2_000 - most_in_a_second(RATE, 100)) as f64 / RATE as f64;
    assert!(
        span >= floor,
        "drained in {span:.1} s: faster than {RATE}/s"
    );
    consumer.stop().await;
    scheduler.close().await;
    env.cleanup().await;
}

/// The order service is down while 300 orders fall due; when it is back it
/// gets them at `action.http.max_rps`, never faster, each cancelled once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_order_service_back_from_an_outage_gets_at_most_its_rate() {
    const RPS: usize = 100;
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
    settings.action.http.max_rps = RPS as u32;
    settings.consumer.catch_up_rate = 1_000;
    let consumer = env.start_consumer_with(&settings);
    let orders: Vec<(String, DateTime<Utc>)> = (0..300)
        .map(|i| (format!("down-{i}"), at_ms(200 + i * 5)))
        .collect();
    env.create_orders(&orders).await;
    let scheduler = Scheduler::from_settings(&env.settings).unwrap();
    for result in scheduler.schedule_many(orders.clone()).await {
        result.expect("scheduled");
    }
    // Down for 4 s after the first falls due.
    tokio::time::sleep(Duration::from_secs(4)).await;
    let service = Endpoint::order_service_on(env.store.clone(), port).await;
    let back = Utc::now();
    cancelled(&env, &orders, Duration::from_secs(30)).await;

    let requests = service.requests();
    let mut times: Vec<DateTime<Utc>> = requests.iter().map(|r| r.at).collect();
    let busiest = busiest_second(&mut times);
    let mut per_order: HashMap<&str, usize> = HashMap::new();
    for r in requests.iter().filter(|r| r.status == Some(200)) {
        *per_order.entry(r.order_id.as_str()).or_default() += 1;
    }
    let span = (times.last().copied().unwrap() - back).num_milliseconds() as f64 / 1e3;
    eprintln!(
        "FIGURES catch-up http: 300 orders held by a 4 s outage, sent in {span:.1} s after \
         the service came back, busiest second {busiest} requests at max_rps {RPS}; {} \
         requests in all",
        requests.len()
    );
    // Two more for the jitter of the service's own stamps.
    assert!(
        busiest <= most_in_a_second(RPS, 2),
        "{busiest} requests in one second"
    );
    assert_eq!(per_order.len(), 300, "every order cancelled by the service");
    assert!(
        per_order.values().all(|n| *n == 1),
        "cancelled once each: {per_order:?}"
    );
    consumer.stop().await;
    scheduler.close().await;
    env.cleanup().await;
}
