//! Typed settings, loaded in layers: the embedded `config/default.toml`, then an
//! optional file, then `ORDER_EXPIRY__SECTION__KEY` environment variables.
//!
//! `config/default.toml` is the one place defaults live: [`Settings::default`]
//! parses it, and no Rust constant repeats a value from it. Durations keep their
//! public `_ms` keys and are [`Duration`]s here. URLs carry passwords, so they
//! are [`SecretString`]s: `Debug` prints `[REDACTED]`, and
//! [`AmqpSettings::display_url`] gives a loggable form.

mod action;
mod millis;
mod redact;
mod validate;

use std::path::{Path, PathBuf};
use std::time::Duration;

use config::{Config, Environment, File, FileFormat};
use secrecy::SecretString;
use serde::Deserialize;

#[cfg(feature = "service")]
pub(crate) use self::action::bearer;
pub use self::action::{
    ActionKind, ActionSettings, AmqpActionSettings, CheckSettings, FinalOutcome, HttpActionSettings,
};
#[cfg(feature = "service")]
pub(crate) use self::redact::scrub_database_url;
pub(crate) use self::redact::{redact_database_url, redact_url, scrub_url, url_list};
pub use self::validate::InvalidSetting;
use crate::topology::{Ladder, LadderError};

/// The defaults, compiled in so the binary runs with no file at all.
const DEFAULT_TOML: &str = include_str!("../../config/default.toml");

/// Prefix of the environment variables that override settings.
pub const ENV_PREFIX: &str = "ORDER_EXPIRY";

/// Everything the service, the CLI and the publisher can be configured with.
#[derive(Debug, Clone, Deserialize)]
pub struct Settings {
    /// The broker.
    pub amqp: AmqpSettings,
    /// Names and shape of the exchanges and queues.
    pub topology: TopologySettings,
    /// The publisher library.
    pub publisher: PublisherSettings,
    /// The consumer service.
    pub consumer: ConsumerSettings,
    /// What expires a due order, and the payment check before it.
    pub action: ActionSettings,
    /// The orders database (`action.kind = sql` and the sweeper).
    pub database: DatabaseSettings,
    /// The safety-net sweep of overdue unpaid orders.
    pub sweeper: SweeperSettings,
    /// The `order_expiry_overdue_unpaid` gauge.
    pub overdue: OverdueSettings,
    /// The transactional outbox relay (`order_expiry_outbox` to the ladder).
    pub outbox: OutboxSettings,
    /// The reference clock: how often its offset is measured, when it is worth a warning.
    pub clock: ClockSettings,
    /// Health and metrics endpoint.
    pub http: HttpSettings,
    /// Logging.
    pub log: LogSettings,
    /// Trace export (`telemetry.otlp`).
    pub telemetry: TelemetrySettings,
}

/// How to reach the broker.
#[derive(Debug, Clone, Deserialize)]
pub struct AmqpSettings {
    /// `amqp://` or `amqps://` URL, with credentials and vhost; or several,
    /// comma-separated (the nodes of a cluster): clients connect to one that
    /// answers and move to another when theirs fails.
    pub url: SecretString,
    /// Bound on connecting, declaring, and one publisher confirm (`timeout_ms`).
    #[serde(rename = "timeout_ms", with = "millis")]
    pub timeout: Duration,
    /// First reconnect delay (`reconnect_initial_ms`).
    #[serde(rename = "reconnect_initial_ms", with = "millis")]
    pub reconnect_initial: Duration,
    /// Longest reconnect delay (`reconnect_max_ms`).
    #[serde(rename = "reconnect_max_ms", with = "millis")]
    pub reconnect_max: Duration,
    /// AMQP heartbeat of `serve`'s consumer connection, for each URL that
    /// sets none (`heartbeat_ms`; whole seconds, rounded up; 0: the broker's
    /// 60 s). The consumer leaves a hung node within about twice this.
    #[serde(rename = "heartbeat_ms", with = "millis")]
    pub heartbeat: Duration,
    /// How often `serve` asks its broker node to re-declare the due binding
    /// (`probe_interval_ms`; 0: never). A node cut off from its cluster's
    /// majority keeps its connections and answers heartbeats, but no declare
    /// (RabbitMQ 4.x: the metadata store is Raft) and no delivery from a queue
    /// led elsewhere; no answer within [`Self::timeout`] ends the session, and
    /// the next one connects through the next URL.
    #[serde(rename = "probe_interval_ms", with = "millis")]
    pub probe_interval: Duration,
    /// PEM file of the CA certificate(s) that sign the broker's certificate, for
    /// `amqps://` with a private CA; the system roots are trusted as well. Read
    /// on every (re)connect, so a rotated file is picked up without a restart.
    #[serde(default)]
    pub tls_ca_file: Option<PathBuf>,
    /// PEM client certificate (chain), for brokers that require one; needs
    /// [`Self::tls_key_file`].
    #[serde(default)]
    pub tls_cert_file: Option<PathBuf>,
    /// PEM private key (PKCS#8, PKCS#1 or SEC1, unencrypted) of [`Self::tls_cert_file`].
    #[serde(default)]
    pub tls_key_file: Option<PathBuf>,
}

