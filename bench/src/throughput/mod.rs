//! `order-expiry-bench throughput`: order-expiry against what bare lapin moves
//! through the same broker, side by side in one run, and its memory footprint.
//!
//! - **end to end**: bare publish-with-confirms through the ladder and a bare
//!   consume-and-ack of the due queue, versus `Scheduler::schedule_stream` and the
//!   real consumer cancelling in PostgreSQL (scheduled → cancel committed);
//! - **publish**: bare pipelined publish-with-confirms versus `schedule_many`;
//! - **drain**: due messages preloaded in `P.due`: bare consume-and-ack versus the
//!   `order-expiry serve` process cancelling the matching unpaid orders;
//! - **footprint**: the consumer's peak RSS and CPU per 100,000 orders; a publisher
//!   process scheduling a million orders hours ahead (RSS sampled through the run)
//!   and the broker's memory for them.
//!
//! Each round measures baseline and order-expiry back to back (alternating which
//! goes first); the table shows medians over rounds and the median of the
//! per-round ratios. Everything lives under its own topology prefix and schema and
//! is deleted at the end, also after an error or Ctrl-C. The rows' targets are
//! the goals of [`Bench::Throughput`]; a missed one makes the run exit non-zero.

mod bare;
mod child;
mod cpu;
mod phases;
mod pipeline;
mod report;
mod setup;

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use clap::{Args, ValueEnum};
use serde_json::json;

use order_expiry::{Settings, settings::QueueType};

use order_expiry_testkit::World;

use self::report::Row;
use crate::Judged;
use crate::goals::{Bench, Measurement};

/// Arguments of `throughput`.
#[derive(Debug, Args)]
pub struct ThroughputArgs {
    /// Orders per end-to-end and publish round.
    #[arg(long, default_value_t = 20_000)]
    pub orders: usize,
    /// Due messages preloaded in the due queue for each drain.
    #[arg(long, default_value_t = 100_000)]
    pub drain: usize,
    /// Orders scheduled hours ahead for the publisher and broker footprint.
    #[arg(long, default_value_t = 1_000_000)]
    pub pending: usize,
    /// Rounds; the table shows medians.
    #[arg(long, default_value_t = 3)]
    pub rounds: usize,
    /// Delay through the ladder in the end-to-end runs (whole seconds).
    #[arg(long, default_value = "3s", value_parser = humantime::parse_duration)]
    pub delay: Duration,
    /// End to end: give each order a uniform sub-second remainder in its due time,
    /// as real orders have (default: the same 20 ms for all, so the rate measures
    /// capacity, not how fast orders fall due).
    #[arg(long)]
    pub spread_due: bool,
    /// Holding queue types to measure.
    #[arg(long, value_enum, value_delimiter = ',', default_values_t = [Holding::Quorum, Holding::Classic])]
    pub queue_types: Vec<Holding>,
    /// Which measurements to run.
    #[arg(long, value_enum, value_delimiter = ',', default_values_t = [Phase::EndToEnd, Phase::Publish, Phase::Drain, Phase::Pending])]
    pub phases: Vec<Phase>,
    /// Where to write the results as JSON.
    #[arg(long, default_value = "throughput.json")]
    pub json: PathBuf,
    /// Run the child processes (consumer, publisher) under this command, e.g.
    /// "valgrind --tool=callgrind": for profiling; timings are then meaningless.
    #[arg(long)]
    pub wrap: Option<String>,
    /// Internal: the part a child process plays.
    #[arg(long, hide = true, value_enum)]
    pub role: Option<Role>,
}

/// Holding queue type, as a command-line value.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Holding {
    /// Quorum queues, at-least-once dead-lettering (the default).
    Quorum,
    /// Classic queues, at-most-once dead-lettering.
    Classic,
}

impl Holding {
    fn queue_type(self) -> QueueType {
        match self {
            Self::Quorum => QueueType::Quorum,
            Self::Classic => QueueType::Classic,
        }
    }
}

/// One measurement.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Phase {
    /// Publish through the ladder, consume, cancel.
    EndToEnd,
    /// Publish with confirms only.
    Publish,
    /// Drain preloaded due messages; consumer footprint.
    Drain,
    /// Schedule `--pending` orders hours ahead; publisher and broker footprint.
    Pending,
}

