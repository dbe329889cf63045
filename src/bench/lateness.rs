//! `order-expiry bench lateness`: see issue 3. Being written.

use clap::Args;

use crate::settings::Settings;

/// Arguments of `bench lateness`.
#[derive(Debug, Args)]
pub struct LatenessArgs {
    /// Orders scheduled per second.
    #[arg(long, default_value_t = 200)]
    pub rate: u32,
}

/// Runs the lateness benchmark.
pub async fn run(_settings: &Settings, _args: &LatenessArgs) -> anyhow::Result<()> {
    anyhow::bail!("bench lateness is not written yet")
}
