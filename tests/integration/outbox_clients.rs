//! Order services writing to the outbox: Rust through
//! `Scheduler::schedule_in_tx`, relayed one round at a time by the library's
//! `Relay`; and the Python example (`examples/python/order_service.py`, with
//! psycopg) against the real database while the real `serve` relays it:
//! an order created, one rolled back, one whose deadline is extended.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use order_expiry::{OutboxError, service::Readiness, service::Relay};
use order_expiry_testkit::{World, at_ms, eventually};
use secrecy::ExposeSecret;

use crate::outbox::{assert_cancelled_on_time, outbox_rows};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn schedule_in_tx_commits_with_the_order_or_not_at_all() {
    let env = World::new().await;
    let scheduler = env.scheduler();
    let mut db = env.connect().await.expect("database");
    let due_at = at_ms(2500);
    let mut entries = Vec::new();
    for (id, commit) in [("rs-committed", true), ("rs-rolled-back", false)] {
        let tx = db.transaction().await.unwrap();
        let insert = "INSERT INTO orders (id, pay_deadline) VALUES ($1, $2)";
        tx.execute(insert, &[&id, &due_at]).await.unwrap();
        entries.push(scheduler.schedule_in_tx(&tx, id, due_at).await.unwrap());
        match commit {
            true => tx.commit().await.unwrap(),
            false => tx.rollback().await.unwrap(),
        }
    }

    // What the relay could never publish is refused inside the transaction.
    let tx = db.transaction().await.unwrap();
    let invalid = scheduler.schedule_in_tx(&tx, "bad\nid", due_at).await;
    assert!(matches!(invalid, Err(OutboxError::InvalidOrderId(_))));
    let far = at_ms(3_600_000); // beyond the test ladder's 63 s
    let too_long = scheduler.schedule_in_tx(&tx, "rs-far", far).await;
    assert!(matches!(too_long, Err(OutboxError::DelayTooLong(_))));
    tx.commit().await.unwrap();
    assert_eq!(outbox_rows(&env).await, 1, "only the committed row");

    // One round of the relay publishes it, and the consumer cancels on time.
    let mut relay = Relay::new(&env.settings, Arc::new(Readiness::default())).unwrap();
    let mut relayed = relay.observe();
    let round = relay.relay_once().await.unwrap();
    assert_eq!((round.published, round.rejected, round.failed), (1, 0, 0));
    let row = relayed.recv().await.expect("the relayed row");
    assert_eq!(
        (row.outbox_id, row.order_id.as_str()),
        (entries[0].id, "rs-committed")
    );
    assert!(row.confirmed_at.is_some_and(|at| at >= row.created_at));
    let consumer = env.start_consumer();
    assert_cancelled_on_time(&env, &["rs-committed"]).await;
    assert!(!env.orders().await.unwrap().contains_key("rs-rolled-back"));
    assert_eq!(relay.relay_once().await.unwrap(), Default::default());
    consumer.stop().await;
    env.cleanup().await;
}

/// Runs the Python example with `args` in the pinned venv that
/// `scripts/python-venv` makes (scripts/test runs it first); its one JSON line.
async fn order_service(env: &World, args: &[&str]) -> serde_json::Value {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let venv = root.join("target/python-venv/bin/python");
    let python = std::env::var_os("ORDER_EXPIRY_TEST_PYTHON").map_or(venv, PathBuf::from);
    assert!(
        python.exists(),
        "{} is missing: run scripts/python-venv",
        python.display()
    );
    let output = tokio::process::Command::new(python)
        .arg(root.join("examples/python/order_service.py"))
        .args(["--database-url", env.settings.database.url.expose_secret()])
        .args(args)
        .output()
        .await
        .expect("python runs");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "order_service.py {args:?}: {stderr}"
    );
    serde_json::from_slice(&output.stdout).expect("one JSON line")
}

/// The Python example's expire endpoint keeps the contract's clock rule: 425
/// with the time left while `due_at` is ahead of its database's clock, then
/// 200 once, then 409.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_python_order_service_refuses_an_expire_before_due() {
    let env = World::new().await;
    let due_at = at_ms(2_000);
    env.create_orders(&[("py-early".to_owned(), due_at)]).await;
    let due = due_at.to_rfc3339();
    let expire = async |id: &str| order_service(&env, &["expire", id, &due]).await;
    let early = expire("py-early").await;
    assert_eq!(early["status"], 425, "{early}");
    let left = early["due_in_ms"].as_i64().expect("due_in_ms");
    assert!((1..=2_000).contains(&left), "{early}");
    assert_eq!(env.order("py-early").await.0, "unpaid");
    tokio::time::sleep(Duration::from_millis(left as u64)).await;
    assert_eq!(expire("py-early").await["status"], 200);
    env.assert_cancelled_in_time("py-early").await;
    assert_eq!(expire("py-early").await["status"], 409);
    assert_eq!(expire("py-none").await["status"], 404);
    env.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_python_order_service_schedules_through_the_outbox() {
    let env = World::new().await;
    let served = env.serve_ready(&[]).await;

    // An extension through the outbox: the old message comes at 10 s and
    // changes nothing, the new one cancels at the new deadline (14 s after the
    // extension), never before. The 10 s leave time to start a cold Python
    // twice before the old deadline.
    for (args, field, expected) in [
        (&["create", "py-1", "3"][..], "committed", true),
        (&["create", "py-2", "3", "--rollback"], "committed", false),
        (&["create", "py-3", "10"], "committed", true),
        (&["extend", "py-3", "14"], "extended", true),
    ] {
        let said = order_service(&env, args).await;
        assert_eq!(said[field], expected, "{args:?}: {said}");
    }

    assert_cancelled_on_time(&env, &["py-1", "py-3"]).await;
    assert!(!env.orders().await.unwrap().contains_key("py-2"));
    assert_eq!(outbox_rows(&env).await, 0);
    // Three messages: the rolled-back order was never scheduled.
    let relayed = served.metric("order_expiry_outbox_lag_seconds_count").await;
    assert_eq!(relayed, 3.0);
    let outcome = |o: &str| format!("order_expiry_messages_total{{outcome=\"{o}\"}}");
    assert_eq!(served.metric(&outcome("cancelled")).await, 2.0);
    let extended = outcome("extended");
    eventually(
        Duration::from_secs(10),
        "the stale message acked as extended",
        async || served.metric(&extended).await >= 1.0,
    )
    .await;
    served.terminate().await;
    env.cleanup().await;
}
