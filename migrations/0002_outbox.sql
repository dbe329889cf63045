-- The transactional outbox.
--
-- - order_expiry_outbox: the contract's table. An order service inserts
--   (order_id, due_at) in the transaction that creates the order.
-- - order_expiry_outbox_rejected: rows the relay can never publish (an invalid
--   order id, a due time beyond the ladder), moved there in the same
--   transaction that deletes them, with the reason. Nothing is dropped.
-- - A statement-level AFTER INSERT trigger that notifies the channel
--   order_expiry_outbox (the relay LISTENs on it) with the table's schema as
--   payload, so the relay wakes at once; at most one notification per
--   transaction reaches it (PostgreSQL folds identical ones).
CREATE TABLE IF NOT EXISTS order_expiry_outbox (
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
  FOR EACH STATEMENT EXECUTE FUNCTION order_expiry_outbox_notify();
