//! `order-expiry-bench lateness`: how late (and whether ever early) orders are
//! cancelled, for the delay ladder and, in the same run and with the same orders,
//! for the textbook design: one holding queue with per-message `expiration`
//! dead-lettering into a due queue ([`naive`]).
//!
//! Orders are scheduled at a steady rate with uniformly drawn delays; a share of
//! them is paid before due. The real consumer cancels the rest. Lateness is read
//! from the database: `cancelled_at - pay_deadline` of every cancelled order.

mod naive;
mod plot;
mod report;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use chrono::{DateTime, TimeDelta, Utc};
use clap::Args;
use futures::StreamExt;
use indicatif::{ProgressBar, ProgressStyle};
use lapin::Channel;
use lapin::options::ConfirmSelectOptions;
use order_expiry::{Consumer, PgOrderStore, Readiness, Scheduler, Settings};
use order_expiry_testkit::World;
use rand::Rng;
use tokio::sync::mpsc::{UnboundedReceiver, UnboundedSender};
use tokio_util::sync::CancellationToken;
use tokio_util::time::DelayQueue;

pub use self::report::{Report, Row, table};

/// Arguments of `lateness`.
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

/// One order of the plan.
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
    let json = report::write_json(&report, &args.out_dir)?;
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

/// Runs the orders through both designs, in a world of their own based on
/// `settings` (prefix `bench-lat-<id>`), and reads the lateness back.
pub async fn measure(settings: &Settings, args: &LatenessArgs) -> anyhow::Result<Report> {
    let world = World::builder()
        .settings(settings.clone())
        .kind("bench-lat")
        .build()
        .await?;
    let naive = (!args.no_naive).then(|| naive::settings(&world.settings));
    let result = measure_in(&world, naive.as_ref(), args).await;
    if let Some(naive) = &naive {
        naive::remove(&world.channel().await, naive).await;
    }
    world.cleanup().await;
    result
}

async fn measure_in(
    world: &World,
    naive: Option<&Settings>,
    args: &LatenessArgs,
) -> anyhow::Result<Report> {
    let count = (f64::from(args.rate) * args.duration.as_secs_f64()).round() as usize;
    if let Some(naive) = naive {
        naive::declare(&world.channel().await, naive).await?;
    }
    let stop = CancellationToken::new();
    let mut consumers = Vec::new();
    for s in std::iter::once(&world.settings).chain(naive) {
        let consumer = Consumer::new(s, Arc::clone(&world.store), Arc::new(Readiness::default()))?;
        consumers.push(tokio::spawn(consumer.run(stop.clone())));
    }
    let progress = progress_bar(count, args.quiet);
    let (pay_tx, pay_rx) = tokio::sync::mpsc::unbounded_channel();
    let payer = tokio::spawn(pay_orders(Arc::clone(&world.store), pay_rx));
    let scheduled = schedule_all(
        world,
        naive,
        &plan(count, args),
        args.rate,
        pay_tx,
        &progress,
    )
    .await;
    if scheduled.is_ok() {
        let designs = if naive.is_some() { 2 } else { 1 };
        wait_settled(world, count * designs, args.max_delay, &progress).await?;
    }
    progress.finish_and_clear();
    stop.cancel();
    for c in consumers {
        let _ = c.await;
    }
    payer.abort();
    scheduled?;
    let mut rows = vec![Row::read(world, "ladder", "L-%", count).await?];
    if naive.is_some() {
        rows.push(Row::read(world, "naive", "N-%", count).await?);
    }
    Ok(Report {
        rows,
        rate: args.rate,
        duration_s: args.duration.as_secs_f64(),
        min_delay_s: args.min_delay.as_secs_f64(),
        max_delay_s: args.max_delay.as_secs_f64(),
        pay_share: args.pay_share,
        queue_type: world.settings.topology.queue_type.as_str().to_owned(),
    })
}

