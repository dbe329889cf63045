//! The consumer: reads the due queue, holds what is early, cancels what is due in
//! batches of one atomic statement, acks only after the database answered, parks
//! what can never be processed, and survives broker and database outages.
//!
//! - [`arrival`]: what to do with a delivery as it arrives (due, hold, park). Pure.
//! - [`acks`]: which deliveries to ack, one `multiple` ack per finished run. Pure.
//! - [`work`]: the unit of work, [`cancel_batch`], and what finished work reports.
//! - [`park`]: copying an unprocessable message to `P.parked`, confirmed, then acking it.
//! - [`session`]: one connection's state and its per-event methods.
//! - [`finished`]: what finished work does: acks; a failure split down to the
//!   order at fault, parked or retried alone; a whole-set backoff while the
//!   database is unavailable.
//! - [`repair`]: re-declaring the consumer's queues when one was deleted.
//! - [`drain`]: the end of a session: drain, ack, release, close.
//!
//! A session is one broker connection. [`Consumer::run`] runs sessions until
//! shutdown, reconnecting with backoff whenever one ends on a broker fault.

mod acks;
mod arrival;
mod drain;
mod finished;
mod park;
mod repair;
mod session;
mod work;

use std::sync::Arc;

use chrono::{DateTime, Utc};
use thiserror::Error;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

pub use self::arrival::{Arrival, on_arrival};
use self::session::{Session, SessionError};
pub use self::work::cancel_batch;
use super::CONSUMER;
use super::backoff::Backoff;
use super::http::Readiness;
use super::orders::OrderStore;
use crate::publisher::OrderId;
use crate::settings::{AmqpSettings, ConsumerSettings, Settings};
use crate::telemetry::RECONNECTS_TOTAL;
use crate::topology::{Ladder, LadderError};

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
    pub order_id: Option<OrderId>,
    /// What happened.
    pub outcome: Outcome,
    /// When it was acked.
    pub at: DateTime<Utc>,
}

/// Receives every [`Handled`] after its ack.
type Observer = tokio::sync::mpsc::UnboundedSender<Handled>;

/// The consumer cannot run at all (as opposed to a fault it waits out).
#[derive(Debug, Error)]
pub enum ConsumerError {
    /// The topology settings are invalid.
    #[error(transparent)]
    Ladder(#[from] LadderError),
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
    /// A consumer of the due queue described by `settings`, cancelling through
    /// `store` and reporting on `readiness`.
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
        session.close(end.is_ok()).await;
        end
    }
}
