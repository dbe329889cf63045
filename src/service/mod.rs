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
//! - `migrations`: the default schema, `migrations/*.sql`, for `migrate`.
//! - `backoff`: exponential backoff for reconnects and retries.
//! - `shutdown`: SIGTERM / Ctrl-C → cancellation token.

/// The log target of the consumer's events and spans: `order_expiry::consumer`,
/// as documented (`ORDER_EXPIRY__LOG__FILTER=info,order_expiry::consumer=debug`),
/// wherever in the service the code lives.
pub(crate) const CONSUMER: &str = "order_expiry::consumer";

/// The target of each order's span in the consumer's log lines, within
/// [`CONSUMER`] for the log filter. The export layer leaves spans of it out
/// (`telemetry`): an exported order's span is made apart, from what the
/// consumer keeps beside the order (`telemetry::spans`).
pub(crate) const ORDER_SPAN: &str = "order_expiry::consumer::order";

/// The log target of the sweeper's events.
const SWEEPER: &str = "order_expiry::sweeper";

mod action;
mod app;
mod backoff;
pub(crate) mod clock;
mod consumer;
mod http;
mod migrations;
mod orders;
mod outbox;
mod overdue;
mod rate;
mod shutdown;
mod sweeper;

pub use self::action::{
    Action, ActionAnswer, ActionError, BuildError, CheckAnswer, ConfiguredAction, EventAction,
    Expiring, HttpAction, PaymentCheck,
};
pub use self::app::{Service, ServiceError};
pub use self::consumer::{Consumer, ConsumerError, Handled, Outcome};
pub use self::http::{OutboxState, Readiness};
pub use self::orders::{
    Disposition, OrderStore, PgOrderStore, PoolError, PooledClient, StoreError,
};
pub use self::outbox::{Relay, RelayError};
pub use self::shutdown::shutdown_on_signal;
pub use self::sweeper::Sweeper;
pub use crate::clock::Clock;

// What the benchmarks and tests drive directly and users do not import: public
// so that the workspace members can reach it, hidden from the documentation,
// and free to change with any release.
#[doc(hidden)]
pub use self::consumer::{Arrival, BundlePart, on_arrival};
#[doc(hidden)]
pub use self::orders::{FailureClass, classify};
#[doc(hidden)]
pub use self::outbox::{Relayed, Round};
