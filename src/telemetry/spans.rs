//! What the consumer's spans tell OpenTelemetry, beyond the fields every log
//! line shows: each order's `process` span joins the trace the order was
//! created in (its parent, and a link, as the messaging conventions ask), with
//! the attributes an operator searches by; the batch that expired it links to
//! it; and the context the action passes on (HTTP `traceparent`, the
//! `order.expired` event's headers, the payment check) is the order's own.
//!
//! Everything here reaches only the exporting layer, never the log lines.
//! Whether there is one is asked once a session ([`Consuming::exports`]);
//! without it no order's span is touched, and the consumer passes on the
//! context each order came with, unchanged.
//!
//! With it, the consumer does as little as it can on its way to the cancel:
//! an order's [`OrderTrace`] keeps what its span will say, and the span is
//! made, linked, described and ended when the order is dropped, on a thread
//! of its own (`finisher`). At a flash sale's
//! 20,000 orders a second, that work done in line was most of what tracing
//! added to every order's lateness. Only an action that passes the context
//! on needs the order's span before it runs: that span is started at
//! arrival, and the rest of its work is still left to the thread.
//!
//! Without the `otel` feature nothing is exported and every function is a
//! no-op of the same signature.

use crate::amqp::BrokerNode;

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
    /// Whether the action (or the payment check) passes each order's context
    /// on: its span must then exist before the action runs.
    pub(crate) passes_on: bool,
}

impl Consuming {
    /// A session consuming `queue` on `node`, expiring by `action`, which
    /// `passes_on` each order's context or not (the SQL action does not).
    pub(crate) fn new(
        queue: &str,
        action: &'static str,
        node: BrokerNode,
        passes_on: bool,
    ) -> Self {
        Self {
            name: format!("process {queue}"),
            queue: queue.to_owned(),
            action,
            node,
            exports: exports(),
            passes_on,
        }
    }
}

#[cfg(feature = "otel")]
mod bridge {
    use std::sync::Arc;
    use std::time::SystemTime;

    use chrono::{DateTime, SecondsFormat, Utc};
    use lapin::message::Delivery;
    use opentelemetry::trace::{
        SpanContext, SpanId, Status, TraceContextExt as _, TraceFlags, TraceId, TraceState,
    };
    use opentelemetry::{Context, KeyValue};
    use tracing_opentelemetry::OpenTelemetrySpanExt as _;

    use super::{Consuming, finisher};
    use crate::publisher::{ExpiryMessage, TraceContext};

    /// An order's exported span, started.
    #[derive(Debug, Clone)]
    struct Exported(Context);

    /// What an order's exported span will say, kept until the order is
    /// dropped; then [`finisher`] makes the span say it and ends it. Empty
    /// when nothing is exported.
    #[derive(Debug)]
    pub(crate) struct OrderTrace(Option<Box<Story>>);

    /// Everything the span of one exported order is made from.
    #[derive(Debug)]
    pub(super) struct Story {
        /// The order's `tracing` span (a handle: the span closes, and is
        /// exported, when the story is finished and drops it).
        span: tracing::Span,
        consuming: Arc<Consuming>,
        delivery: Arc<Delivery>,
        creation: Option<TraceContext>,
        due_at: DateTime<Utc>,
        /// Started at arrival, when the action passes the context on.
        started: Option<Exported>,
        /// The batches that took it to the action: linked both ways.
        batches: Vec<tracing::Span>,
        /// Measures said of it since (lateness, attempt).
        attributes: Vec<KeyValue>,
        /// Why it was parked.
        failed: Option<String>,
        /// When its verdict was known: the span's end, when said.
        ended: Option<SystemTime>,
    }

