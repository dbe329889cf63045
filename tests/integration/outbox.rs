//! The transactional outbox against the real broker, database and binary: rows
//! committed with their orders are relayed and the orders cancelled on time; a
//! rolled-back transaction schedules nothing; two relays publish each row once;
//! kill -9 between the confirm and the delete gives a duplicate, never a loss;
//! rows written while the broker is unreachable are relayed once it is back;
//! rows committed while a round is in progress wake the relay when it ends.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use lapin::options::QueueDeclareOptions;
use order_expiry::{service::Readiness, service::Relay};
use order_expiry_testkit::{
    HasOrderId, Proxy, World, assert_on_time, at_ms, eventually, order_ids, orders,
};
use tokio_util::sync::CancellationToken;

const RELAYED: &str = "order_expiry_outbox_lag_seconds_count";
const SECS_20: Duration = Duration::from_secs(20);

/// `n` orders `{prefix}-{i}`, due `ms` from now plus `i` ms.
fn due_in(prefix: &str, n: usize, ms: i64) -> Vec<(String, DateTime<Utc>)> {
    orders(prefix, n, |i| at_ms(ms + i as i64))
}

/// What an order service does: the unpaid orders and their outbox rows in one
/// transaction, committed or rolled back.
async fn place(env: &World, orders: &[(String, DateTime<Utc>)], commit: bool) {
    let ids: Vec<&str> = orders.iter().map(|(id, _)| id.as_str()).collect();
    let due: Vec<DateTime<Utc>> = orders.iter().map(|(_, at)| *at).collect();
    let mut client = env.store.client().await.expect("database");
    let tx = client.transaction().await.expect("begin");
    for table in [
        "orders (id, pay_deadline)",
        "order_expiry_outbox (order_id, due_at)",
    ] {
        let insert =
            format!("INSERT INTO {table} SELECT * FROM unnest($1::text[], $2::timestamptz[])");
        tx.execute(&insert, &[&ids, &due]).await.expect(&insert);
    }
    match commit {
        true => tx.commit().await.expect("commit"),
        false => tx.rollback().await.expect("rollback"),
    }
}

/// The one number `sql` selects.
async fn count(client: &tokio_postgres::Client, sql: &str) -> i64 {
    client.query_one(sql, &[]).await.expect(sql).get(0)
}

/// Rows left in the world's outbox.
pub(crate) async fn outbox_rows(env: &World) -> i64 {
    let client = env.store.client().await.expect("database");
    count(&client, "SELECT count(*) FROM order_expiry_outbox").await
}

/// Until the world's outbox is empty, at most `secs` seconds.
async fn wait_emptied(env: &World, secs: u64) {
    let emptied = async || outbox_rows(env).await == 0;
    eventually(Duration::from_secs(secs), "the outbox emptied", emptied).await;
}

/// Until a lock that `filter` (of `pg_locks`) selects is waited for.
async fn wait_for_lock_waiter(client: &tokio_postgres::Client, filter: &str) {
    let sql = format!("SELECT count(*) FROM pg_locks WHERE NOT granted AND {filter}");
    eventually(Duration::from_secs(10), "a blocked statement", async || {
        count(client, &sql).await > 0
    })
    .await;
}

