//! The consumer's unit of work: a batch of due messages, each asked about at
//! the payment gateway first (when `action.check` is on), then expired by the
//! [`Action`] in one call, and what finished work reports back to the session.
//! [`InFlight`] is the session's work running now (batches, parks, re-queues).
//!
//! A batch ends in one of three ways: with a verdict for each order (settled
//! with its outcome, to retry, to park, to send through the ladder again, to
//! hold), failed as a whole with an [`ActionError`] (the session isolates the
//! order at fault, see `finished.rs`), or the broker failed.

use std::sync::Arc;
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use futures::future::{BoxFuture, join_all};
use futures::stream::FuturesUnordered;
use futures::{FutureExt, StreamExt};
use lapin::message::Delivery;
use tracing::{Instrument as _, Level, debug, info};

use super::decide::{AfterCheck, Next, after_action, after_check};
use super::outbound::{MoveOut, OutboundError};
use super::session::SessionError;
use super::{Handled, Outcome};
use crate::clock::Clock;
use crate::publisher::{ExpiryMessage, TraceContext};
use crate::service::action::{Action, ActionError, Expiring, PaymentCheck};
use crate::service::{CONSUMER, ORDER_SPAN};
use crate::settings::CheckSettings;
use crate::telemetry::spans::{self, Consuming, OrderTrace};
use crate::telemetry::{
    BATCH_ORDERS, BATCH_SECONDS, EARLY_TOTAL, LATENESS_SECONDS, MESSAGES_TOTAL, NOT_DUE_TOTAL,
};

/// A decoded delivery (or one order of a bundle) waiting for, or in, a
/// batch, with its span.
pub(super) struct Pending {
    /// Shared by the orders of one bundle.
    pub(super) delivery: Arc<Delivery>,
    pub(super) message: ExpiryMessage,
    /// Its `process` span, from arrival to its verdict: its log lines.
    pub(super) span: tracing::Span,
    /// What the span says when it is exported (`telemetry::spans`).
    pub(super) trace: OrderTrace,
    /// The context the action passes on: the span's own when it is
    /// exported, else the one the order came with (`None`: in the message).
    onward: Option<TraceContext>,
    /// Times the action failed for it (busy, or a transient failure), from
    /// the message's `attempts` on: its own backoff.
    pub(super) attempts: u32,
    /// When the action first failed for it in this delivery.
    pub(super) failing_since: Option<Instant>,
}

impl Pending {
    /// An order of `delivery`, consumed as `consuming` says.
    pub(super) fn new(
        delivery: Arc<Delivery>,
        message: ExpiryMessage,
        consuming: &Arc<Consuming>,
    ) -> Self {
        let span = order_span(delivery.redelivered, &message.order_id);
        let trace = OrderTrace::new(&delivery, &message, consuming);
        let onward = trace.onward();
        let attempts = message.attempts;
        Self {
            delivery,
            message,
            span,
            trace,
            onward,
            attempts,
            failing_since: None,
        }
    }

    /// The action failed for it once more: counted, and the first failure's
    /// time kept.
    pub(super) fn failed(&mut self) {
        self.attempts = self.attempts.saturating_add(1);
        self.failing_since.get_or_insert_with(Instant::now);
    }

    pub(super) fn tag(&self) -> u64 {
        self.delivery.delivery_tag
    }

    fn expiring(&self) -> Expiring<'_> {
        Expiring {
            message: &self.message,
            trace: self.onward.as_ref().or(self.message.trace.as_ref()),
            message_id: self
                .delivery
                .properties
                .message_id()
                .as_ref()
                .map(|id| id.as_str()),
        }
    }
}

/// What the batches of one consumer need: the action, the optional payment
/// check and the re-check schedule of orders not found.
pub(super) struct Work<A> {
    pub(super) action: Arc<A>,
    pub(super) check: Option<(PaymentCheck, CheckSettings)>,
    pub(super) unknown_rechecks: Vec<Duration>,
    /// The action's reference clock: the time of every decision.
    pub(super) clock: Clock,
    /// `action.kind`, for the spans.
    pub(super) action_kind: &'static str,
    /// Whether the action or the check passes each order's context on
    /// (every action but SQL does).
    pub(super) passes_on: bool,
}

/// Batches, parks and re-queues running now, concurrently with the delivery loop.
pub(super) struct InFlight {
    running: FuturesUnordered<BoxFuture<'static, Done>>,
}

impl InFlight {
    pub(super) fn new() -> Self {
        Self {
            running: FuturesUnordered::new(),
        }
    }

    /// Starts `work`; it reports through [`InFlight::next`].
    pub(super) fn start(&mut self, work: BoxFuture<'static, Done>) {
        self.running.push(work);
    }

