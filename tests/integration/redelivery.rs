//! RabbitMQ 4.0 drops a quorum-queue message returned more than 20 times (its
//! default `delivery-limit`). The exported definitions carry a policy that
//! lifts the limit on the due and parked queues: with it, a parked message
//! survives 25 looks that return it (as `status` and `parked list` do), on
//! both broker versions (`scripts/test` runs this file on 3.10 and 4.0).

use lapin::BasicProperties;
use lapin::options::{BasicGetOptions, BasicPublishOptions, BasicRejectOptions};
use order_expiry::topology::definitions_json;
use order_expiry_testkit::{World, rabbitmqctl, vhost};
use serde_json::Value;

const RETURNS: usize = 25;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_parked_message_survives_25_returns_under_the_exported_policy() {
    let env = World::new().await;
    let ladder = env.ladder();
    let exported: Value = serde_json::from_str(&definitions_json(
        &ladder,
        &env.settings.topology,
        &vhost(),
        None,
    ))
    .unwrap();
    let policy = &exported["policies"][0];
    let name = policy["name"].as_str().unwrap();
    rabbitmqctl(&[
        "-q",
        "set_policy",
        "-p",
        &vhost(),
        "--apply-to",
        policy["apply-to"].as_str().unwrap(),
        name,
        policy["pattern"].as_str().unwrap(),
        &policy["definition"].to_string(),
    ]);

    let channel = env.channel().await;
    channel
        .basic_publish(
            ladder.parked_exchange().as_str().into(),
            "".into(),
            BasicPublishOptions::default(),
            b"{parked}",
            BasicProperties::default(),
        )
        .await
        .unwrap()
        .await
        .unwrap();
    let queue = ladder.parked_queue();
    for look in 1..=RETURNS {
        let mut got = None;
        for _ in 0..50 {
            got = channel
                .basic_get(queue.as_str().into(), BasicGetOptions::default())
                .await
                .unwrap();
            if got.is_some() {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
        let got =
            got.unwrap_or_else(|| panic!("the parked message is gone after {} returns", look - 1));
        got.delivery
            .reject(BasicRejectOptions { requeue: true })
            .await
            .unwrap();
    }
    let _ = rabbitmqctl(&["-q", "clear_policy", "-p", &vhost(), name]);
    env.cleanup().await;
}
