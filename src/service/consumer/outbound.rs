//! What the consumer publishes itself, on its confirm-mode channel, before it
//! acks a delivery: the leftovers of its pass ([`MoveOut`]). One parked copy
//! for every order of it that can never be processed (with the reason, to
//! `P.parked`), and the orders to look at again later sent through the
//! ladder, as few messages as their routes allow (the next payment check
//! step, an order not found yet, an order the action kept failing for). The
//! delivery is acked only once the broker confirmed every copy: nothing is
//! dropped silently, and a crash before the ack repeats the pass, not more.
//!
//! Every order keeps its W3C trace context: a message sent through the
//! ladder again carries it as its own (`Outgoing::for_orders`); a parked copy
//! of the whole delivery keeps the delivery's headers, and a copy of some of
//! its orders carries no trace header and each order's context in its own
//! entry (an entry that did not decode keeps only what its JSON held).

use std::sync::Arc;
use std::time::Duration;

use chrono::Utc;
use futures::FutureExt;
use futures::future::{BoxFuture, join_all};
use lapin::BasicProperties;
use lapin::message::Delivery;
use lapin::options::BasicAckOptions;
use lapin::types::{AMQPValue, FieldTable};
use thiserror::Error;
use tracing::{Instrument, info, warn};

use super::pass::{Leftovers, ParkedOrder, parked_reason};
use super::session::SessionError;
use super::work::{Done, Failed, record};
use super::{Handled, Observer, Outcome};
use crate::amqp::{self, BrokerError, Confirmed, Confirms};
use crate::clock::Clock;
use crate::publisher::{
    ExpiryMessage, OrderId, Outgoing, TraceContext, encode_bundle, encode_entry, remaining_route,
    trace_headers,
};
use crate::service::CONSUMER;
use crate::telemetry::{MESSAGES_TOTAL, PARKED_TOTAL};
use crate::topology::Ladder;

/// The longest `x-parked-reason` a parked copy of many orders gets.
const REASON_MAX: usize = 1024;

/// The bytes of a bundle around its entries, with room for a field or two.
const ENVELOPE: usize = 32;

/// `,"traceparent":""`: what an untraced order costs in a bundle whose
/// headers carry another order's context.
const NO_TRACE_FIELD: usize = 17;

/// The broker did not take a copy: the delivery stays unacked and the
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

impl OutboundError {
    /// Whether it was the parked exchange that routed nothing (someone
    /// deleted `P.parked` or its binding).
    pub(super) fn unroutable_at(&self, exchange: &str) -> bool {
        matches!(self, Self::Unroutable { exchange: e, .. } if e == exchange)
    }
}

/// A delivery's leftovers, to be confirmed before it is acked; what is not
/// confirmed yet stays here and is published again.
pub(super) struct MoveOut {
    delivery: Arc<Delivery>,
    /// The one parked copy: its body, reason, and the orders in it.
    parked: Option<ParkedCopy>,
    /// Orders to look at again from their `not_before`.
    again: Vec<(ExpiryMessage, Outcome)>,
    /// What the observer is told after the ack.
    handled: Vec<Handled>,
}

struct ParkedCopy {
    body: Vec<u8>,
    /// The trace headers it carries: the delivery's, for the body as it came.
    trace: ParkedTrace,
    reason: String,
    /// The ids of the parked orders that decoded; `None` for one that did not.
    orders: Vec<Option<OrderId>>,
}

/// The trace headers of a parked copy.
enum ParkedTrace {
    /// The delivery's (its body as it came).
    Delivered,
    /// These instead (a body written here).
    Set(Option<TraceContext>),
}

