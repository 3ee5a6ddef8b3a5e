#!/usr/bin/env python3
"""A fake payment provider speaking enough of Adyen's, PayPal's or Square's API (one dialect per
process) for the gateway's end-to-end tests of those providers.

Shaped like fake_provider.py (the fake Stripe): HTTPS with the certificate and key given (or plain
HTTP with --plain, for smoke tests without the gateway), HTTP/1.1 with keep-alive, one thread per
connection. When ready it prints its port on a line of its own.

  --dialect adyen|paypal|square
  --honour-keys / --ignore-keys   a repeated idempotency key gets the stored answer and no new
                                  charge (as each provider documents), or is charged again
  --drop-after-charge OP1,OP2     for these operations, the first time: charge, then reset the
                                  connection (SO_LINGER 0) without an answer
  --rate-limit-first OP3          for these operations, the first time: 429 with Retry-After: 1
                                  and the dialect's rate-limit body, no charge
  --slow OP4=SECONDS              for these operations, the first time: charge, then wait before
                                  answering (the key stays in flight meanwhile, so a duplicate
                                  gets the dialect's "in progress" answer)

Credentials (anything else is 401 in the dialect's shape, outcome "unauthorized"):
  adyen   --api-key K         the X-API-Key header
  square  --access-token T    Authorization: Bearer T
  paypal  --client-id ID --client-secret S [--token-lifetime SECONDS] [--revoke-tokens-after-charges N]
          POST /v1/oauth2/token with HTTP Basic base64(ID:S) and the form grant_type=
          client_credentials issues a token ("A21AA..."), valid for --token-lifetime (32400).
          Wrong client: 401 invalid_client; another grant: 400. Orders need Authorization: Bearer
          <an issued, unexpired, unrevoked token>; else 401 invalid_token (or, with no Bearer
          token at all, 401 AUTHENTICATION_FAILURE). With --revoke-tokens-after-charges N (0 =
          never), after the Nth charge every token issued so far is revoked.

Endpoints, operation (what charges are counted by) and idempotency key:
  adyen   POST /vNN/payments (any NN; adyen 16.0.0's checkout.payments_api.payments calls
          /v72/payments). Body: reference (the operation), amount {value, currency},
          merchantAccount, paymentMethod. Key: the Idempotency-Key header. Answer 200
          {"pspReference", "resultCode": "Authorised", "merchantReference", "amount"}. Adyen's
          documentation says the Idempotency-Key is returned in the response so that a caller can
          see the request was processed idempotently: every answer to a request that carried one
          echoes it. Errors: {"status", "errorCode", "message", "errorType"}.
  paypal  POST /v2/checkout/orders. Body: {"intent", "purchase_units": [{"reference_id" (the
          operation), "amount"}]}. Key: the PayPal-Request-Id header. Answer 201 with an order
          (id, status CREATED, intent, purchase_units, create_time, links). Errors: {"name",
          "message", "debug_id", "details"}; the OAuth endpoint's are {"error", "error_description"}.
  square  POST /v2/payments. Body: source_id, idempotency_key (the key, in the body; more than
          45 characters is 400 VALUE_TOO_LONG, outcome "too-long"), amount_money, reference_id
          (the operation). Answer 200 {"payment": {...}}. Errors: {"errors": [{"category",
          "code", "detail", "field"?}]}.
The operation falls back to an Operation-Id header when the body has none. Other paths: 404 in
the dialect's shape.

With --honour-keys (the body is compared as parsed JSON, key order aside):
  dialect  in flight                                   same key, other body
  adyen    409 errorCode 704 "request already          422 errorCode 704 (same message)
           processed or in progress", errorType
           validation
  paypal   409 RESOURCE_CONFLICT, issue                422 UNPROCESSABLE_ENTITY, issue
           PREVIOUS_REQUEST_IN_PROGRESS                PAYPAL_REQUEST_ID_PREVIOUSLY_USED
  square   409 CONFLICT (INVALID_REQUEST_ERROR)        400 IDEMPOTENCY_KEY_REUSED
A completed key gets the stored answer (outcome "replayed"): the stored status and body, except
PayPal, whose create-order reference says a repeated PayPal-Request-Id is answered 200 OK (not
201) with the order. No Idempotent-Replayed header: none of the three documents one.
Sources, and what is this fake's own choice: Adyen's idempotency page documents only that a
repeated key gets the first answer and echoes the key; 704 "request already processed or in
progress" is the error merchants report from Adyen, with 409 for a concurrent duplicate and 422
for a repeat of a consumed request, so those are used here. PayPal's guide says concurrent
duplicates "might fail"; 409 PREVIOUS_REQUEST_IN_PROGRESS is what integrations handle, and
PAYPAL_REQUEST_ID_PREVIOUSLY_USED is PayPal's documented issue for a request id used for another
request. Square documents IDEMPOTENCY_KEY_REUSED; its in-flight answer (409 CONFLICT) is this
fake's choice. The rate-limit, 401 and 404 bodies follow each provider's documented shape (Square
RATE_LIMITED / UNAUTHORIZED, PayPal RATE_LIMIT_REACHED / AUTHENTICATION_FAILURE /
RESOURCE_NOT_FOUND, Adyen "HTTP Status Response - ..." with errorCode 000).

Every charge is appended to --record as one JSON line: operation, charge (pspReference / order id
/ payment id), idempotency_key, time, response (the body sent). Every request is appended to
--requests: method, path, operation, authorization (as received; for the token endpoint null,
with only the client id seen in client_id: never the secret nor the Basic header),
idempotency_key (header, or Square's body field) and outcome: charged, charged-then-dropped,
rate-limited, replayed, key-in-use, key-reused, unauthorized, not-found, token-issued,
token-refused, too-long (and bad-request for a body that is not what the endpoint takes).
"""

