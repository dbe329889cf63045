//! `order-expiry status [--json]`: the ladder, due, parked, outbox and overdue
//! orders in one look (text table or the stable JSON of docs/src/operating/status-and-parked.md).
//! Exit code 0 healthy, 2 unhealthy (no consumer on the due queue, orders
//! overdue beyond `--margin`, a queue missing, the database not answering), 1
//! when the broker cannot be reached.

use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;
use clap::Args;
use order_expiry::{Settings, ops::Status};

/// `status` arguments.
#[derive(Debug, Args)]
pub(crate) struct StatusArgs {
    /// Print the JSON form (documented in docs/src/operating/status-and-parked.md) instead of the table.
    #[arg(long)]
    json: bool,
    /// Unpaid orders more than this past their deadline make the status
    /// unhealthy.
    #[arg(long, default_value = "60s", value_parser = humantime::parse_duration)]
    margin: Duration,
}

/// Exit code of an unhealthy status (1 is "could not look").
const UNHEALTHY: u8 = 2;

pub(super) async fn run(args: &StatusArgs, settings: &Settings) -> anyhow::Result<ExitCode> {
    let status = Status::collect(settings, args.margin)
        .await
        .context("looking at the broker")?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&status)?);
    } else {
        println!("{status}");
    }
    Ok(match status.healthy {
        true => ExitCode::SUCCESS,
        false => ExitCode::from(UNHEALTHY),
    })
}
