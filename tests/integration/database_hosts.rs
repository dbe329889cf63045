//! `database.url` with several hosts, and a database that takes no writes, on
//! the one test database: a URL whose first host is dead cancels through the
//! next and is logged without its password; a read-only server (SQLSTATE
//! 25006) holds every cancel, retried and never parked, `/readyz` says 503, and
//! a `serve` with a writable URL then cancels them all. The real failover (a
//! primary and its standby) is `tests/faults/failover`.

use std::time::{Duration, Instant};

use order_expiry_testkit::{Served, World, at_ms, database, free_port};
use secrecy::ExposeSecret;

async fn serve(env: &World, url: &str) -> Served {
    env.serve(&[("ORDER_EXPIRY__DATABASE__URL", url)]).await
}

/// `n` unpaid orders `<prefix>-<i>` due in 300 ms, created and scheduled.
async fn due_soon(env: &World, prefix: &str, n: usize) -> Vec<String> {
    let orders: Vec<_> = (0..n)
        .map(|i| (format!("{prefix}-{i}"), at_ms(300)))
        .collect();
    env.create_orders(&orders).await;
    let scheduler = env.scheduler();
    for result in scheduler.schedule_many(orders.iter().cloned()).await {
        result.expect("scheduled");
    }
    scheduler.close().await;
    orders.into_iter().map(|(id, _)| id).collect()
}

async fn all_cancelled(env: &World, ids: &[String], within: Duration) -> bool {
    let deadline = Instant::now() + within;
    while Instant::now() < deadline {
        let rows = env.orders().await.unwrap_or_default();
        if ids
            .iter()
            .all(|id| rows.get(id).is_some_and(|r| r.status == "cancelled"))
        {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    false
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_database_url_whose_first_host_is_dead_cancels_through_the_next() {
    let env = World::new().await;
    let dead = free_port();
    let url = format!(
        "postgres://postgres:pw-db-hosts@127.0.0.1:{dead},127.0.0.1:5432/{}\
         ?target_session_attrs=read-write&options=-csearch_path%3D{}",
        database(),
        env.schema()
    );
    let served = serve(&env, &url).await;
    served.wait_ready(Duration::from_secs(30)).await;
    let ids = due_soon(&env, "h", 10).await;
    assert!(
        all_cancelled(&env, &ids, Duration::from_secs(20)).await,
        "not cancelled through the second host:\n{}",
        served.log_tail(20)
    );
    let log = std::fs::read_to_string(served.log_path()).expect("serve's log");
    assert!(!log.contains("pw-db-hosts"), "the password was logged");
    let shown = format!("postgres://postgres:***@127.0.0.1:{dead},127.0.0.1:5432/");
    assert!(log.contains(&shown), "{shown} not in the start-up log");
    let _ = std::fs::remove_file(served.log_path());
    drop(served);
    env.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_only_database_holds_every_cancel_unparked_until_a_writable_one() {
    let env = World::new().await;
    // Every session of this URL is read-only, as on a standby or a fenced
    // primary; without target_session_attrs the connection is taken anyway.
    let writable = env.settings.database.url.expose_secret().to_owned();
    let read_only = format!("{writable}%20-cdefault_transaction_read_only%3Don");
    let served = serve(&env, &read_only).await;
    let ids = due_soon(&env, "ro", 20).await;
    let deadline = Instant::now() + Duration::from_secs(20);
    while served.metric("order_expiry_retries_total").await < 3.0 {
        assert!(
            Instant::now() < deadline,
            "no retries:\n{}",
            served.log_tail(20)
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let rows = env.orders().await.expect("orders");
    assert!(ids.iter().all(|id| rows[id].status == "unpaid"));
    assert_eq!(served.metric("order_expiry_parked_total").await, 0.0);
    let cancelled = "order_expiry_messages_total{outcome=\"cancelled\"}";
    assert_eq!(served.metric(cancelled).await, 0.0);
    let readyz = served.get("/readyz").await.expect("/readyz answers");
    assert_eq!(readyz.0, 503, "{}", readyz.1);
    assert!(readyz.1.contains("database: false"), "{}", readyz.1);
    // The unavailable class: the batch waits whole, intake pauses (a
    // transient failure would split it and retry each order alone).
    let log = std::fs::read_to_string(served.log_path()).expect("serve's log");
    assert!(
        log.lines()
            .any(|l| l.contains("action unavailable") && l.contains("SQLSTATE 25006")),
        "no 'action unavailable ... SQLSTATE 25006' in the log:\n{}",
        served.log_tail(10)
    );

    // Nothing was acked: a writable serve gets every message back.
    let _ = std::fs::remove_file(served.log_path());
    drop(served);
    let served = serve(&env, &writable).await;
    assert!(
        all_cancelled(&env, &ids, Duration::from_secs(30)).await,
        "not all cancelled once the database took writes:\n{}",
        served.log_tail(20)
    );
    let _ = std::fs::remove_file(served.log_path());
    drop(served);
    env.cleanup().await;
}
