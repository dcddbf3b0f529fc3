package mcpgw_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/jsonschema-go/jsonschema"
	m3client "github.com/mark3labs/mcp-go/client"
	m3 "github.com/mark3labs/mcp-go/mcp"
	m3server "github.com/mark3labs/mcp-go/server"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	"go.opentelemetry.io/otel/propagation"

	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/client"
	"github.com/idemkv/idemkv/internal/testcluster"
	"github.com/idemkv/idemkv/internal/testlog"
	"github.com/idemkv/idemkv/mcpgw"
)

// The tests in this file put the gateway between implementations that share no code
// with the go-sdk it is built on: an upstream written with mark3labs/mcp-go, and
// agents using mark3labs/mcp-go's client or the go-sdk's, checked the way the
// TypeScript SDK checks tool results against their declared outputSchema.

// bigSeq is beyond 2^53: a double cannot hold it, so any decode into float64 on the
// way from the upstream to the agent, or into and out of idemkv, turns it into
// 9007199254740992.
const bigSeq = "9007199254740993"

const orderInputSchema = `{"type":"object","properties":{
 "order_id":{"type":"string"},"amount":{"type":"integer"},"currency":{"type":"string","enum":["EUR","USD"]}},
 "required":["order_id","amount","currency"],"additionalProperties":false}`

const orderOutputSchema = `{"type":"object","properties":{
 "order_id":{"type":"string"},"amount":{"type":"integer"},"ledger_seq":{"type":"integer"}},
 "required":["order_id","amount","ledger_seq"],"additionalProperties":false}`

// m3Upstream is the mark3labs upstream: place_order (not idempotent, every hint
// false, an outputSchema, input validation by the SDK) and lookup_order (read only).
type m3Upstream struct {
	srv *m3server.MCPServer
	mu  sync.Mutex
	n   map[string]int // calls per tool
}

func newM3Upstream() *m3Upstream {
	u := &m3Upstream{n: map[string]int{}}
	u.srv = m3server.NewMCPServer("m3-orders", "1.0.0",
		m3server.WithToolCapabilities(true), m3server.WithLogging(), m3server.WithInputSchemaValidation())
	place := m3.NewToolWithRawSchema("place_order", "Place an order.", json.RawMessage(orderInputSchema))
	place.RawOutputSchema = json.RawMessage(orderOutputSchema)
	place.Annotations = m3.ToolAnnotation{Title: "Place an order", ReadOnlyHint: m3.ToBoolPtr(false),
		DestructiveHint: m3.ToBoolPtr(false), IdempotentHint: m3.ToBoolPtr(false), OpenWorldHint: m3.ToBoolPtr(false)}
	u.srv.AddTool(place, func(ctx context.Context, req m3.CallToolRequest) (*m3.CallToolResult, error) {
		u.count("place_order")
		id, _ := req.GetArguments()["order_id"].(string)
		amount, _ := req.GetArguments()["amount"].(float64)
		out := fmt.Sprintf(`{"order_id":%q,"amount":%d,"ledger_seq":%s}`, id, int64(amount), bigSeq)
		return &m3.CallToolResult{
			Content:           []m3.Content{m3.NewTextContent(out)},
			StructuredContent: json.RawMessage(out),
		}, nil
	})
	lookup := m3.NewToolWithRawSchema("lookup_order", "Look an order up.",
		json.RawMessage(`{"type":"object","properties":{"order_id":{"type":"string"}}}`))
	lookup.Annotations = m3.ToolAnnotation{ReadOnlyHint: m3.ToBoolPtr(true), OpenWorldHint: m3.ToBoolPtr(false)}
	u.srv.AddTool(lookup, func(ctx context.Context, req m3.CallToolRequest) (*m3.CallToolResult, error) {
		u.count("lookup_order")
		return m3.NewToolResultText("none"), nil
	})
	export := m3.NewToolWithRawSchema("export_report", "Export a report, reporting progress.",
		json.RawMessage(`{"type":"object","properties":{"report":{"type":"string"}}}`))
	u.srv.AddTool(export, func(ctx context.Context, req m3.CallToolRequest) (*m3.CallToolResult, error) {
		u.count("export_report")
		srv := m3server.ServerFromContext(ctx)
		if req.Params.Meta != nil && req.Params.Meta.ProgressToken != nil {
			for i := 1; i <= 2; i++ {
				_ = srv.SendNotificationToClient(ctx, "notifications/progress", map[string]any{
					"progressToken": req.Params.Meta.ProgressToken, "progress": i, "total": 2,
					"message": fmt.Sprintf("part %d of 2", i)})
			}
		}
		_ = srv.SendLogMessageToClient(ctx, m3.NewLoggingMessageNotification(m3.LoggingLevelInfo, "m3-orders", "exporting"))
		// mcp-go queues notifications and writes them from another goroutine, so the
		// answer could overtake them, and progress after the answer is dropped, as MCP
		// requires. A tool that works on for a second after reporting is realistic.
		time.Sleep(time.Second)
		return m3.NewToolResultText("exported"), nil
	})
	return u
}

