"""Legacy upstream for the differential test: a plain Flask 3 app knowing nothing about fencing.

Every method except GET, HEAD, OPTIONS and TRACE (as Werkzeug reports it -- it upper-cases the
request line's method) is a write: it appends a record and answers 200 {"applied": resource}.
The request is read exactly as Flask/Werkzeug hand it over; nothing is normalised here.

    python3 tests/upstreams/flask_app.py PORT

Control endpoints (hit directly, not through the gateway): GET /_record, POST /_reset.

Typed-id resources: the id is parsed the way a Flask app would parse it and the resource is
recorded under the parsed value (str() of the int or of the uuid.UUID):

    /orders/<int:id>, /parcels/<int:id>    -> order:<n>, parcel:<n>
    /tickets/<uuid:id>, /badges/<uuid:id>  -> ticket:<uuid>, badge:<uuid>
    /ledgers?id=                           -> ledger:<n>   request.args.get("id", type=int)
    /tallies?id=                           -> tally:<uuid> uuid.UUID(request.args["id"])
    /shipments, header X-Shipment          -> shipment:<n> int(request.headers["X-Shipment"])
    /crates, header X-Crate                -> crate:<uuid> uuid.UUID(request.headers["X-Crate"])

Werkzeug's int converter is the regex \\d+ -- Python's Unicode digits, so full-width ones too --
then int(); its uuid converter is hyphenated 8-4-4-4-12 hex in either case, then uuid.UUID().
A value the converter's regex or to_python rejects leaves /orders/<id> etc. unmatched by the
typed rule; it is caught by a plain /orders/<id> rule that answers Flask's own 404 (without it the
catch-all below would take the path). A failed query/header conversion answers Flask's 400 (a
missing query key is Werkzeug's own BadRequestKeyError, also 400; a missing header, which
Werkzeug reports as a plain KeyError, is answered 400 too). Nothing is recorded for either.
"""

import logging
import sys
import threading
import uuid
from urllib.parse import parse_qsl, unquote, urlsplit

from flask import Flask, abort, jsonify, request
from werkzeug.datastructures import MultiDict
from werkzeug.exceptions import HTTPException
from werkzeug.routing import RequestRedirect

READ_METHODS = {"GET", "HEAD", "OPTIONS", "TRACE"}
# Werkzeug answers 405 for a method a route does not list, so list a broad set.
METHODS = [
    "GET", "HEAD", "OPTIONS", "TRACE", "POST", "PUT", "PATCH", "DELETE", "MOVE", "COPY",
    "MERGE", "PROPPATCH", "PROPFIND", "LOCK", "UNLOCK", "MKCOL", "REPORT", "SEARCH", "FOO",
]

app = Flask(__name__)
_lock = threading.Lock()
_records = []


# Control endpoints are registered first.
@app.route("/_record", methods=["GET"])
def get_record():
    with _lock:
        return jsonify(list(_records))


@app.route("/_reset", methods=["POST"])
def reset():
    with _lock:
        _records.clear()
    return jsonify({"reset": True})


def _uuid_or_400(value):
    try:
        return uuid.UUID(value)
    except ValueError:
        abort(400)


def _int_or_400(value):
    try:
        return int(value)
    except ValueError:
        abort(400)


def _header_or_400(headers, name):
    # request.args[...] raises Werkzeug's BadRequestKeyError (400) for a missing key, but
    # request.headers (EnvironHeaders) raises a plain KeyError, which Flask turns into a 500 with a
    # traceback: a missing header is answered 400 like an unparsable one.
    try:
        return headers[name]
    except KeyError:
        abort(400)


def _resource_for(endpoint, args, query_id, tenant, path, query=None, headers=None):
    """The resource a matched endpoint maps to. `query` (a MultiDict) and `headers` are only read
    by the typed-id resources; a rejected typed id aborts with Flask's 404/400."""
    if endpoint in ("order", "parcel", "ticket", "badge"):
        return f"{endpoint}:{args['id']}"
    if endpoint == "typed_rejected":
        abort(404)
    if endpoint == "ledger":
        n = query.get("id", type=int)
        if n is None:
            abort(400)
        return f"ledger:{n}"
    if endpoint == "tally":
        return f"tally:{_uuid_or_400(query['id'])}"
    if endpoint == "shipment":
        return f"shipment:{_int_or_400(_header_or_400(headers, 'X-Shipment'))}"
    if endpoint == "crate":
        return f"crate:{_uuid_or_400(_header_or_400(headers, 'X-Crate'))}"
    if endpoint == "invoice":
        return f"invoice:{args['id']}"
    if endpoint == "accounts":
        return f"acct:{query_id if query_id is not None else ''}"
    if endpoint == "doc":
        return f"doc:{tenant}:{args['id']}"
    return f"other:{path}"


