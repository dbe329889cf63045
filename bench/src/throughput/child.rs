//! Child processes of the benchmark: the real `order-expiry serve` for the drain
//! and the footprint, and this benchmark in its publisher role, scheduling a
//! million orders. A child has its own address space, so its peak RSS and CPU
//! time in `/proc` are its own, not mixed with the benchmark's preloading and
//! bookkeeping.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, bail};
use order_expiry::Settings;
use order_expiry_testkit::{Child, Launch, http_get, metric_value};
use tokio::time::Instant;

/// Starts `order-expiry serve` (see [`crate::flash::serve::binary`]) with
/// `settings`, at the production log level, the sweeper off, under `wrap`
/// when given.
pub(super) fn serve(settings: &Settings, wrap: Option<&str>) -> anyhow::Result<Child> {
    let serve = crate::flash::serve::binary(None)?;
    let catch_up_after = settings.topology.catch_up_after.as_millis().to_string();
    launch(serve, &["serve"], settings, wrap)
        // The drain measures the consumer: its orders are past their deadline
        // by the time the preload ends, and the sweeper (on by default) would
        // cancel them first.
        .env("ORDER_EXPIRY__SWEEPER__ENABLED", "false")
        // The world's setting (none: `setup::settings`), which the testkit
        // does not pass on. At serve's default (5 s) the preload, due longer
        // ago than that, was an outage's backlog to it, and went at
        // `consumer.catch_up_rate` (2,000 a second), not as fast as it can.
        .env("ORDER_EXPIRY__TOPOLOGY__CATCH_UP_AFTER_MS", &catch_up_after)
        .spawn()
        .context("starting order-expiry serve")
}

/// Starts this benchmark as `throughput --role schedule --orders n`, its
/// reports on stdout.
pub(super) fn publisher(
    settings: &Settings,
    n: usize,
    wrap: Option<&str>,
) -> anyhow::Result<Child> {
    let exe = std::env::current_exe().context("locating order-expiry-bench")?;
    let count = n.to_string();
    let args = ["throughput", "--role", "schedule", "--orders", &count];
    launch(exe, &args, settings, wrap)
        .stdout()
        .spawn()
        .context("starting the publisher")
}

fn launch(program: PathBuf, args: &[&str], settings: &Settings, wrap: Option<&str>) -> Launch {
    let log = crate::temp_log(args.first().copied().unwrap_or("child"));
    Launch::new(program, log)
        .args(args.iter().copied())
        .settings(settings)
        // The production default (info): per-delivery spans are created as in a
        // real deployment. The log goes to a file.
        .env("ORDER_EXPIRY__LOG__FILTER", "info")
        .wrap(wrap)
}

/// Polls the child's `/metrics` on `port` every `every` until `n` orders are
/// cancelled; the instant it saw it.
pub(super) async fn wait_cancelled(
    port: u16,
    n: u64,
    every: Duration,
    limit: Duration,
) -> anyhow::Result<Instant> {
    let deadline = Instant::now() + limit;
    let addr = std::net::SocketAddr::from(([127, 0, 0, 1], port));
    let series = "order_expiry_messages_total{outcome=\"cancelled\"}";
    let mut last = 0;
    loop {
        if let Some((_, text)) = http_get(addr, "/metrics").await {
            last = metric_value(&text, series) as u64;
            if last >= n {
                return Ok(Instant::now());
            }
        }
        if Instant::now() > deadline {
            bail!("only {last} of {n} orders cancelled within {limit:?}");
        }
        tokio::time::sleep(every).await;
    }
}
