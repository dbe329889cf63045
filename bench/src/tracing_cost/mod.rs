//! `order-expiry-bench check --tracing-cost` (or `tracing-cost`): what span
//! export costs, issue 38's "Cost". The flash sale and the steady lateness
//! stream, each run `--runs` times (5) with tracing off and as many with it on,
//! interleaved (off, on, off, on, ...), and the medians compared against the
//! goals of [`crate::goals::Bench::TracingCost`].
//!
//! "On" is what production would do: every order is scheduled with a sampled
//! W3C context of its own (`Tracing::order_context`), and the consumer,
//! `order-expiry serve`, exports every span over OTLP/HTTP
//! (`OTEL_EXPORTER_OTLP_ENDPOINT`, sampler `parentbased_always_on`) to a sink
//! in this process (`sink.rs`) that counts bytes and never decodes. "Off" is
//! the default: no context, export disabled. An "on" run whose spans never
//! reached the sink, or an "off" run whose did, stops the comparison with an
//! error.
//!
//! The runs are those of `check`'s goals ([`Bench::args`]): the flash sale as
//! `flash` is judged (200,000 orders within 10 s, due 25 s later, sweeper and
//! bundles on), on the library path alone (`--path outbox` for the other path
//! that can carry a context per order); the steady stream as `lateness` at its
//! defaults without the naive design, with serve instead of the in-process
//! consumer (span export is set up once per process) and one
//! `schedule_message` call per order. `--quick` takes `check --quick`'s
//! shorter runs.

mod figures;
mod report;
mod run;
mod sink;
mod switch;

use std::path::PathBuf;

use anyhow::Context;
use clap::Args;
use order_expiry::Settings;
use tokio::time::Instant;

use crate::Judged;
use crate::check::parse;
use crate::flash::{self, Bundles, FlashArgs, SalePath};
use crate::goals::Bench;
use crate::lateness::{self, Canceller, LatenessArgs};

pub use self::figures::{COMPARED, Compared, Figure};
pub use self::report::Report;
pub use self::run::{Run, Stream};
use self::sink::{Received, Sink};
pub use self::switch::Tracing;

/// Arguments of `tracing-cost` (and `check --tracing-cost`).
#[derive(Debug, Clone, Args)]
pub struct TracingCostArgs {
    /// Short runs (those of `check --quick`) to try the comparison out; the
    /// goals are stated for the full ones.
    #[arg(long)]
    pub quick: bool,
    /// Runs of each stream with tracing off, and as many with it on.
    #[arg(long, default_value_t = 5)]
    pub runs: usize,
    /// The flash sale's path: `library` or `outbox` (the `cli` path cannot
    /// carry a context per order).
    #[arg(long, value_enum, default_value = "library")]
    pub path: SalePath,
    /// The `order-expiry` binary (default: $ORDER_EXPIRY_BIN, or next to this
    /// one).
    #[arg(long, value_name = "FILE")]
    pub serve_bin: Option<PathBuf>,
    /// Only the tables, no progress lines.
    #[arg(long)]
    pub quiet: bool,
}

impl TracingCostArgs {
    /// The flash sale of each run: `flash` at the settings of its goals,
    /// bundles on, on this comparison's path.
    pub fn flash(&self) -> anyhow::Result<FlashArgs> {
        let mut args: FlashArgs = parse(Bench::Flash.args(self.quick))?;
        anyhow::ensure!(
            self.path != SalePath::Cli,
            "the cli path cannot carry a trace context per order: its NDJSON lines have no \
             traceparent field"
        );
        args.paths = vec![self.path];
        args.bundles = Bundles::On;
        args.serve_bin.clone_from(&self.serve_bin);
        Ok(args)
    }

    /// The steady stream of each run: `lateness` at the settings of its
    /// goals, without the naive design (it has no goal, and would share the
    /// broker with the run untraced).
    pub fn steady(&self) -> anyhow::Result<LatenessArgs> {
        let mut args: LatenessArgs = parse(Bench::Lateness.args(self.quick))?;
        args.no_naive = true;
        Ok(args)
    }
}

