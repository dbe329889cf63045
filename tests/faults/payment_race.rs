//! Scenario 4: a few hundred orders are paid within milliseconds of their due
//! time, from concurrent connections, while the consumer cancels them. Each
//! order ends paid or cancelled, never both; a payment that went through is never
//! overwritten by a cancel; nothing is cancelled early.

use std::time::Duration;

use chrono::Utc;
use order_expiry_testkit::connect_database;
use rand::Rng;

use crate::support::{Ledger, orders, settle, world};

const ORDERS: usize = 400;
const PAYERS: usize = 8;
/// Payments land within this many ms either side of the due time.
const JITTER_MS: i64 = 25;
/// A payment lands at most this long after its target: measured at 5 ms, a
/// bound a busy laptop holds; later, the race is no longer at the due time.
const MAX_PAYMENT_DELAY_MS: i64 = 250;
/// The share of payments that must land within [`MAX_PAYMENT_DELAY_MS`]: a
/// payer stalled once by a busy machine leaves the race real for the others;
/// a payer that falls behind for good does not.
const ON_TIME_SHARE: f64 = 0.9;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn payments_racing_the_due_time_are_never_cancelled() {
    let world = world("payment race").await;
    let served = world.serve_ready(&[]).await;
    // Due 3-5 s from now, 5 ms apart.
    let orders = orders("race", ORDERS, |i| 3000 + i * 5);
    world.place(&orders).await;

    // Each payer has its own connection and pays its share at due_at ± jitter.
    let url = secrecy::ExposeSecret::expose_secret(&world.settings.database.url).to_owned();
    let mut payers = Vec::new();
    for p in 0..PAYERS {
        let mine: Vec<_> = orders
            .iter()
            .skip(p)
            .step_by(PAYERS)
            .map(|(id, due)| {
                let jitter = rand::rng().random_range(-JITTER_MS..=JITTER_MS);
                (id.clone(), *due + chrono::TimeDelta::milliseconds(jitter))
            })
            .collect();
        let url = url.clone();
        payers.push(tokio::spawn(async move {
            let client = connect_database(&url).await.unwrap();
            let pay = client
                .prepare("UPDATE orders SET status = 'paid', paid_at = now() WHERE id = $1 AND status = 'unpaid'")
                .await
                .unwrap();
            let mut results = Vec::new();
            let mut mine = mine;
            mine.sort_by_key(|(_, at)| *at);
            for (id, pay_at) in mine {
                if let Ok(wait) = (pay_at - Utc::now()).to_std() {
                    tokio::time::sleep(wait).await;
                }
                let paid = client.execute(&pay, &[&id]).await.unwrap() == 1;
                let offset_ms = (Utc::now() - pay_at).num_milliseconds();
                results.push((id, paid, offset_ms));
            }
            results
        }));
    }
    let mut paid_ids = std::collections::HashSet::new();
    let (mut max_offset, mut on_time) = (0, 0);
    for payer in payers {
        for (id, paid, offset) in payer.await.unwrap() {
            max_offset = max_offset.max(offset);
            on_time += usize::from(offset <= MAX_PAYMENT_DELAY_MS);
            if paid {
                paid_ids.insert(id);
            }
        }
    }
    let mut ledger = Ledger::default();
    for (id, due) in &orders {
        ledger.add(id, *due, true, paid_ids.contains(id));
    }
    let figures = settle(&world, &ledger, Duration::from_secs(30)).await;
    figures.assert_invariants();
    served.assert_nothing_swept().await;
    // The race was real: the payments landed at their moment (a payer that
    // fell behind pays orders long cancelled, and races nothing), and both
    // sides won some.
    assert!(
        on_time as f64 >= ON_TIME_SHARE * ORDERS as f64,
        "only {on_time} of {ORDERS} payments landed within {MAX_PAYMENT_DELAY_MS} ms of their \
         target (the latest {max_offset} ms after it)"
    );
    assert!(
        figures.paid > 0 && figures.cancelled > 0,
        "payments and cancels should both win some: {figures:?}"
    );
    figures.print(
        "payment race",
        &format!(
            "{PAYERS} concurrent payer connections, payments at due_at ± {JITTER_MS} ms \
             ({on_time} of {ORDERS} landed within {MAX_PAYMENT_DELAY_MS} ms of their target, the latest {max_offset} ms after it): payment won {}, cancel won {}",
            figures.paid, figures.cancelled
        ),
    );
    drop(served);
    world.cleanup().await;
}
