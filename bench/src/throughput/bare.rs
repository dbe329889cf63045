//! The baselines: bare lapin with no order logic. Publish persistent messages with
//! a window of pipelined confirms; consume and ack. These are what the broker
//! itself can move on this machine; order-expiry is measured against them.

use std::collections::VecDeque;

use anyhow::{Context, bail};
use futures::StreamExt;
use futures::stream::FuturesUnordered;
use lapin::options::{BasicAckOptions, BasicConsumeOptions, BasicPublishOptions, BasicQosOptions};
use lapin::types::{FieldTable, ShortString};
use lapin::{BasicProperties, Channel, Confirmation};
use tokio::time::Instant;

use order_expiry::publisher::ExpiryMessage;

/// One message to publish: exchange, routing key, body. Precomputed, so the timed
/// loop only publishes.
pub(super) type Outgoing<'a> = (&'a ShortString, &'a ShortString, &'a [u8]);

/// Publishes `messages` persistent and `mandatory`, with at most `window`
/// confirms outstanding; returns when the last one is confirmed. `channel` must be
/// in confirm mode. Any nack or return is an error.
pub(super) async fn publish<'a>(
    channel: &Channel,
    messages: impl Iterator<Item = Outgoing<'a>>,
    window: usize,
) -> anyhow::Result<()> {
    let properties = BasicProperties::default()
        .with_content_type(ExpiryMessage::CONTENT_TYPE.into())
        .with_delivery_mode(2);
    let options = BasicPublishOptions {
        mandatory: true,
        ..BasicPublishOptions::default()
    };
    let mut pending = VecDeque::with_capacity(window);
    for (exchange, routing_key, body) in messages {
        if pending.len() >= window.max(1)
            && let Some(oldest) = pending.pop_front()
        {
            confirmed(oldest).await?;
        }
        let confirm = channel
            .basic_publish(
                exchange.clone(),
                routing_key.clone(),
                options,
                body,
                properties.clone(),
            )
            .await?;
        pending.push_back(confirm);
    }
    for confirm in pending {
        confirmed(confirm).await?;
    }
    Ok(())
}

async fn confirmed(confirm: lapin::PublisherConfirm) -> anyhow::Result<()> {
    match confirm.await? {
        Confirmation::Ack(None) => Ok(()),
        Confirmation::Ack(Some(r)) => bail!("unroutable: {} {}", r.reply_code, r.reply_text),
        Confirmation::Nack(_) => bail!("broker nacked a publish"),
        Confirmation::NotRequested => bail!("channel is not in confirm mode"),
    }
}

type AckFuture = std::pin::Pin<Box<dyn Future<Output = lapin::Result<bool>> + Send>>;

/// Consumes `n` messages from `queue` with `prefetch`, acking each one as it
/// arrives (acks in flight concurrently, as any sane client does), or with
/// `multiple_every = k` one `multiple` ack per `k` deliveries; returns when the
/// first and the last ack were sent.
pub(super) async fn consume(
    channel: &Channel,
    queue: &str,
    n: usize,
    prefetch: u16,
    multiple_every: Option<usize>,
) -> anyhow::Result<(Instant, Instant)> {
    channel
        .basic_qos(prefetch, BasicQosOptions::default())
        .await?;
    let tag = format!("bench-bare-{}", uuid::Uuid::new_v4().simple());
    let mut deliveries = channel
        .basic_consume(
            queue.into(),
            tag.as_str().into(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await?;
    let mut acks = FuturesUnordered::new();
    let (mut received, mut acked) = (0usize, 0usize);
    let mut first = None;
    while acked < n {
        tokio::select! {
            Some(result) = acks.next(), if !acks.is_empty() => {
                let sent: bool = result?;
                if !sent {
                    bail!("an ack was not sent: channel closed");
                }
                acked += 1;
                first.get_or_insert_with(Instant::now);
            }
            delivery = deliveries.next(), if received < n => {
                let delivery = delivery.context("the broker ended the consumer")??;
                received += 1;
                match multiple_every {
                    None => acks.push(Box::pin(async move {
                        delivery.acker.ack(BasicAckOptions::default()).await
                    }) as AckFuture),
                    Some(k) => {
                        // Covers the k - 1 deliveries before it as well.
                        let pending = received - acked - acks.len();
                        if pending >= k.max(1) || received == n {
                            acked += pending - 1;
                            let channel = channel.clone();
                            let tag = delivery.delivery_tag;
                            acks.push(Box::pin(async move {
                                channel.basic_ack(tag, BasicAckOptions { multiple: true }).await.map(|()| true)
                            }));
                        }
                    }
                }
            }
        }
    }
    let done = Instant::now();
    let first = first.unwrap_or(done);
    channel
        .basic_cancel(tag.as_str().into(), Default::default())
        .await?;
    Ok((first, done))
}
