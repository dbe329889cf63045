//! What else was slow while a run ran, so that a late run says whether the
//! machine or the process stood still: a thread of its own and a task on the
//! run's tokio runtime each wake every 10 ms and note when they woke more than
//! 100 ms late; a third thread writes and syncs 4 KiB to a file in the
//! temporary directory every 50 ms and notes syncs slower than 100 ms (the
//! broker's quorum queues and PostgreSQL sync the same disk on this machine);
//! and the machine's steal and iowait time is read from `/proc/stat` before
//! and after.
//!
//! A thread that woke late means the whole machine did not run it (steal, a
//! host stall); a task that woke late while the thread did not means the
//! runtime's workers were busy (the consumer shares them with the benchmark);
//! a slow sync means the disk stood still.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use serde::Serialize;

/// How often each watcher wakes.
const TICK: Duration = Duration::from_millis(10);
/// A wake-up later than this, or a sync slower, is a stall.
const STALL: Duration = Duration::from_millis(100);
/// How often the disk watcher syncs.
const SYNC_EVERY: Duration = Duration::from_millis(50);

/// One late wake-up.
#[derive(Debug, Clone, Serialize)]
pub struct Stall {
    /// When the watcher woke.
    pub at: DateTime<Utc>,
    /// How much later than its tick it woke, in milliseconds.
    pub lag_ms: f64,
}

/// What the watchers saw over a run.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Stalls {
    /// Late wake-ups of the plain thread.
    pub thread: Vec<Stall>,
    /// Late wake-ups of the task on the run's runtime.
    pub runtime: Vec<Stall>,
    /// Slow syncs of 4 KiB to the temporary directory's disk.
    pub disk: Vec<Stall>,
    /// CPU time the hypervisor took from this machine, all CPUs, ms.
    pub steal_ms: u64,
    /// Time the CPUs sat idle waiting for I/O, all CPUs, ms.
    pub iowait_ms: u64,
}

/// The running watchers; [`StallWatch::finish`] stops them.
pub(super) struct StallWatch {
    stop: Arc<AtomicBool>,
    thread: std::thread::JoinHandle<Vec<Stall>>,
    task: tokio::task::JoinHandle<Vec<Stall>>,
    disk: std::thread::JoinHandle<Vec<Stall>>,
    before: Option<CpuTimes>,
}

impl StallWatch {
    /// Starts the three watchers; call from inside the run's runtime.
    pub(super) fn start() -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let stop = Arc::clone(&stop);
            std::thread::spawn(move || {
                let mut seen = Vec::new();
                while !stop.load(Ordering::Relaxed) {
                    let asleep = Instant::now();
                    std::thread::sleep(TICK);
                    note(&mut seen, asleep.elapsed().saturating_sub(TICK));
                }
                seen
            })
        };
        let task = {
            let stop = Arc::clone(&stop);
            tokio::spawn(async move {
                let mut seen = Vec::new();
                while !stop.load(Ordering::Relaxed) {
                    let asleep = Instant::now();
                    tokio::time::sleep(TICK).await;
                    note(&mut seen, asleep.elapsed().saturating_sub(TICK));
                }
                seen
            })
        };
        let disk = {
            let stop = Arc::clone(&stop);
            std::thread::spawn(move || watch_disk(&stop))
        };
        Self {
            stop,
            thread,
            task,
            disk,
            before: CpuTimes::read(),
        }
    }

    /// Stops the watchers and returns what they saw.
    pub(super) async fn finish(self) -> Stalls {
        self.stop.store(true, Ordering::Relaxed);
        let runtime = self.task.await.unwrap_or_default();
        let (thread, disk) = tokio::task::spawn_blocking(move || {
            (
                self.thread.join().unwrap_or_default(),
                self.disk.join().unwrap_or_default(),
            )
        })
        .await
        .unwrap_or_default();
        let (steal_ms, iowait_ms) = match (self.before, CpuTimes::read()) {
            (Some(before), Some(after)) => (
                after.steal_ms.saturating_sub(before.steal_ms),
                after.iowait_ms.saturating_sub(before.iowait_ms),
            ),
            _ => (0, 0),
        };
        Stalls {
            thread,
            runtime,
            disk,
            steal_ms,
            iowait_ms,
        }
    }
}

