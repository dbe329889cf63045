//! Where the CPU went during a measurement: this process, the broker
//! (`beam.smp`) and the database (every `postgres` process), from `/proc`.

use order_expiry_testkit::procfs::cpu_seconds;

/// CPU seconds used so far by the broker (`beam.smp`) and the database (every
/// `postgres` process, with the backends that already exited).
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct ServiceCpu {
    pub(super) broker: f64,
    pub(super) database: f64,
    pub(super) client: f64,
}

impl ServiceCpu {
    /// A snapshot now; `client` is this process.
    pub(super) fn now() -> Self {
        let sum = |comm, children| -> f64 {
            let pids = crate::pids_named(comm);
            pids.iter()
                .filter_map(|pid| cpu_seconds(&pid.to_string(), children))
                .sum()
        };
        Self {
            client: cpu_seconds("self", false).unwrap_or(0.0),
            broker: sum("beam.smp", false),
            database: sum("postgres", true),
        }
    }

    /// What was used between `self` and `later`.
    pub(super) fn until(&self, later: &Self) -> Self {
        Self {
            broker: later.broker - self.broker,
            database: later.database - self.database,
            client: later.client - self.client,
        }
    }
}
