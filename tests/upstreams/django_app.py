"""Legacy upstream for the differential test: a plain single-file Django 5 app knowing nothing
about fencing.

    python3 tests/upstreams/django_app.py PORT

It is served by Django's own development server (django.core.servers.basehttp.run, as
`manage.py runserver` does, with threading=True) on 127.0.0.1:PORT. Settings are configured here
in code: DEBUG False, ALLOWED_HOSTS ["*"], no database, no installed apps, and the middleware of
`django-admin startproject` less the three that need contrib apps and a database (sessions, auth,
messages): SecurityMiddleware, CommonMiddleware, CsrfViewMiddleware, XFrameOptionsMiddleware.
The views are csrf_exempt, as an API's would be. Only the django.server request log is quieted
(to errors).

Every method except GET, HEAD, OPTIONS and TRACE -- compared as Django reports it: WSGIRequest
upper-cases REQUEST_METHOD, so `get` is a read, and the server accepts any method token -- is a
write: it appends a record and answers 200 {"applied": resource}. The request is read exactly as
Django hands it over; nothing is normalised here.

Routing is Django's URL resolver (django.urls.path / re_path), first match wins:

    /invoices/<str:id>       -> invoice:<id>
    /accounts                -> acct:<request.GET.get("id")>  (QueryDict: the LAST of repeated ids)
    /docs/<str:id>           -> doc:<X-Tenant>:<id>
    /orders/<int:id>, /parcels/<int:id>   -> order:<n>, parcel:<n>   (IntConverter: [0-9]+, int())
    /tickets/<uuid:id>, /badges/<uuid:id> -> ticket:<uuid>, badge:<uuid>
                                 (UUIDConverter: lower-case hyphenated 8-4-4-4-12 only, uuid.UUID())
    /orders/<str:id> etc.    what the int/uuid converter refused: Django's own 404, no record
    /ledgers                 -> ledger:<int(request.GET["id"])>
    /tallies                 -> tally:<uuid.UUID(request.GET["id"])>
    /shipments               -> shipment:<int(request.headers["X-Shipment"])>
    /crates                  -> crate:<uuid.UUID(request.headers["X-Crate"])>
        a ValueError is Django's own 400 (django.core.exceptions.BadRequest), nothing recorded; so
        is a missing id or header (a KeyError, which Django would otherwise answer with a 500)
    anything else (re_path "^")  -> other:<request.path>

Django's defaults are kept: matching is case-sensitive (/Invoices/1 is other:/Invoices/1), and a
pattern has no trailing slash, so /invoices/1/ does not match it and is other:/invoices/1/.
APPEND_SLASH is True (Django's default, left so by startproject) with CommonMiddleware, but it
only redirects a path that resolves to nothing while path + "/" would resolve; the catch-all
resolves every path, so it never fires here.

MOVE/COPY with a Destination header: the destination's path (percent-decoded) is resolved with
django.urls.resolve, and the resource is what that match maps to (its query read with QueryDict;
X-Shipment / X-Crate / X-Tenant are the request's own); source_resource is the request path's.

Control endpoints (hit directly, not through the gateway): GET /_record, POST /_reset (any other
method on them is an ordinary other:/_record or other:/_reset).
"""

import sys
import threading
import uuid
from urllib.parse import unquote, urlsplit

import django
from django.conf import settings

settings.configure(
    DEBUG=False,
    ALLOWED_HOSTS=["*"],
    SECRET_KEY="fencegate-differential-test-upstream-not-secret",
    ROOT_URLCONF=__name__,
    INSTALLED_APPS=[],
    DATABASES={},
    MIDDLEWARE=[
        "django.middleware.security.SecurityMiddleware",
        "django.middleware.common.CommonMiddleware",
        "django.middleware.csrf.CsrfViewMiddleware",
        "django.middleware.clickjacking.XFrameOptionsMiddleware",
    ],
    USE_TZ=True,
    LOGGING={
        "version": 1,
        "disable_existing_loggers": False,
        "loggers": {"django.server": {"level": "ERROR"}},
    },
)
django.setup()

from django.core.exceptions import BadRequest  # noqa: E402
from django.http import Http404, HttpRequest, JsonResponse, QueryDict  # noqa: E402
from django.urls import Resolver404, path, re_path, resolve  # noqa: E402
from django.views.decorators.csrf import csrf_exempt  # noqa: E402

