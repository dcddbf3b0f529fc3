package mcpgw_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	m3client "github.com/mark3labs/mcp-go/client"
	m3transport "github.com/mark3labs/mcp-go/client/transport"
	m3server "github.com/mark3labs/mcp-go/server"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/internal/testcluster"
	"github.com/idemkv/idemkv/mcpgw"
)

// goUpstream is a go-sdk upstream with place_order (not idempotent, counted per
// order) and a read-only lookup_order, serving 2026-07-28 and earlier, or, legacy,
// 2025-11-25 and earlier only.
type goUpstream struct {
	srv *mcp.Server
	mu  sync.Mutex
	n   map[string]int // place_order runs per order id
}

func newGoUpstream(legacy bool) *goUpstream {
	u := &goUpstream{n: map[string]int{}}
	opts := &mcp.ServerOptions{}
	if legacy {
		opts.SupportedProtocolVersions = []string{legacyEra}
	}
	u.srv = mcp.NewServer(&mcp.Implementation{Name: "go-orders", Version: "1"}, opts)
	type orderArgs struct {
		OrderID  string `json:"order_id"`
		Amount   int    `json:"amount"`
		Currency string `json:"currency"`
	}
	type placed struct {
		OrderID string `json:"order_id"`
		Run     int    `json:"run"`
	}
	f := false
	mcp.AddTool(u.srv, &mcp.Tool{Name: "place_order", Annotations: &mcp.ToolAnnotations{DestructiveHint: &f}},
		func(_ context.Context, _ *mcp.CallToolRequest, a orderArgs) (*mcp.CallToolResult, placed, error) {
			u.mu.Lock()
			defer u.mu.Unlock()
			u.n[a.OrderID]++
			return nil, placed{OrderID: a.OrderID, Run: u.n[a.OrderID]}, nil
		})
	mcp.AddTool(u.srv, &mcp.Tool{Name: "lookup_order", Annotations: &mcp.ToolAnnotations{ReadOnlyHint: true}},
		func(_ context.Context, _ *mcp.CallToolRequest, a orderArgs) (*mcp.CallToolResult, placed, error) {
			u.mu.Lock()
			defer u.mu.Unlock()
			return nil, placed{OrderID: a.OrderID, Run: u.n[a.OrderID]}, nil
		})
	return u
}

func (u *goUpstream) runs(order string) int {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.n[order]
}

// serveHTTP serves u over streamable HTTP: stateless, where 2026-07-28 lives in the
// go-sdk, or with sessions for the legacy upstream.
func (u *goUpstream) serveHTTP(t *testing.T, legacy bool) string {
	t.Helper()
	srv := httptest.NewServer(mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return u.srv },
		&mcp.StreamableHTTPOptions{Stateless: !legacy}))
	t.Cleanup(srv.Close)
	return srv.URL
}

// inMemory connects the gateway to u over the go-sdk's in-memory transport, which
// carries either era (as stdio does).
func (u *goUpstream) inMemory(t *testing.T) func() mcp.Transport { return inMemory(t, u.srv) }

// inMemory connects the gateway to srv over the go-sdk's in-memory transport, a new
// session for each connection the gateway makes, until the test ends.
func inMemory(t *testing.T, srv *mcp.Server) func() mcp.Transport {
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	return func() mcp.Transport {
		c, s := mcp.NewInMemoryTransports()
		if _, err := srv.Connect(ctx, s, nil); err != nil {
			t.Errorf("upstream connect: %v", err)
		}
		return c
	}
}

// m3LegacyHTTP serves a mark3labs upstream that speaks 2025-11-25 and earlier only.
func m3LegacyHTTP(t *testing.T, u *m3Upstream) string {
	t.Helper()
	srv := httptest.NewServer(m3server.NewStreamableHTTPServer(u.srv,
		m3server.WithStreamableHTTPProtocolVersions(legacyEra, "2025-06-18", "2025-03-26")))
	t.Cleanup(srv.Close)
	return srv.URL + "/mcp"
}

// agent is one MCP client of the gateway: it calls a tool and hands back the result.
type agent struct {
	name string
	call func(t *testing.T, tool string, args map[string]any, meta map[string]any) *mcp.CallToolResult
}

// goAgent drives a go-sdk session.
func goAgent(name string, s *mcp.ClientSession) agent {
	return agent{name: name, call: func(t *testing.T, tool string, args map[string]any, meta map[string]any) *mcp.CallToolResult {
		return goCall(t, s, tool, args, meta)
	}}
}

// m3AgentOn drives a mark3labs client that is started and initialized in era.
func m3AgentOn(t *testing.T, name string, tr m3transport.Interface, era string) agent {
	t.Helper()
	return m3Started(t, name, m3client.NewClient(tr, m3client.WithProtocolVersion(era)), era)
}

