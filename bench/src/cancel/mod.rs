//! `order-expiry-bench cancel`: what the database charges per cancelled order
//! for `database.cancel_sql`, against the bare UPDATE that only flips the
//! status ([`BARE_UPDATE`]: no deadline rule, no clock rule, no skipped
//! locks, nothing returned), the physical limit of this table on this
//! machine.
//!
//! Both (and any `--also` statement) run on the same table, on the same
//! connections, as prepared statements, interleaved: each repetition creates
//! fresh unpaid orders past their deadline for each batch size and each
//! statement, then cancels them a batch of one statement, then a batch of the
//! next (which goes first rotates), so the noise of a shared machine hits all
//! alike. A statement's cost per order is the time its statements took,
//! summed, over the orders they cancelled. The table shows each one's median
//! over the repetitions, and the median of the repetitions' ratios to the
//! bare UPDATE. Every order must be cancelled: a run that cancels fewer
//! fails.

use std::time::Instant;

use anyhow::{Context, ensure};
use chrono::{DateTime, TimeDelta, Utc};
use clap::Args;
use order_expiry::{Settings, service::PgOrderStore, service::PooledClient};
use order_expiry_testkit::{World, WorldBuilder};
use serde::Serialize;
use tokio_postgres::Statement;

use crate::goals::{Bench, Measurement};
use crate::{Judged, median};

pub mod slots;

/// The physical limit: flips the status of every unpaid order of `$1`, and
/// nothing else.
pub const BARE_UPDATE: &str = "UPDATE orders SET status = 'cancelled', cancelled_at = now() \
                               WHERE id = ANY($1) AND status = 'unpaid'";

/// Arguments of `cancel`.
#[derive(Debug, Clone, Args)]
pub struct CancelArgs {
    /// Orders per statement, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "1,10,30,100,300,1000")]
    pub batch_sizes: Vec<usize>,
    /// Orders each statement cancels at each batch size in each repetition
    /// (fewer for small batches: see --statements).
    #[arg(long, default_value_t = 20_000)]
    pub orders: usize,
    /// At most this many statements at each batch size in each repetition:
    /// small batches cancel batch × statements orders.
    #[arg(long, default_value_t = 300)]
    pub statements: usize,
    /// Repetitions; the table shows their medians.
    #[arg(long, default_value_t = 7)]
    pub repetitions: usize,
    /// Statements running at once, each on its own connection.
    #[arg(long, default_value_t = 1)]
    pub concurrency: usize,
    /// SQL run once on the new orders table before measuring (a fillfactor,
    /// another index, a dropped primary key): what your own schema costs.
    #[arg(long, value_name = "SQL")]
    pub alter: Option<String>,
    /// Another cancel statement measured beside them in the same run, as
    /// `database.cancel_sql` is ($1 the ids, $2 their due times if it
    /// declares it); repeatable.
    #[arg(long, value_name = "SQL")]
    pub also: Vec<String>,
    /// Instead of the ratio table: `database.cancel_sql`'s orders a second
    /// with this many statements in flight (comma-separated), each on its
    /// own connection and all pipelined on one ([`slots`]); --orders each.
    #[arg(long, value_delimiter = ',')]
    pub slots: Vec<usize>,
}

/// One batch size: the medians over the repetitions.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CancelRow {
    /// Orders per statement.
    pub batch: usize,
    /// Orders each statement cancelled in each repetition.
    pub orders: usize,
    /// `database.cancel_sql`: statement time per order, µs (median).
    pub cancel_us: f64,
    /// [`BARE_UPDATE`]: statement time per order, µs (median).
    pub bare_us: f64,
    /// The median of the repetitions' `cancel_us / bare_us`.
    pub ratio: f64,
    /// Each `--also` statement: its µs per order and its ratio, as above.
    pub also: Vec<[f64; 2]>,
}

/// Runs the benchmark in a world of its own (its own schema), prints the
/// table and judges the goals it measured; with `--slots`, the slots table
/// (no goal).
pub async fn run(settings: &Settings, args: &CancelArgs) -> anyhow::Result<()> {
    if !args.slots.is_empty() {
        let rows = builder(settings).run(async |world| slots::run(world, args).await);
        println!("{}", slots::table(&rows.await?, args.repetitions));
        return Ok(());
    }
    let report = measure(settings, args).await?;
    println!("{}", report.table());
    crate::conclude(&report)
}

