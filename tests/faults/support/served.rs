//! The real `order-expiry serve` as a child process, and `/readyz` sampling.

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_util::sync::CancellationToken;

use super::*;

static CLK_TCK: std::sync::OnceLock<f64> = std::sync::OnceLock::new();

/// The real `order-expiry serve`, killed when dropped.
pub struct Served {
    child: Child,
    pub addr: SocketAddr,
    log: PathBuf,
    exited: Option<ExitStatus>,
}

impl Served {
    pub(super) fn spawn(world: &World, env: &[(&str, &str)]) -> Self {
        use secrecy::ExposeSecret;
        let n = std::fs::read_dir(&world.logs).map_or(0, |d| d.count());
        let log = world.logs.join(format!("serve-{n}.log"));
        let file = std::fs::File::create(&log).expect("log file");
        let mut command = Command::new(env!("CARGO_BIN_EXE_order-expiry"));
        command
            .arg("serve")
            .env_remove("RUST_LOG")
            .env("ORDER_EXPIRY__AMQP__URL", amqp_url())
            .env(
                "ORDER_EXPIRY__DATABASE__URL",
                world.settings.database.url.expose_secret(),
            )
            .env(
                "ORDER_EXPIRY__TOPOLOGY__PREFIX",
                &world.settings.topology.prefix,
            )
            .env("ORDER_EXPIRY__TOPOLOGY__LEVELS", LEVELS.to_string())
            .env("ORDER_EXPIRY__HTTP__LISTEN", "127.0.0.1:0")
            .env("ORDER_EXPIRY__LOG__FORMAT", "json")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(file);
        for (key, value) in env {
            command.env(key, value);
        }
        let child = command.spawn().expect("order-expiry serve starts");
        let mut served = Self {
            child,
            addr: SocketAddr::from(([127, 0, 0, 1], 0)),
            log,
            exited: None,
        };
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Some(addr) = served.logged_addr() {
                served.addr = addr;
                return served;
            }
            if let Ok(Some(status)) = served.child.try_wait() {
                panic!(
                    "serve exited at start-up ({status}):\n{}",
                    served.log_tail(40)
                );
            }
            assert!(
                Instant::now() < deadline,
                "serve never logged its http address:\n{}",
                served.log_tail(40)
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// The `http endpoint listening addr=...` line of the JSON log.
    fn logged_addr(&self) -> Option<SocketAddr> {
        let file = std::fs::File::open(&self.log).ok()?;
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

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Log lines (JSON) whose message contains `text`.
    pub fn log_count(&self, text: &str) -> usize {
        std::fs::read_to_string(&self.log)
            .unwrap_or_default()
            .lines()
            .filter(|l| l.contains(text))
            .count()
    }

    pub fn log_tail(&self, n: usize) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(n)..].join("\n")
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
    /// name with or without labels); 0 when absent.
    pub async fn metric(&self, series: &str) -> f64 {
        let Some((200, text)) = self.get("/metrics").await else {
            return 0.0;
        };
        metric_value(&text, series)
    }

    /// User + system CPU time of the process so far.
    pub fn cpu_seconds(&self) -> f64 {
        let stat = std::fs::read_to_string(format!("/proc/{}/stat", self.pid())).expect("stat");
        let rest = &stat[stat.rfind(')').expect("comm") + 2..];
        let fields: Vec<&str> = rest.split_whitespace().collect();
        let ticks: f64 = fields[11].parse::<f64>().unwrap() + fields[12].parse::<f64>().unwrap();
        let per_second = *CLK_TCK.get_or_init(|| {
            run("getconf", &["CLK_TCK"])
                .ok()
                .and_then(|t| t.trim().parse().ok())
                .unwrap_or(100.0)
        });
        ticks / per_second
    }

    /// Still running (did not exit on its own)?
    pub fn running(&mut self) -> bool {
        self.exited.is_none() && matches!(self.child.try_wait(), Ok(None))
    }

    pub fn signal(&self, signal: &str) {
        run("kill", &[signal, &self.pid().to_string()]).expect("kill");
    }

    /// Waits for the process to exit; `None` if it is still running at `timeout`.
    pub fn wait_exit(&mut self, timeout: Duration) -> Option<ExitStatus> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.child.try_wait().expect("try_wait") {
                self.exited = Some(status);
                return Some(status);
            }
            if Instant::now() > deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        if self.exited.is_none() && matches!(self.child.try_wait(), Ok(None)) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
        if std::thread::panicking() {
            eprintln!(
                "--- last lines of {} ---\n{}",
                self.log.display(),
                self.log_tail(40)
            );
        }
    }
}

pub fn metric_value(text: &str, series: &str) -> f64 {
    text.lines()
        .filter(|l| l.starts_with(series))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

async fn http_get(addr: SocketAddr, path: &str) -> Option<(u16, String)> {
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
pub struct ReadyWatch {
    samples: Arc<Mutex<Vec<(Instant, u16)>>>,
    stop: CancellationToken,
}

impl ReadyWatch {
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
        let deadline = Instant::now() + timeout;
        loop {
            let seen = self
                .samples
                .lock()
                .unwrap()
                .iter()
                .find(|(at, s)| *at >= since && *s == status)
                .map(|(at, _)| *at);
            if let Some(at) = seen {
                return at;
            }
            assert!(
                Instant::now() < deadline,
                "/readyz never answered {status} within {timeout:?}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
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
