//lint:file-ignore SA1019 MCP 2026-07-28 deprecates logging (SEP-2577) but keeps it working for at least a year; the gateway relays the upstream's log messages in both eras until it is gone.

package mcpgw_test

import (
	"context"
	"fmt"
	"net"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/idemkv/idemkv/internal/testcluster"
)

// An agent that asked for progress and stops reading its answer must hold up its own
// call only. The upstream's progress comes in on the connection that carries every
// agent's answers (stdio, or in memory as here): relayed to the stuck agent from that
// connection's read, it stopped the gateway from reading any other answer, and every
// other agent's call hung until its tool's timeout.
func TestStuckAgentHoldsUpOnlyItsOwnCall(t *testing.T) {
	cluster := testcluster.Start(t, 1)
	srv := mcp.NewServer(&mcp.Implementation{Name: "chatty", Version: "1"}, nil)
	var chattySent atomic.Int64
	note := strings.Repeat("p", 64<<10)
	mcp.AddTool(srv, &mcp.Tool{Name: "chatty", Annotations: &mcp.ToolAnnotations{ReadOnlyHint: true}},
		func(ctx context.Context, req *mcp.CallToolRequest, _ struct{}) (*mcp.CallToolResult, any, error) {
			token := req.Params.GetProgressToken()
			for i := 1; i <= 400 && ctx.Err() == nil; i++ {
				_ = req.Session.NotifyProgress(ctx, &mcp.ProgressNotificationParams{ProgressToken: token, Progress: float64(i), Message: note})
				chattySent.Add(1)
			}
			return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "done"}}}, nil, nil
		})
	mcp.AddTool(srv, &mcp.Tool{Name: "quick", Annotations: &mcp.ToolAnnotations{ReadOnlyHint: true}},
		func(context.Context, *mcp.CallToolRequest, struct{}) (*mcp.CallToolResult, any, error) {
			return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "quick"}}}, nil, nil
		})
	g := newGW(t, cluster, inMemory(t, srv), gwOptions{policy: "tenant: stuck\ntimeout: 8s\n"})

	// The stuck agent: a 2026-07-28 call with a progress token, whose answer it never reads.
	callAndNeverRead(t, g.url, `"progressToken":"stuck-1"`)
	// The upstream sends all it has to send, unless what it sends stops being read.
	sentAll := testcluster.Eventually(5*time.Second, func() error {
		if n := chattySent.Load(); n < 400 {
			return fmt.Errorf("the upstream has sent %d of 400 progress notifications", n)
		}
		return nil
	})
	t.Logf("the stuck agent's call: %v", sentAll)

	// Another agent's call answers at once.
	other := g.connectGoEra("other", nil, modernEra)
	cctx, ccancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer ccancel()
	start := time.Now()
	res, err := other.CallTool(cctx, &mcp.CallToolParams{Name: "quick", Arguments: map[string]any{}})
	if err != nil || res.IsError {
		t.Fatalf("another agent's call while one agent is stuck: %v %v after %s (the upstream sent %d progress notifications to the stuck agent's call)",
			err, res, time.Since(start), chattySent.Load())
	}
}

// The same for log messages, which come in on the queue that also carries the
// upstream's requests to the gateway (ping, and in 2025-11-25 elicitation, sampling,
// roots): one relayed to an agent that stopped reading held up that queue, so those
// requests went unanswered while other agents' calls waited on them (and an upstream
// that checks its client with pings, KeepAlive, closed the session, ending every call
// in flight with outcome_unknown).
func TestStuckAgentHoldsUpOnlyItsOwnLogs(t *testing.T) {
	cluster := testcluster.Start(t, 1)
	srv := mcp.NewServer(&mcp.Implementation{Name: "chatty", Version: "1"}, nil)
	var logged atomic.Int64
	note := strings.Repeat("l", 64<<10)
	mcp.AddTool(srv, &mcp.Tool{Name: "chatty", Annotations: &mcp.ToolAnnotations{ReadOnlyHint: true}},
		func(ctx context.Context, req *mcp.CallToolRequest, _ struct{}) (*mcp.CallToolResult, any, error) {
			for i := 1; i <= 150 && ctx.Err() == nil; i++ {
				_ = req.Session.Log(ctx, &mcp.LoggingMessageParams{Level: "info", Data: note})
				logged.Add(1)
			}
			// The call stays in flight, so that its agent owns the log messages.
			select {
			case <-time.After(8 * time.Second):
			case <-ctx.Done():
			}
			return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "done"}}}, nil, nil
		})
	var pings atomic.Int64
	mcp.AddTool(srv, &mcp.Tool{Name: "ping_then_act"},
		func(ctx context.Context, req *mcp.CallToolRequest, _ struct{}) (*mcp.CallToolResult, any, error) {
			pctx, cancel := context.WithTimeout(ctx, 2*time.Second)
			defer cancel()
			if err := req.Session.Ping(pctx, nil); err != nil {
				return &mcp.CallToolResult{IsError: true, Content: []mcp.Content{&mcp.TextContent{Text: "the client did not answer a ping: " + err.Error()}}}, nil, nil
			}
			pings.Add(1)
			return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "acted"}}}, nil, nil
		})
	g := newGW(t, cluster, inMemory(t, srv), gwOptions{policy: "tenant: stucklogs\ntimeout: 10s\n"})

	callAndNeverRead(t, g.url, `"io.modelcontextprotocol/logLevel":"debug"`)
	if err := testcluster.Eventually(8*time.Second, func() error {
		if n := logged.Load(); n < 150 {
			return fmt.Errorf("the upstream has sent %d of 150 log messages", n)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}

	other := g.connectGoEra("other", nil, modernEra)
	cctx, ccancel := context.WithTimeout(context.Background(), 6*time.Second)
	defer ccancel()
	res, err := other.CallTool(cctx, &mcp.CallToolParams{Name: "ping_then_act", Arguments: map[string]any{},
		Meta: mcp.Meta{"io.idemkv/idempotency_key": "act-1"}})
	if err != nil || res.IsError || meta(res, "io.idemkv/decision") != "execute" || pings.Load() != 1 {
		t.Fatalf("another agent's call while one agent is stuck: %v %s", err, show(res))
	}
}

// callAndNeverRead sends the gateway at gwURL a 2026-07-28 call of the upstream's
// "chatty" tool, with meta among its _meta members, from an agent that never reads a
// byte of the answer; the connection stays open until the test ends.
func callAndNeverRead(t *testing.T, gwURL, meta string) {
	t.Helper()
	u, err := url.Parse(gwURL)
	if err != nil {
		t.Fatal(err)
	}
	conn, err := net.Dial("tcp", u.Host)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	body := `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"chatty","arguments":{},` +
		`"_meta":{` + meta + `,"io.modelcontextprotocol/protocolVersion":"2026-07-28",` +
		`"io.modelcontextprotocol/clientInfo":{"name":"stuck","version":"1"},"io.modelcontextprotocol/clientCapabilities":{}}}}`
	fmt.Fprintf(conn, "POST / HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\nAccept: application/json, text/event-stream\r\n"+
		"Mcp-Protocol-Version: 2026-07-28\r\nMcp-Method: tools/call\r\nMcp-Name: chatty\r\nContent-Length: %d\r\n\r\n%s", u.Host, len(body), body)
}
