#!/usr/bin/env python3
"""Take a lease in a PostgreSQL lease table, write once through fencegate with it, release.

    python3 pg_lease.py GATEWAY_URL [--dsn DSN] [--table NAME] [--lock KEY] [--ttl SECONDS]

Needs psycopg 3 (`pip install "psycopg[binary]"`). The table (created here if missing) holds one
row per lock; acquiring a free or expired lease raises the row's `fence` in the same statement,
and that `fence` is the fencing token. Releasing expires the lease but keeps the row, so the
counter never restarts. (A holder that writes for longer than the TTL renews the lease: see
examples/pg_lease_worker.rs.) Prints `token=N`, then `status=N` (the gateway's answer to the PUT);
exits 0 when the write was accepted (2xx).
"""

import argparse
import os
import socket
import sys
import time
import urllib.error
import urllib.request

import psycopg
from psycopg import sql

POLL_SECONDS = 0.2  # how often a waiting contender tries again

CREATE = """CREATE TABLE IF NOT EXISTS {table} (
    lock_key   text        PRIMARY KEY,
    owner      text        NOT NULL,
    fence      bigint      NOT NULL,
    expires_at timestamptz NOT NULL)"""

ACQUIRE = """INSERT INTO {table} AS l (lock_key, owner, fence, expires_at)
    VALUES (%(key)s, %(owner)s, 1, now() + make_interval(secs => %(ttl)s))
    ON CONFLICT (lock_key) DO UPDATE
        SET owner = EXCLUDED.owner, fence = l.fence + 1, expires_at = EXCLUDED.expires_at
        WHERE l.expires_at <= now()
    RETURNING fence"""

RELEASE = """UPDATE {table} SET expires_at = now()
    WHERE lock_key = %(key)s AND fence = %(fence)s"""


def query(text, table):
    return sql.SQL(text).format(table=sql.Identifier(*table.split(".")))


def acquire(conn, table, key, owner, ttl):
    """Blocks until the lease is ours; returns its fence (the token)."""
    while True:
        row = conn.execute(query(ACQUIRE, table),
                           {"key": key, "owner": owner, "ttl": ttl}).fetchone()
        if row is not None:
            return row[0]
        time.sleep(POLL_SECONDS)  # held by someone else and not expired yet


def release(conn, table, key, fence):
    conn.execute(query(RELEASE, table), {"key": key, "fence": fence})


def fenced_put(url, token, body):
    request = urllib.request.Request(
        url, data=body.encode(), method="PUT", headers={"X-Fence": str(token)})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as refused:  # 409 stale-fence and other problem answers
        return refused.code, refused.read().decode()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("gateway_url", help="e.g. http://127.0.0.1:8080/invoices/42")
    parser.add_argument("--dsn", default="postgresql://postgres@127.0.0.1:5432/test")
    parser.add_argument("--table", default="lock_leases", help="may be schema-qualified")
    parser.add_argument("--lock", default="locks/invoice/42")
    parser.add_argument("--ttl", type=float, default=10.0, help="lease TTL in seconds")
    args = parser.parse_args()
    owner = f"{socket.gethostname()}:{os.getpid()}"

    # Autocommit: each statement is its own transaction, so no lease row stays locked.
    with psycopg.connect(args.dsn, autocommit=True) as conn:
        conn.execute(query(CREATE, args.table))
        fence = acquire(conn, args.table, args.lock, owner, args.ttl)
        try:
            print(f"token={fence}", flush=True)
            status, answer = fenced_put(args.gateway_url, fence, f"written under token {fence}")
            print(f"status={status}", flush=True)
            if status >= 300:
                print(answer, file=sys.stderr)
        finally:
            release(conn, args.table, args.lock, fence)
    return 0 if 200 <= status < 300 else 1


if __name__ == "__main__":
    sys.exit(main())
