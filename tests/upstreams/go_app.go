// Legacy upstream for the differential test: a plain Go (1.19, standard library) net/http app
// knowing nothing about fencing.
//
// Every method except GET, HEAD, OPTIONS and TRACE -- compared exactly as r.Method reports it, so
// "get" is a write -- appends a record and answers 200 {"applied": resource}. The request is read
// exactly as net/http and its ServeMux hand it over; nothing is normalised here.
//
//	GO111MODULE=off GOPATH=/usr/share/gocode go build -o OUT tests/upstreams/go_app.go && OUT PORT
//
// (GOPATH mode, so that github.com/google/uuid comes from Debian's golang-github-google-uuid-dev
// under /usr/share/gocode/src, offline.)
//
// Control endpoints (hit directly, not through the gateway): GET /_record, POST /_reset.
//
// Typed-id resources: the id is parsed the way a Go app commonly parses it, and the resource is
// recorded under the parsed value (strconv.Itoa / uuid.UUID.String, lower-case hyphenated):
//
//	/orders/ID   strconv.Atoi(ID)                          -> order:N
//	/parcels/ID  strconv.ParseInt(ID, 10, 64)              -> parcel:N
//	/ledgers     strconv.Atoi(r.URL.Query().Get("id"))     -> ledger:N
//	/shipments   strconv.Atoi(r.Header.Get("X-Shipment"))  -> shipment:N
//	/tickets/ID, /badges/ID, /tallies?id=, /crates (header X-Crate): uuid.Parse(v) (google/uuid:
//	canonical in either case, 32 hex digits, urn:uuid:..., and any 38-byte value whose middle 36
//	are canonical -- it drops the first byte and never checks the braces) -> ticket:UUID etc.
//
// ID is what follows the prefix in r.URL.Path (decoded), as for /invoices/; an empty ID or one
// with a "/" is other:PATH. A parse error is answered 400 and recorded nothing.
package main

import (
	"encoding/json"
	"io"
	"log"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync"

	"github.com/google/uuid"
)

type record struct {
	Method         string  `json:"method"`
	Path           string  `json:"path"`
	Resource       string  `json:"resource"`
	Fence          *string `json:"fence"`
	Body           string  `json:"body"`
	SourceResource *string `json:"source_resource,omitempty"`
}

var (
	mu      sync.Mutex
	records = []record{}
)

func isRead(method string) bool {
	switch method {
	case "GET", "HEAD", "OPTIONS", "TRACE":
		return true
	}
	return false
}

func writeJSON(w http.ResponseWriter, v interface{}) {
	w.Header().Set("Content-Type", "application/json")
	json.NewEncoder(w).Encode(v)
}

// resourceFor is what a naive Go app does with a path: prefix checks, no cleaning.
func resourceFor(p string, query url.Values, tenant string) string {
	if strings.HasPrefix(p, "/invoices/") {
		id := strings.TrimPrefix(p, "/invoices/")
		if id != "" && !strings.Contains(id, "/") {
			return "invoice:" + id
		}
		return "other:" + p
	}
	if p == "/accounts" {
		return "acct:" + query.Get("id")
	}
	if strings.HasPrefix(p, "/docs/") {
		id := strings.TrimPrefix(p, "/docs/")
		if id != "" && !strings.Contains(id, "/") {
			return "doc:" + tenant + ":" + id
		}
		return "other:" + p
	}
	return "other:" + p
}

