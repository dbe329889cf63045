//! `order-expiry status`: one look at the whole system, from AMQP and SQL.
//!
//! Every depth is a passive queue declare. AMQP reports a queue's ready
//! messages and consumers but not its unacked ones, so the due queue's
//! `unacked` is `null` (the consumer's `/metrics` and `rabbitmqctl
//! list_queues messages_unacknowledged` have it). The parked queue's oldest
//! message is its head, read unacked by a consumer and returned by closing
//! the channel.
//! The database part reads the default `orders` table and the outbox table.

use std::fmt;
use std::time::Duration;

use chrono::{DateTime, SecondsFormat, TimeDelta, Utc};
use serde::Serialize;

use super::admin::{Admin, OpsError, Resume};
use super::sweep::Sweep;
use crate::amqp;
use crate::service::PgOrderStore;
use crate::service::clock::{OffsetEstimate, reading_bounds};
use crate::settings::{ActionKind, Settings};
use crate::topology::Ladder;

/// The version of the JSON form (`"v"`). Fields are only ever added within one
/// version.
pub const STATUS_VERSION: u32 = 1;

/// The whole system at `checked_at`; `Display` is the text table, `serde` the
/// documented JSON.
#[derive(Debug, Clone, Serialize)]
pub struct Status {
    /// [`STATUS_VERSION`].
    pub v: u32,
    /// When it was looked at.
    pub checked_at: DateTime<Utc>,
    /// `topology.prefix`.
    pub prefix: String,
    /// Each level of the ladder, highest first.
    pub levels: Vec<LevelStatus>,
    /// Messages waiting in the ladder (the levels' sum). A message is one
    /// order (v1) or a bundle of up to `publisher.bundle_max_orders`: the
    /// broker counts messages, not orders; `orders` counts orders.
    pub ladder_messages: u64,
    /// `publisher.bundle_max_orders`: the most orders one message carries.
    pub orders_per_message_max: usize,
    /// The due queue.
    pub due: DueStatus,
    /// The parked queue.
    pub parked: ParkedStatus,
    /// The outbox table; `None` when `outbox.enabled` is off.
    pub outbox: Option<OutboxStatus>,
    /// Unpaid orders past their deadline.
    pub orders: OrdersStatus,
    /// This host's clock against the database's; `None` when nothing here
    /// uses the database (another action kind, no outbox).
    pub clock: Option<ClockStatus>,
    /// What is wrong, one sentence each; empty when healthy.
    pub problems: Vec<String>,
    /// No problems: `status` exits 0.
    pub healthy: bool,
}

/// One level of the ladder.
#[derive(Debug, Clone, Serialize)]
pub struct LevelStatus {
    /// Its number: it holds a message `2^level` seconds.
    pub level: u8,
    /// Its queue.
    pub queue: String,
    /// Its TTL.
    pub ttl_ms: u64,
    /// Messages in it; `None` when the queue does not exist.
    pub messages: Option<u32>,
}

/// The due queue.
#[derive(Debug, Clone, Serialize)]
pub struct DueStatus {
    /// Its name.
    pub queue: String,
    /// Whether it exists.
    pub exists: bool,
    /// Messages ready for a consumer.
    pub ready: Option<u32>,
    /// Always `None`: AMQP does not report unacked messages.
    pub unacked: Option<u32>,
    /// Consumers (each `serve` is one).
    pub consumers: Option<u32>,
}

/// The parked queue.
#[derive(Debug, Clone, Serialize)]
pub struct ParkedStatus {
    /// Its name.
    pub queue: String,
    /// Messages in it; `None` when it does not exist.
    pub messages: Option<u32>,
    /// When its oldest message was parked (`x-parked-at`, else the message's
    /// timestamp).
    pub oldest_parked_at: Option<DateTime<Utc>>,
    /// How long ago that was.
    pub oldest_age_ms: Option<i64>,
}

/// The outbox table.
#[derive(Debug, Clone, Serialize)]
pub struct OutboxStatus {
    /// Rows waiting for the relay.
    pub pending: Option<i64>,
    /// Age of the oldest row.
    pub oldest_age_ms: Option<i64>,
    /// Why the numbers are missing (no table, database down).
    pub error: Option<String>,
}

