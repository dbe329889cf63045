//! One test's isolated topology and schema, and broker and database helpers
//! that survive restarts (a fresh connection per call).

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use lapin::options::{
    BasicGetOptions, BasicPublishOptions, ConfirmSelectOptions, QueueDeclareOptions,
    QueueDeleteOptions,
};
use lapin::types::FieldTable;
use lapin::{BasicProperties, Confirmation, Connection};
use order_expiry::orders::PgOrderStore;
use order_expiry::settings::Settings;
use order_expiry::topology::Topology;
use order_expiry::{ExpiryMessage, Scheduler};
use secrecy::SecretString;
use tokio_postgres::NoTls;

use super::*;

/// Opens a broker connection, waiting for the broker (it may be restarting).
pub async fn amqp() -> Connection {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        match Connection::connect(&amqp_url(), Default::default()).await {
            Ok(c) => return c,
            Err(e) if Instant::now() > deadline => panic!("broker unreachable: {e}"),
            Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
        }
    }
}

async fn ensure_shared_resources() {
    static ONCE: tokio::sync::OnceCell<()> = tokio::sync::OnceCell::const_new();
    ONCE.get_or_init(|| async {
        ensure_broker_up();
        ensure_database_up();
        let _ = run("rabbitmqctl", &["-q", "add_vhost", &vhost()]);
        run(
            "rabbitmqctl",
            &[
                "-q",
                "set_permissions",
                "-p",
                &vhost(),
                "guest",
                ".*",
                ".*",
                ".*",
            ],
        )
        .expect("vhost permissions");
        let _ = run(
            "psql",
            &[
                "-h",
                "127.0.0.1",
                "-U",
                "postgres",
                "-d",
                "postgres",
                "-qc",
                &format!("CREATE DATABASE {}", database()),
            ],
        );
    })
    .await;
}

/// Row locks held open by a test ([`World::lock_rows`]).
pub struct RowLock {
    client: tokio_postgres::Client,
}

impl RowLock {
    /// Statements of the service (application `order-expiry`) waiting on a row
    /// lock in the test database now.
    pub async fn blocked(&self) -> i64 {
        self.client
            .query_one(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() \
                 AND application_name = 'order-expiry' AND wait_event_type = 'Lock'",
                &[],
            )
            .await
            .expect("pg_stat_activity")
            .get(0)
    }

    /// Commits: the blocked statements go on.
    pub async fn release(self) {
        self.client.batch_execute("COMMIT").await.expect("commit");
    }
}

/// One order's row.
#[derive(Debug, Clone)]
pub struct Row {
    pub status: String,
    pub pay_deadline: DateTime<Utc>,
    pub paid_at: Option<DateTime<Utc>>,
    pub cancelled_at: Option<DateTime<Utc>>,
}

/// One test's isolated topology and schema.
pub struct World {
    pub settings: Settings,
    pub store: Arc<PgOrderStore>,
    schema: String,
    pub(super) logs: PathBuf,
}

impl World {
    pub async fn new(name: &'static str) -> Self {
        order_expiry::telemetry::init_for_tests();
        ensure_broker_up();
        ensure_database_up();
        ensure_shared_resources().await;
        let id = uuid::Uuid::new_v4().simple().to_string();
        let schema = format!("f_{}", &id[..12]);
        let mut settings = Settings::load_without_env(None).expect("default settings");
        settings.amqp.url = SecretString::from(amqp_url());
        settings.topology.prefix = format!("f{}", &id[..12]);
        settings.topology.levels = LEVELS;
        settings.http.listen = "127.0.0.1:0".into();
        settings.database.url = SecretString::from(database_url(&schema));
        let store = Arc::new(PgOrderStore::new(&settings.database).expect("store"));
        store
            .pool()
            .get()
            .await
            .expect("database connection")
            .batch_execute(&format!("CREATE SCHEMA {schema}"))
            .await
            .expect("create schema");
        store.migrate().await.expect("migrate");
        let connection = amqp().await;
        let channel = connection.create_channel().await.expect("channel");
        Topology::describe(&settings.ladder().unwrap(), &settings.topology)
            .apply(&channel, Duration::from_secs(30))
            .await
            .expect("topology");
        let _ = connection.close(200, "declared".into()).await;
        let logs = std::env::temp_dir().join(format!("order-expiry-faults-{}", &id[..12]));
        std::fs::create_dir_all(&logs).expect("log dir");
        eprintln!(
            "scenario {name:?}: prefix {}, schema {schema}, service logs in {}",
            settings.topology.prefix,
            logs.display()
        );
        Self {
            settings,
            store,
            schema,
            logs,
        }
    }

