//! The publisher library the order service links.
//!
//! [`Scheduler::schedule`] returns `Ok` only once the broker has confirmed a
//! persistent, `mandatory` message that a queue accepted; every other ending is an
//! error the caller sees (nack, unroutable, timeout, lost connection, delay too
//! long, invalid order id). The connection is opened lazily and re-opened on the
//! next call after it drops.
//!
//! Publishes in flight (sent, not yet confirmed) are bounded for every caller
//! together: `schedule` from many tasks and `schedule_many` / `schedule_stream`
//! share one window of `publisher.max_in_flight`. A publish takes its slot
//! first and only then reads the clock and picks its route, so a publish that
//! queued for a slot never enters the ladder with a delay computed before it
//! waited. The window is small (50) because what a burst has in flight waits in
//! the broker before its TTL starts: with 1,000 in flight a flash sale queued
//! 150-470 ms there, past the 300 ms lead (README, Timeliness).

use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use futures::{Stream, StreamExt};
use lapin::options::BasicPublishOptions;
use lapin::{BasicProperties, Channel, Confirmation};
use secrecy::SecretString;
use tokio::sync::Semaphore;

use super::error::ScheduleError;
use super::message::ExpiryMessage;
use super::order_id::OrderId;
use crate::amqp::{self, BrokerError, ConfirmLink, TlsFiles};
use crate::settings::{Settings, redact_url};
use crate::telemetry::SCHEDULE_TOTAL;
use crate::topology::{DelayTooLong, Ladder, Route};

/// What the broker confirmed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Scheduled {
    /// The `message_id` property, unique per call.
    pub message_id: String,
    /// The due time on the wire (rounded up to the millisecond).
    pub due_at: DateTime<Utc>,
    /// Where it entered the ladder.
    pub route: Route,
}

/// Schedules order expiries on the delay ladder.
///
/// ```no_run
/// # async fn example() -> Result<(), Box<dyn std::error::Error>> {
/// use order_expiry::{Scheduler, Settings};
///
/// let settings = Settings::load(None)?;
/// let scheduler = Scheduler::from_settings(&settings)?;
/// let due_at = chrono::Utc::now() + chrono::TimeDelta::minutes(30);
/// let scheduled = scheduler.schedule("order-42", due_at).await?;
/// println!("order-42 is durable in the broker as {}", scheduled.message_id);
/// scheduler.close().await;
/// # Ok(()) }
/// ```
pub struct Scheduler {
    ladder: Ladder,
    max_in_flight: usize,
    /// One permit per publish in flight, for every caller of this scheduler.
    in_flight: Arc<Semaphore>,
    lead: Duration,
    link: ConfirmLink,
}

impl std::fmt::Debug for Scheduler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Scheduler")
            .field("url", &redact_url(self.link.url()))
            .field("ladder", &self.ladder)
            .field("timeout", &self.link.timeout)
            .finish_non_exhaustive()
    }
}

impl Scheduler {
    /// A scheduler for the broker, ladder and publisher settings of `settings`.
    /// Connects on first use.
    pub fn from_settings(settings: &Settings) -> Result<Self, ScheduleError> {
        settings.validate_publisher()?;
        Ok(Self::with_publisher_settings(
            settings.amqp.url.clone(),
            settings.ladder()?,
            settings,
        ))
    }

    /// A scheduler for `ladder` on the broker at `url`, with every other knob at
    /// its built-in default (`config/default.toml`); see the `with_*` methods.
    pub fn new(url: SecretString, ladder: Ladder) -> Self {
        Self::with_publisher_settings(url, ladder, &Settings::default())
    }

    fn with_publisher_settings(url: SecretString, ladder: Ladder, settings: &Settings) -> Self {
        let tls = TlsFiles::from_settings(&settings.amqp);
        let max_in_flight = settings.publisher.max_in_flight.max(1);
        Self {
            ladder,
            max_in_flight,
            in_flight: Arc::new(Semaphore::new(max_in_flight)),
            lead: settings.publisher.lead,
            link: ConfirmLink::new(url, tls, "order-expiry publisher", settings.amqp.timeout),
        }
    }