/// Unpaid orders whose `pay_deadline` passed, from the default `orders` table.
#[derive(Debug, Clone, Serialize)]
pub struct OrdersStatus {
    /// All of them.
    pub overdue_unpaid: Option<i64>,
    /// Those more than `margin_ms` past: a problem.
    pub beyond_margin: Option<i64>,
    /// `status --margin`.
    pub margin_ms: u64,
    /// How far past its deadline the most overdue one is.
    pub most_overdue_ms: Option<i64>,
    /// Unpaid orders not yet due, by when they fall due, from the orders
    /// table (the broker can only count messages).
    pub upcoming: Option<Upcoming>,
    /// Why the numbers are missing (another action kind, no table, database down).
    pub error: Option<String>,
}

/// This host's clock against the order database's, the clock "never early"
/// is judged by. `serve` measures and corrects its own offset (the gauge
/// `order_expiry_clock_offset_seconds`); this is the offset of the host that
/// ran `status`, a hint that the hosts' clocks drift.
#[derive(Debug, Clone, Serialize)]
pub struct ClockStatus {
    /// The database's clock minus this host's, in ms (positive: this host is
    /// behind).
    pub offset_ms: Option<f64>,
    /// The offset is within this of `offset_ms` (half the best round trip).
    pub error_ms: Option<f64>,
    /// `clock.warn_offset_ms`: an offset beyond it is flagged.
    pub warn_offset_ms: u64,
    /// Why the numbers are missing (database down).
    pub error: Option<String>,
}

/// Unpaid orders with a deadline still ahead, by when it comes.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Upcoming {
    /// Within the next minute.
    pub next_minute: i64,
    /// Within the next hour (the minute's included).
    pub next_hour: i64,
    /// Within the next day (the hour's included).
    pub next_day: i64,
    /// All of them.
    pub all: i64,
}

impl Status {
    /// Looks at the broker and the database of `settings`. Overdue orders more
    /// than `margin` past their deadline make it unhealthy. Fails only when the
    /// broker cannot be reached; a database failure is reported inside.
    pub async fn collect(settings: &Settings, margin: Duration) -> Result<Self, OpsError> {
        let ladder = settings.ladder()?;
        let mut resume = Resume::new("status").through(&settings.amqp.url);
        let (levels, due, parked) = loop {
            let looked = async {
                let mut admin = Admin::open(settings, "order-expiry status").await?;
                resume.connected();
                let broker = broker_part(&mut admin, &ladder).await;
                admin.close().await;
                broker
            };
            match looked.await {
                Ok(broker) => break broker,
                Err(error) => resume.after(error).await?,
            }
        };
        let outbox = match settings.outbox.enabled {
            true => Some(outbox_part(settings).await),
            false => None,
        };
        let orders = orders_part(settings, margin).await;
        let uses_database = settings.action.kind == ActionKind::Sql || settings.outbox.enabled;
        let clock = match uses_database {
            true => Some(clock_part(settings).await),
            false => None,
        };
        let mut status = Self {
            v: STATUS_VERSION,
            checked_at: Utc::now(),
            prefix: ladder.prefix().to_owned(),
            ladder_messages: levels
                .iter()
                .map(|l| u64::from(l.messages.unwrap_or(0)))
                .sum(),
            orders_per_message_max: settings.publisher.bundle_max_orders.max(1),
            levels,
            due,
            parked,
            outbox,
            orders,
            clock,
            problems: Vec::new(),
            healthy: true,
        };
        status.problems = status.problems_found();
        status.healthy = status.problems.is_empty();
        Ok(status)
    }

    /// What makes the system unhealthy: a missing queue, no consumer on the
    /// due queue, orders overdue beyond the margin, a database that did not
    /// answer.
    fn problems_found(&self) -> Vec<String> {
        let mut problems = Vec::new();
        let missing: Vec<&str> = self
            .levels
            .iter()
            .filter(|l| l.messages.is_none())
            .map(|l| l.queue.as_str())
            .collect();
        if let (Some(first), Some(last)) = (missing.first(), missing.last()) {
            let which = match missing.len() {
                1 => (*first).to_owned(),
                n => format!("{n}, {last} to {first}"),
            };
            problems.push(format!(
                "ladder queues missing: {which} (order-expiry topology apply)"
            ));
        }
        if !self.due.exists {
            problems.push(format!(
                "due queue {} is missing (order-expiry topology apply, or start serve)",
                self.due.queue
            ));
        } else if self.due.consumers == Some(0) {
            problems.push(format!(
                "no consumer on {}: is order-expiry serve running?",
                self.due.queue
            ));
        }
        if let Some(n) = self.orders.beyond_margin.filter(|n| *n > 0) {
            problems.push(format!(
                "{n} unpaid orders more than {} past their deadline",
                human_ms(self.orders.margin_ms as i64)
            ));
        }
        if let Some(error) = &self.orders.error
            && self.orders.overdue_unpaid.is_none()
            && !error.starts_with("not checked")
        {
            problems.push(format!("overdue orders unknown: {error}"));
        }
        problems
    }
}