/// Holding queues are quorum or classic queues.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum QueueType {
    /// Replicated, at-least-once dead-lettering: nothing lost on a broker restart.
    Quorum,
    /// At-most-once dead-lettering: faster, can lose messages in a crash.
    Classic,
}

impl QueueType {
    /// The value of `topology.queue_type` (and of `x-queue-type`).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Quorum => "quorum",
            Self::Classic => "classic",
        }
    }
}

/// Names and shape of the topology.
#[derive(Debug, Clone, Deserialize)]
pub struct TopologySettings {
    /// Start of every exchange and queue name.
    pub prefix: String,
    /// The vhost `topology export` puts the definitions in. Connections use the
    /// vhost of `amqp.url` instead (the dev default is `/`, where `guest` works).
    pub vhost: String,
    /// Number of ladder levels.
    pub levels: u8,
    /// Type of the holding queues.
    pub queue_type: QueueType,
    /// Per holding queue length limit (0: none).
    pub max_length: u64,
    /// Members of each quorum queue's replica group (`x-quorum-initial-group-size`):
    /// the queue survives the loss of a minority of them. The broker clamps it to
    /// the nodes there are, so 3 (the default) gives 1 on a single node. Fixed when
    /// a queue is declared; see docs/src/operating/cluster.md to change it later.
    pub replicas: u16,
    /// A due message no consumer took within this long moves to the catch-up
    /// queue (the due queue's `x-message-ttl`; 0: no catch-up queue). Fixed
    /// when the due queue is declared (`catch_up_after_ms`).
    #[serde(rename = "catch_up_after_ms", with = "millis")]
    pub catch_up_after: Duration,
    /// How long a quorum queue keeps the messages a consumer holds once that
    /// consumer's node is unreachable, before it returns them to the queue
    /// for the other consumers (`x-consumer-disconnected-timeout` of the
    /// queues `serve` consumes; RabbitMQ 4.3's default is 60 s, which held
    /// orders that long after a node died). 0: the argument is not set, the
    /// broker's default applies. Fixed when a queue is declared
    /// (`consumer_disconnected_timeout_ms`).
    #[serde(rename = "consumer_disconnected_timeout_ms", with = "millis")]
    pub consumer_disconnected_timeout: Duration,
}

/// The publisher library.
#[derive(Debug, Clone, Deserialize)]
pub struct PublisherSettings {
    /// Unconfirmed publishes `schedule_many` keeps in flight.
    pub max_in_flight: usize,
    /// The ladder delivers up to this much before `due_at` (plus the sub-second
    /// remainder); the consumer holds the message until `due_at` (`lead_ms`).
    #[serde(rename = "lead_ms", with = "millis")]
    pub lead: Duration,
    /// The lead of a v2 bundle (`bundle_lead_ms`; never less than `lead_ms`):
    /// bundles leave only in a burst, and a burst's messages hop through the
    /// ladder together, queueing behind each other at every level.
    #[serde(rename = "bundle_lead_ms", with = "millis")]
    pub bundle_lead_at_least: Duration,
    /// Most orders in one v2 bundle message; 1 sends every order as a v1
    /// message of its own (bundles off).
    pub bundle_max_orders: usize,
    /// Largest bundle body, in bytes: at most the consumers'
    /// `consumer.max_body_bytes`, which parks larger bodies unread.
    pub bundle_max_bytes: usize,
    /// The most the due times of one bundle's orders may differ
    /// (`bundle_span_ms`): the consumer settles a bundle in one pass, at its
    /// latest order's due time.
    #[serde(rename = "bundle_span_ms", with = "millis")]
    pub bundle_span: Duration,
}

