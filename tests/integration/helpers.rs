//! Shared set-up: every test gets its own topology prefix (inside the test vhost)
//! and its own PostgreSQL schema (inside the test database), so tests run in
//! parallel against the real broker and database without seeing each other.

use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use lapin::options::{BasicGetOptions, BasicPublishOptions, QueueDeclareOptions};
use lapin::types::FieldTable;
use lapin::{BasicProperties, Channel, Connection};
use order_expiry::consumer::Handled;
use order_expiry::http::Readiness;
use order_expiry::orders::PgOrderStore;
use order_expiry::settings::Settings;
use order_expiry::topology::Topology;
use order_expiry::{Consumer, ExpiryMessage};
use secrecy::SecretString;
use tokio::sync::mpsc::UnboundedReceiver;
use tokio_util::sync::CancellationToken;

/// Levels for test ladders: up to 63 s, enough for every test delay, and quick to declare.
pub const TEST_LEVELS: u8 = 6;

pub fn vhost() -> String {
    std::env::var("ORDER_EXPIRY_TEST_VHOST").unwrap_or_else(|_| "order-expiry-test".into())
}

fn database() -> String {
    std::env::var("ORDER_EXPIRY_TEST_DATABASE").unwrap_or_else(|_| "order_expiry_test".into())
}

pub fn amqp_url(vhost: &str) -> String {
    let encoded = vhost.replace('%', "%25").replace('/', "%2f");
    format!("amqp://guest:guest@127.0.0.1:5672/{encoded}")
}

