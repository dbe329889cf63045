//! Scenario 6: SIGTERM while the consumer is busy. It exits 0 within its drain
//! timeout; every delivery was either acked after its cancel committed or is back
//! in the queue for the next consumer, which finishes the job.

use std::collections::HashSet;
use std::time::{Duration, Instant};

use crate::support::{
    CANCELLED, Ledger, WAITING_CANCEL, ids, messages, next_consumer_finishes, orders, poll, world,
};
use chrono::Utc;

/// Due at once, published in bursts while the consumer works through them.
const DUE: usize = 4000;
/// Early: held unacked when SIGTERM comes, so they must be released.
const HELD: usize = 200;
/// How early the held ones are: SIGTERM must come before they are due.
const HELD_FOR_MS: i64 = 12_000;
const DRAIN_TIMEOUT_MS: u64 = 10_000;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_under_load_exits_zero_and_hands_back_what_it_did_not_finish() {
    let world = world("graceful shutdown").await;
    let drain = DRAIN_TIMEOUT_MS.to_string();
    let env = [("ORDER_EXPIRY__CONSUMER__DRAIN_TIMEOUT_MS", drain.as_str())];
    let mut first = world.serve_ready(&env).await;
    let due = orders("due", DUE, |i| -1000 - i);
    let held = orders("held", HELD, |i| HELD_FOR_MS + i);
    world.create_orders(&[&due[..], &held].concat()).await;
    world.publish_messages(&messages(&held)).await;
    // Publish the due ones in bursts in the background; SIGTERM lands mid-stream.
    // One by one, each confirmed: 4,000 take seconds on a loaded 4.3 node, and
    // go on after the signal (into the queue, for the next consumer).
    let due_messages = messages(&due);
    let publisher = async {
        for chunk in due_messages.chunks(500) {
            world.publish_messages(chunk).await;
        }
        Instant::now()
    };
    // The signal after the first 500 cancels, and the exit, timed while the
    // publisher goes on: neither may be judged by when the publisher ends
    // (4,000 confirms may take longer than the held messages' 12 s).
    let shutdown = async {
        let started = Instant::now();
        poll(Duration::from_secs(20), 10, async || {
            let done = first.metric(CANCELLED).await;
            (done >= 500.0)
                .then_some(())
                .ok_or("consumer never got going")
        })
        .await;
        first.signal("-TERM");
        let (sent_at, sent_wall, waited) = (Instant::now(), Utc::now(), started.elapsed());
        let status = first
            .wait_exit(Duration::from_millis(DRAIN_TIMEOUT_MS) + Duration::from_secs(5))
            .await
            .expect("exits after SIGTERM");
        (sent_at, sent_wall, waited, status, sent_at.elapsed())
    };
    let (published_at, (sent_at, sent_wall, waited, status, took)) =
        tokio::join!(publisher, shutdown);
    // The held messages must have been early at the signal: they are then
    // released, not cancelled.
    let lead = held[0].1 - sent_wall;
    assert!(
        lead > chrono::TimeDelta::zero(),
        "SIGTERM came {} ms after the held messages were due (500 cancels took {waited:?}): \
         the machine is too slow for this test",
        -lead.num_milliseconds()
    );
    let published_after = published_at.saturating_duration_since(sent_at);
    assert!(status.success(), "exit status {status}");
    assert!(
        took <= Duration::from_millis(DRAIN_TIMEOUT_MS) + Duration::from_secs(1),
        "took {took:?}, drain timeout {DRAIN_TIMEOUT_MS} ms"
    );
    assert_eq!(first.log_count("drained"), 1, "{}", first.log_tail(20));

    // Every order is cancelled (acked after its cancel) or its message is back.
    let rows = world.rows().await;
    let cancelled_by_first = rows.values().filter(|r| r.status == "cancelled").count();
    let requeued: HashSet<String> = world.due_ids().await.into_iter().collect();
    let unaccounted: Vec<&str> = ids(&held)
        .into_iter()
        .chain(ids(&due))
        .filter(|id| rows[*id].status != "cancelled" && !requeued.contains(*id))
        .collect();
    assert!(
        unaccounted.is_empty(),
        "{} orders neither cancelled nor back in the queue: {:?}",
        unaccounted.len(),
        &unaccounted[..unaccounted.len().min(10)]
    );
    assert!(
        held.iter().all(|(id, _)| requeued.contains(id)),
        "the held, early messages were released to the queue"
    );

    // The next consumer finishes the job.
    let ledger = Ledger::scheduled(held.iter().chain(&due));
    let (second, figures) = next_consumer_finishes(&world, &env, &ledger).await;
    figures.print(
        "graceful shutdown",
        &format!(
            "SIGTERM after {cancelled_by_first} cancels: exit 0 after {:.2} s (drain timeout {:.0} s); \
             back in the queue {} (incl. {HELD} held early), lost 0; the next consumer cancelled the rest; \
             SIGTERM {:.1} s before the held were due, the publisher's last confirm {:.1} s after it",
            took.as_secs_f64(),
            DRAIN_TIMEOUT_MS as f64 / 1000.0,
            requeued.len(),
            lead.num_milliseconds() as f64 / 1000.0,
            published_after.as_secs_f64(),
        ),
    );
    drop(second);
    world.cleanup().await;
}

