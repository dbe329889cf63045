//! One failover scenario's world on the pair, and what it places: orders
//! scheduled through the ladder, payments that race their cancels.

use std::sync::Arc;
use std::time::{Duration, Instant};

use chrono::{DateTime, TimeDelta, Utc};
use order_expiry::{Scheduler, service::PgOrderStore};
use order_expiry_testkit::pg_pair::{self, PairLock, Replication};
use order_expiry_testkit::{ReadyWatch, Served, connect_database};
use secrecy::ExposeSecret;
use tokio::task::JoinHandle;

use super::timeline::{Recovery, Timeline};
use crate::support::{CANCELLED, Figures, Ledger, World, build, orders, settle};

/// A scenario: the pair up as `mode` says, a world on it, `serve` with both
/// hosts in its URL (the sweeper off, as every world's), `/readyz` watched
/// unless [`Scenario::unwatched`].
pub struct Scenario {
    pub world: World,
    pub served: Served,
    pub watch: Option<ReadyWatch>,
    pub scheduler: Scheduler,
    /// When the scenario began: the figures count from here.
    pub began: Instant,
    _pair: PairLock,
}

impl Scenario {
    pub async fn start(name: &'static str, mode: Replication, env: &[(&str, &str)]) -> Self {
        let pair = pg_pair::lock().await;
        pg_pair::up(mode).await;
        // Its orders live in the pair's database instead of the test database.
        let world = build(name, World::builder().database_url(&pg_pair::url())).await;
        let served = world.serve(env).await;
        served.wait_ready(Duration::from_secs(30)).await;
        let watch = Some(ReadyWatch::start(&served));
        let scheduler = world.scheduler();
        Self {
            world,
            served,
            watch,
            scheduler,
            began: Instant::now(),
            _pair: pair,
        }
    }

    /// Stops watching `/readyz`: each probe runs `serve`'s database ping,
    /// which drops a read-only connection by itself, so a scenario of the
    /// cancels' own handling of one runs without.
    pub fn unwatched(mut self) -> Self {
        self.watch = None;
        self
    }

    /// The recovery `timeline` shows for `ledger` on the rows now.
    pub async fn recovery(&self, timeline: &Timeline, ledger: &Ledger) -> Recovery {
        let rows = self.world.rows().await;
        timeline.recovery(ledger, &rows, &self.served, self.watch.as_ref())
    }

    /// `count` unpaid orders `<prefix>-<i>`, due from `first` after now over
    /// `spread`, created and scheduled; every fifth is paid at once.
    pub async fn place(
        &self,
        prefix: &str,
        count: usize,
        first: Duration,
        spread: Duration,
    ) -> Ledger {
        let step = spread.as_millis() as i64 / count.max(1) as i64;
        let orders = orders(prefix, count, |i| first.as_millis() as i64 + i * step);
        Ledger::place(&self.world, &self.scheduler, &orders, 5).await
    }

    /// The usual traffic: 400 orders `<prefix>-<i>` due 2-16 s after now
    /// (every fifth paid at once), and the payer racing their due times.
    pub async fn traffic(&self, prefix: &str) -> (Ledger, JoinHandle<Vec<(String, Paid)>>) {
        let (first, spread) = (Duration::from_secs(2), Duration::from_secs(14));
        let ledger = self.place(prefix, 400, first, spread).await;
        let payer = self.payer(&ledger);
        (ledger, payer)
    }

    /// Waits until `at` after the scenario began: the fault's time.
    pub async fn fault_at(&self, at: Duration) -> (Instant, DateTime<Utc>) {
        until(self.began, at).await;
        Timeline::fault_now()
    }

    /// At `at` after the scenario began, kills the primary (-9); promotes the
    /// standby 2 s later (a failover manager's detection).
    pub async fn kill_and_promote(&self, at: Duration) -> Timeline {
        let fault = self.fault_at(at).await;
        pg_pair::kill(1).await;
        tokio::time::sleep(Duration::from_secs(2)).await;
        Timeline::new(fault, pg_pair::promote(2).await)
    }

    /// The world's database URL (both hosts, read-write).
    pub fn url(&self) -> String {
        self.world.settings.database.url.expose_secret().to_owned()
    }

    /// Pays the orders `i % 5 == 1` of `ledger` 200 ms before each is due, across
    /// whatever the database does meanwhile (see [`pay_for_sure`]).
    pub fn payer(&self, ledger: &Ledger) -> JoinHandle<Vec<(String, Paid)>> {
        let store = Arc::clone(&self.world.store);
        let url = self.url();
        let placed = ledger.orders.iter().enumerate();
        let to_pay = placed.filter(|(i, o)| i % 5 == 1 && o.scheduled);
        let due: Vec<_> = to_pay.map(|(_, o)| (o.id.clone(), o.due_at)).collect();
        tokio::spawn(async move {
            let mut paid = Vec::with_capacity(due.len());
            for (id, due_at) in due {
                let at = due_at - TimeDelta::milliseconds(200);
                if let Ok(wait) = (at - Utc::now()).to_std() {
                    tokio::time::sleep(wait).await;
                }
                let answer = pay_for_sure(&store, &url, &id, due_at + TimeDelta::seconds(30)).await;
                paid.push((id, answer));
            }
            paid
        })
    }
}

