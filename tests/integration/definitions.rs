//! `definitions.json` is the export of the default settings, and imported into
//! the real broker its two users can do their job and nothing more: the
//! publisher schedules but cannot consume, declare or delete; the consumer
//! re-declares its part, consumes, parks, sends a message through the ladder
//! again (an order not found yet), but cannot read, purge or delete the
//! ladder's queues, nor publish to the due exchange with any other key than a
//! zero delay's.
//! No AMQP connection here uses `guest`.

use std::sync::Arc;
use std::time::Duration;

use lapin::options::{BasicPublishOptions, ConfirmSelectOptions};
use lapin::types::FieldTable;
use lapin::{BasicProperties, Channel, Connection};
use order_expiry::{
    Scheduler, Settings, service::Outcome, service::Readiness, service::Relay,
    topology::CONSUMER_USER, topology::PUBLISHER_USER, topology::definitions_json,
};
use order_expiry_testkit::{World, amqp_port, at_ms, rabbitmqctl, succeeded};
use secrecy::SecretString;
use serde_json::Value;

fn repo_definitions() -> String {
    std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/definitions.json"))
        .expect("definitions.json at the repository root")
}

#[test]
fn definitions_json_matches_the_export_of_the_default_settings() {
    let settings = Settings::default();
    let expected = definitions_json(
        &settings.ladder().unwrap(),
        &settings.topology,
        &settings.topology.vhost,
        None,
    );
    assert!(
        repo_definitions() == expected,
        "definitions.json drifted from `order-expiry topology export`; regenerate it with\n  \
         cargo run -q -- topology export > definitions.json"
    );
}

/// With the event action, the export lets the consumer user write to the
/// event exchange, and nothing else changes.
#[test]
fn the_export_for_the_event_action_lets_the_consumer_write_its_exchange() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_order-expiry"))
        .args(["topology", "export"])
        .env("ORDER_EXPIRY__ACTION__KIND", "amqp")
        .env("ORDER_EXPIRY__ACTION__AMQP__EXCHANGE", "shop.events")
        .output()
        .expect("order-expiry runs");
    let exported: Value = serde_json::from_str(&succeeded("topology export", &out)).unwrap();
    let plain: Value = serde_json::from_str(&repo_definitions()).unwrap();
    let consumer_write = |defs: &Value| {
        defs["permissions"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["user"] == "order-expiry-consumer")
            .map(|p| p["write"].as_str().unwrap().to_owned())
            .unwrap()
    };
    let with_event = consumer_write(&exported);
    let without = consumer_write(&plain);
    let expected = format!(r"{}|shop\.events)$", without.strip_suffix(")$").unwrap());
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
    file: std::path::PathBuf,
}

impl Imported {
    fn new() -> Self {
        let id = &uuid::Uuid::new_v4().simple().to_string()[..8];
        let imported = Self {
            vhost: format!("order-expiry-import-{id}"),
            publisher: format!("{PUBLISHER_USER}-{id}"),
            consumer: format!("{CONSUMER_USER}-{id}"),
            file: std::env::temp_dir().join(format!("order-expiry-import-{id}.json")),
        };
        let mut defs: Value = serde_json::from_str(&repo_definitions()).unwrap();
        imported.retarget(&mut defs);
        std::fs::write(&imported.file, defs.to_string()).unwrap();
        rabbitmqctl(&["-q", "import_definitions", imported.file.to_str().unwrap()]);
        imported
    }

    fn retarget(&self, defs: &mut Value) {
        let rename = |name: &str| match name {
            PUBLISHER_USER => self.publisher.clone(),
            CONSUMER_USER => self.consumer.clone(),
            other => panic!("definitions.json names an unexpected user {other:?}"),
        };
        for user in defs["users"].as_array_mut().unwrap() {
            user["name"] = rename(user["name"].as_str().unwrap()).into();
        }
        for section in ["permissions", "topic_permissions"] {
            for p in defs[section].as_array_mut().unwrap() {
                p["user"] = rename(p["user"].as_str().unwrap()).into();
                p["vhost"] = self.vhost.as_str().into();
            }
        }
        for section in ["exchanges", "queues", "bindings", "policies"] {
            for object in defs[section].as_array_mut().unwrap() {
                object["vhost"] = self.vhost.as_str().into();
            }
        }
        defs["vhosts"] = serde_json::json!([{ "name": self.vhost }]);
    }

    fn url(&self, user: &str, password: &str) -> String {
        let port = amqp_port();
        format!("amqp://{user}:{password}@127.0.0.1:{port}/{}", self.vhost)
    }

