//! `definitions.json` is the export of the default settings, and it works when
//! imported into a real broker.

use std::time::Duration;

use chrono::TimeDelta;
use lapin::Connection;
use lapin::options::BasicGetOptions;
use order_expiry::topology::{DEFAULT_VHOST, Topology};
use order_expiry::{ExpiryMessage, Scheduler, Settings};
use secrecy::SecretString;

use crate::helpers::{amqp_url, at_ms, rabbitmqctl};

fn repo_definitions() -> String {
    std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/definitions.json"))
        .expect("definitions.json at the repository root")
}

#[test]
fn definitions_json_matches_the_export_of_the_default_settings() {
    let settings = Settings::load_without_env(None).unwrap();
    let expected = Topology::describe(&settings.ladder().unwrap(), &settings.topology)
        .to_definitions_string(DEFAULT_VHOST);
    assert!(
        repo_definitions() == expected,
        "definitions.json drifted from `order-expiry topology export`; regenerate it with\n  \
         cargo run -q -- topology export > definitions.json"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn imported_definitions_carry_a_message_through_the_ladder() {
    // Import the file as it is, into a fresh vhost.
    let vhost = format!(
        "order-expiry-import-{}",
        &uuid::Uuid::new_v4().simple().to_string()[..8]
    );
    let mut definitions: serde_json::Value = serde_json::from_str(&repo_definitions()).unwrap();
    retarget_vhost(&mut definitions, &vhost);
    let file = std::env::temp_dir().join(format!("{vhost}.json"));
    std::fs::write(&file, definitions.to_string()).unwrap();
    rabbitmqctl(&["-q", "import_definitions", file.to_str().unwrap()]);
    rabbitmqctl(&[
        "-q",
        "set_permissions",
        "-p",
        &vhost,
        "guest",
        ".*",
        ".*",
        ".*",
    ]);

    let mut settings = Settings::load_without_env(None).unwrap();
    settings.amqp.url = SecretString::from(amqp_url(&vhost));
    let scheduler = Scheduler::from_settings(&settings).unwrap();
    let due_at = at_ms(2_300);
    let scheduled = scheduler.schedule("imported-1", due_at).await.unwrap();
    assert_eq!(scheduled.route.exchange, "orders.ladder.01");

    let connection = Connection::connect(&amqp_url(&vhost), Default::default())
        .await
        .unwrap();
    let channel = connection.create_channel().await.unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    let message = loop {
        if let Some(m) = channel
            .basic_get("orders.due".into(), BasicGetOptions { no_ack: true })
            .await
            .unwrap()
        {
            break m;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "nothing reached orders.due"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let arrived = chrono::Utc::now();
    let decoded = ExpiryMessage::decode(&message.delivery.data, None, 4096).unwrap();
    assert_eq!(decoded.order_id, "imported-1");
    // The ladder holds floor(2.3 s) = 2 s; the consumer holds the rest.
    assert!(
        arrived >= due_at - TimeDelta::seconds(1),
        "arrived more than 1 s early"
    );
    assert!(arrived < due_at + TimeDelta::seconds(2), "arrived late");

    scheduler.close().await;
    let _ = connection.close(200, "done".into()).await;
    rabbitmqctl(&["-q", "delete_vhost", &vhost]);
    let _ = std::fs::remove_file(file);
}

fn retarget_vhost(definitions: &mut serde_json::Value, vhost: &str) {
    for section in ["exchanges", "queues", "bindings"] {
        for object in definitions[section].as_array_mut().unwrap() {
            object["vhost"] = vhost.into();
        }
    }
    definitions["vhosts"] = serde_json::json!([{ "name": vhost }]);
}
