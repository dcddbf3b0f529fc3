package mcpgw_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	m3client "github.com/mark3labs/mcp-go/client"
	m3transport "github.com/mark3labs/mcp-go/client/transport"
	m3 "github.com/mark3labs/mcp-go/mcp"
	"github.com/modelcontextprotocol/go-sdk/mcp"

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
	code, data := postHeaders(t, url, body, nil)
	text := data
	for _, line := range strings.Split(text, "\n") {
		if rest, ok := strings.CutPrefix(line, "data:"); ok {
			text = strings.TrimSpace(rest)
		}
	}
	var out rpcError
	if err := json.Unmarshal([]byte(text), &out); err != nil {
		t.Fatalf("HTTP %d %q: %v", code, data, err)
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
		c := serveStdio(t, g.gw)
		for i, method := range []string{"server/discover", "tools/list"} {
			id := i + 1
			c.send(fmt.Sprintf(`{"jsonrpc":"2.0","id":%d,"method":%q}`, id, method))
			got, before := c.answer(id)
			if len(before) > 0 {
				t.Errorf("before its answer to %s the gateway sent %q", method, before)
			}
			if got.Error == nil || got.Error.Code != want[method] {
				t.Errorf("%s before initialize: %+v, want code %d", method, got.Error, want[method])
			}
		}
		agent := m3client.NewClient(m3transport.NewIO(c.stdout(), c.stdin, io.NopCloser(strings.NewReader(""))))
		sctx, scancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer scancel()
		if err := agent.Start(sctx); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = agent.Close() })
		var init m3.InitializeRequest
		init.Params.ClientInfo = m3.Implementation{Name: "m3-stdio-agent", Version: "1"}
		if _, err := agent.Initialize(sctx, init); err != nil {
			t.Fatalf("initialize: %v", err)
		}
		listTools(agent)
	})

	if n := log.count("level:ERROR"); n != 0 {
		t.Fatalf("the gateway logged %d lines at ERROR", n)
	}
}

// A client that has not initialized gets nothing from the gateway but the answers
// to its requests. The go-sdk tells every session when the tool list changed, one
// that has not initialized too (also 10 ms after New), so a stdio client probing
// with server/discover could read notifications/tools/list_changed where it
// expected the answer: TestRequestsBeforeInitialize/stdio, reading in step over
// unbuffered pipes, then wrote its next request while the gateway still waited to
// write that answer, and both hung. Once initialized, the client is told.
func TestNoNotificationsBeforeInitialize(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	upstream := mcp.NewServer(&mcp.Implementation{Name: "inproc"}, nil)
	mcp.AddTool(upstream, &mcp.Tool{Name: "a", Annotations: &mcp.ToolAnnotations{ReadOnlyHint: true}}, noop)
	cfg := mcpgw.DefaultConfig()
	cfg.Upstream, cfg.Runner, cfg.Logger = inMemoryUpstream(ctx, t, upstream), failRunner{t}, testlog.NewLevel(t, "gateway: ", slog.LevelDebug)
	gw, err := mcpgw.New(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = gw.Close() })

	c := serveStdio(t, gw)
	c.send(`{"jsonrpc":"2.0","id":1,"method":"server/discover"}`)
	if got, before := c.answer(1); len(before) > 0 || got.Error == nil || got.Error.Code != -32601 {
		t.Fatalf("server/discover: %+v, and before it %q; want code -32601 alone", got.Error, before)
	}

	// A session connected after the client's is told after it: once this one has
	// been told, whatever the gateway sent the client was written already.
	_, notified := connectWatching(ctx, t, gw, "observer")

	mcp.AddTool(upstream, &mcp.Tool{Name: "b", Annotations: &mcp.ToolAnnotations{ReadOnlyHint: true}}, noop)
	select {
	case <-notified:
	case <-ctx.Done():
		t.Fatal("the initialized session was not told the tool list changed")
	}
	c.send(`{"jsonrpc":"2.0","id":2,"method":"tools/list"}`)
	if got, before := c.answer(2); len(before) > 0 || got.Error == nil || got.Error.Code != -32600 {
		t.Fatalf("tools/list before initialize: %+v, and before it %q; want code -32600 alone", got.Error, before)
	}

	c.send(`{"jsonrpc":"2.0","id":3,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"raw","version":"1"}}}`)
	if got, _ := c.answer(3); got.Error != nil {
		t.Fatalf("initialize: %+v", got.Error)
	}
	c.send(`{"jsonrpc":"2.0","method":"notifications/initialized"}`)
	upstream.RemoveTools("a")
	for {
		if m := c.next("notifications/tools/list_changed"); m.Method == "notifications/tools/list_changed" {
			break
		}
	}
}

