package mcpgw_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/idemkv/idemkv/internal/testcluster"
	"github.com/idemkv/idemkv/mcpgw"
)

// clock is a test's clock for derived keys' windows.
type clock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *clock) advance(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}

// Issue 23 point 3: keys for retries that carry none of ours. SEP-3182's
// idempotencyKey is a key, in tools/call's params (over stdio and HTTP, in both eras)
// and in _meta; and a tool whose policy says key: derive gets a key derived from the
// tenant, the caller, the tool and the canonical effect within derive_window: the
// re-issue inside the window replays, the same call in the next window, or by
// another caller, or with another effect, runs.
func TestKeysForRetriesThatCarryNone(t *testing.T) {
	cluster := testcluster.Start(t, 1)
	up := newGoUpstream(false)
	clk := &clock{now: time.Date(2026, 7, 28, 12, 0, 0, 0, time.UTC)}
	g := newGW(t, cluster, up.inMemory(t), gwOptions{
		policy: "tenant: keys\ntools:\n  place_order: {key: derive, derive_window: 10m, volatile: [currency]}\n",
		gwCfg:  func(c *mcpgw.Config) { c.Now = clk.Now },
	})

	t.Run("SEP-3182 in params", func(t *testing.T) {
		for _, era := range eras {
			c := serveStdio(t, g.gw)
			meta := `"_meta":{"io.modelcontextprotocol/protocolVersion":"` + era + `","io.modelcontextprotocol/clientInfo":{"name":"raw","version":"1"},"io.modelcontextprotocol/clientCapabilities":{}}`
			id := 1
			if era == legacyEra {
				c.send(`{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"` + era + `","capabilities":{},"clientInfo":{"name":"raw","version":"1"}}}`)
				c.answer(1)
				c.send(`{"jsonrpc":"2.0","method":"notifications/initialized"}`)
				meta = `"_meta":{}`
			}
			orderID := "sep-" + era
			for _, want := range []string{"execute", "replay"} {
				id++
				c.send(fmt.Sprintf(`{"jsonrpc":"2.0","id":%d,"method":"tools/call","params":{"name":"place_order","idempotencyKey":"sep-key-%s",`+
					`"arguments":{"order_id":%q,"amount":1,"currency":"EUR"},%s}}`, id, era, orderID, meta))
				ans, _ := c.answer(id)
				if ans.Error != nil || !strings.Contains(ans.line, `"io.idemkv/decision":"`+want+`"`) ||
					!strings.Contains(ans.line, `"io.idemkv/idempotency_key":"sep-key-`+era+`"`) {
					t.Errorf("stdio %s: want %s under sep-key-%s, got %s", era, want, era, ans.line)
				}
			}
			if n := up.runs(orderID); n != 1 {
				t.Errorf("stdio %s: place_order ran %d times, want 1", era, n)
			}
		}
		// Over HTTP (a 2026-07-28 request: no session).
		srv := httptest.NewServer(g.gw.HTTPHandler(nil))
		t.Cleanup(srv.Close)
		for _, want := range []string{"execute", "replay"} {
			body := `{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"place_order","idempotencyKey":"sep-key-http",` +
				`"arguments":{"order_id":"sep-http","amount":1,"currency":"EUR"},"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28",` +
				`"io.modelcontextprotocol/clientInfo":{"name":"raw","version":"1"},"io.modelcontextprotocol/clientCapabilities":{}}}}`
			got := postJSON(t, srv.URL, body, map[string]string{"Mcp-Protocol-Version": modernEra, "Mcp-Method": "tools/call", "Mcp-Name": "place_order"})
			if !strings.Contains(got, `"io.idemkv/decision":"`+want+`"`) {
				t.Errorf("http: want %s, got %s", want, got)
			}
		}
		if n := up.runs("sep-http"); n != 1 {
			t.Errorf("http: place_order ran %d times, want 1", n)
		}
	})

	t.Run("SEP-3182 in _meta", func(t *testing.T) {
		agent := g.connectGoEra("meta-agent", nil, modernEra)
		for _, want := range []string{"execute", "replay"} {
			res := goCall(t, agent, "place_order", order("sep-meta", 1, "EUR"), mcp.Meta{mcpgw.MetaSEP3182Key: "sep-key-meta"})
			if res.IsError || meta(res, mcpgw.MetaDecision) != want || meta(res, mcpgw.MetaIdempotencyKey) != "sep-key-meta" {
				t.Errorf("want %s under sep-key-meta, got %s", want, show(res))
			}
		}
	})

	t.Run("derived", func(t *testing.T) {
		agent := g.connectGoEra("deriving-agent", nil, modernEra)
		call := func(args map[string]any, m mcp.Meta) *mcp.CallToolResult {
			t.Helper()
			res := goCall(t, agent, "place_order", args, m)
			if res.IsError {
				t.Fatalf("place_order: %s", show(res))
			}
			return res
		}
		first := call(order("d-1", 5, "EUR"), nil)
		// The re-issue, with a volatile argument changed: the same operation.
		again := call(order("d-1", 5, "USD"), nil)
		if meta(first, mcpgw.MetaDecision) != "execute" || meta(again, mcpgw.MetaDecision) != "replay" ||
			meta(first, mcpgw.MetaIdempotencyKey) != meta(again, mcpgw.MetaIdempotencyKey) ||
			!strings.HasPrefix(meta(first, mcpgw.MetaIdempotencyKey), "derived:") {
			t.Fatalf("a re-issue inside the window: %s then %s, want execute then replay under one derived key", show(first), show(again))
		}
		if n := up.runs("d-1"); n != 1 {
			t.Fatalf("place_order ran %d times for a call and its re-issue, want 1", n)
		}
		if res := call(order("d-1", 6, "EUR"), nil); meta(res, mcpgw.MetaDecision) != "execute" {
			t.Errorf("another effect inside the window: %s, want execute", show(res))
		}
		if res := call(order("d-1", 5, "EUR"), mcp.Meta{mcpgw.MetaActor: "someone-else"}); meta(res, mcpgw.MetaDecision) != "execute" {
			t.Errorf("another caller inside the window: %s, want execute", show(res))
		}
		clk.advance(10 * time.Minute)
		later := call(order("d-1", 5, "EUR"), nil)
		if meta(later, mcpgw.MetaDecision) != "execute" || meta(later, mcpgw.MetaIdempotencyKey) == meta(first, mcpgw.MetaIdempotencyKey) {
			t.Errorf("the same call in the next window: %s, want execute under a new key", show(later))
		}
		if n := up.runs("d-1"); n != 4 {
			t.Errorf("place_order ran %d times, want 4 (first, other effect, other caller, next window)", n)
		}
	})
}

// postJSON posts one JSON-RPC message with headers and returns the body as it came.
func postJSON(t *testing.T, url, body string, headers map[string]string) string {
	t.Helper()
	code, data := postHeaders(t, url, body, headers)
	if code != http.StatusOK {
		t.Fatalf("HTTP %d: %s", code, data)
	}
	return data
}
