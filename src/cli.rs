//! The `order-expiry` command line: argument parsing and the body of each command.
//! `main` only parses, loads settings, starts telemetry and calls [`run`].

use std::io::Write;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, bail};
use chrono::{DateTime, TimeDelta, Utc};
use clap::{Args, Parser, Subcommand};
use futures::StreamExt;
use serde::Deserialize;
use tokio::io::AsyncBufReadExt;

use crate::bench::{self, BenchCommand};
use crate::demo::{self, DemoOptions};
use crate::orders::PgOrderStore;
use crate::scheduler::Scheduler;
use crate::service::Service;
use crate::settings::{LogFormat, Settings, redact_url};
use crate::topology::Topology;
use crate::{broker, definitions, shutdown};

/// Cancel unpaid orders on time with a RabbitMQ delay ladder.
#[derive(Debug, Parser)]
#[command(name = "order-expiry", version, about)]
pub struct Cli {
    /// Settings file (TOML) layered over the built-in defaults; environment
    /// variables ORDER_EXPIRY__SECTION__KEY override both.
    #[arg(long, global = true, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Log format (overrides log.format).
    #[arg(long, global = true, value_enum)]
    pub log_format: Option<LogFormat>,
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// The commands of the public contract.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the consumer service until SIGTERM/SIGINT, then drain and exit 0.
    Serve,
    /// Schedule one order's expiry, or many from stdin (NDJSON).
    Schedule(ScheduleArgs),
    /// Declare or export the broker topology.
    #[command(subcommand)]
    Topology(TopologyCommand),
    /// Create the default orders table (idempotent).
    Migrate,
    /// End-to-end demo on the local broker and database.
    Demo(DemoArgs),
    /// Benchmarks against the local broker and database (not tests).
    #[command(subcommand)]
    Bench(BenchCommand),
}

/// `schedule` arguments.
#[derive(Debug, Args)]
pub struct ScheduleArgs {
    /// The order to cancel if it is unpaid when due.
    #[arg(long, required_unless_present = "stdin", conflicts_with = "stdin")]
    pub order_id: Option<String>,
    /// Due after this long, e.g. 30m, 90s, 1h 30m.
    #[arg(long, value_parser = humantime::parse_duration, conflicts_with_all = ["due_at", "stdin"])]
    pub delay: Option<Duration>,
    /// Due at this RFC 3339 time.
    #[arg(long, conflicts_with = "stdin")]
    pub due_at: Option<DateTime<chrono::FixedOffset>>,
    /// Read one JSON object per line: {"order_id": "...", "due_at": "RFC3339"} or
    /// {"order_id": "...", "delay_ms": N}.
    #[arg(long)]
    pub stdin: bool,
}

/// `topology` subcommands.
#[derive(Debug, Subcommand)]
pub enum TopologyCommand {
    /// Declare every exchange, queue and binding on the broker (idempotent).
    Apply,
    /// Print RabbitMQ definitions JSON for the current settings: the topology in
    /// its own vhost and the least-privilege publisher and consumer users.
    Export {
        /// Virtual host the definitions name [default: topology.vhost, "order-expiry"].
        #[arg(long)]
        vhost: Option<String>,
    },
}

/// `demo` arguments.
#[derive(Debug, Args)]
pub struct DemoArgs {
    /// Orders to create.
    #[arg(long, default_value_t = 40)]
    pub orders: usize,
    /// Shortest payment window.
    #[arg(long, default_value = "2s", value_parser = humantime::parse_duration)]
    pub min_delay: Duration,
    /// Longest payment window.
    #[arg(long, default_value = "8s", value_parser = humantime::parse_duration)]
    pub max_delay: Duration,
    /// Share of orders paid while they wait.
    #[arg(long, default_value_t = 0.3)]
    pub pay_share: f64,
}

/// Runs one command.
pub async fn run(command: Command, settings: Settings) -> anyhow::Result<()> {
    match command {
        Command::Serve => serve(settings).await,
        Command::Schedule(args) => schedule(args, &settings).await,
        Command::Topology(TopologyCommand::Apply) => topology_apply(&settings).await,
        Command::Topology(TopologyCommand::Export { vhost }) => {
            let vhost = vhost.unwrap_or_else(|| settings.topology.vhost.clone());
            let text = definitions::export_string(&settings.ladder()?, &settings.topology, &vhost);
            std::io::stdout().write_all(text.as_bytes())?;
            Ok(())
        }
        Command::Migrate => {
            let store = PgOrderStore::new(&settings.database)?;
            store
                .migrate()
                .await
                .with_context(|| format!("migrating {}", redact_url(&settings.database.url)))?;
            eprintln!("orders table ready");
            Ok(())
        }
        Command::Bench(BenchCommand::Lateness(args)) => {
            bench::lateness::run(&settings, &args).await
        }
        Command::Bench(BenchCommand::Throughput(args)) => {
            bench::throughput::run(&settings, &args).await
        }
        Command::Demo(args) => {
            let options = DemoOptions {
                orders: args.orders,
                min_delay: args.min_delay,
                max_delay: args.max_delay,
                pay_share: args.pay_share,
            };
            let summary = demo::run(&settings, &options, |line| println!("{line}"))
                .await
                .map_err(|e| anyhow::anyhow!("demo failed: {e}"))?;
            println!("summary: {summary}");
            if summary.early > 0 || summary.unpaid > 0 {
                bail!("the demo saw early or missed cancellations");
            }
            Ok(())
        }
    }
}

async fn serve(settings: Settings) -> anyhow::Result<()> {
    let service = Service::build(&settings).await?;
    tracing::info!(
        amqp = %redact_url(&settings.amqp.url),
        database = %redact_url(&settings.database.url),
        "starting consumer service"
    );
    service.run(shutdown::on_signal()).await;
    Ok(())
}

