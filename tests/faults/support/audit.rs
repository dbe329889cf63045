//! What the order service side did ([`Ledger`]) and the invariants counted
//! from the database ([`Figures`]).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use order_expiry::{Scheduler, service::PgOrderStore};
use order_expiry_testkit::OrderRow;
use tokio_util::sync::CancellationToken;

use super::*;

/// What the order service did for one order.
#[derive(Debug, Clone)]
pub struct Placed {
    pub id: String,
    pub due_at: DateTime<Utc>,
    /// `schedule()` returned `Ok` (at some attempt).
    pub scheduled: bool,
    /// The test's payment went through (`UPDATE ... WHERE status = 'unpaid'` hit).
    pub paid: bool,
}

/// Everything the order service side of a test did.
#[derive(Debug, Default, Clone)]
pub struct Ledger {
    pub orders: Vec<Placed>,
    /// `schedule()` calls that returned an error.
    pub schedule_errors: usize,
}

impl Ledger {
    pub fn add(&mut self, id: &str, due_at: DateTime<Utc>, scheduled: bool, paid: bool) {
        self.orders.push(Placed {
            id: id.to_owned(),
            due_at,
            scheduled,
            paid,
        });
    }
}

/// The invariants, counted from the database.
#[derive(Debug, Clone, Default)]
pub struct Figures {
    /// Orders the order service placed.
    pub orders: usize,
    /// ... and scheduled with `Ok`.
    pub scheduled: usize,
    /// Paid by the test before the consumer got to them.
    pub paid: usize,
    /// Ended `cancelled`.
    pub cancelled: usize,
    /// Scheduled, never paid, due, and still `unpaid`.
    pub lost: usize,
    /// Paid (by the test's successful payment) yet `cancelled`, or both
    /// `paid_at` and `cancelled_at` set.
    pub wrongly_cancelled: usize,
    /// Cancelled before `due_at`.
    pub early: usize,
    /// Largest `cancelled_at - due_at`.
    pub max_lateness: Duration,
    /// Ids of lost / wrong / early orders, for the failure message.
    pub bad: Vec<String>,
}

impl Figures {
    fn from_rows(ledger: &Ledger, rows: &HashMap<String, OrderRow>) -> Self {
        let mut f = Figures {
            orders: ledger.orders.len(),
            ..Default::default()
        };
        for placed in &ledger.orders {
            let row = rows
                .get(&placed.id)
                .unwrap_or_else(|| panic!("order {} missing from the table", placed.id));
            if placed.scheduled {
                f.scheduled += 1;
            }
            if placed.paid {
                f.paid += 1;
            }
            let wrong = (placed.paid && row.status != "paid")
                || (row.paid_at.is_some() && row.cancelled_at.is_some());
            if wrong {
                f.wrongly_cancelled += 1;
                f.bad
                    .push(format!("wrongly cancelled {}: {row:?}", placed.id));
            }
            if row.status == "cancelled" {
                f.cancelled += 1;
                let cancelled_at = row.cancelled_at.expect("cancelled_at set");
                match (cancelled_at - row.pay_deadline).to_std() {
                    Ok(late) => f.max_lateness = f.max_lateness.max(late),
                    Err(_) => {
                        f.early += 1;
                        f.bad.push(format!("early {}: {row:?}", placed.id));
                    }
                }
            }
            if placed.scheduled
                && !placed.paid
                && row.status == "unpaid"
                && placed.due_at < Utc::now()
            {
                f.lost += 1;
                f.bad.push(format!("lost {}: {row:?}", placed.id));
            }
        }
        f
    }

    /// Every invariant of the issue; panics with the offending orders.
    pub fn assert_invariants(&self) {
        assert!(
            self.lost == 0 && self.wrongly_cancelled == 0 && self.early == 0,
            "invariants broken: {self:?}"
        );
        assert_eq!(
            self.cancelled + self.paid,
            self.scheduled,
            "every scheduled order ends paid or cancelled: {self:?}"
        );
    }

    pub fn print(&self, scenario: &str, extra: &str) {
        eprintln!(
            "FIGURES {scenario}: orders {}, scheduled ok {}, paid {}, cancelled {}, lost {}, wrongly cancelled {}, early {}, max lateness {} ms; {extra}",
            self.orders,
            self.scheduled,
            self.paid,
            self.cancelled,
            self.lost,
            self.wrongly_cancelled,
            self.early,
            self.max_lateness.as_millis()
        );
    }
}

/// Waits until every scheduled, unpaid order is due and resolved (or `timeout`),
/// then audits the table.
pub async fn settle(world: &World, ledger: &Ledger, timeout: Duration) -> Figures {
    let last_due = ledger
        .orders
        .iter()
        .map(|o| o.due_at)
        .max()
        .unwrap_or_else(Utc::now);
    let started = Instant::now();
    let deadline = started + timeout;
    let mut next_report = started + Duration::from_secs(10);
    loop {
        let rows = world.rows().await;
        let figures = Figures::from_rows(ledger, &rows);
        let all_due = Utc::now() > last_due;
        if (all_due && figures.lost == 0 && figures.cancelled + figures.paid == figures.scheduled)
            || Instant::now() > deadline
        {
            if figures.lost > 0 {
                eprintln!("not settled: queues {}", world.queue_report());
            }
            return figures;
        }
        if all_due && Instant::now() > next_report {
            // Where the missing ones are, for a failure's story.
            eprintln!(
                "settling {:.0} s: {} due orders not cancelled yet; queues {}",
                started.elapsed().as_secs_f64(),
                figures.lost,
                world.queue_report()
            );
            next_report += Duration::from_secs(10);
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The order service of the broker tests: every `every`, insert an unpaid order
/// due in 1-6 s and schedule it, retrying a failed `schedule()` until it returns
/// `Ok` (as a real order service would); every fourth order is paid right after.
/// Runs until `stop`.
pub async fn order_service(
    world_store: Arc<PgOrderStore>,
    scheduler: Arc<Scheduler>,
    every: Duration,
    stop: CancellationToken,
) -> Ledger {
    let mut ledger = Ledger::default();
    let mut n = 0u64;
    while !stop.is_cancelled() {
        n += 1;
        let id = format!("o-{n}");
        let (id, due_at) = order(id, at_ms(1000 + (n as i64 * 397) % 5000));
        // The database is up in the broker tests; the order exists before its message.
        world_store
            .create_unpaid(&id, due_at)
            .await
            .expect("insert order");
        let mut scheduled = false;
        // Keep trying while the order is not long overdue: an outage lasts
        // seconds, a few minutes at most (a RabbitMQ 4.0 node carrying the
        // ballast took 78 s to come back from a kill -9 on a busy machine).
        while !scheduled && Utc::now() < due_at + chrono::TimeDelta::seconds(300) {
            match scheduler.schedule(&id, due_at).await {
                Ok(_) => scheduled = true,
                Err(_) => {
                    ledger.schedule_errors += 1;
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
        }
        let paid = scheduled && n.is_multiple_of(4) && world_store.pay(&id).await.expect("pay");
        ledger.add(&id, due_at, scheduled, paid);
        tokio::time::sleep(every).await;
    }
    ledger
}