impl PublisherSettings {
    /// The lead a bundle gets: `bundle_lead_ms`, or `lead_ms` where that is longer.
    pub fn bundle_lead(&self) -> Duration {
        self.bundle_lead_at_least.max(self.lead)
    }
}

/// The consumer service.
#[derive(Debug, Clone, Deserialize)]
pub struct ConsumerSettings {
    /// basic.qos prefetch count.
    pub prefetch: u16,
    /// Most orders per cancel statement.
    pub batch_max: usize,
    /// Cancel statements running at once.
    pub batch_concurrency: usize,
    /// Longest a too-early message is held before it is parked instead (`max_hold_ms`).
    #[serde(rename = "max_hold_ms", with = "millis")]
    pub max_hold: Duration,
    /// Largest body accepted.
    pub max_body_bytes: usize,
    /// First retry delay after a failure (`retry_initial_ms`).
    #[serde(rename = "retry_initial_ms", with = "millis")]
    pub retry_initial: Duration,
    /// Longest retry delay (`retry_max_ms`).
    #[serde(rename = "retry_max_ms", with = "millis")]
    pub retry_max: Duration,
    /// Longest wait between two tries of the action while nothing can
    /// succeed (the database or the order service unreachable):
    /// `outage_retry_max_ms`.
    #[serde(rename = "outage_retry_max_ms", with = "millis")]
    pub outage_retry_max: Duration,
    /// Tries a failing order is retried held (unacked, in memory) before it
    /// leaves its delivery through the ladder (`held_retries`).
    pub held_retries: u32,
    /// Longest a failing order is retried held (`held_retry_ms`).
    #[serde(rename = "held_retry_ms", with = "millis")]
    pub held_retry: Duration,
    /// Orders of the catch-up queue (the backlog of an outage) started a
    /// second at most, after every order due now (0: no limit).
    pub catch_up_rate: u32,
    /// Messages of the catch-up queue delivered at once.
    pub catch_up_prefetch: u16,
    /// Bound on the drain at shutdown (`drain_timeout_ms`).
    #[serde(rename = "drain_timeout_ms", with = "millis")]
    pub drain_timeout: Duration,
    /// An order not found is looked for again after each of these delays (its
    /// INSERT may not have committed yet), through the ladder; after the last,
    /// it is acked as unknown. Empty: at once (`unknown_rechecks_ms`).
    #[serde(rename = "unknown_rechecks_ms", with = "millis::list")]
    pub unknown_rechecks: Vec<Duration>,
}

/// The orders database.
#[derive(Debug, Clone, Deserialize)]
pub struct DatabaseSettings {
    /// `postgres://` URL (or a key=value connection string). Several hosts,
    /// `postgres://u@h1:5432,h2:5432/db?target_session_attrs=read-write`,
    /// for a primary and its standbys: every connection goes to the first
    /// host that takes writes (docs/src/contract/configuration.md).
    pub url: SecretString,
    /// Pooled connections.
    pub pool_size: usize,
    /// Statement timeout, set on every connection (`statement_timeout_ms`).
    #[serde(rename = "statement_timeout_ms", with = "millis")]
    pub statement_timeout: Duration,
    /// Longest wait for a row lock, set on every connection (`lock_timeout_ms`):
    /// a cancel statement that would wait longer fails with SQLSTATE 55P03.
    #[serde(rename = "lock_timeout_ms", with = "millis")]
    pub lock_timeout: Duration,
    /// Client-side bound on every prepare and query (`query_timeout_ms`): a
    /// silent server never sends its statement timeout. Above `statement_timeout`.
    #[serde(rename = "query_timeout_ms", with = "millis")]
    pub query_timeout: Duration,
    /// Bound on opening (and recycling) one connection (`connect_timeout_ms`).
    #[serde(rename = "connect_timeout_ms", with = "millis")]
    pub connect_timeout: Duration,
    /// Longest wait for a free pooled connection (`acquire_timeout_ms`).
    #[serde(rename = "acquire_timeout_ms", with = "millis")]
    pub acquire_timeout: Duration,
    /// Atomic cancel of every unpaid order in `$1`, returning the cancelled ids.
    pub cancel_sql: String,
    /// Which ids of `$1` exist and, in an optional second column, whether each
    /// is still unpaid (tells a locked order from a paid one).
    pub exists_sql: String,
}

