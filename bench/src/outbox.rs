//! `order-expiry-bench outbox`: the transactional outbox's relay lag, from an
//! order transaction's commit to the broker's confirm of its message, at a
//! steady rate of committed transactions.
//!
//! Writers commit one transaction per order (`BEGIN; INSERT INTO orders;
//! INSERT INTO order_expiry_outbox; COMMIT`) at `--rate` in all, each on its
//! own connection, and note when each `COMMIT` returned. The library's real
//! [`Relay`] runs in the same process, woken by the insert trigger's
//! `NOTIFY`, and reports when each row's confirm came. Orders are due in 30
//! minutes, as real ones are: every message enters the ladder and waits there
//! until the world is removed. The pending rows are counted every second.
//! The run exits non-zero when it misses a goal of [`Bench::Outbox`] (every
//! row relayed, p99 commit → confirm).

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use chrono::{DateTime, TimeDelta, Utc};
use clap::Args;
use order_expiry::{Settings, service::Readiness, service::Relay, service::Relayed};
use order_expiry_testkit::{World, connect_database};
use secrecy::ExposeSecret;
use serde::Serialize;
use tokio_util::sync::CancellationToken;

use crate::goals::{Bench, Measurement};
use crate::{Judged, percentile};

/// Arguments of `outbox`.
#[derive(Debug, Clone, Args)]
pub struct OutboxArgs {
    /// Order transactions committed per second, in all.
    #[arg(long, default_value_t = 1000)]
    pub rate: u32,
    /// How long transactions are committed for.
    #[arg(long, default_value = "60s", value_parser = humantime::parse_duration)]
    pub duration: Duration,
    /// The first part of the run left out of the figures (connections, JIT of
    /// the broker's and database's caches).
    #[arg(long, default_value = "5s", value_parser = humantime::parse_duration)]
    pub warmup: Duration,
    /// Connections committing transactions concurrently.
    #[arg(long, default_value_t = 8)]
    pub writers: u32,
    /// How far ahead orders are due: every message waits in the ladder.
    #[arg(long, default_value = "30m", value_parser = humantime::parse_duration)]
    pub due_in: Duration,
    /// Where the JSON report is written.
    #[arg(long, default_value = "outbox.json")]
    pub json: PathBuf,
}

/// One committed order, and what the relay said of it.
#[derive(Debug, Clone, Copy, Default)]
struct Sample {
    committed_at: DateTime<Utc>,
    created_at: Option<DateTime<Utc>>,
    locked_at: Option<DateTime<Utc>>,
    confirmed_at: Option<DateTime<Utc>>,
}

/// The figures of one run.
#[derive(Debug, Clone, Default, Serialize)]
pub struct OutboxReport {
    /// The broker's URL, password hidden.
    pub broker: String,
    /// Transactions committed, in all and per second achieved.
    pub committed: usize,
    /// Achieved commit rate over the run.
    pub commit_rate: f64,
    /// Rows confirmed and deleted, each counted once.
    pub relayed: usize,
    /// Confirms reported again for a row already confirmed (a row relayed twice).
    pub duplicates: usize,
    /// Rows counted in the figures (after the warm-up).
    pub measured: usize,
    /// Commit → confirm, ms: p50, p90, p99, p99.9, max.
    pub commit_to_confirm_ms: [f64; 5],
    /// `created_at` (transaction start) → confirm, ms: what the metric shows.
    pub created_to_confirm_ms: [f64; 5],
    /// Pending rows sampled every second.
    pub pending: Vec<i64>,
    /// The rows that waited longest (measured ones), slowest first: when
    /// each was committed and how long it waited, to line a stall up with
    /// what else happened then (the relay's slow-round log, the disk).
    pub slowest: Vec<SlowRow>,
    /// Load average (1 min) at the start and at the end.
    pub load: (f64, f64),
}

/// One row that waited long from its commit to its confirm.
#[derive(Debug, Clone, Serialize)]
pub struct SlowRow {
    /// When its transaction's `COMMIT` returned.
    pub committed_at: DateTime<Utc>,
    /// Commit → confirm, ms.
    pub waited_ms: f64,
    /// Of that, commit → locked by a round (waiting for a round), ms; the
    /// rest is the round's publish and commit.
    pub before_round_ms: f64,
}

/// How many of the slowest rows a report lists.
const SLOWEST: usize = 10;

/// Runs the benchmark, prints the report and writes it as JSON.
pub async fn run(settings: &Settings, args: &OutboxArgs) -> anyhow::Result<()> {
    let report = measure(settings, args).await?;
    println!("{}", report.table());
    std::fs::write(&args.json, serde_json::to_string_pretty(&report)?)?;
    println!("wrote {}", args.json.display());
    crate::conclude(&report)
}

impl Judged for OutboxReport {
    fn bench(&self) -> Bench {
        Bench::Outbox
    }

    fn table(&self) -> String {
        table(self)
    }

