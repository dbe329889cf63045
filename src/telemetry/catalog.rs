//! Every metric order-expiry exports, in one table: name, type, labels and the
//! meaning `/metrics` serves as `# HELP`. The code records metrics only through
//! these constants, and tests hold the book's catalog (`docs/src/operating/metrics.md`) and the Grafana
//! dashboard to the same table.

// The publisher records `order_expiry_schedule_total` only; the rest belong to
// the service.
#![cfg_attr(not(feature = "service"), allow(dead_code))]

/// How a metric is exported.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    Counter,
    Gauge,
    Histogram,
}

/// One exported metric.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Metric {
    pub(crate) name: &'static str,
    pub(crate) kind: Kind,
    pub(crate) labels: &'static [&'static str],
    pub(crate) help: &'static str,
}

const fn metric(name: &'static str, kind: Kind, help: &'static str) -> Metric {
    Metric {
        name,
        kind,
        labels: &[],
        help,
    }
}

pub(crate) const MESSAGES_TOTAL: Metric = Metric {
    labels: &["outcome"],
    ..metric(
        "order_expiry_messages_total",
        Kind::Counter,
        "Due orders handled, by outcome: cancelled, not_unpaid, unknown, parked, extended, paid_at_gateway, pending_at_gateway, check_requeued, unknown_requeued, retry_requeued.",
    )
};
pub(crate) const LATENESS_SECONDS: Metric = metric(
    "order_expiry_lateness_seconds",
    Kind::Histogram,
    "Time from due_at to the cancel statement's answer, for cancelled orders.",
);
pub(crate) const ARRIVAL_LATENESS_SECONDS: Metric = metric(
    "order_expiry_arrival_lateness_seconds",
    Kind::Histogram,
    "Time from a message's due_at (or re-check time) to its arrival at the consumer, for messages that arrive due, whatever the action kind: the ladder's and the broker's share of lateness. A stalled ladder level shows as arrivals minutes late.",
);
pub(crate) const ORDERS_PER_MESSAGE: Metric = metric(
    "order_expiry_orders_per_message",
    Kind::Histogram,
    "Orders in each due message the consumer decoded: 1 for a v1 message, more for a v2 bundle (group commit under load). _count is due messages, _sum is orders.",
);
pub(crate) const BATCH_ORDERS: Metric = metric(
    "order_expiry_batch_orders",
    Kind::Histogram,
    "Orders in each call of the action (one cancel statement, for the SQL action): batches grow with the load, up to consumer.batch_max. _sum / _count is the mean batch.",
);
pub(crate) const BATCH_SECONDS: Metric = metric(
    "order_expiry_batch_seconds",
    Kind::Histogram,
    "Duration of each call of the action, whatever its result: with order_expiry_batch_orders, the action's cost per order at the batch sizes the load makes.",
);
pub(crate) const EARLY_TOTAL: Metric = metric(
    "order_expiry_early_total",
    Kind::Counter,
    "Orders cancelled before their due_at (must stay 0).",
);
pub(crate) const HELD_TOTAL: Metric = metric(
    "order_expiry_held_total",
    Kind::Counter,
    "Messages that arrived before due_at and were held unacked until then.",
);
pub(crate) const NOT_DUE_TOTAL: Metric = Metric {
    labels: &["clock"],
    ..metric(
        "order_expiry_not_due_total",
        Kind::Counter,
        "Orders the reference clock said were not due yet when serve's corrected clock said they were (the database's now(), or an order service's 425), held and tried again; by clock: database, http.",
    )
};
pub(crate) const CLOCK_OFFSET_SECONDS: Metric = Metric {
    labels: &["clock"],
    ..metric(
        "order_expiry_clock_offset_seconds",
        Kind::Gauge,
        "The reference clock minus this host's clock, as last measured (positive: this host is behind); by clock: database (timed SELECT clock_timestamp()), http (the order service's answers). serve holds and releases orders by its clock plus this.",
    )
};
pub(crate) const CATCH_UP_TOTAL: Metric = metric(
    "order_expiry_catch_up_total",
    Kind::Counter,
    "Orders of the catch-up queue (what no consumer took within topology.catch_up_after_ms: an outage's backlog) started in a batch; its rate is the backlog's drain rate, at most consumer.catch_up_rate.",
);
pub(crate) const CATCH_UP_ORDERS: Metric = metric(
    "order_expiry_catch_up_orders",
    Kind::Gauge,
    "Orders of the catch-up queue this serve holds, waiting for room behind the orders due now and for consumer.catch_up_rate (the rest of the backlog waits in the queue: rabbitmq_queue_messages of P.catch-up).",
);
pub(crate) const CATCH_UP_OLDEST_SECONDS: Metric = metric(
    "order_expiry_catch_up_oldest_seconds",
    Kind::Gauge,
    "How long past its due time the first order this serve holds of the catch-up queue is; 0 when it holds none.",
);
pub(crate) const PARKED_TOTAL: Metric = metric(
    "order_expiry_parked_total",
    Kind::Counter,
    "Messages copied to the parked queue: they can never be processed.",
);
pub(crate) const RETRIES_TOTAL: Metric = metric(
    "order_expiry_retries_total",
    Kind::Counter,
    "Batches or parks retried after a database or broker failure.",
);
pub(crate) const RECONNECTS_TOTAL: Metric = metric(
    "order_expiry_reconnects_total",
    Kind::Counter,
    "Consumer sessions that ended on a broker fault and were restarted.",
);
pub(crate) const REPAIRS_TOTAL: Metric = Metric {
    labels: &["what"],
    ..metric(
        "order_expiry_repairs_total",
        Kind::Counter,
        "Re-declarations of the consumer's queues after one went missing, by what: due (the broker ended the consumer), parked (a park was unroutable).",
    )
};
pub(crate) const CONSUMING: Metric = metric(
    "order_expiry_consuming",
    Kind::Gauge,
    "1 while the consumer is subscribed to the due queue on a live connection.",
);
pub(crate) const SWEPT_TOTAL: Metric = metric(
    "order_expiry_swept_total",
    Kind::Counter,
    "Overdue unpaid orders cancelled by the safety-net sweeper.",
);
pub(crate) const SWEEP_ERRORS_TOTAL: Metric = metric(
    "order_expiry_sweep_errors_total",
    Kind::Counter,
    "Sweeps that failed (database errors).",
);
pub(crate) const OVERDUE_UNPAID: Metric = metric(
    "order_expiry_overdue_unpaid",
    Kind::Gauge,
    "Unpaid orders more than overdue.margin_ms past their pay_deadline, counted in the database every overdue.interval_ms (action.kind = sql only; -1 until the first count).",
);
pub(crate) const SCHEDULE_TOTAL: Metric = Metric {
    labels: &["result"],
    ..metric(
        "order_expiry_schedule_total",
        Kind::Counter,
        "Scheduler::schedule calls by result: ok or the error kind (publisher side).",
    )
};

