//! Where the tests' broker and database are, and small helpers around them.
//!
//! Defaults: RabbitMQ on `127.0.0.1:5672` as `guest`, vhost `order-expiry-test`;
//! PostgreSQL on `127.0.0.1:5432` as `postgres`, database `order_expiry_test`
//! (`scripts/test` resets both). Environment variables point them elsewhere:
//!
//! | variable | default | what |
//! | --- | --- | --- |
//! | `ORDER_EXPIRY_TEST_AMQP_PORT` | `5672` | the broker's AMQP port (another node, e.g. a RabbitMQ 4 on 5673) |
//! | `ORDER_EXPIRY_TEST_AMQP_URL` | from the port | the whole base URL, `amqp://user:pass@host:port` (no vhost) |
//! | `ORDER_EXPIRY_TEST_RABBITMQ_NODE` | the local default node | `rabbitmqctl -n` for that broker |
//! | `ORDER_EXPIRY_TEST_VHOST` | `order-expiry-test` | the vhost every test prefix lives in |
//! | `ORDER_EXPIRY_TEST_DATABASE` | `order_expiry_test` | the database every test schema lives in |
//! | `ORDER_EXPIRY_TEST_BLUE_AMQP_PORT` | `5672` | the old broker of the blue-green move test (skipped when it is the test broker) |

use std::process::Command;

use chrono::{DateTime, TimeDelta, Utc};

const DEFAULT_AMQP_PORT: u16 = 5672;

/// The test broker's AMQP port: `ORDER_EXPIRY_TEST_AMQP_PORT`, default 5672.
pub fn amqp_port() -> u16 {
    std::env::var("ORDER_EXPIRY_TEST_AMQP_PORT")
        .ok()
        .and_then(|p| p.parse().ok())
        .unwrap_or(DEFAULT_AMQP_PORT)
}

/// The old ("blue") broker's AMQP port of a blue-green broker move:
/// `ORDER_EXPIRY_TEST_BLUE_AMQP_PORT`, default 5672 (the system broker); the
/// test's own broker is the new ("green") one.
pub fn blue_amqp_port() -> u16 {
    std::env::var("ORDER_EXPIRY_TEST_BLUE_AMQP_PORT")
        .ok()
        .and_then(|p| p.parse().ok())
        .unwrap_or(DEFAULT_AMQP_PORT)
}

/// The vhost every test prefix lives in.
pub fn vhost() -> String {
    std::env::var("ORDER_EXPIRY_TEST_VHOST").unwrap_or_else(|_| "order-expiry-test".into())
}

/// The database every test schema lives in.
pub fn database() -> String {
    std::env::var("ORDER_EXPIRY_TEST_DATABASE").unwrap_or_else(|_| "order_expiry_test".into())
}

/// The test vhost on the test broker (`ORDER_EXPIRY_TEST_AMQP_URL` or the port).
pub fn amqp_url() -> String {
    let base = std::env::var("ORDER_EXPIRY_TEST_AMQP_URL")
        .unwrap_or_else(|_| format!("amqp://guest:guest@127.0.0.1:{}", amqp_port()));
    with_vhost(base.trim_end_matches('/'), &vhost())
}

/// The test vhost on the local broker listening on `port`, as `guest`.
pub fn amqp_url_on(port: u16) -> String {
    with_vhost(&format!("amqp://guest:guest@127.0.0.1:{port}"), &vhost())
}

fn with_vhost(base: &str, vhost: &str) -> String {
    let encoded = vhost.replace('%', "%25").replace('/', "%2f");
    format!("{base}/{encoded}")
}

/// The test database, with `search_path` set to `schema` when given.
pub fn database_url(schema: Option<&str>) -> String {
    let url = format!("postgres://postgres@127.0.0.1:5432/{}", database());
    match schema {
        Some(schema) => with_search_path(&url, schema),
        None => url,
    }
}

/// `url` with `search_path` set to `schema` through the `options` parameter.
pub fn with_search_path(url: &str, schema: &str) -> String {
    let sep = if url.contains('?') { '&' } else { '?' };
    format!("{url}{sep}options=-csearch_path%3D{schema}")
}

/// [`try_rabbitmqctl`], panicking with its output on failure.
pub fn rabbitmqctl(args: &[&str]) -> String {
    try_rabbitmqctl(args).unwrap_or_else(|e| panic!("{e}"))
}

/// Runs `rabbitmqctl` (with `-n $ORDER_EXPIRY_TEST_RABBITMQ_NODE` when set):
/// its stdout, or its output when it failed. Clean-ups ignore the `Err`.
pub fn try_rabbitmqctl(args: &[&str]) -> Result<String, String> {
    let mut command = Command::new("rabbitmqctl");
    if let Ok(node) = std::env::var("ORDER_EXPIRY_TEST_RABBITMQ_NODE") {
        command.args(["-n", &node]);
    }
    let what = format!("rabbitmqctl {args:?}");
    let out = command
        .args(args)
        .output()
        .map_err(|e| format!("{what}: {e}"))?;
    crate::child::try_succeeded(what, &out)
}

