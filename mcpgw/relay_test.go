//lint:file-ignore SA1019 MCP 2026-07-28 deprecates logging (SEP-2577) but keeps it working for at least a year; the gateway relays the upstream's log messages in both eras until it is gone.

package mcpgw_test

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/internal/testcluster"
	"github.com/idemkv/idemkv/mcpgw"
)

// notes collects what an agent was sent besides answers.
type notes struct {
	mu       sync.Mutex
	progress []*mcp.ProgressNotificationParams
	logs     []*mcp.LoggingMessageParams
}

func (n *notes) options() *mcp.ClientOptions {
	return &mcp.ClientOptions{
		ProgressNotificationHandler: func(_ context.Context, req *mcp.ProgressNotificationClientRequest) {
			n.mu.Lock()
			n.progress = append(n.progress, req.Params)
			n.mu.Unlock()
		},
		LoggingMessageHandler: func(_ context.Context, req *mcp.LoggingMessageRequest) {
			n.mu.Lock()
			n.logs = append(n.logs, req.Params)
			n.mu.Unlock()
		},
	}
}

func (n *notes) snapshot() ([]*mcp.ProgressNotificationParams, []*mcp.LoggingMessageParams) {
	n.mu.Lock()
	defer n.mu.Unlock()
	return append([]*mcp.ProgressNotificationParams(nil), n.progress...), append([]*mcp.LoggingMessageParams(nil), n.logs...)
}

// Issue 14 point 8: the upstream's progress notifications reach the agent under the
// agent's own progress token, and its log messages reach agents that set a level;
// the gateway says it can log.
func TestUpstreamProgressAndLogsAreRelayed(t *testing.T) {
	cluster := testcluster.Start(t, 1)
	for name, transport := range transports(t) {
		for _, era := range eras {
			t.Run(name+"/"+era, func(t *testing.T) {
				g := newGW(t, cluster, transport, gwOptions{policy: "tenant: relay-" + name + "-" + era + "\n"})
				var n notes
				agent := g.connectGoEra("relay-agent", n.options(), era)
				if agent.InitializeResult().Capabilities.Logging == nil {
					t.Fatalf("the gateway does not advertise logging: %+v", agent.InitializeResult().Capabilities)
				}
				ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
				defer cancel()
				m := mcp.Meta{"progressToken": "agent-token-7", mcpgw.MetaIdempotencyKey: "export-q3"}
				if era == legacyEra {
					if err := agent.SetLoggingLevel(ctx, &mcp.SetLoggingLevelParams{Level: "info"}); err != nil {
						t.Fatal(err)
					}
				} else {
					// 2026-07-28 has no logging/setLevel: the request names its level.
					m[mcp.MetaKeyLogLevel] = "info"
				}
				res, err := agent.CallTool(ctx, &mcp.CallToolParams{Name: "export_report", Arguments: map[string]any{"report": "q3"},
					Meta: m})
				if err != nil || res.IsError {
					t.Fatalf("export_report: %v %s", err, show(res))
				}
				// mcp-go writes notifications from goroutines, so the upstream's two may
				// reach the gateway swapped; the gateway then drops the older one, since MCP
				// wants progress to increase. What the agent sees is distinct parts under its
				// own token, part 2 of 2 among them.
				if err := testcluster.Eventually(10*time.Second, func() error {
					progress, logs := n.snapshot()
					if !slices.ContainsFunc(progress, func(p *mcp.ProgressNotificationParams) bool { return p.Progress == 2 }) || len(logs) < 1 {
						return fmt.Errorf("%d progress notifications and %d log messages so far", len(progress), len(logs))
					}
					return nil
				}); err != nil {
					t.Fatal(err)
				}
				progress, logs := n.snapshot()
				// The agent's client may hand notifications over in another order again.
				slices.SortFunc(progress, func(a, b *mcp.ProgressNotificationParams) int { return cmp.Compare(a.Progress, b.Progress) })
				if len(progress) > 2 {
					t.Errorf("%d progress notifications relayed for 2 sent", len(progress))
				}
				for i, p := range progress {
					if p.ProgressToken != "agent-token-7" || p.Total != 2 || !strings.HasPrefix(p.Message, "part") ||
						(i > 0 && p.Progress <= progress[i-1].Progress) {
						t.Errorf("progress %d: %+v, want distinct parts of 2 under the agent's token", i, p)
					}
				}
				if logs[0].Data != "exporting" || logs[0].Level != "info" {
					t.Errorf("log message %+v", logs[0])
				}
			})
		}
	}
}

// Issue 13 point 5, the gateway's side: arguments with an integer a double cannot
// hold cannot be fingerprinted faithfully, so the call is refused with a tool error
// that says so, before anything is reserved or run.
func TestUnfingerprintableArgumentsAreRefused(t *testing.T) {
	cluster := testcluster.Start(t, 1)
	up := newM3Upstream()
	g := newGW(t, cluster, httpUpstream(up.serveHTTP(t)), gwOptions{policy: "tenant: hugeargs\n"})
	agent := g.connectGo("agent", nil)
	args := map[string]any{"order_id": "o-9", "amount": int64(9007199254740993), "currency": "EUR"}
	res := goCall(t, agent, "place_order", args, key("huge-1"))
	if !res.IsError || meta(res, mcpgw.MetaError) != mcpgw.CodeInvalidArgument || !strings.Contains(text(res), "string") ||
		!strings.Contains(text(res), "place_order was not called") {
		t.Fatalf("want an invalid_argument tool error that says to send the number as a string, got %s", show(res))
	}
	if n := up.calls("place_order"); n != 0 {
		t.Fatalf("place_order ran %d times", n)
	}
	if _, err := g.idem.Get(context.Background(), &idemkv.GetRequest{Tenant: "hugeargs", Key: "huge-1"}); err == nil {
		t.Fatal("a record was reserved")
	}
}

