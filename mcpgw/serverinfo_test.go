package mcpgw_test

import (
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/idemkv/idemkv/internal/testcluster"
	"github.com/idemkv/idemkv/mcpgw"
)

// A 2026-07-28 answer names its server in _meta["io.modelcontextprotocol/serverInfo"],
// and the agent's server is the gateway: an upstream of that era names itself in every
// result, and its name reached the agent (on the first answer and on every replay),
// because the go-sdk adds the gateway's only where a result names none.
func TestAnswersNameTheGatewayAsTheirServer(t *testing.T) {
	cluster := testcluster.Start(t, 1)
	up := newGoUpstream(false)
	g := newGW(t, cluster, up.inMemory(t), gwOptions{policy: "tenant: info\n"})
	if got := g.gw.Upstream().Protocol(); got != modernEra {
		t.Fatalf("the gateway speaks %s with the upstream, want %s", got, modernEra)
	}
	agent := g.connectGoEra("info-agent", nil, modernEra)
	for i, want := range []string{"execute", "replay", ""} {
		tool, m := "place_order", key("info:o-1")
		if want == "" {
			tool, m = "lookup_order", nil
		}
		res := goCall(t, agent, tool, order("o-1", 3, "EUR"), m)
		info, _ := res.Meta[mcp.MetaKeyServerInfo].(map[string]any)
		if res.IsError || meta(res, mcpgw.MetaDecision) != want || info["name"] != "idemkv-mcp-gateway" {
			t.Errorf("call %d (%s): serverInfo %v, want the gateway's; result %s", i+1, tool, info, show(res))
		}
	}
}
