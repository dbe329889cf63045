//! `order-expiry-bench lateness|throughput|outbox|flash|cancel|tracing-cost|check|soak`: the benchmarks, with the
//! settings of `order-expiry` (built-in defaults, `--config FILE`,
//! `ORDER_EXPIRY__…` variables; `ORDER_EXPIRY__AMQP__URL` picks the broker).
//!
//! Each benchmark judges its report by its goals (`order_expiry_bench::goals`,
//! the book's figures in one table) and exits non-zero, its last line naming
//! the missed goal, when one is missed. `check` runs all of them at the
//! settings their goals were stated for and prints one table of every goal.

#![deny(unsafe_code)]
#![warn(missing_debug_implementations, unreachable_pub, missing_docs)]

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::{Parser, Subcommand};
use order_expiry::{Settings, settings::LogFormat};
use order_expiry_bench::{
    GoalsMissed, cancel, check, flash, lateness, outbox, soak, throughput, tracing_cost,
};

/// Benchmarks of order-expiry against the local broker and database (not tests).
#[derive(Debug, Parser)]
#[command(name = "order-expiry-bench", version, about)]
struct Cli {
    /// Settings file (TOML) layered over the built-in defaults; environment
    /// variables ORDER_EXPIRY__SECTION__KEY override both.
    #[arg(long, global = true, value_name = "FILE")]
    config: Option<PathBuf>,
    /// Log format (overrides log.format).
    #[arg(long, global = true, value_enum)]
    log_format: Option<LogFormat>,
    /// Which benchmark.
    #[command(subcommand)]
    command: Command,
}

/// The benchmarks.
#[derive(Debug, Subcommand)]
enum Command {
    /// Lateness of cancels: the ladder against one naive holding queue.
    Lateness(lateness::LatenessArgs),
    /// Throughput and footprint against bare lapin baselines.
    Throughput(throughput::ThroughputArgs),
    /// Relay lag of the transactional outbox, commit to confirm.
    Outbox(outbox::OutboxArgs),
    /// A flash sale: many orders due within seconds, on each path.
    Flash(flash::FlashArgs),
    /// What PostgreSQL charges per cancelled order, by batch size: the
    /// ceiling past the ladder.
    Cancel(cancel::CancelArgs),
    /// What span export costs: the flash sale and the steady stream with
    /// tracing off and on, interleaved, medians compared (what `check
    /// --tracing-cost` runs).
    TracingCost(tracing_cost::TracingCostArgs),
    /// Every benchmark against its goals, at the settings they were stated for.
    Check(check::CheckArgs),
    /// Orders under random faults on the local three-node cluster, every
    /// order accounted for (not a benchmark: a checker's verdict).
    Soak(soak::SoakArgs),
}

#[tokio::main]
async fn main() -> ExitCode {
    match run(Cli::parse()).await {
        Ok(()) => ExitCode::SUCCESS,
        // Its summary is the last line already printed.
        Err(e) if e.is::<GoalsMissed>() => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("Error: {e:?}");
            ExitCode::FAILURE
        }
    }
}

async fn run(cli: Cli) -> anyhow::Result<()> {
    let settings = Settings::load(cli.config.as_deref()).context("loading settings")?;
    let format = cli.log_format.unwrap_or(settings.log.format);
    order_expiry::telemetry::init_tracing(format, &settings.log.filter);
    match cli.command {
        Command::Lateness(args) => lateness::run(&settings, &args).await,
        Command::Throughput(args) => throughput::run(&settings, &args).await,
        Command::Outbox(args) => outbox::run(&settings, &args).await,
        Command::Flash(args) => flash::run(&settings, &args).await,
        Command::Cancel(args) => cancel::run(&settings, &args).await,
        Command::TracingCost(args) => tracing_cost::run(&settings, &args).await,
        Command::Check(args) => check::run(&settings, &args).await,
        Command::Soak(args) => soak::run(&settings, &args).await,
    }
}
