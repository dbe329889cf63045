//! What the consumer publishes itself, on its confirm-mode channel, before it
//! acks a delivery: a parked copy (a message that can never be processed, with
//! its reason, to `P.parked`) or the message sent through the ladder again (the
//! next payment check step; an order not found yet). The delivery is acked only
//! once the broker confirmed the copy: nothing is dropped silently.

use std::sync::Arc;
use std::time::Duration;

use chrono::Utc;
use futures::FutureExt;
use futures::future::BoxFuture;
use lapin::BasicProperties;
use lapin::message::Delivery;
use lapin::options::BasicAckOptions;
use lapin::types::{AMQPValue, FieldTable};
use thiserror::Error;
use tracing::{Instrument, debug, info, warn};

use super::session::SessionError;
use super::work::{Done, Failed, Pending, delivery_span, record};
use super::{Handled, Observer, Outcome};
use crate::amqp::{self, BrokerError, Confirmed, Confirms};
use crate::clock::Clock;
use crate::publisher::{ExpiryMessage, Outgoing};
use crate::service::CONSUMER;
use crate::telemetry::{MESSAGES_TOTAL, PARKED_TOTAL};
use crate::topology::Ladder;

/// The broker did not take the copy: the delivery stays unacked and the
/// publish is retried after a backoff.
#[derive(Debug, Error)]
pub(super) enum OutboundError {
    #[error("exchange {exchange} did not route it ({reply_code} {reply_text})")]
    Unroutable {
        exchange: String,
        reply_code: u16,
        reply_text: String,
    },
    #[error("the broker nacked it")]
    Nacked,
    #[error("no confirm within {0:?}")]
    Timeout(Duration),
}

/// What to publish for a delivery before acking it.
#[derive(Debug, Clone)]
pub(super) enum Republish {
    /// A copy to `P.parked` with this `x-parked-reason`.
    Park(String),
    /// This message through the ladder, counted with this outcome once acked.
    Requeue(Box<ExpiryMessage>, Outcome),
}

/// The delivery a copy is made for: a whole message, or one order of a v2
/// bundle.
#[derive(Clone)]
pub(super) struct Original {
    pub(super) delivery: Arc<Delivery>,
    /// For one order of a bundle, the body of its own parked copy: its v1
    /// message, or (an order that breaks the v1 rules) a bundle of its entry
    /// alone. The copy settles that order; the bundle is acked once all are.
    pub(super) part: Option<Arc<[u8]>>,
}

impl Original {
    /// A whole delivery.
    pub(super) fn whole(delivery: Arc<Delivery>) -> Self {
        Self {
            delivery,
            part: None,
        }
    }
}

/// The session's confirm-mode channel and where things go.
#[derive(Clone)]
pub(super) struct Outbound {
    /// The confirm-mode channel.
    pub(super) confirms: Confirms,
    pub(super) parked_exchange: String,
    pub(super) ladder: Ladder,
    /// `publisher.lead_ms`: a message sent through the ladder again arrives up
    /// to this much (plus its sub-second remainder) early, and is held.
    pub(super) lead: Duration,
    pub(super) timeout: Duration,
    pub(super) observer: Option<Observer>,
    /// The reference clock: a message's delay through the ladder again is
    /// measured by it.
    pub(super) clock: Clock,
}

