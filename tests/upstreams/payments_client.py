#!/usr/bin/env python3
"""Charges operations through fencegate with the official Adyen, PayPal or Square Python library
(one per run, --dialect), for the gateway's end-to-end tests of those providers. The libraries
are pinned in install-payments.sh: adyen 16.0.0, paypal-server-sdk 2.4.0, squareup
46.0.0.20260916.

Each library is used as an application would, pointed at --base (the gateway, plain HTTP) with a
placeholder credential the gateway replaces (for smoke tests against fake_payments.py directly,
the real one), and none of the library's files changed:

  adyen   Adyen.Adyen(xapikey=CREDENTIAL, platform="test"); the README's "Customizing Base URL":
          checkout.payments_api.baseUrl = BASE + "/v72" (the version 16.0.0 calls). Each call
          passes idempotency_key=<uuid4> (sent as Idempotency-Key; the library sends none of its
          own). The library has no retries: --retries must be 0.
  paypal  PaypalServersdkClient(config=GatewayConfiguration(...)), a Configuration subclass whose
          get_base_uri returns BASE (the library's environments are only PayPal's two). The OAuth
          token is pre-set: ClientCredentialsAuthCredentials(o_auth_token=OAuthToken(CREDENTIAL,
          expiry far ahead)), so the library sends "Authorization: Bearer CREDENTIAL" and never
          calls /v1/oauth2/token (the gateway owns the client id and secret; a token provider
          that fails the call is installed in case the library ever wanted a token). Each call
          sends PayPal-Request-Id: <uuid4>. --retries N: the library's urllib3 retries
          (max_retries=N, on connection errors and on 408 413 429 500 502 503 504 521 522 524,
          honouring Retry-After), with POST added to its retry_methods, since by default it
          retries only GET and PUT, so never a create order.
  square  Square(base_url=BASE, token=CREDENTIAL, httpx_client=...). Each call passes
          idempotency_key=<uuid4> in the body, as the library requires one. --retries N:
          request_options max_retries (the library's default is 2) on 408, 409, 429 and 5xx,
          honouring Retry-After; connection errors are not retried.

Each operation is charged --duplicates times at once, each call on its own thread, with the
operation id in the body (Adyen reference, PayPal purchase_units[0].reference_id, Square
reference_id) and in an Operation-Id header. One JSON line per call is printed when all are done,
sorted by (operation, call): operation, call, ok, charge (pspReference / order id / payment id),
status, error, problem (the "type" of an RFC 9457 problem document the gateway answered),
idempotency_key (the one this client sent) and attempts (the status of every HTTP attempt the
library made, "connection-error" for one without an answer).
"""

import argparse
import json
import os
import sys
import threading
import time
import uuid

# Only --base is ever reached: no proxy from the environment.
for _name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy"):
    os.environ.pop(_name, None)

LOCAL = threading.local()
ADYEN_CHECKOUT_VERSION = "v72"


def note_attempt(outcome):
    attempts = getattr(LOCAL, "attempts", None)
    if attempts is not None:
        attempts.append(outcome)


def count_urllib3_attempts():
    """Notes every attempt urllib3 makes (requests' transport: Adyen's and PayPal's)."""
    from urllib3.connectionpool import HTTPConnectionPool

    original = HTTPConnectionPool._make_request

    def counting(self, *args, **kwargs):
        try:
            response = original(self, *args, **kwargs)
        except Exception:
            note_attempt("connection-error")
            raise
        note_attempt(response.status)
        return response

    HTTPConnectionPool._make_request = counting


def problem_type(text):
    if isinstance(text, (bytes, bytearray)):
        text = text.decode("utf-8", "replace")
    try:
        body = json.loads(text) if isinstance(text, str) else text
    except ValueError:
        return None
    if isinstance(body, dict) and isinstance(body.get("type"), str):
        return body["type"]
    return None


# --- Adyen --------------------------------------------------------------------------------------


def adyen_setup(args):
    import Adyen

    if args.retries:
        sys.exit("payments_client.py: the Adyen library has no retry setting; use --retries 0")
    count_urllib3_attempts()
    adyen = Adyen.Adyen(
        xapikey=args.credential,
        platform="test",
        http_force="requests",
        http_timeout=args.timeout,
    )
    adyen.checkout.payments_api.baseUrl = args.base.rstrip("/") + "/" + ADYEN_CHECKOUT_VERSION
    return adyen