/// Writes and syncs 4 KiB every [`SYNC_EVERY`] until `stop`; the syncs slower
/// than [`STALL`]. Nothing when the file cannot be made.
fn watch_disk(stop: &AtomicBool) -> Vec<Stall> {
    use std::io::{Seek, Write};
    let mut seen = Vec::new();
    let path = std::env::temp_dir().join(format!("order-expiry-sync-{}", std::process::id()));
    let Ok(mut file) = std::fs::File::create(&path) else {
        return seen;
    };
    let block = [0u8; 4096];
    while !stop.load(Ordering::Relaxed) {
        let started = Instant::now();
        let synced = file
            .rewind()
            .and_then(|()| file.write_all(&block))
            .and_then(|()| file.sync_data());
        if synced.is_err() {
            break;
        }
        note(&mut seen, started.elapsed());
        std::thread::sleep(SYNC_EVERY);
    }
    let _ = std::fs::remove_file(&path);
    seen
}

/// Notes a wake-up `lag` late (or a sync that long) when it is over [`STALL`].
fn note(seen: &mut Vec<Stall>, lag: Duration) {
    if lag > STALL {
        seen.push(Stall {
            at: Utc::now(),
            lag_ms: lag.as_secs_f64() * 1000.0,
        });
    }
}

impl Stalls {
    /// One line: how many stalls each watcher saw and the worst, and the
    /// machine's steal and iowait time.
    pub fn line(&self) -> String {
        format!(
            "stalls over {} ms: thread {}, runtime {}, disk sync {}; machine steal {} ms, iowait {} ms",
            STALL.as_millis(),
            summary(&self.thread),
            summary(&self.runtime),
            summary(&self.disk),
            self.steal_ms,
            self.iowait_ms
        )
    }
}

fn summary(stalls: &[Stall]) -> String {
    match stalls.iter().max_by(|a, b| a.lag_ms.total_cmp(&b.lag_ms)) {
        None => "none".to_owned(),
        Some(worst) => format!(
            "{} (worst {:.0} ms at {})",
            stalls.len(),
            worst.lag_ms,
            worst.at.format("%H:%M:%S%.3f")
        ),
    }
}

/// The machine's cumulative steal and iowait time, from `/proc/stat`.
#[derive(Clone, Copy)]
struct CpuTimes {
    steal_ms: u64,
    iowait_ms: u64,
}

impl CpuTimes {
    fn read() -> Option<Self> {
        let stat = std::fs::read_to_string("/proc/stat").ok()?;
        Self::parse(stat.lines().next()?)
    }

    /// `cpu  user nice system idle iowait irq softirq steal …`, in clock ticks
    /// of 10 ms (USER_HZ is 100 on Linux).
    fn parse(line: &str) -> Option<Self> {
        let fields: Vec<u64> = line
            .strip_prefix("cpu ")?
            .split_whitespace()
            .map(str::parse)
            .collect::<Result<_, _>>()
            .ok()?;
        Some(Self {
            iowait_ms: fields.get(4)? * 10,
            steal_ms: fields.get(7)? * 10,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proc_stat_steal_and_iowait_are_read_in_ms() {
        let t = CpuTimes::parse("cpu  100 0 50 9000 7 0 3 12 0 0").unwrap();
        assert_eq!((t.iowait_ms, t.steal_ms), (70, 120));
        assert!(CpuTimes::parse("intr 1 2 3").is_none());
    }

    #[test]
    fn only_wake_ups_later_than_the_bound_are_stalls() {
        let mut seen = Vec::new();
        note(&mut seen, Duration::from_millis(20));
        note(&mut seen, Duration::from_millis(350));
        assert_eq!(seen.len(), 1);
        assert!(summary(&seen).starts_with("1 (worst 350 ms at "));
        assert_eq!(summary(&[]), "none");
    }
}
