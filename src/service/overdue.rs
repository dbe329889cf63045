//! The gauge `order_expiry_overdue_unpaid`: unpaid orders more than
//! `overdue.margin_ms` past their `pay_deadline`, counted in the database every
//! `overdue.interval_ms`.
//!
//! It looks at the outcome, not at a mechanism: a ladder level the broker holds
//! back after a restart, a consumer that is not consuming, a sweeper turned off,
//! a schedule that never reached the broker all end as an unpaid order past its
//! deadline. Only with `action.kind = sql`: otherwise the orders live elsewhere.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::MissedTickBehavior;
use tokio_util::sync::CancellationToken;
use tracing::warn;

use super::orders::OrderStore;
use crate::service::SWEEPER;
use crate::settings::OverdueSettings;
use crate::telemetry::OVERDUE_UNPAID;

/// Counts overdue unpaid orders into the gauge until shut down.
#[derive(Debug)]
pub(crate) struct OverdueWatch<S> {
    store: Arc<S>,
    settings: OverdueSettings,
}

impl<S: OrderStore> OverdueWatch<S> {
    /// A watch on `store` configured by `settings`.
    pub(crate) fn new(settings: &OverdueSettings, store: Arc<S>) -> Self {
        Self {
            store,
            settings: settings.clone(),
        }
    }

    /// Counts now and then every interval until `shutdown`. A failed count is
    /// logged and leaves the gauge at its last value (`-1` before the first
    /// answer), so a dashboard shows a database that never answered.
    pub(crate) async fn run(self, shutdown: CancellationToken) {
        let gauge = metrics::gauge!(OVERDUE_UNPAID.name);
        gauge.set(-1.0);
        let interval = self.settings.interval.max(Duration::from_millis(1));
        let mut ticks = tokio::time::interval(interval);
        ticks.set_missed_tick_behavior(MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => break,
                _ = ticks.tick() => {}
            }
            let counted = tokio::select! {
                _ = shutdown.cancelled() => break,
                counted = self.store.count_overdue(self.settings.margin) => counted,
            };
            match counted {
                Ok(n) => gauge.set(n as f64),
                Err(e) => {
                    warn!(target: SWEEPER, error = %e, "counting overdue unpaid orders failed")
                }
            }
        }
    }
}