/// How a scenario that loses nothing ended: the audit, the recovery and
/// `serve`'s own count of its cancels.
pub struct Ended {
    pub figures: Figures,
    pub recovery: Recovery,
    pub served_cancels: f64,
}

impl Scenario {
    /// Waits (at most `limit`) until `ledger` settles, then reads what
    /// `timeline` shows of the recovery and `serve`'s cancels.
    pub async fn settle(&self, timeline: &Timeline, ledger: &Ledger, limit: Duration) -> Ended {
        let figures = settle(&self.world, ledger, limit).await;
        let served_cancels = self.served.metric(CANCELLED).await;
        Ended {
            figures,
            recovery: self.recovery(timeline, ledger).await,
            served_cancels,
        }
    }

    /// Stops `serve` and removes the world (the pair is left as it is: the
    /// next scenario's `up` rebuilds it).
    pub async fn finish(self) {
        self.scheduler.close().await;
        drop(self.watch);
        drop(self.served);
        self.world.cleanup().await;
    }
}

impl Ended {
    /// The scenario's FIGURES line: `title`, the recovery, both counts of
    /// cancels, then `extra`.
    pub fn print(&self, title: &str, extra: &str) {
        let (figures, recovery) = (&self.figures, &self.recovery);
        let cancels = format!(
            "serve's cancels {}, the database's {}",
            self.served_cancels, figures.cancelled
        );
        figures.print(
            title,
            &format!("{}; {cancels}; {extra}", recovery.describe()),
        );
    }

    /// What every scenario that loses nothing promises: the invariants,
    /// every order within [`super::timeline::BOUND`], nothing swept, no cancel
    /// lost or done twice, and some order due in the outage (or the scenario
    /// tested nothing).
    pub async fn assert_promises(&self, s: &Scenario) {
        let figures = &self.figures;
        if figures.lost > 0 {
            eprintln!(
                "pair: {}\nserve: {}",
                pg_pair::status(),
                s.served.log_tail(20)
            );
        }
        figures.assert_invariants();
        self.recovery.assert_within_bound();
        s.served.assert_nothing_swept().await;
        assert!(
            self.served_cancels <= figures.cancelled as f64,
            "serve cancelled {} orders, the database holds {}: some cancel was lost or done twice",
            self.served_cancels,
            figures.cancelled
        );
        assert!(
            self.recovery.due_in_outage > 0,
            "no order came due in the outage"
        );
    }
}

/// What a payment came to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Paid {
    /// The order service saw its payment commit.
    Yes,
    /// The order was cancelled first.
    No,
    /// No answer before the deadline: the database decides.
    Unknown,
}

/// Pays `id`, retrying while the database fails over; an `UPDATE` that
/// answered nothing may have committed, so a retry that finds the order not
/// unpaid reads it: paid (by the earlier try) or cancelled.
pub async fn pay_for_sure(store: &PgOrderStore, url: &str, id: &str, until: DateTime<Utc>) -> Paid {
    let mut tried = false;
    while Utc::now() < until {
        match tokio::time::timeout(Duration::from_secs(3), store.pay(id)).await {
            Ok(Ok(true)) => return Paid::Yes,
            Ok(Ok(false)) if !tried => return Paid::No,
            Ok(Ok(false)) => match status(url, id).await.as_deref() {
                Some("paid") => return Paid::Yes,
                Some(_) => return Paid::No,
                None => {}
            },
            _ => {}
        }
        tried = true;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Paid::Unknown
}

/// The order's status, read on the primary (a connection of its own).
async fn status(url: &str, id: &str) -> Option<String> {
    let client = connect_database(url).await.ok()?;
    let row = client
        .query_one("SELECT status FROM orders WHERE id = $1", &[&id])
        .await
        .ok()?;
    row.try_get(0).ok()
}

/// Puts the payer's answers into `ledger`; an unknown one is what the
/// database says (either is consistent). How many were unknown.
pub async fn record_payments(
    world: &World,
    ledger: &mut Ledger,
    paid: Vec<(String, Paid)>,
) -> usize {
    let mut unknown = 0;
    for (id, answer) in paid {
        let placed = ledger.orders.iter_mut().find(|o| o.id == id);
        placed.expect("placed").paid = match answer {
            Paid::Yes => true,
            Paid::No => false,
            Paid::Unknown => {
                unknown += 1;
                world
                    .rows()
                    .await
                    .get(&id)
                    .is_some_and(|r| r.status == "paid")
            }
        };
    }
    unknown
}

/// Sleeps until `at` after `since`.
pub async fn until(since: Instant, at: Duration) {
    tokio::time::sleep_until((since + at).into()).await;
}
