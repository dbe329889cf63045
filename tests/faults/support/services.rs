//! Breaking and restoring the real services: [`Outage`] and the `ensure_*_up`
//! functions every test starts with.

use std::net::{SocketAddr, TcpStream};
use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use order_expiry_testkit::amqp_port;

const PG_PORT: u16 = 5432;

/// Runs a command to completion; its output on failure. The command starts with
/// every file descriptor above stderr closed: a broker or database it (re)starts
/// must not inherit, and so hold forever, a lock file or pipe of this process
/// (e.g. the `flock` that serialises fault runs).
pub fn run(program: &str, args: &[&str]) -> Result<String, String> {
    const CLOSE_FDS_THEN_EXEC: &str = r#"for fd in /proc/$$/fd/*; do n=${fd##*/}; if [ "$n" -gt 2 ]; then eval "exec $n>&-"; fi; done 2>/dev/null; exec "$@""#;
    let out = Command::new("bash")
        .args(["-c", CLOSE_FDS_THEN_EXEC, "bash", program])
        .args(args)
        .output()
        .map_err(|e| format!("{program} {args:?}: {e}"))?;
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    if out.status.success() {
        Ok(text)
    } else {
        Err(format!("{program} {args:?} failed: {text}"))
    }
}

/// The words of `words` (split at spaces), then `last`.
pub fn argv<'a>(words: &'a str, last: &'a str) -> Vec<&'a str> {
    words.split(' ').chain([last]).collect()
}

fn port_open(port: u16) -> bool {
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    TcpStream::connect_timeout(&addr, Duration::from_millis(300)).is_ok()
}

/// Checks `check` every `every_ms` until it holds (true) or `limit` has passed (false).
fn wait_until(limit: Duration, every_ms: u64, mut check: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + limit;
    while !check() {
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(every_ms));
    }
    true
}

/// Brings RabbitMQ back if it is not serving: `start_app` when the node runs
/// with its application stopped, `rabbitmq-server -detached` when the node is
/// gone; then waits for the port and `await_startup`. Idempotent.
pub fn ensure_broker_up() {
    let port = amqp_port();
    if !port_open(port) {
        if run("rabbitmqctl", &["-q", "start_app"]).is_err() {
            let _ = run("rabbitmq-server", &["-detached"]);
        }
        assert!(
            wait_until(Duration::from_secs(90), 100, || port_open(port)),
            "RabbitMQ did not open {port} within 90 s"
        );
    }
    let _ = run("rabbitmqctl", &["-q", "await_startup", "--timeout", "90"]);
    await_no_alarm();
}

/// Waits (up to 60 s) until the node has no resource alarm: a node in a
/// memory or disk alarm answers AMQP but blocks every publisher, so it is
/// not back for the tests' bounds until the alarm clears. Says so when it
/// waited, so that a late order's figures name the cause.
fn await_no_alarm() {
    let started = Instant::now();
    let mut last = String::new();
    wait_until(Duration::from_secs(60), 100, || {
        match run("rabbitmqctl", &["-q", "eval", "rabbit_alarm:get_alarms()."]) {
            Ok(alarms) if alarms.trim() == "[]" => return true,
            Ok(alarms) => last = alarms.trim().to_owned(),
            Err(e) => last = e,
        }
        false
    });
    if !last.is_empty() {
        eprintln!(
            "the broker was in a resource alarm for {:.1} s after it started: {last}",
            started.elapsed().as_secs_f64()
        );
    }
}

fn pg_version() -> String {
    let dir = std::fs::read_dir("/etc/postgresql").into_iter().flatten();
    let versions = dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok());
    versions
        .max()
        .map_or_else(|| "15".into(), |v| v.to_string())
}

fn pg_ctlcluster(action: &str) -> Result<String, String> {
    run(
        "pg_ctlcluster",
        &["--skip-systemctl-redirect", &pg_version(), "main", action],
    )
}

/// Starts PostgreSQL if its port is closed and waits until it accepts queries.
pub fn ensure_database_up() {
    if !port_open(PG_PORT) {
        let _ = pg_ctlcluster("start");
        assert!(
            wait_until(Duration::from_secs(60), 100, || port_open(PG_PORT)),
            "PostgreSQL did not open {PG_PORT} within 60 s"
        );
    }
    let select_1 = argv("-h 127.0.0.1 -U postgres -d postgres -Atqc", "select 1");
    let answers = || run("psql", &select_1).is_ok();
    assert!(
        wait_until(Duration::from_secs(30), 200, answers),
        "PostgreSQL does not answer"
    );
}

/// Lines of the test broker's log files that contain `needle` (0 when the
/// logs cannot be read): evidence for a failure's story. The logs are in
/// `ORDER_EXPIRY_TEST_RABBITMQ_LOG_DIR` (scripts/test sets it for the 4.3 node),
/// default `/var/log/rabbitmq`.
pub fn broker_log_count(needle: &str) -> usize {
    let dir = std::env::var("ORDER_EXPIRY_TEST_RABBITMQ_LOG_DIR")
        .unwrap_or_else(|_| "/var/log/rabbitmq".into());
    let Ok(dir) = std::fs::read_dir(dir) else {
        return 0;
    };
    dir.filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().ends_with(".log"))
        .filter_map(|e| std::fs::read_to_string(e.path()).ok())
        .map(|text| text.lines().filter(|l| l.contains(needle)).count())
        .sum()
}

