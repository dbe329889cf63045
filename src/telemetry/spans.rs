//! What the consumer's spans tell OpenTelemetry, beyond the fields every log
//! line shows: each order's `process` span joins the trace the order was
//! created in (its parent, and a link, as the messaging conventions ask), with
//! the attributes an operator searches by; the batch that expired it links to
//! it; and the context the action passes on (HTTP `traceparent`, the
//! `order.expired` event's headers) is the order's own.
//!
//! Everything here goes through `tracing-opentelemetry`'s span extension, so
//! it reaches only the exporting layer: with export off (no layer), each call
//! finds no layer and returns, the log lines gain nothing, and the consumer
//! passes on the context each order came with, unchanged. Without the `otel`
//! feature every function is a no-op of the same signature.

use chrono::{DateTime, Utc};

use crate::amqp::BrokerNode;
use crate::publisher::TraceContext;

/// Where a session consumes: the same for every order it processes.
/// (Read only by the bridge: without `otel` nothing is.)
#[derive(Debug, Clone)]
#[cfg_attr(not(feature = "otel"), allow(dead_code))]
pub(crate) struct Consuming {
    /// `process {queue}`: the span name the messaging conventions give.
    pub(crate) name: String,
    /// The due queue.
    pub(crate) queue: String,
    /// `action.kind`.
    pub(crate) action: &'static str,
    /// The broker node the session's connection reached.
    pub(crate) node: BrokerNode,
}

impl Consuming {
    /// A session consuming `queue` on `node`, expiring by `action`.
    pub(crate) fn new(queue: &str, action: &'static str, node: BrokerNode) -> Self {
        Self {
            name: format!("process {queue}"),
            queue: queue.to_owned(),
            action,
            node,
        }
    }
}

/// One delivered order, as its span describes it.
#[derive(Debug, Clone, Copy)]
#[cfg_attr(not(feature = "otel"), allow(dead_code))]
pub(crate) struct Processing<'a> {
    pub(crate) consuming: &'a Consuming,
    /// The context the order was created in.
    pub(crate) creation: Option<&'a TraceContext>,
    pub(crate) routing_key: &'a str,
    pub(crate) message_id: Option<&'a str>,
    pub(crate) delivery_tag: u64,
    pub(crate) due_at: DateTime<Utc>,
}

#[cfg(feature = "otel")]
mod bridge {
    use chrono::SecondsFormat;
    use opentelemetry::trace::{
        SpanContext, SpanId, TraceContextExt as _, TraceFlags, TraceId, TraceState,
    };
    use opentelemetry::{Context, KeyValue};
    use tracing_opentelemetry::OpenTelemetrySpanExt as _;

    use super::Processing;
    use crate::publisher::TraceContext;

    /// Makes `span` the `process` span of one order: a child of the context
    /// it was created in (so the trace runs from "order created" to "order
    /// cancelled", and the sampling decision made there holds here), linked
    /// to it, with the messaging attributes. Whether `span` is exported.
    pub(crate) fn process(span: &tracing::Span, order: Processing<'_>) -> bool {
        // A root of its own, whatever span is current; and the one look for
        // the layer: with export off nothing below runs, not even the parse.
        if span.set_parent(Context::new()).is_err() {
            return false;
        }
        if let Some(remote) = order.creation.and_then(span_context) {
            let parent = Context::new().with_remote_span_context(remote.clone());
            let _ = span.set_parent(parent);
            span.add_link(remote);
        }
        let consuming = order.consuming;
        span.record("otel.name", consuming.name.as_str());
        span.record("otel.kind", "consumer");
        let mut attributes = vec![
            KeyValue::new("messaging.system", "rabbitmq"),
            KeyValue::new("messaging.operation.type", "process"),
            KeyValue::new("messaging.operation.name", "process"),
            KeyValue::new("messaging.destination.name", consuming.queue.clone()),
            KeyValue::new(
                "messaging.rabbitmq.destination.routing_key",
                order.routing_key.to_owned(),
            ),
            KeyValue::new(
                "messaging.rabbitmq.message.delivery_tag",
                i64::try_from(order.delivery_tag).unwrap_or(i64::MAX),
            ),
            KeyValue::new("order_expiry.action", consuming.action),
            KeyValue::new(
                "order_expiry.due_at",
                order.due_at.to_rfc3339_opts(SecondsFormat::Millis, true),
            ),
        ];
        if let Some(id) = order.message_id {
            attributes.push(KeyValue::new("messaging.message.id", id.to_owned()));
        }
        attributes.push(KeyValue::new("server.address", consuming.node.host.clone()));
        attributes.push(KeyValue::new("server.port", i64::from(consuming.node.port)));
        for attribute in attributes {
            span.set_attribute(attribute.key, attribute.value);
        }
        true
    }

