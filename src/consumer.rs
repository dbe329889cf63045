//! The consumer: reads the due queue, holds what is early, cancels what is due in
//! batches of one atomic statement, acks only after the database answered, parks
//! what can never be processed, and survives broker and database outages.
//!
//! A session is one broker connection. [`Consumer::run`] runs sessions until
//! shutdown, reconnecting with backoff whenever one ends on a broker fault.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use futures::future::BoxFuture;
use futures::stream::FuturesUnordered;
use futures::{FutureExt, StreamExt};
use lapin::message::Delivery;
use lapin::options::{
    BasicAckOptions, BasicCancelOptions, BasicConsumeOptions, BasicPublishOptions, BasicQosOptions,
    ConfirmSelectOptions,
};
use lapin::types::{AMQPValue, FieldTable};
use lapin::{BasicProperties, Channel, Confirmation, Connection};
use thiserror::Error;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::time::DelayQueue;
use tracing::{Instrument, debug, info, warn};

use crate::acks::{AckTracker, Acks, State};
use crate::broker::{self, Backoff, ConnectError};
use crate::http::Readiness;
use crate::ladder::{Ladder, LadderError};
use crate::message::ExpiryMessage;
use crate::orders::{Disposition, OrderStore, StoreError};
use crate::settings::{AmqpSettings, ConsumerSettings, Settings};
use crate::topology::{Topology, TopologyError};

/// What happened to one due message. Each is counted in
/// `order_expiry_messages_total{outcome}`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// The order was unpaid and is now cancelled.
    Cancelled,
    /// The order was paid or already cancelled; nothing changed.
    NotUnpaid,
    /// No such order; acked and logged.
    Unknown,
    /// The message can never be processed; copied to the parked queue.
    Parked,
}

impl Outcome {
    /// The metric label.
    pub fn label(self) -> &'static str {
        match self {
            Self::Cancelled => "cancelled",
            Self::NotUnpaid => "not_unpaid",
            Self::Unknown => "unknown",
            Self::Parked => "parked",
        }
    }
}

/// One handled delivery, as reported to an observer (see [`Consumer::observe`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Handled {
    /// The order, when the message could be decoded.
    pub order_id: Option<String>,
    /// What happened.
    pub outcome: Outcome,
    /// When it was acked.
    pub at: DateTime<Utc>,
}

/// Receives every [`Handled`] after its ack.
pub type Observer = tokio::sync::mpsc::UnboundedSender<Handled>;

/// What to do with a delivery the moment it arrives. Pure: no I/O.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Arrival {
    /// Due now: cancel.
    Due(ExpiryMessage),
    /// Early by the given time: hold unacked until `due_at`.
    Hold(ExpiryMessage, Duration),
    /// Never processable: park with this reason.
    Park(String),
}

/// Decides what to do with a body that arrived at `now`.
pub fn on_arrival(
    body: &[u8],
    content_type: Option<&str>,
    now: DateTime<Utc>,
    settings: &ConsumerSettings,
) -> Arrival {
    let message = match ExpiryMessage::decode(body, content_type, settings.max_body_bytes) {
        Ok(m) => m,
        Err(e) => return Arrival::Park(e.to_string()),
    };
    let early = (message.due_at - now).to_std().unwrap_or(Duration::ZERO);
    if early.is_zero() {
        Arrival::Due(message)
    } else if early <= Duration::from_millis(settings.max_hold_ms) {
        Arrival::Hold(message, early)
    } else {
        Arrival::Park(format!(
            "arrived {:.3} s before due_at, more than consumer.max_hold_ms ({} ms): it did not come through the ladder",
            early.as_secs_f64(),
            settings.max_hold_ms
        ))
    }
}

/// Cancels a batch of due messages with one atomic statement and records each
/// outcome: the unit of work, usable without a broker.
pub async fn cancel_batch<S: OrderStore>(
    store: &S,
    messages: &[&ExpiryMessage],
) -> Result<Vec<Outcome>, StoreError> {
    let ids: Vec<&str> = messages.iter().map(|m| m.order_id.as_str()).collect();
    let dispositions = store.cancel_unpaid(&ids).await?;
    let now = Utc::now();
    let outcomes = messages
        .iter()
        .zip(dispositions)
        .map(|(message, disposition)| {
            let outcome = match disposition {
                Disposition::Cancelled => Outcome::Cancelled,
                Disposition::NotUnpaid => Outcome::NotUnpaid,
                Disposition::Unknown => Outcome::Unknown,
            };
            record(message, outcome, now);
            outcome
        })
        .collect();
    Ok(outcomes)
}

