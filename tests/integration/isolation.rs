//! One bad order never holds up the others: a cancel that fails permanently
//! for one order parks that one message with its SQLSTATE while the rest of its
//! batch is cancelled on time; a deleted parked queue is declared again.

use std::sync::Arc;
use std::time::Duration;

use chrono::Utc;
use order_expiry::{service::Outcome, service::PgOrderStore};
use order_expiry_testkit::{
    RunningConsumer, World, assert_on_time, at_ms, count, eventually, json, message, orders,
};

const ORDERS: usize = 200;
/// Bound on the lateness of the orders next to the bad one. Measured: the
/// split takes eight statements of a few ms each (see the FIGURES line).
const MAX_LATENESS: Duration = Duration::from_secs(1);

/// `ORDERS` unpaid orders due together (one batch of 200), one of them `bad`;
/// returns what the consumer did and the parked copy's reason.
async fn one_bad_order_among_many(env: &World, ids: &[String], bad: &str) -> String {
    let due = at_ms(1500);
    let orders: Vec<_> = ids.iter().map(|id| (id.clone(), due)).collect();
    env.create_orders(&orders).await;
    let due = env.order(bad).await.1;
    // A store of its own: the test may have changed the statements.
    let store = Arc::new(PgOrderStore::new(&env.settings).expect("store"));
    let mut consumer = RunningConsumer::start(&env.settings, store);
    let messages: Vec<_> = ids.iter().map(|id| message(id, due)).collect();
    env.publish_messages(&messages).await; // held until due: they come due at once
    // On a loaded machine the set-up may run past the due time; the bound is
    // on what the consumer does once every message is there and it consumes.
    let consuming = async || consumer.readiness.is_consuming();
    eventually(Duration::from_secs(20), "consuming", consuming).await;
    let ready = due.max(Utc::now());
    let handled = consumer.next_n(ORDERS, Duration::from_secs(20)).await;
    assert_eq!(count(&handled, Outcome::Parked), 1, "parked");
    let cancelled = count(&handled, Outcome::Cancelled);
    assert_eq!(cancelled, ORDERS - 1);
    consumer.expect_quiet(Duration::from_millis(300)).await;
    consumer.stop().await;

    let rows = env.orders().await.expect("orders");
    assert_eq!(rows[bad].status, "unpaid", "the bad order was not changed");
    let lateness = rows
        .iter()
        .filter(|(id, _)| id.as_str() != bad)
        .map(|(id, row)| {
            assert_eq!(row.status, "cancelled", "{id}");
            let cancelled_at = row.cancelled_at.expect("cancelled_at");
            assert!(cancelled_at >= row.pay_deadline, "{id} cancelled early");
            (cancelled_at - ready).to_std().unwrap_or_default()
        })
        .max()
        .expect("orders");
    eprintln!(
        "FIGURES one permanent failure among {ORDERS}: parked 1, cancelled {cancelled}, max lateness of the others {} ms \
         (set-up ran {} ms past the due time)",
        lateness.as_millis(),
        (ready - due).num_milliseconds()
    );
    assert!(lateness <= MAX_LATENESS, "others late by {lateness:?}");

    let parked = env.parked().await;
    assert_eq!(parked.len(), 1, "{parked:?}");
    assert!(String::from_utf8_lossy(&parked[0].body).contains(bad));
    assert_eq!(env.depth(&env.ladder().due_queue()).await, 0);
    parked[0].reason.clone()
}

/// A rule of the user's schema one order breaks: a CHECK on the table.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_check_violation_parks_that_order_and_the_rest_of_its_batch_is_cancelled_on_time() {
    let env = World::new().await;
    env.execute(
        "ALTER TABLE orders ADD CONSTRAINT never_cancel_disputed \
         CHECK (status <> 'cancelled' OR id NOT LIKE 'disputed-%')",
    )
    .await;
    let mut ids: Vec<String> = (0..ORDERS - 1).map(|i| format!("ok-{i}")).collect();
    ids.insert(57, "disputed-1".into());
    let reason = one_bad_order_among_many(&env, &ids, "disputed-1").await;
    assert!(
        reason.starts_with("cancel failed permanently: SQLSTATE 23514: ")
            && reason.contains("never_cancel_disputed"),
        "{reason}"
    );
    env.cleanup().await;
}

/// A custom `cancel_sql` for a schema whose ids are uuids (the ids are cast, as
/// a `uuid` column would make them) gets an id that is not one: SQLSTATE 22P02
/// on every try of every batch holding it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_id_the_custom_statement_cannot_cast_is_parked_with_22p02() {
    let mut env = World::new().await;
    env.settings.database.cancel_sql =
        "UPDATE orders SET status = 'cancelled', cancelled_at = now() \
        WHERE id = ANY($1::text[]::uuid[]::text[]) AND status = 'unpaid' RETURNING id"
            .into();
    let mut ids: Vec<String> = (0..ORDERS - 1)
        .map(|_| uuid::Uuid::new_v4().to_string())
        .collect();
    ids.insert(120, "o-1".into());
    let reason = one_bad_order_among_many(&env, &ids, "o-1").await;
    assert_eq!(
        reason,
        "cancel failed permanently: SQLSTATE 22P02: invalid input syntax for type uuid: \"o-1\""
    );
    env.cleanup().await;
}

/// An operator deletes `P.parked` to clear it; then poison arrives. The park
/// comes back unroutable, the consumer declares its queues again (counted),
/// parks it, and cancels go on meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_parked_queue_is_declared_again_and_the_poison_parked() {
    let env = World::new().await;
    let served = env.serve_ready(&[]).await;
    let parked_queue = env.ladder().parked_queue();
    env.delete_queue(&parked_queue).await;

    let due = at_ms(500);
    let orders = orders("pk", 20, |_| due);
    env.create_orders(&orders).await;
    let due = env.order("pk-0").await.1;
    env.publish_due(b"{poison", json()).await;
    let messages: Vec<_> = orders.iter().map(|(id, _)| message(id, due)).collect();
    env.publish_messages(&messages).await;

    let repairs = "order_expiry_repairs_total{what=\"parked\"}";
    eventually(
        Duration::from_secs(10),
        "parked after a repair",
        async || {
            served.metric(repairs).await >= 1.0
                && served.metric("order_expiry_parked_total").await >= 1.0
        },
    )
    .await;
    assert_eq!(
        env.depth(&parked_queue).await,
        1,
        "the poison is in P.parked"
    );
    let parked = env.get(&parked_queue).await.expect("the parked copy");
    assert_eq!(&parked.delivery.data[..], b"{poison");

    let rows = env.wait_cancelled(&orders, Duration::from_secs(10)).await;
    let lateness = assert_on_time(&orders, &rows, MAX_LATENESS);
    eprintln!(
        "FIGURES parked queue deleted: repairs {}, poison parked, 20 cancelled, max lateness {} ms",
        served.metric(repairs).await,
        lateness.max.as_millis()
    );
    drop(served);
    env.cleanup().await;
}
