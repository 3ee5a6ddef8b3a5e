#!/usr/bin/env python3
"""A fake payment provider speaking enough of Stripe's API for tests/process/stripe.rs.

HTTPS only (Python's ssl with the certificate and key given), HTTP/1.1 with keep-alive, one
thread per connection. It serves POST /v1/charges (form-encoded, as the Stripe libraries send
it) and answers Stripe-shaped JSON: a charge object, or {"error": {...}}.

  --honour-keys / --ignore-keys   a repeated Idempotency-Key gets the stored answer and no new
                                  charge (as Stripe does), or is charged again
  --drop-after-charge P1,P2       for these payouts, the first time: charge, then close the
                                  connection without an answer (RST), as a provider that crashed
                                  between its ledger and its reply
  --fail-before-charge P3         for these payouts, the first time: answer 500 without charging
  --slow P4=SECONDS               for these payouts, the first time: charge, then wait before
                                  answering (the test kills the gateway meanwhile)
  --secret KEY                    only "Authorization: Bearer KEY" is served; anything else 401

The payout of a charge is its metadata[payout], else its Payout-Id header. Every charge is
appended to --record as one JSON line: payout, charge id, the Idempotency-Key seen, the time and
the answer sent (which an operator would read off the provider's dashboard). Every request is
appended to --requests: method, path, payout, Authorization and Idempotency-Key as received, and
what was done. When ready it prints its port on a line of its own.
"""

import argparse
import json
import socket
import ssl
import struct
import sys
import threading
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class Dropped(Exception):
    """The connection was closed on purpose, without an answer."""


class Provider:
    def __init__(self, args):
        self.secret = args.secret
        self.honour = args.honour_keys
        self.drop = set(filter(None, args.drop_after_charge.split(",")))
        self.fail = set(filter(None, args.fail_before_charge.split(",")))
        self.slow = {}
        for item in filter(None, args.slow.split(",")):
            payout, seconds = item.split("=", 1)
            self.slow[payout] = float(seconds)
        self.record = open(args.record, "a", encoding="utf-8")
        self.requests = open(args.requests, "a", encoding="utf-8") if args.requests else None
        self.lock = threading.Lock()
        self.charges = 0
        # Idempotency-Key -> (status, body) once answered, or None while the first is in flight.
        self.stored = {}
        # (payout, fault) pairs whose one-time fault (drop, fail, slow) has happened.
        self.faulted = set()

    def log_request(self, entry):
        if self.requests is not None:
            with self.lock:
                self.requests.write(json.dumps(entry) + "\n")
                self.requests.flush()

    def first_time(self, payout, fault, payouts):
        """Whether `fault` is due for `payout` (listed in `payouts`) and has not happened yet."""
        with self.lock:
            if payout in payouts and (payout, fault) not in self.faulted:
                self.faulted.add((payout, fault))
                return True
            return False

    def charge(self, payout, key, form):
        """Records a new charge; the answer body."""
        with self.lock:
            self.charges += 1
            charge_id = "ch_fake_%06d" % self.charges
            metadata = {
                name[len("metadata[") : -1]: value
                for name, value in form.items()
                if name.startswith("metadata[") and name.endswith("]")
            }
            body = {
                "id": charge_id,
                "object": "charge",
                "amount": int(form.get("amount", "0")),
                "currency": form.get("currency", "eur"),
                "metadata": metadata,
                "paid": True,
                "status": "succeeded",
                "livemode": False,
                "created": int(time.time()),
            }
            line = {
                "payout": payout,
                "charge": charge_id,
                "idempotency_key": key,
                "time": time.time(),
                "response": body,
            }
            self.record.write(json.dumps(line) + "\n")
            self.record.flush()
            return body


