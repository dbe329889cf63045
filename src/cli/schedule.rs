//! `order-expiry schedule`: one order (`--order-id` with `--delay` or
//! `--due-at`), or many from stdin, one JSON object a line. Every stdin line is
//! validated before anything is published; then all are published with
//! pipelined confirms, and the command exits 0 only when every one was confirmed.

use std::time::Duration;

use anyhow::{Context, bail};
use chrono::{DateTime, FixedOffset, SecondsFormat, TimeDelta, Utc};
use clap::Args;
use futures::StreamExt;
use order_expiry::{OrderId, Scheduler, Settings};
use serde::Deserialize;
use tokio::io::AsyncBufReadExt;

/// `schedule` arguments.
#[derive(Debug, Args)]
pub(crate) struct ScheduleArgs {
    /// The order to cancel if it is unpaid when due.
    #[arg(long, required_unless_present = "stdin", conflicts_with = "stdin")]
    order_id: Option<String>,
    /// Due after this long, e.g. 30m, 90s, 1h 30m.
    #[arg(long, value_parser = humantime::parse_duration, conflicts_with_all = ["due_at", "stdin"])]
    delay: Option<Duration>,
    /// Due at this RFC 3339 time.
    #[arg(long, conflicts_with = "stdin")]
    due_at: Option<DateTime<FixedOffset>>,
    /// Read one JSON object per line: {"order_id": "...", "due_at": "RFC3339"} or
    /// {"order_id": "...", "delay_ms": N}.
    #[arg(long)]
    stdin: bool,
}

pub(super) async fn run(args: ScheduleArgs, settings: &Settings) -> anyhow::Result<()> {
    let scheduler = Scheduler::from_settings(settings)?;
    let result = if args.stdin {
        schedule_stdin(&scheduler).await
    } else {
        schedule_one(args, &scheduler).await
    };
    scheduler.close().await;
    result
}

async fn schedule_one(args: ScheduleArgs, scheduler: &Scheduler) -> anyhow::Result<()> {
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
            .to_rfc3339_opts(SecondsFormat::Millis, true),
        scheduled.route,
        scheduled.message_id
    );
    Ok(())
}

/// One stdin line.
#[derive(Deserialize)]
struct Line {
    order_id: String,
    due_at: Option<DateTime<FixedOffset>>,
    delay_ms: Option<u64>,
}

fn parse_line(text: &str, now: DateTime<Utc>) -> anyhow::Result<(OrderId, DateTime<Utc>)> {
    let line: Line = serde_json::from_str(text)?;
    let due_at = match (line.due_at, line.delay_ms) {
        (Some(at), None) => at.with_timezone(&Utc),
        (None, Some(ms)) => now + TimeDelta::milliseconds(i64::try_from(ms)?),
        _ => bail!("give exactly one of \"due_at\" and \"delay_ms\""),
    };
    Ok((OrderId::new(line.order_id)?, due_at))
}

/// Reads every line first, so a typo stops the whole batch before anything is
/// published; then publishes with pipelined confirms.
async fn schedule_stdin(scheduler: &Scheduler) -> anyhow::Result<()> {
    let (numbers, orders) = read_stdin().await?;
    let total = orders.len();
    let mut results = scheduler.schedule_stream(futures::stream::iter(orders));
    let mut failed = 0usize;
    let mut lines = numbers.iter();
    while let Some(result) = results.next().await {
        let number = lines.next().copied().unwrap_or_default();
        if let Err(e) = result {
            failed += 1;
            eprintln!("line {number}: {e}");
        }
    }
    eprintln!("scheduled {} of {total} orders", total - failed);
    if failed > 0 {
        bail!("{failed} of {total} orders were not confirmed by the broker");
    }
    Ok(())
}

/// Every non-blank stdin line, validated, with its line number; a report of
/// every bad line (and nothing to schedule) if any is bad.
async fn read_stdin() -> anyhow::Result<(Vec<usize>, Vec<(OrderId, DateTime<Utc>)>)> {
    let mut lines = tokio::io::BufReader::new(tokio::io::stdin()).lines();
    let (mut numbers, mut orders, mut errors) = (Vec::new(), Vec::new(), Vec::new());
    let mut number = 0usize;
    while let Some(text) = lines.next_line().await? {
        number += 1;
        if text.trim().is_empty() {
            continue;
        }
        match parse_line(&text, Utc::now()) {
            Ok(order) => {
                numbers.push(number);
                orders.push(order);
            }
            Err(e) => errors.push(format!("line {number}: {e}")),
        }
    }
    if !errors.is_empty() {
        for e in &errors {
            eprintln!("{e}");
        }
        bail!("{} invalid lines; nothing was scheduled", errors.len());
    }
    Ok((numbers, orders))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stdin_lines_take_due_at_or_delay_and_bad_ones_are_refused() {
        let now = Utc::now();
        let (id, at) =
            parse_line(r#"{"order_id":"a","due_at":"2026-11-30T10:00:00Z"}"#, now).unwrap();
        assert_eq!(id, "a");
        assert_eq!(at.to_rfc3339(), "2026-11-30T10:00:00+00:00");
        let (_, at) = parse_line(r#"{"order_id":"b","delay_ms":1500}"#, now).unwrap();
        assert_eq!(at - now, TimeDelta::milliseconds(1500));
        assert!(parse_line(r#"{"order_id":"a"}"#, now).is_err());
        assert!(parse_line(r#"{"order_id":"","delay_ms":1}"#, now).is_err());
        assert!(parse_line("not json", now).is_err());
        let both = r#"{"order_id":"a","delay_ms":1,"due_at":"2026-11-30T10:00:00Z"}"#;
        assert!(parse_line(both, now).is_err());
    }
}
