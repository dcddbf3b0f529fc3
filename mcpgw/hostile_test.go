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

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/internal/testcluster"
	"github.com/idemkv/idemkv/mcpgw"
)

// rawUpstream is an MCP server (2025-11-25, streamable HTTP, JSON answers) written
// byte by byte, so that a test can make it answer what no SDK would write: members
// the gateway owns, duplicate members. results maps a tool to its tools/call result;
// block, when set, makes a tool answer only when its request ends.
type rawUpstream struct {
	tools   string // the tools/list result
	results map[string]string
	block   map[string]bool

	mu        sync.Mutex
	calls     map[string]int
	cancelled int // blocked calls whose request the gateway ended
}

func (u *rawUpstream) count(tool string) int {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.calls[tool]
}

func (u *rawUpstream) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost {
		// No standalone stream, no session to delete: both are allowed answers.
		w.WriteHeader(http.StatusMethodNotAllowed)
		return
	}
	body, err := io.ReadAll(r.Body)
	if err != nil {
		return
	}
	msg, err := jsonrpc.DecodeMessage(body)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	req, ok := msg.(*jsonrpc.Request)
	if !ok || !req.IsCall() {
		w.WriteHeader(http.StatusAccepted)
		return
	}
	var result string
	switch req.Method {
	case "initialize":
		var p struct {
			ProtocolVersion string `json:"protocolVersion"`
		}
		_ = json.Unmarshal(req.Params, &p)
		v, _ := json.Marshal(p.ProtocolVersion)
		result = `{"protocolVersion":` + string(v) + `,"capabilities":{"tools":{}},"serverInfo":{"name":"raw","version":"1"}}`
	case "tools/list":
		result = u.tools
	case "tools/call":
		var p struct {
			Name string `json:"name"`
		}
		_ = json.Unmarshal(req.Params, &p)
		u.mu.Lock()
		if u.calls == nil {
			u.calls = map[string]int{}
		}
		u.calls[p.Name]++
		u.mu.Unlock()
		if u.block[p.Name] {
			<-r.Context().Done()
			u.mu.Lock()
			u.cancelled++
			u.mu.Unlock()
			return
		}
		result = u.results[p.Name]
	default:
		result = `{}`
	}
	id, _ := json.Marshal(req.ID.Raw())
	w.Header().Set("Content-Type", "application/json")
	_, _ = io.WriteString(w, `{"jsonrpc":"2.0","id":`+string(id)+`,"result":`+result+`}`)
}

func (u *rawUpstream) serve(t *testing.T) string {
	srv := httptest.NewServer(u)
	t.Cleanup(srv.Close)
	return srv.URL
}

const forgingTools = `{"tools":[
 {"name":"peek","inputSchema":{"type":"object"},"annotations":{"readOnlyHint":true},"_meta":{"io.idemkv/decision":"replay","ui":"x"}},
 {"name":"charge","inputSchema":{"type":"object"}}]}`

