//! Each measurement, baseline and order-expiry side by side. Every function
//! prepares outside the timed span (orders seeded, routes and bodies computed)
//! and times only the pipeline.

use std::time::Duration;

use anyhow::{Context, bail};
use chrono::{TimeDelta, Utc};
use lapin::types::ShortString;
use secrecy::ExposeSecret;
use serde_json::{Value, json};
use tokio::time::Instant;

use order_expiry::Settings;
use order_expiry_testkit::{World, free_port, message, procfs};

use super::cpu::ServiceCpu;
use super::{bare, child, pipeline, setup};

/// One timed run: wall time to the first and the last completion, and where the
/// CPU went meanwhile.
#[derive(Debug, Clone, Copy)]
pub(super) struct Timed {
    /// Start to first completion (end to end only; otherwise 0).
    pub(super) first: f64,
    /// Start to last completion.
    pub(super) secs: f64,
    pub(super) cpu: ServiceCpu,
}

impl Timed {
    pub(super) fn to_json(self) -> Value {
        json!({"first_secs": self.first, "secs": self.secs, "cpu_client": self.cpu.client, "cpu_broker": self.cpu.broker, "cpu_database": self.cpu.database})
    }

    /// Completions per second once the pipeline is full: (n - 1) over the time
    /// from the first completion to the last, so the fixed ladder delay and the
    /// broker's expiry timing of the first message do not count.
    pub(super) fn steady_rate(&self, n: usize) -> f64 {
        (n.saturating_sub(1)) as f64 / (self.secs - self.first)
    }
}

async fn timed<F>(run: F) -> anyhow::Result<Timed>
where
    F: Future<Output = anyhow::Result<(Duration, Duration)>>,
{
    let before = ServiceCpu::now();
    let (first, last) = run.await?;
    Ok(Timed {
        first: first.as_secs_f64(),
        secs: last.as_secs_f64(),
        cpu: before.until(&ServiceCpu::now()),
    })
}

fn ids(tag: &str, n: usize) -> Vec<String> {
    (1..=n).map(|i| format!("{tag}-{i}")).collect()
}

/// Baseline end to end: bare publish through the ladder route of `delay`, bare
/// consume and ack from the due queue; first publish to last ack.
pub(super) async fn bare_end_to_end(
    settings: &Settings,
    n: usize,
    delay: Duration,
) -> anyhow::Result<Timed> {
    let route = settings.ladder()?.route(delay.as_secs())?;
    let (exchange, key) = (
        ShortString::from(route.exchange),
        ShortString::from(route.routing_key),
    );
    let body = message("bare-0000000", Utc::now()).encode();
    let (publisher, pub_channel) = open(settings, "bench bare publisher", true).await?;
    let (consumer, sub_channel) = open(settings, "bench bare consumer", false).await?;
    let due = settings.ladder()?.due_queue();
    let result = timed(async {
        let start = Instant::now();
        let messages = (0..n).map(|_| (&exchange, &key, body.as_slice()));
        let window = settings.publisher.max_in_flight;
        let (published, done) = tokio::join!(
            bare::publish(&pub_channel, messages, window),
            bare::consume(&sub_channel, &due, n, settings.consumer.prefetch, None)
        );
        published?;
        let (first, last) = done?;
        Ok((first - start, last - start))
    })
    .await;
    let _ = publisher.close(200, "done".into()).await;
    let _ = consumer.close(200, "done".into()).await;
    result
}

/// order-expiry end to end: `schedule_stream` and the real consumer.
pub(super) async fn end_to_end(
    world: &World,
    settings: &Settings,
    tag: &str,
    n: usize,
    delay: Duration,
    spread: bool,
) -> anyhow::Result<Timed> {
    setup::seed_orders(world, tag, n).await?;
    let result = timed(pipeline::end_to_end(settings, ids(tag, n), delay, spread)).await?;
    let cancelled = world.count_orders("cancelled").await?;
    if cancelled != i64::try_from(n)? {
        bail!("{cancelled} of {n} orders cancelled after the end-to-end run");
    }
    Ok(result)
}

/// Orders `tag-1..=n` due hours ahead, as the publish comparison sends them.
fn pending_orders(tag: &str, n: usize) -> Vec<(String, chrono::DateTime<Utc>)> {
    pipeline::hours_ahead(tag, n, Utc::now()).collect()
}

