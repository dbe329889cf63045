//! What the consumer's spans tell OpenTelemetry, beyond the fields every log
//! line shows: each order's `process` span joins the trace the order was
//! created in (its parent, and a link, as the messaging conventions ask), with
//! the attributes an operator searches by; the batch that expired it links to
//! it; and the context the action passes on (HTTP `traceparent`, the
//! `order.expired` event's headers) is the order's own.
//!
//! Everything here reaches only the exporting layer, never the log lines.
//! Whether there is one is asked once a session ([`Consuming::exports`]);
//! without it no order's span is touched, and the consumer passes on the
//! context each order came with, unchanged. With it, an order's span is
//! started at once and kept ([`Exported`]), so that what is said of it later
//! goes to the OpenTelemetry span directly: at a flash sale's 20,000 orders a
//! second, a dozen lookups of each order's span in the `tracing` registry
//! were a cost of their own. Without the `otel` feature nothing is exported
//! and every function is a no-op of the same signature.

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
    /// Whether the consumer's spans are exported: a layer of
    /// `tracing-opentelemetry` takes them. Asked once, when the session
    /// starts, so that an order's span is made with its exported name and
    /// kind, and without export nothing more is asked.
    pub(crate) exports: bool,
}

impl Consuming {
    /// A session consuming `queue` on `node`, expiring by `action`.
    pub(crate) fn new(queue: &str, action: &'static str, node: BrokerNode) -> Self {
        Self {
            name: format!("process {queue}"),
            queue: queue.to_owned(),
            action,
            node,
            exports: exports(),
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

    /// An order's exported span, started: what is said of it later (the
    /// outcome's measures, the batch's link, a failure) goes to it directly.
    /// Each call through the `tracing` span instead looks it up in the
    /// registry, and there were a dozen an order.
    #[derive(Debug, Clone)]
    pub(crate) struct Exported(Context);

    impl Exported {
        /// The context the order's action passes on: its own span's.
        pub(crate) fn onward(&self) -> Option<TraceContext> {
            TraceContext::of_span_context(self.0.span().span_context())
        }
    }

    /// Whether spans of the consumer's target are exported here.
    pub(crate) fn exports() -> bool {
        let probe = tracing::info_span!(target: crate::service::CONSUMER, "delivery");
        probe.set_parent(Context::new()).is_ok()
    }

    /// Makes `span` the `process` span of one order: a child of the context
    /// it was created in (so the trace runs from "order created" to "order
    /// cancelled", and the sampling decision made there holds here), linked
    /// to it, with the messaging attributes. `None` when it is not exported.
    pub(crate) fn process(span: &tracing::Span, order: Processing<'_>) -> Option<Exported> {
        let consuming = order.consuming;
        // Without export nothing below runs, not even the parse.
        if !consuming.exports {
            return None;
        }
        // A root of its own, whatever span is current, when the order came
        // without a context.
        let parent = match order.creation.and_then(span_context) {
            Some(remote) => {
                span.add_link(remote.clone());
                Context::new().with_remote_span_context(remote)
            }
            None => Context::new(),
        };
        span.set_parent(parent).ok()?;
        // Started here, so that the attributes go in at once.
        let context = span.context();
        let mut attributes = Vec::with_capacity(11);
        attributes.extend([
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
            KeyValue::new("server.address", consuming.node.host.clone()),
            KeyValue::new("server.port", i64::from(consuming.node.port)),
        ]);
        if let Some(id) = order.message_id {
            attributes.push(KeyValue::new("messaging.message.id", id.to_owned()));
        }
        context.span().set_attributes(attributes);
        Some(Exported(context))
    }

    /// The span of one batch through the action: a root of its own (its
    /// orders come from as many traces), linked to each order's span; each
    /// order's span links back to it.
    pub(crate) fn batch<'a>(batch: &tracing::Span, orders: impl Iterator<Item = &'a Exported>) {
        if batch.set_parent(Context::new()).is_err() {
            return;
        }
        let context = batch.context();
        let own = context.span();
        let to_batch = || vec![KeyValue::new("order_expiry.link", "batch")];
        for order in orders {
            let order = order.0.span();
            own.add_link(order.span_context().clone(), Vec::new());
            order.add_link(own.span_context().clone(), to_batch());
        }
    }

    /// Sets a count on the exported span only (the logs do not carry it).
    pub(crate) fn count(span: &Exported, key: &'static str, value: u32) {
        span.0
            .span()
            .set_attribute(KeyValue::new(key, i64::from(value)));
    }

    /// Sets a measure on the exported span only.
    pub(crate) fn float(span: &Exported, key: &'static str, value: f64) {
        span.0.span().set_attribute(KeyValue::new(key, value));
    }

    /// Marks `span` failed, with why: the order was parked.
    pub(crate) fn failed(span: &Exported, why: &str) {
        let status = opentelemetry::trace::Status::error(why.to_owned());
        span.0.span().set_status(status);
    }

    /// A remote span context from a W3C context this crate already checked.
    fn span_context(trace: &TraceContext) -> Option<SpanContext> {
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
pub(crate) use self::bridge::{Exported, batch, count, exports, failed, float, process};

#[cfg(not(feature = "otel"))]
mod bridge_off {
    use super::Processing;
    use crate::publisher::TraceContext;

    /// Never made: without `otel` no span is exported.
    #[derive(Debug, Clone)]
    pub(crate) enum Exported {}

    impl Exported {
        pub(crate) fn onward(&self) -> Option<TraceContext> {
            match *self {}
        }
    }

    pub(crate) fn exports() -> bool {
        false
    }
    pub(crate) fn process(_: &tracing::Span, _: Processing<'_>) -> Option<Exported> {
        None
    }
    pub(crate) fn batch<'a>(_: &tracing::Span, _: impl Iterator<Item = &'a Exported>) {}
    pub(crate) fn count(span: &Exported, _: &'static str, _: u32) {
        match *span {}
    }
    pub(crate) fn float(span: &Exported, _: &'static str, _: f64) {
        match *span {}
    }
    pub(crate) fn failed(span: &Exported, _: &str) {
        match *span {}
    }
}

#[cfg(not(feature = "otel"))]
pub(crate) use self::bridge_off::{Exported, batch, count, exports, failed, float, process};