    /// The figures, named as the goals' measures ([`Bench::Outbox`]).
    fn measurements(&self) -> Vec<Measurement> {
        vec![
            Measurement::new(
                "rows not relayed",
                self.committed.saturating_sub(self.relayed) as f64,
            ),
            Measurement::new("commit → confirm p99", self.commit_to_confirm_ms[2]),
        ]
    }
}

/// Runs the benchmark in a world of its own based on `settings` (prefix
/// `bench-ob-<id>`, its own schema), removed at the end.
pub async fn measure(settings: &Settings, args: &OutboxArgs) -> anyhow::Result<OutboxReport> {
    let run = async |world: &World| measure_in(world, args).await;
    crate::world(settings, "bench-ob").run(run).await
}

async fn measure_in(world: &World, args: &OutboxArgs) -> anyhow::Result<OutboxReport> {
    let load_start = load_average();
    let mut relay = Relay::new(&world.settings, Arc::new(Readiness::default()))?;
    let mut relayed = relay.observe();
    let stop = CancellationToken::new();
    let relay_task = tokio::spawn(relay.run(stop.clone()));
    tokio::time::sleep(Duration::from_millis(500)).await; // connected and listening

    let total = (f64::from(args.rate) * args.duration.as_secs_f64()).round() as usize;
    let start = Instant::now();
    let pending = tokio::spawn(count_pending(
        world.settings.clone(),
        args.duration,
        stop.clone(),
    ));
    let mut writers = Vec::new();
    for w in 0..args.writers.max(1) {
        let settings = world.settings.clone();
        let (rate, n, due_in) = (args.rate, args.writers.max(1), args.due_in);
        writers.push(tokio::spawn(async move {
            write_orders(&settings, (w, n), rate, due_in, total, start).await
        }));
    }
    let mut samples: HashMap<String, Sample> = HashMap::with_capacity(total);
    for writer in writers {
        for (id, committed_at) in writer.await?? {
            let sample = Sample {
                committed_at,
                ..Sample::default()
            };
            samples.insert(id, sample);
        }
    }
    let elapsed = start.elapsed();
    let deadline = Instant::now() + Duration::from_secs(60);
    let (mut relayed_rows, mut duplicates) = (0, 0);
    while relayed_rows < samples.len() && Instant::now() < deadline {
        let Ok(Some(row)) = tokio::time::timeout(Duration::from_secs(5), relayed.recv()).await
        else {
            break;
        };
        match record(&mut samples, row) {
            Recorded::First => relayed_rows += 1,
            Recorded::Again => duplicates += 1,
            Recorded::Not => {}
        }
    }
    stop.cancel();
    let _ = relay_task.await;
    // What the relay reported after the last row: only duplicates can be left.
    while let Ok(row) = relayed.try_recv() {
        if record(&mut samples, row) == Recorded::Again {
            duplicates += 1;
        }
    }
    let pending = pending.await?;
    let warm = chrono::Duration::from_std(args.warmup)?;
    let first_commit = samples.values().map(|s| s.committed_at).min();
    let measured: Vec<&Sample> = samples
        .values()
        .filter(|s| first_commit.is_some_and(|f| s.committed_at >= f + warm))
        .collect();
    let ms = |d: TimeDelta| d.num_microseconds().unwrap_or(0).max(0) as f64 / 1000.0;
    let commit: Vec<f64> = measured
        .iter()
        .filter_map(|s| Some(ms(s.confirmed_at? - s.committed_at)))
        .collect();
    let created: Vec<f64> = measured
        .iter()
        .filter_map(|s| Some(ms(s.confirmed_at? - s.created_at?)))
        .collect();
    let mut slowest: Vec<SlowRow> = measured
        .iter()
        .filter_map(|s| {
            Some(SlowRow {
                committed_at: s.committed_at,
                waited_ms: ms(s.confirmed_at? - s.committed_at),
                before_round_ms: ms(s.locked_at? - s.committed_at),
            })
        })
        .collect();
    slowest.sort_by(|a, b| b.waited_ms.total_cmp(&a.waited_ms));
    slowest.truncate(SLOWEST);
    let figures = |mut v: Vec<f64>| {
        v.sort_by(f64::total_cmp);
        [50.0, 90.0, 99.0, 99.9, 100.0].map(|p| (percentile(&v, p) * 10.0).round() / 10.0)
    };
    Ok(OutboxReport {
        broker: world.settings.amqp.display_url(),
        committed: samples.len(),
        commit_rate: samples.len() as f64 / elapsed.as_secs_f64(),
        relayed: relayed_rows,
        duplicates,
        measured: commit.len(),
        commit_to_confirm_ms: figures(commit),
        created_to_confirm_ms: figures(created),
        pending,
        slowest,
        load: (load_start, load_average()),
    })
}

/// What one report of the relay was for the figures.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Recorded {
    /// The first confirm of a committed row.
    First,
    /// A confirm of a row already confirmed: it was relayed twice.
    Again,
    /// Not a confirm of a committed row of this run.
    Not,
}

