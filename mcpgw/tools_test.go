package mcpgw_test

import (
	"context"
	"fmt"
	"log/slog"
	"net/http/httptest"
	"slices"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/idemkv/idemkv/client"
	"github.com/idemkv/idemkv/internal/testcluster"
	"github.com/idemkv/idemkv/internal/testlog"
	"github.com/idemkv/idemkv/mcpgw"
)

// failRunner fails the test if a call reaches idemkv.
type failRunner struct{ t *testing.T }

func (f failRunner) Do(context.Context, client.Op, client.Func) (*client.Outcome, error) {
	f.t.Error("a call was recorded")
	return nil, context.Canceled
}

var _ mcpgw.Runner = failRunner{}

func noop(context.Context, *mcp.CallToolRequest, struct{}) (*mcp.CallToolResult, struct{}, error) {
	return nil, struct{}{}, nil
}

// The gateway follows the upstream's tool list: a tool added or removed upstream is
// added or removed for the agents, who are told the list changed.
func TestToolListFollowsUpstream(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	upstream := mcp.NewServer(&mcp.Implementation{Name: "inproc"}, nil)
	mcp.AddTool(upstream, &mcp.Tool{Name: "a", Annotations: &mcp.ToolAnnotations{ReadOnlyHint: true}}, noop)

	up := inMemoryUpstream(ctx, t, upstream)
	cfg := mcpgw.DefaultConfig()
	cfg.Upstream, cfg.Runner, cfg.Logger = up, failRunner{t}, testlog.NewLevel(t, "gateway: ", slog.LevelDebug)
	gw, err := mcpgw.New(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = gw.Close() })

	sess, notified := connectWatching(ctx, t, gw, "agent")

	names := func() []string {
		res, err := sess.ListTools(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, tool := range res.Tools {
			out = append(out, tool.Name)
		}
		slices.Sort(out)
		return out
	}
	waitTools := func(want ...string) {
		t.Helper()
		select {
		case <-notified:
		case <-ctx.Done():
			t.Fatalf("no tools/list_changed; tools %v, want %v", names(), want)
		}
		if err := testcluster.Eventually(10*time.Second, func() error {
			if got := names(); !slices.Equal(got, want) {
				return &mismatch{got, want}
			}
			return nil
		}); err != nil {
			t.Fatal(err)
		}
	}
	if got := names(); !slices.Equal(got, []string{"a"}) {
		t.Fatalf("tools %v, want [a]", got)
	}
	mcp.AddTool(upstream, &mcp.Tool{Name: "b", Annotations: &mcp.ToolAnnotations{IdempotentHint: true}}, noop)
	waitTools("a", "b")
	if class, ok := gw.Class("b"); !ok || class != client.IdempotentMutation {
		t.Fatalf("new tool b: class %q offered %v", class, ok)
	}
	upstream.RemoveTools("a")
	waitTools("b")
	if _, ok := gw.Class("a"); ok {
		t.Fatal("removed tool a is still classified")
	}
	res, err := sess.CallTool(ctx, &mcp.CallToolParams{Name: "a"})
	if err == nil {
		t.Fatalf("calling a removed tool: %+v, want a protocol error", res)
	}
}

type mismatch struct{ got, want []string }

func (m *mismatch) Error() string {
	return fmt.Sprintf("tools %v, want %v", m.got, m.want)
}

// connectWatching connects an in-memory MCP client named name to gw and returns its
// session and a channel that gets a value each time the client is told the tool list
// changed.
func connectWatching(ctx context.Context, t *testing.T, gw *mcpgw.Gateway, name string) (*mcp.ClientSession, <-chan struct{}) {
	t.Helper()
	notified := make(chan struct{}, 8)
	client := mcp.NewClient(&mcp.Implementation{Name: name}, &mcp.ClientOptions{
		ToolListChangedHandler: func(context.Context, *mcp.ToolListChangedRequest) { notified <- struct{}{} },
	})
	ct, st := mcp.NewInMemoryTransports()
	ss, err := gw.Server().Connect(ctx, st, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ss.Close() })
	sess, err := client.Connect(ctx, ct, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sess.Close() })
	return sess, notified
}

// Issue 23 point 1: list-changed reaches agents of both eras over streamable HTTP: a
// 2025-11-25 agent on its session's stream, a 2026-07-28 one on the
// subscriptions/listen request it keeps open (there is no session).
func TestToolListChangedReachesBothEras(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
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
	srv := httptest.NewServer(gw.HTTPHandler(nil))
	t.Cleanup(srv.Close)

	notified := map[string]chan struct{}{}
	for _, era := range []string{"2026-07-28", "2025-11-25"} {
		ch := make(chan struct{}, 8)
		notified[era] = ch
		c := mcp.NewClient(&mcp.Implementation{Name: "watcher-" + era}, &mcp.ClientOptions{
			ToolListChangedHandler: func(context.Context, *mcp.ToolListChangedRequest) { ch <- struct{}{} },
		})
		sess, err := c.Connect(ctx, &mcp.StreamableClientTransport{Endpoint: srv.URL, MaxRetries: -1},
			&mcp.ClientSessionOptions{ProtocolVersion: era})
		if err != nil {
			t.Fatalf("%s: %v", era, err)
		}
		t.Cleanup(func() { _ = sess.Close() })
		if v := sess.InitializeResult().ProtocolVersion; v != era {
			t.Fatalf("the watcher speaks %s, want %s", v, era)
		}
	}
	// Whatever the agents were told while connecting is not what is tested.
	for _, ch := range notified {
		for len(ch) > 0 {
			<-ch
		}
	}
	mcp.AddTool(upstream, &mcp.Tool{Name: "b", Annotations: &mcp.ToolAnnotations{IdempotentHint: true}}, noop)
	for era, ch := range notified {
		select {
		case <-ch:
		case <-ctx.Done():
			t.Errorf("%s: no tools/list_changed after the upstream added a tool", era)
		}
	}
}
