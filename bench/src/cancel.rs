//! `order-expiry-bench cancel`: what the database charges per cancelled order,
//! the ceiling a flash sale meets once the ladder carries bundles.
//!
//! For each batch size (the consumer cancels up to `consumer.batch_max` orders
//! in one statement, and a flash sale's batches are full) and each number of
//! concurrent statements (`consumer.batch_concurrency`), it creates fresh
//! unpaid orders whose deadline has passed and cancels all of them through
//! the consumer's own store ([`PgOrderStore`], `database.cancel_sql`, the
//! pool), batch by batch, and reports the time per order, per statement and
//! the orders per second that add up to. Every order must come back
//! `Cancelled`: a run that cancels fewer fails.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, ensure};
use chrono::{TimeDelta, Utc};
use clap::Args;
use futures::StreamExt;
use order_expiry::{Disposition, ExpiryMessage, OrderId, OrderStore, PgOrderStore, Settings};
use order_expiry_testkit::World;
use serde::Serialize;

use crate::percentile;

/// Arguments of `cancel`.
#[derive(Debug, Clone, Args)]
pub struct CancelArgs {
    /// Orders cancelled at each batch size and concurrency.
    #[arg(long, default_value_t = 20_000)]
    pub orders: usize,
    /// Orders per cancel statement, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "1,10,50,100,200,500")]
    pub batch_sizes: Vec<usize>,
    /// Statements running at once, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "1,2")]
    pub concurrency: Vec<usize>,
}

/// One batch size at one concurrency.
#[derive(Debug, Clone, Serialize)]
pub struct CancelRow {
    /// Orders per statement.
    pub batch: usize,
    /// Statements at once.
    pub concurrency: usize,
    /// Orders cancelled.
    pub orders: usize,
    /// Cancelled orders per second, wall clock.
    pub orders_per_s: f64,
    /// Wall time per order, µs.
    pub us_per_order: f64,
    /// One statement's time, ms: p50 and p99.
    pub statement_ms: [f64; 2],
}

/// Runs the benchmark in a world of its own (its own schema) and prints a table.
pub async fn run(settings: &Settings, args: &CancelArgs) -> anyhow::Result<()> {
    let world = World::builder()
        .settings(settings.clone())
        .kind("bench-cancel")
        .declare(false)
        .build()
        .await?;
    let rows = measure_in(&world, args).await;
    world.cleanup().await;
    let rows = rows?;
    println!("{}", table(&rows));
    Ok(())
}

async fn measure_in(world: &World, args: &CancelArgs) -> anyhow::Result<Vec<CancelRow>> {
    let mut settings = world.settings.clone();
    settings.database.pool_size = settings
        .database
        .pool_size
        .max(args.concurrency.iter().copied().max().unwrap_or(1));
    let store = Arc::new(PgOrderStore::new(&settings)?);
    let mut rows = Vec::new();
    for (round, (&batch, &concurrency)) in args
        .batch_sizes
        .iter()
        .flat_map(|b| args.concurrency.iter().map(move |c| (b, c)))
        .enumerate()
    {
        ensure!(
            batch > 0 && concurrency > 0,
            "batch sizes and concurrency start at 1"
        );
        let messages = orders(world, &store, round, args.orders).await?;
        rows.push(cancel_all(&store, &messages, batch, concurrency).await?);
    }
    Ok(rows)
}

/// `n` unpaid orders of round `round`, 1 s past their deadline, and their messages.
async fn orders(
    world: &World,
    store: &PgOrderStore,
    round: usize,
    n: usize,
) -> anyhow::Result<Vec<ExpiryMessage>> {
    let due_at = Utc::now() - TimeDelta::seconds(1);
    let ids: Vec<(String, chrono::DateTime<Utc>)> =
        (0..n).map(|i| (format!("c{round}-{i}"), due_at)).collect();
    for chunk in ids.chunks(10_000) {
        world
            .insert_orders(chunk)
            .await
            .context("creating orders")?;
    }
    let client = store.client().await?;
    client.batch_execute("ANALYZE orders").await?;
    ids.into_iter()
        .map(|(id, at)| Ok(ExpiryMessage::new(OrderId::new(id)?, at)))
        .collect()
}

async fn cancel_all(
    store: &Arc<PgOrderStore>,
    messages: &[ExpiryMessage],
    batch: usize,
    concurrency: usize,
) -> anyhow::Result<CancelRow> {
    let started = Instant::now();
    let results: Vec<anyhow::Result<(usize, Duration)>> =
        futures::stream::iter(messages.chunks(batch))
            .map(|chunk| {
                let store = Arc::clone(store);
                async move {
                    let refs: Vec<&ExpiryMessage> = chunk.iter().collect();
                    let at = Instant::now();
                    let dispositions = store.cancel_unpaid(&refs).await?;
                    let took = at.elapsed();
                    let cancelled = dispositions
                        .iter()
                        .filter(|d| **d == Disposition::Cancelled)
                        .count();
                    Ok((cancelled, took))
                }
            })
            .buffer_unordered(concurrency)
            .collect()
            .await;
    let wall = started.elapsed();
    let mut cancelled = 0;
    let mut statements = Vec::with_capacity(results.len());
    for result in results {
        let (n, took) = result?;
        cancelled += n;
        statements.push(took.as_secs_f64() * 1000.0);
    }
    ensure!(
        cancelled == messages.len(),
        "{cancelled} of {} orders cancelled at batch {batch}",
        messages.len()
    );
    statements.sort_by(f64::total_cmp);
    Ok(CancelRow {
        batch,
        concurrency,
        orders: cancelled,
        orders_per_s: cancelled as f64 / wall.as_secs_f64(),
        us_per_order: wall.as_secs_f64() * 1e6 / cancelled as f64,
        statement_ms: [percentile(&statements, 50.0), percentile(&statements, 99.0)],
    })
}

/// The rows as a Markdown table.
pub fn table(rows: &[CancelRow]) -> String {
    let mut out = String::from(
        "| orders per statement | statements at once | orders | orders/s | µs per order | statement p50 | statement p99 |\n\
         | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n",
    );
    for r in rows {
        out.push_str(&format!(
            "| {} | {} | {} | {:.0} | {:.1} | {:.2} ms | {:.2} ms |\n",
            r.batch,
            r.concurrency,
            r.orders,
            r.orders_per_s,
            r.us_per_order,
            r.statement_ms[0],
            r.statement_ms[1]
        ));
    }
    out
}
