//! The event action: an `order.expired` event for event-driven order services,
//! published persistent and `mandatory` to `action.amqp.exchange` with
//! `action.amqp.routing_key`, on a connection of its own with publisher
//! confirms. The due message is acked only after the event's confirm.
//!
//! Body: `{"order_id", "due_at", "expired_at", "message_id"}`, content type
//! `application/json`; properties `type = order.expired` and `message_id` =
//! the idempotency key of the deadline (`order-expiry:<id>:<due_at>`), the same
//! for every redelivery, so subscribers can drop duplicates; headers
//! `traceparent` (and `tracestate`) when the order has a trace context.
//!
//! An event the exchange routes nowhere, or that the broker nacks, is retried
//! alone with backoff (and logged): nothing is acked before someone could have
//! received it. A missing exchange closes the channel: the batch waits, intake
//! pauses and the link is re-opened. order-expiry declares nothing here: the
//! exchange and its bindings belong to the services that consume the events.

use chrono::{SecondsFormat, Utc};
use futures::future::join_all;
use lapin::BasicProperties;
use serde_json::json;

use super::{Action, ActionAnswer, ActionError, Expiring, idempotency_key};
use crate::amqp::{self, BrokerError, ConfirmLink, Confirmed, TlsFiles};
use crate::publisher::trace_headers;
use crate::service::rate::Pace;
use crate::settings::Settings;

/// The `order.expired` event publisher; see the module docs.
pub struct EventAction {
    link: ConfirmLink,
    exchange: String,
    routing_key: String,
    /// `action.amqp.max_rps`.
    pace: Pace,
}

impl std::fmt::Debug for EventAction {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EventAction")
            .field("exchange", &self.exchange)
            .field("routing_key", &self.routing_key)
            .finish_non_exhaustive()
    }
}

impl EventAction {
    /// Events to `action.amqp` on the broker of `amqp.url`; connects on first use.
    pub fn new(settings: &Settings) -> Self {
        let tls = TlsFiles::from_settings(&settings.amqp);
        Self {
            link: ConfirmLink::new(
                settings.amqp.url.clone(),
                tls,
                "order-expiry events",
                settings.amqp.timeout,
            ),
            exchange: settings.action.amqp.exchange.clone(),
            routing_key: settings.action.amqp.routing_key.clone(),
            pace: Pace::new(settings.action.amqp.max_rps),
        }
    }

    /// Closes its connection.
    pub async fn close(&self) {
        self.link.close().await;
    }
}

/// The event for one due message.
fn event(due: Expiring<'_>) -> (Vec<u8>, BasicProperties) {
    let message = due.message;
    let millis = |at: chrono::DateTime<Utc>| at.to_rfc3339_opts(SecondsFormat::Millis, true);
    let body = json!({
        "order_id": message.order_id.as_str(),
        "due_at": millis(message.due_at),
        "expired_at": millis(Utc::now()),
        "message_id": due.message_id,
    });
    let mut properties = BasicProperties::default()
        .with_content_type("application/json".into())
        .with_delivery_mode(2)
        .with_type("order.expired".into())
        .with_message_id(idempotency_key(message).as_str().into())
        .with_timestamp(u64::try_from(Utc::now().timestamp()).unwrap_or(0));
    if let Some(trace) = due.trace {
        properties = properties.with_headers(trace_headers(trace));
    }
    (body.to_string().into_bytes(), properties)
}

impl Action for EventAction {
    async fn expire(&self, due: &[Expiring<'_>]) -> Result<Vec<ActionAnswer>, ActionError> {
        let (channel, link_id) = self
            .link
            .channel()
            .await
            .map_err(|e| ActionError::Unavailable(format!("order.expired events: {e}")))?;
        // Pipelined: every event published (at most action.amqp.max_rps a
        // second), then every confirm awaited.
        let publishes = due.iter().map(|d| {
            let channel = &channel;
            async move {
                self.pace.ready().await;
                let (body, properties) = event(*d);
                let publishing =
                    channel.publish(&self.exchange, &self.routing_key, body, properties);
                amqp::bounded("order.expired confirm", self.link.timeout, publishing).await
            }
        });
        let answers = join_all(publishes).await;
        if let Some(Err(error)) = answers.iter().find(|a| a.is_err()) {
            let timed_out = matches!(error, BrokerError::Timeout { .. });
            self.link.forget(&channel, link_id, timed_out).await;
        }
        if let Some(Err(error)) = answers.first()
            && answers.iter().all(Result::is_err)
        {
            return Err(ActionError::Unavailable(format!(
                "order.expired to exchange {:?}: {error}",
                self.exchange
            )));
        }
        Ok(answers
            .into_iter()
            .map(|answer| self.verdict(answer))
            .collect())
    }
}

impl EventAction {
    fn verdict(&self, answer: Result<Confirmed, BrokerError>) -> ActionAnswer {
        let exchange = &self.exchange;
        match answer {
            Ok(Confirmed::Taken) => ActionAnswer::Cancelled,
            Ok(Confirmed::Returned {
                reply_code,
                reply_text,
            }) => ActionAnswer::Retry(format!(
                "order.expired event unroutable: exchange {exchange:?} routed it to no queue \
                 with key {:?} ({reply_code} {reply_text}); bind a queue to it",
                self.routing_key
            )),
            Ok(Confirmed::Nacked) => ActionAnswer::Retry(format!(
                "order.expired event nacked by the broker (exchange {exchange:?})"
            )),
            Err(error) => ActionAnswer::Retry(format!("order.expired event: {error}")),
        }
    }
}
