//! One isolated world: its own topology prefix in the broker's vhost and its own
//! PostgreSQL schema with the orders table, the topology declared, settings
//! pointing at both, and a cleanup that removes them. Tests, fault tests and
//! benchmarks run side by side against the real services without seeing each
//! other.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use anyhow::Context;
use chrono::{DateTime, Utc};
use lapin::options::{
    BasicGetOptions, BasicPublishOptions, ConfirmSelectOptions, QueueBindOptions,
    QueueDeclareOptions,
};
use lapin::types::FieldTable;
use lapin::{BasicProperties, Channel, Confirmation, Connection};
use order_expiry::{
    Scheduler, Settings, publisher::ExpiryMessage, service::PgOrderStore, topology::Topology,
};
use secrecy::{ExposeSecret, SecretString};
use tokio::sync::Mutex;

use crate::consumer::RunningConsumer;
use crate::served::Served;
use crate::services::{self, with_search_path};
use crate::wait::{poll, try_poll};

/// Ladder levels of test worlds: delays up to 63 s, quick to declare.
pub const TEST_LEVELS: u8 = 6;

/// How long the admin link waits for a broker that is (re)starting.
const BROKER_WAIT: Duration = Duration::from_secs(60);

/// One isolated world; see the module docs. Built by [`World::new`] (a test
/// world) or [`World::builder`].
pub struct World {
    /// Random, in every name the world makes.
    pub id: String,
    /// The settings of the world: its prefix, its schema, the base's broker.
    pub settings: Settings,
    /// The orders table of the world's schema.
    pub store: Arc<PgOrderStore>,
    schema: String,
    /// The database without the world's `search_path`: drops the schema.
    base_database: Settings,
    /// The broker URL the world was built with (tests may change `settings`).
    admin_url: SecretString,
    /// An admin connection and channel, reopened after a broker restart.
    link: Mutex<Option<(Connection, Channel)>>,
    declared: Mutex<Vec<Topology>>,
    removal_timeout: Duration,
    /// Where [`World::serve`] writes its logs, and the variable that keeps
    /// them after cleanup (see [`WorldBuilder::scenario`]).
    logs: Option<(PathBuf, String)>,
    serves: AtomicUsize,
}

impl std::fmt::Debug for World {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("World")
            .field("prefix", &self.settings.topology.prefix)
            .field("schema", &self.schema)
            .finish_non_exhaustive()
    }
}

/// How to build a [`World`]; see the methods.
#[derive(Debug)]
pub struct WorldBuilder {
    settings: Settings,
    test_services: bool,
    kind: String,
    declare: bool,
    removal_timeout: Duration,
    scenario: Option<(String, String)>,
}

impl World {
    /// A test world on the test broker and database (see [`crate::services`]),
    /// with a 6-level ladder declared and quick retries. Panics if it cannot be
    /// built: the services are part of the test.
    pub async fn new() -> Self {
        Self::builder().build().await.expect("a test world")
    }

    /// A test world by default; [`WorldBuilder::settings`] bases it on any settings.
    pub fn builder() -> WorldBuilder {
        let mut settings = Settings::default();
        settings.amqp.url = SecretString::from(services::amqp_url());
        settings.amqp.reconnect_initial = Duration::from_millis(50);
        settings.amqp.reconnect_max = Duration::from_millis(1000);
        settings.topology.levels = TEST_LEVELS;
        settings.consumer.retry_initial = Duration::from_millis(50);
        settings.consumer.retry_max = Duration::from_millis(1000);
        settings.consumer.drain_timeout = Duration::from_millis(3000);
        settings.database.url = SecretString::from(services::database_url(None));
        settings.http.listen = "127.0.0.1:0".into();
        // The sweeper repairs what the ladder or the consumer lost: a test of
        // either with it on cannot fail on a lost message. The sweeper's own
        // tests turn it on.
        settings.sweeper.enabled = false;
        WorldBuilder {
            settings,
            test_services: true,
            kind: "t".into(),
            declare: true,
            removal_timeout: Duration::from_secs(10),
            scenario: None,
        }
    }
}

