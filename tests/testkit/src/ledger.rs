//! The order service side of a scenario and its audit, for the fault and
//! cluster suites: what was placed and scheduled ([`Ledger`]), an order service
//! that places orders until told to stop ([`order_service`]), and the
//! invariants counted from the orders table ([`Figures`], [`settle`]).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use chrono::{DateTime, TimeDelta, Utc};
use order_expiry::{Scheduler, service::PgOrderStore};
use tokio_util::sync::CancellationToken;

use crate::at_ms;
use crate::world::{OrderRow, World};

/// One `schedule()` call.
#[derive(Debug, Clone)]
pub struct Call {
    /// When it was made.
    pub started: Instant,
    /// When it returned.
    pub ended: Instant,
    /// `None`: confirmed; otherwise the error's text.
    pub error: Option<String>,
}

/// What the order service did for one order.
#[derive(Debug, Clone)]
pub struct Placed {
    /// The order's id.
    pub id: String,
    /// Its deadline, as the wire format carries it.
    pub due_at: DateTime<Utc>,
    /// Some `schedule()` call for it returned `Ok`.
    pub scheduled: bool,
    /// The test paid it (its `UPDATE ... WHERE status = 'unpaid'` hit).
    pub paid: bool,
}

/// Everything the order service side of a test did: each order as a
/// [`Placed`], or as a richer record that keeps one (the soak's, which also
/// knows its route and payment gateway).
#[derive(Debug, Clone)]
pub struct Ledger<O = Placed> {
    /// Every order placed.
    pub orders: Vec<O>,
    /// Every `schedule()` call the order service made.
    pub calls: Vec<Call>,
}

impl<O> Default for Ledger<O> {
    fn default() -> Self {
        Self {
            orders: Vec::new(),
            calls: Vec::new(),
        }
    }
}

impl Ledger {
    /// Records one order.
    pub fn add(&mut self, id: &str, due_at: DateTime<Utc>, scheduled: bool, paid: bool) {
        self.orders.push(Placed {
            id: id.to_owned(),
            due_at,
            scheduled,
            paid,
        });
    }

    /// A ledger of `orders`, each scheduled and none paid.
    pub fn scheduled<'a>(orders: impl IntoIterator<Item = &'a (String, DateTime<Utc>)>) -> Self {
        let mut ledger = Self::default();
        for (id, due_at) in orders {
            ledger.add(id, *due_at, true, false);
        }
        ledger
    }

    /// Creates `orders` in `world`, schedules them with `scheduler` and pays
    /// every `pay_every`-th scheduled one (the first included) at once.
    pub async fn place(
        world: &World,
        scheduler: &Scheduler,
        orders: &[(String, DateTime<Utc>)],
        pay_every: usize,
    ) -> Self {
        world.create_orders(orders).await;
        let results = scheduler.schedule_many(orders.iter().cloned()).await;
        let mut ledger = Self::default();
        for (i, ((id, due_at), result)) in orders.iter().zip(results).enumerate() {
            let scheduled = result.is_ok();
            let paid =
                scheduled && i.is_multiple_of(pay_every) && world.store.pay(id).await.expect("pay");
            ledger.add(id, *due_at, scheduled, paid);
        }
        ledger
    }
}

impl<O> Ledger<O> {
    /// Records one `schedule()` call that started at `started` and ended now.
    pub fn call<T, E: std::fmt::Display>(&mut self, started: Instant, result: &Result<T, E>) {
        self.calls.push(Call {
            started,
            ended: Instant::now(),
            error: result.as_ref().err().map(ToString::to_string),
        });
    }

    /// `schedule()` calls that returned an error.
    pub fn schedule_errors(&self) -> usize {
        self.calls.iter().filter(|c| c.error.is_some()).count()
    }

