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
//! 150-470 ms there, past the 300 ms lead (docs/src/results/flash-sales.md).
//!
//! Every schedule call takes the caller's trace context (feature `otel`: the
//! current `tracing` span's, when valid) and sends it with the order as the
//! W3C `traceparent`/`tracestate` headers ([`TraceContext`]).

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::{DateTime, Utc};
use futures::future::{self, Either};
use futures::{Stream, StreamExt};
use lapin::BasicProperties;
use lapin::types::{AMQPValue, FieldTable};
use secrecy::SecretString;
use tokio::sync::{Notify, Semaphore, oneshot};

use super::bundle::{encode_bundle, encode_entry};
use super::error::ScheduleError;
use super::group::{Bundle, Limits, Waiter, Waiting};
use super::message::ExpiryMessage;
use super::order_id::OrderId;
use super::trace::{self, TraceContext};
use crate::amqp::{self, BrokerError, ConfirmLink, Confirmed, Confirming, Confirms, TlsFiles};
use crate::clock::Clock;
use crate::settings::{Settings, redact_url};
use crate::telemetry::SCHEDULE_TOTAL;
use crate::topology::{DelayTooLong, Ladder, Route};

/// What the broker confirmed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Scheduled {
    /// The `message_id` property of the message that carries the order:
    /// unique per message; the orders of one bundle share it.
    pub message_id: String,
    /// The due time on the wire (rounded up to the millisecond).
    pub due_at: DateTime<Utc>,
    /// Where it entered the ladder.
    pub route: Route,
    /// Orders in the message that carries it: 1 for a v1 message, more for a
    /// v2 bundle (group commit, see [`Scheduler::schedule`]).
    pub orders_in_message: usize,
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
    /// Bundles being published now (not yet confirmed).
    carrying: AtomicUsize,
    /// Told when a bundle was confirmed or a full one gathered.
    bundle_event: Notify,
    lead: Duration,
    /// A bundle's lead (`publisher.bundle_lead_ms`), never less than `lead`.
    bundle_lead: Duration,
    link: ConfirmLink,
    bundles: Limits,
    /// Calls waiting for a slot: the next free slot carries them as a bundle.
    waiting: Mutex<Waiting>,
    /// Source of waiter ids.
    next_waiter: AtomicU64,
    /// The clock delays are measured by: this host's, or (the outbox relay)
    /// this host's corrected to the database's, whose `due_at`s it relays.
    clock: Clock,
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
            carrying: AtomicUsize::new(0),
            bundle_event: Notify::new(),
            lead: settings.publisher.lead,
            bundle_lead: settings.publisher.bundle_lead(),
            link: ConfirmLink::new(url, tls, "order-expiry publisher", settings.amqp.timeout),
            bundles: Limits {
                max_orders: settings.publisher.bundle_max_orders.max(1),
                max_bytes: settings.publisher.bundle_max_bytes,
                span: settings.publisher.bundle_span,
            },
            waiting: Mutex::new(Waiting::default()),
            next_waiter: AtomicU64::new(0),
            clock: Clock::local(),
        }
    }

    /// Measures delays by `clock` instead of this host's own: the outbox
    /// relay's `due_at`s are the database's.
    #[cfg(feature = "service")]
    pub(crate) fn with_clock(mut self, clock: Clock) -> Self {
        self.clock = clock;
        self
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

    /// Most orders in one bundle message (`publisher.bundle_max_orders`); 1
    /// sends each order as a v1 message of its own.
    pub fn with_bundle_max_orders(mut self, max_orders: usize) -> Self {
        self.bundles.max_orders = max_orders.max(1);
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
        self.bundle_lead = self.bundle_lead.max(lead);
        self
    }

    /// How much earlier than `due_at` the ladder may deliver a v2 bundle
    /// (`publisher.bundle_lead_ms`; never less than the lead). Bundles leave
    /// only while the confirm window is full, in a burst, and a burst's
    /// messages expire from each level of the ladder together and queue
    /// there behind each other: their transit is longer than one message's.
    pub fn with_bundle_lead(mut self, lead: Duration) -> Self {
        self.bundle_lead = lead.max(self.lead);
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
    ///
    /// With a free slot in the confirm window the order leaves at once, alone
    /// (a v1 message). While every slot waits for its confirm, calls waiting
    /// for one whose orders take the same route leave together in one v2
    /// bundle on the next free slot, and each returns on that bundle's
    /// confirm (group commit: a flash sale costs the broker one message per
    /// bundle, not per order).
    ///
    /// With the `otel` feature the order carries the trace context of the
    /// current `tracing` span (`TraceContext::current`).
    pub async fn schedule<O>(
        &self,
        order_id: O,
        due_at: DateTime<Utc>,
    ) -> Result<Scheduled, ScheduleError>
    where
        O: TryInto<OrderId>,
        ScheduleError: From<O::Error>,
    {
        let trace = trace::current();
        let result = match order_id.try_into() {
            Ok(order_id) => {
                let message = ExpiryMessage::new(order_id, due_at).with_trace(trace);
                self.publish(message).await
            }
            Err(invalid) => Err(invalid.into()),
        };
        count(&result);
        result
    }

    /// [`Scheduler::schedule`] for a message built by the caller, for an
    /// order service that passes its trace context explicitly
    /// ([`ExpiryMessage::with_trace`]) rather than through a `tracing` span.
    /// A message without a context takes the current span's (feature `otel`).
    pub async fn schedule_message(
        &self,
        message: ExpiryMessage,
    ) -> Result<Scheduled, ScheduleError> {
        let message = match message.trace {
            Some(_) => message,
            None => message.with_trace(trace::current()),
        };
        let result = self.publish(message).await;
        count(&result);
        result
    }

    /// Schedules many orders with up to `max_in_flight` confirms outstanding at
    /// once (shared with every other call on this scheduler), bundled while
    /// the window is full; one result per input, in input order.
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
    /// in-flight window however many orders pass through. Every order carries
    /// the trace context current when this is called (feature `otel`).
    pub fn schedule_stream<'a, S, O>(
        &'a self,
        orders: S,
    ) -> impl Stream<Item = Result<Scheduled, ScheduleError>> + 'a
    where
        S: Stream<Item = (O, DateTime<Utc>)> + 'a,
        O: TryInto<OrderId> + 'a,
        ScheduleError: From<O::Error>,
    {
        let trace = trace::current();
        self.schedule_messages(orders.map(move |(order_id, due_at)| {
            order_id
                .try_into()
                .map(|id| ExpiryMessage::new(id, due_at).with_trace(trace.clone()))
                .map_err(Into::into)
        }))
    }

    /// [`Scheduler::schedule_stream`] of messages built already (the outbox
    /// relay's rows), each with its own trace context, or the reason one
    /// could not be built; one result per item, in order.
    pub(crate) fn schedule_messages<'a, S>(
        &'a self,
        orders: S,
    ) -> impl Stream<Item = Result<Scheduled, ScheduleError>> + 'a
    where
        S: Stream<Item = Result<ExpiryMessage, ScheduleError>> + 'a,
    {
        let bundle = self.bundles.max_orders;
        // Bundles on: what is ready at once leaves as one group, every order
        // in the waiting queue before any takes a slot, so a batch fills its
        // bundles from its first message on (one by one, the first calls
        // would find free slots and leave alone). A stream that trickles
        // gives groups of one: nothing waits for more to come.
        orders
            .ready_chunks(bundle)
            .map(move |chunk| async move {
                let mut results: Vec<Option<Result<Scheduled, ScheduleError>>> = Vec::new();
                let mut valid = Vec::with_capacity(chunk.len());
                for message in chunk {
                    match message {
                        Ok(message) => {
                            valid.push(message);
                            results.push(None);
                        }
                        Err(invalid) => results.push(Some(Err(invalid))),
                    }
                }
                let mut published = self.publish_group(valid).await.into_iter();
                let results: Vec<_> = results
                    .into_iter()
                    .map(|r| {
                        r.or_else(|| published.next())
                            .unwrap_or_else(never_answered)
                    })
                    .inspect(count)
                    .collect();
                futures::stream::iter(results)
            })
            .buffered(self.max_in_flight)
            .flatten()
    }

    /// Closes the connection cleanly.
    pub async fn close(&self) {
        self.link.close().await;
    }

    async fn publish(&self, message: ExpiryMessage) -> Result<Scheduled, ScheduleError> {
        if self.bundles.max_orders <= 1 {
            // The semaphore is never closed, so acquiring cannot fail; the slot
            // is held until the confirm (or the error) and the route computed after.
            let _slot = self.in_flight.acquire().await.ok();
            return self.publish_alone(message).await;
        }
        // Alone at once when nothing is in flight at all (low load). Otherwise
        // through the waiting queue, where Nagle's rule (`may_carry`) lets a
        // call leave at once when no bundle is in flight, and makes it wait
        // for the one in flight (one confirm round trip at most) otherwise.
        let nobody_waits = self.waiting().is_empty();
        let idle = self.carrying.load(Ordering::Acquire) == 0
            && self.in_flight.available_permits() == self.max_in_flight;
        if nobody_waits
            && idle
            && let Ok(_slot) = self.in_flight.try_acquire()
        {
            return self.publish_alone(message).await;
        }
        let (id, answer) = self.enqueue(message.clone());
        self.wait_for(id, message, answer).await
    }

    /// Every order of `messages` into the waiting queue at once, then each
    /// answer: they leave in as few bundles as their routes allow. One result
    /// per message, in order.
    async fn publish_group(
        &self,
        messages: Vec<ExpiryMessage>,
    ) -> Vec<Result<Scheduled, ScheduleError>> {
        if self.bundles.max_orders <= 1 || messages.len() <= 1 {
            let publishing = messages.into_iter().map(|m| self.publish(m));
            return futures::future::join_all(publishing).await;
        }
        let queued: Vec<_> = messages
            .into_iter()
            .map(|m| (self.enqueue(m.clone()), m))
            .collect();
        let mut results = Vec::with_capacity(queued.len());
        for ((id, answer), message) in queued {
            results.push(self.wait_for(id, message, answer).await);
        }
        results
    }

    /// Puts `message` in the waiting queue: the next slot's bundle may take it.
    fn enqueue(&self, message: ExpiryMessage) -> (u64, Answer) {
        let id = self.next_waiter.fetch_add(1, Ordering::Relaxed);
        let (reply, answer) = oneshot::channel();
        let waiting = {
            let mut queue = self.waiting();
            queue.push(Waiter { id, message, reply });
            queue.len()
        };
        if waiting == self.bundles.max_orders {
            self.bundle_event.notify_waiters();
        }
        (id, answer)
    }

    /// Whether a call holding a slot may carry the next bundle now: no bundle
    /// is in flight, or a full one waits.
    fn may_carry(&self) -> bool {
        self.carrying.load(Ordering::Acquire) == 0
            || self.waiting().len() >= self.bundles.max_orders
    }

    /// Waits for the answer about waiter `id` (`message`), carrying the
    /// next bundle on every slot it gets while calls wait.
    async fn wait_for(
        &self,
        mut id: u64,
        message: ExpiryMessage,
        mut answer: Answer,
    ) -> Result<Scheduled, ScheduleError> {
        loop {
            let answered = loop {
                // Our answer first, then a slot (the publisher has no
                // tokio macros: `select` polls its left side first).
                let acquiring = std::pin::pin!(self.in_flight.acquire());
                let slot = match future::select(&mut answer, acquiring).await {
                    Either::Left((answered, _)) => break answered,
                    Either::Right((slot, _)) => slot.ok(),
                };
                // Nagle's rule: a bundle that is not full leaves only when no
                // other bundle is in flight; full ones leave on any free slot.
                // Under load the broker then gets one message per confirm
                // round trip until bundles fill, then as many full ones as
                // the window holds: few, full messages, never a window of
                // single orders.
                if !self.may_carry() {
                    drop(slot);
                    let mut event = std::pin::pin!(self.bundle_event.notified());
                    event.as_mut().enable();
                    if self.may_carry() {
                        continue;
                    }
                    match future::select(&mut answer, event).await {
                        Either::Left((answered, _)) => break answered,
                        Either::Right(((), _)) => continue,
                    }
                }
                let carried = self.carry_next_bundle().await;
                // The slot is free again before this call waits for its own
                // answer: a waiting call never holds a slot idle.
                drop(slot);
                if let Err(error) = carried {
                    let ours = self.waiting().remove(id);
                    // Ours was not taken yet: this call ends with the error.
                    if ours.is_some() {
                        return Err(error);
                    }
                    break (&mut answer).await;
                }
                let nobody_waits = self.waiting().is_empty();
                if nobody_waits {
                    break (&mut answer).await;
                }
            };
            match answered {
                Ok(result) => return result,
                // The call that took our order was dropped before its confirm
                // (a caller's timeout): the broker may or may not hold it;
                // publish it again (a duplicate is cancelled once).
                Err(_) => (id, answer) = self.enqueue(message.clone()),
            }
        }
    }

    /// The broker let a confirm time out: every call still waiting for a
    /// slot fails now with the same error (nothing of theirs was published),
    /// instead of waiting its turn to time out too. Under Nagle's rule the
    /// bundles that are not full leave one at a time, so a broker that stopped
    /// answering would otherwise fail a queue of them one timeout each.
    fn fail_waiting(&self, error: &BrokerError) {
        let waiters = self.waiting().take_all();
        for waiter in waiters {
            let failed = PublishFailed::Broker(error.clone());
            let _ = waiter.reply.send(Err(failed.into()));
        }
    }

    fn waiting(&self) -> std::sync::MutexGuard<'_, Waiting> {
        // The lock is never held across an await, and nothing panics inside it.
        self.waiting
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// On a slot the caller holds: takes the next bundle of waiting calls
    /// and publishes it, answering each. `Err` only when no channel could be
    /// opened, before anything was taken.
    async fn carry_next_bundle(&self) -> Result<(), ScheduleError> {
        let (channel, link_id) = self.link.channel().await?;
        let taken = self.waiting().take_bundle(
            &self.ladder,
            self.bundle_lead,
            self.bundles,
            self.clock.now(),
        );
        let Some(bundle) = taken else { return Ok(()) };
        self.carrying.fetch_add(1, Ordering::AcqRel);
        let _carried = Carried(self);
        self.publish_bundle(&channel, link_id, bundle).await;
        Ok(())
    }

    /// Publishes a taken bundle (one order alone as v1) and answers each.
    async fn publish_bundle(&self, channel: &Confirms, link_id: u64, bundle: Bundle) {
        if bundle.members.len() == 1 {
            // Alone after all: a v1 message, as at low load.
            for (waiter, _) in bundle.members {
                let result =
                    self.publish_on(channel, link_id, waiter.message.clone(), self.clock.now());
                let _ = waiter.reply.send(result.await);
            }
            return;
        }
        let message_id = uuid::Uuid::new_v4().to_string();
        let orders = bundle.members.len();
        let body = encode_bundle(bundle.members.iter().map(|(_, e)| e.as_slice()));
        // The entries were written against the first order's context.
        let trace = bundle.members[0].0.message.trace.as_ref();
        let outgoing =
            Outgoing::with_body(bundle.route, body, &message_id, self.clock.now(), trace);
        let answer = self.confirm(channel, link_id, &outgoing).await;
        for (waiter, _) in bundle.members {
            let result = match &answer {
                Ok(confirmation) => confirmed(
                    confirmation,
                    waiter.message,
                    outgoing.route.clone(),
                    message_id.clone(),
                    orders,
                ),
                Err(error) => Err(error.clone().into()),
            };
            let _ = waiter.reply.send(result);
        }
    }

    /// Publishes one order alone (v1), on a slot the caller holds.
    async fn publish_alone(&self, message: ExpiryMessage) -> Result<Scheduled, ScheduleError> {
        let (channel, link_id) = self.link.channel().await?;
        self.publish_on(&channel, link_id, message, self.clock.now())
            .await
    }

    async fn publish_on(
        &self,
        channel: &Confirms,
        link_id: u64,
        message: ExpiryMessage,
        now: DateTime<Utc>,
    ) -> Result<Scheduled, ScheduleError> {
        let message_id = uuid::Uuid::new_v4().to_string();
        let outgoing = Outgoing::new(&message, &self.ladder, self.lead, &message_id, now)?;
        let confirmation = self.confirm(channel, link_id, &outgoing).await?;
        confirmed(&confirmation, message, outgoing.route, message_id, 1)
    }

    /// Publishes `outgoing` and waits for the broker's answer, bounded.
    async fn confirm(
        &self,
        channel: &Confirms,
        link_id: u64,
        outgoing: &Outgoing,
    ) -> Result<Confirmed, PublishFailed> {
        let publishing = outgoing.publish(channel);
        match amqp::bounded("publisher confirm", self.link.timeout, publishing).await {
            Ok(confirmation) => Ok(confirmation),
            Err(error) => {
                // A link that swallowed a confirm is not trusted (a half-open TCP
                // connection looks like this until heartbeats notice, minutes
                // later): the next call opens a fresh one.
                let timed_out = matches!(error, BrokerError::Timeout { .. });
                self.link.forget(channel, link_id, timed_out).await;
                if timed_out {
                    self.fail_waiting(&error);
                }
                if let BrokerError::Failed { source, .. } = &error
                    && amqp::is_not_found(source)
                {
                    let exchange = outgoing.route.exchange.clone();
                    return Err(PublishFailed::TopologyMissing(exchange));
                }
                Err(PublishFailed::Broker(error))
            }
        }
    }
}