/// Drain timeout of the stuck-shutdown test: shorter than the statement timeout
/// (5 s), so it is the drain timeout that ends the wait.
const SHORT_DRAIN_MS: u64 = 2_000;
const STUCK: usize = 100;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_with_cancels_stuck_in_the_database_exits_at_the_drain_timeout() {
    let world = world("shutdown with stuck cancels").await;
    let drain = SHORT_DRAIN_MS.to_string();
    let env = [("ORDER_EXPIRY__CONSUMER__DRAIN_TIMEOUT_MS", drain.as_str())];
    // Its cancels must block on the locked rows: the statement that waits.
    let stuck_env = [&env[..], &WAITING_CANCEL[..]].concat();
    let mut first = world.serve_ready(&stuck_env).await;
    let stuck = orders("stuck", STUCK, |_| -10);
    world.create_orders(&stuck).await;
    let lock = world.lock_rows(&ids(&stuck)).await;
    world.publish_messages(&messages(&stuck)).await;
    poll(Duration::from_secs(15), 20, async || {
        (lock.blocked().await >= 1)
            .then_some(())
            .ok_or("no cancel ever blocked")
    })
    .await;

    first.signal("-TERM");
    let sent_at = Instant::now();
    let status = first
        .wait_exit(Duration::from_secs(15))
        .await
        .expect("exits after SIGTERM");
    let took = sent_at.elapsed();
    assert!(status.success(), "exit status {status}");
    assert!(
        took >= Duration::from_millis(SHORT_DRAIN_MS)
            && took <= Duration::from_millis(SHORT_DRAIN_MS) + Duration::from_millis(1500),
        "took {took:?} with a {SHORT_DRAIN_MS} ms drain timeout"
    );
    assert_eq!(
        first.log_count("drain timeout"),
        1,
        "{}",
        first.log_tail(20)
    );
    // Nothing was acked: every message is back in the queue.
    let requeued: HashSet<String> = world.due_ids().await.into_iter().collect();
    assert_eq!(requeued.len(), STUCK, "all returned to the queue");

    // The dead process's statements still commit once the lock goes; the next
    // consumer finds those orders already cancelled and only acks them.
    lock.release().await;
    let (second, figures) = next_consumer_finishes(&world, &env, &Ledger::scheduled(&stuck)).await;
    figures.print(
        "shutdown with stuck cancels",
        &format!(
            "SIGTERM while the cancel statements wait on row locks: exit 0 after {:.2} s \
             (drain timeout {:.1} s), all {} messages back in the queue; the next consumer finished them",
            took.as_secs_f64(),
            SHORT_DRAIN_MS as f64 / 1000.0,
            requeued.len(),
        ),
    );
    drop(second);
    world.cleanup().await;
}
