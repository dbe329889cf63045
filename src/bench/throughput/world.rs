//! The benchmark's own corner of the shared broker and database: a random topology
//! prefix per holding-queue type, its own PostgreSQL schema, order seeding, queue
//! purging, broker memory read-outs, and a cleanup that leaves nothing behind.

use std::time::Duration;

use anyhow::Context;
use lapin::options::{QueueDeleteOptions, QueuePurgeOptions};
use lapin::{Channel, Connection};
use secrecy::ExposeSecret;
use serde_json::Value;

use crate::bench::world::with_search_path;
use crate::broker;
use crate::orders::PgOrderStore;
use crate::settings::{QueueType, Settings};
use crate::topology::Topology;

/// One benchmark run's names, connections and schema.
pub(super) struct World {
    /// Random, so that concurrent runs and other benchmarks never collide.
    pub(super) id: String,
    base: Settings,
    schema: String,
    /// On the benchmark schema: seeding and checks.
    pub(super) store: PgOrderStore,
    admin: PgOrderStore,
    connection: Connection,
    /// Plain channel for declare / purge / delete.
    pub(super) channel: Channel,
    declared: Vec<Topology>,
    vhost: String,
}

impl World {
    /// Creates the schema and the broker connection. Nothing is declared yet.
    pub(super) async fn open(settings: &Settings) -> anyhow::Result<Self> {
        let id = uuid::Uuid::new_v4().simple().to_string()[..8].to_owned();
        let schema = format!("bench_tp_{id}");
        let admin = PgOrderStore::new(&settings.database)?;
        admin
            .pool()
            .get()
            .await
            .map_err(|e| anyhow::anyhow!("database: {e}"))?
            .batch_execute(&format!("CREATE SCHEMA {schema}"))
            .await
            .context("creating the benchmark schema")?;
        let mut base = settings.clone();
        base.database.url = with_search_path(&settings.database.url, &schema);
        let opened = async {
            let store = PgOrderStore::new(&base.database)?;
            store.migrate().await.context("creating the orders table")?;
            let timeout = base.amqp.timeout();
            let connection = broker::connect(&base.amqp.url, "order-expiry bench", timeout).await?;
            let channel = connection.create_channel().await?;
            anyhow::Ok((store, connection, channel))
        }
        .await;
        let (store, connection, channel) = match opened {
            Ok(parts) => parts,
            Err(e) => {
                // Nothing else exists yet: leave no schema behind.
                if let Ok(client) = admin.pool().get().await {
                    let _ = client
                        .batch_execute(&format!("DROP SCHEMA IF EXISTS {schema} CASCADE"))
                        .await;
                }
                return Err(e);
            }
        };
        let vhost = base
            .amqp
            .url
            .expose_secret()
            .parse::<lapin::uri::AMQPUri>()
            .map(|u| u.vhost)
            .unwrap_or_else(|_| "/".to_owned());
        Ok(Self {
            id,
            base,
            schema,
            store,
            admin,
            connection,
            channel,
            declared: Vec::new(),
            vhost,
        })
    }

    /// Settings for one holding-queue type: its own prefix, the benchmark schema.
    pub(super) fn settings(&self, queue_type: QueueType) -> Settings {
        let mut s = self.base.clone();
        let tag = match queue_type {
            QueueType::Quorum => "q",
            QueueType::Classic => "c",
        };
        s.topology.prefix = format!("bench-tp-{}-{tag}", self.id);
        s.topology.queue_type = queue_type;
        s
    }

    /// Declares the full topology of `settings` and remembers it for cleanup.
    pub(super) async fn declare(&mut self, settings: &Settings) -> anyhow::Result<()> {
        let topology = Topology::describe(&settings.ladder()?, &settings.topology);
        topology
            .apply(&self.channel, settings.amqp.timeout())
            .await?;
        if !self.declared.contains(&topology) {
            self.declared.push(topology);
        }
        Ok(())
    }

    /// Empties every queue of `settings`' topology.
    pub(super) async fn purge(&self, settings: &Settings) -> anyhow::Result<()> {
        let topology = Topology::describe(&settings.ladder()?, &settings.topology);
        for q in &topology.queues {
            self.channel
                .queue_purge(q.name.as_str().into(), QueuePurgeOptions::default())
                .await
                .with_context(|| format!("purging {}", q.name))?;
        }
        Ok(())
    }

    /// Deletes the queues of `settings`' topology (a million pending messages go
    /// with them) so the next measurement starts from an empty broker.
    pub(super) async fn delete_queues(&self, settings: &Settings) -> anyhow::Result<()> {
        let topology = Topology::describe(&settings.ladder()?, &settings.topology);
        for q in &topology.queues {
            tokio::time::timeout(
                Duration::from_secs(120),
                self.channel
                    .queue_delete(q.name.as_str().into(), QueueDeleteOptions::default()),
            )
            .await
            .with_context(|| format!("deleting {} timed out", q.name))?
            .with_context(|| format!("deleting {}", q.name))?;
        }
        Ok(())
    }

    /// Replaces every order with `n` unpaid ones, `{tag}-1` … `{tag}-n`, and
    /// refreshes the planner statistics so the cancel uses the primary key.
    pub(super) async fn seed_orders(&self, tag: &str, n: usize) -> anyhow::Result<()> {
        let client = self
            .store
            .pool()
            .get()
            .await
            .map_err(|e| anyhow::anyhow!("database: {e}"))?;
        client.batch_execute("TRUNCATE orders").await?;
        let n = i64::try_from(n)?;
        client
            .execute(
                "INSERT INTO orders (id, pay_deadline) SELECT $1 || '-' || g, now() FROM generate_series(1, $2::bigint) g",
                &[&tag, &n],
            )
            .await?;
        client.batch_execute("ANALYZE orders").await?;
        Ok(())
    }

    /// How many orders are cancelled now.
    pub(super) async fn cancelled(&self) -> anyhow::Result<i64> {
        let client = self
            .store
            .pool()
            .get()
            .await
            .map_err(|e| anyhow::anyhow!("database: {e}"))?;
        let row = client
            .query_one(
                "SELECT count(*) FROM orders WHERE status = 'cancelled'",
                &[],
            )
            .await?;
        Ok(row.try_get(0)?)
    }

    /// Messages and bytes the broker reports for the queues of `settings`
    /// (`rabbitmqctl list_queues name messages memory`).
    pub(super) fn queue_memory(&self, settings: &Settings) -> anyhow::Result<(u64, u64)> {
        let prefix = format!("{}.", settings.topology.prefix);
        let out = rabbitmqctl(&[
            "-q",
            "list_queues",
            "-p",
            &self.vhost,
            "name",
            "messages",
            "memory",
            "--formatter",
            "json",
        ])?;
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

    /// Deletes every queue and exchange this run declared and drops the schema.
    pub(super) async fn cleanup(self) {
        for topology in &self.declared {
            // A queue holding a million messages takes a while to delete.
            topology
                .remove(&self.channel, Duration::from_secs(120))
                .await;
        }
        let _ = self.connection.close(200, "done".into()).await;
        if let Ok(client) = self.admin.pool().get().await {
            let _ = client
                .batch_execute(&format!("DROP SCHEMA IF EXISTS {} CASCADE", self.schema))
                .await;
        }
    }
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
