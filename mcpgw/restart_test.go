package mcpgw_test

import (
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/internal/testcluster"
	"github.com/idemkv/idemkv/mcpgw"
)

// An HTTP upstream with sessions (MCP 2025-11-25) that restarted has forgotten the
// gateway's session, and answers the next request on it with 404, as the protocol
// requires: it did not run the tool. The gateway took that for a call that may have
// run: outcome_unknown, the key left pending for the lease, then in doubt for a
// tool without a probe, for an operator to settle, though nothing ran. It now opens a
// new session and sends the call there, once.
func TestUpstreamRestartIsNotAnUnknownOutcome(t *testing.T) {
	cluster := testcluster.Start(t, 1)
	up := newGoUpstream(true)
	var handler atomic.Pointer[http.Handler]
	restart := func() {
		var h http.Handler = mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return up.srv }, nil)
		handler.Store(&h)
	}
	restart()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { (*handler.Load()).ServeHTTP(w, r) }))
	t.Cleanup(srv.Close)
	g := newGW(t, cluster, httpUpstream(srv.URL), gwOptions{policy: "tenant: restart\n"})
	if got := g.gw.Upstream().Protocol(); got != legacyEra {
		t.Fatalf("the gateway speaks %s with the upstream, want %s", got, legacyEra)
	}
	for _, era := range eras {
		agent := g.connectGoEra("restart-agent-"+era, nil, era)
		for i, ord := range []string{"r-1-" + era, "r-2-" + era} {
			if i == 1 {
				restart() // the upstream's sessions are gone
			}
			res := goCall(t, agent, "place_order", order(ord, 5, "EUR"), key("restart:"+ord))
			if res.IsError || meta(res, mcpgw.MetaDecision) != "execute" || up.runs(ord) != 1 {
				t.Fatalf("%s: call %d (restarted upstream: %t): %s, ran %d times; want it run once",
					era, i+1, i == 1, show(res), up.runs(ord))
			}
			rec, err := g.idem.Get(t.Context(), &idemkv.GetRequest{Tenant: "restart", Key: "restart:" + ord})
			if err != nil || rec.Status != idemkv.StatusCommitted {
				t.Fatalf("%s: call %d: record %+v %v, want committed", era, i+1, rec, err)
			}
		}
	}
}
