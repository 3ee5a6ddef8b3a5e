#!/usr/bin/env python3
"""Take a ZooKeeper lock, write once through fencegate with its fencing token, release.

    python3 zk_lock.py GATEWAY_URL [--zk HOSTS] [--lock PATH]

Needs kazoo (`pip install kazoo`). The lock is ZooKeeper's recipe: each contender creates an
ephemeral sequential node under a persistent lock parent, and the lowest sequence number holds the
lock. The fencing token is our node's sequence number: the parent's child-version counter, which
grows with every node created or deleted under it. Never delete the parent, or the counter starts
again at 0 and every later token is below the gateway's mark. Prints `token=N`, then `status=N`
(the gateway's answer to the PUT); exits 0 when the write was accepted (2xx).
"""

import argparse
import sys
import threading
import urllib.error
import urllib.request

from kazoo.client import KazooClient

PREFIX = "lock-"


def lock(zk, parent):
    """Blocks until this session holds the lock; returns (our node, fencing token)."""
    zk.ensure_path(parent)  # persistent: it keeps the sequence counter
    node = zk.create(f"{parent}/{PREFIX}", ephemeral=True, sequence=True)
    name = node.rsplit("/", 1)[1]
    token = int(name[len(PREFIX):])
    while True:
        children = sorted(c for c in zk.get_children(parent) if c.startswith(PREFIX))
        index = children.index(name)
        if index == 0:
            return node, token
        # Wait for the node just before ours to go, not for any change (no herd).
        gone = threading.Event()
        if zk.exists(f"{parent}/{children[index - 1]}", watch=lambda _event: gone.set()):
            gone.wait()


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
    parser.add_argument("--zk", default="127.0.0.1:2181")
    parser.add_argument("--lock", default="/locks/invoice/42")
    args = parser.parse_args()

    zk = KazooClient(hosts=args.zk)
    zk.start(timeout=10)
    try:
        node, token = lock(zk, args.lock)
        try:
            print(f"token={token}", flush=True)
            status, answer = fenced_put(args.gateway_url, token, f"written under token {token}")
            print(f"status={status}", flush=True)
            if status >= 300:
                print(answer, file=sys.stderr)
        finally:
            zk.delete(node)  # release; a lost session deletes it too
    finally:
        zk.stop()
        zk.close()
    return 0 if 200 <= status < 300 else 1


if __name__ == "__main__":
    sys.exit(main())