    /// The next work to finish; `None` when nothing runs.
    pub(super) async fn next(&mut self) -> Option<Done> {
        self.running.next().await
    }

    /// How many run now.
    pub(super) fn len(&self) -> usize {
        self.running.len()
    }

    pub(super) fn is_empty(&self) -> bool {
        self.running.is_empty()
    }
}

/// Work that ran concurrently with the delivery loop, finished.
pub(super) enum Done {
    /// A batch went through: each order's verdict, with what the observer
    /// is told about a settled one once its delivery is acked.
    Settled(Vec<(Pending, Next, Option<Handled>)>),
    /// A delivery's leftovers were confirmed and it was acked singly (the
    /// observer was told).
    MovedOut(u64),
    /// It failed in a way worth retrying after a backoff.
    Failed(Failed),
    /// The channel is unusable: the session ends.
    BrokerFailed(SessionError),
}

/// Failed work, its deliveries unacked.
pub(super) enum Failed {
    /// The action failed the batch; `error.class()` says what happens next.
    Action {
        batch: Vec<Pending>,
        error: ActionError,
    },
    /// Some of a delivery's leftovers were not confirmed: these are left.
    MoveOut {
        move_out: MoveOut,
        error: OutboundError,
    },
}

impl Failed {
    /// Deliveries it holds unacked.
    pub(super) fn deliveries(&self) -> usize {
        match self {
            Self::Action { batch, .. } => batch.len(),
            Self::MoveOut { .. } => 1,
        }
    }
}

/// Checks and expires `batch`, as concurrent work of the session.
pub(super) fn expire_work<A: Action>(
    work: Arc<Work<A>>,
    mut batch: Vec<Pending>,
    observed: bool,
) -> BoxFuture<'static, Done> {
    async move {
        let mut next: Vec<Option<Next>> = vec![None; batch.len()];
        if let Some((check, settings)) = &work.check {
            let answers = join_all(batch.iter().map(|p| check.ask(p.expiring()))).await;
            let now = work.clock.now();
            for ((slot, p), answer) in next.iter_mut().zip(&batch).zip(answers) {
                if let AfterCheck::Then(then) = after_check(answer, &p.message, settings, now) {
                    *slot = Some(then);
                }
            }
        }
        let act: Vec<usize> = (0..batch.len()).filter(|i| next[*i].is_none()).collect();
        if !act.is_empty() {
            let span = batch_span(&work, act.iter().map(|i| &batch[*i]));
            for i in &act {
                batch[*i].trace.in_batch(&span);
            }
            let due: Vec<Expiring<'_>> = act.iter().map(|i| batch[*i].expiring()).collect();
            let started = Instant::now();
            let result = work.action.expire(&due).instrument(span).await;
            metrics::histogram!(BATCH_ORDERS.name).record(due.len() as f64);
            metrics::histogram!(BATCH_SECONDS.name).record(started.elapsed().as_secs_f64());
            let verdicts = match result {
                Ok(v) if v.len() == due.len() => v,
                Ok(v) => {
                    let error = ActionError::Unavailable(format!(
                        "the action returned {} verdicts for {} messages",
                        v.len(),
                        due.len()
                    ));
                    return Done::Failed(Failed::Action { batch, error });
                }
                Err(error) => return Done::Failed(Failed::Action { batch, error }),
            };
            let now = work.clock.now();
            for (i, verdict) in act.into_iter().zip(verdicts) {
                let message = &batch[i].message;
                next[i] = Some(after_action(verdict, message, &work.unknown_rechecks, now));
            }
        }
        settle(batch, next, observed, work.clock.now())
    }
    .boxed()
}

/// The span of one batch through the action, when its orders' spans are
/// exported (`Span::none()` otherwise: nothing to link, nothing logged).
/// Its orders and it link to each other when the orders are finished.
fn batch_span<'a, A>(
    work: &Work<A>,
    orders: impl Iterator<Item = &'a Pending> + Clone,
) -> tracing::Span {
    if !orders.clone().any(|p| p.trace.is_exported()) {
        return tracing::Span::none();
    }
    let count = orders.clone().count();
    let span = tracing::info_span!(
        target: CONSUMER,
        "expire",
        otel.name = "expire orders",
        otel.kind = "client",
        order_expiry.action = work.action_kind,
        order_expiry.batch_size = count,
    );
    spans::batch_root(&span);
    span
}

