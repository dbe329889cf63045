//! One consumer session: one broker connection, from `basic.consume` to close.
//!
//! [`Session`] has one method per event; [`Session::serve`]'s `select!` only
//! picks the next event. Its state is in parts, each a struct with private
//! fields and the methods that change them, so one file answers "who sets
//! this?":
//!
//! - `link`, [`Link`] (`link.rs`): the connection, the consuming channel, the
//!   delivery stream and its tag, the confirm-mode channel for parks and
//!   re-queues.
//! - `unacked`, [`Unacked`] (`unacked.rs`): the ack tracker and the bundles
//!   with orders not settled yet.
//! - `backlog`, [`Backlog`] (`backlog.rs`): held deliveries by their due
//!   time, ready ones, and parts of split batches that run first.
//! - `in_flight`, [`InFlight`] (`work.rs`): batches, parks and re-queues
//!   running now.
//! - `retries`, [`Retries`] (`retries.rs`): messages, parks and re-queues
//!   each retried on its own timer, and their backoffs.
//! - `outage`, [`Outage`] (`outage.rs`): batches waiting for the action, and
//!   when to try again; the one place that pauses intake.
//!
//! The event methods are here and in the files of their job: what finished
//! work does (acks, splitting, retries, parking) in `finished.rs`, repairs of
//! the consumer's queues in `repair.rs`, the shutdown path (drain, release,
//! close) in `drain.rs`.

use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, TimeDelta, Utc};
use lapin::message::Delivery;
use thiserror::Error;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use super::Consumer;
use super::acks::State;
use super::arrival::{Arrival, BundlePart, on_arrival};
use super::backlog::Backlog;
use super::link::Link;
use super::outage::Outage;
use super::pass::{ParkedOrder, Pass};
use super::probe::{Probe, Probed};
use super::retries::{Retries, Retry};
use super::unacked::Unacked;
use super::work::{Done, InFlight, Pending, expire_work};
use crate::amqp::{BrokerError, ConnectError};
use crate::publisher::{ExpiryMessage, received_trace};
use crate::service::CONSUMER;
use crate::service::action::Action;
use crate::telemetry::spans::Consuming;
use crate::telemetry::{
    ARRIVAL_LATENESS_SECONDS, CATCH_UP_OLDEST_SECONDS, CATCH_UP_ORDERS, CATCH_UP_TOTAL, HELD_TOTAL,
    ORDERS_PER_MESSAGE,
};

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
    #[error("the broker node did not answer the probe: {0}")]
    NodeProbe(BrokerError),
}

/// How far apart the due times of one delivery's orders may be to be
/// released together, in one pass (see [`Session::arrive`]).
const PASS_SPAN: TimeDelta = TimeDelta::milliseconds(10);

/// The next thing that happened, as `select!` saw it.
// One lives on the stack for one turn of the loop: boxing the delivery would
// add an allocation per delivery for nothing.
#[allow(clippy::large_enum_variant)]
enum Event {
    Shutdown,
    Finished(Done),
    RetryDue,
    HoldsDue,
    RetryOneDue(Retry),
    Delivery(Option<lapin::Result<Delivery>>),
    /// A delivery of the catch-up queue.
    CatchUp(Option<lapin::Result<Delivery>>),
    /// The catch-up lane may take more.
    CatchUpRate,
    /// The node probe is due, or answered.
    Probe(Probed),
}

/// Which queue a delivery came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Lane {
    /// The due queue: what is due now.
    Due,
    /// The catch-up queue: what no consumer took in time (an outage's backlog).
    CatchUp,
}

/// One session's state, in parts that each change only their own fields;
/// see the module docs.
pub(super) struct Session<'a, A> {
    pub(super) consumer: &'a Consumer<A>,
    pub(super) link: Link,
    pub(super) unacked: Unacked,
    pub(super) backlog: Backlog,
    pub(super) in_flight: InFlight,
    pub(super) retries: Retries,
    pub(super) outage: Outage,
    /// Whether the node still acts for its cluster (`probe.rs`).
    probe: Probe,
    /// What each order's span says of where it was consumed.
    consuming: Arc<Consuming>,
    /// Whether any work succeeded: the connection is good.
    pub(super) worked: bool,
    /// Orders of the catch-up lane last reported in its gauge.
    catch_up_reported: usize,
    started: Instant,
}

