//! The actions beyond SQL against real servers: the HTTP action against a
//! local order service (every response class, a hanging endpoint, the headers
//! and the body it sends) and the event action against the real broker (acked
//! only once an `order.expired` event was confirmed routed to a queue).

use std::collections::HashMap;
use std::time::Duration;

use chrono::{SecondsFormat, TimeDelta, Utc};
use order_expiry::{Settings, service::Outcome, settings::ActionKind};
use order_expiry_testkit::{Endpoint, Reply, World, at_ms};
use secrecy::SecretString;

const TOKEN: &str = "action-token-3c1b";

/// The world's settings with the HTTP action at `base_url`, timing out at 500 ms.
fn http_action(env: &World, base_url: String) -> Settings {
    let mut settings = env.settings.clone();
    settings.action.kind = ActionKind::Http;
    settings.action.http.base_url = base_url;
    settings.action.http.timeout = Duration::from_millis(500);
    settings
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_http_action_maps_every_response_class() {
    let env = World::new().await;
    let endpoint = Endpoint::start().await;
    let status = |code: u16, body: &str| Reply::Status(code, body.to_owned());
    let ok = || status(200, "{}");
    use Outcome::{Cancelled, NotUnpaid, Parked, Unknown};
    let hang = Reply::Hang(Duration::from_secs(5));
    let scripts: [(&str, Vec<Reply>, Outcome); 9] = [
        ("h-200", vec![ok()], Cancelled),
        ("h-204", vec![status(204, "")], Cancelled),
        ("h-409", vec![status(409, "paid")], NotUnpaid),
        ("h-404", vec![status(404, "")], Unknown),
        ("h-503", vec![status(503, "busy"), ok()], Cancelled),
        ("h-429", vec![status(429, "slow down"), ok()], Cancelled),
        ("h-400", vec![status(400, "bad order\nstate")], Parked),
        ("h-hang", vec![hang, ok()], Cancelled),
        ("a/b ü", vec![ok()], Cancelled),
    ];
    for (id, replies, _) in &scripts {
        endpoint.script("expire", id, replies.clone());
    }
    let mut settings = http_action(&env, format!("{}/", endpoint.base_url()));
    settings.action.http.bearer_token = Some(SecretString::from(TOKEN));
    settings.consumer.unknown_rechecks = Vec::new();
    let mut consumer = env.start_consumer_with(&settings);

    let scheduler = env.scheduler();
    let mut scheduled = HashMap::new();
    for (id, _, _) in &scripts {
        scheduled.insert(*id, scheduler.schedule(*id, at_ms(-5)).await.unwrap());
    }
    let started = Utc::now();
    let handled = consumer
        .next_n(scripts.len(), Duration::from_secs(20))
        .await;

    let mut outcomes = HashMap::new();
    for h in &handled {
        let id = h.order_id.as_ref().expect("every outcome names its order");
        let first = outcomes.insert(id.to_string(), h.outcome).is_none();
        assert!(first, "{h:?}");
    }
    for (id, _, expected) in &scripts {
        assert_eq!(outcomes.get(*id), Some(expected), "{id}: {handled:?}");
    }

    // The hanging request did not hold up the others: they were handled
    // within its timeout.
    let h200 = handled
        .iter()
        .find(|h| h.order_id.as_deref() == Some("h-200"));
    let h200 = h200.expect("h-200 handled");
    assert!(h200.at - started < TimeDelta::milliseconds(500), "{h200:?}");
    // ... and it was tried again after its timeout, then went through. The
    // endpoint stamps a request when it reads it, which on a loaded machine
    // can trail the send: half the timeout still tells a retry after the
    // timeout from one right away.
    let hang = endpoint.requests_for("expire", "h-hang");
    assert!(hang.len() >= 2, "{hang:?}");
    let gap = (hang[1].at - hang[0].at).num_milliseconds();
    assert!(gap >= 250, "retried {gap} ms after a 500 ms timeout");
    // 5xx and 429 were retried once, with the same idempotency key.
    for id in ["h-503", "h-429"] {
        let requests = endpoint.requests_for("expire", id);
        assert_eq!(requests.len(), 2, "{id}");
        let key = |i: usize| &requests[i].headers["idempotency-key"];
        assert_eq!(key(0), key(1));
    }

    // What every request carried.
    for (id, _, _) in &scripts {
        let request = &endpoint.requests_for("expire", id)[0];
        let due = millis(scheduled[id].due_at);
        let headers = &request.headers;
        assert_eq!(request.method, "POST");
        assert_eq!(headers["authorization"], format!("Bearer {TOKEN}"));
        assert_eq!(headers["content-type"], "application/json");
        let key = format!("order-expiry:{}:{due}", percent_encode(id));
        assert_eq!(headers["idempotency-key"], key);
        let body: serde_json::Value = serde_json::from_str(&request.body).unwrap();
        let message_id = &scheduled[id].message_id;
        let expected = serde_json::json!({"order_id": id, "due_at": due, "message_id": message_id});
        assert_eq!(body, expected);
    }

    // The 400 is parked with its status and the start of its body.
    let parked = &env.parked().await[0];
    let reason = "expire endpoint answered 400: bad order state";
    assert_eq!(parked.reason, reason);
    assert!(String::from_utf8_lossy(&parked.body).contains("h-400"));

    consumer.expect_quiet(Duration::from_secs(1)).await;
    consumer.stop().await;
    assert_eq!(env.depth(&env.ladder().due_queue()).await, 0);
    scheduler.close().await;
    env.cleanup().await;
}

/// `at` as the messages carry it.
fn millis(at: chrono::DateTime<Utc>) -> String {
    at.to_rfc3339_opts(SecondsFormat::Millis, true)
}

/// `id` with every byte but RFC 3986's unreserved characters percent-encoded.
fn percent_encode(id: &str) -> String {
    let unreserved = |b: u8| b.is_ascii_alphanumeric() || b"-._~".contains(&b);
    let encode = |b: u8| match unreserved(b) {
        true => char::from(b).to_string(),
        false => format!("%{b:02X}"),
    };
    id.bytes().map(encode).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_order_service_pauses_the_batch_and_loses_nothing() {
    let env = World::new().await;
    // Nothing listens on this port yet.
    let port = order_expiry_testkit::free_port();
    let settings = http_action(&env, format!("http://127.0.0.1:{port}"));
    let mut consumer = env.start_consumer_with(&settings);
    let scheduler = env.scheduler();
    for id in ["u-1", "u-2", "u-3"] {
        scheduler.schedule(id, at_ms(-5)).await.unwrap();
    }
    consumer.expect_quiet(Duration::from_secs(2)).await;
    // The order service comes up on that port: everything goes through.
    let endpoint = Endpoint::start_on(port).await;
    let fifteen_s = Duration::from_secs(15);
    consumer.next_all(3, fifteen_s, Outcome::Cancelled).await;
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
    env.declare_exchange(&exchange).await;
    let mut settings = env.settings.clone();
    settings.action.kind = ActionKind::Amqp;
    settings.action.amqp.exchange = exchange.clone();
    let mut consumer = env.start_consumer_with(&settings);
    let scheduler = env.scheduler();
    let mut scheduled = HashMap::new();
    for id in ["ev-1", "ev-2"] {
        scheduled.insert(id, scheduler.schedule(id, at_ms(-5)).await.unwrap());
    }

    // No queue is bound: every event is unroutable, and no order counts as
    // expired. Each is retried held a few times, then goes back through the
    // ladder with its backoff (its message acked only once the broker has
    // its next one).
    consumer
        .only_during(Duration::from_secs(2), Outcome::RetryRequeued)
        .await;

    // A subscriber binds its queue: both go through, each acked after its event.
    env.declare_queue(&queue, Default::default()).await.unwrap();
    env.bind(&queue, &exchange, "order.expired").await;
    let fifteen_s = Duration::from_secs(15);
    consumer.next_all(2, fifteen_s, Outcome::Cancelled).await;
    consumer.expect_quiet(Duration::from_secs(1)).await;

    // Exactly one event per order, as documented.
    let mut events = Vec::new();
    while let Some(m) = env.get(&queue).await {
        events.push(m);
    }
    assert_eq!(events.len(), 2, "one event per order");
    for event in events {
        let body: serde_json::Value = serde_json::from_slice(&event.data).unwrap();
        let id = body["order_id"].as_str().unwrap();
        let due = millis(scheduled[id].due_at);
        assert_eq!(body["due_at"], due.as_str());
        assert_eq!(body["message_id"], scheduled[id].message_id.as_str());
        assert!(body["expired_at"].as_str().unwrap() >= due.as_str());
        let p = &event.properties;
        let text = |s: &Option<lapin::types::ShortString>| s.as_ref().unwrap().to_string();
        assert_eq!(text(p.kind()), "order.expired");
        assert_eq!(text(p.content_type()), "application/json");
        assert_eq!(*p.delivery_mode(), Some(2));
        assert_eq!(text(p.message_id()), format!("order-expiry:{id}:{due}"));
    }
    // Nothing in the orders table changed: the action does not use it.
    assert!(env.orders().await.unwrap().is_empty());

    consumer.stop().await;
    scheduler.close().await;
    env.delete_queue(&queue).await;
    env.delete_exchange(&exchange).await;
    env.cleanup().await;
}