pub(crate) const OUTBOX_PENDING: Metric = metric(
    "order_expiry_outbox_pending",
    Kind::Gauge,
    "Rows waiting in order_expiry_outbox, as this replica last counted them (every outbox.poll_interval_ms).",
);
pub(crate) const OUTBOX_OLDEST_SECONDS: Metric = metric(
    "order_expiry_outbox_oldest_seconds",
    Kind::Gauge,
    "Age of the oldest row waiting in order_expiry_outbox, from its created_at (its transaction's start); 0 when empty.",
);
pub(crate) const OUTBOX_LAG_SECONDS: Metric = metric(
    "order_expiry_outbox_lag_seconds",
    Kind::Histogram,
    "Relay lag: from a row's created_at (its transaction's start) to the broker's confirm of its message, for rows relayed and deleted.",
);
pub(crate) const OUTBOX_PUBLISH_FAILURES_TOTAL: Metric = metric(
    "order_expiry_outbox_publish_failures_total",
    Kind::Counter,
    "Outbox rows whose publish failed (broker down, nack, unroutable, timeout); they stay in the table and are retried.",
);
pub(crate) const OUTBOX_REJECTED_TOTAL: Metric = metric(
    "order_expiry_outbox_rejected_total",
    Kind::Counter,
    "Outbox rows that can never be published (invalid order id, due time beyond the ladder), moved to order_expiry_outbox_rejected.",
);

