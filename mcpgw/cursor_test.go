package mcpgw_test

import (
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/idemkv/idemkv/client"
	"github.com/idemkv/idemkv/internal/testcluster"
	"github.com/idemkv/idemkv/internal/testlog"
	"github.com/idemkv/idemkv/mcpgw"
)

// An upstream whose tools/list hands back the same cursor again would be listed
// forever: New never returned (nothing bounds the context of a gateway starting up),
// and the tools of every page piled up in memory meanwhile. A cursor that comes back
// is an error.
func TestToolListThatLoopsIsRefused(t *testing.T) {
	cluster := testcluster.Start(t, 1)
	up := &rawUpstream{tools: `{"tools":[{"name":"t","inputSchema":{"type":"object"}}],"nextCursor":"again"}`}
	idem, err := client.New(client.Config{Endpoints: cluster.Endpoints()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { idem.Close() })
	u := mcpgw.NewUpstream(httpUpstream(up.serve(t)), &mcp.Implementation{Name: "idemkv-mcp-gateway-test"}, testlog.NewLevel(t, "upstream: ", slog.LevelDebug))
	t.Cleanup(func() { _ = u.Close() })
	cfg := mcpgw.DefaultConfig()
	cfg.Upstream, cfg.Runner = u, idem
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Second)
	defer cancel()
	start := time.Now()
	g, err := mcpgw.New(ctx, cfg)
	if err == nil {
		_ = g.Close()
	}
	if err == nil || ctx.Err() != nil || !strings.Contains(err.Error(), "again") {
		t.Fatalf("New with an upstream whose tools/list loops: %v after %s; want an error naming the cursor it repeats, at once",
			err, time.Since(start).Round(time.Millisecond))
	}
}

// Pages that lead somewhere are all read: an upstream that lists one tool a page
// offers every tool through the gateway.
func TestToolListIsReadPageByPage(t *testing.T) {
	cluster := testcluster.Start(t, 1)
	srv := mcp.NewServer(&mcp.Implementation{Name: "paged", Version: "1"}, &mcp.ServerOptions{PageSize: 1})
	for _, name := range []string{"a", "b", "c"} {
		mcp.AddTool(srv, &mcp.Tool{Name: name, Annotations: &mcp.ToolAnnotations{ReadOnlyHint: true}},
			func(context.Context, *mcp.CallToolRequest, struct{}) (*mcp.CallToolResult, any, error) {
				return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: name}}}, nil, nil
			})
	}
	g := newGW(t, cluster, inMemory(t, srv), gwOptions{policy: "tenant: paged\n"})
	for _, name := range []string{"a", "b", "c"} {
		if _, ok := g.gw.Class(name); !ok {
			t.Errorf("the gateway does not offer %s, listed on a page of its own", name)
		}
	}
}
