-- The W3C trace context of an outbox row (optional): an order service that
-- traces passes the `traceparent` (and `tracestate`) of the span that created
-- the order with the same INSERT, and the relay publishes them as the
-- message's headers, so the order's trace reaches its cancel. NULL: untraced.
-- A relay that finds no such columns (a database not migrated yet) relays
-- every row untraced.
ALTER TABLE order_expiry_outbox ADD COLUMN IF NOT EXISTS traceparent text;
ALTER TABLE order_expiry_outbox ADD COLUMN IF NOT EXISTS tracestate text;