fn record(message: &ExpiryMessage, outcome: Outcome, now: DateTime<Utc>) {
    metrics::counter!("order_expiry_messages_total", "outcome" => outcome.label()).increment(1);
    if outcome == Outcome::Cancelled {
        let lateness = lateness_secs(message, now);
        metrics::histogram!("order_expiry_lateness_seconds").record(lateness);
        if lateness < 0.0 {
            metrics::counter!("order_expiry_early_total").increment(1);
        }
    }
}

fn lateness_secs(message: &ExpiryMessage, now: DateTime<Utc>) -> f64 {
    (now - message.due_at)
        .num_microseconds()
        .unwrap_or(i64::MAX) as f64
        / 1e6
}

/// The span of one delivery, from arrival to ack: every event about it carries
/// its order id (when it decodes) and, once known, its outcome.
fn delivery_span(delivery: &Delivery, order_id: Option<&str>) -> tracing::Span {
    let span = tracing::info_span!(
        "delivery",
        order_id = tracing::field::Empty,
        outcome = tracing::field::Empty,
        redelivered = delivery.redelivered,
    );
    if let Some(order_id) = order_id {
        span.record("order_id", order_id);
    }
    span
}

/// Records the outcome on the delivery's span and logs it there.
fn log_outcome(pending: &Pending, outcome: Outcome, now: DateTime<Utc>) {
    pending.span.record("outcome", outcome.label());
    let _entered = pending.span.enter();
    match outcome {
        Outcome::Cancelled => {
            debug!(
                lateness_ms = lateness_secs(&pending.message, now) * 1e3,
                "handled"
            )
        }
        Outcome::Unknown => info!("due order does not exist"),
        _ => debug!("handled"),
    }
}