/// The benchmark's result: a row per batch size.
#[derive(Debug, Clone)]
pub struct CancelReport {
    /// One row per batch size.
    pub rows: Vec<CancelRow>,
    /// The repetitions whose medians they are.
    pub repetitions: usize,
}

impl Judged for CancelReport {
    fn bench(&self) -> Bench {
        Bench::Cancel
    }

    fn table(&self) -> String {
        table(&self.rows, self.repetitions)
    }

    fn measurements(&self) -> Vec<Measurement> {
        measurements(&self.rows)
    }
}

/// Measures every batch size of `args` in a world of its own.
pub async fn measure(settings: &Settings, args: &CancelArgs) -> anyhow::Result<CancelReport> {
    ensure!(
        args.batch_sizes.iter().all(|&b| b > 0)
            && args.orders > 0
            && args.statements > 0
            && args.repetitions > 0
            && args.concurrency > 0,
        "batch sizes, orders, statements, repetitions and concurrency start at 1"
    );
    let rows = builder(settings).run(async |world| measure_in(world, args).await);
    let repetitions = args.repetitions;
    Ok(CancelReport {
        rows: rows.await?,
        repetitions,
    })
}

/// A world of the benchmark's own: its schema, no topology.
fn builder(settings: &Settings) -> WorldBuilder {
    crate::world(settings, "bench-cancel").declare(false)
}

/// One repetition at one batch size: µs per order of each statement
/// (`cancel_sql`, the bare UPDATE, then each `--also`).
type Sample = Vec<f64>;

async fn measure_in(world: &World, args: &CancelArgs) -> anyhow::Result<Vec<CancelRow>> {
    let mut settings = world.settings.clone();
    settings.database.pool_size = settings.database.pool_size.max(args.concurrency);
    let store = PgOrderStore::new(&settings)?;
    if let Some(alter) = &args.alter {
        let client = store.client().await?;
        client
            .batch_execute(alter)
            .await
            .with_context(|| format!("--alter {alter:?}"))?;
    }
    let mut statements = vec![
        (
            "database.cancel_sql".to_owned(),
            settings.database.cancel_sql.clone(),
        ),
        ("the bare UPDATE".to_owned(), BARE_UPDATE.to_owned()),
    ];
    for (n, sql) in args.also.iter().enumerate() {
        statements.push((format!("--also #{}", n + 1), sql.clone()));
    }
    let mut lanes = Vec::with_capacity(args.concurrency);
    for _ in 0..args.concurrency {
        lanes.push(Lane::prepare(&store, &statements).await?);
    }
    let mut samples: Vec<Vec<Sample>> = vec![Vec::new(); args.batch_sizes.len()];
    for rep in 0..args.repetitions {
        let sets = create_orders(world, args, rep, statements.len()).await?;
        for (i, &batch) in args.batch_sizes.iter().enumerate() {
            let took = cancel_interleaved(&lanes, &sets[i], batch)
                .await
                .with_context(|| format!("at batch {batch}"))?;
            let orders = sets[i][0].len() as f64;
            samples[i].push(took.iter().map(|s| s * 1e6 / orders).collect());
        }
        eprintln!(
            "cancel: repetition {} of {} done",
            rep + 1,
            args.repetitions
        );
    }
    Ok(args
        .batch_sizes
        .iter()
        .zip(&samples)
        .map(|(&batch, samples)| summarize(batch, orders_at(args, batch), samples))
        .collect())
}

/// Orders each statement cancels at `batch` in one repetition.
fn orders_at(args: &CancelArgs, batch: usize) -> usize {
    args.orders.min(batch.saturating_mul(args.statements))
}

/// The fresh unpaid orders of repetition `rep`, 1 s past their deadline: for
/// each batch size, one set per statement.
async fn create_orders(
    world: &World,
    args: &CancelArgs,
    rep: usize,
    statements: usize,
) -> anyhow::Result<Vec<Vec<Vec<String>>>> {
    let due_at = Utc::now() - TimeDelta::seconds(1);
    let mut sets = Vec::with_capacity(args.batch_sizes.len());
    for (i, &batch) in args.batch_sizes.iter().enumerate() {
        let mut per_statement = Vec::with_capacity(statements);
        for k in 0..statements {
            let prefix = format!("r{rep}-b{i}-s{k}");
            per_statement.push(overdue(world, &prefix, orders_at(args, batch), due_at).await?);
        }
        sets.push(per_statement);
    }
    Ok(sets)
}

