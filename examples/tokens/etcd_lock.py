#!/usr/bin/env python3
"""Take an etcd lock, write once through fencegate with its fencing token, release.

    python3 etcd_lock.py GATEWAY_URL [--etcd URL] [--lock NAME] [--ttl SECONDS]

The lock is etcd's own recipe (Go's concurrency.Mutex, `etcdctl lock`), spoken to etcd's v3
HTTP/JSON gateway with the standard library only: grant a lease, put `<lock>/<lease id in hex>`
attached to it, hold the lock once that key has the lowest create_revision under `<lock>/`.
The fencing token is the key's create_revision. Prints `token=N`, then `status=N` (the gateway's
answer to the PUT); exits 0 when the write was accepted (2xx).
"""

import argparse
import base64
import json
import sys
import time
import urllib.error
import urllib.request

POLL_SECONDS = 0.1  # how often a waiting contender looks again (a watch would wake it instead)


def b64(text):
    return base64.b64encode(text.encode()).decode()


def prefix_end(prefix):
    """The end of the key range under `prefix`: its last byte plus one."""
    raw = prefix.encode()
    return base64.b64encode(raw[:-1] + bytes([raw[-1] + 1])).decode()


def etcd(base, path, body):
    request = urllib.request.Request(
        base + path, data=json.dumps(body).encode(), method="POST",
        headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=5) as response:
        return json.load(response)


def lock(base, name, ttl):
    """Blocks until this process holds `name`; returns (lease id, fencing token)."""
    lease = etcd(base, "/v3/lease/grant", {"TTL": str(ttl)})["ID"]
    key = b64(f"{name}/{int(lease):x}")
    # Put our key unless it exists (a retry); either way learn its create_revision.
    txn = etcd(base, "/v3/kv/txn", {
        "compare": [{"key": key, "target": "CREATE", "result": "EQUAL", "create_revision": "0"}],
        "success": [{"request_put": {"key": key, "value": "", "lease": lease}}],
        "failure": [{"request_range": {"key": key}}],
    })
    if txn.get("succeeded"):
        token = int(txn["header"]["revision"])
    else:
        token = int(txn["responses"][0]["response_range"]["kvs"][0]["create_revision"])
    # The holder is the contender created first: wait until that is us.
    while True:
        first = etcd(base, "/v3/kv/range", {
            "key": b64(name + "/"), "range_end": prefix_end(name + "/"),
            "sort_order": "ASCEND", "sort_target": "CREATE", "limit": "1",
        }).get("kvs", [])
        if first and first[0]["key"] == key:
            return lease, token
        time.sleep(POLL_SECONDS)


def unlock(base, lease):
    etcd(base, "/v3/lease/revoke", {"ID": lease})  # deletes our key; the next contender holds


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
    parser.add_argument("--etcd", default="http://127.0.0.1:2379")
    parser.add_argument("--lock", default="locks/invoice/42")
    parser.add_argument("--ttl", type=int, default=10, help="lease TTL in seconds")
    args = parser.parse_args()

    lease, token = lock(args.etcd, args.lock, args.ttl)
    try:
        print(f"token={token}", flush=True)
        status, answer = fenced_put(args.gateway_url, token, f"written under token {token}")
        print(f"status={status}", flush=True)
        if status >= 300:
            print(answer, file=sys.stderr)
    finally:
        unlock(args.etcd, lease)
    return 0 if 200 <= status < 300 else 1


if __name__ == "__main__":
    sys.exit(main())