    /// The span of one batch through the action: a root of its own (its
    /// orders come from as many traces), linked to each order's span; each
    /// order's span links back to it.
    pub(crate) fn batch<'a>(
        batch: &tracing::Span,
        orders: impl Iterator<Item = &'a tracing::Span>,
    ) {
        if batch.set_parent(Context::new()).is_err() {
            return;
        }
        batch.record("otel.kind", "client");
        let own = batch.context().span().span_context().clone();
        for order in orders {
            let of_order = order.context().span().span_context().clone();
            batch.add_link(of_order);
            order.add_link_with_attributes(
                own.clone(),
                vec![KeyValue::new("order_expiry.link", "batch")],
            );
        }
    }

    /// The context `span` passes on, when it is exported.
    pub(crate) fn onward(span: &tracing::Span) -> Option<TraceContext> {
        TraceContext::of_span(span)
    }

    /// Sets a count on the exported span only (the logs do not carry it).
    pub(crate) fn count(span: &tracing::Span, key: &'static str, value: u32) {
        span.set_attribute(key, i64::from(value));
    }

    /// Sets a measure on the exported span only.
    pub(crate) fn float(span: &tracing::Span, key: &'static str, value: f64) {
        span.set_attribute(key, value);
    }

    /// Marks `span` failed, with why: the order was parked.
    pub(crate) fn failed(span: &tracing::Span, why: &str) {
        span.set_status(opentelemetry::trace::Status::error(why.to_owned()));
    }

    /// A remote span context from a W3C context this crate already checked.
    pub(super) fn span_context(trace: &TraceContext) -> Option<SpanContext> {
        let text = trace.traceparent();
        let trace_id = TraceId::from_hex(text.get(3..35)?).ok()?;
        let span_id = SpanId::from_hex(text.get(36..52)?).ok()?;
        let flags = u8::from_str_radix(text.get(53..55)?, 16).ok()?;
        let state = trace
            .tracestate()
            .and_then(|s| s.parse::<TraceState>().ok())
            .unwrap_or_default();
        Some(SpanContext::new(
            trace_id,
            span_id,
            TraceFlags::new(flags),
            true,
            state,
        ))
    }
}

#[cfg(feature = "otel")]
pub(crate) use self::bridge::{batch, count, failed, float, onward, process};

#[cfg(not(feature = "otel"))]
mod bridge_off {
    use super::Processing;
    use crate::publisher::TraceContext;

    pub(crate) fn process(_: &tracing::Span, _: Processing<'_>) -> bool {
        false
    }
    pub(crate) fn batch<'a>(_: &tracing::Span, _: impl Iterator<Item = &'a tracing::Span>) {}
    pub(crate) fn onward(_: &tracing::Span) -> Option<TraceContext> {
        None
    }
    pub(crate) fn count(_: &tracing::Span, _: &'static str, _: u32) {}
    pub(crate) fn float(_: &tracing::Span, _: &'static str, _: f64) {}
    pub(crate) fn failed(_: &tracing::Span, _: &str) {}
}

#[cfg(not(feature = "otel"))]
pub(crate) use self::bridge_off::{batch, count, failed, float, onward, process};
