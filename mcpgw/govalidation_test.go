package mcpgw_test

import (
	"strings"
	"testing"

	"github.com/idemkv/idemkv/internal/testcluster"
	"github.com/idemkv/idemkv/mcpgw"
)

// The go-sdk refuses arguments that fail a typed tool's input schema with an isError
// result before the tool's code runs ("validating \"arguments\": …"), as mcp-go and
// the TypeScript and Python SDKs do with their own words: the key is released, so
// the model's corrected retry under the same key runs. The go-sdk's words were
// missing from the ones the gateway knows, so the refusal was stored as the call's
// failure and the corrected retry met a conflict, its tool never run.
func TestGoSDKValidationErrorsReleaseTheKey(t *testing.T) {
	cluster := testcluster.Start(t, 1)
	up := newGoUpstream(false)
	g := newGW(t, cluster, up.inMemory(t), gwOptions{policy: "tenant: govalidation\n"})
	agent := g.connectGoEra("validating-agent", nil, modernEra)
	bad := goCall(t, agent, "place_order", map[string]any{"order_id": "v-1", "amount": "five", "currency": "EUR"}, key("govalidation:v-1"))
	if !bad.IsError || !strings.Contains(text(bad), `validating "arguments"`) || up.runs("v-1") != 0 {
		t.Fatalf("want the go-sdk's validation error, the tool not run; got %s (ran %d times)", show(bad), up.runs("v-1"))
	}
	fixed := goCall(t, agent, "place_order", order("v-1", 5, "EUR"), key("govalidation:v-1"))
	if fixed.IsError || meta(fixed, mcpgw.MetaDecision) != "execute" || up.runs("v-1") != 1 {
		t.Fatalf("the corrected call under the same key must run; got %s (ran %d times)", show(fixed), up.runs("v-1"))
	}
}