/// Every order of `ids` cancelled, never before its deadline, at most 1 s after.
pub(crate) async fn assert_cancelled_on_time<T: HasOrderId>(env: &World, ids: &[T]) {
    let rows = env.wait_cancelled(ids, SECS_20).await;
    let id = |o: &T| o.order_id().to_owned();
    let due: Vec<_> = ids
        .iter()
        .map(|o| (id(o), rows[&id(o)].pay_deadline))
        .collect();
    assert_on_time(&due, &rows, Duration::from_secs(1));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn committed_rows_are_relayed_and_deleted_and_a_rollback_schedules_nothing() {
    let env = World::new().await;
    let served = env.serve_ready(&[]).await;

    let committed = due_in("ob", 20, 2500);
    for chunk in committed.chunks(5) {
        place(&env, chunk, true).await;
    }
    let rolled_back = due_in("ob-rolled-back", 3, 2500);
    place(&env, &rolled_back, false).await;

    assert_cancelled_on_time(&env, &committed).await;
    assert_eq!(outbox_rows(&env).await, 0, "relayed rows are deleted");
    let all = env.orders().await.expect("orders");
    assert!(rolled_back.iter().all(|(id, _)| !all.contains_key(id)));
    // Exactly the committed rows were published: nothing from the rollback.
    assert_eq!(served.metric(RELAYED).await, 20.0);
    let (_, body) = served.get("/readyz").await.expect("readyz");
    assert!(body.contains("outbox: relaying"), "{body}");
    served.terminate().await;
    env.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_relays_publish_each_row_exactly_once() {
    let env = World::new().await;
    // A copy of every message that reaches the due exchange, whoever consumes
    // the due queue; exclusive, so it goes with the world's connection.
    let tap = format!("{}.tap", env.settings.topology.prefix);
    let exclusive = QueueDeclareOptions {
        exclusive: true,
        ..Default::default()
    };
    let channel = env.channel().await;
    let tapped = channel.queue_declare(tap.as_str().into(), exclusive, Default::default());
    tapped.await.expect("tap");
    env.bind(&tap, &env.ladder().due_exchange(), "#").await;
    // Small batches, so both relays keep taking rows while the other holds some.
    let small = [("ORDER_EXPIRY__OUTBOX__BATCH_MAX", "5")];
    let relays = [env.serve(&small).await, env.serve(&small).await];
    for relay in &relays {
        relay.wait_ready(SECS_20).await;
    }

    // Due already: each message goes straight to the due exchange, and the tap.
    let placed = due_in("two", 400, -1000);
    for chunk in placed.chunks(10) {
        place(&env, chunk, true).await;
    }
    wait_emptied(&env, 30).await;
    // Each row's order in exactly one message (v1, or one of a bundle's).
    let (mut seen, mut messages) = (HashSet::new(), 0);
    let deadline = Instant::now() + Duration::from_secs(10);
    while seen.len() < 400 && Instant::now() < deadline {
        let Some(message) = env.get(&tap).await else {
            tokio::time::sleep(Duration::from_millis(50)).await;
            continue;
        };
        messages += 1;
        for id in order_ids(&message.data) {
            assert!(seen.insert(id.clone()), "{id} published twice");
        }
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        env.get(&tap).await.is_none(),
        "nothing more than one copy per row"
    );
    assert_eq!(seen.len(), 400);
    let [by_first, by_second] = [
        relays[0].metric(RELAYED).await,
        relays[1].metric(RELAYED).await,
    ];
    assert_eq!(by_first + by_second, 400.0);
    assert!(
        by_first > 0.0 && by_second > 0.0,
        "both relays took rows: {by_first} + {by_second}"
    );
    env.wait_cancelled(&placed, SECS_20).await;
    eprintln!("FIGURES outbox two relays: {by_first} + {by_second} rows, {messages} messages");
    for relay in relays {
        relay.terminate().await;
    }
    env.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_between_confirm_and_delete_gives_a_duplicate_never_a_loss() {
    let env = World::new().await;
    let key: i64 = 0x5EED_0000 + i64::from(u16::from_str_radix(&env.id[..4], 16).unwrap());
    // The relay's DELETE (only in this world's schema) blocks on an advisory
    // lock this test holds: it has its confirm and hangs before the delete
    // commits. Its statement timeout is raised so that it waits.
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
    let mut first = env
        .serve(&[
            ("ORDER_EXPIRY__DATABASE__STATEMENT_TIMEOUT_MS", "60000"),
            ("ORDER_EXPIRY__DATABASE__QUERY_TIMEOUT_MS", "70000"),
        ])
        .await;
    first.wait_ready(SECS_20).await;

    // Due in 10 s: the message waits in the 8 s level, where it can be counted.
    let order = due_in("k9", 1, 10_000);
    place(&env, &order, true).await;
    let advisory = format!("locktype = 'advisory' AND classid = 0 AND objid = {key}");
    wait_for_lock_waiter(&hold, &advisory).await;
    assert_eq!(
        env.ladder_depth(None).await,
        1,
        "confirmed: the message is in the ladder"
    );

    first.signal("-KILL");
    let exited = first.wait_exit(Duration::from_secs(5)).await;
    exited.expect("killed");
    assert_eq!(outbox_rows(&env).await, 1, "the row outlived the relay");
    // Let the old backend go on: its client is gone, so it rolls back.
    hold.batch_execute(&format!(
        "SELECT pg_advisory_unlock({key}); DROP TRIGGER hold_delete ON order_expiry_outbox"
    ))
    .await
    .expect("release");

    let second = env.serve(&[]).await;
    assert_cancelled_on_time(&env, &order).await;
    let outcome = |o: &str| format!("order_expiry_messages_total{{outcome=\"{o}\"}}");
    eventually(
        Duration::from_secs(15),
        "both messages handled",
        async || second.metric(&outcome("not_unpaid")).await == 1.0,
    )
    .await;
    assert_eq!(
        second.metric(&outcome("cancelled")).await,
        1.0,
        "cancelled once"
    );
    assert_eq!(second.metric(RELAYED).await, 1.0);
    assert_eq!(outbox_rows(&env).await, 0);
    second.terminate().await;
    env.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rows_written_while_the_broker_is_unreachable_are_relayed_when_it_returns() {
    let mut env = World::new().await;
    let broker = format!("127.0.0.1:{}", order_expiry_testkit::amqp_port());
    let proxy = Proxy::start(broker.parse().expect("address")).await;
    let url = order_expiry_testkit::amqp_url().replace(&broker, &proxy.addr().to_string());
    env.settings.amqp.url = url.into();
    let served = env
        .serve(&[
            ("ORDER_EXPIRY__AMQP__TIMEOUT_MS", "1000"),
            ("ORDER_EXPIRY__OUTBOX__RETRY_MAX_MS", "500"),
        ])
        .await;
    served.wait_ready(SECS_20).await;

    proxy.blackhole();
    let placed = due_in("down", 50, 6000);
    place(&env, &placed, true).await;
    let failures = "order_expiry_outbox_publish_failures_total";
    eventually(Duration::from_secs(10), "publishes failing", async || {
        served.metric(failures).await > 0.0
    })
    .await;
    let (_, body) = served.get("/readyz").await.expect("readyz");
    assert!(body.contains("outbox: failing"), "{body}");
    assert_eq!(outbox_rows(&env).await, 50, "failed rows stay");

    proxy.restore();
    wait_emptied(&env, 15).await;
    assert_cancelled_on_time(&env, &placed).await;
    let failures = served.metric(failures).await;
    eprintln!("FIGURES outbox broker unreachable: {failures} failed publishes, 50 relayed after");
    served.terminate().await;
    env.cleanup().await;
}

/// Rows committed while a round is in progress wake the relay when that round
/// ends, however long it took: each is confirmed within a second of the end of
/// the round, with the fallback poll switched off (60 s) so that only the
/// notifications can wake it. The round is held open by a row that can never
/// be published (an empty order id): moving it into
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
    place(&env, &due_in("round-first", 1, 60_000), true).await;
    let first = tokio::time::timeout(Duration::from_secs(10), relayed.recv()).await;
    assert!(
        matches!(&first, Ok(Some(r)) if r.confirmed_at.is_some()),
        "{first:?}"
    );

    let mut blocker = env.store.client().await.expect("database");
    let blocker = blocker.transaction().await.expect("begin");
    let rejected = "order_expiry_outbox_rejected";
    let lock = format!("LOCK TABLE {rejected} IN SHARE MODE");
    blocker.batch_execute(&lock).await.expect("lock");
    place(&env, &[(String::new(), at_ms(60_000))], true).await;
    let watcher = env.store.client().await.expect("database");
    wait_for_lock_waiter(&watcher, &format!("relation = '{rejected}'::regclass")).await;
    // Committed while the round is in progress, each in its own transaction.
    let during = due_in("round-during", 5, 60_000);
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
