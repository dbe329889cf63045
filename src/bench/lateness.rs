//! `order-expiry bench lateness`: how late (and whether ever early) orders are
//! cancelled, for the delay ladder and, in the same run and with the same orders,
//! for the textbook design: one holding queue with per-message `expiration`
//! dead-lettering into a due queue.
//!
//! Orders are scheduled at a steady rate with uniformly drawn delays; a share of
//! them is paid before due. The real consumer cancels the rest. Lateness is read
//! from the database: `cancelled_at - pay_deadline` of every cancelled order.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use chrono::{DateTime, TimeDelta, Utc};
use clap::Args;
use futures::StreamExt;
use indicatif::{ProgressBar, ProgressStyle};
use lapin::options::{BasicPublishOptions, ConfirmSelectOptions, QueueDeclareOptions};
use lapin::types::{AMQPValue, FieldTable};
use lapin::{BasicProperties, Channel, Confirmation};
use rand::Rng;
use serde::Serialize;
use tokio_util::sync::CancellationToken;
use tokio_util::time::DelayQueue;

use super::percentile;
use super::plot;
use super::world::BenchWorld;
use crate::consumer::Consumer;
use crate::http::Readiness;
use crate::message::{CONTENT_TYPE, ExpiryMessage};
use crate::scheduler::Scheduler;
use crate::settings::Settings;

/// Arguments of `bench lateness`.
#[derive(Debug, Clone, Args)]
pub struct LatenessArgs {
    /// Orders scheduled per second.
    #[arg(long, default_value_t = 200)]
    pub rate: u32,
    /// How long orders are scheduled for.
    #[arg(long, default_value = "60s", value_parser = humantime::parse_duration)]
    pub duration: Duration,
    /// Shortest payment window.
    #[arg(long, default_value = "1s", value_parser = humantime::parse_duration)]
    pub min_delay: Duration,
    /// Longest payment window.
    #[arg(long, default_value = "60s", value_parser = humantime::parse_duration)]
    pub max_delay: Duration,
    /// Share of orders paid before they are due.
    #[arg(long, default_value_t = 0.2)]
    pub pay_share: f64,
    /// Skip the naive single-queue design.
    #[arg(long)]
    pub no_naive: bool,
    /// Where lateness.json and lateness.svg are written.
    #[arg(long, default_value = ".")]
    pub out_dir: PathBuf,
    /// No progress bar.
    #[arg(long)]
    pub quiet: bool,
}

/// One design's figures, in milliseconds.
#[derive(Debug, Clone, Serialize)]
pub struct Row {
    /// `ladder` or `naive`.
    pub design: String,
    /// Orders scheduled.
    pub orders: usize,
    /// Orders cancelled.
    pub cancelled: usize,
    /// Orders still unpaid when the run ended (never cancelled: missed).
    pub missed: usize,
    /// Cancels before `due_at`.
    pub early: usize,
    /// Median lateness.
    pub p50_ms: f64,
    /// 90th percentile.
    pub p90_ms: f64,
    /// 99th percentile.
    pub p99_ms: f64,
    /// 99.9th percentile.
    pub p999_ms: f64,
    /// Worst.
    pub max_ms: f64,
    /// Every cancelled order's lateness, sorted.
    #[serde(skip)]
    pub lateness_ms: Vec<f64>,
}

/// The benchmark's result.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    /// One row per design.
    pub rows: Vec<Row>,
    /// Orders per second.
    pub rate: u32,
    /// Scheduling time, seconds.
    pub duration_s: f64,
    /// Delay range, seconds.
    pub min_delay_s: f64,
    /// Delay range, seconds.
    pub max_delay_s: f64,
    /// Share paid before due.
    pub pay_share: f64,
    /// Holding queue type of the ladder.
    pub queue_type: String,
}

struct Planned {
    index: usize,
    delay: Duration,
    pay_after: Option<Duration>,
}

/// Runs the benchmark and writes its report files.
pub async fn run(settings: &Settings, args: &LatenessArgs) -> anyhow::Result<()> {
    let report = measure(settings, args).await?;
    println!("{}", table(&report));
    std::fs::create_dir_all(&args.out_dir)?;
    let json = args.out_dir.join("lateness.json");
    let mut value = serde_json::to_value(&report)?;
    for (row, out) in report
        .rows
        .iter()
        .zip(value["rows"].as_array_mut().into_iter().flatten())
    {
        out["lateness_ms_sorted"] = serde_json::json!(row.lateness_ms);
    }
    std::fs::write(&json, serde_json::to_string_pretty(&value)?)?;
    let svg = args.out_dir.join("lateness.svg");
    plot::lateness_cdf(&report, &svg)?;
    println!("wrote {} and {}", json.display(), svg.display());
    if report
        .rows
        .first()
        .is_some_and(|r| r.early > 0 || r.missed > 0)
    {
        anyhow::bail!("the ladder cancelled early or missed orders");
    }
    Ok(())
}

