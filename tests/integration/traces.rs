//! W3C trace context (issue 38): each order arrives due with its own
//! `traceparent`, alone or bundled, through the ladder, through the
//! consumer's re-sends, into the parked queue and back out with `parked
//! replay` (the same republishing as `ladder migrate`), and from the outbox's
//! optional columns through the relay.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use lapin::BasicProperties;
use lapin::message::Delivery;
use lapin::options::BasicGetOptions;
use lapin::types::{AMQPValue, FieldTable};
use order_expiry::publisher::{DueMessage, ExpiryMessage, TraceContext, TraceHeaders};
use order_expiry::service::{Outcome, Readiness, Relay};
use order_expiry_testkit::{World, at_ms, count, json, message, poll, schedule_bundled, table};

/// The context of trace number `n`.
fn context(n: usize) -> TraceContext {
    let traceparent = format!("00-{:032x}-00f067aa0ba902b7-01", 0x7ace_0000 + n);
    TraceContext::parse(&traceparent, Some("vendor=1")).expect("a valid context")
}

/// The header value of `name`, as text.
fn header(headers: &FieldTable, name: &str) -> Option<String> {
    match headers.inner().get(name) {
        Some(AMQPValue::LongString(s)) => Some(s.to_string()),
        _ => None,
    }
}

/// Each order a message carries, with the trace context the consumer reads
/// from its body and headers.
fn orders_of(delivery: &Delivery) -> Vec<ExpiryMessage> {
    let headers = delivery.properties.headers().clone().unwrap_or_default();
    let (traceparent, tracestate) = (
        header(&headers, "traceparent"),
        header(&headers, "tracestate"),
    );
    let trace = TraceHeaders {
        traceparent: traceparent.as_deref(),
        tracestate: tracestate.as_deref(),
    };
    let body = &delivery.data;
    let decoded = DueMessage::decode_traced(body, None, 1 << 20, trace).expect("a due message");
    decoded.messages().cloned().collect()
}

/// Takes every message of `queue`: each order in it, with its context.
async fn take_all(env: &World, queue: &str) -> Vec<ExpiryMessage> {
    let mut orders = Vec::new();
    while let Some(got) = env.get(queue).await {
        orders.extend(orders_of(&got.delivery));
    }
    orders
}

