//! A quorum queue drops (or dead-letters) a message returned more times than
//! its `delivery-limit`. What counts as a return, and the default limit,
//! depend on the broker (`scripts/test` runs this file on 3.10 and 4.3, and
//! it passes on 4.0 by hand; each test reads the version the broker announces
//! and asserts that version's own behaviour):
//!
//! | | 3.10 | 4.0 | 4.3 |
//! | --- | --- | --- | --- |
//! | default limit | none | 20 | 20 |
//! | `basic.nack(requeue)` counts | yes | yes | no |
//! | `basic.reject(requeue)`, a closed channel count | yes | yes | yes |
//! | first delivery's headers | `x-delivery-count: 0` | none | none |
//! | headers after a return | `x-delivery-count` | `x-delivery-count` | `x-acquired-count` (every return), `x-delivery-count` (counted ones) |
//!
//! The consumer returns what it holds by closing its channel (SIGTERM, a lost
//! connection) and `status` / `parked list` look at messages the same way,
//! which 4.3 counts: the exported definitions carry a policy that lifts the
//! limit on the due and parked queues, and on 4.3 it is still needed (a
//! parked message without it is gone after 20 looks).

use lapin::options::{BasicGetOptions, BasicNackOptions, BasicRejectOptions};
use lapin::types::AMQPValue;
use lapin::{BasicProperties, Channel};
use order_expiry::topology::definitions_json;
use order_expiry_testkit::{World, broker_version, rabbitmqctl, table, vhost};
use serde_json::Value;

const RETURNS: usize = 25;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_parked_message_survives_25_returns_under_the_exported_policy() {
    let env = World::new().await;
    let ladder = env.ladder();
    let exported = definitions_json(&ladder, &env.settings.topology, &vhost(), None);
    let exported: Value = serde_json::from_str(&exported).unwrap();
    let policy = &exported["policies"][0];
    let [name, apply_to, pattern] =
        ["name", "apply-to", "pattern"].map(|k| policy[k].as_str().unwrap());
    let (vhost, definition) = (vhost(), policy["definition"].to_string());
    let set = ["-q", "set_policy", "-p", &vhost, "--apply-to", apply_to];
    rabbitmqctl(&[&set[..], &[name, pattern, &definition]].concat());

    let (channel, queue) = (env.channel().await, ladder.parked_queue());
    env.publish_to("", &queue, b"{parked}", persistent()).await;
    for look in 1..=RETURNS {
        let got = get(&channel, &queue).await;
        let got =
            got.unwrap_or_else(|| panic!("the parked message is gone after {} returns", look - 1));
        let requeue = BasicRejectOptions { requeue: true };
        assert!(got.delivery.reject(requeue).await.unwrap(), "rejected");
    }
    let _ = rabbitmqctl(&["-q", "clear_policy", "-p", &vhost, name]);
    env.cleanup().await;
}

/// Without the policy, on the broker's defaults, the parked queue loses the
/// message on 4.x after 20 returns by a closed channel (what `status` and
/// `parked list` do; 4.3 still counts those) and keeps it on 3.10 (no default
/// limit): why the exported policy is still shipped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_policy_4_x_drops_a_parked_message_after_20_closed_channels() {
    let env = World::new().await;
    let version = broker_version().await;
    let queue = env.ladder().parked_queue();
    env.publish_to("", &queue, b"{parked}", persistent()).await;
    let mut deliveries = 0;
    while deliveries < RETURNS {
        let look = env.open_channel().await;
        if get(&look, &queue).await.is_none() {
            break;
        }
        deliveries += 1;
        look.close(200, "looked".into()).await.unwrap();
    }
    if version.at_least(4, 0) {
        assert_eq!(
            deliveries, 21,
            "RabbitMQ {version}: the default limit is 20"
        );
    } else {
        assert_eq!(deliveries, RETURNS, "RabbitMQ {version}: no default limit");
    }
    env.cleanup().await;
}

/// How a message is given back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Return {
    Nack,
    Reject,
    CloseChannel,
}

/// With `x-delivery-limit: 2` a message survives two counted returns and is
/// gone at the third. 3.10 and 4.0 count every return; 4.3 counts `reject`
/// and a closed channel, not `nack` (rabbitmq-server#15387). The headers
/// each delivery carries differ too (table above).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_counts_towards_the_delivery_limit_on_each_broker() {
    let env = World::new().await;
    let version = broker_version().await;
    let on_4_0 = version.at_least(4, 0);
    let on_4_3 = version.at_least(4, 3);
    for how in [Return::Nack, Return::Reject, Return::CloseChannel] {
        let queue = format!("{}.limit-{how:?}", env.ladder().prefix());
        let arguments = table([
            ("x-queue-type", AMQPValue::LongString("quorum".into())),
            ("x-delivery-limit", AMQPValue::LongLongInt(2)),
        ]);
        env.declare_queue(&queue, arguments).await.unwrap();
        env.publish_to("", &queue, b"limited", persistent()).await;
        let mut headers = Vec::new();
        while headers.len() < 6 {
            let looking = env.open_channel().await;
            let Some(got) = get(&looking, &queue).await else {
                break;
            };
            headers.push(counts(&got.delivery.properties));
            let (requeue, multiple) = (true, false);
            let returned = match how {
                Return::Nack => {
                    got.delivery
                        .nack(BasicNackOptions { requeue, multiple })
                        .await
                }
                Return::Reject => got.delivery.reject(BasicRejectOptions { requeue }).await,
                Return::CloseChannel => Ok(true),
            };
            assert!(returned.unwrap(), "{how:?} was sent");
            looking.close(200, "returned".into()).await.unwrap();
        }
        let counted = how != Return::Nack || !on_4_3;
        let expected = if counted { 3 } else { 6 };
        assert_eq!(
            headers.len(),
            expected,
            "{how:?} on RabbitMQ {version}: deliveries {headers:?}"
        );
        let want: Vec<(Option<i64>, Option<i64>)> = (0..expected as i64)
            .map(|n| {
                let first = n == 0;
                let delivery_count = (counted && !(first && on_4_0)).then_some(n);
                let acquired_count = (on_4_3 && !first).then_some(n);
                (delivery_count, acquired_count)
            })
            .collect();
        assert_eq!(
            headers, want,
            "{how:?} on RabbitMQ {version}: (x-delivery-count, x-acquired-count) per delivery"
        );
        env.delete_queue(&queue).await;
    }
    env.cleanup().await;
}

fn persistent() -> BasicProperties {
    BasicProperties::default().with_delivery_mode(2)
}

/// One message from `queue`, unacked; waits up to 1 s for a returned one to
/// be ready again.
async fn get(channel: &Channel, queue: &str) -> Option<lapin::message::BasicGetMessage> {
    for _ in 0..50 {
        let got = channel.basic_get(queue.into(), BasicGetOptions::default());
        let got = got.await.unwrap();
        if got.is_some() {
            return got;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    None
}

/// `x-delivery-count` and `x-acquired-count` of a delivery, when present.
fn counts(properties: &BasicProperties) -> (Option<i64>, Option<i64>) {
    let headers = properties.headers().clone().unwrap_or_default();
    let count = |name: &str| match headers.inner().get(name) {
        Some(AMQPValue::LongLongInt(n)) => Some(*n),
        Some(AMQPValue::LongInt(n)) => Some(i64::from(*n)),
        Some(AMQPValue::LongUInt(n)) => Some(i64::from(*n)),
        Some(other) => panic!("{name}: {other:?}"),
        None => None,
    };
    (count("x-delivery-count"), count("x-acquired-count"))
}
