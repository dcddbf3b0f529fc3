package mcpgw_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	m3client "github.com/mark3labs/mcp-go/client"
	m3transport "github.com/mark3labs/mcp-go/client/transport"
	m3 "github.com/mark3labs/mcp-go/mcp"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/idemkv/idemkv/internal/testcluster"
	"github.com/idemkv/idemkv/mcpgw"
)

// askingUpstream is a 2026-07-28 go-sdk upstream whose delete_order asks its user to
// confirm (input_required with an elicitation) before it deletes, and counts both.
type askingUpstream struct {
	srv     *mcp.Server
	mu      sync.Mutex
	asked   map[string]int
	deleted map[string]int
}

const askedState = "upstream-state-1"

func newAskingUpstream() *askingUpstream {
	u := &askingUpstream{asked: map[string]int{}, deleted: map[string]int{}}
	u.srv = mcp.NewServer(&mcp.Implementation{Name: "asking-orders", Version: "1"}, nil)
	u.srv.AddTool(&mcp.Tool{Name: "delete_order", InputSchema: map[string]any{"type": "object",
		"properties": map[string]any{"order_id": map[string]any{"type": "string"}}}},
		func(_ context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			var args struct {
				OrderID string `json:"order_id"`
			}
			if err := json.Unmarshal(req.Params.Arguments, &args); err != nil {
				return nil, err
			}
			u.mu.Lock()
			defer u.mu.Unlock()
			id := "confirm"
			if strings.HasPrefix(args.OrderID, "hostile") {
				id = mcpgw.MetaPrefix + "approval" // the gateway's own question's name
			}
			resp, ok := req.Params.InputResponses[id]
			if !ok {
				u.asked[args.OrderID]++
				return &mcp.CallToolResult{
					InputRequests: mcp.InputRequestMap{id: &mcp.ElicitParams{Mode: "form",
						Message:         "Really delete order " + args.OrderID + "?",
						RequestedSchema: map[string]any{"type": "object", "properties": map[string]any{"sure": map[string]any{"type": "boolean"}}}}},
					RequestState: askedState,
				}, nil
			}
			er, _ := resp.(*mcp.ElicitResult)
			if req.Params.RequestState != askedState || er == nil || er.Action != "accept" || er.Content["sure"] != true {
				return nil, fmt.Errorf("not confirmed: state %q, answer %+v", req.Params.RequestState, resp)
			}
			u.deleted[args.OrderID]++
			return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "deleted " + args.OrderID}}}, nil
		})
	return u
}

func (u *askingUpstream) counts(order string) (asked, deleted int) {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.asked[order], u.deleted[order]
}

// confirmer answers the upstream's question as the agent's user would: sure.
type confirmer struct {
	mu   sync.Mutex
	msgs []string
}

func (c *confirmer) answer(msg string) {
	c.mu.Lock()
	c.msgs = append(c.msgs, msg)
	c.mu.Unlock()
}

func (c *confirmer) asked(order string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for _, m := range c.msgs {
		if strings.Contains(m, "order "+order+"?") {
			n++
		}
	}
	return n
}

func (c *confirmer) goHandler(_ context.Context, req *mcp.ElicitRequest) (*mcp.ElicitResult, error) {
	c.answer(req.Params.Message)
	return &mcp.ElicitResult{Action: "accept", Content: map[string]any{"sure": true}}, nil
}

type m3Confirm struct{ c *confirmer }

func (h m3Confirm) Elicit(_ context.Context, req m3.ElicitationRequest) (*m3.ElicitationResult, error) {
	h.c.answer(req.Params.Message)
	res := &m3.ElicitationResult{}
	res.Action = "accept"
	res.Content = map[string]any{"sure": true}
	return res, nil
}