func (u *m3Upstream) count(tool string) {
	u.mu.Lock()
	u.n[tool]++
	u.mu.Unlock()
}

func (u *m3Upstream) calls(tool string) int {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.n[tool]
}

// serveHTTP serves u over streamable HTTP on loopback and returns its URL.
func (u *m3Upstream) serveHTTP(t *testing.T) string {
	t.Helper()
	srv := httptest.NewServer(m3server.NewStreamableHTTPServer(u.srv))
	t.Cleanup(srv.Close)
	return srv.URL + "/mcp"
}

// gw is a gateway over a real idemkv, in front of an upstream reached through
// transport, served over streamable HTTP on loopback.
type gw struct {
	t    *testing.T
	gw   *mcpgw.Gateway
	idem *client.Client
	url  string
}

type gwOptions struct {
	policy    string
	endpoints []string // idemkv; default: the cluster's
	cfg       func(*client.Config)
	gwCfg     func(*mcpgw.Config)
}

func newGW(t *testing.T, cluster *testcluster.Cluster, transport func() mcp.Transport, o gwOptions) *gw {
	t.Helper()
	policy, err := mcpgw.ParsePolicy([]byte(o.policy))
	if err != nil {
		t.Fatalf("policy: %v", err)
	}
	ccfg := client.Config{
		Endpoints:  o.endpoints,
		Logger:     testlog.NewLevel(t, "client: ", slog.LevelDebug),
		Propagator: propagation.TraceContext{},
		Run:        client.RunConfig{PollWait: 2 * time.Second, BackoffMax: 200 * time.Millisecond},
	}
	if ccfg.Endpoints == nil {
		ccfg.Endpoints = cluster.Endpoints()
	}
	if o.cfg != nil {
		o.cfg(&ccfg)
	}
	idem, err := client.New(ccfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { idem.Close() })
	up := mcpgw.NewUpstream(transport, &mcp.Implementation{Name: "idemkv-mcp-gateway-test"}, testlog.NewLevel(t, "upstream: ", slog.LevelDebug))
	t.Cleanup(func() { _ = up.Close() })
	cfg := mcpgw.DefaultConfig()
	cfg.Upstream, cfg.Runner, cfg.Policy, cfg.Logger = up, idem, policy, testlog.NewLevel(t, "gateway: ", slog.LevelDebug)
	if o.gwCfg != nil {
		o.gwCfg(&cfg)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	g, err := mcpgw.New(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = g.Close() })
	srv := httptest.NewServer(g.HTTPHandler(nil))
	t.Cleanup(srv.Close)
	return &gw{t: t, gw: g, idem: idem, url: srv.URL}
}

func httpUpstream(url string) func() mcp.Transport {
	return func() mcp.Transport { return &mcp.StreamableClientTransport{Endpoint: url, MaxRetries: -1} }
}

