package mcpgw

import (
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// A message goes through an agent's call still in flight, never through its call that
// ended less than logGrace ago (its 2026-07-28 stream is gone); calls of two agents
// own nothing.
func TestOwnerPrefersACallInFlight(t *testing.T) {
	a, b := new(mcp.ServerSession), new(mcp.ServerSession)
	for range 50 { // map order varies
		ended, live := &inFlightCall{ss: a, ended: true}, &inFlightCall{ss: a}
		if got := owner(map[*inFlightCall]struct{}{ended: {}, live: {}}); got != live {
			t.Fatalf("owner %+v, want the call in flight", got)
		}
		if got := owner(map[*inFlightCall]struct{}{ended: {}}); got != ended {
			t.Fatalf("owner %+v, want the call that ended, the agent's only one", got)
		}
		if got := owner(map[*inFlightCall]struct{}{ended: {}, live: {}, {ss: b}: {}}); got != nil {
			t.Fatalf("owner %+v of two agents' calls, want none", got)
		}
	}
	if got := owner(nil); got != nil {
		t.Fatalf("owner %+v of no call", got)
	}
}
