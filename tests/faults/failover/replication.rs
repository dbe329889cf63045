//! Scenarios 4 and 5: the standby falls behind, then the primary dies. Node 1's
//! walsenders are stopped (SIGSTOP) for 3 s while cancels and payments go on,
//! node 1 is killed -9, and node 2 is promoted 2 s later with what it had.
//!
//! - Synchronous replication (4): no commit returns while the standby lags, so
//!   nothing a commit answered is lost; the cancels that waited are retried on
//!   the new primary. The price: every write waits while the standby does.
//! - Asynchronous replication (5): the commits of the 3 s answer at once and
//!   are lost with node 1. A lost cancel leaves its order unpaid, and its
//!   message was acked: nothing sends it again; only the sweeper cancels it
//!   (`grace_ms` after its due time). A lost payment leaves its order unpaid
//!   too, and it is cancelled when due.

use std::time::{Duration, Instant};

use chrono::{TimeDelta, Utc};
use order_expiry_testkit::pg_pair::{self, Replication};

use super::run::{Paid, Scenario, pay_for_sure, until};
use super::timeline::Timeline;
use crate::support::{CANCELLED, Ledger, Placed, World};

/// The lag and the kill: the scenario, its ledger, its timeline and the
/// orders paid in the lag window with an answer.
async fn lag_then_kill(
    name: &'static str,
    mode: Replication,
) -> (Scenario, Ledger, Timeline, Vec<String>) {
    let s = Scenario::start(name, mode, &[]).await;
    let mut ledger = s
        .place("r", 500, Duration::from_secs(2), Duration::from_secs(14))
        .await;
    // In the window: payments of orders due last, not paid up front.
    let to_pay: Vec<String> = unpaid(&ledger)
        .rev()
        .take(20)
        .map(|o| o.id.clone())
        .collect();

    until(s.began, Duration::from_secs(5)).await;
    pg_pair::pause_replication().await;
    let (url, store) = (s.url(), std::sync::Arc::clone(&s.world.store));
    let window_ends = Utc::now() + TimeDelta::seconds(2);
    let payments = tokio::spawn(async move {
        let mut paid = Vec::new();
        for id in to_pay {
            let deadline = Utc::now() + TimeDelta::seconds(40);
            if pay_for_sure(&store, &url, &id, deadline).await == Paid::Yes {
                paid.push((id, Utc::now() < window_ends));
            }
        }
        paid
    });
    let timeline = s.kill_and_promote(Duration::from_secs(8)).await;
    let paid = payments.await.expect("payments");
    for (id, _) in &paid {
        if let Some(placed) = ledger.orders.iter_mut().find(|o| &o.id == id) {
            placed.paid = true;
        }
    }
    let in_window = paid.into_iter().filter(|(_, w)| *w);
    let paid_in_window = in_window.map(|(id, _)| id).collect();
    (s, ledger, timeline, paid_in_window)
}

fn unpaid(ledger: &Ledger) -> impl DoubleEndedIterator<Item = &Placed> {
    ledger.orders.iter().filter(|o| o.scheduled && !o.paid)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "long: scripts/test --long"]
async fn synchronous_replication_loses_no_cancel_when_the_standby_lags_at_the_kill() {
    let name = "failover: standby lagging, synchronous";
    let (s, ledger, timeline, paid_in_window) = lag_then_kill(name, Replication::Sync).await;
    let end = s.settle(&timeline, &ledger, Duration::from_secs(60)).await;
    end.print(
        "failover: standby 3 s behind at the kill (synchronous)",
        &format!(
            "payments answered within the window {} (they wait for the standby), all payments \
             answered {}",
            paid_in_window.len(),
            end.figures.paid,
        ),
    );
    end.assert_promises(&s).await;
    s.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "long: scripts/test --long"]
async fn asynchronous_replication_loses_the_cancels_of_the_lag_and_only_the_sweeper_repairs_them() {
    let name = "failover: standby lagging, asynchronous";
    let (s, ledger, timeline, paid_in_window) = lag_then_kill(name, Replication::Async).await;
    // Every order due, and time for what the ladder still holds.
    let last_due = ledger.orders.iter().map(|o| o.due_at).max();
    let last_due = last_due.expect("orders");
    let wait = (last_due - Utc::now()).to_std().unwrap_or_default() + Duration::from_secs(10);
    tokio::time::sleep(wait).await;
    let rows = s.world.rows().await;
    let lost: Vec<&Placed> = unpaid(&ledger)
        .filter(|o| rows[&o.id].status == "unpaid")
        .collect();
    let paid_with = |pick: fn(&str) -> bool| {
        let statuses = paid_in_window.iter().map(|id| rows[id].status.as_str());
        statuses.filter(|s| pick(s)).count()
    };
    let paid_lost = paid_with(|s| s != "paid");
    let paid_then_cancelled = paid_with(|s| s == "cancelled");
    let cancelled = rows.values().filter(|r| r.status == "cancelled").count();
    let served_cancels = s.served.metric(CANCELLED).await;
    let recovery = s.recovery(&timeline, &ledger).await;

    // The repair: a serve with the sweeper on (its defaults: grace 3 s, every 1 s).
    let swept_from = Instant::now();
    let after_last_due = (Utc::now() - last_due).num_milliseconds() as f64 / 1e3;
    let sweep = [("ORDER_EXPIRY__SWEEPER__ENABLED", "true")];
    let sweeper = s.world.serve(&sweep).await;
    let repaired = repaired_within(&s.world, &lost, swept_from, Duration::from_secs(60)).await;
    let swept = sweeper.metric("order_expiry_swept_total").await;
    eprintln!(
        "FIGURES failover: standby 3 s behind at the kill (asynchronous): {}; serve's cancels \
         {served_cancels}, the database's {cancelled}: {} cancels lost ({} orders unpaid past \
         due), payments answered in the window {}, lost {paid_lost}, of them cancelled when due \
         {paid_then_cancelled}; a serve with the sweeper started {:.1} s after the last order was \
         due cancelled {swept} ({}), all {:.1} s after it was started",
        recovery.describe(),
        served_cancels - cancelled as f64,
        lost.len(),
        paid_in_window.len(),
        after_last_due,
        if repaired.is_some() {
            "every lost one"
        } else {
            "not all"
        },
        repaired.unwrap_or(swept_from.elapsed()).as_secs_f64(),
    );
    assert!(
        !lost.is_empty(),
        "no cancel was lost: the 3 s lag did not reach the standby's promotion"
    );
    assert_eq!(
        served_cancels - cancelled as f64,
        lost.len() as f64,
        "the lost orders are exactly the cancels serve made on the old primary"
    );
    assert!(
        repaired.is_some(),
        "the sweeper did not cancel every lost order"
    );
    assert_eq!(
        swept,
        lost.len() as f64,
        "the sweeper cancelled the lost ones, no more"
    );
    drop(sweeper);
    s.finish().await;
}

/// How long after `started` every order of `lost` was cancelled, within `limit`.
async fn repaired_within(
    world: &World,
    lost: &[&Placed],
    started: Instant,
    limit: Duration,
) -> Option<Duration> {
    while started.elapsed() < limit {
        let rows = world.rows().await;
        if lost.iter().all(|o| rows[&o.id].status == "cancelled") {
            return Some(started.elapsed());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    None
}