impl<'a, A: Action> Session<'a, A> {
    /// Connects, declares the consumer's part of the topology and subscribes
    /// to the due queue.
    pub(super) async fn open(consumer: &'a Consumer<A>) -> Result<Self, SessionError> {
        let link = Link::open(consumer).await?;
        consumer.readiness.set_consuming(true);
        let settings = &consumer.settings;
        let queue = consumer.ladder.due_queue();
        info!(target: CONSUMER, queue = %queue, prefetch = settings.prefetch, "consuming");
        let (work, node) = (&consumer.work, link.node.clone());
        let consuming = Consuming::new(&queue, work.action_kind, node, work.passes_on);
        let consuming = Arc::new(consuming);
        Ok(Self {
            consumer,
            link,
            unacked: Unacked::default(),
            backlog: Backlog::new(consumer.clock.clone(), settings.catch_up_rate),
            in_flight: InFlight::new(),
            retries: Retries::new(settings.retry_initial, settings.retry_max),
            outage: Outage::new(settings.retry_initial, settings.outage_retry_max),
            probe: Probe::new(consumer.amqp.probe_interval),
            consuming,
            worked: false,
            catch_up_reported: 0,
            started: Instant::now(),
        })
    }

    /// Handles events until `shutdown` (`Ok`) or a broker fault (`Err`).
    pub(super) async fn serve(&mut self, shutdown: &CancellationToken) -> Result<(), SessionError> {
        loop {
            // Every turn, not only when the holds' timer fires: under load the
            // timer can fire tens of ms late, while deliveries and finished
            // batches come every millisecond.
            self.backlog.release_due();
            self.start_batches();
            self.report_catch_up();
            match self.next_event(shutdown).await {
                Event::Shutdown => return Ok(()),
                Event::Finished(done) => self.on_finished(done).await?,
                Event::RetryDue => self.on_retry_due(),
                Event::HoldsDue => self.on_holds_due(),
                Event::RetryOneDue(retry) => self.on_retry_one_due(retry),
                Event::Delivery(delivery) => self.on_delivery(delivery, Lane::Due).await?,
                Event::CatchUp(delivery) => self.on_delivery(delivery, Lane::CatchUp).await?,
                // The catch-up lane's rate allows more: start_batches takes it.
                Event::CatchUpRate => {}
                Event::Probe(probed) => self.on_probe(probed)?,
            }
        }
    }

    /// Waits for the next event. Shutdown comes first; while the database is
    /// unavailable, no deliveries are taken (it gets no new work, and the
    /// consumer sleeps instead of spinning). A message retried on its own timer
    /// never stops intake.
    async fn next_event(&mut self, shutdown: &CancellationToken) -> Event {
        let busy = !self.in_flight.is_empty();
        let holding = self.backlog.is_holding();
        let retrying = !self.retries.is_empty();
        let retry_at = self.outage.retry_at();
        let settings = &self.consumer.settings;
        let room = self.in_flight.len() < settings.batch_concurrency.max(1);
        // The catch-up lane waits for its rate only while a batch could start.
        let rate_wait = match (room && retry_at.is_none(), self.backlog.catch_up_wait()) {
            (true, Some(wait)) => Some(Instant::now() + wait.max(Duration::from_millis(1))),
            _ => None,
        };
        let catch_up = retry_at.is_none() && self.backlog.wants_catch_up(settings.batch_max);
        let (in_flight, backlog) = (&mut self.in_flight, &mut self.backlog);
        let retries = &mut self.retries;
        let probing = self.probe.is_on();
        let probe = &mut self.probe;
        let (mut due, mut catching_up) = self.link.streams();
        tokio::select! {
            biased;
            _ = shutdown.cancelled() => Event::Shutdown,
            Some(done) = in_flight.next(), if busy => Event::Finished(done),
            _ = sleep_until(retry_at), if retry_at.is_some() => Event::RetryDue,
            () = backlog.next_due(), if holding => Event::HoldsDue,
            Some(retry) = retries.next_due(), if retrying => Event::RetryOneDue(retry),
            delivery = due.next(), if retry_at.is_none() => Event::Delivery(delivery),
            _ = sleep_until(rate_wait), if rate_wait.is_some() => Event::CatchUpRate,
            delivery = catching_up.next(), if catch_up => Event::CatchUp(delivery),
            probed = probe.next(), if probing => Event::Probe(probed),
        }
    }

