//! The real binary with a known, unique password in both URLs: it never shows up
//! in stdout, stderr (text or JSON logs, at debug level), error messages,
//! `/metrics` or `/readyz`, whether the service works or fails. The working run
//! also checks the JSON log format: one `delivery` span per message carrying
//! `order_id` and `outcome`.

use std::process::Stdio;
use std::time::Duration;

use order_expiry_testkit::{World, amqp_port, database, free_port, http_get, rabbitmqctl, vhost};
use tokio::io::AsyncReadExt;
use tokio::process::{Child, Command};

/// A password no output could contain by accident; `%21` is `!` once decoded,
/// so both spellings are looked for.
struct Secret {
    unique: String,
}

impl Secret {
    fn new() -> Self {
        Self {
            unique: format!("Pw{}", uuid::Uuid::new_v4().simple()),
        }
    }

    /// As written in a URL.
    fn in_url(&self) -> String {
        format!("{}%21", self.unique)
    }

    /// Panics if `text` contains the password in any spelling.
    fn assert_absent(&self, what: &str, text: &str) {
        assert!(
            !text.contains(&self.unique),
            "{what} leaks the password:\n{text}"
        );
    }
}

/// The binary with a clean environment for settings: only `vars` apply.
fn binary(args: &[&str], vars: &[(&str, String)]) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_order-expiry"));
    for (key, _) in std::env::vars() {
        if key.starts_with("ORDER_EXPIRY__") || key == "RUST_LOG" {
            cmd.env_remove(key);
        }
    }
    cmd.args(args)
        .envs(vars.iter().map(|(k, v)| (*k, v.as_str())))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    cmd
}

