//! The benchmark's corner of the shared broker and database: the testkit's
//! isolated world (prefix `bench-tp-<id>`, its own schema) with a topology per
//! holding-queue type, plus order seeding, queue purging and broker memory
//! read-outs. Its cleanup leaves nothing behind.

use std::time::Duration;

use anyhow::Context;
use lapin::options::QueuePurgeOptions;
use order_expiry::{Settings, settings::QueueType, topology::Topology};
use order_expiry_testkit::{World, WorldBuilder, remove_topology};
use secrecy::ExposeSecret;
use serde_json::Value;

/// The run's world: the schema and the orders table; nothing is declared yet.
pub(super) fn builder(settings: &Settings) -> WorldBuilder {
    crate::world(settings, "bench-tp")
        .declare(false)
        // A queue holding a million messages takes a while to delete.
        .removal_timeout(Duration::from_secs(120))
}

/// Settings for one holding-queue type: its own prefix, the run's schema.
pub(super) fn settings(world: &World, queue_type: QueueType) -> Settings {
    let mut s = world.settings.clone();
    let tag = match queue_type {
        QueueType::Quorum => "q",
        QueueType::Classic => "c",
    };
    s.topology.prefix = format!("{}-{tag}", world.settings.topology.prefix);
    s.topology.queue_type = queue_type;
    // No catch-up queue: the drain preloads its due messages for longer than
    // the default `catch_up_after_ms` (5 s) here, and what the due queue's
    // TTL moved there would be drained at `consumer.catch_up_rate`, not as
    // fast as the consumer can.
    s.topology.catch_up_after = Duration::ZERO;
    s
}

/// Empties every queue of `settings`' topology.
pub(super) async fn purge(world: &World, settings: &Settings) -> anyhow::Result<()> {
    let channel = world.channel().await;
    let topology = Topology::describe(&settings.ladder()?, &settings.topology);
    for queue in topology.queue_names() {
        channel
            .queue_purge(queue.into(), QueuePurgeOptions::default())
            .await
            .with_context(|| format!("purging {queue}"))?;
    }
    Ok(())
}

/// Deletes the queues (a million pending messages go with them) and
/// exchanges of `settings`' topology, so the next measurement starts from an
/// empty broker.
pub(super) async fn delete_queues(world: &World, settings: &Settings) -> anyhow::Result<()> {
    let topology = Topology::describe(&settings.ladder()?, &settings.topology);
    let failed = remove_topology(&world.channel().await, &topology, Duration::from_secs(120)).await;
    anyhow::ensure!(failed == 0, "{failed} queues or exchanges not deleted");
    Ok(())
}

/// Replaces every order with `n` unpaid ones, `{tag}-1` … `{tag}-n`, due a
/// minute ago (not later than the preloaded messages' `due_at`, or the
/// deadline rule leaves them unpaid), and refreshes the planner statistics
/// so the cancel uses the primary key.
pub(super) async fn seed_orders(world: &World, tag: &str, n: usize) -> anyhow::Result<()> {
    let client = world.store.client().await?;
    client.batch_execute("TRUNCATE orders").await?;
    let n = i64::try_from(n)?;
    client
        .execute(
            "INSERT INTO orders (id, pay_deadline) SELECT $1 || '-' || g, now() - interval '1 minute' FROM generate_series(1, $2::bigint) g",
            &[&tag, &n],
        )
        .await?;
    client.batch_execute("ANALYZE orders").await?;
    Ok(())
}

/// Messages and bytes the broker reports for the queues of `settings`
/// (`rabbitmqctl list_queues name messages memory`).
pub(super) fn queue_memory(settings: &Settings) -> anyhow::Result<(u64, u64)> {
    let vhost = settings
        .amqp
        .url
        .expose_secret()
        .parse::<lapin::uri::AMQPUri>()
        .map(|u| u.vhost)
        .unwrap_or_else(|_| "/".to_owned());
    let prefix = format!("{}.", settings.topology.prefix);
    let args = [
        "-q",
        "list_queues",
        "-p",
        &vhost,
        "name",
        "messages",
        "memory",
    ];
    let out = rabbitmqctl(&[&args[..], &["--formatter", "json"]].concat())?;
    let rows: Vec<Value> = serde_json::from_str(&out).context("list_queues output")?;
    let (mut messages, mut bytes) = (0, 0);
    for row in rows {
        if row["name"].as_str().is_some_and(|n| n.starts_with(&prefix)) {
            messages += row["messages"].as_u64().unwrap_or(0);
            bytes += row["memory"].as_u64().unwrap_or(0);
        }
    }
    Ok((messages, bytes))
}

/// The broker's total memory as `rabbitmqctl status` reports it (`total.rss`, bytes).
pub(super) fn broker_memory() -> anyhow::Result<u64> {
    let out = rabbitmqctl(&["-q", "status", "--formatter", "json"])?;
    let status: Value = serde_json::from_str(&out).context("status output")?;
    status["memory"]["total"]["rss"]
        .as_u64()
        .context("no memory.total.rss in rabbitmqctl status")
}

fn rabbitmqctl(args: &[&str]) -> anyhow::Result<String> {
    let out = std::process::Command::new("rabbitmqctl")
        .args(args)
        .output()
        .context("running rabbitmqctl (the broker footprint needs it, as root)")?;
    if !out.status.success() {
        anyhow::bail!(
            "rabbitmqctl {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}
