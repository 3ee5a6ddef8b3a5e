#!/usr/bin/env python3
"""Take a lock on one Redis instance with a fencing token, write once through fencegate, release.

    python3 redis_lock.py GATEWAY_URL [--redis URL] [--lock KEY] [--ttl MILLIS]

Needs redis-py (`pip install redis`). Redlock, and a plain `SET key value NX PX ttl`, give the
holder a random value: it proves who holds the lock, but it is not ordered, so it is no fencing
token. Here one script takes the lock and raises a counter that is never deleted (`<lock>:fence`);
the counter's new value is the token, one more per grant of the lock. It is only as durable as
that Redis: a restart without persistence, or a failover to a replica that missed the last INCR,
can hand a number out again (docs/getting-tokens.md). Prints `token=N`, then `status=N` (the
gateway's answer to the PUT); exits 0 when the write was accepted (2xx).
"""

import argparse
import sys
import time
import urllib.error
import urllib.request
import uuid

import redis

# Takes the lock when it is free, and only then counts the grant: the lock and its number move
# together, in one script, so no two grants get the same number.
TAKE = """
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  return redis.call('INCR', KEYS[2])
end
return false
"""

# Releases the lock only while it is still ours (its value is our owner id).
RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
"""


def lock(r, key, owner, ttl_ms):
    """Blocks until `owner` holds `key`; returns the fencing token of this grant."""
    take = r.register_script(TAKE)
    while True:
        token = take(keys=[key, f"{key}:fence"], args=[owner, ttl_ms])
        if token:
            return int(token)
        time.sleep(0.05)


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
    parser.add_argument("--redis", default="redis://127.0.0.1:6379/0")
    parser.add_argument("--lock", default="locks:invoice:42")
    parser.add_argument("--ttl", type=int, default=10_000, help="the lock's TTL in milliseconds")
    args = parser.parse_args()

    r = redis.Redis.from_url(args.redis)
    owner = str(uuid.uuid4())
    token = lock(r, args.lock, owner, args.ttl)
    try:
        print(f"token={token}", flush=True)
        status, answer = fenced_put(args.gateway_url, token, f"written under token {token}")
        print(f"status={status}", flush=True)
        if status >= 300:
            print(answer, file=sys.stderr)
    finally:
        r.register_script(RELEASE)(keys=[args.lock], args=[owner])
    return 0 if 200 <= status < 300 else 1


if __name__ == "__main__":
    sys.exit(main())
