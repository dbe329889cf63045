//! The `order-expiry` binary: `schedule --stdin` confirms every line or names the
//! bad one; `topology export` prints definitions.

use std::process::Stdio;

use order_expiry_testkit::{World, amqp_url, succeeded};
use tokio::io::AsyncWriteExt;
use tokio::process::Command;

pub(crate) fn binary(env: &World) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_order-expiry"));
    cmd.env("ORDER_EXPIRY__AMQP__URL", amqp_url())
        .env(
            "ORDER_EXPIRY__TOPOLOGY__PREFIX",
            &env.settings.topology.prefix,
        )
        .env(
            "ORDER_EXPIRY__TOPOLOGY__LEVELS",
            env.settings.topology.levels.to_string(),
        )
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    cmd
}

async fn run_with_stdin(mut cmd: Command, input: &str) -> std::process::Output {
    let mut child = cmd.spawn().expect("binary runs");
    let mut stdin = child.stdin.take().unwrap();
    stdin.write_all(input.as_bytes()).await.unwrap();
    drop(stdin);
    child.wait_with_output().await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn schedule_stdin_confirms_every_line() {
    let env = World::new().await;
    let mut cmd = binary(&env);
    cmd.args(["schedule", "--stdin"]);
    let input = "{\"order_id\": \"s-1\", \"delay_ms\": 0}\n\n{\"order_id\": \"s-2\", \"due_at\": \"2020-01-01T00:00:00Z\"}\n";
    let out = run_with_stdin(cmd, input).await;
    succeeded("order-expiry", &out);
    // Both orders, in one bundle or two messages.
    let mut ids = Vec::new();
    while let Some(message) = env.get(&env.ladder().due_queue()).await {
        ids.extend(order_expiry_testkit::order_ids(&message.data));
    }
    ids.sort();
    assert_eq!(ids, ["s-1", "s-2"]);
    env.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn schedule_stdin_names_the_bad_line_and_schedules_nothing() {
    let env = World::new().await;
    let mut cmd = binary(&env);
    cmd.args(["schedule", "--stdin"]);
    let input = "{\"order_id\": \"s-1\", \"delay_ms\": 0}\n{\"order_id\": \"s-2\"}\n";
    let out = run_with_stdin(cmd, input).await;
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("line 2"), "{stderr}");
    assert_eq!(env.depth(&env.ladder().due_queue()).await, 0);
    env.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn schedule_one_order_with_a_delay() {
    let env = World::new().await;
    let mut cmd = binary(&env);
    cmd.args(["schedule", "--order-id", "one-1", "--delay", "0s"]);
    let out = run_with_stdin(cmd, "").await;
    assert!(succeeded("order-expiry schedule", &out).contains("scheduled one-1"));
    assert_eq!(env.depth(&env.ladder().due_queue()).await, 1);
    env.cleanup().await;
}

/// Settings that cannot work stop `serve` before it connects anywhere: exit code
/// 1 and one line naming the setting and the reason (the full table is the unit
/// test in `src/settings/validate.rs`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_refuses_impossible_settings_with_one_line_naming_the_key() {
    let cases = [
        (
            "ORDER_EXPIRY__CONSUMER__PREFETCH",
            "0",
            "invalid setting consumer.prefetch: 0 means unlimited",
        ),
        (
            "ORDER_EXPIRY__CONSUMER__PREFETCH",
            "-1",
            "for key `consumer.prefetch`",
        ),
        (
            "ORDER_EXPIRY__PUBLISHER__LEAD_MS",
            "30000",
            "invalid setting consumer.max_hold_ms",
        ),
        (
            "ORDER_EXPIRY__CONSUMER__BATCH_MAX",
            "0",
            "invalid setting consumer.batch_max",
        ),
        (
            "ORDER_EXPIRY__DATABASE__STATEMENT_TIMEOUT_MS",
            "9000",
            "invalid setting database.query_timeout_ms",
        ),
        (
            "ORDER_EXPIRY__SWEEPER__INTERVAL_MS",
            "0",
            "invalid setting sweeper.interval_ms",
        ),
    ];
    for (key, value, expected) in cases {
        let out = Command::new(env!("CARGO_BIN_EXE_order-expiry"))
            .arg("serve")
            .env(key, value)
            .env("ORDER_EXPIRY__HTTP__LISTEN", "127.0.0.1:0")
            .env("RUST_BACKTRACE", "1")
            .stdin(Stdio::null())
            .output();
        let out = tokio::time::timeout(std::time::Duration::from_secs(20), out)
            .await
            .expect("serve exits at once")
            .expect("binary runs");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{key}={value}: {stderr}");
        let lines: Vec<&str> = stderr.lines().collect();
        assert_eq!(lines.len(), 1, "{key}={value}: one line: {stderr}");
        assert!(lines[0].starts_with("error: "), "{stderr}");
        assert!(lines[0].contains(expected), "{key}={value}: {stderr}");
    }
}

/// A schedule into a prefix whose topology was never applied names the missing
/// exchange and the command that creates it, on one line, with no log line
/// from the AMQP client on top.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn schedule_into_a_missing_topology_names_the_exchange_and_the_fix() {
    let env = World::new().await;
    let mut cmd = binary(&env);
    cmd.env(
        "ORDER_EXPIRY__TOPOLOGY__PREFIX",
        format!("nothere-{}", env.id),
    )
    .args(["schedule", "--order-id", "a", "--delay", "5s"]);
    let out = run_with_stdin(cmd, "").await;
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    let lines: Vec<&str> = stderr.lines().collect();
    assert_eq!(lines.len(), 1, "one line: {stderr}");
    let exchange = format!("nothere-{}.ladder.02", env.id);
    assert!(
        lines[0].starts_with("error: exchange ") && lines[0].contains(&exchange),
        "{stderr}"
    );
    assert!(lines[0].contains("order-expiry topology apply"), "{stderr}");
    env.cleanup().await;
}

