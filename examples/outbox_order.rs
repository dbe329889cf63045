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
//! that the due time fits it. It opens no broker connection.

use std::time::Duration;

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

    let due_at = chrono::Utc::now() + chrono::TimeDelta::from_std(window)?;
    let tx = db.transaction().await?;
    tx.execute(
        "INSERT INTO orders (id, pay_deadline) VALUES ($1, $2)",
        &[&order_id, &due_at],
    )
    .await?;
    let entry = match scheduler
        .schedule_in_tx(&tx, order_id.as_str(), due_at)
        .await
    {
        Ok(entry) => entry,
        // The order cannot be expired as asked: do not create it either.
        Err(e @ (OutboxError::InvalidOrderId(_) | OutboxError::DelayTooLong(_))) => {
            tx.rollback().await?;
            eprintln!("{order_id}: not created: {e}");
            return Ok(());
        }
        // The transaction is rolled back when `tx` is dropped.
        Err(e) => return Err(e.into()),
    };
    if rollback {
        tx.rollback().await?;
        println!("{order_id}: rolled back; neither the order nor its expiry exists");
    } else {
        tx.commit().await?;
        println!(
            "{order_id}: created; its expiry at {} is outbox row {} until the relay publishes it",
            entry.due_at, entry.id
        );
    }
    Ok(())
}