/// Runs the orders through both designs and reads the lateness back.
pub async fn measure(settings: &Settings, args: &LatenessArgs) -> anyhow::Result<Report> {
    let world = BenchWorld::create(settings, "lat").await?;
    let result = measure_in(&world, args).await;
    world.destroy().await;
    result
}

async fn measure_in(world: &BenchWorld, args: &LatenessArgs) -> anyhow::Result<Report> {
    let count = (f64::from(args.rate) * args.duration.as_secs_f64()).round() as usize;
    let plan = plan(count, args);
    let naive = !args.no_naive;
    let naive_world = world.naive_settings();
    if naive {
        declare_naive(&world.channel, &naive_world).await?;
    }

    let stop = CancellationToken::new();
    let mut consumers = Vec::new();
    for s in std::iter::once(&world.settings).chain(naive.then_some(&naive_world)) {
        let consumer = Consumer::new(s, Arc::clone(&world.store), Arc::new(Readiness::default()))?;
        consumers.push(tokio::spawn(consumer.run(stop.clone())));
    }

    let progress = progress_bar(count, args.quiet);
    let (pay_tx, pay_rx) = tokio::sync::mpsc::unbounded_channel();
    let payer = tokio::spawn(pay_orders(Arc::clone(&world.store), pay_rx));
    let scheduler = Scheduler::from_settings(&world.settings)?;
    scheduler.connect().await?;
    let naive_channel = world.connection.create_channel().await?;
    naive_channel
        .confirm_select(ConfirmSelectOptions::default())
        .await?;

    // Publish in 10 ms ticks at the requested rate.
    let tick = Duration::from_millis(10);
    let per_tick = f64::from(args.rate) * tick.as_secs_f64();
    let mut interval = tokio::time::interval(tick);
    let mut sent = 0usize;
    let mut owed = 0.0;
    while sent < plan.len() {
        interval.tick().await;
        owed += per_tick;
        let n = (owed.floor() as usize).min(plan.len() - sent);
        owed -= n as f64;
        let batch = &plan[sent..sent + n];
        sent += n;
        let now = Utc::now();
        let mut rows = Vec::with_capacity(n * 2);
        for p in batch {
            let due_at = now + TimeDelta::from_std(p.delay)?;
            rows.push((format!("L-{}", p.index), due_at));
            if naive {
                rows.push((format!("N-{}", p.index), due_at));
            }
        }
        world.insert_orders(&rows).await?;
        for p in batch {
            if let Some(after) = p.pay_after {
                let _ = pay_tx.send((after, format!("L-{}", p.index)));
                if naive {
                    let _ = pay_tx.send((after, format!("N-{}", p.index)));
                }
            }
        }
        let ladder: Vec<(String, DateTime<Utc>)> = rows
            .iter()
            .filter(|(id, _)| id.starts_with('L'))
            .cloned()
            .collect();
        for result in scheduler.schedule_many(ladder).await {
            result.context("scheduling on the ladder")?;
        }
        if naive {
            for (id, due_at) in rows.iter().filter(|(id, _)| id.starts_with('N')) {
                publish_naive(&naive_channel, &naive_world, id, *due_at).await?;
            }
        }
        progress.set_message(format!("scheduled {sent}/{count}"));
    }
    scheduler.close().await;
    drop(pay_tx);

    // Wait until every order is settled: paid, or cancelled.
    let deadline = tokio::time::Instant::now() + args.max_delay + Duration::from_secs(90);
    loop {
        tokio::time::sleep(Duration::from_millis(500)).await;
        let unsettled = world.count_unpaid().await?;
        let settled = count * if naive { 2 } else { 1 } - unsettled as usize;
        progress.set_position(settled as u64);
        if unsettled == 0 || tokio::time::Instant::now() > deadline {
            break;
        }
    }
    progress.finish_and_clear();
    stop.cancel();
    for c in consumers {
        let _ = c.await;
    }
    payer.abort();

    let mut rows = vec![world.row("ladder", "L-%", count).await?];
    if naive {
        rows.push(world.row("naive", "N-%", count).await?);
    }
    Ok(Report {
        rows,
        rate: args.rate,
        duration_s: args.duration.as_secs_f64(),
        min_delay_s: args.min_delay.as_secs_f64(),
        max_delay_s: args.max_delay.as_secs_f64(),
        pay_share: args.pay_share,
        queue_type: format!("{:?}", world.settings.topology.queue_type).to_lowercase(),
    })
}

fn plan(count: usize, args: &LatenessArgs) -> Vec<Planned> {
    let mut rng = rand::rng();
    let min = args.min_delay.as_millis() as u64;
    let max = (args.max_delay.as_millis() as u64).max(min);
    (0..count)
        .map(|index| {
            let delay = Duration::from_millis(rng.random_range(min..=max));
            let pay_after = rng
                .random_bool(args.pay_share.clamp(0.0, 1.0))
                .then(|| delay.mul_f64(rng.random_range(0.0..0.9)));
            Planned {
                index,
                delay,
                pay_after,
            }
        })
        .collect()
}

