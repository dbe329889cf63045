//! One consumer session: one broker connection, from `basic.consume` to close.
//!
//! [`Session`] owns everything a session knows (held deliveries, the ack
//! tracker, the ready queue, parts of split batches, work in flight, messages
//! retried on their own timers, and batches waiting for the database) and has
//! one method per event; [`Session::serve`]'s `select!` only picks the next
//! event. What finished work does (acks, splitting, retries, parking) is in
//! `finished.rs`, repairs of the consumer's queues in `repair.rs`, the shutdown
//! path (drain, release, close) in `drain.rs`.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

use chrono::{DateTime, Utc};
use futures::StreamExt;
use futures::future::BoxFuture;
use futures::stream::FuturesUnordered;
use lapin::message::Delivery;
use lapin::options::{BasicConsumeOptions, BasicQosOptions, ConfirmSelectOptions};
use lapin::types::FieldTable;
use lapin::{Channel, Connection};
use thiserror::Error;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::time::DelayQueue;
use tracing::{debug, info, warn};

use super::acks::{AckTracker, State};
use super::arrival::{Arrival, BundlePart, on_arrival};
use super::outage::Outage;
use super::outbound::{Original, Outbound, Republish};
use super::work::{Done, Pending, delivery_span, expire_work};
use super::{Consumer, Handled};
use crate::amqp::{self, BrokerError, ConnectError, TlsFiles};
use crate::publisher::ExpiryMessage;
use crate::service::CONSUMER;
use crate::service::action::Action;
use crate::service::backoff::Backoff;
use crate::telemetry::{ARRIVAL_LATENESS_SECONDS, HELD_TOTAL, ORDERS_PER_MESSAGE};
use crate::topology::{KeptQueue, Ladder};

