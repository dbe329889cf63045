//! Scheduling inside the order's own transaction (feature `outbox`): a row in
//! `order_expiry_outbox`, which `order-expiry serve` relays to the ladder
//! after the transaction commits.
//!
//! [`Scheduler::schedule`] after the commit is a dual write: a crash between
//! the commit and the confirm loses the schedule (the sweeper catches it,
//! minutes late). [`Scheduler::schedule_in_tx`] writes the schedule in the same
//! transaction as the order instead: both commit or neither does.

use std::convert::Infallible;

use chrono::{DateTime, Utc};
use thiserror::Error;

use super::database_error::DatabaseError;
use super::message::ExpiryMessage;
use super::order_id::{InvalidOrderId, OrderId};
use super::scheduler::Scheduler;
use super::trace::{self, TraceContext};
use crate::topology::DelayTooLong;

/// The statement [`Scheduler::schedule_in_tx`] runs: the same one an order
/// service in any language runs in its transaction. The table is found on the
/// connection's `search_path`, like the orders table.
pub const OUTBOX_INSERT_SQL: &str =
    "INSERT INTO order_expiry_outbox (order_id, due_at) VALUES ($1, $2) RETURNING id";

/// [`OUTBOX_INSERT_SQL`] for an order with a W3C trace context: `$3` the
/// `traceparent`, `$4` the `tracestate` (or NULL). Needs the columns of
/// `migrations/0003_outbox_trace.sql`; an untraced order uses the statement
/// above, which does not.
pub const OUTBOX_INSERT_TRACED_SQL: &str = "INSERT INTO order_expiry_outbox \
     (order_id, due_at, traceparent, tracestate) VALUES ($1, $2, $3, $4) RETURNING id";

/// A schedule written into the caller's transaction: relayed once it commits.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutboxEntry {
    /// The row's `id` in `order_expiry_outbox`.
    pub id: i64,
    /// The order.
    pub order_id: OrderId,
    /// When it is due.
    pub due_at: DateTime<Utc>,
}

/// Why [`Scheduler::schedule_in_tx`] wrote nothing.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum OutboxError {
    /// The order id breaks the contract (1-128 characters, no control characters).
    #[error("invalid order id: {0}")]
    InvalidOrderId(#[from] InvalidOrderId),
    /// The due time is further away than the ladder can hold: the relay could
    /// never publish it.
    #[error(transparent)]
    DelayTooLong(#[from] DelayTooLong),
    /// The insert failed (no outbox table: run `order-expiry migrate`; or the
    /// transaction is aborted). The caller's transaction should roll back.
    #[error("outbox insert failed: {0}")]
    Database(#[from] DatabaseError),
}

impl From<Infallible> for OutboxError {
    fn from(never: Infallible) -> Self {
        match never {}
    }
}

impl Scheduler {
    /// Schedules "cancel `order_id` if unpaid at `due_at`" inside `tx`, the
    /// transaction that creates the order: inserts its row into
    /// `order_expiry_outbox` ([`OUTBOX_INSERT_SQL`]). Nothing is published
    /// here; `order-expiry serve` publishes the row through the ladder with
    /// confirms once `tx` commits, and a rolled-back `tx` schedules nothing.
    ///
    /// The id and the due time are checked as [`Scheduler::schedule`] checks
    /// them, so a row the relay could never publish is refused here, inside
    /// the order's transaction, not found later. No broker connection is used.
    ///
    /// With the `otel` feature the row carries the current `tracing` span's
    /// trace context ([`OUTBOX_INSERT_TRACED_SQL`]), which the relay sends on.
    ///
    /// ```no_run
    /// # async fn example(db: &mut tokio_postgres::Client) -> Result<(), Box<dyn std::error::Error>> {
    /// use order_expiry::{Scheduler, Settings};
    ///
    /// let scheduler = Scheduler::from_settings(&Settings::load(None)?)?;
    /// let due_at = chrono::Utc::now() + chrono::TimeDelta::minutes(30);
    /// let tx = db.transaction().await?;
    /// tx.execute(
    ///     "INSERT INTO orders (id, pay_deadline) VALUES ($1, $2)",
    ///     &[&"order-42", &due_at],
    /// )
    /// .await?;
    /// scheduler.schedule_in_tx(&tx, "order-42", due_at).await?;
    /// tx.commit().await?; // the order and its expiry, or neither
    /// # Ok(()) }
    /// ```
    pub async fn schedule_in_tx<O>(
        &self,
        tx: &tokio_postgres::Transaction<'_>,
        order_id: O,
        due_at: DateTime<Utc>,
    ) -> Result<OutboxEntry, OutboxError>
    where
        O: TryInto<OrderId>,
        OutboxError: From<O::Error>,
    {
        let order_id = order_id.try_into()?;
        self.insert_in_tx(tx, order_id, due_at, trace::current())
            .await
    }

    /// [`Scheduler::schedule_in_tx`] for a message built by the caller, with
    /// its trace context passed explicitly ([`ExpiryMessage::with_trace`]);
    /// one without takes the current span's (feature `otel`). Only its order
    /// id, due time and context are written.
    pub async fn schedule_message_in_tx(
        &self,
        tx: &tokio_postgres::Transaction<'_>,
        message: ExpiryMessage,
    ) -> Result<OutboxEntry, OutboxError> {
        let trace = message.trace.or_else(trace::current);
        self.insert_in_tx(tx, message.order_id, message.due_at, trace)
            .await
    }

    async fn insert_in_tx(
        &self,
        tx: &tokio_postgres::Transaction<'_>,
        order_id: OrderId,
        due_at: DateTime<Utc>,
        trace: Option<TraceContext>,
    ) -> Result<OutboxEntry, OutboxError> {
        // Time only shortens the delay, so what fits now fits when relayed.
        let remaining_ms = (due_at - Utc::now()).num_milliseconds();
        self.ladder().route_for_remaining_ms(remaining_ms)?;
        let id = order_id.as_str();
        let row = match &trace {
            None => tx.query_one(OUTBOX_INSERT_SQL, &[&id, &due_at]).await,
            Some(trace) => {
                let (parent, state) = (trace.traceparent(), trace.tracestate());
                let params: [&(dyn tokio_postgres::types::ToSql + Sync); 4] =
                    [&id, &due_at, &parent, &state];
                tx.query_one(OUTBOX_INSERT_TRACED_SQL, &params).await
            }
        }
        .map_err(DatabaseError::new)?;
        Ok(OutboxEntry {
            id: row.try_get(0).map_err(DatabaseError::new)?,
            order_id,
            due_at,
        })
    }
}