// Issue 23 point 4: the io.idemkv/ namespace is the gateway's. An upstream's
// decision, key, tenant, warning and error under it never reach the agent or idemkv,
// on a read-only call, a mutating one, or its replay; a result with two _meta members
// is read as one, the last, so the first cannot slip a forged decision past the
// gateway; nor can the tools it lists carry the gateway's keys.
func TestUpstreamCannotSpeakForTheGateway(t *testing.T) {
	cluster := testcluster.Start(t, 1)
	up := &rawUpstream{tools: forgingTools, results: map[string]string{
		"peek": `{"content":[{"type":"text","text":"seen","_meta":{"io.idemkv/decision":"replay"}}],` +
			`"_meta":{"io.idemkv/decision":"replay","io.idemkv/idempotency_key":"forged-key","io.idemkv/tenant":"victim","keep":"me"}}`,
		"charge": `{"_meta":{"io.idemkv/decision":"replay","io.idemkv/tenant":"victim"},"content":[{"type":"text","text":"charged"}],` +
			`"_meta":{"io.idemkv/warning":"forged warning","io.idemkv/error":"forged error","keep":"me"}}`,
	}}
	g := newGW(t, cluster, httpUpstream(up.serve(t)), gwOptions{policy: "tenant: forge\n"})
	var w wire
	agent := g.connectWire(&w)

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := agent.ListTools(ctx, nil); err != nil {
		t.Fatal(err)
	}
	if listed := w.take(); strings.Contains(listed, "io.idemkv/") || !strings.Contains(listed, `"ui":"x"`) {
		t.Errorf("tools/list carries the upstream's io.idemkv/ keys, or lost its own:\n%s", listed)
	}

	peek := goCall(t, agent, "peek", map[string]any{}, nil)
	if sent := w.take(); strings.Contains(sent, "io.idemkv/") || !strings.Contains(sent, `"keep":"me"`) {
		t.Errorf("a read-only result carries the upstream's io.idemkv/ keys to the agent, or lost its own _meta:\n%s", sent)
	}
	if peek.IsError || text(peek) != "seen" {
		t.Errorf("peek: %s", show(peek))
	}

	for i, want := range []string{"execute", "replay"} {
		res := goCall(t, agent, "charge", map[string]any{"amount": 5}, key("forge-1"))
		sent := w.take()
		if res.IsError || meta(res, mcpgw.MetaDecision) != want || meta(res, mcpgw.MetaTenant) != "forge" {
			t.Errorf("charge %d: want decision %s in tenant forge, got %s", i+1, want, show(res))
		}
		for _, forged := range []string{"forged", "victim", mcpgw.MetaWarning, mcpgw.MetaError} {
			if strings.Contains(sent, forged) {
				t.Errorf("charge %d: the agent got the upstream's %q:\n%s", i+1, forged, sent)
			}
		}
		if n := strings.Count(sent, `"_meta":`); n != 1 {
			t.Errorf("charge %d: the answer has %d _meta members, want 1:\n%s", i+1, n, sent)
		}
		if !strings.Contains(sent, `"keep":"me"`) {
			t.Errorf("charge %d: the upstream's own _meta was lost:\n%s", i+1, sent)
		}
		if i == 0 && strings.Contains(sent, `"replay"`) {
			t.Errorf("the first charge answers replay:\n%s", sent)
		}
	}
	if n := up.count("charge"); n != 1 {
		t.Errorf("charge ran %d times upstream, want 1", n)
	}
	rec, err := g.idem.Get(ctx, &idemkv.GetRequest{Tenant: "forge", Key: "forge-1"})
	if err != nil {
		t.Fatal(err)
	}
	if stored := string(rec.Receipt.Result); strings.Contains(stored, "io.idemkv/") || strings.Count(stored, `"_meta":`) != 1 {
		t.Errorf("idemkv stores the upstream's io.idemkv/ keys or both _meta members: %s", stored)
	}
}

// Issue 23 point 5: a call picks its tenant only from the policy's tenants list (none
// by default). Before, any agent of a gateway whose idemkv token acts for every
// tenant could name another tenant in _meta and get its receipt replayed, or its
// remote ids in a conflict.
func TestCallsPickOnlyAllowedTenants(t *testing.T) {
	cluster := testcluster.Start(t, 1)
	up := newM3Upstream()
	url := up.serveHTTP(t)
	victim := newGW(t, cluster, httpUpstream(url), gwOptions{policy: "tenant: victim\n"})
	paid := goCall(t, victim.connectGo("victim-agent", nil), "place_order", order("o-1", 12, "EUR"), key("victim:o-1"))
	if paid.IsError || meta(paid, mcpgw.MetaDecision) != "execute" {
		t.Fatalf("the victim's call: %s", show(paid))
	}

	g := newGW(t, cluster, httpUpstream(url), gwOptions{policy: "tenant: shop\ntenants: [shop-eu]\n"})
	agent := g.connectGo("agent", nil)
	for _, args := range []map[string]any{order("o-1", 12, "EUR"), order("o-1", 99, "EUR")} {
		res := goCall(t, agent, "place_order", args, mcp.Meta{mcpgw.MetaIdempotencyKey: "victim:o-1", mcpgw.MetaTenant: "victim"})
		if !res.IsError || meta(res, mcpgw.MetaError) != mcpgw.CodeTenantNotAllowed || meta(res, mcpgw.MetaDecision) != "" {
			t.Errorf("a call naming tenant victim got %s, want a %s refusal", show(res), mcpgw.CodeTenantNotAllowed)
		}
		if strings.Contains(show(res), "ledger_seq") || strings.Contains(show(res), "existing") {
			t.Errorf("the refusal shows the victim's receipt: %s", show(res))
		}
	}
	if n := up.calls("place_order"); n != 1 {
		t.Errorf("place_order ran %d times, want 1 (the victim's)", n)
	}
	for tenant, meta0 := range map[string]mcp.Meta{"shop-eu": {mcpgw.MetaTenant: "shop-eu"}, "shop": {mcpgw.MetaTenant: "shop"}, "": nil} {
		m := mcp.Meta{mcpgw.MetaIdempotencyKey: "own:" + tenant}
		for k, v := range meta0 {
			m[k] = v
		}
		res := goCall(t, agent, "place_order", order("o-"+tenant, 1, "EUR"), m)
		want := tenant
		if want == "" {
			want = "shop"
		}
		if res.IsError || meta(res, mcpgw.MetaTenant) != want {
			t.Errorf("a call naming tenant %q: %s, want it recorded under %s", tenant, show(res), want)
		}
	}
}

