//! The `order-expiry` binary: `schedule --stdin` confirms every line or names the
//! bad one; settings and topologies that cannot work are refused on one line.

use std::process::{Output, Stdio};

use order_expiry::Settings;
use order_expiry_testkit::{World, order_ids, run_cli, settings_env, succeeded};
use tokio::io::AsyncWriteExt;
use tokio::process::Command;

/// `order-expiry schedule --stdin` with the world's settings, `input` on its
/// stdin.
async fn schedule_stdin(env: &World, input: &str) -> Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_order-expiry"))
        .args(["schedule", "--stdin"])
        .envs(settings_env(&env.settings))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("binary runs");
    let mut stdin = child.stdin.take().unwrap();
    stdin.write_all(input.as_bytes()).await.unwrap();
    drop(stdin);
    child.wait_with_output().await.unwrap()
}

/// The stderr of a command that must have exited 1 with one line.
pub(crate) fn refused(out: &Output) -> String {
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert_eq!(stderr.lines().count(), 1, "one line: {stderr}");
    stderr
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn schedule_stdin_confirms_every_line() {
    let env = World::new().await;
    let input = "{\"order_id\": \"s-1\", \"delay_ms\": 0}\n\n{\"order_id\": \"s-2\", \"due_at\": \"2020-01-01T00:00:00Z\"}\n";
    succeeded("order-expiry", &schedule_stdin(&env, input).await);
    // Both orders, in one bundle or two messages.
    let mut ids = Vec::new();
    while let Some(message) = env.get(&env.ladder().due_queue()).await {
        ids.extend(order_ids(&message.data));
    }
    ids.sort();
    assert_eq!(ids, ["s-1", "s-2"]);
    env.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn schedule_stdin_names_the_bad_line_and_schedules_nothing() {
    let env = World::new().await;
    let input = "{\"order_id\": \"s-1\", \"delay_ms\": 0}\n{\"order_id\": \"s-2\"}\n";
    let out = schedule_stdin(&env, input).await;
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("line 2"), "{stderr}");
    assert_eq!(env.depth(&env.ladder().due_queue()).await, 0);
    env.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn schedule_one_order_with_a_delay() {
    let env = World::new().await;
    let out = env
        .cli_ok(&["schedule", "--order-id", "one-1", "--delay", "0s"])
        .await;
    assert!(out.contains("scheduled one-1"), "{out}");
    assert_eq!(env.depth(&env.ladder().due_queue()).await, 1);
    env.cleanup().await;
}

/// Settings that cannot work stop `serve` before it connects anywhere: exit code
/// 1 and one line naming the setting and the reason (the full table is the unit
/// test in `src/settings/validate.rs`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_refuses_impossible_settings_with_one_line_naming_the_key() {
    // `SECTION__KEY=value: what the line says`, one case a line.
    let cases = "\
        CONSUMER__PREFETCH=0: invalid setting consumer.prefetch: 0 means unlimited
        CONSUMER__PREFETCH=-1: for key `consumer.prefetch`
        PUBLISHER__LEAD_MS=30000: invalid setting consumer.max_hold_ms
        CONSUMER__BATCH_MAX=0: invalid setting consumer.batch_max
        DATABASE__STATEMENT_TIMEOUT_MS=9000: invalid setting database.query_timeout_ms
        SWEEPER__INTERVAL_MS=0: invalid setting sweeper.interval_ms";
    let mut settings = Settings::default();
    settings.http.listen = "127.0.0.1:0".into();
    for case in cases.lines().map(str::trim) {
        let (setting, expected) = case.split_once(": ").expect("KEY=value: expected");
        let (key, value) = setting.split_once('=').expect("KEY=value");
        let key = format!("ORDER_EXPIRY__{key}");
        let extra = [(key.as_str(), value), ("RUST_BACKTRACE", "1")];
        let stderr = refused(&run_cli(&settings, &["serve"], &extra).await);
        assert!(stderr.starts_with("error: "), "{stderr}");
        assert!(stderr.contains(expected), "{key}={value}: {stderr}");
    }
}

/// A schedule into a prefix whose topology was never applied names the missing
/// exchange and the command that creates it, on one line, with no log line
/// from the AMQP client on top.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn schedule_into_a_missing_topology_names_the_exchange_and_the_fix() {
    let env = World::new().await;
    let prefix = format!("nothere-{}", env.id);
    let schedule = ["schedule", "--order-id", "a", "--delay", "5s"];
    let out = env
        .cli(&schedule, &[("ORDER_EXPIRY__TOPOLOGY__PREFIX", &prefix)])
        .await;
    let stderr = refused(&out);
    let exchange = format!("{prefix}.ladder.02");
    assert!(
        stderr.starts_with("error: exchange ") && stderr.contains(&exchange),
        "{stderr}"
    );
    assert!(stderr.contains("order-expiry topology apply"), "{stderr}");
    env.cleanup().await;
}

/// An order service configured apart from its consumers (a byte cap above
/// their `consumer.max_body_bytes`) is refused before it schedules anything,
/// with one line naming the key: its bundles would be parked whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn schedule_refuses_bundles_its_consumers_would_park() {
    let env = World::new().await;
    let schedule = ["schedule", "--order-id", "apart-1", "--delay", "5s"];
    let cap = ("ORDER_EXPIRY__PUBLISHER__BUNDLE_MAX_BYTES", "65536");
    let stderr = refused(&env.cli(&schedule, &[cap]).await);
    eprintln!("FIGURES settings apart: {}", stderr.trim());
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
        let other_levels = other.to_string();
        let extra = [("ORDER_EXPIRY__TOPOLOGY__LEVELS", other_levels.as_str())];
        let stderr = refused(&env.cli(&["topology", "apply"], &extra).await);
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
    let above = env.ladder().level_name(levels);
    assert!(
        !env.has_exchange(&above).await,
        "no level {levels} exchange was declared"
    );
    env.cli_ok(&["topology", "apply"]).await;
    env.cleanup().await;
}
