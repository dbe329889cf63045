//! What an order service links: schedule an order's expiry, durable in the
//! broker once `schedule()` returns `Ok`. Needs no service dependency.
//!
//! - `scheduler`: [`Scheduler`]: confirms, `mandatory`, reconnects lazily.
//! - `error`: [`ScheduleError`]: every way a schedule call can fail.
//! - `message`: the v1 wire format: encode, decode, validate. Pure.
//! - `bundle`: the v2 wire format, many orders in one message; decoding of every version. Pure.
//! - `order_id`: the validated [`OrderId`]. Pure.
//! - `trace`: the W3C [`TraceContext`] each order carries. Pure (with
//!   `otel`, it reads the current `tracing` span).
//! - `outbox` (feature `outbox`): `Scheduler::schedule_in_tx`: a row in the
//!   order's own transaction, relayed by `order-expiry serve`.

mod bundle;
#[cfg(feature = "outbox")]
mod database_error;
mod error;
mod group;
mod message;
mod order_id;
#[cfg(feature = "outbox")]
mod outbox;
mod scheduler;
mod trace;

pub use self::bundle::{BadEntry, DueMessage};
#[cfg_attr(not(feature = "service"), allow(unused_imports))]
pub(crate) use self::bundle::{encode_bundle, encode_entry};
#[cfg(feature = "outbox")]
pub use self::database_error::DatabaseError;
pub use self::error::ScheduleError;
pub use self::message::{ExpiryMessage, Malformed};
pub use self::order_id::{InvalidOrderId, OrderId};
#[cfg(feature = "outbox")]
pub use self::outbox::{OUTBOX_INSERT_SQL, OUTBOX_INSERT_TRACED_SQL, OutboxEntry, OutboxError};
#[cfg(feature = "service")]
pub(crate) use self::scheduler::{Outgoing, received_trace, remaining_route, trace_headers};
pub use self::scheduler::{Scheduled, Scheduler};
pub use self::trace::{InvalidTraceContext, TRACESTATE_MAX, TraceContext, TraceHeaders};
