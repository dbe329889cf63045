//! One run's figures: which stream, tracing off or on, its lateness, its
//! rates, the spans the sink received, serve's CPU; and its row of the table.

use std::fmt;

use serde::Serialize;

use crate::{flash, fmt_ms, lateness};

/// Which stream a run measured.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Stream {
    /// `flash`: the flash sale.
    Flash,
    /// `lateness`: the steady stream.
    Steady,
}

impl fmt::Display for Stream {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Flash => "flash sale",
            Self::Steady => "steady stream",
        })
    }
}

/// One run's figures.
#[derive(Debug, Clone, Serialize)]
pub struct Run {
    /// The stream.
    pub stream: Stream,
    /// Which round (1 to `--runs`).
    pub round: usize,
    /// `off` or `on`.
    pub tracing: &'static str,
    /// Orders scheduled.
    pub orders: usize,
    /// Orders cancelled.
    pub cancelled: usize,
    /// Unpaid orders never cancelled (the flash sale's lost, the steady
    /// stream's missed).
    pub not_cancelled: usize,
    /// Orders cancelled before their due time.
    pub early: usize,
    /// p99 lateness, ms.
    pub p99_ms: f64,
    /// The flash sale's orders cancelled per second, from the first due time
    /// to the last cancel (`flash`'s `cancel_rate`); none for the steady
    /// stream, whose rate is its schedule.
    pub cancel_rate: Option<f64>,
    /// The flash sale's orders scheduled per second (`flash`'s `sched/s`).
    pub schedule_rate: Option<f64>,
    /// Export requests the sink received during the run.
    pub span_requests: u64,
    /// Their bytes.
    pub span_bytes: u64,
    /// The spans in them.
    pub spans: u64,
    /// Those of orders (`process {queue}`): at least one per order, unless
    /// spans were lost on their way.
    pub order_spans: u64,
    /// serve's CPU seconds per 1,000 orders.
    pub serve_cpu_per_1000_s: Option<f64>,
    /// How long the run took, world and serve included, seconds.
    pub seconds: f64,
}

impl Run {
    /// A flash sale's figures (its one row); round, tracing and spans are
    /// the comparison's to fill in.
    pub fn flash(row: &flash::Row) -> Self {
        Self {
            stream: Stream::Flash,
            round: 0,
            tracing: "",
            orders: row.orders,
            cancelled: row.lateness.cancelled,
            not_cancelled: row.lost,
            early: row.lateness.early,
            p99_ms: row.lateness.p99_ms,
            cancel_rate: Some(row.cancel_rate),
            schedule_rate: Some(row.schedule_rate),
            span_requests: 0,
            span_bytes: 0,
            spans: 0,
            order_spans: 0,
            serve_cpu_per_1000_s: row.serve_cpu_per_1000_s,
            seconds: 0.0,
        }
    }

    /// The steady stream's figures: the ladder's row.
    pub fn steady(report: &lateness::Report) -> anyhow::Result<Self> {
        let row = report
            .rows
            .iter()
            .find(|r| r.design == "ladder")
            .ok_or_else(|| anyhow::anyhow!("the lateness report has no ladder row"))?;
        Ok(Self {
            stream: Stream::Steady,
            round: 0,
            tracing: "",
            orders: row.orders,
            cancelled: row.lateness.cancelled,
            not_cancelled: row.missed,
            early: row.lateness.early,
            p99_ms: row.lateness.p99_ms,
            cancel_rate: None,
            schedule_rate: None,
            span_requests: 0,
            span_bytes: 0,
            spans: 0,
            order_spans: 0,
            serve_cpu_per_1000_s: report.serve_cpu_per_1000_s,
            seconds: 0.0,
        })
    }

    /// Span bytes per order scheduled.
    pub fn span_bytes_per_order(&self) -> f64 {
        self.span_bytes as f64 / self.orders.max(1) as f64
    }

    /// Orders whose span never reached the sink, with tracing on (0 off).
    pub fn order_spans_lost(&self) -> u64 {
        if self.tracing == "on" {
            (self.orders as u64).saturating_sub(self.order_spans)
        } else {
            0
        }
    }

    /// The run as a progress line.
    pub fn line(&self) -> String {
        let c = cells(self);
        RUN_HEADER
            .iter()
            .zip(&c)
            .skip(3)
            .map(|(h, v)| format!("{h} {v}"))
            .collect::<Vec<_>>()
            .join(", ")
    }
}

pub(super) const RUN_HEADER: [&str; 14] = [
    "stream",
    "run",
    "tracing",
    "orders",
    "cancelled",
    "not cancelled",
    "early",
    "p99",
    "cancels/s",
    "sched/s",
    "spans",
    "order spans lost",
    "span bytes/order",
    "serve CPU/1k",
];

pub(super) fn cells(r: &Run) -> [String; 14] {
    let rate = |v: Option<f64>| v.map_or("-".to_owned(), |v| format!("{v:.0}"));
    [
        r.stream.to_string(),
        r.round.to_string(),
        r.tracing.to_owned(),
        r.orders.to_string(),
        r.cancelled.to_string(),
        r.not_cancelled.to_string(),
        r.early.to_string(),
        fmt_ms(r.p99_ms),
        rate(r.cancel_rate),
        rate(r.schedule_rate),
        format!(
            "{} ({:.1} kB) in {}",
            r.spans,
            r.span_bytes as f64 / 1e3,
            r.span_requests
        ),
        r.order_spans_lost().to_string(),
        format!("{:.0}", r.span_bytes_per_order()),
        r.serve_cpu_per_1000_s
            .map_or("n/a".to_owned(), |s| format!("{s:.3} s")),
    ]
}