def adyen_charge(adyen, args, operation, result):
    import Adyen
    import requests

    key = str(uuid.uuid4())
    result["idempotency_key"] = key
    request = {
        "merchantAccount": args.merchant_account,
        "reference": operation,
        "amount": {"value": args.amount, "currency": "EUR"},
        "paymentMethod": {
            "type": "scheme",
            "encryptedCardNumber": "test_4111111111111111",
            "encryptedExpiryMonth": "test_03",
            "encryptedExpiryYear": "test_2030",
            "encryptedSecurityCode": "test_737",
        },
        "returnUrl": "https://shop.invalid/return",
    }
    try:
        answer = adyen.checkout.payments_api.payments(
            request, idempotency_key=key, header_parameters={"Operation-Id": operation}
        )
        result.update(ok=True, charge=answer.message.get("pspReference"), status=answer.status_code)
    except Adyen.AdyenError as e:
        result.update(ok=False, error=type(e).__name__, status=e.status_code or None)
        result["problem"] = problem_type(e.raw_response)
        result["message"] = str(e.message)[:200]
    except requests.RequestException as e:
        result.update(ok=False, error=type(e).__name__, message=str(e)[:300])


# --- PayPal -------------------------------------------------------------------------------------


def paypal_setup(args):
    from paypalserversdk.configuration import Configuration, Environment, Server
    from paypalserversdk.http.auth.o_auth_2 import ClientCredentialsAuthCredentials
    from paypalserversdk.models.o_auth_token import OAuthToken
    from paypalserversdk.paypal_serversdk_client import PaypalServersdkClient

    count_urllib3_attempts()
    base = args.base.rstrip("/")

    class GatewayConfiguration(Configuration):
        """The library's configuration with one base URI: the gateway's."""

        def get_base_uri(self, server=Server.DEFAULT):
            return base

    def refuse_token_fetch(token, auth):
        raise RuntimeError(
            "the PayPal library wanted an OAuth token of its own; the pre-set one must not expire"
        )

    far = int(time.time()) + 10 * 365 * 24 * 3600
    credentials = ClientCredentialsAuthCredentials(
        # Never sent: the token below is pre-set, and the token endpoint is never called.
        o_auth_client_id="held-by-the-gateway",
        o_auth_client_secret="held-by-the-gateway",
        o_auth_token=OAuthToken(access_token=args.credential, token_type="Bearer", expiry=far),
        o_auth_token_provider=refuse_token_fetch,
    )
    retry_methods = ["GET", "PUT", "POST"] if args.retries else None
    config = GatewayConfiguration(
        http_call_back=paypal_operation_header(),
        timeout=args.timeout,
        max_retries=args.retries,
        retry_methods=retry_methods,
        environment=Environment.SANDBOX,
        client_credentials_auth_credentials=credentials,
    )
    return PaypalServersdkClient(config=config)


def paypal_charge(client, args, operation, result):
    import requests
    from paypalserversdk.exceptions.api_exception import ApiException
    from paypalserversdk.models.amount_with_breakdown import AmountWithBreakdown
    from paypalserversdk.models.checkout_payment_intent import CheckoutPaymentIntent
    from paypalserversdk.models.order_request import OrderRequest
    from paypalserversdk.models.purchase_unit_request import PurchaseUnitRequest

    key = str(uuid.uuid4())
    result["idempotency_key"] = key
    body = OrderRequest(
        intent=CheckoutPaymentIntent.CAPTURE,
        purchase_units=[
            PurchaseUnitRequest(
                reference_id=operation,
                amount=AmountWithBreakdown(currency_code="USD", value="%.2f" % (args.amount / 100)),
            )
        ],
    )
    # The Operation-Id header: create_order takes only its own headers, so it rides on the
    # library's per-request hook (http_call_back, see paypal_operation_header).
    LOCAL.operation = operation
    try:
        answer = client.orders.create_order({"body": body, "paypal_request_id": key})
        result.update(ok=True, charge=answer.body.id, status=answer.status_code)
    except ApiException as e:
        result.update(ok=False, error=type(e).__name__, status=e.response_code)
        result["problem"] = problem_type(e.response.text)
        result["message"] = str(e.reason)[:200]
    except requests.RequestException as e:
        result.update(ok=False, error=type(e).__name__, message=str(e)[:300])
    except RuntimeError as e:
        result.update(ok=False, error=type(e).__name__, message=str(e)[:300])


