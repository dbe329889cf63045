//! How a Rust order service schedules through the transactional outbox: the
//! order and its expiry written in one PostgreSQL transaction, relayed to the
//! ladder by `order-expiry serve` after the commit (feature `outbox`).
//!
//! ```sh
//! cargo run --example outbox_order -- order-42 30m
//! cargo run --example outbox_order -- order-43 30m --rollback   # schedules nothing
//! ```
//!
//! Uses the same settings as the binary (defaults, then `ORDER_EXPIRY__…`):
//! `database.url` for the orders and the outbox, the ladder's settings to check
//! that the due time fits it. It opens no broker connection. `create_order` is
//! the README's Rust snippet, and the integration tests call it
//! (`tests/integration/readme.rs`).

use std::time::Duration;

use chrono::{DateTime, Utc};
use order_expiry::{OutboxError, Scheduler, Settings};
use secrecy::ExposeSecret;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let order_id = args.next().unwrap_or_else(|| "example-order".to_owned());
    let window: Duration = humantime::parse_duration(&args.next().unwrap_or_else(|| "30m".into()))?;
    let rollback = args.next().as_deref() == Some("--rollback");

    let settings = Settings::load(None)?;
    let scheduler = Scheduler::from_settings(&settings)?;
    let url = settings.database.url.expose_secret();
    let (mut db, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls).await?;
    tokio::spawn(connection);

    let due_at = Utc::now() + chrono::TimeDelta::from_std(window)?;
    println!(
        "{}",
        create_order(&scheduler, &mut db, &order_id, due_at, rollback).await?
    );
    Ok(())
}

/// Creates an unpaid order due at `due_at` and schedules its expiry, in one
/// transaction: the order and its expiry, or neither.
pub async fn create_order(
    scheduler: &Scheduler,
    db: &mut tokio_postgres::Client,
    order_id: &str,
    due_at: DateTime<Utc>,
    rollback: bool,
) -> Result<String, Box<dyn std::error::Error>> {
    let tx = db.transaction().await?;
    tx.execute(
        "INSERT INTO orders (id, pay_deadline) VALUES ($1, $2)",
        &[&order_id, &due_at],
    )
    .await?;
    let entry = match scheduler.schedule_in_tx(&tx, order_id, due_at).await {
        Ok(entry) => entry,
        // The order cannot be expired as asked: do not create it either.
        Err(e @ (OutboxError::InvalidOrderId(_) | OutboxError::DelayTooLong(_))) => {
            tx.rollback().await?;
            return Ok(format!("{order_id}: not created: {e}"));
        }
        // The transaction is rolled back when `tx` is dropped.
        Err(e) => return Err(e.into()),
    };
    if rollback {
        tx.rollback().await?;
        return Ok(format!("{order_id}: rolled back; nothing scheduled"));
    }
    tx.commit().await?; // the order and its expiry, or neither
    Ok(format!(
        "{order_id}: created; expiry at {} is outbox row {}",
        entry.due_at, entry.id
    ))
}