impl WorldBuilder {
    /// Bases the world on `settings` (a benchmark's) instead of the test
    /// services: their broker and database, prefix and schema added.
    pub fn settings(mut self, settings: Settings) -> Self {
        self.settings = settings;
        self.test_services = false;
        self
    }

    /// The test vhost on another local broker: `port` instead of
    /// `ORDER_EXPIRY_TEST_AMQP_PORT` (e.g. a RabbitMQ 4 node).
    pub fn amqp_port(mut self, port: u16) -> Self {
        self.settings.amqp.url = SecretString::from(services::amqp_url_on(port));
        self
    }

    /// Another database (e.g. the failover pair's multi-host URL,
    /// [`crate::pg_pair::url`]); the world's schema is made there.
    pub fn database_url(mut self, url: &str) -> Self {
        self.settings.database.url = SecretString::from(url.to_owned());
        self
    }

    /// Another broker URL (another vhost, another user).
    pub fn amqp_url(mut self, url: &str) -> Self {
        self.settings.amqp.url = SecretString::from(url.to_owned());
        self
    }

    /// A due message no consumer took within `after` moves to the catch-up
    /// queue (`topology.catch_up_after_ms`, fixed when declared).
    pub fn catch_up_after(mut self, after: Duration) -> Self {
        self.settings.topology.catch_up_after = after;
        self
    }

    /// Ladder levels.
    pub fn levels(mut self, levels: u8) -> Self {
        self.settings.topology.levels = levels;
        self
    }

    /// Names start with `kind`: prefix `<kind>-<id>`, schema `<kind>_<id>`
    /// (default `t`).
    pub fn kind(mut self, kind: &str) -> Self {
        self.kind = kind.to_owned();
        self
    }

    /// Whether to declare the topology (default: yes). Without, only the schema.
    pub fn declare(mut self, declare: bool) -> Self {
        self.declare = declare;
        self
    }

    /// Bound on each deletion at cleanup (default 10 s; a queue holding a
    /// million messages takes longer).
    pub fn removal_timeout(mut self, timeout: Duration) -> Self {
        self.removal_timeout = timeout;
        self
    }

    /// A named scenario of suite `suite` (`faults`, `cluster`): its `serve`
    /// logs go to a directory of their own, said at start and removed at
    /// cleanup unless `<SUITE>_KEEP_LOGS` is set.
    pub fn scenario(mut self, suite: &str, name: &str) -> Self {
        self.scenario = Some((suite.to_owned(), name.to_owned()));
        self
    }

    /// The settings a world would start from, the test services made ready:
    /// for a benchmark that builds worlds of its own on them.
    pub async fn base_settings(self) -> Settings {
        if self.test_services {
            services::ensure_test_vhost_and_database().await;
        }
        self.settings
    }

    /// Builds the world, runs `body` in it and removes it, whatever `body`
    /// returned: a benchmark's run in a world of its own.
    pub async fn run<T>(
        self,
        body: impl AsyncFnOnce(&World) -> anyhow::Result<T>,
    ) -> anyhow::Result<T> {
        let world = self.build().await?;
        let result = body(&world).await;
        world.cleanup().await;
        result
    }

