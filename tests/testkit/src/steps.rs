//! The steps integration tests repeat, written once: orders made and
//! scheduled ([`World::place`]), waiting until they are cancelled
//! ([`World::wait_cancelled`]), `serve` started and ready, the parked queue
//! read ([`World::parked`]), exchanges and queues declared beside the
//! world's topology.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use chrono::{DateTime, TimeDelta, Utc};
use lapin::options::{ExchangeDeclareOptions, QueueDeclareOptions};
use lapin::types::{AMQPValue, FieldTable};
use lapin::{BasicProperties, ExchangeKind};
use order_expiry::publisher::ExpiryMessage;
use order_expiry::service::{Handled, Outcome};
use order_expiry::{Scheduled, Scheduler};

use crate::ledger::{Figures, Lateness, Ledger};
use crate::served::Served;
use crate::world::{OrderRow, World};

/// `n` orders `<prefix>-<i>`, order `i` due at `due(i)` as its message
/// carries it ([`wire_due`]).
pub fn orders(
    prefix: &str,
    n: usize,
    mut due: impl FnMut(usize) -> DateTime<Utc>,
) -> Vec<(String, DateTime<Utc>)> {
    (0..n)
        .map(|i| (format!("{prefix}-{i}"), wire_due(due(i))))
        .collect()
}

/// `due_at` rounded up to the millisecond a message carries, what the
/// consumer compares against: an order due at the unrounded time could look
/// cancelled early by under a millisecond.
pub fn wire_due(due_at: DateTime<Utc>) -> DateTime<Utc> {
    crate::message("due", due_at).due_at
}

/// Persistent `application/json` properties, as the publisher sends them.
pub fn json() -> BasicProperties {
    BasicProperties::default()
        .with_content_type("application/json".into())
        .with_delivery_mode(2)
}

/// An AMQP table (headers, queue arguments) of `entries`.
pub fn table<'a>(entries: impl IntoIterator<Item = (&'a str, AMQPValue)>) -> FieldTable {
    let mut table = FieldTable::default();
    for (key, value) in entries {
        table.insert(key.into(), value);
    }
    table
}

/// How many of `handled` ended in `outcome`.
pub fn count(handled: &[Handled], outcome: Outcome) -> usize {
    handled.iter().filter(|h| h.outcome == outcome).count()
}

/// Schedules `orders` through `scheduler`, each confirmed, then closes it;
/// how many messages carry them (fewer than orders when they left in bundles).
pub async fn schedule_all(scheduler: Scheduler, orders: &[(String, DateTime<Utc>)]) -> usize {
    let mut messages = HashSet::new();
    for result in scheduler.schedule_many(orders.iter().cloned()).await {
        messages.insert(result.expect("every schedule confirmed").message_id);
    }
    scheduler.close().await;
    messages.len()
}

/// Schedules `messages` at once through `scheduler` (a window of one
/// confirm makes them leave in bundles); panics unless some were bundled.
pub async fn schedule_bundled(
    scheduler: &Scheduler,
    messages: Vec<ExpiryMessage>,
) -> Vec<Scheduled> {
    let calls = messages.into_iter().map(|m| scheduler.schedule_message(m));
    let scheduled: Vec<Scheduled> = futures::future::join_all(calls)
        .await
        .into_iter()
        .map(|r| r.expect("every schedule confirmed"))
        .collect();
    assert!(
        scheduled.iter().any(|s| s.orders_in_message > 1),
        "some orders were bundled: {scheduled:?}"
    );
    scheduled
}

/// Asserts that every order of `orders` (scheduled, none paid) is
/// cancelled in `rows`, none before its due time and each within `bound`
/// after it; their lateness.
pub fn assert_on_time(
    orders: &[(String, DateTime<Utc>)],
    rows: &HashMap<String, OrderRow>,
    bound: Duration,
) -> Lateness {
    let ledger = Ledger::scheduled(orders);
    Figures::audit(&ledger, rows, None).assert_within(bound);
    Lateness::of(&ledger, rows, |_| true)
}

/// Asserts that `late`, how long after its time something happened, is
/// neither negative (early) nor `bound` or more; `what` names it.
#[track_caller]
pub fn assert_late_within(late: TimeDelta, bound: TimeDelta, what: &str) {
    assert!(late >= TimeDelta::zero(), "{what} {late} early");
    assert!(late < bound, "{what} {late} late (bound {bound})");
}

/// Something with an order id: an id, or an `(id, due_at)` pair.
pub trait HasOrderId {
    /// The order's id.
    fn order_id(&self) -> &str;
}

impl HasOrderId for &str {
    fn order_id(&self) -> &str {
        self
    }
}

impl HasOrderId for String {
    fn order_id(&self) -> &str {
        self
    }
}

impl HasOrderId for (String, DateTime<Utc>) {
    fn order_id(&self) -> &str {
        &self.0
    }
}

/// One message taken from the parked queue.
#[derive(Debug, Clone)]
pub struct Parked {
    /// Its body, as it was published.
    pub body: Vec<u8>,
    /// Its `x-parked-reason`.
    pub reason: String,
    /// Its `message_id`, if any.
    pub message_id: Option<String>,
    /// Every header.
    pub headers: FieldTable,
}

impl World {
    /// Inserts `orders` unpaid and schedules them through the world's
    /// scheduler ([`schedule_all`]); how many messages carry them.
    pub async fn place(&self, orders: &[(String, DateTime<Utc>)]) -> usize {
        self.place_with(self.scheduler(), orders).await
    }

