//! Operator tooling, feature `service`: what `order-expiry status`, `parked`
//! and `ladder migrate` do, over AMQP and SQL only (no management plugin).
//!
//! - `admin`: one bounded admin connection: passive queue declares that
//!   survive a missing queue, a confirm-mode channel.
//! - `status`: [`Status`]: the ladder, due, parked, outbox and overdue orders
//!   in one look; its text and its stable JSON.
//! - `parked`: [`Parked`]: list, replay and purge `P.parked`.
//! - `ladder_migrate`: [`LadderMigration`]: an old ladder's messages (on this
//!   broker or another) into the current one, while both are in use.
//! - `drain`: one old queue consumed with a window of publisher confirms.
//! - `republish`: one message into the current ladder for its remaining
//!   delay, confirmed, then the original acked.
//! - `sweep`: a queue read through a consumer, what is left held unacked
//!   (parked list and replay, status).

mod admin;
mod drain;
mod ladder_migrate;
mod parked;
mod republish;
mod status;
mod sweep;

pub use self::admin::{OpsError, QueueState};
pub use self::ladder_migrate::{LadderMigration, LadderMigrationRefused, LadderMigrationReport};
pub use self::parked::{Parked, ParkedMessage, ReplayReport, ReplaySelection};
pub use self::status::{
    ClockStatus, DueStatus, LevelStatus, OrdersStatus, OutboxStatus, ParkedStatus, STATUS_VERSION,
    Status, Upcoming,
};

use chrono::{DateTime, Utc};
use lapin::BasicProperties;
use lapin::types::AMQPValue;

/// When a parked message was parked: its `x-parked-at` header (RFC 3339), else
/// its `timestamp` property.
pub(crate) fn parked_at(properties: &BasicProperties) -> Option<DateTime<Utc>> {
    let header = properties
        .headers()
        .as_ref()
        .and_then(|h| h.inner().get("x-parked-at").cloned());
    let from_header = match header {
        Some(AMQPValue::LongString(s)) => DateTime::parse_from_rfc3339(&s.to_string()).ok(),
        _ => None,
    };
    from_header.map(|at| at.with_timezone(&Utc)).or_else(|| {
        properties
            .timestamp()
            .and_then(|t| DateTime::from_timestamp(i64::try_from(t).ok()?, 0))
    })
}
