//! The flash sale's figures: one row per run (path, bundles), read from the
//! database and serve's metrics, as a text table, JSON and goal measurements.

use chrono::{DateTime, Utc};
use order_expiry::Settings;
use order_expiry_testkit::World;
use serde::Serialize;

use super::broker::Broker;
use super::{FlashArgs, Switch};
use crate::Judged;
use crate::cdf::{Curve, Distribution};
use crate::goals::{Bench, Measurement};

/// One run's figures.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Row {
    /// `library`, `cli` or `outbox`.
    pub path: String,
    /// Bundles on (the built-in default) or off (one order per message).
    pub bundles: bool,
    /// Orders of the sale.
    pub orders: usize,
    /// Seconds from the first schedule to the last confirm (outbox: to the
    /// table empty again).
    pub scheduled_secs: f64,
    /// Orders over `scheduled_secs`.
    pub schedule_rate: f64,
    /// Cancelled through the ladder: the rows serve's cancel statement marked.
    pub by_ladder: f64,
    /// Cancelled by the sweeper: the rows its sweep statement marked.
    pub swept: f64,
    /// Still unpaid at the end: never cancelled.
    pub lost: usize,
    /// The lateness of the orders cancelled, by anyone.
    #[serde(flatten)]
    pub lateness: Distribution,
    /// Orders cancelled per second over the sale: the cancelled orders over
    /// the time from the first one's due time to the last cancel. The due
    /// times pace it (at most `orders / within`); it drops when the cancels
    /// fall behind them.
    pub cancel_rate: f64,
    /// Due messages per order (1 when serve has no `orders_per_message`).
    pub messages_per_order: f64,
    /// Whether serve had the `order_expiry_orders_per_message` histogram.
    pub bundle_metric: bool,
    /// The broker's CPU seconds per 1,000 orders, from the first schedule
    /// until every order is settled and the ladder and due queue are empty.
    pub broker_cpu_per_1000_s: Option<f64>,
    /// serve's peak RSS, MB.
    pub serve_peak_rss_mb: f64,
    /// serve's CPU seconds per 1,000 orders, from its start to the end of the
    /// run.
    pub serve_cpu_per_1000_s: Option<f64>,
    /// Orders that reached serve after their due time (the ladder's share of
    /// the lateness; the rest is serve's and the database's).
    pub arrived_late: f64,
    /// Of those, the ones that reached it more than 100 ms after.
    pub arrived_over_100ms: f64,
    /// Orders per cancel statement, on average (0 when serve has no
    /// `order_expiry_batch_orders`).
    pub batch_mean_orders: f64,
    /// The cancel statement's time per order at those batch sizes, µs.
    pub statement_us_per_order: f64,
}

impl Row {
    /// The lateness figures from every cancelled order's lateness; the rest
    /// zero until the run fills them in.
    pub fn from_lateness(
        path: &str,
        bundles: bool,
        orders: usize,
        lost: usize,
        lateness_ms: Vec<f64>,
    ) -> Self {
        Self {
            path: path.to_owned(),
            bundles,
            orders,
            lost,
            lateness: Distribution::of(lateness_ms),
            messages_per_order: 1.0,
            ..Self::default()
        }
    }

    /// `cancelled_at - pay_deadline` of every cancelled order and the unpaid
    /// ones left, from the world's database.
    pub(super) async fn read(
        world: &World,
        path: &str,
        bundles: bool,
        orders: usize,
    ) -> anyhow::Result<Self> {
        let cancelled = crate::cdf::cancelled(world, "%").await?;
        let cancel_rate = cancel_rate(&cancelled);
        let lateness = cancelled.into_iter().map(|(ms, _)| ms).collect();
        let lost = world.count_orders("unpaid").await?;
        let client = world.store.client().await?;
        let marks = client
            .query_one(
                "SELECT count(*) FILTER (WHERE cancelled_by = 'ladder'), \
                 count(*) FILTER (WHERE cancelled_by = 'sweeper') \
                 FROM orders WHERE status = 'cancelled'",
                &[],
            )
            .await?;
        let (by_ladder, swept): (i64, i64) = (marks.try_get(0)?, marks.try_get(1)?);
        let mut row = Self::from_lateness(path, bundles, orders, usize::try_from(lost)?, lateness);
        anyhow::ensure!(
            usize::try_from(by_ladder + swept)? == row.lateness.cancelled,
            "{} orders cancelled, {by_ladder} marked by the ladder and {swept} by the sweeper: \
             something else cancelled the rest",
            row.lateness.cancelled
        );
        row.by_ladder = by_ladder as f64;
        row.swept = swept as f64;
        row.cancel_rate = cancel_rate;
        Ok(row)
    }