/// The whole catalog, in the order of the book's Metrics page.
pub(crate) const CATALOG: &[Metric] = &[
    MESSAGES_TOTAL,
    LATENESS_SECONDS,
    ARRIVAL_LATENESS_SECONDS,
    ORDERS_PER_MESSAGE,
    BATCH_ORDERS,
    BATCH_SECONDS,
    EARLY_TOTAL,
    HELD_TOTAL,
    NOT_DUE_TOTAL,
    CLOCK_OFFSET_SECONDS,
    CATCH_UP_TOTAL,
    CATCH_UP_ORDERS,
    CATCH_UP_OLDEST_SECONDS,
    PARKED_TOTAL,
    RETRIES_TOTAL,
    RECONNECTS_TOTAL,
    REPAIRS_TOTAL,
    CONSUMING,
    SWEPT_TOTAL,
    SWEEP_ERRORS_TOTAL,
    OVERDUE_UNPAID,
    OUTBOX_PENDING,
    OUTBOX_OLDEST_SECONDS,
    OUTBOX_LAG_SECONDS,
    OUTBOX_PUBLISH_FAILURES_TOTAL,
    OUTBOX_REJECTED_TOTAL,
    SCHEDULE_TOTAL,
];

#[cfg(test)]
mod tests {
    use std::collections::{BTreeMap, BTreeSet};
    use std::path::Path;

    use super::*;

    fn repo_file(path: &str) -> String {
        let full = Path::new(env!("CARGO_MANIFEST_DIR")).join(path);
        std::fs::read_to_string(&full).unwrap_or_else(|e| panic!("{}: {e}", full.display()))
    }

