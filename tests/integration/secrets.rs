//! The real binary with a known, unique password in both URLs: it never shows up
//! in stdout, stderr (text or JSON logs, at debug level), error messages,
//! `/metrics` or `/readyz`, whether the service works or fails. The working run
//! also checks the JSON log format: one `delivery` span per message carrying
//! `order_id` and `outcome`.

use std::process::Stdio;
use std::time::Duration;

use order_expiry_testkit::{
    Endpoint, Reply, World, amqp_port, database, free_port, http_get, rabbitmqctl, vhost,
};
use tokio::process::{Child, Command};

/// Settings as `SECTION__KEY=value`, each `ORDER_EXPIRY__SECTION__KEY`.
type Vars = Vec<String>;

const DEBUG: &str = "LOG__FILTER=debug";

/// A password no output could contain by accident; `%21` is `!` once decoded.
struct Secret(String);

impl Secret {
    fn new() -> Self {
        Self(format!("Pw{}", uuid::Uuid::new_v4().simple()))
    }

    /// As written in a URL.
    fn in_url(&self) -> String {
        format!("{}%21", self.0)
    }

    /// Panics if any of `texts` (what, text) contains the password.
    fn assert_absent<S: AsRef<str>>(&self, texts: &[(&str, S)]) {
        for (what, text) in texts {
            let text = text.as_ref();
            assert!(
                !text.contains(&self.0),
                "{what} leaks the password:\n{text}"
            );
        }
    }
}

/// The binary with a clean environment for settings: only `vars` apply.
fn binary(args: &[&str], vars: &[String]) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_order-expiry"));
    for (key, _) in std::env::vars() {
        if key.starts_with("ORDER_EXPIRY__") || key == "RUST_LOG" {
            cmd.env_remove(key);
        }
    }
    for var in vars {
        let (key, value) = var.split_once('=').expect("KEY=value");
        cmd.env(format!("ORDER_EXPIRY__{key}"), value);
    }
    cmd.args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    cmd
}

/// Runs `order-expiry ARGS` with `vars`: whether it succeeded, stdout and stderr.
async fn output(args: &[&str], vars: &[String]) -> (bool, String) {
    let out = tokio::time::timeout(Duration::from_secs(30), binary(args, vars).output()).await;
    let out = out.expect("the command ends within 30 s");
    text(out.expect("binary runs"))
}

/// Whether it succeeded; its stdout and stderr.
fn text(out: std::process::Output) -> (bool, String) {
    let [stdout, stderr] = [&out.stdout, &out.stderr].map(|o| String::from_utf8_lossy(o));
    (out.status.success(), format!("{stdout}{stderr}"))
}

/// `order-expiry ARGS` (`serve`) with `vars` and HTTP on a free port.
struct Serve {
    child: Child,
    port: u16,
}

impl Serve {
    fn start(args: &[&str], mut vars: Vars) -> Self {
        let port = free_port();
        vars.push(format!("HTTP__LISTEN=127.0.0.1:{port}"));
        let child = binary(args, &vars).spawn().expect("serve starts");
        Self { child, port }
    }