    /// Bounds connecting and each confirm (`amqp.timeout_ms`).
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.link.timeout = timeout;
        self
    }

    /// Unconfirmed publishes in flight at once, all callers together
    /// (`publisher.max_in_flight`).
    pub fn with_max_in_flight(mut self, max_in_flight: usize) -> Self {
        self.max_in_flight = max_in_flight.max(1);
        self.in_flight = Arc::new(Semaphore::new(self.max_in_flight));
        self
    }

    /// TLS files for an `amqps://` broker with a private CA or client
    /// certificates (default: the `amqp.tls_*` settings; none: the system roots).
    pub fn with_tls(mut self, tls: TlsFiles) -> Self {
        self.link.set_tls(tls);
        self
    }

    /// How much earlier than `due_at` the ladder may deliver (`publisher.lead_ms`).
    /// The ladder's transit (a few ms per level dead-lettered, more under load)
    /// then falls inside the consumer's hold instead of making the cancel late;
    /// the consumer never processes a message before `due_at`.
    pub fn with_lead(mut self, lead: Duration) -> Self {
        self.lead = lead;
        self
    }

    /// The ladder messages are published into.
    pub fn ladder(&self) -> &Ladder {
        &self.ladder
    }

    /// Connects now rather than on the first call, so start-up fails early.
    pub async fn connect(&self) -> Result<(), ScheduleError> {
        self.link.channel().await.map(drop).map_err(Into::into)
    }

    /// Schedules "cancel `order_id` if unpaid at `due_at`". Returns once the broker
    /// confirmed it; a `due_at` in the past is delivered at once. `order_id` is a
    /// `&str`, a `String` (both checked here) or an [`OrderId`].
    pub async fn schedule<O>(
        &self,
        order_id: O,
        due_at: DateTime<Utc>,
    ) -> Result<Scheduled, ScheduleError>
    where
        O: TryInto<OrderId>,
        ScheduleError: From<O::Error>,
    {
        let result = match order_id.try_into() {
            Ok(order_id) => self.publish(ExpiryMessage::new(order_id, due_at)).await,
            Err(invalid) => Err(invalid.into()),
        };
        let label = match &result {
            Ok(_) => "ok",
            Err(e) => e.label(),
        };
        metrics::counter!(SCHEDULE_TOTAL.name, "result" => label).increment(1);
        result
    }

    /// Schedules many orders with up to `max_in_flight` confirms outstanding at
    /// once (shared with every other call on this scheduler); one result per
    /// input, in input order.
    pub async fn schedule_many<I, O>(&self, orders: I) -> Vec<Result<Scheduled, ScheduleError>>
    where
        I: IntoIterator<Item = (O, DateTime<Utc>)>,
        O: TryInto<OrderId>,
        ScheduleError: From<O::Error>,
    {
        self.schedule_stream(futures::stream::iter(orders))
            .collect()
            .await
    }

    /// Streaming form of [`Scheduler::schedule_many`]: memory stays bounded by the
    /// in-flight window however many orders pass through.
    pub fn schedule_stream<'a, S, O>(
        &'a self,
        orders: S,
    ) -> impl Stream<Item = Result<Scheduled, ScheduleError>> + 'a
    where
        S: Stream<Item = (O, DateTime<Utc>)> + 'a,
        O: TryInto<OrderId> + 'a,
        ScheduleError: From<O::Error>,
    {
        orders
            .map(move |(order_id, due_at)| self.schedule(order_id, due_at))
            .buffered(self.max_in_flight)
    }

    /// Closes the connection cleanly.
    pub async fn close(&self) {
        self.link.close().await;
    }

    async fn publish(&self, message: ExpiryMessage) -> Result<Scheduled, ScheduleError> {
        // The semaphore is never closed, so acquiring cannot fail; the slot is
        // held until the confirm (or the error) and the route is computed after.
        let _slot = self.in_flight.acquire().await.ok();
        let message_id = uuid::Uuid::new_v4().to_string();
        let outgoing = Outgoing::new(&message, &self.ladder, self.lead, &message_id, Utc::now())?;
        let (channel, link_id) = self.link.channel().await?;
        let publishing = outgoing.publish(&channel);
        let confirmation =
            match amqp::bounded("publisher confirm", self.link.timeout, publishing).await {
                Ok(confirmation) => confirmation,
                Err(error) => {
                    // A link that swallowed a confirm is not trusted (a half-open TCP
                    // connection looks like this until heartbeats notice, minutes
                    // later): the next call opens a fresh one.
                    let timed_out = matches!(error, BrokerError::Timeout { .. });
                    self.link.forget(&channel, link_id, timed_out).await;
                    if let BrokerError::Failed { source, .. } = &error
                        && amqp::is_not_found(source)
                    {
                        let exchange = outgoing.route.exchange;
                        return Err(ScheduleError::TopologyMissing { exchange });
                    }
                    return Err(error.into());
                }
            };
        confirmed(confirmation, message, outgoing.route, message_id)
    }
}

