//! `database.url` with several hosts, and a database that takes no writes, on
//! the one test database: a URL whose first host is dead cancels through the
//! next and is logged without its password; a read-only server (SQLSTATE
//! 25006) holds every cancel, retried and never parked, `/readyz` says 503, and
//! a `serve` with a writable URL then cancels them all. The real failover (a
//! primary and its standby) is `tests/faults/failover`.

use std::time::Duration;

use chrono::{DateTime, Utc};
use order_expiry_testkit::{Served, World, at_ms, database, eventually, free_port, orders};
use secrecy::ExposeSecret;

async fn serve(env: &World, url: &str) -> Served {
    env.serve(&[("ORDER_EXPIRY__DATABASE__URL", url)]).await
}

/// `n` unpaid orders `<prefix>-<i>` due in 300 ms, created and scheduled.
async fn due_soon(env: &World, prefix: &str, n: usize) -> Vec<(String, DateTime<Utc>)> {
    let orders = orders(prefix, n, |_| at_ms(300));
    env.place(&orders).await;
    orders
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
    let orders = due_soon(&env, "h", 10).await;
    // Not cancelled through the second host: the panic quotes serve's log.
    env.wait_cancelled(&orders, Duration::from_secs(20)).await;
    let log = std::fs::read_to_string(served.log_path()).expect("serve's log");
    assert!(!log.contains("pw-db-hosts"), "the password was logged");
    let shown = format!("postgres://postgres:***@127.0.0.1:{dead},127.0.0.1:5432/");
    assert!(log.contains(&shown), "{shown} not in the start-up log");
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
    let orders = due_soon(&env, "ro", 20).await;
    eventually(Duration::from_secs(20), "three retries", async || {
        served.metric("order_expiry_retries_total").await >= 3.0
    })
    .await;
    let rows = env.orders().await.expect("orders");
    assert!(orders.iter().all(|(id, _)| rows[id].status == "unpaid"));
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
    drop(served);
    let served = serve(&env, &writable).await;
    env.wait_cancelled(&orders, Duration::from_secs(30)).await;
    drop(served);
    env.cleanup().await;
}