    impl OrderTrace {
        /// The trace of an order of `delivery`, whose log lines go in
        /// `span`: nothing unless `consuming` exports.
        pub(crate) fn new(
            span: &tracing::Span,
            delivery: &Arc<Delivery>,
            message: &ExpiryMessage,
            consuming: &Arc<Consuming>,
        ) -> Self {
            if !consuming.exports {
                return Self(None);
            }
            let mut story = Story {
                span: span.clone(),
                consuming: Arc::clone(consuming),
                delivery: Arc::clone(delivery),
                creation: message.trace.clone(),
                due_at: message.due_at,
                started: None,
                batches: Vec::new(),
                attributes: Vec::new(),
                failed: None,
                ended: None,
            };
            if consuming.passes_on {
                story.started = process(&story);
            }
            Self(Some(Box::new(story)))
        }

        /// Whether the order's span is exported.
        pub(crate) fn is_exported(&self) -> bool {
            self.0.is_some()
        }

        /// The context the order's action passes on: its own span's, when
        /// that was started for it.
        pub(crate) fn onward(&self) -> Option<TraceContext> {
            let started = self.0.as_ref()?.started.as_ref()?;
            TraceContext::of_span_context(started.0.span().span_context())
        }

        /// The order went to the action in `batch` (a span made by
        /// [`batch_span`]).
        pub(crate) fn in_batch(&mut self, batch: &tracing::Span) {
            if let Some(story) = &mut self.0 {
                story.batches.push(batch.clone());
            }
        }

        /// A count for the exported span only (the logs do not carry it).
        pub(crate) fn count(&mut self, key: &'static str, value: u32) {
            if let Some(story) = &mut self.0 {
                story.attributes.push(KeyValue::new(key, i64::from(value)));
            }
        }

        /// A word for the exported span only.
        pub(crate) fn text(&mut self, key: &'static str, value: &'static str) {
            if let Some(story) = &mut self.0 {
                story.attributes.push(KeyValue::new(key, value));
            }
        }

        /// A measure for the exported span only.
        pub(crate) fn float(&mut self, key: &'static str, value: f64) {
            if let Some(story) = &mut self.0 {
                story.attributes.push(KeyValue::new(key, value));
            }
        }

        /// The span fails, with why: the order was parked.
        pub(crate) fn failed(&mut self, why: &str) {
            if let Some(story) = &mut self.0 {
                story.failed = Some(why.to_owned());
            }
        }

        /// The order's verdict is known now: its span ends here, although
        /// its `tracing` span may never be entered again to say so.
        pub(crate) fn ended(&mut self) {
            if let Some(story) = &mut self.0 {
                story.ended = Some(SystemTime::now());
            }
        }
    }

    impl Drop for OrderTrace {
        fn drop(&mut self) {
            if let Some(story) = self.0.take() {
                finisher::finish_later(story);
            }
        }
    }

    /// Makes `story`'s span say what it holds, and ends it: when its verdict
    /// was known, if that was said ([`OrderTrace::ended`]), else at its last
    /// exit. It is then exported.
    pub(super) fn finish(story: Box<Story>) {
        let Some(exported) = story.started.clone().or_else(|| process(&story)) else {
            return;
        };
        let own = exported.0.span();
        let to_batch = || vec![KeyValue::new("order_expiry.link", "batch")];
        for batch in &story.batches {
            let context = batch.context();
            let batch = context.span();
            if batch.span_context().is_valid() {
                batch.add_link(own.span_context().clone(), Vec::new());
                own.add_link(batch.span_context().clone(), to_batch());
            }
        }
        let Story {
            attributes,
            failed,
            ended,
            ..
        } = *story;
        if !attributes.is_empty() {
            own.set_attributes(attributes);
        }
        if let Some(why) = failed {
            own.set_status(Status::error(why));
        }
        // Ended and exported here; the layer's own end, when the `tracing`
        // span closes, then finds it ended and does nothing.
        if let Some(at) = ended {
            own.end_with_timestamp(at);
        }
    }

    /// Whether spans of the consumer's target are exported here.
    pub(crate) fn exports() -> bool {
        let probe = tracing::info_span!(target: crate::service::CONSUMER, "delivery");
        probe.set_parent(Context::new()).is_ok()
    }

