//! The comparison's result: every [`Run`] and the medians off and on,
//! compared ([`crate::tracing_cost::COMPARED`]); the tables and the
//! measurements the goals judge.

use chrono::Utc;
use order_expiry::Settings;
use serde::Serialize;

use super::figures::{COMPARED, Compared, Figure};
use super::run::{RUN_HEADER, cells};
use super::{Run, Stream, TracingCostArgs};
use crate::goals::{Bench, Measurement};
use crate::{Judged, median};

/// The comparison's result.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Report {
    /// When it started (UTC).
    pub started: String,
    /// The command line.
    pub command: String,
    /// The broker's URL, password hidden.
    pub broker: String,
    /// The broker's version, as the flash sale read it.
    pub broker_version: String,
    /// Whether these were the short runs.
    pub quick: bool,
    /// Runs of each stream each way.
    pub runs_each_way: usize,
    /// The flash sale's command.
    pub flash: String,
    /// The steady stream's command.
    pub steady: String,
    /// How long the whole comparison took, seconds.
    pub seconds: f64,
    /// Every run, in the order they ran.
    pub runs: Vec<Run>,
}

impl Report {
    /// An empty report of `args`' comparison.
    pub(super) fn new(settings: &Settings, args: &TracingCostArgs) -> Self {
        let mut steady = format!("lateness {}", Bench::Lateness.args(args.quick));
        if !steady.contains("--no-naive") {
            steady.push_str(" --no-naive");
        }
        Self {
            started: Utc::now().format("%Y-%m-%d %H:%M UTC").to_string(),
            command: std::env::args().collect::<Vec<_>>().join(" "),
            broker: settings.amqp.display_url(),
            quick: args.quick,
            runs_each_way: args.runs,
            flash: format!(
                "flash {} --path {}",
                Bench::Flash.args(args.quick),
                args.path.as_str()
            ),
            steady: format!("{steady} (consumer: serve)"),
            ..Self::default()
        }
    }

    /// The median of `figure` over the runs of `stream` with `tracing`.
    fn median_of(
        &self,
        stream: Stream,
        tracing: &str,
        figure: impl Fn(&Run) -> Option<f64>,
    ) -> f64 {
        let values: Vec<f64> = self
            .runs
            .iter()
            .filter(|r| r.stream == stream && r.tracing == tracing)
            .filter_map(figure)
            .collect();
        if values.is_empty() {
            f64::NAN
        } else {
            median(&values)
        }
    }

    /// Every figure off and on ([`COMPARED`]).
    pub fn compared(&self) -> Vec<Compared> {
        COMPARED
            .into_iter()
            .map(|(stream, figure)| {
                let off = self.median_of(stream, "off", |r| figure.of(r));
                let on = self.median_of(stream, "on", |r| figure.of(r));
                Compared {
                    stream,
                    figure,
                    off,
                    on,
                    change: figure.change(off, on),
                }
            })
            .collect()
    }
}

impl Judged for Report {
    fn bench(&self) -> Bench {
        Bench::TracingCost
    }

    fn table(&self) -> String {
        let mut out = format!(
            "tracing cost on {} (RabbitMQ {}), started {}: {} runs each way, interleaved off, on; \
             took {:.1} min{}\n  flash sale: {}\n  steady stream: {}\n",
            self.broker,
            self.broker_version,
            self.started,
            self.runs_each_way,
            self.seconds / 60.0,
            if self.quick {
                " (quick settings: NOT those the goals were stated for)"
            } else {
                ""
            },
            self.flash,
            self.steady,
        );
        let rows: Vec<[String; 14]> = self.runs.iter().map(cells).collect();
        out.push_str(&crate::markdown::table(RUN_HEADER, &rows, |c| c >= 3));
        out.push('\n');
        let compared: Vec<[String; 5]> = self
            .compared()
            .iter()
            .map(|c| {
                [
                    c.stream.to_string(),
                    c.figure.name().to_owned(),
                    c.figure.text(c.off),
                    c.figure.text(c.on),
                    c.figure.change_text(c.change),
                ]
            })
            .collect();
        let header = [
            "stream",
            "figure",
            "off (median)",
            "on (median)",
            "on vs off",
        ];
        out.push_str(&crate::markdown::table(header, &compared, |c| c >= 2));
        out.push_str(
            "cancels/s: orders cancelled over the time from the first due time to the last cancel \
             (paced by the due times: it drops when the cancels fall behind); sched/s: flash's \
             schedule rate; spans: the spans, bytes and requests the sink received (counted, not \
             decoded); order spans lost: orders scheduled with no `process` span received; \
             serve CPU: seconds per 1,000 orders over serve's life\n",
        );
        out
    }

