//! One trace from "order created" to "order cancelled" (issue 38), as an
//! OTLP receiver sees it. The test plays the order service: it creates each
//! order inside a span of its own trace, exported to the receiver, and
//! schedules the order with that span's context. `serve` exports too. For
//! every order, the consumer's `process` span must be a child of, and link
//! to, the span that created it, with the messaging attributes and the
//! order's outcome; whether the order was paid, extended, bundled, moved by
//! `ladder migrate`, or (HTTP action) parked and replayed. The HTTP action
//! and the payment check must hand the order service and the gateway the
//! `process` span's `traceparent`.
//!
//! `docs/src/operating/following-an-order.md` shows the tree this prints.

use std::collections::HashMap;
use std::time::Duration;

use chrono::{DateTime, SubsecRound as _, TimeDelta, Utc};
use opentelemetry::trace::TraceContextExt;
use order_expiry::publisher::TraceContext;
use order_expiry::settings::LogFormat;
use order_expiry::telemetry::{OtlpExport, dispatch_with_export};
use order_expiry::{Scheduler, Settings};
use order_expiry_testkit::served::binary;
use order_expiry_testkit::{
    Endpoint, OtlpReceiver, ReceivedSpan, Reply, Served, World, at_ms, message, poll, run_cli,
    schedule_bundled, succeeded,
};
use tracing_opentelemetry::OpenTelemetrySpanExt;

const WAIT: Duration = Duration::from_secs(40);

/// The test's order service: its spans go to the receiver as `order-service`.
struct OrderService {
    export: OtlpExport,
    dispatch: tracing::Dispatch,
}

impl OrderService {
    fn start(receiver: &OtlpReceiver) -> Self {
        let base = receiver.base_url();
        let env = |name: &str| match name {
            "OTEL_EXPORTER_OTLP_ENDPOINT" => Some(base.clone()),
            "OTEL_SERVICE_NAME" => Some("order-service".to_owned()),
            _ => None,
        };
        let settings = Settings::default().telemetry.otlp;
        let export = OtlpExport::start_with(&settings, &env).unwrap();
        let export = export.expect("the endpoint turns export on");
        let dispatch = dispatch_with_export(LogFormat::Text, "info", Some(&export));
        Self { export, dispatch }
    }

    /// Creates `id` inside a span `create order` of a trace of its own; the
    /// context to schedule it with.
    fn create(&self, id: &str) -> TraceContext {
        tracing::dispatcher::with_default(&self.dispatch, || {
            let span = tracing::info_span!(parent: None, "create order", order_id = id);
            let context = span.context();
            let span = context.span();
            let span = span.span_context();
            let traceparent = format!("00-{}-{}-01", span.trace_id(), span.span_id());
            TraceContext::parse(&traceparent, None).expect("a valid context")
        })
    }

    async fn flush(self) {
        drop(self.dispatch);
        self.export.shutdown().await.unwrap();
    }
}

/// `serve` with `settings` (and the HTTP action at `http`), exporting to
/// `receiver` every 200 ms.
async fn serve_exporting(
    settings: &Settings,
    http: Option<&Endpoint>,
    receiver: &OtlpReceiver,
) -> Served {
    let base = receiver.base_url();
    let mut vars = vec![
        ("OTEL_EXPORTER_OTLP_ENDPOINT", base.clone()),
        ("OTEL_SERVICE_NAME", "order-expiry".to_owned()),
        ("OTEL_BSP_SCHEDULE_DELAY", "200".to_owned()),
    ];
    if let Some(endpoint) = http {
        vars.push(("ORDER_EXPIRY__ACTION__KIND", "http".to_owned()));
        vars.push(("ORDER_EXPIRY__ACTION__HTTP__BASE_URL", endpoint.base_url()));
        // The payment gateway too, on the same endpoint: unpaid.
        vars.push(("ORDER_EXPIRY__ACTION__CHECK__ENABLED", "true".to_owned()));
        vars.push(("ORDER_EXPIRY__ACTION__CHECK__BASE_URL", endpoint.base_url()));
        // Within the test ladder's reach; never asked again here.
        vars.push(("ORDER_EXPIRY__ACTION__CHECK__STEPS_MS", "30000".to_owned()));
    }
    let vars: Vec<(&str, &str)> = vars.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let kind = if http.is_some() { "http" } else { "sql" };
    let log = std::env::temp_dir().join(format!(
        "order-expiry-following-{}-{kind}.log",
        settings.topology.prefix,
    ));
    let served = Served::start(&binary(), settings, &vars, log).await;
    served.wait_ready(Duration::from_secs(30)).await;
    served
}

/// Each `process` span of `id`, in arrival order.
fn processed(spans: &[ReceivedSpan], id: &str) -> Vec<ReceivedSpan> {
    spans
        .iter()
        .filter(|s| {
            s.name.starts_with("process ") && s.attributes.get("order_id").is_some_and(|o| o == id)
        })
        .cloned()
        .collect()
}

