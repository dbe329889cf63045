//! Message v2, a bundle of orders: each order in it is settled on its own
//! (one locked or bad order never holds the others' cancels), v1 and v2 share
//! the due queue, the bundle is acked once every order in it is settled, and
//! the publisher's group commit carries a flash sale in bundles, on time.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use chrono::{TimeDelta, Utc};
use order_expiry::service::Outcome;
use order_expiry_testkit::{
    World, assert_on_time, at_ms, bundle, count, json, message, orders, schedule_all,
};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_order_of_a_bundle_is_settled_on_its_own_beside_v1_messages() {
    let env = World::new().await;
    let mut settings = env.settings.clone();
    // An order not found is looked for once more, 500 ms later, then unknown.
    settings.consumer.unknown_rechecks = vec![Duration::from_millis(500)];
    let (due, held_due) = (at_ms(-10), at_ms(1_500));
    let rows = [
        ("b-unpaid-0", due),
        ("b-unpaid-1", due),
        ("b-paid", due),
        ("b-extended", due + TimeDelta::hours(1)),
        ("b-locked", due),
        ("b-held", held_due),
        ("v1-unpaid", due),
    ]
    .map(|(id, at)| (id.to_owned(), at));
    env.create_orders(&rows).await;
    env.execute("UPDATE orders SET status = 'paid' WHERE id = 'b-paid'")
        .await;
    // Hold b-locked's row: its cancel skips it and retries it alone.
    let lock = env.lock_rows(&["b-locked"]).await;

    // The extended order's message carries its old deadline; b-unknown has
    // no row.
    let ids = "b-unpaid-0 b-paid b-extended b-unknown b-locked b-held b-unpaid-1".split(' ');
    let messages: Vec<_> = ids
        .map(|id| message(id, if id == "b-held" { held_due } else { due }))
        .collect();
    let mut body: serde_json::Value = serde_json::from_slice(&bundle(&messages)).unwrap();
    let orders = body["orders"].as_array_mut().unwrap();
    // An entry that breaks the v1 rules, at index 4: parked alone.
    orders.insert(
        4,
        serde_json::json!({"order_id": "", "due_at": "2026-01-01T00:00:00Z"}),
    );
    let body = body.to_string().into_bytes();

    let mut consumer = env.start_consumer_with(&settings);
    env.publish_due(&body, json()).await;
    env.publish_message(&message("v1-unpaid", due)).await;

    // The bundle's other orders and the v1 message are cancelled while the
    // locked one waits: one locked order holds no one else's cancel.
    let on_time = ["b-unpaid-0", "b-unpaid-1", "v1-unpaid", "b-held"];
    env.wait_cancelled(&on_time, Duration::from_secs(15)).await;
    let (status, _, _) = env.order("b-locked").await;
    assert_eq!(status, "unpaid", "the locked row was not touched");
    // Nor its ack: once its last order (b-held) is due, the bundle is acked
    // after one pass. The locked order and the unknown one's second look
    // left it as a message of their own, the bad entry as its one parked
    // copy; the observer hears of its orders at its ack.
    let bundle_acked = |h: &[_]| {
        let retried = count(h, Outcome::RetryRequeued);
        retried >= 1 && h.len() - retried >= 9
    };
    let mut handled = consumer
        .next_until(Duration::from_secs(10), bundle_acked)
        .await;
    assert_eq!(count(&handled, Outcome::Cancelled), 4, "{handled:?}");
    assert_eq!(count(&handled, Outcome::UnknownRequeued), 1, "{handled:?}");
    assert_eq!(
        env.order("b-locked").await.0,
        "unpaid",
        "acked before the lock went"
    );
    // How long after its last order was due the bundle was acked (its
    // reports come with the ack), while one of its orders was still locked.
    let acked_at = handled
        .iter()
        .find(|h| h.outcome == Outcome::Extended)
        .expect("the bundle's report")
        .at;
    let after = (acked_at - held_due).num_milliseconds();
    eprintln!("FIGURES bundle with a locked order acked {after} ms after its last order was due");
    assert!(after < 5_000, "the locked order held its bundle {after} ms");
    lock.release().await;
    env.wait_cancelled(&["b-locked"], Duration::from_secs(15))
        .await;
    // Then the locked order's cancel, and the unknown one's last look (if
    // it did not come yet).
    let unknown_seen = count(&handled, Outcome::Unknown);
    handled.extend(
        consumer
            .next_until(Duration::from_secs(15), |h| {
                count(h, Outcome::Cancelled) == 1 && count(h, Outcome::Unknown) + unknown_seen == 1
            })
            .await,
    );
    let mut outcomes: HashMap<Outcome, usize> = HashMap::new();
    for h in &handled {
        *outcomes.entry(h.outcome).or_default() += 1;
    }
    // b-locked went through the ladder at least once while it was locked.
    let retried = outcomes.remove(&Outcome::RetryRequeued).unwrap_or(0);
    assert!(retried >= 1, "{handled:?}");
    let expected = [
        (Outcome::Cancelled, 5),
        (Outcome::NotUnpaid, 1),
        (Outcome::Extended, 1),
        (Outcome::UnknownRequeued, 1),
        (Outcome::Unknown, 1),
        (Outcome::Parked, 1),
    ];
    assert_eq!(outcomes, HashMap::from(expected), "{handled:?}");

    let rows = env.orders().await.expect("orders");
    for (id, status) in [("b-paid", "paid"), ("b-extended", "unpaid")] {
        assert_eq!(rows[id].status, status, "{id}");
    }
    for (id, _) in rows.iter().filter(|(_, r)| r.status == "cancelled") {
        let (_, due_at, cancelled_at) = env.order(id).await;
        assert!(cancelled_at.unwrap() >= due_at, "{id} cancelled early");
    }

    let parked = env.parked().await;
    assert_eq!(parked.len(), 1, "{parked:?}");
    assert_eq!(
        parked[0].body,
        br#"{"orders":[{"due_at":"2026-01-01T00:00:00Z","order_id":""}],"v":2}"#
    );
    let reason = &parked[0].reason;
    assert!(reason.starts_with("order 4 of the bundle"), "{reason}");
    assert!(reason.contains("invalid order_id"), "{reason}");

    consumer.stop().await;
    // Acked: nothing comes back to the due queue once the consumer is gone.
    assert_eq!(env.depth(&env.ladder().due_queue()).await, 0);
    assert_eq!(env.depth(&env.ladder().parked_queue()).await, 0);
    env.cleanup().await;
}