/// Runs the comparison, prints its tables, and judges it.
pub async fn run(settings: &Settings, args: &TracingCostArgs) -> anyhow::Result<()> {
    let report = measure(settings, args).await?;
    println!("{}", report.table());
    crate::conclude(&report)
}

/// Runs every stream `args.runs` times each way, interleaved, against one
/// sink; the runs' figures and the sink's counts.
pub async fn measure(settings: &Settings, args: &TracingCostArgs) -> anyhow::Result<Report> {
    anyhow::ensure!(args.runs > 0, "--runs must be at least 1");
    let (flash_args, steady_args) = (args.flash()?, args.steady()?);
    let binary = flash::serve::binary(args.serve_bin.as_deref())?;
    let sink = Sink::start().await?;
    let on = Tracing::On {
        endpoint: sink.base_url(),
    };
    let mut report = Report::new(settings, args);
    let started = Instant::now();
    for round in 1..=args.runs {
        for stream in [Stream::Flash, Stream::Steady] {
            for tracing in [&Tracing::Off, &on] {
                let label = format!(
                    "{stream}, tracing {}, run {round} of {}",
                    tracing.as_str(),
                    args.runs
                );
                if !args.quiet {
                    eprintln!("tracing cost: {label}");
                }
                let begun = Instant::now();
                let mut run = match stream {
                    Stream::Flash => {
                        let sale = flash::measure_traced(settings, &flash_args, tracing).await;
                        let sale = sale.with_context(|| label.clone())?;
                        report.broker_version.clone_from(&sale.broker_version);
                        let row = sale.rows.first().context("the flash sale made no row")?;
                        Run::flash(row)
                    }
                    Stream::Steady => {
                        let canceller = Canceller::Serve {
                            binary: binary.clone(),
                            tracing: tracing.clone(),
                        };
                        let steady = lateness::measure_with(settings, &steady_args, &canceller);
                        Run::steady(&steady.await.with_context(|| label.clone())?)?
                    }
                };
                run.round = round;
                run.tracing = tracing.as_str();
                run.seconds = begun.elapsed().as_secs_f64();
                let received = check_spans(tracing, sink.take()).with_context(|| label.clone())?;
                run.span_requests = received.requests;
                run.span_bytes = received.bytes;
                run.spans = received.spans;
                run.order_spans = received.order_spans;
                if !args.quiet {
                    eprintln!("  {}", run.line());
                }
                report.runs.push(run);
            }
        }
    }
    report.seconds = started.elapsed().as_secs_f64();
    Ok(report)
}

/// An "on" run must have sent spans, an "off" run none: otherwise the
/// comparison compares nothing (a check that cannot fail).
fn check_spans(tracing: &Tracing, received: Received) -> anyhow::Result<Received> {
    match (tracing.is_on(), received.bytes) {
        (true, 0) => anyhow::bail!(
            "tracing on, but the span sink received nothing ({} requests): serve exported no span",
            received.requests
        ),
        (false, bytes) if bytes > 0 || received.requests > 0 => anyhow::bail!(
            "tracing off, but the span sink received {bytes} bytes in {} requests",
            received.requests
        ),
        _ => Ok(received),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_on_run_without_spans_or_an_off_run_with_some_is_an_error() {
        let on = Tracing::On {
            endpoint: "http://127.0.0.1:1".to_owned(),
        };
        let got = |requests, bytes| Received {
            requests,
            bytes,
            ..Received::default()
        };
        assert_eq!(check_spans(&on, got(4, 90_000)).unwrap(), got(4, 90_000));
        assert_eq!(check_spans(&Tracing::Off, got(0, 0)).unwrap(), got(0, 0));
        let silent = check_spans(&on, got(0, 0)).unwrap_err().to_string();
        assert!(silent.contains("received nothing"), "{silent}");
        assert!(
            check_spans(&on, got(2, 0)).is_err(),
            "empty requests are no spans"
        );
        let leak = check_spans(&Tracing::Off, got(1, 512))
            .unwrap_err()
            .to_string();
        assert!(leak.contains("512 bytes"), "{leak}");
        assert!(check_spans(&Tracing::Off, got(1, 0)).is_err());
    }
}
