//! The consumer's unit of work: a batch of due messages, each asked about at
//! the payment gateway first (when `action.check` is on), then expired by the
//! [`Action`] in one call, and what finished work reports back to the session.
//! [`InFlight`] is the session's work running now (batches, parks, re-queues).
//!
//! A batch ends in one of three ways: settled (each message acked with its
//! outcome, retried alone, parked, or sent through the ladder again), failed
//! as a whole with an [`ActionError`] (the session isolates the order at fault,
//! see `finished.rs`), or the broker failed.

use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use futures::future::{BoxFuture, join_all};
use futures::stream::FuturesUnordered;
use futures::{FutureExt, StreamExt};
use lapin::message::Delivery;
use tracing::{debug, info};

use super::decide::{AfterCheck, Next, after_action, after_check};
use super::outbound::{Original, OutboundError};
use super::session::SessionError;
use super::{Handled, Outcome};
use crate::clock::Clock;
use crate::publisher::ExpiryMessage;
use crate::service::CONSUMER;
use crate::service::action::{Action, ActionError, Expiring, PaymentCheck};
use crate::settings::CheckSettings;
use crate::telemetry::{
    BATCH_ORDERS, BATCH_SECONDS, EARLY_TOTAL, LATENESS_SECONDS, MESSAGES_TOTAL, NOT_DUE_TOTAL,
};

/// A decoded delivery (or one order of a bundle) waiting for, or in, a
/// batch, with its span.
pub(super) struct Pending {
    /// Shared by the orders of one bundle.
    pub(super) delivery: Arc<Delivery>,
    pub(super) message: ExpiryMessage,
    /// One order of a v2 bundle: settled on its own, the delivery acked
    /// only once every order in it is.
    pub(super) bundled: bool,
    pub(super) span: tracing::Span,
    /// Times it was retried alone (busy, or a transient failure): its own backoff.
    pub(super) attempts: u32,
}

impl Pending {
    pub(super) fn new(delivery: Arc<Delivery>, message: ExpiryMessage, bundled: bool) -> Self {
        let span = delivery_span(&delivery, Some(&message.order_id));
        Self {
            delivery,
            message,
            bundled,
            span,
            attempts: 0,
        }
    }

    /// What its parked copy or its message through the ladder is made for.
    pub(super) fn original(&self) -> Original {
        Original {
            delivery: Arc::clone(&self.delivery),
            part: self.bundled.then(|| self.message.encode().into()),
        }
    }

    pub(super) fn tag(&self) -> u64 {
        self.delivery.delivery_tag
    }

    fn expiring(&self) -> Expiring<'_> {
        Expiring {
            message: &self.message,
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
    /// A delivery was acked singly after its confirmed copy (parked, or sent
    /// through the ladder again).
    Republished(u64),
    /// One order of a bundle was moved out (parked, or sent through the
    /// ladder again) as a confirmed message of its own: settled.
    PartMovedOut { tag: u64, handled: Option<Handled> },
    /// A batch went through: `handled` may be acked, each with what the
    /// observer is told once it is; the others are retried alone later,
    /// parked, sent through the ladder again, or held again for the time the
    /// reference clock says is left.
    Settled {
        handled: Vec<(u64, Option<Handled>)>,
        retry: Vec<(Pending, String)>,
        park: Vec<(Pending, String)>,
        requeue: Vec<(Pending, ExpiryMessage, Outcome)>,
        hold: Vec<(Pending, Duration)>,
    },
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
    /// The parked copy, or the message sent through the ladder again, was not
    /// confirmed.
    Republish {
        original: Original,
        what: super::outbound::Republish,
        error: OutboundError,
    },
}

impl Failed {
    /// Deliveries it holds unacked.
    pub(super) fn deliveries(&self) -> usize {
        match self {
            Self::Action { batch, .. } => batch.len(),
            Self::Republish { .. } => 1,
        }
    }
}

/// Checks and expires `batch`, as concurrent work of the session.
pub(super) fn expire_work<A: Action>(
    work: Arc<Work<A>>,
    batch: Vec<Pending>,
    observed: bool,
) -> BoxFuture<'static, Done> {
    async move {
        let mut next: Vec<Option<Next>> = vec![None; batch.len()];
        if let Some((check, settings)) = &work.check {
            let answers = join_all(batch.iter().map(|p| check.ask(&p.message))).await;
            let now = work.clock.now();
            for ((slot, p), answer) in next.iter_mut().zip(&batch).zip(answers) {
                if let AfterCheck::Then(then) = after_check(answer, &p.message, settings, now) {
                    *slot = Some(then);
                }
            }
        }
        let act: Vec<usize> = (0..batch.len()).filter(|i| next[*i].is_none()).collect();
        if !act.is_empty() {
            let due: Vec<Expiring<'_>> = act.iter().map(|i| batch[*i].expiring()).collect();
            let started = std::time::Instant::now();
            let result = work.action.expire(&due).await;
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

/// Sorts a batch by what happens next; counts and logs what is handled.
fn settle(
    batch: Vec<Pending>,
    next: Vec<Option<Next>>,
    observed: bool,
    now: DateTime<Utc>,
) -> Done {
    let mut handled = Vec::with_capacity(batch.len());
    let (mut retry, mut park, mut requeue, mut hold) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for (p, next) in batch.into_iter().zip(next) {
        match next {
            Some(Next::Ack(outcome)) => {
                record(&p.message, outcome, now);
                log_outcome(&p, outcome, now);
                let seen = observed.then(|| Handled {
                    order_id: Some(p.message.order_id.clone()),
                    outcome,
                    at: now,
                    not_before: None,
                });
                handled.push((p.tag(), seen));
            }
            Some(Next::Retry(reason)) => retry.push((p, reason)),
            Some(Next::Park(reason)) => park.push((p, reason)),
            Some(Next::Requeue(message, outcome)) => requeue.push((p, message, outcome)),
            Some(Next::Hold(clock, left)) => {
                metrics::counter!(NOT_DUE_TOTAL.name, "clock" => clock).increment(1);
                let left_ms = left.as_millis() as u64;
                p.span.in_scope(|| {
                    debug!(target: CONSUMER, clock, left_ms,
                        "not due yet by the reference clock; held again")
                });
                hold.push((p, left));
            }
            // Every slot is filled above; an empty one would be a bug: retry it.
            None => retry.push((p, "not handled".into())),
        }
    }
    Done::Settled {
        handled,
        retry,
        park,
        requeue,
        hold,
    }
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

/// The span of one delivery, from arrival to ack: every event about it carries
/// its order id (when it decodes) and, once known, its outcome.
pub(super) fn delivery_span(delivery: &Delivery, order_id: Option<&str>) -> tracing::Span {
    let span = tracing::info_span!(
        target: CONSUMER,
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
pub(super) fn log_outcome(pending: &Pending, outcome: Outcome, now: DateTime<Utc>) {
    pending.span.record("outcome", outcome.label());
    let _entered = pending.span.enter();
    match outcome {
        Outcome::Cancelled => {
            let lateness_ms = lateness_secs(&pending.message, now) * 1e3;
            debug!(target: CONSUMER, lateness_ms, "handled");
        }
        Outcome::Unknown => info!(target: CONSUMER, rechecks = pending.message.unknown_rechecks,
            "due order does not exist"),
        _ => debug!(target: CONSUMER, "handled"),
    }
}