    /// Creates the schema and the orders table, then declares the topology.
    /// Nothing is left behind when it fails.
    pub async fn build(self) -> anyhow::Result<World> {
        order_expiry::telemetry::init_tracing_for_tests();
        if self.test_services {
            services::ensure_test_vhost_and_database().await;
        }
        let id = uuid::Uuid::new_v4().simple().to_string()[..12].to_owned();
        let schema = format!("{}_{id}", self.kind.replace('-', "_"));
        let base_database = self.settings.clone();
        let admin = PgOrderStore::new(&base_database)?;
        admin
            .client()
            .await?
            .batch_execute(&format!("CREATE SCHEMA {schema}"))
            .await
            .with_context(|| format!("creating schema {schema}"))?;
        let mut world = World {
            settings: self.settings.clone(),
            store: Arc::new(PgOrderStore::new(&base_database)?),
            schema,
            base_database,
            admin_url: self.settings.amqp.url.clone(),
            link: Mutex::new(None),
            declared: Mutex::new(Vec::new()),
            removal_timeout: self.removal_timeout,
            logs: None,
            serves: AtomicUsize::new(0),
            id,
        };
        world.settings.topology.prefix = format!("{}-{}", self.kind, world.id);
        let url = with_search_path(self.settings.database.url.expose_secret(), &world.schema);
        world.settings.database.url = SecretString::from(url);
        if let Err(e) = world.populate(self.declare).await {
            world.cleanup().await;
            return Err(e);
        }
        if let Some((suite, name)) = self.scenario {
            let dir = std::env::temp_dir().join(format!("order-expiry-{suite}-{}", world.id));
            std::fs::create_dir_all(&dir).context("the scenario's log directory")?;
            eprintln!(
                "scenario {name:?}: prefix {}, schema {}, service logs in {}",
                world.settings.topology.prefix,
                world.schema,
                dir.display()
            );
            world.logs = Some((dir, format!("{}_KEEP_LOGS", suite.to_uppercase())));
        }
        Ok(world)
    }
}

impl World {
    async fn populate(&mut self, declare: bool) -> anyhow::Result<()> {
        self.store = Arc::new(PgOrderStore::new(&self.settings)?);
        self.store
            .migrate()
            .await
            .context("creating the orders table")?;
        if declare {
            let settings = self.settings.clone();
            self.declare(&settings).await?;
        }
        Ok(())
    }

    /// The world's PostgreSQL schema.
    pub fn schema(&self) -> &str {
        &self.schema
    }

    /// The world's ladder.
    pub fn ladder(&self) -> order_expiry::topology::Ladder {
        self.settings.ladder().expect("a valid ladder")
    }

    /// The publisher library, as the order service would build it.
    pub fn scheduler(&self) -> Scheduler {
        Scheduler::from_settings(&self.settings).expect("scheduler")
    }

    /// Declares the full topology of `settings` (another prefix of this world:
    /// another queue type, a comparison design) and removes it at cleanup.
    pub async fn declare(&self, settings: &Settings) -> anyhow::Result<()> {
        let topology = Topology::declare(settings, "order-expiry test world").await?;
        let mut declared = self.declared.lock().await;
        if !declared.contains(&topology) {
            declared.push(topology);
        }
        Ok(())
    }

    /// The admin channel (plain, no confirms), reopened after a broker
    /// restart; waits up to a minute for a broker that is starting.
    pub async fn channel(&self) -> Channel {
        self.link_channel(BROKER_WAIT)
            .await
            .expect("broker unreachable")
    }

    /// The admin channel, (re)connecting for at most `wait`.
    async fn link_channel(&self, wait: Duration) -> Option<Channel> {
        let mut link = self.link.lock().await;
        if let Some((connection, channel)) = link.as_ref()
            && connection.status().connected()
            && channel.status().connected()
        {
            return Some(channel.clone());
        }
        let connection = self.connect_broker(wait).await?;
        let channel = connection.create_channel().await.ok()?;
        *link = Some((connection, channel.clone()));
        Some(channel)
    }

    /// A channel of its own on the admin connection: closing it returns what it
    /// fetched unacked.
    pub async fn open_channel(&self) -> Channel {
        let _ = self.channel().await;
        let link = self.link.lock().await;
        let (connection, _) = link.as_ref().expect("the admin link is open");
        connection.create_channel().await.expect("a channel")
    }

    async fn connect_broker(&self, wait: Duration) -> Option<Connection> {
        let url = self.admin_url.expose_secret();
        let connect = || Connection::connect(url, Default::default());
        let connected = try_poll(wait, Duration::from_millis(200), connect).await;
        connected
            .map_err(|e| eprintln!("broker unreachable: {e}"))
            .ok()
    }

    /// Starts `order-expiry serve` for this world's settings, logging into
    /// the scenario's directory (or the temporary one, the log removed at
    /// cleanup); `env` adds or overrides `ORDER_EXPIRY__…` variables.
    pub async fn serve(&self, env: &[(&str, &str)]) -> Served {
        self.serve_labelled("", env).await
    }