    /// Ready messages in a queue, asked of rabbitmqctl (no AMQP user involved).
    fn ready(&self, queue: &str) -> u64 {
        let out = rabbitmqctl(&[
            "-q",
            "list_queues",
            "-p",
            &self.vhost,
            "--no-table-headers",
            "name",
            "messages_ready",
        ]);
        out.lines()
            .filter_map(|l| l.split_once('\t'))
            .find(|(name, _)| *name == queue)
            .and_then(|(_, n)| n.trim().parse().ok())
            .unwrap_or_else(|| panic!("queue {queue} not found in {out}"))
    }
}

impl Drop for Imported {
    fn drop(&mut self) {
        for args in [
            vec!["-q", "delete_vhost", &self.vhost],
            vec!["-q", "delete_user", &self.publisher],
            vec!["-q", "delete_user", &self.consumer],
        ] {
            let _ = std::process::Command::new("rabbitmqctl")
                .args(args)
                .output();
        }
        let _ = std::fs::remove_file(&self.file);
    }
}

async fn channel(url: &str) -> (Connection, Channel) {
    let connection = Connection::connect(url, Default::default())
        .await
        .expect("login with the password set by rabbitmqctl");
    let channel = connection.create_channel().await.expect("channel");
    (connection, channel)
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

/// An operation a user must not be allowed, on a queue.
#[derive(Debug, Clone, Copy)]
enum Op {
    Consume(&'static str),
    Get(&'static str),
    Delete(&'static str),
    Declare(&'static str),
}

impl Op {
    /// Tries it on a fresh channel of `connection`: the broker refuses.
    async fn assert_refused(self, user: &str, connection: &Connection) {
        let c = connection.create_channel().await.expect("a channel");
        let what = format!("{user} {self:?}");
        let result = match self {
            Op::Consume(queue) => c
                .basic_consume(
                    queue.into(),
                    "".into(),
                    Default::default(),
                    FieldTable::default(),
                )
                .await
                .map(|_| ()),
            Op::Get(queue) => c
                .basic_get(queue.into(), Default::default())
                .await
                .map(|_| ()),
            Op::Delete(queue) => c
                .queue_delete(queue.into(), Default::default())
                .await
                .map(|_| ()),
            Op::Declare(queue) => c
                .queue_declare(queue.into(), Default::default(), FieldTable::default())
                .await
                .map(|_| ()),
        };
        assert_refused(&what, result);
    }
}

/// Publishes `message` into the ladder as `url`'s user, as the scheduler would.
async fn scheduler_as(url: &str, message: &order_expiry::publisher::ExpiryMessage) {
    let mut settings = Settings::default();
    settings.amqp.url = SecretString::from(url.to_owned());
    let scheduler = Scheduler::from_settings(&settings).unwrap();
    scheduler
        .schedule(message.order_id.clone(), message.due_at)
        .await
        .expect("scheduled");
    scheduler.close().await;
}

/// Publishes with confirms on a fresh channel: the broker's answer to it.
async fn publish(
    connection: &Connection,
    exchange: &str,
    key: &str,
    body: &[u8],
) -> Result<(), lapin::Error> {
    let channel = connection.create_channel().await?;
    channel
        .confirm_select(ConfirmSelectOptions::default())
        .await?;
    let confirm = channel
        .basic_publish(
            exchange.into(),
            key.into(),
            BasicPublishOptions::default(),
            body,
            BasicProperties::default().with_content_type("application/json".into()),
        )
        .await?;
    match tokio::time::timeout(Duration::from_secs(10), confirm).await {
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
    assert!(
        Connection::connect(&imported.url(&imported.publisher, ""), Default::default())
            .await
            .is_err()
    );
    let [publisher_url, consumer_url] = [&imported.publisher, &imported.consumer].map(|user| {
        let password = uuid::Uuid::new_v4().simple().to_string();
        rabbitmqctl(&["-q", "change_password", user, &password]);
        imported.url(user, &password)
    });
    let permitted = rabbitmqctl(&["-q", "list_permissions", "-p", &imported.vhost]);
    assert!(!permitted.contains("guest"), "{permitted}");

    // The publisher schedules through the ladder and straight into the due exchange.
    // The default settings (prefix `orders`, as in the file), with a schema of
    // their own in the test database.
    let world = World::builder().declare(false).build().await.unwrap();
    let mut settings = Settings {
        database: world.settings.database.clone(),
        ..Settings::default()
    };
    settings.amqp.url = SecretString::from(publisher_url.clone());
    let store = Arc::clone(&world.store);
    let through_ladder = (String::from("lp-ladder"), at_ms(3_500));
    let past_due = (String::from("lp-past"), at_ms(-1_000));
    for (id, due_at) in [&through_ladder, &past_due] {
        store.create_unpaid(id, *due_at).await.unwrap();
    }
    let scheduler = Scheduler::from_settings(&settings).unwrap();
    let scheduled = scheduler
        .schedule(&through_ladder.0, through_ladder.1)
        .await
        .expect("the publisher schedules into the ladder");
    assert!(
        scheduled.route.exchange.starts_with("orders.ladder."),
        "{scheduled:?}"
    );
    let scheduled = scheduler
        .schedule(&past_due.0, past_due.1)
        .await
        .expect("the publisher schedules a past due time");
    assert_eq!(scheduled.route.exchange, "orders.due");
    scheduler.close().await;

    // ...and a malformed body, which the consumer must park.
    let (publisher, _) = channel(&publisher_url).await;
    publish(&publisher, "orders.due", "raw", b"{not json")
        .await
        .expect("the publisher may publish to the due exchange");

    // The publisher can neither consume, read, declare nor delete.
    for op in [
        Op::Consume("orders.due"),
        Op::Get("orders.due"),
        Op::Delete("orders.due"),
        Op::Delete("orders.ladder.00"),
        Op::Declare("orders.mine"),
    ] {
        op.assert_refused("publisher", &publisher).await;
    }
    let _ = publisher.close(200, "done".into()).await;

    // The real consumer, with the consumer user only: it re-declares its part,
    // cancels both orders, parks the malformed body, and sends the message of
    // an order not found yet through the ladder again (once, 2 s later: level 0).
    let missing = order_expiry_testkit::message("lp-missing", at_ms(-10));
    scheduler_as(&publisher_url, &missing).await;
    settings.amqp.url = SecretString::from(consumer_url.clone());
    settings.amqp.reconnect_max = Duration::from_millis(500);
    settings.consumer.unknown_rechecks = vec![Duration::from_secs(2)];
    let mut consumer = world.start_consumer_with(&settings);
    let handled = consumer.next_n(5, Duration::from_secs(15)).await;
    let mut got: Vec<_> = handled
        .into_iter()
        .map(|h| (h.order_id.map(String::from), h.outcome))
        .collect();
    got.sort_by_key(|(id, outcome)| (id.clone(), outcome.label()));
    assert_eq!(
        got,
        [
            (None, Outcome::Parked),
            (Some("lp-ladder".into()), Outcome::Cancelled),
            (Some("lp-missing".into()), Outcome::Unknown),
            (Some("lp-missing".into()), Outcome::UnknownRequeued),
            (Some("lp-past".into()), Outcome::Cancelled),
        ]
    );
    // Quorum queue counters reach `list_queues` a moment after the confirm.
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while imported.ready("orders.parked") != 1 && std::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(imported.ready("orders.parked"), 1);

    // The consumer publishes into the due exchange only with a zero delay's
    // key, and cannot touch the ladder's queues.
    let (consumer_connection, _) = channel(&consumer_url).await;
    for key in [
        "0.0.0",
        "",
        "#",
        "0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.1",
    ] {
        assert_refused(
            &format!("consumer publish to orders.due with key {key:?}"),
            publish(&consumer_connection, "orders.due", key, b"{}").await,
        );
    }
    assert_refused(
        "consumer publish to amq.topic",
        publish(&consumer_connection, "amq.topic", "x", b"{}").await,
    );
    for op in [Op::Get("orders.ladder.00"), Op::Delete("orders.ladder.00")] {
        op.assert_refused("consumer", &consumer_connection).await;
    }
    let _ = consumer_connection.close(200, "done".into()).await;

    consumer.stop().await;

    // serve's outbox relay, as the consumer user: a row due in 40 s enters the
    // ladder, one due already goes to the due exchange with the zero key.
    let db = store.client().await.unwrap();
    db.batch_execute(
        "INSERT INTO order_expiry_outbox (order_id, due_at) VALUES \
         ('lp-outbox-ladder', now() + interval '40 s'), ('lp-outbox-past', now() - interval '1 s')",
    )
    .await
    .unwrap();
    let mut relay = Relay::new(&settings, Arc::new(Readiness::default())).unwrap();
    let round = relay.relay_once().await.unwrap();
    assert_eq!((round.published, round.failed), (2, 0), "{round:?}");
    world.cleanup().await;
}