// Issue 14 point 8: a call that waits while another attempt holds its key tells an
// agent that asked for progress that it is waiting, instead of nothing for up to a
// lease.
func TestWaitingCallSendsProgress(t *testing.T) {
	cluster := testcluster.Start(t, 1)
	up := newM3Upstream()
	g := newGW(t, cluster, httpUpstream(up.serveHTTP(t)), gwOptions{policy: "tenant: waiting\n",
		gwCfg: func(c *mcpgw.Config) { c.WaitProgress = 100 * time.Millisecond }})
	first := g.connectGo("first", nil)
	var n notes
	second := g.connectGo("second", n.options())

	firstDone := make(chan *mcp.CallToolResult, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		res, err := first.CallTool(ctx, &mcp.CallToolParams{Name: "export_report", Arguments: map[string]any{"report": "q4"}, Meta: key("export-q4")})
		if err != nil {
			t.Error(err)
		}
		firstDone <- res
	}()
	// The first call holds the key while export_report works on for a second.
	if err := testcluster.Eventually(10*time.Second, func() error {
		if up.calls("export_report") == 0 {
			return fmt.Errorf("export_report not running yet")
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	res, err := second.CallTool(ctx, &mcp.CallToolParams{Name: "export_report", Arguments: map[string]any{"report": "q4"},
		Meta: mcp.Meta{"progressToken": "second-token", mcpgw.MetaIdempotencyKey: "export-q4"}})
	if err != nil {
		t.Fatal(err)
	}
	if res.IsError || meta(res, mcpgw.MetaDecision) != "replay" {
		t.Fatalf("the waiting call: want the first call's result replayed, got %s", show(res))
	}
	if r := <-firstDone; r == nil || meta(r, mcpgw.MetaDecision) != "execute" {
		t.Fatalf("the first call: %s", show(r))
	}
	progress, _ := n.snapshot()
	if len(progress) == 0 {
		t.Fatal("the waiting call sent no progress")
	}
	last := 0.0
	for i, p := range progress {
		if p.ProgressToken != "second-token" || !strings.Contains(p.Message, "waiting for idemkv") || p.Progress <= last {
			t.Errorf("progress %d: %+v, want the second call's token, a waiting message and more than %v", i, p, last)
		}
		last = p.Progress
	}
	if c := up.calls("export_report"); c != 1 {
		t.Fatalf("export_report ran %d times, want 1", c)
	}
}

// An upstream's log message goes to no agent but the one whose calls are in flight:
// the upstream has one session for every agent, and its log of one tenant's call (an
// order id, a customer) reached every agent of the gateway, of every tenant.
func TestUpstreamLogsReachOnlyTheAgentWhoseCallItIs(t *testing.T) {
	cluster := testcluster.Start(t, 1)
	for _, era := range eras {
		t.Run(era, func(t *testing.T) {
			g := newGW(t, cluster, httpUpstream(newM3Upstream().serveHTTP(t)),
				gwOptions{policy: "tenant: logs-a-" + era + "\ntenants: [logs-b-" + era + "]\n"})
			var a, b notes
			agentA, agentB := g.connectGoEra("agent-a", a.options(), era), g.connectGoEra("agent-b", b.options(), era)
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			call := func(agent *mcp.ClientSession, tenant, key string) error {
				m := mcp.Meta{mcpgw.MetaIdempotencyKey: key, mcpgw.MetaTenant: tenant}
				if era == legacyEra {
					if err := agent.SetLoggingLevel(ctx, &mcp.SetLoggingLevelParams{Level: "info"}); err != nil {
						return err
					}
				} else {
					m[mcp.MetaKeyLogLevel] = "info"
				}
				res, err := agent.CallTool(ctx, &mcp.CallToolParams{Name: "export_report", Arguments: map[string]any{"report": key}, Meta: m})
				if err == nil && res.IsError {
					err = fmt.Errorf("%s", show(res))
				}
				return err
			}
			// B's call logs at once and runs on for a second; A's call, made once B got
			// its log, logs while both are in flight.
			bDone := make(chan error, 1)
			go func() { bDone <- call(agentB, "logs-b-"+era, "export-b") }()
			if err := testcluster.Eventually(10*time.Second, func() error {
				if _, logs := b.snapshot(); len(logs) == 0 {
					return fmt.Errorf("agent B got no log message of its own call")
				}
				return nil
			}); err != nil {
				t.Fatal(err)
			}
			if err := call(agentA, "logs-a-"+era, "export-a"); err != nil {
				t.Fatalf("A's call: %v", err)
			}
			if err := <-bDone; err != nil {
				t.Fatalf("B's call: %v", err)
			}
			time.Sleep(300 * time.Millisecond) // for a message on its way
			if _, logs := b.snapshot(); len(logs) != 1 {
				t.Errorf("agent B got %d log messages, want 1 (its own call's; A's call logged while both were in flight)", len(logs))
			}
			if _, logs := a.snapshot(); len(logs) != 0 {
				t.Errorf("agent A got %d log messages, want none (its call logged while B's was in flight too)", len(logs))
			}
		})
	}
}
