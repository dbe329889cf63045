//! `order-expiry demo`: creates orders with short payment windows, pays some of
//! them while they wait, runs the real consumer, and reports what happened, read
//! back from the database.

use std::sync::Arc;
use std::time::Duration;

use chrono::{TimeDelta, Utc};
use rand::Rng;
use tokio_util::sync::CancellationToken;

use crate::consumer::Consumer;
use crate::http::Readiness;
use crate::orders::PgOrderStore;
use crate::scheduler::Scheduler;
use crate::settings::Settings;
use crate::topology::Topology;

/// Any demo failure, already phrased for a person.
pub type DemoError = Box<dyn std::error::Error + Send + Sync>;

/// What the demo does.
#[derive(Debug, Clone)]
pub struct DemoOptions {
    /// How many orders to create.
    pub orders: usize,
    /// Shortest payment window.
    pub min_delay: Duration,
    /// Longest payment window.
    pub max_delay: Duration,
    /// Share of orders paid before their window closes (0.0-1.0).
    pub pay_share: f64,
}

impl Default for DemoOptions {
    fn default() -> Self {
        Self {
            orders: 40,
            min_delay: Duration::from_secs(2),
            max_delay: Duration::from_secs(8),
            pay_share: 0.3,
        }
    }
}

/// The outcome, from the database.
#[derive(Debug, Clone, PartialEq)]
pub struct DemoSummary {
    /// Orders created.
    pub orders: i64,
    /// Orders cancelled.
    pub cancelled: i64,
    /// Orders paid in time, left paid.
    pub paid: i64,
    /// Orders still unpaid at the end (must be 0).
    pub unpaid: i64,
    /// Orders cancelled before their deadline (must be 0).
    pub early: i64,
    /// Median lateness of cancels, ms.
    pub p50_ms: f64,
    /// 99th percentile lateness, ms.
    pub p99_ms: f64,
    /// Worst lateness, ms.
    pub max_ms: f64,
}

impl std::fmt::Display for DemoSummary {
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

/// Runs the demo on the broker and database of `settings`; `progress` receives
/// one line per step and about one per second while orders wait.
pub async fn run(
    settings: &Settings,
    options: &DemoOptions,
    mut progress: impl FnMut(&str),
) -> Result<DemoSummary, DemoError> {
    let store = Arc::new(PgOrderStore::new(&settings.database)?);
    store.migrate().await?;
    progress("orders table ready");
    apply_topology(settings).await?;
    progress("broker topology declared");

    let run_id = format!("demo-{}", Utc::now().format("%Y%m%dT%H%M%S%.3f"));
    let scheduler = Scheduler::from_settings(settings)?;
    let (min_ms, max_ms) = (
        options.min_delay.as_millis() as i64,
        options
            .max_delay
            .as_millis()
            .max(options.min_delay.as_millis()) as i64,
    );
    let mut rng = rand::rng();
    let now = Utc::now();
    let mut orders = Vec::with_capacity(options.orders);
    let mut to_pay = Vec::new();
    for i in 0..options.orders {
        let id = format!("{run_id}-{i:04}");
        let window = rng.random_range(min_ms..=max_ms);
        let due_at = now + TimeDelta::milliseconds(window);
        store.create_unpaid(&id, due_at).await?;
        if rng.random_bool(options.pay_share.clamp(0.0, 1.0)) {
            // Pay somewhere in the first 80% of the window.
            let pay_after = rng.random_range(0..=(window * 8 / 10));
            to_pay.push((id.clone(), Duration::from_millis(pay_after as u64)));
        }
        orders.push((id, due_at));
    }
    let failures: Vec<String> = scheduler
        .schedule_many(orders)
        .await
        .into_iter()
        .filter_map(|r| r.err().map(|e| e.to_string()))
        .collect();
    scheduler.close().await;
    if let Some(first) = failures.first() {
        return Err(format!("{} schedules failed, first: {first}", failures.len()).into());
    }
    progress(&format!(
        "{} orders scheduled (windows {:?}..{:?}); {} will be paid while they wait",
        options.orders,
        options.min_delay,
        options.max_delay,
        to_pay.len()
    ));

    let stop = CancellationToken::new();
    let consumer = Consumer::new(settings, Arc::clone(&store), Arc::new(Readiness::default()))?;
    let consumer_task = tokio::spawn(consumer.run(stop.clone()));
    let payer_store = Arc::clone(&store);
    let payer = tokio::spawn(async move {
        for (id, after) in sorted(to_pay) {
            tokio::time::sleep_until(
                tokio::time::Instant::now() + after.saturating_sub(since(now)),
            )
            .await;
            let _ = payer_store.pay(&id).await;
        }
    });

    let deadline = tokio::time::Instant::now() + options.max_delay + Duration::from_secs(15);
    let pattern = format!("{run_id}-%");
    loop {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let counts = counts(&store, &pattern).await?;
        progress(&format!(
            "t+{:>4.1}s  unpaid {:>3}  paid {:>3}  cancelled {:>3}",
            since(now).as_secs_f64(),
            counts.0,
            counts.1,
            counts.2
        ));
        if (counts.0 == 0 && payer.is_finished()) || tokio::time::Instant::now() > deadline {
            break;
        }
    }
    stop.cancel();
    let _ = consumer_task.await;
    payer.abort();
    summary(&store, &pattern).await
}

async fn apply_topology(settings: &Settings) -> Result<(), DemoError> {
    let timeout = settings.amqp.timeout();
    let tls = crate::broker::TlsFiles::from_settings(&settings.amqp);
    let connection =
        crate::broker::connect_tls(&settings.amqp.url, &tls, "order-expiry demo", timeout).await?;
    let channel = connection.create_channel().await?;
    Topology::describe(&settings.ladder()?, &settings.topology)
        .apply(&channel, timeout)
        .await?;
    let _ = connection.close(200, "done".into()).await;
    Ok(())
}

fn sorted(mut v: Vec<(String, Duration)>) -> Vec<(String, Duration)> {
    v.sort_by_key(|(_, d)| *d);
    v
}

fn since(start: chrono::DateTime<Utc>) -> Duration {
    (Utc::now() - start).to_std().unwrap_or(Duration::ZERO)
}

async fn counts(store: &PgOrderStore, pattern: &str) -> Result<(i64, i64, i64), DemoError> {
    let client = store.pool().get().await?;
    let row = client
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

async fn summary(store: &PgOrderStore, pattern: &str) -> Result<DemoSummary, DemoError> {
    let client = store.pool().get().await?;
    let row = client
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
    Ok(DemoSummary {
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
