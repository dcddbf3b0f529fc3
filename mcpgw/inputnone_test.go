package mcpgw_test

import (
	"bytes"
	"context"
	"errors"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/internal/testcluster"
	"github.com/idemkv/idemkv/mcpgw"
)

// asksNothing is an upstream connection on which the answer of the tool "busy" comes
// as resultType input_required with a request state and no input request: the call
// did not complete, and there is nothing to ask anyone.
type asksNothing struct{ mcp.Transport }

func (a asksNothing) Connect(ctx context.Context) (mcp.Connection, error) {
	c, err := a.Transport.Connect(ctx)
	if err != nil {
		return nil, err
	}
	return asksNothingConn{c}, nil
}

type asksNothingConn struct{ mcp.Connection }

func (c asksNothingConn) Read(ctx context.Context) (jsonrpc.Message, error) {
	msg, err := c.Connection.Read(ctx)
	if resp, ok := msg.(*jsonrpc.Response); ok && bytes.Contains(resp.Result, []byte(`"busy answer"`)) {
		resp.Result = []byte(`{"resultType":"input_required","requestState":"come-back-later"}`)
	}
	return msg, err
}

// An upstream's input_required that asks for nothing cannot be relayed: a 2026-07-28
// agent got a result the go-sdk marks complete, with no content and no error, as if
// the tool had run (its key released, nothing done). It gets the tool error an agent
// of 2025-11-25 gets.
func TestInputRequiredAskingNothingIsNotASuccess(t *testing.T) {
	cluster := testcluster.Start(t, 1)
	srv := mcp.NewServer(&mcp.Implementation{Name: "busy", Version: "1"}, nil)
	mcp.AddTool(srv, &mcp.Tool{Name: "busy"},
		func(context.Context, *mcp.CallToolRequest, struct{}) (*mcp.CallToolResult, any, error) {
			return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "busy answer"}}}, nil, nil
		})
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	transport := func() mcp.Transport {
		c, s := mcp.NewInMemoryTransports()
		if _, err := srv.Connect(ctx, s, nil); err != nil {
			t.Errorf("upstream connect: %v", err)
		}
		return asksNothing{c}
	}
	g := newGW(t, cluster, transport, gwOptions{policy: "tenant: asksnothing\n"})
	if got := g.gw.Upstream().Protocol(); got != modernEra {
		t.Fatalf("the gateway speaks %s with the upstream, want %s", got, modernEra)
	}
	for _, era := range eras {
		k := "asksnothing:" + era
		res := goCall(t, g.connectGoEra("agent-"+era, nil, era), "busy", map[string]any{}, key(k))
		if !res.IsError || meta(res, mcpgw.MetaError) != mcpgw.CodeUpstreamUnavailable {
			t.Errorf("%s: an input_required asking nothing answered %s, want an upstream_unavailable tool error", era, show(res))
		}
		if _, err := g.idem.Get(t.Context(), &idemkv.GetRequest{Tenant: "asksnothing", Key: k}); !errors.Is(err, idemkv.ErrNotFound) {
			t.Errorf("%s: the key is not released: %v", era, err)
		}
	}
}
