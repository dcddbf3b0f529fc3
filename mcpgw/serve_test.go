package mcpgw_test

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	m3client "github.com/mark3labs/mcp-go/client"
	m3transport "github.com/mark3labs/mcp-go/client/transport"
	m3 "github.com/mark3labs/mcp-go/mcp"

	"github.com/idemkv/idemkv/internal/testcluster"
	"github.com/idemkv/idemkv/internal/testlog"
	"github.com/idemkv/idemkv/mcpgw"
)

// rpcError is the error of a JSON-RPC answer.
type rpcError struct {
	Error *struct {
		Code    int64  `json:"code"`
		Message string `json:"message"`
	} `json:"error"`
}

// postRaw sends one JSON-RPC message to a streamable HTTP endpoint without a session,
// as a client's first request, and decodes the answer (JSON or one SSE event).
func postRaw(t *testing.T, url, body string) rpcError {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	text := string(data)
	for _, line := range strings.Split(text, "\n") {
		if rest, ok := strings.CutPrefix(line, "data:"); ok {
			text = strings.TrimSpace(rest)
		}
	}
	var out rpcError
	if err := json.Unmarshal([]byte(text), &out); err != nil {
		t.Fatalf("HTTP %d %q: %v", resp.StatusCode, data, err)
	}
	return out
}

// Issue 14 point 9: a request that comes before initialize (a newer client's
// server/discover probe, or a known method sent too early) gets a JSON-RPC error with
// its proper code, the gateway logs nothing at ERROR, and mcp-go's client, which
// probes with server/discover, then initializes and works, over streamable HTTP and
// over stdio.
func TestRequestsBeforeInitialize(t *testing.T) {
	cluster := testcluster.Start(t, 1)
	up := newM3Upstream()
	log := lines{testlog.NewLevel(t, "gateway: ", slog.LevelDebug).Handler(), &sync.Mutex{}, map[string]int{}}
	g := newGW(t, cluster, httpUpstream(up.serveHTTP(t)), gwOptions{policy: "tenant: preinit\n",
		gwCfg: func(c *mcpgw.Config) { c.Logger = slog.New(log) }})
	want := map[string]int64{"server/discover": -32601, "tools/list": -32600}
	listTools := func(c *m3client.Client) {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		res, err := c.ListTools(ctx, m3.ListToolsRequest{})
		if err != nil || len(res.Tools) != 3 {
			t.Fatalf("tools/list after the probe: %v, %v", err, res)
		}
	}

	t.Run("http", func(t *testing.T) {
		for method, code := range want {
			got := postRaw(t, g.url, `{"jsonrpc":"2.0","id":1,"method":"`+method+`","params":{}}`)
			if got.Error == nil || got.Error.Code != code {
				t.Errorf("%s before initialize: %+v, want code %d", method, got.Error, code)
			}
		}
		listTools(g.m3Agent())
	})

	t.Run("stdio", func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		t.Cleanup(cancel)
		fromGW, gwOut := io.Pipe()
		gwIn, toGW := io.Pipe()
		served := make(chan error, 1)
		go func() { served <- g.gw.ServeIO(ctx, gwIn, gwOut) }()
		t.Cleanup(func() {
			// The client hangs up: the gateway's session ends without an error.
			toGW.Close()
			if err := <-served; err != nil {
				t.Errorf("serving stdio: %v", err)
			}
			fromGW.Close()
		})
		in := bufio.NewReader(fromGW)
		id := 0
		for method, code := range want {
			id++
			if _, err := io.WriteString(toGW, `{"jsonrpc":"2.0","id":`+string(rune('0'+id))+`,"method":"`+method+`"}`+"\n"); err != nil {
				t.Fatal(err)
			}
			line, err := in.ReadBytes('\n')
			if err != nil {
				t.Fatal(err)
			}
			var got rpcError
			if err := json.Unmarshal(line, &got); err != nil || got.Error == nil || got.Error.Code != code {
				t.Errorf("%s before initialize: %s, want code %d", method, line, code)
			}
		}
		c := m3client.NewClient(m3transport.NewIO(in, toGW, io.NopCloser(strings.NewReader(""))))
		sctx, scancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer scancel()
		if err := c.Start(sctx); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = c.Close() })
		var init m3.InitializeRequest
		init.Params.ClientInfo = m3.Implementation{Name: "m3-stdio-agent", Version: "1"}
		if _, err := c.Initialize(sctx, init); err != nil {
			t.Fatalf("initialize: %v", err)
		}
		listTools(c)
	})

	if n := log.count("level:ERROR"); n != 0 {
		t.Fatalf("the gateway logged %d lines at ERROR", n)
	}
}
