package mcpgw_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	m3server "github.com/mark3labs/mcp-go/server"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/internal/testcluster"
	"github.com/idemkv/idemkv/internal/testlog"
	"github.com/idemkv/idemkv/mcpgw"
)

// m3StdioEnv makes the test binary serve the mark3labs upstream on stdio.
const m3StdioEnv = "MCPGW_TEST_M3_STDIO"

func serveM3Stdio() error { return m3server.ServeStdio(newM3Upstream().srv) }

// stdioUpstream starts the test binary itself as the mark3labs upstream process.
func stdioUpstream(t *testing.T) func() mcp.Transport {
	stderr := testlog.NewWriter(t, "m3 upstream: ")
	return func() mcp.Transport {
		cmd := exec.Command(os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(), m3StdioEnv+"=1")
		cmd.Stderr = stderr
		return &mcp.CommandTransport{Command: cmd, TerminateDuration: 2 * time.Second}
	}
}

// wire records the bodies of every HTTP answer an agent's transport reads: what the
// gateway really sent, before any client decoded it.
type wire struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (w *wire) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := http.DefaultTransport.RoundTrip(req)
	if err == nil && resp.Body != nil {
		resp.Body = struct {
			io.Reader
			io.Closer
		}{io.TeeReader(resp.Body, w), resp.Body}
	}
	return resp, err
}

func (w *wire) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.buf.Write(p)
}

func (w *wire) take() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	s := w.buf.String()
	w.buf.Reset()
	return s
}

// connectWire opens a go-sdk agent session whose answers are recorded.
func (g *gw) connectWire(w *wire) *mcp.ClientSession {
	g.t.Helper()
	c := mcp.NewClient(&mcp.Implementation{Name: "wire-agent", Version: "1"}, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	sess, err := c.Connect(ctx, &mcp.StreamableClientTransport{Endpoint: g.url, MaxRetries: -1,
		DisableStandaloneSSE: true, HTTPClient: &http.Client{Transport: w}}, nil)
	if err != nil {
		g.t.Fatalf("connecting to the gateway: %v", err)
	}
	g.t.Cleanup(func() { _ = sess.Close() })
	return sess
}

func transports(t *testing.T) map[string]func() mcp.Transport {
	return map[string]func() mcp.Transport{
		"http":  httpUpstream(newM3Upstream().serveHTTP(t)),
		"stdio": stdioUpstream(t),
	}
}

// Issue 14 points 9 and 10, issue 13 point 5: what the upstream said reaches the
// agent as the upstream said it, the first time and on every replay from idemkv:
// structuredContent with an integer beyond 2^53, and tool annotations whose hints
// are false.
func TestUpstreamBytesReachTheAgent(t *testing.T) {
	cluster := testcluster.Start(t, 1)
	for name, transport := range transports(t) {
		t.Run(name, func(t *testing.T) {
			tenant := "bytes-" + name
			g := newGW(t, cluster, transport, gwOptions{policy: "tenant: " + tenant + "\n"})
			var w wire
			agent := g.connectWire(&w)

			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			if _, err := agent.ListTools(ctx, nil); err != nil {
				t.Fatal(err)
			}
			listed := w.take()
			want, err := json.Marshal(newM3Upstream().srv.GetTool("place_order").Tool)
			if err != nil {
				t.Fatal(err)
			}
			if !strings.Contains(listed, string(want)) {
				t.Errorf("tools/list does not carry place_order as the upstream lists it:\n want %s\n in   %s", want, listed)
			}
			for _, hint := range []string{`"readOnlyHint":false`, `"idempotentHint":false`, `"destructiveHint":false`} {
				if !strings.Contains(listed, hint) {
					t.Errorf("tools/list lost %s", hint)
				}
			}

			wantSC := `"structuredContent":{"order_id":"o-1","amount":12,"ledger_seq":` + bigSeq + `}`
			for i, wantDecision := range []string{"execute", "replay"} {
				res := goCall(t, agent, "place_order", order("o-1", 12, "EUR"), key("big-1"))
				sent := w.take()
				if res.IsError || meta(res, mcpgw.MetaDecision) != wantDecision {
					t.Fatalf("call %d: %s", i+1, show(res))
				}
				if !strings.Contains(sent, wantSC) {
					t.Errorf("call %d (%s): the agent got\n %s\nwant the upstream's own %s", i+1, wantDecision, sent, wantSC)
				}
			}
			rec, err := g.idem.Get(ctx, &idemkv.GetRequest{Tenant: tenant, Key: "big-1"})
			if err != nil {
				t.Fatal(err)
			}
			if !strings.Contains(string(rec.Receipt.Result), `"ledger_seq":`+bigSeq) {
				t.Errorf("idemkv stores %s, want the upstream's ledger_seq %s", rec.Receipt.Result, bigSeq)
			}
		})
	}
}
