//! Span export checked once against a real receiver: the exporter `serve`
//! builds (`OtlpExport`, configured by the `OTEL_*` variables or
//! `telemetry.otlp`) writes OTLP/HTTP protobuf that the testkit's receiver
//! decodes with `opentelemetry-proto`, parents, links and resource intact;
//! and `serve` sends its last spans when it stops. Only the last test needs
//! the broker and the database.

use std::time::{Duration, SystemTime};

use opentelemetry::KeyValue;
use opentelemetry::trace::TraceContextExt;
use order_expiry::Settings;
use order_expiry::settings::LogFormat;
use order_expiry::telemetry::{OtlpExport, dispatch_with_export};
use order_expiry_testkit::{OtlpReceiver, ReceivedSpan, World, at_ms};
use tracing_opentelemetry::OpenTelemetrySpanExt;

const WAIT: Duration = Duration::from_secs(10);

/// `(trace id, span id)` of a `tracing` span, as the receiver writes them.
fn ids(span: &tracing::Span) -> (String, String) {
    let context = span.context();
    let span_context = context.span().span_context().clone();
    (
        span_context.trace_id().to_string(),
        span_context.span_id().to_string(),
    )
}

/// Emits "place order" with a child "schedule", and a root "expire" linked to
/// "place order", through `export` as `serve`'s subscriber would; returns the
/// ids of "place order".
fn emit(export: Option<&OtlpExport>) -> (String, String) {
    let dispatch = dispatch_with_export(LogFormat::Text, "info", export);
    tracing::dispatcher::with_default(&dispatch, || {
        let placed = tracing::info_span!("place order", order.id = "o-1", attempt = 2_i64);
        let schedule =
            placed.in_scope(|| tracing::info_span!("schedule", messaging.system = "rabbitmq"));
        drop(schedule);
        let expire = tracing::info_span!(parent: None, "expire", order.id = "o-1");
        let link = placed.context().span().span_context().clone();
        let why = vec![KeyValue::new("link.reason", "scheduled by")];
        expire.add_link_with_attributes(link, why);
        let placed_ids = ids(&placed);
        drop(expire);
        drop(placed);
        placed_ids
    })
}

#[tokio::test]
async fn spans_reach_an_otlp_receiver_with_parents_links_and_resource() {
    let receiver = OtlpReceiver::start().await;
    let base = receiver.base_url();
    let env = |name: &str| match name {
        "OTEL_EXPORTER_OTLP_ENDPOINT" => Some(base.clone()),
        "OTEL_SERVICE_NAME" => Some("order-expiry-test".to_owned()),
        "OTEL_RESOURCE_ATTRIBUTES" => Some("deployment.environment=test".to_owned()),
        _ => None,
    };
    // The settings leave export off: the endpoint variable turns it on.
    let settings = Settings::default().telemetry.otlp;
    let export = OtlpExport::start_with(&settings, &env).unwrap();
    let export = export.expect("OTEL_EXPORTER_OTLP_ENDPOINT turns export on");
    assert_eq!(export.endpoint(), format!("{base}/v1/traces"));

    let (trace_id, placed_id) = emit(Some(&export));
    export.shutdown().await.unwrap();

    let spans = receiver.wait_for_spans(3, WAIT).await;
    eprintln!("{}", receiver.tree());
    assert_eq!(spans.len(), 3, "{}", receiver.tree());
    let placed = receiver.span("place order");
    let schedule = receiver.span("schedule");
    let expire = receiver.span("expire");
    assert_eq!((&placed.trace_id, &placed.span_id), (&trace_id, &placed_id));
    assert_eq!(placed.parent_span_id, None);
    assert_eq!(schedule.trace_id, trace_id);
    assert_eq!(schedule.parent_span_id.as_ref(), Some(&placed_id));
    assert_ne!(expire.trace_id, trace_id, "a root of its own trace");
    assert_eq!(expire.parent_span_id, None);
    assert_eq!(expire.links.len(), 1, "{expire:?}");
    let link = &expire.links[0];
    assert_eq!((&link.trace_id, &link.span_id), (&trace_id, &placed_id));
    assert_eq!(link.attributes["link.reason"], "scheduled by");
    assert_eq!(placed.attributes["order.id"], "o-1");
    assert_eq!(placed.attributes["attempt"], "2");
    assert_eq!(schedule.attributes["messaging.system"], "rabbitmq");
    // Only the span's own fields: no location, thread, timing or target.
    let keys: Vec<&String> = placed.attributes.keys().collect();
    assert_eq!(keys, ["attempt", "order.id"]);
    for span in [&placed, &schedule, &expire] {
        assert_eq!(span.service_name.as_deref(), Some("order-expiry-test"));
        assert_eq!(span.resource["deployment.environment"], "test");
        assert_eq!(span.scope, "order-expiry");
    }
}

