//! A failover's timeline, counted from the fault: when `serve` noticed it
//! (its first failed database call), when the standby took writes, when
//! `serve`'s `/readyz` said 200 again (when watched), the first cancel on the new primary, the last late order; and
//! every order's lateness past the later of its due time and the promotion,
//! the bound the scenarios assert.

use std::collections::HashMap;
use std::path::Path;
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use order_expiry_testkit::{OrderRow, ReadyWatch, Served};

use crate::support::Ledger;

/// The bound: every order is cancelled within this of the later of its due
/// time and the promotion.
pub const BOUND: Duration = Duration::from_secs(10);

/// The fault and the promotion, on both clocks.
#[derive(Debug, Clone, Copy)]
pub struct Timeline {
    fault_instant: Instant,
    pub fault: DateTime<Utc>,
    /// When the promoted standby took writes.
    pub promoted: DateTime<Utc>,
}

/// What the timeline shows, in seconds after the fault.
#[derive(Debug, Clone, Default)]
pub struct Recovery {
    /// `serve` first logged a failed database call.
    pub detected: Option<f64>,
    pub promoted: f64,
    /// `/readyz` said 200 again, after the promotion.
    pub ready: Option<f64>,
    /// The first cancel at or after the promotion (the database's clock).
    pub first_cancel: Option<f64>,
    /// The latest order past max(due, promotion): its id, its cancel (s after
    /// the fault) and how late that was.
    pub last: Option<(String, f64, f64)>,
    /// p50, p99 and max lateness past max(due, promotion) of the orders due
    /// after the fault, in ms.
    pub lateness_ms: [f64; 3],
    /// Orders due between the fault and the promotion.
    pub due_in_outage: usize,
    /// Orders cancelled later than [`BOUND`] past max(due, promotion).
    pub over_bound: Vec<String>,
}

impl Timeline {
    /// The fault happens now.
    pub fn fault_now() -> (Instant, DateTime<Utc>) {
        (Instant::now(), Utc::now())
    }

    pub fn new(fault: (Instant, DateTime<Utc>), promoted: DateTime<Utc>) -> Self {
        Self {
            fault_instant: fault.0,
            fault: fault.1,
            promoted,
        }
    }

    fn secs(&self, at: DateTime<Utc>) -> f64 {
        (at - self.fault).num_microseconds().unwrap_or(0) as f64 / 1e6
    }

    fn since_fault(&self, at: Instant) -> f64 {
        at.saturating_duration_since(self.fault_instant)
            .as_secs_f64()
    }

    /// The recovery of the orders of `ledger`, as `rows`, `serve`'s log and
    /// its `/readyz` (when watched) saw it.
    pub fn recovery(
        &self,
        ledger: &Ledger,
        rows: &HashMap<String, OrderRow>,
        served: &Served,
        watch: Option<&ReadyWatch>,
    ) -> Recovery {
        let promoted_instant =
            self.fault_instant + (self.promoted - self.fault).to_std().unwrap_or_default();
        let ready = watch.and_then(|w| w.first_after(promoted_instant, |s| s == 200));
        let mut r = Recovery {
            detected: first_warning(served.log_path(), self.fault).map(|at| self.secs(at)),
            promoted: self.secs(self.promoted),
            ready: ready.map(|at| self.since_fault(at)),
            ..Recovery::default()
        };
        let mut late = Vec::new();
        for placed in &ledger.orders {
            if placed.due_at > self.fault && placed.due_at <= self.promoted {
                r.due_in_outage += 1;
            }
            let Some(row) = rows.get(&placed.id) else {
                continue;
            };
            let Some(cancelled_at) = row.cancelled_at.filter(|_| row.status == "cancelled") else {
                continue;
            };
            if cancelled_at >= self.promoted {
                let at = self.secs(cancelled_at);
                r.first_cancel = Some(r.first_cancel.map_or(at, |first: f64| first.min(at)));
            }
            let from = placed.due_at.max(self.promoted);
            let past = (cancelled_at - from).num_microseconds().unwrap_or(0) as f64 / 1e3;
            if past > BOUND.as_millis() as f64 {
                r.over_bound.push(format!("{} {past:.0} ms", placed.id));
            }
            if placed.due_at > self.fault {
                late.push(past);
                if r.last.as_ref().is_none_or(|(_, _, worst)| past > *worst) {
                    r.last = Some((placed.id.clone(), self.secs(cancelled_at), past));
                }
            }
        }
        late.sort_by(f64::total_cmp);
        let pick = |q: f64| late.get(((late.len() as f64 - 1.0) * q).round() as usize);
        r.lateness_ms = [0.5, 0.99, 1.0].map(|q| pick(q).copied().unwrap_or(0.0).max(0.0));
        r
    }
}

/// When `serve` first logged a warning (a database call that failed) at or
/// after `since`.
fn first_warning(log: &Path, since: DateTime<Utc>) -> Option<DateTime<Utc>> {
    let text = std::fs::read_to_string(log).ok()?;
    text.lines()
        .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
        .filter(|entry| entry["level"] == "WARN")
        .filter_map(|entry| entry["timestamp"].as_str()?.parse::<DateTime<Utc>>().ok())
        .find(|at| *at >= since)
}

impl Recovery {
    /// Every order within [`BOUND`] of the later of its due time and the promotion.
    pub fn assert_within_bound(&self) {
        assert!(
            self.over_bound.is_empty(),
            "{} orders cancelled more than {BOUND:?} past max(due, promotion): {:?}",
            self.over_bound.len(),
            &self.over_bound[..self.over_bound.len().min(10)]
        );
    }

    /// The timeline as one line of the FIGURES output.
    pub fn describe(&self) -> String {
        let s = |v: Option<f64>| v.map_or("-".to_owned(), |v| format!("+{v:.2} s"));
        let last = self
            .last
            .as_ref()
            .map_or("none".to_owned(), |(id, at, past)| {
                format!("+{at:.2} s ({id}, {past:.0} ms past max(due, promotion))")
            });
        format!(
            "timeline from the fault: serve's first failed call {}, promoted +{:.2} s, /readyz 200 {}, \
             first cancel on the new primary {}, last late order {last}; {} orders due in the outage; \
             lateness past max(due, promotion) of the orders due after the fault p50 {:.0} ms, \
             p99 {:.0} ms, max {:.0} ms",
            s(self.detected),
            self.promoted,
            s(self.ready),
            s(self.first_cancel),
            self.due_in_outage,
            self.lateness_ms[0],
            self.lateness_ms[1],
            self.lateness_ms[2],
        )
    }
}
