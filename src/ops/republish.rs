//! Moving one message into the current ladder: its remaining delay from its
//! `due_at` (never from a routing key it came with), no headers (stale
//! `x-death` entries make RabbitMQ drop a message as a dead-letter cycle), a
//! confirmed publish, and only then the ack of the original. Interrupted
//! between the two, the original comes back: a duplicate, never a loss.

use std::time::Duration;

use chrono::Utc;
use lapin::message::BasicGetMessage;
use lapin::options::BasicAckOptions;
use lapin::{Channel, Confirmation};

use super::admin::OpsError;
use crate::amqp;
use crate::publisher::{ExpiryMessage, Malformed, Outgoing};
use crate::topology::{Ladder, Route};

/// Where moved messages go, on a confirm-mode channel.
pub(crate) struct Republisher {
    pub(crate) confirm: Channel,
    pub(crate) ladder: Ladder,
    pub(crate) lead: Duration,
    pub(crate) max_body_bytes: usize,
    pub(crate) timeout: Duration,
}

impl Republisher {
    /// Decodes `got`'s body as the consumer would; a message that is not one
    /// is left alone (the caller decides).
    pub(crate) fn decode(&self, got: &BasicGetMessage) -> Result<ExpiryMessage, Malformed> {
        let content_type = got.delivery.properties.content_type().as_ref();
        ExpiryMessage::decode(
            &got.delivery.data,
            content_type.map(|c| c.as_str()),
            self.max_body_bytes,
        )
    }

    /// Publishes `message` afresh (its payment-check and recheck counters
    /// reset) into the current ladder for the time left until its `due_at`,
    /// or into the due exchange when that passed; then acks `got`.
    pub(crate) async fn move_one(
        &self,
        got: &BasicGetMessage,
        message: &ExpiryMessage,
    ) -> Result<Route, OpsError> {
        let fresh = ExpiryMessage::new(message.order_id.clone(), message.due_at);
        let message_id = got
            .delivery
            .properties
            .message_id()
            .as_ref()
            .map_or_else(|| uuid::Uuid::new_v4().to_string(), |id| id.to_string());
        let what = || format!("order {}", message.order_id.as_str());
        let outgoing = Outgoing::new(&fresh, &self.ladder, self.lead, &message_id, Utc::now())
            .map_err(|e| OpsError::NotTaken {
                what: what(),
                reason: e.to_string(),
            })?;
        let publishing = outgoing.publish(&self.confirm);
        let confirmation = amqp::bounded("publisher confirm", self.timeout, publishing).await?;
        match confirmation {
            Confirmation::Ack(None) => {}
            Confirmation::Ack(Some(returned)) => {
                return Err(OpsError::NotTaken {
                    what: what(),
                    reason: format!(
                        "unroutable via {} ({} {}); is the topology applied?",
                        outgoing.route.exchange, returned.reply_code, returned.reply_text
                    ),
                });
            }
            Confirmation::Nack(_) | Confirmation::NotRequested => {
                return Err(OpsError::NotTaken {
                    what: what(),
                    reason: "nacked".to_owned(),
                });
            }
        }
        ack(got, self.timeout).await?;
        Ok(outgoing.route)
    }
}

/// Acks a fetched message; an ack the channel did not take is an error.
pub(crate) async fn ack(got: &BasicGetMessage, timeout: Duration) -> Result<(), OpsError> {
    let acking = got.delivery.acker.ack(BasicAckOptions::default());
    match amqp::bounded("basic.ack", timeout, acking).await? {
        true => Ok(()),
        false => Err(OpsError::AckRefused),
    }
}
