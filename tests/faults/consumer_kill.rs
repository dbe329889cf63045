//! Scenario 2: the consumer is killed (`kill -9`) while it holds unacked
//! messages, then another one starts. Everything it held comes back from the
//! broker and is handled, once in effect: an order it had already cancelled
//! without getting to ack is only acked (`not_unpaid`) the second time. The
//! same with the orders in v2 bundles: a bundle whose orders are half settled
//! at the kill comes back whole, and its repeats change nothing.

use std::time::{Duration, Instant};

use crate::support::{Ledger, WAITING_CANCEL, World, at_ms, messages, order, settle};

/// Orders early enough to be held unacked until due when the consumer dies.
const HELD: usize = 300;
/// Orders due at once whose rows are locked when the consumer dies: its cancel
/// statements for some of them are sent (and commit later), the acks are not.
const IN_FLIGHT: usize = 50;
/// Orders still in the ladder when the consumer dies.
const LADDER: usize = 150;

/// Orders per bundle in the bundled run.
const BUNDLE: usize = 50;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn consumer_killed_holding_unacked_messages_loses_nothing_and_cancels_once() {
    killed_holding(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn consumer_killed_holding_unacked_bundles_loses_nothing_and_cancels_once() {
    killed_holding(true).await;
}

/// Publishes `orders` straight into the due queue: v1 messages, or v2
/// bundles of [`BUNDLE`]. Returns how many messages that is.
async fn publish(
    world: &World,
    orders: &[(String, chrono::DateTime<chrono::Utc>)],
    bundled: bool,
) -> u32 {
    if !bundled {
        world.publish_messages(&messages(orders)).await;
        return orders.len() as u32;
    }
    let properties = lapin::BasicProperties::default()
        .with_content_type("application/json".into())
        .with_delivery_mode(2);
    let mut sent = 0;
    for chunk in orders.chunks(BUNDLE) {
        let body = order_expiry_testkit::bundle(&messages(chunk));
        world.publish_due(&body, properties.clone()).await;
        sent += 1;
    }
    sent
}

async fn killed_holding(bundled: bool) {
    let name = match bundled {
        false => "consumer kill -9",
        true => "consumer kill -9, bundles",
    };
    let world = World::new(name).await;
    // Its cancel must block on the locked rows: the statement that waits.
    let mut first = world.serve(&WAITING_CANCEL).await;
    first.wait_ready(Duration::from_secs(30)).await;

    let held: Vec<_> = (0..HELD)
        .map(|i| order(format!("held-{i}"), at_ms(6000 + i as i64)))
        .collect();
    let in_flight: Vec<_> = (0..IN_FLIGHT)
        .map(|i| order(format!("inflight-{i}"), at_ms(-10)))
        .collect();
    let ladder: Vec<_> = (0..LADDER)
        .map(|i| order(format!("ladder-{i}"), at_ms(1500 + (i as i64 * 37) % 2500)))
        .collect();
    for group in [&held, &in_flight, &ladder] {
        world.create_orders(group).await;
    }

    // Lock the in-flight group's rows, so the consumer's cancel blocks on them.
    let ids: Vec<&str> = in_flight.iter().map(|(id, _)| id.as_str()).collect();
    let lock = world.lock_rows(&ids).await;

    let sent = publish(&world, &held, bundled).await + publish(&world, &in_flight, bundled).await;
    let scheduler = world.scheduler();
    for (id, due) in &ladder {
        scheduler.schedule(id, *due).await.expect("schedule");
    }

    // Wait until the first consumer holds every early message and its cancel of
    // the due ones is blocked on the lock.
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let held_now = first.metric("order_expiry_held_total").await as usize;
        let blocked = lock.blocked().await;
        if held_now >= HELD && blocked >= 1 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "consumer holds {held_now} of {HELD}, {blocked} blocked cancels"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let due_queue = world.ladder().due_queue();
    assert_eq!(world.depth(&due_queue).await, 0, "all delivered, unacked");

    first.signal("-KILL");
    let status = first
        .wait_exit(Duration::from_secs(5))
        .await
        .expect("killed");
    let killed_at = Instant::now();
    assert!(!status.success());
    // The broker returns everything the dead consumer held.
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut returned = 0;
    while returned < sent {
        assert!(
            Instant::now() < deadline,
            "only {returned} returned to the queue"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
        returned = world.depth(&due_queue).await;
    }
    // The dead consumer's blocked statement still commits once the lock goes:
    // those orders are cancelled, but their messages were never acked.
    lock.release().await;

    let second_started_at = chrono::Utc::now();
    let mut second = world.serve(&[]).await;
    let started = Instant::now();
    let mut ledger = Ledger::default();
    for (id, due) in held.iter().chain(&in_flight).chain(&ladder) {
        ledger.add(id, *due, true, false);
    }
    let figures = settle(&world, &ledger, Duration::from_secs(30)).await;
    let settled = started.elapsed();
    figures.assert_invariants();
    second.assert_nothing_swept().await;
    assert_eq!(figures.cancelled, HELD + IN_FLIGHT + LADDER);

    // Every message was handled by the second consumer exactly once, and the
    // cancels the first one committed were not repeated.
    let deadline = Instant::now() + Duration::from_secs(10);
    let (mut cancelled, mut not_unpaid);
    loop {
        cancelled = second
            .metric("order_expiry_messages_total{outcome=\"cancelled\"}")
            .await as usize;
        not_unpaid = second
            .metric("order_expiry_messages_total{outcome=\"not_unpaid\"}")
            .await as usize;
        if cancelled + not_unpaid >= HELD + IN_FLIGHT + LADDER || Instant::now() > deadline {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(
        cancelled + not_unpaid,
        HELD + IN_FLIGHT + LADDER,
        "each message handled once by the second consumer"
    );
    // The dead consumer's statements that were blocked at the kill committed
    // afterwards; their messages came back and were only acked.
    let committed_by_dead = world
        .rows()
        .await
        .values()
        .filter(|r| r.cancelled_at.is_some_and(|at| at < second_started_at))
        .count();
    assert!(
        committed_by_dead >= 1,
        "no cancel was in flight at the kill"
    );
    assert_eq!(
        not_unpaid, committed_by_dead,
        "exactly the orders the dead consumer cancelled come back as not_unpaid"
    );
    assert!(second.running());
    assert_eq!(world.depth(&due_queue).await, 0);
    assert_eq!(world.depth(&world.ladder().parked_queue()).await, 0);
    figures.print(
        name,
        &format!(
            "held unacked at the kill {HELD} + cancel in flight {IN_FLIGHT} (+ {LADDER} in the ladder), \
             in {sent} messages, returned to the queue {returned}; the dead consumer's blocked cancel committed after the kill \
             for {committed_by_dead}; second consumer: cancelled {cancelled}, acked as already cancelled {not_unpaid}; \
             all settled {:.1} s after the second consumer started ({:.1} s after the kill)",
            settled.as_secs_f64(),
            killed_at.elapsed().as_secs_f64(),
        ),
    );
    scheduler.close().await;
    drop(second);
    world.cleanup().await;
}