/// The consumer cannot run at all (as opposed to a fault it waits out).
#[derive(Debug, Error)]
pub enum ConsumerError {
    /// The topology settings are invalid.
    #[error(transparent)]
    Ladder(#[from] LadderError),
}

/// Why a session ended.
#[derive(Debug, Error)]
enum SessionError {
    #[error(transparent)]
    Connect(#[from] ConnectError),
    #[error(transparent)]
    Declare(#[from] TopologyError),
    #[error("broker: {0}")]
    Broker(#[from] lapin::Error),
    #[error("broker did not answer {0} in time")]
    Timeout(&'static str),
    #[error("{0}")]
    Lost(String),
}

/// A delivery with its decoded message and its span.
struct Pending {
    delivery: Delivery,
    message: ExpiryMessage,
    span: tracing::Span,
}

/// Work that runs concurrently with the delivery loop.
enum Done {
    Handled,
    /// A parked delivery was acked (singly, by the park work).
    Parked(u64),
    /// A batch was cancelled: its deliveries may be acked; each with what the
    /// observer is told once it is.
    Cancelled(Vec<(u64, Option<Handled>)>),
    /// The database failed: keep the deliveries, retry after a backoff.
    StoreFailed(Vec<Pending>, StoreError),
    /// The park publish was refused: keep the delivery, retry after a backoff.
    ParkFailed(Box<Delivery>, String, String),
    /// The channel is unusable: end the session.
    BrokerFailed(String),
}

/// The consumer service's delivery loop.
pub struct Consumer<S> {
    settings: ConsumerSettings,
    amqp: AmqpSettings,
    ladder: Ladder,
    store: Arc<S>,
    readiness: Arc<Readiness>,
    observer: Option<Observer>,
}

impl<S> std::fmt::Debug for Consumer<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Consumer")
            .field("ladder", &self.ladder)
            .field("settings", &self.settings)
            .finish_non_exhaustive()
    }
}

impl<S: OrderStore> Consumer<S> {
    /// A consumer of the due queue described by `settings`, cancelling through `store`.
    pub fn new(
        settings: &Settings,
        store: Arc<S>,
        readiness: Arc<Readiness>,
    ) -> Result<Self, ConsumerError> {
        Ok(Self {
            settings: settings.consumer.clone(),
            amqp: settings.amqp.clone(),
            ladder: settings.ladder()?,
            store,
            readiness,
            observer: None,
        })
    }

    /// Reports every handled delivery, after its ack, on the returned channel: for
    /// tests and the demo, which wait for outcomes instead of sleeping.
    pub fn observe(&mut self) -> tokio::sync::mpsc::UnboundedReceiver<Handled> {
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        self.observer = Some(tx);
        rx
    }

    /// Consumes until `shutdown` is cancelled, then drains and returns. Broker
    /// faults end a session and start another after a backoff; they never end `run`.
    pub async fn run(self, shutdown: CancellationToken) {
        let mut backoff = Backoff::new(
            Duration::from_millis(self.amqp.reconnect_initial_ms),
            Duration::from_millis(self.amqp.reconnect_max_ms),
        );
        while !shutdown.is_cancelled() {
            let result = self.session(&shutdown, &mut backoff).await;
            self.readiness.set_consuming(false);
            match result {
                Ok(()) => break,
                Err(e) => {
                    let delay = backoff.next_delay();
                    warn!(error = %e, retry_in_ms = delay.as_millis() as u64, "consumer session ended; reconnecting");
                    metrics::counter!("order_expiry_reconnects_total").increment(1);
                    tokio::select! {
                        _ = shutdown.cancelled() => break,
                        _ = tokio::time::sleep(delay) => {}
                    }
                }
            }
        }
        info!("consumer stopped");
    }

    async fn open(&self) -> Result<(Connection, Channel, Channel), SessionError> {
        let timeout = self.amqp.timeout();
        let tls = broker::TlsFiles::from_settings(&self.amqp);
        let connection =
            broker::connect_tls(&self.amqp.url, &tls, "order-expiry consumer", timeout).await?;
        let channel = bounded("channel.open", timeout, connection.create_channel()).await?;
        Topology::consumer_part(&self.ladder)
            .apply(&channel, timeout)
            .await?;
        bounded(
            "basic.qos",
            timeout,
            channel.basic_qos(self.settings.prefetch, BasicQosOptions::default()),
        )
        .await?;
        let parking = bounded("channel.open", timeout, connection.create_channel()).await?;
        bounded(
            "confirm.select",
            timeout,
            parking.confirm_select(ConfirmSelectOptions::default()),
        )
        .await?;
        Ok((connection, channel, parking))
    }

    async fn session(
        &self,
        shutdown: &CancellationToken,
        backoff: &mut Backoff,
    ) -> Result<(), SessionError> {
        let timeout = self.amqp.timeout();
        let (connection, channel, parking) = self.open().await?;
        let tag = format!("order-expiry-{}", uuid::Uuid::new_v4());
        let mut deliveries = bounded(
            "basic.consume",
            timeout,
            channel.basic_consume(
                self.ladder.due_queue().as_str().into(),
                tag.as_str().into(),
                BasicConsumeOptions::default(),
                FieldTable::default(),
            ),
        )
        .await?;
        self.readiness.set_consuming(true);
        let consuming_since = Instant::now();
        info!(queue = %self.ladder.due_queue(), prefetch = self.settings.prefetch, "consuming");

        let mut held: DelayQueue<Pending> = DelayQueue::new();
        // Unacked deliveries of this channel, acked with `multiple` where possible.
        let mut acks: AckTracker<Handled> = AckTracker::default();
        let mut ready: VecDeque<Pending> = VecDeque::new();
        let mut in_flight: FuturesUnordered<BoxFuture<'static, Done>> = FuturesUnordered::new();
        let mut failed: Vec<Done> = Vec::new();
        let mut retry_at: Option<Instant> = None;
        let mut retry_backoff = Backoff::new(
            Duration::from_millis(self.settings.retry_initial_ms),
            Duration::from_millis(self.settings.retry_max_ms),
        );
        let batch_max = self.settings.batch_max.max(1);
        let concurrency = self.settings.batch_concurrency.max(1);
        let mut connected_once = false;

        let end: Result<(), SessionError> = loop {
            while retry_at.is_none() && in_flight.len() < concurrency && !ready.is_empty() {
                let n = ready.len().min(batch_max);
                let batch: Vec<Pending> = ready.drain(..n).collect();
                for p in &batch {
                    acks.set(p.delivery.delivery_tag, State::InBatch, None);
                }
                in_flight.push(self.cancel_work(batch));
            }
            tokio::select! {
                biased;
                _ = shutdown.cancelled() => break Ok(()),
                Some(done) = in_flight.next(), if !in_flight.is_empty() => match done {
                    Done::Handled | Done::Parked(_) | Done::Cancelled(_) => {
                        if !connected_once {
                            connected_once = true;
                            backoff.reset();
                        }
                        retry_backoff.reset();
                        match done {
                            Done::Parked(tag) => acks.forget(tag),
                            Done::Cancelled(handled) => {
                                for (tag, h) in handled {
                                    acks.set(tag, State::Done, h);
                                }
                            }
                            _ => {}
                        }
                        if let Err(reason) = send_acks(&channel, acks.take(false), self.observer.as_ref(), timeout).await {
                            break Err(SessionError::Lost(reason));
                        }
                    }
                    Done::BrokerFailed(reason) => break Err(SessionError::Lost(reason)),
                    other => {
                        match &other {
                            Done::StoreFailed(batch, e) => {
                                warn!(error = %e, orders = batch.len(), "database failed; will retry");
                                for p in batch {
                                    acks.set(p.delivery.delivery_tag, State::Waiting, None);
                                }
                            }
                            Done::ParkFailed(_, _, why) => warn!(error = %why, "parking failed; will retry"),
                            _ => {}
                        }
                        metrics::counter!("order_expiry_retries_total").increment(1);
                        failed.push(other);
                        // What finished behind the failed batch need not wait for its retry.
                        if let Err(reason) = send_acks(&channel, acks.take(false), self.observer.as_ref(), timeout).await {
                            break Err(SessionError::Lost(reason));
                        }
                        if retry_at.is_none() {
                            retry_at = Some(Instant::now() + retry_backoff.next_delay());
                        }
                    }
                },
                _ = sleep_until_opt(retry_at), if retry_at.is_some() => {
                    retry_at = None;
                    for work in failed.drain(..) {
                        match work {
                            Done::StoreFailed(batch, _) => {
                                for p in batch.into_iter().rev() {
                                    ready.push_front(p);
                                }
                            }
                            Done::ParkFailed(delivery, reason, _) => {
                                in_flight.push(park_work(parking.clone(), self.ladder.parked_exchange(), *delivery, reason, timeout, self.observer.clone()));
                            }
                            Done::Handled | Done::Parked(_) | Done::Cancelled(_) | Done::BrokerFailed(_) => {}
                        }
                    }
                }
                Some(expired) = held.next(), if !held.is_empty() => {
                    let pending = expired.into_inner();
                    let now = Utc::now();
                    match (pending.message.due_at - now).to_std() {
                        Ok(left) if !left.is_zero() => { held.insert(pending, left); }
                        _ => ready.push_back(pending),
                    }
                }
                delivery = deliveries.next(), if retry_at.is_none() => match delivery {
                    None => break Err(SessionError::Lost("the broker ended the consumer".into())),
                    Some(Err(e)) => break Err(SessionError::Broker(e)),
                    Some(Ok(delivery)) => {
                        acks.received(delivery.delivery_tag);
                        let content_type = delivery.properties.content_type().as_ref().map(|c| c.as_str().to_owned());
                        match on_arrival(&delivery.data, content_type.as_deref(), Utc::now(), &self.settings) {
                            Arrival::Due(message) => {
                                let span = delivery_span(&delivery, Some(&message.order_id));
                                ready.push_back(Pending { delivery, message, span })
                            }
                            Arrival::Hold(message, early) => {
                                metrics::counter!("order_expiry_held_total").increment(1);
                                let span = delivery_span(&delivery, Some(&message.order_id));
                                span.in_scope(|| debug!(early_ms = early.as_millis() as u64, "held until due_at"));
                                held.insert(Pending { delivery, message, span }, early);
                            }
                            Arrival::Park(reason) => {
                                in_flight.push(park_work(parking.clone(), self.ladder.parked_exchange(), delivery, reason, timeout, self.observer.clone()));
                            }
                        }
                    }
                },
            }
        };

        // Not ready from now on, however long the clean-up below takes on a dead link.
        self.readiness.set_consuming(false);
        if end.is_err()
            && consuming_since.elapsed() >= Duration::from_millis(self.amqp.reconnect_max_ms)
        {
            // A session healthy for longer than the longest delay: its end is a new
            // incident, so reconnecting starts again from the shortest delay.
            backoff.reset();
        }

        // Stop taking deliveries, finish what is in flight (bounded), release the rest.
        let _ = tokio::time::timeout(
            timeout,
            channel.basic_cancel(tag.as_str().into(), BasicCancelOptions::default()),
        )
        .await;
        if end.is_ok() {
            let drain = Duration::from_millis(self.settings.drain_timeout_ms);
            let finished = tokio::time::timeout(drain, async {
                while let Some(done) = in_flight.next().await {
                    match done {
                        Done::Parked(tag) => acks.forget(tag),
                        Done::Cancelled(handled) => {
                            for (tag, h) in handled {
                                acks.set(tag, State::Done, h);
                            }
                        }
                        other => failed.push(other),
                    }
                }
            })
            .await;
            if finished.is_err() {
                warn!(?drain, "drain timeout: releasing unfinished deliveries");
            }
            if let Err(reason) =
                send_acks(&channel, acks.take(true), self.observer.as_ref(), timeout).await
            {
                warn!(error = %reason, "acks at shutdown failed; those deliveries come back");
            }
            // Closing the channel returns every unacked delivery to the queue:
            // held, ready and failed ones come back to the next consumer.
            let released = ready.len()
                + held.len()
                + failed
                    .iter()
                    .map(|w| match w {
                        Done::StoreFailed(batch, _) => batch.len(),
                        Done::ParkFailed(..) => 1,
                        _ => 0,
                    })
                    .sum::<usize>();
            info!(released, "drained");
        }
        let _ = tokio::time::timeout(timeout, channel.close(200, "shutdown".into())).await;
        let _ = tokio::time::timeout(timeout, parking.close(200, "shutdown".into())).await;
        let _ = tokio::time::timeout(timeout, connection.close(200, "shutdown".into())).await;
        end
    }

    fn cancel_work(&self, batch: Vec<Pending>) -> BoxFuture<'static, Done> {
        let store = Arc::clone(&self.store);
        let observed = self.observer.is_some();
        async move {
            let messages: Vec<&ExpiryMessage> = batch.iter().map(|p| &p.message).collect();
            let result = cancel_batch(store.as_ref(), &messages).await;
            match result {
                Err(e) => Done::StoreFailed(batch, e),
                Ok(outcomes) => {
                    let now = Utc::now();
                    for (p, outcome) in batch.iter().zip(&outcomes) {
                        log_outcome(p, *outcome, now);
                    }
                    // The session acks them, with `multiple` where it can.
                    let handled = batch.iter().zip(outcomes).map(|(p, outcome)| {
                        let handled = observed.then(|| Handled {
                            order_id: Some(p.message.order_id.clone()),
                            outcome,
                            at: now,
                        });
                        (p.delivery.delivery_tag, handled)
                    });
                    Done::Cancelled(handled.collect())
                }
            }
        }
        .boxed()
    }
}

/// Sends the acks the tracker allows now (one `multiple` ack for the finished
/// front of the window, single ones behind a held delivery), then tells the
/// observer about each delivery they covered.
async fn send_acks(
    channel: &Channel,
    acks: Acks<Handled>,
    observer: Option<&Observer>,
    timeout: Duration,
) -> Result<(), String> {
    let sent = tokio::time::timeout(timeout, async {
        if let Some(tag) = acks.multiple_upto {
            channel
                .basic_ack(tag, BasicAckOptions { multiple: true })
                .await?;
        }
        let singles = acks
            .single
            .iter()
            .map(|tag| channel.basic_ack(*tag, BasicAckOptions::default()));
        futures::future::try_join_all(singles).await.map(drop)
    })
    .await;
    match sent {
        Err(_) => return Err(format!("acks not sent within {timeout:?}")),
        Ok(Err(e)) => return Err(format!("ack failed: {e}")),
        Ok(Ok(())) => {}
    }
    if let Some(observer) = observer {
        let at = Utc::now();
        for mut handled in acks.payloads {
            handled.at = at;
            let _ = observer.send(handled);
        }
    }
    Ok(())
}

async fn ack_all<'a>(deliveries: impl Iterator<Item = &'a Delivery>) -> Done {
    let acks = deliveries.map(|d| d.acker.ack(BasicAckOptions::default()));
    for result in futures::future::join_all(acks).await {
        match result {
            Ok(true) => {}
            Ok(false) => return Done::BrokerFailed("an ack was not sent: channel closed".into()),
            Err(e) => return Done::BrokerFailed(format!("ack failed: {e}")),
        }
    }
    Done::Handled
}

fn park_work(
    channel: Channel,
    exchange: String,
    delivery: Delivery,
    reason: String,
    timeout: Duration,
    observer: Option<Observer>,
) -> BoxFuture<'static, Done> {
    let span = delivery_span(&delivery, None);
    async move {
        warn!(reason = %reason, size = delivery.data.len(), "parking message");
        let mut headers = delivery
            .properties
            .headers()
            .clone()
            .unwrap_or_default();
        headers.insert("x-parked-reason".into(), AMQPValue::LongString(reason.as_str().into()));
        headers.insert(
            "x-parked-at".into(),
            AMQPValue::LongString(Utc::now().to_rfc3339().as_str().into()),
        );
        headers.insert(
            "x-original-routing-key".into(),
            AMQPValue::LongString(delivery.routing_key.as_str().into()),
        );
        let mut properties = BasicProperties::default()
            .with_delivery_mode(2)
            .with_headers(headers);
        if let Some(ct) = delivery.properties.content_type() {
            properties = properties.with_content_type(ct.clone());
        }
        if let Some(id) = delivery.properties.message_id() {
            properties = properties.with_message_id(id.clone());
        }
        let options = BasicPublishOptions {
            mandatory: true,
            ..BasicPublishOptions::default()
        };
        let published = tokio::time::timeout(timeout, async {
            channel
                .basic_publish(exchange.as_str().into(), "".into(), options, &delivery.data, properties)
                .await?
                .await
        })
        .await;
        match published {
            Ok(Ok(Confirmation::Ack(None))) => {
                metrics::counter!("order_expiry_messages_total", "outcome" => Outcome::Parked.label()).increment(1);
                metrics::counter!("order_expiry_parked_total").increment(1);
                tracing::Span::current().record("outcome", Outcome::Parked.label());
                debug!("handled");
                let done = ack_all(std::iter::once(&delivery)).await;
                if let (Done::Handled, Some(observer)) = (&done, observer) {
                    let _ = observer.send(Handled {
                        order_id: None,
                        outcome: Outcome::Parked,
                        at: Utc::now(),
                    });
                }
                match done {
                    Done::Handled => Done::Parked(delivery.delivery_tag),
                    other => other,
                }
            }
            Ok(Ok(Confirmation::Ack(Some(r)))) => {
                let why = format!("parked exchange {exchange} did not route ({} {})", r.reply_code, r.reply_text);
                Done::ParkFailed(Box::new(delivery), reason, why)
            }
            Ok(Ok(_)) => Done::ParkFailed(Box::new(delivery), reason, "broker nacked the parked copy".into()),
            Ok(Err(e)) => Done::BrokerFailed(format!("publishing to {exchange}: {e}")),
            Err(_) => Done::ParkFailed(Box::new(delivery), reason, format!("no confirm within {timeout:?}")),
        }
    }
    .instrument(span)
    .boxed()
}

