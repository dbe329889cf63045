//! One run of the sale: its world, its serve, its path, its figures.

use std::path::Path;
use std::time::Duration;

use order_expiry::Settings;
use order_expiry_testkit::World;
use tokio::time::Instant;

use super::broker::Broker;
use super::plan::Plan;
use super::report::Row;
use super::{FlashArgs, SalePath, paths, serve};
use crate::tracing_cost::Tracing;

/// The default cancel and sweep statements, each marking the rows it
/// cancels in a `cancelled_by` column of the bench's own table: the ladder's
/// from the sweeper's, counted in the database.
async fn mark_who_cancels(world: &World, settings: &mut Settings) -> anyhow::Result<()> {
    world
        .store
        .client()
        .await?
        .batch_execute("ALTER TABLE orders ADD COLUMN cancelled_by text")
        .await?;
    let set = "SET status = 'cancelled', cancelled_at = now()";
    for (statement, by) in [
        (&mut settings.database.cancel_sql, "ladder"),
        (&mut settings.sweeper.sweep_sql, "sweeper"),
    ] {
        anyhow::ensure!(
            statement.contains(set),
            "cannot mark who cancels: the statement does not {set}: {statement}"
        );
        *statement = statement.replace(set, &format!("{set}, cancelled_by = '{by}'"));
    }
    Ok(())
}

/// One run in `world`: its serve, its path, its figures; traced as
/// `tracing` says.
pub(super) async fn run_once(
    world: &World,
    args: &FlashArgs,
    path: SalePath,
    bundled: bool,
    binary: &Path,
    broker: &Broker,
    tracing: &Tracing,
) -> anyhow::Result<Row> {
    anyhow::ensure!(
        !(tracing.is_on() && path == SalePath::Cli),
        "the cli path cannot carry a trace context per order: its NDJSON lines have no \
         traceparent field (use the library or outbox path)"
    );
    let mut settings = world.settings.clone();
    mark_who_cancels(world, &mut settings).await?;
    let served = serve::Serve::start(binary, &settings, bundled, tracing).await?;
    let plan = Plan::new(args.orders, args.within, args.window)?;
    let say = |what: String| {
        if !args.quiet {
            eprintln!("  {what}");
        }
    };
    if path != SalePath::Outbox {
        // Unpaid, `pay_deadline` = `due_at`.
        crate::insert_unpaid(world, &plan.all().collect::<Vec<_>>()).await?;
        say(format!(
            "inserted {} orders in {:.1} s",
            plan.orders,
            plan.start.elapsed().as_secs_f64()
        ));
    }
    let broker_before = broker.cpu_seconds();
    let scheduled = match path {
        SalePath::Library => paths::library(&settings, &plan, bundled, args.callers, tracing).await,
        SalePath::Cli => paths::cli(binary, &settings, &plan, bundled).await,
        SalePath::Outbox => paths::outbox(&settings, &plan, args.settle, tracing).await,
    };
    let scheduled = match scheduled {
        Ok(secs) => secs,
        Err(e) => {
            let _ = served.stop().await;
            return Err(e);
        }
    };
    say(format!(
        "scheduled in {scheduled:.1} s ({:.0} orders/s)",
        plan.orders as f64 / scheduled
    ));
    let deadline = plan.last_due().max(Instant::now()) + args.settle;
    let unpaid = crate::wait_settled(world, deadline, |_| ()).await?;
    let deadline = deadline.max(Instant::now() + Duration::from_secs(30));
    let undelivered = paths::wait_drained(world, deadline).await;
    let broker_cpu = broker.cpu_seconds().zip(broker_before).map(|(a, b)| a - b);
    let metrics = served.metrics().await;
    let peak_rss = served.peak_rss();
    let serve_cpu = served.cpu_seconds();
    served.stop().await?;
    say(format!(
        "settled; {unpaid} unpaid, {undelivered} messages still in the ladder"
    ));
    let metrics = metrics?;
    let mut row = Row::read(world, path.as_str(), bundled, plan.orders).await?;
    row.scheduled_secs = scheduled;
    row.schedule_rate = plan.orders as f64 / scheduled;
    // Who cancelled each row, read from its mark (not serve's own counters);
    // the metrics must agree.
    if (row.by_ladder, row.swept) != (metrics.ladder_cancelled, metrics.swept) {
        say(format!(
            "serve's counters say {:.0} by the ladder and {:.0} swept; the rows {:.0} and {:.0}",
            metrics.ladder_cancelled, metrics.swept, row.by_ladder, row.swept
        ));
    }
    row.messages_per_order = metrics.messages_per_order();
    row.bundle_metric = metrics.bundle_metric();
    row.broker_cpu_per_1000_s = broker_cpu.map(|s| s * 1000.0 / plan.orders.max(1) as f64);
    row.serve_peak_rss_mb = peak_rss as f64 / 1e6;
    row.serve_cpu_per_1000_s = serve_cpu.map(|s| s * 1000.0 / plan.orders.max(1) as f64);
    row.arrived_late = metrics.arrived_late;
    row.arrived_over_100ms = metrics.arrived_over_100ms;
    if metrics.batches > 0.0 && metrics.batched_orders > 0.0 {
        row.batch_mean_orders = metrics.batched_orders / metrics.batches;
        row.statement_us_per_order = metrics.batch_seconds * 1e6 / metrics.batched_orders;
    }
    say(format!(
        "{:.0} orders reached serve after due_at, {:.0} of them more than 100 ms after; \
         {:.0} cancel statements, {:.1} orders and {:.1} ms each on average ({:.0} µs per order)",
        row.arrived_late,
        row.arrived_over_100ms,
        metrics.batches,
        row.batch_mean_orders,
        metrics.batch_seconds * 1e3 / metrics.batches.max(1.0),
        row.statement_us_per_order,
    ));
    Ok(row)
}
