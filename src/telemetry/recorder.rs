//! The process-wide Prometheus recorder `/metrics` renders.

use std::sync::OnceLock;

use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};

use super::catalog::{
    ARRIVAL_LATENESS_SECONDS, BATCH_ORDERS, BATCH_SECONDS, CATALOG, Kind, LATENESS_SECONDS,
    MESSAGES_TOTAL, Metric, ORDERS_PER_MESSAGE, OUTBOX_LAG_SECONDS,
};

/// Lateness buckets, in seconds: fine below 100 ms where the target is, coarse above.
const LATENESS_BUCKETS: &[f64] = &[
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
];

/// Arrival lateness buckets, in seconds: the ladder's milliseconds, then the
/// seconds of an outage and the minutes of a stalled dead-letter worker
/// (RabbitMQ retries after 180 s on stock settings).
const ARRIVAL_LATENESS_BUCKETS: &[f64] = &[
    0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0,
];

/// Relay lag buckets, in seconds: fine around the 50 ms target, then up to the
/// minutes a broker outage keeps rows waiting.
const OUTBOX_LAG_BUCKETS: &[f64] = &[
    0.005, 0.01, 0.02, 0.03, 0.05, 0.075, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0,
];

/// Orders per due message: 1 is a v1 message, the rest bundle sizes up to
/// well past the default `publisher.bundle_max_orders` (100).
const ORDERS_PER_MESSAGE_BUCKETS: &[f64] =
    &[1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0, 200.0, 500.0, 1000.0];

/// Orders per action call: 1 at low load, up to `consumer.batch_max` (200)
/// and a custom one's larger values.
const BATCH_ORDERS_BUCKETS: &[f64] = &[
    1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0, 150.0, 200.0, 500.0, 1000.0,
];

/// Action call durations, in seconds: a commit's millisecond, a full batch's
/// tens of ms, a slow order service's seconds up to its timeout.
const BATCH_SECONDS_BUCKETS: &[f64] = &[
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

/// Every histogram's buckets (the exporter's default buckets suit none of them).
const HISTOGRAM_BUCKETS: &[(Metric, &[f64])] = &[
    (LATENESS_SECONDS, LATENESS_BUCKETS),
    (ARRIVAL_LATENESS_SECONDS, ARRIVAL_LATENESS_BUCKETS),
    (OUTBOX_LAG_SECONDS, OUTBOX_LAG_BUCKETS),
    (ORDERS_PER_MESSAGE, ORDERS_PER_MESSAGE_BUCKETS),
    (BATCH_ORDERS, BATCH_ORDERS_BUCKETS),
    (BATCH_SECONDS, BATCH_SECONDS_BUCKETS),
];

/// The recorder, installed on first use.
pub(crate) fn metrics_handle() -> PrometheusHandle {
    static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();
    HANDLE
        .get_or_init(|| {
            let builder = HISTOGRAM_BUCKETS
                .iter()
                .try_fold(PrometheusBuilder::new(), |builder, (metric, buckets)| {
                    builder.set_buckets_for_metric(Matcher::Full(metric.name.to_owned()), buckets)
                })
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

/// `# HELP` for every metric, and every unlabelled counter and gauge of the
/// service at 0, so series exist from the start: `rate()`/`increase()` then see
/// the first parked message too (a counter that appears at 1 shows no increase).
fn describe_metrics() {
    for metric in CATALOG {
        let (name, help) = (metric.name, metric.help);
        match metric.kind {
            Kind::Histogram => metrics::describe_histogram!(name, help),
            Kind::Gauge => {
                metrics::describe_gauge!(name, help);
                metrics::gauge!(name).set(0.0);
            }
            Kind::Counter => {
                metrics::describe_counter!(name, help);
                if metric.labels.is_empty() {
                    metrics::counter!(name).increment(0);
                }
            }
        }
    }
    // Every outcome label of `order_expiry_messages_total`, at 0.
    for outcome in crate::service::Outcome::ALL {
        metrics::counter!(MESSAGES_TOTAL.name, "outcome" => outcome.label()).increment(0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_histogram_has_buckets_of_its_own() {
        for metric in CATALOG.iter().filter(|m| m.kind == Kind::Histogram) {
            let buckets = HISTOGRAM_BUCKETS
                .iter()
                .find(|(m, _)| m.name == metric.name)
                .map(|(_, buckets)| *buckets);
            let buckets = buckets.unwrap_or_else(|| panic!("{} has no buckets", metric.name));
            assert!(
                buckets.windows(2).all(|w| w[0] < w[1]),
                "{}: buckets must rise",
                metric.name
            );
        }
    }
}
