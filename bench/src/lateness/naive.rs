//! The textbook design the ladder is measured against: one holding queue with
//! per-message `expiration`, dead-lettering into a due queue that the real
//! consumer reads. A message expires only at the head of the queue, so a short
//! delay behind a long one waits for it.

use lapin::options::{BasicPublishOptions, QueueDeclareOptions};
use lapin::types::{AMQPValue, FieldTable};
use lapin::{BasicProperties, Channel, Confirmation};
use order_expiry::{Settings, publisher::ExpiryMessage, topology::Topology};
use order_expiry_testkit::{message, remove_topology};

/// Settings of the naive design's due and parked queues: the world's, with
/// prefix `<prefix>-naive`.
pub(super) fn settings(world: &Settings) -> Settings {
    let mut naive = world.clone();
    naive.topology.prefix = format!("{}-naive", world.topology.prefix);
    naive
}

/// The single holding queue.
pub(super) fn hold_queue(naive: &Settings) -> String {
    format!("{}.hold", naive.topology.prefix)
}

/// Declares the due and parked queues (the consumer's part) and the holding
/// queue dead-lettering into the due exchange.
pub(super) async fn declare(channel: &Channel, naive: &Settings) -> anyhow::Result<()> {
    let ladder = naive.ladder()?;
    Topology::consumer_part(&ladder, &naive.topology)
        .apply(naive, "order-expiry-bench naive")
        .await?;
    let mut args = FieldTable::default();
    args.insert(
        "x-dead-letter-exchange".into(),
        AMQPValue::LongString(ladder.due_exchange().as_str().into()),
    );
    let hold = hold_queue(naive);
    channel
        .queue_declare(hold.as_str().into(), QueueDeclareOptions::durable(), args)
        .await?;
    Ok(())
}

/// Deletes what [`declare`] made.
pub(super) async fn remove(channel: &Channel, naive: &Settings) {
    if let Ok(ladder) = naive.ladder() {
        let topology = Topology::consumer_part(&ladder, &naive.topology);
        remove_topology(channel, &topology, naive.amqp.timeout).await;
    }
    let hold = hold_queue(naive);
    let _ = channel
        .queue_delete(hold.as_str().into(), Default::default())
        .await;
}

/// Publishes `order_id` into the holding queue with the time left as its
/// `expiration`, and waits for the confirm (`channel` is in confirm mode).
pub(super) async fn publish(
    channel: &Channel,
    naive: &Settings,
    order_id: &str,
    due_at: chrono::DateTime<chrono::Utc>,
) -> anyhow::Result<()> {
    let message = message(order_id, due_at);
    let ttl_ms = (message.due_at - chrono::Utc::now())
        .num_milliseconds()
        .max(0);
    let properties = BasicProperties::default()
        .with_content_type(ExpiryMessage::CONTENT_TYPE.into())
        .with_delivery_mode(2)
        .with_expiration(ttl_ms.to_string().as_str().into());
    let options = BasicPublishOptions {
        mandatory: true,
        ..Default::default()
    };
    let hold = hold_queue(naive);
    let confirm = channel
        .basic_publish(
            "".into(),
            hold.as_str().into(),
            options,
            &message.encode(),
            properties,
        )
        .await?
        .await?;
    match confirm {
        Confirmation::Ack(None) => Ok(()),
        other => anyhow::bail!("naive publish not confirmed: {other:?}"),
    }
}
