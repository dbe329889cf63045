//! Memory over the soak: the RSS of every `serve` and every broker node,
//! sampled every 10 s. Flat means no process grew by half and by 100 MB
//! between its fifth-to-tenth minute and its last minute (a process restarted
//! by a fault starts a new series).

use std::collections::BTreeMap;
use std::time::Duration;

use chrono::{DateTime, TimeDelta, Utc};
use order_expiry_testkit::{cluster, procfs};
use tokio_util::sync::CancellationToken;

use super::world::SoakWorld;

/// How often to sample.
const EVERY: Duration = Duration::from_secs(10);

/// One process's samples: (when, RSS bytes).
type Series = Vec<(DateTime<Utc>, u64)>;

/// Every sample, by (process name, pid).
#[derive(Debug, Default)]
pub(super) struct Samples {
    series: BTreeMap<(String, u32), Series>,
}

impl Samples {
    /// Samples until `stop`.
    pub(super) async fn watch(world: &SoakWorld, stop: CancellationToken) -> Self {
        let mut samples = Self::default();
        loop {
            let now = Utc::now();
            let serves = world.running_serves().await.into_iter();
            for (name, pid) in serves
                .map(|(name, pid, _)| (name, pid))
                .chain(node_pids().await)
            {
                if let Some(m) = procfs::memory(&pid.to_string()) {
                    samples
                        .series
                        .entry((name, pid))
                        .or_default()
                        .push((now, m.rss));
                }
            }
            tokio::select! {
                () = stop.cancelled() => return samples,
                () = tokio::time::sleep(EVERY) => {}
            }
        }
    }

    /// Adds one sample, as [`Self::watch`] does.
    #[cfg(test)]
    pub(super) fn push(&mut self, name: &str, pid: u32, at: DateTime<Utc>, rss: u64) {
        let key = (name.to_owned(), pid);
        self.series.entry(key).or_default().push((at, rss));
    }

    /// A violation per process that grew.
    pub(super) fn growth(&self) -> Vec<String> {
        let mut found = Vec::new();
        for ((name, pid), series) in &self.series {
            let (Some(&(first, _)), Some(&(last_at, _))) = (series.first(), series.last()) else {
                continue;
            };
            if last_at - first < TimeDelta::minutes(15) {
                continue;
            }
            let minute = TimeDelta::minutes(1);
            let early = median(series, |at| {
                at >= first + minute * 5 && at < first + minute * 10
            });
            let late = median(series, |at| at > last_at - minute);
            if late > early + early / 2 && late > early + 100 * MB {
                found.push(format!(
                    "{name} (pid {pid}) grew from {} MB (minutes 5-10) to {} MB (last minute)",
                    early / MB,
                    late / MB
                ));
            }
        }
        found
    }

    /// Per process name: (lowest, highest, last) RSS in MB over all its pids.
    pub(super) fn summary(&self) -> Vec<(String, u64, u64, u64)> {
        let mut by_name: BTreeMap<&str, (u64, u64, DateTime<Utc>, u64)> = BTreeMap::new();
        for ((name, _), series) in &self.series {
            for &(at, rss) in series {
                let e = by_name.entry(name).or_insert((u64::MAX, 0, at, rss));
                e.0 = e.0.min(rss);
                e.1 = e.1.max(rss);
                if at >= e.2 {
                    e.2 = at;
                    e.3 = rss;
                }
            }
        }
        by_name
            .into_iter()
            .map(|(name, (lo, hi, _, last))| (name.to_owned(), lo / MB, hi / MB, last / MB))
            .collect()
    }
}

const MB: u64 = 1 << 20;

/// The median RSS of the samples of `series` taken when `keep` holds.
fn median(series: &Series, keep: impl Fn(DateTime<Utc>) -> bool) -> u64 {
    let mut v: Vec<u64> = series
        .iter()
        .filter_map(|&(at, rss)| keep(at).then_some(rss))
        .collect();
    v.sort_unstable();
    v.get(v.len() / 2).copied().unwrap_or(0)
}

/// The running nodes' beam pids.
async fn node_pids() -> Vec<(String, u32)> {
    tokio::task::spawn_blocking(|| {
        (1..=3)
            .filter_map(|n| {
                let out =
                    cluster::cluster_sh(&["pid", &n.to_string()], Duration::from_secs(10)).ok()?;
                let pid = out.trim().parse().ok()?;
                Some((format!("node {n}"), pid))
            })
            .collect()
    })
    .await
    .unwrap_or_default()
}
