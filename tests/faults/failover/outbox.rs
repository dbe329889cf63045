//! An order service that schedules through the transactional outbox, across
//! the failover: each order and its outbox row in one transaction, some outbox
//! rows rolled back, every failed transaction retried until the order service
//! knows what committed.

use std::time::Duration;

use chrono::{DateTime, Utc};
use order_expiry_testkit::{connect_database, wire_due};
use tokio_postgres::Client;
use tokio_util::sync::CancellationToken;

use crate::support::at_ms;

/// What the writer did.
#[derive(Debug, Default)]
pub struct OutboxLedger {
    /// Orders whose outbox row committed with them.
    pub committed: Vec<(String, DateTime<Utc>)>,
    /// Orders committed alone: their outbox row rolled back.
    pub rolled_back: Vec<(String, DateTime<Utc>)>,
    /// Transactions that failed and were tried again.
    pub retries: usize,
}

const INSERT_ORDER: &str = "INSERT INTO orders (id, pay_deadline) VALUES ($1, $2)";
const INSERT_ROW: &str = "INSERT INTO order_expiry_outbox (order_id, due_at) VALUES ($1, $2)";

/// Every `every` until `stop`: an unpaid order due `due_in` later, with its
/// outbox row in the same transaction; every seventh order commits alone and
/// its outbox row rolls back. `url` is the world's (both hosts, read-write).
pub async fn outbox_writer(
    url: String,
    every: Duration,
    due_in: Duration,
    stop: CancellationToken,
) -> OutboxLedger {
    let mut ledger = OutboxLedger::default();
    let mut client: Option<Client> = None;
    let mut n = 0u64;
    while !stop.is_cancelled() {
        n += 1;
        let roll_back = n.is_multiple_of(7);
        let (id, due) = (
            format!("ob-{n}"),
            wire_due(at_ms(due_in.as_millis() as i64)),
        );
        loop {
            let connected = match client.take() {
                Some(c) if !c.is_closed() => Some(c),
                _ => connect(&url).await,
            };
            if let Some(c) = connected {
                let writing = write(&c, &id, due, roll_back);
                if let Ok(Ok(())) = tokio::time::timeout(Duration::from_secs(5), writing).await {
                    client = Some(c);
                    break;
                }
            }
            ledger.retries += 1;
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        match roll_back {
            true => ledger.rolled_back.push((id, due)),
            false => ledger.committed.push((id, due)),
        }
        tokio::time::sleep(every).await;
    }
    ledger
}

async fn connect(url: &str) -> Option<Client> {
    let connecting = connect_database(url);
    tokio::time::timeout(Duration::from_secs(5), connecting)
        .await
        .ok()?
        .ok()
}

/// One try. An order already there means an earlier try committed (with its
/// outbox row, unless it is one to roll back, whose row never commits).
async fn write(
    client: &Client,
    id: &str,
    due: DateTime<Utc>,
    roll_back: bool,
) -> Result<(), tokio_postgres::Error> {
    if roll_back {
        if let Err(e) = client.execute(INSERT_ORDER, &[&id, &due]).await
            && !unique_violation(&e)
        {
            return Err(e);
        }
        client.batch_execute("BEGIN").await?;
        client.execute(INSERT_ROW, &[&id, &due]).await?;
        return client.batch_execute("ROLLBACK").await;
    }
    client.batch_execute("BEGIN").await?;
    match client.execute(INSERT_ORDER, &[&id, &due]).await {
        Ok(_) => {}
        Err(e) if unique_violation(&e) => return client.batch_execute("ROLLBACK").await,
        Err(e) => return Err(e),
    }
    client.execute(INSERT_ROW, &[&id, &due]).await?;
    client.batch_execute("COMMIT").await
}

fn unique_violation(e: &tokio_postgres::Error) -> bool {
    e.as_db_error()
        .is_some_and(|db| db.code().code() == "23505")
}
