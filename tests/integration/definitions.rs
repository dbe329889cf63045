//! `definitions.json` is the export of the default settings, and imported into
//! the real broker its two users can do their job and nothing more: the
//! publisher schedules but cannot consume, declare or delete; the consumer
//! re-declares its part, consumes, parks, sends a message through the ladder
//! again (an order not found yet), but cannot read, purge or delete the
//! ladder's queues, nor publish to the due exchange with any other key than a
//! zero delay's. No AMQP connection here uses `guest`.

use std::sync::Arc;
use std::time::Duration;

use lapin::options::BasicPublishOptions;
use lapin::{BasicProperties, Connection};
use order_expiry::{
    Scheduler, Settings, service::Outcome, service::Readiness, service::Relay,
    topology::CONSUMER_USER, topology::PUBLISHER_USER, topology::definitions_json,
};
use order_expiry_testkit::{
    World, amqp_port, at_ms, broker, eventually, rabbitmqctl, run_cli, succeeded,
};
use serde_json::Value;

fn repo_definitions() -> Value {
    let text = crate::docs::repo_file("definitions.json");
    serde_json::from_str(&text).expect("definitions.json is JSON")
}

#[test]
fn definitions_json_matches_the_export_of_the_default_settings() {
    let settings = Settings::default();
    let topology = &settings.topology;
    let exported = definitions_json(&settings.ladder().unwrap(), topology, &topology.vhost, None);
    assert!(
        crate::docs::repo_file("definitions.json") == exported,
        "definitions.json drifted from `order-expiry topology export`; regenerate it with\n  \
         cargo run -q -- topology export > definitions.json"
    );
}

/// With the event action, the export lets the consumer user write to the
/// event exchange, and nothing else changes.
#[tokio::test]
async fn the_export_for_the_event_action_lets_the_consumer_write_its_exchange() {
    let event = [
        ("ORDER_EXPIRY__ACTION__KIND", "amqp"),
        ("ORDER_EXPIRY__ACTION__AMQP__EXCHANGE", "shop.events"),
    ];
    let out = run_cli(&Settings::default(), &["topology", "export"], &event).await;
    let exported: Value = serde_json::from_str(&succeeded("topology export", &out)).unwrap();
    let plain = repo_definitions();
    let consumer_write = |defs: &Value| {
        let permissions = defs["permissions"].as_array().unwrap().iter();
        let mut consumer = permissions.filter(|p| p["user"] == CONSUMER_USER);
        let write = &consumer.next().unwrap()["write"];
        write.as_str().unwrap().to_owned()
    };
    let without = consumer_write(&plain);
    let expected = format!(r"{}|shop\.events)$", without.strip_suffix(")$").unwrap());
    let with_event = consumer_write(&exported);
    assert_eq!(
        with_event, expected,
        "the consumer writes exactly the event exchange more"
    );
    assert_eq!(exported["queues"], plain["queues"]);
    assert_eq!(exported["topic_permissions"], plain["topic_permissions"]);
}

/// `definitions.json` imported under fresh vhost and user names; everything is
/// deleted again on drop, also when the test fails.
struct Imported {
    vhost: String,
    publisher: String,
    consumer: String,
    _definitions: broker::Imported,
}

impl Imported {
    fn new() -> Self {
        let id = &uuid::Uuid::new_v4().simple().to_string()[..8];
        let vhost = format!("order-expiry-import-{id}");
        let rename = |name: &str| match name {
            PUBLISHER_USER | CONSUMER_USER => format!("{name}-{id}"),
            other => panic!("definitions.json names an unexpected user {other:?}"),
        };
        let mut defs = repo_definitions();
        for user in defs["users"].as_array_mut().unwrap() {
            user["name"] = rename(user["name"].as_str().unwrap()).into();
        }
        // Every object that names a user or a vhost (permissions, queues...).
        for section in defs.as_object_mut().unwrap().values_mut() {
            for object in section.as_array_mut().into_iter().flatten() {
                if let Some(user) = object.get("user").and_then(Value::as_str) {
                    object["user"] = rename(user).into();
                }
                if object.get("vhost").is_some() {
                    object["vhost"] = vhost.as_str().into();
                }
            }
        }
        defs["vhosts"] = serde_json::json!([{ "name": vhost }]);
        Self {
            vhost,
            publisher: rename(PUBLISHER_USER),
            consumer: rename(CONSUMER_USER),
            _definitions: broker::Imported::new(&defs),
        }
    }

