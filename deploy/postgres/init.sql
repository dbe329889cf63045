-- Run once by the postgres image on an empty data directory
-- (mounted into /docker-entrypoint-initdb.d by docker-compose.yml).
-- The default orders table of the public contract; `order-expiry migrate` runs
-- the same statement (src/orders.rs SCHEMA_SQL), and scripts/check-deploy
-- fails if the two differ.
CREATE TABLE IF NOT EXISTS orders (
  id           text PRIMARY KEY,
  status       text NOT NULL DEFAULT 'unpaid' CHECK (status IN ('unpaid','paid','cancelled')),
  created_at   timestamptz NOT NULL DEFAULT now(),
  pay_deadline timestamptz,
  paid_at      timestamptz,
  cancelled_at timestamptz
);
