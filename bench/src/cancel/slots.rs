//! `order-expiry-bench cancel --slots 1,2,4`: how many cancel statements at
//! once, and on how many connections. The consumer runs up to
//! `consumer.batch_concurrency` statements at once (its statement slots),
//! each on a connection of its own from the pool. The other way is to
//! pipeline them on one connection (tokio-postgres sends a query while the
//! previous one runs). This measures both on the same table: for each batch
//! size, each slot count and each way, the wall time `database.cancel_sql`
//! takes to cancel the same number of fresh orders, `slots` statements in
//! flight until every batch is done; the orders a second, the medians over
//! the repetitions (which configuration goes first rotates).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

use anyhow::{Context, ensure};
use chrono::{DateTime, TimeDelta, Utc};
use order_expiry::service::PgOrderStore;
use order_expiry_testkit::World;

use super::{CancelArgs, Lane, overdue};
use crate::median;

/// How the statements in flight reach the database.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Way {
    /// One pooled connection per statement slot (what `serve` does).
    Connections,
    /// Every slot's statement on one connection, pipelined.
    Pipelined,
}

const WAYS: [Way; 2] = [Way::Connections, Way::Pipelined];

/// One batch size and slot count: orders a second each way (medians).
#[derive(Debug, Clone, PartialEq)]
pub struct SlotsRow {
    /// Orders per statement.
    pub batch: usize,
    /// Statements in flight.
    pub slots: usize,
    /// Orders a second, each statement on its own connection.
    pub connections: f64,
    /// Orders a second, every statement pipelined on one connection.
    pub pipelined: f64,
}

/// Measures every batch size × slot count × way in a world of its own;
/// prints the table.
pub async fn run(world: &World, args: &CancelArgs) -> anyhow::Result<Vec<SlotsRow>> {
    ensure!(args.slots.iter().all(|&s| s > 0), "slot counts start at 1");
    let mut settings = world.settings.clone();
    let most = args.slots.iter().copied().max().unwrap_or(1);
    settings.database.pool_size = settings.database.pool_size.max(most);
    let store = PgOrderStore::new(&settings)?;
    let sql = settings.database.cancel_sql.clone();
    let configs: Vec<(usize, usize, Way)> = args
        .batch_sizes
        .iter()
        .flat_map(|&b| {
            args.slots
                .iter()
                .flat_map(move |&s| WAYS.map(|w| (b, s, w)))
        })
        .collect();
    let mut rates = vec![Vec::new(); configs.len()];
    for rep in 0..args.repetitions {
        let due_at = Utc::now() - TimeDelta::seconds(1);
        let mut sets = Vec::with_capacity(configs.len());
        for c in 0..configs.len() {
            sets.push(overdue(world, &format!("s{rep}-c{c}"), args.orders, due_at).await?);
        }
        for turn in 0..configs.len() {
            let c = (turn + rep) % configs.len();
            let (batch, slots, way) = configs[c];
            let took = cancel_all(&store, &sql, &sets[c], batch, slots, way)
                .await
                .with_context(|| format!("batch {batch}, {slots} slots, {way:?}"))?;
            rates[c].push(args.orders as f64 / took);
        }
        eprintln!(
            "cancel --slots: repetition {} of {} done",
            rep + 1,
            args.repetitions
        );
    }
    let rate = |b: usize, s: usize, w: Way| {
        let c = configs
            .iter()
            .position(|&x| x == (b, s, w))
            .expect("measured");
        median(&rates[c])
    };
    Ok(args
        .batch_sizes
        .iter()
        .flat_map(|&batch| {
            args.slots.iter().map(move |&slots| SlotsRow {
                batch,
                slots,
                connections: rate(batch, slots, Way::Connections),
                pipelined: rate(batch, slots, Way::Pipelined),
            })
        })
        .collect())
}

/// Cancels `ids`, `batch` a statement, `slots` statements in flight, `way`;
/// the wall time in seconds. Every order must be cancelled.
async fn cancel_all(
    store: &PgOrderStore,
    sql: &str,
    ids: &[String],
    batch: usize,
    slots: usize,
    way: Way,
) -> anyhow::Result<f64> {
    let connections = match way {
        Way::Connections => slots,
        Way::Pipelined => 1,
    };
    let statements = [("cancel_sql".to_owned(), sql.to_owned())];
    let mut lanes = Vec::with_capacity(connections);
    for _ in 0..connections {
        lanes.push(Lane::prepare(store, &statements).await?);
    }
    let chunks: Vec<&[String]> = ids.chunks(batch).collect();
    let next = AtomicUsize::new(0);
    let due_at = Utc::now() - TimeDelta::seconds(1);
    let started = Instant::now();
    let slots_done = (0..slots).map(|s| {
        let (lane, chunks, next) = (&lanes[s % connections], &chunks, &next);
        async move {
            let mut cancelled = 0;
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some(chunk) = chunks.get(i) else {
                    return anyhow::Ok(cancelled);
                };
                let ids: Vec<&str> = chunk.iter().map(String::as_str).collect();
                let due: Vec<DateTime<Utc>> = vec![due_at; ids.len()];
                cancelled += lane.cancel(0, &ids, &due).await?;
            }
        }
    });
    let cancelled: u64 = futures::future::try_join_all(slots_done)
        .await?
        .iter()
        .sum();
    let took = started.elapsed().as_secs_f64();
    ensure!(
        cancelled == ids.len() as u64,
        "cancelled {cancelled} of {} orders",
        ids.len()
    );
    Ok(took)
}

/// The rows as a Markdown table: orders a second each way, and each slot
/// count's gain over one slot on its own connection.
pub fn table(rows: &[SlotsRow], repetitions: usize) -> String {
    let mut out = format!(
        "database.cancel_sql, orders a second, medians of {repetitions} repetitions\n\n\
         | orders per statement | statements in flight | own connections | × one slot | \
         pipelined on one connection | × one slot |\n\
         | ---: | ---: | ---: | ---: | ---: | ---: |\n"
    );
    for r in rows {
        let one = rows
            .iter()
            .find(|o| o.batch == r.batch && o.slots == 1)
            .map_or(f64::NAN, |o| o.connections);
        out.push_str(&format!(
            "| {} | {} | {:.0} | {:.2} | {:.0} | {:.2} |\n",
            r.batch,
            r.slots,
            r.connections,
            r.connections / one,
            r.pipelined,
            r.pipelined / one
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_slot_count_is_compared_with_one_slot_on_its_own_connection() {
        let row = |batch, slots, connections, pipelined| SlotsRow {
            batch,
            slots,
            connections,
            pipelined,
        };
        let rows = [
            row(100, 1, 1000.0, 1100.0),
            row(100, 2, 1800.0, 1200.0),
            row(300, 1, 2000.0, 2000.0),
        ];
        let table = table(&rows, 3);
        assert!(
            table.contains("| 100 | 1 | 1000 | 1.00 | 1100 | 1.10 |"),
            "{table}"
        );
        assert!(
            table.contains("| 100 | 2 | 1800 | 1.80 | 1200 | 1.20 |"),
            "{table}"
        );
        assert!(
            table.contains("| 300 | 1 | 2000 | 1.00 | 2000 | 1.00 |"),
            "{table}"
        );
    }
}
