package client_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/client"
)

// The server bounds a result by its bytes as they arrive. encoding/json's HTML
// escaping turned each <, > and & of a raw result into six bytes, so that an HTML
// page that fitted the bound as the tool gave it was refused as too large. The client
// sends the result's bytes as they are.
func TestRequestsAreSentWithoutHTMLEscaping(t *testing.T) {
	var mu sync.Mutex
	var got []byte
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		mu.Lock()
		got = b
		mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"idempotency_key":"k","effect_fingerprint":"sha256:00","status":"committed"}`)
	}))
	t.Cleanup(srv.Close)
	c, err := client.New(client.Config{Endpoints: []string{srv.URL}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	result := json.RawMessage(`{"html":"<p>a & b</p>"}`)
	if _, err := c.Commit(ctx, &idemkv.CommitRequest{Tenant: "t", Key: "k", Fingerprint: "sha256:00", Fence: 1,
		RemoteSystem: "s", RemoteID: "<id>", Result: result}); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	if !strings.Contains(string(got), string(result)) || !strings.Contains(string(got), `"<id>"`) {
		t.Fatalf("the commit went out as %s; want the result %s and the remote id as they are", got, result)
	}
}