async fn output(mut cmd: Command) -> (bool, String) {
    let out = tokio::time::timeout(Duration::from_secs(30), cmd.output())
        .await
        .expect("the command ends within 30 s")
        .expect("binary runs");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

async fn get(port: u16, path: &str) -> Option<(u16, String)> {
    http_get(std::net::SocketAddr::from(([127, 0, 0, 1], port)), path).await
}

/// Polls `path` until `done` accepts the answer; everything seen is returned.
async fn wait_for(port: u16, path: &str, done: impl Fn(u16, &str) -> bool) -> (u16, String) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        if let Some((status, body)) = get(port, path).await
            && (done(status, &body) || tokio::time::Instant::now() > deadline)
        {
            return (status, body);
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{path} never answered"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// SIGTERM, then everything the process wrote; it must exit 0.
async fn terminate(mut child: Child) -> String {
    let pid = child.id().expect("running").to_string();
    let killed = std::process::Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .unwrap();
    assert!(killed.success());
    let mut stdout = child.stdout.take().unwrap();
    let mut stderr = child.stderr.take().unwrap();
    let (mut out, mut err) = (String::new(), String::new());
    let status = tokio::time::timeout(Duration::from_secs(20), async {
        let _ = tokio::join!(
            stdout.read_to_string(&mut out),
            stderr.read_to_string(&mut err)
        );
        child.wait().await
    })
    .await
    .expect("serve stops within 20 s of SIGTERM")
    .unwrap();
    assert!(status.success(), "serve exited with {status}:\n{err}");
    out + &err
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failing_commands_and_a_failing_service_never_show_the_password() {
    let secret = Secret::new();
    let pw = secret.in_url();
    let closed = free_port();
    let wrong_amqp = format!(
        "amqp://order-expiry-leak:{pw}@127.0.0.1:{}/{}",
        amqp_port(),
        vhost()
    );
    let unreachable_amqp = format!("amqp://order-expiry-leak:{pw}@127.0.0.1:{closed}/x");
    let unreachable_db = format!("postgres://leak:{pw}@127.0.0.1:{closed}/x");
    let invalid_amqp = format!("amqp:order-expiry-leak:{pw}@127.0.0.1");
    let debug = ("ORDER_EXPIRY__LOG__FILTER", "debug".to_owned());

    // serve: the broker refuses the login, the database is unreachable.
    let port = free_port();
    let child = binary(
        &["serve"],
        &[
            ("ORDER_EXPIRY__AMQP__URL", wrong_amqp.clone()),
            ("ORDER_EXPIRY__DATABASE__URL", unreachable_db.clone()),
            ("ORDER_EXPIRY__HTTP__LISTEN", format!("127.0.0.1:{port}")),
            ("ORDER_EXPIRY__AMQP__RECONNECT_MAX_MS", "300".to_owned()),
            debug.clone(),
        ],
    )
    .spawn()
    .unwrap();
    let (status, readyz) = wait_for(port, "/readyz", |_, _| true).await;
    assert_eq!(status, 503, "{readyz}");
    // Let it fail a few reconnects and readiness checks.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let (_, readyz) = wait_for(port, "/readyz", |_, _| true).await;
    let (_, metrics) = wait_for(port, "/metrics", |_, body| {
        body.contains("order_expiry_reconnects_total")
    })
    .await;
    let logs = terminate(child).await;
    assert!(
        logs.contains("ACCESS_REFUSED"),
        "the failure is reported:\n{logs}"
    );
    assert!(logs.contains("order-expiry-leak:***@"), "{logs}");
    for (what, text) in [
        ("/readyz", &readyz),
        ("/metrics", &metrics),
        ("serve", &logs),
    ] {
        secret.assert_absent(what, text);
    }

    // One-shot commands that fail on the broker, on the database, on the URL.
    let runs: Vec<(&str, Vec<&str>, (&str, String))> = vec![
        (
            "schedule, broker unreachable",
            vec!["schedule", "--order-id", "x", "--delay", "1s"],
            ("ORDER_EXPIRY__AMQP__URL", unreachable_amqp.clone()),
        ),
        (
            "schedule, login refused",
            vec!["schedule", "--order-id", "x", "--delay", "1s"],
            ("ORDER_EXPIRY__AMQP__URL", wrong_amqp.clone()),
        ),
        (
            "schedule, invalid URL",
            vec!["schedule", "--order-id", "x", "--delay", "1s"],
            ("ORDER_EXPIRY__AMQP__URL", invalid_amqp.clone()),
        ),
        (
            "topology apply, login refused",
            vec!["topology", "apply"],
            ("ORDER_EXPIRY__AMQP__URL", wrong_amqp.clone()),
        ),
        (
            "migrate, database unreachable",
            vec!["migrate"],
            ("ORDER_EXPIRY__DATABASE__URL", unreachable_db.clone()),
        ),
    ];
    for (what, args, url) in runs {
        for format in ["text", "json"] {
            let vars = [
                url.clone(),
                debug.clone(),
                ("ORDER_EXPIRY__LOG__FORMAT", format.to_owned()),
            ];
            let (ok, text) = output(binary(&args, &vars)).await;
            assert!(!ok, "{what} should fail:\n{text}");
            assert!(
                text.contains("***"),
                "{what} names the redacted URL:\n{text}"
            );
            secret.assert_absent(what, &text);
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_working_service_logs_json_spans_and_never_the_password() {
    let secret = Secret::new();
    let pw = secret.in_url();
    let env = World::new().await;
    // A broker user with the known password (PostgreSQL trusts 127.0.0.1 and
    // ignores the password, which is still in the URL).
    let user = format!("order-expiry-leak-{}", &env.settings.topology.prefix);
    let decoded = format!("{}!", secret.unique);
    rabbitmqctl(&["-q", "add_user", &user, &decoded]);
    rabbitmqctl(&[
        "-q",
        "set_permissions",
        "-p",
        &vhost(),
        &user,
        ".*",
        ".*",
        ".*",
    ]);
    let amqp = format!("amqp://{user}:{pw}@127.0.0.1:{}/{}", amqp_port(), vhost());
    let database = format!(
        "postgres://postgres:{pw}@127.0.0.1:5432/{}?options=-csearch_path%3D{}",
        database(),
        env.schema()
    );
    let port = free_port();
    let vars = [
        ("ORDER_EXPIRY__AMQP__URL", amqp.clone()),
        ("ORDER_EXPIRY__DATABASE__URL", database.clone()),
        (
            "ORDER_EXPIRY__TOPOLOGY__PREFIX",
            env.settings.topology.prefix.clone(),
        ),
        (
            "ORDER_EXPIRY__TOPOLOGY__LEVELS",
            env.settings.topology.levels.to_string(),
        ),
        ("ORDER_EXPIRY__HTTP__LISTEN", format!("127.0.0.1:{port}")),
        ("ORDER_EXPIRY__LOG__FILTER", "debug".to_owned()),
    ];
    let child = binary(&["--log-format", "json", "serve"], &vars)
        .spawn()
        .unwrap();
    let (status, readyz) = wait_for(port, "/readyz", |status, _| status == 200).await;
    assert_eq!(status, 200, "{readyz}");

    let order = format!("leak-{}", env.settings.topology.prefix);
    let due_at = order_expiry_testkit::at_ms(300);
    env.create_orders(&[(order.clone(), due_at)]).await;
    let (ok, scheduled) = output(binary(
        &[
            "schedule",
            "--order-id",
            &order,
            "--due-at",
            &due_at.to_rfc3339(),
        ],
        &vars,
    ))
    .await;
    assert!(ok, "{scheduled}");
    let (_, metrics) = wait_for(port, "/metrics", |_, body| {
        body.contains("order_expiry_messages_total{outcome=\"cancelled\"} 1")
    })
    .await;
    assert!(metrics.contains("order_expiry_consuming 1"), "{metrics}");
    let logs = terminate(child).await;
    rabbitmqctl(&["-q", "delete_user", &user]);

    for (what, text) in [
        ("/readyz", &readyz),
        ("/metrics", &metrics),
        ("schedule", &scheduled),
        ("serve", &logs),
    ] {
        secret.assert_absent(what, text);
    }

    // JSON logs, one object a line; the delivery's events sit in its span.
    let lines: Vec<serde_json::Value> = logs
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
        .collect();
    let handled = lines
        .iter()
        .find(|l| {
            l["span"]["name"] == "delivery"
                && l["span"]["order_id"] == order.as_str()
                && l["fields"]["message"] == "handled"
        })
        .unwrap_or_else(|| panic!("no `handled` event in a delivery span for {order}:\n{logs}"));
    assert_eq!(handled["span"]["outcome"], "cancelled", "{handled}");
    assert_eq!(handled["level"], "DEBUG", "{handled}");
    assert!(
        lines
            .iter()
            .any(|l| l["fields"]["message"] == "starting consumer service"
                && l["fields"]["amqp"]
                    .as_str()
                    .is_some_and(|u| u.contains(":***@"))),
        "the start-up line names the redacted URLs:\n{logs}"
    );
    env.cleanup().await;
}

/// The HTTP action's and the payment check's bearer tokens reach the
/// endpoints, and nothing else: not the logs at debug level (a 503 and a
/// retry included), `/metrics` or `/readyz` (which says the database is not
/// used).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_bearer_tokens_reach_the_endpoints_and_nothing_else() {
    use order_expiry_testkit::{Endpoint, Reply};
    let secret = Secret::new();
    let env = World::new().await;
    let endpoint = Endpoint::start().await;
    let order = format!("token-{}", env.settings.topology.prefix);
    endpoint.script(
        "expire",
        &order,
        vec![
            Reply::Status(503, "try later".into()),
            Reply::Status(200, "{}".into()),
        ],
    );
    let port = free_port();
    let vars = [
        ("ORDER_EXPIRY__AMQP__URL", order_expiry_testkit::amqp_url()),
        (
            "ORDER_EXPIRY__TOPOLOGY__PREFIX",
            env.settings.topology.prefix.clone(),
        ),
        (
            "ORDER_EXPIRY__TOPOLOGY__LEVELS",
            env.settings.topology.levels.to_string(),
        ),
        ("ORDER_EXPIRY__HTTP__LISTEN", format!("127.0.0.1:{port}")),
        ("ORDER_EXPIRY__LOG__FILTER", "debug".to_owned()),
        ("ORDER_EXPIRY__SWEEPER__ENABLED", "false".to_owned()),
        ("ORDER_EXPIRY__ACTION__KIND", "http".to_owned()),
        ("ORDER_EXPIRY__ACTION__HTTP__BASE_URL", endpoint.base_url()),
        (
            "ORDER_EXPIRY__ACTION__HTTP__BEARER_TOKEN",
            secret.unique.clone(),
        ),
        ("ORDER_EXPIRY__ACTION__CHECK__ENABLED", "true".to_owned()),
        ("ORDER_EXPIRY__ACTION__CHECK__BASE_URL", endpoint.base_url()),
        // The test ladder holds 63 s; a list from the environment.
        (
            "ORDER_EXPIRY__ACTION__CHECK__STEPS_MS",
            "1000,2000".to_owned(),
        ),
        (
            "ORDER_EXPIRY__ACTION__CHECK__BEARER_TOKEN",
            format!("{}c", secret.unique),
        ),
        // No database at all: the HTTP action does not need one.
        (
            "ORDER_EXPIRY__DATABASE__URL",
            "postgres://nobody@127.0.0.1:1/none".to_owned(),
        ),
    ];
    let child = binary(&["--log-format", "json", "serve"], &vars)
        .spawn()
        .unwrap();
    let (status, readyz) = wait_for(port, "/readyz", |status, _| status == 200).await;
    assert_eq!(status, 200, "{readyz}");
    assert!(readyz.contains("database: not used"), "{readyz}");
    let (ok, scheduled) = output(binary(
        &["schedule", "--order-id", &order, "--delay", "0s"],
        &vars,
    ))
    .await;
    assert!(ok, "{scheduled}");
    let (_, metrics) = wait_for(port, "/metrics", |_, body| {
        body.contains("order_expiry_messages_total{outcome=\"cancelled\"} 1")
    })
    .await;
    let logs = terminate(child).await;
    let expire = endpoint.requests_for("expire", &order);
    assert_eq!(expire.len(), 2, "a 503, then a 200");
    assert_eq!(
        expire[0].headers["authorization"],
        format!("Bearer {}", secret.unique)
    );
    let check = endpoint.requests_for("payment", &order);
    assert_eq!(
        check[0].headers["authorization"],
        format!("Bearer {}c", secret.unique)
    );
    assert!(logs.contains("expire endpoint answered 503"), "{logs}");
    for (what, text) in [
        ("/readyz", &readyz),
        ("/metrics", &metrics),
        ("schedule", &scheduled),
        ("serve", &logs),
    ] {
        secret.assert_absent(what, text);
    }
    env.cleanup().await;
}
