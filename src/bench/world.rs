//! A benchmark's private world: its own topology prefix on the configured broker
//! and its own PostgreSQL schema, created at the start and removed at the end, so a
//! benchmark never touches production names or another run's data.

use std::sync::Arc;

use chrono::{DateTime, Utc};
use lapin::options::QueueDeleteOptions;
use lapin::{Channel, Connection};
use secrecy::{ExposeSecret, SecretString};

use super::lateness::Row;
use crate::orders::PgOrderStore;
use crate::settings::Settings;
use crate::topology::Topology;

/// Prefix, schema, store and an admin channel of one benchmark run.
#[derive(Debug)]
pub struct BenchWorld {
    /// Settings pointing at the run's prefix and schema.
    pub settings: Settings,
    /// The run's orders table.
    pub store: Arc<PgOrderStore>,
    /// Admin connection (declares, deletes, bare publishing).
    pub connection: Connection,
    /// Admin channel.
    pub channel: Channel,
    schema: String,
}

impl BenchWorld {
    /// Creates prefix `bench-<kind>-<id>` and schema `bench_<kind>_<id>`, declares
    /// the ladder and migrates the table.
    pub async fn create(base: &Settings, kind: &str) -> anyhow::Result<Self> {
        let id = &uuid::Uuid::new_v4().simple().to_string()[..8];
        let schema = format!("bench_{kind}_{id}");
        let mut settings = base.clone();
        settings.topology.prefix = format!("bench-{kind}-{id}");
        let admin = PgOrderStore::new(&settings.database)?;
        admin
            .pool()
            .get()
            .await?
            .batch_execute(&format!("CREATE SCHEMA {schema}"))
            .await?;
        settings.database.url = with_search_path(&settings.database.url, &schema);
        let store = Arc::new(PgOrderStore::new(&settings.database)?);
        store.migrate().await?;
        let connection = crate::broker::connect(
            &settings.amqp.url,
            "order-expiry bench",
            settings.amqp.timeout(),
        )
        .await?;
        let channel = connection.create_channel().await?;
        Topology::describe(&settings.ladder()?, &settings.topology)
            .apply(&channel, settings.amqp.timeout())
            .await?;
        Ok(Self {
            settings,
            store,
            connection,
            channel,
            schema,
        })
    }

    /// Settings of the naive design's due and parked queues (prefix `<prefix>-naive`).
    pub fn naive_settings(&self) -> Settings {
        let mut naive = self.settings.clone();
        naive.topology.prefix = format!("{}-naive", self.settings.topology.prefix);
        naive
    }

    /// Inserts unpaid orders in one statement.
    pub async fn insert_orders(&self, rows: &[(String, DateTime<Utc>)]) -> anyhow::Result<()> {
        let ids: Vec<&str> = rows.iter().map(|(id, _)| id.as_str()).collect();
        let deadlines: Vec<DateTime<Utc>> = rows.iter().map(|(_, at)| *at).collect();
        self.store
            .pool()
            .get()
            .await?
            .execute(
                "INSERT INTO orders (id, pay_deadline) SELECT * FROM unnest($1::text[], $2::timestamptz[])",
                &[&ids, &deadlines],
            )
            .await?;
        Ok(())
    }

    /// Orders still unpaid.
    pub async fn count_unpaid(&self) -> anyhow::Result<i64> {
        let row = self
            .store
            .pool()
            .get()
            .await?
            .query_one("SELECT count(*) FROM orders WHERE status = 'unpaid'", &[])
            .await?;
        Ok(row.try_get(0)?)
    }

    /// The lateness figures of the orders whose id matches `pattern`.
    pub async fn row(&self, design: &str, pattern: &str, orders: usize) -> anyhow::Result<Row> {
        let client = self.store.pool().get().await?;
        let lateness: Vec<f64> = client
            .query(
                "SELECT extract(epoch FROM cancelled_at - pay_deadline)::float8 * 1000
                 FROM orders WHERE id LIKE $1 AND status = 'cancelled'",
                &[&pattern],
            )
            .await?
            .iter()
            .map(|r| r.try_get(0))
            .collect::<Result<_, _>>()?;
        let missed: i64 = client
            .query_one(
                "SELECT count(*) FROM orders WHERE id LIKE $1 AND status = 'unpaid'",
                &[&pattern],
            )
            .await?
            .try_get(0)?;
        Ok(Row::from_lateness(
            design,
            orders,
            missed as usize,
            lateness,
        ))
    }

    /// Deletes every queue and exchange of this run (naive ones too) and the schema.
    pub async fn destroy(self) {
        let naive = self.naive_settings();
        for settings in [&self.settings, &naive] {
            let Ok(ladder) = settings.ladder() else {
                continue;
            };
            Topology::describe(&ladder, &settings.topology)
                .remove(&self.channel, settings.amqp.timeout())
                .await;
            let hold = super::lateness::naive_hold_queue(settings);
            let _ = self
                .channel
                .queue_delete(hold.as_str().into(), QueueDeleteOptions::default())
                .await;
        }
        let _ = self.connection.close(200, "bench done".into()).await;
        if let Ok(client) = self.store.pool().get().await {
            let _ = client
                .batch_execute(&format!("DROP SCHEMA {} CASCADE", self.schema))
                .await;
        }
    }
}

/// `url` with `search_path` set to `schema` through the `options` parameter.
pub fn with_search_path(url: &SecretString, schema: &str) -> SecretString {
    let raw = url.expose_secret();
    let sep = if raw.contains('?') { '&' } else { '?' };
    SecretString::from(format!("{raw}{sep}options=-csearch_path%3D{schema}"))
}
