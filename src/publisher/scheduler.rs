//! The publisher library the order service links.
//!
//! [`Scheduler::schedule`] returns `Ok` only once the broker has confirmed a
//! persistent, `mandatory` message that a queue accepted; every other ending is an
//! error the caller sees (nack, unroutable, timeout, lost connection, delay too
//! long, invalid order id). The connection is opened lazily and re-opened on the
//! next call after it drops.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use chrono::{DateTime, Utc};
use futures::{Stream, StreamExt};
use lapin::options::{BasicPublishOptions, ConfirmSelectOptions};
use lapin::{BasicProperties, Channel, Confirmation, Connection};
use secrecy::SecretString;
use tokio::sync::Mutex;

use super::error::ScheduleError;
use super::message::ExpiryMessage;
use super::order_id::OrderId;
use crate::amqp::{self, BrokerError, TlsFiles};
use crate::settings::{Settings, redact_url};
use crate::telemetry::SCHEDULE_TOTAL;
use crate::topology::{Ladder, Route};

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

/// One connection and its confirm-mode channel.
struct Link {
    connection: Connection,
    channel: Channel,
    /// Tells links apart: channel ids repeat across connections.
    id: u64,
}

/// Source of [`Link::id`]s.
static LINKS: AtomicU64 = AtomicU64::new(0);

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
    url: SecretString,
    ladder: Ladder,
    timeout: Duration,
    max_in_flight: usize,
    lead: Duration,
    tls: TlsFiles,
    link: Mutex<Option<Link>>,
}

impl std::fmt::Debug for Scheduler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Scheduler")
            .field("url", &redact_url(&self.url))
            .field("ladder", &self.ladder)
            .field("timeout", &self.timeout)
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
        Self {
            url,
            ladder,
            timeout: settings.amqp.timeout,
            max_in_flight: settings.publisher.max_in_flight.max(1),
            lead: settings.publisher.lead,
            tls: TlsFiles::from_settings(&settings.amqp),
            link: Mutex::new(None),
        }
    }

    /// Bounds connecting and each confirm (`amqp.timeout_ms`).
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// Unconfirmed publishes `schedule_many` keeps in flight (`publisher.max_in_flight`).
    pub fn with_max_in_flight(mut self, max_in_flight: usize) -> Self {
        self.max_in_flight = max_in_flight.max(1);
        self
    }

    /// TLS files for an `amqps://` broker with a private CA or client
    /// certificates (default: the `amqp.tls_*` settings; none: the system roots).
    pub fn with_tls(mut self, tls: TlsFiles) -> Self {
        self.tls = tls;
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
        self.channel().await.map(drop)
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
    /// once; one result per input, in input order.
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
        if let Some(link) = self.link.lock().await.take() {
            let _ = link.channel.close(200, "closing".into()).await;
            let _ = link.connection.close(200, "closing".into()).await;
        }
    }

    async fn publish(&self, message: ExpiryMessage) -> Result<Scheduled, ScheduleError> {
        let lead_ms = i64::try_from(self.lead.as_millis()).unwrap_or(i64::MAX);
        let remaining_ms = (message.due_at - Utc::now()).num_milliseconds() - lead_ms;
        let route = self.ladder.route_for_remaining_ms(remaining_ms)?;
        let message_id = uuid::Uuid::new_v4().to_string();
        let properties = BasicProperties::default()
            .with_content_type(ExpiryMessage::CONTENT_TYPE.into())
            .with_delivery_mode(2)
            .with_message_id(message_id.as_str().into())
            .with_timestamp(u64::try_from(Utc::now().timestamp()).unwrap_or(0));
        let (channel, link_id) = self.channel().await?;
        let options = BasicPublishOptions {
            mandatory: true,
            ..BasicPublishOptions::default()
        };
        let body = message.encode();
        let publishing = async {
            let exchange = route.exchange.as_str().into();
            let key = route.routing_key.as_str().into();
            channel
                .basic_publish(exchange, key, options, &body, properties)
                .await?
                .await
        };
        let confirmation = match amqp::bounded("publisher confirm", self.timeout, publishing).await
        {
            Ok(confirmation) => confirmation,
            Err(error) => {
                // A link that swallowed a confirm is not trusted (a half-open TCP
                // connection looks like this until heartbeats notice, minutes
                // later): the next call opens a fresh one.
                let timed_out = matches!(error, BrokerError::Timeout { .. });
                self.forget(&channel, link_id, timed_out).await;
                return Err(error.into());
            }
        };
        confirmed(confirmation, message, route, message_id)
    }

    /// The current channel and its link id, (re)connecting if there is none or
    /// it has failed.
    async fn channel(&self) -> Result<(Channel, u64), ScheduleError> {
        let mut link = self.link.lock().await;
        if let Some(l) = link.as_ref()
            && l.channel.status().connected()
            && l.connection.status().connected()
        {
            return Ok((l.channel.clone(), l.id));
        }
        *link = None;
        let name = "order-expiry publisher";
        let connection = amqp::connect(&self.url, &self.tls, name, self.timeout).await?;
        let channel =
            amqp::bounded("channel.open", self.timeout, connection.create_channel()).await?;
        let confirms = channel.confirm_select(ConfirmSelectOptions::default());
        amqp::bounded("confirm.select", self.timeout, confirms).await?;
        let id = LINKS.fetch_add(1, Ordering::Relaxed);
        *link = Some(Link {
            connection,
            channel: channel.clone(),
            id,
        });
        Ok((channel, id))
    }

    /// Drops the link `link_id` if it is still the current one and its channel
    /// closed (or `always`), so the next call reconnects. Publishes still in
    /// flight on it keep it open until they finish; lapin then closes it.
    async fn forget(&self, failed: &Channel, link_id: u64, always: bool) {
        let mut link = self.link.lock().await;
        let same = link.as_ref().is_some_and(|l| l.id == link_id);
        if same && (always || !failed.status().connected()) {
            *link = None;
        }
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
