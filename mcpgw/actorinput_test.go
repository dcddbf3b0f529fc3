package mcpgw_test

import (
	"strings"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/idemkv/idemkv/internal/testcluster"
	"github.com/idemkv/idemkv/mcpgw"
)

// The actor is part of a derived key (key: derive): each end user or conversation
// that names its own in _meta["io.idemkv/actor"] gets its own operations. An actor
// the gateway silently read otherwise (clipped to the record's 128 bytes, or not a
// string and so replaced by the client's name) made two users' identical calls
// inside one window one operation: the second user got the first one's result.
func TestDistinctActorsNeverShareADerivedKey(t *testing.T) {
	cluster := testcluster.Start(t, 1)
	up := newGoUpstream(false)
	g := newGW(t, cluster, up.inMemory(t), gwOptions{policy: "tenant: actorkeys\ntools:\n  place_order: {key: derive}\n"})
	agent := g.connectGoEra("shared-client", nil, modernEra)
	long := "conversation:" + strings.Repeat("x", 200)
	for _, c := range []struct {
		name   string
		actors [2]any
	}{
		{"long actors that differ past 128 bytes", [2]any{long + "-alice", long + "-bob"}},
		{"actors that are not strings", [2]any{42, 43}},
	} {
		t.Run(c.name, func(t *testing.T) {
			ord := "o-" + strings.ReplaceAll(c.name, " ", "-")
			var answers []*mcp.CallToolResult
			for _, actor := range c.actors {
				answers = append(answers, goCall(t, agent, "place_order", order(ord, 5, "EUR"), mcp.Meta{mcpgw.MetaActor: actor}))
			}
			for i, res := range answers {
				if meta(res, mcpgw.MetaDecision) == "replay" {
					t.Errorf("actor %d got a replay of another actor's call: %s", i+1, show(res))
				}
			}
			ran := up.runs(ord) == 2 && !answers[0].IsError && !answers[1].IsError
			refused := up.runs(ord) == 0 && meta(answers[0], mcpgw.MetaError) == mcpgw.CodeInvalidArgument &&
				meta(answers[1], mcpgw.MetaError) == mcpgw.CodeInvalidArgument
			if !ran && !refused {
				t.Errorf("place_order ran %d times for two actors' calls; want twice, or both refused: %s, %s",
					up.runs(ord), show(answers[0]), show(answers[1]))
			}
		})
	}
}