    pub fn ladder(&self) -> order_expiry::Ladder {
        self.settings.ladder().unwrap()
    }

    /// The publisher library, as the order service would build it.
    pub fn scheduler(&self) -> Scheduler {
        Scheduler::from_settings(&self.settings).expect("scheduler")
    }

    /// Starts `order-expiry serve` for this world; `env` adds or overrides
    /// `ORDER_EXPIRY__…` variables.
    pub fn serve(&self, env: &[(&str, &str)]) -> Served {
        Served::spawn(self, env)
    }

    /// Inserts unpaid orders (what the order service does before scheduling).
    pub async fn create_orders(&self, orders: &[(String, DateTime<Utc>)]) {
        let client = self.store.pool().get().await.expect("db");
        let ids: Vec<&str> = orders.iter().map(|(id, _)| id.as_str()).collect();
        let deadlines: Vec<DateTime<Utc>> = orders.iter().map(|(_, at)| *at).collect();
        client
            .execute(
                "INSERT INTO orders (id, pay_deadline) SELECT * FROM unnest($1::text[], $2::timestamptz[])",
                &[&ids, &deadlines],
            )
            .await
            .expect("insert orders");
    }

    /// Opens a transaction holding the row locks of `ids`: a cancel statement
    /// touching any of them blocks until [`RowLock::release`].
    pub async fn lock_rows(&self, ids: &[&str]) -> RowLock {
        use secrecy::ExposeSecret;
        let (client, connection) =
            tokio_postgres::connect(self.settings.database.url.expose_secret(), NoTls)
                .await
                .expect("locking connection");
        tokio::spawn(connection);
        client.batch_execute("BEGIN").await.expect("begin");
        client
            .execute(
                "SELECT 1 FROM orders WHERE id = ANY($1) FOR UPDATE",
                &[&ids],
            )
            .await
            .expect("lock rows");
        RowLock { client }
    }

