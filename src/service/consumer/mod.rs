//! The consumer: reads the due queue, holds what is early, expires what is due
//! in batches through the [`Action`] (one atomic statement per batch for SQL),
//! acks only after the action answered, parks what can never be processed,
//! sends what must be looked at again through the ladder, and survives broker,
//! database and order-service outages.
//!
//! - [`arrival`]: what to do with a delivery as it arrives (due, hold, park). Pure.
//! - [`acks`]: which deliveries to ack, one `multiple` ack per finished run. Pure.
//! - [`decide`]: after the payment check and the action: ack, retry, park or
//!   send through the ladder again (the next check step; an order not found yet). Pure.
//! - [`work`]: the unit of work (check, then the action), what finished work
//!   reports, and the work running now.
//! - [`pass`]: one delivery's pass: every order's verdict once, then one
//!   ack, after the leftovers left as messages of their own. Pure.
//! - [`outbound`]: the leftovers (one parked copy, messages sent through the
//!   ladder again), confirmed, then the ack.
//! - [`session`]: one connection's session: its per-event methods, its state
//!   in the parts below.
//! - [`link`]: the connection, its two channels, the delivery stream.
//! - [`unacked`]: the unacked deliveries, their passes and ack state.
//! - [`backlog`]: what waits for a batch: held deliveries, ready ones, parts
//!   of split batches.
//! - [`retries`]: messages, parks and re-queues each retried on its own timer.
//! - [`outage`]: while the action is unavailable: the batches waiting for it
//!   and when to try again; the one place that pauses intake.
//! - [`finished`]: what finished work does: acks; a failure split down to the
//!   order at fault, parked or retried alone; a whole-set backoff while the
//!   database is unavailable.
//! - [`repair`]: re-declaring the consumer's queues when one was deleted.
//! - [`drain`]: the end of a session: drain, ack, release, close.
//!
//! Every "is it due?" is asked of the action's reference clock ([`Clock`]:
//! the order database's, the order service's), not of this host's: an order
//! is held until that clock, as measured from here, passes its `due_at`, and
//! when the reference itself says "not yet" (the SQL statement's `now()`
//! rule, an order service's 425), it is held again for the time left.
//!
//! A session is one broker connection. [`Consumer::run`] runs sessions until
//! shutdown, reconnecting with backoff whenever one ends on a broker fault.

mod acks;
mod arrival;
mod backlog;
mod decide;
mod drain;
mod finished;
mod link;
mod outage;
mod outbound;
mod pass;
mod probe;
mod repair;
mod retries;
mod session;
mod unacked;
mod work;

use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use thiserror::Error;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

pub use self::arrival::{Arrival, BundlePart, on_arrival};
use self::session::{Session, SessionError};
use self::work::Work;
use super::CONSUMER;
use super::action::{Action, BuildError, PaymentCheck};
use super::backoff::Backoff;
use super::http::Readiness;
use crate::clock::Clock;
use crate::publisher::OrderId;
use crate::settings::{ActionKind, AmqpSettings, ConsumerSettings, Settings};
use crate::telemetry::RECONNECTS_TOTAL;
use crate::topology::{Ladder, LadderError, Topology};

/// What happened to one due message. Each is counted in
/// `order_expiry_messages_total{outcome}`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Outcome {
    /// The order was unpaid and is now cancelled.
    Cancelled,
    /// The order was paid or already cancelled; nothing changed.
    NotUnpaid,
    /// No such order; acked and logged.
    Unknown,
    /// The message can never be processed; copied to the parked queue.
    Parked,
    /// The order's deadline was extended past this message's `due_at`: a stale
    /// message; nothing changed.
    Extended,
    /// The payment gateway said paid: nothing cancelled.
    PaidAtGateway,
    /// The gateway still said pending after the last check step, and
    /// `action.check.final` is `keep`: nothing changed.
    PendingAtGateway,
    /// The gateway said pending: sent through the ladder to be checked again
    /// at the next step.
    CheckRequeued,
    /// The order was not found: sent through the ladder to be looked for
    /// again (its INSERT may not have committed yet).
    UnknownRequeued,
    /// The action kept failing for it (`consumer.held_retries` tries, or
    /// `consumer.held_retry_ms`), or failed while the rest of its delivery
    /// was settled: sent through the ladder again with its backoff, so that
    /// its delivery is acked.
    RetryRequeued,
}

impl Outcome {
    /// The metric label.
    pub fn label(self) -> &'static str {
        match self {
            Self::Cancelled => "cancelled",
            Self::NotUnpaid => "not_unpaid",
            Self::Unknown => "unknown",
            Self::Parked => "parked",
            Self::Extended => "extended",
            Self::PaidAtGateway => "paid_at_gateway",
            Self::PendingAtGateway => "pending_at_gateway",
            Self::CheckRequeued => "check_requeued",
            Self::UnknownRequeued => "unknown_requeued",
            Self::RetryRequeued => "retry_requeued",
        }
    }

    /// Every outcome, in the order of the metrics catalog.
    pub const ALL: [Self; 10] = [
        Self::Cancelled,
        Self::NotUnpaid,
        Self::Unknown,
        Self::Parked,
        Self::Extended,
        Self::PaidAtGateway,
        Self::PendingAtGateway,
        Self::CheckRequeued,
        Self::UnknownRequeued,
        Self::RetryRequeued,
    ];
}