/// What a child process of the benchmark does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Role {
    /// Schedule `--orders` orders hours ahead, reporting RSS on stdout.
    Schedule,
}

/// What a run measured: the table's rows, the raw figures and the context,
/// for `throughput.json`.
#[derive(Debug)]
pub struct Report {
    rows: Vec<Row>,
    json: serde_json::Value,
}

impl Judged for Report {
    fn bench(&self) -> Bench {
        Bench::Throughput
    }

    /// The table: each figure beside its baseline, the ratio and the target.
    fn table(&self) -> String {
        report::table(&self.rows)
    }

    /// The rows with a goal, named as the goals' measures ([`Bench::Throughput`]).
    fn measurements(&self) -> Vec<Measurement> {
        report::measurements(&self.rows)
    }
}

/// Runs the throughput benchmark, prints its table, writes `--json` and
/// exits non-zero when a goal it measured is missed.
pub async fn run(settings: &Settings, args: &ThroughputArgs) -> anyhow::Result<()> {
    if args.role == Some(Role::Schedule) {
        return pipeline::schedule_role(settings, args.orders).await;
    }
    let report = measure(settings, args).await?;
    println!("{}", report.table());
    let text = serde_json::to_string_pretty(&report.json)?;
    std::fs::write(&args.json, text + "\n")
        .with_context(|| format!("writing {}", args.json.display()))?;
    eprintln!("wrote {}", args.json.display());
    crate::conclude(&report)
}

/// Measures in a world of its own based on `settings`, removed at the end,
/// also after an error or Ctrl-C.
pub async fn measure(settings: &Settings, args: &ThroughputArgs) -> anyhow::Result<Report> {
    let measured = setup::builder(settings).run(async |world| {
        eprintln!(
            "throughput: prefix {}-*, schema {}",
            world.settings.topology.prefix,
            world.schema()
        );
        let result = tokio::select! {
            r = measure_in(world, args) => r,
            _ = tokio::signal::ctrl_c() => Err(anyhow::anyhow!("interrupted")),
        };
        eprintln!("cleaning up");
        result
    });
    let (rows, details) = measured.await?;
    let context = json!({
        "command": std::env::args().collect::<Vec<_>>().join(" "),
        "cores": std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0),
        "orders": args.orders, "drain": args.drain, "pending": args.pending,
        "rounds": args.rounds, "delay_secs": args.delay.as_secs(), "spread_due": args.spread_due,
        "levels": settings.topology.levels,
        "prefetch": settings.consumer.prefetch, "batch_max": settings.consumer.batch_max,
        "batch_concurrency": settings.consumer.batch_concurrency,
        "max_in_flight": settings.publisher.max_in_flight,
    });
    let json = report::to_json(&rows, context, details);
    Ok(Report { rows, json })
}

fn progress(what: &str, t: &phases::Timed, n: usize) {
    eprintln!(
        "  {what:<30} first {:>6.3} s, last {:>7.3} s, {:>7.0}/s; cpu: client {:.2} s, broker {:.2} s, database {:.2} s",
        t.first,
        t.secs,
        if t.first > 0.0 {
            t.steady_rate(n)
        } else {
            n as f64 / t.secs
        },
        t.cpu.client,
        t.cpu.broker,
        t.cpu.database
    );
}

type Measured = (Vec<Row>, serde_json::Value);

async fn measure_in(world: &World, args: &ThroughputArgs) -> anyhow::Result<Measured> {
    let wrap = args.wrap.as_deref();
    let mut rows = Vec::new();
    let mut details = serde_json::Map::new();
    let types: Vec<(Holding, Settings)> = args
        .queue_types
        .iter()
        .map(|h| (*h, setup::settings(world, h.queue_type())))
        .collect();
    for (_, s) in &types {
        world.declare(s).await?;
    }
    let has = |p: Phase| args.phases.contains(&p);
    for (holding, s) in &types {
        let name = format!("{holding:?}").to_lowercase();
        let raw = compare(world, &name, s, args, &mut rows).await?;
        details.insert(name, json!(raw));
    }
    if has(Phase::Drain)
        && let Some((_, s)) = types.first()
    {
        drain(world, s, args, wrap, &mut rows, &mut details).await?;
    }
    if has(Phase::Pending) && args.pending > 0 {
        for (holding, s) in &types {
            let name = format!("{holding:?}").to_lowercase();
            eprintln!("[{name}] scheduling {} orders hours ahead", args.pending);
            let p = phases::pending(world, s, args.pending, wrap).await?;
            footprint_rows(&name, &p, args.pending, &mut rows, &mut details);
        }
    }
    Ok((rows, json!(details)))
}

