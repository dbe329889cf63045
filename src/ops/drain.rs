//! One old queue drained into the current broker at speed: a `basic.consume`
//! with a prefetch window, each message republished at once without waiting
//! for its confirm, a window of confirms outstanding, and the old messages
//! acked (one multiple-ack) only once every republish up to them is
//! confirmed. An interruption leaves the unconfirmed ones unacked in the old
//! queue (the broker returns them when the channel closes): duplicates at
//! worst, never a loss.
//!
//! A delivery on one channel carries a tag one higher than the one before,
//! and the window is settled oldest first, so when the oldest half of it is
//! confirmed, a multiple-ack of the newest of them acks exactly those.

use std::collections::VecDeque;
use std::time::Duration;

use futures::StreamExt;
use lapin::message::Delivery;
use lapin::options::{BasicAckOptions, BasicCancelOptions, BasicConsumeOptions, BasicQosOptions};
use lapin::types::{AMQPValue, FieldTable};
use lapin::{BasicProperties, Channel};

use super::admin::OpsError;
use super::ladder_migrate::LadderMigrationReport;
use super::republish::{Republisher, taken};
use crate::amqp::{self, AmqpError, BrokerError, Confirming};
use crate::publisher::TraceContext;

/// Messages taken from an old queue and not yet confirmed in the new broker:
/// the prefetch and the confirm window. Both brokers stay busy (the move is
/// paced by them, not by round trips), and a crash returns at most this many
/// as duplicates.
pub(crate) const WINDOW: u16 = 1024;

/// With fewer messages than the queue reported (another consumer, the old
/// `serve`, took some), the drain ends after this long without a delivery;
/// the next pass takes what came later.
const IDLE: Duration = Duration::from_millis(500);

/// What an old queue holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Carry {
    /// Expiry messages (a holding queue or the due queue): into the ladder.
    Orders,
    /// Parked messages: into the current parked queue as they are, headers
    /// (`x-parked-reason`) and all.
    Parked,
}

/// Where one republished message went, counted once it is confirmed.
#[derive(Debug, Clone, Copy)]
enum Moved {
    Ladder,
    Due,
    Malformed,
    Parked,
}

/// A republish whose confirm is outstanding, and the old message's tag.
struct InFlight {
    tag: u64,
    confirm: Confirming,
    exchange: String,
    what: String,
    moved: Moved,
}

/// Drains old queues on one channel of the old broker into `republisher`'s.
pub(crate) struct QueueDrain<'a> {
    /// A channel of the old broker's of its own: closing it returns what it
    /// took and did not ack.
    pub(crate) channel: Channel,
    /// The current broker's confirm channel and ladder.
    pub(crate) republisher: &'a Republisher,
}

