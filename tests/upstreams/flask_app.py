"""Legacy upstream for the differential test: a plain Flask 3 app knowing nothing about fencing.

Every method except GET, HEAD, OPTIONS and TRACE (as Werkzeug reports it -- it upper-cases the
request line's method) is a write: it appends a record and answers 200 {"applied": resource}.
The request is read exactly as Flask/Werkzeug hand it over; nothing is normalised here.

    python3 tests/upstreams/flask_app.py PORT

Control endpoints (hit directly, not through the gateway): GET /_record, POST /_reset.
"""

import logging
import sys
import threading
from urllib.parse import parse_qsl, unquote, urlsplit

from flask import Flask, jsonify, request
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


def _resource_for(endpoint, args, query_id, tenant, path):
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
        return _resource_for(endpoint, args, query_id, tenant, path)
    return f"other:{path}"


def _handle(endpoint, **args):
    method = request.method
    tenant = request.headers.get("X-Tenant") or ""
    resource = _resource_for(endpoint, args, request.args.get("id"), tenant, request.path)
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


@app.route("/", methods=METHODS, defaults={"rest": ""})
@app.route("/<path:rest>", methods=METHODS)
def other(rest):
    return _handle("other")


if __name__ == "__main__":
    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    app.run(host="127.0.0.1", port=int(sys.argv[1]), threaded=True)
