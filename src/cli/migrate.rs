//! `order-expiry migrate`: the SQL schema: the default `orders` table and the transactional
//! outbox (`order_expiry_outbox`, its rejected rows, its notify trigger);
//! idempotent.

use anyhow::Context;
use order_expiry::{Settings, service::PgOrderStore};

pub(super) async fn run(settings: &Settings) -> anyhow::Result<()> {
    let store = PgOrderStore::new(settings)?;
    store
        .migrate()
        .await
        .with_context(|| format!("migrating {}", settings.database.display_url()))?;
    eprintln!("orders and outbox tables ready");
    Ok(())
}