/// Waits until every order has a `process` span with its expected outcome.
async fn wait_for_outcomes(
    receiver: &OtlpReceiver,
    expected: &[(&str, &str)],
) -> Vec<ReceivedSpan> {
    poll(WAIT, 100, || async {
        let spans = receiver.spans();
        let missing: Vec<_> = expected
            .iter()
            .filter(|(id, outcome)| {
                !processed(&spans, id)
                    .iter()
                    .any(|s| s.attributes.get("outcome").is_some_and(|o| o == outcome))
            })
            .collect();
        match missing.is_empty() {
            true => Ok(spans),
            false => Err(format!(
                "no process span with {missing:?} in\n{}",
                receiver.tree()
            )),
        }
    })
    .await
}

/// `span` is a child of the span `creation` names, and links to it.
fn joins(span: &ReceivedSpan, creation: &TraceContext, tree: &str) {
    let (trace_id, span_id) = (
        &creation.traceparent()[3..35],
        &creation.traceparent()[36..52],
    );
    let id = &span.attributes["order_id"];
    assert_eq!(
        span.trace_id, trace_id,
        "{id}: the creation's trace\n{tree}"
    );
    assert_eq!(
        span.parent_span_id.as_deref(),
        Some(span_id),
        "{id}: a child of its creation\n{tree}"
    );
    assert!(
        span.links
            .iter()
            .any(|l| l.trace_id == trace_id && l.span_id == span_id),
        "{id}: a link to its creation: {:?}\n{tree}",
        span.links
    );
}

