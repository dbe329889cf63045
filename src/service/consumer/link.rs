//! A session's link to the broker: its connection, the channel it consumes
//! and acks on, the delivery stream and its consumer tag, and the
//! confirm-mode channel for parks and re-queues ([`Outbound`]). Opened
//! together, re-subscribed after a repair, closed together: the one place
//! that changes any of them.

use std::time::Duration;

use futures::StreamExt;
use futures::future::BoxFuture;
use lapin::message::Delivery;
use lapin::options::{BasicAckOptions, BasicCancelOptions, BasicConsumeOptions, BasicQosOptions};
use lapin::types::FieldTable;
use lapin::{Channel, Connection};
use tracing::warn;

use super::Consumer;
use super::outbound::Outbound;
use super::session::SessionError;
use crate::amqp::{self, BrokerError, BrokerNode, TlsFiles};
use crate::service::CONSUMER;
use crate::topology::{KeptQueue, Ladder, Topology};

/// One broker connection and what a session uses of it.
pub(super) struct Link {
    connection: Connection,
    /// Consumes the due queue and the catch-up queue; deliveries of both are
    /// acked on it (one sequence of delivery tags).
    channel: Channel,
    deliveries: lapin::Consumer,
    tag: String,
    /// The catch-up queue's deliveries, when there is one
    /// (`topology.catch_up_after_ms` > 0), and its consumer tag.
    catch_up: Option<(lapin::Consumer, String)>,
    outbound: Outbound,
    /// Where the probe declares (`probe.rs`): a channel of its own, so that
    /// neither a slow answer nor a refusal touches the others.
    probe: Channel,
    /// `amqp.timeout_ms`: bounds every call on the broker.
    timeout: Duration,
    /// The node the connection reached.
    pub(super) node: BrokerNode,
}

impl Link {
    /// Connects, declares the consumer's part of the topology and subscribes
    /// to the due queue. A failure after the connect closes the connection.
    pub(super) async fn open<A>(consumer: &Consumer<A>) -> Result<Self, SessionError> {
        let (amqp, settings) = (&consumer.amqp, &consumer.settings);
        let timeout = amqp.timeout;
        let tls = TlsFiles::from_settings(amqp);
        let name = "order-expiry consumer";
        let url = amqp::with_heartbeat(&amqp.url, amqp.heartbeat);
        let (connection, node) = amqp::connect_node(&url, &tls, name, timeout).await?;
        // Everything after the connect closes the connection when it fails (a
        // node without its quorum answers the connect, then times out a declare).
        let set_up = async {
            let channel =
                amqp::bounded("channel.open", timeout, connection.create_channel()).await?;
            declare(&consumer.own_part, &connection, timeout).await?;
            let qos = channel.basic_qos(settings.prefetch, BasicQosOptions::default());
            amqp::bounded("basic.qos", timeout, qos).await?;
            let outbound =
                amqp::bounded("channel.open", timeout, connection.create_channel()).await?;
            let outbound = amqp::Confirms::select(outbound, timeout).await?;
            let probe = amqp::bounded("channel.open", timeout, connection.create_channel()).await?;
            let (deliveries, tag) = subscribe(&channel, &consumer.ladder, timeout).await?;
            let catch_up = subscribe_catch_up(&channel, consumer, timeout).await?;
            Ok::<_, SessionError>((channel, outbound, probe, deliveries, tag, catch_up))
        }
        .await;
        let (channel, outbound, probe, deliveries, tag, catch_up) = match set_up {
            Ok(parts) => parts,
            Err(error) => {
                amqp::close_failed(&connection, timeout).await;
                return Err(error);
            }
        };
        Ok(Self {
            connection,
            channel,
            deliveries,
            tag,
            catch_up,
            outbound: Outbound {
                confirms: outbound,
                parked_exchange: consumer.ladder.parked_exchange(),
                ladder: consumer.ladder.clone(),
                lead: consumer.lead,
                max_body_bytes: settings.max_body_bytes,
                timeout,
                observer: consumer.observer.clone(),
                clock: consumer.clock.clone(),
            },
            probe,
            timeout,
            node,
        })
    }