async fn sleep_until_opt(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => futures::future::pending().await,
    }
}

async fn bounded<T>(
    what: &'static str,
    timeout: Duration,
    op: impl Future<Output = lapin::Result<T>>,
) -> Result<T, SessionError> {
    match tokio::time::timeout(timeout, op).await {
        Ok(result) => Ok(result?),
        Err(_) => Err(SessionError::Timeout(what)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::settings::Settings;
    use chrono::TimeDelta;

    fn consumer_settings() -> ConsumerSettings {
        Settings::load_without_env(None).unwrap().consumer
    }

    fn body(due_at: DateTime<Utc>) -> Vec<u8> {
        ExpiryMessage::new("o-1", due_at).unwrap().encode()
    }

    #[test]
    fn a_due_message_is_due() {
        let now = Utc::now();
        let due = now - TimeDelta::milliseconds(5);
        assert!(matches!(
            on_arrival(&body(due), None, now, &consumer_settings()),
            Arrival::Due(_)
        ));
    }

    #[test]
    fn an_early_message_is_held_for_exactly_the_time_left() {
        let now = Utc::now();
        let due = crate::message::ceil_to_millis(now + TimeDelta::milliseconds(700));
        match on_arrival(&body(due), None, now, &consumer_settings()) {
            Arrival::Hold(m, early) => {
                assert_eq!(m.due_at, due);
                assert_eq!(early, (due - now).to_std().unwrap());
            }
            other => panic!("expected Hold, got {other:?}"),
        }
    }

    #[test]
    fn a_message_far_too_early_is_parked_not_held_forever() {
        let now = Utc::now();
        let due = now + TimeDelta::hours(1);
        match on_arrival(&body(due), None, now, &consumer_settings()) {
            Arrival::Park(reason) => assert!(reason.contains("before due_at"), "{reason}"),
            other => panic!("expected Park, got {other:?}"),
        }
    }

    #[test]
    fn malformed_bodies_are_parked_with_the_decoder_reason() {
        match on_arrival(b"{}", None, Utc::now(), &consumer_settings()) {
            Arrival::Park(reason) => assert_eq!(reason, "missing field \"v\""),
            other => panic!("expected Park, got {other:?}"),
        }
    }
}
