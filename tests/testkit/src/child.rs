//! Our binaries as child processes (`order-expiry serve`, a benchmark's own
//! publisher role): a world's settings passed as `ORDER_EXPIRY__…` variables,
//! stderr in a log file, killed on drop. A child has its own address space, so
//! `/proc` shows its own peak RSS and CPU time.

use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::time::Duration;

use anyhow::bail;
use order_expiry::{Settings, settings::ENV_PREFIX};
use secrecy::ExposeSecret;
use tokio::io::{AsyncBufReadExt, BufReader, Lines};
use tokio::process::{ChildStdout, Command};

use crate::procfs;

/// The settings that tell a world apart, and those benchmarks vary, as
/// `ORDER_EXPIRY__…` variables (the statements only when they are not the
/// defaults); everything else stays at the child's defaults.
pub fn settings_env(s: &Settings) -> Vec<(String, String)> {
    let defaults = Settings::default();
    let statements = [
        (
            "DATABASE__CANCEL_SQL",
            &s.database.cancel_sql,
            &defaults.database.cancel_sql,
        ),
        (
            "SWEEPER__SWEEP_SQL",
            &s.sweeper.sweep_sql,
            &defaults.sweeper.sweep_sql,
        ),
    ]
    .into_iter()
    .filter(|(_, sql, default)| sql != default)
    .map(|(key, sql, _)| (key, sql.clone()));
    [
        ("AMQP__URL", s.amqp.url.expose_secret().to_owned()),
        ("AMQP__TIMEOUT_MS", s.amqp.timeout.as_millis().to_string()),
        ("TOPOLOGY__PREFIX", s.topology.prefix.clone()),
        ("TOPOLOGY__LEVELS", s.topology.levels.to_string()),
        (
            "TOPOLOGY__QUEUE_TYPE",
            s.topology.queue_type.as_str().to_owned(),
        ),
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
        ("SWEEPER__ENABLED", s.sweeper.enabled.to_string()),
        (
            "SWEEPER__INTERVAL_MS",
            s.sweeper.interval.as_millis().to_string(),
        ),
        ("SWEEPER__GRACE_MS", s.sweeper.grace.as_millis().to_string()),
    ]
    .into_iter()
    .chain(statements)
    .map(|(k, v)| (format!("{ENV_PREFIX}__{k}"), v))
    .collect()
}

/// How to start a [`Child`].
#[derive(Debug)]
pub struct Launch {
    program: PathBuf,
    args: Vec<String>,
    env: Vec<(String, String)>,
    wrap: Vec<String>,
    stdout: bool,
    log: PathBuf,
}

impl Launch {
    /// `program`, its stderr into `log`.
    pub fn new(program: impl Into<PathBuf>, log: PathBuf) -> Self {
        Self {
            program: program.into(),
            args: Vec::new(),
            env: Vec::new(),
            wrap: Vec::new(),
            stdout: false,
            log,
        }
    }

    /// Its arguments.
    pub fn args<I: IntoIterator<Item = S>, S: Into<String>>(mut self, args: I) -> Self {
        self.args.extend(args.into_iter().map(Into::into));
        self
    }

    /// `settings` as variables ([`settings_env`]).
    pub fn settings(mut self, settings: &Settings) -> Self {
        self.env.extend(settings_env(settings));
        self
    }

    /// One more variable; a later one wins.
    pub fn env(mut self, key: &str, value: &str) -> Self {
        self.env.push((key.to_owned(), value.to_owned()));
        self
    }

    /// Runs it under `wrap` (e.g. `valgrind --tool=callgrind`), when given.
    pub fn wrap(mut self, wrap: Option<&str>) -> Self {
        self.wrap = wrap
            .map(|w| w.split_whitespace().map(str::to_owned).collect())
            .unwrap_or_default();
        self
    }

    /// Pipes its stdout ([`Child::stdout_lines`]).
    pub fn stdout(mut self) -> Self {
        self.stdout = true;
        self
    }

    /// Starts it.
    pub fn spawn(self) -> std::io::Result<Child> {
        let mut words = self.wrap;
        words.push(self.program.to_string_lossy().into_owned());
        words.extend(self.args);
        let log_file = std::fs::File::create(&self.log)?;
        let mut command = Command::new(&words[0]);
        command
            .args(&words[1..])
            .env_remove("RUST_LOG")
            .envs(self.env)
            .stdin(Stdio::null())
            .stdout(if self.stdout {
                Stdio::piped()
            } else {
                Stdio::null()
            })
            .stderr(log_file)
            .kill_on_drop(true);
        let child = command.spawn()?;
        let pid = child.id().unwrap_or_default();
        Ok(Child {
            child,
            pid,
            log: self.log,
            exited: None,
        })
    }
}

/// A running child process; killed when dropped.
#[derive(Debug)]
pub struct Child {
    child: tokio::process::Child,
    pid: u32,
    log: PathBuf,
    exited: Option<ExitStatus>,
}

impl Child {
    /// The process id.
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// Its stdout, one line at a time (only when launched with `stdout`).
    pub fn stdout_lines(&mut self) -> Option<Lines<BufReader<ChildStdout>>> {
        self.child
            .stdout
            .take()
            .map(|out| BufReader::new(out).lines())
    }

