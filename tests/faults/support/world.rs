//! A fault test's world: the shared isolated world of `order_expiry_testkit`
//! (its `serve` logs kept per scenario), built once the services are up.

use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use order_expiry::publisher::ExpiryMessage;
use order_expiry_testkit::{Figures, Ledger, Served, World, WorldBuilder, message};

use super::*;

/// Makes sure the broker and the database run (an earlier test may have left
/// them down), then builds the world; `name` labels its logs.
pub async fn world(name: &str) -> World {
    build(name, World::builder()).await
}

/// A world from `builder` (more ladder levels, another database...).
pub async fn build(name: &str, builder: WorldBuilder) -> World {
    ensure_broker_up();
    ensure_database_up();
    let world = builder.scenario("faults", name).build().await;
    world.expect("a test world")
}

/// `serve`'s count of the messages whose orders it cancelled.
pub const CANCELLED: &str = "order_expiry_messages_total{outcome=\"cancelled\"}";
/// `serve`'s count of the messages whose orders were no longer unpaid.
pub const NOT_UNPAID: &str = "order_expiry_messages_total{outcome=\"not_unpaid\"}";

/// Settings of a `serve` whose cancel statement waits for row locks instead of
/// skipping them (the default skips): for the tests that need a cancel stuck in
/// the database. `lock_timeout_ms` 4.5 s keeps it waiting until the statement
/// timeout (5 s) is near.
pub const WAITING_CANCEL: [(&str, &str); 2] = [
    (
        "ORDER_EXPIRY__DATABASE__CANCEL_SQL",
        "UPDATE orders SET status = 'cancelled', cancelled_at = now() \
         WHERE id = ANY($1) AND status = 'unpaid' RETURNING id",
    ),
    ("ORDER_EXPIRY__DATABASE__LOCK_TIMEOUT_MS", "4500"),
];

/// Messages for `orders`.
pub fn messages(orders: &[(String, DateTime<Utc>)]) -> Vec<ExpiryMessage> {
    orders.iter().map(|(id, at)| message(id, *at)).collect()
}

/// `n` unpaid orders `<prefix>-<i>`, order `i` due `due_ms(i)` ms from now.
pub fn orders(prefix: &str, n: usize, due_ms: impl Fn(i64) -> i64) -> Vec<(String, DateTime<Utc>)> {
    order_expiry_testkit::orders(prefix, n, |i| at_ms(due_ms(i as i64)))
}

/// The ids of `orders`.
pub fn ids(orders: &[(String, DateTime<Utc>)]) -> Vec<&str> {
    orders.iter().map(|(id, _)| id.as_str()).collect()
}

/// A next `serve` (with `env`) settles `ledger` within 30 s: the invariants,
/// nothing swept, the due queue empty.
pub async fn next_consumer_finishes(
    world: &World,
    env: &[(&str, &str)],
    ledger: &Ledger,
) -> (Served, Figures) {
    let next = world.serve(env).await;
    let figures = settle(world, ledger, Duration::from_secs(30)).await;
    figures.assert_invariants();
    next.assert_nothing_swept().await;
    assert_eq!(world.depth(&world.ladder().due_queue()).await, 0);
    (next, figures)
}

/// `kill -9` of `served`; its exit status (within 5 s).
pub async fn kill_9(served: &mut Served) -> std::process::ExitStatus {
    served.signal("-KILL");
    let exited = served.wait_exit(Duration::from_secs(5)).await;
    exited.expect("serve killed")
}

/// `/readyz` never said 200 from `from` (its 503) until `to` (the restore):
/// not while `what` was down.
pub fn assert_not_ready(watch: &ReadyWatch, from: Instant, to: Instant, what: &str) {
    let during = watch.between(from, to);
    assert!(
        during.iter().all(|s| *s != 200),
        "/readyz said 200 while {what} was down: {during:?}"
    );
}