/// The end-to-end and publish comparisons for one holding-queue type: each
/// round measures baseline and order-expiry back to back, alternating which
/// goes first. Adds their rows; returns every round's raw figures.
async fn compare(
    world: &World,
    name: &str,
    s: &Settings,
    args: &ThroughputArgs,
    rows: &mut Vec<Row>,
) -> anyhow::Result<Vec<serde_json::Value>> {
    let (n, delay) = (args.orders, args.delay);
    let has = |p: Phase| args.phases.contains(&p);
    let (mut e2e_bare, mut e2e_ours, mut pub_bare, mut pub_ours) = (vec![], vec![], vec![], vec![]);
    let mut raw = Vec::new();
    for round in 0..args.rounds {
        eprintln!("[{name}] round {}/{}", round + 1, args.rounds);
        if has(Phase::EndToEnd) {
            let tag = format!("e{round}");
            let ours = phases::end_to_end(world, s, &tag, n, delay, args.spread_due);
            let (b, o) = if round % 2 == 1 {
                let o = ours.await?;
                (phases::bare_end_to_end(s, n, delay).await?, o)
            } else {
                (phases::bare_end_to_end(s, n, delay).await?, ours.await?)
            };
            progress("end to end, bare lapin", &b, n);
            progress("end to end, order-expiry", &o, n);
            e2e_bare.push(b.steady_rate(n));
            e2e_ours.push(o.steady_rate(n));
            raw.push(json!({"round": round, "e2e_bare": b.to_json(), "e2e_ours": o.to_json()}));
        }
        if has(Phase::Publish) {
            let b = phases::bare_publish(s, n).await?;
            setup::purge(world, s).await?;
            let o = phases::schedule_many(s, n).await?;
            setup::purge(world, s).await?;
            progress("publish, bare lapin", &b, n);
            progress("publish, schedule_many", &o, n);
            pub_bare.push(n as f64 / b.secs);
            pub_ours.push(n as f64 / o.secs);
            raw.push(
                json!({"round": round, "publish_bare": b.to_json(), "publish_ours": o.to_json()}),
            );
        }
    }
    if has(Phase::EndToEnd) {
        let delay_secs = delay.as_secs_f64().floor();
        rows.push(Row {
            figure: format!("end to end, {name} holding queues"),
            unit: "orders/s",
            baseline: e2e_bare,
            ours: e2e_ours,
            goal: Some(format!("end to end, {name}: ratio to bare lapin")),
            note: format!(
                "(N - 1) / (first → last cancel committed); {delay_secs} s through the ladder, then held until due"
            ),
        });
    }
    if has(Phase::Publish) {
        rows.push(Row {
            figure: format!("schedule_many, {name} holding queues"),
            unit: "orders/s",
            baseline: pub_bare,
            ours: pub_ours,
            goal: Some(format!("schedule_many, {name}: ratio to bare lapin")),
            note: "publish with confirms, same window, delays of 1-3 h".into(),
        });
    }
    Ok(raw)
}

