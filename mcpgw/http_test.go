package mcpgw_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
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

// countingListener counts the bytes the server read off every connection.
type countingListener struct {
	net.Listener
	read atomic.Int64
}

func (l *countingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return &countingConn{Conn: c, n: &l.read}, nil
}

type countingConn struct {
	net.Conn
	n *atomic.Int64
}

func (c *countingConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	c.n.Add(int64(n))
	return n, err
}

// serve serves g with Gateway.Serve on loopback and returns its /mcp URL and the
// listener's count of bytes read.
func (g *gw) serve(cfg mcpgw.HTTPConfig) (string, *countingListener) {
	g.t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		g.t.Fatal(err)
	}
	cl := &countingListener{Listener: ln}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- g.gw.Serve(ctx, cl, cfg) }()
	g.t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			g.t.Errorf("Serve: %v", err)
		}
	})
	return "http://" + ln.Addr().String() + "/mcp", cl
}

type bearer struct{ token string }

func (b bearer) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+b.token)
	return http.DefaultTransport.RoundTrip(r)
}

// Issue 23 point 5: --listen can require a bearer token of its own.
func TestListenRequiresItsToken(t *testing.T) {
	cluster := testcluster.Start(t, 1)
	g := newGW(t, cluster, httpUpstream(newM3Upstream().serveHTTP(t)), gwOptions{policy: "tenant: token\n"})
	url, _ := g.serve(mcpgw.HTTPConfig{Token: "s3cret"})

	for name, token := range map[string]string{"no token": "", "wrong token": "guess"} {
		req, _ := http.NewRequest(http.MethodPost, url, strings.NewReader(`{"jsonrpc":"2.0","id":1,"method":"tools/list"}`))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Accept", "application/json, text/event-stream")
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusUnauthorized || !strings.HasPrefix(resp.Header.Get("WWW-Authenticate"), "Bearer") {
			t.Errorf("%s: %d %q %s, want 401 with WWW-Authenticate: Bearer", name, resp.StatusCode, resp.Header.Get("WWW-Authenticate"), body)
		}
		// A caller without the token keeps no connection to sit idle in the bound.
		if !resp.Close {
			t.Errorf("%s: the 401 keeps the connection open (no Connection: close)", name)
		}
	}

	c := mcp.NewClient(&mcp.Implementation{Name: "holder", Version: "1"}, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	sess, err := c.Connect(ctx, &mcp.StreamableClientTransport{Endpoint: url, MaxRetries: -1,
		HTTPClient: &http.Client{Transport: bearer{"s3cret"}}}, nil)
	if err != nil {
		t.Fatalf("with the token: %v", err)
	}
	defer sess.Close()
	if res := goCall(t, sess, "place_order", order("o-1", 1, "EUR"), key("token:o-1")); res.IsError {
		t.Fatalf("with the token: %s", show(res))
	}
}

// endless is a body that never ends on its own.
type endless struct{ n int64 }

func (e *endless) Read(p []byte) (int, error) {
	if e.n <= 0 {
		return 0, io.EOF
	}
	if int64(len(p)) > e.n {
		p = p[:e.n]
	}
	for i := range p {
		p[i] = ' '
	}
	e.n -= int64(len(p))
	return len(p), nil
}

// Issue 23 point 6: a body larger than the bound gets 413 after at most the bound is
// read (before, the go-sdk read the whole body into memory: 400 MB raised the gateway
// to 911 MB); a body or headers that stall are cut after their timeouts; and no more
// than MaxConns connections are served at once.
func TestListenBoundsWhatItReads(t *testing.T) {
	cluster := testcluster.Start(t, 1)
	g := newGW(t, cluster, httpUpstream(newM3Upstream().serveHTTP(t)), gwOptions{policy: "tenant: bounds\n"})
	const limit = 1 << 20
	url, counted := g.serve(mcpgw.HTTPConfig{MaxBodyBytes: limit, ReadBodyTimeout: time.Second, ReadHeaderTimeout: time.Second, MaxConns: 2})

	t.Run("body", func(t *testing.T) {
		for _, chunked := range []bool{true, false} {
			before := counted.read.Load()
			const size = 64 << 20
			var body io.Reader = &endless{n: size}
			req, _ := http.NewRequest(http.MethodPost, url, body)
			if !chunked {
				req.ContentLength = size
			}
			req.Header.Set("Content-Type", "application/json")
			req.Header.Set("Accept", "application/json, text/event-stream")
			resp, err := http.DefaultClient.Do(req)
			status := 0
			if err == nil {
				status = resp.StatusCode
				resp.Body.Close()
			}
			read := counted.read.Load() - before
			if read > 2*limit {
				t.Errorf("chunked %v: the gateway read %d bytes of a %d-byte body; its limit is %d", chunked, read, size, limit)
			}
			if status != http.StatusRequestEntityTooLarge {
				t.Errorf("chunked %v: status %d (err %v), want 413", chunked, status, err)
			}
		}
	})

	// Each subtest dials from a loopback address of its own: MaxConns 2 is also the
	// share of one source, which the connections of the subtest before may still hold
	// while net/http lingers over their close.
	dialFrom := func(src string) (net.Conn, error) {
		d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}}
		return d.Dial("tcp", strings.TrimPrefix(strings.TrimSuffix(url, "/mcp"), "http://"))
	}

	t.Run("stalled body", func(t *testing.T) {
		conn, err := dialFrom("127.0.0.20")
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		fmt.Fprintf(conn, "POST /mcp HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nAccept: application/json, text/event-stream\r\nContent-Length: 1000\r\n\r\n{\"jsonrpc\":")
		_ = conn.SetReadDeadline(time.Now().Add(20 * time.Second))
		resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
		if err != nil {
			t.Fatalf("no answer to a stalled body within 20 s: %v", err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusRequestTimeout {
			t.Errorf("status %d, want 408", resp.StatusCode)
		}
	})

	t.Run("stalled headers", func(t *testing.T) {
		conn, err := dialFrom("127.0.0.21")
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		fmt.Fprintf(conn, "POST /mcp HTTP/1.1\r\nHost: x\r\n")
		_ = conn.SetReadDeadline(time.Now().Add(20 * time.Second))
		if _, err := io.ReadAll(conn); isNetTimeout(err) {
			t.Fatalf("a connection that stalls in its headers is still open after 20 s")
		}
	})

	t.Run("connections", func(t *testing.T) {
		// A listener of its own: a connection of the subtests before, closed by the
		// client but not yet seen closed by the server, would count against MaxConns.
		url, _ := g.serve(mcpgw.HTTPConfig{MaxBodyBytes: limit, ReadBodyTimeout: time.Second, ReadHeaderTimeout: time.Second, MaxConns: 2})
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
		healthz := func(conn net.Conn, within time.Duration) error {
			fmt.Fprintf(conn, "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
			_ = conn.SetReadDeadline(time.Now().Add(within))
			resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
			if err != nil {
				return err
			}
			resp.Body.Close()
			return nil
		}
		// A flood of idle sockets from one host (MaxConns 2) does not keep another
		// host out: the newcomer takes the place of the flood's oldest.
		var flood []net.Conn
		for range 2 {
			c := dial("127.0.0.2")
			if err := healthz(c, 20*time.Second); err != nil {
				t.Fatalf("one of the first two connections: %v", err)
			}
			flood = append(flood, c)
		}
		if err := healthz(dial("127.0.0.3"), 20*time.Second); err != nil {
			t.Fatalf("another host is not served while one host holds idle connections: %v", err)
		}
		closed := 0
		for _, c := range flood {
			_ = c.SetReadDeadline(time.Now().Add(2 * time.Second))
			if _, err := c.Read(make([]byte, 1)); !isNetTimeout(err) {
				closed++
			}
		}
		if closed != 1 {
			t.Fatalf("%d of the flood's 2 idle connections were closed for the newcomer, want 1", closed)
		}

		// With every connection busy (a body on its way), a third waits for one.
		busy := func(c net.Conn) {
			fmt.Fprintf(c, "POST /mcp HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n{")
		}
		held := []net.Conn{dial("127.0.0.4"), dial("127.0.0.5")}
		for _, c := range held {
			busy(c)
		}
		time.Sleep(200 * time.Millisecond) // the server reads their headers
		third := dial("127.0.0.6")
		fmt.Fprintf(third, "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
		_ = third.SetReadDeadline(time.Now().Add(20 * time.Second))
		resp, err := http.ReadResponse(bufio.NewReader(third), nil)
		if err != nil {
			t.Fatalf("the third connection is not served once a busy one ended (its body timed out): %v", err)
		}
		resp.Body.Close()
		for _, c := range held {
			_ = c.SetReadDeadline(time.Now().Add(20 * time.Second))
			if r, err := http.ReadResponse(bufio.NewReader(c), nil); err != nil || r.StatusCode != http.StatusRequestTimeout {
				t.Errorf("a busy connection: %v, %v; want its 408", r, err)
			}
		}
	})
}

func isNetTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// Every initialize opens a session; one left without requests is closed after
// SessionIdle, and its client gets 404 for it (then initializes anew).
func TestIdleSessionsAreClosed(t *testing.T) {
	cluster := testcluster.Start(t, 1)
	g := newGW(t, cluster, httpUpstream(newM3Upstream().serveHTTP(t)), gwOptions{policy: "tenant: sessions\n"})
	url, _ := g.serve(mcpgw.HTTPConfig{SessionIdle: 500 * time.Millisecond})
	initialize := `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"raw","version":"1"}}}`
	req, _ := http.NewRequest(http.MethodPost, url, strings.NewReader(initialize))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.ReadAll(resp.Body)
	resp.Body.Close()
	id := resp.Header.Get("Mcp-Session-Id")
	if resp.StatusCode != http.StatusOK || id == "" {
		t.Fatalf("initialize: %d, session %q", resp.StatusCode, id)
	}
	ping := func() int {
		code, _ := postHeaders(t, url, `{"jsonrpc":"2.0","id":2,"method":"ping"}`,
			map[string]string{"Mcp-Session-Id": id, "Mcp-Protocol-Version": "2025-11-25"})
		return code
	}
	if code := ping(); code != http.StatusOK {
		t.Fatalf("a ping on the new session: %d", code)
	}
	deadline := time.Now().Add(20 * time.Second)
	for ping() != http.StatusNotFound {
		if time.Now().After(deadline) {
			t.Fatal("a session left idle past SessionIdle is still open after 20 s")
		}
		time.Sleep(time.Second) // longer than SessionIdle: the ping itself restarts it
	}
}