    /// Calls that failed, with the first error text.
    pub fn errors(&self) -> (usize, Option<&str>) {
        let mut failed = self.calls.iter().filter_map(|c| c.error.as_deref());
        let first = failed.next();
        (usize::from(first.is_some()) + failed.count(), first)
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

/// How [`order_service`] places its orders.
#[derive(Debug, Clone, Copy)]
pub struct Pace {
    /// Order ids are `<prefix>-<n>`.
    pub prefix: &'static str,
    /// Time between two orders.
    pub every: Duration,
    /// Orders are due `due_from` to `due_from + due_spread` after placement.
    pub due_from: Duration,
    /// See `due_from`.
    pub due_spread: Duration,
    /// Wait before retrying a failed `schedule()`.
    pub retry_every: Duration,
    /// Stop retrying an order this long past its due time: an outage lasts
    /// seconds, a few minutes at most.
    pub give_up_after: Duration,
}

/// The order service: every `pace.every`, an unpaid order, scheduled and
/// retried until `schedule()` returns `Ok` (a real order service keeps trying,
/// or its outbox does); every fourth one is paid right after. Until `stop`.
pub async fn order_service(
    store: Arc<PgOrderStore>,
    scheduler: Arc<Scheduler>,
    pace: Pace,
    stop: CancellationToken,
) -> Ledger {
    let mut ledger = Ledger::default();
    let (from, spread) = (millis(pace.due_from), millis(pace.due_spread).max(1));
    let give_up = TimeDelta::from_std(pace.give_up_after).expect("a small give_up_after");
    let mut n = 0i64;
    while !stop.is_cancelled() {
        n += 1;
        let id = format!("{}-{n}", pace.prefix);
        // Spread over the window; the wire format's due time is what is compared.
        let due_at = crate::wire_due(at_ms(from + (n * 7919) % spread));
        // The order exists before its message.
        store
            .create_unpaid(&id, due_at)
            .await
            .expect("insert order");
        let mut scheduled = false;
        while !scheduled && Utc::now() < due_at + give_up {
            let started = Instant::now();
            let result = scheduler.schedule(id.as_str(), due_at).await;
            scheduled = result.is_ok();
            ledger.call(started, &result);
            if !scheduled {
                tokio::time::sleep(pace.retry_every).await;
            }
        }
        let paid = scheduled && n % 4 == 0 && store.pay(&id).await.expect("pay");
        ledger.add(&id, due_at, scheduled, paid);
        tokio::time::sleep(pace.every).await;
    }
    ledger
}

/// A running [`order_service`]; [`Orders::stop`] returns its ledger.
#[derive(Debug)]
pub struct Orders {
    scheduler: Arc<Scheduler>,
    stop: CancellationToken,
    task: tokio::task::JoinHandle<Ledger>,
}

impl Orders {
    /// Starts [`order_service`] on `store` and `scheduler` at `pace`.
    pub fn start(store: Arc<PgOrderStore>, scheduler: Scheduler, pace: Pace) -> Self {
        let scheduler = Arc::new(scheduler);
        let stop = CancellationToken::new();
        let service = order_service(store, Arc::clone(&scheduler), pace, stop.clone());
        Self {
            scheduler,
            stop,
            task: tokio::spawn(service),
        }
    }

    /// Stops placing orders, closes the publisher; what was placed.
    pub async fn stop(self) -> Ledger {
        self.stop.cancel();
        let ledger = self.task.await.expect("the order service");
        self.scheduler.close().await;
        ledger
    }
}

fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).expect("a small duration")
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
    /// Scheduled with `Ok`, never paid, due, still `unpaid`.
    pub lost: usize,
    /// Cancelled before its due time.
    pub early: usize,
    /// Paid by the test yet cancelled, or both `paid_at` and `cancelled_at` set.
    pub wrongly_cancelled: usize,
    /// Largest `cancelled_at - due_at`.
    pub max_lateness: Duration,
    /// When the fault ended, if the audit was given one.
    pub recovered: Option<DateTime<Utc>>,
    /// Largest `cancelled_at - max(due_at, recovered)`: the lateness a
    /// scenario's bound is about (`max_lateness` without `recovered`).
    pub max_after_recovery: Duration,
    /// The order of `max_after_recovery`: its id, due time and cancel time
    /// by the database's clock, so that a broken bound names it.
    pub latest: Option<String>,
    /// Lost, wrong and early orders, for the failure message.
    pub bad: Vec<String>,
}