    /// Sends the node probe when due; a probe that got no answer ends the
    /// session, so that the next one connects through another node. A probe
    /// the broker refused (its channel closed, say) ends it as any broker
    /// error does.
    fn on_probe(&mut self, probed: Probed) -> Result<(), SessionError> {
        match probed {
            Probed::Due => {
                let probe = self.link.probe(&self.consumer.own_part);
                self.probe.start(probe);
                Ok(())
            }
            Probed::Answered(Ok(())) => Ok(()),
            Probed::Answered(Err(error @ BrokerError::Failed { .. })) => Err(error.into()),
            Probed::Answered(Err(error)) => {
                warn!(target: CONSUMER, %error,
                    "the broker node did not answer the probe (cut off from its cluster?): \
                     connecting through the next node");
                Err(SessionError::NodeProbe(error))
            }
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
            let Some((batch, caught_up)) = self.backlog.next_batch(batch_max) else {
                break;
            };
            if caught_up > 0 {
                metrics::counter!(CATCH_UP_TOTAL.name).increment(caught_up as u64);
            }
            for p in &batch {
                self.unacked.mark(p.tag(), State::InBatch);
            }
            let work = Arc::clone(&self.consumer.work);
            let observed = self.consumer.observer.is_some();
            self.in_flight.start(expire_work(work, batch, observed));
        }
    }

    /// The catch-up lane's gauges, when they change.
    fn report_catch_up(&mut self) {
        let (orders, first) = self.backlog.catching_up();
        if orders == 0 && self.catch_up_reported == 0 {
            return;
        }
        self.catch_up_reported = orders;
        metrics::gauge!(CATCH_UP_ORDERS.name).set(orders as f64);
        let oldest = first.map_or(0.0, |at| {
            (self.consumer.clock.now() - at).num_milliseconds().max(0) as f64 / 1e3
        });
        metrics::gauge!(CATCH_UP_OLDEST_SECONDS.name).set(oldest);
    }

    /// A delivery: due now, held until due, or parked. The end of the stream
    /// is the broker cancelling our consumer (the due queue was deleted):
    /// re-declared, consumed again, and what this session holds carries on.
    async fn on_delivery(
        &mut self,
        delivery: Option<lapin::Result<Delivery>>,
        lane: Lane,
    ) -> Result<(), SessionError> {
        let delivery = match delivery {
            None => return self.on_consumer_ended().await,
            Some(Err(e)) => return Err(SessionError::Deliveries(e)),
            Some(Ok(delivery)) => delivery,
        };
        let content_type = delivery
            .properties
            .content_type()
            .as_ref()
            .map(|c| c.to_string());
        let settings = &self.consumer.settings;
        let now = self.consumer.clock.now();
        let delivery = Arc::new(delivery);
        let tag = delivery.delivery_tag;
        let trace = received_trace(&delivery.properties);
        match on_arrival(
            &delivery.data,
            content_type.as_deref(),
            trace,
            now,
            settings,
        ) {
            Arrival::Bundle(parts) => {
                metrics::histogram!(ORDERS_PER_MESSAGE.name).record(parts.len() as f64);
                let mut pass = Pass::new(parts.len());
                let mut orders = Vec::with_capacity(parts.len());
                for part in parts {
                    match part {
                        BundlePart::Due(message) | BundlePart::Hold(message, _) => {
                            orders.push(message)
                        }
                        BundlePart::Park {
                            entry,
                            order_id,
                            reason,
                        } => {
                            let order = ParkedOrder::Entry {
                                json: entry,
                                order_id,
                            };
                            pass.park(order, reason, false);
                        }
                    }
                }
                self.unacked.received(&delivery, pass);
                self.arrive(&delivery, orders, now, lane);
            }
            Arrival::Due(message) | Arrival::Hold(message, _) => {
                metrics::histogram!(ORDERS_PER_MESSAGE.name).record(1.0);
                self.unacked.received(&delivery, Pass::new(1));
                self.arrive(&delivery, vec![message], now, lane);
            }
            Arrival::Park(reason) => {
                let mut pass = Pass::new(1);
                pass.park(ParkedOrder::Whole, reason, false);
                self.unacked.received(&delivery, pass);
            }
        }
        // A delivery with nothing to wait for (all of it parked) ends now.
        self.end_pass(tag);
        Ok(())
    }