    /// [`World::place`] through `scheduler`.
    pub async fn place_with(
        &self,
        scheduler: Scheduler,
        orders: &[(String, DateTime<Utc>)],
    ) -> usize {
        self.create_orders(orders).await;
        schedule_all(scheduler, orders).await
    }

    /// Inserts one unpaid order due `ms` from now (negative: ago); its
    /// message, due as the table keeps it (to the microsecond).
    pub async fn create_order(&self, id: &str, ms: i64) -> ExpiryMessage {
        self.create_orders(&[(id.to_owned(), crate::at_ms(ms))])
            .await;
        crate::message(id, self.order(id).await.1)
    }

    /// Asserts that order `id` is cancelled, not before its deadline.
    pub async fn assert_cancelled_in_time(&self, id: &str) {
        let (status, deadline, cancelled_at) = self.order(id).await;
        assert_eq!(status, "cancelled", "{id}");
        let cancelled_at = cancelled_at.expect("cancelled_at set");
        assert!(
            cancelled_at >= deadline,
            "{id} cancelled before its deadline"
        );
    }

    /// Runs one statement on the world's orders table; the rows it touched.
    pub async fn execute(&self, statement: &str) -> u64 {
        let client = self.store.client().await.expect("database");
        client.execute(statement, &[]).await.expect(statement)
    }

    /// Waits until every order of `ids` is cancelled; panics after `timeout`
    /// naming some that are not. Every order row then.
    pub async fn wait_cancelled(
        &self,
        ids: &[impl HasOrderId],
        timeout: Duration,
    ) -> HashMap<String, OrderRow> {
        // Reading every row takes its time at a benchmark's size.
        let every_ms = if ids.len() > 10_000 { 1_000 } else { 100 };
        crate::poll(timeout, every_ms, || async {
            let rows = self.orders().await.unwrap_or_default();
            let cancelled = |id: &str| rows.get(id).is_some_and(|r| r.status == "cancelled");
            let left: Vec<&str> = ids
                .iter()
                .map(HasOrderId::order_id)
                .filter(|id| !cancelled(id))
                .collect();
            if left.is_empty() {
                return Ok(rows);
            }
            let some: Vec<_> = left.iter().take(10).map(|id| (id, rows.get(*id))).collect();
            Err(format!(
                "{} of {} not cancelled within {timeout:?}, e.g. {some:?}",
                left.len(),
                ids.len()
            ))
        })
        .await
    }

    /// [`World::serve`], once `/readyz` answers 200 (at most 30 s).
    pub async fn serve_ready(&self, env: &[(&str, &str)]) -> Served {
        let served = self.serve(env).await;
        served.wait_ready(Duration::from_secs(30)).await;
        served
    }

    /// Deletes `queue` with its messages, as an operator might.
    pub async fn delete_queue(&self, queue: &str) {
        let deleting = self.channel().await;
        let deleting = deleting.queue_delete(queue.into(), Default::default());
        deleting.await.expect("the queue deleted");
    }

    /// Declares the durable topic exchange `name`.
    pub async fn declare_exchange(&self, name: &str) {
        let durable = ExchangeDeclareOptions {
            durable: true,
            ..Default::default()
        };
        let channel = self.channel().await;
        let kind = ExchangeKind::Topic;
        let declaring = channel.exchange_declare(name.into(), kind, durable, FieldTable::default());
        declaring.await.expect("an exchange");
    }

    /// Deletes `exchange`, best effort.
    pub async fn delete_exchange(&self, exchange: &str) {
        let channel = self.channel().await;
        let _ = channel
            .exchange_delete(exchange.into(), Default::default())
            .await;
    }

    /// Declares the durable queue `name` with `arguments`: the broker's
    /// answer (on a channel of its own, which the broker closes on an error).
    pub async fn declare_queue(&self, name: &str, arguments: FieldTable) -> lapin::Result<()> {
        let channel = self.open_channel().await;
        let durable = QueueDeclareOptions::durable();
        let declared = channel.queue_declare(name.into(), durable, arguments).await;
        let _ = channel.close(200, "declared".into()).await;
        declared.map(drop)
    }

    /// Whether `exchange` exists (asked on a channel of its own, which the
    /// broker closes when it does not).
    pub async fn has_exchange(&self, exchange: &str) -> bool {
        let passive = ExchangeDeclareOptions {
            passive: true,
            ..Default::default()
        };
        let channel = self.open_channel().await;
        let kind = ExchangeKind::Topic;
        let declared =
            channel.exchange_declare(exchange.into(), kind, passive, FieldTable::default());
        let exists = declared.await.is_ok();
        let _ = channel.close(200, "asked".into()).await;
        exists
    }

    /// Takes every message of the world's parked queue; panics on one
    /// without its `x-parked-reason`.
    pub async fn parked(&self) -> Vec<Parked> {
        let queue = self.ladder().parked_queue();
        let mut parked = Vec::new();
        while let Some(got) = self.get(&queue).await {
            let properties = &got.delivery.properties;
            let headers = properties.headers().clone().unwrap_or_default();
            let reason = match headers.inner().get("x-parked-reason") {
                Some(AMQPValue::LongString(s)) => s.to_string(),
                other => panic!("a parked message without its reason: {other:?}"),
            };
            parked.push(Parked {
                body: got.delivery.data.clone(),
                reason,
                message_id: properties.message_id().as_ref().map(|m| m.to_string()),
                headers,
            });
        }
        parked
    }
}
