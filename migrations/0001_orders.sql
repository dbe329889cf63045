-- The default orders table of the public contract, and the partial index the
-- sweeper and the overdue gauge read (only unpaid orders are in it, so a sweep
-- every second reads the few that are overdue, not the whole table).
--
-- migrations/*.sql is the one source of the default schema: `order-expiry
-- migrate` runs these files in order, in one transaction (src/service/migrations.rs),
-- and the postgres service of docker-compose.yml runs them on an empty data
-- directory (mounted into /docker-entrypoint-initdb.d). Every statement is
-- idempotent.
CREATE TABLE IF NOT EXISTS orders (
  id           text PRIMARY KEY,
  status       text NOT NULL DEFAULT 'unpaid' CHECK (status IN ('unpaid','paid','cancelled')),
  created_at   timestamptz NOT NULL DEFAULT now(),
  pay_deadline timestamptz,
  paid_at      timestamptz,
  cancelled_at timestamptz
);
CREATE INDEX IF NOT EXISTS orders_unpaid_pay_deadline ON orders (pay_deadline) WHERE status = 'unpaid';