/// Runs rabbitmqctl, panicking with its output on failure.
pub fn rabbitmqctl(args: &[&str]) -> String {
    let out = std::process::Command::new("rabbitmqctl")
        .args(args)
        .output()
        .expect("rabbitmqctl runs");
    assert!(
        out.status.success(),
        "rabbitmqctl {args:?}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Creates the test vhost and database once per process when `scripts/test` has
/// not (plain `cargo test`).
async fn ensure_shared_resources() {
    static ONCE: tokio::sync::OnceCell<()> = tokio::sync::OnceCell::const_new();
    ONCE.get_or_init(|| async {
        if Connection::connect(&amqp_url(&vhost()), Default::default())
            .await
            .is_err()
        {
            let _ = std::process::Command::new("rabbitmqctl")
                .args(["-q", "add_vhost", &vhost()])
                .output();
            rabbitmqctl(&[
                "-q",
                "set_permissions",
                "-p",
                &vhost(),
                "guest",
                ".*",
                ".*",
                ".*",
            ]);
        }
        let (client, conn) = tokio_postgres::connect(
            "host=127.0.0.1 user=postgres dbname=postgres",
            tokio_postgres::NoTls,
        )
        .await
        .expect("PostgreSQL on 127.0.0.1:5432 as postgres");
        tokio::spawn(conn);
        let _ = client
            .batch_execute(&format!("CREATE DATABASE {}", database()))
            .await;
    })
    .await;
}

/// One test's isolated world.
pub struct TestEnv {
    pub settings: Settings,
    pub store: Arc<PgOrderStore>,
    pub schema: String,
    pub connection: Connection,
    pub channel: Channel,
}

impl TestEnv {
    /// A fresh prefix and schema, the topology declared and the table migrated.
    pub async fn new() -> Self {
        Self::with_levels(TEST_LEVELS).await
    }

    pub async fn with_levels(levels: u8) -> Self {
        order_expiry::telemetry::init_for_tests();
        ensure_shared_resources().await;
        let id = uuid::Uuid::new_v4().simple().to_string();
        let prefix = format!("t{}", &id[..12]);
        let mut settings = Settings::load_without_env(None).expect("default settings");
        settings.amqp.url = SecretString::from(amqp_url(&vhost()));
        settings.amqp.reconnect_initial_ms = 50;
        settings.amqp.reconnect_max_ms = 1000;
        settings.topology.prefix = prefix;
        settings.topology.levels = levels;
        settings.consumer.retry_initial_ms = 50;
        settings.consumer.retry_max_ms = 1000;
        settings.consumer.drain_timeout_ms = 3000;
        settings.http.listen = "127.0.0.1:0".into();
        let (store, schema) = isolated_store(&mut settings).await;

        let connection = Connection::connect(&amqp_url(&vhost()), Default::default())
            .await
            .expect("broker");
        let channel = connection.create_channel().await.expect("channel");
        Topology::describe(&settings.ladder().unwrap(), &settings.topology)
            .apply(&channel, Duration::from_secs(10))
            .await
            .expect("topology");
        Self {
            settings,
            store,
            schema,
            connection,
            channel,
        }
    }

    pub fn ladder(&self) -> order_expiry::Ladder {
        self.settings.ladder().unwrap()
    }

    /// Starts the real consumer; returns its outcome stream and its stop token.
    pub fn start_consumer(&self) -> RunningConsumer {
        let mut consumer = Consumer::new(
            &self.settings,
            Arc::clone(&self.store),
            Arc::new(Readiness::default()),
        )
        .expect("consumer");
        let outcomes = consumer.observe();
        let stop = CancellationToken::new();
        let task = tokio::spawn(consumer.run(stop.clone()));
        RunningConsumer {
            outcomes,
            stop,
            task,
        }
    }

    /// Inserts unpaid orders with their deadlines.
    pub async fn create_orders(&self, orders: &[(String, DateTime<Utc>)]) {
        for (id, due_at) in orders {
            self.store
                .create_unpaid(id, *due_at)
                .await
                .expect("insert order");
        }
    }

    /// (status, pay_deadline, cancelled_at) of one order.
    pub async fn order(&self, id: &str) -> (String, DateTime<Utc>, Option<DateTime<Utc>>) {
        let client = self.store.pool().get().await.unwrap();
        let row = client
            .query_one(
                "SELECT status, pay_deadline, cancelled_at FROM orders WHERE id = $1",
                &[&id],
            )
            .await
            .unwrap();
        (row.get(0), row.get(1), row.get(2))
    }

    /// Publishes a raw body straight into the due exchange, bypassing the ladder.
    pub async fn publish_due(&self, body: &[u8], properties: BasicProperties) {
        self.channel
            .basic_publish(
                self.ladder().due_exchange().as_str().into(),
                "raw".into(),
                BasicPublishOptions::default(),
                body,
                properties,
            )
            .await
            .expect("publish");
    }

    pub async fn publish_message(&self, message: &ExpiryMessage) {
        self.publish_due(
            &message.encode(),
            BasicProperties::default().with_content_type("application/json".into()),
        )
        .await
    }

    /// Ready messages in a queue.
    pub async fn depth(&self, queue: &str) -> u32 {
        self.channel
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
            .message_count()
    }

    /// Takes one message from a queue (acking it), if any.
    pub async fn get(&self, queue: &str) -> Option<lapin::message::BasicGetMessage> {
        self.channel
            .basic_get(queue.into(), BasicGetOptions { no_ack: true })
            .await
            .expect("basic.get")
    }

    /// Deletes this test's queues, exchanges and schema.
    pub async fn cleanup(self) {
        Topology::describe(&self.ladder(), &self.settings.topology)
            .remove(&self.channel, Duration::from_secs(10))
            .await;
        let _ = self.connection.close(200, "done".into()).await;
        if let Ok(client) = self.store.pool().get().await {
            let _ = client
                .batch_execute(&format!("DROP SCHEMA {} CASCADE", self.schema))
                .await;
        }
    }
}

pub struct RunningConsumer {
    pub outcomes: UnboundedReceiver<Handled>,
    pub stop: CancellationToken,
    pub task: tokio::task::JoinHandle<()>,
}

impl RunningConsumer {
    /// Waits for `n` handled deliveries, failing the test after `timeout`.
    pub async fn next_n(&mut self, n: usize, timeout: Duration) -> Vec<Handled> {
        let mut got = Vec::with_capacity(n);
        let deadline = tokio::time::Instant::now() + timeout;
        while got.len() < n {
            match tokio::time::timeout_at(deadline, self.outcomes.recv()).await {
                Ok(Some(h)) => got.push(h),
                Ok(None) => panic!("consumer stopped after {} of {n} outcomes", got.len()),
                Err(_) => panic!(
                    "only {} of {n} outcomes within {timeout:?}: {got:?}",
                    got.len()
                ),
            }
        }
        got
    }

    /// Asserts nothing more is handled for `quiet`.
    pub async fn expect_quiet(&mut self, quiet: Duration) {
        if let Ok(Some(h)) = tokio::time::timeout(quiet, self.outcomes.recv()).await {
            panic!("unexpected outcome {h:?}");
        }
    }

    pub async fn stop(self) {
        self.stop.cancel();
        tokio::time::timeout(Duration::from_secs(15), self.task)
            .await
            .expect("consumer stops within its drain timeout")
            .expect("consumer task");
    }
}

/// A fresh PostgreSQL schema with the orders table, for tests that need a store
/// but not a `TestEnv` (their broker side is elsewhere): points
/// `settings.database` at it and returns the store and the schema name.
pub async fn isolated_store(settings: &mut Settings) -> (Arc<PgOrderStore>, String) {
    ensure_shared_resources().await;
    let schema = format!("s_{}", &uuid::Uuid::new_v4().simple().to_string()[..12]);
    settings.database.url = SecretString::from(format!(
        "postgres://postgres@127.0.0.1:5432/{}?options=-csearch_path%3D{schema}",
        database()
    ));
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
    (store, schema)
}

/// Drops a schema made by [`isolated_store`].
pub async fn drop_schema(store: &PgOrderStore, schema: &str) {
    if let Ok(client) = store.pool().get().await {
        let _ = client
            .batch_execute(&format!("DROP SCHEMA {schema} CASCADE"))
            .await;
    }
}

/// The test database's name (see `scripts/test`).
pub fn test_database() -> String {
    database()
}

/// A TCP port nobody listens on right now.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port()
}

pub fn at_ms(ms: i64) -> DateTime<Utc> {
    Utc::now() + chrono::TimeDelta::milliseconds(ms)
}
