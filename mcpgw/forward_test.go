package mcpgw_test

import (
	"context"
	"encoding/json"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/client"
	"github.com/idemkv/idemkv/fingerprint"
	"github.com/idemkv/idemkv/internal/testlog"
	"github.com/idemkv/idemkv/mcpgw"
)

// runnerFunc is a Runner made of a function.
type runnerFunc func(ctx context.Context, op client.Op, fn client.Func) (*client.Outcome, error)

func (f runnerFunc) Do(ctx context.Context, op client.Op, fn client.Func) (*client.Outcome, error) {
	return f(ctx, op, fn)
}

var _ mcpgw.Runner = runnerFunc(nil)

// inMemoryUpstream connects the gateway's upstream side to upstream over in-memory
// transports; every session it opens is closed in t's cleanup.
func inMemoryUpstream(ctx context.Context, t *testing.T, upstream *mcp.Server) *mcpgw.Upstream {
	t.Helper()
	var (
		mu       sync.Mutex
		sessions []*mcp.ServerSession
	)
	up := mcpgw.NewUpstream(func() mcp.Transport {
		c, s := mcp.NewInMemoryTransports()
		ss, err := upstream.Connect(ctx, s, nil)
		if err != nil {
			t.Errorf("upstream connect: %v", err)
		}
		mu.Lock()
		sessions = append(sessions, ss)
		mu.Unlock()
		return c
	}, &mcp.Implementation{Name: "gw"}, testlog.NewLevel(t, "upstream: ", slog.LevelDebug))
	t.Cleanup(func() {
		_ = up.Close()
		mu.Lock()
		defer mu.Unlock()
		for _, s := range sessions {
			_ = s.Close()
		}
	})
	return up
}

// inProcess is a gateway in front of an in-process upstream, both on in-memory
// transports, for checking what the gateway hands to idemkv and to the upstream.
func inProcess(t *testing.T, upstream *mcp.Server, runner mcpgw.Runner, policy string, tp *sdktrace.TracerProvider) *mcp.ClientSession {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	up := inMemoryUpstream(ctx, t, upstream)
	p, err := mcpgw.ParsePolicy([]byte(policy))
	if err != nil {
		t.Fatal(err)
	}
	cfg := mcpgw.DefaultConfig()
	cfg.Upstream, cfg.Runner, cfg.Policy, cfg.Logger = up, runner, p, testlog.NewLevel(t, "gateway: ", slog.LevelDebug)
	cfg.Propagator = propagation.TraceContext{}
	if tp != nil {
		cfg.TracerProvider = tp
	}
	gw, err := mcpgw.New(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = gw.Close() })
	ct, st := mcp.NewInMemoryTransports()
	ss, err := gw.Server().Connect(ctx, st, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ss.Close() })
	sess, err := mcp.NewClient(&mcp.Implementation{Name: "the-agent"}, nil).Connect(ctx, ct, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sess.Close() })
	return sess
}

