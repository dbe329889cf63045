//! The figures as text: one Markdown table, a row per run, and the
//! progress line of one run.

use super::on_off;
use super::report::{Report, Row};
use crate::fmt_ms;

const HEADER: [&str; 15] = [
    "path",
    "bundles",
    "orders",
    "sched/s",
    "p50",
    "p99",
    "p99.9",
    "max",
    "ladder",
    "swept",
    "early",
    "lost",
    "msg/order",
    "broker CPU/1k",
    "serve RSS",
];

fn cells(r: &Row) -> [String; 15] {
    [
        r.path.clone(),
        on_off(r.bundles).to_owned(),
        r.orders.to_string(),
        format!("{:.0}", r.schedule_rate),
        fmt_ms(r.lateness.p50_ms),
        fmt_ms(r.lateness.p99_ms),
        fmt_ms(r.lateness.p999_ms),
        fmt_ms(r.lateness.max_ms),
        format!("{:.0}", r.by_ladder),
        format!("{:.0}", r.swept),
        r.lateness.early.to_string(),
        r.lost.to_string(),
        format!(
            "{:.3}{}",
            r.messages_per_order,
            if r.bundle_metric { "" } else { "*" }
        ),
        r.broker_cpu_per_1000_s
            .map_or("n/a".into(), |s| format!("{s:.2} s")),
        format!("{:.0} MB", r.serve_peak_rss_mb),
    ]
}

/// One run as a progress line.
pub(super) fn row_line(r: &Row) -> String {
    let c = cells(r);
    HEADER
        .iter()
        .zip(&c)
        .skip(2)
        .map(|(h, v)| format!("{h} {v}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The figures as a text table (Markdown).
pub(super) fn table(report: &Report) -> String {
    let mut out = format!(
        "flash sale on {} (RabbitMQ {}), started {}: {} orders created within {:.0} s, payment window {:.0} s, \
         sweeper {}, {} holding queues, max_in_flight {}, prefetch {}, {} cores\n",
        report.broker,
        report.broker_version,
        report.started,
        report.orders,
        report.within_s,
        report.window_s,
        on_off(report.sweeper),
        report.queue_type,
        report.max_in_flight,
        report.prefetch,
        report.cores
    );
    let rows: Vec<[String; 15]> = report.rows.iter().map(cells).collect();
    out.push_str(&crate::markdown::table(HEADER, &rows, |_| true));
    out.push_str(
        "lateness = cancelled_at - due_at; ladder/swept: each row's mark (cancelled_by); msg/order: due messages per order \
         (* serve has no orders_per_message histogram: one message per order); broker CPU: its beam.smp, \
         first schedule until settled and the ladder empty, per 1,000 orders\n",
    );
    out
}
