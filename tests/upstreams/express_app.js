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
'use strict';

const querystring = require('node:querystring');
const express = require('express');

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
  return `other:${path}`;
}

function handle(resourceOf) {
  return (req, res) => {
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
  };
}

app.all('/invoices/:id', handle((req) => `invoice:${req.params.id}`));
app.all('/accounts', handle((req) => `acct:${queryValue(req.query.id)}`));
app.all('/docs/:id', handle((req) => `doc:${tenantOf(req)}:${req.params.id}`));
app.use(handle((req) => `other:${req.path}`));

const port = Number(process.argv[2]);
app.listen(port, '127.0.0.1', (err) => {
  if (err) {
    console.error(err);
    process.exit(1);
  }
});