/// A bundle in flight, counted in `carrying` until dropped (also when the
/// carrying call is cancelled); its end wakes the calls that wait to carry.
struct Carried<'a>(&'a Scheduler);

impl Drop for Carried<'_> {
    fn drop(&mut self) {
        self.0.carrying.fetch_sub(1, Ordering::AcqRel);
        self.0.bundle_event.notify_waiters();
    }
}

/// Where a waiting call hears how its order went.
type Answer = oneshot::Receiver<Result<Scheduled, ScheduleError>>;

/// Counts one schedule call's result in `order_expiry_schedule_total`.
fn count(result: &Result<Scheduled, ScheduleError>) {
    let label = match result {
        Ok(_) => "ok",
        Err(e) => e.label(),
    };
    metrics::counter!(SCHEDULE_TOTAL.name, "result" => label).increment(1);
}

/// A result that cannot be missing (one per valid order); a timeout if it were.
fn never_answered() -> Result<Scheduled, ScheduleError> {
    Err(ScheduleError::Timeout(Duration::ZERO))
}

/// A publish that got no confirm; every order of a bundle sees the same.
#[derive(Debug, Clone)]
enum PublishFailed {
    TopologyMissing(String),
    Broker(BrokerError),
}

impl From<PublishFailed> for ScheduleError {
    fn from(failed: PublishFailed) -> Self {
        match failed {
            PublishFailed::TopologyMissing(exchange) => Self::TopologyMissing { exchange },
            PublishFailed::Broker(error) => error.into(),
        }
    }
}

