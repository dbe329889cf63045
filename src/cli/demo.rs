//! `order-expiry demo`: creates orders with short payment windows, pays some of
//! them while they wait, runs the real consumer, and reports what happened, read
//! back from the database.

use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, bail};
use chrono::{DateTime, TimeDelta, Utc};
use clap::Args;
use order_expiry::{
    Scheduler, Settings, service::Consumer, service::PgOrderStore, service::Readiness,
    topology::Topology,
};
use rand::Rng;
use tokio_util::sync::CancellationToken;

/// `demo` arguments.
#[derive(Debug, Args)]
pub(crate) struct DemoArgs {
    /// Orders to create.
    #[arg(long, default_value_t = 40)]
    orders: usize,
    /// Shortest payment window.
    #[arg(long, default_value = "2s", value_parser = humantime::parse_duration)]
    min_delay: Duration,
    /// Longest payment window.
    #[arg(long, default_value = "8s", value_parser = humantime::parse_duration)]
    max_delay: Duration,
    /// Share of orders paid while they wait.
    #[arg(long, default_value_t = 0.3)]
    pay_share: f64,
}

/// The outcome, from the database.
#[derive(Debug, Clone, PartialEq)]
struct Summary {
    orders: i64,
    cancelled: i64,
    paid: i64,
    /// Still unpaid at the end: must be 0.
    unpaid: i64,
    /// Cancelled before their deadline: must be 0.
    early: i64,
    p50_ms: f64,
    p99_ms: f64,
    max_ms: f64,
}

impl std::fmt::Display for Summary {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} orders: cancelled {}, left paid {}, still unpaid {}, early {}; lateness p50 {:.0} ms, p99 {:.0} ms, max {:.0} ms",
            self.orders,
            self.cancelled,
            self.paid,
            self.unpaid,
            self.early,
            self.p50_ms,
            self.p99_ms,
            self.max_ms
        )
    }
}

/// The demo's orders: ids share `run_id` as a prefix.
struct Plan {
    run_id: String,
    started: DateTime<Utc>,
    orders: Vec<(String, DateTime<Utc>)>,
    /// Orders paid while they wait, and after how long.
    to_pay: Vec<(String, Duration)>,
}

pub(super) async fn run(args: &DemoArgs, settings: &Settings) -> anyhow::Result<()> {
    let summary = demo(args, settings).await.context("demo failed")?;
    println!("summary: {summary}");
    if summary.early > 0 || summary.unpaid > 0 {
        bail!("the demo saw early or missed cancellations");
    }
    Ok(())
}

async fn demo(args: &DemoArgs, settings: &Settings) -> anyhow::Result<Summary> {
    let store = Arc::new(PgOrderStore::new(settings)?);
    store.migrate().await?;
    println!("orders table ready");
    Topology::declare(settings, "order-expiry demo").await?;
    println!("broker topology declared");
    let plan = plan(args);
    for (id, due_at) in &plan.orders {
        store.create_unpaid(id, *due_at).await?;
    }
    schedule(settings, &plan).await?;
    println!(
        "{} orders scheduled (windows {:?}..{:?}); {} will be paid while they wait",
        args.orders,
        args.min_delay,
        args.max_delay,
        plan.to_pay.len()
    );
    let stop = CancellationToken::new();
    let consumer = Consumer::new(settings, Arc::clone(&store), Arc::new(Readiness::default()))?;
    let consumer_task = tokio::spawn(consumer.run(stop.clone()));
    let payer = tokio::spawn(pay(Arc::clone(&store), plan.to_pay.clone(), plan.started));
    let pattern = format!("{}-%", plan.run_id);
    let waited = wait_until_settled(&store, &pattern, plan.started, args.max_delay, &payer).await;
    stop.cancel();
    let _ = consumer_task.await;
    payer.abort();
    waited?;
    summary(&store, &pattern).await
}

/// Random payment windows between `--min-delay` and `--max-delay`; about
/// `--pay-share` of the orders paid in the first 80% of theirs.
fn plan(args: &DemoArgs) -> Plan {
    let run_id = format!("demo-{}", Utc::now().format("%Y%m%dT%H%M%S%.3f"));
    let min_ms = args.min_delay.as_millis() as i64;
    let max_ms = args.max_delay.as_millis().max(args.min_delay.as_millis()) as i64;
    let mut rng = rand::rng();
    let started = Utc::now();
    let mut plan = Plan {
        run_id,
        started,
        orders: Vec::with_capacity(args.orders),
        to_pay: Vec::new(),
    };
    for i in 0..args.orders {
        let id = format!("{}-{i:04}", plan.run_id);
        let window = rng.random_range(min_ms..=max_ms);
        if rng.random_bool(args.pay_share.clamp(0.0, 1.0)) {
            let pay_after = rng.random_range(0..=(window * 8 / 10));
            plan.to_pay
                .push((id.clone(), Duration::from_millis(pay_after as u64)));
        }
        plan.orders
            .push((id, started + TimeDelta::milliseconds(window)));
    }
    plan.to_pay.sort_by_key(|(_, after)| *after);
    plan
}

