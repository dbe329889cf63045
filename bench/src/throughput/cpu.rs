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
        let mut cpu = Self {
            client: cpu_seconds("self", false).unwrap_or(0.0),
            ..Self::default()
        };
        let Ok(entries) = std::fs::read_dir("/proc") else {
            return cpu;
        };
        for entry in entries.flatten() {
            let name = entry.file_name();
            let Some(pid) = name
                .to_str()
                .filter(|p| p.bytes().all(|b| b.is_ascii_digit()))
            else {
                continue;
            };
            let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
            match comm.trim_end() {
                "beam.smp" => cpu.broker += cpu_seconds(pid, false).unwrap_or(0.0),
                "postgres" => cpu.database += cpu_seconds(pid, true).unwrap_or(0.0),
                _ => {}
            }
        }
        cpu
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