/// Each order's verdict; counts and logs what is settled.
fn settle(
    batch: Vec<Pending>,
    next: Vec<Option<Next>>,
    observed: bool,
    now: DateTime<Utc>,
) -> Done {
    let verdicts = batch
        .into_iter()
        .zip(next)
        .map(|(mut p, next)| {
            // Every slot is filled above; an empty one would be a bug: retry it.
            let next = next.unwrap_or_else(|| Next::Retry("not handled".into()));
            let seen = match &next {
                Next::Ack(outcome) => {
                    record(&p.message, *outcome, now);
                    log_outcome(&mut p, *outcome, now);
                    observed.then(|| Handled {
                        order_id: Some(p.message.order_id.clone()),
                        outcome: *outcome,
                        at: now,
                        not_before: None,
                    })
                }
                Next::Hold(clock, left) => {
                    metrics::counter!(NOT_DUE_TOTAL.name, "clock" => *clock).increment(1);
                    let left_ms = left.as_millis() as u64;
                    p.span.in_scope(|| {
                        debug!(target: CONSUMER, clock, left_ms,
                            "not due yet by the reference clock; held again")
                    });
                    None
                }
                _ => None,
            };
            (p, next, seen)
        })
        .collect();
    Done::Settled(verdicts)
}

/// Counts one handled message; for a cancel, its lateness.
pub(super) fn record(message: &ExpiryMessage, outcome: Outcome, now: DateTime<Utc>) {
    metrics::counter!(MESSAGES_TOTAL.name, "outcome" => outcome.label()).increment(1);
    if outcome == Outcome::Cancelled {
        let lateness = lateness_secs(message, now);
        metrics::histogram!(LATENESS_SECONDS.name).record(lateness);
        if lateness < 0.0 {
            metrics::counter!(EARLY_TOTAL.name).increment(1);
        }
    }
}

/// How long after the message was due to be processed (`due_at`, or a later
/// `not_before` after a re-check) this is.
fn lateness_secs(message: &ExpiryMessage, now: DateTime<Utc>) -> f64 {
    (now - message.process_at())
        .num_microseconds()
        .unwrap_or(i64::MAX) as f64
        / 1e6
}

/// The span of one order, from arrival to its verdict: every event about it
/// carries its order id and, once known, its outcome. It is for the log
/// lines only: its target keeps it from the export layer (`telemetry`), and
/// an exported order's span is made from its [`OrderTrace`].
fn order_span(redelivered: bool, order_id: &str) -> tracing::Span {
    tracing::info_span!(
        target: ORDER_SPAN,
        "delivery",
        order_id,
        outcome = tracing::field::Empty,
        redelivered,
    )
}

/// Tells the exported span the outcome (its span ends here), and records it
/// on the delivery's span where a line will show it, and logs it there.
pub(super) fn log_outcome(pending: &mut Pending, outcome: Outcome, now: DateTime<Utc>) {
    let trace = &mut pending.trace;
    let label = outcome.label();
    trace.ended();
    trace.outcome(label);
    if outcome == Outcome::Cancelled {
        let lateness_ms = lateness_secs(&pending.message, now) * 1e3;
        trace.lateness_ms(lateness_ms);
        // A cancel's only line is at debug. Where it is off, recording the
        // outcome on the span would cost every cancel a rewrite of the
        // span's fields by the log layer (16 % of the consumer thread's time
        // in a traced flash sale with JSON logs), and nothing would show it.
        if tracing::enabled!(target: CONSUMER, Level::DEBUG) {
            pending.span.record("outcome", label);
            pending
                .span
                .in_scope(|| debug!(target: CONSUMER, lateness_ms, "handled"));
        }
        return;
    }
    pending.span.record("outcome", label);
    let _entered = pending.span.enter();
    match outcome {
        Outcome::Unknown => {
            let rechecks = pending.message.unknown_rechecks;
            info!(target: CONSUMER, rechecks, "{UNKNOWN}");
            trace.event(UNKNOWN, &[("rechecks", &rechecks)]);
        }
        _ => debug!(target: CONSUMER, "handled"),
    }
}

/// The line of an order that does not exist.
const UNKNOWN: &str = "due order does not exist";

#[cfg(all(test, feature = "otlp"))]
mod tests {
    use std::sync::Mutex;

    use lapin::BasicProperties;
    use opentelemetry::trace::SpanKind;
    use opentelemetry_sdk::error::OTelSdkResult;
    use opentelemetry_sdk::trace::{SdkTracerProvider, SpanData, SpanExporter};

    use super::*;
    use crate::amqp::BrokerNode;
    use crate::publisher::OrderId;

    /// Keeps every span exported to it.
    #[derive(Debug, Clone, Default)]
    struct Kept(Arc<Mutex<Vec<SpanData>>>);

    impl SpanExporter for Kept {
        async fn export(&self, batch: Vec<SpanData>) -> OTelSdkResult {
            self.0.lock().unwrap().extend(batch);
            Ok(())
        }
    }

