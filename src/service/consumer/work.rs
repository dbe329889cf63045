//! The consumer's unit of work, a batch of due messages cancelled by one atomic
//! statement, and what finished work reports back to the session.

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
}

impl Pending {
    pub(super) fn new(delivery: Delivery, message: ExpiryMessage) -> Self {
        let span = delivery_span(&delivery, Some(&message.order_id));
        Self {
            delivery,
            message,
            span,
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
    /// A batch was cancelled: its deliveries may be acked, each with what the
    /// observer is told once it is.
    Cancelled(Vec<(u64, Option<Handled>)>),
    /// It failed in a way worth retrying after a backoff.
    Failed(Failed),
    /// The channel is unusable: the session ends.
    BrokerFailed(SessionError),
}

/// Failed work, kept (deliveries unacked) until the retry timer fires.
pub(super) enum Failed {
    /// The database failed the batch.
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

/// `cancel_batch` for `batch`, as concurrent work of the session.
pub(super) fn cancel_work<S: OrderStore>(
    store: Arc<S>,
    batch: Vec<Pending>,
    observed: bool,
) -> BoxFuture<'static, Done> {
    async move {
        let messages: Vec<&ExpiryMessage> = batch.iter().map(|p| &p.message).collect();
        let outcomes = match cancel_batch(store.as_ref(), &messages).await {
            Ok(outcomes) => outcomes,
            Err(error) => return Done::Failed(Failed::Store { batch, error }),
        };
        let now = Utc::now();
        // The session acks them, with `multiple` where it can.
        let handled = batch.iter().zip(outcomes).map(|(p, outcome)| {
            log_outcome(p, outcome, now);
            let handled = observed.then(|| Handled {
                order_id: Some(p.message.order_id.clone()),
                outcome,
                at: now,
            });
            (p.tag(), handled)
        });
        Done::Cancelled(handled.collect())
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