/// Every attribute an operator searches by.
fn described(span: &ReceivedSpan, queue: &str, action: &str, due_at: DateTime<Utc>) {
    let a = &span.attributes;
    let id = &a["order_id"];
    assert_eq!(span.name, format!("process {queue}"), "{id}");
    assert_eq!(a["messaging.system"], "rabbitmq", "{id}");
    assert_eq!(a["messaging.operation.type"], "process", "{id}");
    assert_eq!(a["messaging.destination.name"], queue, "{id}");
    assert_eq!(a["order_expiry.action"], action, "{id}");
    assert_eq!(a["server.address"], "127.0.0.1", "{id}");
    let due: DateTime<Utc> = a["order_expiry.due_at"].parse().expect("an RFC 3339 time");
    assert_eq!(due, due_at.trunc_subsecs(3), "{id}");
    assert!(
        a["order_expiry.attempt"].parse::<u32>().unwrap() >= 1,
        "{id}"
    );
    assert_eq!(span.service_name.as_deref(), Some("order-expiry"), "{id}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_orders_consumer_span_joins_the_trace_it_was_created_in() {
    let receiver = OtlpReceiver::start().await;
    let service = OrderService::start(&receiver);
    let env = World::new().await;

    // Cancelled alone; paid; extended; three in bundles.
    let due = at_ms(2_500).trunc_subsecs(3);
    let ids = ["f-cancel", "f-paid", "f-ext", "f-b1", "f-b2", "f-b3"];
    let created: HashMap<&str, TraceContext> =
        ids.iter().map(|id| (*id, service.create(id))).collect();
    env.create_orders(&ids.map(|id| (id.to_owned(), due))).await;
    env.execute("UPDATE orders SET status = 'paid' WHERE id = 'f-paid'")
        .await;
    env.execute(&format!(
        "UPDATE orders SET pay_deadline = '{}' WHERE id = 'f-ext'",
        (due + TimeDelta::minutes(30)).to_rfc3339()
    ))
    .await;
    let scheduler = env.scheduler().with_max_in_flight(1);
    let messages = ids
        .iter()
        .map(|id| message(id, due).with_trace(Some(created[id].clone())));
    schedule_bundled(&scheduler, messages.collect()).await;

    // One more, scheduled into another ladder and moved into this one by
    // `ladder migrate`.
    let mut old = env.settings.clone();
    old.topology.prefix = format!("{}-old", env.settings.topology.prefix);
    env.declare(&old).await.unwrap();
    let moved = service.create("f-moved");
    env.create_orders(&[("f-moved".to_owned(), due)]).await;
    let old_scheduler = Scheduler::from_settings(&old).unwrap();
    let message_moved = message("f-moved", due).with_trace(Some(moved.clone()));
    old_scheduler.schedule_message(message_moved).await.unwrap();
    let levels = old.topology.levels.to_string();
    let args = [
        "ladder",
        "migrate",
        "--from-prefix",
        &old.topology.prefix,
        "--from-levels",
        &levels,
        "--delete-old",
    ];
    let out = run_cli(&env.settings, &args, &[]).await;
    eprintln!("{}", succeeded("order-expiry ladder migrate", &out));

    let served = serve_exporting(&env.settings, None, &receiver).await;
    let expected = [
        ("f-cancel", "cancelled"),
        ("f-paid", "not_unpaid"),
        ("f-ext", "extended"),
        ("f-b1", "cancelled"),
        ("f-b2", "cancelled"),
        ("f-b3", "cancelled"),
        ("f-moved", "cancelled"),
    ];
    wait_for_outcomes(&receiver, &expected).await;
    served.terminate().await;
    service.flush().await;
    let spans = receiver.spans();
    let tree = receiver.tree();
    eprintln!("{tree}");

    let queue = env.ladder().due_queue();
    let batches: Vec<&ReceivedSpan> = spans.iter().filter(|s| s.name == "expire orders").collect();
    for (id, outcome) in expected {
        let creation = if id == "f-moved" {
            &moved
        } else {
            &created[id]
        };
        let of_order = processed(&spans, id);
        assert_eq!(of_order.len(), 1, "{id}: one process span\n{tree}");
        let span = &of_order[0];
        joins(span, creation, &tree);
        described(span, &queue, "sql", due);
        assert_eq!(span.attributes["outcome"], outcome, "{id}");
        if outcome == "cancelled" {
            let late: f64 = span.attributes["order_expiry.lateness_ms"].parse().unwrap();
            assert!(late >= 0.0, "{id} cancelled {late} ms early");
        }
        // The batch statement that expired it links to it, and it to the batch.
        let batch = batches
            .iter()
            .find(|b| b.links.iter().any(|l| l.span_id == span.span_id));
        let batch = batch.unwrap_or_else(|| panic!("{id}: no batch links to it\n{tree}"));
        assert_eq!(batch.attributes["order_expiry.action"], "sql");
        assert!(
            span.links.iter().any(|l| l.span_id == batch.span_id),
            "{id}: no link to its batch\n{tree}"
        );
    }
    // The order service's spans arrived: the trees read from creation on.
    for id in ids {
        let created = spans.iter().filter(|s| {
            s.name == "create order" && s.attributes.get("order_id").is_some_and(|o| o == id)
        });
        assert_eq!(created.count(), 1, "{id}\n{tree}");
    }
    env.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_http_action_passes_each_orders_span_on_parked_and_replayed() {
    let receiver = OtlpReceiver::start().await;
    let service = OrderService::start(&receiver);
    let env = World::new().await;
    let endpoint = Endpoint::start().await;
    // f-h-parked is refused once (a 4xx: parked), then accepted after replay.
    let refused = Reply::Status(422, r#"{"error":"order locked for audit"}"#.to_owned());
    let accepted = Reply::Status(200, "{}".to_owned());
    endpoint.script("expire", "f-h-parked", vec![refused, accepted]);

    let due = at_ms(2_000).trunc_subsecs(3);
    let ids = ["f-h-ok", "f-h-parked"];
    let created: HashMap<&str, TraceContext> =
        ids.iter().map(|id| (*id, service.create(id))).collect();
    let scheduler = env.scheduler();
    for id in ids {
        let message = message(id, due).with_trace(Some(created[id].clone()));
        scheduler.schedule_message(message).await.unwrap();
    }
    let served = serve_exporting(&env.settings, Some(&endpoint), &receiver).await;
    wait_for_outcomes(
        &receiver,
        &[("f-h-ok", "cancelled"), ("f-h-parked", "parked")],
    )
    .await;
    let out = env
        .cli_ok(&["parked", "replay", "--order-id", "f-h-parked"])
        .await;
    eprintln!("{out}");
    let spans = wait_for_outcomes(&receiver, &[("f-h-parked", "cancelled")]).await;
    served.terminate().await;
    service.flush().await;
    let tree = receiver.tree();
    eprintln!("{tree}");
    let queue = env.ladder().due_queue();

    // The payment gateway and the order service saw, with each request, the
    // traceparent of the process span that sent it.
    for id in ids {
        let of_order = processed(&spans, id);
        for kind in ["payment", "expire"] {
            let requests = endpoint.requests_for(kind, id);
            let n = requests.len();
            assert_eq!(n, of_order.len(), "{id}: {n} {kind} requests\n{tree}");
            for (request, span) in requests.iter().zip(&of_order) {
                joins(span, &created[id], &tree);
                described(span, &queue, "http", due);
                let sent = request.headers.get("traceparent").map(String::as_str);
                let expected = format!("00-{}-{}-01", span.trace_id, span.span_id);
                assert_eq!(
                    sent,
                    Some(expected.as_str()),
                    "{id}: the {kind} traceparent"
                );
            }
        }
    }
    let parked = processed(&spans, "f-h-parked");
    let outcomes: Vec<&str> = parked
        .iter()
        .map(|s| s.attributes["outcome"].as_str())
        .collect();
    assert_eq!(outcomes, ["parked", "cancelled"], "{tree}");
    let failed = parked[0].error.as_deref().unwrap_or_default();
    assert!(
        failed.contains("422"),
        "the parked span fails with why: {failed:?}"
    );
    assert_eq!(parked[1].error, None);
    env.cleanup().await;
}
