//! Settings that parse but cannot work, rejected at start-up in one place with
//! the key and the reason: `serve` refuses to start ([`Settings::validate`]) and
//! the publisher refuses to build ([`Settings::validate_publisher`]). Pure.
//!
//! Negative numbers never get this far: every count and `_ms` key is unsigned,
//! and the config crate rejects `-1` while loading, naming the key.

use std::time::Duration;

use secrecy::ExposeSecret;
use thiserror::Error;

use super::{ActionKind, Settings, url_list};
use crate::topology::LadderError;

/// More than the largest message of one order (a 128-character id of 4-byte
/// characters, both optional times, both counters at their maximum): the
/// smallest `publisher.bundle_max_bytes` accepted.
const MAX_V1_BYTES: usize = 1024;

/// A setting that cannot work: its key (as in `config/default.toml`) and why.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("invalid setting {key}: {reason}")]
pub struct InvalidSetting {
    /// `section.key`, e.g. `consumer.prefetch`; the environment variable is
    /// `ORDER_EXPIRY__SECTION__KEY`.
    pub key: &'static str,
    /// Why it cannot work.
    pub reason: String,
}

fn invalid(key: &'static str, reason: impl Into<String>) -> Result<(), InvalidSetting> {
    Err(InvalidSetting {
        key,
        reason: reason.into(),
    })
}

/// Rejects 0: for every count here, 0 would mean "nothing ever happens" (or,
/// for the prefetch, "unlimited").
fn positive(key: &'static str, value: u64) -> Result<(), InvalidSetting> {
    if value == 0 {
        return invalid(key, "must be at least 1, not 0");
    }
    Ok(())
}

/// Rejects a zero duration: a timeout or interval of 0 fails (or spins) at once.
fn nonzero(key: &'static str, value: Duration) -> Result<(), InvalidSetting> {
    if value.is_zero() {
        return invalid(key, "must be at least 1 ms, not 0");
    }
    Ok(())
}

/// A backoff must not start above its ceiling.
fn backoff(
    initial_key: &'static str,
    initial: Duration,
    max_key: &'static str,
    max: Duration,
) -> Result<(), InvalidSetting> {
    nonzero(initial_key, initial)?;
    if initial > max {
        return invalid(
            initial_key,
            format!(
                "{} ms is more than {max_key} ({} ms): the backoff starts above its ceiling",
                initial.as_millis(),
                max.as_millis()
            ),
        );
    }
    Ok(())
}

/// A base URL the HTTP client can use: `http://` or `https://` with a host.
fn base_url(key: &'static str, url: &str, why: &str) -> Result<(), InvalidSetting> {
    let url = url.trim();
    if url.is_empty() {
        return invalid(key, format!("is empty, but {why}"));
    }
    let rest = url
        .strip_prefix("https://")
        .or_else(|| url.strip_prefix("http://"));
    match rest {
        Some(rest) if !rest.is_empty() && !rest.starts_with('/') => Ok(()),
        _ => invalid(
            key,
            format!("{url:?} is not an http:// or https:// URL with a host"),
        ),
    }
}

/// Delays the consumer sends a message through the ladder for: each at least
/// 1 ms and at most what the ladder holds.
fn ladder_delays(
    key: &'static str,
    delays: &[std::time::Duration],
    max_secs: u64,
) -> Result<(), InvalidSetting> {
    for delay in delays {
        if delay.is_zero() {
            return invalid(key, "has a step of 0 ms: each must be at least 1 ms");
        }
        if delay.as_secs() > max_secs {
            return invalid(
                key,
                format!(
                    "has a step of {} ms, longer than the ladder holds ({max_secs} s with topology.levels)",
                    delay.as_millis()
                ),
            );
        }
    }
    Ok(())
}

fn statement(key: &'static str, sql: &str) -> Result<(), InvalidSetting> {
    if sql.trim().is_empty() {
        return invalid(key, "is empty");
    }
    Ok(())
}

impl Settings {
    /// Every setting `serve` uses: the broker, the topology, the consumer, the
    /// database, the sweeper, HTTP (and the publisher's lead, which decides what
    /// the consumer may hold). The first impossible one is returned.
    pub fn validate(&self) -> Result<(), InvalidSetting> {
        self.validate_publisher()?;
        self.validate_consumer()?;
        self.validate_database()?;
        self.validate_sweeper()?;
        let o = &self.outbox;
        nonzero("outbox.poll_interval_ms", o.poll_interval)?;
        positive("outbox.batch_max", u64::from(o.batch_max))?;
        backoff(
            "outbox.retry_initial_ms",
            o.retry_initial,
            "outbox.retry_max_ms",
            o.retry_max,
        )?;
        nonzero("http.ready_timeout_ms", self.http.ready_timeout)?;
        Ok(())
    }

