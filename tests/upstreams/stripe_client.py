#!/usr/bin/env python3
"""Charges payouts through fencegate with the official Stripe Python library, for
tests/process/stripe.rs.

The library is used as an application would: `stripe.api_key` (a dummy: the gateway replaces the
Authorization header with the real secret, so this process never holds it), `stripe.api_base`
pointing at the gateway, `stripe.ca_bundle_path` at the test CA, and `stripe.max_network_retries`
on, so the library retries connection errors, 409 and 5xx by itself with one Idempotency-Key of
its own per call (which the gateway replaces with the key it derives from Payout-Id).

Each payout is charged --duplicates times at once, each call on its own thread, with the header
Payout-Id: <payout> and metadata[payout]. One JSON line per call is printed when all are done:
payout, call, ok, the charge id (or the error), and the HTTP status of every attempt the library
made.
"""

import argparse
import json
import sys
import threading

import stripe


class CountingClient(stripe.RequestsClient):
    """The library's own requests client, noting the status of each attempt it makes."""

    local = threading.local()

    def request(self, method, url, headers, post_data=None, **kwargs):
        attempts = getattr(CountingClient.local, "attempts", None)
        try:
            content, status, rheaders = super().request(
                method, url, headers, post_data, **kwargs
            )
        except stripe.APIConnectionError:
            if attempts is not None:
                attempts.append("connection-error")
            raise
        if attempts is not None:
            attempts.append(status)
        return content, status, rheaders


def charge(payout, call, amount, results, lock):
    CountingClient.local.attempts = attempts = []
    result = {"payout": payout, "call": call}
    try:
        charged = stripe.Charge.create(
            amount=amount,
            currency="eur",
            source="tok_visa",
            metadata={"payout": payout},
            headers={"Payout-Id": payout},
        )
        result.update(ok=True, charge=charged.id, amount=charged.amount)
    except stripe.StripeError as e:
        result.update(
            ok=False,
            error=type(e).__name__,
            status=e.http_status,
            message=str(e).splitlines()[0][:200] if str(e) else "",
        )
        # A connection error's cause: the library retries timeouts and connection errors, not
        # a failed TLS handshake or a broken response.
        if isinstance(e, stripe.APIConnectionError):
            result["network_error"] = str(e).rsplit("(Network error: ", 1)[-1].rstrip(")")[:300]
            result["retryable"] = e.should_retry
        # The gateway's own refusals are problem documents; note their type.
        try:
            result["problem"] = json.loads(e.http_body or "").get("type")
        except (ValueError, AttributeError):
            pass
    result["attempts"] = attempts
    with lock:
        results.append(result)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--base", required=True, help="the gateway, https://localhost:PORT")
    parser.add_argument("--ca", required=True, help="PEM bundle the gateway's certificate is issued by")
    parser.add_argument("--api-key", required=True, help="the client's key (the gateway replaces it)")
    parser.add_argument("--payouts", required=True, help="comma-separated payout ids")
    parser.add_argument("--duplicates", type=int, default=1)
    parser.add_argument("--retries", type=int, default=3, help="stripe.max_network_retries")
    parser.add_argument("--timeout", type=float, default=30.0, help="per attempt, seconds")
    parser.add_argument("--amount", type=int, default=1000)
    args = parser.parse_args()

    stripe.api_key = args.api_key
    stripe.api_base = args.base
    stripe.ca_bundle_path = args.ca
    stripe.max_network_retries = args.retries
    stripe.enable_telemetry = False
    stripe.default_http_client = CountingClient(timeout=args.timeout)

    results, lock, threads = [], threading.Lock(), []
    for payout in filter(None, args.payouts.split(",")):
        for call in range(args.duplicates):
            thread = threading.Thread(
                target=charge, args=(payout, call, args.amount, results, lock)
            )
            thread.start()
            threads.append(thread)
    for thread in threads:
        thread.join()
    for result in sorted(results, key=lambda r: (r["payout"], r["call"])):
        print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
