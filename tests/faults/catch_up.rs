//! PostgreSQL goes away for 10 s while orders fall due at 100 a second. What
//! fell due more than `topology.catch_up_after_ms` (5 s) before the database
//! was back waits in the catch-up queue; the orders that fall due after it is
//! back are cancelled on time, and the backlog drains beside them at
//! `consumer.catch_up_rate`, never faster.

use std::time::{Duration, Instant};

use chrono::{DateTime, TimeDelta, Utc};

use crate::support::{Fault, Outage, at_ms, order, world};
use order_expiry_testkit::busiest_second;

/// The backlog's rate in this scenario.
const RATE: usize = 100;
const OUTAGE: Duration = Duration::from_secs(10);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn database_down_orders_due_after_it_come_first_and_the_backlog_at_its_rate() {
    let world = world("database outage, catch-up").await;
    let rate = RATE.to_string();
    let served = world
        .serve(&[("ORDER_EXPIRY__CONSUMER__CATCH_UP_RATE", rate.as_str())])
        .await;
    served.wait_ready(Duration::from_secs(30)).await;
    // 100 a second, from 1 s to 22 s from now: the outage (1-11 s) holds a
    // thousand of them, the rest fall due after it.
    let orders: Vec<_> = (0..2_100)
        .map(|i| order(format!("cu-{i}"), at_ms(1_000 + i as i64 * 10)))
        .collect();
    world.create_orders(&orders).await;
    let scheduler = world.scheduler();
    for result in scheduler.schedule_many(orders.clone()).await {
        result.expect("scheduled");
    }
    let wait = (orders[0].1 - Utc::now()).to_std().unwrap_or_default();
    tokio::time::sleep(wait).await;
    let down = Utc::now();
    let outage = tokio::task::spawn_blocking(|| Outage::begin(Fault::DatabaseStop))
        .await
        .expect("stop database");
    tokio::time::sleep(OUTAGE).await;
    tokio::task::spawn_blocking(move || outage.restore())
        .await
        .expect("restore database");

    // Everything is cancelled; the catch-up counter sampled meanwhile.
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut samples: Vec<(Instant, f64)> = Vec::new();
    let rows = loop {
        samples.push((
            Instant::now(),
            served.metric("order_expiry_catch_up_total").await,
        ));
        let rows = world.rows().await;
        let unpaid = orders
            .iter()
            .filter(|(id, _)| rows.get(id).is_none_or(|r| r.status != "cancelled"))
            .count();
        if unpaid == 0 {
            break rows;
        }
        assert!(Instant::now() < deadline, "{unpaid} orders never cancelled");
        tokio::time::sleep(Duration::from_millis(250)).await;
    };
    let caught_up = served.metric("order_expiry_catch_up_total").await as usize;
    // When the database answered again: its first cancel after the stop.
    // Not when restore() returned: it waits for the server's start script,
    // up to 2 s after the server took connections (seen on 4.3.6, where the
    // orders due in the outage's last 4-6 s, less than catch_up_after late
    // and rightly not in the catch-up lane, then counted as its backlog).
    let back = rows
        .values()
        .filter_map(|r| r.cancelled_at)
        .filter(|at| *at > down + TimeDelta::seconds(1))
        .min()
        .expect("cancels after the outage");
    let mut after: Vec<i64> = Vec::new();
    let mut backlog: Vec<DateTime<Utc>> = Vec::new();
    for (id, due) in &orders {
        let cancelled = rows[id].cancelled_at.expect("cancelled");
        assert!(cancelled >= *due, "{id} cancelled early");
        // Due a second after the database was back: on time.
        if *due > back + TimeDelta::seconds(1) {
            after.push((cancelled - *due).num_milliseconds());
        } else if *due > down && *due < back - TimeDelta::seconds(6) {
            backlog.push(cancelled);
        }
    }
    after.sort();
    backlog.sort();
    let drained = (backlog[backlog.len() - 1] - backlog[0]).num_milliseconds() as f64 / 1e3;
    let busiest = busiest_second(&mut backlog);
    // The drain: from the first order out of the catch-up lane to the last.
    let first = samples.iter().find(|(_, n)| *n > 0.0).map(|(at, _)| *at);
    let last = samples
        .iter()
        .find(|(_, n)| *n as usize >= caught_up)
        .map(|(at, _)| *at);
    let lane_secs = match (first, last) {
        (Some(a), Some(b)) => (b - a).as_secs_f64(),
        _ => 0.0,
    };

    eprintln!(
        "FIGURES database outage, catch-up: down {:.1} s; {caught_up} orders out of the \
         catch-up lane in {lane_secs:.1} s at {RATE}/s; the {} due in the outage's first 4 s \
         cancelled over {drained:.1} s (busiest second {busiest}); {} due after the database \
         was back: lateness p50 {} ms, max {} ms",
        OUTAGE.as_secs_f64(),
        backlog.len(),
        after.len(),
        after[after.len() / 2],
        after[after.len() - 1],
    );
    assert!(
        caught_up >= 300,
        "only {caught_up} orders went through the catch-up queue"
    );
    assert!(
        after[after.len() - 1] < 1_000,
        "the backlog held up orders due after the outage: max {} ms",
        after[after.len() - 1]
    );
    // The lane's bucket lets at most the rate and a tenth start in any one
    // second; the cancels' own stamps (a batch may wait for one of the two
    // statement slots) can bunch a few more into one.
    assert!(
        busiest <= RATE + RATE / 5,
        "{busiest} backlog cancels in one second"
    );
    scheduler.close().await;
    drop(served);
    world.cleanup().await;
}
