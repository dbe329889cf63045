//! The transactional outbox against the real broker, database and binary: rows
//! committed with their orders are relayed and the orders cancelled on time; a
//! rolled-back transaction schedules nothing; two relays publish each row once;
//! kill -9 between the confirm and the delete gives a duplicate, never a loss;
//! rows written while the broker is unreachable are relayed once it is back;
//! rows committed while a round is in progress wake the relay when it ends.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use chrono::{DateTime, TimeDelta, Utc};
use lapin::options::QueueDeclareOptions;
use lapin::types::FieldTable;
use order_expiry::{service::Readiness, service::Relay};
use order_expiry_testkit::{Proxy, Served, World, at_ms};
use tokio_util::sync::CancellationToken;

/// A world's orders, each with its due time.
type Orders = Vec<(String, DateTime<Utc>)>;

/// `n` orders named `{prefix}-{i}`, due `due_ms` from now plus `i` ms.
fn orders(prefix: &str, n: usize, due_ms: i64) -> Orders {
    (0..n)
        .map(|i| (format!("{prefix}-{i}"), at_ms(due_ms + i as i64)))
        .collect()
}

/// What an order service does: the unpaid orders and their outbox rows in one
/// transaction, committed or rolled back.
pub(crate) async fn place(env: &World, orders: &[(String, DateTime<Utc>)], commit: bool) {
    let ids: Vec<&str> = orders.iter().map(|(id, _)| id.as_str()).collect();
    let due: Vec<DateTime<Utc>> = orders.iter().map(|(_, at)| *at).collect();
    let mut client = env.store.client().await.expect("database");
    let tx = client.transaction().await.expect("begin");
    let unnest = "SELECT * FROM unnest($1::text[], $2::timestamptz[])";
    tx.execute(
        &format!("INSERT INTO orders (id, pay_deadline) {unnest}"),
        &[&ids, &due],
    )
    .await
    .expect("insert orders");
    tx.execute(
        &format!("INSERT INTO order_expiry_outbox (order_id, due_at) {unnest}"),
        &[&ids, &due],
    )
    .await
    .expect("insert outbox rows");
    match commit {
        true => tx.commit().await.expect("commit"),
        false => tx.rollback().await.expect("rollback"),
    }
}

/// Rows left in the world's outbox.
pub(crate) async fn outbox_rows(env: &World) -> i64 {
    let client = env.store.client().await.expect("database");
    let row = client
        .query_one("SELECT count(*) FROM order_expiry_outbox", &[])
        .await
        .expect("count");
    row.get(0)
}

/// SIGTERM; it must exit 0.
async fn stop(mut served: Served) {
    served.signal("-TERM");
    let status = served.wait_exit(Duration::from_secs(15)).await;
    assert!(status.is_some_and(|s| s.success()), "{status:?}");
}