impl ParkedCopy {
    /// A copy of decoded orders, all parked for `reason`: a v1 message for
    /// one, a bundle for more; the headers carry the first one's context.
    fn of(messages: &[ExpiryMessage], reason: &str) -> Self {
        let trace = messages.first().and_then(|m| m.trace.clone());
        let body = match messages {
            [one] => one.encode(),
            many => {
                let entries: Vec<Vec<u8>> = many
                    .iter()
                    .map(|m| encode_entry(m, trace.as_ref()))
                    .collect();
                encode_bundle(entries.iter().map(Vec::as_slice))
            }
        };
        Self {
            body,
            trace: ParkedTrace::Set(trace),
            reason: reason.to_owned(),
            orders: messages.iter().map(|m| Some(m.order_id.clone())).collect(),
        }
    }
}

impl MoveOut {
    /// The leftovers of `delivery`, a delivery of `orders` orders, and what
    /// the observer is told of its settled ones.
    pub(super) fn new(
        delivery: Arc<Delivery>,
        orders: usize,
        leftovers: Leftovers,
        handled: Vec<Handled>,
    ) -> Self {
        let Leftovers { parked, again } = leftovers;
        let parked = (!parked.is_empty()).then(|| {
            let reason = parked_reason(&parked, orders, REASON_MAX);
            // All of it, or a part of it that does not decode: the body as it
            // came; else a bundle of the parked entries alone.
            let whole =
                parked.len() >= orders || parked.iter().any(|(p, _)| *p == ParkedOrder::Whole);
            // Some of it: its entries hold their own contexts (written for a
            // message without trace headers by arrival.rs and finished.rs),
            // and the delivery's headers, another order's, are not copied.
            let trace = match whole {
                true => ParkedTrace::Delivered,
                false => ParkedTrace::Set(None),
            };
            let body = match whole {
                true => delivery.data.clone(),
                false => encode_bundle(parked.iter().filter_map(|(p, _)| match p {
                    ParkedOrder::Entry { json, .. } => Some(json.as_slice()),
                    ParkedOrder::Whole => None,
                })),
            };
            let orders = parked
                .into_iter()
                .map(|(p, _)| match p {
                    ParkedOrder::Entry { order_id, .. } => order_id,
                    ParkedOrder::Whole => None,
                })
                .collect();
            ParkedCopy {
                body,
                trace,
                reason,
                orders,
            }
        });
        Self {
            delivery,
            parked,
            again,
            handled,
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
    /// `consumer.max_body_bytes`: no message sent through the ladder again is
    /// larger (a consumer would park it).
    pub(super) max_body_bytes: usize,
    pub(super) timeout: Duration,
    pub(super) observer: Option<Observer>,
    /// The reference clock: a message's delay through the ladder again is
    /// measured by it.
    pub(super) clock: Clock,
}

/// One message of a move-out, and what it carries.
enum Piece {
    Parked(ParkedCopy),
    Again(Vec<(ExpiryMessage, Outcome)>),
}

impl Outbound {
    /// Publishes what `move_out` holds, confirmed, then acks its delivery
    /// singly; what the broker does not take stays for a retry.
    pub(super) fn move_out(&self, move_out: MoveOut) -> BoxFuture<'static, Done> {
        let outbound = self.clone();
        // Exported as what it does (its orders' own spans have ended).
        let span = tracing::info_span!(
            target: CONSUMER,
            "delivery",
            redelivered = move_out.delivery.redelivered,
            otel.name = "publish leftovers",
            otel.kind = "producer",
        );
        async move { outbound.publish_all(move_out).await }
            .instrument(span)
            .boxed()
    }

    async fn publish_all(&self, move_out: MoveOut) -> Done {
        let MoveOut {
            delivery,
            parked,
            again,
            mut handled,
        } = move_out;
        let (groups, too_long) = self.group(again);
        let mut pieces: Vec<Piece> = parked.into_iter().map(Piece::Parked).collect();
        if !too_long.is_empty() {
            // Validated at start-up: only a clock far off gets here.
            let reason = "cannot send it through the ladder again: its delay is beyond the \
                          ladder's longest (is this host's clock far off?)";
            pieces.push(Piece::Parked(ParkedCopy::of(&too_long, reason)));
        }
        pieces.extend(groups.into_iter().map(Piece::Again));
        let message_id = match delivery.properties.message_id() {
            Some(id) => id.to_string(),
            None => uuid::Uuid::new_v4().to_string(),
        };
        let publishing = pieces.into_iter().enumerate().map(|(i, piece)| {
            // One id per message of the move-out: the confirms match a
            // return to its publish by id, exchange and routing key.
            let id = match i {
                0 => message_id.clone(),
                n => format!("{message_id}.{n}"),
            };
            let delivery = &delivery;
            async move {
                let answer = self.publish(delivery, &piece, &id).await;
                (piece, answer)
            }
        });
        let mut left = MoveOut {
            delivery: Arc::clone(&delivery),
            parked: None,
            again: Vec::new(),
            handled: Vec::new(),
        };
        let mut failure: Option<Publish> = None;
        for (piece, answer) in join_all(publishing).await {
            match (piece, answer) {
                (piece, Ok(())) => self.confirmed(piece, &mut handled),
                (Piece::Parked(copy), Err(error)) => {
                    left.parked = Some(copy);
                    failure.get_or_insert(error);
                }
                (Piece::Again(orders), Err(error)) => {
                    left.again.extend(orders);
                    failure.get_or_insert(error);
                }
            }
        }
        match failure {
            None => {}
            Some(Publish::Broken(error)) => return Done::BrokerFailed(error),
            Some(Publish::Refused(error)) => {
                left.handled = handled;
                return Done::Failed(Failed::MoveOut {
                    move_out: left,
                    error,
                });
            }
        }
        match delivery.acker.ack(BasicAckOptions::default()).await {
            Ok(true) => {}
            Ok(false) => return Done::BrokerFailed(SessionError::AckNotSent),
            Err(e) => return Done::BrokerFailed(SessionError::Ack(e)),
        }
        if let Some(observer) = &self.observer {
            let at = Utc::now();
            for report in handled {
                let _ = observer.send(Handled { at, ..report });
            }
        }
        Done::MovedOut(delivery.delivery_tag)
    }

    /// The orders to send through the ladder again, as messages: those that
    /// take the same route now share one, up to `consumer.max_body_bytes`;
    /// and those whose delay is beyond the ladder.
    #[allow(clippy::type_complexity)]
    fn group(
        &self,
        again: Vec<(ExpiryMessage, Outcome)>,
    ) -> (Vec<Vec<(ExpiryMessage, Outcome)>>, Vec<ExpiryMessage>) {
        let now = self.clock.now();
        let mut groups: Vec<(u64, usize, Vec<(ExpiryMessage, Outcome)>)> = Vec::new();
        let mut too_long = Vec::new();
        for (message, outcome) in again {
            let Ok(route) = remaining_route(&message, &self.ladder, self.lead, now) else {
                too_long.push(message);
                continue;
            };
            // At most this much, whatever context the first order has.
            let untraced = if message.trace.is_none() {
                NO_TRACE_FIELD
            } else {
                0
            };
            let size = encode_entry(&message, None).len() + untraced + 1;
            let room = |bytes: usize| bytes + size <= self.max_body_bytes;
            match groups
                .iter_mut()
                .find(|(delay, bytes, _)| *delay == route.delay_secs && room(*bytes))
            {
                Some((_, bytes, orders)) => {
                    *bytes += size;
                    orders.push((message, outcome));
                }
                None => groups.push((route.delay_secs, ENVELOPE + size, vec![(message, outcome)])),
            }
        }
        let groups = groups.into_iter().map(|(_, _, orders)| orders).collect();
        (groups, too_long)
    }

    /// Publishes one piece, confirmed.
    async fn publish(&self, delivery: &Delivery, piece: &Piece, id: &str) -> Result<(), Publish> {
        match piece {
            Piece::Parked(copy) => {
                warn!(target: CONSUMER, reason = %copy.reason, orders = copy.orders.len(),
                    size = copy.body.len(), "parking");
                let exchange = self.parked_exchange.as_str();
                let properties = parked_properties(delivery, copy, id);
                let publishing = self
                    .confirms
                    .publish(exchange, "", copy.body.clone(), properties);
                let answer = amqp::bounded(
                    "publishing to the parked exchange",
                    self.timeout,
                    publishing,
                );
                confirmed(answer.await, exchange)
            }
            Piece::Again(orders) => {
                let now = self.clock.now();
                let messages: Vec<ExpiryMessage> = orders.iter().map(|(m, _)| m.clone()).collect();
                let Some((first, rest)) = messages.split_first() else {
                    return Ok(());
                };
                // Grouped by a route computed a moment ago: routed again
                // now, by the earliest of them.
                let Ok(outgoing) =
                    Outgoing::for_orders(first, rest, &self.ladder, self.lead, id, now)
                else {
                    return Err(Publish::Refused(OutboundError::Nacked));
                };
                let answer = amqp::bounded(
                    "publishing into the ladder",
                    self.timeout,
                    outgoing.publish(&self.confirms),
                );
                confirmed(answer.await, &outgoing.route.exchange)
            }
        }
    }

    /// A piece was confirmed: count it and log it; the observer hears of its
    /// orders after the ack.
    fn confirmed(&self, piece: Piece, handled: &mut Vec<Handled>) {
        let observed = self.observer.is_some();
        let at = Utc::now();
        match piece {
            Piece::Parked(copy) => {
                metrics::counter!(PARKED_TOTAL.name).increment(1);
                let parked = copy.orders.len() as u64;
                metrics::counter!(MESSAGES_TOTAL.name, "outcome" => Outcome::Parked.label())
                    .increment(parked);
                if observed {
                    handled.extend(copy.orders.into_iter().map(|order_id| Handled {
                        order_id,
                        outcome: Outcome::Parked,
                        at,
                        not_before: None,
                    }));
                }
            }
            Piece::Again(orders) => {
                for (message, outcome) in orders {
                    record(&message, outcome, self.clock.now());
                    info!(target: CONSUMER, order_id = %message.order_id, outcome = outcome.label(),
                        not_before = ?message.not_before, check_step = message.check_step,
                        unknown_rechecks = message.unknown_rechecks, attempts = message.attempts,
                        "sent through the ladder again");
                    if observed {
                        handled.push(Handled {
                            order_id: Some(message.order_id.clone()),
                            outcome,
                            at,
                            not_before: message.not_before,
                        });
                    }
                }
            }
        }
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

/// The original's headers and properties (its trace headers only for its
/// body as it came), plus why and when it was parked and the routing key it
/// came with.
fn parked_properties(delivery: &Delivery, copy: &ParkedCopy, message_id: &str) -> BasicProperties {
    let reason = copy.reason.as_str();
    let mut headers: FieldTable = delivery.properties.headers().clone().unwrap_or_default();
    if let ParkedTrace::Set(trace) = &copy.trace {
        let kept = headers.inner().iter().filter(|(name, _)| {
            let name = name.as_str();
            name != TraceContext::TRACEPARENT && name != TraceContext::TRACESTATE
        });
        let mut fresh: FieldTable = kept
            .map(|(name, value)| (name.clone(), value.clone()))
            .collect::<std::collections::BTreeMap<_, _>>()
            .into();
        if let Some(trace) = trace {
            for (name, value) in &trace_headers(trace) {
                fresh.insert(name.clone(), value.clone());
            }
        }
        headers = fresh;
    }
    let text = |s: &str| AMQPValue::LongString(s.into());
    headers.insert("x-parked-reason".into(), text(reason));
    headers.insert("x-parked-at".into(), text(&Utc::now().to_rfc3339()));
    headers.insert(
        "x-original-routing-key".into(),
        text(delivery.routing_key.as_str()),
    );
    let mut properties = BasicProperties::default()
        .with_delivery_mode(2)
        .with_headers(headers)
        .with_message_id(message_id.into());
    if let Some(ct) = delivery.properties.content_type() {
        properties = properties.with_content_type(ct.clone());
    }
    properties
}