    fn url(&self, user: &str, password: &str) -> String {
        let port = amqp_port();
        format!("amqp://{user}:{password}@127.0.0.1:{port}/{}", self.vhost)
    }

    /// Ready messages in a queue, asked of rabbitmqctl (no AMQP user involved).
    fn ready(&self, queue: &str) -> u64 {
        let list = format!(
            "-q list_queues -p {} --no-table-headers name messages_ready",
            self.vhost
        );
        let out = rabbitmqctl(&list.split(' ').collect::<Vec<_>>());
        out.lines()
            .filter_map(|l| l.split_once('\t'))
            .find(|(name, _)| *name == queue)
            .and_then(|(_, n)| n.trim().parse().ok())
            .unwrap_or_else(|| panic!("queue {queue} not found in {out}"))
    }
}

async fn connect(url: &str) -> Connection {
    let connected = Connection::connect(url, Default::default()).await;
    connected.expect("login with the password set by rabbitmqctl")
}

fn assert_refused<T: std::fmt::Debug>(what: &str, result: Result<T, lapin::Error>) {
    match result {
        Ok(v) => panic!("{what}: allowed ({v:?}), expected ACCESS_REFUSED"),
        Err(e) => assert!(
            e.to_string().contains("ACCESS_REFUSED"),
            "{what}: failed, but not with ACCESS_REFUSED: {e}"
        ),
    }
}

/// Tries `op` (`consume`, `get`, `delete` or `declare`) on `queue` as `user`,
/// on a fresh channel of `connection`: the broker must refuse it.
async fn assert_refused_on(user: &str, connection: &Connection, op: &str, queue: &str) {
    let c = connection.create_channel().await.expect("a channel");
    let (q, opts, args) = (queue.into(), Default::default(), Default::default());
    let result = match op {
        "consume" => c.basic_consume(q, "".into(), opts, args).await.map(drop),
        "get" => c.basic_get(q, Default::default()).await.map(drop),
        "delete" => c.queue_delete(q, Default::default()).await.map(drop),
        _ => c.queue_declare(q, Default::default(), args).await.map(drop),
    };
    assert_refused(&format!("{user} {op} {queue}"), result);
}