/// Waits until `check` holds, failing with `what` after `timeout`.
async fn eventually<F: AsyncFnMut() -> bool>(timeout: Duration, what: &str, mut check: F) {
    let deadline = Instant::now() + timeout;
    while !check().await {
        assert!(Instant::now() < deadline, "{what} within {timeout:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Every order cancelled once, never before its due time, at most `late` after.
pub(crate) async fn assert_cancelled_on_time(env: &World, orders: &[(String, DateTime<Utc>)]) {
    let late = TimeDelta::seconds(1);
    eventually(
        Duration::from_secs(20),
        "every order cancelled",
        async || {
            let all = env.orders().await.unwrap_or_default();
            orders.iter().all(|(id, _)| {
                all.get(id)
                    .is_some_and(|o| o.status == "cancelled" && o.cancelled_at.is_some())
            })
        },
    )
    .await;
    let all = env.orders().await.expect("orders");
    for (id, _) in orders {
        let order = &all[id];
        let cancelled_at = order.cancelled_at.expect("cancelled");
        assert!(cancelled_at >= order.pay_deadline, "{id} cancelled early");
        assert!(
            cancelled_at - order.pay_deadline <= late,
            "{id} cancelled {} ms late",
            (cancelled_at - order.pay_deadline).num_milliseconds()
        );
    }
}

/// A queue bound to the due exchange with `#`: a copy of every message that
/// reaches it, whoever consumes the due queue. Removed with the world's
/// connection (exclusive).
async fn tap(env: &World) -> String {
    let name = format!("{}.tap", env.settings.topology.prefix);
    let channel = env.channel().await;
    let exclusive = QueueDeclareOptions {
        exclusive: true,
        ..QueueDeclareOptions::default()
    };
    channel
        .queue_declare(name.as_str().into(), exclusive, FieldTable::default())
        .await
        .expect("tap queue");
    env.bind(&name, &env.ladder().due_exchange(), "#").await;
    name
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn committed_rows_are_relayed_and_deleted_and_a_rollback_schedules_nothing() {
    let env = World::new().await;
    let served = env.serve(&[]).await;
    served.wait_ready(Duration::from_secs(20)).await;

    let committed = orders("ob", 20, 2500);
    for chunk in committed.chunks(5) {
        place(&env, chunk, true).await;
    }
    let rolled_back = orders("ob-rolled-back", 3, 2500);
    place(&env, &rolled_back, false).await;

    assert_cancelled_on_time(&env, &committed).await;
    assert_eq!(outbox_rows(&env).await, 0, "relayed rows are deleted");
    let all = env.orders().await.expect("orders");
    assert!(rolled_back.iter().all(|(id, _)| !all.contains_key(id)));
    // Exactly the committed rows were published: nothing from the rollback.
    assert_eq!(
        served.metric("order_expiry_outbox_lag_seconds_count").await,
        20.0
    );
    let (_, body) = served.get("/readyz").await.expect("readyz");
    assert!(body.contains("outbox: relaying"), "{body}");
    stop(served).await;
    env.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_relays_publish_each_row_exactly_once() {
    let env = World::new().await;
    let tap = tap(&env).await;
    // Small batches, so both relays keep taking rows while the other holds some.
    let small = [("ORDER_EXPIRY__OUTBOX__BATCH_MAX", "5")];
    let first = env.serve(&small).await;
    let second = env.serve(&small).await;
    first.wait_ready(Duration::from_secs(20)).await;
    second.wait_ready(Duration::from_secs(20)).await;

    // Due already: each message goes straight to the due exchange, and the tap.
    let placed = orders("two", 400, -1000);
    for chunk in placed.chunks(10) {
        place(&env, chunk, true).await;
    }
    eventually(Duration::from_secs(30), "the outbox emptied", async || {
        outbox_rows(&env).await == 0
    })
    .await;
    // Each row's order in exactly one message (v1, or one of a bundle's).
    let mut seen = std::collections::HashSet::new();
    let mut messages = 0;
    let deadline = Instant::now() + Duration::from_secs(10);
    while seen.len() < 400 && Instant::now() < deadline {
        match env.get(&tap).await {
            Some(message) => {
                messages += 1;
                for id in order_expiry_testkit::order_ids(&message.data) {
                    assert!(seen.insert(id.clone()), "{id} published twice");
                }
            }
            None => tokio::time::sleep(Duration::from_millis(50)).await,
        }
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        env.get(&tap).await.is_none(),
        "nothing more than one copy per row"
    );
    assert_eq!(seen.len(), 400);
    let by_first = first.metric("order_expiry_outbox_lag_seconds_count").await;
    let by_second = second.metric("order_expiry_outbox_lag_seconds_count").await;
    assert_eq!(by_first + by_second, 400.0);
    assert!(
        by_first > 0.0 && by_second > 0.0,
        "both relays took rows: {by_first} + {by_second}"
    );
    eventually(
        Duration::from_secs(20),
        "every order cancelled",
        async || {
            let all = env.orders().await.unwrap_or_default();
            all.values().filter(|o| o.status == "cancelled").count() == 400
        },
    )
    .await;
    eprintln!("FIGURES outbox two relays: {by_first} + {by_second} rows, {messages} messages");
    stop(first).await;
    stop(second).await;
    env.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_between_confirm_and_delete_gives_a_duplicate_never_a_loss() {
    let env = World::new().await;
    let key: i64 = 0x5EED_0000 + i64::from(u16::from_str_radix(&env.id[..4], 16).unwrap());
    // The relay's DELETE blocks on an advisory lock this test holds: it has
    // its confirm and hangs before the delete commits. Only this world's
    // schema has the trigger; the relay's own statement timeout is raised so
    // that it waits rather than failing the round.
    let hold = env.store.client().await.expect("database");
    hold.batch_execute(&format!(
        "CREATE FUNCTION hold_delete() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN \
           PERFORM set_config('lock_timeout', '0', true); \
           PERFORM pg_advisory_xact_lock({key}); RETURN OLD; END $$; \
         CREATE TRIGGER hold_delete BEFORE DELETE ON order_expiry_outbox \
           FOR EACH ROW EXECUTE FUNCTION hold_delete(); \
         SELECT pg_advisory_lock({key});"
    ))
    .await
    .expect("trigger and lock");
    let patient = [
        ("ORDER_EXPIRY__DATABASE__STATEMENT_TIMEOUT_MS", "60000"),
        ("ORDER_EXPIRY__DATABASE__QUERY_TIMEOUT_MS", "70000"),
    ];
    let first = env.serve(&patient).await;
    first.wait_ready(Duration::from_secs(20)).await;

    // Due in 10 s: the message waits in the 8 s level, where it can be counted.
    let order = orders("k9", 1, 10_000);
    place(&env, &order, true).await;
    let waiting = format!(
        "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted \
         AND classid = 0 AND objid = {key}"
    );
    eventually(
        Duration::from_secs(10),
        "the relay blocked in its delete",
        async || {
            let row = hold.query_one(&waiting, &[]).await.expect("pg_locks");
            row.get::<_, i64>(0) == 1
        },
    )
    .await;
    let ladder = env.ladder();
    let mut queues: Vec<String> = (0..ladder.levels()).map(|l| ladder.level_name(l)).collect();
    queues.push(ladder.due_queue());
    let mut in_broker = 0;
    for queue in &queues {
        in_broker += env.depth(queue).await;
    }
    assert_eq!(in_broker, 1, "confirmed: the message is in the ladder");

    let mut first = first;
    first.signal("-KILL");
    first
        .wait_exit(Duration::from_secs(5))
        .await
        .expect("killed");
    assert_eq!(outbox_rows(&env).await, 1, "the row outlived the relay");
    // Let the old backend go on: its client is gone, so it rolls back.
    hold.batch_execute(&format!(
        "SELECT pg_advisory_unlock({key}); DROP TRIGGER hold_delete ON order_expiry_outbox"
    ))
    .await
    .expect("release");

    let second = env.serve(&[]).await;
    assert_cancelled_on_time(&env, &order).await;
    eventually(
        Duration::from_secs(15),
        "both messages handled",
        async || {
            second
                .metric("order_expiry_messages_total{outcome=\"not_unpaid\"}")
                .await
                == 1.0
        },
    )
    .await;
    assert_eq!(
        second
            .metric("order_expiry_messages_total{outcome=\"cancelled\"}")
            .await,
        1.0,
        "cancelled once"
    );
    assert_eq!(
        second.metric("order_expiry_outbox_lag_seconds_count").await,
        1.0
    );
    assert_eq!(outbox_rows(&env).await, 0);
    stop(second).await;
    env.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rows_written_while_the_broker_is_unreachable_are_relayed_when_it_returns() {
    let mut env = World::new().await;
    let broker: std::net::SocketAddr = format!("127.0.0.1:{}", order_expiry_testkit::amqp_port())
        .parse()
        .expect("address");
    let proxy = Proxy::start(broker).await;
    let url = order_expiry_testkit::amqp_url().replace(
        &format!("127.0.0.1:{}", broker.port()),
        &proxy.addr().to_string(),
    );
    env.settings.amqp.url = url.into();
    let quick = [
        ("ORDER_EXPIRY__AMQP__TIMEOUT_MS", "1000"),
        ("ORDER_EXPIRY__OUTBOX__RETRY_MAX_MS", "500"),
    ];
    let served = env.serve(&quick).await;
    served.wait_ready(Duration::from_secs(20)).await;

    proxy.blackhole();
    let placed = orders("down", 50, 6000);
    place(&env, &placed, true).await;
    eventually(Duration::from_secs(10), "publishes failing", async || {
        served
            .metric("order_expiry_outbox_publish_failures_total")
            .await
            > 0.0
    })
    .await;
    let (_, body) = served.get("/readyz").await.expect("readyz");
    assert!(body.contains("outbox: failing"), "{body}");
    assert_eq!(outbox_rows(&env).await, 50, "failed rows stay");

    proxy.restore();
    eventually(Duration::from_secs(15), "the outbox emptied", async || {
        outbox_rows(&env).await == 0
    })
    .await;
    assert_cancelled_on_time(&env, &placed).await;
    let failures = served
        .metric("order_expiry_outbox_publish_failures_total")
        .await;
    eprintln!("FIGURES outbox broker unreachable: {failures} failed publishes, 50 relayed after");
    stop(served).await;
    env.cleanup().await;
}

/// Rows committed while a round is in progress wake the relay when that round
/// ends, however long it took: each is confirmed within a second of the end of
/// the round, with the fallback poll switched off (60 s) so that only the
/// notifications can wake it. The round is held open deterministically: it has
/// a row that can never be published (an empty order id), and moving it into
/// `order_expiry_outbox_rejected` waits for a lock the test holds on that table.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rows_committed_while_a_round_is_in_progress_are_relayed_when_it_ends() {
    let env = World::new().await;
    let mut settings = env.settings.clone();
    settings.outbox.poll_interval = Duration::from_secs(60);
    // The round waits for the test's lock instead of failing after 500 ms.
    settings.database.lock_timeout = Duration::from_secs(10);
    let mut relay = Relay::new(&settings, Arc::new(Readiness::default())).expect("relay");
    let mut relayed = relay.observe();
    let stop = CancellationToken::new();
    let relay_task = tokio::spawn(relay.run(stop.clone()));

    // Listening: a first row comes through on its notification.
    place(&env, &orders("round-first", 1, 60_000), true).await;
    let first = tokio::time::timeout(Duration::from_secs(10), relayed.recv()).await;
    assert!(
        matches!(&first, Ok(Some(r)) if r.confirmed_at.is_some()),
        "{first:?}"
    );

    let mut blocker = env.store.client().await.expect("database");
    let blocker = blocker.transaction().await.expect("begin");
    blocker
        .batch_execute("LOCK TABLE order_expiry_outbox_rejected IN SHARE MODE")
        .await
        .expect("lock");
    place(&env, &[(String::new(), at_ms(60_000))], true).await;
    wait_for_blocked_round(&env).await;
    // Committed while the round is in progress, each in its own transaction.
    let during = orders("round-during", 5, 60_000);
    for order in &during {
        place(&env, std::slice::from_ref(order), true).await;
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    blocker.rollback().await.expect("release the round");
    let released = Utc::now();

    let mut confirmed = HashMap::new();
    let deadline = Instant::now() + Duration::from_secs(5);
    while confirmed.len() < during.len() && Instant::now() < deadline {
        if let Ok(Some(row)) =
            tokio::time::timeout(Duration::from_millis(200), relayed.recv()).await
            && let Some(at) = row.confirmed_at
        {
            confirmed.insert(row.order_id, at);
        }
    }
    stop.cancel();
    relay_task.await.expect("relay stops");
    for (id, _) in &during {
        let waited = confirmed
            .get(id)
            .map(|at| (*at - released).num_milliseconds());
        assert!(
            waited.is_some_and(|ms| ms <= 1000),
            "{id} confirmed {waited:?} ms after the round ended (None: not within 5 s)"
        );
    }
    env.cleanup().await;
}

/// Until the relay's round waits for a lock on the rejected table.
async fn wait_for_blocked_round(env: &World) {
    let client = env.store.client().await.expect("database");
    eventually(
        Duration::from_secs(10),
        "the round waits for the lock",
        async || {
            let row = client
                .query_one(
                    "SELECT count(*) FROM pg_locks WHERE NOT granted \
                 AND relation = 'order_expiry_outbox_rejected'::regclass",
                    &[],
                )
                .await
                .expect("pg_locks");
            row.get::<_, i64>(0) > 0
        },
    )
    .await;
}