    /// `[consumer]`, and `[action]` through it (both bound by the ladder).
    fn validate_consumer(&self) -> Result<(), InvalidSetting> {
        let c = &self.consumer;
        if c.prefetch == 0 {
            return invalid(
                "consumer.prefetch",
                "0 means unlimited in AMQP (the broker would push the whole due queue); set 1 or more",
            );
        }
        positive("consumer.batch_max", c.batch_max as u64)?;
        positive("consumer.batch_concurrency", c.batch_concurrency as u64)?;
        positive("consumer.max_body_bytes", c.max_body_bytes as u64)?;
        positive("consumer.held_retries", u64::from(c.held_retries))?;
        backoff(
            "consumer.retry_initial_ms",
            c.retry_initial,
            "consumer.retry_max_ms",
            c.retry_max,
        )?;
        backoff(
            "consumer.retry_initial_ms",
            c.retry_initial,
            "consumer.outage_retry_max_ms",
            c.outage_retry_max,
        )?;
        nonzero("consumer.drain_timeout_ms", c.drain_timeout)?;
        let max_secs = self.ladder().map(|l| l.max_delay_secs()).unwrap_or(0);
        ladder_delays(
            "consumer.unknown_rechecks_ms",
            &c.unknown_rechecks,
            max_secs,
        )?;
        self.validate_action(max_secs)
    }

    /// `[database]`.
    fn validate_database(&self) -> Result<(), InvalidSetting> {
        let d = &self.database;
        positive("database.pool_size", d.pool_size as u64)?;
        // 0 disables these two in PostgreSQL: a statement could wait for ever.
        nonzero("database.statement_timeout_ms", d.statement_timeout)?;
        nonzero("database.lock_timeout_ms", d.lock_timeout)?;
        nonzero("database.connect_timeout_ms", d.connect_timeout)?;
        nonzero("database.acquire_timeout_ms", d.acquire_timeout)?;
        if d.query_timeout <= d.statement_timeout {
            return invalid(
                "database.query_timeout_ms",
                format!(
                    "{} ms is not more than database.statement_timeout_ms ({} ms): the client would give up \
                     (and drop the connection) before the server's own timeout",
                    d.query_timeout.as_millis(),
                    d.statement_timeout.as_millis()
                ),
            );
        }
        statement("database.cancel_sql", &d.cancel_sql)?;
        statement("database.exists_sql", &d.exists_sql)
    }

    /// `[sweeper]`: it cancels in SQL, so only beside the SQL action without a check.
    fn validate_sweeper(&self) -> Result<(), InvalidSetting> {
        let s = &self.sweeper;
        if s.enabled && self.action.kind != ActionKind::Sql {
            return invalid(
                "sweeper.enabled",
                format!(
                    "the sweeper cancels in the orders table with sweeper.sweep_sql, but action.kind = {} \
                     expires orders without the database; set sweeper.enabled = false",
                    self.action.kind.as_str()
                ),
            );
        }
        if s.enabled && self.action.check.enabled {
            return invalid(
                "sweeper.enabled",
                "the sweeper cancels without asking the payment gateway (action.check.enabled = true), \
                 and would cancel orders the check still waits for; set sweeper.enabled = false",
            );
        }
        nonzero("sweeper.interval_ms", s.interval)?;
        positive("sweeper.batch_max", u64::from(s.batch_max))?;
        statement("sweeper.sweep_sql", &s.sweep_sql)?;
        nonzero("overdue.interval_ms", self.overdue.interval)?;
        statement("overdue.count_sql", &self.overdue.count_sql)
    }

