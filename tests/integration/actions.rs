//! The actions beyond SQL against real servers: the HTTP action against a
//! local order service (every response class, a hanging endpoint, the headers
//! and the body it sends) and the event action against the real broker (acked
//! only once an `order.expired` event was confirmed routed to a queue).

use std::collections::HashMap;
use std::time::Duration;

use chrono::Utc;
use lapin::options::{
    BasicGetOptions, ExchangeDeclareOptions, ExchangeDeleteOptions, QueueDeclareOptions,
    QueueDeleteOptions,
};
use lapin::types::{AMQPValue, FieldTable};
use order_expiry::{Scheduler, service::Outcome, settings::ActionKind};
use order_expiry_testkit::{Endpoint, Reply, World, at_ms};
use secrecy::SecretString;

const TOKEN: &str = "action-token-3c1b";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_http_action_maps_every_response_class() {
    let env = World::new().await;
    let endpoint = Endpoint::start().await;
    let status = |code: u16, body: &str| Reply::Status(code, body.to_owned());
    let scripts: [(&str, Vec<Reply>, Outcome); 9] = [
        ("h-200", vec![status(200, "{}")], Outcome::Cancelled),
        ("h-204", vec![status(204, "")], Outcome::Cancelled),
        ("h-409", vec![status(409, "paid")], Outcome::NotUnpaid),
        ("h-404", vec![status(404, "")], Outcome::Unknown),
        (
            "h-503",
            vec![status(503, "busy"), status(200, "{}")],
            Outcome::Cancelled,
        ),
        (
            "h-429",
            vec![status(429, "slow down"), status(200, "{}")],
            Outcome::Cancelled,
        ),
        (
            "h-400",
            vec![status(400, "bad order\nstate")],
            Outcome::Parked,
        ),
        (
            "h-hang",
            vec![Reply::Hang(Duration::from_secs(5)), status(200, "{}")],
            Outcome::Cancelled,
        ),
        ("a/b ü", vec![status(200, "{}")], Outcome::Cancelled),
    ];
    for (id, replies, _) in &scripts {
        endpoint.script("expire", id, replies.clone());
    }
    let mut settings = env.settings.clone();
    settings.action.kind = ActionKind::Http;
    settings.action.http.base_url = format!("{}/", endpoint.base_url());
    settings.action.http.timeout = Duration::from_millis(500);
    settings.action.http.bearer_token = Some(SecretString::from(TOKEN));
    settings.consumer.unknown_rechecks = Vec::new();
    let mut consumer = env.start_consumer_with(&settings);

    let scheduler = Scheduler::from_settings(&env.settings).unwrap();
    let due_at = at_ms(-5);
    let mut message_ids = HashMap::new();
    for (id, _, _) in &scripts {
        let scheduled = scheduler.schedule(*id, due_at).await.unwrap();
        message_ids.insert(id.to_string(), (scheduled.message_id, scheduled.due_at));
    }
    let started = Utc::now();
    let handled = consumer
        .next_n(scripts.len(), Duration::from_secs(20))
        .await;

    let mut outcomes: HashMap<String, Outcome> = HashMap::new();
    for h in &handled {
        let id = h.order_id.as_ref().expect("every outcome names its order");
        assert!(
            outcomes.insert(id.to_string(), h.outcome).is_none(),
            "{h:?}"
        );
    }
    for (id, _, expected) in &scripts {
        assert_eq!(outcomes.get(*id), Some(expected), "{id}: {handled:?}");
    }

    // The hanging request did not hold up the others: they were handled
    // within its timeout.
    let h200 = handled
        .iter()
        .find(|h| h.order_id.as_deref() == Some("h-200"))
        .unwrap();
    assert!(
        h200.at - started < chrono::TimeDelta::milliseconds(500),
        "{h200:?}"
    );
    // ... and it was tried again after its timeout, then went through.
    let hang = endpoint.requests_for("expire", "h-hang");
    assert!(hang.len() >= 2, "{hang:?}");
    // The endpoint stamps a request when it reads it, which on a loaded
    // machine can trail the send by a few hundred ms (scripts/test of
    // 2026-12-02 failed a bound of the full 500 ms once): half the timeout
    // still tells a retry after the timeout from one right away.
    let gap = hang[1].at - hang[0].at;
    assert!(
        gap >= chrono::TimeDelta::milliseconds(250),
        "retried {} ms after the hanging request (timeout 500 ms)",
        gap.num_milliseconds()
    );
    // 5xx and 429 were retried once, with the same idempotency key.
    for id in ["h-503", "h-429"] {
        let requests = endpoint.requests_for("expire", id);
        assert_eq!(requests.len(), 2, "{id}");
        assert_eq!(
            requests[0].headers["idempotency-key"],
            requests[1].headers["idempotency-key"]
        );
    }

    // What every request carried.
    for (id, _, _) in &scripts {
        let request = &endpoint.requests_for("expire", id)[0];
        let (message_id, due_at) = &message_ids[*id];
        let due = due_at.to_rfc3339_opts(chrono::SecondsFormat::Millis, true);
        assert_eq!(request.method, "POST");
        assert_eq!(request.headers["authorization"], format!("Bearer {TOKEN}"));
        assert_eq!(request.headers["content-type"], "application/json");
        let encoded: String = percent_encode(id);
        assert_eq!(
            request.headers["idempotency-key"],
            format!("order-expiry:{encoded}:{due}")
        );
        let body: serde_json::Value = serde_json::from_str(&request.body).unwrap();
        assert_eq!(
            body,
            serde_json::json!({"order_id": id, "due_at": due, "message_id": message_id})
        );
    }

    // The 400 is parked with its status and the start of its body.
    let parked = env.get(&env.ladder().parked_queue()).await.expect("parked");
    let headers = parked.properties.headers().clone().unwrap_or_default();
    let reason = match headers.inner().get("x-parked-reason") {
        Some(AMQPValue::LongString(s)) => s.to_string(),
        other => panic!("no reason: {other:?}"),
    };
    assert_eq!(reason, "expire endpoint answered 400: bad order state");
    assert!(String::from_utf8_lossy(&parked.data).contains("h-400"));

    consumer.expect_quiet(Duration::from_secs(1)).await;
    consumer.stop().await;
    assert_eq!(env.depth(&env.ladder().due_queue()).await, 0);
    scheduler.close().await;
    env.cleanup().await;
}

