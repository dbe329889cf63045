//! The transactional outbox relay: rows an order service inserted into
//! `order_expiry_outbox` in the transaction that created the order are
//! published through the ladder with confirms, then deleted.
//!
//! One round, in one transaction: lock up to `outbox.batch_max` of the oldest
//! rows with `FOR UPDATE SKIP LOCKED` (so replicas never take the same row),
//! publish each through the [`Scheduler`] (pipelined, confirmed), delete exactly
//! the confirmed rows, move the rows that can never be published into
//! `order_expiry_outbox_rejected`, commit. A crash after a confirm and before
//! the commit leaves the row, which the next round publishes again: a
//! duplicate message (the consumer acks the second as `not_unpaid`), never a
//! lost one. A failed publish keeps its row and the relay backs off.
//!
//! The relay wakes on the insert trigger's `NOTIFY`, polls every
//! `outbox.poll_interval_ms` as a fallback, and goes on at once while rounds
//! come back full.
//!
//! A row's optional `traceparent`/`tracestate` columns
//! (`migrations/0003_outbox_trace.sql`) go out as the message's trace
//! headers: the order's trace goes on from the order service's INSERT.
//!
//! - `schema`: the channel its trigger notifies (the tables and the trigger:
//!   `migrations/0002_outbox.sql`).
//! - [`connection`]: the relay's own listening connection and its statements.
//! - [`round`]: what a publish result means for its row (pure).
//! - [`report`]: what a committed round reports: metrics, logs, the observer.

mod connection;
mod report;
mod round;
mod schema;

use std::sync::Arc;
use std::time::{Duration, Instant};

use chrono::Utc;
use futures::StreamExt;
use thiserror::Error;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use self::connection::RelayConnection;
pub use self::report::Relayed;
use self::report::report;
use self::round::{OutboxRow, RowFate, fate};
use super::backoff::Backoff;
use super::http::{OutboxState, Readiness};
use super::orders::{StoreError, connect_config, with_causes};
use crate::clock::Clock;
use crate::publisher::{ScheduleError, Scheduler};
use crate::settings::{OutboxSettings, Settings};
use crate::telemetry::{
    OUTBOX_OLDEST_SECONDS, OUTBOX_PENDING, OUTBOX_PUBLISH_FAILURES_TOTAL, OUTBOX_REJECTED_TOTAL,
};

/// The log target of the relay's events.
pub(super) const RELAY: &str = "order_expiry::outbox";

/// A round slower than this is logged with the time each phase took: the
/// rows it held waited that long for their confirm.
const SLOW_ROUND: Duration = Duration::from_secs(1);

/// Logs a round slower than [`SLOW_ROUND`], naming where the time went: the
/// database (locking the rows, committing their delete) or the broker
/// (publishing and waiting for the confirms).
fn warn_if_slow(rows: usize, started: Instant, locked: Instant, published: Instant) {
    let took = started.elapsed();
    if took < SLOW_ROUND {
        return;
    }
    let ms = |d: Duration| d.as_millis() as u64;
    warn!(target: RELAY, rows, took_ms = ms(took),
        lock_ms = ms(locked - started),
        publish_ms = ms(published - locked),
        commit_ms = ms(published.elapsed()),
        "slow outbox round: its rows waited for it"
    );
}

/// Why the relay cannot be built, or why a round failed (it is retried).
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum RelayError {
    /// The broker or ladder settings are invalid (at build time).
    #[error("outbox relay: {0}")]
    Scheduler(#[from] ScheduleError),
    /// The database settings are invalid (at build time).
    #[error(transparent)]
    Settings(#[from] StoreError),
    /// A statement failed, or the connection did.
    #[error("outbox database call failed: {}", with_causes(.0))]
    Database(#[from] tokio_postgres::Error),
    /// No answer within `database.query_timeout_ms`.
    #[error("no answer from the database within {0:?}")]
    Timeout(Duration),
    /// The relay's connection ended.
    #[error("the outbox connection closed")]
    Closed,
    /// The table is not on the connection's `search_path`.
    #[error(
        "no table order_expiry_outbox on the database's search_path: run `order-expiry migrate`"
    )]
    NoTable,
}

/// What one round did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Round {
    /// Rows published (confirmed) and deleted.
    pub published: usize,
    /// Rows moved to `order_expiry_outbox_rejected`.
    pub rejected: usize,
    /// Rows whose publish failed; they stay for a later round.
    pub failed: usize,
    /// The round locked `outbox.batch_max` rows: there may be more.
    pub full: bool,
}

