//! The three ways a sale's orders reach the ladder, and the orders table
//! around them: inserting the orders first, waiting until every one is
//! settled. With tracing on, the library and outbox paths give each order a
//! sampled trace context of its own; the CLI's NDJSON lines have no field for
//! one (`order-expiry schedule --stdin` takes the current span's context for
//! every line), so that path cannot be traced per order.

use std::path::Path;
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, bail};
use chrono::SecondsFormat;
use order_expiry::publisher::ExpiryMessage;
use order_expiry::{OrderId, Scheduler, Settings};
use order_expiry_testkit::{World, connect_database, settings_env};
use secrecy::ExposeSecret;
use tokio::io::{AsyncWriteExt, BufWriter};
use tokio::time::Instant;

use super::NO_BUNDLES_ENV;
use super::plan::Plan;
use crate::tracing_cost::Tracing;

/// Orders (and outbox rows) per transaction on the outbox path.
const OUTBOX_TX: usize = 2_000;

/// The library path: one `Scheduler` for every call. With `callers` 0, each
/// order is scheduled by a task of its own started at its creation time (an
/// order service's request handlers); otherwise `callers` tasks each schedule
/// their share one call at a time, none before its creation time. Each call
/// is `Scheduler::schedule_message` with the order's context when `tracing`
/// is on (none when off: then it is `Scheduler::schedule`). Seconds from the
/// first call to the last confirm.
pub(super) async fn library(
    settings: &Settings,
    plan: &Plan,
    bundled: bool,
    callers: usize,
    tracing: &Tracing,
) -> anyhow::Result<f64> {
    let mut settings = settings.clone();
    if !bundled {
        settings.publisher.bundle_max_orders = 1;
    }
    let scheduler = Arc::new(Scheduler::from_settings(&settings)?);
    scheduler.connect().await?;
    let start = Instant::now();
    let mut calls = tokio::task::JoinSet::new();
    let schedule = |scheduler: Arc<Scheduler>, plan: Plan, i: usize, tracing: Tracing| async move {
        let message = ExpiryMessage::new(OrderId::new(Plan::id(i))?, plan.due_at(i))
            .with_trace(tracing.order_context()?);
        scheduler
            .schedule_message(message)
            .await
            .map(drop)
            .with_context(|| format!("scheduling {}", Plan::id(i)))
    };
    if callers == 0 {
        for i in 0..plan.orders {
            tokio::time::sleep_until(plan.created(i)).await;
            calls.spawn(schedule(Arc::clone(&scheduler), *plan, i, tracing.clone()));
        }
    } else {
        for caller in 0..callers {
            let (scheduler, plan, tracing) = (Arc::clone(&scheduler), *plan, tracing.clone());
            calls.spawn(async move {
                for i in (caller..plan.orders).step_by(callers) {
                    tokio::time::sleep_until(plan.created(i)).await;
                    schedule(Arc::clone(&scheduler), plan, i, tracing.clone()).await?;
                }
                anyhow::Ok(())
            });
        }
    }
    let mut result = Ok(());
    while let Some(done) = calls.join_next().await {
        if let Err(e) = done.map_err(anyhow::Error::from).and_then(|r| r)
            && result.is_ok()
        {
            // The first failure is the one reported; the rest are cancelled.
            calls.abort_all();
            result = Err(e);
        }
    }
    let secs = start.elapsed().as_secs_f64();
    scheduler.close().await;
    result.map(|()| secs)
}

