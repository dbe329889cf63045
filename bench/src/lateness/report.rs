//! The lateness figures: one row per design, read from the database, as a text
//! table and JSON.

use order_expiry_testkit::World;
use serde::Serialize;

use super::stalls::Stalls;
use crate::Judged;
use crate::cdf::{Curve, Distribution};
use crate::fmt_ms;
use crate::goals::{Bench, Measurement};

/// One design's figures, in milliseconds.
#[derive(Debug, Clone, Serialize)]
pub struct Row {
    /// `ladder` or `naive`.
    pub design: String,
    /// Orders scheduled.
    pub orders: usize,
    /// Orders still unpaid when the run ended (never cancelled: missed).
    pub missed: usize,
    /// The cancelled orders' lateness.
    #[serde(flatten)]
    pub lateness: Distribution,
    /// The orders cancelled more than [`LATE_MS`] late, by due time: when a
    /// run is late, whether it was a moment (a stall) or all along.
    #[serde(skip)]
    pub late: Vec<LateOrder>,
}

/// Lateness from which an order is listed in [`Row::late`], ms.
pub const LATE_MS: f64 = 250.0;

/// One order cancelled more than [`LATE_MS`] late.
#[derive(Debug, Clone)]
pub struct LateOrder {
    /// Its due time.
    pub due_at: chrono::DateTime<chrono::Utc>,
    /// How late it was cancelled, ms.
    pub lateness_ms: f64,
}

/// The benchmark's result.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Report {
    /// One row per design.
    pub rows: Vec<Row>,
    /// Orders per second.
    pub rate: u32,
    /// Scheduling time, seconds.
    pub duration_s: f64,
    /// Delay range, seconds.
    pub min_delay_s: f64,
    /// Delay range, seconds.
    pub max_delay_s: f64,
    /// Share paid before due.
    pub pay_share: f64,
    /// Holding queue type of the ladder.
    pub queue_type: String,
    /// Whether the machine or the process stood still during the run.
    pub stalls: Stalls,
    /// Flash-sale orders on top of the steady stream (0: none).
    pub burst: usize,
    /// How long the flash sale took to place, seconds.
    pub burst_over_s: f64,
    /// Flash-sale delay range, seconds.
    pub burst_min_delay_s: f64,
    /// Flash-sale delay range, seconds.
    pub burst_max_delay_s: f64,
    /// `publisher.max_in_flight` of the run.
    pub max_in_flight: usize,
    /// serve's CPU seconds per 1,000 steady-stream orders, from its start to
    /// the end of the run, when serve was the consumer.
    pub serve_cpu_per_1000_s: Option<f64>,
}

impl Row {
    /// The row in the lateness picture.
    pub(crate) fn curve(&self) -> Curve<'_> {
        self.lateness.curve(&self.design, "")
    }

    /// Figures from every cancelled order's lateness.
    pub fn from_lateness(
        design: &str,
        orders: usize,
        missed: usize,
        lateness_ms: Vec<f64>,
    ) -> Self {
        Self {
            design: design.to_owned(),
            orders,
            missed,
            lateness: Distribution::of(lateness_ms),
            late: Vec::new(),
        }
    }

    /// The figures of the orders whose id matches `pattern`, from the database:
    /// `cancelled_at - pay_deadline` of each cancelled one.
    pub(super) async fn read(
        world: &World,
        design: &str,
        pattern: &str,
        orders: usize,
    ) -> anyhow::Result<Self> {
        let cancelled = crate::cdf::cancelled(world, pattern).await?;
        let mut late: Vec<LateOrder> = cancelled
            .iter()
            .filter(|(lateness_ms, _)| *lateness_ms > LATE_MS)
            .map(|&(lateness_ms, due_at)| LateOrder {
                due_at,
                lateness_ms,
            })
            .collect();
        late.sort_by_key(|o| o.due_at);
        let lateness = cancelled.into_iter().map(|(l, _)| l).collect();
        let client = world.store.client().await?;
        let missed: i64 = client
            .query_one(
                "SELECT count(*) FROM orders WHERE id LIKE $1 AND status = 'unpaid'",
                &[&pattern],
            )
            .await?
            .try_get(0)?;
        Ok(Self {
            late,
            ..Self::from_lateness(design, orders, missed as usize, lateness)
        })
    }

    /// The late orders by the second they were due, e.g. `14:12:03 12 up to
    /// 1.4 s`: empty when none was later than [`LATE_MS`].
    pub fn late_by_second(&self) -> Vec<String> {
        let mut out: Vec<(i64, usize, f64)> = Vec::new();
        for o in &self.late {
            let second = o.due_at.timestamp();
            match out.last_mut() {
                Some((s, n, worst)) if *s == second => {
                    *n += 1;
                    *worst = worst.max(o.lateness_ms);
                }
                _ => out.push((second, 1, o.lateness_ms)),
            }
        }
        out.into_iter()
            .map(|(second, n, worst)| {
                let at = chrono::DateTime::from_timestamp(second, 0).unwrap_or_default();
                format!("{} {n} up to {}", at.format("%H:%M:%S"), fmt_ms(worst))
            })
            .collect()
    }
}

