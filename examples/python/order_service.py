"""An order service in Python that schedules expiries through order-expiry's
transactional outbox: the order and its outbox row are written in one
PostgreSQL transaction, so both commit or neither does. `order-expiry serve`
relays the row to RabbitMQ after the commit and cancels the order when it is
still unpaid at its deadline. No RabbitMQ client is needed here.

    python order_service.py create ORDER_ID SECONDS [--rollback]
    python order_service.py extend ORDER_ID SECONDS
    python order_service.py pay ORDER_ID
    python order_service.py expire ORDER_ID DUE_AT

`expire` is what an order service's expire endpoint does for order-expiry's
HTTP action (`POST /orders/{id}/expire` with `{"order_id", "due_at"}`): it
prints the HTTP status the endpoint answers with.

The database URL comes from --database-url, else ORDER_EXPIRY__DATABASE__URL
(the same variable order-expiry reads), else the local default. Each command
prints one JSON line saying what it did.
"""

from __future__ import annotations

import argparse
import json
import os
from datetime import datetime, timedelta

import psycopg

DEFAULT_URL = "postgres://postgres@127.0.0.1:5432/postgres"

# The outbox insert: the same statement in any language. The table is found on
# the connection's search_path, like the orders table.
SCHEDULE = "INSERT INTO order_expiry_outbox (order_id, due_at) VALUES (%s, %s) RETURNING id"


def create_order(conn: psycopg.Connection, order_id: str, window: timedelta, rollback: bool = False) -> dict:
    """Creates an unpaid order due in `window` and schedules its expiry, in one
    transaction. With `rollback` the transaction is rolled back at the end, as
    any later failure of the order's creation would: nothing is scheduled."""
    with conn.transaction():
        (deadline,) = conn.execute(
            "INSERT INTO orders (id, pay_deadline) VALUES (%s, now() + %s) RETURNING pay_deadline",
            (order_id, window),
        ).fetchone()
        (outbox_id,) = conn.execute(SCHEDULE, (order_id, deadline)).fetchone()
        if rollback:
            raise psycopg.Rollback()  # leaves the block; the order and its row are gone
        return {"order_id": order_id, "due_at": deadline.isoformat(), "outbox_id": outbox_id, "committed": True}
    return {"order_id": order_id, "committed": False}


def extend_deadline(conn: psycopg.Connection, order_id: str, window: timedelta) -> dict:
    """Gives an unpaid order `window` more from now: a new pay_deadline and a new
    schedule, in one transaction. The message of the old deadline still comes;
    the default cancel statement leaves an order whose pay_deadline is later
    than that message's due time alone, and the new message cancels it."""
    with conn.transaction():
        row = conn.execute(
            "UPDATE orders SET pay_deadline = now() + %s WHERE id = %s AND status = 'unpaid' "
            "RETURNING pay_deadline",
            (window, order_id),
        ).fetchone()
        if row is None:
            return {"order_id": order_id, "extended": False}
        conn.execute(SCHEDULE, (order_id, row[0]))
        return {"order_id": order_id, "due_at": row[0].isoformat(), "extended": True}


def pay(conn: psycopg.Connection, order_id: str) -> dict:
    """Marks an order paid if it is still unpaid: one statement, so a cancel
    landing at the same time either happened first or changes nothing."""
    with conn.transaction():
        paid = conn.execute(
            "UPDATE orders SET status = 'paid', paid_at = now() WHERE id = %s AND status = 'unpaid'",
            (order_id,),
        ).rowcount
        return {"order_id": order_id, "paid": paid == 1}


def expire(conn: psycopg.Connection, order_id: str, due_at: datetime) -> dict:
    """The expire endpoint of order-expiry's HTTP action, by this database's
    clock. One transaction, so one reading of the clock (now()) decides: 404
    unknown, 409 paid or cancelled or extended past due_at, 425 Too Early (with
    the time left) while due_at is still ahead, else cancelled: 200."""
    with conn.transaction():
        row = conn.execute(
            "SELECT status = 'unpaid', pay_deadline > %(due)s, %(due)s > now(), "
            "ceil(extract(epoch FROM %(due)s - now()) * 1000)::bigint "
            "FROM orders WHERE id = %(id)s FOR UPDATE",
            {"id": order_id, "due": due_at},
        ).fetchone()
        if row is None:
            return {"order_id": order_id, "status": 404}
        unpaid, extended, early, due_in_ms = row
        if not unpaid or extended:
            return {"order_id": order_id, "status": 409}
        if early:
            # The body serve reads; Retry-After would say ceil(due_in_ms / 1000).
            return {"order_id": order_id, "status": 425, "due_in_ms": due_in_ms}
        conn.execute("UPDATE orders SET status = 'cancelled', cancelled_at = now() WHERE id = %s", (order_id,))
        return {"order_id": order_id, "status": 200}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--database-url", default=os.environ.get("ORDER_EXPIRY__DATABASE__URL", DEFAULT_URL))
    commands = parser.add_subparsers(dest="command", required=True)
    create = commands.add_parser("create", help="create an order and schedule its expiry")
    create.add_argument("order_id")
    create.add_argument("seconds", type=float, help="payment window")
    create.add_argument("--rollback", action="store_true", help="roll the transaction back at the end")
    extend = commands.add_parser("extend", help="move an unpaid order's deadline and schedule again")
    extend.add_argument("order_id")
    extend.add_argument("seconds", type=float, help="new payment window, from now")
    paid = commands.add_parser("pay", help="mark an order paid")
    paid.add_argument("order_id")
    expired = commands.add_parser("expire", help="what the expire endpoint answers, and does")
    expired.add_argument("order_id")
    expired.add_argument("due_at", type=datetime.fromisoformat, help="RFC 3339, from the request")
    args = parser.parse_args()

    with psycopg.connect(args.database_url, autocommit=True) as conn:
        if args.command == "create":
            result = create_order(conn, args.order_id, timedelta(seconds=args.seconds), args.rollback)
        elif args.command == "extend":
            result = extend_deadline(conn, args.order_id, timedelta(seconds=args.seconds))
        elif args.command == "expire":
            result = expire(conn, args.order_id, args.due_at)
        else:
            result = pay(conn, args.order_id)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