    /// [`World::serve`], `label` in its log's name in a scenario's directory.
    pub async fn serve_labelled(&self, label: &str, env: &[(&str, &str)]) -> Served {
        let n = self.serves.fetch_add(1, Ordering::Relaxed);
        let log = match &self.logs {
            Some((dir, _)) => dir.join(format!("serve-{n}{label}.log")),
            None => self.temporary_log(n),
        };
        Served::start(&crate::served::binary(), &self.settings, env, log).await
    }

    fn temporary_log(&self, n: usize) -> PathBuf {
        let name = format!("order-expiry-{}-serve-{n}.log", self.id);
        std::env::temp_dir().join(name)
    }

    /// `order-expiry ARGS` with this world's settings (see [`crate::run_cli`]).
    pub async fn cli(&self, args: &[&str], extra: &[(&str, &str)]) -> std::process::Output {
        crate::run_cli(&self.settings, args, extra).await
    }

    /// The stdout of `order-expiry ARGS` with this world's settings, which
    /// must succeed.
    pub async fn cli_ok(&self, args: &[&str]) -> String {
        let out = self.cli(args, &[]).await;
        crate::succeeded(format_args!("order-expiry {args:?}"), &out)
    }

    /// Starts the real consumer in this process; its outcomes are observed.
    pub fn start_consumer(&self) -> RunningConsumer {
        RunningConsumer::start(&self.settings, Arc::clone(&self.store))
    }

    /// The real consumer for `settings` (this world's, changed: another action,
    /// the payment check), with the action they select.
    pub fn start_consumer_with(&self, settings: &Settings) -> RunningConsumer {
        RunningConsumer::configured(settings, Arc::clone(&self.store))
    }

    /// Inserts unpaid orders with their deadlines, in one statement.
    pub async fn insert_orders(&self, orders: &[(String, DateTime<Utc>)]) -> anyhow::Result<()> {
        let ids: Vec<&str> = orders.iter().map(|(id, _)| id.as_str()).collect();
        let deadlines: Vec<DateTime<Utc>> = orders.iter().map(|(_, at)| *at).collect();
        let insert = "INSERT INTO orders (id, pay_deadline) \
                      SELECT * FROM unnest($1::text[], $2::timestamptz[])";
        let client = self.store.client().await?;
        client.execute(insert, &[&ids, &deadlines]).await?;
        Ok(())
    }

    /// [`World::insert_orders`] for tests: panics when it fails.
    pub async fn create_orders(&self, orders: &[(String, DateTime<Utc>)]) {
        self.insert_orders(orders).await.expect("insert orders");
    }

    /// (status, pay_deadline, cancelled_at) of one order.
    pub async fn order(&self, id: &str) -> (String, DateTime<Utc>, Option<DateTime<Utc>>) {
        let select = format!("{SELECT_ORDERS} WHERE id = $1");
        let client = self.store.client().await.expect("database");
        let row = client.query_one(&select, &[&id]).await;
        let (_, row) = OrderRow::keyed(&row.expect("the order exists"));
        (row.status, row.pay_deadline, row.cancelled_at)
    }

    /// How many of the world's orders have `status`.
    pub async fn count_orders(&self, status: &str) -> anyhow::Result<i64> {
        let client = self.store.client().await?;
        let count = "SELECT count(*) FROM orders WHERE status = $1";
        Ok(client.query_one(count, &[&status]).await?.try_get(0)?)
    }

    /// Every order of the world, by id.
    pub async fn orders(&self) -> Result<HashMap<String, OrderRow>, String> {
        let client = self.store.client().await.map_err(|e| e.to_string())?;
        let rows = client.query(SELECT_ORDERS, &[]).await;
        let rows = rows.map_err(|e| e.to_string())?;
        Ok(rows.iter().map(OrderRow::keyed).collect())
    }

    /// Every order row, retrying for up to 30 s while the database comes
    /// back. Read on a connection of its own: a pooled one may still reach a
    /// server that stopped being the primary (and holds what it had then).
    pub async fn rows(&self) -> HashMap<String, OrderRow> {
        poll(Duration::from_secs(30), 200, || async {
            let read = async {
                let rows = self.connect().await?.query(SELECT_ORDERS, &[]).await?;
                Ok::<_, tokio_postgres::Error>(rows.iter().map(OrderRow::keyed).collect())
            };
            read.await.map_err(|e| format!("reading orders: {e}"))
        })
        .await
    }