impl Judged for Report {
    /// Whose goals the run is judged by: the flash sale's with a burst, else
    /// the steady stream's.
    fn bench(&self) -> Bench {
        if self.burst > 0 {
            Bench::Burst
        } else {
            Bench::Lateness
        }
    }

    /// The ladder's figures, named as the goals' measures: `ladder: …` for
    /// the steady stream alone, `steady stream: …` and `flash sale: …` beside
    /// a sale. The naive design has no goal.
    fn measurements(&self) -> Vec<Measurement> {
        let mut out = Vec::new();
        for row in &self.rows {
            let l = &row.lateness;
            let name = match (row.design.as_str(), self.burst > 0) {
                ("ladder", false) => "ladder",
                ("ladder", true) => "steady stream",
                ("ladder, flash sale", _) => "flash sale",
                _ => continue,
            };
            out.extend([
                Measurement::new(format!("{name}: cancelled early"), l.early as f64),
                Measurement::new(format!("{name}: missed"), row.missed as f64),
                Measurement::new(format!("{name}: p99 lateness"), l.p99_ms),
                Measurement::new(format!("{name}: max lateness"), l.max_ms),
            ]);
        }
        out
    }

    /// The figures as a text table.
    fn table(&self) -> String {
        let mut out = format!(
            "lateness of cancels: {} orders/s for {:.0} s, delays {:.0}-{:.0} s, {:.0}% paid before due, {} holding queues\n",
            self.rate,
            self.duration_s,
            self.min_delay_s,
            self.max_delay_s,
            self.pay_share * 100.0,
            self.queue_type
        );
        if self.burst > 0 {
            out.push_str(&format!(
                "flash sale: {} more orders placed within {:.1} s, delays {:.0}-{:.0} s; publisher.max_in_flight {}\n",
                self.burst,
                self.burst_over_s,
                self.burst_min_delay_s,
                self.burst_max_delay_s,
                self.max_in_flight
            ));
        }
        out.push_str(&format!(
            "{:<18} {:>7} {:>9} {:>6} {:>6} {:>9} {:>9} {:>9} {:>9} {:>9}\n",
            "design", "orders", "cancelled", "missed", "early", "p50", "p90", "p99", "p99.9", "max"
        ));
        for r in &self.rows {
            let l = &r.lateness;
            out.push_str(&format!(
                "{:<18} {:>7} {:>9} {:>6} {:>6} {:>9} {:>9} {:>9} {:>9} {:>9}\n",
                r.design,
                r.orders,
                l.cancelled,
                r.missed,
                l.early,
                fmt_ms(l.p50_ms),
                fmt_ms(l.p90_ms),
                fmt_ms(l.p99_ms),
                fmt_ms(l.p999_ms),
                fmt_ms(l.max_ms)
            ));
        }
        // The first dozen seconds: enough to tell a moment's stall from a run late
        // all along.
        const SHOWN: usize = 12;
        for r in &self.rows {
            let late = r.late_by_second();
            if !late.is_empty() {
                let more = match late.len().saturating_sub(SHOWN) {
                    0 => String::new(),
                    n => format!("; and {n} more seconds"),
                };
                out.push_str(&format!(
                    "{}: {} later than {LATE_MS} ms, by the second due: {}{more}\n",
                    r.design,
                    r.late.len(),
                    late[..late.len().min(SHOWN)].join("; ")
                ));
            }
        }
        out.push_str(&self.stalls.line());
        out.push('\n');
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::goals::{all_met, judge};

    fn report(burst: usize, rows: Vec<Row>) -> Report {
        Report {
            rows,
            burst,
            ..Report::default()
        }
    }

    #[test]
    fn late_orders_are_told_by_the_second_they_were_due() {
        let at = |s: i64, ms: i64| {
            chrono::DateTime::from_timestamp(s, 0).unwrap() + chrono::TimeDelta::milliseconds(ms)
        };
        let mut row = Row::from_lateness("ladder", 10, 0, vec![3.0; 10]);
        assert!(row.late_by_second().is_empty());
        let late = |due_at, lateness_ms| LateOrder {
            due_at,
            lateness_ms,
        };
        row.late = vec![
            late(at(3, 100), 1283.5),
            late(at(3, 900), 400.0),
            late(at(5, 0), 300.0),
        ];
        assert_eq!(
            row.late_by_second(),
            ["00:00:03 2 up to 1283.5 ms", "00:00:05 1 up to 300.0 ms"]
        );
    }

    #[test]
    fn a_steady_run_measures_every_lateness_goal() {
        let ladder = Row::from_lateness("ladder", 10, 0, vec![3.0, 1.0, 2.0]);
        let naive = Row::from_lateness("naive", 10, 5, vec![-1.0, 30_000.0]);
        let r = report(0, vec![ladder, naive]);
        assert_eq!(r.bench(), Bench::Lateness);
        let verdicts = judge(Bench::Lateness, &r.measurements(), true);
        assert!(
            verdicts.iter().all(|v| v.measured.is_some()),
            "{verdicts:?}"
        );
        assert!(
            all_met(&verdicts),
            "the naive row is not judged: {verdicts:?}"
        );
    }

    #[test]
    fn a_late_or_early_sale_misses_its_goals() {
        let steady = Row::from_lateness("ladder", 10, 0, vec![4.0; 10]);
        let on_time = Row::from_lateness("ladder, flash sale", 10, 0, vec![5.0; 10]);
        let r = report(10, vec![steady.clone(), on_time]);
        assert_eq!(r.bench(), Bench::Burst);
        let verdicts = judge(Bench::Burst, &r.measurements(), true);
        assert_eq!(verdicts.len(), 6);
        assert!(all_met(&verdicts), "{verdicts:?}");
        let mut late = vec![5.0; 99];
        late.push(101.0);
        let late = Row::from_lateness("ladder, flash sale", 100, 0, late);
        let verdicts = judge(
            Bench::Burst,
            &report(100, vec![steady.clone(), late]).measurements(),
            true,
        );
        let missed: Vec<_> = verdicts
            .iter()
            .filter(|v| !v.met)
            .map(|v| v.goal.measure.as_str())
            .collect();
        assert_eq!(missed, ["flash sale: max lateness"]);
        let early = Row::from_lateness("ladder, flash sale", 10, 0, vec![-0.5, 5.0]);
        let verdicts = judge(
            Bench::Burst,
            &report(10, vec![steady, early]).measurements(),
            true,
        );
        assert!(!all_met(&verdicts));
    }
}