def stripe_error(kind, message, code=None):
    error = {"type": kind, "message": message}
    if code:
        error["code"] = code
    return {"error": error}


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "fake-stripe/1"

    def log_message(self, format, *args):  # quiet: the request log is the record
        pass

    def handle(self):
        try:
            super().handle()
        except (Dropped, OSError, ValueError):
            self.close_connection = True

    def answer(self, status, body, extra=()):
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.send_header("Request-Id", "req_fake_%d" % time.monotonic_ns())
        for name, value in extra:
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(data)
        self.wfile.flush()

    def drop_connection(self):
        """Closes the socket with a reset and no answer."""
        sock = self.connection
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        sock.close()
        raise Dropped()

    def do_GET(self):
        self.answer(404, stripe_error("invalid_request_error", "Unrecognized request URL"))

    def do_POST(self):
        provider = self.server.provider
        length = int(self.headers.get("Content-Length", "0"))
        raw = self.rfile.read(length).decode("utf-8") if length else ""
        form = {k: v[-1] for k, v in urllib.parse.parse_qs(raw, keep_blank_values=True).items()}
        payout = form.get("metadata[payout]") or self.headers.get("Payout-Id")
        key = self.headers.get("Idempotency-Key")
        auth = self.headers.get("Authorization")
        entry = {
            "method": "POST",
            "path": self.path,
            "payout": payout,
            "authorization": auth,
            "idempotency_key": key,
        }

        def done(what):
            entry["outcome"] = what
            provider.log_request(entry)

        if auth != "Bearer " + provider.secret:
            done("unauthorized")
            return self.answer(
                401, stripe_error("invalid_request_error", "Invalid API Key provided")
            )
        if self.path.split("?")[0] != "/v1/charges":
            done("not-found")
            return self.answer(404, stripe_error("invalid_request_error", "Unrecognized request URL"))
        if provider.first_time(payout, "fail", provider.fail):
            done("failed-before-charge")
            return self.answer(500, stripe_error("api_error", "An unknown error occurred"))

        if provider.honour and key:
            with provider.lock:
                if key in provider.stored:
                    stored = provider.stored[key]
                    if stored is None:
                        in_use = True
                    else:
                        in_use = False
                        status, body = stored
                else:
                    provider.stored[key] = None
                    in_use, stored = False, None
            if in_use:
                done("key-in-use")
                return self.answer(
                    409,
                    stripe_error(
                        "idempotency_error",
                        "There is currently another in-progress request using this Idempotent Key",
                        "idempotency_key_in_use",
                    ),
                )
            if stored is not None:
                done("replayed")
                return self.answer(status, body, [("Idempotent-Replayed", "true")])

        body = provider.charge(payout, key, form)
        if provider.honour and key:
            with provider.lock:
                provider.stored[key] = (200, body)
        if provider.first_time(payout, "drop", provider.drop):
            done("charged-then-dropped")
            self.drop_connection()
        delay = provider.slow.get(payout)
        if delay is not None and provider.first_time(payout, "slow", provider.slow):
            done("charged-then-slow")
            time.sleep(delay)
        else:
            done("charged")
        self.answer(200, body)


class TlsServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, address, context, provider):
        super().__init__(address, Handler)
        self.context = context
        self.provider = provider

    def finish_request(self, request, client_address):
        # The handshake runs on the connection's own thread, not the accepting one.
        try:
            tls = self.context.wrap_socket(request, server_side=True)
        except (OSError, ssl.SSLError):
            return
        try:
            self.RequestHandlerClass(tls, client_address, self)
        finally:
            try:
                tls.close()
            except OSError:
                pass


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--cert", required=True)
    parser.add_argument("--key", required=True)
    parser.add_argument("--secret", required=True)
    parser.add_argument("--record", required=True)
    parser.add_argument("--requests")
    keys = parser.add_mutually_exclusive_group(required=True)
    keys.add_argument("--honour-keys", action="store_true")
    keys.add_argument("--ignore-keys", action="store_true")
    parser.add_argument("--drop-after-charge", default="")
    parser.add_argument("--fail-before-charge", default="")
    parser.add_argument("--slow", default="")
    args = parser.parse_args()

    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(args.cert, args.key)
    server = TlsServer(("127.0.0.1", args.port), context, Provider(args))
    print(server.server_address[1], flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    sys.exit(main())