fn percent_encode(id: &str) -> String {
    id.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_order_service_pauses_the_batch_and_loses_nothing() {
    let env = World::new().await;
    // Nothing listens on this port yet.
    let port = order_expiry_testkit::free_port();
    let mut settings = env.settings.clone();
    settings.action.kind = ActionKind::Http;
    settings.action.http.base_url = format!("http://127.0.0.1:{port}");
    settings.action.http.timeout = Duration::from_millis(500);
    let mut consumer = env.start_consumer_with(&settings);
    let scheduler = Scheduler::from_settings(&env.settings).unwrap();
    for id in ["u-1", "u-2", "u-3"] {
        scheduler.schedule(id, at_ms(-5)).await.unwrap();
    }
    consumer.expect_quiet(Duration::from_secs(2)).await;
    // The order service comes up on that port: everything goes through.
    let endpoint = Endpoint::start_on(port).await;
    let handled = consumer.next_n(3, Duration::from_secs(15)).await;
    assert!(
        handled.iter().all(|h| h.outcome == Outcome::Cancelled),
        "{handled:?}"
    );
    assert_eq!(endpoint.requests().len(), 3);
    consumer.stop().await;
    scheduler.close().await;
    env.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_event_action_acks_only_after_a_routed_confirmed_event() {
    let env = World::new().await;
    let exchange = format!("{}.events", env.settings.topology.prefix);
    let queue = format!("{}.expired-events", env.settings.topology.prefix);
    let channel = env.channel().await;
    channel
        .exchange_declare(
            exchange.as_str().into(),
            lapin::ExchangeKind::Topic,
            ExchangeDeclareOptions {
                durable: true,
                ..Default::default()
            },
            FieldTable::default(),
        )
        .await
        .unwrap();
    let mut settings = env.settings.clone();
    settings.action.kind = ActionKind::Amqp;
    settings.action.amqp.exchange = exchange.clone();
    let mut consumer = env.start_consumer_with(&settings);
    let scheduler = Scheduler::from_settings(&env.settings).unwrap();
    let mut scheduled = HashMap::new();
    for id in ["ev-1", "ev-2"] {
        scheduled.insert(id, scheduler.schedule(id, at_ms(-5)).await.unwrap());
    }

    // No queue is bound: every event is unroutable, and no order counts as
    // expired. Each is retried held a few times, then goes back through the
    // ladder with its backoff (its message acked only once the broker has
    // its next one).
    let meanwhile = consumer.during(Duration::from_secs(2)).await;
    assert!(
        meanwhile
            .iter()
            .all(|h| h.outcome == Outcome::RetryRequeued),
        "{meanwhile:?}"
    );

    // A subscriber binds its queue: both go through, each acked after its event.
    channel
        .queue_declare(
            queue.as_str().into(),
            QueueDeclareOptions {
                durable: true,
                ..Default::default()
            },
            FieldTable::default(),
        )
        .await
        .unwrap();
    env.bind(&queue, &exchange, "order.expired").await;
    let handled = consumer.next_n(2, Duration::from_secs(15)).await;
    assert!(
        handled.iter().all(|h| h.outcome == Outcome::Cancelled),
        "{handled:?}"
    );
    consumer.expect_quiet(Duration::from_secs(1)).await;

    // Exactly one event per order, as documented.
    let mut events = Vec::new();
    while let Some(m) = channel
        .basic_get(queue.as_str().into(), BasicGetOptions { no_ack: true })
        .await
        .unwrap()
    {
        events.push(m);
    }
    assert_eq!(events.len(), 2, "one event per order");
    for event in events {
        let body: serde_json::Value = serde_json::from_slice(&event.data).unwrap();
        let id = body["order_id"].as_str().unwrap();
        let s = &scheduled[id];
        let due = s
            .due_at
            .to_rfc3339_opts(chrono::SecondsFormat::Millis, true);
        assert_eq!(body["due_at"], due.as_str());
        assert_eq!(body["message_id"], s.message_id.as_str());
        assert!(body["expired_at"].as_str().unwrap() >= due.as_str());
        let p = &event.properties;
        assert_eq!(p.kind().as_ref().unwrap().as_str(), "order.expired");
        assert_eq!(
            p.content_type().as_ref().unwrap().as_str(),
            "application/json"
        );
        assert_eq!(*p.delivery_mode(), Some(2));
        assert_eq!(
            p.message_id().as_ref().unwrap().as_str(),
            format!("order-expiry:{id}:{due}")
        );
    }
    // Nothing in the orders table changed: the action does not use it.
    assert!(env.orders().await.unwrap().is_empty());

    consumer.stop().await;
    scheduler.close().await;
    let _ = channel
        .queue_delete(queue.as_str().into(), QueueDeleteOptions::default())
        .await;
    let _ = channel
        .exchange_delete(exchange.as_str().into(), ExchangeDeleteOptions::default())
        .await;
    env.cleanup().await;
}
