//! What the consumer's spans tell OpenTelemetry, beyond the fields every log
//! line shows: each order's `process` span joins the trace the order was
//! created in (its parent, and a link, as the messaging conventions ask), with
//! the attributes an operator searches by; the batch that expired it links to
//! it; and the context the action passes on (HTTP `traceparent`, the
//! `order.expired` event's headers, the payment check) is the order's own.
//!
//! An order's span is made with the tracer of [`OrderSpans`], a layer of the
//! subscriber, not from the order's `tracing` span, which the export layer
//! does not see: what it says is kept beside the order ([`OrderTrace`]),
//! never in its log lines. Whether there is such a tracer is asked once a
//! session ([`Consuming::new`]); without one no order's span is made, and
//! the consumer passes on the context each order came with, unchanged.
//!
//! With one, the consumer does as little as it can on its way to the cancel:
//! an order's [`OrderTrace`] keeps what its span will say, and the span is
//! made, linked, described and ended when the order is dropped, on a thread
//! of its own (`finisher`). At a flash sale's 20,000 orders a second, that
//! work done in line was most of what tracing added to every order's
//! lateness. Only an action that passes the context on needs the order's
//! span before it runs: that span is started at arrival, and the rest of its
//! work is still left to the thread.
//!
//! Without the `otel` feature nothing is exported and every function is a
//! no-op of the same signature.

use crate::amqp::BrokerNode;

/// Where a session consumes: the same for every order it processes.
#[derive(Debug)]
pub(crate) struct Consuming {
    /// Whether the action (or the payment check) passes each order's context
    /// on: its span must then exist before the action runs.
    pub(crate) passes_on: bool,
    /// How its orders' spans are made, when they are exported: found once,
    /// when the session starts, so that without export nothing more is
    /// asked.
    #[cfg_attr(not(feature = "otel"), allow(dead_code))]
    export: Option<Export>,
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
            passes_on,
            export: Export::current(queue, action, &node),
        }
    }
}

#[cfg(feature = "otel")]
mod bridge {
    use std::borrow::Cow;
    use std::fmt::{self, Display};
    use std::sync::Arc;
    use std::time::SystemTime;

    use chrono::{DateTime, SecondsFormat, Utc};
    use lapin::message::Delivery;
    use opentelemetry::global::{BoxedSpan, BoxedTracer};
    use opentelemetry::trace::{
        Event, Link, Span as _, SpanBuilder, SpanContext, SpanId, SpanKind, Status,
        TraceContextExt as _, TraceFlags, TraceId, TraceState, Tracer,
    };
    use opentelemetry::{Context, KeyValue, Value};
    use tracing_opentelemetry::OpenTelemetrySpanExt as _;

    use super::{Consuming, finisher};
    use crate::amqp::BrokerNode;
    use crate::publisher::{ExpiryMessage, TraceContext};

    /// The tracer each order's `process` span is made with: a layer of the
    /// subscriber that does nothing else, so that the consumer finds it
    /// where it finds its subscriber (a test installs one per thread).
    /// `telemetry::OtlpExport`'s layer includes it. A program that embeds
    /// the consumer with its own `tracing-opentelemetry` layer adds one
    /// beside it, or the consumer exports no order's span.
    ///
    /// The order spans are made with it directly, not as `tracing` spans
    /// through the bridge: the bridge's work for each (its state, made on
    /// the consumer's thread and looked up on another) was most of what
    /// tracing cost a flash sale.
    pub struct OrderSpans(Arc<BoxedTracer>);

    impl OrderSpans {
        /// Order spans made with `tracer`.
        pub fn new<T>(tracer: T) -> Self
        where
            T: Tracer + Send + Sync + 'static,
            T::Span: Send + Sync + 'static,
        {
            Self(Arc::new(BoxedTracer::new(Box::new(tracer))))
        }
    }