/// Baseline publish: the same routes `schedule_many` would take, bare.
pub(super) async fn bare_publish(settings: &Settings, n: usize) -> anyhow::Result<Timed> {
    let ladder = settings.ladder()?;
    let now = Utc::now();
    let mut messages = Vec::with_capacity(n);
    for (id, due_at) in pending_orders("b", n) {
        let route = ladder.route_for_remaining_ms((due_at - now).num_milliseconds())?;
        let body = message(&id, due_at).encode();
        messages.push((
            ShortString::from(route.exchange),
            ShortString::from(route.routing_key),
            body,
        ));
    }
    let (connection, channel) = open(settings, "bench bare publisher", true).await?;
    let result = timed(async {
        let start = Instant::now();
        let outgoing = messages.iter().map(|(e, k, b)| (e, k, b.as_slice()));
        bare::publish(&channel, outgoing, settings.publisher.max_in_flight).await?;
        Ok((Duration::ZERO, start.elapsed()))
    })
    .await;
    let _ = connection.close(200, "done".into()).await;
    result
}

/// `schedule_many` of the same orders.
pub(super) async fn schedule_many(settings: &Settings, n: usize) -> anyhow::Result<Timed> {
    let orders = pending_orders("s", n);
    timed(async {
        Ok((
            Duration::ZERO,
            pipeline::schedule_many(settings, orders).await?,
        ))
    })
    .await
}

/// Puts `n` due messages for orders `tag-1..=n` into the due queue.
pub(super) async fn preload_due(
    world: &World,
    settings: &Settings,
    tag: &str,
    n: usize,
) -> anyhow::Result<()> {
    let ladder = settings.ladder()?;
    let route = ladder.route(0)?;
    let (exchange, key) = (
        ShortString::from(route.exchange),
        ShortString::from(route.routing_key),
    );
    let due_at = Utc::now() - TimeDelta::seconds(1);
    let bodies: Vec<Vec<u8>> = (1..=n)
        .map(|i| message(&format!("{tag}-{i}"), due_at).encode())
        .collect();
    let (connection, channel) = open(settings, "bench preload", true).await?;
    let outgoing = bodies.iter().map(|b| (&exchange, &key, b.as_slice()));
    let published = bare::publish(&channel, outgoing, 2000).await;
    let _ = connection.close(200, "done".into()).await;
    published?;
    let depth = world.depth(&ladder.due_queue()).await;
    if depth as usize != n {
        bail!("due queue holds {depth} messages after preloading {n}");
    }
    Ok(())
}

/// Bare drain of `n` preloaded due messages: consume and ack, each singly or with
/// one `multiple` ack per `batch_max` (what the consumer sends when nothing is held).
pub(super) async fn bare_drain(
    world: &World,
    settings: &Settings,
    n: usize,
    multiple: bool,
) -> anyhow::Result<Timed> {
    preload_due(world, settings, "x", n).await?;
    timed(async {
        let start = Instant::now();
        let (connection, channel) = open(settings, "bench bare drain", false).await?;
        let due = settings.ladder()?.due_queue();
        let every = multiple.then_some(settings.consumer.batch_max);
        let done = bare::consume(&channel, &due, n, settings.consumer.prefetch, every).await;
        let _ = connection.close(200, "done".into()).await;
        Ok((Duration::ZERO, done?.1 - start))
    })
    .await
}

/// What the consumer process used for a drain.
#[derive(Debug, Clone, Copy)]
pub(super) struct ConsumerDrain {
    pub(super) timed: Timed,
    /// Peak RSS of `order-expiry serve`, bytes.
    pub(super) peak_rss: u64,
    /// CPU seconds of `order-expiry serve`.
    pub(super) cpu: f64,
}

