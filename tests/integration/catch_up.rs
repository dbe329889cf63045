//! Catching up after an outage: what no consumer took in time moves from the
//! due queue to the catch-up queue (the due queue's message TTL), so the due
//! queue keeps only what is due now. The consumer takes what is due now
//! first, and drains the backlog beside it at `consumer.catch_up_rate`; the
//! HTTP action never sends the order service more than
//! `action.http.max_rps` a second, however large the backlog.

use std::collections::HashMap;
use std::panic::AssertUnwindSafe;
use std::time::Duration;

use chrono::{DateTime, Utc};
use futures::FutureExt as _;
use order_expiry::settings::ActionKind;
use order_expiry_testkit::{
    Endpoint, OrderRow, World, assert_on_time, at_ms, bundle, busiest_second, eventually, json,
    message, orders,
};

/// What no consumer takes within this moves to the catch-up queue.
const AFTER: Duration = Duration::from_secs(1);

/// Orders due now are cancelled within this of their due time, backlog or not.
const BOUND: Duration = Duration::from_secs(1);

/// The most orders any one-second window may see started: the rate, a tenth
/// saved up, and the rest of one bundle past the rate.
fn most_in_a_second(rate: usize, bundle: usize) -> usize {
    rate + rate / 10 + bundle
}

/// A world whose due queue moves what no consumer took within [`AFTER`] to
/// its catch-up queue, with 8 ladder levels (up to 255 s): the full-size
/// order-service outage schedules orders 150 s ahead.
async fn world() -> World {
    let world = World::builder().catch_up_after(AFTER).levels(8).build();
    world.await.expect("a world")
}

/// Publishes `n` overdue orders straight into the due queue, in bundles of
/// 100, and waits until the due queue's TTL has moved them all to the
/// catch-up queue (nothing consumes yet).
async fn a_backlog(env: &World, prefix: &str, n: usize) -> Vec<(String, DateTime<Utc>)> {
    let overdue = orders(prefix, n, |_| at_ms(-60_000));
    env.create_orders(&overdue).await;
    for chunk in overdue.chunks(100) {
        let messages: Vec<_> = chunk.iter().map(|(id, at)| message(id, *at)).collect();
        env.publish_due(&bundle(&messages), json()).await;
    }
    let (due, catch_up) = (env.ladder().due_queue(), env.ladder().catch_up_queue());
    let moved = async || env.depth(&catch_up).await >= n.div_ceil(100) as u32;
    eventually(Duration::from_secs(15), "the backlog moved", moved).await;
    assert_eq!(env.depth(&due).await, 0);
    overdue
}

/// The cancel times of `orders` in `rows`.
fn cancel_times(
    orders: &[(String, DateTime<Utc>)],
    rows: &HashMap<String, OrderRow>,
) -> Vec<DateTime<Utc>> {
    orders
        .iter()
        .filter_map(|(id, _)| rows.get(id)?.cancelled_at)
        .collect()
}

/// `serve` was down: 2,000 orders are overdue in the catch-up queue when it
/// starts. The orders that fall due meanwhile are cancelled on time, and
/// the backlog drains at its rate, never faster.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn orders_due_now_come_before_the_backlog_which_drains_at_its_rate() {
    // backlog 2,000, then 200 due 15 ms apart, the backlog at 400 a second
    startup(2_000, 200, 15, 400).await;
}

/// The full size, a benchmark for a quiet machine (run by hand:
/// `cargo test --release -p order-expiry --test integration full_size_ --
/// --ignored --nocapture`): 100,000 overdue at the default rate (2,000 a
/// second), 1,000 orders a second falling due for the minute it takes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "benchmark: 160,000 orders, for a quiet machine (not in scripts/test --long)"]
async fn full_size_100_000_overdue_at_start_up() {
    // backlog 100,000, then 60,000 due 1 ms apart, the backlog at 2,000 a second
    startup(100_000, 60_000, 1, 2_000).await;
}

