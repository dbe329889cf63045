//! Moving one message into the current ladder: its remaining delay from its
//! `due_at` (never from a routing key it came with), no headers but each
//! order's W3C trace context (stale `x-death` entries make RabbitMQ drop a
//! message as a dead-letter cycle), a confirmed publish, and only then the ack of the original. Interrupted
//! between the two, the original comes back: a duplicate, never a loss.

use std::time::Duration;

use chrono::Utc;
use lapin::message::Delivery;
use lapin::options::BasicAckOptions;

use super::admin::OpsError;
use crate::amqp::{self, Confirmed, Confirms};
use crate::publisher::{DueMessage, ExpiryMessage, Outgoing, received_trace};
use crate::topology::{Ladder, Route};

/// Where moved messages go, on a confirm-mode channel.
pub(crate) struct Republisher {
    pub(crate) confirm: Confirms,
    pub(crate) ladder: Ladder,
    /// A v1 message's lead (`publisher.lead_ms`)...
    pub(crate) lead: Duration,
    /// ...and a bundle's (`publisher.bundle_lead_ms`), as the publisher's.
    pub(crate) bundle_lead: Duration,
    pub(crate) max_body_bytes: usize,
    pub(crate) timeout: Duration,
}

impl Republisher {
    /// Decodes a message's body as the consumer would: its orders (one for v1,
    /// every order of a v2 bundle). A message that is not one, or a bundle
    /// with an order that breaks the v1 rules, is left alone with the reason
    /// (the caller decides).
    pub(crate) fn decode(&self, delivery: &Delivery) -> Result<Vec<ExpiryMessage>, String> {
        let content_type = delivery.properties.content_type().as_ref();
        let decoded = DueMessage::decode_traced(
            &delivery.data,
            content_type.map(|c| c.as_str()),
            self.max_body_bytes,
            received_trace(&delivery.properties),
        );
        match decoded.map_err(|e| e.to_string())? {
            DueMessage::One(message) => Ok(vec![message]),
            DueMessage::Bundle(entries) => entries
                .into_iter()
                .map(|e| e.map_err(|bad| bad.to_string()))
                .collect(),
        }
    }

    /// Publishes `messages` (one, or a bundle's orders, as one message again)
    /// afresh into the current ladder ([`Republisher::outgoing`]), waits for
    /// the confirm, then acks `delivery`.
    pub(crate) async fn move_one(
        &self,
        delivery: &Delivery,
        messages: &[ExpiryMessage],
    ) -> Result<Route, OpsError> {
        let (outgoing, what) = self.outgoing(delivery, messages)?;
        let publishing = outgoing.publish(&self.confirm);
        let confirmation = amqp::bounded("publisher confirm", self.timeout, publishing).await?;
        taken(&confirmation, &outgoing.route.exchange, &what)?;
        ack(delivery, self.timeout).await?;
        Ok(outgoing.route)
    }

    /// `messages` (from `delivery`) afresh (their payment-check and recheck
    /// counters reset, their trace contexts kept), routed into the current ladder for the time left
    /// until the earliest `due_at`, or into the due exchange when that
    /// passed; with a name for them in errors. Keeps `delivery`'s
    /// `message_id`.
    pub(crate) fn outgoing(
        &self,
        delivery: &Delivery,
        messages: &[ExpiryMessage],
    ) -> Result<(Outgoing, String), OpsError> {
        let fresh: Vec<ExpiryMessage> = messages
            .iter()
            .map(|m| ExpiryMessage::new(m.order_id.clone(), m.due_at).with_trace(m.trace.clone()))
            .collect();
        let Some((first, rest)) = fresh.split_first() else {
            return Err(OpsError::NotTaken {
                what: "a message".to_owned(),
                reason: "it carries no order".to_owned(),
            });
        };
        let message_id = delivery
            .properties
            .message_id()
            .as_ref()
            .map_or_else(|| uuid::Uuid::new_v4().to_string(), |id| id.to_string());
        let what = match rest.len() {
            0 => format!("order {}", first.order_id.as_str()),
            n => format!("a bundle of order {} and {n} more", first.order_id.as_str()),
        };
        let now = Utc::now();
        let lead = if rest.is_empty() {
            self.lead
        } else {
            self.bundle_lead
        };
        match Outgoing::for_orders(first, rest, &self.ladder, lead, &message_id, now) {
            Ok(outgoing) => Ok((outgoing, what)),
            Err(e) => Err(OpsError::NotTaken {
                what,
                reason: e.to_string(),
            }),
        }
    }
}

/// What the broker's answer to the publish of `what` to `exchange` means:
/// only a plain ack is taken (a returned message was unroutable).
pub(crate) fn taken(confirmed: &Confirmed, exchange: &str, what: &str) -> Result<(), OpsError> {
    match confirmed {
        Confirmed::Taken => Ok(()),
        Confirmed::Returned {
            reply_code,
            reply_text,
        } => Err(OpsError::NotTaken {
            what: what.to_owned(),
            reason: format!(
                "unroutable via {exchange} ({reply_code} {reply_text}); is the topology applied?"
            ),
        }),
        Confirmed::Nacked => Err(OpsError::NotTaken {
            what: what.to_owned(),
            reason: "nacked".to_owned(),
        }),
    }
}

/// Acks a delivery; an ack the channel did not take is an error.
pub(crate) async fn ack(delivery: &Delivery, timeout: Duration) -> Result<(), OpsError> {
    let acking = delivery.acker.ack(BasicAckOptions::default());
    match amqp::bounded("basic.ack", timeout, acking).await? {
        true => Ok(()),
        false => Err(OpsError::AckRefused),
    }
}
