//! order-expiry itself, measured the way it runs: [`Scheduler`] publishing and the
//! real [`Consumer`] cancelling in PostgreSQL; and the child role that schedules a
//! million orders hours ahead while reporting its own memory.

use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, bail};
use chrono::{DateTime, TimeDelta, Utc};
use futures::StreamExt;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use order_expiry::{
    Scheduler, Settings, service::Consumer, service::Outcome, service::PgOrderStore,
    service::Readiness,
};
use order_expiry_testkit::procfs;

/// Schedules `ids` (`schedule_stream`) while the real consumer cancels them;
/// returns the time from the first publish to the first and to the last cancel
/// committed (and acked).
///
/// Each order is due `delay` + the publisher's lead + a remainder after it is
/// scheduled, so the ladder carries the same whole seconds as the baseline
/// (`delay`) and the consumer holds each message for the lead and the remainder.
/// The remainder is 20 ms for every order, so completions follow capacity; with
/// `spread`, order `i` gets `i * 7919 % 1000` ms, a uniform sub-second remainder as
/// real due times have, and completions can come no faster than orders fall due.
pub(super) async fn end_to_end(
    settings: &Settings,
    ids: Vec<String>,
    delay: Duration,
    spread: bool,
) -> anyhow::Result<(Duration, Duration)> {
    let n = ids.len();
    let store = Arc::new(PgOrderStore::new(settings)?);
    let readiness = Arc::new(Readiness::default());
    let mut consumer = Consumer::new(settings, store, Arc::clone(&readiness))?;
    let mut outcomes = consumer.observe();
    let stop = CancellationToken::new();
    let consuming = tokio::spawn(consumer.run(stop.clone()));
    let ready_by = Instant::now() + Duration::from_secs(10);
    while !readiness.is_consuming() {
        if Instant::now() > ready_by {
            stop.cancel();
            bail!("the consumer did not start consuming within 10 s");
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let scheduler = Scheduler::from_settings(settings)?;
    scheduler.connect().await?;
    let delay = TimeDelta::from_std(delay)? + TimeDelta::from_std(settings.publisher.lead)?;

    let start = Instant::now();
    let publishing = async {
        let orders = futures::stream::iter(ids.into_iter().enumerate()).map(|(i, id)| {
            let remainder = match spread {
                true => i64::try_from(i.wrapping_mul(7919) % 1000).unwrap_or(0),
                false => 20,
            };
            (id, Utc::now() + delay + TimeDelta::milliseconds(remainder))
        });
        let mut results = std::pin::pin!(scheduler.schedule_stream(orders));
        while let Some(result) = results.next().await {
            result.context("schedule_stream")?;
        }
        anyhow::Ok(())
    };
    let cancelling = async {
        let limit = Duration::from_secs(60) + Duration::from_millis(n as u64);
        let mut cancelled = 0usize;
        let mut first = None;
        while cancelled < n {
            let handled = tokio::time::timeout(limit, outcomes.recv())
                .await
                .with_context(|| format!("only {cancelled} of {n} cancelled within {limit:?}"))?
                .context("the consumer stopped")?;
            if handled.outcome != Outcome::Cancelled {
                bail!("unexpected outcome {handled:?}");
            }
            cancelled += 1;
            first.get_or_insert_with(Instant::now);
        }
        let last = Instant::now();
        anyhow::Ok((first.unwrap_or(last), last))
    };
    let result = tokio::try_join!(publishing, cancelling);
    stop.cancel();
    let _ = tokio::time::timeout(Duration::from_secs(15), consuming).await;
    scheduler.close().await;
    let ((), (first, last)) = result?;
    Ok((first - start, last - start))
}

/// `schedule_many` for `orders`; the time until every one is confirmed.
pub(super) async fn schedule_many(
    settings: &Settings,
    orders: Vec<(String, DateTime<Utc>)>,
) -> anyhow::Result<Duration> {
    let scheduler = Scheduler::from_settings(settings)?;
    scheduler.connect().await?;
    let start = Instant::now();
    let results = scheduler.schedule_many(orders).await;
    let elapsed = start.elapsed();
    scheduler.close().await;
    if let Some(Err(e)) = results.into_iter().find(Result::is_err) {
        return Err(e).context("schedule_many");
    }
    Ok(elapsed)
}

/// Orders `1..=n` due in one to three hours, spread over the ladder levels.
pub(super) fn hours_ahead(
    tag: &str,
    n: usize,
    now: DateTime<Utc>,
) -> impl Iterator<Item = (String, DateTime<Utc>)> {
    let tag = tag.to_owned();
    (1..=n).map(move |i| {
        let spread = i64::try_from(i.wrapping_mul(7919) % 7200).unwrap_or(0);
        (
            format!("{tag}-{i}"),
            now + TimeDelta::seconds(3600 + spread),
        )
    })
}

/// The child role: schedules `n` orders hours ahead through `schedule_stream`,
/// printing `{"scheduled": k, "rss": bytes}` twenty times along the way and a
/// final summary line, all as JSON on stdout.
pub(super) async fn schedule_role(settings: &Settings, n: usize) -> anyhow::Result<()> {
    let scheduler = Scheduler::from_settings(settings)?;
    scheduler.connect().await?;
    let every = (n / 20).max(1);
    let start = Instant::now();
    let orders = futures::stream::iter(hours_ahead("p", n, Utc::now()));
    let mut results = std::pin::pin!(scheduler.schedule_stream(orders));
    let (mut scheduled, mut failed) = (0usize, 0usize);
    while let Some(result) = results.next().await {
        match result {
            Ok(_) => scheduled += 1,
            Err(_) => failed += 1,
        }
        let k = scheduled + failed;
        if k % every == 0 {
            let rss = procfs::memory("self").map_or(0, |m| m.rss);
            println!(
                "{}",
                serde_json::json!({"scheduled": k, "rss": rss, "secs": start.elapsed().as_secs_f64()})
            );
        }
    }
    let secs = start.elapsed().as_secs_f64();
    scheduler.close().await;
    let memory = procfs::memory("self").unwrap_or_default();
    println!(
        "{}",
        serde_json::json!({"done": scheduled, "failed": failed, "secs": secs, "rss": memory.rss, "peak": memory.peak})
    );
    Ok(())
}
