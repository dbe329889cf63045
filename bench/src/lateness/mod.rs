//! `order-expiry-bench lateness`: how late (and whether ever early) orders are
//! cancelled, for the delay ladder and, in the same run and with the same orders,
//! for the textbook design: one holding queue with per-message `expiration`
//! dead-lettering into a due queue ([`naive`]).
//!
//! Orders are scheduled at a steady rate with uniformly drawn delays; a share of
//! them is paid before due. The real consumer cancels the rest. Lateness is read
//! from the database: `cancelled_at - pay_deadline` of every cancelled order.
//!
//! `--burst N` adds a flash sale on top of the steady stream: `N` more orders
//! (`B-<i>`) scheduled within `--burst-over` (1 s), `--burst-at` into the run,
//! through the same `Scheduler` from ten concurrent callers, with their own
//! delays (1-15 s by default). Their lateness is a row of its own.
//!
//! The run is judged by the goals of [`crate::goals::Bench::Lateness`] (or `Burst`
//! with a sale): never early, none missed, and the lateness bounds; it exits
//! non-zero when one is missed.
//!
//! The consumer runs in this process. The tracing-cost comparison
//! ([`measure_with`], [`Canceller::Serve`]) runs `order-expiry serve` instead,
//! as deployed, because span export is set up once per process.

mod naive;
mod report;
mod stalls;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use chrono::{DateTime, TimeDelta, Utc};
use clap::Args;
use futures::StreamExt;
use indicatif::{ProgressBar, ProgressStyle};
use lapin::Channel;
use lapin::options::ConfirmSelectOptions;
use order_expiry::publisher::ExpiryMessage;
use order_expiry::{
    OrderId, Scheduler, Settings, service::Consumer, service::PgOrderStore, service::Readiness,
};
use order_expiry_testkit::World;
use rand::Rng;
use tokio::sync::mpsc::{UnboundedReceiver, UnboundedSender};
use tokio_util::sync::CancellationToken;
use tokio_util::time::DelayQueue;

use crate::Judged;
use crate::flash::serve::Serve;
use crate::tracing_cost::Tracing;

pub use self::report::{LATE_MS, LateOrder, Report, Row};
pub use self::stalls::{Stall, Stalls};

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
    /// Orders of a flash sale scheduled on top of the steady stream (0: none).
    #[arg(long, default_value_t = 0)]
    pub burst: usize,
    /// When the flash sale starts, from the start of the steady stream.
    #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
    pub burst_at: Duration,
    /// How long the flash sale's orders take to be placed.
    #[arg(long, default_value = "1s", value_parser = humantime::parse_duration)]
    pub burst_over: Duration,
    /// Shortest payment window of a flash-sale order.
    #[arg(long, default_value = "1s", value_parser = humantime::parse_duration)]
    pub burst_min_delay: Duration,
    /// Longest payment window of a flash-sale order.
    #[arg(long, default_value = "15s", value_parser = humantime::parse_duration)]
    pub burst_max_delay: Duration,
}

/// Who cancels the ladder's orders.
#[derive(Debug, Clone)]
pub enum Canceller {
    /// A `Consumer` in this process (`lateness`), without span export.
    InProcess,
    /// An `order-expiry serve` child (the `binary`), its sweeper off so that
    /// the ladder alone cancels, its span export as `tracing` says; each
    /// order is scheduled by a `schedule_message` call of its own, with its
    /// own context when tracing is on (`schedule_many` gives every order of
    /// a call the same one). The tracing-cost comparison.
    Serve {
        /// The `order-expiry` binary.
        binary: PathBuf,
        /// Export on or off, and the orders' contexts.
        tracing: Tracing,
    },
}

/// Where orders go to be paid after a while ([`pay_orders`]).
type Payments = UnboundedSender<(Duration, String)>;

/// One order of the plan.
struct Planned {
    index: usize,
    delay: Duration,
    pay_after: Option<Duration>,
}

/// Runs the benchmark and writes its report files.
pub async fn run(settings: &Settings, args: &LatenessArgs) -> anyhow::Result<()> {
    let report = measure(settings, args).await?;
    println!("{}", report.table());
    let mut caption = format!(
        "Lateness of cancels, {} orders/s, delays {:.0}-{:.0} s ({} holding queues)",
        report.rate, report.min_delay_s, report.max_delay_s, report.queue_type
    );
    if report.burst > 0 {
        caption += &format!(", + {} within {:.0} s", report.burst, report.burst_over_s);
    }
    let curves: Vec<_> = report.rows.iter().map(report::Row::curve).collect();
    let (json, svg) = crate::cdf::write(&args.out_dir, "lateness", &report, &caption, &curves)?;
    println!("wrote {} and {}", json.display(), svg.display());
    crate::conclude(&report)
}

/// Runs the orders through both designs, in a world of their own based on
/// `settings` (prefix `bench-lat-<id>`), and reads the lateness back.
pub async fn measure(settings: &Settings, args: &LatenessArgs) -> anyhow::Result<Report> {
    measure_with(settings, args, &Canceller::InProcess).await
}

