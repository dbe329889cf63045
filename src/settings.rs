//! Typed settings, loaded in layers: the embedded `config/default.toml`, then an
//! optional file, then `ORDER_EXPIRY__SECTION__KEY` environment variables.
//!
//! URLs carry passwords, so they are [`SecretString`]s: `Debug` prints
//! `[REDACTED]`, and [`redact_url`] gives a loggable form.

use std::path::{Path, PathBuf};
use std::time::Duration;

use config::{Config, Environment, File, FileFormat};
use secrecy::{ExposeSecret, SecretString};
use serde::Deserialize;

use crate::ladder::{Ladder, LadderError};

/// The defaults, compiled in so the binary runs with no file at all.
pub const DEFAULT_TOML: &str = include_str!("../config/default.toml");

/// Prefix of the environment variables that override settings.
pub const ENV_PREFIX: &str = "ORDER_EXPIRY";

/// Everything the service and the CLI can be configured with.
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
    /// The orders database.
    pub database: DatabaseSettings,
    /// The safety-net sweep of overdue unpaid orders.
    pub sweeper: SweeperSettings,
    /// Health and metrics endpoint.
    pub http: HttpSettings,
    /// Logging.
    pub log: LogSettings,
}

/// How to reach the broker.
#[derive(Debug, Clone, Deserialize)]
pub struct AmqpSettings {
    /// `amqp://` or `amqps://` URL, with credentials and vhost.
    pub url: SecretString,
    /// Bound on connecting, declaring, and one publisher confirm.
    pub timeout_ms: u64,
    /// First reconnect delay.
    pub reconnect_initial_ms: u64,
    /// Longest reconnect delay.
    pub reconnect_max_ms: u64,
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
}

/// The publisher library.
#[derive(Debug, Clone, Deserialize)]
pub struct PublisherSettings {
    /// Unconfirmed publishes `schedule_many` keeps in flight.
    pub max_in_flight: usize,
    /// The ladder delivers up to this much before `due_at` (plus the sub-second
    /// remainder); the consumer holds the message until `due_at`.
    pub lead_ms: u64,
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
    /// Longest a too-early message is held before it is parked instead.
    pub max_hold_ms: u64,
    /// Largest body accepted.
    pub max_body_bytes: usize,
    /// First retry delay after a failure.
    pub retry_initial_ms: u64,
    /// Longest retry delay.
    pub retry_max_ms: u64,
    /// Bound on the drain at shutdown.
    pub drain_timeout_ms: u64,
}

/// The orders database.
#[derive(Debug, Clone, Deserialize)]
pub struct DatabaseSettings {
    /// `postgres://` URL.
    pub url: SecretString,
    /// Pooled connections.
    pub pool_size: usize,
    /// Statement timeout, ms.
    pub statement_timeout_ms: u64,
    /// Atomic cancel of every unpaid order in `$1`, returning the cancelled ids.
    pub cancel_sql: String,
    /// Which ids of `$1` exist.
    pub exists_sql: String,
}

/// The safety-net sweeper: cancels unpaid orders long past their deadline whose
/// schedule never reached the broker.
#[derive(Debug, Clone, Deserialize)]
pub struct SweeperSettings {
    /// Whether `serve` runs it.
    pub enabled: bool,
    /// Time between sweeps, ms.
    pub interval_ms: u64,
    /// How long past `pay_deadline` an order must be before it is swept, ms.
    pub grace_ms: u64,
    /// Most orders per sweep statement.
    pub batch_max: u32,
    /// Atomic cancel of up to `$2` (bigint) unpaid orders older than `now() - $1`
    /// seconds (float8), returning the cancelled ids.
    pub sweep_sql: String,
}

impl SweeperSettings {
    /// [`Self::interval_ms`] as a `Duration`, at least 1 ms.
    pub fn interval(&self) -> Duration {
        Duration::from_millis(self.interval_ms.max(1))
    }

    /// [`Self::grace_ms`] in seconds, the unit of the statement's `$1`.
    pub fn grace_secs(&self) -> f64 {
        self.grace_ms as f64 / 1000.0
    }
}

