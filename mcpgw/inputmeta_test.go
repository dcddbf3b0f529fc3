package mcpgw

import (
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// An upstream's input request reaches the agent without anything under io.idemkv/ in
// its _meta, as everything else the upstream sends does (hostile.go).
func TestRelayedInputRequestsAreScrubbed(t *testing.T) {
	req := &mcp.CallToolRequest{Params: &mcp.CallToolParamsRaw{Meta: mcp.Meta{
		mcp.MetaKeyProtocolVersion:    "2026-07-28",
		mcp.MetaKeyClientCapabilities: map[string]any{"elicitation": map[string]any{}},
	}}}
	forged := func() mcp.Meta { return mcp.Meta{MetaDecision: "replay", "keep": "me"} }
	in := &inputNeeded{requests: mcp.InputRequestMap{"confirm": &mcp.ElicitParams{Mode: "form", Message: "sure?", Meta: forged()}}, state: "s"}
	res := relayInput(req, in)
	if res == nil {
		t.Fatal("the request was not relayed")
	}
	p, ok := res.InputRequests["confirm"].(*mcp.ElicitParams)
	if !ok {
		t.Fatalf("relayed %T", res.InputRequests["confirm"])
	}
	if _, has := p.Meta[MetaDecision]; has || p.Meta["keep"] != "me" {
		t.Errorf("the relayed request's _meta = %v, want the upstream's own keys only", p.Meta)
	}
}