async fn drain(
    world: &World,
    s: &Settings,
    args: &ThroughputArgs,
    wrap: Option<&str>,
    rows: &mut Vec<Row>,
    details: &mut serde_json::Map<String, serde_json::Value>,
) -> anyhow::Result<()> {
    let d = args.drain;
    let (mut bare, mut ours, mut rss, mut cpu_bare, mut cpu_ours, mut raw) =
        (vec![], vec![], vec![], vec![], vec![], vec![]);
    let mut bare_multi = vec![];
    for round in 0..args.rounds {
        eprintln!(
            "[drain] round {}/{}: {d} due messages",
            round + 1,
            args.rounds
        );
        let b = phases::bare_drain(world, s, d, false).await?;
        let o = phases::consumer_drain(world, s, d, wrap).await?;
        let m = phases::bare_drain(world, s, d, true).await?;
        progress("drain, bare consume-and-ack", &b, d);
        progress("drain, order-expiry serve", &o.timed, d);
        progress("drain, bare, multiple acks", &m, d);
        bare.push(d as f64 / b.secs);
        ours.push(d as f64 / o.timed.secs);
        bare_multi.push(d as f64 / m.secs);
        rss.push(o.peak_rss as f64 / 1e6);
        cpu_bare.push(b.cpu.client * 100_000.0 / d as f64);
        cpu_ours.push(o.cpu * 100_000.0 / d as f64);
        raw.push(
            json!({"round": round, "bare": b.to_json(), "consumer": o.timed.to_json(),
                        "bare_multiple": m.to_json(), "consumer_peak_rss": o.peak_rss}),
        );
    }
    rows.push(Row {
        figure: format!("drain {d} due (quorum due queue)"),
        unit: "orders/s",
        baseline: bare,
        ours: ours.clone(),
        goal: Some("drain: ratio to bare lapin".into()),
        note: "from consumer start to last cancel committed; bare acks each message".into(),
    });
    rows.push(Row {
        figure: "  same, bare acking with multiple".into(),
        unit: "orders/s",
        baseline: bare_multi,
        ours,
        goal: None,
        note: "bare drain sending one multiple ack per batch_max, as the consumer does".into(),
    });
    rows.push(Row {
        figure: "consumer peak RSS while draining".into(),
        unit: "MB",
        baseline: vec![],
        ours: rss,
        goal: Some("consumer peak RSS while draining".into()),
        note: "VmHWM of the order-expiry serve process".into(),
    });
    rows.push(Row {
        figure: "consumer CPU per 100k orders".into(),
        unit: "CPU-s",
        baseline: cpu_bare,
        ours: cpu_ours,
        goal: None,
        note: "user+system; baseline: the bare drain's client".into(),
    });
    details.insert("drain".into(), json!(raw));
    Ok(())
}

fn footprint_rows(
    name: &str,
    p: &phases::Pending,
    n: usize,
    rows: &mut Vec<Row>,
    details: &mut serde_json::Map<String, serde_json::Value>,
) {
    let mb = |b: u64| b as f64 / 1e6;
    // Flat: from a tenth of the way in (connections and buffers warm) to the end.
    let warm = p
        .samples
        .iter()
        .find(|(k, _)| *k as usize >= n / 10)
        .map_or(0, |s| s.1);
    let last = p.samples.last().map_or(0, |s| s.1);
    let max = p.samples.iter().map(|s| s.1).max().unwrap_or(0);
    rows.push(Row {
        figure: format!("publisher RSS growth over {n} pending, {name}"),
        unit: "MB",
        baseline: vec![],
        ours: vec![mb(last) - mb(warm)],
        goal: Some(format!("publisher RSS growth, {name}")),
        note: format!(
            "RSS {:.1} MB at 10%, {:.1} MB at the end, max {:.1} MB, peak {:.1} MB; {:.0} orders/s",
            mb(warm),
            mb(last),
            mb(max),
            mb(p.peak_rss),
            n as f64 / p.secs
        ),
    });
    rows.push(Row {
        figure: format!("broker memory for {n} pending, {name}"),
        unit: "MB",
        baseline: vec![],
        ours: vec![mb(p.queue_memory)],
        goal: None,
        note: format!(
            "sum of queue memory for {} messages ({:.0} B/message); broker RSS grew {:.1} MB",
            p.messages,
            p.queue_memory as f64 / p.messages.max(1) as f64,
            p.broker_growth as f64 / 1e6
        ),
    });
    let samples: Vec<_> = p
        .samples
        .iter()
        .map(|(k, r)| json!({"scheduled": k, "rss": r}))
        .collect();
    details.insert(
        format!("pending_{name}"),
        json!({"samples": samples, "secs": p.secs, "peak_rss": p.peak_rss, "messages": p.messages,
               "queue_memory": p.queue_memory, "broker_rss_growth": p.broker_growth,
               "median_rss": crate::median(&p.samples.iter().map(|s| s.1 as f64).collect::<Vec<_>>())}),
    );
}