/// The orders of each message in `queue`, left there (fetched unacked,
/// returned when the channel closes).
async fn peek(env: &World, queue: &str) -> Vec<Vec<ExpiryMessage>> {
    let channel = env.open_channel().await;
    let mut messages = Vec::new();
    let get = || channel.basic_get(queue.into(), BasicGetOptions { no_ack: false });
    while let Some(got) = get().await.expect("basic.get") {
        messages.push(orders_of(&got.delivery));
    }
    let _ = channel.close(200, "requeue".into()).await;
    messages
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_order_keeps_its_own_trace_through_ladder_resends_parking_and_replay() {
    let env = World::new().await;
    let ladder = env.ladder();
    // A copy of everything that reaches the due exchange.
    let spy = format!("{}.trace-spy", ladder.due_queue());
    env.declare_queue(&spy, FieldTable::default())
        .await
        .expect("the spy queue");
    env.bind(&spy, &ladder.due_exchange(), "#").await;

    // Eight orders at once through a window of one confirm: they leave in
    // bundles, each with a trace of its own, one untraced. tr-3 and tr-5
    // have no row: the consumer sends them through the ladder again once.
    let ids: Vec<String> = (0..8).map(|i| format!("tr-{i}")).collect();
    let traces: HashMap<String, Option<TraceContext>> = ids
        .iter()
        .enumerate()
        .map(|(i, id)| (id.clone(), (i != 3).then(|| context(i))))
        .collect();
    let due = at_ms(2_500);
    let rows: Vec<_> = ids
        .iter()
        .filter(|id| !["tr-3", "tr-5"].contains(&id.as_str()))
        .map(|id| (id.clone(), due))
        .collect();
    env.create_orders(&rows).await;
    let scheduler = env.scheduler().with_max_in_flight(1);
    let messages = ids
        .iter()
        .map(|id| message(id, due).with_trace(traces[id].clone()));
    schedule_bundled(&scheduler, messages.collect()).await;

    // Parking: a bundle whose first order (the headers' context) and an
    // untraced one are far too early, beside one due now; and a v1 message
    // far too early.
    let early = message("tr-early", at_ms(45_000)).with_trace(context(20));
    let now = message("tr-now", at_ms(-10)).with_trace(context(21));
    env.create_orders(&[("tr-now".into(), now.due_at)]).await;
    let headers = |c: &TraceContext| {
        table([
            ("traceparent", AMQPValue::LongString(c.traceparent().into())),
            ("tracestate", AMQPValue::LongString("vendor=1".into())),
        ])
    };
    let entries = format!(
        r#"{{"v":2,"orders":[{{"order_id":"tr-early","due_at":"{}"}},{{"order_id":"tr-now","due_at":"{}","traceparent":"{}","tracestate":"vendor=1"}},{{"order_id":"tr-early-2","due_at":"{0}","traceparent":""}}]}}"#,
        early.due_at.to_rfc3339(),
        now.due_at.to_rfc3339(),
        context(21).traceparent(),
    );
    let with = |c: &TraceContext| -> BasicProperties { json().with_headers(headers(c)) };
    env.publish_due(entries.as_bytes(), with(&context(20)))
        .await;
    let alone = message("tr-alone", at_ms(45_000));
    env.publish_due(&alone.encode(), with(&context(22))).await;

    let mut settings = env.settings.clone();
    settings.consumer.unknown_rechecks = vec![Duration::from_millis(300)];
    let mut consumer = env.start_consumer_with(&settings);
    let handled = consumer
        .next_until(Duration::from_secs(20), |h| {
            count(h, Outcome::Cancelled) >= 7 && count(h, Outcome::Unknown) >= 2
        })
        .await;
    assert_eq!(count(&handled, Outcome::UnknownRequeued), 2, "{handled:?}");
    consumer.stop().await;

    // Every copy that reached the due exchange carried its order's own
    // context: from the publisher, and from the consumer's re-send.
    let arrived = take_all(&env, &spy).await;
    for id in &ids {
        let copies: Vec<_> = arrived
            .iter()
            .filter(|m| m.order_id.as_str() == id)
            .collect();
        let resent = copies.iter().filter(|m| m.not_before.is_some()).count();
        let expected = if ["tr-3", "tr-5"].contains(&id.as_str()) {
            1
        } else {
            0
        };
        assert_eq!((copies.len(), resent), (1 + expected, expected), "{id}");
        for copy in copies {
            assert_eq!(
                copy.trace,
                traces[id],
                "{id} (re-sent: {})",
                copy.not_before.is_some()
            );
        }
    }
    let tr_now = arrived.iter().find(|m| m.order_id.as_str() == "tr-now");
    assert_eq!(tr_now.and_then(|m| m.trace.clone()), Some(context(21)));

    // The parked copies: the v1 message with its headers; the bundle's two
    // early orders, each with its own context (the headers were one of
    // theirs, and must not become the untraced one's).
    let mut parked = peek(&env, &ladder.parked_queue()).await;
    parked.sort_by_key(Vec::len);
    let early_2 = message("tr-early-2", early.due_at);
    let bundle = vec![early.clone(), early_2.clone()];
    assert_eq!(parked, [vec![alone.with_trace(context(22))], bundle]);

    // Replayed, tr-early's bundle goes back into the ladder, each order with
    // its own context.
    let out = env
        .cli_ok(&["parked", "replay", "--order-id", "tr-early"])
        .await;
    let in_ladder = poll(Duration::from_secs(5), 100, || async {
        let mut found = Vec::new();
        for level in 0..ladder.levels() {
            found.extend(take_all(&env, &ladder.level_name(level)).await);
        }
        match found.is_empty() {
            true => Err(format!("tr-early is not in the ladder after {out}")),
            false => Ok(found),
        }
    })
    .await;
    assert_eq!(in_ladder, [early, early_2]);

    env.delete_queue(&spy).await;
    env.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_outbox_relays_each_rows_trace_context_and_a_table_without_the_columns() {
    let env = World::new().await;
    let scheduler = env.scheduler();
    let due = at_ms(-10);
    let mut client = env.store.client().await.expect("database");
    let tx = client.transaction().await.expect("begin");
    // The library, the plain SQL of another language, an untraced row and
    // one whose traceparent is nonsense (relayed untraced).
    let traced = message("ot-lib", due).with_trace(context(30));
    scheduler.schedule_message_in_tx(&tx, traced).await.unwrap();
    scheduler
        .schedule_in_tx(&tx, "ot-plain", due)
        .await
        .unwrap();
    let insert = "INSERT INTO order_expiry_outbox (order_id, due_at, traceparent, tracestate) \
                  VALUES ($1, $2, $3, $4)";
    let other = context(31);
    let sql_row = ("ot-sql", other.traceparent(), Some("vendor=1"));
    for (id, traceparent, tracestate) in [sql_row, ("ot-bad", "00-nonsense", None)] {
        let params: [&(dyn tokio_postgres::types::ToSql + Sync); 4] =
            [&id, &due, &traceparent, &tracestate];
        tx.execute(insert, &params).await.expect(insert);
    }
    tx.commit().await.expect("commit");

    let readiness = Arc::new(Readiness::default());
    let mut relay = Relay::new(&env.settings, Arc::clone(&readiness)).expect("relay");
    assert_eq!(relay.relay_once().await.expect("a round").published, 4);
    let mut arrived = take_all(&env, &env.ladder().due_queue()).await;
    arrived.sort_by(|a, b| a.order_id.as_str().cmp(b.order_id.as_str()));
    let traces: Vec<_> = arrived
        .iter()
        .map(|m| (m.order_id.as_str(), m.trace.clone()))
        .collect();
    let expected = [
        ("ot-bad", None),
        ("ot-lib", Some(context(30))),
        ("ot-plain", None),
        ("ot-sql", Some(context(31))),
    ];
    assert_eq!(traces, expected);

    // A database not migrated to 0003 yet: relayed, untraced.
    let drop = "ALTER TABLE order_expiry_outbox DROP COLUMN traceparent, DROP COLUMN tracestate";
    client.batch_execute(drop).await.expect(drop);
    let tx = client.transaction().await.expect("begin");
    scheduler.schedule_in_tx(&tx, "ot-old", due).await.unwrap();
    tx.commit().await.expect("commit");
    let mut relay = Relay::new(&env.settings, readiness).expect("relay");
    assert_eq!(relay.relay_once().await.expect("a round").published, 1);
    let old = take_all(&env, &env.ladder().due_queue()).await;
    assert_eq!(old, [message("ot-old", due)]);
    env.cleanup().await;
}
