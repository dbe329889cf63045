//! Several brokers in `amqp.url` (comma-separated: the nodes of a cluster) and
//! queues declared with other placement arguments, on the one test broker: a
//! list whose first URL is dead still schedules and consumes, a list of dead
//! brokers names each without its password, and `topology apply` (and the
//! consumer) keep a queue declared before `topology.replicas`. The cluster
//! itself (node loss, leaders, competing consumers) is `tests/cluster`.

use std::time::Duration;

use lapin::types::{AMQPValue, FieldTable};
use order_expiry::{Scheduler, service::Outcome};
use order_expiry_testkit::{World, amqp_url, at_ms, free_port, run_cli, table};
use secrecy::SecretString;

/// A URL on this host where nothing listens, with `password`.
fn dead_url(password: &str) -> String {
    format!("amqp://guest:{password}@127.0.0.1:{}/%2f", free_port())
}

/// The arguments of a quorum queue declared without placement.
fn quorum() -> FieldTable {
    table([("x-queue-type", AMQPValue::LongString("quorum".into()))])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_list_with_a_dead_broker_first_schedules_and_consumes() {
    let env = World::new().await;
    let mut settings = env.settings.clone();
    let list = format!("{}, {}", dead_url("pw-dead"), amqp_url());
    settings.amqp.url = SecretString::from(list);
    settings.amqp.timeout = Duration::from_secs(5);
    let scheduler = Scheduler::from_settings(&settings).unwrap();
    let mut consumer = env.start_consumer_with(&settings);
    let ids = ["f-1", "f-2", "f-3"];
    env.create_orders(&ids.map(|id| (id.to_owned(), at_ms(500))))
        .await;
    for id in ids {
        // Each call may start at either URL (connects rotate through the list).
        scheduler.schedule(id, at_ms(500)).await.unwrap();
        scheduler.close().await;
    }
    let twenty_s = Duration::from_secs(20);
    consumer.next_all(3, twenty_s, Outcome::Cancelled).await;
    consumer.stop().await;
    env.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_list_of_dead_brokers_names_each_without_its_password() {
    let env = World::new().await;
    let mut settings = env.settings.clone();
    let (one, two) = (dead_url("pw-one"), dead_url("pw-two"));
    settings.amqp.url = SecretString::from(format!("{one},{two}"));
    let scheduler = Scheduler::from_settings(&settings).unwrap();
    let error = scheduler.schedule("nowhere", at_ms(1000)).await;
    let error = error.unwrap_err();
    let text = error.to_string();
    assert!(text.contains("none of the 2 brokers"), "{text}");
    for url in [&one, &two] {
        let redacted = url
            .replace(":pw-one@", ":***@")
            .replace(":pw-two@", ":***@");
        assert!(text.contains(&redacted), "{text}");
    }
    assert!(!text.contains("pw-"), "{text}");
    assert!(!format!("{error:?}").contains("pw-"));
    // The binary says the same, without the passwords.
    let schedule = ["schedule", "--order-id", "a", "--delay", "5s"];
    let timeout = [("ORDER_EXPIRY__AMQP__TIMEOUT_MS", "2000")];
    let out = run_cli(&settings, &schedule, &timeout).await;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("none of the 2 brokers"), "{stderr}");
    assert!(!stderr.contains("pw-"), "{stderr}");
    env.cleanup().await;
}

/// A due queue declared before `topology.replicas` (no placement arguments):
/// the broker refuses a re-declare with them (PRECONDITION_FAILED, RabbitMQ
/// 3.10 and 4.0 alike), so `topology apply` keeps it, says so, and declares the
/// rest; the consumer starts on it. Any other difference stays an error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn apply_keeps_a_queue_declared_without_placement_and_says_so() {
    let env = World::builder().kind("placement").declare(false).build();
    let env = env.await.unwrap();
    let due = env.ladder().due_queue();
    env.declare_queue(&due, quorum()).await.unwrap();
    let apply = async || env.cli(&["topology", "apply"], &[]).await;
    let out = apply().await;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    assert!(
        stderr.contains(&format!("warning: {due}: queue kept")),
        "{stderr}"
    );
    assert!(stderr.contains("x-quorum-initial-group-size"), "{stderr}");
    assert!(stderr.contains("rabbitmq-queues grow"), "{stderr}");
    // Every other queue got the placement: a second apply keeps only the due queue.
    let again = apply().await;
    let stderr = String::from_utf8_lossy(&again.stderr);
    assert_eq!(stderr.matches("warning:").count(), 1, "{stderr}");
    env.declare(&env.settings).await.unwrap();

    // The consumer declares its part on every connect, with the same leniency.
    let mut consumer = env.start_consumer();
    env.place(&[("kept-1".to_owned(), at_ms(300))]).await;
    let fifteen_s = Duration::from_secs(15);
    consumer.next_all(1, fifteen_s, Outcome::Cancelled).await;
    consumer.stop().await;

    // A level queue with another TTL is still refused: that one would break the ladder.
    let level = env.ladder().level_name(1);
    env.delete_queue(&level).await;
    let mut wrong = quorum();
    wrong.insert("x-message-ttl".into(), AMQPValue::LongLongInt(1234));
    env.declare_queue(&level, wrong).await.unwrap();
    let out = apply().await;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains(&level), "{stderr}");
    env.cleanup().await;
}