    /// Every order row, retrying while the database comes back.
    pub async fn rows(&self) -> HashMap<String, Row> {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            match self.try_rows().await {
                Ok(rows) => return rows,
                Err(e) if Instant::now() > deadline => panic!("reading orders: {e}"),
                Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
            }
        }
    }

    async fn try_rows(&self) -> Result<HashMap<String, Row>, String> {
        let client = self.store.pool().get().await.map_err(|e| e.to_string())?;
        let rows = client
            .query(
                "SELECT id, status, pay_deadline, paid_at, cancelled_at FROM orders",
                &[],
            )
            .await
            .map_err(|e| e.to_string())?;
        Ok(rows
            .iter()
            .map(|r| {
                (
                    r.get(0),
                    Row {
                        status: r.get(1),
                        pay_deadline: r.get(2),
                        paid_at: r.get(3),
                        cancelled_at: r.get(4),
                    },
                )
            })
            .collect())
    }

    /// Publishes messages straight into the due exchange (bypassing the ladder)
    /// and waits for every confirm.
    pub async fn publish_due(&self, messages: &[ExpiryMessage]) {
        let connection = amqp().await;
        let channel = connection.create_channel().await.expect("channel");
        channel
            .confirm_select(ConfirmSelectOptions::default())
            .await
            .expect("confirms");
        let mut confirms = Vec::with_capacity(messages.len());
        for message in messages {
            confirms.push(
                channel
                    .basic_publish(
                        self.ladder().due_exchange().as_str().into(),
                        "direct".into(),
                        BasicPublishOptions {
                            mandatory: true,
                            ..Default::default()
                        },
                        &message.encode(),
                        BasicProperties::default()
                            .with_content_type("application/json".into())
                            .with_delivery_mode(2),
                    )
                    .await
                    .expect("publish"),
            );
        }
        for confirm in confirms {
            assert_eq!(
                confirm.await.expect("confirm"),
                Confirmation::Ack(None),
                "broker took the message"
            );
        }
        let _ = connection.close(200, "published".into()).await;
    }

    /// This world's non-empty queues as `name ready/unacked`, from `rabbitmqctl`.
    pub fn queue_report(&self) -> String {
        let prefix = format!("{}.", self.settings.topology.prefix);
        let listing = run(
            "rabbitmqctl",
            &[
                "-q",
                "list_queues",
                "-p",
                &vhost(),
                "--no-table-headers",
                "name",
                "messages_ready",
                "messages_unacknowledged",
            ],
        )
        .unwrap_or_else(|e| e);
        let queues: Vec<String> = listing
            .lines()
            .filter_map(|line| {
                let mut fields = line.split_whitespace();
                let name = fields.next()?.strip_prefix(&prefix)?;
                let (ready, unacked) = (fields.next()?, fields.next()?);
                (ready != "0" || unacked != "0").then(|| format!("{name} {ready}/{unacked}"))
            })
            .collect();
        if queues.is_empty() {
            "all empty".into()
        } else {
            queues.join(", ")
        }
    }

    /// Ready (not unacked) messages in a queue.
    pub async fn depth(&self, queue: &str) -> u32 {
        let connection = amqp().await;
        let channel = connection.create_channel().await.expect("channel");
        let count = channel
            .queue_declare(
                queue.into(),
                QueueDeclareOptions {
                    passive: true,
                    ..Default::default()
                },
                FieldTable::default(),
            )
            .await
            .expect("queue exists")
            .message_count();
        let _ = connection.close(200, "counted".into()).await;
        count
    }

    /// The order ids of the messages ready in the due queue, left in the queue:
    /// they are fetched unacked and returned when the channel closes.
    pub async fn due_ids(&self) -> Vec<String> {
        let connection = amqp().await;
        let channel = connection.create_channel().await.expect("channel");
        let mut ids = Vec::new();
        while let Some(message) = channel
            .basic_get(
                self.ladder().due_queue().as_str().into(),
                BasicGetOptions { no_ack: false },
            )
            .await
            .expect("basic.get")
        {
            let decoded = ExpiryMessage::decode(&message.delivery.data, None, 1 << 20)
                .expect("a well-formed message in the due queue");
            ids.push(decoded.order_id);
        }
        let _ = channel.close(200, "requeue".into()).await;
        let _ = connection.close(200, "peeked".into()).await;
        ids
    }

    /// Deletes this test's queues, exchanges and schema (best effort).
    pub async fn cleanup(self) {
        if let Ok(connection) = Connection::connect(&amqp_url(), Default::default()).await
            && let Ok(channel) = connection.create_channel().await
        {
            let topology = Topology::describe(&self.ladder(), &self.settings.topology);
            for q in &topology.queues {
                let _ = channel
                    .queue_delete(q.name.as_str().into(), QueueDeleteOptions::default())
                    .await;
            }
            for e in &topology.exchanges {
                let _ = channel
                    .exchange_delete(e.name.as_str().into(), Default::default())
                    .await;
            }
            let _ = connection.close(200, "done".into()).await;
        }
        if let Ok(client) = self.store.pool().get().await {
            let _ = client
                .batch_execute(&format!("DROP SCHEMA {} CASCADE", self.schema))
                .await;
        }
        if std::env::var_os("FAULTS_KEEP_LOGS").is_none() {
            let _ = std::fs::remove_dir_all(&self.logs);
        }
    }
}

/// An unpaid order due at `due_at`, with its wire-format due time (what the
/// consumer compares against).
pub fn order(id: impl Into<String>, due_at: DateTime<Utc>) -> (String, DateTime<Utc>) {
    (id.into(), order_expiry::message::ceil_to_millis(due_at))
}

pub fn at_ms(ms: i64) -> DateTime<Utc> {
    Utc::now() + chrono::TimeDelta::milliseconds(ms)
}