impl Figures {
    /// Audits `rows` against `ledger`; `recovered` is when the fault ended.
    pub fn audit(
        ledger: &Ledger,
        rows: &HashMap<String, OrderRow>,
        recovered: Option<DateTime<Utc>>,
    ) -> Self {
        let mut f = Figures {
            orders: ledger.orders.len(),
            recovered,
            ..Default::default()
        };
        for placed in &ledger.orders {
            let row = rows
                .get(&placed.id)
                .unwrap_or_else(|| panic!("order {} missing from the table", placed.id));
            f.scheduled += usize::from(placed.scheduled);
            f.paid += usize::from(placed.paid);
            if (placed.paid && row.status != "paid")
                || (row.paid_at.is_some() && row.cancelled_at.is_some())
            {
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
                let from = recovered.map_or(row.pay_deadline, |r| row.pay_deadline.max(r));
                if let Ok(late) = (cancelled_at - from).to_std()
                    && (f.latest.is_none() || late > f.max_after_recovery)
                {
                    f.max_after_recovery = late;
                    f.latest = Some(format!(
                        "{}: due {}, cancelled {}",
                        placed.id, row.pay_deadline, cancelled_at
                    ));
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

    /// Every scheduled order ended paid or cancelled.
    pub fn settled(&self) -> bool {
        self.cancelled + self.paid == self.scheduled
    }

    /// 0 lost, 0 early, 0 wrongly cancelled, every scheduled order paid or
    /// cancelled; panics with the offending orders.
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

    /// The invariants, and every cancel within `bound` of max(due, recovered).
    pub fn assert_within(&self, bound: Duration) {
        self.assert_invariants();
        assert!(
            self.max_after_recovery <= bound,
            "a cancel came {:?} after max(due, recovered), beyond {bound:?}: {self:?}",
            self.max_after_recovery
        );
    }

    /// The scenario's `FIGURES` line (`scripts/test` shows these).
    pub fn print(&self, scenario: &str, extra: &str) {
        let after = match self.recovered {
            Some(_) => format!(
                ", after recovery {} ms",
                self.max_after_recovery.as_millis()
            ),
            None => String::new(),
        };
        eprintln!(
            "FIGURES {scenario}: orders {}, scheduled ok {}, paid {}, cancelled {}, lost {}, early {}, \
             wrongly cancelled {}, max lateness {} ms{after}; {extra}",
            self.orders,
            self.scheduled,
            self.paid,
            self.cancelled,
            self.lost,
            self.early,
            self.wrongly_cancelled,
            self.max_lateness.as_millis(),
        );
    }
}

/// Lateness of a set of cancelled orders, measured from each one's due time
/// (or from a later start, [`Lateness::since`]).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Lateness {
    /// Cancelled orders counted.
    pub cancels: usize,
    /// Median.
    pub p50: Duration,
    /// 99th percentile (nearest rank).
    pub p99: Duration,
    /// Largest.
    pub max: Duration,
}

impl Lateness {
    /// Of the cancelled orders in `ledger` that `pick` keeps, from their due time.
    pub fn of(
        ledger: &Ledger,
        rows: &HashMap<String, OrderRow>,
        pick: impl Fn(&Placed) -> bool,
    ) -> Self {
        Self::since(ledger, rows, None, pick)
    }

    /// As [`Lateness::of`], each measured from the later of its due time and
    /// `from` (a fault's repair): what is left once the fault is over; 0 for
    /// an order cancelled before `from`. An early cancel (before its due time)
    /// is not counted here: [`Figures`] counts those.
    pub fn since(
        ledger: &Ledger,
        rows: &HashMap<String, OrderRow>,
        from: Option<DateTime<Utc>>,
        pick: impl Fn(&Placed) -> bool,
    ) -> Self {
        let mut late: Vec<Duration> = ledger
            .orders
            .iter()
            .filter(|o| pick(o))
            .filter_map(|o| {
                let row = rows.get(&o.id)?;
                let cancelled_at = row.cancelled_at?;
                (cancelled_at - row.pay_deadline).to_std().ok()?;
                let start = from.map_or(row.pay_deadline, |f| row.pay_deadline.max(f));
                Some((cancelled_at - start).to_std().unwrap_or_default())
            })
            .collect();
        late.sort_unstable();
        let rank = |q: usize| late[(late.len() * q).div_ceil(100).max(1) - 1];
        match late.last() {
            None => Self::default(),
            Some(&max) => Self {
                cancels: late.len(),
                p50: rank(50),
                p99: rank(99),
                max,
            },
        }
    }
}

impl std::fmt::Display for Lateness {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} cancels, p50 {:.2} s, p99 {:.2} s, max {:.2} s",
            self.cancels,
            self.p50.as_secs_f64(),
            self.p99.as_secs_f64(),
            self.max.as_secs_f64()
        )
    }
}

