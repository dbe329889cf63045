//! What the fault tests look at in a world while a fault goes on: row locks a
//! test holds so that cancels wait ([`World::lock_rows`]), the due messages
//! left for the next consumer ([`World::due_ids`]) and where this world's
//! messages are ([`World::queue_report`]).

use lapin::options::BasicGetOptions;
use order_expiry::publisher::DueMessage;

use crate::services::{self, try_rabbitmqctl};
use crate::world::World;

impl World {
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
        let vhost = services::vhost();
        let args = ["-q", "list_queues", "-p", &vhost, "--no-table-headers"];
        let fields = ["name", "messages_ready", "messages_unacknowledged"];
        let listing = try_rabbitmqctl(&[&args[..], &fields].concat()).unwrap_or_else(|e| e);
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
}

/// Row locks held open by a test ([`World::lock_rows`]).
#[derive(Debug)]
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