    /// `library, bundles on`.
    pub fn label(&self) -> String {
        format!("{}, bundles {}", self.path, super::on_off(self.bundles))
    }

    /// The row in the lateness picture.
    pub(crate) fn curve(&self) -> Curve<'_> {
        let swept = format!("swept {:.0}, ", self.swept);
        self.lateness.curve(&self.label(), &swept)
    }
}

/// Orders cancelled per second, from the first due time to the last cancel,
/// of `(lateness ms, due_at)` of every cancelled order; 0 for none.
fn cancel_rate(cancelled: &[(f64, DateTime<Utc>)]) -> f64 {
    let first_due = cancelled.iter().map(|(_, due)| *due).min();
    let last_cancel = cancelled
        .iter()
        .map(|(ms, due)| due.timestamp_millis() as f64 + ms)
        .max_by(f64::total_cmp);
    match (first_due, last_cancel) {
        (Some(first), Some(last)) if last > first.timestamp_millis() as f64 => {
            cancelled.len() as f64 * 1000.0 / (last - first.timestamp_millis() as f64)
        }
        _ => 0.0,
    }
}

/// The benchmark's result.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Report {
    /// When it started (UTC).
    pub started: String,
    /// The command line.
    pub command: String,
    /// The broker's URL, password hidden.
    pub broker: String,
    /// The broker's version (the local node's `rabbitmqctl status`).
    pub broker_version: String,
    /// The broker process whose CPU was read.
    pub broker_pid: Option<u32>,
    /// Orders of each run.
    pub orders: usize,
    /// Created within, seconds.
    pub within_s: f64,
    /// Payment window, seconds.
    pub window_s: f64,
    /// Whether serve's sweeper ran.
    pub sweeper: bool,
    /// Holding queue type.
    pub queue_type: String,
    /// `publisher.max_in_flight`.
    pub max_in_flight: usize,
    /// `consumer.prefetch`.
    pub prefetch: u16,
    /// Cores of this machine.
    pub cores: usize,
    /// One row per run.
    pub rows: Vec<Row>,
}

impl Report {
    pub(super) fn new(settings: &Settings, args: &FlashArgs, broker: &Broker) -> Self {
        Self {
            started: Utc::now().format("%Y-%m-%d %H:%M UTC").to_string(),
            command: std::env::args().collect::<Vec<_>>().join(" "),
            broker: settings.amqp.display_url(),
            broker_version: broker.version.clone(),
            broker_pid: broker.pid,
            orders: args.orders,
            within_s: args.within.as_secs_f64(),
            window_s: args.window.as_secs_f64(),
            sweeper: args.sweeper == Switch::On,
            queue_type: settings.topology.queue_type.as_str().to_owned(),
            max_in_flight: settings.publisher.max_in_flight,
            prefetch: settings.consumer.prefetch,
            cores: std::thread::available_parallelism().map_or(0, |n| n.get()),
            rows: Vec::new(),
        }
    }
}

impl Judged for Report {
    fn bench(&self) -> Bench {
        Bench::Flash
    }

    fn table(&self) -> String {
        super::table::table(self)
    }

