//! `order-expiry serve` for one run: started with the world's settings, the
//! run's bundles setting and its span export (on or off), watched for its peak
//! RSS, read through its `/metrics` and `/proc`, stopped with SIGTERM. The
//! flash sale's consumer, and the steady stream's in the tracing-cost
//! comparison.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use anyhow::{Context, bail};
use order_expiry::Settings;
use order_expiry_testkit::{Served, metric_value, procfs};
use tokio_util::sync::CancellationToken;

use super::NO_BUNDLES_ENV;
use crate::tracing_cost::Tracing;

/// The `order-expiry` binary: `given`, else `$ORDER_EXPIRY_BIN`, else next to
/// this executable or one directory up (a test binary lives in `deps/`).
pub(crate) fn binary(given: Option<&Path>) -> anyhow::Result<PathBuf> {
    if let Some(path) = given {
        return Ok(path.to_owned());
    }
    if let Some(path) = std::env::var_os("ORDER_EXPIRY_BIN") {
        return Ok(PathBuf::from(path));
    }
    let exe = std::env::current_exe().context("locating this executable")?;
    let dir = exe.parent().context("this executable's directory")?;
    let candidates = [dir.join("order-expiry"), dir.join("../order-expiry")];
    match candidates.iter().find(|c| c.is_file()) {
        Some(found) => Ok(found.clone()),
        None => bail!(
            "no order-expiry binary next to {}: build it (cargo build --release -p order-expiry, \
             or cargo build -p order-expiry for tests), or pass --serve-bin",
            exe.display()
        ),
    }
}

/// A running serve; killed when dropped.
#[derive(Debug)]
pub(crate) struct Serve {
    served: Served,
    peak_rss: Arc<AtomicU64>,
    watching: CancellationToken,
}

/// What serve's `/metrics` said at the end of a run.
#[derive(Debug, Clone, Copy)]
pub(super) struct Metrics {
    /// `order_expiry_messages_total{outcome="cancelled"}`.
    pub(super) ladder_cancelled: f64,
    /// `order_expiry_swept_total`.
    pub(super) swept: f64,
    /// `order_expiry_orders_per_message` (`_count`, `_sum`), when serve has it.
    per_message: Option<(f64, f64)>,
    /// Orders that reached the consumer after their `due_at`
    /// (`order_expiry_arrival_lateness_seconds_count`): the ladder's and the
    /// broker's share of the lateness, where the rest is the consumer's and the database's.
    pub(super) arrived_late: f64,
    /// Of those, the ones that reached it more than 100 ms after.
    pub(super) arrived_over_100ms: f64,
    /// Action calls (cancel statements): `order_expiry_batch_orders_count`.
    pub(super) batches: f64,
    /// Orders in them: `order_expiry_batch_orders_sum`.
    pub(super) batched_orders: f64,
    /// Seconds spent in them: `order_expiry_batch_seconds_sum`.
    pub(super) batch_seconds: f64,
}

impl Metrics {
    fn parse(text: &str) -> Self {
        let histogram = "order_expiry_orders_per_message";
        let count = format!("{histogram}_count");
        let per_message = text.lines().any(|l| l.starts_with(&count)).then(|| {
            (
                metric_value(text, &count),
                metric_value(text, &format!("{histogram}_sum")),
            )
        });
        let arrival = "order_expiry_arrival_lateness_seconds";
        let arrived_late = metric_value(text, &format!("{arrival}_count"));
        Self {
            ladder_cancelled: metric_value(
                text,
                "order_expiry_messages_total{outcome=\"cancelled\"}",
            ),
            swept: metric_value(text, "order_expiry_swept_total"),
            per_message,
            arrived_late,
            arrived_over_100ms: arrived_late
                - metric_value(text, &format!("{arrival}_bucket{{le=\"0.1\"}}")),
            batches: metric_value(text, "order_expiry_batch_orders_count"),
            batched_orders: metric_value(text, "order_expiry_batch_orders_sum"),
            batch_seconds: metric_value(text, "order_expiry_batch_seconds_sum"),
        }
    }

    /// Due messages per order: `_count / _sum` of the histogram, 1 without it.
    pub(super) fn messages_per_order(&self) -> f64 {
        match self.per_message {
            Some((messages, orders)) if orders > 0.0 => messages / orders,
            _ => 1.0,
        }
    }

