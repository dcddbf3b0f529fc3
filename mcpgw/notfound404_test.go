package mcpgw_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/idemkv/idemkv/internal/testcluster"
)

// A 404 whose body is a JSON-RPC answer is that answer, not a session the upstream
// forgot: MCP 2026-07-28 has no session, and sends a JSON-RPC "method not found"
// (-32601) with HTTP 404, which a tool's handler can answer after doing its work. The
// gateway took every 404 to a tools/call for a session the upstream no longer holds
// and sent the call again on a new session: one agent call, the tool run twice.
func TestA404WithAnAnswerIsNotCalledAgain(t *testing.T) {
	cluster := testcluster.Start(t, 1)
	srv := mcp.NewServer(&mcp.Implementation{Name: "downstream-proxy", Version: "1"}, nil)
	var runs atomic.Int64
	srv.AddTool(&mcp.Tool{Name: "book", InputSchema: map[string]any{"type": "object"}},
		func(context.Context, *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			runs.Add(1) // the booking is made; the follow-up it calls is not there
			return nil, &jsonrpc.Error{Code: jsonrpc.CodeMethodNotFound, Message: "downstream: no method notify"}
		})
	hs := httptest.NewServer(mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return srv }, &mcp.StreamableHTTPOptions{Stateless: true}))
	t.Cleanup(hs.Close)
	g := newGW(t, cluster, httpUpstream(hs.URL), gwOptions{policy: "tenant: notfound\n"})
	if got := g.gw.Upstream().Protocol(); got != modernEra {
		t.Fatalf("the gateway speaks %s with the upstream, want %s", got, modernEra)
	}
	agent := g.connectGoEra("notfound-agent", nil, modernEra)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	res, err := agent.CallTool(ctx, &mcp.CallToolParams{Name: "book", Arguments: map[string]any{"room": 7}, Meta: key("notfound:book-7")})
	if n := runs.Load(); n != 1 {
		t.Fatalf("one agent call ran the tool %d times (answer %s, %v)", n, show(res), err)
	}
}
