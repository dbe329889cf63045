//! Reading a queue through a consumer while holding what was read unacked:
//! `parked list`, `parked replay` and the look `status` takes at the parked
//! queue's oldest message.
//!
//! A consumer, not `basic.get`. When the node of the channel goes away,
//! RabbitMQ gives back what a consumer held: when the channel closes, or a
//! quorum queue's `x-consumer-disconnected-timeout` after the node is seen
//! gone. A message a `basic.get` had taken, RabbitMQ 4.3.6 kept
//! unacknowledged for good instead (3 runs in 36 of the cluster test
//! `parked_replay_carries_on_when_its_node_dies`, before this module).
//!
//! What the caller holds counts against the consumer's prefetch, so a
//! consumer that holds its whole window is cancelled (what it holds stays
//! held by the channel) and a new one takes over: any number can be held.
//! The sweep ends when no message came for [`IDLE`] and a passive declare
//! finds none ready; not before `settle_by`, which a caller that lost a node
//! sets to when the broker will have given back what that node's channel
//! held.

use std::time::{Duration, Instant};

use futures::StreamExt;
use lapin::message::Delivery;
use lapin::options::{BasicCancelOptions, BasicConsumeOptions, BasicQosOptions};
use lapin::types::FieldTable;
use lapin::{Channel, Consumer};

use super::admin::{Admin, OpsError};
use crate::amqp::{self, AmqpError, BrokerError};

/// Without a delivery for this long, the sweep asks the queue whether it is
/// empty.
const IDLE: Duration = Duration::from_millis(500);

/// The most messages one consumer is sent before the caller settles any: the
/// prefetch. Bodies are at most `consumer.max_body_bytes` (16 KiB by default),
/// so this bounds what waits in memory to a few MiB.
pub(crate) const WINDOW: u16 = 256;

/// Why the current consumer is being cancelled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Reading,
    /// It holds its whole window: a new one follows.
    Renewing,
    /// The queue is swept: the stream ends after what was already sent.
    Ending,
}

/// One sweep of `queue` on `channel` (a channel of its own: closing it
/// returns everything held).
pub(crate) struct Sweep<'a> {
    admin: &'a mut Admin,
    channel: &'a Channel,
    queue: &'a str,
    window: u16,
    settle_by: Option<Instant>,
    consumer: Option<Consumer>,
    phase: Phase,
    /// Deliveries of the current consumer that the caller holds.
    held: u16,
    consumers: u32,
}

impl<'a> Sweep<'a> {
    /// A sweep with a prefetch of `window` (at least 1); it does not end
    /// before `settle_by`.
    pub(crate) fn new(
        admin: &'a mut Admin,
        channel: &'a Channel,
        queue: &'a str,
        window: u16,
        settle_by: Option<Instant>,
    ) -> Self {
        Self {
            admin,
            channel,
            queue,
            window: window.max(1),
            settle_by,
            consumer: None,
            phase: Phase::Reading,
            held: 0,
            consumers: 0,
        }
    }

    /// The next message in queue order; `None` once the queue is swept.
    /// Each one is the caller's to ack, or to [`Sweep::hold`].
    pub(crate) async fn next(&mut self) -> Result<Option<Delivery>, OpsError> {
        let timeout = self.admin.timeout;
        let quiet_since = Instant::now();
        loop {
            if self.phase == Phase::Reading && self.held >= self.window {
                self.cancel().await?;
                self.phase = Phase::Renewing;
            }
            let Some(consumer) = self.consumer.as_mut() else {
                self.consume().await?;
                continue;
            };
            let wait = match self.phase {
                Phase::Reading => IDLE,
                Phase::Renewing | Phase::Ending => timeout,
            };
            match tokio::time::timeout(wait, consumer.next()).await {
                Ok(Some(Ok(delivery))) => return Ok(Some(delivery)),
                Ok(Some(Err(source))) => {
                    return Err(OpsError::Broker(BrokerError::Failed {
                        what: format!("consuming {}", self.queue).into(),
                        source: AmqpError::new(source),
                    }));
                }
                // After a cancel, the stream ends once it has given what the
                // broker sent before the cancel-ok.
                Ok(None) if self.phase == Phase::Ending => return Ok(None),
                Ok(None) => {
                    self.consumer = None;
                    self.phase = Phase::Reading;
                    self.held = 0;
                }
                Err(_) if self.phase != Phase::Reading => {
                    let what = format!("the end of a consumer of {}", self.queue).into();
                    return Err(OpsError::Broker(BrokerError::Timeout { what, timeout }));
                }
                Err(_) => {
                    if self.swept(quiet_since.elapsed()).await? {
                        self.cancel().await?;
                        self.phase = Phase::Ending;
                    }
                }
            }
        }
    }

    /// The last message [`Sweep::next`] gave is kept unacked until the
    /// channel closes.
    pub(crate) fn hold(&mut self) {
        self.held = self.held.saturating_add(1);
    }

    /// Whether a queue that sent nothing for `quiet` is swept: none ready,
    /// and `settle_by` passed. Ready messages that are not sent for the
    /// admin timeout are an error (the command resumes on a new channel).
    async fn swept(&mut self, quiet: Duration) -> Result<bool, OpsError> {
        let ready = match self.admin.queue(self.queue).await? {
            Some(state) => state.messages,
            None => return Err(OpsError::Missing(self.queue.to_owned())),
        };
        if ready > 0 && quiet >= self.admin.timeout {
            let what = format!("a delivery of the {ready} ready in {}", self.queue).into();
            let timeout = self.admin.timeout;
            return Err(OpsError::Broker(BrokerError::Timeout { what, timeout }));
        }
        let settled = self.settle_by.is_none_or(|at| Instant::now() >= at);
        Ok(ready == 0 && settled)
    }

    async fn consume(&mut self) -> Result<(), OpsError> {
        let timeout = self.admin.timeout;
        let qos = self
            .channel
            .basic_qos(self.window, BasicQosOptions::default());
        amqp::bounded("basic.qos", timeout, qos).await?;
        self.consumers += 1;
        let tag = format!("order-expiry-sweep-{}", self.consumers);
        let consuming = self.channel.basic_consume(
            self.queue.into(),
            tag.as_str().into(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        );
        let what = format!("basic.consume {}", self.queue);
        self.consumer = Some(amqp::bounded(what, timeout, consuming).await?);
        Ok(())
    }

    async fn cancel(&mut self) -> Result<(), OpsError> {
        let Some(consumer) = &self.consumer else {
            return Ok(());
        };
        let cancelling = self
            .channel
            .basic_cancel(consumer.tag(), BasicCancelOptions::default());
        let what = format!("basic.cancel {}", self.queue);
        amqp::bounded(what, self.admin.timeout, cancelling).await?;
        Ok(())
    }
}