/// RabbitMQ's stock `dead_letter_worker_publisher_confirm_timeout`.
const STOCK_DEAD_LETTER_RETRY: Duration = Duration::from_secs(180);

/// How long the test broker's at-least-once dead-letter worker waits before it
/// retries what it could not route (`dead_letter_worker_publisher_confirm_timeout`,
/// read from the running node): 5 s with the deployed configuration
/// (`deploy/rabbitmq/advanced.config`, which scripts/test gives both test
/// brokers), 180 s with stock settings (`ORDER_EXPIRY_BROKER_SETTINGS=stock`).
/// A ladder level that stalls at boot, or a due queue that is missing, holds
/// its messages that long: the bounds the restart tests assert follow from it.
pub fn dead_letter_retry() -> Duration {
    let expr = "application:get_env(rabbit, dead_letter_worker_publisher_confirm_timeout).";
    let answer = run("rabbitmqctl", &["-q", "eval", expr]).expect("rabbitmqctl eval");
    parse_dead_letter_retry(answer.trim())
        .unwrap_or_else(|| panic!("dead_letter_worker_publisher_confirm_timeout: {answer:?}"))
}

fn parse_dead_letter_retry(answer: &str) -> Option<Duration> {
    if answer == "undefined" {
        return Some(STOCK_DEAD_LETTER_RETRY);
    }
    let ms = answer
        .strip_prefix("{ok,")?
        .strip_suffix('}')?
        .parse()
        .ok()?;
    Some(Duration::from_millis(ms))
}

/// What an [`Outage`] broke.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// `rabbitmqctl stop_app`: the node stays, AMQP closes every connection.
    BrokerStopApp,
    /// `kill -9` of RabbitMQ's `beam.smp`.
    BrokerKill,
    /// `pg_ctlcluster ... stop` (fast: open sessions are terminated).
    DatabaseStop,
}

/// A broken service. [`Outage::restore`] brings it back and says when it
/// answered again; dropping the guard does the same if the test did not get that
/// far (a failed assertion), so the services are always left running.
#[must_use = "dropping the outage restores the service at once"]
#[derive(Debug)]
pub struct Outage {
    fault: Fault,
    restored: bool,
}

impl Outage {
    pub fn begin(fault: Fault) -> Self {
        // Armed before the fault, so even a half-done fault is undone.
        let outage = Self {
            fault,
            restored: false,
        };
        match fault {
            Fault::BrokerStopApp => {
                run("rabbitmqctl", &["-q", "stop_app"]).expect("stop_app");
            }
            Fault::BrokerKill => {
                let status = run("rabbitmqctl", &["status"]).expect("rabbitmqctl status");
                let pid = status
                    .lines()
                    .find_map(|l| l.trim().strip_prefix("OS PID: "))
                    .expect("OS PID in rabbitmqctl status")
                    .trim()
                    .to_owned();
                run("kill", &["-9", &pid]).expect("kill -9 beam.smp");
                // Wait until it is really gone, so the restart is a restart.
                let proc = PathBuf::from(format!("/proc/{pid}"));
                wait_until(Duration::from_secs(10), 50, || !proc.exists());
            }
            Fault::DatabaseStop => {
                pg_ctlcluster("stop").expect("pg_ctlcluster stop");
            }
        }
        assert!(
            !port_open(outage.port()),
            "{fault:?}: port {} still open",
            outage.port()
        );
        outage
    }

    fn port(&self) -> u16 {
        match self.fault {
            Fault::BrokerStopApp | Fault::BrokerKill => amqp_port(),
            Fault::DatabaseStop => PG_PORT,
        }
    }

    /// Brings the service back; returns when it answers again.
    pub fn restore(mut self) -> Instant {
        self.restore_now();
        Instant::now()
    }

    fn restore_now(&mut self) {
        if self.restored {
            return;
        }
        self.restored = true;
        match self.fault {
            Fault::BrokerStopApp => {
                let _ = run("rabbitmqctl", &["-q", "start_app"]);
                ensure_broker_up();
            }
            Fault::BrokerKill => {
                let _ = run("rabbitmq-server", &["-detached"]);
                ensure_broker_up();
            }
            Fault::DatabaseStop => ensure_database_up(),
        }
    }
}

impl Drop for Outage {
    fn drop(&mut self) {
        if !self.restored {
            eprintln!("restoring after {:?} (test did not finish)", self.fault);
        }
        self.restore_now();
    }
}

#[test]
fn the_dead_letter_retry_is_read_from_the_node_answer() {
    assert_eq!(
        parse_dead_letter_retry("{ok,5000}"),
        Some(Duration::from_secs(5))
    );
    assert_eq!(
        parse_dead_letter_retry("undefined"),
        Some(STOCK_DEAD_LETTER_RETRY)
    );
    assert_eq!(parse_dead_letter_retry("{badrpc,nodedown}"), None);
}