// m3Agent is an agent on mark3labs/mcp-go's client, over streamable HTTP.
func (g *gw) m3Agent() *m3client.Client {
	g.t.Helper()
	c, err := m3client.NewStreamableHttpClient(g.url)
	if err != nil {
		g.t.Fatal(err)
	}
	g.t.Cleanup(func() { _ = c.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := c.Start(ctx); err != nil {
		g.t.Fatal(err)
	}
	var init m3.InitializeRequest
	init.Params.ClientInfo = m3.Implementation{Name: "m3-agent", Version: "1"}
	if _, err := c.Initialize(ctx, init); err != nil {
		g.t.Fatalf("initialize: %v", err)
	}
	return c
}

// m3Call calls a tool through a mark3labs agent and returns the result as the wire
// JSON, decoded into the go-sdk's type for the assertions.
func m3Call(t *testing.T, c *m3client.Client, tool string, args map[string]any, meta map[string]any) (raw json.RawMessage, res *mcp.CallToolResult) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var req m3.CallToolRequest
	req.Params.Name = tool
	req.Params.Arguments = args
	if meta != nil {
		req.Params.Meta = &m3.Meta{AdditionalFields: meta}
	}
	r, err := c.CallTool(ctx, req)
	if err != nil {
		t.Fatalf("%s: %v", tool, err)
	}
	raw, err = json.Marshal(r)
	if err != nil {
		t.Fatal(err)
	}
	res = new(mcp.CallToolResult)
	if err := json.Unmarshal(raw, res); err != nil {
		t.Fatalf("decoding %s: %v", raw, err)
	}
	return raw, res
}

// outputChecker checks results against the tools' declared outputSchema the way the
// TypeScript SDK's client does, even on isError results: a tool that declares one
// must answer a success with structuredContent, and any structuredContent must
// validate.
type outputChecker map[string]*jsonschema.Resolved

func newOutputChecker(t *testing.T, tools []*mcp.Tool) outputChecker {
	t.Helper()
	oc := outputChecker{}
	for _, tool := range tools {
		if tool.OutputSchema == nil {
			continue
		}
		b, err := json.Marshal(tool.OutputSchema)
		if err != nil {
			t.Fatal(err)
		}
		var s jsonschema.Schema
		if err := json.Unmarshal(b, &s); err != nil {
			t.Fatal(err)
		}
		r, err := s.Resolve(nil)
		if err != nil {
			t.Fatalf("%s: %v", tool.Name, err)
		}
		oc[tool.Name] = r
	}
	return oc
}

func (oc outputChecker) check(tool string, res *mcp.CallToolResult) error {
	r, ok := oc[tool]
	if !ok {
		return nil
	}
	if res.StructuredContent == nil {
		if res.IsError {
			return nil
		}
		return fmt.Errorf("%s declares an outputSchema but answered without structuredContent", tool)
	}
	b, err := json.Marshal(res.StructuredContent)
	if err != nil {
		return err
	}
	var v any
	if err := json.Unmarshal(b, &v); err != nil {
		return err
	}
	if err := r.Validate(v); err != nil {
		return fmt.Errorf("%s: structuredContent %s does not match the declared outputSchema: %w", tool, b, err)
	}
	return nil
}

func listTools(t *testing.T, s *mcp.ClientSession) []*mcp.Tool {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	res, err := s.ListTools(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	return res.Tools
}

// connectGo opens a go-sdk agent session to the gateway.
func (g *gw) connectGo(name string, opts *mcp.ClientOptions) *mcp.ClientSession {
	g.t.Helper()
	c := mcp.NewClient(&mcp.Implementation{Name: name, Version: "1"}, opts)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	sess, err := c.Connect(ctx, &mcp.StreamableClientTransport{Endpoint: g.url, MaxRetries: -1}, nil)
	if err != nil {
		g.t.Fatalf("connecting to the gateway: %v", err)
	}
	g.t.Cleanup(func() { _ = sess.Close() })
	return sess
}

func goCall(t *testing.T, s *mcp.ClientSession, tool string, args any, meta mcp.Meta) *mcp.CallToolResult {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	res, err := s.CallTool(ctx, &mcp.CallToolParams{Name: tool, Arguments: args, Meta: meta})
	if err != nil {
		t.Fatalf("%s: %v", tool, err)
	}
	return res
}

func order(id string, amount int, currency string) map[string]any {
	return map[string]any{"order_id": id, "amount": amount, "currency": currency}
}

func key(k string) mcp.Meta { return mcp.Meta{mcpgw.MetaIdempotencyKey: k} }

// Issue 14 point 6: the gateway's own errors (conflict, missing key, in doubt) go
// into content text and _meta, never into the structuredContent a tool's
// outputSchema describes, so a client that validates structured content accepts them.
func TestGatewayErrorsKeepDeclaredOutputSchemas(t *testing.T) {
	cluster := testcluster.Start(t, 1)
	up := newM3Upstream()
	g := newGW(t, cluster, httpUpstream(up.serveHTTP(t)), gwOptions{policy: "tenant: schemas\n"})
	agent := g.connectGo("validating-agent", nil)
	oc := newOutputChecker(t, listTools(t, agent))
	if oc["place_order"] == nil {
		t.Fatal("place_order is listed without its outputSchema")
	}

	first := goCall(t, agent, "place_order", order("o-1", 12, "EUR"), key("schemas:o-1"))
	if first.IsError || meta(first, mcpgw.MetaDecision) != "execute" {
		t.Fatalf("first call: %s", show(first))
	}
	conflict := goCall(t, agent, "place_order", order("o-1", 13, "EUR"), key("schemas:o-1"))
	missing := goCall(t, agent, "place_order", order("o-2", 1, "EUR"), nil)
	for name, res := range map[string]*mcp.CallToolResult{"first": first, "conflict": conflict, "missing key": missing} {
		if err := oc.check("place_order", res); err != nil {
			t.Errorf("%s: a validating client rejects the answer: %v\n%s", name, err, show(res))
		}
	}
	if !conflict.IsError || meta(conflict, mcpgw.MetaError) != mcpgw.CodeConflict {
		t.Fatalf("want a conflict tool error, got %s", show(conflict))
	}
	details, _ := conflict.Meta[mcpgw.MetaDetails].(map[string]any)
	if details["reason"] != "idempotency_key_reused_with_different_effect" || details["existing_fingerprint"] != meta(first, mcpgw.MetaFingerprint) {
		t.Fatalf("the conflict is not in _meta[%s]: %s", mcpgw.MetaDetails, show(conflict))
	}
	if !strings.Contains(text(conflict), `"reason":"idempotency_key_reused_with_different_effect"`) {
		t.Fatalf("the conflict is not in the text: %s", text(conflict))
	}
	if meta(missing, mcpgw.MetaError) != mcpgw.CodeMissingKey {
		t.Fatalf("want a missing-key error, got %s", show(missing))
	}
	if n := up.calls("place_order"); n != 1 {
		t.Fatalf("place_order ran %d times, want 1", n)
	}
}

// Issue 14 point 7: an upstream that refuses the arguments in its input validation
// (an isError result, SEP-1303) did not run the tool: the key is released, so the
// model's corrected retry under the same key runs instead of meeting a conflict. The
// policy can still ask for the old behaviour.
func TestValidationErrorsReleaseTheKey(t *testing.T) {
	cluster := testcluster.Start(t, 1)
	for _, tc := range []struct {
		name   string
		policy string
		stored bool
	}{
		{name: "default", policy: "tenant: validation\n"},
		{name: "store", policy: "tenant: validation-store\nvalidation_errors: store\n", stored: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			up := newM3Upstream()
			g := newGW(t, cluster, httpUpstream(up.serveHTTP(t)), gwOptions{policy: tc.policy})
			agent := g.m3Agent()
			k := map[string]any{mcpgw.MetaIdempotencyKey: "order-7"}
			_, bad := m3Call(t, agent, "place_order", order("o-7", 5, "GBP"), k)
			if !bad.IsError || !strings.Contains(text(bad), "input schema validation failed") {
				t.Fatalf("want the upstream's validation error, got %s", show(bad))
			}
			_, fixed := m3Call(t, agent, "place_order", order("o-7", 5, "EUR"), k)
			if tc.stored {
				if meta(fixed, mcpgw.MetaError) != mcpgw.CodeConflict {
					t.Fatalf("validation_errors: store keeps the failure, so the corrected call conflicts; got %s", show(fixed))
				}
				if _, again := m3Call(t, agent, "place_order", order("o-7", 5, "GBP"), k); meta(again, mcpgw.MetaDecision) != "replay" || !again.IsError {
					t.Fatalf("the stored failure is replayed; got %s", show(again))
				}
				return
			}
			if fixed.IsError || meta(fixed, mcpgw.MetaDecision) != "execute" {
				t.Fatalf("the corrected call under the same key must run; got %s", show(fixed))
			}
			if n := up.calls("place_order"); n != 1 {
				t.Fatalf("place_order's own code ran %d times, want 1", n)
			}
		})
	}
}

// Issue 14 point 6, a receipt the gateway did not store: an operator settled an
// in-doubt call with `idemkv resolve --committed` and the tool's output as the
// result. The replay gives that output as the structuredContent (exactly, a
// ledger_seq beyond 2^53 included) and the receipt's description in the text and
// _meta, never the description as structuredContent.
func TestOperatorSettledReceiptKeepsTheSchema(t *testing.T) {
	cluster := testcluster.Start(t, 1)
	up := newM3Upstream()
	g := newGW(t, cluster, httpUpstream(up.serveHTTP(t)), gwOptions{policy: "tenant: settled\n"})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	args := order("o-5", 7, "EUR")
	effect, _ := json.Marshal(args)
	res, err := g.idem.Reserve(ctx, &idemkv.ReserveRequest{Tenant: "settled", Key: "settle-1", Tool: "place_order",
		Actor: "crashed-agent", Effect: effect, LeaseTTLMs: 1000})
	if err != nil || res.Decision != idemkv.DecisionExecute {
		t.Fatalf("reserve: %v %+v", err, res)
	}
	fp := res.Record.Fingerprint
	if _, err := g.idem.Doubt(ctx, &idemkv.DoubtRequest{Tenant: "settled", Key: "settle-1", Fingerprint: fp, Fence: res.Fence}); err != nil {
		t.Fatal(err)
	}
	output := `{"order_id":"o-5","amount":7,"ledger_seq":` + bigSeq + `}`
	if _, err := g.idem.Resolve(ctx, &idemkv.ResolveRequest{Tenant: "settled", Key: "settle-1", Fingerprint: fp,
		Outcome: idemkv.ResolveCommitted, RemoteSystem: "m3-orders", RemoteID: "o-5", Result: json.RawMessage(output)}); err != nil {
		t.Fatal(err)
	}

	var w wire
	agent := g.connectWire(&w)
	oc := newOutputChecker(t, listTools(t, agent))
	w.take()
	got := goCall(t, agent, "place_order", args, key("settle-1"))
	sent := w.take()
	if got.IsError || meta(got, mcpgw.MetaDecision) != "replay" {
		t.Fatalf("want the settled receipt replayed, got %s", show(got))
	}
	if err := oc.check("place_order", got); err != nil {
		t.Fatalf("a validating client rejects the replay: %v\n%s", err, sent)
	}
	if !strings.Contains(sent, `"structuredContent":`+output) {
		t.Errorf("the agent got %s, want the settled output %s as structuredContent", sent, output)
	}
	if d := details(t, got); d["remote_id"] != "o-5" || d["status"] != "committed" {
		t.Errorf("the receipt's description is not in _meta: %s", show(got))
	}
	if n := up.calls("place_order"); n != 0 {
		t.Fatalf("place_order ran %d times", n)
	}
}

// The eras of MCP an agent or upstream speaks in the tests: 2026-07-28 (stateless,
// server/discover) and 2025-11-25 (initialize and a session).
const (
	modernEra = "2026-07-28"
	legacyEra = "2025-11-25"
)

var eras = []string{modernEra, legacyEra}

// connectGoEra opens a go-sdk agent session to the gateway in era: the go-sdk
// discovers first by default, and pinned to 2025-11-25 it initializes.
func (g *gw) connectGoEra(name string, opts *mcp.ClientOptions, era string) *mcp.ClientSession {
	g.t.Helper()
	c := mcp.NewClient(&mcp.Implementation{Name: name, Version: "1"}, opts)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	sess, err := c.Connect(ctx, &mcp.StreamableClientTransport{Endpoint: g.url, MaxRetries: -1},
		&mcp.ClientSessionOptions{ProtocolVersion: era})
	if err != nil {
		g.t.Fatalf("connecting to the gateway in %s: %v", era, err)
	}
	g.t.Cleanup(func() { _ = sess.Close() })
	if got := sess.InitializeResult().ProtocolVersion; got != era {
		g.t.Fatalf("the agent speaks %s with the gateway, want %s", got, era)
	}
	return sess
}