async fn broker_part(
    admin: &mut Admin,
    ladder: &Ladder,
) -> Result<(Vec<LevelStatus>, DueStatus, ParkedStatus), OpsError> {
    let mut levels = Vec::with_capacity(usize::from(ladder.levels()));
    for level in (0..ladder.levels()).rev() {
        let queue = ladder.level_name(level);
        let state = admin.queue(&queue).await?;
        levels.push(LevelStatus {
            level,
            queue,
            ttl_ms: Ladder::level_ttl_ms(level),
            messages: state.map(|s| s.messages),
        });
    }
    let due_queue = ladder.due_queue();
    let state = admin.queue(&due_queue).await?;
    let due = DueStatus {
        queue: due_queue,
        exists: state.is_some(),
        ready: state.map(|s| s.messages),
        unacked: None,
        consumers: state.map(|s| s.consumers),
    };
    let parked_queue = ladder.parked_queue();
    let messages = admin.queue(&parked_queue).await?.map(|s| s.messages);
    let oldest_parked_at = match messages {
        Some(n) if n > 0 => oldest_parked_at(admin, &parked_queue).await?,
        _ => None,
    };
    let parked = ParkedStatus {
        queue: parked_queue,
        messages,
        oldest_parked_at,
        oldest_age_ms: oldest_parked_at.map(|at| (Utc::now() - at).num_milliseconds()),
    };
    Ok((levels, due, parked))
}

/// The parked time of the queue's head: read unacked on a channel of its
/// own, through a consumer ([`Sweep`]), and returned to the queue when that
/// channel closes.
async fn oldest_parked_at(
    admin: &mut Admin,
    queue: &str,
) -> Result<Option<DateTime<Utc>>, OpsError> {
    let channel = admin.own_channel().await?;
    let head = Sweep::new(admin, &channel, queue, 1, None).next().await;
    let _ = amqp::bounded(
        "channel.close",
        admin.timeout,
        channel.close(200, "peeked".into()),
    )
    .await;
    Ok(head?.and_then(|delivery| super::parked_at(&delivery.properties)))
}

/// Three timed readings of the database's clock; the best one's offset.
async fn clock_part(settings: &Settings) -> ClockStatus {
    let warn_offset_ms = u64::try_from(settings.clock.warn_offset.as_millis()).unwrap_or(u64::MAX);
    let read = async {
        let store = PgOrderStore::new(settings).map_err(|e| e.to_string())?;
        let mut estimate = OffsetEstimate::new(Duration::from_secs(60));
        let mut found = None;
        for _ in 0..3 {
            let (reference, sent, round_trip) =
                store.read_clock().await.map_err(|e| e.to_string())?;
            let (lo, hi) = reading_bounds(reference, sent, round_trip, TimeDelta::zero());
            found = Some(estimate.observe(std::time::Instant::now(), lo, hi));
        }
        found.ok_or_else(|| "no reading".to_owned())
    };
    let timeout = settings.database.query_timeout;
    let read = match tokio::time::timeout(timeout, read).await {
        Ok(read) => read,
        Err(_) => Err(format!("no answer from the database within {timeout:?}")),
    };
    let ms = |d: TimeDelta| d.num_microseconds().unwrap_or(0) as f64 / 1e3;
    match read {
        Ok(offset) => ClockStatus {
            offset_ms: Some(ms(offset.offset)),
            error_ms: Some(ms(offset.error)),
            warn_offset_ms,
            error: None,
        },
        Err(error) => ClockStatus {
            offset_ms: None,
            error_ms: None,
            warn_offset_ms,
            error: Some(error),
        },
    }
}

async fn outbox_part(settings: &Settings) -> OutboxStatus {
    let query = "SELECT count(*), (extract(epoch FROM now() - min(created_at)) * 1000)::int8 \
                 FROM order_expiry_outbox";
    match query_row(settings, query, &[]).await {
        Ok(row) => OutboxStatus {
            pending: row.first().copied().flatten(),
            oldest_age_ms: row.get(1).copied().flatten(),
            error: None,
        },
        Err(error) => OutboxStatus {
            pending: None,
            oldest_age_ms: None,
            error: Some(error),
        },
    }
}