async fn schedule(settings: &Settings, plan: &Plan) -> anyhow::Result<()> {
    let scheduler = Scheduler::from_settings(settings)?;
    let results = scheduler.schedule_many(plan.orders.iter().cloned()).await;
    scheduler.close().await;
    let failures: Vec<String> = results
        .into_iter()
        .filter_map(|r| r.err().map(|e| e.to_string()))
        .collect();
    if let Some(first) = failures.first() {
        bail!("{} schedules failed, first: {first}", failures.len());
    }
    Ok(())
}

/// Pays the orders of `to_pay` (sorted by time) like customers would.
async fn pay(store: Arc<PgOrderStore>, to_pay: Vec<(String, Duration)>, started: DateTime<Utc>) {
    for (id, after) in to_pay {
        let wait = after.saturating_sub(since(started));
        tokio::time::sleep(wait).await;
        let _ = store.pay(&id).await;
    }
}

/// Prints progress every second until nothing is unpaid and the payer is
/// done, or the longest window plus 15 s has passed.
async fn wait_until_settled(
    store: &PgOrderStore,
    pattern: &str,
    started: DateTime<Utc>,
    max_delay: Duration,
    payer: &tokio::task::JoinHandle<()>,
) -> anyhow::Result<()> {
    let deadline = tokio::time::Instant::now() + max_delay + Duration::from_secs(15);
    loop {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let (unpaid, paid, cancelled) = counts(store, pattern).await?;
        println!(
            "t+{:>4.1}s  unpaid {unpaid:>3}  paid {paid:>3}  cancelled {cancelled:>3}",
            since(started).as_secs_f64(),
        );
        if (unpaid == 0 && payer.is_finished()) || tokio::time::Instant::now() > deadline {
            return Ok(());
        }
    }
}

fn since(start: DateTime<Utc>) -> Duration {
    (Utc::now() - start).to_std().unwrap_or(Duration::ZERO)
}

async fn counts(store: &PgOrderStore, pattern: &str) -> anyhow::Result<(i64, i64, i64)> {
    let row = store
        .client()
        .await?
        .query_one(
            "SELECT count(*) FILTER (WHERE status = 'unpaid'),
                    count(*) FILTER (WHERE status = 'paid'),
                    count(*) FILTER (WHERE status = 'cancelled')
             FROM orders WHERE id LIKE $1",
            &[&pattern],
        )
        .await?;
    Ok((row.try_get(0)?, row.try_get(1)?, row.try_get(2)?))
}

async fn summary(store: &PgOrderStore, pattern: &str) -> anyhow::Result<Summary> {
    let row = store
        .client()
        .await?
        .query_one(
            "SELECT count(*),
                    count(*) FILTER (WHERE status = 'cancelled'),
                    count(*) FILTER (WHERE status = 'paid'),
                    count(*) FILTER (WHERE status = 'unpaid'),
                    count(*) FILTER (WHERE status = 'cancelled' AND cancelled_at < pay_deadline),
                    coalesce(percentile_cont(0.5) WITHIN GROUP (ORDER BY l), 0),
                    coalesce(percentile_cont(0.99) WITHIN GROUP (ORDER BY l), 0),
                    coalesce(max(l), 0)
             FROM (SELECT status, cancelled_at, pay_deadline,
                          CASE WHEN status = 'cancelled'
                               THEN extract(epoch FROM cancelled_at - pay_deadline)::float8 * 1000 END AS l
                   FROM orders WHERE id LIKE $1) o",
            &[&pattern],
        )
        .await?;
    Ok(Summary {
        orders: row.try_get(0)?,
        cancelled: row.try_get(1)?,
        paid: row.try_get(2)?,
        unpaid: row.try_get(3)?,
        early: row.try_get(4)?,
        p50_ms: row.try_get(5)?,
        p99_ms: row.try_get(6)?,
        max_ms: row.try_get(7)?,
    })
}
