//! Scenarios 5-7: one order, one silent connection or one deleted queue never
//! stalls the rest.
//!
//! - a payment holds one order's row lock for 30 s among 500 due orders;
//! - the database's address goes silent for 60 s (a black-holing proxy: bytes
//!   accepted, nothing answered), which a clean `pg_ctl stop` never shows;
//! - an operator deletes the due queue while orders are in the ladder.

use std::time::{Duration, Instant};

use chrono::Utc;
use order_expiry_testkit::Proxy;
use secrecy::ExposeSecret;
use tokio::task::block_in_place;

use crate::support::{
    Ledger, ReadyWatch, assert_not_ready, dead_letter_retry, orders, poll, schedule_all, settle,
    world,
};

/// Lateness bound for the orders that share nothing with the fault.
const MAX_LATENESS: Duration = Duration::from_secs(1);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_order_locked_for_thirty_seconds_holds_up_no_other() {
    const ORDERS: usize = 500;
    const LOCK: Duration = Duration::from_secs(30);
    // The locked order is retried alone at most every consumer.retry_max_ms
    // (1 s here) while its row is locked.
    const AFTER_RELEASE: Duration = Duration::from_millis(2500);
    let world = world("row lock").await;
    let served = world
        .serve_ready(&[("ORDER_EXPIRY__CONSUMER__RETRY_MAX_MS", "1000")])
        .await;
    // Due 3.0-3.5 s from now: they come due together and share batches.
    let orders = orders("lock", ORDERS, |i| 3000 + i);
    world.create_orders(&orders).await;
    let locked = "lock-250";
    let lock = world.lock_rows(&[locked]).await;
    let locked_at = Instant::now();
    schedule_all(world.scheduler(), &orders).await;
    let others = Ledger::scheduled(orders.iter().filter(|(id, _)| id != locked));
    let figures = settle(&world, &others, Duration::from_secs(20)).await;
    // Within the bound: the other orders did not wait for the lock.
    figures.assert_within(MAX_LATENESS);
    served.assert_nothing_swept().await;

    // The locked one stays unpaid while the payment holds it...
    tokio::time::sleep(LOCK.saturating_sub(locked_at.elapsed())).await;
    assert_eq!(
        world.order(locked).await.0,
        "unpaid",
        "cancelled through a lock"
    );
    let released_at = Utc::now();
    lock.release().await;
    // ... and is cancelled soon after it is released (the payment rolled back).
    let cancelled_at = poll(AFTER_RELEASE, 50, async || {
        let (status, _, cancelled_at) = world.order(locked).await;
        let what = format!("not cancelled {AFTER_RELEASE:?} after the release");
        cancelled_at.filter(|_| status == "cancelled").ok_or(what)
    })
    .await;
    assert!(cancelled_at >= released_at, "cancelled before the release");
    let retries = served.metric("order_expiry_retries_total").await;
    figures.print(
        "row lock",
        &format!(
            "one order locked for {} s among {ORDERS}: the other {} cancelled, max lateness {} ms; \
             the locked one cancelled {} ms after the release; retries {retries}",
            LOCK.as_secs(),
            figures.cancelled,
            figures.max_lateness.as_millis(),
            (cancelled_at - released_at).num_milliseconds(),
        ),
    );
    drop(served);
    world.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_database_for_a_minute_loses_nothing_and_does_not_spin() {
    const ORDERS: usize = 600;
    const SILENCE: Duration = Duration::from_secs(60);
    /// `/readyz` waits http.ready_timeout_ms (2 s) for SELECT 1; sampled every 100 ms.
    const NOT_READY_WITHIN: Duration = Duration::from_millis(3500);
    /// After the route returns: a statement in flight on a silent connection is
    /// closed by the proxy (or ends at query_timeout_ms, 6 s), then the
    /// batch's backoff (at most consumer.retry_max_ms, 1 s here).
    const SETTLED_WITHIN: Duration = Duration::from_secs(10);
    /// A busy loop would use the whole minute.
    const MAX_CPU_SECONDS: f64 = 3.0;
    let world = world("database blackhole").await;
    let proxy = Proxy::start(([127, 0, 0, 1], 5432).into()).await;
    let url = world
        .settings
        .database
        .url
        .expose_secret()
        .replace("127.0.0.1:5432", &proxy.addr().to_string());
    let env = [
        ("ORDER_EXPIRY__DATABASE__URL", url.as_str()),
        ("ORDER_EXPIRY__CONSUMER__RETRY_MAX_MS", "1000"),
    ];
    let mut served = world.serve_ready(&env).await;
    let watch = ReadyWatch::start(&served);

    // Due every 100 ms from 2 s to 62 s: most come due while the database is silent.
    let orders = orders("bh", ORDERS, |i| 2000 + i * 100);
    let ledger = Ledger::place(&world, &world.scheduler(), &orders, 4).await;
    tokio::time::sleep(Duration::from_millis(2500)).await;

    proxy.blackhole();
    let silent_at = Instant::now();
    let not_ready_at = watch
        .wait_for(503, silent_at, Duration::from_secs(10))
        .await;
    let cpu_before = served.cpu_seconds();
    let measured_from = Instant::now();
    tokio::time::sleep(SILENCE.saturating_sub(silent_at.elapsed())).await;
    let cpu = served.cpu_seconds() - cpu_before;
    let measured = measured_from.elapsed();
    assert!(served.running(), "the consumer exited during the silence");
    let before_restore = Instant::now();
    proxy.restore();
    let back_at = Instant::now();
    let ready_at = watch.wait_for(200, back_at, Duration::from_secs(30)).await;
    assert_not_ready(&watch, not_ready_at, before_restore, "the silent database");
    let figures = settle(&world, &ledger, Duration::from_secs(30)).await;
    let settled = back_at.elapsed();
    figures.assert_invariants();
    served.assert_nothing_swept().await;
    let not_ready = not_ready_at - silent_at;
    let retries = served.metric("order_expiry_retries_total").await;
    figures.print(
        "database blackhole",
        &format!(
            "database silent {:.1} s (proxy accepts, answers nothing): /readyz 503 {:.1} s after; \
             consumer CPU {cpu:.2} s over {:.1} s of it; retries {retries}; ready again {:.1} s and \
             everything settled {:.1} s after the route returned",
            (back_at - silent_at).as_secs_f64(),
            not_ready.as_secs_f64(),
            measured.as_secs_f64(),
            (ready_at - back_at).as_secs_f64(),
            settled.as_secs_f64(),
        ),
    );
    assert!(
        not_ready <= NOT_READY_WITHIN,
        "/readyz 503 only after {not_ready:?}"
    );
    assert!(
        cpu < MAX_CPU_SECONDS,
        "{cpu:.2} s CPU over {measured:?}: a hot loop"
    );
    assert!(
        settled <= SETTLED_WITHIN,
        "settled {settled:?} after the route returned"
    );
    drop(watch);
    drop(served);
    world.cleanup().await;
}

/// Scenario 7: an operator deletes the live due queue. The consumer declares
/// it again (a repair, or on RabbitMQ 4.0 and 4.3 a new session). What the ladder
/// dead-letters meanwhile is unroutable, and at-least-once dead-lettering
/// retries it after `dead_letter_worker_publisher_confirm_timeout`
/// ([`dead_letter_retry`]). But the messages the broker routed into the queue
/// it was deleting die with it: on 4.0.5, with the sweeper off, the 18 unpaid
/// orders due in the 0.7 s after the deletion were never cancelled (the queue
/// record outlives the end of our consumer there; 4.3.6 the same: 27 swept). That is what the sweeper
/// is for, so it runs here (every 1 s, 3 s grace), and the test attributes
/// every order it sweeps to the deletion: due within [`SWEPT_WITHIN`] of it.
/// Everything else is cancelled by its message, one outcome per message.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_due_queue_is_declared_again_and_nothing_is_lost() {
    const ORDERS: usize = 300;
    /// Past the broker's retry: the repair and the ladder's own hops.
    const AFTER_RETRY: Duration = Duration::from_secs(5);
    /// The orders a deletion can take down: due from just before it (held
    /// early, at most 1 s) to a few seconds after (the repair's gap).
    const SWEPT_WITHIN: Duration = Duration::from_secs(5);
    /// The sweeper: every second, 3 s of grace.
    const SWEEP_EVERY: Duration = Duration::from_secs(1);
    const GRACE: Duration = Duration::from_secs(3);
    let retry = block_in_place(dead_letter_retry);
    let bound = retry + AFTER_RETRY;
    let world = world("due queue deleted").await;
    let (every, grace) = (SWEEP_EVERY.as_millis(), GRACE.as_millis());
    let (every, grace) = (every.to_string(), grace.to_string());
    let sweeper = [
        ("ORDER_EXPIRY__SWEEPER__ENABLED", "true"),
        ("ORDER_EXPIRY__SWEEPER__INTERVAL_MS", every.as_str()),
        ("ORDER_EXPIRY__SWEEPER__GRACE_MS", grace.as_str()),
    ];
    let served = world.serve_ready(&sweeper).await;
    // Due every 30 ms from 2 s to 11 s, through the ladder.
    let orders = orders("dq", ORDERS, |i| 2000 + i * 30);
    let ledger = Ledger::place(&world, &world.scheduler(), &orders, 4).await;
    tokio::time::sleep(Duration::from_millis(4000)).await;
    world.delete_queue(&world.ladder().due_queue()).await;
    let deleted_at = Instant::now();
    let deleted_wall = Utc::now();
    let figures = settle(&world, &ledger, bound + Duration::from_secs(15)).await;
    let settled = deleted_at.elapsed();
    // Settled counts paid orders at payment, so their messages may still be on
    // their way (`list_queues` figures for quorum queues also lag by up to the
    // broker's stats interval, 5 s). What matters: one outcome per message,
    // none missing (a message the broker dropped) and no duplicate from the
    // deleted queue; then a quiet second in which no more come.
    let all_by = Instant::now() + bound;
    let mut handled = served.metric("order_expiry_messages_total").await;
    while handled < ORDERS as f64 && Instant::now() < all_by {
        tokio::time::sleep(Duration::from_millis(250)).await;
        handled = served.metric("order_expiry_messages_total").await;
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    let handled = served.metric("order_expiry_messages_total").await;
    let repairs = served
        .metric("order_expiry_repairs_total{what=\"due\"}")
        .await;
    let swept = served.metric("order_expiry_swept_total").await;
    let reconnects = served.metric("order_expiry_reconnects_total").await;
    // Swept: cancelled more than the grace after their due time (the ladder's
    // cancels are milliseconds late). Each must be one the deletion took.
    let rows = world.rows().await;
    let grace = chrono::TimeDelta::from_std(GRACE).expect("grace");
    let window = deleted_wall - chrono::TimeDelta::seconds(1)
        ..=deleted_wall + chrono::TimeDelta::from_std(SWEPT_WITHIN).expect("window");
    let swept_orders: Vec<_> = rows
        .iter()
        .filter(|(_, r)| r.cancelled_at.is_some_and(|c| c - r.pay_deadline >= grace))
        .collect();
    let unexplained: Vec<_> = swept_orders
        .iter()
        .filter(|(_, r)| !window.contains(&r.pay_deadline))
        .map(|(id, r)| format!("{id} due {}", r.pay_deadline))
        .collect();
    let due_in_window = ledger
        .orders
        .iter()
        .filter(|o| window.contains(&o.due_at))
        .count();
    figures.print(
        "due queue deleted (sweeper 1 s / 3 s grace)",
        &format!(
            "the broker's dead-letter retry {} s; repairs {repairs}, reconnects {reconnects}, \
             swept {swept} (all due within {} s of the deletion), settled {:.1} s after the deletion; \
             messages handled {handled} of {ORDERS}; queues now: {}",
            retry.as_secs(),
            SWEPT_WITHIN.as_secs(),
            settled.as_secs_f64(),
            world.queue_report()
        ),
    );
    // Sweeper bound for the ones the deletion took, the ladder's for the rest.
    figures.assert_within(GRACE + SWEEP_EVERY + Duration::from_secs(2));
    assert!(
        unexplained.is_empty(),
        "swept orders the deletion does not explain: {unexplained:?}"
    );
    assert_eq!(swept, swept_orders.len() as f64, "swept orders counted");
    // RabbitMQ 3.10 deletes the queue, then ends our consumer: the session
    // re-declares on its channel (a repair). RabbitMQ 4.0 and 4.3 may end the consumer
    // while the queue record still exists: the repair's declare finds the dying
    // queue, its bind then fails NOT_FOUND and closes the channel, and the next
    // session re-declares instead (a reconnect). Either way it was re-declared.
    assert!(
        repairs + reconnects >= 1.0,
        "the consumer never re-declared the due queue"
    );
    // One outcome per message: no duplicate from the deleted queue, and only
    // messages due around the deletion missing (died with it).
    assert!(
        handled <= ORDERS as f64 && handled + due_in_window as f64 >= ORDERS as f64,
        "{handled} outcomes for {ORDERS} messages ({due_in_window} due around the deletion)"
    );
    drop(served);
    world.cleanup().await;
}