    /// `[action]`: what the chosen action and the payment check need.
    fn validate_action(&self, max_secs: u64) -> Result<(), InvalidSetting> {
        let a = &self.action;
        match a.kind {
            ActionKind::Sql => {}
            ActionKind::Http => {
                base_url(
                    "action.http.base_url",
                    &a.http.base_url,
                    "action.kind = http posts to it",
                )?;
                nonzero("action.http.timeout_ms", a.http.timeout)?;
                positive("action.http.concurrency", a.http.concurrency as u64)?;
            }
            ActionKind::Amqp => {
                if a.amqp.exchange.trim().is_empty() {
                    return invalid(
                        "action.amqp.exchange",
                        "is empty, but action.kind = amqp publishes the order.expired event to it",
                    );
                }
            }
        }
        let c = &a.check;
        if c.enabled {
            base_url(
                "action.check.base_url",
                &c.base_url,
                "action.check.enabled = true asks it",
            )?;
            nonzero("action.check.timeout_ms", c.timeout)?;
            positive("action.check.concurrency", c.concurrency as u64)?;
            if c.steps.is_empty() {
                return invalid(
                    "action.check.steps_ms",
                    "is empty: a pending payment would never be asked about again; give at least one step",
                );
            }
            ladder_delays("action.check.steps_ms", &c.steps, max_secs)?;
        }
        Ok(())
    }