fn progress_bar(count: usize, quiet: bool) -> ProgressBar {
    if quiet {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::new(count as u64);
    bar.set_style(
        ProgressStyle::with_template("{elapsed_precise} [{bar:40}] {pos}/{len} settled · {msg}")
            .unwrap_or_else(|_| ProgressStyle::default_bar())
            .progress_chars("=> "),
    );
    bar.enable_steady_tick(Duration::from_millis(200));
    bar
}

/// Pays orders at their planned times, like customers would.
async fn pay_orders(
    store: Arc<crate::orders::PgOrderStore>,
    mut plans: tokio::sync::mpsc::UnboundedReceiver<(Duration, String)>,
) {
    let mut due: DelayQueue<String> = DelayQueue::new();
    let mut open = true;
    loop {
        tokio::select! {
            plan = plans.recv(), if open => match plan {
                Some((after, id)) => { due.insert(id, after); }
                None => open = false,
            },
            Some(expired) = due.next(), if !due.is_empty() => {
                let _ = store.pay(expired.get_ref()).await;
            }
            else => break,
        }
    }
}

async fn declare_naive(channel: &Channel, naive: &Settings) -> anyhow::Result<()> {
    let ladder = naive.ladder()?;
    crate::topology::Topology::consumer_part(&ladder)
        .apply(channel, naive.amqp.timeout())
        .await?;
    let mut args = FieldTable::default();
    args.insert(
        "x-dead-letter-exchange".into(),
        AMQPValue::LongString(ladder.due_exchange().as_str().into()),
    );
    let hold = naive_hold_queue(naive);
    channel
        .queue_declare(hold.as_str().into(), QueueDeclareOptions::durable(), args)
        .await?;
    Ok(())
}

/// The single holding queue of the textbook design.
pub(crate) fn naive_hold_queue(naive: &Settings) -> String {
    format!("{}.hold", naive.topology.prefix)
}

async fn publish_naive(
    channel: &Channel,
    naive: &Settings,
    order_id: &str,
    due_at: DateTime<Utc>,
) -> anyhow::Result<()> {
    let message = ExpiryMessage::new(order_id, due_at)?;
    let ttl_ms = (message.due_at - Utc::now()).num_milliseconds().max(0);
    let properties = BasicProperties::default()
        .with_content_type(CONTENT_TYPE.into())
        .with_delivery_mode(2)
        .with_expiration(ttl_ms.to_string().as_str().into());
    let confirm = channel
        .basic_publish(
            "".into(),
            naive_hold_queue(naive).as_str().into(),
            BasicPublishOptions {
                mandatory: true,
                ..Default::default()
            },
            &message.encode(),
            properties,
        )
        .await?
        .await?;
    match confirm {
        Confirmation::Ack(None) => Ok(()),
        other => anyhow::bail!("naive publish not confirmed: {other:?}"),
    }
}

/// The figures as a text table.
pub fn table(report: &Report) -> String {
    let mut out = format!(
        "lateness of cancels: {} orders/s for {:.0} s, delays {:.0}-{:.0} s, {:.0}% paid before due, {} holding queues\n",
        report.rate,
        report.duration_s,
        report.min_delay_s,
        report.max_delay_s,
        report.pay_share * 100.0,
        report.queue_type
    );
    out.push_str(&format!(
        "{:<8} {:>7} {:>9} {:>6} {:>6} {:>9} {:>9} {:>9} {:>9} {:>9}\n",
        "design", "orders", "cancelled", "missed", "early", "p50", "p90", "p99", "p99.9", "max"
    ));
    for r in &report.rows {
        out.push_str(&format!(
            "{:<8} {:>7} {:>9} {:>6} {:>6} {:>9} {:>9} {:>9} {:>9} {:>9}\n",
            r.design,
            r.orders,
            r.cancelled,
            r.missed,
            r.early,
            fmt_ms(r.p50_ms),
            fmt_ms(r.p90_ms),
            fmt_ms(r.p99_ms),
            fmt_ms(r.p999_ms),
            fmt_ms(r.max_ms)
        ));
    }
    out
}

fn fmt_ms(ms: f64) -> String {
    if ms.abs() >= 10_000.0 {
        format!("{:.1} s", ms / 1000.0)
    } else {
        format!("{ms:.1} ms")
    }
}

impl Row {
    /// Figures from every cancelled order's lateness.
    pub fn from_lateness(
        design: &str,
        orders: usize,
        missed: usize,
        mut lateness_ms: Vec<f64>,
    ) -> Self {
        lateness_ms.sort_by(f64::total_cmp);
        Self {
            design: design.to_owned(),
            orders,
            cancelled: lateness_ms.len(),
            missed,
            early: lateness_ms.iter().filter(|l| **l < 0.0).count(),
            p50_ms: percentile(&lateness_ms, 50.0),
            p90_ms: percentile(&lateness_ms, 90.0),
            p99_ms: percentile(&lateness_ms, 99.0),
            p999_ms: percentile(&lateness_ms, 99.9),
            max_ms: lateness_ms.last().copied().unwrap_or(0.0),
            lateness_ms,
        }
    }
}
