//! `order-expiry-bench check`: every benchmark, one after the other, at the
//! settings its goals were stated for ([`Bench::args`]), judged against every
//! goal in [`goals::GOALS`]: one table, and a non-zero exit when a goal is
//! missed or a benchmark could not run. `--quick` runs short versions to try
//! it out; the goals are stated for the full ones. `--tracing-cost` runs the
//! tracing-cost comparison alone ([`crate::tracing_cost`]).

use std::path::PathBuf;

use anyhow::Context;
use chrono::Utc;
use clap::{Args, Parser};
use order_expiry::Settings;
use serde_json::json;

use crate::goals::{self, Bench, Measurement};
use crate::{Judged, cancel, flash, lateness, outbox, throughput, tracing_cost};

/// Arguments of `check`.
#[derive(Debug, Clone, Args)]
pub struct CheckArgs {
    /// Short runs (about 10 minutes in all, 6 of them the tracing cost) to
    /// try the check out; the goals are stated for the full settings (about
    /// an hour, 30 minutes of it the tracing cost).
    #[arg(long)]
    pub quick: bool,
    /// Only the tracing-cost comparison: the flash sale and the steady stream,
    /// 5 runs each with span export off and on, interleaved (about 30
    /// minutes; with --quick about 6).
    #[arg(long)]
    pub tracing_cost: bool,
    /// Also write the verdicts as JSON.
    #[arg(long, value_name = "FILE")]
    pub json: Option<PathBuf>,
}

/// Runs every benchmark, prints each one's report and then the goals table;
/// an error when a goal is missed.
pub async fn run(settings: &Settings, args: &CheckArgs) -> anyhow::Result<()> {
    let started = Utc::now();
    let mut verdicts = Vec::new();
    let mut errors = Vec::new();
    let benches: &[Bench] = if args.tracing_cost {
        &[Bench::TracingCost]
    } else {
        &Bench::ALL
    };
    for &bench in benches {
        let cli = bench.args(args.quick);
        eprintln!("check: {bench} {cli}");
        let measured = match measure(settings, bench, cli).await {
            Ok(measured) => measured,
            Err(e) => {
                eprintln!("check: {bench} failed: {e:#}");
                errors.push(format!("{bench}: {e:#}"));
                Vec::new()
            }
        };
        verdicts.extend(goals::judge(bench, &measured, true));
    }
    let settings_name = if args.quick {
        "quick settings: NOT the settings the goals were stated for"
    } else {
        "the settings the goals were stated for"
    };
    println!(
        "goals on {} ({settings_name}), started {}",
        settings.amqp.display_url(),
        started.format("%Y-%m-%d %H:%M UTC")
    );
    for e in &errors {
        println!("failed to run: {e}");
    }
    if let Some(path) = &args.json {
        let value = json!({
            "started": started.to_rfc3339(),
            "broker": settings.amqp.display_url(),
            "quick": args.quick,
            "runs": benches.iter().map(|b| json!({"bench": b, "args": b.args(args.quick)})).collect::<Vec<_>>(),
            "verdicts": verdicts,
            "errors": errors,
            "met": goals::all_met(&verdicts),
        });
        std::fs::write(path, serde_json::to_string_pretty(&value)? + "\n")
            .with_context(|| format!("writing {}", path.display()))?;
        eprintln!("wrote {}", path.display());
    }
    crate::finish(&verdicts)
}

/// Runs one benchmark with `cli` as its arguments and prints its report.
async fn measure(settings: &Settings, bench: Bench, cli: &str) -> anyhow::Result<Vec<Measurement>> {
    fn shown(report: impl Judged) -> Vec<Measurement> {
        println!("{}", report.table());
        report.measurements()
    }
    Ok(match bench {
        Bench::Lateness | Bench::Burst => shown(lateness::measure(settings, &parse(cli)?).await?),
        Bench::Throughput => shown(throughput::measure(settings, &parse(cli)?).await?),
        Bench::Outbox => shown(outbox::measure(settings, &parse(cli)?).await?),
        Bench::Flash => shown(flash::measure(settings, &parse(cli)?).await?),
        Bench::Cancel => shown(cancel::measure(settings, &parse(cli)?).await?),
        Bench::TracingCost => shown(tracing_cost::measure(settings, &parse(cli)?).await?),
    })
}

