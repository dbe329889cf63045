//! Order services writing to the outbox: Rust through
//! `Scheduler::schedule_in_tx`, relayed one round at a time by the library's
//! `Relay`; and the Python example (`examples/python/order_service.py`, with
//! psycopg) against the real database while the real `serve` relays it:
//! an order created, one rolled back, one whose deadline is extended.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use order_expiry::{OutboxError, service::Readiness, service::Relay};
use order_expiry_testkit::{World, at_ms};
use secrecy::ExposeSecret;

use crate::outbox::{assert_cancelled_on_time, outbox_rows};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn schedule_in_tx_commits_with_the_order_or_not_at_all() {
    let env = World::new().await;
    let scheduler = env.scheduler();
    let mut db = env.connect().await.expect("database");
    let insert = "INSERT INTO orders (id, pay_deadline) VALUES ($1, $2)";

    let due_at = at_ms(2500);
    let tx = db.transaction().await.unwrap();
    tx.execute(insert, &[&"rs-committed", &due_at])
        .await
        .unwrap();
    let entry = scheduler
        .schedule_in_tx(&tx, "rs-committed", due_at)
        .await
        .unwrap();
    tx.commit().await.unwrap();

    let tx = db.transaction().await.unwrap();
    tx.execute(insert, &[&"rs-rolled-back", &due_at])
        .await
        .unwrap();
    scheduler
        .schedule_in_tx(&tx, "rs-rolled-back", due_at)
        .await
        .unwrap();
    tx.rollback().await.unwrap();

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
        (entry.id, "rs-committed")
    );
    assert!(row.confirmed_at.is_some_and(|at| at >= row.created_at));
    let consumer = env.start_consumer();
    let orders = [("rs-committed".to_owned(), due_at)];
    assert_cancelled_on_time(&env, &orders).await;
    assert!(!env.orders().await.unwrap().contains_key("rs-rolled-back"));
    assert_eq!(relay.relay_once().await.unwrap(), Default::default());
    consumer.stop().await;
    env.cleanup().await;
}

/// The pinned venv `scripts/python-venv` makes (scripts/test runs it first).
fn python() -> PathBuf {
    let venv = Path::new(env!("CARGO_MANIFEST_DIR")).join("target/python-venv/bin/python");
    let python = std::env::var_os("ORDER_EXPIRY_TEST_PYTHON").map_or(venv, PathBuf::from);
    assert!(
        python.exists(),
        "{} is missing: run scripts/python-venv (scripts/test does)",
        python.display()
    );
    python
}

/// Runs the Python example with `args`; its one JSON line.
async fn order_service(env: &World, args: &[&str]) -> serde_json::Value {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/python/order_service.py");
    let output = tokio::process::Command::new(python())
        .arg(script)
        .args(["--database-url", env.settings.database.url.expose_secret()])
        .args(args)
        .output()
        .await
        .expect("python runs");
    assert!(
        output.status.success(),
        "order_service.py {args:?}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_slice(&output.stdout).expect("one JSON line")
}

/// The Python example's expire endpoint keeps the contract's clock rule: 425
/// with the time left while `due_at` is ahead of its database's clock, then
/// 200 once, then 409.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_python_order_service_refuses_an_expire_before_due() {
    let env = World::new().await;
    let due_at = order_expiry_testkit::at_ms(2_000);
    env.create_orders(&[("py-early".to_owned(), due_at)]).await;
    let due = due_at.to_rfc3339();
    let early = order_service(&env, &["expire", "py-early", &due]).await;
    assert_eq!(early["status"], 425, "{early}");
    let left = early["due_in_ms"].as_i64().expect("due_in_ms");
    assert!((1..=2_000).contains(&left), "{early}");
    assert_eq!(env.order("py-early").await.0, "unpaid");
    tokio::time::sleep(Duration::from_millis(left as u64)).await;
    let cancelled = order_service(&env, &["expire", "py-early", &due]).await;
    assert_eq!(cancelled["status"], 200, "{cancelled}");
    let (_, deadline, cancelled_at) = env.order("py-early").await;
    assert!(
        cancelled_at.expect("cancelled") >= deadline,
        "cancelled early"
    );
    let again = order_service(&env, &["expire", "py-early", &due]).await;
    assert_eq!(again["status"], 409, "{again}");
    let unknown = order_service(&env, &["expire", "py-none", &due]).await;
    assert_eq!(unknown["status"], 404, "{unknown}");
    env.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_python_order_service_schedules_through_the_outbox() {
    let env = World::new().await;
    let served = env.serve(&[]).await;
    served.wait_ready(Duration::from_secs(20)).await;

    let created = order_service(&env, &["create", "py-1", "3"]).await;
    assert_eq!(created["committed"], true, "{created}");
    let rolled_back = order_service(&env, &["create", "py-2", "3", "--rollback"]).await;
    assert_eq!(rolled_back["committed"], false, "{rolled_back}");

    // An extension through the outbox: the old message comes at 10 s and
    // changes nothing, the new one cancels at the new deadline (14 s after the
    // extension), never before. The extension must land before the old
    // deadline, and each run of the script starts a Python: on a fresh
    // machine's first run (no bytecode cached yet, load 4-5) a 2 s window
    // was over before the second script ran (seen on 2026-12-02;
    // reproduced with a Python that takes 2.5 s to start).
    let extended = order_service(&env, &["create", "py-3", "10"]).await;
    assert_eq!(extended["committed"], true, "{extended}");
    let extended = order_service(&env, &["extend", "py-3", "14"]).await;
    assert_eq!(extended["extended"], true, "{extended}");

    let mut due = Vec::new();
    for id in ["py-1", "py-3"] {
        due.push((id.to_owned(), env.order(id).await.1));
    }
    assert_cancelled_on_time(&env, &due).await;
    assert!(!env.orders().await.unwrap().contains_key("py-2"));
    assert_eq!(outbox_rows(&env).await, 0);
    // Three messages: the rolled-back order was never scheduled.
    let relayed = served.metric("order_expiry_outbox_lag_seconds_count").await;
    assert_eq!(relayed, 3.0);
    let outcome = |o: &str| format!("order_expiry_messages_total{{outcome=\"{o}\"}}");
    assert_eq!(served.metric(&outcome("cancelled")).await, 2.0);
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while served.metric(&outcome("extended")).await < 1.0 {
        assert!(
            std::time::Instant::now() < deadline,
            "the stale message was acked as extended"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let mut served = served;
    served.signal("-TERM");
    assert!(
        served
            .wait_exit(Duration::from_secs(15))
            .await
            .is_some_and(|s| s.success())
    );
    env.cleanup().await;
}