/// The safety-net sweeper: cancels unpaid orders long past their deadline whose
/// schedule never reached the broker.
#[derive(Debug, Clone, Deserialize)]
pub struct SweeperSettings {
    /// Whether `serve` runs it.
    pub enabled: bool,
    /// Time between sweeps (`interval_ms`).
    #[serde(rename = "interval_ms", with = "millis")]
    pub interval: Duration,
    /// How long past `pay_deadline` an order must be before it is swept (`grace_ms`).
    #[serde(rename = "grace_ms", with = "millis")]
    pub grace: Duration,
    /// Most orders per sweep statement.
    pub batch_max: u32,
    /// Atomic cancel of up to `$2` (bigint) unpaid orders older than `now() - $1`
    /// seconds (float8), returning the cancelled ids.
    pub sweep_sql: String,
}

/// The gauge of unpaid orders past their deadline by more than a margin: the
/// signal that catches a stall whatever its cause (a ladder level held back by
/// the broker, no consumer, the sweeper off).
#[derive(Debug, Clone, Deserialize)]
pub struct OverdueSettings {
    /// How far past `pay_deadline` an unpaid order counts (`margin_ms`).
    #[serde(rename = "margin_ms", with = "millis")]
    pub margin: Duration,
    /// How often the database is asked (`interval_ms`).
    #[serde(rename = "interval_ms", with = "millis")]
    pub interval: Duration,
    /// Counts the unpaid orders more than `$1` seconds (float8) past their
    /// deadline: one bigint column.
    pub count_sql: String,
}

/// The outbox relay `serve` runs: rows an order service inserted into
/// `order_expiry_outbox` in its own transaction are published through the
/// ladder with confirms, then deleted.
#[derive(Debug, Clone, Deserialize)]
pub struct OutboxSettings {
    /// Whether `serve` runs the relay.
    pub enabled: bool,
    /// The fallback poll: the relay looks at the table this often even without
    /// a notification (and at once after reconnecting), and refreshes the
    /// pending-rows gauges (`poll_interval_ms`).
    #[serde(rename = "poll_interval_ms", with = "millis")]
    pub poll_interval: Duration,
    /// Most rows locked, published and deleted per transaction.
    pub batch_max: u32,
    /// First wait after a round whose publishes or statements failed (`retry_initial_ms`).
    #[serde(rename = "retry_initial_ms", with = "millis")]
    pub retry_initial: Duration,
    /// Longest such wait (`retry_max_ms`).
    #[serde(rename = "retry_max_ms", with = "millis")]
    pub retry_max: Duration,
}

/// The HTTP endpoint.
#[derive(Debug, Clone, Deserialize)]
pub struct HttpSettings {
    /// Address to listen on, e.g. `0.0.0.0:8080`.
    pub listen: String,
    /// How long `/readyz` waits for the database to answer (`ready_timeout_ms`).
    #[serde(rename = "ready_timeout_ms", with = "millis")]
    pub ready_timeout: Duration,
}

/// The reference clock "never early" is judged by: the order database's
/// (the SQL action, the outbox relay) or the order service's (the HTTP action).
#[derive(Debug, Clone, Deserialize)]
pub struct ClockSettings {
    /// How often `serve` measures its offset from the database (`probe_interval_ms`).
    #[serde(rename = "probe_interval_ms", with = "millis")]
    pub probe_interval: Duration,
    /// An offset larger than this is logged as a warning (`warn_offset_ms`).
    #[serde(rename = "warn_offset_ms", with = "millis")]
    pub warn_offset: Duration,
}

