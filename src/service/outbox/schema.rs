//! The outbox's tables and its wake-up trigger, as `order-expiry migrate`
//! creates them (and `deploy/postgres/init.sql`, which a test holds to this).
//!
//! - `order_expiry_outbox`: the contract's table. An order service inserts
//!   `(order_id, due_at)` in the transaction that creates the order.
//! - `order_expiry_outbox_rejected`: rows the relay can never publish (an
//!   invalid order id, a due time beyond the ladder), moved there in the same
//!   transaction that deletes them, with the reason. Nothing is dropped.
//! - A statement-level `AFTER INSERT` trigger that notifies [`CHANNEL`] with the
//!   table's schema as payload, so the relay wakes at once; at most one
//!   notification per transaction reaches it (PostgreSQL folds identical ones).
//!
//! Every statement is idempotent; they run in one transaction.

/// The `LISTEN` channel the trigger notifies.
pub(crate) const CHANNEL: &str = "order_expiry_outbox";

/// The statements, in order.
pub(crate) const OUTBOX_SCHEMA_SQL: &str = "CREATE TABLE IF NOT EXISTS order_expiry_outbox (
  id         bigserial PRIMARY KEY,
  order_id   text NOT NULL,
  due_at     timestamptz NOT NULL,
  created_at timestamptz NOT NULL DEFAULT now()
);
CREATE TABLE IF NOT EXISTS order_expiry_outbox_rejected (
  id          bigint PRIMARY KEY,
  order_id    text NOT NULL,
  due_at      timestamptz NOT NULL,
  created_at  timestamptz NOT NULL,
  rejected_at timestamptz NOT NULL DEFAULT now(),
  reason      text NOT NULL
);
CREATE OR REPLACE FUNCTION order_expiry_outbox_notify() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  PERFORM pg_notify('order_expiry_outbox', TG_TABLE_SCHEMA);
  RETURN NULL;
END
$$;
DROP TRIGGER IF EXISTS order_expiry_outbox_notify ON order_expiry_outbox;
CREATE TRIGGER order_expiry_outbox_notify AFTER INSERT ON order_expiry_outbox
  FOR EACH STATEMENT EXECUTE FUNCTION order_expiry_outbox_notify()";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_trigger_notifies_the_channel_the_relay_listens_on() {
        assert!(OUTBOX_SCHEMA_SQL.contains(&format!("pg_notify('{CHANNEL}'")));
    }
}
