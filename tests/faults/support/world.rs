//! A fault test's world: the shared isolated world of `order_expiry_testkit`
//! (its `serve` logs kept per scenario), built once the services are up.

use chrono::{DateTime, Utc};
use order_expiry::publisher::ExpiryMessage;
use order_expiry_testkit::{World, WorldBuilder, message};

use super::*;

/// Makes sure the broker and the database run (an earlier test may have left
/// them down), then builds the world; `name` labels its logs.
pub async fn world(name: &str) -> World {
    build(name, World::builder()).await
}

/// A world whose orders live in the database of `url` (the failover pair's,
/// [`order_expiry_testkit::pg_pair::url`]) instead of the test database.
pub async fn world_on_database(name: &str, url: &str) -> World {
    build(name, World::builder().database_url(url)).await
}

/// A world from `builder` (more ladder levels, another database...).
pub async fn build(name: &str, builder: WorldBuilder) -> World {
    ensure_broker_up();
    ensure_database_up();
    let world = builder.scenario("faults", name).build().await;
    world.expect("a test world")
}

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

/// An unpaid order due at `due_at`, with its wire-format due time (what the
/// consumer compares against).
pub fn order(id: impl Into<String>, due_at: DateTime<Utc>) -> (String, DateTime<Utc>) {
    let id = id.into();
    let due_at = message(&id, due_at).due_at;
    (id, due_at)
}

/// Messages for `orders`.
pub fn messages(orders: &[(String, DateTime<Utc>)]) -> Vec<ExpiryMessage> {
    orders.iter().map(|(id, at)| message(id, *at)).collect()
}