/// The CLI path: every order in one NDJSON stream into `order-expiry
/// schedule --stdin`. Seconds from its start to its exit, which is after the
/// last confirm.
pub(super) async fn cli(
    binary: &Path,
    settings: &Settings,
    plan: &Plan,
    bundled: bool,
) -> anyhow::Result<f64> {
    let log = crate::temp_log("flash-cli");
    let mut command = tokio::process::Command::new(binary);
    command
        .args(["schedule", "--stdin"])
        .env_remove("RUST_LOG")
        .envs(settings_env(settings))
        .env("ORDER_EXPIRY__LOG__FILTER", "warn")
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log)?)
        .kill_on_drop(true);
    if !bundled {
        command.env(NO_BUNDLES_ENV.0, NO_BUNDLES_ENV.1);
    }
    let start = Instant::now();
    let mut child = command.spawn().context("starting order-expiry schedule")?;
    let mut stdin = BufWriter::new(child.stdin.take().context("its stdin")?);
    for (id, due_at) in plan.all() {
        let due_at = due_at.to_rfc3339_opts(SecondsFormat::Millis, true);
        let line = format!("{{\"order_id\":\"{id}\",\"due_at\":\"{due_at}\"}}\n");
        stdin.write_all(line.as_bytes()).await?;
    }
    stdin.shutdown().await?;
    drop(stdin);
    let status = tokio::time::timeout(Duration::from_secs(600), child.wait())
        .await
        .context("order-expiry schedule did not exit within 10 minutes")??;
    let secs = start.elapsed().as_secs_f64();
    let said = std::fs::read_to_string(&log).unwrap_or_default();
    if !status.success() {
        let tail: Vec<&str> = said.lines().rev().take(5).collect();
        bail!("order-expiry schedule exited with {status}: {tail:?}");
    }
    let _ = std::fs::remove_file(&log);
    Ok(secs)
}

/// The outbox path: one connection commits each `OUTBOX_TX` orders and their
/// outbox rows in one transaction as soon as the last of them is created;
/// serve's relay publishes them. Each row's `traceparent` is the order's
/// context when `tracing` is on, NULL when off. Seconds from the first
/// commit's start until the table is empty again (every row confirmed), at
/// most `limit` after the last commit.
pub(super) async fn outbox(
    settings: &Settings,
    plan: &Plan,
    limit: Duration,
    tracing: &Tracing,
) -> anyhow::Result<f64> {
    let url = settings.database.url.expose_secret();
    let mut db = connect_database(url)
        .await
        .context("outbox writer connection")?;
    let orders = db
        .prepare("INSERT INTO orders (id, pay_deadline) SELECT * FROM unnest($1::text[], $2::timestamptz[])")
        .await?;
    let rows = db
        .prepare(
            "INSERT INTO order_expiry_outbox (order_id, due_at, traceparent) \
             SELECT * FROM unnest($1::text[], $2::timestamptz[], $3::text[])",
        )
        .await?;
    let start = Instant::now();
    for first in (0..plan.orders).step_by(OUTBOX_TX) {
        let last = (first + OUTBOX_TX).min(plan.orders) - 1;
        tokio::time::sleep_until(plan.created(last)).await;
        let ids: Vec<String> = (first..=last).map(Plan::id).collect();
        let due: Vec<_> = (first..=last).map(|i| plan.due_at(i)).collect();
        let traces = (first..=last)
            .map(|_| Ok(tracing.order_context()?.map(|t| t.traceparent().to_owned())))
            .collect::<anyhow::Result<Vec<Option<String>>>>()?;
        let tx = db.transaction().await?;
        tx.execute(&orders, &[&ids, &due]).await?;
        tx.execute(&rows, &[&ids, &due, &traces]).await?;
        tx.commit().await?;
    }
    let deadline = Instant::now() + limit;
    loop {
        let pending: i64 = db
            .query_one("SELECT count(*) FROM order_expiry_outbox", &[])
            .await?
            .try_get(0)?;
        if pending == 0 {
            return Ok(start.elapsed().as_secs_f64());
        }
        if Instant::now() > deadline {
            bail!("{pending} outbox rows still pending {limit:?} after the last commit");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Waits until the ladder and the due queue hold no message ready (every
/// message of the run delivered, so the broker's work for the sale is done
/// even when the sweeper cancelled the orders first), or `deadline`; the
/// messages left.
pub(super) async fn wait_drained(world: &World, deadline: Instant) -> u32 {
    loop {
        let left = world.ladder_depth(None).await;
        if left == 0 || Instant::now() > deadline {
            return left;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}