/// `count` unpaid orders `PREFIX-<n>` due at `due_at`, created
/// ([`crate::insert_unpaid`]); their ids.
async fn overdue(
    world: &World,
    prefix: &str,
    count: usize,
    due_at: DateTime<Utc>,
) -> anyhow::Result<Vec<String>> {
    let orders: Vec<(String, DateTime<Utc>)> = (0..count)
        .map(|n| (format!("{prefix}-{n}"), due_at))
        .collect();
    crate::insert_unpaid(world, &orders).await?;
    Ok(orders.into_iter().map(|(id, _)| id).collect())
}

/// One connection and every statement prepared on it.
struct Lane {
    client: PooledClient,
    statements: Vec<(String, Statement)>,
}

impl Lane {
    async fn prepare(
        store: &PgOrderStore,
        statements: &[(String, String)],
    ) -> anyhow::Result<Self> {
        let client = store.client().await?;
        let mut prepared = Vec::with_capacity(statements.len());
        for (name, sql) in statements {
            let statement = client
                .prepare(sql)
                .await
                .with_context(|| format!("preparing {name}"))?;
            prepared.push((name.clone(), statement));
        }
        Ok(Self {
            client,
            statements: prepared,
        })
    }

    /// Runs statement `k` on `ids` (and their due times, when it takes
    /// them); the orders it cancelled.
    async fn cancel(
        &self,
        k: usize,
        ids: &[&str],
        due_at: &[DateTime<Utc>],
    ) -> anyhow::Result<u64> {
        let (name, statement) = &self.statements[k];
        let cancelled = match (statement.params().len(), statement.columns().is_empty()) {
            (1, true) => self.client.execute(statement, &[&ids]).await?,
            (2, true) => self.client.execute(statement, &[&ids, &due_at]).await?,
            (1, false) => self.client.query(statement, &[&ids]).await?.len() as u64,
            (2, false) => self.client.query(statement, &[&ids, &due_at]).await?.len() as u64,
            (n, _) => anyhow::bail!("{name} has {n} parameters, not 1 or 2"),
        };
        Ok(cancelled)
    }
}

/// One statement's parameters: the ids and their due times.
type Batch<'a> = (Vec<&'a str>, Vec<DateTime<Utc>>);

/// Cancels every order of every statement's set, `batch` orders a
/// statement, spread over the lanes: each lane runs a batch of one
/// statement, then the same size of the next (which goes first rotates), so
/// the machine's noise hits all alike. Each statement's time, summed, in
/// seconds.
async fn cancel_interleaved(
    lanes: &[Lane],
    sets: &[Vec<String>],
    batch: usize,
) -> anyhow::Result<Vec<f64>> {
    let due_at = Utc::now() - TimeDelta::seconds(1);
    let statements = sets.len();
    let chunks: Vec<Vec<Batch>> = sets
        .iter()
        .map(|set| {
            set.chunks(batch)
                .map(|chunk| {
                    (
                        chunk.iter().map(String::as_str).collect(),
                        vec![due_at; chunk.len()],
                    )
                })
                .collect()
        })
        .collect();
    let rounds = chunks[0].len();
    let lanes_done = lanes.iter().enumerate().map(|(l, lane)| {
        let chunks = &chunks;
        async move {
            let mut took = vec![0.0; statements];
            let mut cancelled = vec![0; statements];
            for i in (l..rounds).step_by(lanes.len()) {
                for k in (0..statements).map(|k| (k + i) % statements) {
                    let (ids, due_at) = &chunks[k][i];
                    let started = Instant::now();
                    cancelled[k] += lane
                        .cancel(k, ids, due_at)
                        .await
                        .with_context(|| lane.statements[k].0.clone())?;
                    took[k] += started.elapsed().as_secs_f64();
                }
            }
            anyhow::Ok((took, cancelled))
        }
    });
    let mut took = vec![0.0; statements];
    let mut cancelled = vec![0; statements];
    for (lane_took, lane_cancelled) in futures::future::try_join_all(lanes_done).await? {
        for k in 0..statements {
            took[k] += lane_took[k];
            cancelled[k] += lane_cancelled[k];
        }
    }
    for (k, set) in sets.iter().enumerate() {
        ensure!(
            cancelled[k] == set.len() as u64,
            "{} cancelled {} of {} orders",
            lanes[0].statements[k].0,
            cancelled[k],
            set.len()
        );
    }
    Ok(took)
}

