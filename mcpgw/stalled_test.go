package mcpgw_test

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/idemkv/idemkv/internal/testcluster"
	"github.com/idemkv/idemkv/mcpgw"
)

// A connection whose client stopped reading its answer is busy for as long as a write
// to it waits, and the gateway never closes a busy connection to make room: without
// a bound on that wait, clients that ask for large answers (or progress) and read
// none held --max-conns for good, and every other agent waited to be accepted.
func TestStalledReadersDoNotHoldTheListen(t *testing.T) {
	cluster := testcluster.Start(t, 1)
	srv := mcp.NewServer(&mcp.Implementation{Name: "chatty", Version: "1"}, nil)
	var done atomic.Int64
	note := strings.Repeat("p", 64<<10)
	mcp.AddTool(srv, &mcp.Tool{Name: "chatty", Annotations: &mcp.ToolAnnotations{ReadOnlyHint: true}},
		func(ctx context.Context, req *mcp.CallToolRequest, _ struct{}) (*mcp.CallToolResult, any, error) {
			// 9.6 MiB of progress, more than loopback holds for a client that reads
			// nothing.
			for i := 1; i <= 150 && ctx.Err() == nil; i++ {
				_ = req.Session.NotifyProgress(ctx, &mcp.ProgressNotificationParams{ProgressToken: req.Params.GetProgressToken(), Progress: float64(i), Message: note})
			}
			done.Add(1)
			return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "done"}}}, nil, nil
		})
	g := newGW(t, cluster, inMemory(t, srv), gwOptions{policy: "tenant: stalled\n"})
	url, _ := g.serve(mcpgw.HTTPConfig{MaxConns: 2, WriteStallTimeout: time.Second})
	addr := strings.TrimPrefix(strings.TrimSuffix(url, "/mcp"), "http://")
	dial := func(src string) net.Conn {
		t.Helper()
		d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}}
		c, err := d.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	for i := range 2 {
		body := fmt.Sprintf(`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"chatty","arguments":{},`+
			`"_meta":{"progressToken":"p-%d","io.modelcontextprotocol/protocolVersion":"2026-07-28",`+
			`"io.modelcontextprotocol/clientInfo":{"name":"stalled","version":"1"},"io.modelcontextprotocol/clientCapabilities":{}}}}`, i)
		c := dial("127.0.0.2")
		fmt.Fprintf(c, "POST /mcp HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\nAccept: application/json, text/event-stream\r\n"+
			"Mcp-Protocol-Version: 2026-07-28\r\nMcp-Method: tools/call\r\nMcp-Name: chatty\r\nContent-Length: %d\r\n\r\n%s", addr, len(body), body)
	}
	// 9.6 MiB through the upstream's JSON, twice, takes seconds under -race on a machine
	// that runs other suites beside this one (10 s was once not enough in CI).
	if err := testcluster.Eventually(30*time.Second, func() error {
		if n := done.Load(); n < 2 {
			return fmt.Errorf("chatty answered %d of 2 calls", n)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	// Both connections are busy writing what nobody reads; another host is served
	// once the writes give up.
	other := dial("127.0.0.3")
	fmt.Fprintf(other, "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
	_ = other.SetReadDeadline(time.Now().Add(6 * time.Second))
	resp, err := http.ReadResponse(bufio.NewReader(other), nil)
	if err != nil {
		t.Fatalf("another host while two clients read none of their answers: %v", err)
	}
	resp.Body.Close()
}
