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
use super::order_id::{InvalidOrderId, OrderId};
use super::scheduler::Scheduler;
use crate::topology::DelayTooLong;

/// The statement [`Scheduler::schedule_in_tx`] runs: the same one an order
/// service in any language runs in its transaction. The table is found on the
/// connection's `search_path`, like the orders table.
pub const OUTBOX_INSERT_SQL: &str =
    "INSERT INTO order_expiry_outbox (order_id, due_at) VALUES ($1, $2) RETURNING id";

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
        // Time only shortens the delay, so what fits now fits when relayed.
        let remaining_ms = (due_at - Utc::now()).num_milliseconds();
        self.ladder().route_for_remaining_ms(remaining_ms)?;
        let row = tx
            .query_one(OUTBOX_INSERT_SQL, &[&order_id.as_str(), &due_at])
            .await
            .map_err(DatabaseError::new)?;
        Ok(OutboxEntry {
            id: row.try_get(0).map_err(DatabaseError::new)?,
            order_id,
            due_at,
        })
    }
}