import argparse
import base64
import binascii
import datetime
import json
import re
import secrets
import socket
import ssl
import struct
import sys
import threading
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

SQUARE_KEY_MAX = 45
ADYEN_PAYMENTS = re.compile(r"^/v[0-9]{1,3}/payments$")
ADYEN_704 = "request already processed or in progress"


class Dropped(Exception):
    """The connection was closed on purpose, without an answer."""


def now_iso():
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def canonical(value):
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


# --- the dialects' error bodies ---------------------------------------------------------------


def adyen_error(status, code, message, kind):
    return {"status": status, "errorCode": code, "message": message, "errorType": kind}


def paypal_error(name, message, issue=None, description=None):
    body = {"name": name, "message": message, "debug_id": secrets.token_hex(7)}
    if issue:
        body["details"] = [{"issue": issue, "description": description or message}]
    return body


def square_error(category, code, detail, field=None):
    error = {"category": category, "code": code, "detail": detail}
    if field:
        error["field"] = field
    return {"errors": [error]}


class Dialect:
    """What differs between the providers: paths, keys, bodies and errors."""

    def __init__(self, name):
        self.name = name

    def is_charge_path(self, path):
        if self.name == "adyen":
            return ADYEN_PAYMENTS.match(path) is not None
        if self.name == "paypal":
            return path == "/v2/checkout/orders"
        return path == "/v2/payments"

    def operation(self, body):
        try:
            if self.name == "adyen":
                return body.get("reference")
            if self.name == "paypal":
                return body["purchase_units"][0].get("reference_id")
            return body.get("reference_id")
        except (AttributeError, KeyError, IndexError, TypeError):
            return None

    def not_found(self):
        if self.name == "adyen":
            return 404, adyen_error(404, "000", "HTTP Status Response - Not Found", "security")
        if self.name == "paypal":
            return 404, paypal_error(
                "RESOURCE_NOT_FOUND",
                "The specified resource does not exist.",
                "INVALID_RESOURCE_ID",
                "Specified resource ID does not exist. Please check the resource ID and try again.",
            )
        return 404, square_error("INVALID_REQUEST_ERROR", "NOT_FOUND", "Resource not found.")

    def unauthorized(self, bearer_present=False):
        if self.name == "adyen":
            return 401, adyen_error(401, "000", "HTTP Status Response - Unauthorized", "security")
        if self.name == "paypal":
            if bearer_present:
                return 401, {
                    "error": "invalid_token",
                    "error_description": "Token signature verification failed",
                }
            return 401, paypal_error(
                "AUTHENTICATION_FAILURE",
                "Authentication failed due to invalid authentication credentials or a missing "
                "Authorization header.",
            )
        return 401, square_error(
            "AUTHENTICATION_ERROR",
            "UNAUTHORIZED",
            "This request could not be authorized.",
        )

    def rate_limited(self):
        if self.name == "adyen":
            return 429, adyen_error(
                429, "000", "HTTP Status Response - Too Many Requests", "security"
            )
        if self.name == "paypal":
            return 429, paypal_error(
                "RATE_LIMIT_REACHED", "Too many requests. Blocked due to rate limiting."
            )
        return 429, square_error("RATE_LIMIT_ERROR", "RATE_LIMITED", "Rate limit exceeded.")

    def key_in_use(self):
        if self.name == "adyen":
            return 409, adyen_error(409, "704", ADYEN_704, "validation")
        if self.name == "paypal":
            return 409, paypal_error(
                "RESOURCE_CONFLICT",
                "The server has detected a conflict while processing this request.",
                "PREVIOUS_REQUEST_IN_PROGRESS",
                "A previous request on this resource is currently in progress. Please wait for "
                "some time and try again. It is best to space out the initial and retry "
                "request(s) for at least 5 seconds.",
            )
        return 409, square_error(
            "INVALID_REQUEST_ERROR",
            "CONFLICT",
            "Another request with this idempotency key is in progress.",
            "idempotency_key",
        )

    def key_reused(self):
        if self.name == "adyen":
            return 422, adyen_error(422, "704", ADYEN_704, "validation")
        if self.name == "paypal":
            return 422, paypal_error(
                "UNPROCESSABLE_ENTITY",
                "The requested action could not be performed, semantically incorrect, or failed "
                "business validation.",
                "PAYPAL_REQUEST_ID_PREVIOUSLY_USED",
                "The PayPal-Request-ID has already been used for another request.",
            )
        return 400, square_error(
            "INVALID_REQUEST_ERROR",
            "IDEMPOTENCY_KEY_REUSED",
            "The idempotency key can only be retried with the same request data.",
            "idempotency_key",
        )

    def bad_request(self, detail):
        if self.name == "adyen":
            return 400, adyen_error(400, "702", detail, "validation")
        if self.name == "paypal":
            return 400, paypal_error(
                "INVALID_REQUEST",
                "Request is not well-formed, syntactically incorrect, or violates schema.",
                "MALFORMED_REQUEST_JSON",
                detail,
            )
        return 400, square_error("INVALID_REQUEST_ERROR", "BAD_REQUEST", detail)

    def replay_status(self, status):
        # PayPal answers a repeated PayPal-Request-Id on create order with 200 OK.
        if self.name == "paypal" and status == 201:
            return 200
        return status

    def charged(self, number, body, host):
        """The answer to a new charge: (status, body, charge id)."""
        if self.name == "adyen":
            psp = "88%014d" % number
            answer = {
                "pspReference": psp,
                "resultCode": "Authorised",
                "merchantReference": body.get("reference"),
                "amount": body.get("amount"),
            }
            return 200, answer, psp
        if self.name == "paypal":
            order_id = "8FAKE%012d" % number
            units = []
            for unit in body.get("purchase_units") or []:
                unit = dict(unit)
                unit.setdefault("payee", {"merchant_id": "FAKEMERCHANT1"})
                units.append(unit)
            base = "http://%s/v2/checkout/orders/%s" % (host, order_id)
            answer = {
                "id": order_id,
                "intent": body.get("intent"),
                "status": "CREATED",
                "purchase_units": units,
                "create_time": now_iso(),
                "links": [
                    {"href": base, "rel": "self", "method": "GET"},
                    {
                        "href": "http://%s/checkoutnow?token=%s" % (host, order_id),
                        "rel": "approve",
                        "method": "GET",
                    },
                    {"href": base, "rel": "update", "method": "PATCH"},
                    {"href": base + "/capture", "rel": "capture", "method": "POST"},
                ],
            }
            return 201, answer, order_id
        payment_id = "sqpay_fake_%06d" % number
        created = now_iso()
        answer = {
            "payment": {
                "id": payment_id,
                "created_at": created,
                "updated_at": created,
                "amount_money": body.get("amount_money"),
                "total_money": body.get("amount_money"),
                "status": "COMPLETED",
                "source_type": "CARD",
                "location_id": "LFAKE000000001",
                "order_id": "ofake_%06d" % number,
                "reference_id": body.get("reference_id"),
                "version_token": secrets.token_hex(8),
            }
        }
        return 200, answer, payment_id


