// Legacy upstream for the differential test: a plain Express 5 app knowing nothing about fencing.
//
// Every method except GET, HEAD, OPTIONS and TRACE (as Node/Express report it) is a write: it
// appends a record and answers 200 {"applied": resource}. The request is read exactly as Express
// hands it over (default routing: case-insensitive, non-strict; default "simple" query parser);
// nothing is normalised here.
//
//     node tests/upstreams/express_app.js PORT
//
// Control endpoints (hit directly, not through the gateway): GET /_record, POST /_reset.
//
// Typed-id resources: the id is parsed the way an Express app is commonly written, and the
// resource is recorded under the parsed value:
//   /orders/:id    Number(req.params.id)            -> order:String(n)
//   /parcels/:id   parseInt(req.params.id)          -> parcel:String(n)   (no radix)
//   /ledgers?id=   parseInt(req.query.id, 10)       -> ledger:String(n)
//   /shipments     Number(req.get('X-Shipment'))    -> shipment:String(n)
//     a result that is NaN or not Number.isSafeInteger is answered 400 and not recorded;
//   /tickets/:id, /badges/:id, /tallies?id=, /crates (header X-Crate): the npm `uuid` package's
//     validate(v) (which also insists on an RFC 9562 version digit 1-8 and variant 8/9/a/b, or
//     the nil/max UUID), then v.toLowerCase(); invalid (or not a single string) is 400.
'use strict';

const querystring = require('node:querystring');
const express = require('express');
const { validate: uuidValidate } = require('uuid');

const READ_METHODS = new Set(['GET', 'HEAD', 'OPTIONS', 'TRACE']);
const records = []; // Node is single-threaded: appends are atomic.

const app = express();

// Control endpoints are registered first.
app.get('/_record', (req, res) => res.json(records));
app.post('/_reset', (req, res) => {
  records.length = 0;
  res.json({ reset: true });
});

// Read every body, whatever its content type, as raw bytes.
app.use(express.raw({ type: () => true, limit: '10mb' }));

function queryValue(value) {
  if (value === undefined) return '';
  if (typeof value === 'string') return value;
  return JSON.stringify(value);
}

function tenantOf(req) {
  return req.get('x-tenant') ?? '';
}

// Mirrors Express's own routes below: case-insensitive, optional trailing slash.
const INVOICE_RE = /^\/invoices\/([^/]+)\/?$/i;
const ACCOUNTS_RE = /^\/accounts\/?$/i;
const DOC_RE = /^\/docs\/([^/]+)\/?$/i;

// Thrown by a typed-id parser that rejects its value: the write is answered 400, unrecorded.
class Rejected extends Error {}

function integer(n) {
  if (Number.isNaN(n) || !Number.isSafeInteger(n)) throw new Rejected('not an integer id');
  return String(n);
}

function uuidOf(v) {
  if (!uuidValidate(v)) throw new Rejected('not a UUID id');
  return v.toLowerCase();
}

const orderResource = (id) => `order:${integer(Number(id))}`;
const parcelResource = (id) => `parcel:${integer(parseInt(id))}`;
const ticketResource = (id) => `ticket:${uuidOf(id)}`;
const badgeResource = (id) => `badge:${uuidOf(id)}`;
const ledgerResource = (query) => `ledger:${integer(parseInt(query.id, 10))}`;
const tallyResource = (query) => `tally:${uuidOf(query.id)}`;
const shipmentResource = (req) => `shipment:${integer(Number(req.get('X-Shipment')))}`;
const crateResource = (req) => `crate:${uuidOf(req.get('X-Crate'))}`;

// Mirrors Express's own routes for the typed-id resources, as above. A typed destination is read
// like a request to it: its own query's `id`, and the request's X-Shipment / X-Crate headers (as
// /docs/ uses the request's X-Tenant).
const TYPED_PATH_RES = [
  [/^\/orders\/([^/]+)\/?$/i, orderResource],
  [/^\/parcels\/([^/]+)\/?$/i, parcelResource],
  [/^\/tickets\/([^/]+)\/?$/i, ticketResource],
  [/^\/badges\/([^/]+)\/?$/i, badgeResource],
];
const TYPED_QUERY_RES = [
  [/^\/ledgers\/?$/i, ledgerResource],
  [/^\/tallies\/?$/i, tallyResource],
];
const TYPED_HEADER_RES = [
  [/^\/shipments\/?$/i, shipmentResource],
  [/^\/crates\/?$/i, crateResource],
];

function typedDestination(path, url, req) {
  for (const [re, resource] of TYPED_PATH_RES) {
    const m = re.exec(path);
    if (m) return resource(m[1]);
  }
  for (const [re, resource] of TYPED_QUERY_RES) {
    if (re.test(path)) return resource(querystring.parse(url.search.slice(1)));
  }
  for (const [re, resource] of TYPED_HEADER_RES) {
    if (re.test(path)) return resource(req);
  }
  return undefined;
}

function destinationResource(dest, req) {
  let url;
  try {
    url = new URL(dest, 'http://x');
  } catch (e) {
    return `other:${dest}`;
  }
  let path;
  try {
    path = decodeURIComponent(url.pathname);
  } catch (e) {
    path = url.pathname;
  }
  let m;
  if ((m = INVOICE_RE.exec(path))) return `invoice:${m[1]}`;
  if (ACCOUNTS_RE.test(path)) {
    return `acct:${queryValue(querystring.parse(url.search.slice(1)).id)}`;
  }
  if ((m = DOC_RE.exec(path))) return `doc:${tenantOf(req)}:${m[1]}`;
  const typed = typedDestination(path, url, req);
  if (typed !== undefined) return typed;
  return `other:${path}`;
}

function handle(resourceOf) {
  return (req, res) => {
    try {
      applyOrRead(resourceOf, req, res);
    } catch (e) {
      if (!(e instanceof Rejected)) throw e;
      res.status(400).json({ error: e.message });
    }
  };
}

function applyOrRead(resourceOf, req, res) {
  let resource = resourceOf(req);
  if (READ_METHODS.has(req.method)) {
    res.json({ read: resource });
    return;
  }
  const record = {
    method: req.method,
    path: req.path,
    resource,
    fence: req.get('x-fence') ?? null,
    body: Buffer.isBuffer(req.body) ? req.body.toString('utf8') : '',
  };
  const dest = req.get('destination');
  const upper = req.method.toUpperCase();
  if ((upper === 'MOVE' || upper === 'COPY') && dest !== undefined) {
    record.source_resource = resource;
    record.resource = resource = destinationResource(dest, req);
  }
  records.push(record);
  res.json({ applied: resource });
}

app.all('/invoices/:id', handle((req) => `invoice:${req.params.id}`));
app.all('/accounts', handle((req) => `acct:${queryValue(req.query.id)}`));
app.all('/docs/:id', handle((req) => `doc:${tenantOf(req)}:${req.params.id}`));
app.all('/orders/:id', handle((req) => orderResource(req.params.id)));
app.all('/parcels/:id', handle((req) => parcelResource(req.params.id)));
app.all('/tickets/:id', handle((req) => ticketResource(req.params.id)));
app.all('/badges/:id', handle((req) => badgeResource(req.params.id)));
app.all('/ledgers', handle((req) => ledgerResource(req.query)));
app.all('/tallies', handle((req) => tallyResource(req.query)));
app.all('/shipments', handle(shipmentResource));
app.all('/crates', handle(crateResource));
app.use(handle((req) => `other:${req.path}`));

const port = Number(process.argv[2]);
app.listen(port, '127.0.0.1', (err) => {
  if (err) {
    console.error(err);
    process.exit(1);
  }
});