    /// The attributes [`process`] gives an order's span, at most.
    const PROCESS_ATTRIBUTES: usize = 11;

    /// The most attributes an order's exported span carries: its `tracing`
    /// span's two fields with values (`order_id`, `redelivered`), those of
    /// [`process`], and its verdict's lateness, outcome and attempt. The
    /// order's `tracing` span has a field for each (`consumer::work`).
    #[cfg(test)]
    pub(crate) const ORDER_SPAN_ATTRIBUTES: usize = 2 + PROCESS_ATTRIBUTES + 3;

    /// Starts `story`'s span as the `process` span of one order: a child of
    /// the context it was created in (so the trace runs from "order created"
    /// to "order cancelled", and the sampling decision made there holds
    /// here), linked to it, with the messaging attributes. Its start is the
    /// `tracing` span's: the order's arrival.
    fn process(story: &Story) -> Option<Exported> {
        let (delivery, consuming) = (&story.delivery, &story.consuming);
        let span = &story.span;
        // A root of its own, whatever span is current, when the order came
        // without a context.
        let parent = match story.creation.as_ref().and_then(span_context) {
            Some(remote) => {
                span.add_link(remote.clone());
                Context::new().with_remote_span_context(remote)
            }
            None => Context::new(),
        };
        span.set_parent(parent).ok()?;
        // Started here, so that the attributes go in at once.
        let context = span.context();
        let mut attributes = Vec::with_capacity(PROCESS_ATTRIBUTES);
        attributes.extend([
            KeyValue::new("messaging.system", "rabbitmq"),
            KeyValue::new("messaging.operation.type", "process"),
            KeyValue::new("messaging.operation.name", "process"),
            KeyValue::new("messaging.destination.name", consuming.queue.clone()),
            KeyValue::new(
                "messaging.rabbitmq.destination.routing_key",
                delivery.routing_key.as_str().to_owned(),
            ),
            KeyValue::new(
                "messaging.rabbitmq.message.delivery_tag",
                i64::try_from(delivery.delivery_tag).unwrap_or(i64::MAX),
            ),
            KeyValue::new("order_expiry.action", consuming.action),
            KeyValue::new(
                "order_expiry.due_at",
                story.due_at.to_rfc3339_opts(SecondsFormat::Millis, true),
            ),
            KeyValue::new("server.address", consuming.node.host.clone()),
            KeyValue::new("server.port", i64::from(consuming.node.port)),
        ]);
        if let Some(id) = delivery.properties.message_id() {
            attributes.push(KeyValue::new("messaging.message.id", id.to_string()));
        }
        debug_assert!(attributes.len() <= PROCESS_ATTRIBUTES);
        context.span().set_attributes(attributes);
        Some(Exported(context))
    }