async fn orders_part(settings: &Settings, margin: Duration) -> OrdersStatus {
    let margin_ms = u64::try_from(margin.as_millis()).unwrap_or(u64::MAX);
    let mut orders = OrdersStatus {
        overdue_unpaid: None,
        beyond_margin: None,
        margin_ms,
        most_overdue_ms: None,
        upcoming: None,
        error: None,
    };
    if settings.action.kind != ActionKind::Sql {
        orders.error = Some(format!(
            "not checked: action.kind is {:?}, the orders are not in this database",
            settings.action.kind
        ));
        return orders;
    }
    let query = "SELECT count(*), \
                 count(*) FILTER (WHERE pay_deadline < now() - make_interval(secs => $1)), \
                 (extract(epoch FROM now() - min(pay_deadline)) * 1000)::int8 \
                 FROM orders WHERE status = 'unpaid' AND pay_deadline < now()";
    let margin_secs = margin.as_secs_f64();
    match query_row(settings, query, &[&margin_secs]).await {
        Ok(row) => {
            orders.overdue_unpaid = row.first().copied().flatten();
            orders.beyond_margin = row.get(1).copied().flatten();
            orders.most_overdue_ms = row.get(2).copied().flatten();
        }
        Err(error) => {
            orders.error = Some(error);
            return orders;
        }
    }
    // Reads the partial index of unpaid orders by deadline.
    let upcoming = "SELECT \
                    count(*) FILTER (WHERE pay_deadline <= now() + interval '1 minute'), \
                    count(*) FILTER (WHERE pay_deadline <= now() + interval '1 hour'), \
                    count(*) FILTER (WHERE pay_deadline <= now() + interval '1 day'), \
                    count(*) \
                    FROM orders WHERE status = 'unpaid' AND pay_deadline >= now()";
    match query_row(settings, upcoming, &[]).await {
        Ok(row) => {
            let n = |i: usize| row.get(i).copied().flatten().unwrap_or(0);
            orders.upcoming = Some(Upcoming {
                next_minute: n(0),
                next_hour: n(1),
                next_day: n(2),
                all: n(3),
            });
        }
        Err(error) => orders.error = Some(error),
    }
    orders
}

/// One row of int8 columns, bounded by `database.query_timeout_ms`; the error
/// as text (it goes into the status).
async fn query_row(
    settings: &Settings,
    query: &str,
    params: &[&(dyn tokio_postgres::types::ToSql + Sync)],
) -> Result<Vec<Option<i64>>, String> {
    let timeout = settings.database.query_timeout;
    let run = async {
        let store = PgOrderStore::new(settings).map_err(|e| e.to_string())?;
        let client = store.client().await.map_err(|e| e.to_string())?;
        let row = client
            .query_one(query, params)
            .await
            .map_err(|e| match e.as_db_error() {
                Some(db) => db.message().to_owned(),
                None => e.to_string(),
            })?;
        (0..row.len())
            .map(|i| row.try_get::<_, Option<i64>>(i).map_err(|e| e.to_string()))
            .collect()
    };
    match tokio::time::timeout(timeout, run).await {
        Ok(result) => result,
        Err(_) => Err(format!("no answer from the database within {timeout:?}")),
    }
}

/// A duration for people: its two largest units (`24d 6h`, `1m 4s`, `32s`),
/// milliseconds below one second.
pub(crate) fn human_ms(ms: i64) -> String {
    if ms.abs() < 1000 {
        return format!("{ms}ms");
    }
    let sign = if ms < 0 { "-" } else { "" };
    let secs = ms.unsigned_abs() / 1000;
    let units = [
        (secs / 86_400, "d"),
        (secs / 3_600 % 24, "h"),
        (secs / 60 % 60, "m"),
        (secs % 60, "s"),
    ];
    let first = units.iter().position(|(n, _)| *n > 0).unwrap_or(3);
    let shown: Vec<String> = units[first..(first + 2).min(4)]
        .iter()
        .filter(|(n, _)| *n > 0)
        .map(|(n, unit)| format!("{n}{unit}"))
        .collect();
    format!("{sign}{}", shown.join(" "))
}

fn or_dash<T: fmt::Display>(value: Option<T>) -> String {
    value.map_or_else(|| "-".to_owned(), |v| v.to_string())
}

