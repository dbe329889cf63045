//! The publisher library the order service links.
//!
//! [`Scheduler::schedule`] returns `Ok` only once the broker has confirmed a
//! persistent, `mandatory` message that a queue accepted; every other ending is an
//! error the caller sees (nack, unroutable, timeout, lost connection, delay too
//! long, invalid order id). The connection is opened lazily and re-opened on the
//! next call after it drops.

use std::time::Duration;

use chrono::{DateTime, Utc};
use futures::{Stream, StreamExt};
use lapin::options::{BasicPublishOptions, ConfirmSelectOptions};
use lapin::{BasicProperties, Channel, Confirmation, Connection};
use secrecy::SecretString;
use thiserror::Error;
use tokio::sync::Mutex;

use crate::broker::{self, ConnectError, TlsFiles};
use crate::ladder::{DelayTooLong, Ladder, Route};
use crate::message::{CONTENT_TYPE, ExpiryMessage, InvalidOrderId};
use crate::settings::Settings;

/// Why a schedule call did not end with a message durable in the broker.
#[derive(Debug, Error)]
pub enum ScheduleError {
    /// The order id breaks the contract (1-128 characters, no control characters).
    #[error("invalid order id: {0}")]
    InvalidOrderId(#[from] InvalidOrderId),
    /// The due time is further away than the ladder can hold.
    #[error(transparent)]
    DelayTooLong(#[from] DelayTooLong),
    /// The ladder description cannot be built from the settings.
    #[error("invalid topology settings: {0}")]
    Topology(#[from] crate::ladder::LadderError),
    /// The broker negatively acknowledged the message (e.g. a full queue with
    /// `reject-publish`): it does not hold it.
    #[error("broker refused the message for order {order_id:?} (nack)")]
    Nacked {
        /// The order.
        order_id: String,
    },
    /// No queue accepted the message: the topology is missing or wrong.
    #[error(
        "message for order {order_id:?} was unroutable via {exchange} ({reply_code} {reply_text}); is the topology applied?"
    )]
    Unroutable {
        /// The order.
        order_id: String,
        /// The exchange it was published to.
        exchange: String,
        /// AMQP reply code (312 NO_ROUTE).
        reply_code: u16,
        /// AMQP reply text.
        reply_text: String,
    },
    /// The broker did not confirm in time; the message may or may not be held.
    #[error("no publisher confirm within {0:?}")]
    Timeout(Duration),
    /// The channel or connection failed while publishing.
    #[error("broker connection failed while publishing: {0}")]
    Broker(#[from] lapin::Error),
    /// No connection could be opened.
    #[error(transparent)]
    Connect(#[from] ConnectError),
}

impl ScheduleError {
    /// Short label for the `order_expiry_schedule_total{result}` metric.
    pub fn label(&self) -> &'static str {
        match self {
            Self::InvalidOrderId(_) => "invalid_order_id",
            Self::DelayTooLong(_) => "delay_too_long",
            Self::Topology(_) => "topology",
            Self::Nacked { .. } => "nacked",
            Self::Unroutable { .. } => "unroutable",
            Self::Timeout(_) => "timeout",
            Self::Broker(_) | Self::Connect(_) => "connection",
        }
    }
}

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

/// Default of [`Scheduler::with_lead`]: above the ladder's transit tail that
/// `bench lateness` measured here without a lead (max 42 ms quiet, 219 ms with
/// both cores busy; README, Timeliness).
pub const DEFAULT_LEAD: Duration = Duration::from_millis(300);

struct Link {
    connection: Connection,
    channel: Channel,
    /// Tells links apart: channel ids repeat across connections.
    id: u64,
}

/// Source of [`Link::id`]s.
static LINKS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

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
    timeout: Duration,
    ladder: Ladder,
    max_in_flight: usize,
    lead: Duration,
    tls: TlsFiles,
    link: Mutex<Option<Link>>,
}

impl std::fmt::Debug for Scheduler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Scheduler")
            .field("url", &crate::settings::redact_url(&self.url))
            .field("ladder", &self.ladder)
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

impl Scheduler {
    /// A scheduler for the broker and ladder of `settings`. Connects on first use.
    pub fn from_settings(settings: &Settings) -> Result<Self, ScheduleError> {
        Ok(Self::new(
            settings.amqp.url.clone(),
            settings.ladder()?,
            settings.amqp.timeout(),
            settings.publisher.max_in_flight,
        )
        .with_lead(Duration::from_millis(settings.publisher.lead_ms))
        .with_tls(TlsFiles::from_settings(&settings.amqp)))
    }

    /// A scheduler for `ladder` on the broker at `url`; `timeout` bounds
    /// connecting and each confirm; `max_in_flight` bounds `schedule_many`.
    pub fn new(url: SecretString, ladder: Ladder, timeout: Duration, max_in_flight: usize) -> Self {
        Self {
            url,
            timeout,
            ladder,
            max_in_flight: max_in_flight.max(1),
            lead: DEFAULT_LEAD,
            tls: TlsFiles::default(),
            link: Mutex::new(None),
        }
    }

    /// TLS files for an `amqps://` broker with a private CA or client
    /// certificates (default: none, the system roots).
    pub fn with_tls(mut self, tls: TlsFiles) -> Self {
        self.tls = tls;
        self
    }