impl Outbound {
    /// Copies `original` to the parked exchange with `reason`, then acks it
    /// (a whole delivery) or settles its order (one order of a bundle).
    pub(super) fn park(&self, original: Original, reason: String) -> BoxFuture<'static, Done> {
        let span = delivery_span(&original.delivery, None);
        self.send(original, Republish::Park(reason), span)
    }

    /// Sends `message` through the ladder, then acks `pending`'s delivery.
    pub(super) fn requeue(
        &self,
        pending: Pending,
        message: ExpiryMessage,
        outcome: Outcome,
    ) -> BoxFuture<'static, Done> {
        let what = Republish::Requeue(Box::new(message), outcome);
        self.send(pending.original(), what, pending.span)
    }

    /// Publishes what `what` says for `original`, confirmed, then acks or settles it.
    pub(super) fn send(
        &self,
        original: Original,
        what: Republish,
        span: tracing::Span,
    ) -> BoxFuture<'static, Done> {
        let outbound = self.clone();
        async move {
            let delivery = &original.delivery;
            let published = match &what {
                Republish::Park(reason) => {
                    let body: &[u8] = original.part.as_deref().unwrap_or(&delivery.data);
                    warn!(target: CONSUMER, reason = %reason, size = body.len(),
                        bundled = original.part.is_some(), "parking message");
                    outbound.publish_parked(delivery, body, reason).await
                }
                Republish::Requeue(message, _) => {
                    match outbound.publish_again(delivery, message).await {
                        Ok(published) => published,
                        Err(too_long) => {
                            // Validated at start-up: only a clock far off gets here.
                            let reason =
                                format!("cannot send it through the ladder again: {too_long}");
                            return outbound
                                .send(original, Republish::Park(reason), tracing::Span::current())
                                .await;
                        }
                    }
                }
            };
            match published {
                Ok(()) => outbound.acked(original, what).await,
                Err(Publish::Refused(error)) => Done::Failed(Failed::Republish {
                    original,
                    what,
                    error,
                }),
                Err(Publish::Broken(error)) => Done::BrokerFailed(error),
            }
        }
        .instrument(span)
        .boxed()
    }

    async fn publish_parked(
        &self,
        delivery: &Delivery,
        body: &[u8],
        reason: &str,
    ) -> Result<(), Publish> {
        let exchange = self.parked_exchange.as_str();
        let properties = parked_properties(delivery, reason);
        let publishing = self
            .confirms
            .publish(exchange, "", body.to_vec(), properties);
        let answer = amqp::bounded(
            "publishing to the parked exchange",
            self.timeout,
            publishing,
        );
        confirmed(answer.await, exchange)
    }

    /// Publishes `message` into the ladder; `Err` if its delay is beyond the ladder.
    async fn publish_again(
        &self,
        delivery: &Delivery,
        message: &ExpiryMessage,
    ) -> Result<Result<(), Publish>, crate::topology::DelayTooLong> {
        let message_id = match delivery.properties.message_id() {
            Some(id) => id.to_string(),
            None => uuid::Uuid::new_v4().to_string(),
        };
        let now = self.clock.now();
        let outgoing = Outgoing::new(message, &self.ladder, self.lead, &message_id, now)?;
        let answer = amqp::bounded(
            "publishing into the ladder",
            self.timeout,
            outgoing.publish(&self.confirms),
        );
        Ok(confirmed(answer.await, &outgoing.route.exchange))
    }

    /// The copy is confirmed: count it, ack the original (or settle its
    /// order of a bundle), tell the observer.
    async fn acked(&self, original: Original, what: Republish) -> Done {
        let delivery = &original.delivery;
        let (order_id, outcome, not_before) = match &what {
            Republish::Park(_) => {
                metrics::counter!(MESSAGES_TOTAL.name, "outcome" => Outcome::Parked.label())
                    .increment(1);
                metrics::counter!(PARKED_TOTAL.name).increment(1);
                tracing::Span::current().record("outcome", Outcome::Parked.label());
                debug!(target: CONSUMER, "handled");
                (None, Outcome::Parked, None)
            }
            Republish::Requeue(message, outcome) => {
                record(message, *outcome, self.clock.now());
                tracing::Span::current().record("outcome", outcome.label());
                info!(target: CONSUMER, not_before = ?message.not_before,
                    check_step = message.check_step, unknown_rechecks = message.unknown_rechecks,
                    "sent through the ladder again");
                (Some(message.order_id.clone()), *outcome, message.not_before)
            }
        };
        let handled = self.observer.is_some().then(|| Handled {
            order_id,
            outcome,
            at: Utc::now(),
            not_before,
        });
        if original.part.is_some() {
            return Done::PartMovedOut {
                tag: delivery.delivery_tag,
                handled,
            };
        }
        match delivery.acker.ack(BasicAckOptions::default()).await {
            Ok(true) => {}
            Ok(false) => return Done::BrokerFailed(SessionError::AckNotSent),
            Err(e) => return Done::BrokerFailed(SessionError::Ack(e)),
        }
        if let (Some(observer), Some(handled)) = (&self.observer, handled) {
            let _ = observer.send(Handled {
                at: Utc::now(),
                ..handled
            });
        }
        Done::Republished(delivery.delivery_tag)
    }
}

/// Why a publish did not go through.
enum Publish {
    /// The broker answered but did not take it: retry later.
    Refused(OutboundError),
    /// The channel failed: the session ends.
    Broken(SessionError),
}

/// What the broker's answer to a mandatory, confirmed publish means.
fn confirmed(answer: Result<Confirmed, BrokerError>, exchange: &str) -> Result<(), Publish> {
    match answer {
        Ok(Confirmed::Taken) => Ok(()),
        Ok(Confirmed::Returned {
            reply_code,
            reply_text,
        }) => Err(Publish::Refused(OutboundError::Unroutable {
            exchange: exchange.to_owned(),
            reply_code,
            reply_text,
        })),
        Ok(Confirmed::Nacked) => Err(Publish::Refused(OutboundError::Nacked)),
        Err(BrokerError::Timeout { timeout, .. }) => {
            Err(Publish::Refused(OutboundError::Timeout(timeout)))
        }
        Err(error) => Err(Publish::Broken(SessionError::Broker(error))),
    }
}

/// The original's headers and properties, plus why and when it was parked and
/// the routing key it came with.
fn parked_properties(delivery: &Delivery, reason: &str) -> BasicProperties {
    let mut headers: FieldTable = delivery.properties.headers().clone().unwrap_or_default();
    let text = |s: &str| AMQPValue::LongString(s.into());
    headers.insert("x-parked-reason".into(), text(reason));
    headers.insert("x-parked-at".into(), text(&Utc::now().to_rfc3339()));
    headers.insert(
        "x-original-routing-key".into(),
        text(delivery.routing_key.as_str()),
    );
    let mut properties = BasicProperties::default()
        .with_delivery_mode(2)
        .with_headers(headers);
    if let Some(ct) = delivery.properties.content_type() {
        properties = properties.with_content_type(ct.clone());
    }
    if let Some(id) = delivery.properties.message_id() {
        properties = properties.with_message_id(id.clone());
    }
    properties
}
