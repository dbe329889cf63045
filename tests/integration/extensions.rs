//! The deadline rule: an order whose `pay_deadline` was extended is not
//! cancelled by the message of its old deadline (outcome `extended`, the order
//! stays unpaid); the message scheduled with the new deadline, through the
//! library or the CLI, cancels it on time and never early. The sweeper, which
//! reads the current `pay_deadline`, agrees.

use std::time::Duration;

use chrono::{DateTime, SubsecRound, TimeDelta, Utc};
use order_expiry::{service::OrderStore, service::Outcome};
use order_expiry_testkit::steps::assert_late_within;
use order_expiry_testkit::{World, at_ms};

/// Sets a new deadline, as the order service does when it extends one.
async fn extend(env: &World, id: &str, pay_deadline: DateTime<Utc>) {
    let client = env.store.client().await.unwrap();
    let set = "UPDATE orders SET pay_deadline = $2 WHERE id = $1";
    assert_eq!(client.execute(set, &[&id, &pay_deadline]).await.unwrap(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_extended_deadline_outlives_its_old_message() {
    let env = World::new().await;
    let scheduler = env.scheduler();
    let mut consumer = env.start_consumer();
    let ten_s = Duration::from_secs(10);
    // Two orders due in 2 s; both extended by 2 s right away and scheduled
    // again: one through the library, one through the CLI.
    // Whole milliseconds, as the wire carries them: the CLI is given the new
    // deadline as text, and a due_at even 1 µs before the deadline would be
    // stale.
    let old = at_ms(2_000).trunc_subsecs(3);
    let new = old + TimeDelta::seconds(2);
    let ids = ["ext-lib", "ext-cli"];
    env.create_orders(&ids.map(|id| (id.to_owned(), old))).await;
    for id in ids {
        scheduler.schedule(id, old).await.unwrap();
        extend(&env, id, new).await;
    }
    scheduler.schedule("ext-lib", new).await.unwrap();
    let new_text = new.to_rfc3339_opts(chrono::SecondsFormat::Millis, true);
    env.cli_ok(&["schedule", "--order-id", "ext-cli", "--due-at", &new_text])
        .await;

    // The old messages: stale, acked, nothing changes.
    consumer.next_all(2, ten_s, Outcome::Extended).await;
    // Unpaid, unless the new deadline has passed meanwhile (set-up on a
    // loaded machine can take longer than the 2 s extension) and the new
    // message cancelled it: then not before the new deadline.
    for id in ids {
        let (status, pay_deadline, cancelled_at) = env.order(id).await;
        match cancelled_at {
            None => assert_eq!(status, "unpaid", "{id}"),
            Some(at) => assert!(
                at >= pay_deadline && pay_deadline == new,
                "{id} cancelled at {at}, before its extended deadline {new}"
            ),
        }
    }

    // The new ones cancel on time, never early.
    consumer.next_all(2, ten_s, Outcome::Cancelled).await;
    for id in ids {
        let (status, pay_deadline, cancelled_at) = env.order(id).await;
        assert_eq!(status, "cancelled", "{id}");
        let late = cancelled_at.unwrap() - pay_deadline;
        assert_late_within(late, TimeDelta::seconds(1), &format!("{id} cancelled"));
        eprintln!(
            "FIGURES extension {id}: cancelled {} ms after the new deadline",
            late.num_milliseconds()
        );
    }
    scheduler.close().await;
    consumer.stop().await;
    env.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_store_applies_the_rule_and_the_sweeper_reads_the_new_deadline() {
    let env = World::new().await;
    // Due 10 s ago, then extended to 10 s ahead.
    let old = at_ms(-10_000);
    env.create_orders(&[("ext-sweep".into(), old), ("ext-null".into(), old)])
        .await;
    extend(&env, "ext-sweep", at_ms(10_000)).await;
    env.execute("UPDATE orders SET pay_deadline = NULL WHERE id = 'ext-null'")
        .await;
    let stale = order_expiry_testkit::message("ext-sweep", old);
    let no_deadline = order_expiry_testkit::message("ext-null", old);
    let messages = [&stale, &no_deadline];
    let dispositions = env.store.cancel_unpaid(&messages).await.unwrap();
    use order_expiry::service::Disposition::{Cancelled, Extended};
    // A NULL deadline never extends: the message cancels it.
    assert_eq!(dispositions, [Extended, Cancelled]);
    assert_eq!(env.order("ext-sweep").await.0, "unpaid");
    // The sweeper goes by the current deadline: nothing is overdue.
    let swept = env.store.sweep_overdue(Duration::ZERO, 100).await.unwrap();
    assert!(swept.is_empty(), "{swept:?}");
    env.cleanup().await;
}
