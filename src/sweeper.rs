//! The safety net: every `sweeper.interval_ms`, cancel the unpaid orders whose
//! `pay_deadline` passed more than `sweeper.grace_ms` ago.
//!
//! The ladder cancels orders on time; an order is only left for the sweeper when
//! its schedule never reached the broker (the order service crashed between its
//! insert and `schedule()`, or gave up on an error). The grace period gives the
//! ladder, and a broker outage, time to do it first, so a healthy system sweeps
//! nothing. The statement has the same single-statement shape as the consumer's
//! cancel: it re-checks `status = 'unpaid'` in the `UPDATE`, so a payment landing
//! meanwhile is never overwritten.

use std::sync::Arc;

use tokio::time::MissedTickBehavior;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::orders::{PgOrderStore, StoreError};
use crate::settings::SweeperSettings;

/// At most this many statements per sweep, so one sweep cannot run for ever on a
/// huge backlog; the next interval goes on where it stopped.
const MAX_BATCHES_PER_SWEEP: usize = 100;

/// Periodically cancels overdue unpaid orders through the `sweep_sql` statement.
#[derive(Debug)]
pub struct Sweeper {
    store: Arc<PgOrderStore>,
    settings: SweeperSettings,
}

impl Sweeper {
    /// A sweeper on `store` configured by `settings` (whether it is enabled is
    /// the caller's decision: [`crate::Service`] only builds one when it is).
    pub fn new(settings: &SweeperSettings, store: Arc<PgOrderStore>) -> Self {
        Self {
            store,
            settings: settings.clone(),
        }
    }

    /// One sweep: runs the statement until a batch comes back short (or
    /// [`MAX_BATCHES_PER_SWEEP`] ran) and returns the ids it cancelled. Each
    /// batch commits on its own.
    pub async fn sweep_once(&self) -> Result<Vec<String>, StoreError> {
        let client = self
            .store
            .pool()
            .get()
            .await
            .map_err(|e| StoreError::Pool(e.to_string()))?;
        let statement = client.prepare_cached(&self.settings.sweep_sql).await?;
        let grace = self.settings.grace_secs();
        let limit = i64::from(self.settings.batch_max.max(1));
        let mut swept = Vec::new();
        for _ in 0..MAX_BATCHES_PER_SWEEP {
            let rows = client.query(&statement, &[&grace, &limit]).await?;
            let batch = rows
                .iter()
                .map(|row| row.try_get::<_, String>(0))
                .collect::<Result<Vec<_>, _>>()?;
            let short = !sweep_again(batch.len(), limit);
            metrics::counter!("order_expiry_swept_total").increment(batch.len() as u64);
            swept.extend(batch);
            if short {
                break;
            }
        }
        Ok(swept)
    }

    /// Sweeps now and then every interval until `shutdown` is cancelled. A failed
    /// sweep is logged and counted and waits for the next interval: the database
    /// being down never turns into a busy loop.
    pub async fn run(self, shutdown: CancellationToken) {
        metrics::counter!("order_expiry_swept_total").increment(0);
        let mut ticks = tokio::time::interval(self.settings.interval());
        ticks.set_missed_tick_behavior(MissedTickBehavior::Delay);
        info!(
            interval_ms = self.settings.interval_ms,
            grace_ms = self.settings.grace_ms,
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
                Ok(ids) => warn!(
                    swept = ids.len(),
                    first = ?&ids[..ids.len().min(10)],
                    "swept overdue unpaid orders: their expiry never came through the ladder"
                ),
                Err(e) => {
                    metrics::counter!("order_expiry_sweep_errors_total").increment(1);
                    warn!(error = %e, "sweep failed; next one in an interval");
                }
            }
        }
        info!("sweeper stopped");
    }
}

/// Whether a sweep should run the statement again: only when the last batch
/// was full, i.e. there may be more. Pure.
pub fn sweep_again(returned: usize, limit: i64) -> bool {
    i64::try_from(returned).is_ok_and(|n| n >= limit)
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
