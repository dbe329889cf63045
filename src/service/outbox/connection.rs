//! The relay's own database connection: `LISTEN` for the outbox trigger's
//! notifications, and the round's statements, prepared once per connection.
//!
//! A pooled connection cannot receive notifications (the pool drives its
//! connection futures and drops what they deliver), so the relay holds one of
//! its own, with the same settings as the pool's. Every call is bounded by
//! `database.query_timeout_ms`; on any failure the relay drops the whole connection
//! (the server rolls back what it held) and opens a new one.

use std::time::Duration;

use chrono::{DateTime, Utc};
use futures::StreamExt;
use tokio::sync::mpsc::{UnboundedReceiver, error::TryRecvError};
use tokio_postgres::{AsyncMessage, Client, Config, NoTls, Statement, Transaction};

use super::RelayError;
use super::round::OutboxRow;
use super::schema::CHANNEL;

/// Which schema `order_expiry_outbox` resolves to on this connection's
/// `search_path`; NULL when there is none.
const SCHEMA_SQL: &str = "SELECT n.nspname::text FROM pg_catalog.pg_class c \
     JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace \
     WHERE c.oid = to_regclass('order_expiry_outbox')";

/// The oldest rows no other relay holds, locked until the round commits,
/// with their trace context. The optional columns are read through the row's
/// JSON so that a table without them (`migrations/0003_outbox_trace.sql` not
/// run yet) is relayed too, untraced.
const LOCK_SQL: &str = "SELECT id, order_id, due_at, created_at, \
     to_jsonb(o) ->> 'traceparent', to_jsonb(o) ->> 'tracestate' \
     FROM order_expiry_outbox o ORDER BY id LIMIT $1 FOR UPDATE SKIP LOCKED";

/// Rows done with: confirmed, or moved to the rejected table.
const DELETE_SQL: &str = "DELETE FROM order_expiry_outbox WHERE id = ANY($1)";

/// Rows that can never be published, with their reasons.
const REJECT_SQL: &str = "INSERT INTO order_expiry_outbox_rejected \
     (id, order_id, due_at, created_at, reason) \
     SELECT * FROM unnest($1::bigint[], $2::text[], $3::timestamptz[], $4::timestamptz[], $5::text[]) \
     ON CONFLICT (id) DO NOTHING";

/// The whole table: rows waiting and the age of the oldest, in seconds.
const PENDING_SQL: &str = "SELECT count(*), \
     coalesce(extract(epoch FROM now() - min(created_at)), 0)::float8 \
     FROM order_expiry_outbox";

/// One open connection, listening.
pub(super) struct RelayConnection {
    client: Client,
    notifications: UnboundedReceiver<String>,
    /// The schema of the outbox table: notifications from other schemas'
    /// outboxes in the same database are not ours.
    schema: String,
    timeout: Duration,
    lock: Statement,
    delete: Statement,
    reject: Statement,
}

/// A round's transaction: the locked rows, and what to do with them.
pub(super) struct Locked<'a> {
    tx: Transaction<'a>,
    timeout: Duration,
    delete: &'a Statement,
    reject: &'a Statement,
}

impl RelayConnection {
    /// Connects, finds the outbox table, prepares the statements, listens.
    pub(super) async fn open(config: &Config, timeout: Duration) -> Result<Self, RelayError> {
        let (client, mut connection) = bounded(timeout, config.connect(NoTls)).await?;
        let (sender, notifications) = tokio::sync::mpsc::unbounded_channel();
        // Drives the connection and forwards its notifications; ends when the
        // connection does (the client dropped, or the server gone).
        tokio::spawn(async move {
            let mut messages = futures::stream::poll_fn(move |cx| connection.poll_message(cx));
            while let Some(Ok(message)) = messages.next().await {
                if let AsyncMessage::Notification(n) = message {
                    let _ = sender.send(n.payload().to_owned());
                }
            }
        });
        // The relay's own commits (the deletes) need not wait for the WAL
        // flush: a delete lost in a database crash brings its row back, and
        // the row is published again, a duplicate the consumer acks as
        // `not_unpaid`. That saves a disk flush per round on the relay's lag.
        bounded(
            timeout,
            client.batch_execute("SET synchronous_commit TO off"),
        )
        .await?;
        let row = bounded(timeout, client.query_one(SCHEMA_SQL, &[])).await?;
        let schema: String = row
            .try_get::<_, Option<String>>(0)?
            .ok_or(RelayError::NoTable)?;
        let lock = bounded(timeout, client.prepare(LOCK_SQL)).await?;
        let delete = bounded(timeout, client.prepare(DELETE_SQL)).await?;
        let reject = bounded(timeout, client.prepare(REJECT_SQL)).await?;
        bounded(timeout, client.batch_execute(&format!("LISTEN {CHANNEL}"))).await?;
        Ok(Self {
            client,
            notifications,
            schema,
            timeout,
            lock,
            delete,
            reject,
        })
    }