/// The whole seconds `message` waits in the ladder when published at `now`,
/// arriving `lead` before it may be processed.
pub(super) fn remaining_secs(message: &ExpiryMessage, lead: Duration, now: DateTime<Utc>) -> u64 {
    u64::try_from(remaining_ms(message, lead, now).max(0) / 1000).unwrap_or(0)
}

/// Its route through `ladder` (see [`remaining_secs`]).
pub(crate) fn remaining_route(
    message: &ExpiryMessage,
    ladder: &Ladder,
    lead: Duration,
    now: DateTime<Utc>,
) -> Result<Route, DelayTooLong> {
    ladder.route_for_remaining_ms(remaining_ms(message, lead, now))
}

fn remaining_ms(message: &ExpiryMessage, lead: Duration, now: DateTime<Utc>) -> i64 {
    let lead_ms = i64::try_from(lead.as_millis()).unwrap_or(i64::MAX);
    (message.process_at() - now)
        .num_milliseconds()
        .saturating_sub(lead_ms)
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
    /// `message_id` and no header but its trace context's (never `x-death`:
    /// a message re-entering the ladder with it could be dropped as a
    /// dead-letter cycle).
    pub(crate) fn new(
        message: &ExpiryMessage,
        ladder: &Ladder,
        lead: Duration,
        message_id: &str,
        now: DateTime<Utc>,
    ) -> Result<Self, DelayTooLong> {
        let route = remaining_route(message, ladder, lead, now)?;
        let trace = message.trace.as_ref();
        Ok(Self::with_body(
            route,
            message.encode(),
            message_id,
            now,
            trace,
        ))
    }

    /// `messages` in one message: a v1 one for one order, a v2 bundle for
    /// more, routed by the earliest of them (the others arrive a little
    /// earlier than they need, and are held); each keeps its trace context
    /// (the headers carry `first`'s).
    #[cfg_attr(not(feature = "service"), allow(dead_code))]
    pub(crate) fn for_orders(
        first: &ExpiryMessage,
        rest: &[ExpiryMessage],
        ladder: &Ladder,
        lead: Duration,
        message_id: &str,
        now: DateTime<Utc>,
    ) -> Result<Self, DelayTooLong> {
        if rest.is_empty() {
            return Self::new(first, ladder, lead, message_id, now);
        }
        let all = || std::iter::once(first).chain(rest);
        let earliest = all().min_by_key(|m| m.process_at()).unwrap_or(first);
        let route = remaining_route(earliest, ladder, lead, now)?;
        let trace = first.trace.as_ref();
        let entries: Vec<Vec<u8>> = all().map(|m| encode_entry(m, trace)).collect();
        let body = encode_bundle(entries.iter().map(Vec::as_slice));
        Ok(Self::with_body(route, body, message_id, now, trace))
    }

    /// `body` (a v1 message or a v2 bundle) on `route`, with the same
    /// properties, and `trace` (a v1 order's context, a bundle's first
    /// order's) as the `traceparent`/`tracestate` headers.
    pub(crate) fn with_body(
        route: Route,
        body: Vec<u8>,
        message_id: &str,
        now: DateTime<Utc>,
        trace: Option<&TraceContext>,
    ) -> Self {
        let mut properties = BasicProperties::default()
            .with_content_type(ExpiryMessage::CONTENT_TYPE.into())
            .with_delivery_mode(2)
            .with_message_id(message_id.into())
            .with_timestamp(u64::try_from(now.timestamp()).unwrap_or(0));
        if let Some(trace) = trace {
            properties = properties.with_headers(trace_headers(trace));
        }
        Self {
            route,
            body,
            properties,
        }
    }

    /// Publishes it `mandatory` through `confirms`: on its way when this
    /// returns, the future is the broker's answer (the caller bounds it; a
    /// pipelining caller keeps a window of them outstanding).
    pub(crate) fn publish(&self, confirms: &Confirms) -> Confirming {
        let route = &self.route;
        let (body, properties) = (self.body.clone(), self.properties.clone());
        confirms.publish(&route.exchange, &route.routing_key, body, properties)
    }
}