/// [`measure`], the ladder's orders cancelled by `canceller`. A flash sale
/// (`--burst`) is scheduled through `schedule_many`, so it cannot be traced
/// per order: [`Canceller::Serve`] takes the steady stream alone.
pub async fn measure_with(
    settings: &Settings,
    args: &LatenessArgs,
    canceller: &Canceller,
) -> anyhow::Result<Report> {
    if let Canceller::Serve { .. } = canceller {
        anyhow::ensure!(
            args.burst == 0,
            "the steady stream alone is measured with serve as its consumer (no --burst)"
        );
    }
    crate::world(settings, "bench-lat")
        .run(async |world| {
            let naive = (!args.no_naive).then(|| naive::settings(&world.settings));
            let result = measure_in(world, naive.as_ref(), args, canceller).await;
            if let Some(naive) = &naive {
                naive::remove(&world.channel().await, naive).await;
            }
            result
        })
        .await
}

async fn measure_in(
    world: &World,
    naive: Option<&Settings>,
    args: &LatenessArgs,
    canceller: &Canceller,
) -> anyhow::Result<Report> {
    let count = (f64::from(args.rate) * args.duration.as_secs_f64()).round() as usize;
    if let Some(naive) = naive {
        naive::declare(&world.channel().await, naive).await?;
    }
    let (served, per_order) = match canceller {
        Canceller::InProcess => (None, None),
        Canceller::Serve { binary, tracing } => (
            Some(start_serve(world, binary, tracing).await?),
            Some(tracing),
        ),
    };
    let stop = CancellationToken::new();
    let mut consumers = Vec::new();
    let ladder = served.is_none().then_some(&world.settings);
    for s in ladder.into_iter().chain(naive) {
        let consumer = Consumer::new(s, Arc::clone(&world.store), Arc::new(Readiness::default()))?;
        consumers.push(tokio::spawn(consumer.run(stop.clone())));
    }
    let watch = stalls::StallWatch::start();
    let designs = if naive.is_some() { 2 } else { 1 };
    let total = count * designs + args.burst;
    let progress = progress_bar(total, args.quiet);
    let (pay_tx, pay_rx) = tokio::sync::mpsc::unbounded_channel();
    let payer = tokio::spawn(pay_orders(Arc::clone(&world.store), pay_rx));
    // One scheduler, as in one order service: the steady stream and the sale
    // share its in-flight window.
    let scheduler = Arc::new(Scheduler::from_settings(&world.settings)?);
    scheduler.connect().await?;
    let steady_plan = plan(count, args.min_delay, args.max_delay, args.pay_share);
    let publisher = Publisher {
        scheduler: &scheduler,
        per_order,
    };
    let steady = schedule_all(
        world,
        publisher,
        naive,
        &steady_plan,
        args.rate,
        pay_tx.clone(),
        &progress,
    );
    let burst_plan = plan(
        args.burst,
        args.burst_min_delay,
        args.burst_max_delay,
        args.pay_share,
    );
    let burst = schedule_burst(world, &scheduler, &burst_plan, args, pay_tx);
    let (steady, burst) = tokio::join!(steady, burst);
    scheduler.close().await;
    let scheduled = steady.and(burst);
    if scheduled.is_ok() {
        // Every order settled (paid or cancelled), or the longest delay and 90 s.
        let longest = args.max_delay.max(args.burst_max_delay) + Duration::from_secs(90);
        let settled =
            |unpaid: i64| progress.set_position(total.saturating_sub(unpaid as usize) as u64);
        crate::wait_settled(world, tokio::time::Instant::now() + longest, settled).await?;
    }
    progress.finish_and_clear();
    stop.cancel();
    for c in consumers {
        let _ = c.await;
    }
    let serve_cpu = served.as_ref().and_then(Serve::cpu_seconds);
    if let Some(served) = served {
        served.stop().await?;
    }
    payer.abort();
    let stalls = watch.finish().await;
    scheduled?;
    let mut rows = vec![Row::read(world, "ladder", "L-%", count).await?];
    if args.burst > 0 {
        rows.push(Row::read(world, "ladder, flash sale", "B-%", args.burst).await?);
    }
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
        stalls,
        burst: args.burst,
        burst_over_s: args.burst_over.as_secs_f64(),
        burst_min_delay_s: args.burst_min_delay.as_secs_f64(),
        burst_max_delay_s: args.burst_max_delay.as_secs_f64(),
        max_in_flight: world.settings.publisher.max_in_flight,
        serve_cpu_per_1000_s: serve_cpu.map(|s| s * 1000.0 / count.max(1) as f64),
    })
}

/// `order-expiry serve` for the world's ladder, its sweeper off: the ladder
/// alone cancels, as the in-process consumer does.
async fn start_serve(world: &World, binary: &Path, tracing: &Tracing) -> anyhow::Result<Serve> {
    let mut settings = world.settings.clone();
    settings.sweeper.enabled = false;
    Serve::start(binary, &settings, true, tracing).await
}

