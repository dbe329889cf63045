//! order-expiry's benchmarks against the real local RabbitMQ and PostgreSQL:
//! not tests, and not part of the product. Run them on a quiet machine through
//! the `order-expiry-bench` binary and read the report.
//!
//! - [`lateness`]: how late (and whether ever early) orders are cancelled, for
//!   the delay ladder and, with the same orders, one naive holding queue.
//! - [`throughput`]: order-expiry against bare lapin through the same broker,
//!   and its memory footprint.
//! - [`outbox`]: the transactional outbox's relay lag, commit to confirm, at a
//!   steady rate of committed order transactions.
//! - [`flash`]: a flash sale: many orders due within seconds, through the
//!   library, the CLI or the outbox, with and without bundles: lateness, who
//!   cancelled, broker messages and CPU per order, serve's peak RSS.
//! - [`cancel`]: what PostgreSQL charges per cancelled order at each batch
//!   size, the next ceiling once the ladder carries bundles.
//! - [`tracing_cost`]: what span export costs: the flash sale and the steady
//!   stream with tracing off and on, interleaved, medians compared, spans
//!   counted by a sink in this process.
//! - [`soak`]: an hour of orders under random faults on the local three-node
//!   cluster (seeded), every order accounted for by a checker, with a report
//!   and a plot.
//! - [`goals`]: every goal the book states for them (docs/src/results), with the settings it
//!   was stated for, and the judging of a report against them.
//! - [`check`]: every benchmark against its goals, one table, a non-zero exit
//!   when one is missed.
//! - [`cdf`]: the lateness figures of a run's cancelled orders and their
//!   plot, shared by `lateness`, `flash` and `soak`; `markdown`: the
//!   benchmarks' tables.
//!
//! Each run lives in its own isolated world (`order_expiry_testkit::World`:
//! topology prefix and PostgreSQL schema), removed at the end.

#![deny(unsafe_code)]
#![warn(missing_debug_implementations, unreachable_pub, missing_docs)]

pub mod cancel;
pub mod cdf;
pub mod check;
pub mod flash;
pub mod goals;
pub mod lateness;
mod markdown;
pub mod outbox;
pub mod soak;
pub mod throughput;
pub mod tracing_cost;

use anyhow::Context;
use order_expiry_testkit::{World, WorldBuilder};

/// A subcommand's last words: its goals as a table, then one line saying
/// whether they are met; [`GoalsMissed`] (a non-zero exit) when one is missed.
pub fn finish(verdicts: &[goals::Verdict]) -> anyhow::Result<()> {
    if verdicts.is_empty() {
        return Ok(());
    }
    println!("{}", goals::table(verdicts));
    let line = goals::summary(verdicts);
    println!("{line}");
    if goals::all_met(verdicts) {
        Ok(())
    } else {
        Err(GoalsMissed(line).into())
    }
}

/// A run that missed a goal: the binary exits non-zero without printing it
/// again, so the summary stays the last line.
#[derive(Debug)]
pub struct GoalsMissed(pub String);

impl std::fmt::Display for GoalsMissed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for GoalsMissed {}

/// A benchmark's result, as its subcommand and `check` print and judge it.
pub trait Judged {
    /// Whose goals judge it.
    fn bench(&self) -> goals::Bench;
    /// The text it prints.
    fn table(&self) -> String;
    /// Its figures, named as its goals' measures.
    fn measurements(&self) -> Vec<goals::Measurement>;
}

/// A subcommand's end: `report` judged by the goals it measured ([`finish`]).
pub fn conclude(report: &impl Judged) -> anyhow::Result<()> {
    finish(&goals::judge(report.bench(), &report.measurements(), false))
}

/// A benchmark's world of its own on `settings` (prefix and schema named
/// after `kind`), removed when its run ends.
pub(crate) fn world(settings: &order_expiry::Settings, kind: &str) -> WorldBuilder {
    World::builder().settings(settings.clone()).kind(kind)
}

/// Inserts `orders` unpaid, 10,000 a statement, and refreshes the planner's
/// statistics so the cancels use the primary key.
pub(crate) async fn insert_unpaid(
    world: &World,
    orders: &[(String, chrono::DateTime<chrono::Utc>)],
) -> anyhow::Result<()> {
    for chunk in orders.chunks(10_000) {
        world
            .insert_orders(chunk)
            .await
            .context("creating orders")?;
    }
    let client = world.store.client().await?;
    client.batch_execute("ANALYZE orders").await?;
    Ok(())
}

/// Waits until no order of `world` is unpaid, or `deadline`, telling
/// `progress` each count; the unpaid ones left.
pub(crate) async fn wait_settled(
    world: &World,
    deadline: tokio::time::Instant,
    progress: impl Fn(i64),
) -> anyhow::Result<i64> {
    loop {
        let unpaid = world.count_orders("unpaid").await?;
        progress(unpaid);
        if unpaid == 0 || tokio::time::Instant::now() > deadline {
            return Ok(unpaid);
        }
        tokio::time::sleep(std::time::Duration::from_millis(250)).await;
    }
}

/// The processes whose command (`/proc/<pid>/comm`) is `comm`.
pub(crate) fn pids_named(comm: &str) -> Vec<u32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/comm")).is_ok_and(|c| c.trim_end() == comm)
        })
        .collect()
}

/// A fresh log file for a child process, `order-expiry-bench-<what>-<id>.log`
/// in the temporary directory.
pub(crate) fn temp_log(what: &str) -> std::path::PathBuf {
    let id = uuid::Uuid::new_v4().simple();
    std::env::temp_dir().join(format!("order-expiry-bench-{what}-{id}.log"))
}

/// Median of the finite values (the mean of the middle two for an even
/// count); 0 for none.
pub fn median(values: &[f64]) -> f64 {
    let mut sorted: Vec<f64> = values.iter().copied().filter(|v| v.is_finite()).collect();
    sorted.sort_by(f64::total_cmp);
    match sorted.len() {
        0 => 0.0,
        n if n % 2 == 1 => sorted[n / 2],
        n => (sorted[n / 2 - 1] + sorted[n / 2]) / 2.0,
    }
}

/// Percentile of sorted values by nearest rank; 0 for none.
pub fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// A lateness for the tables: milliseconds, or seconds from 10 s on.
pub(crate) fn fmt_ms(ms: f64) -> String {
    if ms.abs() >= 10_000.0 {
        format!("{:.1} s", ms / 1000.0)
    } else {
        format!("{ms:.1} ms")
    }
}

/// What plotters said, as the benchmarks report it.
pub(crate) fn plot_error<E: std::fmt::Debug>(e: E) -> anyhow::Error {
    anyhow::anyhow!("drawing the chart: {e:?}")
}

#[cfg(test)]
mod tests {
    use super::{median, percentile};

    #[test]
    fn medians_of_odd_and_even_counts() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&[4.0, 1.0, 2.0, 3.0]), 2.5);
        assert_eq!(median(&[f64::NAN, 1.0, 3.0]), 2.0);
        assert_eq!(median(&[]), 0.0);
    }

    #[test]
    fn nearest_rank_percentiles() {
        let v: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(percentile(&v, 50.0), 50.0);
        assert_eq!(percentile(&v, 99.0), 99.0);
        assert_eq!(percentile(&v, 99.9), 100.0);
        assert_eq!(percentile(&v, 100.0), 100.0);
        assert_eq!(percentile(&[], 50.0), 0.0);
    }
}
