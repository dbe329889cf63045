//! The order service side of a scenario ([`order_service`]: orders placed with
//! delays of 2-30 s, every schedule call's outcome kept with its time) and the
//! audit of the orders table against the invariants ([`Figures`]).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use chrono::{DateTime, TimeDelta, Utc};
use order_expiry::{Scheduler, service::PgOrderStore};
use order_expiry_testkit::{OrderRow, at_ms, message};
use tokio_util::sync::CancellationToken;

use super::world::ClusterWorld;

/// One `schedule()` call.
#[derive(Debug, Clone)]
pub struct Call {
    pub started: Instant,
    pub ended: Instant,
    /// `None`: confirmed; otherwise the error's text.
    pub error: Option<String>,
}

/// What the order service did for one order.
#[derive(Debug, Clone)]
pub struct Placed {
    pub id: String,
    pub due_at: DateTime<Utc>,
    /// Some `schedule()` call for it returned `Ok`.
    pub scheduled: bool,
    /// The test paid it (its `UPDATE ... WHERE status = 'unpaid'` hit).
    pub paid: bool,
}

/// Everything the order service did.
#[derive(Debug, Default)]
pub struct Ledger {
    pub orders: Vec<Placed>,
    pub calls: Vec<Call>,
}

impl Ledger {
    /// Calls that failed, with the first error text.
    pub fn errors(&self) -> (usize, Option<&str>) {
        let failed: Vec<&Call> = self.calls.iter().filter(|c| c.error.is_some()).collect();
        (
            failed.len(),
            failed.first().and_then(|c| c.error.as_deref()),
        )
    }

    /// How long after `from` the first call started at or after `from` was
    /// confirmed: the publisher's time to recover.
    pub fn first_ok_after(&self, from: Instant) -> Option<Duration> {
        self.calls
            .iter()
            .filter(|c| c.started >= from && c.error.is_none())
            .map(|c| c.ended - from)
            .min()
    }

    /// When the first confirm after `from` came back, whenever its call
    /// started: without a majority nothing is confirmed, so after a majority
    /// loss this is when the cluster took writes again, as a publisher sees it.
    pub fn first_confirm_after(&self, from: Instant) -> Option<Instant> {
        self.calls
            .iter()
            .filter(|c| c.ended > from && c.error.is_none())
            .map(|c| c.ended)
            .min()
    }

    /// Calls started in `[from, to)`: (confirmed, failed).
    pub fn outcomes_between(&self, from: Instant, to: Instant) -> (usize, usize) {
        let window = self
            .calls
            .iter()
            .filter(|c| c.started >= from && c.started < to);
        window.fold((0, 0), |(ok, failed), c| match c.error {
            None => (ok + 1, failed),
            Some(_) => (ok, failed + 1),
        })
    }
}