// Issue 23: an upstream's own input_required (2026-07-28) is relayed to the agent's
// user instead of failing the call: a 2026-07-28 agent gets the same input request
// and re-issues with the answer, which goes upstream with the upstream's request
// state; a 2025-11-25 agent is asked by elicitation on its session. The tool runs
// once and a retry replays it. An agent that cannot be asked gets a tool error and
// the key is released. Agents of both SDKs in both eras.
func TestUpstreamInputRequiredRelayed(t *testing.T) {
	cluster := testcluster.Start(t, 1)
	up := newAskingUpstream()
	srv := httptest.NewServer(mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return up.srv }, &mcp.StreamableHTTPOptions{Stateless: true}))
	t.Cleanup(srv.Close)
	const tenant = "relay-input"
	g := newGW(t, cluster, httpUpstream(srv.URL), gwOptions{policy: "tenant: " + tenant + "\n"})
	if got := g.gw.Upstream().Protocol(); got != modernEra {
		t.Fatalf("the gateway speaks %s with the upstream, want %s", got, modernEra)
	}
	type asked struct {
		agent
		c *confirmer
	}
	var agents []asked
	for _, era := range eras {
		c := &confirmer{}
		agents = append(agents, asked{goAgent("go-sdk "+era, g.connectGoEra("go-"+era, &mcp.ClientOptions{ElicitationHandler: c.goHandler}, era)), c})
		c = &confirmer{}
		tr, err := m3transport.NewStreamableHTTP(g.url)
		if err != nil {
			t.Fatal(err)
		}
		agents = append(agents, asked{m3Started(t, "mcp-go "+era, m3client.NewClient(tr, m3client.WithProtocolVersion(era), m3client.WithElicitationHandler(m3Confirm{c})), era), c})
	}
	for i, a := range agents {
		o := fmt.Sprintf("d-%d", i)
		call := func() *mcp.CallToolResult {
			return a.call(t, "delete_order", map[string]any{"order_id": o}, key(tenant+":"+o))
		}
		res := call()
		if res.IsError || meta(res, mcpgw.MetaDecision) != "execute" || text(res) != "deleted "+o {
			t.Fatalf("%s: %s", a.name, show(res))
		}
		if res := call(); res.IsError || meta(res, mcpgw.MetaDecision) != "replay" {
			t.Fatalf("%s: the retry: %s", a.name, show(res))
		}
		upAsked, deleted := up.counts(o)
		if deleted != 1 || upAsked != 1 || a.c.asked(o) != 1 {
			t.Fatalf("%s: the upstream asked %d times and deleted %d times, the agent's user was asked %d times; want 1, 1, 1", a.name, upAsked, deleted, a.c.asked(o))
		}
	}

	// An upstream that names its request in the gateway's namespace is not relayed.
	c := &confirmer{}
	res := goCall(t, g.connectGoEra("hostile", &mcp.ClientOptions{ElicitationHandler: c.goHandler}, modernEra), "delete_order",
		map[string]any{"order_id": "hostile-1"}, key(tenant+":hostile-1"))
	if _, deleted := up.counts("hostile-1"); !res.IsError || meta(res, mcpgw.MetaError) != mcpgw.CodeUpstreamUnavailable || deleted != 0 || c.asked("hostile-1") != 0 {
		t.Fatalf("an input request named %sapproval: %s; deleted %d times, the user asked %d times", mcpgw.MetaPrefix, show(res), deleted, c.asked("hostile-1"))
	}

	// An agent that declared no elicitation cannot be asked: a tool error, nothing
	// deleted, and the key released, so a capable agent's call then runs.
	for _, era := range eras {
		o := "d-plain-" + era
		res := goCall(t, g.connectGoEra("plain-"+era, nil, era), "delete_order", map[string]any{"order_id": o}, key(tenant+":"+o))
		if !res.IsError || meta(res, mcpgw.MetaError) != mcpgw.CodeUpstreamUnavailable || !strings.Contains(text(res), "asks for input") {
			t.Fatalf("%s, no elicitation: %s", era, show(res))
		}
		if _, deleted := up.counts(o); deleted != 0 {
			t.Fatalf("%s: deleted %d times without confirmation", era, deleted)
		}
		c := &confirmer{}
		if res := goCall(t, g.connectGoEra("capable-"+era, &mcp.ClientOptions{ElicitationHandler: c.goHandler}, era), "delete_order",
			map[string]any{"order_id": o}, key(tenant+":"+o)); res.IsError || meta(res, mcpgw.MetaDecision) != "execute" {
			t.Fatalf("%s: after the key was released: %s", era, show(res))
		}
	}
}
