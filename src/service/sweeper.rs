//! The safety net: every `sweeper.interval_ms`, cancel the unpaid orders whose
//! `pay_deadline` passed more than `sweeper.grace_ms` ago.
//!
//! The ladder cancels orders on time; an order is only left for the sweeper when
//! its schedule never reached the broker (the order service crashed between its
//! insert and `schedule()`, or gave up on an error). The grace period gives the
//! ladder, and a broker outage, time to do it first, so a healthy system sweeps
//! nothing. The store's statement has the same single-statement shape as the
//! consumer's cancel: it re-checks `status = 'unpaid'` in the `UPDATE`, so a
//! payment landing meanwhile is never overwritten.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::MissedTickBehavior;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use super::orders::{OrderStore, StoreError};
use crate::service::SWEEPER;
use crate::settings::SweeperSettings;
use crate::telemetry::{SWEEP_ERRORS_TOTAL, SWEPT_TOTAL};

/// At most this many statements per sweep, so one sweep cannot run for ever on a
/// huge backlog; the next interval goes on where it stopped.
const MAX_BATCHES_PER_SWEEP: usize = 100;

/// Periodically cancels overdue unpaid orders through [`OrderStore::sweep_overdue`].
#[derive(Debug)]
pub struct Sweeper<S> {
    store: Arc<S>,
    settings: SweeperSettings,
}

impl<S: OrderStore> Sweeper<S> {
    /// A sweeper on `store` configured by `settings` (whether it is enabled is
    /// the caller's decision: [`crate::service::Service`] only builds one when it is).
    pub fn new(settings: &SweeperSettings, store: Arc<S>) -> Self {
        Self {
            store,
            settings: settings.clone(),
        }
    }

    /// One sweep: cancels batches until one comes back short (or 100 ran: one
    /// sweep never runs for ever on a huge backlog) and returns the ids it
    /// cancelled. Each batch commits on its own.
    pub async fn sweep_once(&self) -> Result<Vec<String>, StoreError> {
        let limit = self.settings.batch_max.max(1);
        let mut swept = Vec::new();
        for _ in 0..MAX_BATCHES_PER_SWEEP {
            let batch = self.store.sweep_overdue(self.settings.grace, limit).await?;
            let full = sweep_again(batch.len(), limit);
            metrics::counter!(SWEPT_TOTAL.name).increment(batch.len() as u64);
            swept.extend(batch);
            if !full {
                break;
            }
        }
        Ok(swept)
    }

    /// Sweeps now and then every interval until `shutdown` is cancelled. A failed
    /// sweep is logged and counted and waits for the next interval: the database
    /// being down never turns into a busy loop.
    pub async fn run(self, shutdown: CancellationToken) {
        metrics::counter!(SWEPT_TOTAL.name).increment(0);
        let interval = self.settings.interval.max(Duration::from_millis(1));
        let mut ticks = tokio::time::interval(interval);
        ticks.set_missed_tick_behavior(MissedTickBehavior::Delay);
        info!(target: SWEEPER, interval_ms = interval.as_millis() as u64,
            grace_ms = self.settings.grace.as_millis() as u64,
            "sweeper running"
        );
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => break,
                _ = ticks.tick() => {}
            }
            let result = tokio::select! {
                _ = shutdown.cancelled() => break,
                result = self.sweep_once() => result,
            };
            match result {
                Ok(ids) if ids.is_empty() => {}
                Ok(ids) => warn!(target: SWEEPER, swept = ids.len(),
                    first = ?&ids[..ids.len().min(10)],
                    "swept overdue unpaid orders: their expiry never came through the ladder"
                ),
                Err(e) => {
                    metrics::counter!(SWEEP_ERRORS_TOTAL.name).increment(1);
                    warn!(target: SWEEPER, error = %e, "sweep failed; next one in an interval");
                }
            }
        }
        info!(target: SWEEPER, "sweeper stopped");
    }
}

/// Whether a sweep should run the statement again: only when the last batch
/// was full, i.e. there may be more. Pure.
fn sweep_again(returned: usize, limit: u32) -> bool {
    u32::try_from(returned).map_or(true, |n| n >= limit)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_full_batch_sweeps_again_a_short_one_stops() {
        assert!(sweep_again(500, 500));
        assert!(!sweep_again(499, 500));
        assert!(!sweep_again(0, 1));
    }
}