    /// A probe of the node (`probe.rs`): the first binding of `own_part`
    /// (the due exchange to the due queue) declared again on the probe's
    /// channel.
    pub(super) fn probe(&self, own_part: &Topology) -> BoxFuture<'static, Result<(), BrokerError>> {
        Box::pin(own_part.probe_on(self.probe.clone(), self.timeout))
    }

    /// Where parks and re-queues are published.
    pub(super) fn outbound(&self) -> &Outbound {
        &self.outbound
    }

    /// The delivery streams: the due queue's, and the catch-up queue's when
    /// there is one (apart, so that one `select!` can wait on both).
    pub(super) fn streams(&mut self) -> (Deliveries<'_>, Deliveries<'_>) {
        (
            Deliveries(Some(&mut self.deliveries)),
            Deliveries(self.catch_up.as_mut().map(|(d, _)| d)),
        )
    }

    /// Whether the consuming channel is still open.
    pub(super) fn is_connected(&self) -> bool {
        self.channel.status().connected()
    }

    /// Re-declares `own_part` (the consumer's queues, exchanges and bindings).
    pub(super) async fn redeclare(&self, own_part: &Topology) -> Result<(), BrokerError> {
        declare(own_part, &self.connection, self.timeout).await
    }

    /// Consumes the due queue and the catch-up queue again, on the same
    /// channel, with fresh tags (the one still consuming is cancelled first).
    pub(super) async fn resubscribe<A>(
        &mut self,
        consumer: &Consumer<A>,
    ) -> Result<(), BrokerError> {
        self.cancel().await;
        let (deliveries, tag) = subscribe(&self.channel, &consumer.ladder, self.timeout).await?;
        self.deliveries = deliveries;
        self.tag = tag;
        self.catch_up = subscribe_catch_up(&self.channel, consumer, self.timeout).await?;
        Ok(())
    }

    /// Acks every delivery up to `multiple_upto` with one `multiple` ack, then
    /// each of `single` on its own.
    pub(super) async fn ack(
        &self,
        multiple_upto: Option<u64>,
        single: &[u64],
    ) -> Result<(), BrokerError> {
        let channel = &self.channel;
        let sending = async {
            if let Some(tag) = multiple_upto {
                channel
                    .basic_ack(tag, BasicAckOptions { multiple: true })
                    .await?;
            }
            let singles = single
                .iter()
                .map(|tag| channel.basic_ack(*tag, BasicAckOptions::default()));
            futures::future::try_join_all(singles).await.map(drop)
        };
        amqp::bounded("basic.ack", self.timeout, sending).await
    }

    /// Stops taking deliveries; whatever the broker answers.
    pub(super) async fn cancel(&self) {
        let tags = std::iter::once(&self.tag).chain(self.catch_up.as_ref().map(|(_, t)| t));
        for tag in tags {
            let cancel = self
                .channel
                .basic_cancel(tag.as_str().into(), BasicCancelOptions::default());
            let _ = amqp::bounded("basic.cancel", self.timeout, cancel).await;
        }
    }

    /// Leaves the connection to close in the background, without a word on
    /// each channel: for a node that answers nothing for its cluster (the
    /// probe), where each of those, and the close itself, waits out its whole
    /// timeout (measured: 10 s for the close on RabbitMQ 4.3.6). The broker
    /// closes the channels with it; what they held goes back once the queues
    /// hear of it.
    pub(super) fn abandon(self) {
        let (connection, timeout) = (self.connection, self.timeout);
        tokio::spawn(async move {
            let closing = connection.close(200, "node probe failed".into());
            let _ = amqp::bounded("connection.close", timeout, closing).await;
        });
    }

    /// Closes the channels, then the connection: every unacked delivery goes
    /// back to the queue.
    pub(super) async fn close(self) {
        let timeout = self.timeout;
        let channel = self.channel.close(200, "shutdown".into());
        let _ = amqp::bounded("channel.close", timeout, channel).await;
        let outbound = self
            .outbound
            .confirms
            .channel()
            .close(200, "shutdown".into());
        let _ = amqp::bounded("channel.close", timeout, outbound).await;
        let probe = self.probe.close(200, "shutdown".into());
        let _ = amqp::bounded("channel.close", timeout, probe).await;
        let connection = self.connection.close(200, "shutdown".into());
        let _ = amqp::bounded("connection.close", timeout, connection).await;
    }
}