/// Why a session ended.
#[derive(Debug, Error)]
pub(super) enum SessionError {
    #[error(transparent)]
    Connect(#[from] ConnectError),
    #[error(transparent)]
    Broker(#[from] BrokerError),
    #[error("the delivery stream failed: {0}")]
    Deliveries(lapin::Error),
    #[error("the broker ended the consumer")]
    ConsumerEnded,
    #[error("ack failed: {0}")]
    Ack(lapin::Error),
    #[error("an ack was not sent: channel closed")]
    AckNotSent,
}

/// The next thing that happened, as `select!` saw it.
// One lives on the stack for one turn of the loop: boxing the delivery would
// add an allocation per delivery for nothing.
#[allow(clippy::large_enum_variant)]
enum Event {
    Shutdown,
    Finished(Done),
    RetryDue,
    HoldExpired(Pending),
    RetryOneDue(Retry),
    Delivery(Option<lapin::Result<Delivery>>),
}

/// Work retried on its own timer, without holding up anything else.
pub(super) enum Retry {
    /// A message whose order was busy (locked), whose action failed
    /// transiently for it (a 5xx, a timeout), or whose batch failed transiently
    /// when it was alone: checked and expired again, alone.
    Again(Box<Pending>),
    /// A park or a re-queue the broker did not confirm.
    Republish { original: Original, what: Republish },
}

/// One session's state; see the module docs.
pub(super) struct Session<'a, A> {
    pub(super) consumer: &'a Consumer<A>,
    pub(super) connection: Connection,
    pub(super) channel: Channel,
    pub(super) outbound: Outbound,
    pub(super) deliveries: lapin::Consumer,
    pub(super) tag: String,
    /// Early deliveries, each until its `due_at`.
    pub(super) held: DelayQueue<Pending>,
    /// Unacked deliveries of this channel, acked with `multiple` where
    /// possible; with what the observer is told about each once it is.
    pub(super) acks: AckTracker<Vec<Handled>>,
    /// Bundles with orders not settled yet: how many, and what the observer
    /// is told about those that are. A bundle is acked when none is left.
    pub(super) bundles: HashMap<u64, (usize, Vec<Handled>)>,
    /// Due deliveries waiting for a cancel statement.
    pub(super) ready: VecDeque<Pending>,
    /// Parts of failed batches, each run as a batch of its own before `ready`,
    /// until the order at fault is alone.
    pub(super) split: VecDeque<Vec<Pending>>,
    /// Batches, parks and re-queues running now.
    pub(super) in_flight: FuturesUnordered<BoxFuture<'static, Done>>,
    /// Single messages, parks and re-queues, each retried on its own timer.
    pub(super) retrying: DelayQueue<Retry>,
    pub(super) park_backoff: Backoff,
    /// While the action is unavailable: the batches it could not take, and
    /// when to try again (no new batch starts, no deliveries are taken).
    pub(super) outage: Outage,
    /// Whether any work succeeded: the connection is good.
    pub(super) worked: bool,
    pub(super) started: Instant,
}

impl<'a, A: Action> Session<'a, A> {
    /// Connects, declares the consumer's part of the topology and subscribes
    /// to the due queue.
    pub(super) async fn open(consumer: &'a Consumer<A>) -> Result<Self, SessionError> {
        let (amqp, settings) = (&consumer.amqp, &consumer.settings);
        let timeout = amqp.timeout;
        let tls = TlsFiles::from_settings(amqp);
        let name = "order-expiry consumer";
        let connection = amqp::connect(&amqp.url, &tls, name, timeout).await?;
        // Everything after the connect closes the connection when it fails (a
        // node without its quorum answers the connect, then times out a declare).
        let set_up = async {
            let channel =
                amqp::bounded("channel.open", timeout, connection.create_channel()).await?;
            let kept = consumer.own_part.apply_on(&connection, timeout).await?;
            warn_kept(&kept);
            let qos = channel.basic_qos(settings.prefetch, BasicQosOptions::default());
            amqp::bounded("basic.qos", timeout, qos).await?;
            let outbound =
                amqp::bounded("channel.open", timeout, connection.create_channel()).await?;
            let confirms = outbound.confirm_select(ConfirmSelectOptions::default());
            amqp::bounded("confirm.select", timeout, confirms).await?;
            let (deliveries, tag) = subscribe(&channel, &consumer.ladder, timeout).await?;
            Ok::<_, SessionError>((channel, outbound, deliveries, tag))
        }
        .await;
        let (channel, outbound, deliveries, tag) = match set_up {
            Ok(parts) => parts,
            Err(error) => {
                amqp::close_failed(&connection, timeout).await;
                return Err(error);
            }
        };
        consumer.readiness.set_consuming(true);
        let queue = consumer.ladder.due_queue();
        info!(target: CONSUMER, queue = %queue, prefetch = settings.prefetch, "consuming");
        Ok(Self {
            consumer,
            connection,
            channel,
            outbound: Outbound {
                channel: outbound,
                parked_exchange: consumer.ladder.parked_exchange(),
                ladder: consumer.ladder.clone(),
                lead: consumer.lead,
                timeout,
                observer: consumer.observer.clone(),
            },
            deliveries,
            tag,
            held: DelayQueue::new(),
            acks: AckTracker::default(),
            bundles: HashMap::new(),
            ready: VecDeque::new(),
            split: VecDeque::new(),
            in_flight: FuturesUnordered::new(),
            retrying: DelayQueue::new(),
            park_backoff: Backoff::new(settings.retry_initial, settings.retry_max),
            outage: Outage::new(settings.retry_initial, settings.retry_max),
            worked: false,
            started: Instant::now(),
        })
    }

    /// Handles events until `shutdown` (`Ok`) or a broker fault (`Err`).
    pub(super) async fn serve(&mut self, shutdown: &CancellationToken) -> Result<(), SessionError> {
        loop {
            self.start_batches();
            match self.next_event(shutdown).await {
                Event::Shutdown => return Ok(()),
                Event::Finished(done) => self.on_finished(done).await?,
                Event::RetryDue => self.on_retry_due(),
                Event::HoldExpired(pending) => self.on_hold_expired(pending),
                Event::RetryOneDue(retry) => self.on_retry_one_due(retry),
                Event::Delivery(delivery) => self.on_delivery(delivery).await?,
            }
        }
    }

