//! What to do with a delivery the moment it arrives: cancel it now, hold it
//! until its `due_at`, or park it. Pure: no I/O.

use std::time::Duration;

use chrono::{DateTime, Utc};

use crate::publisher::ExpiryMessage;
use crate::settings::ConsumerSettings;

/// The decision for one delivery.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Arrival {
    /// Due now: cancel.
    Due(ExpiryMessage),
    /// Early by the given time: hold unacked until `due_at`.
    Hold(ExpiryMessage, Duration),
    /// Never processable: park with this reason (the `x-parked-reason`).
    Park(String),
}

/// Decides what to do with a body that arrived at `now`: due at
/// [`ExpiryMessage::process_at`] (`due_at`, or a later `not_before`).
pub fn on_arrival(
    body: &[u8],
    content_type: Option<&str>,
    now: DateTime<Utc>,
    settings: &ConsumerSettings,
) -> Arrival {
    let message = match ExpiryMessage::decode(body, content_type, settings.max_body_bytes) {
        Ok(m) => m,
        Err(e) => return Arrival::Park(e.to_string()),
    };
    // A message sent through the ladder again is due at its `not_before`.
    let early = (message.process_at() - now)
        .to_std()
        .unwrap_or(Duration::ZERO);
    if early.is_zero() {
        Arrival::Due(message)
    } else if early <= settings.max_hold {
        Arrival::Hold(message, early)
    } else {
        Arrival::Park(format!(
            "arrived {:.3} s before due_at, more than consumer.max_hold_ms ({} ms): it did not come through the ladder",
            early.as_secs_f64(),
            settings.max_hold.as_millis()
        ))
    }
}

#[cfg(test)]
mod tests {
    use chrono::TimeDelta;

    use super::*;
    use crate::Settings;
    use crate::publisher::OrderId;

    fn consumer_settings() -> ConsumerSettings {
        Settings::default().consumer
    }

    fn message(due_at: DateTime<Utc>) -> ExpiryMessage {
        ExpiryMessage::new(OrderId::new("o-1").unwrap(), due_at)
    }

    #[test]
    fn a_due_message_is_due() {
        let now = Utc::now();
        let body = message(now - TimeDelta::milliseconds(5)).encode();
        assert!(matches!(
            on_arrival(&body, None, now, &consumer_settings()),
            Arrival::Due(_)
        ));
    }

    #[test]
    fn an_early_message_is_held_for_exactly_the_time_left() {
        let now = Utc::now();
        let expected = message(now + TimeDelta::milliseconds(700));
        match on_arrival(&expected.encode(), None, now, &consumer_settings()) {
            Arrival::Hold(m, early) => {
                assert_eq!(m, expected);
                assert_eq!(early, (expected.due_at - now).to_std().unwrap());
            }
            other => panic!("expected Hold, got {other:?}"),
        }
    }

    #[test]
    fn a_message_far_too_early_is_parked_not_held_forever() {
        let now = Utc::now();
        let body = message(now + TimeDelta::hours(1)).encode();
        match on_arrival(&body, None, now, &consumer_settings()) {
            Arrival::Park(reason) => assert!(reason.contains("before due_at"), "{reason}"),
            other => panic!("expected Park, got {other:?}"),
        }
    }

    #[test]
    fn malformed_bodies_are_parked_with_the_decoder_reason() {
        match on_arrival(b"{}", None, Utc::now(), &consumer_settings()) {
            Arrival::Park(reason) => assert_eq!(reason, "missing field \"v\""),
            other => panic!("expected Park, got {other:?}"),
        }
    }
}