impl fmt::Display for Status {
    /// The text table of `order-expiry status`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let at = self.checked_at.to_rfc3339_opts(SecondsFormat::Secs, true);
        writeln!(f, "order-expiry status of prefix {} at {at}", self.prefix)?;
        let carry = match self.orders_per_message_max {
            1 => String::new(),
            n => format!(", up to {n} orders each"),
        };
        writeln!(
            f,
            "ladder   {} levels, {} messages waiting{carry}",
            self.levels.len(),
            self.ladder_messages
        )?;
        writeln!(
            f,
            "         {:<6} {:<12} {:>10}",
            "level", "ttl", "messages"
        )?;
        for l in &self.levels {
            let ttl = human_ms(i64::try_from(l.ttl_ms).unwrap_or(i64::MAX));
            let messages = l.messages.map_or("missing".to_owned(), |n| n.to_string());
            let level = format!("{:02}", l.level);
            writeln!(f, "         {level:<6} {ttl:<12} {messages:>10}")?;
        }
        match self.due.exists {
            true => writeln!(
                f,
                "due      {}: {} ready, unacked not visible over AMQP, {} consumers",
                self.due.queue,
                or_dash(self.due.ready),
                or_dash(self.due.consumers)
            )?,
            false => writeln!(f, "due      {}: missing", self.due.queue)?,
        }
        match (self.parked.messages, self.parked.oldest_age_ms) {
            (None, _) => writeln!(f, "parked   {}: missing", self.parked.queue)?,
            (Some(n), Some(age)) => writeln!(
                f,
                "parked   {}: {n} messages, oldest parked {} ago",
                self.parked.queue,
                human_ms(age)
            )?,
            (Some(n), None) => writeln!(f, "parked   {}: {n} messages", self.parked.queue)?,
        }
        match &self.outbox {
            None => writeln!(f, "outbox   relay disabled (outbox.enabled = false)")?,
            Some(OutboxStatus { error: Some(e), .. }) => writeln!(f, "outbox   unknown: {e}")?,
            Some(o) => writeln!(
                f,
                "outbox   {} rows pending{}",
                or_dash(o.pending),
                o.oldest_age_ms
                    .map(|ms| format!(", oldest {} old", human_ms(ms)))
                    .unwrap_or_default()
            )?,
        }
        let margin = human_ms(i64::try_from(self.orders.margin_ms).unwrap_or(i64::MAX));
        match (&self.orders.error, self.orders.overdue_unpaid) {
            (Some(e), None) => writeln!(f, "orders   overdue unknown: {e}")?,
            (_, n) => writeln!(
                f,
                "orders   {} unpaid past their deadline, {} of them more than {margin}{}",
                or_dash(n),
                or_dash(self.orders.beyond_margin),
                self.orders
                    .most_overdue_ms
                    .map(|ms| format!("; most overdue by {}", human_ms(ms)))
                    .unwrap_or_default()
            )?,
        }
        if let Some(u) = self.orders.upcoming {
            writeln!(
                f,
                "         {} unpaid due ahead: {} within a minute, {} within an hour, {} within a day",
                u.all, u.next_minute, u.next_hour, u.next_day
            )?;
        }
        match &self.clock {
            None => {}
            Some(ClockStatus {
                offset_ms: Some(offset),
                error_ms,
                warn_offset_ms,
                ..
            }) => {
                let side = if *offset > 0.0 { "behind" } else { "ahead of" };
                let flag = match offset.abs() > *warn_offset_ms as f64 {
                    true => format!(
                        " (more than clock.warn_offset_ms, {warn_offset_ms} ms: check this host's \
                         time sync, and serve's order_expiry_clock_offset_seconds)"
                    ),
                    false => String::new(),
                };
                writeln!(
                    f,
                    "clock    this host is {:.1} ms {side} the database (±{:.1} ms){flag}",
                    offset.abs(),
                    error_ms.unwrap_or(0.0)
                )?
            }
            Some(ClockStatus { error, .. }) => writeln!(
                f,
                "clock    unknown: {}",
                error.as_deref().unwrap_or("no reading")
            )?,
        }
        match self.problems.is_empty() {
            true => write!(f, "health   ok"),
            false => write!(f, "health   UNHEALTHY: {}", self.problems.join("; ")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_show_their_two_largest_units() {
        assert_eq!(human_ms(250), "250ms");
        assert_eq!(human_ms(32_000), "32s");
        assert_eq!(human_ms(64_000), "1m 4s");
        assert_eq!(human_ms(3_600_000), "1h");
        assert_eq!(human_ms(2_097_152_000), "24d 6h");
        assert_eq!(human_ms(-90_000), "-1m 30s");
    }
}
