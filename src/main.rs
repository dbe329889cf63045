//! `order-expiry`: parse the command line, load settings, start telemetry,
//! dispatch, and flush the spans still buffered before exiting.

#![deny(unsafe_code)]
#![warn(missing_debug_implementations, unreachable_pub, missing_docs)]

mod cli;

use std::process::ExitCode;

use anyhow::Context;
use clap::Parser;
use order_expiry::Settings;

/// Runs the command; a failure is one line on stderr (the error and its
/// causes, e.g. `error: invalid setting consumer.prefetch: ...`) and exit code 1.
#[tokio::main]
async fn main() -> ExitCode {
    match run().await {
        Ok(code) => code,
        Err(error) => {
            eprintln!("error: {error:#}");
            ExitCode::FAILURE
        }
    }
}

async fn run() -> anyhow::Result<ExitCode> {
    let args = cli::Cli::parse();
    let settings = Settings::load(args.config.as_deref()).context("loading settings")?;
    let format = args.log_format.unwrap_or(settings.log.format);
    // A one-shot command reports a broker refusal itself, on one line; lapin's
    // own ERROR for the channel the broker closed would say it a second time.
    let filter = if args.command.reports_broker_errors() {
        format!("{},lapin::channel=off", settings.log.filter)
    } else {
        settings.log.filter.clone()
    };
    #[cfg(not(feature = "otlp"))]
    {
        order_expiry::telemetry::init_tracing(format, &filter);
        cli::run(args.command, settings).await
    }
    #[cfg(feature = "otlp")]
    {
        let export = order_expiry::telemetry::init_tracing_and_export(
            format,
            &filter,
            &settings.telemetry.otlp,
        )
        .context("starting span export (telemetry.otlp, OTEL_*)")?;
        let code = cli::run(args.command, settings).await;
        // Last, after `serve` has drained: the spans of its final orders.
        if let Some(export) = export
            && let Err(error) = export.shutdown().await
        {
            tracing::warn!(error = %error, "the last spans were not exported");
        }
        code
    }
}