/// The HTTP endpoint.
#[derive(Debug, Clone, Deserialize)]
pub struct HttpSettings {
    /// Address to listen on, e.g. `0.0.0.0:8080`.
    pub listen: String,
}

/// Log output.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, clap::ValueEnum)]
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

impl Settings {
    /// Defaults, then `file` if given, then the environment.
    pub fn load(file: Option<&Path>) -> Result<Self, config::ConfigError> {
        Self::load_with(file, Environment::with_prefix(ENV_PREFIX))
    }

    /// Defaults and `file` only: for tests that must not see the caller's environment.
    pub fn load_without_env(file: Option<&Path>) -> Result<Self, config::ConfigError> {
        let mut builder =
            Config::builder().add_source(File::from_str(DEFAULT_TOML, FileFormat::Toml));
        if let Some(path) = file {
            builder = builder.add_source(File::from(path).required(true));
        }
        builder.build()?.try_deserialize()
    }

    fn load_with(file: Option<&Path>, env: Environment) -> Result<Self, config::ConfigError> {
        let mut builder =
            Config::builder().add_source(File::from_str(DEFAULT_TOML, FileFormat::Toml));
        if let Some(path) = file {
            builder = builder.add_source(File::from(path).required(true));
        }
        builder
            .add_source(env.prefix_separator("__").separator("__").try_parsing(true))
            .build()?
            .try_deserialize()
    }

    /// The ladder these settings describe.
    pub fn ladder(&self) -> Result<Ladder, LadderError> {
        Ladder::new(&self.topology.prefix, self.topology.levels)
    }
}

impl AmqpSettings {
    /// [`Self::timeout_ms`] as a `Duration`.
    pub fn timeout(&self) -> Duration {
        Duration::from_millis(self.timeout_ms)
    }
}

/// `url` with its password replaced by `***`, for logs and error messages.
pub fn redact_url(url: &SecretString) -> String {
    let raw = url.expose_secret();
    let Some((scheme, rest)) = raw.split_once("://") else {
        return "***".to_owned();
    };
    let (authority, path) = match rest.find('/') {
        Some(i) => rest.split_at(i),
        None => (rest, ""),
    };
    match authority.rsplit_once('@') {
        Some((userinfo, host)) => {
            let user = userinfo.split(':').next().unwrap_or("");
            format!("{scheme}://{user}:***@{host}{path}")
        }
        None => format!("{scheme}://{authority}{path}"),
    }
}

/// `text` with `url` and its password (as written and percent-decoded) replaced
/// by `***`: for third-party error messages that may quote what they were given.
pub fn scrub_url(text: &str, url: &SecretString) -> String {
    let raw = url.expose_secret();
    if raw.is_empty() {
        return text.to_owned();
    }
    let mut out = text.replace(raw, &redact_url(url));
    let password = raw
        .split_once("://")
        .map(|(_, rest)| rest.split('/').next().unwrap_or(rest))
        .and_then(|authority| authority.rsplit_once('@'))
        .and_then(|(userinfo, _)| userinfo.split_once(':'))
        .map(|(_, password)| password);
    if let Some(password) = password.filter(|p| !p.is_empty()) {
        out = out.replace(password, "***");
        let decoded = percent_decode(password);
        if !decoded.is_empty() {
            out = out.replace(&decoded, "***");
        }
    }
    out
}