def paypal_operation_header():
    """An HttpCallBack adding Operation-Id: the calling thread's operation."""
    from paypalserversdk.http.http_call_back import HttpCallBack

    class OperationHeader(HttpCallBack):
        def on_before_request(self, request):
            operation = getattr(LOCAL, "operation", None)
            if operation is not None:
                request.add_header("Operation-Id", operation)

        def on_after_response(self, response):
            pass

    return OperationHeader()


# --- Square -------------------------------------------------------------------------------------


def square_setup(args):
    import httpx
    from square import Square

    class CountingTransport(httpx.HTTPTransport):
        def handle_request(self, request):
            try:
                response = super().handle_request(request)
            except httpx.TransportError:
                note_attempt("connection-error")
                raise
            note_attempt(response.status_code)
            return response

    http = httpx.Client(
        transport=CountingTransport(), timeout=args.timeout, trust_env=False, follow_redirects=False
    )
    return Square(
        base_url=args.base.rstrip("/"), token=args.credential, httpx_client=http, timeout=args.timeout
    )


def square_charge(client, args, operation, result):
    import httpx
    from square.core.api_error import ApiError

    key = str(uuid.uuid4())
    result["idempotency_key"] = key
    try:
        # with_raw_response: the same call, also giving the HTTP status.
        answer = client.payments.with_raw_response.create(
            source_id="cnon:card-nonce-ok",
            idempotency_key=key,
            amount_money={"amount": args.amount, "currency": "USD"},
            reference_id=operation,
            request_options={
                "max_retries": args.retries,
                "additional_headers": {"Operation-Id": operation},
            },
        )
        payment = answer.data.payment
        result.update(ok=True, charge=payment.id if payment else None, status=answer.status_code)
    except ApiError as e:
        result.update(ok=False, error=type(e).__name__, status=e.status_code)
        body = json.dumps(e.body) if isinstance(e.body, dict) else e.body
        result["problem"] = problem_type(body)
        result["message"] = "; ".join("%s %s" % (x.category, x.code) for x in e.errors)[:200]
    except httpx.HTTPError as e:
        result.update(ok=False, error=type(e).__name__, message=str(e)[:300])


DIALECTS = {
    "adyen": (adyen_setup, adyen_charge),
    "paypal": (paypal_setup, paypal_charge),
    "square": (square_setup, square_charge),
}


def call(charge, client, args, operation, number, results, lock):
    LOCAL.attempts = attempts = []
    result = {"operation": operation, "call": number, "ok": False, "charge": None, "status": None,
              "error": None, "problem": None}
    charge(client, args, operation, result)
    result["attempts"] = attempts
    with lock:
        results.append(result)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dialect", required=True, choices=sorted(DIALECTS))
    parser.add_argument("--base", required=True, help="the gateway, http://127.0.0.1:PORT")
    parser.add_argument("--credential", required=True,
                        help="Adyen API key / PayPal access token / Square access token "
                        "(a placeholder the gateway replaces)")
    parser.add_argument("--operations", required=True, help="comma-separated operation ids")
    parser.add_argument("--duplicates", type=int, default=1)
    parser.add_argument("--retries", type=int, default=0, help="the library's own retries")
    parser.add_argument("--timeout", type=float, default=30.0, help="per attempt, seconds")
    parser.add_argument("--amount", type=int, default=1000, help="minor units")
    parser.add_argument("--merchant-account", default="FencegateTestECOM", help="Adyen only")
    args = parser.parse_args()

    setup, charge = DIALECTS[args.dialect]
    client = setup(args)

    results, lock, threads = [], threading.Lock(), []
    for operation in filter(None, args.operations.split(",")):
        for number in range(args.duplicates):
            thread = threading.Thread(
                target=call, args=(charge, client, args, operation, number, results, lock)
            )
            thread.start()
            threads.append(thread)
    for thread in threads:
        thread.join()
    for result in sorted(results, key=lambda r: (r["operation"], r["call"])):
        print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
