// Legacy upstream for the differential test: a plain Go (1.19, standard library) net/http app
// knowing nothing about fencing.
//
// Every method except GET, HEAD, OPTIONS and TRACE -- compared exactly as r.Method reports it, so
// "get" is a write -- appends a record and answers 200 {"applied": resource}. The request is read
// exactly as net/http and its ServeMux hand it over; nothing is normalised here.
//
//	go build -o OUT tests/upstreams/go_app.go && OUT PORT
//
// Control endpoints (hit directly, not through the gateway): GET /_record, POST /_reset.
package main

import (
	"encoding/json"
	"io"
	"log"
	"net/http"
	"net/url"
	"os"
	"strings"
	"sync"
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

func handler(w http.ResponseWriter, r *http.Request) {
	tenant := r.Header.Get("X-Tenant")
	resource := resourceFor(r.URL.Path, r.URL.Query(), tenant)
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
			resource = resourceFor(dest.Path, dest.Query(), tenant)
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
	mux.HandleFunc("/", handler)
	log.Fatal(http.ListenAndServe("127.0.0.1:"+os.Args[1], mux))
}