/// One handled delivery, as reported to an observer (see [`Consumer::observe`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Handled {
    /// The order, when the message could be decoded.
    pub order_id: Option<OrderId>,
    /// What happened.
    pub outcome: Outcome,
    /// When it was acked.
    pub at: DateTime<Utc>,
    /// For a message sent through the ladder again (`check_requeued`,
    /// `unknown_requeued`): when it is due again (never processed before).
    pub not_before: Option<DateTime<Utc>>,
}

/// Receives every [`Handled`] after its ack.
type Observer = tokio::sync::mpsc::UnboundedSender<Handled>;

/// The consumer cannot run at all (as opposed to a fault it waits out).
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum ConsumerError {
    /// The topology settings are invalid.
    #[error(transparent)]
    Ladder(#[from] LadderError),
    /// The payment check cannot be built.
    #[error(transparent)]
    Check(#[from] BuildError),
}

/// The consumer service's delivery loop.
pub struct Consumer<A> {
    settings: ConsumerSettings,
    amqp: AmqpSettings,
    ladder: Ladder,
    /// What the consumer declares after every (re)connect: the due and parked
    /// queues with `topology.replicas`, their exchanges and bindings.
    own_part: Topology,
    /// `publisher.lead_ms`, for messages the consumer sends through the ladder again.
    lead: Duration,
    /// `topology.catch_up_after_ms`: zero when there is no catch-up queue.
    catch_up_after: Duration,
    work: Arc<Work<A>>,
    /// The action's reference clock, corrected: holds and releases go by it.
    clock: Clock,
    readiness: Arc<Readiness>,
    observer: Option<Observer>,
}

impl<A> std::fmt::Debug for Consumer<A> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Consumer")
            .field("ladder", &self.ladder)
            .field("settings", &self.settings)
            .finish_non_exhaustive()
    }
}

impl<A: Action> Consumer<A> {
    /// A consumer of the due queue described by `settings`, expiring through
    /// `action` (a [`super::PgOrderStore`] is the SQL one), asking the payment
    /// gateway first when `action.check` is on, and reporting on `readiness`.
    pub fn new(
        settings: &Settings,
        action: Arc<A>,
        readiness: Arc<Readiness>,
    ) -> Result<Self, ConsumerError> {
        let check = &settings.action.check;
        let check = match check.enabled {
            true => Some((PaymentCheck::new(check)?, check.clone())),
            false => None,
        };
        let clock = action.clock();
        let passes_on = settings.action.kind != ActionKind::Sql || check.is_some();
        Ok(Self {
            settings: settings.consumer.clone(),
            amqp: settings.amqp.clone(),
            ladder: settings.ladder()?,
            own_part: Topology::consumer_part(&settings.ladder()?, &settings.topology),
            lead: settings.publisher.lead,
            catch_up_after: settings.topology.catch_up_after,
            work: Arc::new(Work {
                action,
                check,
                unknown_rechecks: settings.consumer.unknown_rechecks.clone(),
                clock: clock.clone(),
                action_kind: settings.action.kind.as_str(),
                passes_on,
            }),
            clock,
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
        let mut backoff = Backoff::new(self.amqp.reconnect_initial, self.amqp.reconnect_max);
        while !shutdown.is_cancelled() {
            let result = self.session(&shutdown, &mut backoff).await;
            self.readiness.set_consuming(false);
            let Err(error) = result else { break };
            let delay = backoff.next_delay();
            let retry_in_ms = delay.as_millis() as u64;
            warn!(target: CONSUMER, %error, retry_in_ms, "consumer session ended; reconnecting");
            metrics::counter!(RECONNECTS_TOTAL.name).increment(1);
            tokio::select! {
                _ = shutdown.cancelled() => break,
                _ = tokio::time::sleep(delay) => {}
            }
        }
        info!(target: CONSUMER, "consumer stopped");
    }

    /// One session, from connect to close.
    async fn session(
        &self,
        shutdown: &CancellationToken,
        backoff: &mut Backoff,
    ) -> Result<(), SessionError> {
        let mut session = Session::open(self).await?;
        let end = session.serve(shutdown).await;
        // Not ready from now on, however long the clean-up below takes on a dead link.
        self.readiness.set_consuming(false);
        // Work went through, or the session was healthy for longer than the
        // longest delay: its end is a new incident, so reconnecting starts again
        // from the shortest delay.
        if session.worked || (end.is_err() && session.age() >= self.amqp.reconnect_max) {
            backoff.reset();
        }
        match &end {
            // Cut off from its cluster: a closing word per channel would each
            // wait out the timeout there.
            Err(SessionError::NodeProbe(_)) => session.abandon(),
            _ => session.close(end.is_ok()).await,
        }
        end
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `/metrics` describes, and the book's metrics catalog lists, every outcome.
    #[test]
    fn every_outcome_is_described_and_documented() {
        let help = crate::telemetry::MESSAGES_TOTAL.help;
        let catalog = include_str!("../../../docs/src/operating/metrics.md");
        for outcome in Outcome::ALL {
            let label = outcome.label();
            assert!(help.contains(label), "# HELP misses {label}");
            assert!(
                catalog.contains(&format!("`{label}`")),
                "docs/src/operating/metrics.md misses `{label}`"
            );
        }
    }
}