/// One expiry message ready to enter the ladder: where, and what. The
/// scheduler and the consumer (sending a message through the ladder again)
/// publish the same way.
#[derive(Debug)]
pub(crate) struct Outgoing {
    pub(crate) route: Route,
    body: Vec<u8>,
    properties: BasicProperties,
}

impl Outgoing {
    /// `message` routed to arrive `lead` before it may be processed
    /// ([`ExpiryMessage::process_at`]), as seen at `now`; persistent, with
    /// `message_id` and nothing else (no headers: a message re-entering the
    /// ladder with `x-death` headers could be dropped as a dead-letter cycle).
    pub(crate) fn new(
        message: &ExpiryMessage,
        ladder: &Ladder,
        lead: Duration,
        message_id: &str,
        now: DateTime<Utc>,
    ) -> Result<Self, DelayTooLong> {
        let lead_ms = i64::try_from(lead.as_millis()).unwrap_or(i64::MAX);
        let remaining_ms = (message.process_at() - now).num_milliseconds() - lead_ms;
        let route = ladder.route_for_remaining_ms(remaining_ms)?;
        let properties = BasicProperties::default()
            .with_content_type(ExpiryMessage::CONTENT_TYPE.into())
            .with_delivery_mode(2)
            .with_message_id(message_id.into())
            .with_timestamp(u64::try_from(now.timestamp()).unwrap_or(0));
        Ok(Self {
            route,
            body: message.encode(),
            properties,
        })
    }

    /// Publishes it `mandatory` on `channel` (in confirm mode) and waits for
    /// the broker's answer: the caller bounds the wait and reads the answer.
    pub(crate) async fn publish(&self, channel: &Channel) -> lapin::Result<Confirmation> {
        let options = BasicPublishOptions {
            mandatory: true,
            ..BasicPublishOptions::default()
        };
        let exchange = self.route.exchange.as_str().into();
        let key = self.route.routing_key.as_str().into();
        channel
            .basic_publish(exchange, key, options, &self.body, self.properties.clone())
            .await?
            .await
    }
}

/// What the broker's answer to one publish means for the caller.
fn confirmed(
    confirmation: Confirmation,
    message: ExpiryMessage,
    route: Route,
    message_id: String,
) -> Result<Scheduled, ScheduleError> {
    let order_id = message.order_id.into_string();
    match confirmation {
        Confirmation::Ack(None) => Ok(Scheduled {
            message_id,
            due_at: message.due_at,
            route,
        }),
        Confirmation::Ack(Some(returned)) => Err(ScheduleError::Unroutable {
            order_id,
            exchange: route.exchange,
            reply_code: returned.reply_code,
            reply_text: returned.reply_text.to_string(),
        }),
        // confirm_select is always on, so NotRequested cannot happen; treat the
        // impossible as a refusal.
        Confirmation::Nack(_) | Confirmation::NotRequested => {
            Err(ScheduleError::Nacked { order_id })
        }
    }
}
