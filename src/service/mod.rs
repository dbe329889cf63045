//! The consumer service (`order-expiry serve`), feature `service`.
//!
//! - `app`: [`Service`]: consumer + sweeper + HTTP, built once for `main` and tests.
//! - `action`: what expires a due order ([`Action`]: SQL, HTTP, an event)
//!   and the optional payment check before it.
//! - `consumer`: the delivery loop: hold until due, batch, ack / park / retry.
//! - `orders`: the [`OrderStore`] trait and its PostgreSQL implementation.
//! - `sweeper`: safety net: every second, cancels unpaid orders a few seconds overdue.
//! - `overdue`: the gauge of unpaid orders past their deadline by more than a margin.
//! - `outbox`: the transactional outbox relay: `order_expiry_outbox` to the ladder.
//! - `http`: `/healthz`, `/readyz`, `/metrics`.
//! - `clock`: this host's offset from the reference clock (the order database's,
//!   the order service's), measured; [`Clock`], corrected by it.
//! - `backoff`: exponential backoff for reconnects and retries.
//! - `shutdown`: SIGTERM / Ctrl-C → cancellation token.

/// The log target of the consumer's events and spans: `order_expiry::consumer`,
/// as documented (`ORDER_EXPIRY__LOG__FILTER=info,order_expiry::consumer=debug`),
/// wherever in the service the code lives.
const CONSUMER: &str = "order_expiry::consumer";

/// The log target of the sweeper's events.
const SWEEPER: &str = "order_expiry::sweeper";

mod action;
mod app;
mod backoff;
pub(crate) mod clock;
mod consumer;
mod http;
mod orders;
mod outbox;
mod overdue;
mod shutdown;
mod sweeper;

pub use self::action::{
    Action, ActionAnswer, ActionError, BuildError, CheckAnswer, ConfiguredAction, EventAction,
    Expiring, HttpAction, PaymentCheck,
};
pub use self::app::{Service, ServiceError};
pub use self::consumer::{
    Arrival, BundlePart, Consumer, ConsumerError, Handled, Outcome, on_arrival,
};
pub use self::http::{OutboxState, Readiness};
pub use self::orders::{Disposition, FailureClass, OrderStore, PgOrderStore, StoreError, classify};
pub use self::outbox::{Relay, RelayError, Relayed, Round};
pub use self::shutdown::shutdown_on_signal;
pub use self::sweeper::Sweeper;
pub use crate::clock::Clock;
