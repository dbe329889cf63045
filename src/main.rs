//! `order-expiry`: parse the command line, load settings, start telemetry, dispatch.

use anyhow::Context;
use clap::Parser;
use order_expiry::cli::{self, Cli};
use order_expiry::{Settings, telemetry};

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Cli::parse();
    let settings = Settings::load(args.config.as_deref()).context("loading settings")?;
    telemetry::init(
        args.log_format.unwrap_or(settings.log.format),
        &settings.log.filter,
    );
    cli::run(args.command, settings).await
}