    /// How much earlier than `due_at` the ladder may deliver (default
    /// [`DEFAULT_LEAD`]). The ladder's transit (a few ms per level dead-lettered,
    /// more under load) then falls inside the consumer's hold instead of making
    /// the cancel late; the consumer never processes a message before `due_at`.
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
    /// confirmed it; a `due_at` in the past is delivered at once.
    pub async fn schedule(
        &self,
        order_id: &str,
        due_at: DateTime<Utc>,
    ) -> Result<Scheduled, ScheduleError> {
        let result = self.publish(order_id, due_at).await;
        let label = match &result {
            Ok(_) => "ok",
            Err(e) => e.label(),
        };
        metrics::counter!("order_expiry_schedule_total", "result" => label).increment(1);
        result
    }

    /// Schedules many orders with up to `max_in_flight` confirms outstanding at
    /// once; one result per input, in input order.
    pub async fn schedule_many<I>(&self, orders: I) -> Vec<Result<Scheduled, ScheduleError>>
    where
        I: IntoIterator<Item = (String, DateTime<Utc>)>,
    {
        self.schedule_stream(futures::stream::iter(orders))
            .collect()
            .await
    }

    /// Streaming form of [`Scheduler::schedule_many`]: memory stays bounded by the
    /// in-flight window however many orders pass through.
    pub fn schedule_stream<'a, S>(
        &'a self,
        orders: S,
    ) -> impl Stream<Item = Result<Scheduled, ScheduleError>> + 'a
    where
        S: Stream<Item = (String, DateTime<Utc>)> + 'a,
    {
        orders
            .map(move |(order_id, due_at)| async move { self.schedule(&order_id, due_at).await })
            .buffered(self.max_in_flight)
    }

    /// Closes the connection cleanly.
    pub async fn close(&self) {
        if let Some(link) = self.link.lock().await.take() {
            let _ = link.channel.close(200, "closing".into()).await;
            let _ = link.connection.close(200, "closing".into()).await;
        }
    }

    async fn publish(
        &self,
        order_id: &str,
        due_at: DateTime<Utc>,
    ) -> Result<Scheduled, ScheduleError> {
        let message = ExpiryMessage::new(order_id, due_at)?;
        let lead_ms = i64::try_from(self.lead.as_millis()).unwrap_or(i64::MAX);
        let remaining_ms = (message.due_at - Utc::now()).num_milliseconds() - lead_ms;
        let route = self.ladder.route_for_remaining_ms(remaining_ms)?;
        let message_id = uuid::Uuid::new_v4().to_string();
        let properties = BasicProperties::default()
            .with_content_type(CONTENT_TYPE.into())
            .with_delivery_mode(2)
            .with_message_id(message_id.as_str().into())
            .with_timestamp(u64::try_from(Utc::now().timestamp()).unwrap_or(0));
        let (channel, link_id) = self.channel().await?;
        let options = BasicPublishOptions {
            mandatory: true,
            ..BasicPublishOptions::default()
        };
        let confirmed = tokio::time::timeout(self.timeout, async {
            channel
                .basic_publish(
                    route.exchange.as_str().into(),
                    route.routing_key.as_str().into(),
                    options,
                    &message.encode(),
                    properties,
                )
                .await?
                .await
        })
        .await;
        let confirmation = match confirmed {
            Err(_) => {
                // A link that swallowed a confirm is not trusted (a half-open TCP
                // connection looks like this until heartbeats notice, minutes
                // later): the next call opens a fresh one.
                self.forget(&channel, link_id, true).await;
                return Err(ScheduleError::Timeout(self.timeout));
            }
            Ok(Err(e)) => {
                self.forget(&channel, link_id, false).await;
                return Err(ScheduleError::Broker(e));
            }
            Ok(Ok(c)) => c,
        };
        match confirmation {
            Confirmation::Ack(None) => Ok(Scheduled {
                message_id,
                due_at: message.due_at,
                route,
            }),
            Confirmation::Ack(Some(returned)) => Err(ScheduleError::Unroutable {
                order_id: message.order_id,
                exchange: route.exchange,
                reply_code: returned.reply_code,
                reply_text: returned.reply_text.to_string(),
            }),
            Confirmation::Nack(_) => Err(ScheduleError::Nacked {
                order_id: message.order_id,
            }),
            // confirm_select is always on; treat the impossible as a refusal.
            Confirmation::NotRequested => Err(ScheduleError::Nacked {
                order_id: message.order_id,
            }),
        }
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
        let connection =
            broker::connect_tls(&self.url, &self.tls, "order-expiry publisher", self.timeout)
                .await?;
        let channel = bounded(self.timeout, connection.create_channel()).await?;
        bounded(
            self.timeout,
            channel.confirm_select(ConfirmSelectOptions::default()),
        )
        .await?;
        let id = LINKS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
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

async fn bounded<T>(
    timeout: Duration,
    op: impl Future<Output = lapin::Result<T>>,
) -> Result<T, ScheduleError> {
    match tokio::time::timeout(timeout, op).await {
        Ok(result) => Ok(result?),
        Err(_) => Err(ScheduleError::Timeout(timeout)),
    }
}