/// Waits until every scheduled, unpaid order is due and resolved, at most
/// `limit` past the later of now and the last due time; then audits the table
/// (against `recovered`, see [`Figures::audit`]). Every 10 s while due orders
/// are missing, prints how many with `progress()` (where the messages are).
pub async fn settle(
    world: &World,
    ledger: &Ledger,
    recovered: Option<DateTime<Utc>>,
    limit: Duration,
    progress: impl Fn() -> String,
) -> Figures {
    let last_due = ledger.orders.iter().map(|o| o.due_at).max();
    let last_due = last_due.unwrap_or_else(Utc::now).max(Utc::now());
    let deadline = last_due + TimeDelta::from_std(limit).expect("a small limit");
    let started = Instant::now();
    let mut next_report = started + Duration::from_secs(10);
    loop {
        let figures = Figures::audit(ledger, &world.rows().await, recovered);
        let all_due = Utc::now() > last_due;
        if (all_due && figures.lost == 0 && figures.settled()) || Utc::now() > deadline {
            if figures.lost > 0 {
                eprintln!("not settled: {}", progress());
            }
            return figures;
        }
        if all_due && Instant::now() > next_report {
            eprintln!(
                "settling {:.0} s: {} due orders not cancelled yet; {}",
                started.elapsed().as_secs_f64(),
                figures.lost,
                progress()
            );
            next_report += Duration::from_secs(10);
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(status: &str, due: i64, cancelled: Option<i64>) -> OrderRow {
        let at = |ms| DateTime::<Utc>::from_timestamp_millis(ms).expect("a time");
        OrderRow {
            status: status.into(),
            pay_deadline: at(due),
            paid_at: None,
            cancelled_at: cancelled.map(at),
            cancelled_by: None,
        }
    }

    #[test]
    fn the_audit_counts_lost_early_and_late_orders() {
        let ledger = Ledger::scheduled(&[
            ("late".to_owned(), at_ms(-9_000)),
            ("early".to_owned(), at_ms(-9_000)),
            ("lost".to_owned(), at_ms(-9_000)),
        ]);
        let rows = HashMap::from([
            ("late".to_owned(), row("cancelled", 1_000, Some(1_700))),
            ("early".to_owned(), row("cancelled", 1_000, Some(900))),
            ("lost".to_owned(), row("unpaid", 1_000, None)),
        ]);
        let f = Figures::audit(&ledger, &rows, None);
        assert_eq!((f.cancelled, f.early, f.lost), (2, 1, 1));
        assert_eq!(f.max_lateness, Duration::from_millis(700));
        let latest = f.latest.as_deref().expect("the latest cancel");
        assert!(
            latest.starts_with("late: due 1970-01-01 00:00:01 UTC"),
            "{latest}"
        );
        assert!(!f.settled());
        let broken = std::panic::catch_unwind(|| f.assert_invariants());
        assert!(broken.is_err(), "a lost order breaks the invariants");
    }

    #[test]
    fn lateness_takes_percentiles_of_the_picked_cancels_from_due_or_a_repair() {
        let ids: Vec<(String, DateTime<Utc>)> =
            (0..100).map(|i| (format!("o{i}"), at_ms(-9_000))).collect();
        let ledger = Ledger::scheduled(&ids);
        // o0 is cancelled 0 ms late, o99 990 ms late, o100 does not exist.
        let rows: HashMap<String, OrderRow> = (0..100)
            .map(|i| {
                (
                    format!("o{i}"),
                    row("cancelled", 1_000, Some(1_000 + 10 * i)),
                )
            })
            .collect();
        let all = Lateness::of(&ledger, &rows, |_| true);
        assert_eq!(all.cancels, 100);
        assert_eq!(all.p50, Duration::from_millis(490));
        assert_eq!(all.p99, Duration::from_millis(980));
        assert_eq!(all.max, Duration::from_millis(990));
        let some = Lateness::of(&ledger, &rows, |o| o.id.ends_with('9'));
        assert_eq!((some.cancels, some.max), (10, Duration::from_millis(990)));
        let repaired = DateTime::<Utc>::from_timestamp_millis(1_500).expect("a time");
        let after = Lateness::since(&ledger, &rows, Some(repaired), |_| true);
        assert_eq!(
            (after.cancels, after.max),
            (100, Duration::from_millis(490))
        );
        assert_eq!(after.p50, Duration::ZERO);
        assert_eq!(Lateness::of(&ledger, &rows, |_| false), Lateness::default());
    }
}