    impl fmt::Debug for OrderSpans {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("OrderSpans")
        }
    }

    /// Found by its type (`Dispatch::downcast_ref`), the layer's default.
    impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for OrderSpans {}

    /// What every order's span of one session is made with.
    pub(super) struct Export {
        tracer: Arc<BoxedTracer>,
        /// `process {queue}`: the span name the messaging conventions give.
        name: Cow<'static, str>,
        /// The attributes that are the same for each of its orders.
        session: Vec<KeyValue>,
    }

    impl fmt::Debug for Export {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.debug_struct("Export").field("name", &self.name).finish()
        }
    }

    impl Export {
        /// How a session consuming `queue` on `node` for `action` exports its
        /// orders' spans: `None` when the current subscriber has no
        /// [`OrderSpans`].
        pub(super) fn current(
            queue: &str,
            action: &'static str,
            node: &BrokerNode,
        ) -> Option<Self> {
            let tracer = tracing::dispatcher::get_default(|dispatch| {
                dispatch
                    .downcast_ref::<OrderSpans>()
                    .map(|spans| Arc::clone(&spans.0))
            })?;
            // Shared, not owned, so that each order's copy is a count.
            let shared = |text: &str| Value::from(Arc::<str>::from(text));
            let session = vec![
                KeyValue::new("messaging.system", "rabbitmq"),
                KeyValue::new("messaging.operation.type", "process"),
                KeyValue::new("messaging.operation.name", "process"),
                KeyValue::new("messaging.destination.name", shared(queue)),
                KeyValue::new("order_expiry.action", action),
                KeyValue::new("server.address", shared(&node.host)),
                KeyValue::new("server.port", i64::from(node.port)),
            ];
            Some(Self {
                tracer,
                name: Cow::Owned(format!("process {queue}")),
                session,
            })
        }
    }

    /// What an order's exported span will say, kept until the order is
    /// dropped; then [`finisher`] makes the span say it and ends it. Empty
    /// when nothing is exported.
    #[derive(Debug)]
    pub(crate) struct OrderTrace(Option<Box<Story>>);

    /// Everything the span of one exported order is made from.
    #[derive(Debug)]
    pub(super) struct Story {
        consuming: Arc<Consuming>,
        delivery: Arc<Delivery>,
        order_id: String,
        creation: Option<TraceContext>,
        due_at: DateTime<Utc>,
        /// The span's start.
        arrived: SystemTime,
        /// Started at arrival, when the action passes the context on.
        started: Option<BoxedSpan>,
        /// The batches that took it to the action: linked both ways.
        batches: Vec<tracing::Span>,
        lateness_ms: Option<f64>,
        outcome: Option<&'static str>,
        attempt: Option<u32>,
        /// What was logged about it at `info` or above.
        events: Vec<Event>,
        /// Why it was parked.
        failed: Option<String>,
        /// When its verdict was known: the span's end, when said.
        ended: Option<SystemTime>,
    }

    impl OrderTrace {
        /// The trace of an order of `delivery`: nothing unless `consuming`
        /// exports.
        pub(crate) fn new(
            delivery: &Arc<Delivery>,
            message: &ExpiryMessage,
            consuming: &Arc<Consuming>,
        ) -> Self {
            let Some(export) = &consuming.export else {
                return Self(None);
            };
            let mut story = Story {
                consuming: Arc::clone(consuming),
                delivery: Arc::clone(delivery),
                order_id: message.order_id.to_string(),
                creation: message.trace.clone(),
                due_at: message.due_at,
                arrived: SystemTime::now(),
                started: None,
                batches: Vec::new(),
                lateness_ms: None,
                outcome: None,
                attempt: None,
                events: Vec::new(),
                failed: None,
                ended: None,
            };
            if consuming.passes_on {
                let (builder, parent) = process(&story, export);
                story.started = Some(export.tracer.build_with_context(builder, &parent));
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
            TraceContext::of_span_context(started.span_context())
        }

        /// The order went to the action in `batch` (a span made by
        /// [`batch_root`]).
        pub(crate) fn in_batch(&mut self, batch: &tracing::Span) {
            if let Some(story) = &mut self.0 {
                story.batches.push(batch.clone());
            }
        }

        /// How late it was cancelled.
        pub(crate) fn lateness_ms(&mut self, ms: f64) {
            if let Some(story) = &mut self.0 {
                story.lateness_ms = Some(ms);
            }
        }

        /// Its outcome, as the metrics label it (or `retried`).
        pub(crate) fn outcome(&mut self, label: &'static str) {
            if let Some(story) = &mut self.0 {
                story.outcome = Some(label);
            }
        }

        /// The attempt its verdict came from.
        pub(crate) fn attempt(&mut self, attempt: u32) {
            if let Some(story) = &mut self.0 {
                story.attempt = Some(attempt);
            }
        }

        /// A line logged about it at `info` or above: an event of its span,
        /// with `fields` as text.
        pub(crate) fn event(
            &mut self,
            message: &'static str,
            fields: &[(&'static str, &dyn Display)],
        ) {
            if let Some(story) = &mut self.0 {
                let attributes = fields
                    .iter()
                    .map(|(key, value)| KeyValue::new(*key, value.to_string()))
                    .collect();
                story
                    .events
                    .push(Event::new(message, SystemTime::now(), attributes, 0));
            }
        }

        /// The span fails, with why: the order was parked.
        pub(crate) fn failed(&mut self, why: &str) {
            if let Some(story) = &mut self.0 {
                story.failed = Some(why.to_owned());
            }
        }

        /// The order's verdict is known now: its span ends here.
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

    /// The most attributes an order's span carries: its session's, the
    /// order's own five (`order_id`, `redelivered`, routing key, delivery
    /// tag, `due_at`), its message id, and its verdict's lateness, outcome
    /// and attempt. Its list is made this long once, so that it never grows.
    pub(crate) const ORDER_SPAN_ATTRIBUTES: usize = 7 + 5 + 1 + 3;

    /// Makes `story`'s span say what it holds, and ends it: when its verdict
    /// was known, if that was said ([`OrderTrace::ended`]), else now. It is
    /// then exported.
    pub(super) fn finish(story: Box<Story>) {
        let mut story = *story;
        let consuming = Arc::clone(&story.consuming);
        let Some(export) = &consuming.export else {
            return;
        };
        let batches: Vec<(&tracing::Span, SpanContext)> = story
            .batches
            .iter()
            .filter_map(|batch| {
                let context = batch.context().span().span_context().clone();
                context.is_valid().then_some((batch, context))
            })
            .collect();
        let to_batch = || vec![KeyValue::new("order_expiry.link", "batch")];
        let verdict = [
            story
                .lateness_ms
                .map(|ms| KeyValue::new("order_expiry.lateness_ms", ms)),
            story
                .outcome
                .map(|outcome| KeyValue::new("outcome", outcome)),
            story
                .attempt
                .map(|n| KeyValue::new("order_expiry.attempt", i64::from(n))),
        ];
        let verdict = verdict.into_iter().flatten();
        let mut span = match story.started.take() {
            Some(mut span) => {
                span.set_attributes(verdict);
                for (_, context) in &batches {
                    span.add_link(context.clone(), to_batch());
                }
                for event in story.events.drain(..) {
                    span.add_event_with_timestamp(event.name, event.timestamp, event.attributes);
                }
                span
            }
            None => {
                let (mut builder, parent) = process(&story, export);
                if let Some(attributes) = &mut builder.attributes {
                    attributes.extend(verdict);
                    debug_assert!(attributes.len() <= ORDER_SPAN_ATTRIBUTES);
                }
                if let Some(links) = &mut builder.links {
                    links.extend(
                        batches
                            .iter()
                            .map(|(_, context)| Link::new(context.clone(), to_batch(), 0)),
                    );
                }
                if !story.events.is_empty() {
                    builder.events = Some(std::mem::take(&mut story.events));
                }
                export.tracer.build_with_context(builder, &parent)
            }
        };
        for (batch, _) in &batches {
            batch.add_link(span.span_context().clone());
        }
        if let Some(why) = story.failed.take() {
            span.set_status(Status::error(why));
        }
        span.end_with_timestamp(story.ended.unwrap_or_else(SystemTime::now));
    }

    /// The `process` span of `story`'s order, to start from its arrival: a
    /// child of the context it was created in (so the trace runs from "order
    /// created" to "order cancelled", and the sampling decision made there
    /// holds here), linked to it, with the messaging attributes. Its parent
    /// is the context returned.
    fn process(story: &Story, export: &Export) -> (SpanBuilder, Context) {
        let delivery = &story.delivery;
        let mut attributes = Vec::with_capacity(ORDER_SPAN_ATTRIBUTES);
        attributes.extend(export.session.iter().cloned());
        attributes.extend([
            KeyValue::new("order_id", story.order_id.clone()),
            KeyValue::new("redelivered", delivery.redelivered),
            KeyValue::new(
                "messaging.rabbitmq.destination.routing_key",
                delivery.routing_key.as_str().to_owned(),
            ),
            KeyValue::new(
                "messaging.rabbitmq.message.delivery_tag",
                i64::try_from(delivery.delivery_tag).unwrap_or(i64::MAX),
            ),
            KeyValue::new(
                "order_expiry.due_at",
                story.due_at.to_rfc3339_opts(SecondsFormat::Millis, true),
            ),
        ]);
        if let Some(id) = delivery.properties.message_id() {
            attributes.push(KeyValue::new("messaging.message.id", id.to_string()));
        }
        let mut links = Vec::new();
        // A root of its own when the order came without a context.
        let parent = match story.creation.as_ref().and_then(span_context) {
            Some(remote) => {
                links.push(Link::with_context(remote.clone()));
                Context::new().with_remote_span_context(remote)
            }
            None => Context::new(),
        };
        let builder = SpanBuilder::from_name(export.name.clone())
            .with_kind(SpanKind::Consumer)
            .with_start_time(story.arrived)
            .with_attributes(attributes)
            .with_links(links);
        (builder, parent)
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

#[cfg(feature = "otel")]
use self::bridge::Export;
#[cfg(all(test, feature = "otel"))]
pub(crate) use self::bridge::ORDER_SPAN_ATTRIBUTES;
#[cfg(feature = "otel")]
pub use self::bridge::OrderSpans;
#[cfg(feature = "otel")]
pub(crate) use self::bridge::{OrderTrace, batch_root};
#[cfg(feature = "otlp")]
pub(crate) use self::finisher::drain;

#[cfg(not(feature = "otel"))]
mod bridge_off {
    use std::fmt::Display;
    use std::sync::Arc;

    use lapin::message::Delivery;

    use super::Consuming;
    use crate::amqp::BrokerNode;
    use crate::publisher::{ExpiryMessage, TraceContext};

    /// Never made: without `otel` no span is exported.
    #[derive(Debug)]
    pub(super) struct Export;

    impl Export {
        pub(super) fn current(_: &str, _: &'static str, _: &BrokerNode) -> Option<Self> {
            None
        }
    }

    /// Never holds anything: without `otel` no span is exported.
    #[derive(Debug)]
    pub(crate) struct OrderTrace;

    impl OrderTrace {
        pub(crate) fn new(_: &Arc<Delivery>, _: &ExpiryMessage, _: &Arc<Consuming>) -> Self {
            Self
        }
        pub(crate) fn is_exported(&self) -> bool {
            false
        }
        pub(crate) fn onward(&self) -> Option<TraceContext> {
            None
        }
        pub(crate) fn in_batch(&mut self, _: &tracing::Span) {}
        pub(crate) fn lateness_ms(&mut self, _: f64) {}
        pub(crate) fn outcome(&mut self, _: &'static str) {}
        pub(crate) fn attempt(&mut self, _: u32) {}
        pub(crate) fn event(&mut self, _: &'static str, _: &[(&'static str, &dyn Display)]) {}
        pub(crate) fn failed(&mut self, _: &str) {}
        pub(crate) fn ended(&mut self) {}
    }

    pub(crate) fn batch_root(_: &tracing::Span) {}
}

#[cfg(not(feature = "otel"))]
use self::bridge_off::Export;
#[cfg(not(feature = "otel"))]
pub(crate) use self::bridge_off::{OrderTrace, batch_root};