/// The AMQP headers that carry `trace`, as the W3C/OpenTelemetry AMQP
/// propagation writes them (long strings).
pub(crate) fn trace_headers(trace: &TraceContext) -> FieldTable {
    let mut headers = FieldTable::default();
    let text = |s: &str| AMQPValue::LongString(s.into());
    headers.insert(TraceContext::TRACEPARENT.into(), text(trace.traceparent()));
    if let Some(state) = trace.tracestate() {
        headers.insert(TraceContext::TRACESTATE.into(), text(state));
    }
    headers
}

/// The trace headers a received message carries, as text (a header that
/// is not a UTF-8 string is none).
#[cfg(feature = "service")]
pub(crate) fn received_trace(properties: &BasicProperties) -> super::TraceHeaders<'_> {
    let Some(headers) = properties.headers() else {
        return super::TraceHeaders::NONE;
    };
    let text = |name: &str| match headers.inner().get(name) {
        Some(AMQPValue::LongString(s)) => std::str::from_utf8(s.as_bytes()).ok(),
        Some(AMQPValue::ShortString(s)) => Some(s.as_str()),
        _ => None,
    };
    super::TraceHeaders {
        traceparent: text(TraceContext::TRACEPARENT),
        tracestate: text(TraceContext::TRACESTATE),
    }
}

