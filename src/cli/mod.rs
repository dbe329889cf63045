//! The `order-expiry` command line: argument parsing and one module per command.
//! Binary-only: the commands use the library's public API.
//!
//! - [`serve`]: the consumer service until SIGTERM.
//! - [`schedule`]: one order, or many from stdin.
//! - [`topology`]: `topology apply` and `topology export`.
//! - [`schema`]: `migrate`: the SQL schema (the default orders table, the outbox).
//! - [`demo`]: the end-to-end demo.
//! - [`ladder`]: `ladder migrate`: an old ladder's messages into the current one.
//! - [`parked`]: list, replay and purge the parked queue.
//! - [`status`]: one look at the ladder, due, parked, outbox and overdue orders.

mod demo;
mod ladder;
mod migrate;
mod parked;
mod schedule;
mod serve;
mod status;
mod topology;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use order_expiry::{Settings, settings::LogFormat};

/// Cancel unpaid orders on time with a RabbitMQ delay ladder.
#[derive(Debug, Parser)]
#[command(name = "order-expiry", version, about)]
pub(crate) struct Cli {
    /// Settings file (TOML) layered over the built-in defaults; environment
    /// variables ORDER_EXPIRY__SECTION__KEY override both.
    #[arg(long, global = true, value_name = "FILE")]
    pub(crate) config: Option<PathBuf>,
    /// Log format (overrides log.format).
    #[arg(long, global = true, value_enum)]
    pub(crate) log_format: Option<LogFormat>,
    /// What to do.
    #[command(subcommand)]
    pub(crate) command: Command,
}

/// The commands of the public contract.
#[derive(Debug, Subcommand)]
pub(crate) enum Command {
    /// Run the consumer service until SIGTERM/SIGINT, then drain and exit 0.
    Serve,
    /// Schedule one order's expiry, or many from stdin (NDJSON).
    Schedule(schedule::ScheduleArgs),
    /// Declare or export the broker topology.
    #[command(subcommand)]
    Topology(topology::TopologyCommand),
    /// Create the default orders table and the outbox tables (idempotent).
    Migrate,
    /// End-to-end demo on the local broker and database.
    Demo(demo::DemoArgs),
    /// One look at the whole system; exit 2 when unhealthy.
    Status(status::StatusArgs),
    /// List, replay or purge the parked queue.
    #[command(subcommand)]
    Parked(parked::ParkedCommand),
    /// Move the messages of an old ladder into the current one.
    #[command(subcommand)]
    Ladder(ladder::LadderCommand),
}

impl Command {
    /// Whether the command ends on its first broker error and prints it itself
    /// (every command but the long-running `serve` and `demo`).
    pub(crate) fn reports_broker_errors(&self) -> bool {
        !matches!(self, Self::Serve | Self::Demo(_))
    }
}

/// Runs one command; most exit 0 when they succeed, `status` tells health.
pub(crate) async fn run(command: Command, settings: Settings) -> anyhow::Result<ExitCode> {
    match command {
        Command::Serve => serve::run(&settings).await,
        Command::Schedule(args) => schedule::run(args, &settings).await,
        Command::Topology(command) => topology::run(command, &settings).await,
        Command::Migrate => migrate::run(&settings).await,
        Command::Demo(args) => demo::run(&args, &settings).await,
        Command::Status(args) => return status::run(&args, &settings).await,
        Command::Parked(command) => parked::run(command, &settings).await,
        Command::Ladder(command) => ladder::run(command, &settings).await,
    }?;
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cli_parses_the_contract_commands() {
        let parse = |args: &str| Cli::try_parse_from(args.split(' '));
        for ok in [
            "order-expiry schedule --order-id x --delay 30m",
            "order-expiry schedule --stdin",
            "order-expiry topology export",
            "order-expiry --config f.toml serve",
            "order-expiry --log-format json migrate",
        ] {
            parse(ok).unwrap();
        }
        assert!(parse("order-expiry schedule --order-id x --stdin").is_err());
        assert!(parse("order-expiry bench lateness").is_err());
    }
}
