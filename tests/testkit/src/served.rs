//! The real `order-expiry serve` as a child process, its HTTP endpoint, and
//! `/readyz` sampling.

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::ops::{Deref, DerefMut};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use order_expiry::Settings;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_util::sync::CancellationToken;

use crate::child::{Child, Launch};

/// The `order-expiry` binary Cargo built beside the running test (what
/// `env!("CARGO_BIN_EXE_order-expiry")` names in the product's own tests):
/// the test runs from `target/<profile>/deps/`.
pub fn binary() -> PathBuf {
    let test = std::env::current_exe().expect("the test's path");
    let profile = test
        .parent()
        .and_then(Path::parent)
        .expect("a test under target/<profile>/deps");
    let binary = profile.join(format!("order-expiry{}", std::env::consts::EXE_SUFFIX));
    assert!(
        binary.exists(),
        "{} missing: the product's tests build it",
        binary.display()
    );
    binary
}

/// `order-expiry serve` for a world; killed when dropped.
#[derive(Debug)]
pub struct Served {
    child: Child,
    /// Its `/healthz`, `/readyz` and `/metrics`.
    pub addr: SocketAddr,
}

impl Served {
    /// Starts `binary serve` (tests pass `env!("CARGO_BIN_EXE_order-expiry")`)
    /// with `settings` ([`crate::settings_env`]), JSON logs into `log` and HTTP
    /// on a free port; `env` adds or overrides `ORDER_EXPIRY__…` variables.
    /// Returns once it logged its HTTP address.
    pub async fn start(
        binary: &Path,
        settings: &Settings,
        env: &[(&str, &str)],
        log: PathBuf,
    ) -> Self {
        let mut launch = Launch::new(binary, log)
            .args(["serve"])
            .settings(settings)
            .env("ORDER_EXPIRY__HTTP__LISTEN", "127.0.0.1:0")
            .env("ORDER_EXPIRY__LOG__FORMAT", "json");
        for (key, value) in env {
            launch = launch.env(key, value);
        }
        let mut child = launch.spawn().expect("order-expiry serve starts");
        let addr = crate::poll(Duration::from_secs(20), 50, || {
            std::future::ready(match logged_addr(child.log_path()) {
                Some(addr) => Ok(addr),
                None if !child.running() => {
                    panic!("serve exited at start-up:\n{}", child.log_tail(40))
                }
                None => Err(format!(
                    "serve never logged its http address:\n{}",
                    child.log_tail(40)
                )),
            })
        });
        Self {
            addr: addr.await,
            child,
        }
    }

    /// `GET path` → (status, body); `None` when nothing answers.
    pub async fn get(&self, path: &str) -> Option<(u16, String)> {
        http_get(self.addr, path).await
    }