/// What the broker's answer to one publish means for the caller.
fn confirmed(
    confirmation: &Confirmed,
    message: ExpiryMessage,
    route: Route,
    message_id: String,
    orders_in_message: usize,
) -> Result<Scheduled, ScheduleError> {
    let order_id = message.order_id.into_string();
    match confirmation {
        Confirmed::Taken => Ok(Scheduled {
            message_id,
            due_at: message.due_at,
            route,
            orders_in_message,
        }),
        Confirmed::Returned {
            reply_code,
            reply_text,
        } => Err(ScheduleError::Unroutable {
            order_id,
            exchange: route.exchange,
            reply_code: *reply_code,
            reply_text: reply_text.clone(),
        }),
        Confirmed::Nacked => Err(ScheduleError::Nacked { order_id }),
    }
}

#[cfg(all(test, feature = "service"))]
mod tests {
    use chrono::TimeDelta;

    use super::*;
    use crate::publisher::DueMessage;

    fn order(id: &str, traceparent: Option<&str>) -> ExpiryMessage {
        let due_at = Utc::now() + TimeDelta::seconds(5);
        let trace = traceparent.map(|t| TraceContext::parse(t, Some("rojo=1")).unwrap());
        ExpiryMessage::new(OrderId::new(id).unwrap(), due_at).with_trace(trace)
    }