    /// Waits for the next event. Shutdown comes first; while the database is
    /// unavailable, no deliveries are taken (it gets no new work, and the
    /// consumer sleeps instead of spinning). A message retried on its own timer
    /// never stops intake.
    async fn next_event(&mut self, shutdown: &CancellationToken) -> Event {
        let busy = !self.in_flight.is_empty();
        let holding = !self.held.is_empty();
        let retrying = !self.retrying.is_empty();
        let retry_at = self.outage.retry_at();
        let (in_flight, held) = (&mut self.in_flight, &mut self.held);
        let (retries, deliveries) = (&mut self.retrying, &mut self.deliveries);
        tokio::select! {
            biased;
            _ = shutdown.cancelled() => Event::Shutdown,
            Some(done) = in_flight.next(), if busy => Event::Finished(done),
            _ = sleep_until(retry_at), if retry_at.is_some() => Event::RetryDue,
            Some(expired) = held.next(), if holding => Event::HoldExpired(expired.into_inner()),
            Some(expired) = retries.next(), if retrying => Event::RetryOneDue(expired.into_inner()),
            delivery = deliveries.next(), if retry_at.is_none() => Event::Delivery(delivery),
        }
    }

    /// Starts batches, up to `consumer.batch_concurrency` at once, unless the
    /// action is unavailable: parts of split batches first, each on its own,
    /// then up to `consumer.batch_max` ready deliveries.
    fn start_batches(&mut self) {
        let settings = &self.consumer.settings;
        let (batch_max, concurrency) =
            (settings.batch_max.max(1), settings.batch_concurrency.max(1));
        while !self.outage.is_on() && self.in_flight.len() < concurrency {
            let batch: Vec<Pending> = match self.split.pop_front() {
                Some(part) => part,
                None if self.ready.is_empty() => break,
                None => {
                    let n = self.ready.len().min(batch_max);
                    self.ready.drain(..n).collect()
                }
            };
            for p in &batch {
                self.mark(p.tag(), State::InBatch);
            }
            let work = Arc::clone(&self.consumer.work);
            let observed = self.consumer.observer.is_some();
            self.in_flight.push(expire_work(work, batch, observed));
        }
    }

    /// A delivery: due now, held until due, or parked. The end of the stream
    /// is the broker cancelling our consumer (the due queue was deleted):
    /// re-declared, consumed again, and what this session holds carries on.
    async fn on_delivery(
        &mut self,
        delivery: Option<lapin::Result<Delivery>>,
    ) -> Result<(), SessionError> {
        let delivery = match delivery {
            None => return self.on_consumer_ended().await,
            Some(Err(e)) => return Err(SessionError::Deliveries(e)),
            Some(Ok(delivery)) => delivery,
        };
        self.acks.received(delivery.delivery_tag);
        let content_type = delivery
            .properties
            .content_type()
            .as_ref()
            .map(|c| c.to_string());
        let settings = &self.consumer.settings;
        let now = Utc::now();
        let delivery = Arc::new(delivery);
        match on_arrival(&delivery.data, content_type.as_deref(), now, settings) {
            Arrival::Bundle(parts) => {
                metrics::histogram!(ORDERS_PER_MESSAGE.name).record(parts.len() as f64);
                self.bundles
                    .insert(delivery.delivery_tag, (parts.len(), Vec::new()));
                for part in parts {
                    match part {
                        BundlePart::Due(message) => self.on_due(&delivery, message, true, now),
                        BundlePart::Hold(message, early) => {
                            self.on_early(&delivery, message, early, true)
                        }
                        BundlePart::Park { body, reason } => {
                            let original = Original {
                                delivery: Arc::clone(&delivery),
                                part: Some(body.into()),
                            };
                            self.in_flight.push(self.outbound.park(original, reason));
                        }
                    }
                }
            }
            Arrival::Due(message) => {
                metrics::histogram!(ORDERS_PER_MESSAGE.name).record(1.0);
                self.on_due(&delivery, message, false, now);
            }
            Arrival::Hold(message, early) => {
                metrics::histogram!(ORDERS_PER_MESSAGE.name).record(1.0);
                self.on_early(&delivery, message, early, false);
            }
            Arrival::Park(reason) => {
                let park = self.outbound.park(Original::whole(delivery), reason);
                self.in_flight.push(park);
            }
        }
        Ok(())
    }

