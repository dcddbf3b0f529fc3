package main

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	collectortrace "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	"google.golang.org/protobuf/proto"
)

// The example honours the OTEL_* variables as the binary does: with an OTLP endpoint
// set, both the runtime's tool-call spans and the embedded node's request spans reach
// the collector.
func TestStoryExportsToOTLP(t *testing.T) {
	var mu sync.Mutex
	services := map[string]int{}
	collector := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		var req collectortrace.ExportTraceServiceRequest
		if err := proto.Unmarshal(b, &req); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		mu.Lock()
		for _, rs := range req.ResourceSpans {
			name := ""
			for _, kv := range rs.GetResource().GetAttributes() {
				if kv.Key == "service.name" {
					name = kv.GetValue().GetStringValue()
				}
			}
			for _, ss := range rs.ScopeSpans {
				services[name] += len(ss.Spans)
			}
		}
		mu.Unlock()
		w.WriteHeader(http.StatusOK)
	}))
	defer collector.Close()
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", collector.URL)
	t.Setenv("OTEL_SERVICE_NAME", "")

	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var out bytes.Buffer
	if err := run(ctx, options{dataDir: t.TempDir()}, &out); err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	// run flushed both providers on its way out.
	mu.Lock()
	defer mu.Unlock()
	total := 0
	for _, n := range services {
		total += n
	}
	if services["agent-tickets-idemkv"] == 0 || total == services["agent-tickets-idemkv"] {
		t.Fatalf("spans per service: %v; want the node's and the runtime's", services)
	}
}