/// Relays `order_expiry_outbox` to the ladder; `serve` runs one when
/// `outbox.enabled` (see the module docs).
pub struct Relay {
    settings: OutboxSettings,
    config: tokio_postgres::Config,
    query_timeout: Duration,
    scheduler: Scheduler,
    readiness: Arc<Readiness>,
    observer: Option<tokio::sync::mpsc::UnboundedSender<Relayed>>,
    connection: Option<RelayConnection>,
}

impl std::fmt::Debug for Relay {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Relay")
            .field("settings", &self.settings)
            .field("scheduler", &self.scheduler)
            .finish_non_exhaustive()
    }
}

impl Relay {
    /// A relay for the database, broker, ladder and outbox settings of
    /// `settings`, reporting on `readiness`. Connects on first use.
    pub fn new(settings: &Settings, readiness: Arc<Readiness>) -> Result<Self, RelayError> {
        Ok(Self {
            settings: settings.outbox.clone(),
            config: connect_config(&settings.database)?,
            query_timeout: settings.database.query_timeout,
            scheduler: Scheduler::from_settings(settings)?,
            readiness,
            observer: None,
            connection: None,
        })
    }

    /// Measures each row's delay by `clock` (this host's corrected to the
    /// database's, whose `due_at`s the rows hold) instead of this host's own.
    pub(crate) fn with_clock(mut self, clock: Clock) -> Self {
        self.scheduler = self.scheduler.with_clock(clock);
        self
    }

    /// Reports every row the relay is done with, after its round committed:
    /// for tests and benchmarks, which measure the lag of each row.
    pub fn observe(&mut self) -> tokio::sync::mpsc::UnboundedReceiver<Relayed> {
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        self.observer = Some(tx);
        rx
    }

    /// Relays until `shutdown` is cancelled; a round in progress finishes
    /// first (bounded by the broker's and the database's timeouts).
    pub async fn run(mut self, shutdown: CancellationToken) {
        info!(target: RELAY, batch_max = self.settings.batch_max,
            poll_interval_ms = self.settings.poll_interval.as_millis() as u64,
            "outbox relay running"
        );
        metrics::counter!(OUTBOX_PUBLISH_FAILURES_TOTAL.name).increment(0);
        metrics::counter!(OUTBOX_REJECTED_TOTAL.name).increment(0);
        // Connected before the first row comes, so it does not wait for it; a
        // broker that is down now is retried by the rounds.
        let _ = self.scheduler.connect().await;
        let mut backoff = Backoff::new(self.settings.retry_initial, self.settings.retry_max);
        let mut counted: Option<Instant> = None;
        while !shutdown.is_cancelled() {
            let round = self.relay_once().await;
            let wait = match &round {
                Ok(r) if r.failed == 0 => {
                    backoff.reset();
                    self.readiness.set_outbox(OutboxState::Relaying);
                    if r.full {
                        continue;
                    }
                    None
                }
                Ok(_) => {
                    self.readiness.set_outbox(OutboxState::Failing);
                    Some(backoff.next_delay())
                }
                Err(e) => {
                    self.readiness.set_outbox(OutboxState::Failing);
                    let delay = backoff.next_delay();
                    warn!(target: RELAY, error = %e, retry_in_ms = delay.as_millis() as u64,
                        "outbox round failed; the rows stay in the table"
                    );
                    Some(delay)
                }
            };
            if counted.is_none_or(|at| at.elapsed() >= self.settings.poll_interval) {
                self.count_pending().await;
                counted = Some(Instant::now());
            }
            match wait {
                Some(delay) => {
                    tokio::select! {
                        _ = shutdown.cancelled() => break,
                        _ = tokio::time::sleep(delay) => {}
                    }
                }
                None => self.wait_for_rows(&shutdown).await,
            }
        }
        self.scheduler.close().await;
        self.readiness.set_outbox(OutboxState::Disabled);
        info!(target: RELAY, "outbox relay stopped");
    }