    /// The bundles-on runs' figures, named as the goals' measures
    /// (`<path>: swept` ...); bundles-off runs are reported, not judged.
    fn measurements(&self) -> Vec<Measurement> {
        let mut out = Vec::new();
        for row in self.rows.iter().filter(|r| r.bundles) {
            let (p, l) = (&row.path, &row.lateness);
            out.extend([
                Measurement::new(format!("{p}: swept"), row.swept),
                Measurement::new(format!("{p}: cancelled early"), l.early as f64),
                Measurement::new(format!("{p}: lost"), row.lost as f64),
                Measurement::new(format!("{p}: p99 lateness"), l.p99_ms),
                Measurement::new(format!("{p}: max lateness"), l.max_ms),
            ]);
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::goals::{all_met, judge};

    fn row(path: &str, bundles: bool, lateness: Vec<f64>, lost: usize, swept: f64) -> Row {
        let mut r = Row::from_lateness(path, bundles, lateness.len() + lost, lost, lateness);
        r.swept = swept;
        r
    }

    fn report(rows: Vec<Row>) -> Report {
        Report {
            rows,
            ..Report::default()
        }
    }

    #[test]
    fn the_cancel_rate_runs_from_the_first_due_time_to_the_last_cancel() {
        let at = |ms: i64| DateTime::from_timestamp_millis(1_000_000 + ms).unwrap();
        // Four orders due over 3 s, the last cancelled 1 s late: 4 in 4 s.
        let cancelled = [
            (5.0, at(0)),
            (2.0, at(1_000)),
            (0.0, at(2_000)),
            (1_000.0, at(3_000)),
        ];
        assert_eq!(cancel_rate(&cancelled), 1.0);
        // On time: 4 in 3.005 s.
        let on_time = [
            (5.0, at(0)),
            (2.0, at(1_000)),
            (0.0, at(2_000)),
            (5.0, at(3_000)),
        ];
        assert!((cancel_rate(&on_time) - 4.0 / 3.005).abs() < 1e-9);
        assert_eq!(cancel_rate(&[]), 0.0);
        assert_eq!(cancel_rate(&[(-1.0, at(0))]), 0.0, "no time elapsed");
    }

    #[test]
    fn only_bundles_on_runs_are_judged_and_every_goal_is_measured() {
        let on_time: Vec<Row> = ["library", "cli", "outbox"]
            .iter()
            .map(|p| row(p, true, vec![5.0; 10], 0, 0.0))
            .collect();
        let mut rows = on_time.clone();
        rows.push(row("library", false, vec![-1.0, 9_000.0], 3, 7.0));
        let verdicts = judge(Bench::Flash, &report(rows).measurements(), true);
        assert!(
            verdicts.iter().all(|v| v.measured.is_some()),
            "{verdicts:?}"
        );
        assert!(
            all_met(&verdicts),
            "the bundles-off run is not judged: {verdicts:?}"
        );
        assert!(report(on_time).table().contains("| library |"));
    }

    #[test]
    fn a_swept_early_lost_or_late_order_misses_the_goal() {
        let missed = |r: Row| {
            let verdicts = judge(Bench::Flash, &report(vec![r]).measurements(), false);
            verdicts
                .iter()
                .filter(|v| !v.met)
                .map(|v| v.goal.measure.clone())
                .collect::<Vec<_>>()
        };
        assert!(missed(row("cli", true, vec![5.0; 10], 0, 0.0)).is_empty());
        assert_eq!(
            missed(row("cli", true, vec![5.0; 10], 0, 1.0)),
            ["cli: swept"]
        );
        assert_eq!(
            missed(row("cli", true, vec![5.0; 10], 1, 0.0)),
            ["cli: lost"]
        );
        let early = missed(row("outbox", true, vec![-0.5, 5.0], 0, 0.0));
        assert_eq!(early, ["outbox: cancelled early"]);
        let mut late = vec![5.0; 99];
        late.push(1_001.0);
        assert_eq!(
            missed(row("library", true, late, 0, 0.0)),
            ["library: max lateness"]
        );
        let slow = missed(row("library", true, vec![101.0; 10], 0, 0.0));
        assert_eq!(slow, ["library: p99 lateness"]);
    }
}