/// Log output; also the value of the binaries' `--log-format` (the
/// `service` feature).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[cfg_attr(feature = "service", derive(clap::ValueEnum))]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line.
    Json,
}

/// Logging.
#[derive(Debug, Clone, Deserialize)]
pub struct LogSettings {
    /// Text or JSON.
    pub format: LogFormat,
    /// EnvFilter directives.
    pub filter: String,
}

/// Telemetry beyond logs and Prometheus metrics.
#[derive(Debug, Clone, Deserialize)]
pub struct TelemetrySettings {
    /// Span export over OTLP (`telemetry.otlp`).
    pub otlp: OtlpSettings,
}

/// Span export over OTLP/HTTP to a collector (feature `otlp`). The standard
/// `OTEL_*` variables win over every key here; the binary's
/// `telemetry::OtlpExport` applies them.
#[derive(Debug, Clone, Deserialize)]
pub struct OtlpSettings {
    /// Whether `serve` and the commands export spans.
    pub enabled: bool,
    /// The collector's base URL; `/v1/traces` is appended.
    pub endpoint: String,
    /// The resource's `service.name`.
    pub service_name: String,
    /// One of the `OTEL_TRACES_SAMPLER` names.
    pub sampler: String,
    /// The ratio of the `traceidratio` samplers, 0.0 to 1.0.
    pub sampler_arg: f64,
    /// More resource attributes, `key=value,key=value`.
    pub resource_attributes: String,
}

impl Default for Settings {
    /// The built-in defaults: `config/default.toml`, embedded, with no file and
    /// no environment. A unit test proves it parses.
    fn default() -> Self {
        Self::load_with(None, None).expect("the embedded config/default.toml is valid")
    }
}

impl Settings {
    /// Defaults, then `file` if given, then the environment.
    pub fn load(file: Option<&Path>) -> Result<Self, config::ConfigError> {
        Self::load_with(file, Some(Environment::with_prefix(ENV_PREFIX)))
    }

    fn load_with(
        file: Option<&Path>,
        env: Option<Environment>,
    ) -> Result<Self, config::ConfigError> {
        let mut builder =
            Config::builder().add_source(File::from_str(DEFAULT_TOML, FileFormat::Toml));
        if let Some(path) = file {
            builder = builder.add_source(File::from(path).required(true));
        }
        if let Some(env) = env {
            builder =
                builder.add_source(env.prefix_separator("__").separator("__").try_parsing(true));
        }
        builder.build()?.try_deserialize()
    }

    /// The ladder these settings describe.
    pub fn ladder(&self) -> Result<Ladder, LadderError> {
        Ladder::new(&self.topology.prefix, self.topology.levels)
    }
}

impl AmqpSettings {
    /// The broker URL (every URL of a list) with its password replaced by
    /// `***`, for logs.
    pub fn display_url(&self) -> String {
        redact_url(&self.url)
    }
}

impl DatabaseSettings {
    /// The database URL (every host of it) with its password replaced by
    /// `***`, for logs.
    pub fn display_url(&self) -> String {
        redact_database_url(&self.url)
    }
}

#[cfg(test)]
mod tests {
    use secrecy::ExposeSecret;

    use super::*;

    fn with_env(vars: &[(&str, &str)]) -> Settings {
        let source = vars
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        let env = Environment::with_prefix(ENV_PREFIX).source(Some(source));
        Settings::load_with(None, Some(env)).unwrap()
    }