/// One batch size's row from its repetitions: each statement's median cost,
/// and the median of the repetitions' ratios to the bare UPDATE (each
/// repetition measured all of them interleaved, so its ratio carries less
/// of the machine's drift than the ratio of the medians would).
pub fn summarize(batch: usize, orders: usize, samples: &[Sample]) -> CancelRow {
    let statements = samples.first().map_or(2, Vec::len);
    let cost = |k: usize| median(&samples.iter().map(|s| s[k]).collect::<Vec<_>>());
    let ratio = |k: usize| median(&samples.iter().map(|s| s[k] / s[1]).collect::<Vec<_>>());
    CancelRow {
        batch,
        orders,
        cancel_us: cost(0),
        bare_us: cost(1),
        ratio: ratio(0),
        also: (2..statements).map(|k| [cost(k), ratio(k)]).collect(),
    }
}

/// The figures the goals judge: the ratio at each batch size.
fn measurements(rows: &[CancelRow]) -> Vec<Measurement> {
    let measure = |batch| format!("cancel_sql / bare UPDATE, {batch} per statement");
    rows.iter()
        .map(|r| Measurement::new(measure(r.batch), r.ratio))
        .collect()
}

/// The rows as a Markdown table.
fn table(rows: &[CancelRow], repetitions: usize) -> String {
    let also = rows.first().map_or(0, |r| r.also.len());
    let mut out = format!(
        "medians of {repetitions} repetitions; a ratio is the median of each repetition's ratio \
         to the bare UPDATE\n\n\
         | orders per statement | orders | cancel_sql µs per order | bare UPDATE µs per order | ratio |"
    );
    for n in 1..=also {
        out.push_str(&format!(" --also #{n} µs per order | ratio |"));
    }
    out.push_str("\n| ---: | ---: | ---: | ---: | ---: |");
    out.push_str(&" ---: | ---: |".repeat(also));
    out.push('\n');
    for r in rows {
        out.push_str(&format!(
            "| {} | {} | {:.1} | {:.1} | {:.2} |",
            r.batch, r.orders, r.cancel_us, r.bare_us, r.ratio
        ));
        for [us, ratio] in &r.also {
            out.push_str(&format!(" {us:.1} | {ratio:.2} |"));
        }
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::goals::{all_met, judge};

    #[test]
    fn a_ratio_is_the_median_of_each_repetitions_ratio_to_the_bare_update() {
        // The machine slowed down in the third repetition, for all of them.
        let samples = [
            vec![12.0, 10.0, 20.0],
            vec![11.0, 10.0, 30.0],
            vec![60.0, 50.0, 50.0],
        ];
        let row = summarize(100, 6000, &samples);
        assert_eq!((row.cancel_us, row.bare_us), (12.0, 10.0));
        assert_eq!(row.ratio, 1.2);
        assert_eq!(row.also, [[30.0, 2.0]]);
    }

    #[test]
    fn the_goal_holds_at_batches_of_30_and_more() {
        let row = |batch, ratio| CancelRow {
            batch,
            orders: 6000,
            cancel_us: ratio * 10.0,
            bare_us: 10.0,
            ratio,
            also: Vec::new(),
        };
        let met = [row(1, 3.0), row(10, 1.6), row(30, 1.25), row(1000, 1.1)];
        let verdicts = judge(Bench::Cancel, &measurements(&met), false);
        assert_eq!(verdicts.len(), 2, "batches of 1 and 10 have no goal");
        assert!(all_met(&verdicts));
        let missed = [row(30, 1.2), row(300, 1.26)];
        assert!(!all_met(&judge(
            Bench::Cancel,
            &measurements(&missed),
            false
        )));
    }

    #[test]
    fn small_batches_cancel_fewer_orders() {
        let args = CancelArgs {
            batch_sizes: vec![1, 1000],
            orders: 6000,
            statements: 300,
            repetitions: 1,
            concurrency: 1,
            alter: None,
            also: Vec::new(),
            slots: Vec::new(),
        };
        assert_eq!(orders_at(&args, 1), 300);
        assert_eq!(orders_at(&args, 30), 6000);
        assert_eq!(orders_at(&args, 1000), 6000);
    }
}
