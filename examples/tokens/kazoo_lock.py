#!/usr/bin/env python3
"""Take kazoo's Lock, write once through fencegate with its fencing token, release.

    python3 kazoo_lock.py GATEWAY_URL [--zk HOSTS] [--lock PATH]

Needs kazoo (`pip install kazoo`). The lock is kazoo's own recipe (`kazoo.recipe.lock.Lock`,
`zk.Lock(path)`): each contender creates an ephemeral sequential node `<uuid>__lock__0000000007`
under the persistent lock node PATH (kazoo creates it when missing), and the lowest sequence
number holds the lock. The fencing token is our node's sequence number: ZooKeeper takes it from a
counter of PATH, which grows by at least one with every node created under it. Never delete PATH,
or the counter starts again at 0 and every later token is below the gateway's mark. Prints
`token=N`, then `status=N` (the gateway's answer to the PUT); exits 0 when the write was accepted
(2xx).

The node lives as long as our ZooKeeper session: release deletes it, and so does ZooKeeper when the
session expires (a process paused, or cut off, for longer than the session timeout). The next
contender then holds the lock while this process may still believe it does: that is what the token
is for. The gateway refuses it once a later holder has written (or, on a route that follows
ZooKeeper itself, as soon as the node is gone). A holder that works for longer should also add a
connection listener (`zk.add_listener`): a `LOST` session means the lock is gone.
"""

import argparse
import sys
import urllib.error
import urllib.request

from kazoo.client import KazooClient

SEQUENCE_DIGITS = 10  # what ZooKeeper appends to a sequential node's name


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
        lock = zk.Lock(args.lock)
        lock.acquire()  # blocks until our node is the lowest under PATH
        try:
            # lock.node: our node's name under PATH, while we hold the lock.
            token = int(lock.node[-SEQUENCE_DIGITS:])
            print(f"token={token}", flush=True)
            status, answer = fenced_put(args.gateway_url, token, f"written under token {token}")
            print(f"status={status}", flush=True)
            if status >= 300:
                print(answer, file=sys.stderr)
        finally:
            lock.release()  # deletes our node; a lost session deletes it too
    finally:
        zk.stop()
        zk.close()
    return 0 if 200 <= status < 300 else 1


if __name__ == "__main__":
    sys.exit(main())