    /// Polls `path` until `done` accepts the answer (at most 20 s); the last answer.
    async fn wait_for(&self, path: &str, done: impl Fn(u16, &str) -> bool) -> (u16, String) {
        let addr = std::net::SocketAddr::from(([127, 0, 0, 1], self.port));
        let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
        loop {
            let answer = http_get(addr, path).await;
            let late = tokio::time::Instant::now() > deadline;
            match answer {
                Some((status, body)) if late || done(status, &body) => return (status, body),
                _ => assert!(!late, "{path} never answered"),
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// SIGTERM, then everything the process wrote; it must exit 0.
    async fn terminate(self) -> String {
        let pid = self.child.id().expect("running").to_string();
        let killed = std::process::Command::new("kill")
            .args(["-TERM", &pid])
            .status();
        assert!(killed.unwrap().success());
        let exit = tokio::time::timeout(Duration::from_secs(20), self.child.wait_with_output());
        let exited = exit.await.expect("serve stops within 20 s of SIGTERM");
        let (ok, text) = text(exited.expect("serve's output"));
        assert!(ok, "serve failed:\n{text}");
        text
    }
}

/// A working `serve` (JSON logs) with `vars` while `order-expiry SCHEDULE`,
/// with the same `vars`, schedules one order that it then cancels: its
/// `/readyz`, `/metrics` and logs, none of which (nor the schedule's output)
/// shows the password.
async fn one_order_through(secret: &Secret, vars: &[String], schedule: &[&str]) -> [String; 3] {
    let serve = Serve::start(&["--log-format", "json", "serve"], vars.to_vec());
    let (status, readyz) = serve.wait_for("/readyz", |status, _| status == 200).await;
    assert_eq!(status, 200, "{readyz}");
    let (ok, scheduled) = output(schedule, vars).await;
    assert!(ok, "{scheduled}");
    let cancelled = "order_expiry_messages_total{outcome=\"cancelled\"} 1";
    let (_, metrics) = serve
        .wait_for("/metrics", |_, body| body.contains(cancelled))
        .await;
    let logs = serve.terminate().await;
    let texts = [
        ("/readyz", &readyz),
        ("/metrics", &metrics),
        ("schedule", &scheduled),
        ("serve", &logs),
    ];
    secret.assert_absent(&texts);
    [readyz, metrics, logs]
}

/// Debug logs, the world's prefix and levels.
fn world_vars(env: &World) -> Vars {
    let topology = &env.settings.topology;
    vec![
        DEBUG.to_owned(),
        format!("TOPOLOGY__PREFIX={}", topology.prefix),
        format!("TOPOLOGY__LEVELS={}", topology.levels),
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failing_commands_and_a_failing_service_never_show_the_password() {
    let secret = Secret::new();
    let pw = secret.in_url();
    let closed = free_port();
    let (port, vhost) = (amqp_port(), vhost());
    let wrong_amqp = format!("AMQP__URL=amqp://order-expiry-leak:{pw}@127.0.0.1:{port}/{vhost}");
    let unreachable_amqp = format!("AMQP__URL=amqp://order-expiry-leak:{pw}@127.0.0.1:{closed}/x");
    let unreachable_db = format!("DATABASE__URL=postgres://leak:{pw}@127.0.0.1:{closed}/x");
    let invalid_amqp = format!("AMQP__URL=amqp:order-expiry-leak:{pw}@127.0.0.1");

    // serve: the broker refuses the login, the database is unreachable.
    let vars = [
        wrong_amqp.as_str(),
        &unreachable_db,
        "AMQP__RECONNECT_MAX_MS=300",
        DEBUG,
    ];
    let serve = Serve::start(&["serve"], vars.map(str::to_owned).to_vec());
    let (status, readyz) = serve.wait_for("/readyz", |_, _| true).await;
    assert_eq!(status, 503, "{readyz}");
    // Let it fail a few reconnects and readiness checks.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let (_, readyz) = serve.wait_for("/readyz", |_, _| true).await;
    let reconnects = |_, body: &str| body.contains("order_expiry_reconnects_total");
    let (_, metrics) = serve.wait_for("/metrics", reconnects).await;
    let logs = serve.terminate().await;
    assert!(logs.contains("ACCESS_REFUSED"), "unreported:\n{logs}");
    assert!(logs.contains("order-expiry-leak:***@"), "{logs}");
    let texts = [
        ("/readyz", &readyz),
        ("/metrics", &metrics),
        ("serve", &logs),
    ];
    secret.assert_absent(&texts);

    // One-shot commands that fail on the broker, on the database, on the URL.
    let schedule = ["schedule", "--order-id", "x", "--delay", "1s"];
    let (apply, migrate) = (["topology", "apply"], ["migrate"]);
    let runs: [(&str, &[&str], &str); 5] = [
        ("schedule, broker unreachable", &schedule, &unreachable_amqp),
        ("schedule, login refused", &schedule, &wrong_amqp),
        ("schedule, invalid URL", &schedule, &invalid_amqp),
        ("topology apply, login refused", &apply, &wrong_amqp),
        ("migrate, database unreachable", &migrate, &unreachable_db),
    ];
    for (what, args, url) in runs {
        for format in ["text", "json"] {
            let format = format!("LOG__FORMAT={format}");
            let vars = [url, DEBUG, format.as_str()].map(str::to_owned);
            let (ok, text) = output(args, &vars).await;
            assert!(!ok, "{what} should fail:\n{text}");
            assert!(text.contains("***"), "{what}, no redacted URL:\n{text}");
            secret.assert_absent(&[(what, &text)]);
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
    let vhost = vhost();
    rabbitmqctl(&["-q", "add_user", &user, &format!("{}!", secret.0)]);
    let all = [".*", ".*", ".*"];
    rabbitmqctl(&[&["-q", "set_permissions", "-p", &vhost, &user][..], &all].concat());
    let (port, database, schema) = (amqp_port(), database(), env.schema());
    let mut vars = world_vars(&env);
    vars.extend([
        format!("AMQP__URL=amqp://{user}:{pw}@127.0.0.1:{port}/{vhost}"),
        format!("DATABASE__URL=postgres://postgres:{pw}@127.0.0.1:5432/{database}?options=-csearch_path%3D{schema}"),
    ]);
    let order = format!("leak-{}", env.settings.topology.prefix);
    let due_at = order_expiry_testkit::at_ms(300);
    env.create_orders(&[(order.clone(), due_at)]).await;
    let due = due_at.to_rfc3339();
    let schedule = ["schedule", "--order-id", &order, "--due-at", &due];
    let [_, metrics, logs] = one_order_through(&secret, &vars, &schedule).await;
    rabbitmqctl(&["-q", "delete_user", &user]);
    assert!(metrics.contains("order_expiry_consuming 1"), "{metrics}");

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
    // The start-up line names the redacted URLs.
    let start = lines
        .iter()
        .find(|l| l["fields"]["message"] == "starting consumer service");
    let amqp = start.and_then(|l| l["fields"]["amqp"].as_str());
    assert!(amqp.is_some_and(|u| u.contains(":***@")), "{logs}");
    env.cleanup().await;
}

/// The HTTP action's and the payment check's bearer tokens reach the
/// endpoints, and nothing else: not the logs at debug level (a 503 and a
/// retry included), `/metrics` or `/readyz` (which says the database is not
/// used).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_bearer_tokens_reach_the_endpoints_and_nothing_else() {
    let secret = Secret::new();
    let env = World::new().await;
    let endpoint = Endpoint::start().await;
    let order = format!("token-{}", env.settings.topology.prefix);
    let replies = vec![
        Reply::Status(503, "try later".into()),
        Reply::Status(200, "{}".into()),
    ];
    endpoint.script("expire", &order, replies);
    let (base, token) = (endpoint.base_url(), &secret.0);
    let mut vars = world_vars(&env);
    vars.extend([
        format!("AMQP__URL={}", order_expiry_testkit::amqp_url()),
        "SWEEPER__ENABLED=false".to_owned(),
        "ACTION__KIND=http".to_owned(),
        format!("ACTION__HTTP__BASE_URL={base}"),
        format!("ACTION__HTTP__BEARER_TOKEN={token}"),
        "ACTION__CHECK__ENABLED=true".to_owned(),
        format!("ACTION__CHECK__BASE_URL={base}"),
        // The test ladder holds 63 s; a list from the environment.
        "ACTION__CHECK__STEPS_MS=1000,2000".to_owned(),
        format!("ACTION__CHECK__BEARER_TOKEN={token}c"),
        // No database at all: the HTTP action does not need one.
        "DATABASE__URL=postgres://nobody@127.0.0.1:1/none".to_owned(),
    ]);
    let schedule = ["schedule", "--order-id", &order, "--delay", "0s"];
    let [readyz, _, logs] = one_order_through(&secret, &vars, &schedule).await;
    assert!(readyz.contains("database: not used"), "{readyz}");
    let expire = endpoint.requests_for("expire", &order);
    assert_eq!(expire.len(), 2, "a 503, then a 200");
    assert_eq!(
        expire[0].headers["authorization"],
        format!("Bearer {}", secret.0)
    );
    let check = endpoint.requests_for("payment", &order);
    assert_eq!(
        check[0].headers["authorization"],
        format!("Bearer {}c", secret.0)
    );
    assert!(logs.contains("expire endpoint answered 503"), "{logs}");
    env.cleanup().await;
}