// typedResourceFor maps the typed-id resources to (resource, true, parse error), and any other
// path to ("", false, nil). The headers are the request's own, also for a Destination (as /docs/
// uses the request's X-Tenant).
func typedResourceFor(p string, query url.Values, header http.Header) (string, bool, error) {
	segment := func(prefix string) (string, bool) {
		if !strings.HasPrefix(p, prefix) {
			return "", false
		}
		id := strings.TrimPrefix(p, prefix)
		return id, id != "" && !strings.Contains(id, "/")
	}
	integer := func(name string, n int, err error) (string, bool, error) {
		return name + ":" + strconv.Itoa(n), true, err
	}
	parsedUUID := func(name, v string) (string, bool, error) {
		u, err := uuid.Parse(v)
		return name + ":" + u.String(), true, err
	}
	if id, found := segment("/orders/"); found {
		n, err := strconv.Atoi(id)
		return integer("order", n, err)
	}
	if id, found := segment("/parcels/"); found {
		n, err := strconv.ParseInt(id, 10, 64)
		return "parcel:" + strconv.FormatInt(n, 10), true, err
	}
	if id, found := segment("/tickets/"); found {
		return parsedUUID("ticket", id)
	}
	if id, found := segment("/badges/"); found {
		return parsedUUID("badge", id)
	}
	switch p {
	case "/ledgers":
		n, err := strconv.Atoi(query.Get("id"))
		return integer("ledger", n, err)
	case "/tallies":
		return parsedUUID("tally", query.Get("id"))
	case "/shipments":
		n, err := strconv.Atoi(header.Get("X-Shipment"))
		return integer("shipment", n, err)
	case "/crates":
		return parsedUUID("crate", header.Get("X-Crate"))
	}
	return "", false, nil
}

// resolve is typedResourceFor, else resourceFor.
func resolve(p string, query url.Values, r *http.Request, tenant string) (string, error) {
	if resource, ok, err := typedResourceFor(p, query, r.Header); ok {
		return resource, err
	}
	return resourceFor(p, query, tenant), nil
}

func handler(w http.ResponseWriter, r *http.Request) {
	tenant := r.Header.Get("X-Tenant")
	resource, err := resolve(r.URL.Path, r.URL.Query(), r, tenant)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	if isRead(r.Method) {
		writeJSON(w, map[string]string{"read": resource})
		return
	}
	body, _ := io.ReadAll(r.Body)
	rec := record{Method: r.Method, Path: r.URL.Path, Resource: resource, Body: string(body)}
	if _, ok := r.Header["X-Fence"]; ok {
		fence := r.Header.Get("X-Fence")
		rec.Fence = &fence
	}
	upper := strings.ToUpper(r.Method)
	if _, ok := r.Header["Destination"]; ok && (upper == "MOVE" || upper == "COPY") {
		source := resource
		rec.SourceResource = &source
		if dest, err := url.Parse(r.Header.Get("Destination")); err == nil {
			if resource, err = resolve(dest.Path, dest.Query(), r, tenant); err != nil {
				http.Error(w, err.Error(), http.StatusBadRequest)
				return
			}
		} else {
			resource = "other:" + r.Header.Get("Destination")
		}
		rec.Resource = resource
	}
	mu.Lock()
	records = append(records, rec)
	mu.Unlock()
	writeJSON(w, map[string]string{"applied": resource})
}

func main() {
	if len(os.Args) != 2 {
		log.Fatal("usage: go_app PORT")
	}
	mux := http.NewServeMux()
	// Control endpoints: exact patterns, more specific than "/" and so matched first.
	mux.HandleFunc("/_record", func(w http.ResponseWriter, r *http.Request) {
		if r.Method != "GET" {
			handler(w, r)
			return
		}
		mu.Lock()
		defer mu.Unlock()
		writeJSON(w, records)
	})
	mux.HandleFunc("/_reset", func(w http.ResponseWriter, r *http.Request) {
		if r.Method != "POST" {
			handler(w, r)
			return
		}
		mu.Lock()
		records = []record{}
		mu.Unlock()
		writeJSON(w, map[string]bool{"reset": true})
	})
	mux.HandleFunc("/invoices/", handler)
	mux.HandleFunc("/accounts", handler)
	mux.HandleFunc("/docs/", handler)
	// The typed-id resources (/orders/, /ledgers, ...) are served by the "/" pattern's handler,
	// which parses them: registering "/orders/" would make ServeMux answer "/orders" with a 301
	// to "/orders/", where it has always been an ordinary other:/orders.
	mux.HandleFunc("/", handler)
	log.Fatal(http.ListenAndServe("127.0.0.1:"+os.Args[1], mux))
}