/// A subcommand's arguments from its command line (`"--orders 2000 --quiet"`),
/// its defaults for the rest: how `check` and the tests state a run.
pub fn parse<A: Args>(cli: &str) -> anyhow::Result<A> {
    #[derive(Parser)]
    struct One<A: Args> {
        #[command(flatten)]
        args: A,
    }
    let argv = std::iter::once("order-expiry-bench").chain(cli.split_whitespace());
    let one = One::<A>::try_parse_from(argv).with_context(|| format!("arguments {cli:?}"))?;
    Ok(one.args)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::flash::{Bundles, SalePath, Switch};

    #[test]
    fn every_run_parses_at_the_settings_of_its_goals() {
        let secs = Duration::from_secs;
        let steady: lateness::LatenessArgs = parse(Bench::Lateness.args(false)).unwrap();
        assert_eq!(steady.rate, 200);
        assert_eq!(steady.duration, secs(60));
        assert_eq!((steady.min_delay, steady.max_delay), (secs(1), secs(60)));
        assert_eq!(
            (steady.pay_share, steady.no_naive, steady.burst),
            (0.2, false, 0)
        );

        let burst: lateness::LatenessArgs = parse(Bench::Burst.args(false)).unwrap();
        assert_eq!((burst.rate, burst.burst, burst.no_naive), (200, 2000, true));
        assert_eq!(burst.duration, secs(20));
        assert_eq!(burst.max_delay, secs(20));
        assert_eq!(burst.burst_at, secs(8));
        assert_eq!(burst.burst_over, secs(1));
        assert_eq!(
            (burst.burst_min_delay, burst.burst_max_delay),
            (secs(1), secs(15))
        );

        let tp: throughput::ThroughputArgs = parse(Bench::Throughput.args(false)).unwrap();
        assert_eq!(
            (tp.orders, tp.drain, tp.pending, tp.rounds),
            (20_000, 100_000, 1_000_000, 3)
        );
        assert_eq!(tp.queue_types.len(), 2);
        assert_eq!(tp.phases.len(), 4);

        let ob: outbox::OutboxArgs = parse(Bench::Outbox.args(false)).unwrap();
        assert_eq!((ob.rate, ob.writers), (1000, 8));
        assert_eq!((ob.duration, ob.warmup), (secs(60), secs(5)));

        let fl: flash::FlashArgs = parse(Bench::Flash.args(false)).unwrap();
        assert_eq!(fl.orders, 200_000);
        assert_eq!((fl.within, fl.window), (secs(10), secs(25)));
        assert_eq!((fl.bundles, fl.sweeper), (Bundles::On, Switch::On));
        assert_eq!(
            fl.paths,
            [SalePath::Library, SalePath::Cli, SalePath::Outbox]
        );

        let c: cancel::CancelArgs = parse(Bench::Cancel.args(false)).unwrap();
        assert_eq!(c.batch_sizes, [1, 10, 30, 100, 300, 1000]);
        assert_eq!((c.repetitions, c.concurrency, c.alter), (7, 1, None));

        // The tracing cost: the flash sale and the steady stream above, the
        // library path alone, without the naive design.
        let cost: tracing_cost::TracingCostArgs = parse(Bench::TracingCost.args(false)).unwrap();
        assert_eq!(
            (cost.runs, cost.quick, cost.path),
            (5, false, SalePath::Library)
        );
        let sale = cost.flash().unwrap();
        assert_eq!(
            (sale.orders, sale.within, sale.window),
            (fl.orders, fl.within, fl.window)
        );
        assert_eq!((sale.bundles, sale.sweeper), (Bundles::On, Switch::On));
        assert_eq!(sale.paths, [SalePath::Library]);
        let stream = cost.steady().unwrap();
        assert_eq!(
            (stream.rate, stream.duration),
            (steady.rate, steady.duration)
        );
        assert_eq!(
            (stream.min_delay, stream.max_delay),
            (steady.min_delay, steady.max_delay)
        );
        assert_eq!((stream.pay_share, stream.burst), (steady.pay_share, 0));
        assert!(stream.no_naive);
    }

    #[test]
    fn quick_runs_parse_and_are_shorter() {
        let l: lateness::LatenessArgs = parse(Bench::Lateness.args(true)).unwrap();
        assert!(l.duration < Duration::from_secs(60));
        let b: lateness::LatenessArgs = parse(Bench::Burst.args(true)).unwrap();
        assert!(b.burst > 0 && b.duration < Duration::from_secs(20));
        let t: throughput::ThroughputArgs = parse(Bench::Throughput.args(true)).unwrap();
        assert!(t.pending < 1_000_000 && t.rounds == 1);
        let o: outbox::OutboxArgs = parse(Bench::Outbox.args(true)).unwrap();
        assert!(o.duration < Duration::from_secs(60));
        let f: flash::FlashArgs = parse(Bench::Flash.args(true)).unwrap();
        assert!(f.orders < 200_000 && f.bundles == Bundles::On);
        let c: cancel::CancelArgs = parse(Bench::Cancel.args(true)).unwrap();
        assert!(c.orders < 20_000 && c.repetitions < 7);
        let cost: tracing_cost::TracingCostArgs = parse(Bench::TracingCost.args(true)).unwrap();
        assert!(cost.quick && cost.runs == 5);
        assert_eq!(cost.flash().unwrap().orders, f.orders);
        assert_eq!(cost.steady().unwrap().duration, l.duration);
        let cli: tracing_cost::TracingCostArgs = parse("--path cli").unwrap();
        assert!(
            cli.flash().is_err(),
            "the cli path cannot carry a context per order"
        );
        assert!(parse::<outbox::OutboxArgs>("--no-such-flag").is_err());
    }
}
