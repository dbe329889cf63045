-- Run once by the postgres image on an empty data directory
-- (mounted into /docker-entrypoint-initdb.d by docker-compose.yml).
-- The default orders table of the public contract and the transactional outbox;
-- `order-expiry migrate` runs the same statements (SCHEMA_SQL in
-- src/service/orders/postgres.rs, OUTBOX_SCHEMA_SQL in
-- src/service/outbox/schema.rs), and a unit test fails if the two differ.
CREATE TABLE IF NOT EXISTS orders (
  id           text PRIMARY KEY,
  status       text NOT NULL DEFAULT 'unpaid' CHECK (status IN ('unpaid','paid','cancelled')),
  created_at   timestamptz NOT NULL DEFAULT now(),
  pay_deadline timestamptz,
  paid_at      timestamptz,
  cancelled_at timestamptz
);
CREATE INDEX IF NOT EXISTS orders_unpaid_pay_deadline ON orders (pay_deadline) WHERE status = 'unpaid';
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