#[tokio::test]
async fn with_export_off_nothing_is_sent() {
    let receiver = OtlpReceiver::start().await;
    let mut settings = Settings::default().telemetry.otlp;
    settings.endpoint = receiver.base_url();
    let no_env = |_: &str| None;
    let off = OtlpExport::start_with(&settings, &no_env).unwrap();
    assert!(off.is_none(), "telemetry.otlp.enabled is false by default");
    settings.enabled = true;
    let disabled = |name: &str| (name == "OTEL_SDK_DISABLED").then(|| "true".to_owned());
    let off = OtlpExport::start_with(&settings, &disabled).unwrap();
    assert!(
        off.is_none(),
        "OTEL_SDK_DISABLED=true wins over the setting"
    );
    emit(None);
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(receiver.requests(), 0, "{}", receiver.tree());

    // The same settings do reach the receiver once on: the silence above is
    // export being off, not a receiver that hears nothing.
    let on = OtlpExport::start_with(&settings, &no_env).unwrap();
    let on = on.expect("telemetry.otlp.enabled turns export on");
    emit(Some(&on));
    on.flush().await.unwrap();
    receiver.wait_for_spans(3, WAIT).await;
    on.shutdown().await.unwrap();
}

/// `serve` exports when the standard variable says so, and flushes when it
/// stops: with the batch delay at a minute, only the flush after the drain can
/// deliver the span of an order cancelled just before SIGTERM.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_sends_its_last_spans_when_it_stops() {
    let receiver = OtlpReceiver::start().await;
    let env = World::new().await;
    let base = receiver.base_url();
    let vars = [
        ("OTEL_EXPORTER_OTLP_ENDPOINT", base.as_str()),
        ("OTEL_SERVICE_NAME", "order-expiry-serve"),
        ("OTEL_BSP_SCHEDULE_DELAY", "60000"),
    ];
    let served = env.serve_ready(&vars).await;
    let placed = SystemTime::now();
    env.place(&[("traced-1".to_owned(), at_ms(0))]).await;
    env.wait_cancelled(&["traced-1"], WAIT).await;
    assert_eq!(receiver.requests(), 0, "the batch waits its minute");
    let stopping = SystemTime::now();
    served.terminate().await;

    let spans = receiver.wait_for_spans(1, WAIT).await;
    eprintln!("{}", receiver.tree());
    let of_the_order =
        |s: &&ReceivedSpan| s.attributes.get("order_id").map(String::as_str) == Some("traced-1");
    let Some(delivery) = spans.iter().find(of_the_order) else {
        panic!("no span of traced-1:\n{}", receiver.tree());
    };
    assert_eq!(delivery.attributes["outcome"], "cancelled");
    // It ended at its verdict, before serve was told to stop, although it
    // was exported only then.
    assert!(
        placed <= delivery.start && delivery.start <= delivery.end && delivery.end <= stopping,
        "placed {placed:?}, span {:?} to {:?}, stopping {stopping:?}",
        delivery.start,
        delivery.end
    );
    assert_eq!(delivery.service_name.as_deref(), Some("order-expiry-serve"));
    env.cleanup().await;
}