    /// What a consumer reads back from `outgoing`: body and headers.
    fn received(outgoing: &Outgoing) -> Vec<ExpiryMessage> {
        let trace = received_trace(&outgoing.properties);
        let decoded = DueMessage::decode_traced(&outgoing.body, None, 16384, trace).unwrap();
        decoded.messages().cloned().collect()
    }

    #[test]
    fn each_order_reaches_the_consumer_with_its_own_context_alone_or_bundled() {
        let ladder = Ladder::new("t", 10).unwrap();
        let (lead, now) = (Duration::ZERO, Utc::now());
        let a = order(
            "A",
            Some("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"),
        );
        let b = order(
            "B",
            Some("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-00"),
        );
        let c = order("C", None);
        let one = Outgoing::new(&a, &ladder, lead, "m", now).unwrap();
        assert_eq!(received(&one), std::slice::from_ref(&a));
        // Untraced: no headers at all, the body as before.
        let plain = Outgoing::new(&c, &ladder, lead, "m", now).unwrap();
        assert!(plain.properties.headers().is_none());
        assert_eq!(
            (received(&plain), plain.body.clone()),
            (vec![c.clone()], c.encode())
        );
        for orders in [[&a, &b, &c], [&c, &a, &b], [&b, &c, &a]] {
            let [first, rest @ ..] = orders.map(Clone::clone);
            let many = Outgoing::for_orders(&first, &rest, &ladder, lead, "m", now).unwrap();
            assert_eq!(received(&many), orders.map(Clone::clone));
        }
    }
}
