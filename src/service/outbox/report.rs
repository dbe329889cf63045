//! What a committed round reports: the lag of each published row, the
//! failures and rejections (counted and logged), and every row to an observer.

use chrono::{DateTime, Utc};
use tokio::sync::mpsc::UnboundedSender;
use tracing::warn;

use super::RELAY;
use super::round::OutboxRow;
use crate::telemetry::{OUTBOX_LAG_SECONDS, OUTBOX_PUBLISH_FAILURES_TOTAL, OUTBOX_REJECTED_TOTAL};

/// One row the relay is done with, as reported to an observer
/// ([`Relay::observe`](super::Relay::observe)) after its round committed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Relayed {
    /// The row's `id`.
    pub outbox_id: i64,
    /// Its `order_id`.
    pub order_id: String,
    /// Its `due_at`.
    pub due_at: DateTime<Utc>,
    /// Its `created_at`: the start of the transaction that inserted it.
    pub created_at: DateTime<Utc>,
    /// When the round that relayed it locked it: from its commit until then
    /// it waited for a round, after it for the round's publish and commit.
    pub locked_at: DateTime<Utc>,
    /// When the broker confirmed its message; `None` for a rejected row.
    pub confirmed_at: Option<DateTime<Utc>>,
    /// Why it can never be published, for a rejected row.
    pub rejected: Option<String>,
}

/// Metrics, logs and the observer, once a round committed.
pub(super) fn report(
    observer: Option<&UnboundedSender<Relayed>>,
    locked_at: DateTime<Utc>,
    published: &[(&OutboxRow, DateTime<Utc>)],
    rejected: &[(&OutboxRow, String)],
    failed: usize,
) {
    metrics::counter!(OUTBOX_PUBLISH_FAILURES_TOTAL.name).increment(failed as u64);
    metrics::counter!(OUTBOX_REJECTED_TOTAL.name).increment(rejected.len() as u64);
    let lag = metrics::histogram!(OUTBOX_LAG_SECONDS.name);
    for (row, confirmed_at) in published {
        let seconds = (*confirmed_at - row.created_at)
            .num_microseconds()
            .unwrap_or(0);
        lag.record(seconds.max(0) as f64 / 1e6);
    }
    for (row, reason) in rejected {
        warn!(target: RELAY, outbox_id = row.id, order_id = %row.order_id.escape_debug(),
            %reason, "outbox row can never be published: moved to order_expiry_outbox_rejected");
    }
    let Some(observer) = observer else {
        return;
    };
    let relayed = |row: &OutboxRow, confirmed_at, rejected| Relayed {
        outbox_id: row.id,
        order_id: row.order_id.clone(),
        due_at: row.due_at,
        created_at: row.created_at,
        locked_at,
        confirmed_at,
        rejected,
    };
    for (row, at) in published {
        let _ = observer.send(relayed(row, Some(*at), None));
    }
    for (row, reason) in rejected {
        let _ = observer.send(relayed(row, None, Some(reason.clone())));
    }
}