    /// Makes `batch` the span of one batch through the action: a root of its
    /// own (its orders come from as many traces). Its orders link to it, and
    /// it to them, when they are finished.
    pub(crate) fn batch_root(batch: &tracing::Span) {
        let _ = batch.set_parent(Context::new());
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
mod finisher {
    //! The thread that finishes exported orders' spans (`bridge::finish`),
    //! off the consumer's way: on another core, while the consumer goes on
    //! to the next batch. It runs at the process's priority: at a lower one
    //! (nice 10, with the exporter's thread) the flash sale's p99 was worse,
    //! 41-202 ms against 10-12 ms. Most of what it frees was allocated on
    //! the consumer's thread, so it takes that thread's allocator lock; held
    //! by a thread the scheduler readily preempts, that lock held the
    //! consumer up. Its queue is bounded; when it is full, an order's
    //! span is finished where it was dropped, so a slow thread costs time,
    //! never spans or memory.
    //!
    //! It blocks on its queue when that is empty, so each order handed to it
    //! then costs the consumer a wake-up (3 % of the consumer thread's
    //! samples in a traced sale). Resting 1 ms before blocking, so that in a
    //! sale the orders found it awake, spared the consumer those wake-ups
    //! but made the traced sale's p99 far worse (87 and 149 ms, against 26
    //! and 16 ms without the rest, in alternating runs).

    use std::sync::OnceLock;
    use std::sync::mpsc::{self, SyncSender, TrySendError};
    use std::time::Duration;

    use super::bridge::{Story, finish};

    /// Orders waiting for the thread: about a second of a flash sale.
    const QUEUE: usize = 16_384;

    enum Job {
        Finish(Box<Story>),
        /// Answered once every job sent before it is done.
        #[cfg_attr(not(feature = "otlp"), allow(dead_code))]
        Drained(mpsc::Sender<()>),
    }

    static THREAD: OnceLock<Option<SyncSender<Job>>> = OnceLock::new();

    fn thread() -> Option<&'static SyncSender<Job>> {
        THREAD
            .get_or_init(|| {
                let (send, receive) = mpsc::sync_channel(QUEUE);
                std::thread::Builder::new()
                    .name("order-spans".to_owned())
                    .spawn(move || {
                        for job in receive {
                            match job {
                                Job::Finish(story) => finish(story),
                                Job::Drained(done) => {
                                    let _ = done.send(());
                                }
                            }
                        }
                    })
                    .ok()
                    .map(|_| send)
            })
            .as_ref()
    }

    /// Finishes `story` on the thread, or here when the thread is behind.
    pub(super) fn finish_later(story: Box<Story>) {
        let Some(thread) = thread() else {
            return finish(story);
        };
        // Full or gone, the job comes back: a story, as sent.
        if let Err(TrySendError::Full(job) | TrySendError::Disconnected(job)) =
            thread.try_send(Job::Finish(story))
            && let Job::Finish(story) = job
        {
            finish(story);
        }
    }

    /// Waits, at most `limit`, until every span handed to the thread so far
    /// is finished: before a flush, so that they are in it.
    #[cfg_attr(not(feature = "otlp"), allow(dead_code))]
    pub(crate) fn drain(limit: Duration) {
        let Some(thread) = THREAD.get().and_then(Option::as_ref) else {
            return;
        };
        let (done, drained) = mpsc::channel();
        if thread.send(Job::Drained(done)).is_ok() {
            let _ = drained.recv_timeout(limit);
        }
    }
}

#[cfg(all(test, feature = "otel"))]
pub(crate) use self::bridge::ORDER_SPAN_ATTRIBUTES;
#[cfg(feature = "otel")]
pub(crate) use self::bridge::{OrderTrace, batch_root, exports};
#[cfg(feature = "otlp")]
pub(crate) use self::finisher::drain;

#[cfg(not(feature = "otel"))]
mod bridge_off {
    use std::sync::Arc;

    use lapin::message::Delivery;

    use super::Consuming;
    use crate::publisher::{ExpiryMessage, TraceContext};

    /// Never holds anything: without `otel` no span is exported.
    #[derive(Debug)]
    pub(crate) struct OrderTrace;

    impl OrderTrace {
        pub(crate) fn new(
            _: &tracing::Span,
            _: &Arc<Delivery>,
            _: &ExpiryMessage,
            _: &Arc<Consuming>,
        ) -> Self {
            Self
        }
        pub(crate) fn is_exported(&self) -> bool {
            false
        }
        pub(crate) fn onward(&self) -> Option<TraceContext> {
            None
        }
        pub(crate) fn in_batch(&mut self, _: &tracing::Span) {}
        pub(crate) fn count(&mut self, _: &'static str, _: u32) {}
        pub(crate) fn text(&mut self, _: &'static str, _: &'static str) {}
        pub(crate) fn float(&mut self, _: &'static str, _: f64) {}
        pub(crate) fn failed(&mut self, _: &str) {}
        pub(crate) fn ended(&mut self) {}
    }

    pub(crate) fn exports() -> bool {
        false
    }
    pub(crate) fn batch_root(_: &tracing::Span) {}
}

#[cfg(not(feature = "otel"))]
pub(crate) use self::bridge_off::{OrderTrace, batch_root, exports};