    /// Waits until `/readyz` answers 200; how long that took.
    pub async fn wait_ready(&self, timeout: Duration) -> Duration {
        let start = Instant::now();
        loop {
            if let Some((200, _)) = self.get("/readyz").await {
                return start.elapsed();
            }
            assert!(
                start.elapsed() < timeout,
                "not ready within {timeout:?}:\n{}",
                self.log_tail(30)
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// The sum of the series of `/metrics` that start with `series` (a metric
    /// name with or without labels); 0 when no series matches. Panics when
    /// `/metrics` does not answer 200: a figure read from a dead endpoint is no
    /// figure (a check on it could never fail).
    pub async fn metric(&self, series: &str) -> f64 {
        match self.get("/metrics").await {
            Some((200, text)) => metric_value(&text, series),
            other => panic!(
                "/metrics of serve on {} answered {:?} (reading {series}):\n{}",
                self.addr,
                other.map(|(status, _)| status),
                self.log_tail(20)
            ),
        }
    }

    /// SIGTERM; asserts it exits 0 within 15 s.
    pub async fn terminate(mut self) {
        self.signal("-TERM");
        let status = self.wait_exit(Duration::from_secs(15)).await;
        assert!(
            status.is_some_and(|s| s.success()),
            "serve exited {status:?}"
        );
    }

    /// Asserts that the sweeper cancelled nothing: every cancel of this `serve`
    /// came through the ladder and the consumer. A test of the message path
    /// runs with the sweeper off ([`crate::World::new`]), so this holds by
    /// construction there, and it fails the day someone turns it back on.
    pub async fn assert_nothing_swept(&self) {
        let swept = self.metric("order_expiry_swept_total").await;
        assert_eq!(
            swept, 0.0,
            "the sweeper cancelled {swept} orders: the message path lost them"
        );
    }
}

impl Deref for Served {
    type Target = Child;

    fn deref(&self) -> &Child {
        &self.child
    }
}

impl DerefMut for Served {
    fn deref_mut(&mut self) -> &mut Child {
        &mut self.child
    }
}

/// The `http endpoint listening addr=...` line of a JSON log.
fn logged_addr(log: &Path) -> Option<SocketAddr> {
    let file = std::fs::File::open(log).ok()?;
    BufReader::new(file)
        .lines()
        .map_while(Result::ok)
        .find_map(|line| {
            let value: serde_json::Value = serde_json::from_str(&line).ok()?;
            let fields = value.get("fields")?;
            (fields.get("message")?.as_str()? == "http endpoint listening")
                .then(|| fields.get("addr")?.as_str()?.parse().ok())
                .flatten()
        })
}

/// The sum of `series` over `serves`' metrics.
pub async fn sum_metric(serves: &[Served], series: &str) -> f64 {
    let mut total = 0.0;
    for served in serves {
        total += served.metric(series).await;
    }
    total
}

/// The sum of the series of a Prometheus text that start with `series`.
pub fn metric_value(text: &str, series: &str) -> f64 {
    text.lines()
        .filter(|l| l.starts_with(series))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        // Not `sum()`: an empty float sum is -0.0, which prints as "-0".
        .fold(0.0, |total, value| total + value)
}

/// `GET path` on `addr` → (status, body), within 5 s; `None` when nothing answers.
pub async fn http_get(addr: SocketAddr, path: &str) -> Option<(u16, String)> {
    let exchange = async {
        let mut stream = tokio::net::TcpStream::connect(addr).await.ok()?;
        let request = format!("GET {path} HTTP/1.1\r\nHost: test\r\nConnection: close\r\n\r\n");
        stream.write_all(request.as_bytes()).await.ok()?;
        let mut response = String::new();
        stream.read_to_string(&mut response).await.ok()?;
        let status = response.get(9..12)?.parse().ok()?;
        let body = response.split("\r\n\r\n").nth(1).unwrap_or("").to_owned();
        Some((status, body))
    };
    tokio::time::timeout(Duration::from_secs(5), exchange)
        .await
        .ok()
        .flatten()
}

/// Polls `/readyz` every 100 ms in the background and keeps every answer, so a
/// test can ask what readiness said during and after a fault.
#[derive(Debug)]
pub struct ReadyWatch {
    samples: Arc<Mutex<Vec<(Instant, u16)>>>,
    stop: CancellationToken,
}

impl ReadyWatch {
    /// Starts polling `served`.
    pub fn start(served: &Served) -> Self {
        let samples = Arc::new(Mutex::new(Vec::new()));
        let stop = CancellationToken::new();
        let (addr, keep, done) = (served.addr, Arc::clone(&samples), stop.clone());
        tokio::spawn(async move {
            while !done.is_cancelled() {
                let status = http_get(addr, "/readyz").await.map_or(0, |(s, _)| s);
                keep.lock().unwrap().push((Instant::now(), status));
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        });
        Self { samples, stop }
    }

    /// Waits until `/readyz` said `status` after `since`; when it did.
    pub async fn wait_for(&self, status: u16, since: Instant, timeout: Duration) -> Instant {
        crate::poll(timeout, 50, || async {
            let samples = self.samples.lock().unwrap();
            let seen = samples.iter().find(|(at, s)| *at >= since && *s == status);
            seen.map(|(at, _)| *at)
                .ok_or_else(|| format!("/readyz never answered {status} within {timeout:?}"))
        })
        .await
    }

    /// The first answer after `since` that `matches`, and when it came.
    pub fn first_after(&self, since: Instant, matches: impl Fn(u16) -> bool) -> Option<Instant> {
        self.samples
            .lock()
            .unwrap()
            .iter()
            .find(|(at, s)| *at >= since && matches(*s))
            .map(|(at, _)| *at)
    }

    /// Every answer between `from` and `to`.
    pub fn between(&self, from: Instant, to: Instant) -> Vec<u16> {
        self.samples
            .lock()
            .unwrap()
            .iter()
            .filter(|(at, _)| *at >= from && *at <= to)
            .map(|(_, s)| *s)
            .collect()
    }
}

impl Drop for ReadyWatch {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}
