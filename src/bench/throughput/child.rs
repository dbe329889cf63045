//! Child processes of the benchmark: the real `order-expiry serve` for the drain
//! and the footprint, and the publisher that schedules a million orders. A child
//! has its own address space, so its peak RSS and CPU time in `/proc` are its own,
//! not mixed with the benchmark's preloading and bookkeeping.

use std::process::Stdio;
use std::time::Duration;

use anyhow::{Context, bail};
use secrecy::ExposeSecret;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt};
use tokio::process::{Child, Command};
use tokio::time::Instant;

use crate::settings::{QueueType, Settings};

/// A child `order-expiry` process started with `settings` in its environment.
pub(super) struct ChildProcess {
    child: Child,
    pid: String,
    log: std::path::PathBuf,
}

impl ChildProcess {
    /// Starts `order-expiry <args>` with `settings` passed as `ORDER_EXPIRY__…`
    /// variables, under `wrap` (e.g. `valgrind --tool=callgrind`) when given.
    pub(super) fn spawn(
        settings: &Settings,
        args: &[&str],
        wrap: Option<&str>,
        stdout: bool,
    ) -> anyhow::Result<Self> {
        let exe = std::env::current_exe().context("locating the order-expiry binary")?;
        let mut words: Vec<String> = wrap
            .map(|w| w.split_whitespace().map(str::to_owned).collect())
            .unwrap_or_default();
        words.push(exe.to_string_lossy().into_owned());
        words.extend(args.iter().map(|a| (*a).to_owned()));
        let log = std::env::temp_dir().join(format!(
            "order-expiry-bench-{}-{}.log",
            args.first().copied().unwrap_or("child"),
            uuid::Uuid::new_v4().simple()
        ));
        let log_file = std::fs::File::create(&log)?;
        let mut command = Command::new(&words[0]);
        command
            .args(&words[1..])
            .env_remove("RUST_LOG")
            .envs(environment(settings))
            .stdin(Stdio::null())
            .stdout(if stdout {
                Stdio::piped()
            } else {
                Stdio::null()
            })
            .stderr(log_file)
            .kill_on_drop(true);
        let child = command
            .spawn()
            .with_context(|| format!("starting {words:?}"))?;
        let pid = child.id().context("child has no pid")?.to_string();
        Ok(Self { child, pid, log })
    }

    /// The process id, for `/proc`.
    pub(super) fn pid(&self) -> &str {
        &self.pid
    }

    /// Its stdout, one line at a time (only when spawned with `stdout`).
    pub(super) fn lines(
        &mut self,
    ) -> Option<tokio::io::Lines<tokio::io::BufReader<tokio::process::ChildStdout>>> {
        self.child
            .stdout
            .take()
            .map(|out| tokio::io::BufReader::new(out).lines())
    }

    /// Sends SIGTERM and waits for a clean exit; kills it after `grace`.
    pub(super) async fn stop(self, grace: Duration) -> anyhow::Result<()> {
        let _ = Command::new("kill")
            .args(["-TERM", &self.pid])
            .status()
            .await;
        self.wait(grace).await
    }

    /// Waits for the process to exit by itself; kills it after `limit`.
    pub(super) async fn wait(mut self, limit: Duration) -> anyhow::Result<()> {
        match tokio::time::timeout(limit, self.child.wait()).await {
            Ok(Ok(status)) if status.success() => {
                let _ = std::fs::remove_file(&self.log);
                Ok(())
            }
            Ok(Ok(status)) => bail!("child exited with {status}; its log: {}", self.log_tail()),
            Ok(Err(e)) => Err(e.into()),
            Err(_) => {
                let _ = self.child.kill().await;
                bail!(
                    "child did not exit within {limit:?}; its log: {}",
                    self.log_tail()
                )
            }
        }
    }

    /// The end of its stderr, for error messages.
    pub(super) fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let tail: Vec<&str> = text.lines().rev().take(5).collect();
        format!(
            "{} [...] {}",
            self.log.display(),
            tail.into_iter().rev().collect::<Vec<_>>().join(" | ")
        )
    }
}

/// The settings a child needs, as `ORDER_EXPIRY__…` variables.
fn environment(s: &Settings) -> Vec<(String, String)> {
    let queue_type = match s.topology.queue_type {
        QueueType::Quorum => "quorum",
        QueueType::Classic => "classic",
    };
    [
        ("AMQP__URL", s.amqp.url.expose_secret().to_owned()),
        ("AMQP__TIMEOUT_MS", s.amqp.timeout_ms.to_string()),
        ("TOPOLOGY__PREFIX", s.topology.prefix.clone()),
        ("TOPOLOGY__LEVELS", s.topology.levels.to_string()),
        ("TOPOLOGY__QUEUE_TYPE", queue_type.to_owned()),
        (
            "PUBLISHER__MAX_IN_FLIGHT",
            s.publisher.max_in_flight.to_string(),
        ),
        ("CONSUMER__PREFETCH", s.consumer.prefetch.to_string()),
        ("CONSUMER__BATCH_MAX", s.consumer.batch_max.to_string()),
        (
            "CONSUMER__BATCH_CONCURRENCY",
            s.consumer.batch_concurrency.to_string(),
        ),
        ("DATABASE__URL", s.database.url.expose_secret().to_owned()),
        ("DATABASE__POOL_SIZE", s.database.pool_size.to_string()),
        ("HTTP__LISTEN", s.http.listen.clone()),
        // The production default (info): per-delivery spans are created as in a
        // real deployment. The log goes to a file.
        ("LOG__FILTER", "info".to_owned()),
    ]
    .into_iter()
    .map(|(k, v)| (format!("{}__{k}", crate::settings::ENV_PREFIX), v))
    .collect()
}

/// A free local port for a child's HTTP endpoint.
pub(super) fn free_port() -> anyhow::Result<u16> {
    let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
    Ok(listener.local_addr()?.port())
}

/// `order_expiry_messages_total{outcome="cancelled"}` from a child's `/metrics`,
/// or `None` while it does not answer yet.
pub(super) async fn cancelled_metric(port: u16) -> Option<u64> {
    let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .ok()?;
    stream
        .write_all(b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
        .await
        .ok()?;
    let mut text = String::new();
    stream.read_to_string(&mut text).await.ok()?;
    let needle = "order_expiry_messages_total{outcome=\"cancelled\"}";
    Some(
        text.lines()
            .find(|l| l.starts_with(needle))
            .and_then(|l| l.split_whitespace().last())
            .and_then(|v| v.parse::<f64>().ok())
            .map_or(0, |v| v as u64),
    )
}

/// Polls `port` every `every` until `n` orders are cancelled; the instant it saw it.
pub(super) async fn wait_cancelled(
    port: u16,
    n: u64,
    every: Duration,
    limit: Duration,
) -> anyhow::Result<Instant> {
    let deadline = Instant::now() + limit;
    let mut last = 0;
    loop {
        if let Some(seen) = cancelled_metric(port).await {
            last = seen;
            if seen >= n {
                return Ok(Instant::now());
            }
        }
        if Instant::now() > deadline {
            bail!("only {last} of {n} orders cancelled within {limit:?}");
        }
        tokio::time::sleep(every).await;
    }
}
