//! An event-driven order service for the event action (`action.kind = amqp`):
//! it subscribes to `order.expired` on an exchange of its own and cancels each
//! order in its own table with the contract's atomic statement, deadline rule
//! and clock rule (an event that comes before its `due_at` by the
//! subscriber's own clock, the database's `now()`, is held unacked until
//! then), then acks, as a real subscriber would. Its queue is a durable quorum
//! queue, so events confirmed before a broker restart survive it, and it
//! reconnects on its own (every 200 ms) while the broker is away. A lost or
//! unrouted event leaves its order unpaid, and the test's audit fails.

use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use futures::StreamExt;
use lapin::Connection;
use lapin::options::{
    BasicAckOptions, BasicConsumeOptions, BasicNackOptions, BasicQosOptions, QueueDeleteOptions,
};
use lapin::types::{AMQPValue, FieldTable};
use order_expiry::service::PgOrderStore;
use secrecy::ExposeSecret;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::World;
use crate::endpoint::{Expiry, expire_order};

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
    /// Times an event came before its `due_at` by this service's clock and
    /// was held until then.
    pub held: u64,
}

/// The running subscriber; [`Subscriber::stop`] ends it.
#[derive(Debug)]
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
        world.declare_exchange(&exchange).await;
        let quorum = crate::table([("x-queue-type", AMQPValue::LongString("quorum".into()))]);
        let declared = world.declare_queue(&queue, quorum).await;
        declared.expect("the subscriber's queue");
        world.bind(&queue, &exchange, "order.expired").await;
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
        world.delete_exchange(&self.exchange).await;
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

/// One session: connect, consume, and for each event, in a task of its own
/// (an event held until due holds no other), cancel, then ack. Ends with `Ok`
/// when stopped, and on any broker error; an event whose statement failed is
/// returned to the queue (an unacked event comes back with the next session).
async fn consume(
    url: &str,
    queue: &str,
    store: &Arc<PgOrderStore>,
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
    let mut handling = tokio::task::JoinSet::new();
    let ended = loop {
        let delivery = tokio::select! {
            () = stop.cancelled() => break Ok(()),
            Some(done) = handling.join_next(), if !handling.is_empty() => {
                add(received, done.unwrap_or_default());
                continue;
            }
            next = deliveries.next() => match next {
                Some(Ok(delivery)) => delivery,
                Some(Err(_)) | None => break Err(Lost { connected: true }),
            },
        };
        let (store, stop) = (Arc::clone(store), stop.clone());
        handling.spawn(async move {
            let (order_id, due_at) = event(&delivery.data);
            let mut done = Received::default();
            match expire(&store, &order_id, due_at, &stop, &mut done).await {
                Some(cancelled) => {
                    if delivery.acker.ack(BasicAckOptions::default()).await.is_ok() {
                        // Counted once acked: an ack lost with the broker
                        // brings the event back, and the second time it
                        // cancels nothing.
                        done.events += 1;
                        done.cancelled += u64::from(cancelled);
                    }
                }
                None => {
                    let requeue = BasicNackOptions {
                        requeue: true,
                        ..Default::default()
                    };
                    let _ = delivery.acker.nack(requeue).await;
                }
            }
            done
        });
    };
    // In-flight events finish (a held one wakes at stop) before the close.
    while let Some(done) = handling.join_next().await {
        add(received, done.unwrap_or_default());
    }
    let _ = connection.close(200, "done".into()).await;
    ended
}

fn add(total: &mut Received, one: Received) {
    total.events += one.events;
    total.cancelled += one.cancelled;
    total.held += one.held;
}

/// Expires the order of one event by this service's clock ([`expire_order`]);
/// an event that comes early waits until its `due_at`. `Some(cancelled)`
/// once decided, `None` when the database failed or the subscriber stopped
/// first.
async fn expire(
    store: &PgOrderStore,
    order_id: &str,
    due_at: DateTime<Utc>,
    stop: &CancellationToken,
    done: &mut Received,
) -> Option<bool> {
    loop {
        match expire_order(store, order_id, due_at).await.ok()? {
            Expiry::Cancelled => return Some(true),
            Expiry::NotUnpaid | Expiry::Unknown => return Some(false),
            Expiry::Early(due_in) => {
                done.held += 1;
                tokio::select! {
                    () = stop.cancelled() => return None,
                    () = tokio::time::sleep(due_in) => {}
                }
            }
        }
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