READ_METHODS = {"GET", "HEAD", "OPTIONS", "TRACE"}

_lock = threading.Lock()
_records = []


def _parsed(parse, lookup, key):
    """parse(lookup[key]); a missing key or a ValueError is Django's 400."""
    try:
        return parse(lookup[key])
    except (KeyError, ValueError):
        raise BadRequest(f"bad {key}")


def _resource_for(name, kwargs, query, request, path):
    """The resource a resolved URL name maps to, reading `query` (a QueryDict) and the request's
    headers where the resource says so."""
    if name == "invoice":
        return f"invoice:{kwargs['id']}"
    if name == "accounts":
        return f"acct:{query.get('id') or ''}"
    if name == "doc":
        return f"doc:{request.headers.get('X-Tenant') or ''}:{kwargs['id']}"
    if name in ("order", "parcel", "ticket", "badge"):
        return f"{name}:{kwargs['id']}"
    if name == "typed_rejected":
        raise Http404("rejected by the path converter")
    if name == "ledger":
        return f"ledger:{_parsed(int, query, 'id')}"
    if name == "tally":
        return f"tally:{_parsed(uuid.UUID, query, 'id')}"
    if name == "shipment":
        return f"shipment:{_parsed(int, request.headers, 'X-Shipment')}"
    if name == "crate":
        return f"crate:{_parsed(uuid.UUID, request.headers, 'X-Crate')}"
    return f"other:{path}"


def _destination_resource(dest, request):
    """Resolves a Destination header through Django's own URL resolver."""
    parts = urlsplit(dest)
    dest_path = unquote(parts.path)
    try:
        match = resolve(dest_path)
    except Resolver404:
        return f"other:{dest_path}"
    return _resource_for(match.url_name, match.kwargs, QueryDict(parts.query), request, dest_path)


@csrf_exempt
def handle(request: HttpRequest, **kwargs):
    method = request.method
    resource = _resource_for(
        request.resolver_match.url_name, kwargs, request.GET, request, request.path
    )
    if method in READ_METHODS:
        return JsonResponse({"read": resource})
    record = {
        "method": method,
        "path": request.path,
        "resource": resource,
        "fence": request.headers.get("X-Fence"),
        "body": request.body.decode("utf-8", "replace"),
    }
    dest = request.headers.get("Destination")
    if method in ("MOVE", "COPY") and dest is not None:
        record["source_resource"] = resource
        record["resource"] = resource = _destination_resource(dest, request)
    with _lock:
        _records.append(record)
    return JsonResponse({"applied": resource})


@csrf_exempt
def get_record(request):
    if request.method != "GET":
        return handle(request)
    with _lock:
        return JsonResponse(list(_records), safe=False)


@csrf_exempt
def reset(request):
    if request.method != "POST":
        return handle(request)
    with _lock:
        _records.clear()
    return JsonResponse({"reset": True})


urlpatterns = [
    path("_record", get_record, name="other"),
    path("_reset", reset, name="other"),
    path("invoices/<str:id>", handle, name="invoice"),
    path("accounts", handle, name="accounts"),
    path("docs/<str:id>", handle, name="doc"),
    path("orders/<int:id>", handle, name="order"),
    path("parcels/<int:id>", handle, name="parcel"),
    path("tickets/<uuid:id>", handle, name="ticket"),
    path("badges/<uuid:id>", handle, name="badge"),
    # Only reached when the typed converter above refused the segment.
    path("orders/<str:id>", handle, name="typed_rejected"),
    path("parcels/<str:id>", handle, name="typed_rejected"),
    path("tickets/<str:id>", handle, name="typed_rejected"),
    path("badges/<str:id>", handle, name="typed_rejected"),
    path("ledgers", handle, name="ledger"),
    path("tallies", handle, name="tally"),
    path("shipments", handle, name="shipment"),
    path("crates", handle, name="crate"),
    re_path(r"^", handle, name="other"),
]


if __name__ == "__main__":
    from django.core.servers.basehttp import run
    from django.core.wsgi import get_wsgi_application

    run("127.0.0.1", int(sys.argv[1]), get_wsgi_application(), threading=True)