// stdioGateway serves g over a pair of pipes, as `idemkv mcp-gateway` does on stdio.
func stdioGateway(t *testing.T, g *mcpgw.Gateway) (toGateway io.WriteCloser, fromGateway io.ReadCloser) {
	t.Helper()
	inR, inW := io.Pipe()
	outR, outW := io.Pipe()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = g.ServeIO(ctx, inR, outW)
		outW.Close()
	}()
	t.Cleanup(func() {
		cancel()
		inW.Close()
		outR.Close()
		<-done
	})
	return inW, outR
}

// goStdioAgent is a go-sdk session with g over stdio in era.
func goStdioAgent(t *testing.T, g *mcpgw.Gateway, era string) *mcp.ClientSession {
	t.Helper()
	w, r := stdioGateway(t, g)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	sess, err := mcp.NewClient(&mcp.Implementation{Name: "go-stdio-" + era, Version: "1"}, nil).Connect(ctx,
		&mcp.IOTransport{Reader: r, Writer: w}, &mcp.ClientSessionOptions{ProtocolVersion: era})
	if err != nil {
		t.Fatalf("go-sdk over stdio in %s: %v", era, err)
	}
	t.Cleanup(func() { _ = sess.Close() })
	if got := sess.InitializeResult().ProtocolVersion; got != era {
		t.Fatalf("the stdio agent speaks %s, want %s", got, era)
	}
	return sess
}

// upstreamCase is one upstream of the era matrix.
type upstreamCase struct {
	name      string
	era       string
	transport func() mcp.Transport
	runs      func(order string) int    // place_order runs for an order; nil: not counted per order
	total     func() int                // place_order runs in all; nil: not counted
	sc        func(order string) string // the structured content place_order answers first
}

// Issue 23 points 1 and 2: the go-sdk and mark3labs/mcp-go as agents and as
// upstreams, each in 2026-07-28 and in 2025-11-25, over streamable HTTP and stdio,
// through the real gateway on a real idemkv: the gateway talks to each upstream in
// its era and serves every agent in the agent's, and in every pairing a mutating
// call runs once, its retry is a replay of the same bytes, and a read-only call
// passes through.
func TestErasInterop(t *testing.T) {
	cluster := testcluster.Start(t, 1)
	m3Modern, m3Old := newM3Upstream(), newM3Upstream()
	goModern, goOld, goMem := newGoUpstream(false), newGoUpstream(true), newGoUpstream(false)
	m3SC := func(order string) string {
		return `"structuredContent":{"order_id":"` + order + `","amount":12,"ledger_seq":` + bigSeq + `}`
	}
	goSC := func(order string) string { return `"structuredContent":{"order_id":"` + order + `","run":1}` }
	upstreams := []upstreamCase{
		{"mcp-go/http", modernEra, httpUpstream(m3Modern.serveHTTP(t)), nil, func() int { return m3Modern.calls("place_order") }, m3SC},
		{"mcp-go/http", legacyEra, httpUpstream(m3LegacyHTTP(t, m3Old)), nil, func() int { return m3Old.calls("place_order") }, m3SC},
		{"mcp-go/stdio", modernEra, stdioUpstream(t), nil, nil, m3SC},
		{"go-sdk/http", modernEra, httpUpstream(goModern.serveHTTP(t, false)), goModern.runs, nil, goSC},
		{"go-sdk/http", legacyEra, httpUpstream(goOld.serveHTTP(t, true)), goOld.runs, nil, goSC},
		{"go-sdk/in-memory", modernEra, goMem.inMemory(t), goMem.runs, nil, goSC},
	}
	for i, up := range upstreams {
		t.Run(fmt.Sprintf("upstream %s %s", up.name, up.era), func(t *testing.T) {
			tenant := fmt.Sprintf("eras-%d", i)
			g := newGW(t, cluster, up.transport, gwOptions{policy: "tenant: " + tenant + "\n"})
			if got := g.gw.Upstream().Protocol(); got != up.era {
				t.Fatalf("the gateway speaks %s with the upstream, want %s", got, up.era)
			}
			var agents []agent
			for _, era := range eras {
				agents = append(agents, goAgent("go-sdk/http "+era, g.connectGoEra("go-"+era, nil, era)))
				tr, err := m3transport.NewStreamableHTTP(g.url)
				if err != nil {
					t.Fatal(err)
				}
				agents = append(agents, m3AgentOn(t, "mcp-go/http "+era, tr, era))
				agents = append(agents, goAgent("go-sdk/stdio "+era, goStdioAgent(t, g.gw, era)))
				w, r := stdioGateway(t, g.gw)
				agents = append(agents, m3AgentOn(t, "mcp-go/stdio "+era, m3transport.NewIO(r, w, io.NopCloser(strings.NewReader(""))), era))
			}
			for j, a := range agents {
				orderID := fmt.Sprintf("o-%d", j)
				before := 0
				if up.runs != nil {
					before = up.runs(orderID)
				}
				var texts []string
				for k, want := range []string{"execute", "replay"} {
					res := a.call(t, "place_order", order(orderID, 12, "EUR"), key(tenant+":"+orderID))
					if res.IsError || meta(res, mcpgw.MetaDecision) != want {
						t.Fatalf("%s: call %d: want %s, got %s", a.name, k+1, want, show(res))
					}
					texts = append(texts, text(res))
				}
				if texts[0] != texts[1] {
					t.Errorf("%s: the replay's text %q differs from the first answer's %q", a.name, texts[1], texts[0])
				}
				if up.runs != nil {
					if n := up.runs(orderID) - before; n != 1 {
						t.Errorf("%s: place_order ran %d times for two calls, want 1", a.name, n)
					}
				}
				rec := g.stored(tenant, tenant+":"+orderID)
				if !strings.Contains(string(rec), up.sc(orderID)) {
					t.Errorf("%s: idemkv stores %s, want the upstream's own %s", a.name, rec, up.sc(orderID))
				}
				ro := a.call(t, "lookup_order", order(orderID, 12, "EUR"), nil)
				if ro.IsError || meta(ro, mcpgw.MetaDecision) != "" {
					t.Errorf("%s: a read-only call: %s", a.name, show(ro))
				}
			}
			if up.total != nil {
				// One run per agent, for two calls each.
				if n := up.total(); n != len(agents) {
					t.Errorf("place_order ran %d times upstream for %d agents calling it twice each", n, len(agents))
				}
			}
		})
	}
}