/// How the run schedules its ladder orders: `schedule_many` (the benchmark
/// alone), or with `per_order`, one `schedule_message` call per order, each
/// with its own context when tracing is on.
#[derive(Clone, Copy)]
struct Publisher<'a> {
    scheduler: &'a Scheduler,
    per_order: Option<&'a Tracing>,
}

impl Publisher<'_> {
    /// Schedules `orders`, all confirmed or the first error.
    async fn schedule(&self, orders: Vec<(String, DateTime<Utc>)>) -> anyhow::Result<()> {
        let results = match self.per_order {
            None => self.scheduler.schedule_many(orders).await,
            Some(tracing) => {
                let messages = orders
                    .into_iter()
                    .map(|(id, due_at)| {
                        let message = ExpiryMessage::new(OrderId::new(id)?, due_at);
                        Ok(message.with_trace(tracing.order_context()?))
                    })
                    .collect::<anyhow::Result<Vec<_>>>()?;
                let calls = messages
                    .into_iter()
                    .map(|message| self.scheduler.schedule_message(message));
                futures::future::join_all(calls).await
            }
        };
        for result in results {
            result.context("scheduling on the ladder")?;
        }
        Ok(())
    }
}

/// Inserts and schedules the plan in 10 ms ticks at `rate` orders per second:
/// `L-<i>` through the ladder and, with `naive`, `N-<i>` through the naive queue,
/// with the same due times; payments go to the payer.
async fn schedule_all(
    world: &World,
    ladder: Publisher<'_>,
    naive: Option<&Settings>,
    plan: &[Planned],
    rate: u32,
    pay: Payments,
    progress: &ProgressBar,
) -> anyhow::Result<()> {
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
            ladder,
            naive.map(|s| (s, &naive_channel)),
            batch,
            &pay,
        )
        .await;
        progress.set_message(format!("scheduled {sent}/{}", plan.len()));
    }
    let _ = naive_channel.close(200, "done".into()).await;
    result
}

/// The flash sale: `args.burst_at` after the start, the burst plan in ten
/// slices over `args.burst_over`, each slice inserted and then scheduled by a
/// caller of its own (`schedule_many` on the shared scheduler), as the
/// checkouts of a sale would.
async fn schedule_burst(
    world: &World,
    scheduler: &Arc<Scheduler>,
    plan: &[Planned],
    args: &LatenessArgs,
    pay: Payments,
) -> anyhow::Result<()> {
    if plan.is_empty() {
        return Ok(());
    }
    const SLICES: usize = 10;
    tokio::time::sleep(args.burst_at).await;
    let mut tick = tokio::time::interval(args.burst_over / SLICES as u32);
    let mut callers = Vec::new();
    for slice in plan.chunks(plan.len().div_ceil(SLICES)) {
        tick.tick().await;
        let orders = insert(world, "B", Utc::now(), slice, &pay).await?;
        let scheduler = Arc::clone(scheduler);
        callers.push(tokio::spawn(async move {
            scheduler.schedule_many(orders).await
        }));
    }
    for caller in callers {
        for result in caller.await? {
            result.context("scheduling the flash sale")?;
        }
    }
    Ok(())
}

/// Inserts `<prefix>-<i>` of each planned order, due its delay after `now`,
/// then hands its payment to the payer; the orders.
async fn insert(
    world: &World,
    prefix: &str,
    now: DateTime<Utc>,
    plan: &[Planned],
    pay: &Payments,
) -> anyhow::Result<Vec<(String, DateTime<Utc>)>> {
    let id = |p: &Planned| format!("{prefix}-{}", p.index);
    let orders = plan
        .iter()
        .map(|p| Ok((id(p), now + TimeDelta::from_std(p.delay)?)))
        .collect::<anyhow::Result<Vec<_>>>()?;
    world.insert_orders(&orders).await?;
    for p in plan {
        if let Some(after) = p.pay_after {
            let _ = pay.send((after, id(p)));
        }
    }
    Ok(orders)
}

async fn schedule_batch(
    world: &World,
    ladder: Publisher<'_>,
    naive: Option<(&Settings, &Channel)>,
    batch: &[Planned],
    pay: &Payments,
) -> anyhow::Result<()> {
    let now = Utc::now();
    let orders = insert(world, "L", now, batch, pay).await?;
    let naive_orders = match naive {
        Some(_) => insert(world, "N", now, batch, pay).await?,
        None => Vec::new(),
    };
    ladder.schedule(orders).await?;
    if let Some((settings, channel)) = naive {
        for (id, due_at) in naive_orders {
            naive::publish(channel, settings, &id, due_at).await?;
        }
    }
    Ok(())
}

fn plan(count: usize, min: Duration, max: Duration, pay_share: f64) -> Vec<Planned> {
    let mut rng = rand::rng();
    let min = min.as_millis() as u64;
    let max = (max.as_millis() as u64).max(min);
    (0..count)
        .map(|index| {
            let delay = Duration::from_millis(rng.random_range(min..=max));
            let pay_after = rng
                .random_bool(pay_share.clamp(0.0, 1.0))
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
