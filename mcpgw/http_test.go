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

	t.Run("stalled body", func(t *testing.T) {
		conn, err := net.Dial("tcp", strings.TrimPrefix(strings.TrimSuffix(url, "/mcp"), "http://"))
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
		conn, err := net.Dial("tcp", strings.TrimPrefix(strings.TrimSuffix(url, "/mcp"), "http://"))
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
		addr := strings.TrimPrefix(strings.TrimSuffix(url, "/mcp"), "http://")
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
		var held []net.Conn
		for range 2 {
			c, err := net.Dial("tcp", addr)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			if err := healthz(c, 20*time.Second); err != nil {
				t.Fatalf("one of the first two connections: %v", err)
			}
			held = append(held, c)
		}
		third, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		defer third.Close()
		fmt.Fprintf(third, "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
		_ = third.SetReadDeadline(time.Now().Add(500 * time.Millisecond))
		r := bufio.NewReader(third)
		if _, err := http.ReadResponse(r, nil); !isNetTimeout(err) {
			t.Fatalf("a third connection was served while two were open (MaxConns 2): %v", err)
		}
		held[0].Close()
		_ = third.SetReadDeadline(time.Now().Add(20 * time.Second))
		resp, err := http.ReadResponse(r, nil)
		if err != nil {
			t.Fatalf("the third connection is not served after one of the two closed: %v", err)
		}
		resp.Body.Close()
	})
}

func isNetTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}
