//! Memory and CPU of processes, read from `/proc` (Linux). Reading `/proc` needs no
//! unsafe code and sees a child process from outside, which `getrusage` cannot.

use std::sync::OnceLock;

/// Resident set size now and at its peak, in bytes (`VmRSS`, `VmHWM`).
#[derive(Debug, Clone, Copy, Default)]
pub struct Memory {
    /// `VmRSS`.
    pub rss: u64,
    /// `VmHWM`.
    pub peak: u64,
}

/// Memory of `pid` (`"self"` for this process).
pub fn memory(pid: &str) -> Option<Memory> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let field = |name: &str| {
        status
            .lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|kb| kb.parse::<u64>().ok())
            .map(|kb| kb * 1024)
    };
    Some(Memory {
        rss: field("VmRSS:")?,
        peak: field("VmHWM:")?,
    })
}

/// CPU seconds (user + system, all threads) `pid` has used; with `children`, also
/// those of its exited, reaped children.
pub fn cpu_seconds(pid: &str, children: bool) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name may hold spaces; fields are counted after its ')'.
    let rest = &stat[stat.rfind(')')? + 2..];
    let fields: Vec<u64> = rest
        .split_whitespace()
        .skip(11) // fields 3..=13
        .take(4) // utime stime cutime cstime
        .map(|f| f.parse().unwrap_or(0))
        .collect();
    let ticks = match (fields.as_slice(), children) {
        ([u, s, cu, cs], true) => u + s + cu + cs,
        ([u, s, ..], false) => u + s,
        _ => return None,
    };
    Some(ticks as f64 / clock_ticks())
}

fn clock_ticks() -> f64 {
    static TICKS: OnceLock<f64> = OnceLock::new();
    *TICKS.get_or_init(|| {
        std::process::Command::new("getconf")
            .arg("CLK_TCK")
            .output()
            .ok()
            .and_then(|o| String::from_utf8_lossy(&o.stdout).trim().parse().ok())
            .unwrap_or(100.0)
    })
}