    /// An order due now (a whole v1 delivery, or one order of a bundle).
    fn on_due(
        &mut self,
        delivery: &Arc<Delivery>,
        message: ExpiryMessage,
        bundled: bool,
        now: DateTime<Utc>,
    ) {
        record_arrival(&message, now);
        let pending = Pending::new(Arc::clone(delivery), message, bundled);
        self.ready.push_back(pending);
    }

    /// An order that arrived early: held until its `due_at`.
    fn on_early(
        &mut self,
        delivery: &Arc<Delivery>,
        message: ExpiryMessage,
        early: std::time::Duration,
        bundled: bool,
    ) {
        metrics::counter!(HELD_TOTAL.name).increment(1);
        let pending = Pending::new(Arc::clone(delivery), message, bundled);
        let early_ms = early.as_millis() as u64;
        pending
            .span
            .in_scope(|| debug!(target: CONSUMER, early_ms, "held until due_at"));
        self.held.insert(pending, early);
    }

    /// A message's, a park's or a re-queue's own retry timer fired: the
    /// message runs again in a batch of its own (it may fail again, and must
    /// not take others with it), the copy is published again.
    fn on_retry_one_due(&mut self, retry: Retry) {
        match retry {
            Retry::Again(pending) => self.split.push_back(vec![*pending]),
            Retry::Republish { original, what } => {
                let span = delivery_span(&original.delivery, None);
                self.in_flight
                    .push(self.outbound.send(original, what, span))
            }
        }
    }

    /// A held delivery's timer fired: ready if its `due_at` (or later
    /// `not_before`) has passed (the timer has millisecond granularity), held
    /// again otherwise.
    fn on_hold_expired(&mut self, pending: Pending) {
        match (pending.message.process_at() - Utc::now()).to_std() {
            Ok(left) if !left.is_zero() => {
                self.held.insert(pending, left);
            }
            _ => self.ready.push_back(pending),
        }
    }

    /// How long this session has been consuming.
    pub(super) fn age(&self) -> std::time::Duration {
        self.started.elapsed()
    }
}

/// Consumes the due queue with a fresh consumer tag.
pub(super) async fn subscribe(
    channel: &Channel,
    ladder: &Ladder,
    timeout: std::time::Duration,
) -> Result<(lapin::Consumer, String), BrokerError> {
    let tag = format!("order-expiry-{}", uuid::Uuid::new_v4());
    let queue = ladder.due_queue();
    let consume = channel.basic_consume(
        queue.as_str().into(),
        tag.as_str().into(),
        BasicConsumeOptions::default(),
        FieldTable::default(),
    );
    let deliveries = amqp::bounded("basic.consume", timeout, consume).await?;
    Ok((deliveries, tag))
}

/// Logs each queue the broker holds with other placement arguments (declared
/// before `topology.replicas`, or with another value): it is used as it is.
pub(super) fn warn_kept(kept: &[KeptQueue]) {
    for k in kept {
        warn!(target: CONSUMER, queue = %k.name, broker = %k.reason, "{}", KeptQueue::ADVICE);
    }
}

/// How late a due message reached the consumer: what the ladder and the broker
/// added, seen the same way whatever the action kind (a stalled level shows
/// here even where no sweeper or database count can).
fn record_arrival(message: &ExpiryMessage, now: DateTime<Utc>) {
    let late = (now - message.process_at()).num_microseconds().unwrap_or(0) as f64 / 1e6;
    metrics::histogram!(ARRIVAL_LATENESS_SECONDS.name).record(late.max(0.0));
}

async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => futures::future::pending().await,
    }
}
