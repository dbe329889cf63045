//! What one round's publish results mean for their rows. Pure.

use chrono::{DateTime, Utc};

use crate::publisher::{ExpiryMessage, OrderId, ScheduleError, Scheduled, TraceContext};

/// One locked row of `order_expiry_outbox`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct OutboxRow {
    pub(crate) id: i64,
    pub(crate) order_id: String,
    pub(crate) due_at: DateTime<Utc>,
    pub(crate) created_at: DateTime<Utc>,
    /// The W3C context the order service inserted with it, if any.
    pub(crate) traceparent: Option<String>,
    pub(crate) tracestate: Option<String>,
}

impl OutboxRow {
    /// The message the row asks for, with its trace context (an invalid one
    /// is dropped: the order goes on untraced).
    pub(crate) fn message(&self) -> Result<ExpiryMessage, ScheduleError> {
        let order_id = OrderId::new(self.order_id.as_str())?;
        let trace =
            TraceContext::from_wire(self.traceparent.as_deref(), self.tracestate.as_deref());
        Ok(ExpiryMessage::new(order_id, self.due_at).with_trace(trace))
    }
}

/// What happens to a row after its publish.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum RowFate {
    /// Confirmed by the broker: delete the row.
    Published,
    /// It can never be published: move it to `order_expiry_outbox_rejected`
    /// with this reason.
    Rejected(String),
    /// Not published this time (broker down, nack, unroutable, timeout): keep
    /// the row; a later round publishes it.
    Retry,
}

/// The fate of a row after one publish result. Only what no retry can change rejects a
/// row: its order id, or a due time beyond the ladder (time only shortens the
/// delay, but not by the days a ladder's end is away).
pub(crate) fn fate(result: &Result<Scheduled, ScheduleError>) -> RowFate {
    match result {
        Ok(_) => RowFate::Published,
        Err(e @ (ScheduleError::InvalidOrderId(_) | ScheduleError::DelayTooLong(_))) => {
            RowFate::Rejected(e.to_string())
        }
        Err(_) => RowFate::Retry,
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::publisher::OrderId;
    use crate::topology::{DelayTooLong, Ladder};

    #[test]
    fn only_what_no_retry_changes_is_rejected() {
        let route = Ladder::new("p", 3).unwrap().route(1).unwrap();
        let ok = Ok(Scheduled {
            message_id: "m".into(),
            due_at: Utc::now(),
            route,
            orders_in_message: 1,
        });
        assert_eq!(fate(&ok), RowFate::Published);

        let invalid = OrderId::new("").unwrap_err();
        let rejected = fate(&Err(ScheduleError::InvalidOrderId(invalid)));
        assert!(matches!(rejected, RowFate::Rejected(r) if r.starts_with("invalid order id")));
        let too_long = DelayTooLong {
            delay_secs: 100,
            max_secs: 7,
        };
        let rejected = fate(&Err(ScheduleError::DelayTooLong(too_long)));
        assert!(matches!(rejected, RowFate::Rejected(r) if r.contains("100")));

        for transient in [
            ScheduleError::Nacked {
                order_id: "o".into(),
            },
            ScheduleError::Unroutable {
                order_id: "o".into(),
                exchange: "p.ladder.00".into(),
                reply_code: 312,
                reply_text: "NO_ROUTE".into(),
            },
            ScheduleError::Timeout(Duration::from_secs(1)),
        ] {
            assert_eq!(fate(&Err(transient)), RowFate::Retry);
        }
    }
}