    /// A new connection to the world's database (with several hosts, the
    /// one that takes writes), its schema first on the search path.
    pub async fn connect(&self) -> Result<tokio_postgres::Client, tokio_postgres::Error> {
        services::connect_database(self.settings.database.url.expose_secret()).await
    }

    /// Publishes a raw body straight into the due exchange, bypassing the
    /// ladder, and waits for the broker's confirm.
    pub async fn publish_due(&self, body: &[u8], properties: BasicProperties) {
        let exchange = self.ladder().due_exchange();
        self.publish_all(&exchange, "raw", [body], properties).await;
    }

    /// Publishes `body` to `exchange` with `key` on a channel of its own and
    /// asserts the broker routed and confirmed it.
    pub async fn publish_to(
        &self,
        exchange: &str,
        key: &str,
        body: &[u8],
        properties: BasicProperties,
    ) {
        self.publish_all(exchange, key, [body], properties).await;
    }

    /// Publishes messages, persistent, straight into the due exchange and waits
    /// for every confirm.
    pub async fn publish_messages(&self, messages: &[ExpiryMessage]) {
        let properties = BasicProperties::default()
            .with_content_type(ExpiryMessage::CONTENT_TYPE.into())
            .with_delivery_mode(2);
        let bodies: Vec<Vec<u8>> = messages.iter().map(ExpiryMessage::encode).collect();
        let exchange = self.ladder().due_exchange();
        let bodies = bodies.iter().map(Vec::as_slice);
        self.publish_all(&exchange, "raw", bodies, properties).await;
    }

    /// One message, as [`World::publish_messages`] does.
    pub async fn publish_message(&self, message: &ExpiryMessage) {
        self.publish_messages(std::slice::from_ref(message)).await
    }

    /// Publishes each body, mandatory, on a channel of its own with confirms,
    /// and asserts the broker routed and confirmed every one.
    async fn publish_all<'a>(
        &self,
        exchange: &str,
        key: &str,
        bodies: impl IntoIterator<Item = &'a [u8]>,
        properties: BasicProperties,
    ) {
        let channel = self.open_channel().await;
        let confirms = channel.confirm_select(ConfirmSelectOptions::default());
        confirms.await.expect("confirms");
        let options = BasicPublishOptions {
            mandatory: true,
            ..Default::default()
        };
        for body in bodies {
            let publishing = channel.basic_publish(
                exchange.into(),
                key.into(),
                options,
                body,
                properties.clone(),
            );
            let confirm = publishing.await.expect("publish").await.expect("confirm");
            assert_eq!(
                confirm,
                Confirmation::Ack(None),
                "{exchange} took the message"
            );
        }
        let _ = channel.close(200, "published".into()).await;
    }

    /// Ready messages in the world's ladder: its due queue and every holding
    /// queue but `skip` (one a test deleted).
    pub async fn ladder_depth(&self, skip: Option<u8>) -> u32 {
        let ladder = self.ladder();
        let mut total = self.depth(&ladder.due_queue()).await;
        for level in (0..ladder.levels()).filter(|l| Some(*l) != skip) {
            total += self.depth(&ladder.level_name(level)).await;
        }
        total
    }

    /// Ready (not unacked) messages in a queue.
    pub async fn depth(&self, queue: &str) -> u32 {
        let passive = QueueDeclareOptions {
            passive: true,
            ..Default::default()
        };
        self.channel()
            .await
            .queue_declare(queue.into(), passive, FieldTable::default())
            .await
            .expect("queue exists")
            .message_count()
    }

    /// Binds `queue` to `exchange` for `key`, on the admin channel.
    pub async fn bind(&self, queue: &str, exchange: &str, key: &str) {
        let options = QueueBindOptions::default();
        self.channel()
            .await
            .queue_bind(
                queue.into(),
                exchange.into(),
                key.into(),
                options,
                FieldTable::default(),
            )
            .await
            .expect("a binding");
    }

    /// Whether `queue` exists (asked on a channel of its own, which the
    /// broker closes when it does not).
    pub async fn has_queue(&self, queue: &str) -> bool {
        let passive = QueueDeclareOptions {
            passive: true,
            ..Default::default()
        };
        let channel = self.open_channel().await;
        let declared = channel.queue_declare(queue.into(), passive, FieldTable::default());
        let exists = declared.await.is_ok();
        let _ = channel.close(200, "asked".into()).await;
        exists
    }

    /// Takes one message from a queue (acking it), if any.
    pub async fn get(&self, queue: &str) -> Option<lapin::message::BasicGetMessage> {
        self.channel()
            .await
            .basic_get(queue.into(), BasicGetOptions { no_ack: true })
            .await
            .expect("basic.get")
    }

    /// Deletes the world's queues, exchanges and schema, best effort.
    pub async fn cleanup(self) {
        if let Some(channel) = self.link_channel(Duration::ZERO).await {
            for topology in self.declared.lock().await.iter() {
                remove_topology(&channel, topology, self.removal_timeout).await;
            }
        }
        if let Some((connection, _)) = self.link.lock().await.take() {
            let _ = connection.close(200, "done".into()).await;
        }
        if let Ok(admin) = PgOrderStore::new(&self.base_database)
            && let Ok(client) = admin.client().await
        {
            let drop = format!("DROP SCHEMA IF EXISTS {} CASCADE", self.schema);
            let _ = client.batch_execute(&drop).await;
        }
        match &self.logs {
            Some((dir, keep)) if std::env::var_os(keep).is_none() => {
                let _ = std::fs::remove_dir_all(dir);
            }
            Some(_) => {}
            // A test that panics never comes here: its logs stay.
            None => {
                for n in 0..self.serves.load(Ordering::Relaxed) {
                    let _ = std::fs::remove_file(self.temporary_log(n));
                }
            }
        }
    }
}