    #[test]
    fn environment_overrides_defaults_and_durations_keep_their_millisecond_keys() {
        let s = with_env(&[
            ("ORDER_EXPIRY__TOPOLOGY__PREFIX", "t1"),
            ("ORDER_EXPIRY__CONSUMER__PREFETCH", "7"),
            ("ORDER_EXPIRY__HTTP__LISTEN", "0.0.0.0:9"),
            ("ORDER_EXPIRY__AMQP__TLS_CA_FILE", "/etc/tls/ca.pem"),
            ("ORDER_EXPIRY__SWEEPER__ENABLED", "false"),
            ("ORDER_EXPIRY__SWEEPER__GRACE_MS", "1500"),
            ("ORDER_EXPIRY__CONSUMER__MAX_HOLD_MS", "250"),
            ("ORDER_EXPIRY__TELEMETRY__OTLP__ENABLED", "true"),
        ]);
        assert!(s.telemetry.otlp.enabled);
        assert_eq!((s.topology.prefix.as_str(), s.consumer.prefetch), ("t1", 7));
        assert_eq!(s.http.listen, "0.0.0.0:9");
        assert_eq!(s.amqp.tls_ca_file, Some(PathBuf::from("/etc/tls/ca.pem")));
        assert_eq!(s.amqp.tls_cert_file, None);
        assert_eq!(s.topology.vhost, "order-expiry");
        assert!(!s.sweeper.enabled);
        assert_eq!(s.sweeper.grace, Duration::from_millis(1500));
        assert_eq!(s.consumer.max_hold, Duration::from_millis(250));
    }

    #[test]
    fn defaults_load_and_reach_local_services() {
        let s = Settings::default();
        assert_eq!(s.topology.prefix, "orders");
        assert_eq!(s.topology.queue_type, QueueType::Quorum);
        assert!(s.amqp.url.expose_secret().contains("127.0.0.1:5672"));
        assert!(s.ladder().unwrap().max_delay_secs() >= 30 * 24 * 3600);
        assert_eq!(s.amqp.timeout, Duration::from_secs(10));
        assert!(s.sweeper.enabled);
        assert!(s.outbox.enabled, "serve relays the outbox by default");
        // The ladder gets its 300 ms lead and a few ms of work first; the
        // sweeper bounds a stalled level at grace + interval (docs/src/results/sweeper.md).
        assert!(s.sweeper.grace >= Duration::from_secs(1));
        assert!(s.sweeper.grace + s.sweeper.interval <= Duration::from_secs(5));
        assert_eq!(s.overdue.margin, Duration::from_secs(10));
        assert!(!s.telemetry.otlp.enabled, "no span export unless asked");
        assert_eq!(s.telemetry.otlp.sampler, "parentbased_always_on");
        let sweep = &s.sweeper.sweep_sql;
        assert!(sweep.contains("status = 'unpaid' RETURNING id"));
    }

    #[test]
    fn step_lists_come_from_a_file_or_the_environment() {
        let s = Settings::default();
        assert_eq!(s.action.check.steps.len(), 8);
        assert_eq!(s.action.check.steps[7], Duration::from_secs(3600));
        assert_eq!(s.consumer.unknown_rechecks.len(), 3);
        let s = with_env(&[
            ("ORDER_EXPIRY__ACTION__CHECK__STEPS_MS", "1000, 3000"),
            ("ORDER_EXPIRY__CONSUMER__UNKNOWN_RECHECKS_MS", ""),
            ("ORDER_EXPIRY__ACTION__KIND", "http"),
            ("ORDER_EXPIRY__ACTION__CHECK__FINAL", "keep"),
        ]);
        let ms = Duration::from_millis;
        assert_eq!(s.action.check.steps, [ms(1000), ms(3000)]);
        assert!(s.consumer.unknown_rechecks.is_empty());
        assert_eq!(s.action.kind, ActionKind::Http);
        assert_eq!(s.action.check.final_outcome, FinalOutcome::Keep);
        let one = with_env(&[("ORDER_EXPIRY__CONSUMER__UNKNOWN_RECHECKS_MS", "500")]);
        assert_eq!(one.consumer.unknown_rechecks, [ms(500)]);
    }

    #[test]
    fn secrets_do_not_print() {
        let mut s = Settings::default();
        s.action.http.bearer_token = Some(SecretString::from("tok-secret"));
        s.action.check.bearer_token = Some(SecretString::from("tok-secret"));
        let debug = format!("{s:?}");
        assert!(!debug.contains("guest:guest"), "{debug}");
        assert!(!debug.contains("tok-secret"), "{debug}");
        assert_eq!(s.amqp.display_url(), "amqp://guest:***@127.0.0.1:5672/%2f");
    }
}