// The gateway hands idemkv the tenant, key, actor and effect of the call, and hands
// the upstream the agent's arguments and _meta, without the gateway's own keys, with
// its trace context.
func TestWhatTheGatewayForwards(t *testing.T) {
	var got struct {
		sync.Mutex
		meta mcp.Meta
		args json.RawMessage
	}
	upstream := mcp.NewServer(&mcp.Implementation{Name: "inproc"}, nil)
	upstream.AddTool(&mcp.Tool{Name: "pay", InputSchema: map[string]any{"type": "object"}},
		func(_ context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			got.Lock()
			got.meta, got.args = req.Params.Meta, req.Params.Arguments
			got.Unlock()
			return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "paid"}},
				StructuredContent: map[string]any{"payment": map[string]any{"id": "pay_1"}}}, nil
		})

	var op client.Op
	var stored *client.Result
	runner := runnerFunc(func(ctx context.Context, o client.Op, fn client.Func) (*client.Outcome, error) {
		op = o
		res, err := fn(ctx)
		if err != nil {
			return nil, err
		}
		stored = res
		raw, _ := json.Marshal(res.Result)
		return &client.Outcome{Decision: idemkv.DecisionExecute, Fingerprint: "sha256:x",
			Receipt: &idemkv.Receipt{Status: idemkv.StatusCommitted, Result: raw}}, nil
	})
	tp := sdktrace.NewTracerProvider()
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	sess := inProcess(t, upstream, runner, `
tenant: shop
tenants: [shop-eu]
tools:
  pay:
    key: "{tenant}:{order.id}:pay"
    volatile: [note]
    remote_id: payment.id
    ttl: 72h
    lease_ttl: 5s
`, tp)

	const traceID = "4bf92f3577b34da6a3ce929d0e0e4736"
	args := map[string]any{"order": map[string]any{"id": "o-17"}, "amount": 12.5, "note": "model wording"}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	res, err := sess.CallTool(ctx, &mcp.CallToolParams{Name: "pay", Arguments: args, Meta: mcp.Meta{
		mcpgw.MetaTenant: "shop-eu",
		"traceparent":    "00-" + traceID + "-00f067aa0ba902b7-01",
		"progressToken":  "p1",
		"x-request":      "r-9",
	}})
	if err != nil {
		t.Fatal(err)
	}
	if res.IsError || res.Meta[mcpgw.MetaDecision] != "execute" || res.Meta[mcpgw.MetaTenant] != "shop-eu" {
		t.Fatalf("result %+v", res)
	}

	if op.Tenant != "shop-eu" || op.Key != "shop-eu:o-17:pay" || op.Tool != "pay" || op.Actor != "the-agent" ||
		op.Class != client.NonIdempotentMutation || op.TTL != 72*time.Hour || op.LeaseTTL != 5*time.Second || op.Probe != nil {
		t.Fatalf("op %+v", op)
	}
	fp, err := fingerprint.OfValue(op.Effect, op.Drop...)
	if err != nil {
		t.Fatal(err)
	}
	want, _ := fingerprint.Of([]byte(`{"order":{"id":"o-17"},"amount":12.5}`))
	if fp != want {
		t.Fatalf("effect %s drop %v fingerprints to %s, want %s (without the volatile note)", op.Effect, op.Drop, fp, want)
	}
	if stored.RemoteID != "pay_1" || stored.RemoteSystem != "inproc" {
		t.Fatalf("receipt %+v, want remote id pay_1 from inproc", stored)
	}

	got.Lock()
	defer got.Unlock()
	if got.meta["x-request"] != "r-9" {
		t.Errorf("the agent's own _meta was not forwarded: %v", got.meta)
	}
	for k := range got.meta {
		if strings.HasPrefix(k, mcpgw.MetaPrefix) {
			t.Errorf("forwarded %s upstream: %v", k, got.meta)
		}
	}
	// The agent's progress token stays with the gateway, which relays the upstream's
	// progress under it; upstream goes a token of the gateway's own.
	if tok, _ := got.meta["progressToken"].(string); tok == "" || tok == "p1" {
		t.Errorf("upstream progressToken %v, want one of the gateway's own", got.meta["progressToken"])
	}
	tpHeader, _ := got.meta["traceparent"].(string)
	if !strings.HasPrefix(tpHeader, "00-"+traceID+"-") || strings.Contains(tpHeader, "00f067aa0ba902b7") {
		t.Errorf("upstream traceparent %q, want the agent's trace under the gateway's own span", tpHeader)
	}
	var fwd map[string]any
	if err := json.Unmarshal(got.args, &fwd); err != nil || fwd["note"] != "model wording" || fwd["amount"] != 12.5 {
		t.Errorf("forwarded arguments %s, want the agent's, volatile fields included", got.args)
	}
}

// When idemkv fails around the tool, the agent learns whether the tool ran: if it did,
// it gets the tool's answer (and a warning that the outcome was not stored); if not,
// an error saying nothing ran.
func TestStoreFailuresAroundTheTool(t *testing.T) {
	var calls int
	var mu sync.Mutex
	upstream := mcp.NewServer(&mcp.Implementation{Name: "inproc"}, nil)
	upstream.AddTool(&mcp.Tool{Name: "send", InputSchema: map[string]any{"type": "object"}},
		func(context.Context, *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			mu.Lock()
			calls++
			mu.Unlock()
			return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "sent"}}}, nil
		})
	unavailable := idemkv.Errorf(idemkv.ErrUnavailable, "no leader")
	for _, tc := range []struct {
		name     string
		runTool  bool
		err      error // what Do reports, as client.Do reports it
		wantRan  bool
		wantCode string
	}{
		{name: "reserve failed", err: &client.StoreUnavailableError{Key: "k", Waited: time.Second, Cause: unavailable},
			wantCode: mcpgw.CodeStoreUnavailable},
		{name: "commit failed", runTool: true, err: &client.OutcomeUnknownError{Key: "k", Decision: idemkv.DecisionExecute, Cause: unavailable},
			wantRan: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			runner := runnerFunc(func(ctx context.Context, _ client.Op, fn client.Func) (*client.Outcome, error) {
				if tc.runTool {
					if _, err := fn(ctx); err != nil {
						t.Errorf("tool: %v", err)
					}
				}
				return nil, tc.err
			})
			sess := inProcess(t, upstream, runner, "", nil)
			mu.Lock()
			before := calls
			mu.Unlock()
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			res, err := sess.CallTool(ctx, &mcp.CallToolParams{Name: "send", Meta: mcp.Meta{mcpgw.MetaIdempotencyKey: "k"}})
			if err != nil {
				t.Fatal(err)
			}
			mu.Lock()
			ran := calls > before
			mu.Unlock()
			if ran != tc.wantRan {
				t.Fatalf("the tool ran: %v, want %v", ran, tc.wantRan)
			}
			if tc.wantRan {
				warning, _ := res.Meta[mcpgw.MetaWarning].(string)
				if res.IsError || text(res) != "sent" || !strings.Contains(warning, "could not store") {
					t.Fatalf("want the tool's answer with a warning, got %s", show(res))
				}
				return
			}
			if !res.IsError || res.Meta[mcpgw.MetaError] != tc.wantCode || !strings.Contains(text(res), "was not called") {
				t.Fatalf("want a %s error, got %s", tc.wantCode, show(res))
			}
		})
	}
}
