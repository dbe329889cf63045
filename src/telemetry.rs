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
            let _ = metrics::set_global_recorder(recorder);
            handle
        })
        .clone()
}