    /// Whether serve had the histogram (a build with bundles).
    pub(super) fn bundle_metric(&self) -> bool {
        self.per_message.is_some()
    }
}

impl Serve {
    /// Starts `binary serve` with `settings`, bundles off unless `bundled`,
    /// span export as `tracing` says, and waits until `/readyz` says 200.
    pub(crate) async fn start(
        binary: &Path,
        settings: &Settings,
        bundled: bool,
        tracing: &Tracing,
    ) -> anyhow::Result<Self> {
        let log = crate::temp_log("serve");
        // The production default: spans and logs as in a deployment.
        let mut env = vec![("ORDER_EXPIRY__LOG__FILTER", "info")];
        if !bundled {
            env.push(NO_BUNDLES_ENV);
        }
        let export = tracing.serve_env();
        env.extend(export.iter().map(|(key, value)| (*key, value.as_str())));
        let served = Served::start(binary, settings, &env, log).await;
        served.wait_ready(Duration::from_secs(30)).await;
        let peak_rss = Arc::new(AtomicU64::new(0));
        let watching = CancellationToken::new();
        tokio::spawn(watch_rss(
            served.pid().to_string(),
            Arc::clone(&peak_rss),
            watching.clone(),
        ));
        Ok(Self {
            served,
            peak_rss,
            watching,
        })
    }

    /// Its `/metrics` now.
    pub(super) async fn metrics(&self) -> anyhow::Result<Metrics> {
        match self.served.get("/metrics").await {
            Some((200, text)) => Ok(Metrics::parse(&text)),
            other => bail!(
                "/metrics of serve answered {:?}: {}",
                other.map(|(status, _)| status),
                self.served.log_tail(10)
            ),
        }
    }

    /// Its user + system CPU seconds so far.
    pub(crate) fn cpu_seconds(&self) -> Option<f64> {
        procfs::cpu_seconds(&self.served.pid().to_string(), false)
    }

    /// Its peak RSS so far, bytes (`VmHWM`, or the largest `VmRSS` seen).
    pub(super) fn peak_rss(&self) -> u64 {
        let now = procfs::memory(&self.served.pid().to_string()).map_or(0, |m| m.peak.max(m.rss));
        self.peak_rss.fetch_max(now, Ordering::Relaxed).max(now)
    }

    /// SIGTERM, and a clean exit within 30 s (with export on, serve sends
    /// its last spans before it exits).
    pub(crate) async fn stop(mut self) -> anyhow::Result<()> {
        self.watching.cancel();
        self.served.signal("-TERM");
        match self.served.wait_exit(Duration::from_secs(30)).await {
            Some(status) if status.success() => Ok(std::fs::remove_file(self.served.log_path())?),
            status => bail!("serve exited {status:?}: {}", self.served.log_tail(10)),
        }
    }
}

/// Samples `pid`'s `VmHWM` and `VmRSS` every 200 ms into `peak` until `stop`.
async fn watch_rss(pid: String, peak: Arc<AtomicU64>, stop: CancellationToken) {
    let mut ticks = tokio::time::interval(Duration::from_millis(200));
    while !stop.is_cancelled() {
        ticks.tick().await;
        match procfs::memory(&pid) {
            Some(m) => {
                peak.fetch_max(m.peak.max(m.rss), Ordering::Relaxed);
            }
            None => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_per_order_come_from_the_histogram_or_are_one() {
        let without = "order_expiry_swept_total 3\n\
                       order_expiry_messages_total{outcome=\"cancelled\"} 97\n\
                       order_expiry_messages_total{outcome=\"unknown\"} 1\n";
        let m = Metrics::parse(without);
        assert_eq!((m.swept, m.ladder_cancelled), (3.0, 97.0));
        assert_eq!(m.messages_per_order(), 1.0);
        assert!(!m.bundle_metric());
        let with = "order_expiry_orders_per_message_bucket{le=\"1\"} 2\n\
                    order_expiry_orders_per_message_sum 100\n\
                    order_expiry_orders_per_message_count 4\n";
        let m = Metrics::parse(with);
        assert_eq!(m.messages_per_order(), 0.04);
        assert!(m.bundle_metric());
    }
}