    fn by_name() -> BTreeMap<&'static str, Metric> {
        CATALOG.iter().map(|m| (m.name, *m)).collect()
    }

    /// The rows `| `name` | type | labels | meaning |` of the book's Metrics page.
    fn book_catalog() -> Vec<(String, String, BTreeSet<String>, String)> {
        repo_file("docs/src/operating/metrics.md")
            .lines()
            .filter_map(|line| {
                let cells: Vec<&str> = line.split('|').map(str::trim).collect();
                let name = cells.get(1)?.strip_prefix("`order_expiry_")?;
                let name = format!("order_expiry_{}", name.strip_suffix('`')?);
                let labels = cells[3]
                    .split(',')
                    .map(|l| l.trim().trim_matches('`').to_owned())
                    .filter(|l| !l.is_empty() && l != "-")
                    .collect();
                Some((name, cells[2].to_owned(), labels, cells[4].to_owned()))
            })
            .collect()
    }

    #[test]
    fn the_book_catalog_is_this_catalog() {
        let rows = book_catalog();
        let documented: BTreeSet<&str> = rows.iter().map(|r| r.0.as_str()).collect();
        let exported: BTreeSet<&str> = CATALOG.iter().map(|m| m.name).collect();
        assert_eq!(
            documented, exported,
            "the book's metrics catalog vs the code"
        );
        let catalog = by_name();
        for (name, kind, labels, meaning) in &rows {
            let metric = catalog[name.as_str()];
            // The Prometheus type name is the variant's, in lower case.
            let exported = format!("{:?}", metric.kind).to_lowercase();
            assert_eq!(kind, &exported, "the book's type of {name}");
            let expected: BTreeSet<String> =
                metric.labels.iter().map(|l| (*l).to_owned()).collect();
            assert_eq!(labels, &expected, "the book's labels of {name}");
            assert!(!meaning.is_empty(), "the book gives {name} no meaning");
        }
    }

    /// A `counter!`, `gauge!` or `histogram!` named by a string literal would
    /// bypass the catalog.
    #[test]
    fn the_code_records_metrics_by_catalog_name_only() {
        let mut pending = vec![Path::new(env!("CARGO_MANIFEST_DIR")).join("src")];
        while let Some(dir) = pending.pop() {
            for entry in std::fs::read_dir(&dir).unwrap() {
                let path = entry.unwrap().path();
                if path.is_dir() {
                    pending.push(path);
                    continue;
                }
                let text = std::fs::read_to_string(&path).unwrap();
                let squeezed: String = text.split_whitespace().collect();
                for kind in ["counter", "gauge", "histogram"] {
                    // Built here, so that this file does not match itself.
                    let call = format!("{kind}!(\"");
                    let uses = squeezed.contains(&call);
                    assert!(!uses, "{} uses {call}...", path.display());
                }
            }
        }
    }

    /// Every `order_expiry_*` series the dashboard queries is exported, and every
    /// label it groups by exists on what it queries.
    #[test]
    fn the_dashboard_queries_exported_metrics_and_labels() {
        let dashboard: serde_json::Value =
            serde_json::from_str(&repo_file("deploy/grafana/order-expiry.json")).unwrap();
        let catalog = by_name();
        let panels = dashboard["panels"].as_array().expect("panels");
        let mut queried = 0;
        for target in panels
            .iter()
            .flat_map(|p| p["targets"].as_array().into_iter().flatten())
        {
            let expr = target["expr"].as_str().unwrap_or_default();
            let mut labels: BTreeSet<&str> = BTreeSet::from(["le"]);
            for metric in exported(&catalog, expr, "the dashboard") {
                labels.extend(catalog[metric].labels);
                queried += 1;
            }
            if words(expr).any(|w| w.starts_with("rabbitmq_")) {
                labels.extend(["vhost", "queue"]);
            }
            for label in groupings(expr).flat_map(|g| g.split(',')) {
                let label = label.trim();
                assert!(
                    labels.contains(label),
                    "{expr}: no label {label:?} to group by"
                );
            }
        }
        assert!(queried > 0, "the dashboard queries no order_expiry_ metric");
    }

    /// Every `order_expiry_*` series the alerting rules query is exported (a
    /// renamed metric would leave its alert silent forever).
    #[test]
    fn the_alert_rules_query_exported_metrics() {
        let rules = repo_file("deploy/prometheus/order-expiry-rules.yaml");
        let catalog = by_name();
        let mut queried = BTreeSet::new();
        // The queries: every line but comments and the annotations' prose.
        let prose = ["#", "summary:", "description:"];
        for line in rules
            .lines()
            .filter(|l| !prose.iter().any(|p| l.trim_start().starts_with(p)))
        {
            queried.extend(exported(&catalog, line, "the alert rules"));
        }
        for name in [OVERDUE_UNPAID, ARRIVAL_LATENESS_SECONDS, SWEPT_TOTAL].map(|m| m.name) {
            assert!(queried.contains(name), "no alert reads {name}");
        }
    }

    /// The metrics the `order_expiry_*` series of `query` belong to (a
    /// histogram's `_bucket`, `_sum` and `_count` series are its own), each
    /// asserted to be exported.
    fn exported<'a>(catalog: &BTreeMap<&str, Metric>, query: &'a str, by: &str) -> Vec<&'a str> {
        let series = words(query).filter(|w| w.starts_with("order_expiry_"));
        let metric = |name: &'a str| {
            ["_bucket", "_sum", "_count"]
                .iter()
                .find_map(|s| name.strip_suffix(s))
                .filter(|b| catalog.get(b).is_some_and(|m| m.kind == Kind::Histogram))
                .unwrap_or(name)
        };
        let metrics: Vec<&str> = series.map(metric).collect();
        for &m in &metrics {
            assert!(
                catalog.contains_key(m),
                "{by} queries {m}, which nothing exports"
            );
        }
        metrics
    }

    /// The label lists of `by (...)` and `without (...)` clauses.
    fn groupings(expr: &str) -> impl Iterator<Item = &str> {
        ["by", "without"].into_iter().flat_map(move |keyword| {
            expr.match_indices(keyword).filter_map(move |(at, _)| {
                let word_start = expr[..at]
                    .chars()
                    .last()
                    .is_none_or(|c| !(c.is_ascii_alphanumeric() || c == '_'));
                let rest = expr[at + keyword.len()..].trim_start().strip_prefix('(')?;
                word_start.then(|| rest.split(')').next().unwrap_or(""))
            })
        })
    }

    fn words(expr: &str) -> impl Iterator<Item = &str> {
        expr.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .filter(|w| !w.is_empty())
    }
}