    /// The judged comparisons, named as the goals' measures.
    fn measurements(&self) -> Vec<Measurement> {
        self.compared()
            .into_iter()
            .filter_map(|c| {
                let measure = match (c.stream, c.figure) {
                    (Stream::Flash, Figure::CancelRate) => "flash sale: cancels/s, on / off",
                    (Stream::Flash, Figure::P99) => "flash sale: p99 lateness, on - off",
                    (Stream::Steady, Figure::P99) => "steady stream: p99 lateness, on - off",
                    _ => return None,
                };
                Some(Measurement::new(measure, c.change))
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::goals::{all_met, judge};

    fn run(stream: Stream, tracing: &'static str, p99_ms: f64, rate: f64) -> Run {
        Run {
            stream,
            round: 1,
            tracing,
            orders: 1000,
            cancelled: 1000,
            not_cancelled: 0,
            early: 0,
            p99_ms,
            cancel_rate: (stream == Stream::Flash).then_some(rate),
            schedule_rate: (stream == Stream::Flash).then_some(rate),
            span_requests: 3,
            span_bytes: if tracing == "on" { 300_000 } else { 0 },
            spans: if tracing == "on" { 1010 } else { 0 },
            order_spans: if tracing == "on" { 990 } else { 0 },
            serve_cpu_per_1000_s: Some(0.1),
            seconds: 10.0,
        }
    }

    /// Five runs each way of both streams: the flash sale's rates and p99s
    /// off and on, the steady stream's p99s off and on.
    fn report(flash: [(f64, f64, f64, f64); 5], steady: [(f64, f64); 5]) -> Report {
        let mut runs = Vec::new();
        for ((rate_off, p99_off, rate_on, p99_on), (steady_off, steady_on)) in
            flash.into_iter().zip(steady)
        {
            runs.push(run(Stream::Flash, "off", p99_off, rate_off));
            runs.push(run(Stream::Flash, "on", p99_on, rate_on));
            runs.push(run(Stream::Steady, "off", steady_off, 0.0));
            runs.push(run(Stream::Steady, "on", steady_on, 0.0));
        }
        Report {
            runs,
            runs_each_way: 5,
            ..Report::default()
        }
    }

    fn missed(r: &Report) -> Vec<String> {
        let verdicts = judge(Bench::TracingCost, &r.measurements(), true);
        assert!(
            verdicts.iter().all(|v| v.measured.is_some()),
            "{verdicts:?}"
        );
        verdicts
            .iter()
            .filter(|v| !v.met)
            .map(|v| v.goal.measure.clone())
            .collect()
    }

    #[test]
    fn medians_are_compared_and_an_outlier_run_does_not_decide() {
        // Off: rates 100..104 (median 102), p99 10..14 (median 12). On: one
        // very slow run, the rest close: median rate 100 (ratio 0.98), median
        // p99 12.5.
        let flash = [
            (100.0, 10.0, 20.0, 90.0),
            (101.0, 11.0, 99.0, 11.5),
            (102.0, 12.0, 100.0, 12.5),
            (103.0, 13.0, 101.0, 13.0),
            (104.0, 14.0, 102.0, 9.0),
        ];
        let steady = [(4.0, 4.2), (5.0, 5.1), (6.0, 6.9), (7.0, 3.0), (8.0, 7.5)];
        let r = report(flash, steady);
        let c = r.compared();
        let get = |stream, figure| {
            c.iter()
                .find(|c| c.stream == stream && c.figure == figure)
                .map(|c| (c.off, c.on, c.change))
                .unwrap()
        };
        let (off, on, ratio) = get(Stream::Flash, Figure::CancelRate);
        assert_eq!((off, on), (102.0, 100.0));
        assert!((ratio - 100.0 / 102.0).abs() < 1e-12);
        assert_eq!(get(Stream::Flash, Figure::P99), (12.0, 12.5, 0.5));
        assert_eq!(get(Stream::Steady, Figure::P99), (6.0, 5.1, 5.1 - 6.0));
        assert_eq!(get(Stream::Flash, Figure::SpanBytes), (0.0, 300.0, 300.0));
        assert_eq!(get(Stream::Flash, Figure::SpansLost), (0.0, 10.0, 10.0));
        assert!(missed(&r).is_empty(), "{:?}", missed(&r));
        assert!(r.table().contains("| flash sale    | cancels/s"));
    }

    #[test]
    fn a_slower_sale_or_a_later_p99_misses_its_goal() {
        let same = [(100.0, 10.0, 100.0, 10.0); 5];
        let steady = [(5.0, 5.0); 5];
        assert!(missed(&report(same, steady)).is_empty());
        let slower = [(100.0, 10.0, 96.9, 10.0); 5];
        assert_eq!(
            missed(&report(slower, steady)),
            ["flash sale: cancels/s, on / off"]
        );
        let at_the_bound = [(100.0, 10.0, 97.0, 11.0); 5];
        assert!(missed(&report(at_the_bound, steady)).is_empty());
        let later = [(100.0, 10.0, 100.0, 11.01); 5];
        assert_eq!(
            missed(&report(later, steady)),
            ["flash sale: p99 lateness, on - off"]
        );
        let steady_later = [(5.0, 6.5); 5];
        assert_eq!(
            missed(&report(same, steady_later)),
            ["steady stream: p99 lateness, on - off"]
        );
    }

    #[test]
    fn a_comparison_without_on_runs_is_missed_not_passed() {
        let mut r = report([(100.0, 10.0, 100.0, 10.0); 5], [(5.0, 5.0); 5]);
        r.runs.retain(|run| run.tracing == "off");
        let verdicts = judge(Bench::TracingCost, &r.measurements(), true);
        assert!(!all_met(&verdicts), "{verdicts:?}");
    }
}