    /// Forgets notifications already received: the round about to start sees
    /// every row they announced.
    pub(super) fn drain(&mut self) -> Result<(), RelayError> {
        loop {
            match self.notifications.try_recv() {
                Ok(_) => {}
                Err(TryRecvError::Empty) => return Ok(()),
                Err(TryRecvError::Disconnected) => return Err(RelayError::Closed),
            }
        }
    }

    /// Waits for a notification from our outbox; an error when the connection
    /// ended.
    pub(super) async fn notified(&mut self) -> Result<(), RelayError> {
        loop {
            match self.notifications.recv().await {
                Some(schema) if schema == self.schema => return Ok(()),
                Some(_) => {}
                None => return Err(RelayError::Closed),
            }
        }
    }

    /// Begins a round: locks up to `limit` of the oldest rows no other relay
    /// holds.
    pub(super) async fn lock(
        &mut self,
        limit: u32,
    ) -> Result<(Locked<'_>, Vec<OutboxRow>), RelayError> {
        let timeout = self.timeout;
        let tx = bounded(timeout, self.client.transaction()).await?;
        let rows = bounded(timeout, tx.query(&self.lock, &[&i64::from(limit)])).await?;
        let rows = rows
            .iter()
            .map(|r| {
                Ok(OutboxRow {
                    id: r.try_get(0)?,
                    order_id: r.try_get(1)?,
                    due_at: r.try_get(2)?,
                    created_at: r.try_get(3)?,
                    traceparent: r.try_get(4)?,
                    tracestate: r.try_get(5)?,
                })
            })
            .collect::<Result<Vec<_>, tokio_postgres::Error>>()?;
        let locked = Locked {
            tx,
            timeout,
            delete: &self.delete,
            reject: &self.reject,
        };
        Ok((locked, rows))
    }

    /// Rows waiting in the whole table, and the age of the oldest in seconds.
    pub(super) async fn pending(&self) -> Result<(i64, f64), RelayError> {
        let row = bounded(self.timeout, self.client.query_one(PENDING_SQL, &[])).await?;
        Ok((row.try_get(0)?, row.try_get(1)?))
    }
}

impl Locked<'_> {
    /// Deletes the rows `done`, moves `rejected` (row, reason) into the
    /// rejected table, and commits: all of it or none.
    pub(super) async fn finish(
        self,
        done: &[i64],
        rejected: &[(&OutboxRow, String)],
    ) -> Result<(), RelayError> {
        if !done.is_empty() {
            bounded(self.timeout, self.tx.execute(self.delete, &[&done])).await?;
        }
        if !rejected.is_empty() {
            let ids: Vec<i64> = rejected.iter().map(|(r, _)| r.id).collect();
            let orders: Vec<&str> = rejected.iter().map(|(r, _)| r.order_id.as_str()).collect();
            let due: Vec<DateTime<Utc>> = rejected.iter().map(|(r, _)| r.due_at).collect();
            let created: Vec<DateTime<Utc>> = rejected.iter().map(|(r, _)| r.created_at).collect();
            let reasons: Vec<&str> = rejected.iter().map(|(_, why)| why.as_str()).collect();
            bounded(
                self.timeout,
                self.tx
                    .execute(self.reject, &[&ids, &orders, &due, &created, &reasons]),
            )
            .await?;
        }
        bounded(self.timeout, self.tx.commit()).await
    }
}

/// Awaits a database call for at most `timeout`.
async fn bounded<T>(
    timeout: Duration,
    call: impl Future<Output = Result<T, tokio_postgres::Error>>,
) -> Result<T, RelayError> {
    match tokio::time::timeout(timeout, call).await {
        Ok(answer) => Ok(answer?),
        Err(_) => Err(RelayError::Timeout(timeout)),
    }
}
