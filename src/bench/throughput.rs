//! `order-expiry bench throughput`: see issue 5. Being written.

use clap::Args;

use crate::settings::Settings;

/// Arguments of `bench throughput`.
#[derive(Debug, Args)]
pub struct ThroughputArgs {
    /// Orders per round.
    #[arg(long, default_value_t = 20_000)]
    pub orders: usize,
}

/// Runs the throughput benchmark.
pub async fn run(_settings: &Settings, _args: &ThroughputArgs) -> anyhow::Result<()> {
    anyhow::bail!("bench throughput is not written yet")
}