class Provider:
    def __init__(self, args):
        self.dialect = Dialect(args.dialect)
        self.args = args
        self.honour = args.honour_keys
        self.drop = set(filter(None, args.drop_after_charge.split(",")))
        self.rate_limit = set(filter(None, args.rate_limit_first.split(",")))
        self.slow = {}
        for item in filter(None, args.slow.split(",")):
            operation, seconds = item.split("=", 1)
            self.slow[operation] = float(seconds)
        self.record = open(args.record, "a", encoding="utf-8")
        self.requests = open(args.requests, "a", encoding="utf-8") if args.requests else None
        self.lock = threading.Lock()
        self.charges = 0
        # key -> [fingerprint, None] while the first is in flight, then [fingerprint, (status,
        # body, headers)].
        self.stored = {}
        # (operation, fault) pairs whose one-time fault has happened.
        self.faulted = set()
        # PayPal: token -> expiry (epoch seconds); revoked tokens.
        self.tokens = {}
        self.revoked = set()

    def log_request(self, entry):
        if self.requests is not None:
            with self.lock:
                self.requests.write(json.dumps(entry) + "\n")
                self.requests.flush()

    def first_time(self, operation, fault, operations):
        with self.lock:
            if operation in operations and (operation, fault) not in self.faulted:
                self.faulted.add((operation, fault))
                return True
            return False

    def issue_token(self):
        token = "A21AA" + secrets.token_urlsafe(48)
        with self.lock:
            self.tokens[token] = time.time() + self.args.token_lifetime
        return token

    def token_valid(self, token):
        with self.lock:
            expiry = self.tokens.get(token)
            return expiry is not None and token not in self.revoked and time.time() < expiry

    def charge(self, operation, key, body, host):
        """Records a new charge; (status, answer body)."""
        with self.lock:
            self.charges += 1
            number = self.charges
            status, answer, charge_id = self.dialect.charged(number, body, host)
            line = {
                "operation": operation,
                "charge": charge_id,
                "idempotency_key": key,
                "time": time.time(),
                "response": answer,
            }
            self.record.write(json.dumps(line) + "\n")
            self.record.flush()
            revoke_after = self.args.revoke_tokens_after_charges
            if revoke_after and number == revoke_after:
                self.revoked.update(self.tokens)
            return status, answer


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "fake-payments/1"

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
        dialect = self.server.provider.dialect.name
        if dialect == "paypal":
            self.send_header("Paypal-Debug-Id", secrets.token_hex(7))
        elif dialect == "square":
            self.send_header("Square-Version", "2026-09-16")
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

    def read_body(self):
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            parts = []
            while True:
                size = int(self.rfile.readline().split(b";", 1)[0].strip() or b"0", 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass
                    break
                parts.append(self.rfile.read(size))
                self.rfile.readline()
            return b"".join(parts)
        length = int(self.headers.get("Content-Length", "0") or "0")
        return self.rfile.read(length) if length else b""

    def do_GET(self):
        self.read_body()
        provider = self.server.provider
        status, body = provider.dialect.not_found()
        provider.log_request(
            {
                "method": self.command,
                "path": self.path,
                "operation": None,
                "authorization": self.headers.get("Authorization"),
                "idempotency_key": None,
                "outcome": "not-found",
            }
        )
        self.answer(status, body)

    do_PUT = do_PATCH = do_DELETE = do_GET

    def token_request(self, raw):
        """PayPal's POST /v1/oauth2/token."""
        provider = self.server.provider
        client_id = None
        secret = None
        auth = self.headers.get("Authorization", "")
        if auth[:6].lower() == "basic ":
            try:
                decoded = base64.b64decode(auth[6:].strip(), validate=True).decode("utf-8")
                client_id, _, secret = decoded.partition(":")
            except (binascii.Error, UnicodeDecodeError):
                pass
        entry = {
            "method": "POST",
            "path": self.path,
            "operation": None,
            "authorization": None,
            "client_id": client_id,
            "idempotency_key": None,
        }
        form = urllib.parse.parse_qs(raw.decode("utf-8", "replace"), keep_blank_values=True)
        grant = form.get("grant_type", [None])[-1]
        if client_id != provider.args.client_id or secret != provider.args.client_secret:
            entry["outcome"] = "token-refused"
            provider.log_request(entry)
            return self.answer(
                401, {"error": "invalid_client", "error_description": "Client Authentication failed"}
            )
        if grant != "client_credentials":
            entry["outcome"] = "token-refused"
            provider.log_request(entry)
            return self.answer(
                400,
                {
                    "error": "unsupported_grant_type",
                    "error_description": (
                        "Grant Type is NULL" if grant is None else "unsupported grant_type"
                    ),
                },
            )
        token = provider.issue_token()
        entry["outcome"] = "token-issued"
        provider.log_request(entry)
        self.answer(
            200,
            {
                "scope": "https://uri.paypal.com/services/payments/payment "
                "https://uri.paypal.com/services/payments/refund openid",
                "access_token": token,
                "token_type": "Bearer",
                "app_id": "APP-FAKE",
                "expires_in": provider.args.token_lifetime,
                "nonce": now_iso() + secrets.token_urlsafe(24),
            },
        )

    def authorised(self):
        """(ok, whether a Bearer token was presented)."""
        provider = self.server.provider
        args = provider.args
        name = provider.dialect.name
        if name == "adyen":
            return self.headers.get("X-API-Key") == args.api_key, False
        auth = self.headers.get("Authorization") or ""
        if auth[:7].lower() != "bearer ":
            return False, False
        token = auth[7:].strip()
        if name == "square":
            return token == args.access_token, True
        return provider.token_valid(token), True

    def do_POST(self):
        provider = self.server.provider
        dialect = provider.dialect
        raw = self.read_body()
        path = self.path.split("?", 1)[0]
        if dialect.name == "paypal" and path == "/v1/oauth2/token":
            return self.token_request(raw)

        try:
            body = json.loads(raw.decode("utf-8")) if raw else None
        except (UnicodeDecodeError, ValueError):
            body = None
        operation = (dialect.operation(body) if isinstance(body, dict) else None) or self.headers.get(
            "Operation-Id"
        )
        if dialect.name == "square":
            key = body.get("idempotency_key") if isinstance(body, dict) else None
        elif dialect.name == "paypal":
            key = self.headers.get("PayPal-Request-Id")
        else:
            key = self.headers.get("Idempotency-Key")
        entry = {
            "method": "POST",
            "path": self.path,
            "operation": operation,
            "authorization": self.headers.get("Authorization"),
            "idempotency_key": key,
        }
        if dialect.name == "adyen":
            entry["api_key"] = self.headers.get("X-API-Key")
        echo = [("Idempotency-Key", key)] if dialect.name == "adyen" and key else []

        def done(what):
            entry["outcome"] = what
            provider.log_request(entry)

        ok, bearer = self.authorised()
        if not ok:
            done("unauthorized")
            return self.answer(*dialect.unauthorized(bearer))
        if not dialect.is_charge_path(path):
            done("not-found")
            return self.answer(*dialect.not_found())
        if not isinstance(body, dict):
            done("bad-request")
            return self.answer(*dialect.bad_request("The request body is not a JSON object."))
        if dialect.name == "square":
            if not key:
                done("bad-request")
                return self.answer(
                    400,
                    square_error(
                        "INVALID_REQUEST_ERROR",
                        "MISSING_REQUIRED_PARAMETER",
                        "Field must be set",
                        "idempotency_key",
                    ),
                )
            if len(key) > SQUARE_KEY_MAX:
                done("too-long")
                return self.answer(
                    400,
                    square_error(
                        "INVALID_REQUEST_ERROR",
                        "VALUE_TOO_LONG",
                        "Field must not be greater than %d length" % SQUARE_KEY_MAX,
                        "idempotency_key",
                    ),
                )
        if provider.first_time(operation, "rate-limit", provider.rate_limit):
            done("rate-limited")
            return self.answer(*dialect.rate_limited(), extra=[("Retry-After", "1")])

        fingerprint = canonical(body)
        if provider.honour and key:
            with provider.lock:
                slot = provider.stored.get(key)
                if slot is None:
                    provider.stored[key] = [fingerprint, None]
            if slot is not None:
                if slot[1] is None:
                    done("key-in-use")
                    return self.answer(*dialect.key_in_use(), extra=echo)
                if slot[0] != fingerprint:
                    done("key-reused")
                    return self.answer(*dialect.key_reused(), extra=echo)
                status, stored_body = slot[1]
                done("replayed")
                return self.answer(dialect.replay_status(status), stored_body, extra=echo)

        host = self.headers.get("Host") or "%s:%d" % self.server.server_address[:2]
        status, answer = provider.charge(operation, key, body, host)
        if provider.first_time(operation, "drop", provider.drop):
            if provider.honour and key:
                with provider.lock:
                    provider.stored[key][1] = (status, answer)
            done("charged-then-dropped")
            self.drop_connection()
        delay = provider.slow.get(operation)
        if delay is not None and provider.first_time(operation, "slow", provider.slow):
            time.sleep(delay)
        if provider.honour and key:
            with provider.lock:
                provider.stored[key][1] = (status, answer)
        done("charged")
        self.answer(status, answer, extra=echo)


class PlainServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, address, provider):
        super().__init__(address, Handler)
        self.provider = provider