/// One start-up run: `backlog` orders overdue in the catch-up queue when the
/// consumer starts; `fresh` orders falling due meanwhile, from 1 s after the
/// start, `every_ms` apart; `consumer.catch_up_rate` at `rate`.
async fn startup(backlog: usize, fresh: usize, every_ms: i64, rate: usize) {
    let env = world().await;
    let overdue = a_backlog(&env, "backlog", backlog).await;
    let mut settings = env.settings.clone();
    settings.consumer.catch_up_rate = rate as u32;
    let consumer = env.start_consumer_with(&settings);
    let due_now = orders("now", fresh, |i| at_ms(1_000 + i as i64 * every_ms));
    env.place(&due_now).await;
    let last_due = Duration::from_millis((fresh as i64 * every_ms) as u64);
    let limit = last_due + Duration::from_secs(20);
    let rows = env.wait_cancelled(&due_now, limit).await;
    let fresh_cancelled = cancel_times(&due_now, &rows);
    let floor = (backlog - most_in_a_second(rate, 100)) as f64 / rate as f64;
    let drain_limit = Duration::from_secs_f64(floor * 2.0 + 30.0);
    let rows = env.wait_cancelled(&overdue, drain_limit).await;
    let mut drained = cancel_times(&overdue, &rows);
    let lateness = assert_on_time(&due_now, &rows, BOUND);
    let (first, last) = (drained.iter().min().copied(), drained.iter().max().copied());
    let span = (last.unwrap() - first.unwrap()).num_milliseconds() as f64 / 1e3;
    let busiest = busiest_second(&mut drained);
    eprintln!(
        "FIGURES catch-up: {backlog} overdue at start drained in {span:.1} s at {rate}/s \
         (busiest second {busiest}); {fresh} due meanwhile: lateness {lateness}, \
         the last one cancelled {:.1} s before the backlog was done",
        (last.unwrap() - *fresh_cancelled.iter().max().unwrap()).num_milliseconds() as f64 / 1e3
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
    env.cleanup().await;
}

/// The order service is down while 300 orders fall due; when it is back it
/// gets them at `action.http.max_rps`, never faster, each cancelled once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_order_service_back_from_an_outage_gets_at_most_its_rate() {
    // 300 orders 5 ms apart, the service down 4 s, max_rps 100, catch-up 1,000/s
    order_service_outage(300, 5, Duration::from_secs(4), 100, 1_000).await;
}

/// The full size, a benchmark for a quiet machine (run by hand, as
/// above): the order service down 2 minutes while 1,000 orders a second fall
/// due, then 30 s more. Its `max_rps` must exceed the rate orders fall due
/// at, or the backlog never drains: 2,000 here, the backlog at 1,000.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "benchmark: 150,000 orders, for a quiet machine (not in scripts/test --long)"]
async fn full_size_order_service_down_2_min_at_1000_a_second() {
    // 150,000 orders 1 ms apart, down 120 s, max_rps 2,000, catch-up 1,000/s
    order_service_outage(150_000, 1, Duration::from_secs(120), 2_000, 1_000).await;
}

/// One outage: `count` orders falling due from 200 ms on, `every_ms` apart;
/// the order service down for `down` from the start; `action.http.max_rps`
/// at `rps` and `consumer.catch_up_rate` at `rate`.
async fn order_service_outage(count: usize, every_ms: i64, down: Duration, rps: usize, rate: u32) {
    let env = world().await;
    let port = order_expiry_testkit::free_port();
    let mut settings = env.settings.clone();
    settings.action.kind = ActionKind::Http;
    settings.action.http.base_url = format!("http://127.0.0.1:{port}");
    settings.action.http.timeout = Duration::from_millis(500);
    settings.action.http.max_rps = rps as u32;
    settings.consumer.catch_up_rate = rate;
    let consumer = env.start_consumer_with(&settings);
    let orders = orders("down", count, |i| at_ms(200 + i as i64 * every_ms));
    env.place(&orders).await;
    tokio::time::sleep(down).await;
    let service = Endpoint::order_service_on(env.store.clone(), port).await;
    let back = Utc::now();
    let span = Duration::from_millis((count as i64 * every_ms) as u64);
    let drain = Duration::from_secs_f64(count as f64 / rps as f64 * 2.0);
    let waiting = env.wait_cancelled(&orders, span + drain + Duration::from_secs(30));
    if let Err(why) = AssertUnwindSafe(waiting).catch_unwind().await {
        let why = why
            .downcast_ref::<String>()
            .map_or("(no message)", String::as_str);
        panic!("{why}\n{}", where_they_are(&env, &service, back).await);
    }

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
    env.cleanup().await;
}

/// Where the orders not cancelled are, for a failure's message: what the
/// order service saw of each (ms after it came back, status) and what the
/// world's queues hold.
async fn where_they_are(env: &World, service: &Endpoint, back: DateTime<Utc>) -> String {
    let rows = env.orders().await.unwrap_or_default();
    let mut text = String::new();
    let stuck = rows.iter().filter(|(_, r)| r.status != "cancelled");
    for (id, row) in stuck.take(5) {
        let seen: Vec<_> = service
            .requests_for("expire", id)
            .iter()
            .map(|r| ((r.at - back).num_milliseconds(), r.status))
            .collect();
        text += &format!(
            "{id}: due {}, requests (ms after back, status) {seen:?}\n",
            row.pay_deadline
        );
    }
    let ladder = env.ladder();
    for queue in [
        ladder.due_queue(),
        ladder.catch_up_queue(),
        ladder.parked_queue(),
    ] {
        text += &format!("{queue}: {} ready\n", env.depth(&queue).await);
    }
    text + &format!(
        "ladder, due queue included: {} ready",
        env.ladder_depth(None).await
    )
}
