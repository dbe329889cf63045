//! `order-expiry serve`: the consumer service until SIGTERM/SIGINT, then drain
//! and exit 0.

use order_expiry::{Settings, service::Service, service::shutdown_on_signal};

pub(super) async fn run(settings: &Settings) -> anyhow::Result<()> {
    let service = Service::build(settings).await?;
    service.run(shutdown_on_signal()).await;
    Ok(())
}