    /// A full batch through the SQL action (`consumer.batch_max` orders),
    /// under the subscriber `serve` installs when it exports, with its
    /// limits: each order has one span, made apart from its `tracing` span,
    /// which is not exported; a child of and linked to the span it was
    /// created in, linked both ways to its batch, with every attribute, and
    /// the lines logged about it as events.
    #[test]
    fn an_exported_order_has_one_span_with_its_story() {
        let kept = Kept::default();
        let provider = SdkTracerProvider::builder()
            .with_simple_exporter(kept.clone())
            .with_max_links_per_span(crate::telemetry::LINKS_PER_SPAN)
            .build();
        let full = crate::Settings::default().consumer.batch_max;
        let dispatch = crate::telemetry::dispatch_exporting_to(&provider);
        let creation = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
        let creation = TraceContext::parse(creation, None).unwrap();
        tracing::dispatcher::with_default(&dispatch, || {
            let node = BrokerNode {
                host: "rabbitmq".to_owned(),
                port: 5672,
            };
            let consuming = Arc::new(Consuming::new("shop.due", "sql", node, false));
            let mut delivery = Delivery::mock(7, "".into(), "shop.due".into(), true, Vec::new());
            delivery.properties = BasicProperties::default().with_message_id("m-7".into());
            let delivery = Arc::new(delivery);
            let order = |id: &str| {
                let message = ExpiryMessage::new(OrderId::new(id).unwrap(), Utc::now());
                let message = message.with_trace(creation.clone());
                Pending::new(Arc::clone(&delivery), message, &consuming)
            };
            let mut orders: Vec<Pending> = (1..=full).map(|i| order(&format!("o-{i}"))).collect();
            let batch =
                tracing::info_span!(target: CONSUMER, "expire", otel.name = "expire orders");
            spans::batch_root(&batch);
            for pending in &mut orders {
                pending.trace.in_batch(&batch);
                pending.trace.attempt(1);
            }
            for (i, pending) in orders.iter_mut().enumerate() {
                let outcome = match i {
                    1 => Outcome::Unknown,
                    _ => Outcome::Cancelled,
                };
                log_outcome(pending, outcome, Utc::now());
            }
        });
        spans::drain(Duration::from_secs(5));
        let exported = kept.0.lock().unwrap().clone();
        let names: Vec<&str> = exported.iter().map(|s| s.name.as_ref()).collect();
        assert_eq!(names.len(), full + 1, "the orders and their batch");
        let batch = exported.iter().find(|s| s.name == "expire orders");
        let batch = batch.expect("the batch's span");
        assert_eq!(
            batch.links.links.len(),
            full,
            "the batch links to each order"
        );
        for id in ["o-1", "o-2"] {
            let attribute = |span: &SpanData, key: &str| {
                let found = span.attributes.iter().find(|kv| kv.key.as_str() == key);
                found.map(|kv| kv.value.to_string())
            };
            let order = exported
                .iter()
                .find(|s| attribute(s, "order_id").as_deref() == Some(id))
                .unwrap_or_else(|| panic!("{id}'s span in {names:?}"));
            assert_eq!(order.name, "process shop.due", "{id}");
            assert_eq!(order.span_kind, SpanKind::Consumer, "{id}");
            let context = &order.span_context;
            assert_eq!(context.trace_id().to_string(), creation.trace_id(), "{id}");
            assert_eq!(order.parent_span_id.to_string(), "b7ad6b7169203331", "{id}");
            let linked = |from: &SpanData, to: &str| {
                from.links
                    .links
                    .iter()
                    .any(|l| l.span_context.span_id().to_string() == to)
            };
            assert!(
                linked(order, "b7ad6b7169203331"),
                "{id} links to its creation"
            );
            let batch_id = batch.span_context.span_id().to_string();
            assert!(linked(order, &batch_id), "{id} links to its batch");
            assert!(
                linked(batch, &context.span_id().to_string()),
                "the batch to {id}"
            );
            assert_eq!(attribute(order, "redelivered").as_deref(), Some("true"));
            assert_eq!(
                attribute(order, "messaging.message.id").as_deref(),
                Some("m-7")
            );
            let attributes = order.attributes.len();
            let events: Vec<&str> = order
                .events
                .events
                .iter()
                .map(|e| e.name.as_ref())
                .collect();
            if id == "o-1" {
                assert_eq!(attribute(order, "outcome").as_deref(), Some("cancelled"));
                assert_eq!(
                    attributes,
                    spans::ORDER_SPAN_ATTRIBUTES,
                    "{:?}",
                    order.attributes
                );
                assert!(events.is_empty(), "{events:?}");
            } else {
                assert_eq!(attribute(order, "outcome").as_deref(), Some("unknown"));
                assert_eq!(events, [UNKNOWN]);
            }
        }
    }
}
