//! What expires a due order: one [`Action`] the consumer's batches call, so the
//! batch machinery (split on a failure, retry alone, park, pause while
//! everything is unavailable) is the same whatever the action is.
//!
//! - `sql`: every [`OrderStore`](crate::service::OrderStore) is an action: `database.cancel_sql` on PostgreSQL.
//! - `http`: [`HttpAction`], `POST {base}/orders/{id}/expire` on the order service.
//! - `event`: [`EventAction`], an `order.expired` event, confirmed by the broker.
//! - `check`: [`PaymentCheck`], the optional question to the payment gateway
//!   before the action, and what its answers lead to (pure).
//! - `client`: the HTTP client both HTTP parts share (timeouts, TLS, token).

mod check;
mod client;
mod event;
mod http;
mod sql;

use std::sync::Arc;

use thiserror::Error;

pub(crate) use self::check::Checked;
pub use self::check::{CheckAnswer, PaymentCheck};
pub use self::event::EventAction;
pub use self::http::HttpAction;
pub(crate) use self::http::idempotency_key;
use super::orders::{FailureClass, OrderStore, PgOrderStore, StoreError};
use crate::clock::Clock;
use crate::publisher::{ExpiryMessage, TraceContext};
use crate::settings::{ActionKind, Settings};

/// One due message as an action sees it.
#[derive(Debug, Clone, Copy)]
pub struct Expiring<'a> {
    /// The decoded message.
    pub message: &'a ExpiryMessage,
    /// Its `message_id` property, when it has one.
    pub message_id: Option<&'a str>,
    /// The trace context the action passes on (HTTP `traceparent`, the
    /// event's headers): the consumer's span of it when spans are exported,
    /// else the context the order was created in.
    pub trace: Option<&'a TraceContext>,
}

/// What an action did with one due message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ActionAnswer {
    /// It was unpaid and is now cancelled (or its `order.expired` event confirmed).
    Cancelled,
    /// It was paid or already cancelled: nothing changed.
    NotUnpaid,
    /// No such order (yet: see `consumer.unknown_rechecks_ms`).
    Unknown,
    /// Its deadline was extended past this message's `due_at`: a stale message.
    Extended,
    /// Not now (a row lock, a 5xx, a timeout, an unroutable event): this one
    /// message is tried again alone, after its own backoff.
    Retry(String),
    /// It can never go through as it is (a 4xx): parked with this reason.
    Park(String),
    /// Not due yet by the reference clock (the database's `now()`, or the
    /// order service's 425 Too Early): held, and tried again after `left`.
    /// Neither parked nor counted as handled.
    NotDue {
        /// The reference clock that said so: `database` or `http`.
        clock: &'static str,
        /// How long until it is due, by that clock.
        left: std::time::Duration,
    },
}

/// The action failed for a whole batch; [`ActionError::class`] says what the
/// consumer does next (split it, or wait for the dependency).
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum ActionError {
    /// The orders database failed the statement.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// Nothing answered: every request of the batch failed to connect, or the
    /// broker channel of the events is gone. The batch waits, intake pauses.
    #[error("{0}")]
    Unavailable(String),
}

impl ActionError {
    /// What the failure means for the messages of the batch.
    pub fn class(&self) -> FailureClass {
        match self {
            Self::Store(e) => e.class(),
            Self::Unavailable(_) => FailureClass::Unavailable,
        }
    }

    /// The `x-parked-reason` of a message alone in a batch that failed
    /// permanently, e.g. `cancel failed permanently: SQLSTATE 22P02: …`.
    pub(crate) fn park_reason(&self) -> String {
        match self {
            Self::Store(e) => match e.sqlstate() {
                Some((code, message)) => {
                    format!("cancel failed permanently: SQLSTATE {code}: {message}")
                }
                None => format!("cancel failed permanently: {e}"),
            },
            Self::Unavailable(reason) => format!("action failed permanently: {reason}"),
        }
    }
}

/// Expires due orders. Every [`OrderStore`](crate::service::OrderStore) is one (the SQL action).
pub trait Action: Send + Sync + 'static {
    /// Expires the order of every message, returning one [`ActionAnswer`] per
    /// message, in input order; or fails for the whole batch.
    fn expire(
        &self,
        due: &[Expiring<'_>],
    ) -> impl Future<Output = Result<Vec<ActionAnswer>, ActionError>> + Send;

    /// The clock that says when an order is due: the order database's for
    /// the SQL action, the order service's for the HTTP action, as measured
    /// from this host. The consumer holds and releases orders by it.
    fn clock(&self) -> Clock {
        Clock::local()
    }
}

/// The action `action.kind` selects.
#[derive(Debug)]
pub enum ConfiguredAction {
    /// `sql`: the orders table.
    Sql(Arc<PgOrderStore>),
    /// `http`: the order service's endpoint.
    Http(HttpAction),
    /// `amqp`: an `order.expired` event.
    Amqp(Box<EventAction>),
}

/// The action cannot be built from the settings.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum BuildError {
    /// The database settings.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The HTTP client (TLS roots, the token).
    #[error("{setting}: {reason}")]
    Http {
        /// The setting at fault.
        setting: &'static str,
        /// Why.
        reason: String,
    },
}

impl ConfiguredAction {
    /// The action of `settings.action.kind`; the SQL one on `store`.
    pub fn from_settings(
        settings: &Settings,
        store: Option<Arc<PgOrderStore>>,
    ) -> Result<Self, BuildError> {
        Ok(match settings.action.kind {
            ActionKind::Sql => match store {
                Some(store) => Self::Sql(store),
                None => Self::Sql(Arc::new(PgOrderStore::new(settings)?)),
            },
            ActionKind::Http => {
                Self::Http(HttpAction::new(&settings.action.http, &settings.clock)?)
            }
            ActionKind::Amqp => Self::Amqp(Box::new(EventAction::new(settings))),
        })
    }

    /// The orders database, when the action uses it.
    pub fn store(&self) -> Option<&Arc<PgOrderStore>> {
        match self {
            Self::Sql(store) => Some(store),
            _ => None,
        }
    }
}

impl Action for ConfiguredAction {
    async fn expire(&self, due: &[Expiring<'_>]) -> Result<Vec<ActionAnswer>, ActionError> {
        match self {
            Self::Sql(store) => store.as_ref().expire(due).await,
            Self::Http(http) => http.expire(due).await,
            Self::Amqp(event) => event.expire(due).await,
        }
    }

    /// The database's for `sql`, the order service's for `http`; this host's
    /// own for `amqp`, whose subscribers judge `due_at` by their clocks.
    fn clock(&self) -> Clock {
        match self {
            Self::Sql(store) => OrderStore::clock(store.as_ref()),
            Self::Http(http) => http.clock(),
            Self::Amqp(_) => Clock::local(),
        }
    }
}
