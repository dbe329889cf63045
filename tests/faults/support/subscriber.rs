//! An event-driven order service for the event action (`action.kind = amqp`):
//! it subscribes to `order.expired` on an exchange of its own and cancels each
//! order in its own table with the contract's atomic statement and deadline
//! rule, then acks, as a real subscriber would. Its queue is a durable quorum
//! queue, so events confirmed before a broker restart survive it, and it
//! reconnects on its own (every 200 ms) while the broker is away. A lost or
//! unrouted event leaves its order unpaid, and the test's audit fails.

use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use futures::StreamExt;
use lapin::options::{
    BasicAckOptions, BasicConsumeOptions, BasicQosOptions, ExchangeDeclareOptions,
    QueueBindOptions, QueueDeclareOptions, QueueDeleteOptions,
};
use lapin::types::{AMQPValue, FieldTable};
use lapin::{Connection, ExchangeKind};
use order_expiry::service::PgOrderStore;
use secrecy::ExposeSecret;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use super::World;

/// What the subscriber did.
#[derive(Debug, Default, Clone, Copy)]
pub struct Received {
    /// Events acked.
    pub events: u64,
    /// Orders its statement cancelled (an event of an order not unpaid, or a
    /// duplicate, cancels nothing).
    pub cancelled: u64,
    /// Times it connected again after losing the broker.
    pub reconnects: u64,
}

/// The running subscriber; [`Subscriber::stop`] ends it.
pub struct Subscriber {
    /// The exchange the event action publishes to (`action.amqp.exchange`).
    pub exchange: String,
    queue: String,
    stop: CancellationToken,
    task: JoinHandle<Received>,
}

impl Subscriber {
    /// Declares `P.events` (topic) and the quorum queue `P.expired-events`
    /// bound to it for `order.expired`, then consumes it.
    pub async fn start(world: &World) -> Self {
        let prefix = &world.settings.topology.prefix;
        let exchange = format!("{prefix}.events");
        let queue = format!("{prefix}.expired-events");
        let channel = world.channel().await;
        let durable = ExchangeDeclareOptions {
            durable: true,
            ..Default::default()
        };
        channel
            .exchange_declare(
                exchange.as_str().into(),
                ExchangeKind::Topic,
                durable,
                FieldTable::default(),
            )
            .await
            .expect("the events exchange");
        let mut quorum = FieldTable::default();
        quorum.insert(
            "x-queue-type".into(),
            AMQPValue::LongString("quorum".into()),
        );
        let durable = QueueDeclareOptions {
            durable: true,
            ..Default::default()
        };
        channel
            .queue_declare(queue.as_str().into(), durable, quorum)
            .await
            .expect("the subscriber's queue");
        channel
            .queue_bind(
                queue.as_str().into(),
                exchange.as_str().into(),
                "order.expired".into(),
                QueueBindOptions::default(),
                FieldTable::default(),
            )
            .await
            .expect("its binding");
        let url = world.settings.amqp.url.expose_secret().to_owned();
        let stop = CancellationToken::new();
        let task = tokio::spawn(subscribe(
            url,
            queue.clone(),
            Arc::clone(&world.store),
            stop.clone(),
        ));
        Self {
            exchange,
            queue,
            stop,
            task,
        }
    }

    /// Stops consuming, deletes its queue and exchange, and says what it did.
    pub async fn stop(self, world: &World) -> Received {
        self.stop.cancel();
        let received = self.task.await.expect("the subscriber");
        let channel = world.channel().await;
        let _ = channel
            .queue_delete(self.queue.as_str().into(), QueueDeleteOptions::default())
            .await;
        let _ = channel
            .exchange_delete(self.exchange.as_str().into(), Default::default())
            .await;
        received
    }
}

async fn subscribe(
    url: String,
    queue: String,
    store: Arc<PgOrderStore>,
    stop: CancellationToken,
) -> Received {
    let mut received = Received::default();
    let mut connected_before = false;
    while !stop.is_cancelled() {
        match consume(&url, &queue, &store, &stop, &mut received, connected_before).await {
            Ok(()) => break,
            Err(lost) => {
                connected_before |= lost.connected;
                tokio::select! {
                    () = stop.cancelled() => break,
                    () = tokio::time::sleep(Duration::from_millis(200)) => {}
                }
            }
        }
    }
    received
}

/// Why a session ended, and whether it had connected at all.
struct Lost {
    connected: bool,
}

/// One session: connect, consume, and for each event cancel, then ack. Ends
/// with `Ok` when stopped, and on any broker or database error (an unacked
/// event comes back with the next session).
async fn consume(
    url: &str,
    queue: &str,
    store: &PgOrderStore,
    stop: &CancellationToken,
    received: &mut Received,
    connected_before: bool,
) -> Result<(), Lost> {
    let not_connected = |_| Lost { connected: false };
    let connection = Connection::connect(url, Default::default())
        .await
        .map_err(not_connected)?;
    let lost = |_| Lost { connected: true };
    if connected_before {
        received.reconnects += 1;
    }
    let channel = connection.create_channel().await.map_err(lost)?;
    channel
        .basic_qos(200, BasicQosOptions::default())
        .await
        .map_err(lost)?;
    let mut deliveries = channel
        .basic_consume(
            queue.into(),
            "expired-events-subscriber".into(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await
        .map_err(lost)?;
    loop {
        let delivery = tokio::select! {
            () = stop.cancelled() => {
                let _ = connection.close(200, "done".into()).await;
                return Ok(());
            }
            next = deliveries.next() => match next {
                Some(Ok(delivery)) => delivery,
                Some(Err(_)) | None => return Err(Lost { connected: true }),
            },
        };
        let (order_id, due_at) = event(&delivery.data);
        let client = store.client().await.map_err(|_| Lost { connected: true })?;
        let cancelled = client
            .query_opt(
                "UPDATE orders SET status = 'cancelled', cancelled_at = now() \
                 WHERE id = $1 AND status = 'unpaid' \
                 AND (pay_deadline IS NULL OR pay_deadline <= $2) RETURNING id",
                &[&order_id, &due_at],
            )
            .await
            .map_err(|_| Lost { connected: true })?;
        // Counted when it commits: an ack lost with the broker brings the
        // event back, and the second time it cancels nothing.
        received.cancelled += u64::from(cancelled.is_some());
        delivery
            .acker
            .ack(BasicAckOptions::default())
            .await
            .map_err(lost)?;
        received.events += 1;
    }
}

/// The order and deadline of an `order.expired` event; the event action
/// sends nothing else, so anything else fails the test.
fn event(body: &[u8]) -> (String, DateTime<Utc>) {
    let event: serde_json::Value = serde_json::from_slice(body).expect("an event is JSON");
    let order_id = event["order_id"].as_str().expect("order_id").to_owned();
    let due_at = event["due_at"]
        .as_str()
        .and_then(|s| s.parse().ok())
        .expect("due_at, RFC 3339");
    (order_id, due_at)
}