/// An order service configured apart from its consumers (a byte cap above
/// their `consumer.max_body_bytes`) is refused before it schedules anything,
/// with one line naming the key: its bundles would be parked whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn schedule_refuses_bundles_its_consumers_would_park() {
    let env = World::new().await;
    let mut cmd = binary(&env);
    cmd.env("ORDER_EXPIRY__PUBLISHER__BUNDLE_MAX_BYTES", "65536")
        .args(["schedule", "--order-id", "apart-1", "--delay", "5s"]);
    let out = run_with_stdin(cmd, "").await;
    let stderr = String::from_utf8_lossy(&out.stderr);
    eprintln!("FIGURES settings apart: {}", stderr.trim());
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert_eq!(stderr.lines().count(), 1, "one line: {stderr}");
    assert!(
        stderr.contains("publisher.bundle_max_bytes") && stderr.contains("parked unread"),
        "{stderr}"
    );
    assert_eq!(env.ladder_depth(None).await, 0, "nothing scheduled");
    env.cleanup().await;
}

/// `topology apply` with another `topology.levels` under a prefix that has a
/// ladder refuses (exit 1, one line naming both counts and the migration)
/// and declares nothing: in place, the other count's bindings would make
/// copies of messages, some of them early. The same count applies again.
/// The same on RabbitMQ 3.10 and 4.3 (`scripts/test` runs it on both): the
/// guard's passive declares of a missing level exchange get NOT_FOUND on a
/// channel of their own on either metadata store (Mnesia, Khepri).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn topology_apply_refuses_another_level_count_under_the_same_prefix() {
    let env = World::new().await;
    let levels = env.settings.topology.levels;
    let prefix = env.settings.topology.prefix.clone();
    for other in [levels + 2, levels - 2] {
        let mut cmd = binary(&env);
        cmd.env("ORDER_EXPIRY__TOPOLOGY__LEVELS", other.to_string())
            .args(["topology", "apply"]);
        let out = run_with_stdin(cmd, "").await;
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{stderr}");
        assert_eq!(stderr.lines().count(), 1, "one line: {stderr}");
        assert!(
            stderr.contains(&format!(
                "under prefix {prefix} with {levels} levels, not {other}"
            )) && stderr.contains(&format!(
                "ladder migrate --from-prefix {prefix} --from-levels {levels}"
            )),
            "{stderr}"
        );
    }
    // Nothing of the refused 24-level ladder was declared.
    let channel = env.open_channel().await;
    let passive = lapin::options::ExchangeDeclareOptions {
        passive: true,
        ..Default::default()
    };
    let above = channel
        .exchange_declare(
            env.ladder().level_name(levels).as_str().into(),
            lapin::ExchangeKind::Topic,
            passive,
            Default::default(),
        )
        .await;
    assert!(above.is_err(), "no level {levels} exchange was declared");

    let mut cmd = binary(&env);
    cmd.args(["topology", "apply"]);
    let out = run_with_stdin(cmd, "").await;
    succeeded("order-expiry", &out);
    env.cleanup().await;
}
