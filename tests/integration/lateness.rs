//! Timeliness under a little load, through the benchmark's own code: a few hundred
//! mixed delays, never early, p99 well under a second. And a held message survives
//! the consumer being killed.

use std::process::Stdio;
use std::time::Duration;

use order_expiry::bench::lateness::{LatenessArgs, measure};
use order_expiry::{ExpiryMessage, Outcome};
use secrecy::ExposeSecret;

use crate::helpers::{TestEnv, at_ms};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_few_hundred_mixed_delays_are_never_early_and_p99_is_under_a_second() {
    let env = TestEnv::new().await;
    let args = LatenessArgs {
        rate: 60,
        duration: Duration::from_secs(5),
        min_delay: Duration::from_millis(500),
        max_delay: Duration::from_secs(12),
        pay_share: 0.2,
        no_naive: true,
        out_dir: std::env::temp_dir(),
        quiet: true,
    };
    let report = measure(&env.settings, &args).await.expect("benchmark runs");
    let ladder = &report.rows[0];
    eprintln!("{}", order_expiry::bench::lateness::table(&report));
    assert_eq!(ladder.orders, 300);
    assert!(ladder.cancelled > 150, "most orders are unpaid: {ladder:?}");
    assert_eq!(ladder.missed, 0, "every unpaid order is cancelled");
    assert_eq!(ladder.early, 0, "no order is cancelled early");
    assert!(ladder.p99_ms < 1000.0, "p99 {} ms", ladder.p99_ms);
    env.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killing_the_consumer_while_it_holds_a_message_loses_nothing() {
    let env = TestEnv::new().await;
    env.create_orders(&[("kill-1".into(), at_ms(3_000))]).await;
    let (_, due_at, _) = env.order("kill-1").await;

    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_order-expiry"))
        .arg("serve")
        .env(
            "ORDER_EXPIRY__AMQP__URL",
            env.settings.amqp.url.expose_secret(),
        )
        .env(
            "ORDER_EXPIRY__DATABASE__URL",
            env.settings.database.url.expose_secret(),
        )
        .env(
            "ORDER_EXPIRY__TOPOLOGY__PREFIX",
            &env.settings.topology.prefix,
        )
        .env(
            "ORDER_EXPIRY__TOPOLOGY__LEVELS",
            env.settings.topology.levels.to_string(),
        )
        .env("ORDER_EXPIRY__HTTP__LISTEN", "127.0.0.1:0")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("serve starts");
    env.publish_message(&ExpiryMessage::new("kill-1", due_at).unwrap())
        .await;
    // Wait until the child has taken it (no longer ready in the queue), then kill -9.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while env.depth(&env.ladder().due_queue()).await > 0 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "serve never took the message"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    child.start_kill().expect("SIGKILL");
    child.wait().await.expect("child reaped");
    assert_eq!(
        env.order("kill-1").await.0,
        "unpaid",
        "held, not processed early"
    );

    let mut consumer = env.start_consumer();
    let handled = consumer.next_n(1, Duration::from_secs(10)).await;
    assert_eq!(handled[0].outcome, Outcome::Cancelled);
    let (_, due_at, cancelled_at) = env.order("kill-1").await;
    assert!(
        cancelled_at.expect("cancelled") >= due_at,
        "cancelled before due_at"
    );
    consumer.stop().await;
    env.cleanup().await;
}