impl QueueDrain<'_> {
    /// Moves what `queue` holds now (`expected`, as a passive declare saw
    /// it), counting into `report`; how many messages it took.
    pub(crate) async fn run(
        &self,
        queue: &str,
        expected: u32,
        carry: Carry,
        report: &mut LadderMigrationReport,
    ) -> Result<u64, OpsError> {
        let timeout = self.republisher.timeout;
        let qos = self.channel.basic_qos(WINDOW, BasicQosOptions::default());
        amqp::bounded("basic.qos", timeout, qos).await?;
        let consuming = self.channel.basic_consume(
            queue.into(),
            "order-expiry-ladder-migrate".into(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        );
        let mut consumer =
            amqp::bounded(format!("basic.consume {queue}"), timeout, consuming).await?;
        let mut pending = VecDeque::with_capacity(usize::from(WINDOW));
        let mut received = 0u64;
        let mut cancelled = false;
        loop {
            if !cancelled && received >= u64::from(expected) {
                self.cancel(&consumer, queue).await?;
                cancelled = true;
            }
            // After the cancel, the stream yields what was already delivered,
            // then ends.
            let wait = if cancelled { timeout } else { IDLE };
            let delivery = match tokio::time::timeout(wait, consumer.next()).await {
                Err(_) if !cancelled => {
                    self.cancel(&consumer, queue).await?;
                    cancelled = true;
                    continue;
                }
                Err(_) => {
                    return Err(OpsError::Broker(BrokerError::Timeout {
                        what: format!("the end of the consumer of {queue}").into(),
                        timeout,
                    }));
                }
                Ok(None) => break,
                Ok(Some(Err(source))) => {
                    let what = format!("consuming {queue}").into();
                    return Err(OpsError::Broker(BrokerError::Failed {
                        what,
                        source: AmqpError::new(source),
                    }));
                }
                Ok(Some(Ok(delivery))) => delivery,
            };
            received += 1;
            pending.push_back(self.send(delivery, queue, carry)?);
            if pending.len() >= usize::from(WINDOW) {
                self.settle(&mut pending, usize::from(WINDOW / 2), report)
                    .await?;
            }
        }
        let all = pending.len();
        self.settle(&mut pending, all, report).await?;
        Ok(received)
    }

    async fn cancel(&self, consumer: &lapin::Consumer, queue: &str) -> Result<(), OpsError> {
        let cancelling = self
            .channel
            .basic_cancel(consumer.tag(), BasicCancelOptions::default());
        let what = format!("basic.cancel {queue}");
        amqp::bounded(what, self.republisher.timeout, cancelling).await?;
        Ok(())
    }

    /// Publishes `delivery`'s message into the current broker, not waiting
    /// for the confirm.
    fn send(&self, delivery: Delivery, queue: &str, carry: Carry) -> Result<InFlight, OpsError> {
        let republisher = self.republisher;
        let decoded = match carry {
            Carry::Orders => Some(republisher.decode(&delivery)),
            Carry::Parked => None,
        };
        let parked = republisher.ladder.parked_exchange();
        let (exchange, what, moved, confirm) = match decoded {
            Some(Ok(messages)) => {
                let (outgoing, what) = republisher.outgoing(&delivery, &messages)?;
                let moved = match outgoing.route.exchange == republisher.ladder.due_exchange() {
                    true => Moved::Due,
                    false => Moved::Ladder,
                };
                let confirm = outgoing.publish(&republisher.confirm);
                (outgoing.route.exchange, what, moved, confirm)
            }
            Some(Err(malformed)) => {
                let reason = format!("ladder migrate from {queue}: {malformed}");
                let properties = parked_properties(&delivery, &reason);
                let confirm = self.publish_raw(&parked, &delivery.data, properties);
                let what = format!("a malformed message from {queue}, to {parked}");
                (parked, what, Moved::Malformed, confirm)
            }
            None => {
                let properties = delivery.properties.clone();
                let confirm = self.publish_raw(&parked, &delivery.data, properties);
                let what = format!("a parked message from {queue}, to {parked}");
                (parked, what, Moved::Parked, confirm)
            }
        };
        Ok(InFlight {
            tag: delivery.delivery_tag,
            confirm,
            exchange,
            what,
            moved,
        })
    }

    fn publish_raw(&self, exchange: &str, body: &[u8], properties: BasicProperties) -> Confirming {
        let confirms = &self.republisher.confirm;
        confirms.publish(exchange, "", body.to_vec(), properties)
    }

    /// Waits for the oldest `n` confirms, then acks their old messages with
    /// one multiple-ack.
    async fn settle(
        &self,
        pending: &mut VecDeque<InFlight>,
        n: usize,
        report: &mut LadderMigrationReport,
    ) -> Result<(), OpsError> {
        let timeout = self.republisher.timeout;
        let mut last = None;
        for flight in pending.drain(..n.min(pending.len())) {
            let confirmation = amqp::bounded("publisher confirm", timeout, flight.confirm).await?;
            taken(&confirmation, &flight.exchange, &flight.what)?;
            match flight.moved {
                Moved::Ladder => report.to_ladder += 1,
                Moved::Due => report.to_due += 1,
                Moved::Malformed => report.parked += 1,
                Moved::Parked => report.parked_moved += 1,
            }
            last = Some(flight.tag);
        }
        let Some(tag) = last else { return Ok(()) };
        let acking = self
            .channel
            .basic_ack(tag, BasicAckOptions { multiple: true });
        amqp::bounded("basic.ack", timeout, acking).await?;
        Ok(())
    }
}

/// A body that is not a message, for the current parked queue with `reason`
/// (and the trace headers it came with, its only headers kept).
fn parked_properties(delivery: &Delivery, reason: &str) -> BasicProperties {
    let mut headers = FieldTable::default();
    if let Some(came) = delivery.properties.headers() {
        for name in [TraceContext::TRACEPARENT, TraceContext::TRACESTATE] {
            if let Some(value) = came.inner().get(name) {
                headers.insert(name.into(), value.clone());
            }
        }
    }
    headers.insert(
        "x-parked-reason".into(),
        AMQPValue::LongString(reason.into()),
    );
    let now = chrono::Utc::now().to_rfc3339();
    headers.insert(
        "x-parked-at".into(),
        AMQPValue::LongString(now.as_str().into()),
    );
    let mut properties = BasicProperties::default()
        .with_delivery_mode(2)
        .with_headers(headers);
    if let Some(ct) = delivery.properties.content_type() {
        properties = properties.with_content_type(ct.clone());
    }
    properties
}
