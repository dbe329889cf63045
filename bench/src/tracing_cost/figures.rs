//! The figures the comparison compares, off against on: their medians, how
//! they compare (a ratio or a difference), and their text.

use serde::Serialize;

use super::{Run, Stream};
use crate::fmt_ms;
use crate::goals::number;

/// One figure off and on: the medians of its runs, and how they compare.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Compared {
    /// The stream.
    pub stream: Stream,
    /// The figure.
    pub figure: Figure,
    /// Median of the "off" runs.
    pub off: f64,
    /// Median of the "on" runs.
    pub on: f64,
    /// `on / off` for a rate, `on - off` for a lateness.
    pub change: f64,
}

/// A figure of a run that the comparison compares.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Figure {
    /// The flash sale's orders cancelled per second.
    CancelRate,
    /// p99 lateness.
    P99,
    /// The flash sale's orders scheduled per second.
    ScheduleRate,
    /// serve's CPU per 1,000 orders.
    ServeCpu,
    /// Span bytes per order.
    SpanBytes,
    /// Orders whose span never reached the sink.
    SpansLost,
}

/// Every figure compared. Judged: the flash sale's cancels per second (a
/// ratio) and both streams' p99 lateness (a difference); the rest is
/// reported.
pub const COMPARED: [(Stream, Figure); 10] = [
    (Stream::Flash, Figure::CancelRate),
    (Stream::Flash, Figure::P99),
    (Stream::Steady, Figure::P99),
    (Stream::Flash, Figure::ScheduleRate),
    (Stream::Flash, Figure::ServeCpu),
    (Stream::Steady, Figure::ServeCpu),
    (Stream::Flash, Figure::SpanBytes),
    (Stream::Steady, Figure::SpanBytes),
    (Stream::Flash, Figure::SpansLost),
    (Stream::Steady, Figure::SpansLost),
];

impl Figure {
    /// Its name in the tables.
    pub fn name(self) -> &'static str {
        match self {
            Self::CancelRate => "cancels/s",
            Self::P99 => "p99 lateness",
            Self::ScheduleRate => "sched/s",
            Self::ServeCpu => "serve CPU/1k",
            Self::SpanBytes => "span bytes/order",
            Self::SpansLost => "order spans lost",
        }
    }

    /// Its value in `run`, if the run has it.
    pub(super) fn of(self, run: &Run) -> Option<f64> {
        match self {
            Self::CancelRate => run.cancel_rate,
            Self::P99 => Some(run.p99_ms),
            Self::ScheduleRate => run.schedule_rate,
            Self::ServeCpu => run.serve_cpu_per_1000_s,
            Self::SpanBytes => Some(run.span_bytes_per_order()),
            Self::SpansLost => Some(run.order_spans_lost() as f64),
        }
    }

    /// On against off: a ratio for a rate or a cost, a difference for a
    /// lateness or for bytes (none when off).
    pub(super) fn change(self, off: f64, on: f64) -> f64 {
        match self {
            Self::P99 | Self::SpanBytes | Self::SpansLost => on - off,
            Self::CancelRate | Self::ScheduleRate | Self::ServeCpu => on / off,
        }
    }

    /// `v` in its unit.
    pub(super) fn text(self, v: f64) -> String {
        match self {
            Self::P99 => fmt_ms(v),
            Self::ServeCpu => format!("{v:.3} s"),
            Self::CancelRate | Self::ScheduleRate | Self::SpanBytes | Self::SpansLost => number(v),
        }
    }

    /// A change as text: a signed difference in the unit, or a ratio.
    pub(super) fn change_text(self, change: f64) -> String {
        match self {
            Self::P99 => format!("{change:+.2} ms"),
            Self::SpanBytes | Self::SpansLost => format!("{change:+.0}"),
            Self::CancelRate | Self::ScheduleRate | Self::ServeCpu => format!("× {change:.3}"),
        }
    }
}
