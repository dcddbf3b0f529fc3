package mcpgw_test

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/idemkv/idemkv/internal/testcluster"
	"github.com/idemkv/idemkv/mcpgw"
)

// TestRoutingHeadersMustMatchTheBody: MCP 2026-07-28 (SEP-2243) has every HTTP request
// carry Mcp-Method, and tools/call its tool in Mcp-Name, so that proxies can route,
// rate-limit and authorize without reading bodies; a server must refuse a request whose
// headers are missing or disagree with the body (400, JSON-RPC -32020). A gateway that
// ran the body's tool under a header naming another would let a caller pass an edge
// policy for a harmless tool and run a mutating one. The call is refused before the
// gateway reserves or the upstream runs.
func TestRoutingHeadersMustMatchTheBody(t *testing.T) {
	cluster := testcluster.Start(t, 1)
	up := newGoUpstream(false)
	g := newGW(t, cluster, up.inMemory(t), gwOptions{policy: "tenant: hdr\n"})
	srv := httptest.NewServer(g.gw.Handler(mcpgw.HTTPConfig{}))
	t.Cleanup(srv.Close)
	body := `{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"place_order","arguments":{"order_id":"hdr-1","amount":1,"currency":"EUR"},` +
		`"_meta":{"io.idemkv/idempotency_key":"hdr-key","io.modelcontextprotocol/protocolVersion":"2026-07-28",` +
		`"io.modelcontextprotocol/clientInfo":{"name":"raw","version":"1"},"io.modelcontextprotocol/clientCapabilities":{}}}}`
	for _, c := range []struct {
		name    string
		headers map[string]string
	}{
		{"another tool in Mcp-Name", map[string]string{"Mcp-Method": "tools/call", "Mcp-Name": "list_orders"}},
		{"another method in Mcp-Method", map[string]string{"Mcp-Method": "tools/list", "Mcp-Name": "place_order"}},
		{"no Mcp-Method", map[string]string{"Mcp-Name": "place_order"}},
		{"no Mcp-Name", map[string]string{"Mcp-Method": "tools/call"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			h := map[string]string{"Mcp-Protocol-Version": modernEra}
			for k, v := range c.headers {
				h[k] = v
			}
			code, got := postHeaders(t, srv.URL, body, h)
			if code != http.StatusBadRequest || !strings.Contains(got, "-32020") {
				t.Errorf("HTTP %d %s, want 400 with JSON-RPC error -32020", code, got)
			}
		})
	}
	if n := up.runs("hdr-1"); n != 0 {
		t.Fatalf("place_order ran %d times under headers that did not match its body", n)
	}
	// The same call with the right headers runs once.
	got := postJSON(t, srv.URL, body, map[string]string{"Mcp-Protocol-Version": modernEra, "Mcp-Method": "tools/call", "Mcp-Name": "place_order"})
	if !strings.Contains(got, `"io.idemkv/decision":"execute"`) || up.runs("hdr-1") != 1 {
		t.Fatalf("with matching headers: %s (ran %d times)", got, up.runs("hdr-1"))
	}
}

// postHeaders posts body to url with headers set, and returns the status and body.
func postHeaders(t *testing.T, url, body string, headers map[string]string) (int, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	for k, v := range headers {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(data)
}
