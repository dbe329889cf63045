//! Never early by the reference clock, whatever `serve`'s own clock says.
//! `serve` runs under libfaketime with its wall clock 5 s ahead or behind;
//! this process, on the clock of the database's host, makes the orders and
//! schedules them, as an order service beside its database would. With the
//! SQL action the reference is the order database's `now()`; with the HTTP
//! action it is the order service's clock, which answers 425 to an expire
//! that comes before `due_at`. The sweeper is off: every cancel is the
//! consumer's.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use chrono::{DateTime, TimeDelta, Utc};
use order_expiry::Scheduler;
use order_expiry_testkit::{
    Endpoint, MovableClock, Proxy, Served, Subscriber, World, assert_on_time, at_ms, database,
    orders, skewed_clock, with_search_path,
};

/// How far `serve`'s clock is off, in seconds.
const SKEW_S: i64 = 5;

/// The promise: cancelled no earlier than due, and within this after, by the
/// reference clock (the offset is measured and corrected).
const BOUND: Duration = Duration::from_secs(1);

/// Orders per run, due 4-9 s after they are made.
const ORDERS: usize = 150;

/// How an order travels.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Carried {
    /// One v1 message per order.
    Alone,
    /// v2 bundles (group commit with a window of two publishes).
    Bundled,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_ahead_never_cancels_before_the_database_says_due() {
    sql_run(SKEW_S, Carried::Alone).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_ahead_never_cancels_a_bundled_order_before_the_database_says_due() {
    sql_run(SKEW_S, Carried::Bundled).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_behind_cancels_on_time_by_the_database_clock() {
    sql_run(-SKEW_S, Carried::Bundled).await;
}

/// A clock that jumps ahead between two measurements of its offset: `serve`
/// releases the orders by its now wrong corrected time, 5 s early, and the
/// cancel statement's own rule (`due_at <= now()`, the database's) refuses
/// them; they are held for the time the database says is left, not parked,
/// not retried on a backoff.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_clock_that_jumps_ahead_unmeasured_is_still_never_early() {
    let env = World::new().await;
    let clock = MovableClock::new(&env.id, 0);
    let mut vars = clock.env();
    // One measurement, at start; none while the test runs.
    vars.push((
        "ORDER_EXPIRY__CLOCK__PROBE_INTERVAL_MS",
        "600000".to_owned(),
    ));
    let served = start(&env, &vars).await;
    clock.set(SKEW_S);
    // libfaketime reads its file again within a second.
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    let orders = schedule(&env, "jump", Carried::Bundled).await;
    let figures = judge(&env, &orders).await;
    let refused = served
        .metric("order_expiry_not_due_total{clock=\"database\"}")
        .await;
    eprintln!(
        "FIGURES clock sql serve jumped +{SKEW_S} s unmeasured: {figures}; refused as not due {refused}"
    );
    assert!(refused > 0.0, "the database never refused an early cancel");
    drop(served);
    env.cleanup().await;
}

/// Whether the proxy in front of `serve`'s database resets a connection that
/// reads the database's clock.
static CUT_CLOCK_READS: AtomicBool = AtomicBool::new(true);

/// Picks the bytes of a reading of the database's clock while
/// [`CUT_CLOCK_READS`] is set.
fn clock_read(bytes: &[u8]) -> bool {
    CUT_CLOCK_READS.load(Ordering::SeqCst) && bytes.windows(15).any(|w| w == b"clock_timestamp")
}

/// `serve` 5 s behind whose first reading of the database's clock is lost
/// (its connection reset, as a database slow to answer at start is given
/// up on): until it measures, it holds orders by its own clock, 5 s late.
/// It must read the clock again soon, not a whole probe interval later (10 s
/// here: every order would be late).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_behind_whose_first_clock_reading_is_lost_is_on_time() {
    let env = World::new().await;
    let proxy = Proxy::cutting("127.0.0.1:5432".parse().expect("an address"), clock_read).await;
    let url = format!("postgres://postgres@{}/{}", proxy.addr(), database());
    let mut vars = skewed_clock(-SKEW_S);
    vars.push((
        "ORDER_EXPIRY__DATABASE__URL",
        with_search_path(&url, env.schema()),
    ));
    vars.push(("ORDER_EXPIRY__CLOCK__PROBE_INTERVAL_MS", "10000".to_owned()));
    let served = start(&env, &vars).await;
    CUT_CLOCK_READS.store(false, Ordering::SeqCst);
    assert!(
        proxy.cuts() > 0,
        "serve's first reading of the clock went through"
    );
    let orders = schedule(&env, "lost", Carried::Alone).await;
    let figures = judge(&env, &orders).await;
    eprintln!(
        "FIGURES clock sql serve -{SKEW_S} s, first reading lost: {figures}; cut {}",
        proxy.cuts()
    );
    drop(served);
    env.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_ahead_never_expires_before_the_order_service_says_due() {
    http_run(SKEW_S).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_behind_expires_on_time_by_the_order_service_clock() {
    http_run(-SKEW_S).await;
}

/// The event action has no reference clock `serve` can read: its
/// subscribers judge `due_at` by their own, as the contract asks. `serve`
/// ahead publishes every event early; the subscriber holds each until due.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_ahead_never_has_an_event_acted_on_early() {
    let env = World::new().await;
    let subscriber = Subscriber::start(&env).await;
    let mut vars = vec![
        ("ORDER_EXPIRY__ACTION__KIND", "amqp".to_owned()),
        (
            "ORDER_EXPIRY__ACTION__AMQP__EXCHANGE",
            subscriber.exchange.clone(),
        ),
    ];
    vars.extend(skewed_clock(SKEW_S));
    let served = start(&env, &vars).await;
    let orders = schedule(&env, "event", Carried::Alone).await;
    let figures = judge(&env, &orders).await;
    drop(served);
    let received = subscriber.stop(&env).await;
    eprintln!(
        "FIGURES clock event serve +{SKEW_S} s: {figures}; events {}, held by the subscriber {}",
        received.events, received.held
    );
    assert!(
        received.held > 0,
        "no event came early: serve's clock was not ahead"
    );
    env.cleanup().await;
}

/// The rest of the matrix, for `scripts/test --long` (and the book's
/// table): `serve` behind with lone orders, and no skew with lone orders,
/// with bundles and with the HTTP action, one after the other.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "long: scripts/test --long"]
async fn long_the_rest_of_the_matrix() {
    sql_run(-SKEW_S, Carried::Alone).await;
    sql_run(0, Carried::Alone).await;
    sql_run(0, Carried::Bundled).await;
    http_run(0).await;
}

/// One run of the HTTP action with `serve`'s clock `skew_s` off, against an
/// order service on the database host's clock that keeps the contract's
/// rule (425 Too Early before `due_at`).
async fn http_run(skew_s: i64) {
    let env = World::new().await;
    let service = Endpoint::order_service(env.store.clone()).await;
    let base_url = service.base_url();
    let mut vars = vec![
        ("ORDER_EXPIRY__ACTION__KIND", "http".to_owned()),
        ("ORDER_EXPIRY__ACTION__HTTP__BASE_URL", base_url),
    ];
    vars.extend(skewed_clock(skew_s));
    let served = start(&env, &vars).await;
    let orders = schedule(&env, "http", Carried::Alone).await;
    let figures = judge(&env, &orders).await;
    let too_early = service
        .requests()
        .iter()
        .filter(|r| r.kind == "expire" && r.status == Some(425))
        .count();
    let parked = env.depth(&env.ladder().parked_queue()).await;
    let offset = served
        .metric("order_expiry_clock_offset_seconds{clock=\"http\"}")
        .await;
    eprintln!(
        "FIGURES clock http serve {skew_s:+} s: {figures}; 425 answers {too_early}, parked {parked}, \
         offset {offset:+.3} s"
    );
    assert_eq!(parked, 0, "an order the service called early was parked");
    assert!(
        (offset + skew_s as f64).abs() < 0.5,
        "the offset from the order service's answers reads {offset:+.3} s, not {:+} s",
        -skew_s
    );
    drop(served);
    env.cleanup().await;
}

/// One run of the SQL action with `serve`'s clock `skew_s` off.
async fn sql_run(skew_s: i64, carried: Carried) {
    let env = World::new().await;
    let vars = skewed_clock(skew_s);
    let served = start(&env, &vars).await;
    let orders = schedule(&env, "sql", carried).await;
    let figures = judge(&env, &orders).await;
    let offset = served
        .metric("order_expiry_clock_offset_seconds{clock=\"database\"}")
        .await;
    eprintln!("FIGURES clock sql serve {skew_s:+} s {carried:?}: {figures}; offset {offset:+.3} s");
    assert!(
        (offset + skew_s as f64).abs() < 0.1,
        "serve measured its offset from the database as {offset:+.3} s, not {:+} s",
        -skew_s
    );
    drop(served);
    env.cleanup().await;
}

/// `serve` for `env` with `vars`, ready.
async fn start(env: &World, vars: &[(&str, String)]) -> Served {
    let vars: Vec<(&str, &str)> = vars.iter().map(|(k, v)| (*k, v.as_str())).collect();
    env.serve_ready(&vars).await
}

/// Makes `ORDERS` unpaid orders due 4-9 s from now and schedules them from
/// this process (the database host's clock), alone or in bundles. They fall
/// due in groups of ten a millisecond apart, so that bundles can form (a
/// bundle holds orders due within `publisher.bundle_span_ms`).
async fn schedule(env: &World, prefix: &str, carried: Carried) -> Vec<(String, DateTime<Utc>)> {
    let orders = orders(prefix, ORDERS, |i| {
        at_ms(4_000 + ((i / 10) * 10 * 5_000 / ORDERS) as i64 + (i % 10) as i64)
    });
    let mut settings = env.settings.clone();
    match carried {
        Carried::Alone => settings.publisher.bundle_max_orders = 1,
        Carried::Bundled => settings.publisher.max_in_flight = 2,
    }
    let scheduler = Scheduler::from_settings(&settings).expect("a scheduler");
    let messages = env.place_with(scheduler, &orders).await;
    match carried {
        Carried::Alone => assert_eq!(messages, ORDERS, "one message per order"),
        // 15 groups of ten make 15 messages at best; how many more depends
        // on the confirms' pace (group commit), which a loaded machine slows:
        // two orders a message on average is enough for the rule to be
        // tested on bundles.
        Carried::Bundled => assert!(
            messages <= ORDERS / 2,
            "{messages} messages for {ORDERS} orders: not bundled"
        ),
    }
    orders
}

/// Waits until every order is cancelled (at most 10 s after the last is
/// due), then asserts none lost, none early and every one within [`BOUND`],
/// each by the database's clock (`cancelled_at` against `pay_deadline`);
/// returns the figures.
async fn judge(env: &World, orders: &[(String, DateTime<Utc>)]) -> String {
    let last_due = orders.iter().map(|(_, at)| *at).max().expect("orders");
    let limit = (last_due - Utc::now() + TimeDelta::seconds(10)).to_std();
    let rows = env.wait_cancelled(orders, limit.unwrap_or_default()).await;
    let lateness = assert_on_time(orders, &rows, BOUND);
    format!(
        "{} orders, early 0, lost 0, lateness {lateness}",
        orders.len()
    )
}
