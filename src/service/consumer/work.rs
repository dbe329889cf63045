//! The consumer's unit of work, a batch of due messages cancelled by one atomic
//! statement, and what finished work reports back to the session.
//!
//! A batch ends in one of three ways: settled (each message cancelled, not
//! unpaid, unknown, or busy: locked by a payment, retried alone later), failed
//! with a store error (the session isolates the order at fault, see
//! `finished.rs`), or the broker failed.

use std::sync::Arc;

use chrono::{DateTime, Utc};
use futures::FutureExt;
use futures::future::BoxFuture;
use lapin::message::Delivery;
use tracing::{debug, info};

use super::park::ParkError;
use super::session::SessionError;
use super::{Handled, Outcome};
use crate::publisher::ExpiryMessage;
use crate::service::CONSUMER;
use crate::service::orders::{Disposition, OrderStore, StoreError};
use crate::telemetry::{EARLY_TOTAL, LATENESS_SECONDS, MESSAGES_TOTAL};

/// A decoded delivery waiting for, or in, a cancel statement, with its span.
pub(super) struct Pending {
    pub(super) delivery: Delivery,
    pub(super) message: ExpiryMessage,
    pub(super) span: tracing::Span,
    /// Times it was retried alone (busy, or a transient failure): its own backoff.
    pub(super) attempts: u32,
}

impl Pending {
    pub(super) fn new(delivery: Delivery, message: ExpiryMessage) -> Self {
        let span = delivery_span(&delivery, Some(&message.order_id));
        Self {
            delivery,
            message,
            span,
            attempts: 0,
        }
    }

    pub(super) fn tag(&self) -> u64 {
        self.delivery.delivery_tag
    }
}

/// Work that ran concurrently with the delivery loop, finished.
pub(super) enum Done {
    /// A parked delivery was acked (singly, by the park work).
    Parked(u64),
    /// A batch went through: `handled` may be acked, each with what the
    /// observer is told once it is; `busy` were locked by another transaction
    /// and are retried alone later.
    Settled {
        handled: Vec<(u64, Option<Handled>)>,
        busy: Vec<Pending>,
    },
    /// It failed in a way worth retrying after a backoff.
    Failed(Failed),
    /// The channel is unusable: the session ends.
    BrokerFailed(SessionError),
}

/// Failed work, its deliveries unacked.
pub(super) enum Failed {
    /// The database failed the batch; `error.class()` says what happens next.
    Store {
        batch: Vec<Pending>,
        error: StoreError,
    },
    /// The parked copy was not confirmed.
    Park {
        delivery: Box<Delivery>,
        reason: String,
        error: ParkError,
    },
}

impl Failed {
    /// Deliveries it holds unacked.
    pub(super) fn deliveries(&self) -> usize {
        match self {
            Self::Store { batch, .. } => batch.len(),
            Self::Park { .. } => 1,
        }
    }
}

/// Cancels a batch of due messages with one atomic statement and records each
/// final outcome: the unit of work, usable without a broker. A
/// [`Disposition::Busy`] order (locked by another transaction) is not final:
/// the caller tries it again later.
pub async fn cancel_batch<S: OrderStore>(
    store: &S,
    messages: &[&ExpiryMessage],
) -> Result<Vec<Disposition>, StoreError> {
    let dispositions = store.cancel_unpaid(messages).await?;
    let now = Utc::now();
    for (message, disposition) in messages.iter().zip(&dispositions) {
        if let Some(outcome) = outcome(*disposition) {
            record(message, outcome, now);
        }
    }
    Ok(dispositions)
}

/// The final outcome of a disposition; `None` for one to try again (busy).
fn outcome(disposition: Disposition) -> Option<Outcome> {
    match disposition {
        Disposition::Cancelled => Some(Outcome::Cancelled),
        Disposition::NotUnpaid => Some(Outcome::NotUnpaid),
        Disposition::Unknown => Some(Outcome::Unknown),
        Disposition::Busy => None,
    }
}

/// `cancel_batch` for `batch`, as concurrent work of the session.
pub(super) fn cancel_work<S: OrderStore>(
    store: Arc<S>,
    batch: Vec<Pending>,
    observed: bool,
) -> BoxFuture<'static, Done> {
    async move {
        let messages: Vec<&ExpiryMessage> = batch.iter().map(|p| &p.message).collect();
        let dispositions = match cancel_batch(store.as_ref(), &messages).await {
            Ok(dispositions) => dispositions,
            Err(error) => return Done::Failed(Failed::Store { batch, error }),
        };
        let now = Utc::now();
        // The session acks the handled ones, with `multiple` where it can.
        let mut handled = Vec::with_capacity(batch.len());
        let mut busy = Vec::new();
        for (p, disposition) in batch.into_iter().zip(dispositions) {
            let Some(outcome) = outcome(disposition) else {
                busy.push(p);
                continue;
            };
            log_outcome(&p, outcome, now);
            let seen = observed.then(|| Handled {
                order_id: Some(p.message.order_id.clone()),
                outcome,
                at: now,
            });
            handled.push((p.tag(), seen));
        }
        Done::Settled { handled, busy }
    }
    .boxed()
}

fn record(message: &ExpiryMessage, outcome: Outcome, now: DateTime<Utc>) {
    metrics::counter!(MESSAGES_TOTAL.name, "outcome" => outcome.label()).increment(1);
    if outcome == Outcome::Cancelled {
        let lateness = lateness_secs(message, now);
        metrics::histogram!(LATENESS_SECONDS.name).record(lateness);
        if lateness < 0.0 {
            metrics::counter!(EARLY_TOTAL.name).increment(1);
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
fn log_outcome(pending: &Pending, outcome: Outcome, now: DateTime<Utc>) {
    pending.span.record("outcome", outcome.label());
    let _entered = pending.span.enter();
    match outcome {
        Outcome::Cancelled => {
            let lateness_ms = lateness_secs(&pending.message, now) * 1e3;
            debug!(target: CONSUMER, lateness_ms, "handled");
        }
        Outcome::Unknown => info!(target: CONSUMER, "due order does not exist"),
        _ => debug!(target: CONSUMER, "handled"),
    }
}