/// The order service: every `every`, an unpaid order due in 2-30 s, scheduled
/// and retried every 200 ms until `schedule()` returns `Ok` (a real order
/// service keeps trying, or its outbox does); every fourth one is paid right
/// after. Until `stop`.
pub async fn order_service(
    store: Arc<PgOrderStore>,
    scheduler: Arc<Scheduler>,
    every: Duration,
    stop: CancellationToken,
) -> Ledger {
    let mut ledger = Ledger::default();
    let mut n = 0i64;
    while !stop.is_cancelled() {
        n += 1;
        let id = format!("c-{n}");
        // Spread over 2-30 s; the wire format's due time is what is compared.
        let due_at = message(&id, at_ms(2000 + (n * 7919) % 28_000)).due_at;
        store
            .create_unpaid(&id, due_at)
            .await
            .expect("insert order");
        let mut scheduled = false;
        while !scheduled && Utc::now() < due_at + TimeDelta::seconds(60) {
            let started = Instant::now();
            let result = scheduler.schedule(id.as_str(), due_at).await;
            let error = result.err().map(|e| e.to_string());
            scheduled = error.is_none();
            ledger.calls.push(Call {
                started,
                ended: Instant::now(),
                error,
            });
            if !scheduled {
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
        let paid = scheduled && n % 4 == 0 && store.pay(&id).await.expect("pay");
        ledger.orders.push(Placed {
            id,
            due_at,
            scheduled,
            paid,
        });
        tokio::time::sleep(every).await;
    }
    ledger
}

/// The invariants, counted from the database.
#[derive(Debug, Clone, Default)]
pub struct Figures {
    pub orders: usize,
    pub scheduled: usize,
    pub paid: usize,
    pub cancelled: usize,
    /// Scheduled with `Ok`, never paid, due, still `unpaid`.
    pub lost: usize,
    /// Cancelled before its due time.
    pub early: usize,
    /// Paid by the test yet cancelled (or both times set).
    pub wrongly_cancelled: usize,
    /// Largest `cancelled_at - due_at`.
    pub max_lateness: Duration,
    /// Largest `cancelled_at - max(due_at, recovered)`: the lateness the
    /// scenario's bound is about.
    pub max_after_recovery: Duration,
    pub bad: Vec<String>,
}

impl Figures {
    /// Audits `rows` against `ledger`; `recovered` is when the cluster had its
    /// majority again (the fault's end for the bound).
    pub fn audit(
        ledger: &Ledger,
        rows: &HashMap<String, OrderRow>,
        recovered: DateTime<Utc>,
    ) -> Self {
        let mut f = Figures {
            orders: ledger.orders.len(),
            ..Default::default()
        };
        for placed in &ledger.orders {
            let row = &rows[&placed.id];
            f.scheduled += usize::from(placed.scheduled);
            f.paid += usize::from(placed.paid);
            if (placed.paid && row.status != "paid")
                || (row.paid_at.is_some() && row.cancelled_at.is_some())
            {
                f.wrongly_cancelled += 1;
                f.bad
                    .push(format!("wrongly cancelled {}: {row:?}", placed.id));
            }
            if let Some(cancelled_at) = row.cancelled_at {
                f.cancelled += 1;
                match (cancelled_at - row.pay_deadline).to_std() {
                    Ok(late) => f.max_lateness = f.max_lateness.max(late),
                    Err(_) => {
                        f.early += 1;
                        f.bad.push(format!("early {}: {row:?}", placed.id));
                    }
                }
                let from = row.pay_deadline.max(recovered);
                if let Ok(late) = (cancelled_at - from).to_std() {
                    f.max_after_recovery = f.max_after_recovery.max(late);
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

    /// 0 lost, 0 early, 0 wrongly cancelled, every scheduled order paid or
    /// cancelled, and every cancel within `bound` of max(due, recovered).
    pub fn assert_within(&self, bound: Duration) {
        assert!(
            self.lost == 0 && self.early == 0 && self.wrongly_cancelled == 0,
            "invariants broken: {self:?}"
        );
        assert_eq!(self.cancelled + self.paid, self.scheduled, "{self:?}");
        assert!(
            self.max_after_recovery <= bound,
            "a cancel came {:?} after max(due, recovered), beyond {bound:?}: {self:?}",
            self.max_after_recovery
        );
    }

    pub fn print(&self, scenario: &str, extra: &str) {
        eprintln!(
            "FIGURES {scenario}: orders {}, scheduled ok {}, paid {}, cancelled {}, lost {}, early {}, \
             wrongly cancelled {}, max lateness {} ms, after recovery {} ms; {extra}",
            self.orders,
            self.scheduled,
            self.paid,
            self.cancelled,
            self.lost,
            self.early,
            self.wrongly_cancelled,
            self.max_lateness.as_millis(),
            self.max_after_recovery.as_millis(),
        );
    }
}

/// Waits until every scheduled, unpaid order is due and cancelled, at most
/// `limit` past the last due time; then audits.
pub async fn settle(
    world: &ClusterWorld,
    ledger: &Ledger,
    recovered: DateTime<Utc>,
    limit: Duration,
) -> Figures {
    let last_due = ledger
        .orders
        .iter()
        .map(|o| o.due_at)
        .max()
        .unwrap_or_else(Utc::now);
    let deadline = last_due + TimeDelta::from_std(limit).expect("a small limit");
    loop {
        let rows = rows(world).await;
        let figures = Figures::audit(ledger, &rows, recovered);
        let done = Utc::now() > last_due && figures.cancelled + figures.paid == figures.scheduled;
        if done || Utc::now() > deadline {
            return figures;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// Every order row (retrying a failed read for up to 30 s).
pub async fn rows(world: &ClusterWorld) -> HashMap<String, OrderRow> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        match world.orders().await {
            Ok(rows) => return rows,
            Err(e) if Instant::now() > deadline => panic!("reading orders: {e}"),
            Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
        }
    }
}