/// Adds what the relay said of one row; its first confirm is the one measured.
fn record(samples: &mut HashMap<String, Sample>, row: Relayed) -> Recorded {
    match samples.get_mut(&row.order_id) {
        Some(sample) if row.confirmed_at.is_some() => {
            if sample.confirmed_at.is_some() {
                return Recorded::Again;
            }
            sample.created_at = Some(row.created_at);
            sample.locked_at = Some(row.locked_at);
            sample.confirmed_at = row.confirmed_at;
            Recorded::First
        }
        _ => Recorded::Not,
    }
}

/// Writer `w` of `n`: commits its share of `total` order transactions at its
/// share of `rate`, each due `due_in` later, on its own connection; returns
/// (order id, when its commit returned).
async fn write_orders(
    settings: &Settings,
    (w, n): (u32, u32),
    rate: u32,
    due_in: Duration,
    total: usize,
    start: Instant,
) -> anyhow::Result<Vec<(String, DateTime<Utc>)>> {
    let due_in = TimeDelta::from_std(due_in)?;
    let url = settings.database.url.expose_secret();
    let mut db = connect_database(url).await.context("writer connection")?;
    let order = db
        .prepare("INSERT INTO orders (id, pay_deadline) VALUES ($1, $2)")
        .await?;
    let outbox = db
        .prepare("INSERT INTO order_expiry_outbox (order_id, due_at) VALUES ($1, $2)")
        .await?;
    let mut committed = Vec::with_capacity(total / n as usize + 1);
    for i in (w as usize..total).step_by(n as usize) {
        let at = start + Duration::from_secs_f64(i as f64 / f64::from(rate));
        tokio::time::sleep_until(at.into()).await;
        let id = format!("ob-{i}");
        let due_at = Utc::now() + due_in;
        let tx = db.transaction().await?;
        tx.execute(&order, &[&id, &due_at]).await?;
        tx.execute(&outbox, &[&id, &due_at]).await?;
        tx.commit().await?;
        committed.push((id, Utc::now()));
    }
    Ok(committed)
}

/// The outbox's rows, every second, until `stop` (or the run and a minute).
async fn count_pending(settings: Settings, run: Duration, stop: CancellationToken) -> Vec<i64> {
    let url = settings.database.url.expose_secret().to_owned();
    let Ok(db) = connect_database(&url).await else {
        return Vec::new();
    };
    let mut counts = Vec::new();
    let mut ticks = tokio::time::interval(Duration::from_secs(1));
    let until = Instant::now() + run + Duration::from_secs(60);
    while !stop.is_cancelled() && Instant::now() < until {
        ticks.tick().await;
        match db
            .query_one("SELECT count(*) FROM order_expiry_outbox", &[])
            .await
        {
            Ok(row) => counts.push(row.get(0)),
            Err(_) => break,
        }
    }
    counts
}

fn load_average() -> f64 {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|l| l.split_whitespace().next()?.parse().ok())
        .unwrap_or(f64::NAN)
}

/// The report as text.
fn table(r: &OutboxReport) -> String {
    let row = |name: &str, v: &[f64; 5]| {
        format!(
            "| {name:<34} | {:>6.1} | {:>6.1} | {:>6.1} | {:>6.1} | {:>7.1} |",
            v[0], v[1], v[2], v[3], v[4]
        )
    };
    let max_pending = r.pending.iter().max().copied().unwrap_or(0);
    let slowest: Vec<String> = r
        .slowest
        .iter()
        .map(|s| {
            format!(
                "{} +{:.0} ms ({:.0} before its round)",
                s.committed_at.format("%H:%M:%S%.3f"),
                s.waited_ms,
                s.before_round_ms
            )
        })
        .collect();
    format!(
        "outbox relay lag on {}: {} transactions committed at {:.0}/s, {} relayed ({} twice), {} measured after the warm-up\n\
         | lag (ms)                           |    p50 |    p90 |    p99 |  p99.9 |     max |\n\
         | ---------------------------------- | ------:| ------:| ------:| ------:| -------:|\n\
         {}\n{}\n\
         pending rows, every second: {:?} (max {max_pending})\n\
         slowest rows (committed at, waited): {}\n\
         load average (1 min): {:.2} at the start, {:.2} at the end",
        r.broker,
        r.committed,
        r.commit_rate,
        r.relayed,
        r.duplicates,
        r.measured,
        row("commit → confirm", &r.commit_to_confirm_ms),
        row("created_at (tx start) → confirm", &r.created_to_confirm_ms),
        r.pending,
        slowest.join(", "),
        r.load.0,
        r.load.1,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::goals::{all_met, judge};

    fn report(relayed: usize, p99: f64) -> OutboxReport {
        OutboxReport {
            committed: 1000,
            relayed,
            commit_to_confirm_ms: [2.0, 5.0, p99, 20.0, 40.0],
            ..OutboxReport::default()
        }
    }

    #[test]
    fn the_relay_goals_read_p99_and_unrelayed_rows() {
        let judged = |r: &OutboxReport| judge(Bench::Outbox, &r.measurements(), true);
        assert!(all_met(&judged(&report(1000, 50.0))));
        assert!(!all_met(&judged(&report(1000, 50.1))));
        assert!(!all_met(&judged(&report(999, 10.9))));
    }
}