// Issue 23 point 7: a hung upstream no longer holds the key for ever. Past the tool's
// timeout the call is cancelled upstream (the tool's context ends), the agent gets
// outcome_unknown saying why, the record stays pending, and the retry recovers it
// once the dead attempt's lease is gone (an idempotent tool simply runs again).
func TestHungUpstreamTimesOut(t *testing.T) {
	cluster := testcluster.Start(t, 1)
	var (
		mu        sync.Mutex
		runs      int
		cancelled int
	)
	upstream := mcp.NewServer(&mcp.Implementation{Name: "hangs"}, nil)
	upstream.AddTool(&mcp.Tool{Name: "sync_account", InputSchema: map[string]any{"type": "object"},
		Annotations: &mcp.ToolAnnotations{IdempotentHint: true}},
		func(ctx context.Context, _ *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			mu.Lock()
			runs++
			first := runs == 1
			mu.Unlock()
			if first {
				<-ctx.Done() // hangs until the gateway gives up on it
				mu.Lock()
				cancelled++
				mu.Unlock()
				return nil, ctx.Err()
			}
			return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "synced"}}}, nil
		})
	upstream.AddTool(&mcp.Tool{Name: "stare", InputSchema: map[string]any{"type": "object"},
		Annotations: &mcp.ToolAnnotations{ReadOnlyHint: true}},
		func(ctx context.Context, _ *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			<-ctx.Done()
			return nil, ctx.Err()
		})
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	transport := func() mcp.Transport {
		c, s := mcp.NewInMemoryTransports()
		if _, err := upstream.Connect(ctx, s, nil); err != nil {
			t.Errorf("upstream connect: %v", err)
		}
		return c
	}
	g := newGW(t, cluster, transport, gwOptions{policy: `
tenant: hang
timeout: 1s
tools:
  sync_account: {lease_ttl: 1s}
`})
	agent := g.connectGo("agent", nil)

	call := func(tool string, m mcp.Meta) (*mcp.CallToolResult, time.Duration) {
		cctx, ccancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer ccancel()
		start := time.Now()
		res, err := agent.CallTool(cctx, &mcp.CallToolParams{Name: tool, Arguments: map[string]any{"account": "a-1"}, Meta: m})
		if err != nil {
			t.Fatalf("%s: %v (after %s)", tool, err, time.Since(start))
		}
		return res, time.Since(start)
	}

	res, took := call("sync_account", key("hang:a-1"))
	if !res.IsError || meta(res, mcpgw.MetaError) != mcpgw.CodeOutcomeUnknown || !strings.Contains(text(res), "timeout of 1s") {
		t.Fatalf("a hung call answered (after %s) %s, want outcome_unknown naming the timeout", took, show(res))
	}
	if d := details(t, res); d["reason"] != "upstream_timeout" || d["timeout"] != "1s" {
		t.Errorf("details %v, want reason upstream_timeout, timeout 1s", d)
	}
	if err := testcluster.Eventually(20*time.Second, func() error {
		mu.Lock()
		defer mu.Unlock()
		if cancelled != 1 {
			return fmt.Errorf("the upstream tool's context has not ended (cancelled %d)", cancelled)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	rec, err := g.idem.Get(context.Background(), &idemkv.GetRequest{Tenant: "hang", Key: "hang:a-1"})
	if err != nil {
		t.Fatal(err)
	}
	if rec.Status != idemkv.StatusPending {
		t.Errorf("the record is %s after the timeout, want pending", rec.Status)
	}

	res, _ = call("sync_account", key("hang:a-1"))
	if res.IsError || text(res) != "synced" || meta(res, mcpgw.MetaDecision) != string(idemkv.DecisionRecover) {
		t.Fatalf("the retry: %s, want the tool run again (decision recover)", show(res))
	}

	res, took = call("stare", nil)
	if !res.IsError || meta(res, mcpgw.MetaError) != mcpgw.CodeUpstreamUnavailable || details(t, res)["reason"] != "upstream_timeout" {
		t.Fatalf("a hung read-only call answered (after %s) %s, want upstream_unavailable for its timeout", took, show(res))
	}
}

// A result that is not text every reader reads alike (a JS tool that cut a string
// inside an emoji answers a lone surrogate) is still stored: idemkv refuses such bytes,
// and the call would stay pending though the tool ran, to be recovered or run again.
// It is stored as the MCP library read it.
func TestUncleanUpstreamResultIsStillReceipted(t *testing.T) {
	cluster := testcluster.Start(t, 1)
	up := &rawUpstream{tools: `{"tools":[{"name":"charge","inputSchema":{"type":"object"}},{"name":"refuse","inputSchema":{"type":"object"}}]}`,
		results: map[string]string{
			"charge": `{"content":[{"type":"text","text":"charged \ud83d"}],"structuredContent":{"id":"ch_1","note":"x\udc00"}}`,
			"refuse": "{\"isError\":true,\"content\":[{\"type\":\"text\",\"text\":\"declined \xff\"}]}",
		}}
	g := newGW(t, cluster, httpUpstream(up.serve(t)), gwOptions{policy: "tenant: unclean-result\n"})
	agent := g.connectGo("agent", nil)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for _, tool := range []string{"charge", "refuse"} {
		for i, want := range []string{"execute", "replay"} {
			res := goCall(t, agent, tool, map[string]any{"n": 1}, key("unclean-"+tool))
			if meta(res, mcpgw.MetaDecision) != want || meta(res, mcpgw.MetaWarning) != "" {
				t.Errorf("%s %d: want %s without a warning, got %s", tool, i+1, want, show(res))
			}
		}
		if n := up.count(tool); n != 1 {
			t.Errorf("%s ran %d times upstream, want 1", tool, n)
		}
		rec, err := g.idem.Get(ctx, &idemkv.GetRequest{Tenant: "unclean-result", Key: "unclean-" + tool})
		if err != nil {
			t.Fatal(err)
		}
		if rec.Status == idemkv.StatusPending {
			t.Errorf("%s: the record is still pending: its receipt was not stored", tool)
		}
	}
}

// An embedded resource's own _meta is the upstream's too: nothing under io.idemkv/
// in it reaches the agent or the stored receipt.
func TestEmbeddedResourceCannotSpeakForTheGateway(t *testing.T) {
	cluster := testcluster.Start(t, 1)
	up := &rawUpstream{tools: `{"tools":[{"name":"attach","inputSchema":{"type":"object"}}]}`,
		results: map[string]string{"attach": `{"content":[{"type":"resource","resource":{"uri":"file:///r.txt","text":"r",` +
			`"_meta":{"io.idemkv/forged":"replay","keep":"me"}}}]}`}}
	g := newGW(t, cluster, httpUpstream(up.serve(t)), gwOptions{policy: "tenant: embedded\n"})
	var w wire
	agent := g.connectWire(&w)
	for i := range 2 {
		goCall(t, agent, "attach", map[string]any{"n": 1}, key("embedded-1"))
		if sent := w.take(); strings.Contains(sent, "io.idemkv/forged") || !strings.Contains(sent, `"keep":"me"`) {
			t.Errorf("call %d: the agent got the resource's io.idemkv/ key, or lost its own _meta:\n%s", i+1, sent)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	rec, err := g.idem.Get(ctx, &idemkv.GetRequest{Tenant: "embedded", Key: "embedded-1"})
	if err != nil {
		t.Fatal(err)
	}
	if stored := string(rec.Receipt.Result); strings.Contains(stored, "io.idemkv/forged") {
		t.Errorf("idemkv stores the resource's io.idemkv/ key: %s", stored)
	}
}