/// Deletes every queue (with its messages) and exchange of `topology` on
/// `channel`, best effort: what is already gone or cannot be deleted is
/// skipped. For the throw-away topologies of tests and benchmarks. Returns how
/// many deletions failed.
pub async fn remove_topology(channel: &Channel, topology: &Topology, timeout: Duration) -> usize {
    let mut failed = 0;
    for queue in topology.queue_names() {
        let deleting = channel.queue_delete(queue.into(), Default::default());
        failed += usize::from(!matches!(
            tokio::time::timeout(timeout, deleting).await,
            Ok(Ok(_))
        ));
    }
    for exchange in topology.exchange_names() {
        let deleting = channel.exchange_delete(exchange.into(), Default::default());
        failed += usize::from(!matches!(
            tokio::time::timeout(timeout, deleting).await,
            Ok(Ok(()))
        ));
    }
    failed
}

/// One row of the orders table.
#[derive(Debug, Clone)]
pub struct OrderRow {
    /// `unpaid`, `paid` or `cancelled`.
    pub status: String,
    /// When it is due.
    pub pay_deadline: DateTime<Utc>,
    /// When it was paid.
    pub paid_at: Option<DateTime<Utc>>,
    /// When it was cancelled.
    pub cancelled_at: Option<DateTime<Utc>>,
    /// Who cancelled it, in a table with a `cancelled_by` column that a
    /// sweep statement sets (the soak's), `None` elsewhere.
    pub cancelled_by: Option<String>,
}

/// The columns of [`OrderRow`], `cancelled_by` where the table has it.
const SELECT_ORDERS: &str = "SELECT id, status, pay_deadline, paid_at, cancelled_at, \
     to_jsonb(orders) ->> 'cancelled_by' FROM orders";

impl OrderRow {
    fn keyed(row: &tokio_postgres::Row) -> (String, Self) {
        let order = Self {
            status: row.get(1),
            pay_deadline: row.get(2),
            paid_at: row.get(3),
            cancelled_at: row.get(4),
            cancelled_by: row.get(5),
        };
        (row.get(0), order)
    }
}