async fn topology_apply(settings: &Settings) -> anyhow::Result<()> {
    let timeout = settings.amqp.timeout();
    let tls = broker::TlsFiles::from_settings(&settings.amqp);
    let connection =
        broker::connect_tls(&settings.amqp.url, &tls, "order-expiry topology", timeout).await?;
    let channel = connection.create_channel().await?;
    let topology = Topology::describe(&settings.ladder()?, &settings.topology);
    topology.apply(&channel, timeout).await?;
    let _ = connection.close(200, "done".into()).await;
    eprintln!(
        "declared {} exchanges, {} queues, {} bindings",
        topology.exchanges.len(),
        topology.queues.len(),
        topology.bindings.len()
    );
    Ok(())
}

async fn schedule(args: ScheduleArgs, settings: &Settings) -> anyhow::Result<()> {
    let scheduler = Scheduler::from_settings(settings)?;
    let result = if args.stdin {
        schedule_stdin(&scheduler).await
    } else {
        let order_id = args.order_id.context("--order-id is required")?;
        let due_at = match (args.delay, args.due_at) {
            (Some(delay), None) => Utc::now() + TimeDelta::from_std(delay)?,
            (None, Some(at)) => at.with_timezone(&Utc),
            _ => bail!("give exactly one of --delay and --due-at"),
        };
        let scheduled = scheduler.schedule(&order_id, due_at).await?;
        println!(
            "scheduled {order_id} due {} ({}, message {})",
            scheduled
                .due_at
                .to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
            scheduled.route,
            scheduled.message_id
        );
        Ok(())
    };
    scheduler.close().await;
    result
}

#[derive(Deserialize)]
struct Line {
    order_id: String,
    due_at: Option<DateTime<chrono::FixedOffset>>,
    delay_ms: Option<u64>,
}

fn parse_line(text: &str, now: DateTime<Utc>) -> anyhow::Result<(String, DateTime<Utc>)> {
    let line: Line = serde_json::from_str(text)?;
    let due_at = match (line.due_at, line.delay_ms) {
        (Some(at), None) => at.with_timezone(&Utc),
        (None, Some(ms)) => now + TimeDelta::milliseconds(i64::try_from(ms)?),
        _ => bail!("give exactly one of \"due_at\" and \"delay_ms\""),
    };
    crate::message::validate_order_id(&line.order_id)?;
    Ok((line.order_id, due_at))
}

/// Reads every line first, so a typo stops the whole batch before anything is
/// published; then publishes with pipelined confirms.
async fn schedule_stdin(scheduler: &Scheduler) -> anyhow::Result<()> {
    let mut lines = tokio::io::BufReader::new(tokio::io::stdin()).lines();
    let mut orders = Vec::new();
    let mut errors = Vec::new();
    let mut number = 0usize;
    while let Some(text) = lines.next_line().await? {
        number += 1;
        if text.trim().is_empty() {
            continue;
        }
        match parse_line(&text, Utc::now()) {
            Ok(order) => orders.push((number, order)),
            Err(e) => errors.push(format!("line {number}: {e}")),
        }
    }
    if !errors.is_empty() {
        for e in &errors {
            eprintln!("{e}");
        }
        bail!("{} invalid lines; nothing was scheduled", errors.len());
    }
    let total = orders.len();
    let numbers: Vec<usize> = orders.iter().map(|(n, _)| *n).collect();
    let mut results =
        scheduler.schedule_stream(futures::stream::iter(orders.into_iter().map(|(_, o)| o)));
    let mut failed = 0usize;
    let mut index = 0usize;
    while let Some(result) = results.next().await {
        if let Err(e) = result {
            failed += 1;
            eprintln!("line {}: {e}", numbers[index]);
        }
        index += 1;
    }
    eprintln!("scheduled {} of {total} orders", total - failed);
    if failed > 0 {
        bail!("{failed} of {total} orders were not confirmed by the broker");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stdin_lines_take_due_at_or_delay() {
        let now = Utc::now();
        let (id, at) =
            parse_line(r#"{"order_id":"a","due_at":"2026-11-30T10:00:00Z"}"#, now).unwrap();
        assert_eq!(id, "a");
        assert_eq!(at.to_rfc3339(), "2026-11-30T10:00:00+00:00");
        let (_, at) = parse_line(r#"{"order_id":"b","delay_ms":1500}"#, now).unwrap();
        assert_eq!(at - now, TimeDelta::milliseconds(1500));
    }

    #[test]
    fn bad_stdin_lines_say_what_is_wrong() {
        let now = Utc::now();
        assert!(parse_line(r#"{"order_id":"a"}"#, now).is_err());
        assert!(parse_line(r#"{"order_id":"","delay_ms":1}"#, now).is_err());
        assert!(parse_line("not json", now).is_err());
        assert!(
            parse_line(
                r#"{"order_id":"a","delay_ms":1,"due_at":"2026-11-30T10:00:00Z"}"#,
                now
            )
            .is_err()
        );
    }

    #[test]
    fn cli_parses_the_contract_commands() {
        Cli::try_parse_from([
            "order-expiry",
            "schedule",
            "--order-id",
            "x",
            "--delay",
            "30m",
        ])
        .unwrap();
        Cli::try_parse_from(["order-expiry", "schedule", "--stdin"]).unwrap();
        Cli::try_parse_from(["order-expiry", "topology", "export"]).unwrap();
        Cli::try_parse_from(["order-expiry", "--config", "f.toml", "serve"]).unwrap();
        assert!(
            Cli::try_parse_from(["order-expiry", "schedule", "--order-id", "x", "--stdin"])
                .is_err()
        );
    }
}
