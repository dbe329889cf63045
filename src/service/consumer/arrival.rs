//! What to do with a delivery the moment it arrives: cancel it now, hold it
//! until its `due_at`, or park it; for a v2 bundle, that for each of its
//! orders. Pure: no I/O. Each order keeps the trace context it came with
//! (the message's trace headers, or its own bundle entry's).

use std::time::Duration;

use chrono::{DateTime, Utc};

use crate::publisher::{BadEntry, DueMessage, ExpiryMessage, OrderId, TraceHeaders, encode_entry};
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
    /// A v2 bundle: each order decided on its own, in body order.
    Bundle(Vec<BundlePart>),
}

/// The decision for one order of a bundle.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BundlePart {
    /// Due now: cancel.
    Due(ExpiryMessage),
    /// Early by the given time: hold until `due_at` (the bundle stays unacked).
    Hold(ExpiryMessage, Duration),
    /// Never processable: parked (with the delivery's other parked orders,
    /// in one copy).
    Park {
        /// Its entry's JSON, as its bundle carried it (or, for an order that
        /// decoded, as it encodes in a message without trace headers: its
        /// context in its own fields).
        entry: Vec<u8>,
        /// Its order, when the entry decoded.
        order_id: Option<OrderId>,
        /// Why.
        reason: String,
    },
}

/// Decides what to do with a body that arrived at `now` with these trace
/// headers: due at [`ExpiryMessage::process_at`] (`due_at`, or a later
/// `not_before`).
pub fn on_arrival(
    body: &[u8],
    content_type: Option<&str>,
    trace: TraceHeaders<'_>,
    now: DateTime<Utc>,
    settings: &ConsumerSettings,
) -> Arrival {
    match DueMessage::decode_traced(body, content_type, settings.max_body_bytes, trace) {
        Ok(DueMessage::One(message)) => match one(message, now, settings) {
            BundlePart::Due(message) => Arrival::Due(message),
            BundlePart::Hold(message, early) => Arrival::Hold(message, early),
            BundlePart::Park { reason, .. } => Arrival::Park(reason),
        },
        Ok(DueMessage::Bundle(entries)) => Arrival::Bundle(
            entries
                .into_iter()
                .map(|entry| match entry {
                    Ok(message) => one(message, now, settings),
                    Err(bad) => parked(&bad),
                })
                .collect(),
        ),
        Err(e) => Arrival::Park(e.to_string()),
    }
}

fn parked(bad: &BadEntry) -> BundlePart {
    BundlePart::Park {
        entry: bad.raw.clone().into_bytes(),
        order_id: None,
        reason: bad.to_string(),
    }
}

/// The decision for one order, by the v1 rules; one far too early is parked
/// with its own v1 body.
fn one(message: ExpiryMessage, now: DateTime<Utc>, settings: &ConsumerSettings) -> BundlePart {
    // A message sent through the ladder again is due at its `not_before`.
    let early = (message.process_at() - now)
        .to_std()
        .unwrap_or(Duration::ZERO);
    if early.is_zero() {
        BundlePart::Due(message)
    } else if early <= settings.max_hold {
        BundlePart::Hold(message, early)
    } else {
        BundlePart::Park {
            entry: encode_entry(&message, None),
            order_id: Some(message.order_id.clone()),
            reason: format!(
                "arrived {:.3} s before due_at, more than consumer.max_hold_ms ({} ms): it did not come through the ladder",
                early.as_secs_f64(),
                settings.max_hold.as_millis()
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use chrono::TimeDelta;

    use super::*;
    use crate::Settings;
    use crate::publisher::{OrderId, encode_bundle};

    fn message(due_at: DateTime<Utc>) -> ExpiryMessage {
        ExpiryMessage::new(OrderId::new("o-1").unwrap(), due_at)
    }

    fn arrive(body: &[u8], now: DateTime<Utc>) -> Arrival {
        on_arrival(
            body,
            None,
            TraceHeaders::NONE,
            now,
            &Settings::default().consumer,
        )
    }

    fn parked(arrival: Arrival) -> String {
        match arrival {
            Arrival::Park(reason) => reason,
            other => panic!("expected Park, got {other:?}"),
        }
    }

    #[test]
    fn a_due_message_is_due_and_an_early_one_is_held_for_exactly_the_time_left() {
        let now = Utc::now();
        let body = message(now - TimeDelta::milliseconds(5)).encode();
        assert!(matches!(arrive(&body, now), Arrival::Due(_)));
        let expected = message(now + TimeDelta::milliseconds(700));
        let Arrival::Hold(m, early) = arrive(&expected.encode(), now) else {
            panic!("expected Hold")
        };
        assert_eq!(m, expected);
        assert_eq!(early, (expected.due_at - now).to_std().unwrap());
    }

    /// A message far too early is not held forever.
    #[test]
    fn a_message_far_too_early_or_malformed_is_parked_with_its_reason() {
        let now = Utc::now();
        let reason = parked(arrive(&message(now + TimeDelta::hours(1)).encode(), now));
        assert!(reason.contains("before due_at"), "{reason}");
        assert_eq!(parked(arrive(b"{}", now)), "missing field \"v\"");
    }

    #[test]
    fn each_order_of_a_bundle_is_decided_on_its_own() {
        let now = Utc::now();
        let due = message(now - TimeDelta::milliseconds(5));
        let early = message(now + TimeDelta::milliseconds(700));
        let far = message(now + TimeDelta::hours(1));
        let entries = [&due, &early, &far].map(|m| encode_entry(m, None));
        let malformed: &[u8] = br#"{"order_id":"x"}"#;
        let body = encode_bundle(entries.iter().map(Vec::as_slice).chain([malformed]));
        let Arrival::Bundle(parts) = arrive(&body, now) else {
            panic!("a bundle")
        };
        assert!(matches!(&parts[0], BundlePart::Due(m) if *m == due));
        assert!(matches!(&parts[1], BundlePart::Hold(m, _) if *m == early));
        assert!(
            matches!(&parts[2], BundlePart::Park { entry, order_id: Some(_), reason }
            if reason.contains("before due_at") && *entry == encode_entry(&far, None))
        );
        assert!(
            matches!(&parts[3], BundlePart::Park { entry, order_id: None, reason }
            if reason.starts_with("order 3 of the bundle")
                && entry.as_slice() == br#"{"order_id":"x"}"#)
        );
    }
}