    /// One round (see the module docs), connecting first if needed. On an
    /// error the connection is dropped, and the server rolls back: every row
    /// stays for the next round.
    pub async fn relay_once(&mut self) -> Result<Round, RelayError> {
        let result = self.round().await;
        if result.is_err() {
            self.connection = None;
        }
        result
    }

    async fn round(&mut self) -> Result<Round, RelayError> {
        let connection = match &mut self.connection {
            Some(connection) => connection,
            None => self
                .connection
                .insert(RelayConnection::open(&self.config, self.query_timeout).await?),
        };
        connection.drain()?;
        let batch_max = self.settings.batch_max;
        let started = Instant::now();
        let (locked, rows) = connection.lock(batch_max).await?;
        let locked_at = Instant::now();
        let locked_wall = Utc::now();
        if rows.is_empty() {
            locked.finish(&[], &[]).await?;
            return Ok(Round::default());
        }
        let full = rows.len() >= batch_max as usize;
        let results = match self.scheduler.connect().await {
            // Connected: publish all, pipelined; each result as it comes.
            Ok(()) => {
                // Each with the trace context of its row, not the relay's.
                let orders: Vec<_> = rows.iter().map(OutboxRow::message).collect();
                self.scheduler
                    .schedule_messages(futures::stream::iter(orders))
                    .map(|result| (result, Utc::now()))
                    .collect::<Vec<_>>()
                    .await
            }
            // No broker: one failure for the batch, not one connect per row.
            Err(e) => {
                warn!(target: RELAY, error = %e, rows = rows.len(),
                    "cannot reach the broker; the rows stay in the outbox");
                metrics::counter!(OUTBOX_PUBLISH_FAILURES_TOTAL.name).increment(rows.len() as u64);
                locked.finish(&[], &[]).await?;
                return Ok(Round {
                    failed: rows.len(),
                    full,
                    ..Round::default()
                });
            }
        };
        let mut done = Vec::with_capacity(rows.len());
        let mut published = Vec::with_capacity(rows.len());
        let mut rejected = Vec::new();
        let mut failed = 0;
        for (row, (result, at)) in rows.iter().zip(&results) {
            match fate(result) {
                RowFate::Published => {
                    done.push(row.id);
                    published.push((row, *at));
                }
                RowFate::Rejected(reason) => {
                    done.push(row.id);
                    rejected.push((row, reason));
                }
                RowFate::Retry => {
                    if failed == 0
                        && let Err(e) = result
                    {
                        warn!(target: RELAY, error = %e, outbox_id = row.id, order_id = %row.order_id,
                            "publish failed; the row stays in the outbox");
                    }
                    failed += 1;
                }
            }
        }
        let published_at = Instant::now();
        locked.finish(&done, &rejected).await?;
        warn_if_slow(rows.len(), started, locked_at, published_at);
        report(
            self.observer.as_ref(),
            locked_wall,
            &published,
            &rejected,
            failed,
        );
        Ok(Round {
            published: published.len(),
            rejected: rejected.len(),
            failed,
            full,
        })
    }

    /// Refreshes the pending-rows gauges; a failure leaves them as they were.
    async fn count_pending(&mut self) {
        let Some(connection) = &self.connection else {
            return;
        };
        match connection.pending().await {
            Ok((rows, oldest)) => {
                metrics::gauge!(OUTBOX_PENDING.name).set(rows as f64);
                metrics::gauge!(OUTBOX_OLDEST_SECONDS.name).set(oldest);
            }
            Err(e) => {
                warn!(target: RELAY, error = %e, "cannot count the outbox's pending rows");
                self.connection = None;
            }
        }
    }

    /// Until a notification from our outbox, the poll interval, or shutdown.
    async fn wait_for_rows(&mut self, shutdown: &CancellationToken) {
        let poll = tokio::time::sleep(self.settings.poll_interval);
        let Some(connection) = &mut self.connection else {
            return;
        };
        let notified = tokio::select! {
            _ = shutdown.cancelled() => Ok(()),
            _ = poll => Ok(()),
            notified = connection.notified() => notified,
        };
        if notified.is_err() {
            self.connection = None;
        }
    }
}
