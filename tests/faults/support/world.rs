//! A fault test's world: the shared isolated world of `order_expiry_testkit`
//! (its `serve` logs kept per scenario), plus what only the fault tests need:
//! the services up first, row locks and a report of where messages are.

use std::ops::Deref;

use chrono::{DateTime, Utc};
use lapin::options::BasicGetOptions;
use order_expiry::{publisher::DueMessage, publisher::ExpiryMessage};
use order_expiry_testkit::{message, vhost};

use super::*;

/// One scenario's world; derefs to the shared [`order_expiry_testkit::World`].
pub struct World {
    world: order_expiry_testkit::World,
}

impl Deref for World {
    type Target = order_expiry_testkit::World;

    fn deref(&self) -> &Self::Target {
        &self.world
    }
}

impl World {
    /// Makes sure the broker and the database run (an earlier test may have
    /// left them down), then builds the world; `name` labels its logs.
    pub async fn new(name: &'static str) -> Self {
        Self::build(name, order_expiry_testkit::World::builder()).await
    }

    /// A world whose orders live in the database of `url` (the failover
    /// pair's, [`order_expiry_testkit::pg_pair::url`]) instead of the test
    /// database.
    pub async fn on_database(name: &'static str, url: &str) -> Self {
        Self::build(
            name,
            order_expiry_testkit::World::builder().database_url(url),
        )
        .await
    }

    async fn build(name: &'static str, builder: order_expiry_testkit::WorldBuilder) -> Self {
        ensure_broker_up();
        ensure_database_up();
        let world = builder.scenario("faults", name).build().await;
        Self {
            world: world.expect("a test world"),
        }
    }

    /// Opens a transaction holding the row locks of `ids`: a cancel statement
    /// touching any of them blocks until [`RowLock::release`].
    pub async fn lock_rows(&self, ids: &[&str]) -> RowLock {
        let client = self.connect().await.expect("locking connection");
        client.batch_execute("BEGIN").await.expect("begin");
        client
            .execute(
                "SELECT 1 FROM orders WHERE id = ANY($1) FOR UPDATE",
                &[&ids],
            )
            .await
            .expect("lock rows");
        RowLock { client }
    }

    /// This world's non-empty queues as `name ready/unacked`, from `rabbitmqctl`.
    pub fn queue_report(&self) -> String {
        let prefix = format!("{}.", self.settings.topology.prefix);
        let vhost = vhost();
        let args = ["-q", "list_queues", "-p", &vhost, "--no-table-headers"];
        let fields = ["name", "messages_ready", "messages_unacknowledged"];
        let listing = run("rabbitmqctl", &[&args[..], &fields[..]].concat()).unwrap_or_else(|e| e);
        let queues: Vec<String> = listing
            .lines()
            .filter_map(|line| {
                let mut fields = line.split_whitespace();
                let name = fields.next()?.strip_prefix(&prefix)?;
                let (ready, unacked) = (fields.next()?, fields.next()?);
                (ready != "0" || unacked != "0").then(|| format!("{name} {ready}/{unacked}"))
            })
            .collect();
        if queues.is_empty() {
            "all empty".into()
        } else {
            queues.join(", ")
        }
    }

    /// The order ids of the messages ready for the next consumer, in the due
    /// queue and its catch-up queue, left there: they are fetched unacked and
    /// returned when the channel closes.
    pub async fn due_ids(&self) -> Vec<String> {
        let channel = self.open_channel().await;
        let ladder = self.ladder();
        let mut ids = Vec::new();
        // What waited in the due queue longer than topology.catch_up_after_ms
        // (counted from when it was first enqueued, so also a message a
        // consumer held and handed back) is in the catch-up queue.
        for queue in [ladder.due_queue(), ladder.catch_up_queue()] {
            let get =
                || channel.basic_get(queue.as_str().into(), BasicGetOptions { no_ack: false });
            while let Some(message) = get().await.expect("basic.get") {
                let decoded = DueMessage::decode(&message.delivery.data, None, 1 << 20)
                    .expect("a well-formed message in the due queue");
                ids.extend(decoded.messages().map(|m| m.order_id.to_string()));
            }
        }
        let _ = channel.close(200, "requeue".into()).await;
        ids
    }

    /// Deletes this test's queues, exchanges and schema (best effort), and its
    /// logs unless `FAULTS_KEEP_LOGS` is set.
    pub async fn cleanup(self) {
        self.world.cleanup().await;
    }
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

/// Row locks held open by a test ([`World::lock_rows`]).
pub struct RowLock {
    client: tokio_postgres::Client,
}

impl RowLock {
    /// Statements of the service (application `order-expiry`) waiting on a row
    /// lock in the test database now.
    pub async fn blocked(&self) -> i64 {
        self.client
            .query_one(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() \
                 AND application_name = 'order-expiry' AND wait_event_type = 'Lock'",
                &[],
            )
            .await
            .expect("pg_stat_activity")
            .get(0)
    }

    /// Commits: the blocked statements go on.
    pub async fn release(self) {
        self.client.batch_execute("COMMIT").await.expect("commit");
    }
}

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