/// Declares `own_part` on `connection`, and logs each queue kept as it is.
async fn declare(
    own_part: &Topology,
    connection: &Connection,
    timeout: Duration,
) -> Result<(), BrokerError> {
    let kept = own_part.apply_on(connection, timeout).await?;
    warn_kept(&kept);
    Ok(())
}

/// Consumes the due queue with a fresh consumer tag.
async fn subscribe(
    channel: &Channel,
    ladder: &Ladder,
    timeout: Duration,
) -> Result<(lapin::Consumer, String), BrokerError> {
    consume(channel, &ladder.due_queue(), "order-expiry", timeout).await
}

/// Consumes `queue` with a fresh consumer tag starting with `tag_prefix`.
async fn consume(
    channel: &Channel,
    queue: &str,
    tag_prefix: &str,
    timeout: Duration,
) -> Result<(lapin::Consumer, String), BrokerError> {
    let tag = format!("{tag_prefix}-{}", uuid::Uuid::new_v4());
    let consume = channel.basic_consume(
        queue.into(),
        tag.as_str().into(),
        BasicConsumeOptions::default(),
        FieldTable::default(),
    );
    let deliveries = amqp::bounded("basic.consume", timeout, consume).await?;
    Ok((deliveries, tag))
}

/// One queue's deliveries, or none.
pub(super) struct Deliveries<'a>(Option<&'a mut lapin::Consumer>);

impl Deliveries<'_> {
    /// The next delivery; `None` when the broker ended the consumer; never,
    /// for no queue.
    pub(super) async fn next(&mut self) -> Option<lapin::Result<Delivery>> {
        match &mut self.0 {
            Some(deliveries) => deliveries.next().await,
            None => futures::future::pending().await,
        }
    }
}

/// Consumes the catch-up queue with `consumer.catch_up_prefetch` (a qos
/// set before its `basic.consume` applies to that consumer alone), and
/// gives the due queue's consumers the prefetch back for later ones. None
/// without a catch-up queue.
async fn subscribe_catch_up<A>(
    channel: &Channel,
    consumer: &Consumer<A>,
    timeout: Duration,
) -> Result<Option<(lapin::Consumer, String)>, BrokerError> {
    if consumer.catch_up_after.is_zero() {
        return Ok(None);
    }
    let settings = &consumer.settings;
    let qos = channel.basic_qos(
        settings.catch_up_prefetch.max(1),
        BasicQosOptions::default(),
    );
    amqp::bounded("basic.qos", timeout, qos).await?;
    let queue = consumer.ladder.catch_up_queue();
    let (deliveries, tag) = consume(channel, &queue, "order-expiry-catch-up", timeout).await?;
    let qos = channel.basic_qos(settings.prefetch, BasicQosOptions::default());
    amqp::bounded("basic.qos", timeout, qos).await?;
    Ok(Some((deliveries, tag)))
}

/// Logs each queue the broker holds with other placement arguments (declared
/// before `topology.replicas`, or with another value): it is used as it is.
fn warn_kept(kept: &[KeptQueue]) {
    for k in kept {
        warn!(target: CONSUMER, queue = %k.name, broker = %k.reason, "{}", KeptQueue::ADVICE);
    }
}