// stdioDeadline bounds a test's stdio exchange with the gateway: past it, the
// client's writes fail and its reads give up, so a gateway (or a test) that stops
// reading or answering fails the test instead of hanging it.
const stdioDeadline = 30 * time.Second

// stdioClient is a client's end of ServeIO over two unbuffered in-memory pipes, its
// stdin and stdout as a process would have them.
type stdioClient struct {
	t        *testing.T
	stdin    net.Conn
	lines    chan []byte   // what the gateway wrote, a line at a time
	done     chan struct{} // closed when the test is over
	readErr  error         // why lines was closed
	deadline time.Time
}

// wireMessage is one JSON-RPC message as the client reads it.
type wireMessage struct {
	ID     json.RawMessage `json:"id"`
	Method string          `json:"method"`
	Error  *struct {
		Code    int64  `json:"code"`
		Message string `json:"message"`
	} `json:"error"`
	line string // as the gateway wrote it
}

// serveStdio serves g with ServeIO for the rest of the test. When the test ends the
// client hangs up (closes its stdin), the session must end without an error, and
// then the gateway's stdout is closed, as when its process exits.
func serveStdio(t *testing.T, g *mcpgw.Gateway) *stdioClient {
	t.Helper()
	stdin, gwIn := net.Pipe()
	gwOut, stdout := net.Pipe()
	c := &stdioClient{t: t, stdin: stdin, lines: make(chan []byte), done: make(chan struct{}),
		deadline: time.Now().Add(stdioDeadline)}
	if err := stdin.SetWriteDeadline(c.deadline); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- g.ServeIO(ctx, gwIn, gwOut) }()
	go func() {
		defer close(c.lines)
		in := bufio.NewReader(stdout)
		for {
			line, err := in.ReadBytes('\n')
			if err != nil {
				c.readErr = err
				return
			}
			select {
			case c.lines <- line:
			case <-c.done:
				return
			}
		}
	}()
	t.Cleanup(func() {
		defer cancel()
		_ = stdin.Close()
		select {
		case err := <-served:
			if err != nil {
				t.Errorf("serving stdio: %v", err)
			}
		case <-time.After(10 * time.Second):
			t.Errorf("ServeIO did not return within 10s of the client closing its stdin")
			cancel()
			_ = stdout.Close() // a write the client never read must not block the gateway
		}
		close(c.done)
		_ = gwOut.Close()
	})
	return c
}

// send writes one message and its newline.
func (c *stdioClient) send(msg string) {
	c.t.Helper()
	if _, err := io.WriteString(c.stdin, msg+"\n"); err != nil {
		c.t.Fatalf("sending %s: %v", msg, err)
	}
}

// next reads the next message the gateway wrote; what says what the test waits for.
func (c *stdioClient) next(what string) wireMessage {
	c.t.Helper()
	timeout := time.NewTimer(time.Until(c.deadline))
	defer timeout.Stop()
	select {
	case line, ok := <-c.lines:
		if !ok {
			c.t.Fatalf("waiting for %s: the gateway's stdout ended: %v", what, c.readErr)
		}
		m := wireMessage{line: strings.TrimSpace(string(line))}
		if err := json.Unmarshal(line, &m); err != nil {
			c.t.Fatalf("waiting for %s: the gateway wrote %q: %v", what, line, err)
		}
		return m
	case <-timeout.C:
		c.t.Fatalf("waiting for %s: nothing came within %v", what, stdioDeadline)
	}
	return wireMessage{}
}

// answer reads up to the answer to request id, and returns it with what came before
// it.
func (c *stdioClient) answer(id int) (answer wireMessage, before []string) {
	c.t.Helper()
	for {
		m := c.next(fmt.Sprintf("the answer to request %d", id))
		if m.Method == "" && string(m.ID) == fmt.Sprint(id) {
			return m, before
		}
		before = append(before, m.line)
	}
}

// stdout is the gateway's stdout for a client library to read from; the test reads
// none of it itself afterwards.
func (c *stdioClient) stdout() io.Reader { return &lineReader{c: c} }

type lineReader struct {
	c    *stdioClient
	rest []byte
}

func (r *lineReader) Read(p []byte) (int, error) {
	if len(r.rest) == 0 {
		line, ok := <-r.c.lines
		if !ok {
			return 0, io.EOF
		}
		r.rest = line
	}
	n := copy(p, r.rest)
	r.rest = r.rest[n:]
	return n, nil
}
