//! The outbox's wake-up channel. Its tables and trigger are in
//! `migrations/0002_outbox.sql` (run by `order-expiry migrate`).

/// The `LISTEN` channel the outbox's trigger notifies.
pub(crate) const CHANNEL: &str = "order_expiry_outbox";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_trigger_notifies_the_channel_the_relay_listens_on() {
        let migration = crate::service::migrations::migration_sql();
        assert!(migration.contains(&format!("pg_notify('{CHANNEL}'")));
    }
}