class TlsServer(PlainServer):
    def __init__(self, address, context, provider):
        super().__init__(address, provider)
        self.context = context

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
    parser.add_argument("--dialect", required=True, choices=["adyen", "paypal", "square"])
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--plain", action="store_true", help="serve plain HTTP (smoke tests)")
    parser.add_argument("--cert")
    parser.add_argument("--key")
    parser.add_argument("--record", required=True)
    parser.add_argument("--requests")
    keys = parser.add_mutually_exclusive_group(required=True)
    keys.add_argument("--honour-keys", action="store_true")
    keys.add_argument("--ignore-keys", action="store_true")
    parser.add_argument("--drop-after-charge", default="")
    parser.add_argument("--rate-limit-first", default="")
    parser.add_argument("--slow", default="")
    parser.add_argument("--api-key", help="adyen: the X-API-Key served")
    parser.add_argument("--access-token", help="square: the Bearer token served")
    parser.add_argument("--client-id", help="paypal: the OAuth client id")
    parser.add_argument("--client-secret", help="paypal: the OAuth client secret")
    parser.add_argument("--token-lifetime", type=int, default=32400, help="paypal: seconds")
    parser.add_argument("--revoke-tokens-after-charges", type=int, default=0, help="paypal: 0 = never")
    args = parser.parse_args()

    needed = {
        "adyen": ["api_key"],
        "square": ["access_token"],
        "paypal": ["client_id", "client_secret"],
    }[args.dialect]
    for name in needed:
        if not getattr(args, name):
            parser.error("--dialect %s needs --%s" % (args.dialect, name.replace("_", "-")))
    if not args.plain and not (args.cert and args.key):
        parser.error("--cert and --key are required unless --plain")

    provider = Provider(args)
    if args.plain:
        server = PlainServer(("127.0.0.1", args.port), provider)
    else:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        context.load_cert_chain(args.cert, args.key)
        server = TlsServer(("127.0.0.1", args.port), context, provider)
    print(server.server_address[1], flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    sys.exit(main())
