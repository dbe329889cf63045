//! One place that sets up logging (text or JSON) and the Prometheus recorder.

use std::sync::OnceLock;

use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use tracing_subscriber::EnvFilter;

use crate::settings::LogFormat;

/// Lateness buckets, in seconds: fine below 100 ms where the target is, coarse above.
const LATENESS_BUCKETS: &[f64] = &[
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
];

/// Installs the global tracing subscriber. `RUST_LOG` overrides `filter`. Logs go to
/// stderr so that stdout stays for command output (`topology export`). Calling it
/// twice (tests) keeps the first.
pub fn init(format: LogFormat, filter: &str) {
    let filter = EnvFilter::try_from_default_env()
        .or_else(|_| EnvFilter::try_new(filter))
        .unwrap_or_else(|_| EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    let _ = match format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder.json().with_current_span(true).try_init(),
    };
}

/// Every metric order-expiry exports: name, type, labels and meaning. `/metrics`
/// serves the meaning as `# HELP`; the README's catalog lists the same metrics
/// (`scripts/check-deploy` compares the two with the names used in `src/`).
pub const METRICS: &[(&str, &str, &str, &str)] = &[
    (
        "order_expiry_messages_total",
        "counter",
        "outcome",
        "Due messages handled, by outcome: cancelled, not_unpaid, unknown, parked.",
    ),
    (
        "order_expiry_lateness_seconds",
        "histogram",
        "",
        "Time from due_at to the cancel statement's answer, for cancelled orders.",
    ),
    (
        "order_expiry_early_total",
        "counter",
        "",
        "Orders cancelled before their due_at (must stay 0).",
    ),
    (
        "order_expiry_held_total",
        "counter",
        "",
        "Messages that arrived before due_at and were held unacked until then.",
    ),
    (
        "order_expiry_parked_total",
        "counter",
        "",
        "Messages copied to the parked queue: they can never be processed.",
    ),
    (
        "order_expiry_retries_total",
        "counter",
        "",
        "Batches or parks retried after a database or broker failure.",
    ),
    (
        "order_expiry_reconnects_total",
        "counter",
        "",
        "Consumer sessions that ended on a broker fault and were restarted.",
    ),
    (
        "order_expiry_consuming",
        "gauge",
        "",
        "1 while the consumer is subscribed to the due queue on a live connection.",
    ),
    (
        "order_expiry_swept_total",
        "counter",
        "",
        "Overdue unpaid orders cancelled by the safety-net sweeper.",
    ),
    (
        "order_expiry_sweep_errors_total",
        "counter",
        "",
        "Sweeps that failed (database errors).",
    ),
    (
        "order_expiry_schedule_total",
        "counter",
        "result",
        "Scheduler::schedule calls by result: ok or the error kind (publisher side).",
    ),
];

/// Outcome labels of `order_expiry_messages_total`, registered at 0.
const OUTCOMES: &[&str] = &["cancelled", "not_unpaid", "unknown", "parked"];

/// `# HELP` for every metric, and every unlabelled counter and gauge of the
/// service at 0, so series exist from the start: `rate()`/`increase()` then see
/// the first parked message too (a counter that appears at 1 shows no increase).
fn describe_metrics() {
    for &(name, kind, labels, help) in METRICS {
        match kind {
            "histogram" => metrics::describe_histogram!(name, help),
            "gauge" => {
                metrics::describe_gauge!(name, help);
                metrics::gauge!(name).set(0.0);
            }
            _ => {
                metrics::describe_counter!(name, help);
                if labels.is_empty() {
                    metrics::counter!(name).increment(0);
                }
            }
        }
    }
    for outcome in OUTCOMES {
        metrics::counter!("order_expiry_messages_total", "outcome" => *outcome).increment(0);
    }
}

/// For tests: logs only when `TEST_LOG` is set, so a passing run stays quiet.
pub fn init_for_tests() {
    if std::env::var_os("TEST_LOG").is_some() {
        init(LogFormat::Text, "info,order_expiry=debug");
    }
}

/// The process-wide Prometheus recorder, installed on first use.
pub fn metrics_handle() -> PrometheusHandle {
    static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();
    HANDLE
        .get_or_init(|| {
            let builder = PrometheusBuilder::new()
                .set_buckets_for_metric(
                    Matcher::Full("order_expiry_lateness_seconds".to_owned()),
                    LATENESS_BUCKETS,
                )
                .unwrap_or_else(|_| PrometheusBuilder::new());
            let recorder = builder.build_recorder();
            let handle = recorder.handle();
            // Another recorder may already be installed (a host application's);
            // then this handle renders nothing, which is all we can do.
            if metrics::set_global_recorder(recorder).is_ok() {
                describe_metrics();
            }
            handle
        })
        .clone()
}