def _destination_resource(dest, tenant):
    """Resolves a Destination header the way Flask's own URL map would resolve that path."""
    parts = urlsplit(dest)
    path = unquote(parts.path)
    query_id = None
    for key, value in parse_qsl(parts.query, keep_blank_values=True):
        if key == "id":
            query_id = value
            break
    adapter = app.url_map.bind("localhost")
    for _ in range(5):
        try:
            endpoint, args = adapter.match(path, method="PUT")
        except RequestRedirect as redirect:
            # merge_slashes / strict_slashes: Flask would serve the redirected path.
            path = unquote(urlsplit(redirect.new_url).path)
            continue
        except HTTPException:
            return f"other:{path}"
        # A typed destination is read like a request to it: its query's `id`, and the request's
        # own X-Shipment / X-Crate headers (as /docs/ uses the request's X-Tenant).
        query = MultiDict(parse_qsl(parts.query, keep_blank_values=True))
        return _resource_for(endpoint, args, query_id, tenant, path, query, request.headers)
    return f"other:{path}"


def _handle(endpoint, **args):
    method = request.method
    tenant = request.headers.get("X-Tenant") or ""
    resource = _resource_for(
        endpoint, args, request.args.get("id"), tenant, request.path, request.args, request.headers
    )
    if method in READ_METHODS:
        return jsonify({"read": resource})
    record = {
        "method": method,
        "path": request.path,
        "resource": resource,
        "fence": request.headers.get("X-Fence"),
        "body": request.get_data(as_text=True),
    }
    dest = request.headers.get("Destination")
    if method.upper() in ("MOVE", "COPY") and dest is not None:
        record["source_resource"] = resource
        record["resource"] = resource = _destination_resource(dest, tenant)
    with _lock:
        _records.append(record)
    return jsonify({"applied": resource})


@app.route("/invoices/<id>", methods=METHODS)
def invoice(id):
    return _handle("invoice", id=id)


@app.route("/accounts", methods=METHODS)
def accounts():
    return _handle("accounts")


@app.route("/docs/<id>", methods=METHODS)
def doc(id):
    return _handle("doc", id=id)


@app.route("/orders/<int:id>", methods=METHODS, endpoint="order")
@app.route("/parcels/<int:id>", methods=METHODS, endpoint="parcel")
@app.route("/tickets/<uuid:id>", methods=METHODS, endpoint="ticket")
@app.route("/badges/<uuid:id>", methods=METHODS, endpoint="badge")
def typed_path(id):
    return _handle(request.endpoint, id=id)


# Werkzeug tries a rule part's converters by weight (int 50 before the default string converter's
# 100; uuid ties at 100 and goes first by being registered first), so these take only what the
# typed rules above rejected: Flask's 404, as an app without the catch-all below would answer.
@app.route("/orders/<id>", methods=METHODS, endpoint="typed_rejected")
@app.route("/parcels/<id>", methods=METHODS, endpoint="typed_rejected")
@app.route("/tickets/<id>", methods=METHODS, endpoint="typed_rejected")
@app.route("/badges/<id>", methods=METHODS, endpoint="typed_rejected")
def typed_rejected(id):
    return _handle("typed_rejected", id=id)


@app.route("/ledgers", methods=METHODS, endpoint="ledger")
@app.route("/tallies", methods=METHODS, endpoint="tally")
@app.route("/shipments", methods=METHODS, endpoint="shipment")
@app.route("/crates", methods=METHODS, endpoint="crate")
def typed_query_or_header():
    return _handle(request.endpoint)


@app.route("/", methods=METHODS, defaults={"rest": ""})
@app.route("/<path:rest>", methods=METHODS)
def other(rest):
    return _handle("other")


if __name__ == "__main__":
    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    app.run(host="127.0.0.1", port=int(sys.argv[1]), threaded=True)