/// A flash sale: `ORDERS` orders due within 4 s, scheduled at once through
/// one `Scheduler` with the default settings. The window of 50 fills, the
/// waiting calls leave in bundles, and every order is cancelled no earlier
/// than due and within a bound a busy 2-core laptop holds (the tight goal is
/// `order-expiry-bench flash`'s).
const ORDERS: usize = 20_000;
const LATE_BOUND: Duration = Duration::from_secs(10);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flash_sale_leaves_in_bundles_and_is_cancelled_on_time() {
    let env = World::new().await;
    let orders = orders("fs", ORDERS, |i| {
        at_ms(10_000 + (i * 4_000 / ORDERS) as i64)
    });
    env.create_orders(&orders).await;
    let consumer = env.start_consumer();
    let began = Instant::now();
    let messages = schedule_all(env.scheduler(), &orders).await;
    let took = began.elapsed();
    eprintln!(
        "scheduled {ORDERS} in {took:?} ({:.0}/s) in {messages} messages",
        ORDERS as f64 / took.as_secs_f64(),
    );
    assert!(
        messages <= ORDERS / 20,
        "{messages} messages for {ORDERS} orders: group commit did not bundle"
    );
    let rows = env.wait_cancelled(&orders, Duration::from_secs(44)).await;
    let lateness = assert_on_time(&orders, &rows, LATE_BOUND);
    eprintln!("FIGURES flash sale {ORDERS}: lateness {lateness}");
    consumer.stop().await;
    env.cleanup().await;
}

/// A bundle leaves only in a burst, and a burst's messages expire from each
/// level together and queue behind each other: a bundle is routed to reach
/// the due queue `publisher.bundle_lead_ms` (1.5 s) before its orders are due,
/// where a lone v1 message gets `publisher.lead_ms` (300 ms). The bundle lead
/// brings every bundle at least 1.5 s early, less the ladder's transit,
/// however long scheduling takes. The orders are due so that, scheduled
/// within 0.4 s (as here: 90-105 ms), the short lead would bring every bundle
/// at most about 0.9 s early (a sub-second remainder of 0.2-0.6 s); on a
/// machine slow enough to take longer the test only tells the two apart less
/// surely, so that is said, not failed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bundle_reaches_the_due_queue_its_bundle_lead_early() {
    const BURST: usize = 1_000;
    let env = World::new().await;
    let due_at = at_ms(6_900);
    let orders = orders("bl", BURST, |_| due_at);
    let began = Instant::now();
    schedule_all(env.scheduler(), &orders).await;
    let took = began.elapsed();
    if took >= Duration::from_millis(400) {
        eprintln!(
            "scheduling {BURST} orders took {took:?}: the short lead may bring a bundle early enough too"
        );
    }
    let due_queue = env.ladder().due_queue();
    let mut bundles_early_ms = Vec::new();
    let mut seen = 0;
    let deadline = Instant::now() + Duration::from_secs(20);
    while seen < BURST {
        assert!(
            Instant::now() < deadline,
            "only {seen} of {BURST} orders arrived"
        );
        let Some(got) = env.get(&due_queue).await else {
            tokio::time::sleep(Duration::from_millis(5)).await;
            continue;
        };
        let early = due_at - Utc::now();
        let body: serde_json::Value = serde_json::from_slice(&got.delivery.data).unwrap();
        match body["orders"].as_array() {
            Some(orders) => {
                seen += orders.len();
                bundles_early_ms.push(early.num_milliseconds());
            }
            None => seen += 1,
        }
    }
    bundles_early_ms.sort_unstable();
    eprintln!(
        "FIGURES bundle lead: {BURST} orders scheduled in {took:?}, {} bundles, arrived {:?} ms early (least first)",
        bundles_early_ms.len(),
        bundles_early_ms
    );
    assert!(
        bundles_early_ms.len() >= 5,
        "{} bundles: group commit did not bundle",
        bundles_early_ms.len()
    );
    assert!(
        bundles_early_ms[0] >= 1_100,
        "a bundle arrived only {} ms before its orders were due: routed with the short lead",
        bundles_early_ms[0]
    );
    env.cleanup().await;
}
