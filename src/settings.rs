//! Typed settings, loaded in layers: the embedded `config/default.toml`, then an
//! optional file, then `ORDER_EXPIRY__SECTION__KEY` environment variables.
//!
//! URLs carry passwords, so they are [`SecretString`]s: `Debug` prints
//! `[REDACTED]`, and [`redact_url`] gives a loggable form.

use std::path::Path;
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_load_and_reach_local_services() {
        let s = Settings::load_without_env(None).unwrap();
        assert_eq!(s.topology.prefix, "orders");
        assert_eq!(s.topology.queue_type, QueueType::Quorum);
        assert!(s.amqp.url.expose_secret().contains("127.0.0.1:5672"));
        assert!(s.ladder().unwrap().max_delay_secs() >= 30 * 24 * 3600);
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