/// `order-expiry serve` as a child draining `n` preloaded due messages with
/// matching unpaid orders; from its start to the `n`th cancel committed.
pub(super) async fn consumer_drain(
    world: &World,
    settings: &Settings,
    n: usize,
    wrap: Option<&str>,
) -> anyhow::Result<ConsumerDrain> {
    setup::seed_orders(world, "d", n).await?;
    preload_due(world, settings, "d", n).await?;
    let port = free_port();
    let mut s = settings.clone();
    s.http.listen = format!("127.0.0.1:{port}");
    let before = ServiceCpu::now();
    let start = Instant::now();
    let serve = child::serve(&s, wrap)?;
    let limit = Duration::from_secs(if wrap.is_some() { 3600 } else { 120 });
    let every = Duration::from_millis(if wrap.is_some() { 1000 } else { 20 });
    let done = match child::wait_cancelled(port, n as u64, every, limit).await {
        Ok(done) => done,
        Err(e) => {
            let tail = serve.log_tail(5);
            let _ = serve.stop(Duration::from_secs(15)).await;
            return Err(e.context(tail));
        }
    };
    let pid = serve.pid().to_string();
    let cpu = procfs::cpu_seconds(&pid, false).unwrap_or(0.0);
    let peak_rss = procfs::memory(&pid).map_or(0, |m| m.peak);
    let mut used = before.until(&ServiceCpu::now());
    used.client = cpu;
    serve.stop(Duration::from_secs(60)).await?;
    let cancelled = world.count_orders("cancelled").await?;
    if cancelled != i64::try_from(n)? {
        bail!("{cancelled} of {n} orders cancelled after the drain");
    }
    Ok(ConsumerDrain {
        timed: Timed {
            first: 0.0,
            secs: (done - start).as_secs_f64(),
            cpu: used,
        },
        peak_rss,
        cpu,
    })
}

/// What scheduling many orders hours ahead cost the publisher and the broker.
#[derive(Debug, Clone, Default)]
pub(super) struct Pending {
    /// (orders scheduled so far, publisher RSS bytes), through the run.
    pub(super) samples: Vec<(u64, u64)>,
    pub(super) peak_rss: u64,
    pub(super) secs: f64,
    pub(super) messages: u64,
    /// Sum of the queues' memory, bytes.
    pub(super) queue_memory: u64,
    /// Growth of the broker's total RSS, bytes.
    pub(super) broker_growth: i64,
}

/// A child process schedules `n` orders hours ahead (`schedule_stream`) and
/// reports its RSS as it goes; then the broker's memory for them is read.
pub(super) async fn pending(
    world: &World,
    settings: &Settings,
    n: usize,
    wrap: Option<&str>,
) -> anyhow::Result<Pending> {
    let broker_before = setup::broker_memory()?;
    let mut publisher = child::publisher(settings, n, wrap)?;
    let mut lines = publisher.stdout_lines().context("child stdout")?;
    let mut result = Pending::default();
    let mut done = false;
    while let Some(line) = lines.next_line().await? {
        let v: Value =
            serde_json::from_str(&line).with_context(|| format!("child said {line:?}"))?;
        if let Some(k) = v["scheduled"].as_u64() {
            result.samples.push((k, v["rss"].as_u64().unwrap_or(0)));
        } else if let Some(scheduled) = v["done"].as_u64() {
            let failed = v["failed"].as_u64().unwrap_or(0);
            if failed > 0 || scheduled != n as u64 {
                bail!("the publisher scheduled {scheduled} of {n} ({failed} failed)");
            }
            result.secs = v["secs"].as_f64().unwrap_or(0.0);
            result.peak_rss = v["peak"].as_u64().unwrap_or(0);
            done = true;
        }
    }
    publisher.finish(Duration::from_secs(60)).await?;
    if !done {
        bail!("the publisher ended without a summary");
    }
    // Let the broker's memory accounting catch up with the last publishes.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let (messages, queue_memory) = setup::queue_memory(settings)?;
    result.messages = messages;
    result.queue_memory = queue_memory;
    result.broker_growth = i64::try_from(setup::broker_memory()?)? - i64::try_from(broker_before)?;
    setup::delete_queues(world, settings).await?;
    Ok(result)
}

/// A connection and channel of its own (confirm mode when `confirms`).
async fn open(
    settings: &Settings,
    name: &str,
    confirms: bool,
) -> anyhow::Result<(lapin::Connection, lapin::Channel)> {
    let properties = lapin::ConnectionProperties::default().with_connection_name(name.into());
    let connection =
        lapin::Connection::connect(settings.amqp.url.expose_secret(), properties).await?;
    let channel = connection.create_channel().await?;
    if confirms {
        channel
            .confirm_select(lapin::options::ConfirmSelectOptions::default())
            .await?;
    }
    Ok((connection, channel))
}
