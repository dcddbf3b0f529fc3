package mcpgw

import (
	"strings"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// An upstream's result that carries its own io.modelcontextprotocol/serverInfo reaches
// a 2026-07-28 agent with the gateway's in its place (the gateway is the agent's
// server), once, and with the upstream's other _meta keys as they were.
func TestWithProtocolGatewayServerInfoWins(t *testing.T) {
	raw := []byte(`{"content":[],"_meta":{"io.modelcontextprotocol/serverInfo":{"name":"upstream","version":"6.6.6"},"vendor/x":1}}`)
	meta := mcp.Meta{protocolMetaPrefix + "serverInfo": map[string]any{"name": "idemkv-mcp-gateway", "version": "1"}}
	out, err := withProtocol(raw, meta, true)
	if err != nil {
		t.Fatal(err)
	}
	got := string(out)
	if strings.Contains(got, "upstream") || strings.Count(got, "serverInfo") != 1 || !strings.Contains(got, `"name":"idemkv-mcp-gateway"`) {
		t.Errorf("serverInfo: want the gateway's alone, got %s", got)
	}
	if !strings.Contains(got, `"vendor/x":1`) || !strings.Contains(got, `"resultType":"complete"`) {
		t.Errorf("lost the upstream's own key or the result type: %s", got)
	}
}