    /// The orders of one delivery (one for v1), at `now`: due, or held.
    /// Orders due within [`PASS_SPAN`] of each other are released together, at
    /// the latest one's time, so that the orders of a bundle (the publisher
    /// bundles only orders due within `publisher.bundle_span_ms`) go through
    /// the action in one batch and their delivery is acked after one pass.
    fn arrive(
        &mut self,
        delivery: &Arc<Delivery>,
        mut orders: Vec<ExpiryMessage>,
        now: DateTime<Utc>,
        lane: Lane,
    ) {
        orders.sort_by_key(ExpiryMessage::process_at);
        let mut window: Vec<ExpiryMessage> = Vec::new();
        for message in orders {
            if let Some(first) = window.first()
                && message.process_at() - first.process_at() > PASS_SPAN
            {
                self.release_together(delivery, std::mem::take(&mut window), now, lane);
            }
            window.push(message);
        }
        self.release_together(delivery, window, now, lane);
    }

    /// Orders of one delivery due within [`PASS_SPAN`]: ready now, or held
    /// until the latest of them is due.
    fn release_together(
        &mut self,
        delivery: &Arc<Delivery>,
        window: Vec<ExpiryMessage>,
        now: DateTime<Utc>,
        lane: Lane,
    ) {
        let Some(at) = window.iter().map(ExpiryMessage::process_at).max() else {
            return;
        };
        for message in window {
            let pending = Pending::new(Arc::clone(delivery), message, &self.consuming);
            if at <= now {
                record_arrival(&pending.message, now);
                // Late by more than catch_up_after: an outage's backlog, even
                // when it came from the due queue (taken before the outage,
                // or buffered by the client while intake paused).
                let late = (now - at).to_std().unwrap_or_default();
                let catch_up = self.consumer.catch_up_after;
                match lane {
                    Lane::Due if catch_up.is_zero() || late <= catch_up => {
                        self.backlog.due(pending)
                    }
                    _ => self.backlog.catch_up(pending),
                }
            } else {
                metrics::counter!(HELD_TOTAL.name).increment(1);
                let early_ms = (at - now).num_milliseconds();
                pending
                    .span
                    .in_scope(|| debug!(target: CONSUMER, early_ms, "held until due"));
                self.backlog.hold_until(pending, at);
            }
        }
    }

    /// An order's own retry timer fired: it runs again in a batch of its own
    /// (it may fail again, and must not take others with it); or leftovers
    /// the broker did not confirm are published again.
    fn on_retry_one_due(&mut self, retry: Retry) {
        match retry {
            Retry::Again(pending) => self.backlog.alone(*pending),
            Retry::MoveOut(move_out) => self
                .in_flight
                .start(self.link.outbound().move_out(move_out)),
        }
    }

    /// The earliest held order's time came: every held order due by now is
    /// ready, to start together.
    fn on_holds_due(&mut self) {
        self.backlog.release_due();
    }

    /// How long this session has been consuming.
    pub(super) fn age(&self) -> std::time::Duration {
        self.started.elapsed()
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