fn percent_decode(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = bytes
            .get(i + 1..i + 3)
            .and_then(|h| std::str::from_utf8(h).ok())
            .and_then(|h| u8::from_str_radix(h, 16).ok());
        match (bytes[i], hex) {
            (b'%', Some(byte)) => {
                out.push(byte);
                i += 3;
            }
            (byte, _) => {
                out.push(byte);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scrubbing_removes_the_url_and_its_password_in_both_spellings() {
        let url = SecretString::from("amqp://app:s%40cret-pw@rabbit:5672/vh");
        let text = "failed: amqp://app:s%40cret-pw@rabbit:5672/vh; pw s%40cret-pw or s@cret-pw";
        let scrubbed = scrub_url(text, &url);
        assert!(!scrubbed.contains("cret-pw"), "{scrubbed}");
        assert!(
            scrubbed.contains("amqp://app:***@rabbit:5672/vh"),
            "{scrubbed}"
        );
        let opaque = SecretString::from("amqp:app:hunter2@rabbit");
        assert_eq!(
            scrub_url("Invalid URL: 'amqp:app:hunter2@rabbit'", &opaque),
            "Invalid URL: '***'"
        );
    }

    #[test]
    fn tls_files_come_from_the_environment() {
        let env = Environment::with_prefix(ENV_PREFIX).source(Some(
            [(
                "ORDER_EXPIRY__AMQP__TLS_CA_FILE".to_owned(),
                "/etc/tls/ca.pem".to_owned(),
            )]
            .into(),
        ));
        let s = Settings::load_with(None, env).unwrap();
        assert_eq!(s.amqp.tls_ca_file, Some(PathBuf::from("/etc/tls/ca.pem")));
        assert_eq!(s.amqp.tls_cert_file, None);
        assert_eq!(s.topology.vhost, crate::topology::DEFAULT_VHOST);
    }

    #[test]
    fn defaults_load_and_reach_local_services() {
        let s = Settings::load_without_env(None).unwrap();
        assert_eq!(s.topology.prefix, "orders");
        assert_eq!(s.topology.queue_type, QueueType::Quorum);
        assert!(s.amqp.url.expose_secret().contains("127.0.0.1:5672"));
        assert!(s.ladder().unwrap().max_delay_secs() >= 30 * 24 * 3600);
        assert!(s.sweeper.enabled);
        assert!(s.sweeper.grace_ms >= 60_000, "the ladder gets time first");
        assert!(
            s.sweeper
                .sweep_sql
                .contains("status = 'unpaid' RETURNING id")
        );
    }

    #[test]
    fn sweeper_can_be_turned_off_and_grace_is_in_seconds() {
        let env = Environment::with_prefix(ENV_PREFIX).source(Some(
            [
                (
                    "ORDER_EXPIRY__SWEEPER__ENABLED".to_owned(),
                    "false".to_owned(),
                ),
                (
                    "ORDER_EXPIRY__SWEEPER__GRACE_MS".to_owned(),
                    "1500".to_owned(),
                ),
            ]
            .into(),
        ));
        let s = Settings::load_with(None, env).unwrap();
        assert!(!s.sweeper.enabled);
        assert_eq!(s.sweeper.grace_secs(), 1.5);
    }

    #[test]
    fn environment_overrides_defaults() {
        let env = Environment::with_prefix(ENV_PREFIX).source(Some(
            [
                ("ORDER_EXPIRY__TOPOLOGY__PREFIX".to_owned(), "t1".to_owned()),
                (
                    "ORDER_EXPIRY__CONSUMER__PREFETCH".to_owned(),
                    "7".to_owned(),
                ),
                (
                    "ORDER_EXPIRY__HTTP__LISTEN".to_owned(),
                    "0.0.0.0:9".to_owned(),
                ),
            ]
            .into(),
        ));
        let s = Settings::load_with(None, env).unwrap();
        assert_eq!(s.topology.prefix, "t1");
        assert_eq!(s.consumer.prefetch, 7);
        assert_eq!(s.http.listen, "0.0.0.0:9");
    }

    #[test]
    fn secrets_do_not_print() {
        let s = Settings::load_without_env(None).unwrap();
        let debug = format!("{s:?}");
        assert!(!debug.contains("guest:guest"), "{debug}");
        let url = SecretString::from("amqp://app:hunter2@rabbit:5672/vh");
        assert_eq!(redact_url(&url), "amqp://app:***@rabbit:5672/vh");
        let url = SecretString::from("postgres://u:p%40ss@db/orders?sslmode=require");
        assert_eq!(
            redact_url(&url),
            "postgres://u:***@db/orders?sslmode=require"
        );
    }
}