/// Publishes with confirms on a fresh channel: the broker's answer to it.
async fn publish(
    connection: &Connection,
    exchange: &str,
    key: &str,
    body: &[u8],
) -> Result<(), lapin::Error> {
    let channel = connection.create_channel().await?;
    channel.confirm_select(Default::default()).await?;
    let options = BasicPublishOptions::default();
    let properties = BasicProperties::default().with_content_type("application/json".into());
    let publishing = channel.basic_publish(exchange.into(), key.into(), options, body, properties);
    match tokio::time::timeout(Duration::from_secs(10), publishing.await?).await {
        Err(_) => panic!("no answer to a publish to {exchange} within 10 s"),
        Ok(Ok(c)) if c.is_ack() => Ok(()),
        Ok(Ok(c)) => panic!("publish to {exchange}: {c:?}"),
        Ok(Err(e)) => Err(e),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn imported_users_have_least_privilege_and_suffice() {
    order_expiry::telemetry::init_tracing_for_tests();
    let imported = Imported::new();
    // No password in the file: both users exist but cannot log in yet.
    let no_password = imported.url(&imported.publisher, "");
    let refused = Connection::connect(&no_password, Default::default()).await;
    assert!(refused.is_err(), "logged in without a password");
    let [publisher_url, consumer_url] = [&imported.publisher, &imported.consumer].map(|user| {
        let password = uuid::Uuid::new_v4().simple().to_string();
        rabbitmqctl(&["-q", "change_password", user, &password]);
        imported.url(user, &password)
    });
    let permitted = rabbitmqctl(&["-q", "list_permissions", "-p", &imported.vhost]);
    assert!(!permitted.contains("guest"), "{permitted}");

    // The publisher schedules through the ladder and straight into the due
    // exchange, with the default settings (prefix `orders`, as in the file)
    // and a schema of their own in the test database.
    let world = World::builder().declare(false).build().await.unwrap();
    let mut settings = Settings::default();
    settings.database = world.settings.database.clone();
    settings.amqp.url = publisher_url.clone().into();
    let (through_ladder, past_due) = (at_ms(3_500), at_ms(-1_000));
    world
        .create_orders(&[
            ("lp-ladder".into(), through_ladder),
            ("lp-past".into(), past_due),
        ])
        .await;
    let scheduler = Scheduler::from_settings(&settings).unwrap();
    // The last is an order not found yet, which the consumer sends through the
    // ladder again.
    for (id, due_at, expected) in [
        ("lp-ladder", through_ladder, "orders.ladder."),
        ("lp-past", past_due, "orders.due"),
        ("lp-missing", at_ms(-10), "orders.due"),
    ] {
        let scheduled = scheduler.schedule(id, due_at).await.expect("scheduled");
        let exchange = scheduled
            .route
            .exchange
            .trim_end_matches(|c: char| c.is_ascii_digit());
        assert_eq!(exchange, expected, "{scheduled:?}");
    }
    scheduler.close().await;

    // ...and a malformed body, which the consumer must park.
    let publisher = connect(&publisher_url).await;
    publish(&publisher, "orders.due", "raw", b"{not json")
        .await
        .expect("the publisher may publish to the due exchange");

    // The publisher can neither consume, read, declare nor delete.
    for (op, queue) in [
        ("consume", "orders.due"),
        ("get", "orders.due"),
        ("delete", "orders.due"),
        ("delete", "orders.ladder.00"),
        ("declare", "orders.mine"),
    ] {
        assert_refused_on("publisher", &publisher, op, queue).await;
    }
    let _ = publisher.close(200, "done".into()).await;

    // The real consumer, with the consumer user only: it re-declares its part,
    // cancels both orders, parks the malformed body, and sends the missing
    // order's message through the ladder again (once, 2 s later: level 0).
    settings.amqp.url = consumer_url.clone().into();
    settings.amqp.reconnect_max = Duration::from_millis(500);
    settings.consumer.unknown_rechecks = vec![Duration::from_secs(2)];
    let mut consumer = world.start_consumer_with(&settings);
    let handled = consumer.next_n(5, Duration::from_secs(15)).await;
    let mut got: Vec<_> = handled
        .into_iter()
        .map(|h| (h.order_id.map(String::from), h.outcome))
        .collect();
    got.sort_by_key(|(id, outcome)| (id.clone(), outcome.label()));
    let order = |id: &str, outcome| (Some(id.to_owned()), outcome);
    assert_eq!(
        got,
        [
            (None, Outcome::Parked),
            order("lp-ladder", Outcome::Cancelled),
            order("lp-missing", Outcome::Unknown),
            order("lp-missing", Outcome::UnknownRequeued),
            order("lp-past", Outcome::Cancelled),
        ]
    );
    // Quorum queue counters reach `list_queues` a moment after the confirm.
    eventually(Duration::from_secs(5), "one parked", async || {
        imported.ready("orders.parked") == 1
    })
    .await;

    // The consumer publishes into the due exchange only with a zero delay's
    // key, and cannot touch the ladder's queues.
    let consumer_connection = connect(&consumer_url).await;
    let long_key = "0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.1";
    for (exchange, key) in [
        ("orders.due", "0.0.0"),
        ("orders.due", ""),
        ("orders.due", "#"),
        ("orders.due", long_key),
        ("amq.topic", "x"),
    ] {
        let what = format!("consumer publish to {exchange} with key {key:?}");
        assert_refused(
            &what,
            publish(&consumer_connection, exchange, key, b"{}").await,
        );
    }
    for op in ["get", "delete"] {
        assert_refused_on("consumer", &consumer_connection, op, "orders.ladder.00").await;
    }
    let _ = consumer_connection.close(200, "done".into()).await;
    consumer.stop().await;

    // serve's outbox relay, as the consumer user: a row due in 40 s enters the
    // ladder, one due already goes to the due exchange with the zero key.
    world
        .execute(
            "INSERT INTO order_expiry_outbox (order_id, due_at) VALUES \
             ('lp-outbox-ladder', now() + interval '40 s'), ('lp-outbox-past', now() - interval '1 s')",
        )
        .await;
    let mut relay = Relay::new(&settings, Arc::new(Readiness::default())).unwrap();
    let round = relay.relay_once().await.unwrap();
    assert_eq!((round.published, round.failed), (2, 0), "{round:?}");
    world.cleanup().await;
}