/// A TCP port nobody listens on right now.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port()
}

/// A new connection to the database of `url` (`postgres://…` or
/// `host=… dbname=…`), its driver task spawned.
pub async fn connect_database(url: &str) -> Result<tokio_postgres::Client, tokio_postgres::Error> {
    let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls).await?;
    tokio::spawn(connection);
    Ok(client)
}

/// `ms` milliseconds from now (negative: ago).
pub fn at_ms(ms: i64) -> DateTime<Utc> {
    Utc::now() + TimeDelta::milliseconds(ms)
}

/// Creates the test vhost and database once per process when `scripts/test` has
/// not (a plain `cargo test`).
pub(crate) async fn ensure_test_vhost_and_database() {
    static ONCE: tokio::sync::OnceCell<()> = tokio::sync::OnceCell::const_new();
    ONCE.get_or_init(|| async {
        let reachable = lapin::Connection::connect(&amqp_url(), Default::default()).await;
        if reachable.is_err() {
            let _ = try_rabbitmqctl(&["-q", "add_vhost", &vhost()]);
            let vhost = vhost();
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
        }
        let client = connect_database("host=127.0.0.1 user=postgres dbname=postgres")
            .await
            .expect("PostgreSQL on 127.0.0.1:5432 as postgres");
        let _ = client
            .batch_execute(&format!("CREATE DATABASE {}", database()))
            .await;
    })
    .await;
}

/// libfaketime's multithreaded library (Debian's `faketime` package, which
/// `scripts/test` installs).
const FAKETIME_LIB: &str = "/usr/lib/x86_64-linux-gnu/faketime/libfaketimeMT.so.1";

/// Environment that runs a child with its wall clock `skew_s` seconds ahead
/// (negative: behind) of this host's, through libfaketime. The monotonic
/// clock is left alone: only what the child reads as the time of day moves.
/// Panics when libfaketime is not installed.
pub fn skewed_clock(skew_s: i64) -> Vec<(&'static str, String)> {
    faketime(vec![("FAKETIME", format!("{skew_s:+}s"))])
}

/// A wall clock for a child that a test can move while the child runs
/// (libfaketime reading its offset from a file, re-read every second).
#[derive(Debug)]
pub struct MovableClock {
    file: std::path::PathBuf,
}

impl MovableClock {
    /// A clock `skew_s` seconds off this host's, in a file named after `name`.
    pub fn new(name: &str, skew_s: i64) -> Self {
        let file = std::env::temp_dir().join(format!("order-expiry-faketime-{name}"));
        let clock = Self { file };
        clock.set(skew_s);
        clock
    }

    /// The child's environment (see [`skewed_clock`]).
    pub fn env(&self) -> Vec<(&'static str, String)> {
        faketime(vec![
            ("FAKETIME_TIMESTAMP_FILE", self.file.display().to_string()),
            ("FAKETIME_CACHE_DURATION", "1".to_owned()),
        ])
    }

    /// Moves the child's clock to `skew_s` seconds off this host's; it reads
    /// the change within a second.
    pub fn set(&self, skew_s: i64) {
        std::fs::write(&self.file, format!("{skew_s:+}s\n")).expect("the faketime file");
    }
}

impl Drop for MovableClock {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.file);
    }
}

fn faketime(mut vars: Vec<(&'static str, String)>) -> Vec<(&'static str, String)> {
    assert!(
        std::path::Path::new(FAKETIME_LIB).exists(),
        "{FAKETIME_LIB} is missing: apt-get install faketime"
    );
    vars.extend([
        ("LD_PRELOAD", FAKETIME_LIB.to_owned()),
        ("FAKETIME_DONT_FAKE_MONOTONIC", "1".to_owned()),
        ("FAKETIME_DONT_RESET", "1".to_owned()),
    ]);
    vars
}

/// Runs `scripts/lib/<script> ARGS` with `env` added, at most `limit`; its
/// stdout, or why it failed.
pub(crate) fn run_script(
    script: &str,
    args: &[&str],
    env: &[(&str, String)],
    limit: std::time::Duration,
) -> Result<String, String> {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/lib");
    let out = Command::new("timeout")
        .arg(limit.as_secs().to_string())
        .arg(path.join(script))
        .args(args)
        .envs(env.iter().map(|(k, v)| (k, v)))
        .output()
        .map_err(|e| format!("{script} {args:?}: {e}"))?;
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    if out.status.success() {
        Ok(stdout)
    } else {
        Err(format!(
            "{script} {args:?} exited {:?}: {stdout}{}",
            out.status.code(),
            String::from_utf8_lossy(&out.stderr)
        ))
    }
}