// stored is a stored result's bytes.
func (g *gw) stored(tenant, key string) json.RawMessage {
	g.t.Helper()
	rec, err := g.idem.Get(context.Background(), &idemkv.GetRequest{Tenant: tenant, Key: key})
	if err != nil {
		g.t.Fatalf("get %s/%s: %v", tenant, key, err)
	}
	return rec.Receipt.Result
}

// cutter cuts the response stream of the first tools/call it carries once the
// answer has started (the headers came) and before it ends, as a dropped connection
// does; 2026-07-28 has no stream resumption, so the client must re-issue the request.
type cutter struct {
	mu   sync.Mutex
	cuts int
}

func (c *cutter) RoundTrip(req *http.Request) (*http.Response, error) {
	var body []byte
	if req.Body != nil {
		body, _ = io.ReadAll(req.Body)
		req.Body = io.NopCloser(strings.NewReader(string(body)))
	}
	resp, err := http.DefaultTransport.RoundTrip(req)
	if err != nil || !strings.Contains(string(body), `"tools/call"`) {
		return resp, err
	}
	c.mu.Lock()
	cut := c.cuts == 0
	c.cuts++
	c.mu.Unlock()
	if cut {
		resp.Body.Close()
		resp.Body = io.NopCloser(&failing{io.ErrUnexpectedEOF})
	}
	return resp, nil
}

type failing struct{ err error }

func (f *failing) Read([]byte) (int, error) { return 0, f.err }

// Issue 23 point 2: a 2026-07-28 client whose response stream broke mid-call re-issues
// the request, with the same arguments and no key of ours: the policy's key template
// makes it the same operation, and the ticket is created once.
func TestReissuedRequestAfterACutStream(t *testing.T) {
	cluster := testcluster.Start(t, 1)
	e := newEnv(t, cluster, envOptions{policy: ticketPolicy("reissue"), delay: 2 * time.Second})
	srv := httptest.NewServer(e.gw.HTTPHandler(nil))
	t.Cleanup(srv.Close)
	var c cutter
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	sess, err := mcp.NewClient(&mcp.Implementation{Name: "reissuing-agent", Version: "1"}, nil).Connect(ctx,
		&mcp.StreamableClientTransport{Endpoint: srv.URL, MaxRetries: -1, HTTPClient: &http.Client{Transport: &c}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer sess.Close()
	if v := sess.InitializeResult().ProtocolVersion; v != modernEra {
		t.Fatalf("the agent speaks %s, want %s", v, modernEra)
	}
	args := ticketArgs("INC-77", "disk full")
	if _, err := sess.CallTool(ctx, &mcp.CallToolParams{Name: "create_ticket", Arguments: args}); err == nil {
		t.Fatal("the first call answered although its stream was cut")
	}
	res, err := sess.CallTool(ctx, &mcp.CallToolParams{Name: "create_ticket", Arguments: args})
	if err != nil {
		t.Fatalf("the re-issued call: %v", err)
	}
	if res.IsError || meta(res, mcpgw.MetaDecision) == "" {
		t.Fatalf("the re-issued call: %s", show(res))
	}
	st := e.upstream()
	if len(st.Tickets) != 1 || st.CreateCalls != 1 {
		t.Fatalf("the upstream holds %d tickets after %d create calls, want 1 and 1 (decision %s)", len(st.Tickets), st.CreateCalls, meta(res, mcpgw.MetaDecision))
	}
	t.Logf("the re-issued call's decision: %s", meta(res, mcpgw.MetaDecision))
}