    /// Where its stderr goes.
    pub fn log_path(&self) -> &Path {
        &self.log
    }

    /// The last `n` lines of its log.
    pub fn log_tail(&self, n: usize) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(n)..].join("\n")
    }

    /// Log lines that contain `text`.
    pub fn log_count(&self, text: &str) -> usize {
        let log = std::fs::read_to_string(&self.log).unwrap_or_default();
        log.lines().filter(|l| l.contains(text)).count()
    }

    /// User + system CPU time of the process so far.
    pub fn cpu_seconds(&self) -> f64 {
        procfs::cpu_seconds(&self.pid.to_string(), false).unwrap_or(0.0)
    }

    /// Still running (did not exit on its own)?
    pub fn running(&mut self) -> bool {
        self.exited.is_none() && matches!(self.child.try_wait(), Ok(None))
    }

    /// Sends `signal` (`-TERM`, `-KILL`, ...).
    pub fn signal(&self, signal: &str) {
        let status = std::process::Command::new("kill")
            .args([signal, &self.pid.to_string()])
            .status()
            .expect("kill runs");
        assert!(status.success(), "kill {signal} {}", self.pid);
    }

    /// Waits for the process to exit; `None` if it is still running at `timeout`.
    pub async fn wait_exit(&mut self, timeout: Duration) -> Option<ExitStatus> {
        if let Some(status) = self.exited {
            return Some(status);
        }
        let status = tokio::time::timeout(timeout, self.child.wait())
            .await
            .ok()?
            .ok()?;
        self.exited = Some(status);
        Some(status)
    }

    /// SIGTERM, then [`Child::finish`] within `grace`.
    pub async fn stop(self, grace: Duration) -> anyhow::Result<()> {
        self.signal("-TERM");
        self.finish(grace).await
    }

    /// SIGTERM, then [`Child::exited_cleanly`] within `grace`; the log is
    /// kept either way (the soak's report links it).
    pub async fn stop_keeping_log(&mut self, grace: Duration) -> anyhow::Result<()> {
        self.signal("-TERM");
        self.exited_cleanly(grace).await
    }

    /// Waits for a clean exit (killing it after `limit`); removes the log when
    /// it exited 0.
    pub async fn finish(mut self, limit: Duration) -> anyhow::Result<()> {
        self.exited_cleanly(limit).await?;
        let _ = std::fs::remove_file(&self.log);
        Ok(())
    }

    /// Waits for an exit with status 0 within `limit`; the log quoted otherwise.
    pub async fn exited_cleanly(&mut self, limit: Duration) -> anyhow::Result<()> {
        let log = self.log.display().to_string();
        match self.wait_exit(limit).await {
            Some(status) if status.success() => Ok(()),
            Some(status) => bail!("child exited with {status}; {log}: {}", self.log_tail(5)),
            None => bail!(
                "child did not exit within {limit:?}; {log}: {}",
                self.log_tail(5)
            ),
        }
    }
}

impl Drop for Child {
    fn drop(&mut self) {
        if self.running() {
            let _ = self.child.start_kill();
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

/// [`try_run_cli`] of the tests' `order-expiry`, within 5 minutes;
/// panics when it does not end.
pub async fn run_cli(
    settings: &Settings,
    args: &[&str],
    extra: &[(&str, &str)],
) -> std::process::Output {
    let binary = crate::served::binary();
    let out = try_run_cli(&binary, settings, args, extra, Duration::from_secs(300)).await;
    out.unwrap_or_else(|e| panic!("{e:#}"))
}

/// `binary ARGS` (an `order-expiry`) with `settings` ([`settings_env`]) and
/// `extra` variables (`RUST_LOG` unset): its output once it ended, or why
/// not within `limit` (killed then).
pub async fn try_run_cli(
    binary: &Path,
    settings: &Settings,
    args: &[&str],
    extra: &[(&str, &str)],
    limit: Duration,
) -> anyhow::Result<std::process::Output> {
    let mut command = Command::new(binary);
    command
        .args(args)
        .env_remove("RUST_LOG")
        .envs(settings_env(settings))
        .kill_on_drop(true);
    command.envs(extra.iter().copied());
    let out = tokio::time::timeout(limit, command.output()).await;
    let out = out.map_err(|_| anyhow::anyhow!("order-expiry {args:?} took over {limit:?}"))?;
    Ok(out?)
}

/// [`try_succeeded`], panicking with its stdout and stderr on failure.
pub fn succeeded(what: impl std::fmt::Display, out: &std::process::Output) -> String {
    try_succeeded(what, out).unwrap_or_else(|e| panic!("{e}"))
}

/// The stdout of `what`, a command that ended; its stdout and stderr when it
/// failed.
pub fn try_succeeded(
    what: impl std::fmt::Display,
    out: &std::process::Output,
) -> Result<String, String> {
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    match out.status.success() {
        true => Ok(stdout),
        false => Err(format!(
            "{what} failed ({}):\n{stdout}\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        )),
    }
}