/// Inserts and schedules the plan in 10 ms ticks at `rate` orders per second:
/// `L-<i>` through the ladder and, with `naive`, `N-<i>` through the naive queue,
/// with the same due times; payments go to the payer.
async fn schedule_all(
    world: &World,
    naive: Option<&Settings>,
    plan: &[Planned],
    rate: u32,
    pay: UnboundedSender<(Duration, String)>,
    progress: &ProgressBar,
) -> anyhow::Result<()> {
    let scheduler = Scheduler::from_settings(&world.settings)?;
    scheduler.connect().await?;
    let naive_channel = world.open_channel().await;
    naive_channel
        .confirm_select(ConfirmSelectOptions::default())
        .await?;
    let tick = Duration::from_millis(10);
    let per_tick = f64::from(rate) * tick.as_secs_f64();
    let mut interval = tokio::time::interval(tick);
    let (mut sent, mut owed) = (0usize, 0.0);
    let mut result = Ok(());
    while sent < plan.len() && result.is_ok() {
        interval.tick().await;
        owed += per_tick;
        let n = (owed.floor() as usize).min(plan.len() - sent);
        owed -= n as f64;
        let batch = &plan[sent..sent + n];
        sent += n;
        result = schedule_batch(
            world,
            &scheduler,
            naive.map(|s| (s, &naive_channel)),
            batch,
            &pay,
        )
        .await;
        progress.set_message(format!("scheduled {sent}/{}", plan.len()));
    }
    scheduler.close().await;
    let _ = naive_channel.close(200, "done".into()).await;
    result
}

async fn schedule_batch(
    world: &World,
    scheduler: &Scheduler,
    naive: Option<(&Settings, &Channel)>,
    batch: &[Planned],
    pay: &UnboundedSender<(Duration, String)>,
) -> anyhow::Result<()> {
    let now = Utc::now();
    let due =
        |p: &Planned| -> anyhow::Result<DateTime<Utc>> { Ok(now + TimeDelta::from_std(p.delay)?) };
    let mut ladder = Vec::with_capacity(batch.len());
    let mut naive_orders = Vec::new();
    for p in batch {
        ladder.push((format!("L-{}", p.index), due(p)?));
        if naive.is_some() {
            naive_orders.push((format!("N-{}", p.index), due(p)?));
        }
    }
    world
        .insert_orders(&[ladder.clone(), naive_orders.clone()].concat())
        .await?;
    for p in batch {
        if let Some(after) = p.pay_after {
            let _ = pay.send((after, format!("L-{}", p.index)));
            if naive.is_some() {
                let _ = pay.send((after, format!("N-{}", p.index)));
            }
        }
    }
    for result in scheduler.schedule_many(ladder).await {
        result.context("scheduling on the ladder")?;
    }
    if let Some((settings, channel)) = naive {
        for (id, due_at) in &naive_orders {
            naive::publish(channel, settings, id, *due_at).await?;
        }
    }
    Ok(())
}

/// Waits until every order is settled (paid, or cancelled), or the longest
/// delay plus 90 s has passed.
async fn wait_settled(
    world: &World,
    total: usize,
    max_delay: Duration,
    progress: &ProgressBar,
) -> anyhow::Result<()> {
    let deadline = tokio::time::Instant::now() + max_delay + Duration::from_secs(90);
    loop {
        tokio::time::sleep(Duration::from_millis(500)).await;
        let unsettled: i64 = world
            .store
            .client()
            .await?
            .query_one("SELECT count(*) FROM orders WHERE status = 'unpaid'", &[])
            .await?
            .try_get(0)?;
        progress.set_position(total.saturating_sub(unsettled as usize) as u64);
        if unsettled == 0 || tokio::time::Instant::now() > deadline {
            return Ok(());
        }
    }
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
async fn pay_orders(store: Arc<PgOrderStore>, mut plans: UnboundedReceiver<(Duration, String)>) {
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
