//! How an order service uses the publisher library: schedule an order's expiry
//! and act on the outcome.
//!
//! ```sh
//! cargo run --example schedule_order -- order-42 30m
//! ```
//!
//! Uses the same settings as the binary (defaults, then `ORDER_EXPIRY__…`).

use std::time::Duration;

use order_expiry::{ScheduleError, Scheduler, Settings};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let order_id = args.next().unwrap_or_else(|| "example-order".to_owned());
    let window: Duration = humantime::parse_duration(&args.next().unwrap_or_else(|| "30m".into()))?;

    let settings = Settings::load(None)?;
    let scheduler = Scheduler::from_settings(&settings)?;
    let due_at = chrono::Utc::now() + chrono::TimeDelta::from_std(window)?;

    match scheduler.schedule(&order_id, due_at).await {
        // Durable in the broker: the order will be cancelled at due_at if unpaid.
        Ok(scheduled) => println!(
            "{order_id}: expiry scheduled for {} (message {}, {})",
            scheduled.due_at, scheduled.message_id, scheduled.route
        ),
        // Not held by the broker: the order service must not rely on it. Retry, or
        // fail the order creation; the sweeper is only a safety net.
        Err(
            e @ (ScheduleError::Timeout(_) | ScheduleError::Broker(_) | ScheduleError::Connect(_)),
        ) => {
            eprintln!("{order_id}: broker unavailable, retry later: {e}");
        }
        Err(e) => eprintln!("{order_id}: cannot schedule: {e}"),
    }
    scheduler.close().await;
    Ok(())
}