    /// The settings the publisher library uses: the broker, the topology and
    /// the publisher's own. [`crate::Scheduler::from_settings`] calls it.
    pub fn validate_publisher(&self) -> Result<(), InvalidSetting> {
        let a = &self.amqp;
        nonzero("amqp.timeout_ms", a.timeout)?;
        backoff(
            "amqp.reconnect_initial_ms",
            a.reconnect_initial,
            "amqp.reconnect_max_ms",
            a.reconnect_max,
        )?;
        match self.ladder() {
            Ok(_) => {}
            Err(e @ LadderError::Levels(_)) => return invalid("topology.levels", e.to_string()),
            Err(e @ LadderError::Prefix(_)) => return invalid("topology.prefix", e.to_string()),
        }
        positive("topology.replicas", u64::from(self.topology.replicas))?;
        if url_list(self.amqp.url.expose_secret()).next().is_none() {
            return invalid(
                "amqp.url",
                "names no broker (one URL, or several comma-separated)",
            );
        }
        let p = &self.publisher;
        positive("publisher.max_in_flight", p.max_in_flight as u64)?;
        positive("publisher.bundle_max_orders", p.bundle_max_orders as u64)?;
        // The largest v1 message must fit: a bundle of one order is never
        // bigger than it.
        if p.bundle_max_bytes < MAX_V1_BYTES {
            return invalid(
                "publisher.bundle_max_bytes",
                format!("must be at least {MAX_V1_BYTES} (the largest message of one order)"),
            );
        }
        // What the consumers would park: checked here too, so that an order
        // service that links the library is refused at start, not its orders
        // parked. Its `consumer.*` are the defaults unless it sets them as
        // serve does.
        let c = &self.consumer;
        positive("consumer.max_body_bytes", c.max_body_bytes as u64)?;
        if p.bundle_max_bytes > c.max_body_bytes {
            return invalid(
                "publisher.bundle_max_bytes",
                format!(
                    "{} is more than consumer.max_body_bytes ({}): bundles that large would be parked \
                     unread by the consumers (set both alike, here and in serve's settings)",
                    p.bundle_max_bytes, c.max_body_bytes
                ),
            );
        }
        // The ladder delivers up to 1 s (its whole seconds) plus the lead before
        // due_at (a bundle's lead, the longer): a hold limit at or below that
        // parks every ladder message.
        let earliest = p.bundle_lead() + Duration::from_secs(1);
        if c.max_hold <= earliest {
            return invalid(
                "consumer.max_hold_ms",
                format!(
                    "{} ms is not more than publisher.bundle_lead_ms (or lead_ms, the longer) + 1 s ({} ms): \
                     messages arrive up to that early, and every one would be parked as far too early",
                    c.max_hold.as_millis(),
                    earliest.as_millis()
                ),
            );
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `action.kind = http` at `url`, the sweeper off.
    fn http(s: &mut Settings, url: &str) {
        s.action.kind = ActionKind::Http;
        s.sweeper.enabled = false;
        s.action.http.base_url = url.into();
    }

    /// The payment check on at `url`, the sweeper off.
    fn check(s: &mut Settings, url: &str) {
        s.action.check.enabled = true;
        s.action.check.base_url = url.into();
        s.sweeper.enabled = false;
    }

    #[test]
    fn the_defaults_and_every_action_with_its_own_settings_are_valid() {
        let mut s = Settings::default();
        s.validate().unwrap();
        http(&mut s, "https://orders.internal/api/");
        s.validate().unwrap();
        s.action.kind = ActionKind::Amqp;
        s.action.amqp.exchange = "order-events".into();
        s.validate().unwrap();
        check(&mut s, "http://gateway:9000");
        s.validate().unwrap();
    }

    /// Every rejected combination: what is changed, the key named, and a word
    /// of the reason.
    #[test]
    fn every_impossible_combination_is_rejected_with_its_key() {
        type Change = fn(&mut Settings);
        const fn ms(n: u64) -> Duration {
            Duration::from_millis(n)
        }
        #[rustfmt::skip]
        let table: &[(Change, &str, &str)] = &[
            (|s| s.consumer.prefetch = 0, "consumer.prefetch", "unlimited"),
            (|s| s.consumer.batch_max = 0, "consumer.batch_max", "at least 1"),
            (|s| s.consumer.batch_concurrency = 0, "consumer.batch_concurrency", "at least 1"),
            (|s| s.consumer.max_body_bytes = 0, "consumer.max_body_bytes", "at least 1"),
            (|s| s.consumer.max_hold = ms(1300), "consumer.max_hold_ms", "parked"),
            (|s| s.publisher.lead = ms(29_000),
                "consumer.max_hold_ms", "lead_ms, the longer) + 1 s"),
            (|s| s.publisher.bundle_lead_at_least = ms(29_000),
                "consumer.max_hold_ms", "bundle_lead_ms"),
            (|s| s.consumer.retry_initial = ms(0), "consumer.retry_initial_ms", "not 0"),
            (|s| s.consumer.retry_initial = ms(20_000), "consumer.retry_initial_ms", "ceiling"),
            (|s| s.consumer.drain_timeout = ms(0), "consumer.drain_timeout_ms", "not 0"),
            (|s| s.database.pool_size = 0, "database.pool_size", "at least 1"),
            (|s| s.database.statement_timeout = ms(0), "database.statement_timeout_ms", "not 0"),
            (|s| s.database.lock_timeout = ms(0), "database.lock_timeout_ms", "not 0"),
            (|s| s.database.connect_timeout = ms(0), "database.connect_timeout_ms", "not 0"),
            (|s| s.database.acquire_timeout = ms(0), "database.acquire_timeout_ms", "not 0"),
            (|s| s.database.query_timeout = ms(5000),
                "database.query_timeout_ms", "statement_timeout"),
            (|s| s.database.query_timeout = ms(0),
                "database.query_timeout_ms", "statement_timeout"),
            (|s| s.database.cancel_sql = " ".into(), "database.cancel_sql", "empty"),
            (|s| s.database.exists_sql = String::new(), "database.exists_sql", "empty"),
            (|s| s.sweeper.interval = ms(0), "sweeper.interval_ms", "not 0"),
            (|s| s.sweeper.batch_max = 0, "sweeper.batch_max", "at least 1"),
            (|s| s.sweeper.sweep_sql = String::new(), "sweeper.sweep_sql", "empty"),
            (|s| s.outbox.poll_interval = ms(0), "outbox.poll_interval_ms", "not 0"),
            (|s| s.outbox.batch_max = 0, "outbox.batch_max", "at least 1"),
            (|s| s.outbox.retry_initial = ms(0), "outbox.retry_initial_ms", "not 0"),
            (|s| s.outbox.retry_initial = ms(20_000), "outbox.retry_initial_ms", "ceiling"),
            (|s| s.http.ready_timeout = ms(0), "http.ready_timeout_ms", "not 0"),
            (|s| s.consumer.unknown_rechecks = vec![ms(1000), ms(0)],
                "consumer.unknown_rechecks_ms", "step of 0 ms"),
            (|s| s.consumer.unknown_rechecks = vec![ms(4_194_304_000)],
                "consumer.unknown_rechecks_ms", "longer than the ladder"),
            (|s| http(s, ""), "action.http.base_url", "is empty"),
            (|s| http(s, "ftp://orders"), "action.http.base_url", "not an http"),
            (|s| http(s, "https://"), "action.http.base_url", "with a host"),
            (|s| { http(s, "http://orders"); s.action.http.timeout = ms(0) },
                "action.http.timeout_ms", "not 0"),
            (|s| { http(s, "http://orders"); s.action.http.concurrency = 0 },
                "action.http.concurrency", "at least 1"),
            (|s| { s.sweeper.enabled = false; s.action.kind = ActionKind::Amqp },
                "action.amqp.exchange", "is empty"),
            (|s| { http(s, "http://orders"); s.sweeper.enabled = true },
                "sweeper.enabled", "action.kind = http"),
            (|s| { s.action.kind = ActionKind::Amqp; s.action.amqp.exchange = "events".into() },
                "sweeper.enabled", "action.kind = amqp"),
            (|s| { check(s, "http://gateway"); s.sweeper.enabled = true },
                "sweeper.enabled", "payment gateway"),
            (|s| check(s, ""), "action.check.base_url", "is empty"),
            (|s| { check(s, "http://g"); s.action.check.steps = Vec::new() },
                "action.check.steps_ms", "is empty"),
            (|s| { check(s, "http://g"); s.action.check.steps = vec![ms(1000), ms(0)] },
                "action.check.steps_ms", "step of 0 ms"),
            (|s| { check(s, "http://g"); s.action.check.timeout = ms(0) },
                "action.check.timeout_ms", "not 0"),
            (|s| { check(s, "http://g"); s.action.check.concurrency = 0 },
                "action.check.concurrency", "at least 1"),
            (|s| s.amqp.timeout = ms(0), "amqp.timeout_ms", "not 0"),
            (|s| s.amqp.reconnect_initial = ms(0), "amqp.reconnect_initial_ms", "not 0"),
            (|s| s.amqp.reconnect_initial = ms(20_000), "amqp.reconnect_initial_ms", "ceiling"),
            (|s| s.topology.levels = 0, "topology.levels", "levels"),
            (|s| s.topology.replicas = 0, "topology.replicas", "at least 1"),
            (|s| s.amqp.url = " , ".to_owned().into(), "amqp.url", "no broker"),
            (|s| s.topology.levels = 40, "topology.levels", "levels"),
            (|s| s.topology.prefix = "a b".into(), "topology.prefix", "prefix"),
            (|s| s.publisher.max_in_flight = 0, "publisher.max_in_flight", "at least 1"),
            (|s| s.publisher.bundle_max_orders = 0, "publisher.bundle_max_orders", "at least 1"),
            (|s| s.publisher.bundle_max_bytes = 100, "publisher.bundle_max_bytes", "at least"),
            (|s| s.publisher.bundle_max_bytes = 1 << 20,
                "publisher.bundle_max_bytes", "parked unread"),
        ];
        for (change, key, reason) in table {
            let mut settings = Settings::default();
            change(&mut settings);
            let error = settings.validate().expect_err(key);
            assert_eq!(error.key, *key, "{error}");
            assert!(error.to_string().contains(reason), "{key}: {error}");
            assert!(!error.to_string().contains('\n'), "one line: {error}");
        }
    }

    /// An order service configured apart from its consumers is refused at
    /// start, with the key and the reason, instead of having its bundles
    /// parked whole; and it checks only its own keys.
    #[test]
    fn the_publisher_refuses_what_its_consumers_would_park_and_checks_only_its_keys() {
        type Change = fn(&mut Settings);
        #[rustfmt::skip]
        let table: [(Change, &str, &str); 3] = [
            (|s| s.publisher.bundle_max_bytes = 65_536,
                "publisher.bundle_max_bytes", "parked unread"),
            (|s| s.publisher.bundle_lead_at_least = Duration::from_secs(40),
                "consumer.max_hold_ms", "far too early"),
            (|s| { s.consumer.prefetch = 0; s.publisher.max_in_flight = 0 },
                "publisher.max_in_flight", ""),
        ];
        for (change, key, reason) in table {
            let mut settings = Settings::default();
            change(&mut settings);
            let error = settings.validate_publisher().unwrap_err();
            assert_eq!(error.key, key);
            assert!(error.to_string().contains(reason), "{error}");
        }
        let mut settings = Settings::default();
        settings.consumer.prefetch = 0;
        settings.validate_publisher().unwrap();
    }

    #[test]
    fn a_negative_number_is_refused_while_loading_naming_the_key() {
        let env = config::Environment::with_prefix(super::super::ENV_PREFIX).source(Some(
            [("ORDER_EXPIRY__CONSUMER__PREFETCH".into(), "-1".into())].into(),
        ));
        let error = Settings::load_with(None, Some(env))
            .unwrap_err()
            .to_string();
        assert!(error.contains("consumer.prefetch"), "{error}");
    }
}
