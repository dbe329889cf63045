//! Parking: a message that can never be processed is copied, with its reason,
//! to `P.parked` and acked only once the broker confirmed the copy. Nothing is
//! dropped silently.

use std::time::Duration;

use chrono::Utc;
use futures::FutureExt;
use futures::future::BoxFuture;
use lapin::message::Delivery;
use lapin::options::{BasicAckOptions, BasicPublishOptions};
use lapin::types::{AMQPValue, FieldTable};
use lapin::{BasicProperties, Channel, Confirmation};
use thiserror::Error;
use tracing::{Instrument, debug, warn};

use super::session::SessionError;
use super::work::{Done, Failed, delivery_span};
use super::{Handled, Observer, Outcome};
use crate::amqp::{self, BrokerError};
use crate::service::CONSUMER;
use crate::telemetry::{MESSAGES_TOTAL, PARKED_TOTAL};

/// The broker did not take the parked copy: the delivery stays unacked and the
/// park is retried after a backoff.
#[derive(Debug, Error)]
pub(super) enum ParkError {
    #[error("parked exchange {exchange} did not route ({reply_code} {reply_text})")]
    Unroutable {
        exchange: String,
        reply_code: u16,
        reply_text: String,
    },
    #[error("broker nacked the parked copy")]
    Nacked,
    #[error("no confirm within {0:?}")]
    Timeout(Duration),
}

/// Where parked copies go, and who hears about them.
#[derive(Clone)]
pub(super) struct Parking {
    /// In confirm mode.
    pub(super) channel: Channel,
    pub(super) exchange: String,
    pub(super) timeout: Duration,
    pub(super) observer: Option<Observer>,
}

impl Parking {
    /// Copies `delivery` to the parked exchange with `reason`, then acks it.
    pub(super) fn park(&self, delivery: Delivery, reason: String) -> BoxFuture<'static, Done> {
        let span = delivery_span(&delivery, None);
        let parking = self.clone();
        async move {
            warn!(target: CONSUMER, reason = %reason, size = delivery.data.len(), "parking message");
            match parking.publish(&delivery, &reason).await {
                Ok(()) => parking.parked(delivery).await,
                Err(Publish::Refused(error)) => Done::Failed(Failed::Park {
                    delivery: Box::new(delivery),
                    reason,
                    error,
                }),
                Err(Publish::Broken(error)) => Done::BrokerFailed(error),
            }
        }
        .instrument(span)
        .boxed()
    }

    async fn publish(&self, delivery: &Delivery, reason: &str) -> Result<(), Publish> {
        let options = BasicPublishOptions {
            mandatory: true,
            ..BasicPublishOptions::default()
        };
        let publishing = async {
            let exchange = self.exchange.as_str().into();
            let properties = parked_properties(delivery, reason);
            self.channel
                .basic_publish(exchange, "".into(), options, &delivery.data, properties)
                .await?
                .await
        };
        match amqp::bounded(
            "publishing to the parked exchange",
            self.timeout,
            publishing,
        )
        .await
        {
            Ok(Confirmation::Ack(None)) => Ok(()),
            Ok(Confirmation::Ack(Some(returned))) => Err(Publish::Refused(ParkError::Unroutable {
                exchange: self.exchange.clone(),
                reply_code: returned.reply_code,
                reply_text: returned.reply_text.to_string(),
            })),
            Ok(_) => Err(Publish::Refused(ParkError::Nacked)),
            Err(BrokerError::Timeout { timeout, .. }) => {
                Err(Publish::Refused(ParkError::Timeout(timeout)))
            }
            Err(error) => Err(Publish::Broken(SessionError::Broker(error))),
        }
    }

    /// The copy is confirmed: count it, ack the original, tell the observer.
    async fn parked(&self, delivery: Delivery) -> Done {
        metrics::counter!(MESSAGES_TOTAL.name, "outcome" => Outcome::Parked.label()).increment(1);
        metrics::counter!(PARKED_TOTAL.name).increment(1);
        tracing::Span::current().record("outcome", Outcome::Parked.label());
        debug!(target: CONSUMER, "handled");
        match delivery.acker.ack(BasicAckOptions::default()).await {
            Ok(true) => {}
            Ok(false) => return Done::BrokerFailed(SessionError::AckNotSent),
            Err(e) => return Done::BrokerFailed(SessionError::Ack(e)),
        }
        if let Some(observer) = &self.observer {
            let _ = observer.send(Handled {
                order_id: None,
                outcome: Outcome::Parked,
                at: Utc::now(),
            });
        }
        Done::Parked(delivery.delivery_tag)
    }
}

/// Why a park publish did not go through.
enum Publish {
    /// The broker answered but did not take the copy: retry later.
    Refused(ParkError),
    /// The channel failed: the session ends.
    Broken(SessionError),
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
